"""The figure of each result, composed once from the generic primitives and drawn by either
backend: :mod:`homoglens.plotting` (matplotlib, the default) or its twin
:mod:`homoglens.plotting_plotly` (``backend="plotly"``), which take the same arguments. Each
result's ``plot()`` (:class:`~homoglens.results.base.Plotted`) calls the one its class names;
matplotlib or plotly is imported when a figure is made.

A plotly figure always carries its provenance in its title (model, backend, weights, data);
a matplotlib figure keeps the titles it always had.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from homoglens.errors import InvalidInputError
from homoglens.results.figure_parts import LAYER_AXIS as LAYER_AXIS
from homoglens.results.figure_parts import AnyFigure as AnyFigure
from homoglens.results.figure_parts import figure_kit as figure_kit
from homoglens.results.figure_parts import headline as headline
from homoglens.results.figure_parts import provenance_title as provenance_title
from homoglens.results.figure_parts import sink_rate_label as sink_rate_label

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import pandas as pd
    from matplotlib.axes import Axes

    from homoglens.plotting_plotly import Panel
    from homoglens.results.attribution import SinkAttribution
    from homoglens.results.bias import AttentionBiasStudy
    from homoglens.results.comparison import ModelComparison
    from homoglens.results.lengths import LengthStudy
    from homoglens.results.massive import MassiveActivations
    from homoglens.results.patching import PositionalPatchingResult
    from homoglens.results.profile import HomogenizationProfile
    from homoglens.results.similarity import PositionalSimilarity
    from homoglens.results.sinks import AttentionReceived, SinkScores
    from homoglens.results.studies import PositionAblationStudy
    from homoglens.results.sweeps import CheckpointSweep


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


def _layer_curves(
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


def study_figure(
    study: PositionAblationStudy, *, title: str | None = None, backend: str = "matplotlib"
) -> AnyFigure:
    """Mean pairwise cosine by layer for each mode with CI bands; loss per mode with CIs."""
    kit = figure_kit(backend)
    what = "massive-activation ablations" if study.is_massive else "positional ablations"
    fig, (left, right) = kit.new_figure(12, 4.2, ncols=2, width_ratios=[1.6, 1])
    _layer_curves(
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


def similarity_figure(
    result: PositionalSimilarity,
    layers: list[int] | int | None,
    *,
    title: str | None = None,
    backend: str = "matplotlib",
) -> AnyFigure:
    """Position x position heatmaps of ``M`` and ``W`` for each chosen layer (default: the
    last), ``SP`` and ``to_first`` by position, and the lag curves of every layer.

    Raises:
        InvalidInputError: a layer not in the result, or an unknown backend.
    """
    kit = figure_kit(backend)
    chosen = [result.layers[-1]] if layers is None else layers
    layers = [chosen] if isinstance(chosen, int) else list(chosen)
    missing = [layer for layer in layers if layer not in result.layers]
    if missing or not layers:
        raise InvalidInputError(
            f"layers {missing or layers} are not in this result (it has {list(result.layers)})"
        )
    n = len(layers)
    fig, axes = kit.new_figure(4.2 * (2 * n + 2), 4, ncols=2 * n + 2)
    pos = result.positions.numpy()
    extent = (pos[0] - 0.5, pos[-1] + 0.5, pos[-1] + 0.5, pos[0] - 0.5)
    for k, layer in enumerate(layers):
        li = result.layers.index(layer)
        m_ax, w_ax = axes[2 * k : 2 * k + 2]
        common: dict[str, Any] = {
            "extent": extent, "origin": "upper", "xlabel": "position j", "ylabel": "position i",
            "label": "cosine",
        }  # fmt: skip
        kit.heatmap(m_ax, result.M[li].numpy(), title=f"M, layer {layer}", **common)
        w = result.W[li].numpy()
        bound = float(np.nanmax(np.abs(w - np.diag(np.diag(w))))) or 1.0
        kit.heatmap(  # centred on 0, scaled to the off-diagonal (the diagonal is 1 - C)
            w_ax, w, title=f"W, layer {layer}", cmap="RdBu_r", vmin=-bound, vmax=bound,
            **{**common, "label": "W = M - C (cosine)"},
        )  # fmt: skip
    series = {}
    styles = {}
    for layer in layers:
        li = result.layers.index(layer)
        series[f"SP, layer {layer}"] = result.SP[li].numpy()
        series[f"to_first, {layer}"] = result.to_first[li].numpy()
        styles[f"to_first, {layer}"] = "--"
    kit.curves(
        axes[-2], pos, series, styles=styles, lw=1, legend="x-small", xlabel="position",
        ylabel="cosine", title="Same position across inputs (SP); to first",
    )  # fmt: skip
    kit.curves(
        axes[-1], np.arange(1, result.n_pos),
        {str(layer): result.lag[li, 1:].numpy() for li, layer in enumerate(result.layers)},
        lw=1, legend="x-small" if len(result.layers) <= 12 else None, legend_title="layer",
        xlabel="distance |i - j| (positions)", ylabel="mean within-window cosine",
        title="Similarity by distance, per layer",
    )  # fmt: skip
    default = (
        f"{result.provenance.model}: positional similarity over {result.n_sequences} windows "
        f"(space={result.space}, centre={result.centre})"
    )
    headline(kit, fig, title, default, matplotlib=True)
    return fig


def edge_excess_figure(
    result: PositionalSimilarity, edge: pd.DataFrame, *, backend: str = "matplotlib"
) -> AnyFigure:
    """The naive and the distance-matched edge excess by layer (matched with its intervals),
    from ``edge = result.edge_excess()``."""
    kit = figure_kit(backend)
    rows = {name: edge[edge["edge"] == name] for name in ("first", "last")}
    series, styles, bands = {}, {}, {}
    for name, r in rows.items():
        series[f"naive, {name}"], styles[f"naive, {name}"] = r["naive"], "--"
        series[f"matched, {name}"], styles[f"matched, {name}"] = r["matched"], "o-"
        bands[f"matched, {name}"] = (r["ci_low"], r["ci_high"])
    fig, (ax,) = kit.new_figure(7, 4)
    kit.curves(
        ax, {k: rows[k.split(", ")[1]]["layer"] for k in series}, series, styles=styles,
        bands=bands, ms=3, hlines=(0.0,), legend="x-small", xlabel=LAYER_AXIS,
        ylabel="edge minus middle (cosine)",
        title=f"Edge excess, {result.edge_k} positions per edge",
    )  # fmt: skip
    what = f"positional similarity over {result.n_sequences} windows"
    headline(kit, fig, None, what, matplotlib=False, provenance=result.provenance)
    return fig


def sink_scores_figure(scores: SinkScores, *, backend: str = "matplotlib") -> AnyFigure:
    """Heatmaps of sink mass and importance per (layer, head)."""
    kit = figure_kit(backend)
    fig, axes = kit.new_figure(11, 4, ncols=2)
    panels = (
        ("sink mass", scores.mass, f"mean attention on key {scores.key} (fraction, 0-1)"),
        ("importance alpha", scores.importance, f"Gu et al. alpha_{scores.key + 1} (0-1)"),
    )
    for ax, (name, values, label) in zip(axes, panels, strict=True):
        kit.heatmap(
            ax, values.numpy(), cmap="magma", vmin=0, vmax=1, xlabel="head", ylabel="layer",
            title=f"{name} on key {scores.key}", label=label,
        )  # fmt: skip
    default = (
        f"Attention sinks: {sink_rate_label(scores.key, scores.eps)} = {scores.sink_rate:.1f} %"
    )
    headline(kit, fig, None, default, matplotlib=True, provenance=scores.provenance)
    return fig


def massive_figure(massive: MassiveActivations, *, backend: str = "matplotlib") -> AnyFigure:
    """Heatmap of log10 of the mean max/median ratio per (layer, position)."""
    kit = figure_kit(backend)
    values = massive.ratio_mean.clamp_min(1).log10().numpy()
    label = "log10 of max |x| / median |x| (ratio, no unit)"
    title = "Massive activations: log10 mean(max |x| / median |x|)"
    n_pos = values.shape[1]
    if n_pos < 2:
        fig, (ax,) = kit.new_figure(7, 4)
        kit.heatmap(ax, values, xlabel="position", ylabel="layer (0 = embeddings)", title=title,
                    label=label)  # fmt: skip
    else:  # position 0 (where the massive activations sit) in a panel of its own, readable
        fig, (first, rest) = kit.new_figure(8, 4, ncols=2, width_ratios=(1.6, 6))
        finite = values[np.isfinite(values)]
        shared = {"vmin": float(finite.min()), "vmax": float(finite.max())} if finite.size else {}
        kit.heatmap(
            first, values[:, :1], xlabel="position", ylabel="layer (0 = embeddings)",
            title="position 0", label=label, xticklabels=["0"], **shared,
        )  # fmt: skip
        kit.heatmap(
            rest, values[:, 1:], xlabel="position", title=title, label=label,
            extent=(0.5, n_pos - 0.5, -0.5, values.shape[0] - 0.5), **shared,
        )  # fmt: skip
    what = f"massive activations over {massive.n_sequences} sequences"
    headline(kit, fig, None, what, matplotlib=False, provenance=massive.provenance)
    return fig


def attribution_figure(
    result: SinkAttribution, metric: str, j: int, *, backend: str = "matplotlib"
) -> AnyFigure:
    """Per-head change of ``metric`` (a ``[layer head_index]`` heatmap, or bars for a few
    heads) and, in exact mode, the change of ``to_others`` per position."""
    kit = figure_kit(backend)
    exact = result.delta_to_others is not None
    fig, axes = kit.new_figure(11 if exact else 6, 4, ncols=2 if exact else 1)
    title = f"{result.method} attribution, {result.ablation} ablation, layer {result.layer}"
    values = result.delta[:, j].numpy()
    if len(result.heads) > 12:  # RdBu_r: centred on 0, scaled to the data by heatmap
        kit.heatmap(
            axes[0], result.grid(metric).numpy(), cmap="RdBu_r", xlabel="head", ylabel="layer",
            title=title, label=f"delta {metric} (cosine)",
        )  # fmt: skip
    else:
        labels = [f"L{lay}H{h}" for lay, h in result.heads]
        if result.joint_delta is not None:
            labels.append("joint")
            values = np.asarray([*values, float(result.joint_delta[j])])
        kit.bars(axes[0], labels, values, ylabel=f"delta {metric} (cosine)", title=title)
    if exact:
        assert result.delta_to_others is not None
        series = {
            f"L{lay}H{h}": curve.numpy()
            for (lay, h), curve in zip(result.heads, result.delta_to_others, strict=True)
        }
        if result.joint_delta_to_others is not None:
            series["joint"] = result.joint_delta_to_others.numpy()
        kit.curves(
            axes[1], np.arange(len(next(iter(series.values())))), series, lw=1, hlines=(0.0,),
            legend=7, xlabel="position", ylabel="delta to_others (cosine)",
        )  # fmt: skip
    what = f"sink attribution over {result.n_sequences} sequences"
    headline(kit, fig, None, what, matplotlib=False, provenance=result.provenance)
    return fig


def _effect_levels(effect: torch.Tensor) -> tuple[float, ...]:
    """The reference lines of a patching curve: 0 always (so the axis keeps it), and 1 (the
    source run) only where an effect comes within half of it; small effects (often <= 0.03)
    are then drawn on an axis scaled to them, not flattened on a 0-1 axis."""
    finite = effect[torch.isfinite(effect)]
    near_one = finite.numel() > 0 and float(finite.abs().max()) >= 0.5
    return (0.0, 1.0) if near_one else (0.0,)


def patching_figure(
    result: PositionalPatchingResult, m: int, *, backend: str = "matplotlib"
) -> AnyFigure:
    """Heatmap of the normalised effect, layer x cell (one metric), or a curve over blocks when
    there is one cell per block."""
    kit = figure_kit(backend)
    fig, (ax,) = kit.new_figure(7, 4.5)
    title = f"{result.direction}: {result.component}, {result.metrics[m]} (ablation {result.how})"
    what = f"positional patching over {result.n_sequences} sequences"
    headline(kit, fig, None, what, matplotlib=False, provenance=result.provenance)
    if len(result.cells) == 1:  # one cell per block: a curve over blocks
        kit.curves(
            ax, list(result.layers), {"effect": result.effect[m, :, 0].numpy()},
            styles={"effect": "o-"}, hlines=_effect_levels(result.effect[m, :, 0]), legend=None,
            xlabel="block",
            ylabel="normalised effect", title=title,
        )  # fmt: skip
        kit.panel_title(ax, title, fontsize=10)
        return fig
    if result.cell_axis == "pos":
        labels = [f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in result.cells]
    else:
        labels = [str(a) for a, _ in result.cells]
    kit.heatmap(  # RdBu_r: centred on 0 and scaled to max |effect| (effects are often << 1)
        ax, result.effect[m].numpy(), cmap="RdBu_r", xticklabels=labels,
        yticklabels=[str(x) for x in result.layers],
        xlabel="position" if result.cell_axis == "pos" else "head", ylabel="block", title=title,
        label="normalised effect (fraction of the gap, 1 = source run)",
    )  # fmt: skip
    kit.panel_title(ax, title, fontsize=10)
    return fig


def comparison_figure(comparison: ModelComparison, *, backend: str = "matplotlib") -> AnyFigure:
    """Centred homogenization by layer per model; the matched and the naive edge excess at the
    last layer (block-bootstrap intervals); loss per model."""
    kit = figure_kit(backend)
    fig, (left, middle, right) = kit.new_figure(15, 4.4, ncols=3, width_ratios=[1.1, 1.5, 0.9])
    _layer_curves(
        kit, left, comparison.layer_table(), "model", comparison.labels,
        ("homogenization", "h_ci_low", "h_ci_high"), lw=1, hlines=(0.0,), legend="x-small",
        ylabel="H = mean off-diagonal W (centred)", title="Homogenization by layer",
    )  # fmt: skip
    summary = comparison.summary().set_index(["model", "statistic"])
    stats = ["matched_first", "matched_last", "naive_first", "naive_last"]

    def column(label: str, key: str, names: list[str]) -> list[float]:
        return [float(summary.loc[(label, s)][key]) for s in names]

    kit.bars(
        middle, [s.replace("_", "\n") for s in stats], None,
        groups={k: column(k, "value", stats) for k in comparison.labels},
        group_low={k: column(k, "ci_low", stats) for k in comparison.labels},
        group_high={k: column(k, "ci_high", stats) for k in comparison.labels},
        ylabel="edge minus middle (cosine)",
        title=f"Edge excess at the last layer ({comparison.edge_k} positions per edge)",
    )  # fmt: skip
    loss = {key: [column(k, key, ["loss"])[0] for k in comparison.labels]
            for key in ("value", "ci_low", "ci_high")}  # fmt: skip
    kit.bars(
        right, [label.split("/")[-1] for label in comparison.labels], loss["value"],
        low=loss["ci_low"], high=loss["ci_high"], rotation=30,
        ylabel="next-token loss (nats/token)", title="Loss",
    )  # fmt: skip
    headline(
        kit, fig, None, f"Models compared on {comparison.n_sequences} windows", matplotlib=True
    )
    return fig


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


def length_figure(
    study: LengthStudy, layer: int, *, title: str | None = None, backend: str = "matplotlib"
) -> AnyFigure:
    """Over positions: lag-controlled similarity and SP at entry ``layer``, the last block's
    normalised attention entropy and key-0 mass; over lengths: H_W and the matched edges."""
    kit = figure_kit(backend)
    fig, axes = kit.new_figure(13, 3.4, ncols=3)
    lag = study.curve("lag", layer)
    series = {f"M[p, p-{d}]": lag.loc[lag["lag"] == d, "value"].to_numpy() for d in study.lags}
    series["SP[p]"] = study.curve("sp", layer)["value"].to_numpy()
    x = np.arange(max(study.lengths))
    entry = study.layers[layer]
    kit.curves(axes[0], x, series, xlabel="position p", ylabel=f"cosine (entry {entry})",
               title="similarity over positions")  # fmt: skip
    attn = {
        "entropy / log(p+1)": study.curve("attention_entropy", -1)["value"].to_numpy(),
        "mass on key 0": study.curve("first_key_mass", -1)["value"].to_numpy(),
    }
    kit.curves(axes[1], x, attn, xlabel="query position p", ylabel="last block, mean over heads",
               title="attention over positions")  # fmt: skip
    by = {stat: study.by_length(stat, layer)["value"].to_numpy()
          for stat in ("homogenization", "matched_first", "matched_last")}  # fmt: skip
    kit.curves(axes[2], np.asarray(study.lengths), by, styles=dict.fromkeys(by, "o-"),
               xlabel="length T", ylabel=f"cosine (entry {entry})", hlines=[0.0],
               title="by length")  # fmt: skip
    kit.log_scale(axes[2], "x", base=2)
    what = f"over sequence length, {study.n_sequences} windows"
    headline(kit, fig, title, what, matplotlib=False, provenance=study.provenance)
    return fig


def received_figure(result: AttentionReceived, *, backend: str = "matplotlib") -> AnyFigure:
    """Attention received and attractor shift per key position for the first, middle and last
    block measured, and the slope of the shift on attention per block."""
    kit = figure_kit(backend)
    fig, axes = kit.new_figure(13, 3.4, ncols=3)
    picks = sorted({0, len(result.blocks) // 2, len(result.blocks) - 1})
    x = np.arange(result.received.shape[1])
    received = {f"block {result.blocks[i]}": result.received[i].numpy() for i in picks}
    kit.curves(axes[0], x, received, xlabel="key position k", ylabel="attention received",
               title="attention received (mean over heads, later queries)")  # fmt: skip
    kit.log_scale(axes[0], "y")
    shift = {f"block {result.blocks[i]}": result.shift[i].numpy() for i in picks}
    kit.curves(axes[1], x, shift, xlabel="key position k", ylabel="cosine change toward k",
               hlines=[0.0], title="attractor shift")  # fmt: skip
    kit.bars(axes[2], [str(b) for b in result.blocks], result.slope.numpy(),
             ylabel="slope of shift on attention (per block)",
             title="in proportion to attention?")  # fmt: skip
    what = f"attention received over {result.n_sequences} sequences"
    headline(kit, fig, None, what, matplotlib=False, provenance=result.provenance)
    return fig


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
