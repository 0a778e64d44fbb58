"""Option groups shared by the ``homoglens`` commands."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class Command(click.Command):
    """A command whose line in ``homoglens --help`` is the full first sentence of its docstring
    (click cuts it at about 45 characters otherwise, mid-sentence)."""

    def get_short_help_str(self, limit: int = 45) -> str:
        """The first sentence of the help, whole (``limit`` is ignored)."""
        return super().get_short_help_str(limit=10_000)


class Group(click.Group):
    """The ``homoglens`` group: its subcommands are :class:`Command` s."""

    command_class = Command


def count(name: str, default: int, help: str, *, min: int = 1, max: int | None = None) -> Decorator:
    """An integer option with a lower bound (and an upper one, ``max``), its help text and its
    default shown in ``--help``."""
    return click.option(
        name, type=click.IntRange(min=min, max=max), default=default, show_default=True, help=help
    )


class _Block(click.ParamType):
    """``auto`` or an integer >= 1."""

    name = "auto|N"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value == "auto" or isinstance(value, int):
            return value
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            self.fail(f"{value!r} is neither 'auto' nor an integer >= 1", param, ctx)
        return number


def block_option() -> Decorator:
    """``--block``: windows per bootstrap block, ``auto`` (from their autocorrelation) or N."""
    return click.option(
        "--block",
        type=_Block(),
        default="auto",
        show_default=True,
        help="Consecutive windows per bootstrap block: auto (chosen from the windows' "
        "autocorrelation, Politis-White) or an integer (1: independent windows).",
    )


def choice(name: str, choices: list[str], help: str) -> Decorator:
    """A choice option whose first choice is the default."""
    return click.option(
        name, type=click.Choice(choices), default=choices[0], show_default=True, help=help
    )


def seed_option(help: str) -> Decorator:
    """``--seed``: a non-negative 64-bit integer, default 0."""
    return click.option(
        "--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True, help=help
    )


def switch(name: str, help: str, *, default: bool = True) -> Decorator:
    """A ``--x/--no-x`` flag with its default shown in ``--help``."""
    return click.option(name, default=default, show_default=True, help=help)


def group(*options: Decorator) -> Decorator:
    """One decorator applying ``options`` in the order they are listed in ``--help``."""

    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        return functools.reduce(lambda f, option: option(f), reversed(options), func)

    return apply


def output_options(default: Path | None) -> tuple[Decorator, ...]:
    """``--out`` (default ``default``) and ``--overwrite``."""
    return (
        click.option(
            "--out",
            type=click.Path(path_type=Path),
            default=default,
            show_default=default is not None,
            help="Output folder (must be empty or absent).",
        ),
        click.option(
            "--overwrite", is_flag=True, help="Replace the contents of a non-empty --out."
        ),
    )


INTERACTIVE = click.option(
    "--interactive",
    is_flag=True,
    help="Embed interactive plotly figures (hover values, zoom) in report.html, with plotly.js "
    "inlined so it opens offline (about 5 MB more); PNGs still go to figures/. Needs plotly: "
    'pip install "homoglens[plotly]" (from a source checkout: pip install -e ".[plotly]").',
)
"""``--interactive``."""

BACKEND = choice(
    "--backend", ["auto", "hooked", "bridge"], "HookedTransformer (TL < 4) or TransformerBridge."
)
"""``--backend``."""

data_options = group(
    click.option(
        "--model",
        default="smollm2-135m-instruct",
        show_default=True,
        help="Embedded model name, local Hugging Face folder, or TL model name.",
    ),
    BACKEND,
    click.option("--corpus", default="austen", show_default=True, help="Vendored corpus name."),
    click.option(
        "--text",
        "text_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="Use this UTF-8 text file instead of --corpus.",
    ),
    count("--n-seq", 64, "Number of token windows."),
    count("--seq-len", 256, "Tokens per window (a BOS counts inside it).", min=2),
    choice(
        "--bos", ["auto", "always", "never"], "BOS at position 0 ('auto': the model's default)."
    ),
    count("--batch-size", 8, "Windows per forward pass (memory and speed, not results)."),
    click.option(
        "--process-weights",
        is_flag=True,
        help="Apply TransformerLens weight processing (changes every cosine).",
    ),
    click.option("--device", default=None, help="Torch device (default: cuda if available)."),
    count("--edge-k", 8, "Positions per edge in the edge-versus-middle tables."),
    *output_options(None),
    INTERACTIVE,
    switch("--progress/--no-progress", "Show progress bars on stderr."),
)
"""Options shared by every command that profiles a model on a corpus."""

profile_options = group(
    click.option("--exclude-first", is_flag=True, help="Leave position 0 out of every statistic."),
    switch("--effective-rank/--no-effective-rank", "Also compute the effective rank per layer."),
)
"""Options of the homogenization profile."""

sink_options = group(
    count("--sink-top-k", 3, "Sink heads (by mass) for the exact attribution."),
    count("--sink-n-seq", 16, "Windows used by the sink attributions (each costs several passes)."),
)
"""Options of the attention-sink analysis."""


def patch_options(layer_step: int) -> Decorator:
    """Options of the positional patching sweep (``layer_step``: the default block stride)."""
    return group(
        count(
            "--patch-n-seq",
            4,
            "Windows used by the patching sweep (each cell is a forward pass over them).",
        ),
        count("--patch-bins", 8, "Position bins of the patching sweep."),
        count(
            "--patch-layer-step",
            layer_step,
            "Patch every k-th block (and the last); the positions sweep too.",
        ),
    )
