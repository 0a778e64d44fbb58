"""Build a model with each TransformerLens backend: ``HookedTransformer`` (TransformerLens 3.9)
from a folder or a Hub name, ``TransformerBridge`` from either; and :class:`LoadOptions`, the
checked options of :func:`homoglens.models.loading.load_model` they are built with.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from homoglens.core.errors import UnsupportedArchitectureError
from homoglens.models.assets import deprecations_shown, package_version

__all__ = ["LoadOptions", "load_bridge", "load_folder_hooked", "load_hub_hooked"]


@dataclass(frozen=True)
class LoadOptions:
    """How :func:`homoglens.models.loading.load_model` builds a model, its arguments checked.

    Attributes:
        device: Torch device.
        dtype: Parameter dtype.
        process_weights: Apply TransformerLens' weight processing.
        n_devices: Split the blocks over this many CUDA devices (as given).
        placement: The bridge's multi-device ``boot_transformers`` keywords.
    """

    device: str
    dtype: torch.dtype
    process_weights: bool
    n_devices: int
    placement: dict[str, Any]


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


def load_folder_hooked(
    folder: Path,
    tokenizer_dir: Path,
    hf_architecture: str,
    device: str,
    dtype: torch.dtype,
    process_weights: bool,
    n_devices: int = 1,
) -> Any:
    """Build a ``HookedTransformer`` (TransformerLens 3.9) from a Hugging Face folder.

    Args:
        folder: The model folder (``config.json`` + weights).
        tokenizer_dir: The folder whose tokenizer is used.
        hf_architecture: The Hugging Face architecture name from ``config.json``.
        device: Torch device.
        dtype: Parameter dtype.
        process_weights: Apply TransformerLens' weight processing.
        n_devices: Split the blocks over this many CUDA devices.

    Returns:
        The model in eval mode.

    Raises:
        UnsupportedArchitectureError: HookedTransformer cannot convert this architecture.
    """
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


def load_bridge(
    source: str,
    tokenizer_dir: Path | None,
    device: str,
    dtype: torch.dtype,
    process_weights: bool,
    placement: dict[str, Any] | None = None,
) -> Any:
    """Build a ``TransformerBridge`` with ``boot_transformers``.

    Args:
        source: A folder path or a Hub name.
        tokenizer_dir: The folder whose tokenizer is used; ``None``: TransformerLens picks it.
        device: Torch device.
        dtype: Parameter dtype.
        process_weights: Enable TransformerLens' compatibility mode (processed weights).
        placement: Further ``boot_transformers`` keywords (``device_map``, ``n_devices``, the
            Hub revision or checkpoint).

    Returns:
        The bridge in eval mode.
    """
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


def load_hub_hooked(
    name: str,
    device: str,
    dtype: torch.dtype,
    process_weights: bool,
    n_devices: int = 1,
    hub: dict[str, Any] | None = None,
) -> Any:
    """Build a ``HookedTransformer`` (TransformerLens 3.9) from a Hub name it knows.

    Args:
        name: The official TransformerLens name.
        device: Torch device.
        dtype: Parameter dtype.
        process_weights: ``from_pretrained`` (processed) instead of
            ``from_pretrained_no_processing`` (raw).
        n_devices: Split the blocks over this many CUDA devices.
        hub: The revision or checkpoint keywords.

    Returns:
        The model in eval mode.
    """
    from transformer_lens import HookedTransformer

    hooked = cast(Any, HookedTransformer)  # TransformerLens 3.9 only
    kwargs = {"device": device, "dtype": dtype, "n_devices": n_devices, **(hub or {})}
    with deprecations_shown():
        if process_weights:
            return hooked.from_pretrained(name, **kwargs).eval()
        return hooked.from_pretrained_no_processing(name, **kwargs).eval()
