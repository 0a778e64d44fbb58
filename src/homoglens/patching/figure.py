"""The figure of a :class:`~homoglens.patching.result.PositionalPatchingResult`,
composed from :mod:`homoglens.results.figure_parts` and drawn by either backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from homoglens.results.figure_parts import (
    AnyFigure,
    figure_kit,
    headline,
)

if TYPE_CHECKING:
    from homoglens.patching.result import PositionalPatchingResult


def _effect_levels(effect: torch.Tensor) -> tuple[float, ...]:
    """The reference lines of a patching curve: 0 always (so the axis keeps it), and 1 (the
    source run) only where an effect comes within half of it; small effects (often <= 0.03)
    are then drawn on an axis scaled to them, not flattened on a 0-1 axis."""
    finite = effect[torch.isfinite(effect)]
    near_one = finite.numel() > 0 and float(finite.abs().max()) >= 0.5
    return (0.0, 1.0) if near_one else (0.0,)


def patching_figure(
    result: PositionalPatchingResult, m: int, *, backend: str = "matplotlib"
) -> AnyFigure:
    """Heatmap of the normalised effect, layer x cell (one metric), or a curve over blocks when
    there is one cell per block."""
    kit = figure_kit(backend)
    fig, (ax,) = kit.new_figure(7, 4.5)
    title = f"{result.direction}: {result.component}, {result.metrics[m]} (ablation {result.how})"
    what = f"positional patching over {result.n_sequences} sequences"
    headline(kit, fig, None, what, matplotlib=False, provenance=result.provenance)
    if len(result.cells) == 1:  # one cell per block: a curve over blocks
        kit.curves(
            ax, list(result.layers), {"effect": result.effect[m, :, 0].numpy()},
            styles={"effect": "o-"}, hlines=_effect_levels(result.effect[m, :, 0]), legend=None,
            xlabel="block",
            ylabel="normalised effect", title=title,
        )  # fmt: skip
        kit.panel_title(ax, title, fontsize=10)
        return fig
    if result.cell_axis == "pos":
        labels = [f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in result.cells]
    else:
        labels = [str(a) for a, _ in result.cells]
    kit.heatmap(  # RdBu_r: centred on 0 and scaled to max |effect| (effects are often << 1)
        ax, result.effect[m].numpy(), cmap="RdBu_r", xticklabels=labels,
        yticklabels=[str(x) for x in result.layers],
        xlabel="position" if result.cell_axis == "pos" else "head", ylabel="block", title=title,
        label="normalised effect (fraction of the gap, 1 = source run)",
    )  # fmt: skip
    kit.panel_title(ax, title, fontsize=10)
    return fig
