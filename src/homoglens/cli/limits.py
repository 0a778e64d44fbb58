"""The option values a command's windows and model can honour: whether the user set an option,
the largest value honoured, and the refusals (or notes on stderr) when one is set above it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click


def given(name: str) -> bool:
    """Whether the user set the option ``name`` (on the command line or in the environment)
    rather than leaving its default; outside a click command, True."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return True
    source = ctx.get_parameter_source(name)
    return source not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def flag(name: str) -> str:
    """The command-line spelling of option ``name``: ``edge_k`` -> ``--edge-k``."""
    return "--" + name.replace("_", "-")


def fit(
    opts: dict[str, Any],
    name: str,
    limit: int,
    reason: str,
    section: str,
    *,
    required: bool = True,
    other: str = "",
) -> int:
    """The value of option ``name``, or ``limit`` when it is larger: refused when the user set
    it and ``section`` is what the command measures (``required``; the message gives the range
    and ``reason``), else said on stderr (once per message).

    Args:
        opts: The command's options.
        name: The option (``edge_k``).
        limit: The largest value that can be honoured here (>= 1).
        reason: Why, e.g. "windows of 16 tokens allow at most 7 positions per edge".
        section: What uses the value ("the sink attribution").
        required: Whether ``section`` is the command's measurement (False: a section of the
            profile report, which uses ``limit`` and says so).
        other: The other fix the refusal offers ("a longer --seq-len").

    Raises:
        InvalidInputError: the user set ``name`` above ``limit`` and ``required``.
    """
    from homoglens.core.errors import InvalidInputError

    value = int(opts[name])
    if value <= limit:
        return value
    chosen = given(name)
    if chosen and required:
        raise InvalidInputError(
            f"{flag(name)} {value} cannot be honoured: {reason}; give {flag(name)} between 1 "
            f"and {limit}" + (f", or {other}" if other else "")
        )
    note = (
        f"note: {section} uses {flag(name)} {limit}, not "
        f"{'the' if chosen else 'its default'} {value}: {reason}"
    )
    notes: set[str] = opts.setdefault("_notes", set())
    if note not in notes:
        notes.add(note)
        click.echo(note, err=True)
    return limit


def edge_limit(length: int, what: str = "tokens") -> tuple[int, str]:
    """The largest edge_k that windows of ``length`` ``what`` allow (2 middle positions), and
    the reason, for :func:`fit`."""
    limit = (length - 2) // 2
    return limit, (
        f"windows of {length} {what} allow at most {limit} positions per edge (and a middle of 2)"
    )


def check_options(opts: dict[str, Any], names: Iterable[str]) -> None:
    """Refuse, before any work, the options ``names`` the user set to values the command's
    windows cannot honour (``--edge-k`` over ``(--seq-len - 2) // 2``, ``--patch-bins`` over
    ``--seq-len``, a ``--*-n-seq`` over ``--n-seq``); defaults that do not fit are said on
    stderr where they are used.

    Raises:
        InvalidInputError: an option set above what the windows allow (the range is named).
    """
    n_seq, seq_len = int(opts["n_seq"]), int(opts["seq_len"])
    windows = (n_seq, f"there are {n_seq} windows (--n-seq)", "a larger --n-seq")
    n_ref = min(8, n_seq // 3)
    limits = {
        "edge_k": (*edge_limit(seq_len), "a longer --seq-len"),
        "patch_bins": (seq_len, f"windows have {seq_len} positions", "a longer --seq-len"),
        "patch_n_seq": windows,
        "sink_n_seq": windows,
        "bias_n_seq": windows,
        "gradient_windows": windows,
        "massive_n_seq": (
            n_seq - n_ref,
            f"{n_ref} of the {n_seq} windows (--n-seq) give the means, so {n_seq - n_ref} are "
            "left to measure",
            "a larger --n-seq",
        ),
    }
    for name in names:
        limit, reason, other = limits[name]
        if limit >= 1 and given(name):
            fit(opts, name, limit, reason, "", other=other)
