"""The figures of a :class:`~homoglens.similarity.result.PositionalSimilarity`: the
position-resolved curves and the edge excess,
composed from :mod:`homoglens.results.figure_parts` and drawn by either backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from homoglens.core.errors import InvalidInputError
from homoglens.results.base import entry_index
from homoglens.results.figure_parts import (
    LAYER_AXIS,
    AnyFigure,
    figure_kit,
    headline,
)

if TYPE_CHECKING:
    import pandas as pd

    from homoglens.similarity.result import PositionalSimilarity


def similarity_figure(
    result: PositionalSimilarity,
    layers: list[int] | int | None,
    *,
    title: str | None = None,
    backend: str = "matplotlib",
) -> AnyFigure:
    """Position x position heatmaps of ``M`` and ``W`` for each chosen layer (default: the
    last), ``SP`` and ``to_first`` by position, and the lag curves of every layer.

    Raises:
        InvalidInputError: a layer not in the result, or an unknown backend.
    """
    kit = figure_kit(backend)
    chosen = [result.layers[-1]] if layers is None else layers
    layers = [chosen] if isinstance(chosen, int) else list(chosen)
    missing = [layer for layer in layers if layer not in result.layers]
    if missing or not layers:
        raise InvalidInputError(
            f"layers {missing or layers} are not in this result (it has {list(result.layers)})"
        )
    n = len(layers)
    fig, axes = kit.new_figure(4.2 * (2 * n + 2), 4, ncols=2 * n + 2)
    pos = result.positions.numpy()
    extent = (pos[0] - 0.5, pos[-1] + 0.5, pos[-1] + 0.5, pos[0] - 0.5)
    for k, layer in enumerate(layers):
        li = entry_index(layer, result.layers, "this result")
        m_ax, w_ax = axes[2 * k : 2 * k + 2]
        common: dict[str, Any] = {
            "extent": extent, "origin": "upper", "xlabel": "position j", "ylabel": "position i",
            "label": "cosine",
        }  # fmt: skip
        kit.heatmap(m_ax, result.M[li].numpy(), title=f"M, layer {layer}", **common)
        w = result.W[li].numpy()
        bound = float(np.nanmax(np.abs(w - np.diag(np.diag(w))))) or 1.0
        kit.heatmap(  # centred on 0, scaled to the off-diagonal (the diagonal is 1 - C)
            w_ax, w, title=f"W, layer {layer}", cmap="RdBu_r", vmin=-bound, vmax=bound,
            **{**common, "label": "W = M - C (cosine)"},
        )  # fmt: skip
    series = {}
    styles = {}
    for layer in layers:
        li = entry_index(layer, result.layers, "this result")
        series[f"SP, layer {layer}"] = result.SP[li].numpy()
        series[f"to_first, {layer}"] = result.to_first[li].numpy()
        styles[f"to_first, {layer}"] = "--"
    kit.curves(
        axes[-2], pos, series, styles=styles, lw=1, legend="x-small", xlabel="position",
        ylabel="cosine", title="Same position across inputs (SP); to first",
    )  # fmt: skip
    kit.curves(
        axes[-1], np.arange(1, result.n_pos),
        {str(layer): result.lag[li, 1:].numpy() for li, layer in enumerate(result.layers)},
        lw=1, legend="x-small" if len(result.layers) <= 12 else None, legend_title="layer",
        xlabel="distance |i - j| (positions)", ylabel="mean within-window cosine",
        title="Similarity by distance, per layer",
    )  # fmt: skip
    default = (
        f"{result.provenance.model}: positional similarity over {result.n_sequences} windows "
        f"(space={result.space}, centre={result.centre})"
    )
    headline(kit, fig, title, default, matplotlib=True)
    return fig


def edge_excess_figure(
    result: PositionalSimilarity, edge: pd.DataFrame, *, backend: str = "matplotlib"
) -> AnyFigure:
    """The naive and the distance-matched edge excess by layer (matched with its intervals),
    from ``edge = result.edge_excess()``."""
    kit = figure_kit(backend)
    rows = {name: edge[edge["edge"] == name] for name in ("first", "last")}
    series, styles, bands = {}, {}, {}
    for name, r in rows.items():
        series[f"naive, {name}"], styles[f"naive, {name}"] = r["naive"], "--"
        series[f"matched, {name}"], styles[f"matched, {name}"] = r["matched"], "o-"
        bands[f"matched, {name}"] = (r["ci_low"], r["ci_high"])
    fig, (ax,) = kit.new_figure(7, 4)
    kit.curves(
        ax, {k: rows[k.split(", ")[1]]["layer"] for k in series}, series, styles=styles,
        bands=bands, ms=3, hlines=(0.0,), legend="x-small", xlabel=LAYER_AXIS,
        ylabel="edge minus middle (cosine)",
        title=f"Edge excess, {result.edge_k} positions per edge",
    )  # fmt: skip
    what = f"positional similarity over {result.n_sequences} windows"
    headline(kit, fig, None, what, matplotlib=False, provenance=result.provenance)
    return fig
