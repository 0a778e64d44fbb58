"""Option groups shared by the ``homoglens`` commands."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def data_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every command that profiles a model on a corpus."""
    options = [
        click.option(
            "--model",
            default="smollm2-135m-instruct",
            show_default=True,
            help="Embedded model name, local Hugging Face folder, or TL model name.",
        ),
        click.option(
            "--backend",
            type=click.Choice(["auto", "hooked", "bridge"]),
            default="auto",
            show_default=True,
            help="HookedTransformer (TL < 4) or TransformerBridge.",
        ),
        click.option("--corpus", default="austen", show_default=True, help="Vendored corpus name."),
        click.option(
            "--text",
            "text_file",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=None,
            help="Use this UTF-8 text file instead of --corpus.",
        ),
        click.option(
            "--n-seq",
            type=click.IntRange(min=1),
            default=64,
            show_default=True,
            help="Number of token windows.",
        ),
        click.option(
            "--seq-len",
            type=click.IntRange(min=2),
            default=256,
            show_default=True,
            help="Tokens per window (a BOS counts inside it).",
        ),
        click.option(
            "--bos",
            type=click.Choice(["auto", "always", "never"]),
            default="auto",
            show_default=True,
            help="BOS at position 0 ('auto': the model's default).",
        ),
        click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True),
        click.option(
            "--process-weights",
            is_flag=True,
            help="Apply TransformerLens weight processing (changes every cosine).",
        ),
        click.option("--device", default=None, help="Torch device (default: cuda if available)."),
        click.option(
            "--edge-k",
            type=click.IntRange(min=1),
            default=8,
            show_default=True,
            help="Positions per edge in the edge-versus-middle tables.",
        ),
        click.option(
            "--out",
            type=click.Path(path_type=Path),
            default=None,
            help="Output folder (must be empty or absent).",
        ),
        click.option(
            "--overwrite", is_flag=True, help="Replace the contents of a non-empty --out."
        ),
        click.option("--progress/--no-progress", default=True, show_default=True),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def profile_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the homogenization profile."""
    options = [
        click.option(
            "--exclude-first", is_flag=True, help="Leave position 0 out of every statistic."
        ),
        click.option(
            "--effective-rank/--no-effective-rank",
            default=True,
            show_default=True,
            help="Also compute the effective rank per layer.",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def sink_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the attention-sink analysis."""
    options = [
        click.option(
            "--sink-top-k",
            type=click.IntRange(min=1),
            default=3,
            show_default=True,
            help="Sink heads (by mass) for the exact attribution.",
        ),
        click.option(
            "--sink-n-seq",
            type=click.IntRange(min=1),
            default=16,
            show_default=True,
            help="Windows used by the sink attributions (each costs several passes).",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def patch_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the positional patching sweep."""
    options = [
        click.option(
            "--patch-n-seq",
            type=click.IntRange(min=1),
            default=4,
            show_default=True,
            help="Windows used by the patching sweep (each cell is a forward pass over them).",
        ),
        click.option(
            "--patch-bins",
            type=click.IntRange(min=1),
            default=8,
            show_default=True,
            help="Position bins of the patching sweep.",
        ),
        click.option(
            "--patch-layer-step",
            type=click.IntRange(min=1),
            default=5,
            show_default=True,
            help="Patch every k-th block (and the last); the positions sweep too.",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)
