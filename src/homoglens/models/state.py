"""What homoglens knows about a model and its state: :class:`ModelInfo` and :func:`model_info`
(raw or processed weights, dtype, hooks others attached), the per-model lock every pass holds,
and the check that an intervention's hook point is written, not only read.

Moved out of :mod:`homoglens.models.loading`, which still exports these names.
"""

from __future__ import annotations

import contextlib
import threading
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from homoglens.core.errors import UnsupportedArchitectureError
from homoglens.core.types import HookedModel, WeightsKind
from homoglens.core.validate import first_few
from homoglens.models.architectures import BLOCK_POINTS, component_hook_name, family_of

__all__ = [
    "ModelInfo",
    "ModelLock",
    "attached_hooks",
    "check_writable",
    "has_hooked_transformer",
    "is_hooked_transformer",
    "model_info",
    "model_lock",
    "remember_loaded",
]


@dataclass(frozen=True)
class ModelInfo:
    """What homoglens records about a model in every result.

    Attributes:
        name: The name or path the model was loaded from (or ``cfg.model_name``).
        family: Architecture family from :mod:`homoglens.models.architectures`.
        backend: ``"hooked"`` (HookedTransformer) or ``"bridge"`` (TransformerBridge).
        weights: ``"raw"``, ``"processed"`` or ``"unknown"``.
        dtype: The model's parameter dtype, e.g. ``"float32"``.
        source: Extra provenance (for the embedded model: package, file and quantisation).
        revision: For a Hub name: the revision or training checkpoint asked for and the commit
            of the cached snapshot when known (``"main @ <sha>"``); ``""`` otherwise.
        hooks: Modules that held hooks homoglens did not attach when the measurement began
            (the user's ``model.hooks(...)`` or ``add_hook``, an intervention's ``with`` block,
            a forgotten permanent hook, PyTorch's ``register_forward_hook``): they run in every
            pass of the measurement.
    """

    name: str
    family: str
    backend: str
    weights: WeightsKind
    dtype: str
    source: str = ""
    revision: str = ""
    hooks: tuple[str, ...] = ()


# Models loaded by load_model, with what is known about them; nothing is attached to the model.
_LOADED: weakref.WeakKeyDictionary[Any, ModelInfo] = weakref.WeakKeyDictionary()


def remember_loaded(model: Any, info: ModelInfo) -> None:
    """Record what :func:`homoglens.models.loading.load_model` knows about a model it loaded.

    Args:
        model: The model just loaded.
        info: Its provenance; :func:`model_info` starts from it (nothing is attached to the model).
    """
    _LOADED[model] = info


def has_hooked_transformer() -> bool:
    """Return whether the installed TransformerLens still has ``HookedTransformer`` (< 4.0)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def is_hooked_transformer(model: Any) -> bool:
    """Return whether ``model`` is a ``HookedTransformer`` (``False`` on TransformerLens 4)."""
    if not has_hooked_transformer():
        return False
    from transformer_lens import HookedTransformer

    return isinstance(model, HookedTransformer)


def _hooked_weights(model: Any) -> WeightsKind:
    """What a ``HookedTransformer`` homoglens did not load tells about its weights: folded
    LayerNorm leaves ``normalization_type`` ``"LNPre"``/``"RMSPre"``; centred writing weights
    leave every embedding row with mean 0 over ``d_model``. Neither: raw. Read once per state of
    the model (``model_info`` runs in every measurement; the embedding of a large model is big):
    the answer is kept with the embedding's storage and version counter, which
    ``process_weights_()`` (or any in-place edit) moves on."""
    embed = model.W_E
    state = (embed.data_ptr(), embed._version, str(getattr(model.cfg, "normalization_type", "")))
    known = _WEIGHTS.get(model)
    if known is not None and known[0] == state:
        return known[1]
    if str(getattr(model.cfg, "normalization_type", "")).endswith("Pre"):
        kind: WeightsKind = "processed"
    else:
        with torch.no_grad():
            embed = model.W_E.detach()
            wide = torch.promote_types(embed.dtype, torch.float32)  # float64 stays float64
            row_means = embed.mean(-1, dtype=wide).abs().max()
            scale = embed.norm(dtype=wide) / embed.numel() ** 0.5  # RMS, no copy
            kind = "processed" if bool(row_means <= 1e-6 * scale.clamp_min(1e-30)) else "raw"
    _WEIGHTS[model] = (state, kind)
    return kind


_WEIGHTS: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int, str], WeightsKind]] = (
    weakref.WeakKeyDictionary()
)


class ModelLock:
    """The lock of one model: a homoglens call holds it for each of its passes (re-entrant:
    a measurement that calls another keeps it), so two threads measuring one model take turns
    instead of reading each other's activations, and the state a pass switches (hooks, the
    SDPA fast path) is restored before another pass sees the model. ``depth`` counts the
    passes the holding thread has open."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.owner: int | None = None
        self.depth = 0

    def __enter__(self) -> ModelLock:
        self._lock.acquire()
        self.owner = threading.get_ident()
        self.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.owner = None
        self._lock.release()

    @contextlib.contextmanager
    def hold(self) -> Iterator[ModelLock]:
        """Hold the lock without entering a pass: an intervention's ``with`` block (its hooks
        attached) keeps measurements of other threads out until it ends, while a measurement
        of this thread inside the block still sees the hooks as not its own."""
        with self._lock:
            yield self

    def held_here(self) -> bool:
        """Whether the current thread is inside a pass on the model."""
        return self.depth > 0 and self.owner == threading.get_ident()


