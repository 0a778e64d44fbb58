"""The per-window readings of a :class:`~homoglens.PositionalSimilarity`: which statistics
exist per window, which of them are cross-input readings (built on ``SP``) and when those mean
nothing, and the per-window values whose mean over windows is the corpus statistic."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float

from homoglens.errors import InvalidInputError
from homoglens.similarity_math import SIMILARITY_STATISTICS, edge_groups, pseudo_values

if TYPE_CHECKING:
    from homoglens.results.similarity import PositionalSimilarity

C_STATS = (2, 3, 4)  # matched_first, matched_last, homogenization: they involve C
"""Indices into :data:`~homoglens.similarity_math.SIMILARITY_STATISTICS` of the statistics
that subtract the cross-window ``C``."""

WINDOW_STATISTICS: tuple[str, ...] = (*SIMILARITY_STATISTICS, "sp_first", "sp_last", "sp_mean")
"""Per-window statistics of :meth:`PositionalSimilarity.per_window` (cosines)."""

CROSS_INPUT_STATISTICS: tuple[str, ...] = ("sp_first", "sp_last", "sp_mean")
"""The cross-input readings (built on ``SP``): meaningful only on uncentred vectors."""


def cross_input_problem(centre: str | None) -> str | None:
    """Why a cross-input reading (``SP``) means nothing on vectors centred so, or ``None``.

    Centred by position, every position's mean over windows is 0, so ``SP[i] = -1 / (n - 1)``
    at every position by construction: any edge excess is 0 whatever the model does (a review
    of SmolLM2 read -0.021 everywhere, and 0.0000 +- 0.0000 on every null and control).
    Centred globally, a stationary positional code of constant norm gets an SP edge excess
    (+0.014 / +0.011 at the first / last 8 positions, 44 % / 27 % false positives): the one
    mean over positions is farther from the edges' codes. Source: issue 38 of homoglens;
    docs/similarity.md, "Three readings".
    """
    if centre == "position":
        return (
            "the vectors were centred by position, so SP is -1/(n-1) at every position by "
            "construction and any cross-input (SP) reading is 0 whatever the model does"
        )
    if centre == "global":
        return (
            "the vectors were centred globally, which makes a false SP edge excess on a "
            "stationary positional code (44 % false positives at the first edge)"
        )
    return None


def window_values(sim: PositionalSimilarity, statistic: str) -> Float[torch.Tensor, "batch layer"]:
    """The ``[batch layer]`` per-window values of one statistic of ``sim``, as
    :meth:`PositionalSimilarity.per_window` (its arguments, returns and errors)."""
    if statistic not in WINDOW_STATISTICS:
        raise InvalidInputError(f"statistic={statistic!r} must be one of {list(WINDOW_STATISTICS)}")
    n = sim.n_sequences
    if statistic in CROSS_INPUT_STATISTICS:
        if sim.window_same_position is None:
            raise InvalidInputError(
                f"{statistic} needs the second pass; rerun positional_similarity(..., "
                "pseudo_values=True)"
            )
        shape = (n, len(sim.layers))
        if sim._cross_input_refused(statistic, stacklevel=4):
            return torch.full(shape, math.nan, dtype=torch.float64, device="cpu")
        first, middle, last = edge_groups(sim.n_pos, sim.edge_k)
        psi = pseudo_values(2 * sim.window_same_position, sim.SP[None], n)  # [batch layer pos]
        if statistic == "sp_mean":
            return psi.mean(-1)
        edge = first if statistic == "sp_first" else last
        return psi[..., list(edge)].mean(-1) - psi[..., list(middle)].mean(-1)
    e = SIMILARITY_STATISTICS.index(statistic)
    within = sim.window_within[..., e]
    if e not in C_STATS:
        return within.clone()
    c_stat = sim._stat(sim.C, k=sim.edge_k)[:, e]  # [layer]
    if sim.window_cross is None or n < 2:
        return within - c_stat[None]
    return within - pseudo_values(sim.window_cross[..., e], c_stat[None], n)
