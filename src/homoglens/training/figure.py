"""The figure of a :class:`~homoglens.training.sweep_result.CheckpointSweep`,
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
    from homoglens.training.sweep_result import CheckpointSweep


_SWEEP_TITLES = {
    "sink_rate": "Sink_1^0.3 (key 0), % of heads",
    "homogenization": "homogenization, last entry (cosine)",
    "homogenization_adjusted": "adjusted homogenization, last entry",
    "loss": "next-token loss (nats)",
}


def sweep_figure(
    sweep: CheckpointSweep, *, title: str | None = None, backend: str = "matplotlib"
) -> AnyFigure:
    """Each scalar metric against the training step (symmetric-log axis when step 0 is
    included; linear on the plotly side, which has none), and the first per-entry metric as a
    heatmap (residual entry x checkpoint)."""
    kit = figure_kit(backend)
    n_panels = len(sweep.metrics) + (1 if sweep.layer_metrics else 0)
    fig, axes = kit.new_figure(4.2 * max(n_panels, 1), 3.4, ncols=max(n_panels, 1))
    known = ~torch.isnan(sweep.steps)
    x = (sweep.steps if bool(known.all())
         else torch.arange(len(sweep.checkpoints), device="cpu").double())  # fmt: skip
    xlabel = "training step" if bool(known.all()) else "checkpoint (training order)"
    for ax, (m, name) in zip(axes, enumerate(sweep.metrics), strict=False):
        kit.curves(ax, x, {name: sweep.values[:, m]}, xlabel=xlabel, ylabel=name, legend=None,
                   marker="o", ms=3)  # fmt: skip
        if bool(known.all()) and float(x.max()) > 10 * max(float(x[x > 0].min()), 1.0):
            kit.log_scale(ax, "x", linthresh=max(float(x[x > 0].min()), 1.0))
        kit.panel_title(ax, _SWEEP_TITLES.get(name, name), fontsize=9)
    if sweep.layer_metrics:
        name = sweep.layer_metrics[0]
        kit.heatmap(
            axes[-1], sweep.layer_values[:, 0].T, xlabel="checkpoint", ylabel="residual entry",
            title=f"{name} by residual entry", label=name,
            xticklabels=[label.rsplit("/", 1)[-1] for label in sweep.checkpoints],
            yticklabels=[str(layer) for layer in sweep.layers],
        )  # fmt: skip
    default = f"{sweep.provenance.model}: over {len(sweep.checkpoints)} checkpoints"
    headline(kit, fig, title, default, matplotlib=True)
    return fig
