"""The figure of a :class:`~homoglens.ablation.result.PositionAblationStudy`,
composed from :mod:`homoglens.results.figure_parts` and drawn by either backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from homoglens.results.figure_parts import (
    AnyFigure,
    figure_kit,
    headline,
    layer_curves,
)

if TYPE_CHECKING:
    from homoglens.ablation.result import PositionAblationStudy


def study_figure(
    study: PositionAblationStudy, *, title: str | None = None, backend: str = "matplotlib"
) -> AnyFigure:
    """Mean pairwise cosine by layer for each mode with CI bands; loss per mode with CIs."""
    kit = figure_kit(backend)
    what = "massive-activation ablations" if study.is_massive else "positional ablations"
    fig, (left, right) = kit.new_figure(12, 4.2, ncols=2, width_ratios=[1.6, 1])
    layer_curves(
        kit, left, study.layer_table(), "mode", study.modes, ("mean_pairwise", "ci_low", "ci_high"),
        ylabel="mean pairwise cosine", title=f"Homogenization by layer under {what}",
    )  # fmt: skip
    loss = study.loss_table()
    kit.bars(
        right, list(loss["mode"]), loss["loss"], low=loss["ci_low"], high=loss["ci_high"],
        ylabel="next-token loss (nats/token)",
        title="Loss per mode (95% CI)" if study.ci == 0.95 else "Loss per mode",
    )  # fmt: skip
    p = study.profiles["none"].provenance
    default = f"{p.model}: {what}, {study.loss.shape[1]} sequences"
    headline(kit, fig, title, default, matplotlib=True)
    return fig
