"""The files of a saved result: atomic writes (a file, a pair of safetensors + JSON, a whole
folder swapped into place), and the sha256 that each result's JSON records of its files and of
its own content, checked on every read; nothing is ever pickled.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from homoglens.core.errors import (
    IncompatibleResultsError,
    InvalidInputError,
    ResultsNotFoundError,
    ResultWriteError,
)
from homoglens.models.assets import apply_umask, sync_folder

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
    unchanged, or a folder that load refuses (a part missing); never a mix of the two. A
    symbolic link to a folder stays: the result is saved into the folder it points to.

    Args:
        path: The folder (created with its parents if missing).
        write: Writes the result's files into the folder it is given.
        own: Glob patterns of the entry names a saved result of this kind holds.
        manifest: The entry written last (its JSON, which records the others' sha256).

    Returns:
        The folder.

    Raises:
        InvalidInputError: ``path`` is not a path (``""``, ``None``, ``"/"``), is a file, or
            its parent cannot be created.
        ResultWriteError: a write fails (an ``OSError`` with its ``errno``; an older result
            there is left as it was).
    """
    given = folder_path(path)
    try:
        # A link to a folder (results -> /big/disk/results) is kept: the save goes where it
        # points. "." or "..": the folder they name, filled entry by entry (never replaced: it
        # may be the working directory); "/": refused.
        target = Path(os.path.realpath(given)) if given.is_symlink() else given
        in_place = not target.name
        target = target.resolve() if in_place else target
        if not target.name:
            raise InvalidInputError(f"cannot save into {str(given)!r}; give a folder below it")
        if target.exists() and not target.is_dir():
            raise InvalidInputError(f"{str(given)!r} is a file; save() needs a folder")
    except OSError as err:
        raise ResultWriteError(
            err.errno, f"cannot save into {str(given)[:80]!r}: {err.strerror or err}"
        ) from None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInputError(f"cannot create the folder {str(target)!r}: {err}") from None
    tmp: Path | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.saving-", dir=target.parent))
        write(tmp)
        apply_umask(tmp)
        sync_folder(tmp)
        if not target.exists():
            os.rename(tmp, target)
        elif not in_place and all(_is_own(target, name, own) for name in os.listdir(target)):
            _swap_folder(tmp, target)
        else:
            _swap_entries(tmp, target, manifest)
        sync_folder(target.parent)
    except OSError as err:  # nothing of an older result was changed (see above)
        fix = "a shorter name" if err.errno == errno.ENAMETOOLONG else "a folder you can write to"
        raise ResultWriteError(
            err.errno, f"cannot save into {str(given)!r}: {err.strerror or err}; choose {fix}"
        ) from None
    finally:
        if tmp is not None and os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return given


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


def folder_path(path: Any, verb: str = "save") -> Path:
    """``path`` (a ``str`` or ``os.PathLike``, ``~`` expanded) as the folder of a save (or,
    with ``verb="load"``, of a load).

    Raises:
        InvalidInputError: ``path`` is empty, ``None`` or not a path.
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InvalidInputError(
            f"{verb}() needs a folder path (a str or pathlib.Path, e.g. 'results/profile'), "
            f"got {path!r}"
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
