"""The figures of :class:`~homoglens.MassiveActivations` beside its default heatmap: Sun et al.
2024's layer-wise figure (arXiv 2402.17762, Fig. 2; ``main_llm.py --exp2``), the three largest
|x| of the hidden state and its median, by layer, on a log axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from homoglens.errors import InvalidInputError
from homoglens.results.figure_parts import LAYER_AXIS, AnyFigure, figure_kit, headline

if TYPE_CHECKING:
    from homoglens.results.massive import MassiveActivations

MASSIVE_PLOT_KINDS = ("positions", "layers")
"""The figures of ``MassiveActivations.plot(kind=...)``: ``"positions"`` (the default heatmap of
log10 max/median ratio per layer and position) and ``"layers"`` (Sun et al.'s Fig. 2)."""


def massive_plot(
    massive: MassiveActivations, kind: str, *, backend: str = "matplotlib"
) -> AnyFigure:
    """Draw ``massive``'s figure ``kind`` (one of :data:`MASSIVE_PLOT_KINDS`).

    Raises:
        InvalidInputError: an unknown ``kind`` or ``backend``; ``kind="layers"`` on a result
            saved before ``layer_top`` existed.
    """
    if not isinstance(kind, str) or kind not in MASSIVE_PLOT_KINDS:
        raise InvalidInputError(
            f"kind={kind!r} is not one of {list(MASSIVE_PLOT_KINDS)}: 'positions' (the heatmap "
            "of max/median ratio by layer and position) or 'layers' (Sun et al.'s top 1-3 and "
            "median by layer)"
        )
    if kind == "layers":
        return massive_layers_figure(massive, backend=backend)
    from homoglens.results.figures import massive_figure

    return massive_figure(massive, backend=backend)


def massive_layers_figure(massive: MassiveActivations, *, backend: str = "matplotlib") -> AnyFigure:
    """Sun et al.'s Fig. 2: per layer, the mean over sequences of the 1st, 2nd and 3rd largest
    |x| of the whole hidden state (all real tokens and dimensions) and of its median |x|, on a
    log y axis (model units).

    Raises:
        InvalidInputError: an unknown ``backend``, or a result without ``layer_top`` (saved by
            an older homoglens: measure again).
    """
    if massive.layer_top is None or massive.layer_median is None:
        raise InvalidInputError(
            "this MassiveActivations has no layer_top / layer_median (saved before they "
            "existed): measure again with massive_activations(...) to draw kind='layers'"
        )
    kit = figure_kit(backend)
    x = np.asarray(massive.layers)
    top = massive.layer_top.double().numpy()
    series = {f"top {k + 1}": top[:, k] for k in range(top.shape[1])}
    series["median"] = massive.layer_median.double().numpy()
    positive = np.concatenate([v[v > 0] for v in series.values()])
    floor = float(positive.min()) / 2 if positive.size else 1e-12
    series = {label: np.clip(values, floor, None) for label, values in series.items()}
    styles = {label: "o-" for label in series} | {"median": "s--"}
    fig, (ax,) = kit.new_figure(7, 4)
    kit.curves(
        ax, x, series, styles=styles, lw=1.2, ms=3, xlabel=LAYER_AXIS,
        ylabel="|x| (model units, log scale)", legend="small",
        title="Massive activations: largest |x| and median |x| by layer (Sun et al. Fig. 2)",
    )  # fmt: skip
    kit.log_scale(ax, "y")
    what = f"top 1-3 and median |x| by layer over {massive.n_sequences} sequences"
    headline(kit, fig, None, what, matplotlib=False, provenance=massive.provenance)
    return fig
