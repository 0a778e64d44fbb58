"""Load a local Hugging Face folder with TransformerLens: the shipped and embedded models' folders
and the user's own, each checked before loading (config, decoder-only architecture, weights that
match the config and are complete, a tokenizer). Part of
:func:`homoglens.models.loading.load_model`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

from homoglens.core.errors import (
    HomoglensError,
    IncompleteModelFolderError,
    InvalidInputError,
    ModelFolderNotFoundError,
    UnsupportedArchitectureError,
)
from homoglens.core.types import Backend
from homoglens.core.validate import first_few
from homoglens.models.architectures import find_architecture, is_decoder_only, supported_families
from homoglens.models.assets import (
    EMBEDDED_MODELS,
    SHIPPED_MODELS,
    TOKENIZER_FILES,
    TRAINED_NAME,
    deprecations_shown,
    embedded_model_folder,
    gpt2_tokenizer_folder,
    has_tokenizer,
    shipped_model_folder,
)
from homoglens.models.backends import LoadOptions, load_bridge, load_folder_hooked

__all__ = ["load_from_folder", "resolve_source"]


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


def _shipped_source(folder: Path) -> str:
    """The provenance source of a shipped model, from its folder's ``training.json``."""
    record = json.loads((folder / "training.json").read_text())
    return (
        f"shipped with homoglens: trained by homoglens.training.train (variant "
        f"{record['config']['variant']}"
        + (", BOS at every window" if record["config"].get("bos") else "")
        + f", seed {record['config']['seed']}, held-out loss "
        f"{record['heldout_loss']:.3f} nats/token on {record['heldout']})"
    )


def _embedded_source(folder: Path) -> str:
    """The provenance source of the embedded model, from its folder's
    ``homoglens_provenance.json``."""
    prov = json.loads((folder / "homoglens_provenance.json").read_text())
    return (
        f"{prov['package']} {prov['package_version']}: {prov['gguf_file']} ({prov['quantization']})"
    )


def resolve_source(
    name_or_path: str | os.PathLike[str], name: str, hub: dict[str, Any]
) -> tuple[Path, str, bool]:
    """Resolve a name to its folder: a shipped model, the embedded model (converted from its
    GGUF on first use) or a path; anything else is a Hub name.

    Args:
        name_or_path: The argument as given (an ``os.PathLike`` is always a path).
        name: Its text.
        hub: The revision or checkpoint keywords (a folder takes none).

    Returns:
        The folder (for a Hub name: ``name`` as a path, unused), the provenance source of a
        shipped or embedded model (``""`` otherwise) and whether it is a folder.

    Raises:
        ModelFolderNotFoundError: a path that does not exist.
        InvalidInputError: a Hub version asked for a folder.
    """
    source = ""
    if name not in SHIPPED_MODELS and TRAINED_NAME.fullmatch(name):
        shipped_model_folder(name)  # raises: names the training command
    if name in SHIPPED_MODELS:
        folder = shipped_model_folder(name)
        source = _shipped_source(folder)
    elif name in EMBEDDED_MODELS:
        folder = embedded_model_folder(name)
        source = _embedded_source(folder)
    else:
        folder = Path(name).expanduser()
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
    return folder, source, is_folder


def _check_folder(folder: Path) -> tuple[str, Path]:
    """Check a model folder before loading it: a config.json naming a decoder-only
    architecture, weights that match it and are complete, and a tokenizer (a GPT-2 folder
    without one gets the real GPT-2 BPE tokenizer). Returns the Hugging Face architecture name
    and the tokenizer's folder; raises the errors :func:`homoglens.models.loading.load_model` lists
    for a folder."""
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
    return hf_architecture, tokenizer_dir


def load_from_folder(
    folder: Path, backend: Backend, resolved: str, options: LoadOptions
) -> tuple[Any, str]:
    """Check a model folder and load it with the backend resolved (``"auto"`` falls back to
    the bridge where ``HookedTransformer`` cannot convert the architecture).

    Args:
        folder: The model folder.
        backend: The backend asked for (``"auto"``, ``"hooked"`` or ``"bridge"``).
        resolved: The backend ``backend`` resolved to.
        options: The checked load options.

    Returns:
        The model and the backend that loaded it.

    Raises:
        ModelFolderNotFoundError: no config.json or no weights.
        UnsupportedArchitectureError: not a decoder-only causal LM, or not loadable with the
            backend asked for.
        IncompleteModelFolderError: weights missing tensors the architecture needs.
        InvalidInputError: no tokenizer, weights that do not match the config, or a load that
            failed otherwise (corrupt weights, bad config values).
    """
    hf_architecture, tokenizer_dir = _check_folder(folder)
    model: Any = None
    try:
        if resolved == "hooked":
            try:
                model = load_folder_hooked(
                    folder,
                    tokenizer_dir,
                    hf_architecture,
                    options.device,
                    options.dtype,
                    options.process_weights,
                    options.n_devices,
                )
            except UnsupportedArchitectureError:
                if backend != "auto":
                    raise
                resolved = "bridge"  # "auto": the bridge loads what HookedTransformer cannot
        if resolved == "bridge":
            model = load_bridge(
                str(folder),
                tokenizer_dir,
                options.device,
                options.dtype,
                options.process_weights,
                options.placement,
            )
    except Exception as err:  # corrupt weights, bad config values, ...
        if isinstance(err, HomoglensError):
            raise
        raise InvalidInputError(
            f"could not load the model folder {str(folder)!r}: {type(err).__name__}: "
            f"{str(err)[:300]}. Check that its weights and config.json belong together "
            "(e.g. re-save with model.save_pretrained(folder))"
        ) from err
    return model, resolved
