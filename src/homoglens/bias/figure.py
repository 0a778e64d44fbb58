"""The figure of an :class:`~homoglens.bias.result.AttentionBiasStudy`,
composed from :mod:`homoglens.results.figure_parts` and drawn by either backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from homoglens.results.figure_parts import (
    AnyFigure,
    figure_kit,
    headline,
)

if TYPE_CHECKING:
    from homoglens.bias.result import AttentionBiasStudy


def bias_figure(
    study: AttentionBiasStudy, layer: int, *, title: str | None = None, backend: str = "matplotlib"
) -> AnyFigure:
    """Dose-response of an attention bias: the change in H_W and in the matched edge excess at
    residual entry ``layer`` (paired intervals), the loss, and the manipulation checks."""
    kit = figure_kit(backend)
    fig, axes = kit.new_figure(13, 3.4, ncols=3)
    x = np.asarray(study.strengths)
    axis = "beta" if study.kind == "temperature" else "b"
    series, bands = {}, {}
    for metric in ("homogenization", "matched_first", "matched_last"):
        frame = study.curve(metric, layer)
        series[metric] = frame["delta"].to_numpy()
        bands[metric] = (frame["ci_low"].fillna(0.0).to_numpy(),
                         frame["ci_high"].fillna(0.0).to_numpy())  # fmt: skip
    entry = study.layers[layer]
    kit.curves(axes[0], x, series, bands=bands, styles=dict.fromkeys(series, "o-"),
               xlabel=axis, ylabel=f"change vs baseline (entry {entry})", hlines=[0.0],
               title=f"{study.kind}: homogenization and edges")  # fmt: skip
    loss = study.curve("loss")
    kit.curves(axes[1], x, {"loss": loss["value"].to_numpy()}, styles={"loss": "o-"},
               xlabel=axis, ylabel="next-token loss (nats)", legend=None,
               title="loss")  # fmt: skip
    checks = {name: study.curve(name, None)["value"].to_numpy() for name in ("mass", "kl")}
    if study.kind == "temperature":
        checks = {"entropy": study.curve("entropy", None)["value"].to_numpy(), "kl": checks["kl"]}
    kit.curves(axes[2], x, checks, styles=dict.fromkeys(checks, "o-"), xlabel=axis,
               ylabel="per biased row (nats / mass)", title="manipulation checks")  # fmt: skip
    what = f"attention bias ({study.kind}) on {study.n_sequences} windows"
    headline(kit, fig, title, what, matplotlib=False, provenance=study.provenance)
    return fig
