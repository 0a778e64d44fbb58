"""Unit tests of homoglens.results.plotting (generic primitives, no result class) and of the figure
of each result (each measurement's figure module)."""

from __future__ import annotations

import numpy as np
import pytest

from homoglens.results.plotting import bars, curves, heatmap, new_figure


def test_primitives_draw_what_they_are_given() -> None:
    fig, (left, middle, right) = new_figure(9, 3, ncols=3)
    curves(
        left, np.arange(3), {"a": [0, 1, 2], "b": [2, 1, 0]}, bands={"a": ([0, 0, 1], [1, 2, 3])},
        hlines=(0.0,), title="curves",
    )  # fmt: skip
    assert len(left.lines) == 3 and left.get_title() == "curves"  # two curves and the 0 line
    image = heatmap(middle, np.array([[1.0, -2.0], [np.nan, 0.5]]), symmetric=True, label="x")
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

    import homoglens.results.plotting as plotting

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


def test_figures_are_inline_figures_that_render_png_and_pickle() -> None:
    import pickle

    from homoglens.results.plotting import InlineFigure

    fig, _ = new_figure(3, 2)
    assert isinstance(fig, InlineFigure)
    assert fig._repr_png_().startswith(b"\x89PNG")
    assert type(pickle.loads(pickle.dumps(fig))) is InlineFigure


def test_diverging_maps_are_centred_and_scaled_to_the_data() -> None:
    fig, (left, right) = new_figure(6, 3, ncols=2)
    small = np.array([[0.05, -0.2], [0.1, np.nan]])
    assert heatmap(left, small, cmap="RdBu_r", label="x").get_clim() == (-0.2, 0.2)
    fixed = heatmap(right, small, cmap="coolwarm", vmin=-1, vmax=1, label="x")
    assert fixed.get_clim() == (-1, 1)  # an explicit range wins


def _colourbar_labels(fig) -> list[str]:
    """The label of every colour bar of a figure (colour-bar axes are the ones an image maps
    to, added by ``fig.colorbar``)."""
    bars = [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is not None]
    return [ax._colorbar.ax.get_ylabel() for ax in bars]


def test_patching_heatmap_scales_to_its_effects_and_labels_its_bar(get_model) -> None:
    from homoglens import corpus_windows, positional_patching

    model = get_model("gpt2", "bridge")
    result = positional_patching(
        model, corpus_windows(model, n_seq=2, seq_len=16).tokens, how="permute",
        bins=[(0, 4), (4, 10), (10, 16)], layers=[0, 1], progress=False,
    )  # fmt: skip
    fig = result.plot("mean_pairwise")
    (image,) = fig.axes[0].images
    bound = float(np.nanmax(np.abs(result.effect[0].numpy())))
    assert image.get_clim() == pytest.approx((-bound, bound))
    labels = _colourbar_labels(fig)
    assert labels and all("normalised effect" in label for label in labels)


def test_sink_figures_name_the_rate_as_gu_et_al_and_label_every_bar(get_model) -> None:
    from homoglens import corpus_windows, massive_activations, sink_scores
    from homoglens.results.figure_parts import sink_rate_label

    assert sink_rate_label(0, 0.3) == "Sink_1^0.3 (key 0)"
    model = get_model("gpt2", "bridge")
    windows = corpus_windows(model, n_seq=2, seq_len=16)
    scores = sink_scores(model, windows, progress=False)
    fig = scores.plot()
    assert "Sink_1^0.3 (key 0)" in fig.get_suptitle()
    massive = massive_activations(model, windows, progress=False)
    for figure in (fig, massive.plot()):
        labels = _colourbar_labels(figure)
        assert labels and all(label.strip() for label in labels), labels
