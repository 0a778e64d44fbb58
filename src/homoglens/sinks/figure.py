"""The figures of the sink and massive-activation results (sink scores, massive activations,
sink attribution, attention received),
composed from :mod:`homoglens.results.figure_parts` and drawn by either backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from homoglens.core.errors import InvalidInputError
from homoglens.results.figure_parts import (
    LAYER_AXIS,
    AnyFigure,
    figure_kit,
    headline,
    sink_rate_label,
)

if TYPE_CHECKING:
    from homoglens.sinks.attribution_result import SinkAttribution
    from homoglens.sinks.massive_result import MassiveActivations
    from homoglens.sinks.result import AttentionReceived, SinkScores


# The figures of :class:`~homoglens.MassiveActivations` beside its default heatmap: Sun et al.
# 2024's layer-wise figure (arXiv 2402.17762, Fig. 2; ``main_llm.py --exp2``), the three largest
# |x| of the hidden state and its median, by layer, on a log axis.

MASSIVE_PLOT_KINDS = ("positions", "layers")
"""The figures of ``MassiveActivations.plot(kind=...)``: ``"positions"`` (the default heatmap of
log10 max/median ratio per layer and position) and ``"layers"`` (Sun et al.'s Fig. 2)."""


def massive_plot(
    massive: MassiveActivations, kind: str, *, backend: str = "matplotlib"
) -> AnyFigure:
    """Draw ``massive``'s figure ``kind`` (one of :data:`MASSIVE_PLOT_KINDS`).

    Raises:
        InvalidInputError: an unknown ``kind`` or ``backend``; ``kind="layers"`` on a result
            saved before ``layer_top`` existed.
    """
    if not isinstance(kind, str) or kind not in MASSIVE_PLOT_KINDS:
        raise InvalidInputError(
            f"kind={kind!r} is not one of {list(MASSIVE_PLOT_KINDS)}: 'positions' (the heatmap "
            "of max/median ratio by layer and position) or 'layers' (Sun et al.'s top 1-3 and "
            "median by layer)"
        )
    if kind == "layers":
        return massive_layers_figure(massive, backend=backend)
    return massive_figure(massive, backend=backend)


def massive_layers_figure(massive: MassiveActivations, *, backend: str = "matplotlib") -> AnyFigure:
    """Sun et al.'s Fig. 2: per layer, the mean over sequences of the 1st, 2nd and 3rd largest
    |x| of the whole hidden state (all real tokens and dimensions) and of its median |x|, on a
    log y axis (model units).

    Raises:
        InvalidInputError: an unknown ``backend``, or a result without ``layer_top`` (saved by
            an older homoglens: measure again).
    """
    if massive.layer_top is None or massive.layer_median is None:
        raise InvalidInputError(
            "this MassiveActivations has no layer_top / layer_median (saved before they "
            "existed): measure again with massive_activations(...) to draw kind='layers'"
        )
    kit = figure_kit(backend)
    x = np.asarray(massive.layers)
    top = massive.layer_top.double().numpy()
    series = {f"top {k + 1}": top[:, k] for k in range(top.shape[1])}
    series["median"] = massive.layer_median.double().numpy()
    positive = np.concatenate([v[v > 0] for v in series.values()])
    floor = float(positive.min()) / 2 if positive.size else 1e-12
    series = {label: np.clip(values, floor, None) for label, values in series.items()}
    styles = {label: "o-" for label in series} | {"median": "s--"}
    fig, (ax,) = kit.new_figure(7, 4)
    kit.curves(
        ax, x, series, styles=styles, lw=1.2, ms=3, xlabel=LAYER_AXIS,
        ylabel="|x| (model units, log scale)", legend="small",
        title="Massive activations: largest |x| and median |x| by layer (Sun et al. Fig. 2)",
    )  # fmt: skip
    kit.log_scale(ax, "y")
    what = f"top 1-3 and median |x| by layer over {massive.n_sequences} sequences"
    headline(kit, fig, None, what, matplotlib=False, provenance=massive.provenance)
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
