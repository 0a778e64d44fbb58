"""Model objects in: a ``transformers`` causal LM or an nnsight ``LanguageModel`` the user
already holds, wrapped in a TransformerLens ``TransformerBridge`` without copying its weights.

:func:`as_hooked` is called at the top of every public measurement that takes a model (a
TransformerLens model passes through unchanged) and by :func:`homoglens.models.loading.load_model`.

How the user's object stays unchanged: ``TransformerBridge.boot_transformers(hf_model=...)``
rewrites the model it is given in place (it swaps every submodule for a bridge component and
switches the attention implementation to eager). homoglens therefore hands it a *structural
twin*: new module objects and a copied config, holding the user's very ``Parameter`` and buffer
tensors (no weight is copied; dtype, device and an accelerate device map stay what they are).
The user's object keeps its modules, config (``_attn_implementation``), hooks, training mode,
devices and ``requires_grad`` flags. Hooks attached to the object (``register_forward_hook``)
do not run inside homoglens' passes; attach them to the bridge's hook points instead.

The twin is cached per object, weakly (wrapping the same object again costs a dictionary
look-up) and rebuilt when the object's parameters, device or dtype have changed since.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from homoglens.core.errors import (
    InvalidInputError,
    ModelStateError,
    UnsupportedArchitectureError,
)
from homoglens.core.types import HookedModel
from homoglens.models.architectures import is_decoder_only, supported_families

__all__ = [
    "ACCEPTED_MODELS",
    "as_hooked",
    "is_model_object",
    "underlying_module",
    "wrap_model_object",
]

ACCEPTED_MODELS = (
    "a TransformerLens HookedTransformer or TransformerBridge, a transformers "
    "PreTrainedModel of a decoder-only causal LM (...ForCausalLM / ...LMHeadModel, e.g. "
    "AutoModelForCausalLM.from_pretrained(...)), or an nnsight LanguageModel wrapping one"
)

# Hook dictionaries of torch.nn.Module: the twin starts with fresh, empty ones.
_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)

# user object -> {(tokenizer id, state key): bridge}
_WRAPPED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()


def _is_tl_model(model: Any) -> bool:
    return (
        hasattr(model, "cfg") and hasattr(model, "hook_dict") and hasattr(model, "run_with_hooks")
    )


def _nnsight_inner(model: Any) -> Any | None:
    """The ``torch`` module inside an nnsight model (``LanguageModel``, ``NNsight``), else
    ``None``. Read without importing nnsight (``_module`` of its ``Envoy``)."""
    if not type(model).__module__.startswith("nnsight"):
        return None
    try:
        inner = object.__getattribute__(model, "_module")
    except AttributeError:
        return None
    return inner if isinstance(inner, torch.nn.Module) else None


def underlying_module(model: Any) -> Any:
    """The ``torch`` module of a model object: an nnsight model's underlying model, else
    ``model`` itself."""
    inner = _nnsight_inner(model)
    return model if inner is None else inner


def is_model_object(model: Any) -> bool:
    """Whether ``model`` is a model object :func:`as_hooked` wraps (a ``torch.nn.Module`` that
    is not a TransformerLens model, or an nnsight model), as opposed to a TransformerLens model
    or anything else."""
    if _is_tl_model(model):
        return False
    return isinstance(model, torch.nn.Module) or _nnsight_inner(model) is not None


def refuse_in_context(model: Any, what: str) -> None:
    """Refuse a model object in a context manager that changes a model's own passes (``what``,
    e.g. ``"ablated_positions"``): homoglens leaves the object unchanged, so the object's own
    forward inside the block would not see the change, and its outputs would silently be the
    unchanged model's.

    Anything else (a TransformerLens model, or what is no model at all) passes, for the
    context manager's own checks.

    Raises:
        InvalidInputError: ``model`` is a ``transformers`` / nnsight model object.
    """
    from transformers import PreTrainedModel

    inner = _nnsight_inner(model)
    if inner is not None or (is_model_object(model) and isinstance(model, PreTrainedModel)):
        raise InvalidInputError(
            f"{what}(...) changes the passes of a TransformerLens model, and homoglens leaves "
            f"your {type(model).__name__} unchanged, so its own forward inside the block would "
            "not see the change. Wrap it once (its weights are shared, not copied): "
            f"model = homoglens.load_model(obj); then `with {what}(model, ...): model(tokens)`"
        )


def _check_hf_model(hf: Any, given: Any) -> str:
    """Refuse what the bridge cannot wrap as a decoder-only causal LM; return the Hugging Face
    architecture (class) name."""
    from transformers import PreTrainedModel

    name = type(hf).__name__
    if not isinstance(hf, PreTrainedModel):
        raise InvalidInputError(
            f"got a {type(given).__module__}.{type(given).__name__}, which homoglens cannot "
            f"measure. Accepted: {ACCEPTED_MODELS}"
        )
    config = getattr(hf, "config", None)
    if bool(getattr(config, "is_encoder_decoder", False)) or not is_decoder_only(name):
        raise UnsupportedArchitectureError(
            f"got a {name}, not a decoder-only causal language model; homoglens measures the "
            f"residual stream of causal LMs. Accepted: {ACCEPTED_MODELS}. Load the causal-LM "
            f"class (AutoModelForCausalLM). Families with positional interventions: "
            f"{supported_families()}"
        )
    meta = [n for n, p in hf.named_parameters() if p.is_meta]
    if meta:
        raise ModelStateError(
            f"{len(meta)} weight(s) of the {name} are on the 'meta' device (no values; e.g. an "
            "nnsight LanguageModel not yet dispatched). Load real weights first: "
            "LanguageModel(..., dispatch=True), or AutoModelForCausalLM.from_pretrained(...)"
        )
    return name


@contextlib.contextmanager
def _tokenizer_folder(hf: Any, tokenizer: Any, family_hint: str) -> Iterator[Path]:
    """The folder the bridge's tokenizer is loaded from (a fresh copy, so the user's tokenizer
    object is never modified): an in-memory one is saved to a temporary folder first, removed
    once the copy is loaded."""
    from homoglens.models.assets import gpt2_tokenizer_folder, has_tokenizer

    if tokenizer is not None:
        if not hasattr(tokenizer, "save_pretrained"):
            raise InvalidInputError(
                f"tokenizer={type(tokenizer).__name__} is not a transformers tokenizer; pass "
                "AutoTokenizer.from_pretrained(folder)"
            )
        source = getattr(tokenizer, "name_or_path", "") or ""
        if source and Path(source).is_dir() and has_tokenizer(Path(source)):
            yield Path(source)
            return
        with tempfile.TemporaryDirectory(prefix="homoglens-tokenizer-") as folder:
            tokenizer.save_pretrained(folder)
            yield Path(folder)
        return
    for source in (
        getattr(hf, "name_or_path", None),
        getattr(getattr(hf, "config", None), "_name_or_path", None),
    ):
        if source and os.path.isdir(str(source)) and has_tokenizer(Path(str(source))):
            yield Path(str(source))
            return
    if family_hint.startswith("GPT2"):
        yield gpt2_tokenizer_folder()
        return
    raise InvalidInputError(
        f"no tokenizer found for the {family_hint}: its name_or_path "
        f"({getattr(hf, 'name_or_path', '')!r}) is not a folder holding one. Pass it: "
        "tokenizer=AutoTokenizer.from_pretrained(...)"
    )


def _twin(model: torch.nn.Module) -> torch.nn.Module:
    """A structural twin of ``model``: new module objects sharing every ``Parameter`` and buffer
    (no tensor is copied), with a deep-copied config and no hooks. An accelerate device-map hook
    (``_hf_hook``) is re-attached to the twin; instance ``forward`` overrides (accelerate's,
    nnsight's) are dropped from it."""
    config = getattr(model, "config", None)
    configs: dict[int, Any] = {}
    if config is not None:
        copy.deepcopy(config, configs)
    done: dict[int, torch.nn.Module] = {}
    accelerate_hooks: list[tuple[torch.nn.Module, Any]] = []

    def clone(module: torch.nn.Module) -> torch.nn.Module:
        if id(module) in done:
            return done[id(module)]
        cls = type(module)
        new = cls.__new__(cls)
        state = dict(module.__dict__)
        for key in ("forward", "_hf_hook", "_old_forward"):
            state.pop(key, None)
        new.__dict__.update(state)
        done[id(module)] = new
        new._parameters = dict(module._parameters)
        new._buffers = dict(module._buffers)
        new._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
        for name in _HOOK_DICTS:
            if name in state:
                setattr(new, name, OrderedDict())
        new._modules = {k: (None if c is None else clone(c)) for k, c in module._modules.items()}
        own = state.get("config")
        if own is not None and id(own) in configs:
            new.__dict__["config"] = configs[id(own)]
        hook = module.__dict__.get("_hf_hook")
        if hook is not None:
            accelerate_hooks.append((new, hook))
        return new

    twin = clone(model)
    if accelerate_hooks:
        from accelerate.hooks import add_hook_to_module

        for new, hook in accelerate_hooks:
            add_hook_to_module(new, hook)
    return twin


def _state_key(hf: torch.nn.Module) -> tuple[Any, ...]:
    """What must not have changed for a cached wrapper to be reused: the parameter objects,
    and the device and dtype of the first."""
    params = list(hf.parameters())
    first = params[0] if params else None
    return (
        tuple(id(p) for p in params),
        str(first.device) if first is not None else "",
        str(first.dtype) if first is not None else "",
    )


def wrap_model_object(model: Any, tokenizer: Any = None) -> tuple[HookedModel, str]:
    """Wrap a ``transformers`` causal LM or an nnsight ``LanguageModel`` in a
    ``TransformerBridge`` without copying its weights (see the module docstring).

    Args:
        model: A ``transformers.PreTrainedModel`` (decoder-only) or an nnsight model.
        tokenizer: Its tokenizer; default: the nnsight model's, else the one saved in the
            folder of ``model.name_or_path`` / ``config._name_or_path`` (a GPT-2 model without
            one gets the real GPT-2 BPE tokenizer).

    Returns:
        The bridge (raw weights, eval mode; cached per object, weakly) and its provenance
        source (``"transformers object <class>"`` or ``"nnsight LanguageModel (<class>)"``).

    Raises:
        InvalidInputError: not a model homoglens can wrap, or no tokenizer found.
        UnsupportedArchitectureError: not a decoder-only causal LM (BERT, T5, ...).
        ModelStateError: weights on the ``meta`` device.
    """
    inner = _nnsight_inner(model)
    hf = inner if inner is not None else model
    name = _check_hf_model(hf, model)
    if inner is not None:
        source = f"nnsight {type(model).__name__} ({name})"
        if tokenizer is None:
            tokenizer = getattr(model, "tokenizer", None)
    else:
        source = f"transformers object {name}"
    key = (id(tokenizer) if tokenizer is not None else None, *_state_key(hf))
    known = _WRAPPED.get(hf)
    if known is not None and key in known:
        return known[key], source
    with _tokenizer_folder(hf, tokenizer, name) as folder:
        bridge = _boot(hf, folder, name)
    _WRAPPED.setdefault(hf, {}).clear()
    _WRAPPED[hf][key] = bridge
    return bridge, source


def _boot(hf: torch.nn.Module, tokenizer_folder: Path, name: str) -> Any:
    """Boot the bridge on a twin of ``hf`` (its tokenizer from ``tokenizer_folder``)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    from homoglens.models.assets import deprecations_shown

    params = list(hf.parameters())
    dtype = params[0].dtype if params else torch.float32
    twin = _twin(hf)
    try:
        with deprecations_shown():
            bridge = TransformerBridge.boot_transformers(
                str(getattr(hf, "name_or_path", "") or name),
                hf_model=twin,
                tokenizer=AutoTokenizer.from_pretrained(str(tokenizer_folder)),
                dtype=dtype,
            )
    except Exception as err:
        raise UnsupportedArchitectureError(
            f"TransformerLens' bridge could not wrap the {name} ({type(err).__name__}: "
            f"{str(err)[:300]}). Accepted: {ACCEPTED_MODELS}"
        ) from err
    return bridge.eval()


def as_hooked(model: Any, tokenizer: Any = None) -> HookedModel:
    """Return a TransformerLens model for ``model``: a TransformerLens model as it is; a
    ``transformers`` causal LM or an nnsight ``LanguageModel`` wrapped. Anything else is
    returned as given, for the measurement's own check to refuse with its message.

    The object is wrapped in a ``TransformerBridge`` without copying its weights: the bridge
    runs a twin of its module tree that holds the very same tensors, raw and as they are (dtype,
    device and device map kept). The object itself is left unchanged (modules, config and
    ``_attn_implementation``, hooks, training mode, devices, ``requires_grad``); hooks attached
    to it do not run in homoglens' passes. The wrapper is cached per object, weakly (wrapping it
    again is free; a changed dtype or device re-wraps). Provenance (``model_source``) says
    ``"transformers object <class>"`` or ``"nnsight LanguageModel (<class>)"``.

    Args:
        model: The model a measurement was given.
        tokenizer: The tokenizer of a model object (default: found, see
            :func:`wrap_model_object`).

    Returns:
        The TransformerLens model, its provenance recorded for a wrapped object.

    Raises:
        InvalidInputError: an unsupported module, or a model object without a tokenizer.
        UnsupportedArchitectureError: a non-decoder model (BERT, T5, ...).
        ModelStateError: a model object with weights on the ``meta`` device.
    """
    if not is_model_object(model):
        return model
    from homoglens.models.architectures import family_of
    from homoglens.models.state import ModelInfo, remember_loaded

    bridge, source = wrap_model_object(model, tokenizer)
    inner = _nnsight_inner(model)
    hf = inner if inner is not None else model
    remember_loaded(
        bridge,
        ModelInfo(
            name=str(getattr(hf, "name_or_path", "") or type(hf).__name__),
            family=family_of(bridge),
            backend="bridge",
            weights="raw",
            dtype=str(next(bridge.parameters()).dtype).removeprefix("torch."),
            source=source,
        ),
    )
    return bridge
