"""The checks of ``--out`` before any work (never an input of the command, creatable where it
goes) and the one-line CLI errors of typed errors and failed file operations."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click

from homoglens.core.errors import HomoglensError

_CAUSES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: (
        "no space is left on that disk",
        "free some space there, or choose an --out on another disk",
    ),
    getattr(errno, "EDQUOT", -1): (
        "your disk quota there is used up",
        "free some space, or choose an --out on another disk",
    ),
    errno.EACCES: (
        "permission denied",
        "choose an --out in a folder you can write to, or give yourself write permission there",
    ),
    errno.EPERM: (
        "the operation is not permitted there",
        "choose an --out in an ordinary folder you can write to",
    ),
    errno.EROFS: ("the file system is read-only", "choose an --out on a writable disk"),
    errno.ENOENT: (
        "a folder on the path is missing, or the file system (such as /proc or /sys) does not "
        "allow creating files there",
        "choose an --out in an ordinary folder on disk",
    ),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "choose another --out"),
    errno.ENAMETOOLONG: ("the path is too long", "choose a shorter --out"),
    errno.EMFILE: (
        "this process has too many open files",
        "raise the open-file limit (ulimit -n) and run again",
    ),
    errno.EIO: (
        "the disk reported an input/output error",
        "check the disk (dmesg, fsck), or choose an --out on another disk",
    ),
}
"""What an ``errno`` of a failed write means, and how to fix it."""


def _is_output(path: str, out: Path | None) -> bool:
    """Whether ``path`` is ``out``, inside it, one of the folders above it (made for it), or one
    of its staged, probe or backup siblings (``.<out>.partial-*``, ``<out>.homoglens-backup-*``)."""
    if out is None:
        return False
    target = Path(path).expanduser().absolute()
    folder = Path(out).expanduser().absolute()
    if target == folder or folder in target.parents or target in folder.parents:
        return True
    if folder.parent not in target.parents:
        return False
    sibling = target.relative_to(folder.parent).parts[0]
    return sibling.lstrip(".").startswith(f"{folder.name}.")


def os_error_message(err: OSError, out: Path | None = None) -> str:
    """A one-line CLI error for a failed file operation: what failed (from ``errno``: no space,
    permission, read-only file system, ...), on which path, and how to fix it.

    Args:
        err: The error.
        out: The command's output folder: an error on it (or on its staged sibling) is a failed
            write of the output; any other is a failed read or write of that path.
    """
    name = errno.errorcode.get(err.errno or 0)
    detail = err.strerror or str(err)
    if name is not None:
        detail = f"{detail}, {name}"
    cause, fix = _CAUSES.get(err.errno or 0, ("", "choose another --out, or check that path"))
    cause = f"{cause} ({detail})" if cause else detail
    filename = getattr(err, "filename", None)
    if filename is None:
        return f"a file operation failed: {cause}; {fix}"
    if "homoglens-backup-" in str(filename):  # staged_output could not move it back
        return f"could not replace the output: {err.strerror or err}"
    if _is_output(str(filename), out):
        return (
            f"could not write the output ({filename}): {cause}; {fix} (nothing of this run is "
            "left behind; an existing --out is as it was)"
        )
    return f"could not read or write {filename}: {cause}; check that path and its permissions"


_CLI_WORDING: tuple[tuple[str, str], ...] = (
    ("(before starting Python)", "(before running homoglens)"),
    ("(load_model('/path/to/folder'), ", "(--model /path/to/folder, "),
    ("homoglens.load_model(name, device='cpu')", "--device cpu"),
    ("homoglens.load_model(name)", "--model NAME"),
)
"""Phrases of the Python API's error messages and what a command-line user types instead."""


def cli_message(message: str) -> str:
    """A typed error's message in command-line words: the Python calls it suggests
    (``load_model('/path/to/folder')``, "before starting Python") become the options and steps
    of the ``homoglens`` command (``--model /path/to/folder``, "before running homoglens").
    The Python API keeps its own wording; only the CLI's copy is reworded."""
    for python, cli in _CLI_WORDING:
        message = message.replace(python, cli)
    return message


@contextlib.contextmanager
def cli_errors(out: Path | None = None) -> Iterator[None]:
    """Turn typed homoglens errors and failed file operations into one-line CLI errors (no
    traceback), in command-line words (:func:`cli_message`); ``out``, the output folder, tells
    failed writes of the output apart."""
    try:
        yield
    except HomoglensError as err:
        raise click.ClickException(cli_message(str(err))) from err
    except OSError as err:  # a full disk, a read-only folder, no permission
        raise click.ClickException(os_error_message(err, out)) from err


