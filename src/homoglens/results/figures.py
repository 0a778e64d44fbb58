"""The figure of each result, composed from the generic primitives of
:mod:`homoglens.plotting` (which knows no result class). Each result's ``plot()`` calls one of
these; matplotlib is imported when a figure is made."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from homoglens.errors import InvalidInputError
from homoglens.plotting import bars, curves, heatmap, new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from homoglens.results.bias import AttentionBiasStudy
    from homoglens.results.comparison import ModelComparison
    from homoglens.results.lengths import LengthStudy
    from homoglens.results.patching import PositionalPatchingResult
    from homoglens.results.profile import HomogenizationProfile
    from homoglens.results.similarity import PositionalSimilarity
    from homoglens.results.sinks import (
        AttentionReceived,
        MassiveActivations,
        SinkAttribution,
        SinkScores,
    )
    from homoglens.results.studies import PositionAblationStudy

LAYER_AXIS = "layer (0 = embeddings, l = output of block l-1)"


def sink_rate_label(key: int, eps: float) -> str:
    """Gu et al.'s name of the sink rate on 0-indexed ``key``: they count keys from 1, so key 0
    is their Sink_1 (``sink_rate_label(0, 0.3) == "Sink_1^0.3 (key 0)"``)."""
    return f"Sink_{key + 1}^{eps:g} (key {key})"


def _panel(ax: Axes | None, width: float, height: float) -> tuple[Figure, Axes]:
    if ax is not None:
        return cast("Figure", ax.figure), ax
    fig, axes = new_figure(width, height)
    return fig, axes[0]


def profile_curves(
    profile: HomogenizationProfile, *, ax: Axes | None = None, title: str | None = None
) -> Figure:
    """Per-layer mean pairwise cosine (raw), anisotropy baseline, and adjusted = raw - baseline."""
    fig, ax = _panel(ax, 6, 4)
    series = {
        "mean pairwise cosine (raw)": profile.mean_pairwise.numpy(),
        "baseline (across sequences)": profile.baseline.numpy(),
        "adjusted = raw - baseline": profile.adjusted.numpy(),
    }
    styles = dict(zip(series, ("o-", "s--", "^-"), strict=True))
    curves(
        ax, np.asarray(profile.layers), series, styles=styles, hlines=(0.0,), xlabel=LAYER_AXIS,
        ylabel="cosine", title=title or "Homogenization by layer",
    )  # fmt: skip
    return fig


def profile_heatmap(
    profile: HomogenizationProfile,
    *,
    ax: Axes | None = None,
    metric: str = "to_others",
    title: str | None = None,
) -> Figure:
    """Layer x position heatmap of a per-position metric (default ``to_others``)."""
    fig, ax = _panel(ax, 7, 4)
    values = getattr(profile, metric).numpy()
    heatmap(
        ax, values, extent=(-0.5, profile.n_pos - 0.5, -0.5, len(values) - 0.5),
        yticklabels=[str(layer) for layer in profile.layers],
        xlabel="position (from the first real token)", ylabel="layer",
        title=title or f"{metric} by layer and position",
        label="cosine" if metric != "norm" else "norm",
    )  # fmt: skip
    return fig


def profile_figure(profile: HomogenizationProfile, *, title: str | None = None) -> Figure:
    """Two panels: per-layer curves (raw, baseline, adjusted) and the ``to_others`` heatmap."""
    fig, (left, right) = new_figure(13, 4.5, ncols=2, width_ratios=[1, 1.3])
    profile_curves(profile, ax=left)
    profile_heatmap(profile, ax=right)
    p = profile.provenance
    fig.suptitle(
        title
        or f"{p.model} ({p.backend}, {p.weights} weights): "
        f"{profile.n_sequences} sequences, {profile.n_tokens} tokens"
    )
    return fig


def study_figure(study: PositionAblationStudy, *, title: str | None = None) -> Figure:
    """Mean pairwise cosine by layer for each mode with CI bands; loss per mode with CIs."""
    fig, (left, right) = new_figure(12, 4.2, ncols=2, width_ratios=[1.6, 1])
    table = study.layer_table()
    rows = {mode: table[table["mode"] == mode] for mode in study.modes}
    curves(
        left, {m: r["layer"] for m, r in rows.items()},
        {m: r["mean_pairwise"] for m, r in rows.items()},
        bands={m: (r["ci_low"], r["ci_high"]) for m, r in rows.items()},
        styles=dict.fromkeys(rows, "o-"), ms=3, xlabel=LAYER_AXIS, ylabel="mean pairwise cosine",
        title="Homogenization by layer under positional ablations",
    )  # fmt: skip
    loss = study.loss_table()
    bars(
        right, list(loss["mode"]), loss["loss"], low=loss["ci_low"], high=loss["ci_high"],
        ylabel="next-token loss (nats/token)",
        title="Loss per mode (95% CI)" if study.ci == 0.95 else "Loss per mode",
    )  # fmt: skip
    fig.suptitle(
        title
        or f"{study.profiles['none'].provenance.model}: positional ablations, "
        f"{study.loss.shape[1]} sequences"
    )
    return fig


def similarity_figure(
    result: PositionalSimilarity, layers: list[int] | int | None, *, title: str | None = None
) -> Figure:
    """Position x position heatmaps of ``M`` and ``W`` for each chosen layer (default: the
    last), ``SP`` and ``to_first`` by position, and the lag curves of every layer.

    Raises:
        InvalidInputError: a layer not in the result.
    """
    chosen = [result.layers[-1]] if layers is None else layers
    layers = [chosen] if isinstance(chosen, int) else list(chosen)
    missing = [layer for layer in layers if layer not in result.layers]
    if missing or not layers:
        raise InvalidInputError(
            f"layers {missing or layers} are not in this result (it has {list(result.layers)})"
        )
    n = len(layers)
    fig, axes = new_figure(4.2 * (2 * n + 2), 4, ncols=2 * n + 2)
    pos = result.positions.numpy()
    extent = (pos[0] - 0.5, pos[-1] + 0.5, pos[-1] + 0.5, pos[0] - 0.5)
    for k, layer in enumerate(layers):
        li = result.layers.index(layer)
        m_ax, w_ax = axes[2 * k : 2 * k + 2]
        common: dict[str, Any] = {
            "extent": extent, "origin": "upper", "xlabel": "position j", "ylabel": "position i",
            "label": "cosine",
        }  # fmt: skip
        heatmap(m_ax, result.M[li].numpy(), title=f"M, layer {layer}", **common)
        w = result.W[li].numpy()
        bound = float(np.nanmax(np.abs(w - np.diag(np.diag(w))))) or 1.0
        heatmap(  # centred on 0, scaled to the off-diagonal (the diagonal is 1 - C)
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
    curves(
        axes[-2], pos, series, styles=styles, lw=1, legend="x-small", xlabel="position",
        ylabel="cosine", title="Same position across inputs (SP); to first",
    )  # fmt: skip
    curves(
        axes[-1], np.arange(1, result.n_pos),
        {str(layer): result.lag[li, 1:].numpy() for li, layer in enumerate(result.layers)},
        lw=1, legend="x-small" if len(result.layers) <= 12 else None, legend_title="layer",
        xlabel="distance |i - j| (positions)", ylabel="mean within-window cosine",
        title="Similarity by distance, per layer",
    )  # fmt: skip
    p = result.provenance
    fig.suptitle(
        title
        or f"{p.model}: positional similarity over {result.n_sequences} windows "
        f"(space={result.space}, centre={result.centre})"
    )
    return fig


def sink_scores_figure(scores: SinkScores) -> Figure:
    """Heatmaps of sink mass and importance per (layer, head)."""
    fig, axes = new_figure(11, 4, ncols=2)
    panels = (
        ("sink mass", scores.mass, f"mean attention on key {scores.key} (fraction, 0-1)"),
        ("importance alpha", scores.importance, f"Gu et al. alpha_{scores.key + 1} (0-1)"),
    )
    for ax, (name, values, label) in zip(axes, panels, strict=True):
        heatmap(
            ax, values.numpy(), cmap="magma", vmin=0, vmax=1, xlabel="head", ylabel="layer",
            title=f"{name} on key {scores.key}", label=label,
        )  # fmt: skip
    fig.suptitle(
        f"Attention sinks: {sink_rate_label(scores.key, scores.eps)} = {scores.sink_rate:.1f} %"
    )
    return fig


def massive_figure(massive: MassiveActivations) -> Figure:
    """Heatmap of log10 of the mean max/median ratio per (layer, position)."""
    fig, (ax,) = new_figure(7, 4)
    heatmap(
        ax, massive.ratio_mean.clamp_min(1).log10().numpy(), xlabel="position",
        ylabel="layer (0 = embeddings)",
        title="Massive activations: log10 mean(max |x| / median |x|)",
        label="log10 of max |x| / median |x| (ratio, no unit)",
    )  # fmt: skip
    return fig


def attribution_figure(result: SinkAttribution, metric: str, j: int) -> Figure:
    """Per-head change of ``metric`` (a ``[layer head]`` heatmap, or bars for a few heads) and,
    in exact mode, the change of ``to_others`` per position."""
    exact = result.delta_to_others is not None
    fig, axes = new_figure(11 if exact else 6, 4, ncols=2 if exact else 1)
    title = f"{result.method} attribution, {result.ablation} ablation, layer {result.layer}"
    values = result.delta[:, j].numpy()
    if len(result.heads) > 12:  # RdBu_r: centred on 0, scaled to the data by heatmap
        heatmap(
            axes[0], result.grid(metric).numpy(), cmap="RdBu_r", xlabel="head", ylabel="layer",
            title=title, label=f"delta {metric} (cosine)",
        )  # fmt: skip
    else:
        labels = [f"L{lay}H{h}" for lay, h in result.heads]
        if result.joint_delta is not None:
            labels.append("joint")
            values = np.asarray([*values, float(result.joint_delta[j])])
        bars(axes[0], labels, values, ylabel=f"delta {metric} (cosine)", title=title)
    if exact:
        assert result.delta_to_others is not None
        series = {
            f"L{lay}H{h}": curve.numpy()
            for (lay, h), curve in zip(result.heads, result.delta_to_others, strict=True)
        }
        if result.joint_delta_to_others is not None:
            series["joint"] = result.joint_delta_to_others.numpy()
        curves(
            axes[1], np.arange(len(next(iter(series.values())))), series, lw=1, hlines=(0.0,),
            legend=7, xlabel="position", ylabel="delta to_others (cosine)",
        )  # fmt: skip
    return fig


def patching_figure(result: PositionalPatchingResult, m: int) -> Figure:
    """Heatmap of the normalised effect, layer x cell (one metric), or a curve over blocks when
    there is one cell per block."""
    fig, (ax,) = new_figure(7, 4.5)
    title = f"{result.direction}: {result.component}, {result.metrics[m]} (ablation {result.how})"
    if len(result.cells) == 1:  # one cell per block: a curve over blocks
        curves(
            ax, list(result.layers), {"effect": result.effect[m, :, 0].numpy()},
            styles={"effect": "o-"}, hlines=(0.0, 1.0), legend=None, xlabel="block",
            ylabel="normalised effect", title=title,
        )  # fmt: skip
        ax.title.set_fontsize(10)
        return fig
    if result.cell_axis == "pos":
        labels = [f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in result.cells]
    else:
        labels = [str(a) for a, _ in result.cells]
    heatmap(  # RdBu_r: centred on 0 and scaled to max |effect| (effects are often << 1)
        ax, result.effect[m].numpy(), cmap="RdBu_r", xticklabels=labels,
        yticklabels=[str(x) for x in result.layers],
        xlabel="position" if result.cell_axis == "pos" else "head", ylabel="block", title=title,
        label="normalised effect (fraction of the gap, 1 = source run)",
    )  # fmt: skip
    ax.title.set_fontsize(10)
    return fig


def comparison_figure(comparison: ModelComparison) -> Figure:
    """Centred homogenization by layer per model; the matched and the naive edge excess at the
    last layer (block-bootstrap intervals); loss per model."""
    fig, (left, middle, right) = new_figure(15, 4.4, ncols=3, width_ratios=[1.1, 1.5, 0.9])
    layers = comparison.layer_table()
    rows = {label: layers[layers["model"] == label] for label in comparison.labels}
    curves(
        left, {k: r["layer"] for k, r in rows.items()},
        {k: r["homogenization"] for k, r in rows.items()},
        bands={k: (r["h_ci_low"], r["h_ci_high"]) for k, r in rows.items()},
        styles=dict.fromkeys(rows, "o-"), ms=3, lw=1, hlines=(0.0,), legend="x-small",
        xlabel=LAYER_AXIS, ylabel="H = mean off-diagonal W (centred)",
        title="Homogenization by layer",
    )  # fmt: skip
    summary = comparison.summary().set_index(["model", "statistic"])
    stats = ["matched_first", "matched_last", "naive_first", "naive_last"]

    def column(label: str, key: str, names: list[str]) -> list[float]:
        return [float(summary.loc[(label, s)][key]) for s in names]

    bars(
        middle, [s.replace("_", "\n") for s in stats], None,
        groups={k: column(k, "value", stats) for k in comparison.labels},
        group_low={k: column(k, "ci_low", stats) for k in comparison.labels},
        group_high={k: column(k, "ci_high", stats) for k in comparison.labels},
        ylabel="edge minus middle (cosine)",
        title=f"Edge excess at the last layer ({comparison.edge_k} positions per edge)",
    )  # fmt: skip
    loss = {key: [column(k, key, ["loss"])[0] for k in comparison.labels]
            for key in ("value", "ci_low", "ci_high")}  # fmt: skip
    bars(
        right, [label.split("/")[-1] for label in comparison.labels], loss["value"],
        low=loss["ci_low"], high=loss["ci_high"], rotation=30,
        ylabel="next-token loss (nats/token)", title="Loss",
    )  # fmt: skip
    fig.suptitle(f"Models compared on {comparison.n_sequences} windows")
    return fig


def bias_figure(study: AttentionBiasStudy, layer: int, *, title: str | None = None) -> Figure:
    """Dose-response of an attention bias: the change in H_W and in the matched edge excess at
    residual entry ``layer`` (paired intervals), the loss, and the manipulation checks."""
    fig, axes = new_figure(13, 3.4, ncols=3)
    x = np.asarray(study.strengths)
    axis = "beta" if study.kind == "temperature" else "b"
    series, bands = {}, {}
    for metric in ("homogenization", "matched_first", "matched_last"):
        frame = study.curve(metric, layer)
        series[metric] = frame["delta"].to_numpy()
        bands[metric] = (frame["ci_low"].fillna(0.0).to_numpy(),
                         frame["ci_high"].fillna(0.0).to_numpy())  # fmt: skip
    entry = study.layers[layer]
    curves(axes[0], x, series, bands=bands, styles=dict.fromkeys(series, "o-"),
           xlabel=axis, ylabel=f"change vs baseline (entry {entry})", hlines=[0.0],
           title=f"{study.kind}: homogenization and edges")  # fmt: skip
    loss = study.curve("loss")
    curves(axes[1], x, {"loss": loss["value"].to_numpy()}, styles={"loss": "o-"},
           xlabel=axis, ylabel="next-token loss (nats)", legend=None, title="loss")  # fmt: skip
    checks = {name: study.curve(name, None)["value"].to_numpy() for name in ("mass", "kl")}
    if study.kind == "temperature":
        checks = {"entropy": study.curve("entropy", None)["value"].to_numpy(), "kl": checks["kl"]}
    curves(axes[2], x, checks, styles=dict.fromkeys(checks, "o-"), xlabel=axis,
           ylabel="per biased row (nats / mass)", title="manipulation checks")  # fmt: skip
    if title:
        fig.suptitle(title)
    return fig


def length_figure(study: LengthStudy, layer: int, *, title: str | None = None) -> Figure:
    """Over positions: lag-controlled similarity and SP at entry ``layer``, the last block's
    normalised attention entropy and key-0 mass; over lengths: H_W and the matched edges."""
    fig, axes = new_figure(13, 3.4, ncols=3)
    lag = study.curve("lag", layer)
    series = {f"M[p, p-{d}]": lag.loc[lag["lag"] == d, "value"].to_numpy() for d in study.lags}
    series["SP[p]"] = study.curve("sp", layer)["value"].to_numpy()
    x = np.arange(max(study.lengths))
    entry = study.layers[layer]
    curves(axes[0], x, series, xlabel="position p", ylabel=f"cosine (entry {entry})",
           title="similarity over positions")  # fmt: skip
    attn = {
        "entropy / log(p+1)": study.curve("attention_entropy", -1)["value"].to_numpy(),
        "mass on key 0": study.curve("first_key_mass", -1)["value"].to_numpy(),
    }
    curves(axes[1], x, attn, xlabel="query position p", ylabel="last block, mean over heads",
           title="attention over positions")  # fmt: skip
    by = {stat: study.by_length(stat, layer)["value"].to_numpy()
          for stat in ("homogenization", "matched_first", "matched_last")}  # fmt: skip
    curves(axes[2], np.asarray(study.lengths), by, styles=dict.fromkeys(by, "o-"),
           xlabel="length T", ylabel=f"cosine (entry {entry})", hlines=[0.0],
           title="by length")  # fmt: skip
    axes[2].set_xscale("log", base=2)
    if title:
        fig.suptitle(title)
    return fig


def received_figure(result: AttentionReceived) -> Figure:
    """Attention received and attractor shift per key position for the first, middle and last
    block measured, and the slope of the shift on attention per block."""
    fig, axes = new_figure(13, 3.4, ncols=3)
    picks = sorted({0, len(result.blocks) // 2, len(result.blocks) - 1})
    x = np.arange(result.received.shape[1])
    received = {f"block {result.blocks[i]}": result.received[i].numpy() for i in picks}
    curves(axes[0], x, received, xlabel="key position k", ylabel="attention received",
           title="attention received (mean over heads, later queries)")  # fmt: skip
    axes[0].set_yscale("log")
    shift = {f"block {result.blocks[i]}": result.shift[i].numpy() for i in picks}
    curves(axes[1], x, shift, xlabel="key position k", ylabel="cosine change toward k",
           hlines=[0.0], title="attractor shift")  # fmt: skip
    bars(axes[2], [str(b) for b in result.blocks], result.slope.numpy(),
         ylabel="slope of shift on attention (per block)",
         title="in proportion to attention?")  # fmt: skip
    return fig
