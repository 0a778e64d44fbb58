"""The checks of a :class:`~homoglens.PositionalSimilarity`'s fields: the shapes that must fit
together (on construction) and the sums that must fit together (on load)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from homoglens.results.validation import FieldError
from homoglens.similarity_math import SIMILARITY_STATISTICS, edge_groups
from homoglens.types import CENTRES, SPACES

if TYPE_CHECKING:
    from homoglens.results.similarity import PositionalSimilarity


def check_similarity_fields(sim: PositionalSimilarity) -> None:
    """Check the fields of a new :class:`PositionalSimilarity` against each other (run by its
    ``__post_init__``): the shapes of the sums and per-window rows, the dropped dimensions,
    the second-pass fields together, the window count, the space, the centring and ``edge_k``.

    Args:
        sim: The result being built.

    Raises:
        ValueError: the first field that does not fit.
    """
    n_layer = len(sim.layers)
    if n_layer < 1 or sim.within_sum.ndim != 3:
        raise ValueError(f"within_sum must be [layer pos pos], got {sim.within_sum.shape}")
    n_pos = int(sim.within_sum.shape[1])
    want = {
        "within_sum": (n_layer, n_pos, n_pos),
        "window_within": (sim.n_sequences, n_layer, len(SIMILARITY_STATISTICS)),
    }
    if sim.window_cross is not None:
        want["window_cross"] = (sim.n_sequences, n_layer, len(SIMILARITY_STATISTICS))
    if sim.window_same_position is not None:
        want["window_same_position"] = (sim.n_sequences, n_layer, n_pos)
    for name, shape in want.items():
        got = tuple(getattr(sim, name).shape)
        if got != shape:
            raise ValueError(f"{name} has shape {got}, expected {shape}")
    if sim.unit_sum.ndim != 3 or tuple(sim.unit_sum.shape[:2]) != (n_layer, n_pos):
        raise ValueError(f"unit_sum is {tuple(sim.unit_sum.shape)}, not [{n_layer} {n_pos} d]")
    if sim.dropped_dims is not None and (
        sim.dropped_dims.dtype != torch.int64
        or sim.dropped_dims.ndim != 2
        or int(sim.dropped_dims.shape[0]) != n_layer
        or bool((sim.dropped_dims < 0).any())
        or bool((sim.dropped_dims >= sim.unit_sum.shape[-1]).any())
        or any(len(set(row)) != len(row) for row in sim.dropped_dims.tolist())
    ):
        raise ValueError(
            f"dropped_dims {tuple(sim.dropped_dims.shape)} must be [{n_layer} k] distinct "
            f"int64 indices of the {int(sim.unit_sum.shape[-1])} dimensions"
        )
    if (sim.window_cross is None) != (sim.window_same_position is None):
        raise ValueError("window_cross and window_same_position come together")
    if sim.n_sequences < 1 or sim.first_position < 0:
        raise ValueError(f"n_sequences={sim.n_sequences} < 1 or first_position < 0")
    if sim.space not in SPACES or sim.centre not in CENTRES:
        raise ValueError(f"unknown space {sim.space!r} or centre {sim.centre!r}")
    edge_groups(n_pos, int(sim.edge_k))  # edge_k fits the windows


def check_similarity_values(sim: PositionalSimilarity) -> None:
    """Check that the sums of a loaded :class:`PositionalSimilarity` fit together (the work of
    its ``_check_values``, whose docstring lists the checks).

    Args:
        sim: The result read from disk.

    Raises:
        FieldError: the field that does not fit, and why.
    """
    if sim.provenance.exclude_first != (sim.first_position > 0):
        raise FieldError(
            "provenance",
            f"provenance.exclude_first={sim.provenance.exclude_first} but first_position="
            f"{sim.first_position}: position 0 is left out exactly when the first counted "
            "position is above 0",
        )
    n = sim.n_sequences
    within = sim.within_sum.double()
    if not torch.allclose(within, within.transpose(1, 2), rtol=0, atol=1e-6 * max(n, 1)):
        raise FieldError("within_sum", "within_sum is not symmetric (a sum of U U^T is)")
    diag = torch.diagonal(within, dim1=1, dim2=2)
    slack = 1e-5 * max(n, 1)  # unit vectors of float32 models: |u . u - 1| ~ 1e-7
    if bool(((diag < -slack) | (diag > n + slack)).any()):
        raise FieldError(
            "within_sum",
            f"the diagonal of within_sum (u . u summed over windows) must lie in [0, {n}], "
            f"got {float(diag.min()):.6g} .. {float(diag.max()):.6g}",
        )
    sq = (sim.unit_sum.double() ** 2).sum(-1)  # [layer pos]
    if bool((sq > n * n * (1 + 1e-5) + 1e-6).any()):
        raise FieldError(
            "unit_sum",
            f"unit_sum has a norm of {float(sq.max().sqrt()):.6g}, more than the "
            f"{n} windows' unit vectors can sum to",
        )
    if n > 1:
        sp = (sq - diag) / (n * (n - 1))
        if bool((sp.abs() > 1 + 1e-4).any()):
            raise FieldError(
                "unit_sum",
                "SP (the same-position cosine across windows) reaches "
                f"{float(sp.abs().max()):.6g}: unit_sum and within_sum do not fit together",
            )
    if sim.n_massive and (
        sim.centre != "global" or len(sim.n_massive) != len(sim.layers)
        or max(sim.n_massive) > n * (sim.n_pos + sim.first_position)
    ):  # fmt: skip
        raise FieldError(
            "n_massive",
            f"n_massive={list(sim.n_massive)} must hold one count per layer entry, each "
            f"at most {n * (sim.n_pos + sim.first_position)}, and only for "
            "centre='global'",
        )
