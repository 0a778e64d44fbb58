"""The one save/load of every result: safetensors + JSON with a format tag, and the
validation of a result's fields (dtypes, shapes, ranges) driven by its annotations.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from homoglens.architectures import resid_hook_name
from homoglens.assets import apply_umask, sync_folder
from homoglens.errors import IncompatibleResultsError, InvalidInputError, ResultsNotFoundError

if TYPE_CHECKING:  # plotting stays a lazy import
    pass


@dataclass(frozen=True)
class Provenance:
    """Where a result came from.

    Attributes:
        model: Model name or path.
        family: Architecture family (``gpt2``, ``neox``, ``llama``, ...; the Hugging Face
            architecture name for a family outside the table) or ``"none"``.
        backend: ``"hooked"``, ``"bridge"`` or ``"none"`` (computed from given activations).
        weights: ``"raw"``, ``"processed"`` (TransformerLens weight processing) or ``"unknown"``.
        dtype: Model dtype (statistics are always accumulated in float64).
        model_source: Extra model provenance (e.g. the embedded GGUF and its quantisation).
        hook_points: TransformerLens hook name of each entry of the layer axis.
        bos: Whether position 0 of every sequence held a BOS token (``None``: mixed).
        data: Description of the data.
        exclude_first: Whether position 0 was left out of every statistic.
        homoglens_version: Package version that computed the result.
        transformer_lens_version: TransformerLens version used (``""`` if none).
        torch_version: torch version used (``""`` if not recorded: results saved before it was).
        transformers_version: Hugging Face transformers version used (``""`` if not recorded).
        model_revision: The model's version: for a Hub name, the ``revision`` or training
            checkpoint asked for (``"revision step1000"``, ``"checkpoint_value 1000"``) and the
            commit of the cached snapshot when known (``"main @ 0123abcd..."``); ``""`` when not
            known (local folders: see ``model_source``).
        data_sha256: Content hash of the data measured: sha256 of the row lengths then the real
            token ids (pads left out), row by row, as little-endian int64 (``""`` if not
            recorded; merged parts join their hashes with ``" + "``).
        foreign_hooks: Hook points (or modules) that held hooks homoglens did not attach when
            the measurement began: they ran in every pass (an intervention's ``with`` block, a
            forgotten permanent hook); ``()`` for a clean model.
        data_rows: A fingerprint of each sequence measured (the first 8 bytes of the sha256
            of its length and real token ids, 16 hex digits each, concatenated; ``""`` if not
            recorded): ``merge`` refuses parts that share any sequence. Left out of ``repr``.
    """

    model: str = "none"
    family: str = "none"
    backend: str = "none"
    weights: str = "unknown"
    dtype: str = ""
    model_source: str = ""
    hook_points: tuple[str, ...] = ()
    bos: bool | None = None
    data: str = ""
    exclude_first: bool = False
    homoglens_version: str = ""
    transformer_lens_version: str = ""
    torch_version: str = ""
    transformers_version: str = ""
    model_revision: str = ""
    data_sha256: str = ""
    foreign_hooks: tuple[str, ...] = ()
    data_rows: str = field(default="", repr=False)


ROW_DIGITS = 16
"""Hex digits of one sequence's fingerprint in :attr:`Provenance.data_rows`."""


HASHES = "sha256"
"""Key of the JSON of a saved result (written last) that records the sha256 of its files:
``{relative path: hex digest}``: its safetensors, each part's JSON for a composite result, and
under the JSON's own name the digest of its own content (:func:`json_digest`). Every loader
refuses a JSON without it, with an empty one, or with one that leaves out a file it reads: there
is no older format (homoglens 0.1.0)."""