_LOCKS: weakref.WeakKeyDictionary[Any, ModelLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: HookedModel) -> ModelLock:
    """The :class:`ModelLock` of ``model`` (made on first use, dropped with the model)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = ModelLock()
        return lock


def attached_hooks(model: HookedModel) -> tuple[str, ...]:
    """The hook points of ``model`` that hold forward, pre-forward or backward hooks now, by
    their TransformerLens name, and ``"<global>"`` for PyTorch's global module hooks.

    The backends' own wiring is left out: TransformerLens' permanent hooks that mirror a
    sub-component's hook points (OPT's split MLP on the bridge), and the capture hooks the
    bridge and transformers install on the Hugging Face modules at the first pass."""
    from torch.nn.modules import module as torch_module

    found: dict[int, str] = {}
    for name, point in getattr(model, "hook_dict", {}).items():
        hooks = (
            *point._forward_hooks.values(),
            *point._forward_pre_hooks.values(),
            *point._backward_hooks.values(),
        )
        if any(not _backend_hook(fn) for fn in hooks):
            found.setdefault(id(point), str(getattr(point, "name", None) or name))
    names = list(found.values())
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        names.append("<global>")
    return tuple(names)


def _backend_hook(fn: Any) -> bool:
    """Whether a hook (as registered, or the function TransformerLens' ``add_hook`` wraps)
    was written by TransformerLens itself."""
    inner = [
        cell.cell_contents
        for cell in getattr(fn, "__closure__", None) or ()
        if isinstance(getattr(cell, "cell_contents", None), types.FunctionType)
    ]
    return any(
        str(getattr(f, "__module__", "")).startswith("transformer_lens.")
        and "add_hook" not in getattr(f, "__qualname__", "")
        for f in (fn, *inner)
    )


_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()


def _warn_processed(model: Any) -> None:
    if model in _WARNED:
        return
    _WARNED.add(model)
    import warnings

    warnings.warn(
        "this model's weights were processed by TransformerLens (folded LayerNorm / centred "
        "writing weights): the residual stream's mean direction is removed, so cosines and "
        "homogenization differ from the raw model's (TransformerLens issue #346). Results "
        "record weights='processed'; for raw weights use homoglens.load_model(...) or "
        "HookedTransformer.from_pretrained_no_processing(...)",
        UserWarning,
        stacklevel=3,
    )


class _Seen(Exception):
    """Ends a probe pass once block 0's output has been read."""


_WRITABLE: weakref.WeakKeyDictionary[Any, dict[str, bool]] = weakref.WeakKeyDictionary()


def check_writable(model: HookedModel, point: str, what: str) -> None:
    """Refuse an intervention whose hook point the model only reads.

    TransformerLens 4.3's bridge fires ``attn.hook_pattern`` of GPT-Neo, OPT and GPT-J as a view
    of the Hugging Face module's own computation: the values are right, but a hook's return
    value never reaches the output, so an intervention there would be silently ignored. Two
    two-token passes through block 0, with ``point`` of block 0 shifted by 1 and without, tell
    (no later block, final norm or unembedding runs; cached per model and point).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        point: The component written, a key of :data:`homoglens.models.architectures.BLOCK_POINTS`
            (``"pattern"``: ``attn.hook_pattern``).
        what: The intervention, for the message.

    Raises:
        UnsupportedArchitectureError: writing ``point`` changes nothing on this model.
    """
    known = _WRITABLE.setdefault(model, {})
    name = component_hook_name(0, point)
    if point not in known:
        known[point] = name in model.hook_dict and _moves_block_0(model, name)
    if not known[point]:
        raise UnsupportedArchitectureError(
            f"{what} writes blocks.{{l}}.{BLOCK_POINTS[point]}, which this {family_of(model)} "
            "model only reads "
            "(TransformerLens computes its attention inside the Hugging Face module, so a "
            "changed value never reaches the output). Load it with backend='hooked' "
            "(TransformerLens 3.9), where it is written"
        )


def _moves_block_0(model: Any, name: str) -> bool:
    vocab = int(model.cfg.d_vocab)  # two ordinary tokens (0 is often a zero padding row)
    device = next(model.parameters()).device
    tokens = torch.tensor([[min(100, vocab - 1), min(200, vocab - 2)]], device=device)
    outputs = []

    def read(activation: torch.Tensor, hook: Any) -> None:
        outputs.append(activation.detach().clone())
        raise _Seen

    for shifted in (False, True):
        hooks = [(name, lambda act, hook: act + 1.0)] if shifted else []
        try:
            with torch.no_grad():
                model.run_with_hooks(
                    tokens, fwd_hooks=[*hooks, (component_hook_name(0, "resid_post"), read)]
                )
        except _Seen:
            pass
    return len(outputs) == 2 and not torch.equal(outputs[0], outputs[1])


def model_info(model: HookedModel) -> ModelInfo:
    """Describe a TransformerLens model: name, family, backend, raw or processed weights.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``, loaded by :func:`load_model`
            or by the user.

    Returns:
        The :class:`ModelInfo`.

    The family is the architecture table's name (``"gpt2"``, ``"llama"``, ...) where the table
    has a row, and the Hugging Face architecture name (``"FalconForCausalLM"``) otherwise.
    The weights are read from the model at call time, also for a model homoglens loaded: a
    bridge after ``enable_compatibility_mode()`` / ``process_weights()``, or a
    ``HookedTransformer`` with folded LayerNorm or centred writing weights
    (``from_pretrained``'s default, ``process_weights_()``), is ``"processed"``, and a
    ``UserWarning`` says so once per model (cosines differ from the raw model's). So are the
    dtype and the hooks attached that homoglens did not attach (``hooks``; a ``UserWarning``
    names them: they run in every pass of the measurement).

    Raises:
        InvalidInputError: ``model`` is not a TransformerLens model.
    """
    from homoglens.core.validate import check_model

    check_model(model)
    current = str(next(model.parameters()).dtype).removeprefix("torch.")
    hooked = is_hooked_transformer(model)
    weights: WeightsKind
    if hooked:
        weights = _hooked_weights(model)
    else:
        weights = "processed" if getattr(model, "_weights_processed", False) else "raw"
    # Inside one of homoglens' own passes the hooks attached are its own. Read under the lock:
    # another thread's intervention block is either over or not begun.
    lock = model_lock(model)
    with lock.hold():
        hooks = () if lock.held_here() else attached_hooks(model)
    if hooks:
        _warn_hooks(hooks)
    known = _LOADED.get(model)
    if known is not None:  # the state now, not at load time (model.half(), process_weights_())
        if known.weights == "processed":
            weights = "processed"  # loaded processed: what the loader did, not a guess
        elif weights == "processed":
            _warn_processed(model)
        return replace(known, dtype=current, weights=weights, hooks=hooks)
    if weights == "processed":
        _warn_processed(model)
    return ModelInfo(
        name=str(getattr(model.cfg, "model_name", "unknown")),
        family=family_of(model),
        backend="hooked" if hooked else "bridge",
        weights=weights,
        dtype=current,
        hooks=hooks,
    )


def _warn_hooks(hooks: tuple[str, ...]) -> None:
    import warnings

    warnings.warn(
        f"homoglens: {len(hooks)} hook(s) homoglens did not attach are on the model "
        f"({first_few(list(hooks), 4)}); they run in every pass of this measurement (a study's "
        "'none' row is then not the clean model). The result records them in "
        "provenance.foreign_hooks; remove them with model.reset_hooks(including_permanent=True) "
        "or measure outside the with-block if that was not intended",
        UserWarning,
        stacklevel=3,
    )
