"""``PositionalSimilarity``: position x position similarity of the residual stream over a corpus.

The stored fields are sums that merge by addition (the within-window cosine matrix summed over
windows, the per-position sums of unit vectors) plus one row of linear statistics per window;
every reported value (``M``, ``C``, ``W``, ``SP``, ``to_first``, ``lag``, the naive and the
distance-matched edge excess) is derived from them. Saved as ``similarity.safetensors`` +
``similarity.json``; never pickled.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import IncompatibleResultsError, InvalidInputError
from homoglens.core.stats import estimate
from homoglens.core.types import CENTRES, SPACES, Centring
from homoglens.models.assets import package_version
from homoglens.results import Provenance, SavedResult
from homoglens.results.base import Plotted, keyword_repr, selected_layers
from homoglens.results.cache import cached_residuals
from homoglens.results.provenance import check_mergeable, merge_parts
from homoglens.results.validation import NON_NEGATIVE, Bounds, FieldError
from homoglens.similarity.maths import (
    SIMILARITY_STATISTICS,
    activation_fields,
    edge_groups,
    pseudo_values,
    similarity_coefficients,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from plotly.graph_objects import Figure as PlotlyFigure

    from homoglens.core.types import PlotBackend


# The checks of a :class:`~homoglens.PositionalSimilarity`'s fields: the shapes that must fit
# together (on construction) and the sums that must fit together (on load).


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


# Combining :class:`~homoglens.PositionalSimilarity` results: the checks and the sums of a merge
# of results over disjoint windows, and the selection of entries of the layer axis.


def check_similarity_parts(
    first: PositionalSimilarity, parts: tuple[PositionalSimilarity, ...]
) -> None:
    """Refuse parts of :meth:`PositionalSimilarity.merge` whose sums do not add up to a
    one-pass result: dimensions dropped or vectors centred per part, or different layers,
    positions, width, first position, ``edge_k``, space or standardisation.

    Args:
        first: The first part.
        parts: Every part.

    Raises:
        IncompatibleResultsError: naming what differs.
    """
    if len(parts) > 1 and any(p.dropped_dims is not None for p in parts):
        raise IncompatibleResultsError(
            "results with drop_dims zeroed the dimensions of each part's own corpus, so "
            "their sums do not add up to a one-pass result; run positional_similarity once "
            "over all the data"
        )
    if len(parts) > 1 and any(p.centre is not None for p in parts):
        raise IncompatibleResultsError(
            "centred results subtract each part's own corpus mean, so their sums do not "
            "add up to a one-pass result; run positional_similarity once over all the data "
            "(it streams, and shards under torch.distributed)"
        )
    for other in parts[1:]:
        for attr in ("layers", "n_pos", "d_model", "first_position", "edge_k", "space"):
            if getattr(other, attr) != getattr(first, attr):
                raise IncompatibleResultsError(
                    f"cannot merge results with different {attr}: "
                    f"{getattr(first, attr)} vs {getattr(other, attr)}"
                )
        if other.standardize != first.standardize:
            raise IncompatibleResultsError("cannot merge results with different standardize")


def merge_similarity(
    first: PositionalSimilarity, parts: tuple[PositionalSimilarity, ...]
) -> PositionalSimilarity:
    """Add up parts that :meth:`PositionalSimilarity.merge` has checked: the sums added, the
    per-window rows concatenated in the order given, the second-pass values dropped (with a
    warning) when more than one part is merged.

    Args:
        first: The first part (its settings and provenance label the result).
        parts: Every part.

    Returns:
        The merged result.
    """
    if len(parts) > 1 and any(p.has_pseudo_values for p in parts):
        warnings.warn(
            "merge() drops the second-pass (pseudo-value) columns: they depend on the "
            "whole corpus; per-window values fall back to C held fixed",
            stacklevel=3,  # the caller of PositionalSimilarity.merge
        )
    datas = list(dict.fromkeys(p.provenance.data for p in parts))
    single = len(parts) == 1
    # every other field is the first part's: layers and the settings; n_massive and
    # dropped_dims too (merging is refused for centred results and for those with
    # dimensions dropped)
    return replace(
        first,
        within_sum=torch.stack([p.within_sum for p in parts]).sum(0),
        unit_sum=torch.stack([p.unit_sum for p in parts]).sum(0),
        n_sequences=sum(p.n_sequences for p in parts),
        window_within=torch.cat([p.window_within for p in parts]),
        window_cross=first.window_cross if single else None,
        window_same_position=first.window_same_position if single else None,
        provenance=replace(
            first.provenance,
            data=" + ".join(datas) if len(datas) <= 3 else f"{len(parts)} merged parts",
            data_sha256=" + ".join(p.provenance.data_sha256 for p in parts),
            data_rows="".join(p.provenance.data_rows for p in parts),
        ),
    )


def select_layers(
    sim: PositionalSimilarity, layers: list[int] | tuple[int, ...] | int
) -> PositionalSimilarity:
    """The result of :meth:`PositionalSimilarity.sel`: only the given entries of the layer
    axis (values, not indices), in ascending order.

    Args:
        sim: The result.
        layers: Entries of ``sim.layers``, or one.

    Returns:
        A new result.

    Raises:
        InvalidInputError: not integers, empty, or a layer given twice.
        IncompatibleResultsError: a requested layer is not in this result.
    """
    chosen = selected_layers(layers, sim.layers, "this result")
    idx = torch.tensor([sim.layers.index(layer) for layer in chosen], device="cpu")
    hooks = sim.provenance.hook_points

    def pick(t: Any, dim: int) -> Any:
        return None if t is None else t.index_select(dim, idx)

    return replace(
        sim,
        layers=tuple(chosen),
        within_sum=pick(sim.within_sum, 0),
        unit_sum=pick(sim.unit_sum, 0),
        window_within=pick(sim.window_within, 1),
        window_cross=pick(sim.window_cross, 1),
        window_same_position=pick(sim.window_same_position, 1),
        dropped_dims=pick(sim.dropped_dims, 0),
        n_massive=tuple(sim.n_massive[i] for i in idx.tolist()) if sim.n_massive else (),
        provenance=replace(
            sim.provenance,
            hook_points=tuple(hooks[i] for i in idx.tolist()) if hooks else (),
        ),
    )


# The per-window readings of a :class:`~homoglens.PositionalSimilarity`: which statistics exist
# per window, which of them are cross-input readings (built on ``SP``) and when those mean
# nothing, and the per-window values whose mean over windows is the corpus statistic.

C_STATS = (2, 3, 4)  # matched_first, matched_last, homogenization: they involve C
"""Indices into :data:`~homoglens.similarity.maths.SIMILARITY_STATISTICS` of the statistics
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


