"""The ``homoglens`` command line: the commands live in :mod:`homoglens.cli.commands`."""

from homoglens.cli.commands import main

__all__ = ["main"]
