"""The figures of a :class:`~homoglens.profile.result.HomogenizationProfile`: the curves per
entry, the anisotropy-adjusted curves and the [layer pos] heatmap,
composed from :mod:`homoglens.results.figure_parts` and drawn by either backend.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from homoglens.results.figure_parts import (
    LAYER_AXIS,
    AnyFigure,
    figure_kit,
    headline,
    provenance_title,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from matplotlib.axes import Axes

    from homoglens.profile.result import HomogenizationProfile
    from homoglens.results.plotting_plotly import Panel


def _profile_panel(
    profile: HomogenizationProfile,
    ax: Axes | Panel | None,
    size: tuple[float, float],
    backend: str,
    draw: Callable[[ModuleType, Any], None],
) -> AnyFigure:
    """Draw ``draw(kit, panel)`` on ``ax``, or on a figure of its own of ``size`` (inches)
    titled with the profile's provenance on the plotly side; the figure drawn on."""
    kit = figure_kit(backend)
    if ax is not None:
        draw(kit, ax)
        return ax.figure
    fig, axes = kit.new_figure(*size)
    draw(kit, axes[0])
    headline(kit, fig, None, _profile_title(profile), matplotlib=False)
    return fig


def profile_curves(
    profile: HomogenizationProfile,
    *,
    ax: Axes | Panel | None = None,
    title: str | None = None,
    backend: str = "matplotlib",
) -> AnyFigure:
    """Per-layer mean pairwise cosine (raw), anisotropy baseline, and adjusted = raw - baseline
    (on ``ax``, or a figure of its own titled with the provenance on the plotly side)."""

    def draw(kit: ModuleType, panel: Any) -> None:
        series = {
            "mean pairwise cosine (raw)": profile.mean_pairwise.numpy(),
            "baseline (across sequences)": profile.baseline.numpy(),
            "adjusted = raw - baseline": profile.adjusted.numpy(),
        }
        styles = dict(zip(series, ("o-", "s--", "^-"), strict=True))
        kit.curves(
            panel, np.asarray(profile.layers), series, styles=styles, hlines=(0.0,),
            xlabel=LAYER_AXIS, ylabel="cosine", title=title or "Homogenization by layer",
        )  # fmt: skip

    return _profile_panel(profile, ax, (6, 4), backend, draw)


def _profile_title(profile: HomogenizationProfile) -> str:
    return provenance_title(
        profile.provenance, f"{profile.n_sequences} sequences, {profile.n_tokens} tokens"
    )


def profile_adjusted(profile: HomogenizationProfile, *, backend: str = "matplotlib") -> AnyFigure:
    """Per-layer adjusted homogenization (mean pairwise cosine - baseline), the report's
    figure of what is left beyond anisotropy."""
    kit = figure_kit(backend)
    fig, (ax,) = kit.new_figure(6, 4)
    kit.curves(
        ax, list(profile.layers), {"adjusted": profile.adjusted.numpy()},
        styles={"adjusted": "^-"}, hlines=(0.0,), legend=None, xlabel=LAYER_AXIS,
        ylabel="mean pairwise cosine - baseline",
        title="Adjusted homogenization (beyond anisotropy)",
    )  # fmt: skip
    headline(kit, fig, None, _profile_title(profile), matplotlib=False)
    return fig


def profile_heatmap(
    profile: HomogenizationProfile,
    *,
    ax: Axes | Panel | None = None,
    metric: str = "to_others",
    title: str | None = None,
    backend: str = "matplotlib",
) -> AnyFigure:
    """Layer x position heatmap of a per-position metric (default ``to_others``)."""

    def draw(kit: ModuleType, panel: Any) -> None:
        values = getattr(profile, metric).numpy()
        kit.heatmap(
            panel, values, extent=(-0.5, profile.n_pos - 0.5, -0.5, len(values) - 0.5),
            yticklabels=[str(layer) for layer in profile.layers],
            xlabel="position (from the first real token)", ylabel="layer",
            title=title or f"{metric} by layer and position",
            label="cosine" if metric != "norm" else "norm",
        )  # fmt: skip

    return _profile_panel(profile, ax, (7, 4), backend, draw)


def profile_figure(
    profile: HomogenizationProfile, *, title: str | None = None, backend: str = "matplotlib"
) -> AnyFigure:
    """Two panels: per-layer curves (raw, baseline, adjusted) and the ``to_others`` heatmap."""
    kit = figure_kit(backend)
    fig, (left, right) = kit.new_figure(13, 4.5, ncols=2, width_ratios=[1, 1.3])
    profile_curves(profile, ax=left, backend=backend)
    profile_heatmap(profile, ax=right, backend=backend)
    headline(kit, fig, title, _profile_title(profile), matplotlib=True)
    return fig
