"""Filesystem helpers."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["apply_umask", "staged_output"]


def apply_umask(root: Path) -> None:
    """Give a folder made by ``tempfile`` (mode 0700) and its files the usual permissions
    under the process umask, before it is moved into place."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(root, 0o777 & ~umask)
    for path in root.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def staged_output(folder: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to write into; it replaces ``folder`` only when the
    block succeeds, so a failed or interrupted run leaves ``folder`` exactly as it was (or
    absent). Under ``torch.distributed`` only rank 0 writes: other ranks get a scratch folder
    that is dropped."""
    from homoglens.distributed import is_main_process

    if not is_main_process():
        with tempfile.TemporaryDirectory() as scratch:
            yield Path(scratch)
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    try:
        yield tmp
        apply_umask(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
