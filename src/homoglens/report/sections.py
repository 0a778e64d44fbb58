"""The sections of the reports, one per measurement (figures embedded as PNG, or as plotly
figures in an interactive report: :func:`homoglens.report.html.figure_tag`)."""

from __future__ import annotations

import html
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from homoglens.report.html import figure_tag, table_html

if TYPE_CHECKING:
    from homoglens.ablation.result import PositionAblationStudy
    from homoglens.comparison.result import ModelComparison
    from homoglens.patching.result import PositionalPatchingResult
    from homoglens.profile.result import HomogenizationProfile
    from homoglens.similarity.calibration import CalibratedReadings
    from homoglens.similarity.result import PositionalSimilarity
    from homoglens.sinks import SinkAnalysis


def study_section(study: PositionAblationStudy, out: Path) -> str:
    """Save the study and return its HTML section (figure, loss table, per-layer table)."""
    from homoglens.ablation.figure import study_figure

    study.save(out / "study")
    figure = figure_tag(
        lambda backend: study_figure(study, backend=backend), out / "figures" / "ablation.png",
        "ablation",
    )  # fmt: skip
    loss = study.loss_table()
    loss.to_csv(out / "ablation_loss.csv", index=False)
    layers = study.layer_table()
    layers.to_csv(out / "ablation_layers.csv", index=False)

    def cell(row: Any) -> str:
        return (
            f"{row.mean_pairwise:.4f} ({row.diff_vs_none:+.4f} [{row.diff_ci_low:+.4f}, "
            f"{row.diff_ci_high:+.4f}])"
        )

    layers["cell"] = [
        f"{r.mean_pairwise:.4f}" if r.mode == "none" else cell(r)
        for r in cast(Iterable[Any], layers.itertuples())
    ]
    wide = layers.pivot(index="layer", columns="mode", values="cell")[list(study.modes)]
    wide.columns.name = None
    wide = wide.reset_index()
    adjusted_wide = _adjusted_table(study, layers)
    pct = int(round(study.ci * 100))
    settings = html.escape(", ".join(f"{k}={v}" for k, v in study.settings.items() if k != "data"))
    meaning = {
        "zero": "'zero' removes the explicit positional signal (learned: zero embedding; "
        "rotary: no rotation)",
        "permute": "'permute' gives token i the signal of a random position (seeded)",
        "shift": "'shift' gives token i the signal of position i + shift",
        "mean": "'mean' gives every token the mean positional embedding",
    }
    explained = "; ".join(meaning[m] for m in study.modes if m in meaning) + "."
    context = ""
    if study.icl is not None:
        table = study.context_table()
        table.to_csv(out / "ablation_context.csv", index=False)
        context = f"""<h3>Context-task costs (C3c)</h3>
<p class="note">icl: in-context-learning score, the loss of the last eighth of each window minus
that of its second eighth (negative: context helps; Olsson et al. 2022); induction_loss: the
loss on the second half of repeated random-token sequences (low: the model copies from the
first half). Differences are paired with the intact run.</p>
{table_html(table)}
"""
    return f"""
<h2>Positional ablations: homogenization and loss</h2>
<p class="note">Same sequences under each mode ({", ".join(study.modes)}); {settings}.
{explained}
NoPE models still infer position from the causal mask (Kazemnejad et al. 2023), so this removes
explicit positional information only. Intervals: {pct}% paired bootstrap over sequences
({study.n_boot} resamples).</p>
{figure}
<h3>Next-token loss (nats/token)</h3>
{loss.to_html(index=False, float_format=lambda v: f"{v:.4f}")}
<h3>Mean pairwise cosine by layer: value (difference to none [{pct}% CI])</h3>
{wide.to_html(index=False)}
<h3>Anisotropy-adjusted, beside it: raw - that mode's baseline (difference to none [{pct}% CI])
</h3>
<p class="note">The baseline (mean cosine between tokens of different sequences) is one number
per mode and layer, held fixed: the interval is the raw difference's, shifted by the change of
the baseline. A raw change that the baseline shares is anisotropy, not homogenization.</p>
{adjusted_wide.to_html(index=False)}
{context}"""


