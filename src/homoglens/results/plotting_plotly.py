"""Generic figure primitives (plotly): the twin of :mod:`homoglens.results.plotting` for
``plot(backend="plotly")``.

Every function here takes the arguments of its matplotlib namesake, so each result's figure
(each measurement's ``figure`` module) is composed once and drawn by either module. A "panel" here
is a :class:`Panel` (one subplot of a ``plotly.graph_objects.Figure``) where matplotlib has an
``Axes``. What plotly adds: hover values with their units (heatmaps: row, column and value;
curves: x, y and the interval), legend entries that toggle a curve with its band, and zoom.

plotly is an optional dependency (``pip install "homoglens[plotly]"``), imported when a figure
is made, never with homoglens; without it :func:`require_plotly` raises
:class:`~homoglens.core.errors.MissingDependencyError`. Colour maps are sampled from matplotlib's,
so both backends colour the same values alike.
"""

from __future__ import annotations

import html
import importlib.util
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from homoglens.core.errors import MissingDependencyError
from homoglens.results.plotting import colour_range

__all__ = [
    "INSTALL",
    "Panel",
    "bars",
    "curves",
    "heatmap",
    "log_scale",
    "new_figure",
    "panel_title",
    "require_plotly",
    "suptitle",
]

INSTALL = 'pip install "homoglens[plotly]" (from a source checkout: pip install -e ".[plotly]")'
"""The command that installs the plotly extra (plotly and nbformat), for an installed package
and for a source checkout."""

TAB10 = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
"""matplotlib's default colour cycle (``C0`` ... ``C9``), so curves keep their colours."""

_PX_PER_INCH = 100
_MARKERS = {
    "o": "circle", "s": "square", "^": "triangle-up", "v": "triangle-down", "D": "diamond",
    "d": "diamond", "x": "x", "+": "cross", ".": "circle", "*": "star",
}  # fmt: skip
_DASHES = (("--", "dash"), ("-.", "dashdot"), (":", "dot"), ("-", "solid"))


def require_plotly() -> Any:
    """Import ``plotly.graph_objects``.

    Returns:
        The module.

    Raises:
        MissingDependencyError: plotly is not installed, or (in a Jupyter kernel) nbformat is
            not, without which plotly cannot display the figure in the notebook (it prints
            "Mime type rendering requires nbformat>=4.2.0" instead). The message gives the
            install command.
    """
    try:
        import plotly.graph_objects as go
    except ImportError as error:
        raise MissingDependencyError(
            f'backend="plotly" needs plotly, which is not installed: {INSTALL} '
            '(or draw with backend="matplotlib", the default)'
        ) from error
    if _in_jupyter_kernel() and importlib.util.find_spec("nbformat") is None:
        raise MissingDependencyError(
            'backend="plotly" in Jupyter needs nbformat to display the figure, which is not '
            f'installed: {INSTALL}, then restart the kernel (or draw with backend="matplotlib")'
        )
    return go


def _in_jupyter_kernel() -> bool:
    """Whether this code runs in a Jupyter (IPython) kernel, where plotly shows a figure through
    nbformat."""
    shell = sys.modules.get("IPython")
    get_ipython = getattr(shell, "get_ipython", None)
    ip = get_ipython() if callable(get_ipython) else None
    return ip is not None and getattr(ip, "kernel", None) is not None


@dataclass(eq=False)
class Panel:
    """One panel (subplot) of a plotly figure, where matplotlib has an ``Axes``.

    Attributes:
        figure: The ``plotly.graph_objects.Figure`` it belongs to.
        col: Its column (1 = leftmost); the figures have one row of panels.
    """

    figure: Any
    col: int

    def axis(self, which: Literal["x", "y"]) -> Any:
        """The panel's ``layout.xaxis`` / ``layout.yaxis`` object (``xaxis2`` ... for col > 1)."""
        return self.figure.layout[f"{which}axis{'' if self.col == 1 else self.col}"]

    @property
    def legend(self) -> str:
        """The id of the panel's own legend (``legend``, ``legend2``, ...)."""
        return "legend" if self.col == 1 else f"legend{self.col}"

    def domain(self, which: Literal["x", "y"]) -> tuple[float, float]:
        """Where the panel's axis lies on the figure, in paper fractions (0-1)."""
        low, high = self.axis(which).domain
        return float(low), float(high)


