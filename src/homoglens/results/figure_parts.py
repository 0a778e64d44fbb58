"""The parts every result figure shares: the backend's drawing kit (:func:`figure_kit`), the
title with provenance (:func:`headline`), the layer-axis label and Gu et al.'s sink-rate label.
Each measurement's ``figure`` module composes its result's figure from them.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import PLOT_BACKENDS

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pandas as pd

    from homoglens.results.provenance import Provenance

LAYER_AXIS = "layer (0 = embeddings, l = output of block l-1)"


def sink_rate_label(key: int, eps: float) -> str:
    """Gu et al.'s name of the sink rate on 0-indexed ``key``: they count keys from 1, so key 0
    is their Sink_1 (``sink_rate_label(0, 0.3) == "Sink_1^0.3 (key 0)"``)."""
    return f"Sink_{key + 1}^{eps:g} (key {key})"


AnyFigure: TypeAlias = Any
"""A matplotlib ``Figure`` or a ``plotly.graph_objects.Figure`` (``Plotted.plot`` says which)."""


def figure_kit(backend: str) -> ModuleType:
    """The primitives that draw with ``backend``: :mod:`homoglens.results.plotting` or
    :mod:`homoglens.results.plotting_plotly` (same functions, same arguments).

    Raises:
        InvalidInputError: ``backend`` is neither ``"matplotlib"`` nor ``"plotly"``.
        MissingDependencyError: ``"plotly"`` without plotly installed.
    """
    if backend == "matplotlib":
        import homoglens.results.plotting as plotting

        return plotting
    if backend == "plotly":
        import homoglens.results.plotting_plotly as plotting_plotly

        plotting_plotly.require_plotly()
        return plotting_plotly
    raise InvalidInputError(
        f"backend={backend!r} is not one of {', '.join(map(repr, PLOT_BACKENDS))}: "
        "'matplotlib' (static, the default) or 'plotly' (interactive)"
    )


def provenance_title(p: Provenance, what: str = "") -> str:
    """``"<model> (<backend>, <weights> weights)[: what]"``, the provenance of a figure title."""
    return f"{p.model} ({p.backend}, {p.weights} weights)" + (f": {what}" if what else "")


def headline(
    kit: ModuleType,
    fig: AnyFigure,
    title: str | None,
    default: str,
    *,
    matplotlib: bool,
    provenance: Provenance | None = None,
) -> None:
    """Title the figure ``title``, else ``default``.

    A matplotlib figure gets the default only where it always had one (``matplotlib=True``); a
    plotly figure always gets a title, with the ``provenance`` (model, backend, weights) before
    the default where it is given.
    """
    if kit.__name__ == "homoglens.results.plotting":
        if title or matplotlib:
            kit.suptitle(fig, title or default)
        return
    if not title and provenance is not None:
        default = provenance_title(provenance, default)
    kit.suptitle(fig, title or default)


def layer_curves(
    kit: ModuleType, ax: Any, table: pd.DataFrame, by: str, groups: Sequence[str],
    columns: tuple[str, str, str], **options: Any,
) -> None:  # fmt: skip
    """One ``o-`` curve by layer per group (``table[by] == group``) of the ``(value, low, high)``
    columns of a tidy ``table``, its interval a band; ``options`` go to ``kit.curves``."""
    value, low, high = columns
    rows = {group: table[table[by] == group] for group in groups}
    kit.curves(
        ax, {k: r["layer"] for k, r in rows.items()}, {k: r[value] for k, r in rows.items()},
        bands={k: (r[low], r[high]) for k, r in rows.items()}, styles=dict.fromkeys(rows, "o-"),
        ms=3, xlabel=LAYER_AXIS, **options,
    )  # fmt: skip