def sha256_of(data: bytes) -> str:
    """The sha256 hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def json_digest(meta: dict[str, Any], name: str) -> str:
    """The digest that the JSON ``name`` of a saved result records of its own content: the
    sha256 of its canonical text (``sort_keys``, no spaces) with its own entry ``name`` left
    out of :data:`HASHES` (every other entry, and every label, included)."""
    hashes = meta.get(HASHES)
    if isinstance(hashes, dict):
        meta = {**meta, HASHES: {k: v for k, v in hashes.items() if k != name}}
    text = json.dumps(json.loads(json.dumps(meta)), sort_keys=True, separators=(",", ":"))
    return sha256_of(text.encode())


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: into a sibling temporary file, flushed to disk
    (``fsync``), then renamed over ``path`` (``os.replace``). ``path`` holds its old content or
    the new one, never a part of either; the temporary file is removed on any failure."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    sync_folder(path.parent)


def write_pair(
    folder: Path,
    stem: str,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    parts: Sequence[str] = (),
) -> None:
    """Write ``{stem}.safetensors`` then, last, ``{stem}.json`` (each with :func:`write_file`)
    into ``folder``; the JSON records under :data:`HASHES` the sha256 of the safetensors and of
    each file of ``parts`` (paths relative to ``folder``: the JSON of each part of a composite
    result, written before)."""
    from safetensors.torch import save

    data = save({k: v.contiguous() for k, v in tensors.items()})
    write_file(folder / f"{stem}.safetensors", data)
    hashes = {f"{stem}.safetensors": sha256_of(data)}
    for part in parts:
        hashes[part] = sha256_of((folder / part).read_bytes())
    write_json(folder / f"{stem}.json", {**meta, HASHES: hashes})


def write_json(path: Path, meta: dict[str, Any]) -> None:
    """Write ``meta`` as indented JSON to ``path`` with :func:`write_file`; a result's JSON
    (``meta`` holding :data:`HASHES`) records there, under its own name, the digest of its own
    content (:func:`json_digest`)."""
    if isinstance(meta.get(HASHES), dict):
        hashes = {k: v for k, v in meta[HASHES].items() if k != path.name}
        meta = {**meta, HASHES: hashes}
        meta[HASHES][path.name] = json_digest(meta, path.name)
    write_file(path, json.dumps(meta, indent=2).encode())


def _is_own(folder: Path, name: str, own: Sequence[str]) -> bool:
    """Whether the entry ``name`` of ``folder`` is a file of a saved result: its name matches
    one of the glob patterns ``own``, and a folder holds a homoglens result's JSON."""
    if not any(fnmatch.fnmatchcase(name, pattern) for pattern in own):
        return False
    path = folder / name
    if path.is_symlink() or not path.is_dir():
        return not path.is_symlink()
    for child in (*path.glob("*.json"), *path.glob("*/*.json")):
        with contextlib.suppress(OSError):
            with open(child, "rb") as handle:
                if b'"format": "homoglens.' in handle.read(4096):
                    return True
    return False


