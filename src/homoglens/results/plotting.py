"""Generic figure primitives (matplotlib): a figure with panels, curves with interval bands, a
heatmap with its colour bar, bars with error bars.

This module knows no result class: each result's ``plot()`` composes these primitives
(each measurement's ``figure`` module). matplotlib is imported when a figure is made, not with
homoglens. :mod:`homoglens.results.plotting_plotly` is its twin for ``backend="plotly"``: the same
functions with the same arguments, so each result's figure is composed once.

Every figure is an :class:`InlineFigure`: a matplotlib ``Figure`` (made without pyplot, so no
global figure state) with a ``_repr_png_``, so a fresh Jupyter kernel displays a ``plot()`` that
ends a cell, once, with no ``%matplotlib`` magic. Where IPython already has a formatter for
``Figure`` (pyplot imported under the inline backend), that formatter draws it instead, once.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

__all__ = [
    "DIVERGING",
    "bars",
    "colour_range",
    "curves",
    "heatmap",
    "log_scale",
    "new_figure",
    "panel_title",
    "suptitle",
]  # fmt: skip  # and InlineFigure, built lazily

DIVERGING = frozenset(
    {"RdBu", "coolwarm", "bwr", "seismic", "PiYG", "PRGn", "BrBG", "PuOr", "RdGy",
     "RdYlBu", "RdYlGn", "Spectral"}
)  # fmt: skip
"""Diverging colour maps: :func:`heatmap` centres them on 0 and scales them to the data."""

_INLINE_FIGURE: type[Figure] | None = None


def _inline_figure_class() -> type[Figure]:
    """Build :class:`InlineFigure` on first use (matplotlib is imported here, not on import)."""
    global _INLINE_FIGURE
    if _INLINE_FIGURE is None:
        from matplotlib.figure import Figure

        class InlineFigure(Figure):
            """A matplotlib ``Figure`` that Jupyter displays as a PNG (``_repr_png_``) with no
            pyplot and no ``%matplotlib`` magic; everything else is ``Figure``'s."""

            def _repr_png_(self) -> bytes:
                """The figure as PNG bytes, cropped to its content (as the inline backend does)."""
                buffer = io.BytesIO()
                self.savefig(buffer, format="png", bbox_inches="tight")
                return buffer.getvalue()

        InlineFigure.__module__ = __name__
        InlineFigure.__qualname__ = "InlineFigure"
        _INLINE_FIGURE = InlineFigure
    return _INLINE_FIGURE


def __getattr__(name: str) -> Any:
    """``homoglens.results.plotting.InlineFigure`` (built on first access; pickling finds it
    here)."""
    if name == "InlineFigure":
        return _inline_figure_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_figure(
    width: float,
    height: float,
    *,
    ncols: int = 1,
    width_ratios: Sequence[float] | None = None,
) -> tuple[Figure, list[Axes]]:
    """A constrained-layout figure of ``ncols`` panels in one row.

    The figure is an :class:`InlineFigure`: a cell of a fresh Jupyter kernel that ends with it
    displays it (as PNG), with no pyplot and no ``%matplotlib`` magic.

    Args:
        width: Figure width (inches).
        height: Figure height (inches).
        ncols: Panels.
        width_ratios: Relative panel widths.

    Returns:
        The figure and its axes, left to right.
    """
    fig = _inline_figure_class()(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, width_ratios=width_ratios, squeeze=False)[0]
    return fig, list(axes)


def curves(
    ax: Axes,
    x: Any,
    series: Mapping[str, Any],
    *,
    bands: Mapping[str, tuple[Any, Any]] | None = None,
    styles: Mapping[str, str] | None = None,
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    hlines: Sequence[float] = (),
    legend: str | int | None = "small",
    legend_title: str | None = None,
    **line: Any,
) -> None:
    """Draw one curve per entry of ``series`` over ``x``, with optional interval bands.

    Args:
        ax: The panel.
        x: ``[n]`` positions on the x axis (or a mapping label -> x for curves of their own x).
        series: ``{label: [n] values}``.
        bands: ``{label: ([n] low, [n] high)}``, drawn in the curve's colour.
        styles: ``{label: matplotlib format string}`` (default ``"-"``).
        xlabel: Axis label.
        ylabel: Axis label.
        title: Panel title.
        hlines: Horizontal reference lines (grey).
        legend: Legend font size (a name or points), or ``None`` for no legend.
        legend_title: Legend title.
        **line: Passed to ``ax.plot`` (``lw``, ``ms``, ...).
    """
    for i, (label, y) in enumerate(series.items()):
        xs = x[label] if isinstance(x, Mapping) else x
        style = (styles or {}).get(label, "-")
        ax.plot(np.asarray(xs), np.asarray(y), style, label=label, color=f"C{i % 10}", **line)
        if bands and label in bands:
            low, high = bands[label]
            ax.fill_between(np.asarray(xs), low, high, alpha=0.2, color=f"C{i % 10}")
    for level in hlines:
        ax.axhline(level, color="grey", lw=0.6)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend is not None and series:
        ax.legend(fontsize=legend, title=legend_title)


