"""`homoglens --help` and every command's `--help`: each option has help text, and the command
list shows each command's full first sentence (click cuts it at about 45 characters unless
told otherwise)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from homoglens.cli import main


def commands(cmd: click.Command, path: tuple[str, ...] = ("homoglens",)) -> Iterator[tuple]:
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from commands(sub, (*path, name))


COMMANDS = list(commands(main))


def first_sentence(text: str) -> str:
    return re.split(r"(?<=\.)\s", " ".join(text.split()), maxsplit=1)[0]


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_has_help_text(path: tuple[str, ...], cmd: click.Command) -> None:
    assert (cmd.help or "").strip(), f"{' '.join(path)} has no docstring"
    bare = [
        "/".join(p.opts)
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
    ]
    assert not bare, f"{' '.join(path)}: options without help text: {bare}"
    result = CliRunner().invoke(main, [*path[1:], "--help"])
    assert result.exit_code == 0, result.output


def test_the_command_list_shows_each_full_first_sentence() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    subcommands = [(p[-1], c) for p, c in COMMANDS if len(p) == 2]
    assert len(subcommands) >= 8
    for name, cmd in subcommands:
        sentence = first_sentence(cmd.help or "")
        assert f"{name} {sentence}" in shown, f"{name}: {sentence!r} not in\n{result.output}"
    listing = result.output.split("Commands:", 1)[1]
    assert not [line for line in listing.splitlines() if line.rstrip().endswith("...")], listing