def save_folder(
    path: str | Path, write: Callable[[Path], None], own: Sequence[str], manifest: str
) -> Path:
    """Save a result into the folder ``path`` atomically: ``write(tmp)`` writes every file of it
    into a temporary sibling folder, which is then put in place.

    * ``path`` absent, empty or holding nothing but entries of such a result (names matching
      ``own``, glob patterns; a folder among them holding a homoglens result's JSON): the old
      folder is renamed to a backup sibling, the new one to ``path``, and the backup deleted
      (renamed back if the second rename fails).
    * ``path`` holding other entries (the user's): entry by entry. The old entries that the new
      result replaces are moved to a backup sibling first (``manifest``, the result's JSON, first
      of all), then the new entries are moved in (``manifest`` last), then the backup is
      deleted; on a failure the moves are undone. The user's other entries are never touched.

    A save that fails or is interrupted at any step leaves the older result loadable and
    unchanged, or a folder that load refuses (a part missing); never a mix of the two.

    Args:
        path: The folder (created with its parents if missing).
        write: Writes the result's files into the folder it is given.
        own: Glob patterns of the entry names a saved result of this kind holds.
        manifest: The entry written last (its JSON, which records the others' sha256).

    Returns:
        The folder.

    Raises:
        InvalidInputError: ``path`` is not a path (``""``, ``None``), is a file, or its parent
            cannot be created.
    """
    target = folder_path(path)
    if target.exists() and not target.is_dir():
        raise InvalidInputError(f"{str(target)!r} is a file; save() needs a folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInputError(f"cannot create the folder {str(target)!r}: {err}") from None
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
    try:
        write(tmp)
        apply_umask(tmp)
        sync_folder(tmp)
        if not target.exists():
            os.rename(tmp, target)
        elif all(_is_own(target, name, own) for name in os.listdir(target)):
            _swap_folder(tmp, target)
        else:
            _swap_entries(tmp, target, manifest)
        sync_folder(target.parent)
    finally:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _backup_of(target: Path) -> Path:
    return target.with_name(f".{target.name}.replaced-{secrets.token_hex(4)}")


def _swap_folder(new: Path, target: Path) -> None:
    """Replace the folder ``target`` by ``new`` (old -> backup, new -> target, delete backup)."""
    backup = _backup_of(target)
    os.rename(target, backup)
    try:
        os.rename(new, target)
    except BaseException:
        if not os.path.lexists(target):
            os.rename(backup, target)
        raise
    shutil.rmtree(backup, ignore_errors=True)


def _swap_entries(new: Path, target: Path, manifest: str) -> None:
    """Move the entries of ``new`` into ``target``, replacing those of the same name and no
    other (``manifest`` out first and in last); undone on any failure."""
    names = sorted(os.listdir(new), key=lambda name: name == manifest)  # manifest last
    backup = _backup_of(target)
    os.mkdir(backup)
    moved_out: list[str] = []
    moved_in: list[str] = []
    try:
        for name in sorted(names, key=lambda name: name != manifest):  # manifest first
            if os.path.lexists(target / name):
                os.rename(target / name, backup / name)
                moved_out.append(name)
        for name in names:
            os.rename(new / name, target / name)
            moved_in.append(name)
    except BaseException:
        for name in reversed(moved_in):
            with contextlib.suppress(OSError):
                os.rename(target / name, new / name)
        for name in reversed(moved_out):
            with contextlib.suppress(OSError):
                os.rename(backup / name, target / name)
        raise
    finally:
        if not os.listdir(backup) or len(moved_in) == len(names):
            shutil.rmtree(backup, ignore_errors=True)


Parts = Sequence[str] | Callable[[dict[str, Any]], Sequence[str]]
"""The files (relative paths) beside a saved result's JSON that its loader reads, which the
JSON's :data:`HASHES` must record: a list, or a function of the JSON (e.g. of its ``modes``)."""


def read_json(folder: Path, name: str, *, parts: Parts = ()) -> Any:
    """Read the JSON ``name`` of a saved result in ``folder`` and check the sha256 it records
    (:data:`HASHES`, removed from the returned dict): of its own content, of ``parts`` (which
    it must record) and of every other file it lists.

    Raises:
        ResultsNotFoundError: the JSON is missing. IncompatibleResultsError: it is not JSON, it
            records no sha256 or not those of ``parts``, its content was edited, or a file it
            lists is missing or does not match its recorded sha256.
    """
    meta, _ = _read_checked(folder, name, {}, parts)
    return meta


def _unrecorded(path: Path, what: str) -> IncompatibleResultsError:
    return IncompatibleResultsError(
        f"{path} {what}: the result was saved incompletely or edited; save it again"
    )


def _read_checked(
    folder: Path, name: str, read: dict[str, bytes], parts: Parts = ()
) -> tuple[Any, dict[str, str]]:
    """The JSON ``name`` (without :data:`HASHES`) and the sha256 it records, checked: present,
    covering its own content (:func:`json_digest`), the files of ``read`` (already read: name
    -> bytes) and ``parts``, and matching every file it lists."""
    path = folder / name
    if not path.is_file():
        raise ResultsNotFoundError(
            f"{path} not found; is {str(folder)!r} a saved result?{_leftover_hint(folder)}"
        )
    try:
        meta = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise IncompatibleResultsError(
            f"cannot read {path}: {err}; the file is corrupt: save the result again"
        ) from None
    if not isinstance(meta, dict):
        return meta, {}  # not a result: the loader refuses its format
    if not meta.get(HASHES):
        raise _unrecorded(path, f"records no sha256 of its files ({HASHES!r} missing or empty)")
    hashes = meta[HASHES]
    if not isinstance(hashes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _relative(k) for k, v in hashes.items()
    ):
        raise IncompatibleResultsError(
            f"{path} records {HASHES}={hashes!r}, not file names and sha256 digests; the file "
            "was edited: save the result again"
        )
    own = hashes.get(name)
    if own is None:
        raise _unrecorded(path, "records no digest of its own content")
    if own is not None and own != json_digest(meta, name):
        raise _unrecorded(path, "does not match the digest of its content that it records")
    meta.pop(HASHES)
    hashes = {k: v for k, v in hashes.items() if k != name}
    needed = list(read) + list(parts(meta) if callable(parts) else parts)
    missing = [part for part in needed if part not in hashes]
    if missing:
        raise _unrecorded(path, f"records no sha256 of {missing}, which the loader reads")
    for part, digest in hashes.items():
        data = read.get(part)
        if data is None:
            try:
                data = (folder / part).read_bytes()
            except OSError:
                raise IncompatibleResultsError(
                    f"{folder / part}, which {path} records, is missing: the result was saved "
                    "incompletely or edited; save it again"
                ) from None
        if sha256_of(data) != digest:
            raise IncompatibleResultsError(
                f"{folder / part} does not match the sha256 that {path} records: the result "
                "was saved incompletely or edited; save it again"
            )
    return meta, hashes


def _relative(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def _leftover_hint(folder: Path) -> str:
    """Where an interrupted save left the previous version of ``folder``, if it did."""
    try:
        found = sorted(folder.parent.glob(f".{folder.name}.replaced-*"))
    except OSError:
        return ""
    if not found:
        return ""
    return (
        f" An interrupted save left the previous version in {str(found[-1])!r}: move it back "
        "or save the result again"
    )


def read_saved(
    folder: Path, stem: str, *, parts: Parts = ()
) -> tuple[Any, dict[str, torch.Tensor]]:
    """Read ``{stem}.json`` and ``{stem}.safetensors`` of a saved result (never pickle), and
    check the sha256 that the JSON records (:data:`HASHES`; not returned): of its own content,
    of the safetensors and of ``parts`` (which it must record), and of any other part it lists.

    Raises:
        ResultsNotFoundError: a file is missing. IncompatibleResultsError: a file is corrupt,
            the JSON records no sha256 or not those of the files read, or a file does not match
            the sha256 recorded in the JSON (saved incompletely or edited).
    """
    from safetensors.torch import load

    for name in (f"{stem}.json", f"{stem}.safetensors"):
        if not (folder / name).is_file():
            raise ResultsNotFoundError(
                f"{folder / name} not found; is {str(folder)!r} a saved {stem}?"
                f"{_leftover_hint(folder)}"
            )
    try:
        data = (folder / f"{stem}.safetensors").read_bytes()
    except OSError as err:
        raise IncompatibleResultsError(f"cannot read the {stem} in {folder}: {err}") from None
    meta, _ = _read_checked(folder, f"{stem}.json", {f"{stem}.safetensors": data}, parts)
    try:
        tensors = load(data)
    except Exception as err:  # corrupt safetensors
        raise IncompatibleResultsError(
            f"cannot read {folder / (stem + '.safetensors')}: {err}; the file is corrupt: save "
            "the result again"
        ) from None
    return meta, tensors


def _deep_tuple(value: Any) -> Any:
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, list) else value


def folder_path(path: Any) -> Path:
    """``path`` (a ``str`` or ``os.PathLike``, ``~`` expanded) as the folder of a save.

    Raises:
        InvalidInputError: ``path`` is empty, ``None`` or not a path.
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InvalidInputError(
            f"save() needs a folder path (a str or pathlib.Path, e.g. 'results/profile'), got "
            f"{path!r}"
        )
    return Path(path).expanduser()


def prepare_folder(path: str | Path) -> Path:
    """Create the folder ``path`` (parents too) and return it.

    Raises:
        InvalidInputError: ``path`` is not a path (``""``, ``None``), is a file, or cannot be
            created (e.g. a parent is a file).
    """
    folder = folder_path(path)
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"{str(folder)!r} is a file; save() needs a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInputError(f"cannot create the folder {str(folder)!r}: {err}") from None
    return folder


def result_files(result: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensor fields and the JSON of a frozen result dataclass (with its format tag)."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {"format": f"homoglens.{type(result).__name__}/1"}
    for f in fields(result):
        value = getattr(result, f.name)
        if isinstance(value, torch.Tensor):
            tensors[f.name] = value.contiguous()
        elif isinstance(value, Provenance):
            meta[f.name] = asdict(value)
        else:
            meta[f.name] = value
    return tensors, meta


def save_result(result: Any, path: str | Path, stem: str) -> Path:
    """Save a frozen result dataclass as ``{stem}.safetensors`` (its tensor fields) and
    ``{stem}.json`` (every other field, the format ``homoglens.{ClassName}/1`` and the sha256
    of the safetensors), atomically (:func:`save_folder`); no pickle.

    Raises:
        InvalidInputError: ``path`` is a file.
    """
    tensors, meta = result_files(result)
    return save_folder(
        path,
        lambda folder: write_pair(folder, stem, tensors, meta),
        own=(f"{stem}.json", f"{stem}.safetensors"),
        manifest=f"{stem}.json",
    )


_TENSOR_ANNOTATION = re.compile(r"(Float|Int|Bool)\[torch\.Tensor, ['\"]([^'\"]*)['\"]\]")


_LENGTH_OF = {
    "layer": "layers",
    "metric": "metrics",
    "cell": "cells",
    "head": "heads",
    "mode": "modes",
}
"""Named dimensions whose size is the length of another field."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite_number(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


class FieldError(ValueError):
    """A bad value of one field of a result (``field``), for the message naming its file."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Bounds:
    """The values a field (or a derived property) of a saved result may hold, checked on load
    by :func:`validate_result` (declared per class in ``_bounds``; every float tensor field not
    declared must be finite).

    Attributes:
        low: Lower bound (closed; times ``scale``).
        high: Upper bound (closed; times ``scale``).
        nan: Whether NaN is meaningful in the field (documented by the class); inf never is.
        scale: Name of a field that multiplies both bounds: a count tensor (broadcast against
            the values) or an int, for sums of per-sequence values.
        tol: Absolute slack for float rounding (times ``scale``).
    """

    low: float = -math.inf
    high: float = math.inf
    nan: bool = False
    scale: str | None = None
    tol: float = 0.0


FINITE = Bounds()
"""Finite (no NaN, no inf)."""
FINITE_OR_NAN = Bounds(nan=True)
"""Finite or NaN (undefined)."""
COSINE = Bounds(-1.0, 1.0, tol=1e-4)
"""A cosine (or a mean of cosines)."""
COSINE_OR_NAN = Bounds(-1.0, 1.0, nan=True, tol=1e-4)
"""A cosine, or NaN where it is undefined."""
UNIT = Bounds(0.0, 1.0, tol=1e-6)
"""A mass, a rate or a fraction in [0, 1]."""
UNIT_OR_NAN = Bounds(0.0, 1.0, nan=True, tol=1e-6)
"""A mass, a rate or a fraction in [0, 1], or NaN where it is undefined."""
NON_NEGATIVE = Bounds(0.0)
"""A count, an index, a loss or a norm: >= 0."""


def _flat(value: tuple[Any, ...]) -> list[Any]:
    return [v for item in value for v in (_flat(item) if isinstance(item, tuple) else [item])]


def _first_bad(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(mask)[0].tolist())


def check_bounds(result: Any, name: str, bounds: Bounds, value: Any = None) -> None:
    """Check one field (or property) ``name`` of ``result`` against ``bounds``; ``None``
    values (optional fields) pass.

    Raises:
        FieldError: NaN where it is not meaningful, inf, or a value out of bounds (the first
            bad index and value named).
    """
    value = getattr(result, name) if value is None else value
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, torch.Tensor):
        x = value.detach().to("cpu", torch.float64)
    elif isinstance(value, tuple):
        flat = _flat(value)
        if not all(_is_number(v) for v in flat):
            return  # strings: their choices are checked elsewhere
        x = torch.tensor([float(v) for v in flat], dtype=torch.float64)
    elif _is_number(value):
        x = torch.tensor([float(value)], dtype=torch.float64)
    else:
        return
    nan = torch.isnan(x)
    if bool(nan.any()) and not bounds.nan:
        raise FieldError(
            name, f"{name} holds NaN at index {_first_bad(nan)}, where it must be finite"
        )
    if bool(torch.isinf(x).any()):
        raise FieldError(name, f"{name} holds inf at index {_first_bad(torch.isinf(x))}")
    scale: Any = 1.0
    if bounds.scale is not None:
        scale = getattr(result, bounds.scale)
        scale = scale.to("cpu", torch.float64) if isinstance(scale, torch.Tensor) else float(scale)
    low = -math.inf if bounds.low == -math.inf else bounds.low * scale
    high = math.inf if bounds.high == math.inf else bounds.high * scale
    if isinstance(scale, torch.Tensor):
        slack: Any = bounds.tol * scale.abs().clamp_min(1.0)
    else:
        slack = bounds.tol * max(1.0, abs(scale))
    bad = ~nan & ((x < low - slack) | (x > high + slack))
    if bool(bad.any()):
        at = _first_bad(bad)
        where = f"[{', '.join(map(str, at))}]" if x.ndim and x.numel() > 1 else ""
        unit = f" x {bounds.scale}" if bounds.scale else ""
        raise FieldError(
            name,
            f"{name}{where}={float(x[at]):.6g} lies outside [{bounds.low:g}, {bounds.high:g}]"
            f"{unit}",
        )


def _annotated(annotation: str, value: Any, name: str) -> None:
    """The exact JSON type of a plain field by its annotation (a string: postponed)."""
    kinds = [part.strip() for part in annotation.split("|")]
    if "None" in kinds and value is None:
        return
    ok = False
    for kind in kinds:
        if kind == "None":
            continue  # None itself passed above
        if kind == "int":
            ok = ok or _is_int(value)
        elif kind == "float":
            ok = ok or _is_finite_number(value)
        elif kind == "bool":
            ok = ok or isinstance(value, bool)
        elif kind == "str":
            ok = ok or isinstance(value, str)
        elif kind.startswith("tuple[tuple[int"):
            ok = ok or (
                isinstance(value, (tuple, list))
                and all(
                    isinstance(v, (tuple, list)) and len(v) == 2 and all(_is_int(i) for i in v)
                    for v in value
                )
            )
        elif kind.startswith("tuple[int"):
            ok = ok or (isinstance(value, (tuple, list)) and all(_is_int(v) for v in value))
        elif kind.startswith("tuple[float"):
            ok = ok or (
                isinstance(value, (tuple, list)) and all(_is_finite_number(v) for v in value)
            )
        elif kind.startswith("tuple[str"):
            ok = ok or (isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value))
        elif kind.startswith("dict"):
            ok = ok or isinstance(value, dict)
        else:
            return  # tensors, nested results, provenance: checked elsewhere
    if not ok:
        wanted = {
            "int": "an integer",
            "float": "a finite number",
            "bool": "true or false",
            "str": "a string",
        }
        what = " or ".join(wanted.get(k, k) for k in kinds)
        raise FieldError(name, f"{name}={value!r} must be {what}")


def check_scalars(cls: Any, values: dict[str, Any]) -> None:
    """Exact types of the plain (non-tensor) fields, before the dataclass sees them
    (``n_sequences`` of 3.7 is not 3, a ``ci`` of ``"0.95"`` is not 0.95); counts >= 0.

    Raises:
        FieldError: a value of the wrong type, a negative count.
    """
    for f in fields(cls):
        if f.name not in values or isinstance(values[f.name], torch.Tensor):
            continue
        value, annotation = values[f.name], str(f.type)
        _annotated(annotation, value, f.name)
        count = f.name.startswith("n_") or "count" in f.name
        if count and _is_int(value) and value < 0:
            raise FieldError(f.name, f"{f.name}={value} must be >= 0")
        if f.name in ("layers", "n_massive") and isinstance(value, (tuple, list)):
            if any(_is_int(v) and v < 0 for v in value):
                raise FieldError(f.name, f"{f.name}={list(value)} must be >= 0")


def check_provenance(prov: Any) -> dict[str, Any]:
    """The provenance of a saved result as read from JSON: known keys, each of the exact type
    :class:`Provenance` declares (lists become tuples).

    Raises:
        FieldError: an unknown key or a value of the wrong type.
    """
    if not isinstance(prov, dict):
        raise FieldError("provenance", f"provenance={prov!r} must be a JSON object")
    known = {f.name: str(f.type) for f in fields(Provenance)}
    extra = sorted(set(prov) - set(known))
    if extra:
        raise FieldError("provenance", f"provenance has unknown keys {extra}")
    out = dict(prov)
    for name, value in prov.items():
        _annotated(known[name], value, f"provenance.{name}")
        if isinstance(value, list):
            out[name] = tuple(value)
        allowed = _PROVENANCE_CHOICES.get(name)
        if allowed is not None and value not in allowed:
            raise FieldError("provenance", f"provenance.{name}={value!r} must be one of {allowed}")
    dtype = prov.get("dtype", "")
    if dtype and not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise FieldError("provenance", f"provenance.dtype={dtype!r} is not a torch dtype")
    digests = str(prov.get("data_sha256", "")).split(" + ")
    if not all(not d or re.fullmatch(r"[0-9a-f]{64}", d) for d in digests):
        raise FieldError(
            "provenance",
            f"provenance.data_sha256={prov.get('data_sha256')!r} must be empty or sha256 hex "
            "digests (64 characters 0-9a-f) joined by ' + '",
        )
    rows = str(prov.get("data_rows", ""))
    if len(rows) % ROW_DIGITS or not re.fullmatch(r"[0-9a-f]*", rows):
        raise FieldError(
            "provenance",
            f"provenance.data_rows must be {ROW_DIGITS} hex digits (0-9a-f) per sequence",
        )
    return out


_PROVENANCE_CHOICES: dict[str, list[Any]] = {
    "backend": ["hooked", "bridge", "none"],
    "weights": ["raw", "processed", "unknown"],
}
"""The values :class:`Provenance` documents for its fields with a fixed set (``bos``:
true/false/null, by its type)."""


_REPEATS = ("n_massive",)
"""Tuple fields whose entries may repeat (counts); every other tuple field lists distinct
entries (layers, modes, labels, metrics, cells, heads, blocks, lengths, ...)."""


def validate_result(result: Any) -> None:
    """The one check of a result read from disk: names, dtypes, shapes, values and cross-field
    consistency, read from the dataclass' own annotations and declarations.

    * tensor fields: float / integral as annotated (``Float[...]`` / ``Int[...]``), the number
      of dimensions annotated, and every named dimension the same size in every field
      (``layer`` = ``len(layers)``, ``metric`` = ``len(metrics)``, ``cell`` = ``len(cells)``,
      ``head`` = ``len(heads)``, ``mode`` = ``len(modes)``); counts (``count``/``n_*``
      fields) integral and >= 0;
    * ``int`` / ``float`` / ``bool`` / ``str`` fields of exactly that type (``n_sequences`` of
      3.7 is not 3), counts >= 0, floats finite; the entries of a tuple field distinct (but
      for counts such as ``n_massive``);
    * values: the class' ``_bounds`` (:class:`Bounds` of a field or a derived property: finite,
      NaN only where documented, ranges such as cosines in [-1, 1] or masses in [0, 1], sums
      bounded by their counts); every float tensor field not declared there must be finite;
    * the class' ``_choices`` (allowed strings, of a field or of every entry of a tuple field)
      and ``_ranges`` (open intervals);
    * the class' own cross-field checks (``_check_values``: counts consistent with each other,
      positions in range, ...);
    * ``provenance.hook_points``, when recorded by a result whose ``layers`` are residual entries
      (``_layer_axis``), one per entry and the residual hook of that entry (a reordered
      ``layers`` would silently relabel every row).

    Raises:
        ValueError: what is wrong, by field name (a :class:`FieldError` for a bad value).
    """
    cls = type(result)
    check_scalars(cls, {f.name: getattr(result, f.name) for f in fields(result)})
    sizes: dict[str, int] = {}
    for dim, attr in _LENGTH_OF.items():
        if isinstance(getattr(result, attr, None), tuple):
            sizes[dim] = len(getattr(result, attr))
    declared: dict[str, Bounds] = getattr(cls, "_bounds", {})
    for f in fields(result):
        value, annotation = getattr(result, f.name), str(f.type)
        count = f.name.startswith("n_") or "count" in f.name
        if isinstance(value, tuple) and f.name not in _REPEATS:
            if len(set(value)) != len(value):
                raise FieldError(f.name, f"{f.name}={list(value)} repeats an entry")
        if isinstance(value, torch.Tensor):
            match = _TENSOR_ANNOTATION.search(annotation)
            if match is None:
                continue
            kind, dims = match.group(1), match.group(2).split()
            if kind == "Float" and not value.is_floating_point():
                raise ValueError(f"{f.name} has dtype {value.dtype}, expected a float tensor")
            if kind == "Int" and (value.is_complex() or value.dtype == torch.bool):
                raise ValueError(f"{f.name} has dtype {value.dtype}, expected integers")
            if "..." not in dims and value.ndim != len(dims):
                raise ValueError(
                    f"{f.name} has {value.ndim} dimensions {tuple(value.shape)}, expected "
                    f"[{' '.join(dims)}]"
                )
            for dim, size in zip(dims, value.shape, strict=False):
                if dim == "...":
                    break
                if sizes.setdefault(dim, int(size)) != size:
                    raise ValueError(
                        f"{f.name} has {size} entries along {dim!r}, but the result has "
                        f"{sizes[dim]} (shape {tuple(value.shape)})"
                    )
            if kind == "Int" or count:
                finite = value[~torch.isnan(value)] if value.is_floating_point() else value
                if bool((finite < 0).any()) or not bool((finite == finite.round()).all()):
                    raise FieldError(f.name, f"{f.name} must hold non-negative whole counts")
            if kind == "Float" and f.name not in declared:
                check_bounds(result, f.name, FINITE)
    for name, allowed in getattr(cls, "_choices", {}).items():
        value = getattr(result, name)
        for entry in value if isinstance(value, tuple) else (value,):
            if entry not in allowed:
                raise FieldError(name, f"{name}={value!r} must be one of {list(allowed)}")
    for name, (low, high) in getattr(cls, "_ranges", {}).items():
        value = getattr(result, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
            raise FieldError(name, f"{name}={value!r} must lie in ({low}, {high})")
    for name, bounds in declared.items():
        check_bounds(result, name, bounds)
    check = getattr(result, "_check_values", None)
    if check is not None:
        check()
    layers = getattr(result, "layers", None)
    hooks = getattr(getattr(result, "provenance", None), "hook_points", ())
    if isinstance(layers, tuple) and hooks and getattr(cls, "_layer_axis", False):
        if len(hooks) != len(layers):
            raise FieldError(
                "provenance",
                f"provenance.hook_points has {len(hooks)} entries for {len(layers)} layers",
            )
        for layer, hook in zip(layers, hooks, strict=True):
            resid = resid_hook_name(layer)
            if re.fullmatch(r"blocks\.\d+\.hook_resid_(pre|post)", hook) and hook != resid:
                raise FieldError(
                    "layers",
                    f"layer entry {layer} is recorded at {hook}, but entry {layer} is {resid}: "
                    "layers and hook_points disagree (reordered or edited layers)",
                )


def load_result(cls: Any, path: str | Path, stem: str) -> Any:
    """Load a result written by :func:`save_result` into ``cls`` (no pickle).

    Raises:
        ResultsNotFoundError: a file is missing.
        IncompatibleResultsError: wrong format, missing or unknown fields, bad shapes or
            values, a file that does not match the sha256 recorded in the JSON.
    """
    folder = Path(path).expanduser()
    meta, tensors = read_saved(folder, stem)
    fmt = f"homoglens.{cls.__name__}/1"
    if not isinstance(meta, dict) or meta.pop("format", None) != fmt:
        raise IncompatibleResultsError(f"{folder} does not hold a {fmt} result")
    names = {f.name: f for f in fields(cls)}
    given = set(meta) | set(tensors)
    if not given <= set(names):
        raise IncompatibleResultsError(f"{folder}: unknown fields {sorted(given - set(names))}")
    kwargs: dict[str, Any] = dict(tensors)
    for name, value in meta.items():
        tupled = name != "provenance" and str(names[name].type).startswith("tuple")
        kwargs[name] = _deep_tuple(value) if tupled else value
    return checked_result(cls, folder, kwargs, stem=stem)


def checked_result(
    cls: Any, folder: Path, kwargs: dict[str, Any], *, stem: str | None = None
) -> Any:
    """``cls(**kwargs)`` read from ``folder`` (``{stem}.json`` + ``{stem}.safetensors``), with
    its scalars, provenance, invariants, values and cross-field constraints checked.

    Raises:
        IncompatibleResultsError: any failure, naming the file, the field and the bad value.
    """
    stem = str(stem or getattr(cls, "_stem", None) or cls.__name__)
    try:
        if isinstance(kwargs.get("provenance"), dict):  # as saved in JSON
            kwargs = {**kwargs, "provenance": Provenance(**check_provenance(kwargs["provenance"]))}
        check_scalars(cls, kwargs)
        result = cls(**kwargs)
        validate_result(result)
        return result
    except (ValueError, TypeError, IndexError, KeyError) as err:
        field = str(getattr(err, "field", "")).split(".")[0]
        if field not in kwargs:  # a derived value, or no one field
            where = f"{folder / stem}.safetensors + .json"
        elif isinstance(kwargs[field], torch.Tensor):
            where = f"{folder / stem}.safetensors"
        else:
            where = f"{folder / stem}.json"
        raise IncompatibleResultsError(
            f"{where} does not hold a consistent {cls.__name__}: {err}; the file was edited or "
            "is corrupt: save the result again"
        ) from None


def merge_parts(parts: Sequence[Any], cls: type) -> Any:
    """Check the argument of a ``merge()``: a non-empty sequence of ``cls`` results; return
    the first (the merge then checks its own fields, then :func:`check_mergeable`).

    Raises:
        IncompatibleResultsError: no parts, or a part of another type.
    """
    if not parts:
        raise IncompatibleResultsError("merge() needs at least one result")
    wrong = [type(p).__name__ for p in parts if not isinstance(p, cls)]
    if wrong:
        raise IncompatibleResultsError(f"merge() takes {cls.__name__} objects, got {wrong}")
    return parts[0]


MERGE_PROVENANCE = (
    "model",
    "family",
    "backend",
    "weights",
    "dtype",
    "model_revision",
    "hook_points",
    "exclude_first",
)
"""Provenance fields that every part of a ``merge()`` must share (the merged result carries the
first part's: parts of another model, checkpoint, dtype or weights would be mislabelled)."""


def check_mergeable(parts: Sequence[Any], what: str) -> None:
    """Refuse parts that cannot be added up into one result: a different
    :data:`MERGE_PROVENANCE` field, or overlapping data: the same result object twice, the
    same ``provenance.data_sha256`` (split on ``" + "`` for merged parts; an empty hash is not
    recorded, and overlaps nothing), or any sequence in common (``provenance.data_rows``).

    Raises:
        IncompatibleResultsError: naming the field and both values, or the parts that overlap.
    """
    first = parts[0].provenance
    for i, part in enumerate(parts[1:], 1):
        for name in MERGE_PROVENANCE:
            a, b = getattr(first, name), getattr(part.provenance, name)
            given_parts = [
                k for k, p in ((0, first), (i, part.provenance)) if p.data.startswith("given ")
            ]
            if a != b and given_parts:
                given = given_parts[0]
                raise IncompatibleResultsError(
                    f"cannot merge {what} results: part {given} was computed from given "
                    "activations (from_cache / from_activations), which record no model "
                    f"(provenance.{name}: {a!r} vs {b!r}); merge it only with results computed "
                    "the same way, or measure every part with the model"
                )
            if a != b:
                raise IncompatibleResultsError(
                    f"cannot merge {what} results with different provenance.{name}: {a!r} "
                    f"(part 0) vs {b!r} (part {i}); merge only results of the same model, "
                    "checkpoint, weights and dtype measured the same way, and compare the "
                    "others side by side"
                )
    if len({part.provenance.bos for part in parts}) > 1:
        import warnings

        warnings.warn(
            f"homoglens: merging {what} parts with and without a BOS at position 0 (provenance."
            f"bos {[part.provenance.bos for part in parts]}): each position then averages BOS "
            "and text tokens alike, as one pass over the mixed data would; the result records "
            "bos=None. Merge parts measured with one bos= policy to keep position 0 one thing",
            UserWarning,
            stacklevel=3,
        )
    for i, part in enumerate(parts):
        for j in range(i):
            if parts[j] is part:
                raise IncompatibleResultsError(
                    f"cannot merge {what} results of overlapping data: parts {j} and {i} are the "
                    "same result; merging would count its sequences twice. Merge results of "
                    "disjoint data only"
                )
    seen: dict[str, int] = {}
    for i, part in enumerate(parts):
        for digest in str(part.provenance.data_sha256).split(" + "):
            digest = digest.strip()
            if not digest:
                continue  # not recorded
            if digest in seen:
                raise IncompatibleResultsError(
                    f"cannot merge {what} results of overlapping data: parts {seen[digest]} and "
                    f"{i} both hold data {digest[:24]}... (provenance.data_sha256); merging "
                    "would count those sequences twice (and pair tokens with their own copies in "
                    "the cross-sequence baseline). Merge results of disjoint data only"
                )
            seen[digest] = i
    owner: dict[str, int] = {}
    for i, part in enumerate(parts):
        rows = str(getattr(part.provenance, "data_rows", ""))
        mine = {rows[k : k + ROW_DIGITS] for k in range(0, len(rows), ROW_DIGITS)}
        shared = [row for row in mine if row in owner]
        if shared:
            raise IncompatibleResultsError(
                f"cannot merge {what} results of overlapping data: parts {owner[shared[0]]} and "
                f"{i} share {len(shared)} sequence(s) (provenance.data_rows); merging would "
                "count them twice. Merge results of disjoint data only"
            )
        owner.update(dict.fromkeys(mine, i))


class SavedResult:
    """Mixin of the result dataclasses: ``save(path)`` / ``load(path)`` as
    ``{_stem}.safetensors`` (tensor fields) + ``{_stem}.json`` (the rest, and the sha256 of the
    safetensors); never pickle."""

    _stem: ClassVar[str]

    def save(self, path: str | Path) -> Path:
        """Save into the folder ``path`` (created if missing) as safetensors + JSON,
        atomically: a failed or interrupted save leaves an older result there loadable and
        unchanged, or refused on load; never a mix (:func:`save_folder`).

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created."""
        return save_result(self, path, self._stem)

    def _write_into(self, folder: Path) -> None:
        """Write this result's files into ``folder`` (a part of a composite result)."""
        tensors, meta = result_files(self)
        write_pair(folder, self._stem, tensors, meta)

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Load what :meth:`save` wrote, with its values checked (:func:`validate_result`).

        Raises:
            ResultsNotFoundError: a file is missing. IncompatibleResultsError: a bad file, bad
                values, or a file that does not match the sha256 recorded in the JSON."""
        return load_result(cls, path, cls._stem)