def colour_range(
    values: Any,
    cmap: str,
    *,
    symmetric: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
) -> tuple[float | None, float | None]:
    """The colour range of a heatmap: ``(vmin, vmax)`` as given, or, for a diverging map
    (:data:`DIVERGING`) or ``symmetric``, ``+- max |finite value|`` (1 when all are 0 or NaN);
    ``None`` ends are left to the plotting library (the data's range).

    Args:
        values: ``[rows cols]`` the cells.
        cmap: Colour-map name (a ``_r`` suffix reverses it).
        symmetric: Centre on 0 for any colour map.
        vmin: Lower end given by the caller.
        vmax: Upper end given by the caller.

    Returns:
        The lower and upper ends.
    """
    if (symmetric or cmap.removesuffix("_r") in DIVERGING) and vmin is None and vmax is None:
        array = np.asarray(values, dtype=float)
        finite = np.abs(array[np.isfinite(array)])
        bound = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        return -bound, bound
    return vmin, vmax


def heatmap(
    ax: Axes,
    values: Any,
    *,
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    label: str,
    cmap: str = "viridis",
    symmetric: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
    extent: tuple[float, float, float, float] | None = None,
    origin: Literal["upper", "lower"] = "lower",
    yticklabels: Sequence[str] | None = None,
    xticklabels: Sequence[str] | None = None,
) -> AxesImage:
    """A ``[rows cols]`` heatmap with its colour bar.

    Args:
        ax: The panel.
        values: ``[rows cols]`` (NaN cells are left blank).
        xlabel: Axis label.
        ylabel: Axis label.
        title: Panel title.
        label: Colour-bar label: the quantity and its unit (required: no bar goes unlabelled).
        cmap: Colour map. A diverging one (:data:`DIVERGING`) is always centred on 0 and scaled
            to the data, ``+- max |value|``, unless ``vmin``/``vmax`` are given.
        symmetric: A range centred on 0, ``+- max |value|`` (unless ``vmin``/``vmax``), for any
            colour map.
        vmin: Lower end of the colour range.
        vmax: Upper end of the colour range.
        extent: ``(left, right, bottom, top)`` in data units; default cell indices.
        origin: ``"lower"`` (row 0 at the bottom) or ``"upper"``.
        yticklabels: One label per row (thinned to about 12 when there are many).
        xticklabels: One label per column (thinned to about 12).

    Returns:
        The image.
    """
    array = np.asarray(values, dtype=float)
    vmin, vmax = colour_range(array, cmap, symmetric=symmetric, vmin=vmin, vmax=vmax)
    image = ax.imshow(
        array,
        aspect="auto",
        origin=origin,
        interpolation="nearest",
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        extent=extent,
    )
    for labels, setter in ((yticklabels, ax.set_yticks), (xticklabels, ax.set_xticks)):
        if labels is not None:
            step = max(1, len(labels) // 12)
            setter(range(0, len(labels), step), list(labels)[::step], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.figure.colorbar(image, ax=ax, label=label)
    return image


def bars(
    ax: Axes,
    labels: Sequence[str],
    values: Any,
    *,
    low: Any = None,
    high: Any = None,
    ylabel: str = "",
    title: str = "",
    groups: Mapping[str, Any] | None = None,
    group_low: Mapping[str, Any] | None = None,
    group_high: Mapping[str, Any] | None = None,
    rotation: float = 0,
) -> None:
    """Bars with optional intervals: one bar per label, or groups of bars side by side.

    Args:
        ax: The panel.
        labels: One tick label per bar (or per group position).
        values: ``[n]`` bar heights (ignored when ``groups`` is given).
        low: ``[n]`` interval lower ends (optional).
        high: ``[n]`` interval upper ends.
        ylabel: Axis label.
        title: Panel title.
        groups: ``{series: [n] heights}``: bars of each series side by side at each label.
        group_low: ``{series: [n] lower ends}``.
        group_high: ``{series: [n] upper ends}``.
        rotation: Tick-label rotation (degrees).
    """
    x = np.arange(len(labels))
    if groups is None:
        heights = np.asarray(values, dtype=float)
        err = None
        if low is not None and high is not None:
            err = np.vstack([heights - np.asarray(low), np.asarray(high) - heights])
        ax.bar(x, heights, yerr=err, capsize=4, color=[f"C{i % 10}" for i in x])
    else:
        width = 0.8 / len(groups)
        for i, (name, heights) in enumerate(groups.items()):
            heights = np.asarray(heights, dtype=float)
            err = None
            if group_low is not None and group_high is not None:
                err = np.vstack(
                    [heights - np.asarray(group_low[name]), np.asarray(group_high[name]) - heights]
                )
            offset = (i - (len(groups) - 1) / 2) * width
            ax.bar(x + offset, heights, width, yerr=err, capsize=2, label=name, color=f"C{i % 10}")
        ax.legend(fontsize="x-small")
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_xticks(x, list(labels), rotation=rotation)
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def suptitle(fig: Figure, text: str) -> None:
    """Title the whole figure (above its panels).

    Args:
        fig: The figure.
        text: The title (a figure's title carries its provenance: model, data).
    """
    fig.suptitle(text)


def panel_title(ax: Axes, text: str, *, fontsize: float | None = None) -> None:
    """Title one panel.

    Args:
        ax: The panel.
        text: The title.
        fontsize: Font size (points; default matplotlib's).
    """
    ax.set_title(text, fontsize=fontsize)


def log_scale(
    ax: Axes, axis: Literal["x", "y"], *, base: float = 10, linthresh: float | None = None
) -> None:
    """Put one axis of a panel on a logarithmic scale.

    Args:
        ax: The panel.
        axis: ``"x"`` or ``"y"``.
        base: Base of the logarithm.
        linthresh: A symmetric-log scale, linear within ``+- linthresh`` (shows 0).
    """
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    if linthresh is None:
        setter("log", base=base)
    else:
        setter("symlog", linthresh=linthresh, base=base)
