"""mkdocs hook: the site shows every tutorial with its outputs (figures, printed frames).

The tutorials are stored without outputs (``tutorials/*.ipynb``, reached through the
``docs/tutorials`` link). The tutorial test (``tests/docs/test_tutorials.py``, run by
``scripts/test.sh`` with ``HOMOGLENS_RUN_TUTORIALS=1``) writes each notebook it executed to
``build/tutorials/`` (git-ignored). This hook renders that executed copy in place of the stored
notebook when its cells are the stored notebook's cells (so an edited tutorial never shows stale
outputs); mkdocs-jupyter does not execute it again (``execute_ignore`` in mkdocs.yml). A
tutorial without a fresh copy is executed at build time (``execute: true``), so a plain
``mkdocs build`` still shows every output, only slower (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

EXECUTED = Path("build") / "tutorials"
"""Where the executed notebooks are written, relative to the folder of mkdocs.yml."""

log = logging.getLogger("mkdocs.hooks.docs_hooks")


def cells(path: Path) -> list[tuple[str, str]] | None:
    """``(cell type, source)`` of every cell of a notebook (``None`` if it cannot be read)."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        return [
            (
                cell["cell_type"],
                "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"],
            )
            for cell in notebook["cells"]
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def executed_copy(stored: Path, folder: Path) -> Path | None:
    """The executed copy of the notebook ``stored`` in ``folder``, if it exists and holds the
    same cells (an out-of-date copy is ignored)."""
    copy = folder / stored.name
    if not copy.is_file():
        return None
    found = cells(copy)
    return copy if found is not None and found == cells(stored) else None


@event_priority(-50)  # after mkdocs-jupyter has wrapped the notebooks into its own files
def on_files(files: Any, config: Any) -> Any:
    """Point each tutorial page at its executed copy where a fresh one exists.

    mkdocs-jupyter's file wrapper computes ``abs_src_path`` itself (a cached property of
    mkdocs' ``File``), so the path is set on the wrapper and on the file it wraps."""
    folder = Path(config.config_file_path).resolve().parent / EXECUTED
    for file in files:
        uri = file.src_uri
        if not (uri.startswith("tutorials/") and uri.endswith(".ipynb")):
            continue
        copy = executed_copy(Path(file.abs_src_path), folder)
        if copy is None:
            log.info("%s: no executed copy in %s, executed at build time", uri, folder)
        else:
            log.info("%s: rendering the executed copy %s", uri, copy)
            for target in (file, vars(file).get("file")):
                if target is not None:
                    target.abs_src_path = str(copy)
    return files