def _adjusted_table(study: PositionAblationStudy, layers: Any) -> Any:
    """Per layer and mode: adjusted value (difference to none [CI]) from ``layer_table()``."""
    frame = layers.copy()
    base = frame[frame["mode"] == "none"].set_index("layer")["adjusted"]
    shift = frame["adjusted"].to_numpy() - base.loc[frame["layer"]].to_numpy()
    shift = shift - frame["diff_vs_none"].to_numpy()  # change of the baseline, negated
    frame["cell"] = [
        f"{r.adjusted:.4f}"
        if r.mode == "none"
        else f"{r.adjusted:.4f} ({r.diff_vs_none + d:+.4f} [{r.diff_ci_low + d:+.4f}, "
        f"{r.diff_ci_high + d:+.4f}])"
        for r, d in zip(cast(Iterable[Any], frame.itertuples()), shift, strict=True)
    ]
    wide = frame.pivot(index="layer", columns="mode", values="cell")[list(study.modes)]
    wide.columns.name = None
    return wide.reset_index()


def massive_section(study: PositionAblationStudy, out: Path) -> str:
    """Save a :func:`~homoglens.massive_ablation_study` and return its HTML section: loss and
    homogenization with the massive activations set to their mean or to zero."""
    from homoglens.ablation.figure import study_figure

    study.save(out / "massive_ablation")
    figure = figure_tag(
        lambda backend: study_figure(study, backend=backend),
        out / "figures" / "massive_ablation.png", "massive-activation ablation",
    )  # fmt: skip
    loss = study.loss_table()
    loss.to_csv(out / "massive_ablation_loss.csv", index=False)
    layers = study.layer_table()
    layers.to_csv(out / "massive_ablation_layers.csv", index=False)
    step = max(1, (len(study.layers) - 1) // 6)
    shown = [*study.layers[::step], study.layers[-1]]
    columns = ["mode", "layer", "mean_pairwise", "adjusted", "diff_vs_none", "diff_ci_low",
               "diff_ci_high"]  # fmt: skip
    table = table_html(layers.loc[layers["layer"].isin(shown), columns])
    pct = int(round(study.ci * 100))
    st = study.settings
    return f"""
<h2>Massive activations set to their mean or to zero</h2>
<p class="note">Sun et al. (2024, arXiv 2402.17762) set the massive activations of one decoder
layer's output to their mean over a reference corpus (<em>set_mean</em>: the model is
unharmed) or to zero (<em>set_zero</em>: the model breaks). Here: decoder layer {st.get("layer")}
(<code>blocks.{int(st.get("layer", 1)) - 1}.hook_resid_post</code>), dims {st.get("dims")},
positions {st.get("positions")} ({html.escape(str(st.get("sites")))}); means over
{html.escape(str(st.get("reference")))}; measured on {html.escape(str(st.get("data")))}. When
the site is the first token of windows that all start with the same BOS, its activation is the
same in every window, so the mean changes nothing by construction; the zero run is the test.
Intervals: {pct}% paired bootstrap over windows.</p>
{figure}
<h3>Next-token loss (nats/token)</h3>
{loss.to_html(index=False, float_format=lambda v: f"{v:.4f}")}
<h3>Homogenization (raw, adjusted, raw difference to none [{pct}% CI]), every
{step}th layer</h3>
{table}
<p class="note">All layers: massive_ablation_layers.csv; the study: massive_ablation/ (reload
with PositionAblationStudy.load).</p>
"""


def similarity_section(result: PositionalSimilarity, out: Path) -> str:
    """Save the positional similarity and return its HTML section: M / W heatmaps of a late
    layer, the naive and the matched edge excess by layer (with intervals), SP by position."""
    from homoglens.similarity.figure import edge_excess_figure

    result.save(out / "similarity")
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    late = result.layers[-1]  # the summary's layer too
    heat = figure_tag(
        lambda backend: result.plot(layers=[late], backend=backend),
        figures / "similarity.png", "similarity",
    )  # fmt: skip
    edge = result.edge_excess()
    edge.to_csv(out / "similarity_edge_excess.csv", index=False)
    sp = result.sp_excess()
    sp.to_csv(out / "similarity_sp_excess.csv", index=False)
    result.to_pandas().to_csv(out / "similarity.csv", index=False)
    curves = figure_tag(
        lambda backend: edge_excess_figure(result, edge, backend=backend),
        figures / "similarity_edge_excess.png", "edge excess",
    )  # fmt: skip
    pct = 95
    last = edge[edge["layer"] == late]
    first_pos = (
        "position 0 left out (it holds a BOS)" if result.first_position else ("position 0 included")
    )
    return f"""
<h2>Position-resolved similarity (edges without the distance bias)</h2>
<p class="note">{result.n_sequences} windows of {result.n_pos + result.first_position} tokens,
{first_pos}; space={result.space}, centre={result.centre}. M[i, j] is the within-window mean
cosine of positions i and j, C[i, j] the same pair across different windows, W = M - C the
contextual similarity. The <em>naive</em> edge excess (an edge position's mean similarity to the
others minus the middle's) is negative for any sequence whose similarity falls with distance;
the <em>matched</em> excess compares edge-middle pairs of W with middle-middle pairs at the same
distance, and is 0 in expectation when no position is special. Intervals: {pct}% t intervals
with moving-block bootstrap standard errors over windows (block length chosen from their
autocorrelation), jackknife pseudo-values
{"on" if result.has_pseudo_values else "off"}. SP[i] = C[i, i] is the similarity of the same
position across inputs.</p>
{heat}
{curves}
<h3>Edge excess at layer {late}</h3>
{table_html(last)}
<h3>SP of the edges minus the middle, by layer</h3>
{table_html(sp)}
<p class="note">All layers: similarity_edge_excess.csv; matrices: similarity/ (reload with
PositionalSimilarity.load).</p>
"""


def sinks_section(analysis: SinkAnalysis, out: Path) -> str:
    """Save the sink analysis and return its HTML section."""
    scores, massive, fast, exact = analysis.scores, analysis.massive, analysis.fast, analysis.exact
    analysis.save(out / "sinks")
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    scores_png = figure_tag(
        lambda backend: scores.plot(backend=backend), figures / "sink_scores.png", "sink scores"
    )
    massive_png = figure_tag(
        lambda backend: massive.plot(backend=backend), figures / "massive_activations.png",
        "massive activations",
    )  # fmt: skip
    fast_png = figure_tag(
        lambda backend: fast.plot("mean_pairwise", backend=backend),
        figures / "sink_attribution_fast.png", "fast attribution",
    )  # fmt: skip
    exact_png = figure_tag(
        lambda backend: exact.plot("mean_pairwise", backend=backend),
        figures / "sink_attribution_exact.png", "exact attribution",
    )  # fmt: skip
    top = scores.top_heads(10)
    top.to_csv(out / "sink_heads.csv", index=False)
    scores.to_pandas().to_csv(out / "sink_scores.csv", index=False)
    dims = massive.top_dims(3)
    dims["dims"] = [", ".join(map(str, d)) for d in dims["dims"]]
    first = massive.ratio_mean[:, 0]
    rest = massive.ratio_mean[:, 1:].nanmedian(dim=1).values
    worst = int(torch.argmax(first.nan_to_num()))
    summary = exact.summary()
    summary.to_csv(out / "sink_attribution_exact.csv", index=False)
    fast_table = fast.to_pandas()
    fast_table.to_csv(out / "sink_attribution_fast.csv", index=False)
    fast_top = fast_table.reindex(
        fast_table["delta_mean_pairwise"].abs().sort_values(ascending=False).index
    ).head(10)
    joint = exact.joint_delta if exact.joint_delta is not None else exact.delta[0]
    change = float(joint[0])
    direction = "raises" if change > 0 else "lowers"
    heads = ", ".join(f"L{lay}H{h}" for lay, h in exact.heads)
    bos = {True: "a BOS token", False: "a real token", None: "a BOS in some sequences"}[
        scores.key_holds_bos
    ]
    share = -float(joint[1]) / float(exact.base[1]) if float(exact.base[1]) else float("nan")
    return f"""
<h2>Attention sinks</h2>
<p class="note">Key position {scores.key} holds {bos}. Sink mass: mean attention of each head
on the key over later queries; importance: Gu et al. 2024 alpha (arXiv 2410.10781); sink rate
Sink<sub>{scores.key + 1}</sub><sup>{scores.eps:g}</sup> (Gu et al. count keys from 1: key
{scores.key} here) = share of (sequence, layer, head) with alpha &gt; {scores.eps:g}:
<strong>{scores.sink_rate:.1f} %</strong> over {scores.n_sequences} sequences.</p>
{scores_png}
<h3>Strongest sink heads</h3>
{table_html(top)}
<h3>Massive activations (Sun et al. 2024, arXiv 2402.17762)</h3>
<p class="note">Per token, max |x| / median |x| over d_model. At position 0 the mean ratio
peaks at {float(first[worst]):.0f} (layer {massive.layers[worst]}) against a median of
{float(rest[worst]):.1f} for the other positions there. Dimensions that most often hold a
token's largest entry when its ratio exceeds {massive.threshold:g}:</p>
{massive_png}
{table_html(dims)}
<h3>Sink attribution: what removing the sinks does to homogenization</h3>
<p class="note">Measured at residual entry {exact.layer} (the last block's output) on
{exact.n_sequences} sequences. Removing a sink: the head's attention to key {exact.key} is set
to 0 and each row renormalised over the other keys. Metrics: mean_pairwise; first_excess /
last_excess = mean to_others of the first / last {exact.edge_k} tokens minus the middle tokens
(tokens up to the key left out). Base values: mean_pairwise {float(exact.base[0]):.4f},
first_excess {float(exact.base[1]):+.4f}, last_excess {float(exact.base[2]):+.4f}.</p>
<p><strong>Removing the sinks of {heads} together {direction} the mean pairwise cosine by
{abs(change):.4f}</strong> (Barbero et al. 2025, arXiv 2504.02732, predict a rise) and changes
the first-edge excess by {float(joint[1]):+.4f} (share removed: {share:.1%}).
Exact reruns: {html.escape(exact.rerun)}.</p>
{exact_png}
{table_html(summary)}
<h3>Fast attribution of every head (attribution patching, first order)</h3>
<p class="note">{html.escape(fast.rerun)}. First order in the size of the pattern change: heads
whose sink mass is near 1 are changed far beyond the linear regime, so trust the exact rows for
them. Correlation with the exact values over the {len(exact.heads)} exact heads
(mean_pairwise): {exact.correlation(fast):.3f}.</p>
{fast_png}
{table_html(fast_top)}
"""


def patching_section(result: PositionalPatchingResult, out: Path, *, name: str = "patching") -> str:
    """Save the patching result (as ``out/name``) and return its HTML section."""
    result.save(out / name)
    table = result.to_pandas()
    table.to_csv(out / f"{name}.csv", index=False)
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    images = []
    for metric in result.metrics:
        images.append(
            figure_tag(
                lambda backend, metric=metric: result.plot(metric, backend=backend),
                figures / f"{name}_{metric}.png",
                f"{name} {metric}",
            )
        )
    baselines = "; ".join(
        f"{html.escape(n)}: normal {float(a):.4f}, ablated {float(b):.4f}"
        for n, a, b in zip(result.metrics, result.normal, result.ablated, strict=True)
    )
    receiving = "position-ablated" if result.direction == "restore" else "normal"
    unit = "head" if result.cell_axis == "head_index" else "position bin"
    source = "normal" if result.direction == "restore" else "position-ablated"
    effect = result.effect
    top = []
    for m, metric_name in enumerate(result.metrics):
        values = effect[m].nan_to_num(float("-inf"))
        i, j = divmod(int(values.argmax()), values.shape[1])
        start, stop = result.cells[j]
        cell = f"head {start}" if unit == "head" else f"positions {start}-{stop - 1}"
        value = float(effect[m, i, j])
        top.append(
            f"{html.escape(metric_name)}: block {result.layers[i]}, {cell} (effect {value:.2f})"
        )
    if result.component == "positions":
        heading = "Where the positional signal enters: patching it one block at a time"
        what = (
            "the positional signal (rotation of queries and keys; for learned positions, the "
            "embedding) of one block, at every position"
        )
    else:
        heading = "Activation patching: where the positional signal acts"
        what = f"<code>{html.escape(result.component)}</code> of one block at one {unit}"
    return f"""
<h2>{heading}</h2>
<p class="note">{html.escape(result.direction)}: the {receiving} run (ablation
'{html.escape(result.how)}') receives the {source} run's {what}; the metric is
measured on the patched run (homogenization at residual entry {result.metric_layer}; loss in
nats/token). Normalised effect = (patched - receiving) / (source - receiving): 0 = no change,
1 = the source run's value. Baselines: {baselines}. {result.n_sequences} sequences of
{html.escape(result.provenance.data)}; cost
{result.forward_equivalents:.0f} forward-pass equivalents ({html.escape(result.batching)}).</p>
<p>Largest single-cell effect per metric: {"; ".join(top)}.</p>
{"".join(images)}
"""


def comparison_section(comparison: ModelComparison, out: Path) -> str:
    """Save the comparison (``comparison/``, CSVs, figure) and return its HTML section."""
    comparison.save(out / "comparison")
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    png = figure_tag(
        lambda backend: comparison.plot(backend=backend), figures / "comparison.png", "comparison"
    )
    tables = {
        "claims": comparison.claims(),
        "summary": comparison.summary(),
        "differences": comparison.differences(),
        "ablation_effects": comparison.ablation_effects(),
        "layers": comparison.layer_table(),
    }
    for name, frame in tables.items():
        frame.to_csv(out / f"comparison_{name}.csv", index=False)
    pct = int(round(comparison.ci * 100))
    held = [
        {"model": label, **{k: v for k, v in rec.items() if k != "heldout"}}
        for label, rec in comparison.heldout.items()
        if rec
    ]
    held_html = ""
    if held:
        import pandas as pd

        held_html = (
            "<h3>Held-out loss recorded at training (whole held-out novel, nats/token)</h3>"
            + table_html(pd.DataFrame(held))
        )
    nope = comparison.no_positions
    grouped = comparison.group_by == "variant"
    seeds = ", ".join(
        f"{html.escape(name)}: {len(labels)}" for name, labels in comparison.entities().items()
    )
    unit = (
        f"Models are variants; their training seeds ({seeds}) are the unit of replication: "
        "intervals come from a hierarchical bootstrap (seeds, then blocks of "
        f"{_blocks(comparison.block)}) with t quantiles on Welch-Satterthwaite degrees "
        "of freedom over the seed and window parts, and seed_sd is the between-seed s.d."
        if grouped
        else f"Each model is one training run: intervals are over windows only (moving blocks of "
        f"{_blocks(comparison.block)}), so they say nothing about another seed."
    )
    shipped = comparison.settings.get("shipped_statistics") or []
    shipped_note = (
        f" Shipped per-window statistics (no weights) for: {html.escape(', '.join(shipped))}."
        if shipped
        else ""
    )
    primary = tables["claims"][tables["claims"]["primary"]]
    sesoi_text = (
        "a tenth of each statistic's scale (column sesoi)"
        if comparison.sesoi is None
        else f"{comparison.sesoi} cosine"
    )
    return f"""
<h2>Models compared on the same windows</h2>
<p class="note">{comparison.n_sequences} windows:
{html.escape(str(comparison.settings.get("data", "")))}. Every statistic is paired by window.
{unit}{shipped_note} Model without positions: {html.escape(str(nope))}. Edge statistics use the
first / last {comparison.edge_k} positions against the middle at the last layer: "matched"
compares edge-middle pairs with middle-middle pairs at the same distance (the naive excess is
biased by distance and shown for reference); H is the mean off-diagonal of W = M - C; both on
vectors centred {html.escape(str(comparison.settings.get("centre")))} (what every window shares
at a position removed first). Sinks use
Gu et al.'s importance on key 0 with eps = {comparison.eps}. The metrics are homoglens' own
operationalisation of Yusupov et al. 2025 (arXiv 2508.17126), not the paper's numbers.</p>
{png}
<h3>Claims C1-C3: primary tests ({len(primary)}, Holm-adjusted, SESOI {sesoi_text}
/ {comparison.loss_sesoi} nats)</h3>
<p class="note">holds: significant on the predicted side; equivalent: TOST shows the effect is
smaller than the SESOI; fails: significant on the other side; "possibly negligible" after holds
or fails: significant, but the interval reaches inside the SESOI; inconclusive: none of these.
The full table (secondary rows unadjusted) is in comparison_claims.csv.</p>
{table_html(primary)}
<h3>Per model (mean over windows, {pct}% CI; per-layer statistics at the last layer)</h3>
{table_html(tables["summary"])}
{held_html}
<h3>Paired differences to {html.escape(comparison.labels[0])}</h3>
{table_html(tables["differences"])}
<h3>Positional ablations within each model (ablated minus intact)</h3>
{table_html(tables["ablation_effects"])}
<h3>Homogenization by layer (intact models: raw mean pairwise, centred H)</h3>
{table_html(tables["layers"])}
"""


def first_token_warning(profile: HomogenizationProfile) -> str:
    """A warning paragraph when position 0 carries a massive activation (Sun et al. 2024)."""
    if profile.provenance.exclude_first or profile.n_pos < 3:
        return ""
    norm = profile.norm
    others = norm[:, 1:].nanmedian(dim=1).values
    ratio = norm[:, 0] / others.clamp_min(1e-12)
    worst = int(torch.argmax(ratio.nan_to_num()))
    if float(ratio[worst]) < 10:
        return ""
    return (
        f'<p class="note"><strong>Position 0 dominates some layers:</strong> its residual norm '
        f"is up to {float(ratio[worst]):.0f}x the median norm of the other positions (layer "
        f"{profile.layers[worst]}), a massive activation (Sun et al. 2024, arXiv 2402.17762). "
        "Per-sequence metrics that weigh vectors by their norm (relative_residual, "
        "effective_rank) then mostly describe that one token there; rerun with "
        "<code>--exclude-first</code> to measure the rest.</p>"
    )


def _blocks(block: object) -> str:
    """How a bootstrap block length reads in a report."""
    if block == "auto":
        return "consecutive windows, their length chosen from the windows' autocorrelation"
    return f"{block} consecutive windows"


_DESIGN_NOTES = {
    "offset": "A start-of-sequence contrast, descriptive: the same tokens read as a window of "
    "their own and after a prefix. A fresh start and a late copy differ through the causal mask "
    "alone (the prefix length, the first token's share of attention), so a verdict here says "
    "that the first / last tokens of a sequence differ from the same tokens later in a "
    "sequence, not that positional bias drives it (that needs the model-matched null: "
    "calibrated_readings(..., reference='no_positions')).",
    "no_positions": "Positional attribution against the model-matched causal null: the same "
    "model on the same windows with its positions removed, which keeps the weights, the content, "
    "the causal mask and the sink the mask sustains; the null's loss cost (below, and the "
    "null_loss_change column of the CSV) says how far out of distribution it is.",
    "model": "Against a reference model on the same windows (a NoPE twin is the causal null of "
    "the controlled models).",
}


def readings_section(readings: CalibratedReadings, out: Path, name: str = "readings") -> str:
    """Save calibrated readings and return their HTML section: the three readings of "edge
    tokens homogenize" in the model and in its reference, their paired differences with
    intervals and verdicts at the last layer (every layer in ``{name}.csv``), named for what
    the design answers (:data:`homoglens.similarity.calibration.DESIGNS`: the offset design is a
    start-of-sequence contrast, not a causal null); a ``"no_positions"`` null's loss cost stands
    above the table. Files: ``{name}/`` and ``{name}.csv`` in ``out``."""
    import pandas as pd

    readings.save(out / name)
    tables = [readings.table(layer) for layer in readings.model.layers[1:]]
    everything = pd.concat(tables, ignore_index=True)
    everything.to_csv(out / f"{name}.csv", index=False)
    last = tables[-1]
    shown = last[["reading", "model", "reference", "difference", "ci_low", "ci_high", "sesoi",
                  "verdict", "block"]]  # fmt: skip
    title = readings.design.split(":")[0]
    what = _DESIGN_NOTES[readings.reference_kind]
    cost = readings.null_cost()
    cost_html = (
        ""
        if cost is None
        else f"""<p>The null's cost: next-token loss with the positions removed minus intact,
{cost.value:+.3f} nats/token [{cost.ci_low:+.3f}, {cost.ci_high:+.3f}] (95 %, paired over the
windows). The larger it is, the further out of distribution the null runs, and the less its
verdicts license.</p>"""
    )
    return f"""
<h2>Edge homogenization, three readings (C2): {html.escape(title)}</h2>
<p class="note">{what} Each reading of "edge tokens homogenize" is read in the model and in
{html.escape(readings.reference_name)}, on the same {readings.model.n_sequences} windows of
{readings.model.n_pos} positions (uncentred, jackknife pseudo-values), and only their paired
difference gets a verdict: (a) within-window contextual similarity of the edges, the
distance-matched excess of W; (b) convergence of the edge tokens on a direction shared by all
inputs, SP of the edge minus the middle; (c) cross-input convergence over depth, mean SP at the
layer minus at the embeddings. Verdicts: holds (difference &gt; 0), equivalent (within the
SESOI, a tenth of the model's H_W at the layer), fails (&lt; 0), "possibly negligible" after
either (significant, but the interval reaches inside the SESOI), inconclusive; Holm over the five
readings; t intervals over windows with the block length (column block, in windows) chosen from
their autocorrelation.</p>
{cost_html}
<h3>Layer {readings.model.layers[-1]}</h3>
{table_html(shown)}
<p class="note">Every layer: {name}.csv; the similarities: {name}/ (reload with
CalibratedReadings.load).</p>
"""
