"""Ctrl-C while homoglens is still being imported ends as an interrupted command does.

Every ``homoglens`` command first imports the package (torch, transformers, TransformerLens:
seconds), before click runs and turns a ``KeyboardInterrupt`` into ``Aborted!``. Between
:func:`install` (when this module is imported, first thing in ``homoglens/__init__.py``) and
:func:`uninstall` (after the package's imports; ``homoglens.cli`` does the same around its
own), a ``KeyboardInterrupt`` that stops the program inside the module-level code of a
homoglens module prints ``Aborted!`` on stderr, as click does, instead of a traceback through
the imports; Python then exits as killed by SIGINT (status 130). Every other uncaught
exception goes to the previous ``sys.excepthook``, which is put back when the imports finish.
"""

from __future__ import annotations

import sys
from types import TracebackType

__all__ = ["install", "uninstall"]

_previous = sys.excepthook


def _in_homoglens_import(tb: TracebackType | None) -> bool:
    """Whether the traceback runs through the module-level code of a homoglens module."""
    while tb is not None:
        frame = tb.tb_frame
        name = str(frame.f_globals.get("__name__", ""))
        if frame.f_code.co_name == "<module>" and name.split(".")[0] == "homoglens":
            return True
        tb = tb.tb_next
    return False


def _hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt) and _in_homoglens_import(tb):
        sys.stderr.write("\nAborted!\n")  # what click prints for an interrupted command
        sys.stderr.flush()
        return
    _previous(kind, value, tb)


def install() -> None:
    """Route uncaught exceptions through the hook (before the imports it guards)."""
    global _previous
    if sys.excepthook is not _hook:
        _previous = sys.excepthook
        sys.excepthook = _hook


def uninstall() -> None:
    """Put the previous ``sys.excepthook`` back (once the guarded imports have finished; an
    interrupted import never gets here, and its hook prints ``Aborted!`` as the program stops).
    """
    if sys.excepthook is _hook:
        sys.excepthook = _previous


install()  # on import: ``homoglens/__init__.py`` imports this module before any other
