"""The fast attention path: passes that read no attention pattern run PyTorch SDPA.

TransformerLens' ``TransformerBridge`` forces eager attention on every pass, and for most
families it re-implements attention step by step, so that ``hook_attn_scores`` and
``hook_pattern`` can fire: every pass materialises ``[batch head_index query_pos key_pos]``
scores and patterns, even when nothing reads them. A profile, a position-resolved similarity, a
massive-activation scan or a residual-stream patching pass reads only the residual stream.
For such a pass :func:`fast_attention` hands each block's attention back to the wrapped Hugging
Face module (``AttentionBridge``'s plain delegating forward, which still fires ``attn.hook_in``
and ``attn.hook_out``) with the model's attention implementation set to ``"sdpa"``, and restores
both when the pass ends, however it ends. Every hook point outside the attention internals
fires with the same values (equal to eager within float rounding: 3e-6 on the 16 families of
the table it serves, tests/oracles/test_fast_attention.py); user hooks there keep working.

The pass stays eager, exactly as before, whenever the fast path could not be exact:

* a hook of the pass, or one the user attached (``model.add_hook``, ``model.hooks()``), sits
  on an attention-internal hook point (``hook_pattern``, ``hook_attn_scores``, ``hook_q``,
  ``hook_rot_k``, ``hook_cos``, ...: everything under ``blocks.{l}.attn`` but its
  ``hook_in`` / ``hook_out``); positional and attention-bias interventions hook there;
* the backend is ``HookedTransformer`` (TransformerLens computes its own attention);
* the Hugging Face model does not support SDPA (GPT-Neo, BLOOM, MPT), soft-caps its attention
  logits (Gemma 2), or the bridge is configured to split the attention input per head
  (``use_split_qkv_input``, ``use_attn_in``, ``use_attn_result``).

The last one prints a one-line notice, once per model.

Half precision takes the fast path too. In float16 / bfloat16 neither path is the truth: eager
rounds the scores and the pattern to the model's dtype, SDPA (flash / memory-efficient kernels)
keeps its softmax in float32; each is judged by its distance from the same model in float32,
and SDPA is the closer (docs/performance.md, "Half precision", gives each statistic's tolerance
per dtype). In float32 the fast path equals eager within rounding (3e-6 on the table's
families).

The rotary tables (``blocks.{l}.attn.hook_cos`` / ``hook_sin``) are not attention internals
here: the fast path fires them on the ``position_embeddings`` the Hugging Face decoder layer
hands its attention module, as the bridge's own forward does, so a rotary position ablation
keeps SDPA (:func:`homoglens.position_ablation_hooks`).

Passes that read or change attention (sink scores, attention received, the attention-bias
study, the length sweep) declare :class:`~homoglens.run.blocked_attention.AttentionJob` objects per
block instead of hooks on ``hook_pattern``: on the fast path they run inside the
``"homoglens"`` attention function, a block of queries at a time (no ``[batch head_index
query_pos key_pos]`` tensor of a whole layer; :mod:`homoglens.run.blocked_attention`); elsewhere
they run as hooks on the eager pattern.

Normalisation takes a lean path too. The bridge's LayerNorm / RMSNorm components compute the
norm's statistics a second time for ``hook_scale`` and ``hook_normalized`` (and for LayerNorm
recompute the whole norm in Python): two to seven times the Hugging Face module's own time, about
2.5 % of a forward pass at T = 128. Where neither of those hook points is hooked, a pass runs
``hook_in``, the Hugging Face module, ``hook_out``. Where the bridge's own forward would return
that module's output (TransformerLens' native-autograd path: RMSNorm families) the result is the
same bit for bit, so every pass takes it, those that read attention patterns included; where the
bridge recomputes the norm in Python (LayerNorm families) only passes on the SDPA path take it,
and only with raw weights (after ``enable_compatibility_mode()`` the norms carry folded weights).

``homoglens.run.fast_attention.ENABLED = False`` (or the environment variable ``HOMOGLENS_EAGER=1``)
turns the fast path off everywhere.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import types
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import torch

from homoglens.core.types import HookedModel, HookSpec
from homoglens.models.architectures import (
    ATTENTION_POSITION_POINTS,
    ATTENTION_SPEAKING_POINTS,
    pattern_hook_name,
)
from homoglens.run.blocked_attention import ATTENTION_NAME, AttentionJob, active_jobs, pattern_hook

__all__ = ["ENABLED", "fast_attention", "fast_attention_status", "serves_jobs"]

ENABLED: bool = os.environ.get("HOMOGLENS_EAGER", "") not in ("1", "true", "yes")
"""Whether residual-only passes may run SDPA attention (see the module's docstring)."""

_SPEAKING = ATTENTION_SPEAKING_POINTS  # attention hook points the delegating forward fires
_POSITIONS = ATTENTION_POSITION_POINTS  # fired too, where the module is handed the tables
_STATUS: weakref.WeakKeyDictionary[Any, _Status] = weakref.WeakKeyDictionary()
_TOLD: weakref.WeakSet[Any] = weakref.WeakSet()
_NORMS: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
_T = TypeVar("_T")


def fast_attention_status(model: HookedModel) -> str:
    """``"sdpa"`` where residual-only passes of ``model`` run SDPA attention, else the reason
    they stay eager (one line). Passes that hook attention internals are eager either way.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.

    Returns:
        ``"sdpa"`` or ``"eager: "`` and the reason (the backend, the family, the dtype, or the
        switch turned off).

    References:
        PyTorch ``torch.nn.functional.scaled_dot_product_attention``; Hugging Face transformers'
        ``attn_implementation`` ("sdpa", "eager"); Dao et al. 2022, arXiv 2205.14135
        (FlashAttention, the memory-efficient kernels SDPA dispatches to).

    Examples:
        >>> from homoglens import fast_attention_status, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> fast_attention_status(load_model(tiny_model_folder("llama"), backend="bridge"))
        'sdpa'
    """
    if not ENABLED:
        return (
            "eager: turned off (homoglens.run.fast_attention.ENABLED = False or HOMOGLENS_EAGER=1)"
        )
    return _status(model).status


class _Status(NamedTuple):
    status: str
    """``"sdpa"`` or ``"eager: "`` and the reason."""
    internal: frozenset[int]
    """ids of the attention-internal hook points (empty: not a bridge of attention bridges)."""
    modules: dict[int, int]
    """id of each block's Hugging Face attention module -> its block, where every module runs
    through transformers' attention interface (the ``"homoglens"`` function can serve them);
    empty otherwise."""


def serves_jobs(model: HookedModel) -> bool:
    """Whether passes of ``model`` run attention jobs inside the ``"homoglens"`` attention
    function (the fast path is on, the model is a bridge whose Hugging Face attention supports
    SDPA and looks its attention function up), rather than as hooks on the eager pattern."""
    found = _status(model) if ENABLED else None
    return found is not None and found.status == "sdpa" and bool(found.modules)


def _status(model: Any) -> _Status:
    """The model's :class:`_Status`, cached per model."""
    try:
        return _STATUS[model]
    except (KeyError, TypeError):
        pass
    return _remember(_STATUS, model, _inspect(model))


def _remember(cache: weakref.WeakKeyDictionary[Any, _T], model: Any, found: _T) -> _T:
    """Keep ``found`` as ``model``'s entry of ``cache`` (not for a model that cannot be a weak
    key) and return it."""
    try:
        cache[model] = found
    except TypeError:
        pass
    return found


def _inspect(model: Any) -> _Status:
    try:
        from transformer_lens.hook_points import HookPoint
        from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
    except ImportError:  # pragma: no cover - every supported TransformerLens has both
        return _Status("eager: this TransformerLens has no AttentionBridge", frozenset(), {})
    hf = getattr(model, "original_model", None)
    blocks = getattr(model, "blocks", None)
    if hf is None or blocks is None:
        return _Status("eager: HookedTransformer computes its own attention", frozenset(), {})
    attns = [getattr(block, "attn", None) for block in blocks]
    if not attns or not all(isinstance(a, AttentionBridge) for a in attns):
        reason = "eager: a block's attention is not a TransformerLens AttentionBridge"
        return _Status(reason, frozenset(), {})
    attns = [a for a in attns if isinstance(a, AttentionBridge)]  # (for the type checker)
    internal = frozenset(
        id(module)
        for attn in attns
        for name, module in attn.named_modules()
        if isinstance(module, HookPoint)
        and name not in _SPEAKING
        and not (name in _POSITIONS and _fires_positions(attn))
    )

    def eager(reason: str) -> _Status:
        return _Status(f"eager: {reason}", internal, {})

    cfg = model.cfg
    for flag in ("use_split_qkv_input", "use_attn_in", "use_attn_result"):
        if getattr(cfg, flag, False):
            return eager(f"cfg.{flag} is set (the bridge splits attention per head)")
    config = getattr(hf, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return eager("the Hugging Face model has no attention implementation to switch")
    if not getattr(hf, "_supports_sdpa", False):
        return eager(f"{type(hf).__name__} does not support SDPA attention")
    for attn in attns:
        original = attn.original_component
        cap = getattr(original, "attn_logit_softcapping", None)
        cap = cap if cap is not None else getattr(config, "attn_logit_softcapping", None)
        if cap is not None:
            return eager("the attention logits are soft-capped (SDPA cannot)")
    modules: dict[int, int] = {}
    if all(_uses_interface(type(attn.original_component)) for attn in attns):
        modules = {id(attn.original_component): i for i, attn in enumerate(attns)}
    return _Status("sdpa", internal, modules)


@functools.cache
def _uses_interface(cls: type) -> bool:
    """Whether a Hugging Face attention class looks its attention function up in transformers'
    ``ALL_ATTENTION_FUNCTIONS`` (so the ``"homoglens"`` function serves it)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source


def _fires_positions(attn: Any) -> bool:
    """Whether the fast path fires this attention bridge's ``hook_cos`` / ``hook_sin``: the
    bridge has them (``_apply_position_embedding_hooks``) and its Hugging Face module is handed
    ``position_embeddings`` (rather than computing its rotation itself, as GPT-J does)."""
    if not hasattr(attn, "_apply_position_embedding_hooks"):
        return False
    try:
        params = inspect.signature(type(attn.original_component).forward).parameters
    except (TypeError, ValueError):
        return False
    return "position_embeddings" in params


def _norms(model: Any) -> list[Any]:
    """The bridge's normalisation components whose unhooked output is their Hugging Face
    module's output (``NormalizationBridge``, ``RMSNormalizationBridge``; not the weightless
    LNPre / RMSPre of processed weights), cached per model."""
    try:
        return _NORMS[model]
    except (KeyError, TypeError):
        pass
    try:
        from transformer_lens.model_bridge.generalized_components.normalization import (
            NormalizationBridge,
        )
        from transformer_lens.model_bridge.generalized_components.rms_normalization import (
            RMSNormalizationBridge,
        )
    except ImportError:  # pragma: no cover - every supported TransformerLens has both
        return []
    kinds = (NormalizationBridge, RMSNormalizationBridge)
    found = [
        module
        for module in model.modules()
        if type(module) in kinds
        and isinstance(getattr(module, "original_component", None), torch.nn.Module)
        and not isinstance(module.original_component, torch.nn.Identity)
    ]
    return _remember(_NORMS, model, found)


def _native(norm: Any) -> bool:
    """Whether the bridge's unhooked forward of ``norm`` returns its Hugging Face module's
    output as it is (TransformerLens' native-autograd path) rather than a Python recomputation."""
    config = getattr(norm, "config", None)
    return bool(
        getattr(norm, "use_native_layernorm_autograd", False)
        or getattr(config, "layer_norm_folding", False)
    )


def _lean_norm_forward(self: Any, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """A normalisation bridge's forward with nothing hooked inside it: ``hook_in``, the Hugging
    Face module, ``hook_out``.

    The bridge's own forward first computes the statistics again, for ``hook_scale`` and
    ``hook_normalized``, and then either calls the same module or recomputes the norm in
    Python: two to seven times the module's own time. Another thread's pass (a user's
    ``model(x)`` while a measurement runs) takes the bridge's own forward.
    """
    if _OWNER.get(id(self)) != threading.get_ident():
        return type(self).forward(self, hidden_states, **kwargs)
    x = self.hook_in(hidden_states)
    out = self.original_component(x)
    return self.hook_out(out if out.dtype == x.dtype else out.to(x.dtype))


def _touched(
    model: Any, fwd_hooks: Sequence[HookSpec], groups: Sequence[frozenset[int]]
) -> list[bool]:
    """For each group of hook points (ids): whether a hook of the pass, or one already
    attached, sits on one of them (a name filter or an unknown name counts for every group)."""
    hook_dict = getattr(model, "hook_dict", {})
    touched = [False] * len(groups)
    for name, _ in fwd_hooks:
        if not isinstance(name, str) or name not in hook_dict:
            return [True] * len(groups)  # let the bridge's own path handle it
        for i, group in enumerate(groups):
            touched[i] = touched[i] or id(hook_dict[name]) in group
    for point in hook_dict.values():
        if point._forward_hooks or point._forward_pre_hooks or point._backward_hooks:
            for i, group in enumerate(groups):
                touched[i] = touched[i] or id(point) in group
    return touched


def _configs(model: Any) -> list[Any]:
    """Every distinct config object whose ``_attn_implementation`` the pass reads."""
    hf = model.original_model
    found: dict[int, Any] = {}
    for config in (
        getattr(hf, "config", None),
        getattr(getattr(hf, "config", None), "text_config", None),
        *(getattr(block.attn.original_component, "config", None) for block in model.blocks),
    ):
        if config is not None and hasattr(config, "_attn_implementation"):
            found[id(config)] = config
    return list(found.values())


def _fast_attention_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """An attention bridge's forward on the fast path: ``hook_in``, the Hugging Face module (its
    attention function: SDPA, or homoglens' for a pass with attention jobs), ``hook_out``; the
    rotary tables the module is handed go through the bridge's ``hook_cos`` / ``hook_sin``
    first, as in the bridge's own forward. Another thread's pass (a user's ``model(x)`` while
    a measurement runs) takes the bridge's own forward."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    if _OWNER.get(id(self)) != threading.get_ident():
        return type(self).forward(self, *args, **kwargs)

    tables = kwargs.get("position_embeddings")
    if tables is not None and hasattr(self, "_apply_position_embedding_hooks"):
        kwargs["position_embeddings"] = self._apply_position_embedding_hooks(tables)
    return AttentionBridge.forward(self, *args, **kwargs)


_OWNER: dict[int, int] = {}
"""``{id(module): thread}``: the thread whose pass a replaced forward serves (the model's lock,
held by that pass, keeps it to one thread per model)."""


def _job_hooks(jobs: Mapping[int, AttentionJob]) -> list[HookSpec]:
    """The jobs as hooks on the eager pattern (``blocks.{l}.attn.hook_pattern``)."""
    return [(pattern_hook_name(layer), pattern_hook(job)) for layer, job in jobs.items()]


@contextmanager
def fast_attention(
    model: HookedModel,
    fwd_hooks: Sequence[HookSpec] = (),
    jobs: Mapping[int, AttentionJob] | None = None,
) -> Iterator[list[HookSpec]]:
    """For the pass run inside the block: SDPA attention where it is exact for the hooks
    attached (see the module docstring), restored however the block ends; the attention
    ``jobs`` run inside the attention function where it serves the model, else as hooks on the
    eager pattern, which the block yields for the pass to attach.

    Args:
        model: The model the pass runs.
        fwd_hooks: The ``(hook name, function)`` pairs the pass will attach.
        jobs: ``{block: AttentionJob}`` of the pass (their ``calls`` are reset to 0).

    Yields:
        The hooks the pass must attach besides ``fwd_hooks`` (the jobs on the eager pattern;
        empty when the jobs run inside the attention function).
    """
    jobs = dict(jobs or {})
    for job in jobs.values():
        job.calls = 0
    found = _status(model) if ENABLED else None
    if found is None or not found.internal:  # off, or not a bridge of attention bridges
        yield _job_hooks(jobs)
        return
    if found.status != "sdpa" and model not in _TOLD:  # say once why the attention stays eager
        _TOLD.add(model)
        warnings.warn(
            f"homoglens: residual-only passes run eager attention ({found.status[7:]})",
            stacklevel=3,
        )
    norms = _norms(model)
    norm_internal = frozenset(
        id(point) for norm in norms for point in (norm.hook_scale, norm.hook_normalized)
    )
    touched_attention, touched_norms = _touched(model, fwd_hooks, (found.internal, norm_internal))
    sdpa = found.status == "sdpa" and not touched_attention
    blocked = sdpa and bool(found.modules)
    if jobs and not blocked:  # the jobs read the eager pattern
        sdpa = False
    # Norms: where the bridge's own forward ends in its Hugging Face module's output (native
    # autograd), the lean forward is that output bit for bit, so every pass takes it. Where the
    # bridge recomputes the norm in Python, the module's output differs by rounding: only
    # passes on the SDPA path take it (inexact at that level already), and only with raw
    # weights (after enable_compatibility_mode() those norms carry folded weights).
    if touched_norms:
        norms = []
    elif not sdpa or getattr(model, "_weights_processed", False):
        norms = [norm for norm in norms if _native(norm)]
    attns = [block.attn for block in model.blocks] if sdpa else []  # type: ignore[attr-defined]
    configs = _configs(model) if sdpa else []
    saved = [config._attn_implementation for config in configs]
    implementation = ATTENTION_NAME if jobs else "sdpa"
    by_module = {}
    if jobs:
        block_of = {layer: module for module, layer in found.modules.items()}
        by_module = {block_of[layer]: job for layer, job in jobs.items()} if sdpa else {}
    owner = threading.get_ident()
    try:
        for config in configs:
            config._attn_implementation = implementation
        for attn in attns:  # an instance attribute, past the bridge's own __setattr__
            _OWNER[id(attn)] = owner
            object.__setattr__(attn, "forward", types.MethodType(_fast_attention_forward, attn))
        for norm in norms:
            _OWNER[id(norm)] = owner
            object.__setattr__(norm, "forward", types.MethodType(_lean_norm_forward, norm))
        with active_jobs(by_module):
            yield [] if sdpa else _job_hooks(jobs)
    finally:
        for module in (*attns, *norms):
            if "forward" in module.__dict__:
                object.__delattr__(module, "forward")
            _OWNER.pop(id(module), None)
        for config, value in zip(configs, saved, strict=True):
            config._attn_implementation = value
