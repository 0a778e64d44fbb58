"""Filesystem helpers."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["apply_umask"]


def apply_umask(root: Path) -> None:
    """Give a folder made by ``tempfile`` (mode 0700) and its files the usual permissions
    under the process umask, before it is moved into place."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(root, 0o777 & ~umask)
    for path in root.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
