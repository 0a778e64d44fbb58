"""Unit tests of homoglens.plotting (generic primitives, no result class) and of the figure
of each result (homoglens.results.figures)."""

from __future__ import annotations

import numpy as np
import pytest

from homoglens.plotting import bars, curves, heatmap, new_figure


def test_primitives_draw_what_they_are_given() -> None:
    fig, (left, middle, right) = new_figure(9, 3, ncols=3)
    curves(
        left, np.arange(3), {"a": [0, 1, 2], "b": [2, 1, 0]}, bands={"a": ([0, 0, 1], [1, 2, 3])},
        hlines=(0.0,), title="curves",
    )  # fmt: skip
    assert len(left.lines) == 3 and left.get_title() == "curves"  # two curves and the 0 line
    image = heatmap(middle, np.array([[1.0, -2.0], [np.nan, 0.5]]), symmetric=True)
    assert image.get_clim() == (-2.0, 2.0)  # symmetric range from the finite values
    bars(right, ["x", "y"], [1.0, 2.0], low=[0.5, 1.5], high=[1.5, 2.5])
    assert len(right.patches) == 2
    assert len(fig.axes) == 4  # three panels and the heatmap's colour bar


def test_grouped_bars_put_each_series_side_by_side() -> None:
    fig, (ax,) = new_figure(4, 3)
    bars(ax, ["p", "q"], None, groups={"s1": [1, 2], "s2": [3, 4]})
    assert len(ax.patches) == 4
    assert ax.get_legend() is not None


def test_plotting_imports_no_result_class() -> None:
    import ast

    import homoglens.plotting as plotting

    tree = ast.parse(open(plotting.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert not [m for m in imported if m.startswith("homoglens")], imported


def test_the_similarity_figure_rejects_unknown_layers() -> None:
    from homoglens import InvalidInputError, PositionalSimilarity

    sim = PositionalSimilarity.from_activations(__import__("torch").randn(2, 6, 20, 8), edge_k=2)
    assert len(sim.plot(layers=1).axes) >= 4
    with pytest.raises(InvalidInputError, match="not in this result"):
        sim.plot(layers=[5])