def _text(text: str) -> str:
    """Plain text for plotly's pseudo-HTML labels (``<``, ``>``, ``&`` escaped; newlines as
    line breaks)."""
    return html.escape(str(text), quote=False).replace("\n", "<br>")


def _rgba(colour: str, alpha: float) -> str:
    value = colour.lstrip("#")
    r, g, b = (int(value[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _colourscale(cmap: str, n: int = 11) -> list[list[Any]]:
    """The matplotlib colour map ``cmap`` sampled at ``n`` stops as a plotly colour scale."""
    import matplotlib

    from_map = matplotlib.colormaps[cmap]
    stops = np.linspace(0.0, 1.0, n)
    return [
        [float(s), "rgb({},{},{})".format(*(int(round(255 * c)) for c in from_map(s)[:3]))]
        for s in stops
    ]


def _style(fmt: str) -> tuple[str | None, str | None]:
    """A matplotlib format string (``"o-"``, ``"s--"``, ``"--"``) as a plotly dash style and
    marker symbol (``None`` where the format has none)."""
    dash = None
    for pattern, name in _DASHES:
        if pattern in fmt:
            dash, fmt = name, fmt.replace(pattern, "", 1)
            break
    marker = next((_MARKERS[c] for c in fmt if c in _MARKERS), None)
    return dash, marker


def _number(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=float)


def new_figure(
    width: float,
    height: float,
    *,
    ncols: int = 1,
    width_ratios: Sequence[float] | None = None,
) -> tuple[Any, list[Panel]]:
    """A figure of ``ncols`` panels in one row (width follows the page or notebook cell).

    Args:
        width: Figure width (inches, as matplotlib's; plotly fills the width it is given).
        height: Figure height (inches; 100 pixels each).
        ncols: Panels.
        width_ratios: Relative panel widths.

    Returns:
        The ``plotly.graph_objects.Figure`` and its panels, left to right.

    Raises:
        MissingDependencyError: plotly is not installed.
    """
    require_plotly()
    from plotly.subplots import make_subplots

    del width  # the figure fills its container; panels keep their relative widths
    widths = None if width_ratios is None else [r / sum(width_ratios) for r in width_ratios]
    spacing = min(0.1, 0.3 / (ncols - 1)) if ncols > 1 else 0.0
    fig = make_subplots(rows=1, cols=ncols, column_widths=widths, horizontal_spacing=spacing)
    fig.update_layout(
        template="plotly_white",
        height=int(round(_PX_PER_INCH * height)) + 60,
        margin={"l": 60, "r": 30, "t": 90, "b": 60},
        barmode="group",
        hovermode="closest",
        hoverlabel={"namelength": -1},
        font={"size": 11},
    )
    panels = [Panel(fig, col) for col in range(1, ncols + 1)]
    for panel in panels:
        fig.update_layout(
            {
                panel.legend: {
                    "x": panel.domain("x")[1],
                    "y": 1.0,
                    "xanchor": "right",
                    "yanchor": "top",
                    "bgcolor": "rgba(255,255,255,0.7)",
                    "font": {"size": 10},
                }
            }
        )
    return fig, panels


def curves(
    ax: Panel,
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
    """Draw one curve per entry of ``series`` over ``x``, with optional interval bands (filled
    areas that the curve's legend entry toggles with it).

    Hover shows the curve, x and y with the axis labels (units) and, where a band is given, the
    interval.

    Args:
        ax: The panel.
        x: ``[n]`` positions on the x axis (or a mapping label -> x for curves of their own x).
        series: ``{label: [n] values}``.
        bands: ``{label: ([n] low, [n] high)}``, drawn in the curve's colour.
        styles: ``{label: matplotlib format string}`` (default ``"-"``): dashes and markers.
        xlabel: Axis label.
        ylabel: Axis label.
        title: Panel title.
        hlines: Horizontal reference lines (grey).
        legend: ``None`` for no legend entries (any other value: the panel's own legend).
        legend_title: Legend title.
        **line: ``lw`` (line width), ``ms`` (marker size) and ``marker`` as for matplotlib;
            others are ignored.
    """
    go = require_plotly()
    fig = ax.figure
    width = 1.3 * float(line.get("lw", line.get("linewidth", 1.5)))
    size = 1.6 * float(line.get("ms", line.get("markersize", 4)))
    extra_marker = _MARKERS.get(str(line.get("marker", "")))
    for i, (label, y) in enumerate(series.items()):
        xs = _number(x[label] if isinstance(x, Mapping) else x)
        ys = _number(y)
        colour = TAB10[i % 10]
        dash, marker = _style((styles or {}).get(label, "-"))
        marker = marker or extra_marker
        mode = "+".join(m for m, on in (("lines", dash), ("markers", marker)) if on) or "lines"
        group = f"{ax.col}:{label}"
        name = _text(label)
        band = (bands or {}).get(label)
        interval = ""
        custom = None
        if band is not None:
            low, high = _number(band[0]), _number(band[1])
            for edge, fill in ((low, None), (high, "tonexty")):
                fig.add_trace(
                    go.Scatter(
                        x=xs, y=edge, mode="lines", line={"width": 0, "color": colour},
                        fill=fill, fillcolor=_rgba(colour, 0.2), hoverinfo="skip",
                        showlegend=False, legendgroup=group, legend=ax.legend,
                    ),
                    row=1, col=ax.col,
                )  # fmt: skip
            custom = np.column_stack([low, high])
            interval = " [%{customdata[0]:.4g}, %{customdata[1]:.4g}]"
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode=mode, name=name, legendgroup=group, legend=ax.legend,
                showlegend=legend is not None, customdata=custom,
                line={"color": colour, "dash": dash or "solid", "width": width},
                marker={"color": colour, "symbol": marker or "circle", "size": size},
                hovertemplate=f"<b>{name}</b><br>{_text(xlabel or 'x')}: %{{x}}<br>"
                f"{_text(ylabel or 'y')}: %{{y:.4g}}{interval}<extra></extra>",
            ),
            row=1, col=ax.col,
        )  # fmt: skip
    for level in hlines:
        fig.add_hline(y=level, line={"color": "grey", "width": 0.8}, row=1, col=ax.col)
    xs_all = [x[label] if isinstance(x, Mapping) else x for label in series]
    if xs_all:
        _integer_ticks(ax, "x", np.concatenate([_number(v).ravel() for v in xs_all]))
    _axis_titles(ax, xlabel, ylabel)
    panel_title(ax, title)
    if legend_title:
        fig.update_layout({ax.legend: {"title": {"text": _text(legend_title)}}})


def _integer_ticks(ax: Panel, which: Literal["x", "y"], values: Any) -> None:
    """Ticks at whole numbers only when the values are a few whole numbers (layers, heads):
    no tick at layer 0.5."""
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array)]
    if array.size and np.all(array == np.round(array)) and np.ptp(array) <= 20:
        update = ax.figure.update_xaxes if which == "x" else ax.figure.update_yaxes
        update(dtick=1, row=1, col=ax.col)


