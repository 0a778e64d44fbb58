"""The tables of a :class:`~homoglens.PositionalSimilarity`: the naive and distance-matched
edge excess, the same-position cross-input excess (each with block-bootstrap intervals), and
the tidy export of the derived values."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Literal

import torch

from homoglens.similarity_math import edge_groups
from homoglens.stats import estimate

if TYPE_CHECKING:
    import pandas as pd

    from homoglens.results.similarity import PositionalSimilarity


def _interval(
    values: torch.Tensor | None,
    *,
    ci: float,
    block: int | Literal["auto"],
    seed: int,
    n_boot: int,
) -> dict[str, float]:
    """The ``se``, ``ci_low`` and ``ci_high`` columns of a table row: the block-bootstrap
    estimate (:func:`~homoglens.stats.estimate`) of the mean of ``values`` ``[batch]`` over the
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

    from homoglens.validate import as_int

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