def probe_output(folder: Path) -> None:
    """Fail now, before any work, when ``folder`` could not be written: create and remove a
    scratch folder in the nearest existing folder above it (where the staged output and its
    parents will be made). Nothing is left behind.

    Raises:
        OSError: that folder refuses new entries (no permission, read-only, /proc, no space).
    """
    from homoglens.core.distributed import is_main_process

    if not is_main_process():
        return
    base = Path(folder).expanduser().absolute().parent
    while not base.exists() and base != base.parent:
        base = base.parent
    try:
        scratch = tempfile.mkdtemp(prefix=f".{Path(folder).name}.probe-", dir=base)
    except OSError as err:
        if err.filename is None or "probe-" in str(err.filename):
            err.filename = str(folder)
        raise
    os.rmdir(scratch)


def model_inputs(name: str, option: str) -> list[tuple[str, Path]]:
    """The folders a ``--model``-like value reads: a local folder, a shipped model's folder in
    the package, the cache of converted embedded models, or the Hugging Face cache for a Hub
    name; each with the words that name it in an error."""
    from homoglens.models.assets import (
        EMBEDDED_MODELS,
        SHIPPED_MODELS,
        TRAINED_NAME,
        cache_dir,
        shipped_model_folder,
    )

    if name in SHIPPED_MODELS:
        try:
            return [(f"the shipped model {name} ({option})", shipped_model_folder(name))]
        except HomoglensError:  # the load says what is missing
            return []
    if name in EMBEDDED_MODELS:
        return [(f"the cache of converted models ({option} {name})", cache_dir() / "models")]
    path = Path(name).expanduser()
    if os.path.lexists(path):
        return [(f"the model folder given by {option}", path)]
    if TRAINED_NAME.fullmatch(name):  # a replicate's statistics, inside the package
        return []
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1:
        return []  # a missing folder: the load says so
    from huggingface_hub import constants

    return [(f"the Hugging Face cache ({option} {name})", Path(constants.HF_HUB_CACHE))]


def data_inputs(opts: dict[str, Any]) -> list[tuple[str, Path]]:
    """The files and folders the data options read: ``--model``, ``--text``, a ``--corpus``
    that is a path."""
    from homoglens.run.data import CORPORA

    found = model_inputs(opts["model"], "--model") if opts.get("model") else []
    if opts.get("text_file") is not None:
        found.append(("the text file given by --text", Path(opts["text_file"])))
    corpus = opts.get("corpus")
    if corpus is not None and corpus not in CORPORA and os.path.lexists(Path(corpus)):
        found.append(("the corpus given by --corpus", Path(corpus).expanduser()))
    return found


def check_out_is_no_input(folder: Path, inputs: Iterable[tuple[str, Path]]) -> None:
    """Refuse an ``--out`` that is, holds or is inside an input of the command (compared as
    resolved paths, symbolic links followed), before anything is written or deleted.

    Raises:
        InvalidInputError: ``folder`` and an input overlap; the message names both.
    """
    from homoglens.core.errors import InvalidInputError

    out = Path(folder).expanduser().resolve()
    for what, path in inputs:
        source = Path(path).expanduser().resolve()
        same = out == source or (out.exists() and source.exists() and os.path.samefile(out, source))
        if same:
            relation, harm = "is", "--overwrite would delete it"
        elif out in source.parents:
            relation, harm = "holds", "--overwrite would delete it"
        elif source in out.parents:
            relation, harm = "is inside", "the report would be written among its files"
        else:
            continue
        raise InvalidInputError(
            f"--out {str(folder)!r} {relation} {what} ({source}); {harm}. Choose an --out "
            "outside every input of the command"
        )


def check_output(out: Path, inputs: Iterable[tuple[str, Path]], *, overwrite: bool) -> Path:
    """Before any work, in this order: refuse an ``--out`` that overlaps an input (first, as
    no option lifts it: a model folder given as ``--out`` is said to be one, not merely "not
    empty"), then check the folder itself (:func:`~homoglens.report.check_output_dir`: a file,
    a protected folder, a non-empty one without ``--overwrite``), then that the output can be
    created where it goes (:func:`probe_output`).

    Returns:
        The output folder (``out`` with ``~`` expanded).

    Raises:
        InvalidInputError: ``out`` is, holds or is inside an input; or ``check_output_dir``
            refuses it.
        OSError: the folder that will hold ``out`` refuses new entries.
    """
    from homoglens.report import check_output_dir

    check_out_is_no_input(out, inputs)
    folder = check_output_dir(out, overwrite=overwrite)
    probe_output(folder)
    return folder
