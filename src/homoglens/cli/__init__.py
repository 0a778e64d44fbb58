"""The ``homoglens`` command line: the commands live in :mod:`homoglens.cli.commands`."""

from homoglens.core import interrupt

interrupt.install()  # Ctrl-C while the commands import says "Aborted!", not a traceback
from homoglens.cli.commands import main  # noqa: E402

interrupt.uninstall()

__all__ = ["main"]