def _axis_titles(ax: Panel, xlabel: str, ylabel: str) -> None:
    ax.figure.update_xaxes(title_text=_text(xlabel), row=1, col=ax.col)
    ax.figure.update_yaxes(title_text=_text(ylabel), row=1, col=ax.col)


def _centres(low: float, high: float, n: int) -> list[float]:
    """The centres of ``n`` equal cells from ``low`` to ``high`` (whole numbers as ints)."""
    out = []
    for i in range(n):
        value = round(low + (high - low) * (i + 0.5) / n, 9)
        out.append(int(value) if float(value).is_integer() else value)
    return out


def heatmap(
    ax: Panel,
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
) -> Any:
    """A ``[rows cols]`` heatmap with its labelled colour bar beside its panel.

    Hover shows the row and column (with the axis labels) and the value with the colour bar's
    label (its quantity and unit). Diverging maps are centred on 0 and scaled to the data as on
    the matplotlib side (:func:`homoglens.results.plotting.colour_range`).

    Args:
        ax: The panel.
        values: ``[rows cols]`` (NaN cells are left blank).
        xlabel: Axis label.
        ylabel: Axis label.
        title: Panel title.
        label: Colour-bar label: the quantity and its unit (required).
        cmap: matplotlib colour-map name (sampled into a plotly colour scale).
        symmetric: A range centred on 0, ``+- max |value|`` (unless ``vmin``/``vmax``).
        vmin: Lower end of the colour range.
        vmax: Upper end of the colour range.
        extent: ``(left, right, bottom, top)`` in data units; default cell indices.
        origin: ``"lower"`` (row 0 at the bottom) or ``"upper"``.
        yticklabels: One label per row (a categorical axis).
        xticklabels: One label per column (a categorical axis).

    Returns:
        The ``Heatmap`` trace.
    """
    go = require_plotly()
    array = np.asarray(values, dtype=float)
    rows, cols = array.shape
    zmin, zmax = colour_range(array, cmap, symmetric=symmetric, vmin=vmin, vmax=vmax)
    left, right, bottom, top = extent or (-0.5, cols - 0.5, -0.5, rows - 0.5)
    if origin == "upper" and extent is None:
        bottom, top = top, bottom
    xs: list[Any] = _centres(left, right, cols)
    first, last = (bottom, top) if origin == "lower" else (top, bottom)
    ys: list[Any] = _centres(first, last, rows)
    if xticklabels is not None:
        xs = [_text(t) for t in xticklabels]
        ax.figure.update_xaxes(type="category", row=1, col=ax.col)
    else:
        _integer_ticks(ax, "x", xs)
    if yticklabels is not None:
        ys = [_text(t) for t in yticklabels]
        ax.figure.update_yaxes(type="category", row=1, col=ax.col)
    else:
        _integer_ticks(ax, "y", ys)
    if bottom > top:  # the axis runs downward, as matplotlib draws it
        ax.figure.update_yaxes(autorange="reversed", row=1, col=ax.col)
    x0, x1 = ax.domain("x")
    last = x1 > 0.99  # the last panel's colour bar lies in the right margin
    if not last:  # narrow the panel so its colour bar clears the next panel's axis labels
        x1 -= min(0.06, 0.25 * (x1 - x0))
        ax.figure.update_xaxes(domain=[x0, x1], row=1, col=ax.col)
    y0, y1 = ax.domain("y")
    ylab, xlab, unit = _text(ylabel or "row"), _text(xlabel or "column"), _text(label)
    trace = go.Heatmap(  # float32: half the bytes in a report, more digits than hover shows
        z=array.astype(np.float32), x=xs, y=ys, zmin=zmin, zmax=zmax, colorscale=_colourscale(cmap),
        hoverongaps=False,
        hovertemplate=f"{ylab}: %{{y}}<br>{xlab}: %{{x}}<br>{unit}: %{{z:.4g}}<extra></extra>",
        colorbar={
            "title": {"text": unit, "side": "right"}, "x": x1 + 0.005, "xanchor": "left",
            "y": (y0 + y1) / 2, "len": y1 - y0, "thickness": 12,
        },
    )  # fmt: skip
    ax.figure.add_trace(trace, row=1, col=ax.col)
    if last:
        ax.figure.update_layout(margin={"r": 110})
    _axis_titles(ax, xlabel, ylabel)
    panel_title(ax, title)
    return trace