# The tables of a :class:`~homoglens.PositionalSimilarity`: the naive and distance-matched edge
# excess, the same-position cross-input excess (each with block-bootstrap intervals), and the tidy
# export of the derived values.


def _interval(
    values: torch.Tensor | None,
    *,
    ci: float,
    block: int | Literal["auto"],
    seed: int,
    n_boot: int,
) -> dict[str, float]:
    """The ``se``, ``ci_low`` and ``ci_high`` columns of a table row: the block-bootstrap
    estimate (:func:`~homoglens.core.stats.estimate`) of the mean of ``values`` ``[batch]`` over the
    windows, or NaN for all three where ``values`` is ``None`` (no per-window values)."""
    if values is None:
        return {"se": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    est = estimate([values[None]], block=block, n_boot=n_boot, ci=ci, seed=seed)
    return {"se": est.se, "ci_low": est.ci_low, "ci_high": est.ci_high}


def edge_excess_table(
    sim: PositionalSimilarity,
    k: int | None,
    *,
    ci: float,
    block: int | Literal["auto"],
    seed: int,
    n_boot: int,
) -> pd.DataFrame:
    """The edge-excess table of ``sim`` (per layer and edge, naive and distance-matched), as
    :meth:`PositionalSimilarity.edge_excess` (its arguments, returns and errors)."""
    import pandas as pd

    from homoglens.core.validate import as_int

    k = sim.edge_k if k is None else as_int("k", k, low=1)
    naive = sim._stat(sim.M, k=k)
    matched = sim._stat(sim.W, k=k)
    rows = []
    have = k == sim.edge_k and sim.n_sequences > 1
    if not have and k != sim.edge_k:
        warnings.warn(
            f"per-window values are stored for edge_k={sim.edge_k}, not k={k}: no "
            f"intervals; rerun positional_similarity(..., edge_k={k}) for them",
            stacklevel=3,  # the caller of PositionalSimilarity.edge_excess
        )
    for li, layer in enumerate(sim.layers):
        for e, edge in enumerate(("first", "last")):
            values = sim.per_window(f"matched_{edge}")[:, li] if have else None
            interval = _interval(values, ci=ci, block=block, seed=seed, n_boot=n_boot)
            rows.append(
                {
                    "layer": layer,
                    "edge": edge,
                    "naive": float(naive[li, e]),
                    "matched": float(matched[li, 2 + e]),
                    **interval,
                    "n_sequences": sim.n_sequences,
                }
            )
    return pd.DataFrame(rows)


def sp_excess_table(
    sim: PositionalSimilarity,
    *,
    ci: float,
    block: int | Literal["auto"],
    seed: int,
    n_boot: int,
) -> pd.DataFrame:
    """The cross-input excess table of ``sim`` (per layer and edge, ``SP`` of the edge minus
    the middle's), as :meth:`PositionalSimilarity.sp_excess` (its arguments and returns)."""
    import pandas as pd

    refused = sim._cross_input_refused("sp_excess", stacklevel=4)
    first, middle, last = edge_groups(sim.n_pos, sim.edge_k)
    rows = []
    for li, layer in enumerate(sim.layers):
        mid = math.nan if refused else float(sim.SP[li, list(middle)].mean())
        for edge, where in (("first", first), ("last", last)):
            value = math.nan if refused else float(sim.SP[li, list(where)].mean())
            values = None
            if sim.has_pseudo_values and sim.n_sequences > 1 and not refused:
                values = sim.per_window(f"sp_{edge}")[:, li]
            interval = _interval(values, ci=ci, block=block, seed=seed, n_boot=n_boot)
            rows.append(
                {
                    "layer": layer,
                    "edge": edge,
                    "sp_edge": value,
                    "sp_middle": mid,
                    "excess": value - mid,
                    **interval,
                    "n_sequences": sim.n_sequences,
                }
            )
    return pd.DataFrame(rows)


def similarity_frame(sim: PositionalSimilarity) -> pd.DataFrame:
    """The tidy DataFrame of :meth:`PositionalSimilarity.to_pandas`: one row per (metric,
    layer, index), columns ``metric, layer, index, value``.

    Args:
        sim: The result.

    Returns:
        The DataFrame (``index`` is ``<NA>`` for the per-layer metrics).
    """
    import pandas as pd

    frames = []
    layer_col = torch.tensor(sim.layers, device="cpu")
    for name, index in (
        ("SP", sim.positions),
        ("to_first", sim.positions),
        ("to_others", sim.positions),
        ("lag", torch.arange(sim.n_pos, device="cpu")),
    ):
        values = getattr(sim, name)
        frames.append(
            pd.DataFrame(
                {
                    "metric": name,
                    "layer": layer_col.repeat_interleave(values.shape[1]).numpy(),
                    "index": pd.array(index.repeat(len(sim.layers)).numpy(), dtype="Int64"),
                    "value": values.flatten().numpy(),
                }
            )
        )
    for name in ("homogenization", "mean_pairwise", "baseline"):
        frames.append(
            pd.DataFrame(
                {
                    "metric": name,
                    "layer": layer_col.numpy(),
                    "index": pd.array([None] * len(sim.layers), dtype="Int64"),
                    "value": getattr(sim, name).numpy(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


__all__ = [
    "CROSS_INPUT_STATISTICS",
    "WINDOW_STATISTICS",
    "PositionalSimilarity",
    "cross_input_problem",
]


@dataclass(frozen=True, eq=False)
class PositionalSimilarity(SavedResult, Plotted):
    """Position x position cosine similarity of residual vectors over equal-length windows.

    For windows s = 1..n and counted positions i, j (``first_position`` .. window end), with
    unit vectors u_{s,i} (after the chosen ``space`` and ``centre``):

    * ``M[i, j] = mean_s u_{s,i} . u_{s,j}`` (within-window similarity);
    * ``C[i, j] = mean_{s != r} u_{s,i} . u_{r,j}`` (the same pair of positions across windows:
      anisotropy plus whatever all windows share at those positions);
    * ``W = M - C`` (contextual similarity), ``homogenization = mean_{i != j} W[i, j]``;
    * ``SP[i] = C[i, i]`` (same position, different inputs), ``to_first[i] = M[i, 0]``,
      ``lag[d] = mean_i M[i, i - d]``;
    * edge statistics (:meth:`edge_excess`): the naive excess of the first / last ``k``
      positions' mean similarity over the middle's, and the distance-matched excess, which
      compares edge-middle pairs with middle-middle pairs at the same distance (see
      :func:`homoglens.similarity.maths.similarity_coefficients`).

    Stored fields (float64; sums merge by addition):
        layers: Entries of the ``n_layers + 1`` residual axis held.
        within_sum: ``[layer pos pos]`` sum over windows of U_s U_s^T.
        unit_sum: ``[layer pos d_model]`` sum over windows of the unit vectors at each position.
        n_sequences: Windows.
        window_within: ``[batch layer stat]`` per window, ``stat_e(U_s U_s^T)`` for each of
            :data:`~homoglens.similarity.maths.SIMILARITY_STATISTICS` (the coefficients of
            ``edge_k``).
        window_cross: ``[batch layer stat]`` or ``None``: per window,
            ``sum_{r != s} (stat_e(U_s U_r^T) + stat_e(U_r U_s^T))``, the window's share of
            the cross-window terms (a second pass; enables jackknife pseudo-values).
        window_same_position: ``[batch layer pos]`` or ``None``: per window and position,
            ``u_{s,i} . sum_{r != s} u_{r,i}`` (second pass).
        first_position: The first counted position: 0, 1 when position 0 was left out (a
            BOS), or the ``offset`` of :func:`~homoglens.positional_similarity`.
        edge_k: Positions per edge of the per-window statistics.
        space: ``"resid"``, ``"ln_input"`` or ``"final_norm"``.
        centre: ``None``, ``"global"`` or ``"position"``.
        standardize: Whether each dimension was divided by its corpus s.d.
        massive_threshold: Tokens with max |x| / median |x| above it were left out of the
            global mean (``centre="global"``).
        n_massive: Per layer entry, tokens (after position 0) left out of the global mean for
            that reason (empty unless ``centre="global"``).
        dropped_dims: ``[layer k]`` or ``None``: the dimensions zeroed before the cosines in
            each layer entry (``drop_dims``: the k of largest mean square).
        provenance: :class:`~homoglens.results.Provenance`.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (edge homogenization, the claim tested).
        Ethayarajh 2019 (anisotropy); Barbero et al. 2024, arXiv 2406.04267 (tokens of
        different inputs converge); Timkey & van Schijndel 2021, arXiv 2109.04404 (rogue
        dimensions, standardisation).
    """

    _stem: ClassVar[str] = "similarity"
    _figure: ClassVar[str] = "similarity.figure.similarity_figure"
    _layer_axis: ClassVar[bool] = True
    _choices: ClassVar[dict[str, tuple[Any, ...]]] = {
        "space": ("resid", "ln_input", "final_norm"),
        "centre": (None, "global", "position"),
    }
    _bounds: ClassVar[dict[str, Bounds]] = {
        # sums over windows of cosines (and of per-window statistics: differences of means of
        # cosines), bounded by the number of windows
        "within_sum": Bounds(-1.0, 1.0, scale="n_sequences", tol=1e-6),
        "window_within": Bounds(-2.0, 2.0, tol=1e-6),
        "window_cross": Bounds(-4.0, 4.0, scale="n_sequences", tol=1e-6),
        "window_same_position": Bounds(-1.0, 1.0, scale="n_sequences", tol=1e-6),
        "first_position": NON_NEGATIVE,
        "edge_k": Bounds(1.0),
        "massive_threshold": Bounds(1.0),
        "n_massive": NON_NEGATIVE,
    }

    layers: tuple[int, ...]
    within_sum: Float[torch.Tensor, "layer pos pos"]
    unit_sum: Float[torch.Tensor, "layer pos d_model"]
    n_sequences: int
    window_within: Float[torch.Tensor, "batch layer stat"]
    window_cross: Float[torch.Tensor, "batch layer stat"] | None = None
    window_same_position: Float[torch.Tensor, "batch layer pos"] | None = None
    first_position: int = 0
    edge_k: int = 8
    space: str = "resid"
    centre: str | None = None
    standardize: bool = False
    massive_threshold: float = 100.0
    n_massive: tuple[int, ...] = ()
    dropped_dims: Int[torch.Tensor, "layer k"] | None = None
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        check_similarity_fields(self)

    def _check_values(self) -> None:
        """The sums of a saved result fit together (run by
        :func:`~homoglens.results.validate_result` on load): ``within_sum`` is a sum of Gram
        matrices of unit (or zero) vectors, so it is symmetric with a diagonal in [0, n]; each
        ``unit_sum[l, i]`` is a sum of n unit vectors (norm <= n); ``SP`` (``C[i, i]``) is a
        cosine; ``n_massive`` holds one count per layer entry, only for ``centre="global"``;
        ``provenance.exclude_first`` is whether ``first_position`` is above 0."""
        check_similarity_values(self)

    @classmethod
    def from_activations(
        cls,
        resid: Float[torch.Tensor, "batch pos d_model"]
        | Float[torch.Tensor, "layer batch pos d_model"],
        attention_mask: Any = None,
        **options: Any,
    ) -> PositionalSimilarity:
        """Build the result from activations you already have (no model), e.g. the tensors
        of an ``ActivationCache``: see
        :func:`homoglens.similarity.measure.similarity_from_activations` for the keyword
        ``options``, errors and an example."""
        fields = activation_fields(resid, attention_mask, **options)
        provenance = Provenance(
            exclude_first=bool(fields["first_position"]),
            data=f"given activations {tuple(resid.shape)}",
            homoglens_version=package_version("homoglens"),
        )
        return cls(**fields, provenance=provenance)

    @classmethod
    def from_cache(
        cls,
        cache: Any,
        *,
        layers: list[int] | tuple[int, ...] | int | None = None,
        attention_mask: Any = None,
        centre: Centring | None = None,
        standardize: bool = False,
        exclude_first: bool = False,
        edge_k: int = 8,
        massive_threshold: float = 100.0,
        pseudo_values: bool = True,
        drop_dims: int = 0,
        batch_size: int = 64,
    ) -> PositionalSimilarity:
        """Position x position similarity of activations you already have: the residual stream
        held by a TransformerLens ``ActivationCache``, with no second forward pass.

        Reads entry 0 from ``blocks.0.hook_resid_pre`` and entry l from
        ``blocks.{l-1}.hook_resid_post`` (the hook points :func:`~homoglens.positional_similarity`
        reads with ``space="resid"``) and runs the same passes over them, so
        ``PositionalSimilarity.from_cache(cache)`` of ``_, cache = model.run_with_cache(tokens)``
        equals ``positional_similarity(model, tokens, exclude_first=False)``.

        Args:
            cache: The ``ActivationCache`` of ``model.run_with_cache(tokens)``, or a dict of
                those hook names to ``[batch pos d_model]`` tensors.
            layers: Entries of the residual axis; default: every entry the cache holds.
            attention_mask: ``[batch pos]`` 0/1 (left or right padding); every row must hold the
                same number of real tokens. Default: all real.
            centre: As in :func:`~homoglens.positional_similarity`.
            standardize: As there.
            exclude_first: Leave position 0 out (a bool: the cache has no BOS record).
            edge_k: As there.
            massive_threshold: As there.
            pseudo_values: As there.
            drop_dims: As there.
            batch_size: Windows reduced at a time (memory, not results).

        Returns:
            A :class:`PositionalSimilarity` (``space="resid"``) whose provenance names the
            cache's model and backend (when the cache knows its model) and the hook points.

        Raises:
            InvalidInputError: not a cache, a missing hook point (the message says how to keep
                it), rows of different lengths, bad options.
            NonFiniteActivationError: NaN/inf in a counted vector.

        Examples:
            >>> import torch
            >>> from homoglens import PositionalSimilarity, load_model
            >>> from homoglens.testing import tiny_model_folder
            >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
            >>> _, cache = model.run_with_cache(torch.randint(0, 50000, (6, 24)))
            >>> sim = PositionalSimilarity.from_cache(cache, edge_k=4)
            >>> sim.layers, tuple(sim.M.shape)
            ((0, 1, 2), (3, 24, 24))
        """
        read = cached_residuals(cache, layers, attention_mask, exclude_first=bool(exclude_first))
        fields = activation_fields(
            torch.stack(read.resid),
            read.attention_mask,
            centre=centre,
            standardize=standardize,
            exclude_first=exclude_first,
            edge_k=edge_k,
            massive_threshold=massive_threshold,
            pseudo_values=pseudo_values,
            drop_dims=drop_dims,
            batch_size=batch_size,
        )
        provenance = replace(read.provenance, exclude_first=bool(fields["first_position"]))
        return cls(**{**fields, "layers": read.layers}, provenance=provenance)

    # ------------------------------------------------------------------ shape
    @property
    def n_pos(self) -> int:
        """Counted positions per window (the window length minus ``first_position``)."""
        return int(self.within_sum.shape[1])

    @property
    def d_model(self) -> int:
        """Residual width."""
        return int(self.unit_sum.shape[-1])

    @property
    def positions(self) -> torch.Tensor:
        """``[pos]`` absolute position (from the window's first token) of each counted index."""
        return torch.arange(self.n_pos, device="cpu") + self.first_position

    # ------------------------------------------------------------------ matrices
    @cached_property
    def M(self) -> Float[torch.Tensor, "layer pos pos"]:
        """``[layer pos pos]`` within-window mean cosine, in [-1, 1]."""
        return self.within_sum / self.n_sequences

    @cached_property
    def C(self) -> Float[torch.Tensor, "layer pos pos"]:
        """``[layer pos pos]`` mean cosine of position i of one window with position j of
        another, in [-1, 1]; NaN with one window."""
        n = self.n_sequences
        if n < 2:
            return torch.full_like(self.within_sum, math.nan)
        cross = self.unit_sum @ self.unit_sum.transpose(1, 2) - self.within_sum
        return cross / (n * (n - 1))

    @cached_property
    def W(self) -> Float[torch.Tensor, "layer pos pos"]:
        """``[layer pos pos]`` contextual similarity ``M - C``."""
        return self.M - self.C

    @cached_property
    def SP(self) -> Float[torch.Tensor, "layer pos"]:
        """``[layer pos]`` same-position cross-input similarity ``C[i, i]`` (1 when every
        window holds the same vector there, e.g. a BOS)."""
        return torch.diagonal(self.C, dim1=1, dim2=2).clone()

    @cached_property
    def to_first(self) -> Float[torch.Tensor, "layer pos"]:
        """``[layer pos]`` within-window cosine to the first counted position, ``M[:, i, 0]``."""
        return self.M[:, :, 0].clone()

    @cached_property
    def to_others(self) -> Float[torch.Tensor, "layer pos"]:
        """``[layer pos]`` mean within-window cosine of a position to the other counted ones
        (the profile's ``to_others`` on these windows)."""
        total = self.M.sum(-1) - torch.diagonal(self.M, dim1=1, dim2=2)
        return total / (self.n_pos - 1)

    @cached_property
    def lag(self) -> Float[torch.Tensor, "layer lag"]:
        """``[layer lag]`` mean within-window cosine of tokens ``lag`` positions apart
        (``lag = 0 .. pos - 1``; ``lag[0]`` is the fraction of non-zero vectors)."""
        return torch.stack(
            [torch.diagonal(self.M, offset=-d, dim1=1, dim2=2).mean(-1) for d in range(self.n_pos)],
            dim=1,
        )

    @cached_property
    def homogenization(self) -> Float[torch.Tensor, " layer"]:
        """``[layer]`` mean off-diagonal ``W``: within-window similarity beyond what windows
        share (anisotropy, common positional components)."""
        return self._stat(self.W, k=self.edge_k)[:, 4]

    @cached_property
    def mean_pairwise(self) -> Float[torch.Tensor, " layer"]:
        """``[layer]`` mean off-diagonal ``M`` (raw mean pairwise cosine)."""
        return self._stat(self.M, k=self.edge_k)[:, 4]

    @cached_property
    def baseline(self) -> Float[torch.Tensor, " layer"]:
        """``[layer]`` mean of ``C`` over all position pairs: the anisotropy baseline of
        :class:`~homoglens.HomogenizationProfile` on these windows."""
        return self.C.mean((1, 2))

    def _stat(self, matrix: torch.Tensor, *, k: int) -> torch.Tensor:
        """``[layer stat]`` the linear statistics of ``matrix`` (``[layer pos pos]``)."""
        coef = similarity_coefficients(self.n_pos, k)
        return torch.einsum("lij,eij->le", matrix, coef)

    # ------------------------------------------------------------------ per window
    @property
    def has_pseudo_values(self) -> bool:
        """Whether the second pass ran, so per-window values are jackknife pseudo-values."""
        return self.window_cross is not None

    def per_window(self, statistic: str) -> Float[torch.Tensor, "batch layer"]:
        """Per-window values whose mean over windows is the corpus statistic exactly.

        For ``naive_*`` the window's own statistic. For ``matched_*`` and ``homogenization``
        (which subtract ``C``): with the second pass, the exact delete-one jackknife
        pseudo-value ``n stat - (n-1) stat_(-s)`` (``stat(M_s) - (x_s - n stat(C)) / (n-2)``,
        x_s being the window's share of the cross-window pairs; first-order for n = 2), whose
        variance over windows gives the standard error including ``C``'s own sampling noise;
        without it, ``stat(M_s - C)`` with ``C`` held fixed (docs/similarity.md; the
        standard error then ignores ``C``'s noise and can be off either way: 0.0017 against a
        true 0.0013 on the AR(1) null of 400 x 128 x 128, 0.85-0.88 of the true spread on
        smaller ones, where the pseudo-values give 1.00 and 0.83-0.94). ``sp_first`` /
        ``sp_last`` (``SP`` of an edge minus the middle's mean) and ``sp_mean`` (``SP``
        averaged over the counted positions) exist only with the second pass (they are
        cross-window by definition), and only on uncentred vectors: on centred ones they are
        NaN with a warning (:func:`cross_input_problem`).

        Args:
            statistic: One of :data:`WINDOW_STATISTICS`.

        Returns:
            ``[batch layer]`` float64 cosines.

        Raises:
            InvalidInputError: unknown statistic, or ``sp_*`` without the second pass.
        """
        return window_values(self, statistic)

    def _cross_input_refused(self, what: str, stacklevel: int = 3) -> bool:
        """Warn and return True when ``what`` (a cross-input reading) means nothing on these
        vectors (:func:`cross_input_problem`); the warning points ``stacklevel`` frames up
        (3: the caller of the method that called this one)."""
        problem = cross_input_problem(self.centre)
        if problem is None:
            return False
        warnings.warn(
            f"{what} is NaN: {problem}. Measure cross-input readings on uncentred vectors: "
            "positional_similarity(..., centre=None, exclude_first=True, pseudo_values=True)",
            stacklevel=stacklevel,
        )
        return True

    # ------------------------------------------------------------------ tables
    def edge_excess(
        self,
        k: int | None = None,
        *,
        ci: float = 0.95,
        block: int | Literal["auto"] = "auto",
        seed: int = 0,
        n_boot: int = 1000,
    ) -> pd.DataFrame:
        """Naive and distance-matched excess similarity of the first and last ``k`` counted
        positions over the middle, per layer, with a block-bootstrap interval on the matched one.

        ``naive`` is the mean within-window cosine of an edge position to the others minus the
        same for the middle positions (what ``edge_summary`` reports; negative for any process
        whose similarity falls with distance). ``matched`` compares edge-middle pairs of ``W``
        with middle-middle pairs at the same distance (zero in expectation when no position is
        special). The interval is a t interval with the standard error of a circular
        moving-block bootstrap over windows (:func:`homoglens.core.stats.estimate`) of the
        per-window values (:meth:`per_window`: jackknife pseudo-values when the second pass ran,
        else C held fixed, which is wider than the truth on real data).

        Args:
            k: Positions per edge (default: ``edge_k``). Intervals need the per-window values,
                stored for ``edge_k`` only; another ``k`` gives point estimates and NaN bounds.
            ci: Interval coverage, in (0, 1).
            block: Consecutive windows per bootstrap block: ``"auto"`` (chosen from the
                windows' autocorrelation, :func:`homoglens.core.stats.auto_block`) or an integer
                (1: i.i.d.).
            seed: Bootstrap seed.
            n_boot: Bootstrap resamples.

        Returns:
            DataFrame with columns ``layer, edge, naive, matched, se, ci_low, ci_high,
            n_sequences`` (one row per layer and edge ``first`` / ``last``; the interval is NaN,
            with a warning, from fewer than 4 windows).

        Raises:
            InvalidInputError: ``k`` too large for the windows, bad ``ci``/``block``.
        """
        return edge_excess_table(self, k, ci=ci, block=block, seed=seed, n_boot=n_boot)

    def sp_excess(
        self,
        *,
        ci: float = 0.95,
        block: int | Literal["auto"] = "auto",
        seed: int = 0,
        n_boot: int = 1000,
    ) -> pd.DataFrame:
        """Same-position cross-input similarity of the first and last ``edge_k`` positions
        minus the middle's mean, per layer (Barbero et al. 2024: late tokens of different
        inputs converge), with a block-bootstrap interval when the second pass ran.

        This is reading (b) of "edge tokens homogenize" (edge tokens converging on a direction
        shared by all inputs): it reads +c on every window's first ``edge_k`` tokens plus one
        common vector, 0 on stationary processes. On centred vectors it means nothing (every
        value NaN, with a warning: :func:`cross_input_problem`); measure it uncentred, with
        ``exclude_first`` where position 0 holds a BOS or massive activations. Causal mixing
        alone (no positional preference) can still move it: a verdict about positional bias
        compares it with a calibrated reference (docs/similarity.md, "Three readings").

        Returns:
            DataFrame with columns ``layer, edge, sp_edge, sp_middle, excess, se, ci_low,
            ci_high, n_sequences``.
        """
        return sp_excess_table(self, ci=ci, block=block, seed=seed, n_boot=n_boot)

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per (metric, layer, index). ``metric`` is ``SP``, ``to_first`` or
        ``to_others`` (``index`` = absolute position), ``lag`` (``index`` = distance), or
        ``homogenization``, ``mean_pairwise``, ``baseline`` (``index`` is ``<NA>``); columns
        ``metric, layer, index, value``. The matrices are the attributes ``M``, ``C``, ``W``."""
        return similarity_frame(self)

    @overload
    def plot(
        self,
        layers: list[int] | int | None = None,
        *,
        title: str | None = None,
        backend: Literal["matplotlib"] = "matplotlib",
    ) -> Figure: ...
    @overload
    def plot(
        self,
        layers: list[int] | int | None = None,
        *,
        title: str | None = None,
        backend: Literal["plotly"],
    ) -> PlotlyFigure: ...
    def plot(
        self,
        layers: list[int] | int | None = None,
        *,
        title: str | None = None,
        backend: PlotBackend = "matplotlib",
    ) -> Figure | PlotlyFigure:
        """``M`` and ``W`` heatmaps of the chosen layers (default: the last), ``SP`` and
        ``to_first`` by position, and the lag curves of every layer.

        Args:
            layers: Entries of :attr:`layers` to draw as heatmaps (default: the last).
            title: Figure title (default: the model, the windows and the settings).
            backend: As in :meth:`homoglens.results.base.Plotted.plot`, which says what is
                returned and raised.

        Raises:
            InvalidInputError: a layer not in this result.
        """
        return self._draw(layers, title=title, backend=backend)

    # ------------------------------------------------------------------ combining
    @staticmethod
    def merge(*parts: PositionalSimilarity) -> PositionalSimilarity:
        """Add results over disjoint windows into one (any split equals the one-pass result).

        Per-window rows are concatenated in the order given. The second-pass values depend on
        the whole corpus's sums, so they are dropped (with a warning) when more than one part
        is merged. Centred results subtracted each part's own corpus mean and are refused.

        Raises:
            IncompatibleResultsError: no parts, or they differ in layers, positions, width,
                edge_k, space, centring, or a provenance field that must agree (model, family,
                backend, weights, dtype, model_revision, hook_points, exclude_first); centred
                parts; parts of overlapping data (the same ``provenance.data_sha256``, or the
                same result given twice).
        """
        first = merge_parts(parts, PositionalSimilarity)
        check_similarity_parts(first, parts)
        check_mergeable(parts, "PositionalSimilarity")
        return merge_similarity(first, parts)

    def sel(self, layers: list[int] | tuple[int, ...] | int) -> PositionalSimilarity:
        """A new result with only the given entries of the layer axis (values, not indices),
        in ascending order, as a measurement's ``layers=`` returns them.

        Raises:
            InvalidInputError: not integers, empty, or a layer given twice.
            IncompatibleResultsError: a requested layer is not in this result.
        """
        return select_layers(self, layers)

    def __repr__(self) -> str:
        dropped = self.dropped_dims
        return keyword_repr(
            "PositionalSimilarity",
            model=repr(self.provenance.model),
            layers=len(self.layers),
            pos=f"{self.n_pos} (from {self.first_position})",
            n_sequences=self.n_sequences,
            space=self.space,
            centre=self.centre,
            edge_k=self.edge_k,
            pseudo_values=self.has_pseudo_values,
            **({} if dropped is None else {"drop_dims": int(dropped.shape[1])}),
        )
