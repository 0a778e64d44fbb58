"""Figure builders (matplotlib), imported lazily by the result objects and the CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from homoglens.results import HomogenizationProfile

__all__ = ["profile_figure", "curves_figure", "heatmap_figure", "similarity_figure"]


def _layers(profile: HomogenizationProfile) -> np.ndarray:
    return np.asarray(profile.layers)


def curves_figure(profile: HomogenizationProfile, *, ax=None, title: str | None = None) -> Figure:
    """Per-layer mean pairwise cosine (raw), anisotropy baseline, and adjusted = raw - baseline.

    Returns:
        The matplotlib ``Figure`` holding the axes.
    """
    from matplotlib.figure import Figure

    if ax is None:
        fig = Figure(figsize=(6, 4), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    x = _layers(profile)
    ax.plot(x, profile.mean_pairwise.numpy(), "o-", label="mean pairwise cosine (raw)")
    ax.plot(x, profile.baseline.numpy(), "s--", label="baseline (across sequences)")
    ax.plot(x, profile.adjusted.numpy(), "^-", label="adjusted = raw - baseline")
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_xlabel("layer (0 = embeddings, l = output of block l-1)")
    ax.set_ylabel("cosine")
    ax.set_title(title or "Homogenization by layer")
    ax.legend(fontsize="small")
    return fig


def heatmap_figure(
    profile: HomogenizationProfile, *, ax=None, metric: str = "to_others", title: str | None = None
) -> Figure:
    """Layer x position heatmap of a per-position metric (default ``to_others``).

    Returns:
        The matplotlib ``Figure`` holding the axes.
    """
    from matplotlib.figure import Figure

    if ax is None:
        fig = Figure(figsize=(7, 4), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    values = getattr(profile, metric).numpy()
    image = ax.imshow(
        values,
        aspect="auto",
        origin="lower",
        interpolation="nearest",
        cmap="viridis",
        extent=(-0.5, profile.n_pos - 0.5, -0.5, len(values) - 0.5),
    )
    ax.set_yticks(range(len(values)), [str(layer) for layer in profile.layers])
    if len(values) > 16:
        ax.yaxis.set_major_locator(__import__("matplotlib").ticker.MaxNLocator(12, integer=True))
    ax.set_xlabel("position (from the first real token)")
    ax.set_ylabel("layer")
    ax.set_title(title or f"{metric} by layer and position")
    fig.colorbar(image, ax=ax, label="cosine" if metric != "norm" else "norm")
    return fig


def profile_figure(profile: HomogenizationProfile, *, title: str | None = None) -> Figure:
    """Two panels: per-layer curves (raw, baseline, adjusted) and the to_others heatmap."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.3])
    curves_figure(profile, ax=left)
    heatmap_figure(profile, ax=right)
    p = profile.provenance
    fig.suptitle(
        title
        or f"{p.model} ({p.backend}, {p.weights} weights): "
        f"{profile.n_sequences} sequences, {profile.n_tokens} tokens"
    )
    return fig


def study_figure(study, *, title: str | None = None) -> Figure:
    """Left: mean pairwise cosine by layer for each mode with CI bands; right: loss per mode
    with CIs (a positional-ablation study)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1.6, 1])
    table = study.layer_table()
    for mode in study.modes:
        rows = table[table["mode"] == mode]
        left.plot(rows["layer"], rows["mean_pairwise"], "o-", ms=3, label=mode)
        left.fill_between(rows["layer"], rows["ci_low"], rows["ci_high"], alpha=0.2)
    left.set_xlabel("layer (0 = embeddings, l = output of block l-1)")
    left.set_ylabel("mean pairwise cosine")
    left.set_title("Homogenization by layer under positional ablations")
    left.legend(fontsize="small")
    loss = study.loss_table()
    x = np.arange(len(loss))
    err = np.vstack([loss["loss"] - loss["ci_low"], loss["ci_high"] - loss["loss"]])
    right.bar(x, loss["loss"], yerr=err, capsize=4, color=[f"C{i}" for i in x])
    right.set_xticks(x, list(loss["mode"]))
    right.set_ylabel("next-token loss (nats/token)")
    right.set_title("Loss per mode (95% CI)" if study.ci == 0.95 else "Loss per mode")
    fig.suptitle(
        title
        or f"{study.profiles['none'].provenance.model}: positional ablations, "
        f"{study.loss.shape[1]} sequences"
    )
    return fig


def similarity_figure(result, layers: list[int], *, title: str | None = None) -> Figure:
    """Position x position heatmaps of ``M`` and ``W`` for each chosen layer, ``SP`` and
    ``to_first`` by position, and the lag curves (a
    :class:`~homoglens.results.similarity.PositionalSimilarity`)."""
    from matplotlib.figure import Figure

    n = len(layers)
    fig = Figure(figsize=(4.2 * (2 * n + 2), 4), layout="constrained")
    axes = fig.subplots(1, 2 * n + 2)
    pos = result.positions.numpy()
    extent = (pos[0] - 0.5, pos[-1] + 0.5, pos[-1] + 0.5, pos[0] - 0.5)
    for k, layer in enumerate(layers):
        li = result.layers.index(layer)
        for ax, name in zip(axes[2 * k : 2 * k + 2], ("M", "W"), strict=True):
            values = getattr(result, name)[li].numpy()
            if name == "W":
                bound = float(np.nanmax(np.abs(values - np.diag(np.diag(values))))) or 1.0
                image = ax.imshow(
                    values, cmap="RdBu_r", vmin=-bound, vmax=bound, extent=extent,
                    interpolation="nearest",
                )  # fmt: skip
            else:
                image = ax.imshow(values, cmap="viridis", extent=extent, interpolation="nearest")
            ax.set_title(f"{name}, layer {layer}")
            ax.set_xlabel("position j")
            ax.set_ylabel("position i")
            fig.colorbar(image, ax=ax, shrink=0.8, label="cosine")
    sp_ax, lag_ax = axes[-2], axes[-1]
    for layer in layers:
        li = result.layers.index(layer)
        sp_ax.plot(pos, result.SP[li].numpy(), lw=1, label=f"SP, layer {layer}")
        sp_ax.plot(pos, result.to_first[li].numpy(), lw=1, ls="--", label=f"to_first, {layer}")
    sp_ax.set_xlabel("position")
    sp_ax.set_ylabel("cosine")
    sp_ax.set_title("Same position across inputs (SP); to first")
    sp_ax.legend(fontsize="x-small")
    lags = np.arange(1, result.n_pos)
    for li, layer in enumerate(result.layers):
        lag_ax.plot(lags, result.lag[li, 1:].numpy(), lw=1, label=str(layer))
    lag_ax.set_xlabel("distance |i - j| (positions)")
    lag_ax.set_ylabel("mean within-window cosine")
    lag_ax.set_title("Similarity by distance, per layer")
    if len(result.layers) <= 12:
        lag_ax.legend(fontsize="x-small", title="layer")
    p = result.provenance
    fig.suptitle(
        title
        or f"{p.model}: positional similarity over {result.n_sequences} windows "
        f"(space={result.space}, centre={result.centre})"
    )
    return fig