def bars(
    ax: Panel,
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
    """Bars with optional intervals (error bars): one bar per label, or groups of bars side by
    side (one legend entry per series). Hover shows the value and the interval.

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
    go = require_plotly()
    ticks = [_text(t) for t in labels]
    unit = _text(ylabel or "value")
    if groups is None:
        items = [("", values, low, high, [TAB10[i % 10] for i in range(len(ticks))])]
    else:
        items = [
            (name, heights, (group_low or {}).get(name), (group_high or {}).get(name),
             TAB10[i % 10])
            for i, (name, heights) in enumerate(groups.items())
        ]  # fmt: skip
    for name, heights, lows, highs, colour in items:
        h = _number(heights)
        error = None
        custom = None
        interval = ""
        if lows is not None and highs is not None:
            lo, hi = _number(lows), _number(highs)
            error = {"type": "data", "array": hi - h, "arrayminus": h - lo, "visible": True}
            custom = np.column_stack([lo, hi])
            interval = " [%{customdata[0]:.4g}, %{customdata[1]:.4g}]"
        head = f"<b>{_text(name)}</b><br>" if name else ""
        ax.figure.add_trace(
            go.Bar(
                x=ticks, y=h, name=_text(name) or None, marker={"color": colour},
                error_y=error, customdata=custom, showlegend=bool(name),
                legendgroup=f"{ax.col}:{name}", legend=ax.legend,
                hovertemplate=f"{head}%{{x}}<br>{unit}: %{{y:.4g}}{interval}<extra></extra>",
            ),
            row=1, col=ax.col,
        )  # fmt: skip
    fig = ax.figure
    fig.add_hline(y=0.0, line={"color": "grey", "width": 0.6}, row=1, col=ax.col)
    fig.update_xaxes(type="category", tickangle=-rotation, row=1, col=ax.col)
    _axis_titles(ax, "", ylabel)
    panel_title(ax, title)


def suptitle(fig: Any, text: str) -> None:
    """Title the whole figure (above its panels; a figure's title carries its provenance).

    Args:
        fig: The ``plotly.graph_objects.Figure``.
        text: The title.
    """
    fig.update_layout(
        title={"text": _text(text), "x": 0.5, "xanchor": "center", "font": {"size": 15}}
    )


def panel_title(ax: Panel, text: str, *, fontsize: float | None = None) -> None:
    """Title one panel (an annotation above it, as plotly's subplot titles are).

    Args:
        ax: The panel.
        text: The title (empty: none).
        fontsize: Font size in points, as matplotlib's (1.25 pixels each; default 13 pixels).
    """
    go = require_plotly()
    name = f"panel title {ax.col}"
    kept = [a for a in ax.figure.layout.annotations if a.name != name]
    if text:
        x0, x1 = ax.domain("x")
        kept.append(
            go.layout.Annotation(
                name=name, text=_text(text), x=(x0 + x1) / 2, y=ax.domain("y")[1],
                xref="paper", yref="paper", xanchor="center", yanchor="bottom", yshift=4,
                showarrow=False, font={"size": round(1.25 * fontsize) if fontsize else 13},
            )
        )  # fmt: skip
    ax.figure.layout.annotations = kept


def log_scale(
    ax: Panel, axis: Literal["x", "y"], *, base: float = 10, linthresh: float | None = None
) -> None:
    """Put one axis of a panel on a logarithmic scale.

    plotly has no symmetric-log axis: with ``linthresh`` (a scale that must show 0) the axis
    stays linear.

    Args:
        ax: The panel.
        axis: ``"x"`` or ``"y"``.
        base: Base of the logarithm (ticks at its powers).
        linthresh: A symmetric-log scale on the matplotlib side; linear here.
    """
    if linthresh is not None:
        return
    settings: dict[str, Any] = {"type": "log"}
    if base != 10:
        settings["dtick"] = math.log10(base)
    update = ax.figure.update_xaxes if axis == "x" else ax.figure.update_yaxes
    update(row=1, col=ax.col, **settings)
