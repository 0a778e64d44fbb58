"""Write a homogenization profile as files: safetensors + JSON, tidy CSV, PNG figures, and one
self-contained HTML report (figures embedded, no network needed to view it)."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from homoglens._fs import staged_output
from homoglens.errors import InvalidInputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from homoglens.comparison import ModelComparison
    from homoglens.patching import PositionalPatchingResult
    from homoglens.results import HomogenizationProfile, PositionAblationStudy
    from homoglens.results.similarity import PositionalSimilarity
    from homoglens.sinks import SinkAnalysis

__all__ = [
    "check_output_dir",
    "staged_output",
    "write_profile_report",
    "write_sinks_report",
    "write_patching_report",
    "write_comparison_report",
]

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em}
h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}img{max-width:100%}
.note{color:#555;font-size:.9em}
"""


def check_output_dir(out: str | Path, *, overwrite: bool) -> Path:
    """Validate an output folder before any work is done; nothing is created or deleted here.

    Raises:
        InvalidInputError: ``out`` is a file; is the working folder, one of its parents, the home
            folder or a filesystem root (never replaced); or is not empty and ``overwrite`` is
            False.
    """
    folder = Path(out).expanduser()
    if folder.is_symlink():
        raise InvalidInputError(
            f"--out {str(folder)!r} is a symbolic link; give the real folder it points to"
        )
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"--out {str(folder)!r} is a file; give a folder")
    blocker = next((p for p in folder.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise InvalidInputError(
            f"--out {str(folder)!r} cannot be created: {str(blocker)!r} is a file, not a folder"
        )
    resolved = folder.resolve()
    cwd = Path.cwd().resolve()
    protected = {cwd, Path.home().resolve(), Path(resolved.anchor)} | set(cwd.parents)
    if resolved in protected:
        raise InvalidInputError(
            f"--out {str(folder)!r} is the working folder, one of its parents, the home folder or "
            "a filesystem root; homoglens never replaces those. Give a new folder, e.g. "
            "--out homoglens-report"
        )
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise InvalidInputError(
            f"output folder {str(folder)!r} is not empty; choose another --out or pass "
            "--overwrite to replace its contents (only after the run succeeds)"
        )
    return folder


def _png(fig: Figure, path: Path) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    data = buf.getvalue()
    path.write_bytes(data)
    return base64.b64encode(data).decode("ascii")


def _study_section(study: PositionAblationStudy, out: Path) -> str:
    """Save the study and return its HTML section (figure, loss table, per-layer table)."""
    from homoglens.plotting import study_figure

    study.save(out / "study")
    figure = _png(study_figure(study), out / "figures" / "ablation.png")
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
        f"{r.mean_pairwise:.4f}" if r.mode == "none" else cell(r) for r in layers.itertuples()
    ]
    wide = layers.pivot(index="layer", columns="mode", values="cell")[list(study.modes)]
    wide.columns.name = None
    wide = wide.reset_index()
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
    return f"""
<h2>Positional ablations: homogenization and loss</h2>
<p class="note">Same sequences under each mode ({", ".join(study.modes)}); {settings}.
{explained}
NoPE models still infer position from the causal mask (Kazemnejad et al. 2023), so this removes
explicit positional information only. Intervals: {pct}% paired bootstrap over sequences
({study.n_boot} resamples).</p>
<img alt="ablation" src="data:image/png;base64,{figure}">
<h3>Next-token loss (nats/token)</h3>
{loss.to_html(index=False, float_format=lambda v: f"{v:.4f}")}
<h3>Mean pairwise cosine by layer: value (difference to none [{pct}% CI])</h3>
{wide.to_html(index=False)}
"""


def _table(frame: Any) -> str:
    return str(frame.to_html(index=False, float_format=lambda v: f"{v:.4f}"))


def _similarity_section(result: PositionalSimilarity, out: Path) -> str:
    """Save the positional similarity and return its HTML section: M / W heatmaps of a late
    layer, the naive and the matched edge excess by layer (with intervals), SP by position."""
    from matplotlib.figure import Figure

    result.save(out / "similarity")
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    late = result.layers[max(0, (3 * (len(result.layers) - 1)) // 4)]
    heat = _png(result.plot(layers=[late]), figures / "similarity.png")
    edge = result.edge_excess()
    edge.to_csv(out / "similarity_edge_excess.csv", index=False)
    sp = result.sp_excess()
    sp.to_csv(out / "similarity_sp_excess.csv", index=False)
    result.to_pandas().to_csv(out / "similarity.csv", index=False)
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    for i, name in enumerate(("first", "last")):
        rows = edge[edge["edge"] == name]
        ax.plot(rows["layer"], rows["naive"], "--", color=f"C{i}", label=f"naive, {name}")
        ax.plot(rows["layer"], rows["matched"], "o-", ms=3, color=f"C{i}", label=f"matched, {name}")
        ax.fill_between(rows["layer"], rows["ci_low"], rows["ci_high"], color=f"C{i}", alpha=0.2)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("layer (0 = embeddings, l = output of block l-1)")
    ax.set_ylabel("edge minus middle (cosine)")
    ax.set_title(f"Edge excess, {result.edge_k} positions per edge")
    ax.legend(fontsize="x-small")
    curves = _png(fig, figures / "similarity_edge_excess.png")
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
distance, and is 0 in expectation when no position is special. Intervals: {pct}% Wald intervals
with moving-block bootstrap standard errors over windows (blocks of 16), jackknife pseudo-values
{"on" if result.has_pseudo_values else "off"}. SP[i] = C[i, i] is the similarity of the same
position across inputs.</p>
<img alt="similarity" src="data:image/png;base64,{heat}">
<img alt="edge excess" src="data:image/png;base64,{curves}">
<h3>Edge excess at layer {late}</h3>
{_table(last)}
<h3>SP of the edges minus the middle, by layer</h3>
{_table(sp)}
<p class="note">All layers: similarity_edge_excess.csv; matrices: similarity/ (reload with
PositionalSimilarity.load).</p>
"""


def _sinks_section(analysis: SinkAnalysis, out: Path) -> str:
    """Save the sink analysis and return its HTML section."""
    scores, massive, fast, exact = analysis.scores, analysis.massive, analysis.fast, analysis.exact
    analysis.save(out / "sinks")
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    scores_png = _png(scores.plot(), figures / "sink_scores.png")
    massive_png = _png(massive.plot(), figures / "massive_activations.png")
    fast_png = _png(fast.plot("mean_pairwise"), figures / "sink_attribution_fast.png")
    exact_png = _png(exact.plot("mean_pairwise"), figures / "sink_attribution_exact.png")
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
Sink<sub>{scores.key}</sub><sup>{scores.eps}</sup> = share of (sequence, layer, head) with
alpha &gt; {scores.eps}: <strong>{scores.sink_rate:.1f} %</strong> over {scores.n_sequences}
sequences.</p>
<img alt="sink scores" src="data:image/png;base64,{scores_png}">
<h3>Strongest sink heads</h3>
{_table(top)}
<h3>Massive activations (Sun et al. 2024, arXiv 2402.17762)</h3>
<p class="note">Per token, max |x| / median |x| over d_model. At position 0 the mean ratio
peaks at {float(first[worst]):.0f} (layer {massive.layers[worst]}) against a median of
{float(rest[worst]):.1f} for the other positions there. Dimensions that most often hold a
token's largest entry when its ratio exceeds {massive.threshold:g}:</p>
<img alt="massive activations" src="data:image/png;base64,{massive_png}">
{_table(dims)}
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
<img alt="exact attribution" src="data:image/png;base64,{exact_png}">
{_table(summary)}
<h3>Fast attribution of every head (attribution patching, first order)</h3>
<p class="note">{html.escape(fast.rerun)}. First order in the size of the pattern change: heads
whose sink mass is near 1 are changed far beyond the linear regime, so trust the exact rows for
them. Correlation with the exact values over the {len(exact.heads)} exact heads
(mean_pairwise): {exact.correlation(fast):.3f}.</p>
<img alt="fast attribution" src="data:image/png;base64,{fast_png}">
{_table(fast_top)}
"""


def _page(heading: str, body: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(heading)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(heading)}</h1>
{body}
</body></html>
"""


def _provenance_table(rows: dict[str, Any]) -> str:
    return (
        "<table>"
        + "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in rows.items()
        )
        + "</table>"
    )


def _section_page(out: Path, heading: str, section: str, provenance: Any) -> Path:
    """Write ``report.html``: one section and the provenance table."""
    prov = asdict(provenance)
    prov.pop("hook_points", None)
    body = section + "<h2>Provenance</h2>" + _provenance_table(prov)
    path = out / "report.html"
    path.write_text(_page(heading, body), encoding="utf-8")
    return path


def write_sinks_report(analysis: SinkAnalysis, out: Path, *, title: str | None = None) -> Path:
    """Write the attention-sink analysis (``sinks/`` results, CSVs, figures, ``report.html``)
    into the prepared folder ``out``.

    Returns:
        The path of ``report.html``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    out = Path(out)
    heading = title or f"Attention sinks: {analysis.scores.provenance.model}"
    return _section_page(out, heading, _sinks_section(analysis, out), analysis.scores.provenance)


def _patching_section(
    result: PositionalPatchingResult, out: Path, *, name: str = "patching"
) -> str:
    """Save the patching result (as ``out/name``) and return its HTML section."""
    result.save(out / name)
    table = result.to_pandas()
    table.to_csv(out / f"{name}.csv", index=False)
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    images = []
    for metric in result.metrics:
        png = _png(result.plot(metric), figures / f"{name}_{metric}.png")
        images.append(f'<img alt="{name} {html.escape(metric)}" src="data:image/png;base64,{png}">')
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


def write_patching_report(
    result: PositionalPatchingResult, out: Path, *, title: str | None = None
) -> Path:
    """Write a patching result (``patching/``, ``patching.csv``, figures, ``report.html``)
    into the prepared folder ``out``.

    Returns:
        The path of ``report.html``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    out = Path(out)
    heading = title or f"Positional activation patching: {result.provenance.model}"
    return _section_page(out, heading, _patching_section(result, out), result.provenance)


def _comparison_section(comparison: ModelComparison, out: Path) -> str:
    """Save the comparison (``comparison/``, CSVs, figure) and return its HTML section."""
    comparison.save(out / "comparison")
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    png = _png(comparison.plot(), figures / "comparison.png")
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
            + _table(pd.DataFrame(held))
        )
    nope = comparison.no_positions
    grouped = comparison.group_by == "variant"
    seeds = ", ".join(
        f"{html.escape(name)}: {len(labels)}" for name, labels in comparison.entities().items()
    )
    unit = (
        f"Models are variants; their training seeds ({seeds}) are the unit of replication: "
        "intervals come from a hierarchical bootstrap (seeds, then blocks of "
        f"{comparison.block} consecutive windows) with t quantiles on Welch-Satterthwaite degrees "
        "of freedom over the seed and window parts, and seed_sd is the between-seed s.d."
        if grouped
        else f"Each model is one training run: intervals are over windows only (moving blocks of "
        f"{comparison.block} consecutive windows), so they say nothing about another seed."
    )
    shipped = comparison.settings.get("shipped_statistics") or []
    shipped_note = (
        f" Shipped per-window statistics (no weights) for: {html.escape(', '.join(shipped))}."
        if shipped
        else ""
    )
    primary = tables["claims"][tables["claims"]["primary"]]
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
<img alt="comparison" src="data:image/png;base64,{png}">
<h3>Claims C1-C3: primary tests ({len(primary)}, Holm-adjusted, SESOI {comparison.sesoi}
cosine / {comparison.loss_sesoi} nats)</h3>
<p class="note">holds: significant on the predicted side; equivalent: TOST shows the effect is
smaller than the SESOI; fails: significant on the other side; inconclusive: none of these.
The full table (secondary rows unadjusted) is in comparison_claims.csv.</p>
{_table(primary)}
<h3>Per model (mean over windows, {pct}% CI; per-layer statistics at the last layer)</h3>
{_table(tables["summary"])}
{held_html}
<h3>Paired differences to {html.escape(comparison.labels[0])}</h3>
{_table(tables["differences"])}
<h3>Positional ablations within each model (ablated minus intact)</h3>
{_table(tables["ablation_effects"])}
<h3>Homogenization by layer (intact models: raw mean pairwise, centred H)</h3>
{_table(tables["layers"])}
"""


def write_comparison_report(
    comparison: ModelComparison, out: Path, *, title: str | None = None
) -> Path:
    """Write a model comparison (``comparison/``, ``comparison_*.csv``, figure,
    ``report.html``) into the prepared folder ``out``.

    Returns:
        The path of ``report.html``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    out = Path(out)
    heading = title or "Controlled comparison: " + ", ".join(comparison.labels)
    body = (
        _comparison_section(comparison, out)
        + "<h2>Provenance</h2>"
        + _provenance_table(
            {
                **{f"backend ({k})": v for k, v in comparison.settings.get("backends", {}).items()},
                **{f"weights ({k})": v for k, v in comparison.settings.get("weights", {}).items()},
                "modes": ", ".join(comparison.settings.get("modes", [])),
            }
        )
    )
    path = out / "report.html"
    path.write_text(_page(heading, body), encoding="utf-8")
    return path


def _first_token_warning(profile: HomogenizationProfile) -> str:
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


def write_profile_report(
    profile: HomogenizationProfile,
    out: Path,
    *,
    edge_k: int = 8,
    title: str | None = None,
    study: PositionAblationStudy | None = None,
    sinks: SinkAnalysis | None = None,
    patching: PositionalPatchingResult | list[PositionalPatchingResult] | None = None,
    similarity: PositionalSimilarity | None = None,
) -> Path:
    """Write profile files, figures and ``report.html`` into the (prepared) folder ``out``.

    Files: ``profile/profile.safetensors`` + ``profile/profile.json`` (reload with
    ``HomogenizationProfile.load``), ``profile.csv`` (tidy), ``edge_summary.csv``,
    ``figures/curves.png``, ``figures/curves_adjusted.png``, ``figures/heatmap.png``,
    ``report.html``; with a ``study``: ``study/``, ``ablation_loss.csv``,
    ``ablation_layers.csv``, ``figures/ablation.png`` and a report section; with ``sinks``:
    ``sinks/``, ``sink_*.csv``, sink figures and a section; with ``patching``: ``patching/``,
    ``patching.csv``, heatmaps and a section; with ``similarity``: ``similarity/``,
    ``similarity*.csv``, figures and a position-resolved section.

    Returns:
        The path of ``report.html``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    from homoglens.plotting import curves_figure, heatmap_figure

    out = Path(out)
    profile.save(out / "profile")
    profile.to_pandas().to_csv(out / "profile.csv", index=False)
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    curves = _png(curves_figure(profile), figures / "curves.png")

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(list(profile.layers), profile.adjusted.numpy(), "^-", color="C2")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("layer (0 = embeddings, l = output of block l-1)")
    ax.set_ylabel("mean pairwise cosine - baseline")
    ax.set_title("Adjusted homogenization (beyond anisotropy)")
    adjusted = _png(fig, figures / "curves_adjusted.png")
    heat = _png(heatmap_figure(profile), figures / "heatmap.png")

    counted = int((profile.count > 0).sum())
    k = min(edge_k, (counted - 1) // 2)
    if k >= 1:
        edge = profile.edge_summary(k)
        edge.to_csv(out / "edge_summary.csv", index=False)
        edge_html = edge.to_html(index=False, float_format=lambda v: f"{v:.4f}")
    else:
        edge_html = f"<p>Too few counted positions ({counted}) for an edge-versus-middle table.</p>"
    per_layer = profile.to_pandas()
    per_layer = per_layer[per_layer["pos"].isna()].pivot(
        index="layer", columns="metric", values="value"
    )
    per_layer.columns.name = None
    per_layer = per_layer.reset_index()

    prov = asdict(profile.provenance)
    prov["hook_points"] = (
        f"{prov['hook_points'][0]} ... {prov['hook_points'][-1]}" if prov["hook_points"] else ""
    )
    prov.update(n_sequences=profile.n_sequences, n_tokens=profile.n_tokens, positions=profile.n_pos)
    ablation = _similarity_section(similarity, out) if similarity is not None else ""
    if study is not None:
        ablation += _study_section(study, out)
    if sinks is not None:
        ablation += _sinks_section(sinks, out)
    if patching is not None:
        sweeps = patching if isinstance(patching, list) else [patching]
        for sweep in sweeps:
            ablation += _patching_section(sweep, out, name=f"patching_{sweep.component}")
    source = (
        f"Model source: {html.escape(profile.provenance.model_source)}."
        if profile.provenance.model_source
        else ""
    )
    warning = _first_token_warning(profile)
    p = profile.provenance
    heading = title or f"Token homogenization: {p.model}"
    body = f"""<p class="note">{profile.n_sequences} sequences, {profile.n_tokens} tokens;
{p.backend} backend, {p.weights} weights; BOS at position 0: {p.bos};
exclude_first: {p.exclude_first}.
Metrics are homoglens' operationalisation of token homogenization (Yusupov et al. 2025,
arXiv 2508.17126); they do not reproduce the paper's numbers. Raw cosines include anisotropy:
read them against the baseline (mean cosine between tokens of different sequences).
{source}</p>
{warning}
<details open><summary>What the numbers mean</summary><dl class="note">
<dt>layer</dt><dd>0 = embeddings (input of block 0), l = output of block l-1.</dd>
<dt>to_others[layer, pos]</dt><dd>mean cosine of the token at pos to the other tokens of its
sequence, averaged over sequences.</dd>
<dt>mean_pairwise[layer]</dt><dd>mean cosine over all token pairs of a sequence, averaged over
sequences (raw homogenization).</dd>
<dt>baseline[layer]</dt><dd>mean cosine between tokens of <em>different</em> sequences
(anisotropy, Ethayarajh 2019), exact over all cross pairs.</dd>
<dt>adjusted[layer]</dt><dd>mean_pairwise - baseline: homogenization beyond anisotropy.</dd>
<dt>relative_residual[layer]</dt><dd>||X - mean||_F / ||X||_F per sequence; 0 when all tokens
are identical (Dong et al. 2021).</dd>
<dt>effective_rank[layer]</dt><dd>exp(entropy of the normalised singular values) of each
sequence's [pos d_model] matrix (Roy &amp; Vetterli 2007).</dd>
<dt>to_mean, to_prefix, norm</dt><dd>cosine to the sequence mean, mean cosine to earlier tokens,
mean vector norm. Full definitions: docs/metrics.md.</dd></dl></details>
<h2>Homogenization by layer (raw and baseline)</h2>
<img alt="curves" src="data:image/png;base64,{curves}">
<h2>Adjusted homogenization (raw minus baseline)</h2>
<img alt="adjusted" src="data:image/png;base64,{adjusted}">
<h2>Layer x position: mean cosine to the other tokens (to_others)</h2>
<img alt="heatmap" src="data:image/png;base64,{heat}">
<h2>Edge versus middle (to_others, first/last {max(k, 0)} positions)</h2>
{edge_html}
<h2>Per-layer values</h2>
{per_layer.to_html(index=False, float_format=lambda v: f"{v:.4f}")}
{ablation}
<h2>Provenance</h2>
{_provenance_table(prov)}
<p class="note">Files beside this report: profile/ (safetensors + JSON, reload with
<code>HomogenizationProfile.load</code>), profile.csv (tidy), edge_summary.csv, figures/.</p>
"""
    path = out / "report.html"
    path.write_text(_page(heading, body), encoding="utf-8")
    return path
