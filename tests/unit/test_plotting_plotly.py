"""plot(backend="plotly"): every result's figure as a plotly Figure (title with the provenance,
hover values with units, labelled colour bars), the primitives of homoglens.results.plotting_plotly
against their matplotlib twins, and the typed errors (unknown backend, plotly missing)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("plotly", reason='plotly is an optional extra: pip install "homoglens[plotly]"')

import plotly.graph_objects as go  # noqa: E402

from helpers import BACKENDS  # noqa: E402
from homoglens import (  # noqa: E402
    InvalidInputError,
    MissingDependencyError,
    attention_bias_study,
    attention_received,
    compare_models,
    corpus_windows,
    length_study,
    load_model,
    massive_activations,
    position_ablation_study,
    positional_patching,
    positional_similarity,
    sink_attribution,
    sink_scores,
)
from homoglens.results.provenance import Provenance  # noqa: E402
from homoglens.testing import tiny_model_folder  # noqa: E402
from homoglens.training.sweep_result import CheckpointSweep  # noqa: E402

# the tiny results have too few windows for 16-window bootstrap blocks, and say so
pytestmark = pytest.mark.filterwarnings("ignore:.*fewer than 4 blocks:UserWarning")

RESULTS = [
    "profile", "study", "similarity", "sink_scores", "massive", "attribution_exact",
    "attribution_fast", "patching", "received", "bias", "lengths", "comparison", "sweep",
]  # fmt: skip
_BUILT: dict[str, Any] = {}


def _sweep() -> CheckpointSweep:
    """A checkpoint sweep built from its fields (over_checkpoints is tested in test_sweeps)."""
    return CheckpointSweep(
        checkpoints=("step0", "step10", "final"),
        steps=torch.tensor([0.0, 10.0, 200.0], dtype=torch.float64),
        metrics=("homogenization", "sink_rate"),
        values=torch.rand(3, 2, dtype=torch.float64),
        layer_metrics=("homogenization",),
        layers=(0, 1, 2),
        layer_values=torch.rand(3, 1, 3, dtype=torch.float64),
        provenance=Provenance(model="tiny-sweep", backend="bridge", weights="raw"),
    )


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    """One small result of every class that has a ``plot()``, built once (a few seconds)."""
    if not _BUILT:
        model = load_model(tiny_model_folder("gpt2"), backend=BACKENDS[-1], device="cpu")
        windows = corpus_windows(model, n_seq=4, seq_len=24)
        study = position_ablation_study(
            model, windows, modes=["none", "zero"], n_boot=50, progress=False
        )
        shipped = {
            name: load_model(name, backend=BACKENDS[-1], device="cpu")
            for name in ("homoglens/tiny-learned", "homoglens/tiny-none")
        }
        _BUILT.update(
            profile=study.profiles["none"],
            study=study,
            similarity=positional_similarity(model, windows, edge_k=3, progress=False),
            sink_scores=sink_scores(model, windows, progress=False),
            massive=massive_activations(model, windows, progress=False),
            attribution_exact=sink_attribution(
                model, windows[:2], top_k=2, edge_k=3, progress=False
            ),
            attribution_fast=sink_attribution(
                model, windows[:2], method="fast", edge_k=3, progress=False
            ),
            patching=positional_patching(
                model,
                windows[:2],
                how="permute",
                bins=[(0, 8), (8, 16), (16, 24)],
                layers=[0, 1],
                progress=False,
            ),  # fmt: skip
            received=attention_received(model, windows.tokens[:2], progress=False),
            bias=attention_bias_study(
                model, windows, kind="first", edge_k=3, batch_size=4, progress=False
            ),
            lengths=length_study(
                model, windows, lengths=(12, 24), edge_k=2, lags=(1, 3), progress=False
            ),
            comparison=compare_models(
                shipped,
                n_seq=4,
                seq_len=32,
                n_boot=50,
                modes=("none",),
                edge_k=2,
                progress=False,
            ),  # fmt: skip
            sweep=_sweep(),
        )
    return _BUILT


def _model_name(result: Any) -> str | None:
    if hasattr(result, "provenance"):
        return result.provenance.model
    if hasattr(result, "profiles"):
        return result.profiles["none"].provenance.model
    return None  # a comparison of several models


@pytest.mark.parametrize("name", RESULTS)
def test_every_plot_draws_with_plotly_and_matplotlib_stays_the_default(results, name) -> None:
    from matplotlib.figure import Figure

    result = results[name]
    assert isinstance(result.plot(), Figure)  # the default is unchanged
    assert isinstance(result.plot(backend="matplotlib"), Figure)
    fig = result.plot(backend="plotly")
    assert isinstance(fig, go.Figure)
    title = fig.layout.title.text
    assert title and title.strip()
    model = _model_name(result)
    assert model is None or model in title, title  # the provenance is in the title
    if model is None:
        assert "windows" in title
    assert fig.data, "no traces"
    for trace in fig.data:
        if trace.type == "heatmap":
            unit = trace.colorbar.title.text
            assert unit and unit.strip(), "an unlabelled colour bar"
            assert "%{z" in trace.hovertemplate and unit in trace.hovertemplate
            assert "%{x}" in trace.hovertemplate and "%{y}" in trace.hovertemplate
        elif trace.hoverinfo != "skip":  # curves and bars (bands are skipped)
            assert trace.hovertemplate and "%{y" in trace.hovertemplate
    fig.to_json()  # serialisable as it is embedded


def test_titles_carry_model_backend_and_weights(results) -> None:
    profile = results["profile"]
    p = profile.provenance
    title = profile.plot(backend="plotly").layout.title.text
    assert p.model in title and p.backend in title and f"{p.weights} weights" in title
    assert "sequences" in title and "tokens" in title
    # figures whose matplotlib twin has no overall title still name the model with plotly
    massive = results["massive"]
    assert massive.plot().get_suptitle() == ""
    assert massive.provenance.model in massive.plot(backend="plotly").layout.title.text
    assert profile.plot(backend="plotly", title="mine").layout.title.text == "mine"


def test_patching_heatmap_is_centred_on_zero_and_scaled_to_its_effects(results) -> None:
    result = results["patching"]
    (heat,) = [t for t in result.plot("mean_pairwise", backend="plotly").data]
    bound = float(np.nanmax(np.abs(result.effect[0].numpy())))
    assert (heat.zmin, heat.zmax) == pytest.approx((-bound, bound))
    assert "normalised effect" in heat.colorbar.title.text
    assert list(heat.y) == [str(layer) for layer in result.layers]  # blocks, as ticks say
    assert "block: %{y}" in heat.hovertemplate and "position: %{x}" in heat.hovertemplate


@pytest.mark.parametrize("bad", ["bokeh", "Plotly", ""])
def test_an_unknown_backend_is_a_typed_error(results, bad) -> None:
    for name in ("profile", "sink_scores", "sweep"):
        with pytest.raises(InvalidInputError, match="'matplotlib', 'plotly'"):
            results[name].plot(backend=bad)
    with pytest.raises(ValueError):  # also the built-in it fits
        results["profile"].plot(backend=bad)


def test_missing_plotly_names_the_extra(results, monkeypatch) -> None:
    for module in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "plotly", None)  # what an environment without it imports
    with pytest.raises(MissingDependencyError, match=r'pip install "homoglens\[plotly\]"'):
        results["profile"].plot(backend="plotly")
    with pytest.raises(ImportError):  # also the built-in it fits
        results["sink_scores"].plot(backend="plotly")
    assert results["sink_scores"].plot() is not None  # matplotlib needs no plotly


def test_missing_nbformat_in_jupyter_names_the_extra(results, monkeypatch) -> None:
    # In a Jupyter kernel plotly displays a figure through nbformat; without it the user saw a
    # red "Mime type rendering requires nbformat>=4.2.0" ValueError when the cell ended.
    import importlib.util

    import homoglens.results.plotting_plotly as plotting_plotly

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(plotting_plotly, "_in_jupyter_kernel", lambda: True)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "nbformat" else real_find_spec(name, *a),
    )
    with pytest.raises(MissingDependencyError, match=r'nbformat.*-e "\.\[plotly\]"'):
        results["profile"].plot(backend="plotly")
    monkeypatch.setattr(plotting_plotly, "_in_jupyter_kernel", lambda: False)
    assert results["profile"].plot(backend="plotly") is not None  # a script needs no nbformat
    assert plotting_plotly._in_jupyter_kernel() in (True, False)


def test_homoglens_imports_no_plotly() -> None:
    code = (
        "import sys, homoglens, homoglens.profile.figure, homoglens.sinks.figure; "
        "sys.exit('plotly' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ----------------------------------------------------------------------------- primitives
def test_diverging_heatmaps_match_the_matplotlib_range_and_say_their_units() -> None:
    from homoglens.results import plotting, plotting_plotly

    values = np.array([[0.05, -0.2], [0.1, np.nan]])
    fig, (left, right) = plotting_plotly.new_figure(6, 3, ncols=2)
    trace = plotting_plotly.heatmap(
        left, values, cmap="RdBu_r", label="delta (cosine)", xlabel="head", ylabel="layer"
    )
    _, (ax,) = plotting.new_figure(3, 3)
    image = plotting.heatmap(ax, values, cmap="RdBu_r", label="delta (cosine)")
    assert (trace.zmin, trace.zmax) == image.get_clim() == (-0.2, 0.2)
    assert trace.hovertemplate.startswith("layer: %{y}<br>head: %{x}<br>delta (cosine): %{z")
    assert trace.colorbar.title.text == "delta (cosine)"
    fixed = plotting_plotly.heatmap(right, values, cmap="coolwarm", vmin=-1, vmax=1, label="x")
    assert (fixed.zmin, fixed.zmax) == (-1, 1)  # an explicit range wins
    # the colour scale is matplotlib's map: blue at the low end of RdBu_r, red at the high end
    (r0, _, b0), (r1, _, b1) = (
        [int(c) for c in stop[1].removeprefix("rgb(").removesuffix(")").split(",")]
        for stop in (trace.colorscale[0], trace.colorscale[-1])
    )
    assert b0 > r0 and r1 > b1


def test_heatmap_cells_sit_where_matplotlib_puts_them() -> None:
    from homoglens.results import plotting_plotly

    fig, (upper, lower) = plotting_plotly.new_figure(6, 3, ncols=2)
    values = np.arange(6.0).reshape(2, 3)
    top = plotting_plotly.heatmap(
        upper, values, origin="upper", extent=(4.5, 7.5, 6.5, 4.5), label="v"
    )
    assert list(top.x) == [5, 6, 7] and list(top.y) == [5, 6]  # row 0 at position 5, on top
    assert fig.layout.yaxis.autorange == "reversed"
    plain = plotting_plotly.heatmap(lower, values, label="v", yticklabels=["a", "b"])
    assert list(plain.x) == [0, 1, 2] and list(plain.y) == ["a", "b"]
    assert fig.layout.yaxis2.autorange is None and fig.layout.yaxis2.type == "category"


def test_bands_are_filled_areas_that_toggle_with_their_curve() -> None:
    from homoglens.results import plotting_plotly

    fig, (ax,) = plotting_plotly.new_figure(4, 3)
    plotting_plotly.curves(
        ax, np.arange(3), {"a": [0, 1, 2], "b": [2, 1, 0]}, bands={"a": ([0, 0, 1], [1, 2, 3])},
        styles={"a": "o-", "b": "s--"}, hlines=(0.0,), xlabel="layer", ylabel="cosine",
        title="curves", legend_title="mode",
    )  # fmt: skip
    low, high, a, b = fig.data
    assert high.fill == "tonexty" and low.fill is None
    assert low.legendgroup == high.legendgroup == a.legendgroup != b.legendgroup
    assert not low.showlegend and not high.showlegend and a.showlegend and b.showlegend
    assert a.mode == "lines+markers" and b.line.dash == "dash" and b.marker.symbol == "square"
    assert "customdata[0]" in a.hovertemplate and "customdata" not in b.hovertemplate
    assert a.hovertemplate.startswith("<b>a</b><br>layer: %{x}<br>cosine: %{y")
    assert fig.layout.legend.title.text == "mode"
    assert [s.y0 for s in fig.layout.shapes] == [0.0]
    assert [an.text for an in fig.layout.annotations] == ["curves"]


def test_bars_groups_and_log_axes() -> None:
    from homoglens.results import plotting_plotly

    fig, (left, right) = plotting_plotly.new_figure(6, 3, ncols=2)
    plotting_plotly.bars(
        left, ["p_q", "r"], None, groups={"s1": [1, 2], "s2": [3, 4]},
        group_low={"s1": [0, 1], "s2": [2, 3]}, group_high={"s1": [2, 3], "s2": [4, 5]},
    )  # fmt: skip
    one, two = fig.data
    assert one.name == "s1" and list(one.error_y.array) == [1, 1]
    assert fig.layout.xaxis.type == "category"
    plotting_plotly.bars(right, ["x\ny"], [1.0], low=[0.5], high=[2.0])
    assert list(fig.data[-1].x) == ["x<br>y"] and not fig.data[-1].showlegend
    logs, (ax,) = plotting_plotly.new_figure(3, 3)
    plotting_plotly.curves(ax, [1, 2, 4], {"a": [1, 10, 100]})
    plotting_plotly.log_scale(ax, "y")
    plotting_plotly.log_scale(ax, "x", base=2)
    assert logs.layout.yaxis.type == "log" and logs.layout.xaxis.type == "log"
    assert logs.layout.xaxis.dtick == pytest.approx(np.log10(2))  # ticks at powers of 2
    symlog, (ax,) = plotting_plotly.new_figure(3, 3)
    plotting_plotly.log_scale(ax, "x", linthresh=1.0)  # no symmetric log in plotly: linear
    assert symlog.layout.xaxis.type is None
