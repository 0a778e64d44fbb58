"""Write a homogenization profile as files: safetensors + JSON, tidy CSV, PNG figures, and one
self-contained HTML report (figures embedded, no network needed to view it)."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homoglens.core.validate import at_most
from homoglens.report.bias_sections import bias_section, length_section
from homoglens.report.html import (
    figure_tag,
    interactive_figures,
    page_html,
    provenance_table,
    section_page,
)
from homoglens.report.sections import (
    comparison_section,
    first_token_warning,
    massive_section,
    patching_section,
    readings_section,
    similarity_section,
    sinks_section,
    study_section,
)
from homoglens.report.summary import (
    check_results,
    edge_intervals,
    listed,
    summary_html,
    summary_rows,
    with_contents,
)

if TYPE_CHECKING:
    from homoglens.ablation.result import PositionAblationStudy
    from homoglens.bias.result import AttentionBiasStudy
    from homoglens.comparison.result import ModelComparison
    from homoglens.lengths.result import LengthStudy
    from homoglens.patching.result import PositionalPatchingResult
    from homoglens.profile.result import HomogenizationProfile
    from homoglens.similarity.calibration import CalibratedReadings
    from homoglens.similarity.result import PositionalSimilarity
    from homoglens.sinks import SinkAnalysis

__all__ = [
    "write_bias_report",
    "write_comparison_report",
    "write_length_report",
    "write_patching_report",
    "write_profile_report",
    "write_sinks_report",
]


def write_sinks_report(
    analysis: SinkAnalysis, out: Path, *, title: str | None = None, interactive: bool = False
) -> Path:
    """Write the attention-sink analysis (``sinks/`` results, CSVs, figures, ``report.html``)
    into the prepared folder ``out`` (``interactive``: see :func:`write_profile_report`).

    Returns:
        The path of ``report.html``.
    """
    provenance = analysis.scores.provenance
    return _one_section_page(
        out, title, "Attention sinks", sinks_section, analysis, interactive, provenance
    )


def write_bias_report(
    study: AttentionBiasStudy, out: Path, *, title: str | None = None, interactive: bool = False
) -> Path:
    """Write an attention-bias study (``attention_bias/``, CSVs, figure, ``report.html``) into
    the prepared folder ``out`` (``interactive``: see :func:`write_profile_report`).

    Returns:
        The path of ``report.html``.
    """
    return _one_section_page(
        out, title, f"Attention bias ({study.kind})", bias_section, study, interactive
    )


def write_length_report(
    study: LengthStudy, out: Path, *, title: str | None = None, interactive: bool = False
) -> Path:
    """Write a length study (``lengths/``, ``lengths.csv``, figure, ``report.html``) into the
    prepared folder ``out`` (``interactive``: see :func:`write_profile_report`).

    Returns:
        The path of ``report.html``.
    """
    return _one_section_page(out, title, "Over sequence length", length_section, study, interactive)


def write_patching_report(
    result: PositionalPatchingResult,
    out: Path,
    *,
    title: str | None = None,
    interactive: bool = False,
) -> Path:
    """Write a patching result (``patching/``, ``patching.csv``, figures, ``report.html``)
    into the prepared folder ``out`` (``interactive``: see :func:`write_profile_report`).

    Returns:
        The path of ``report.html``.
    """
    return _one_section_page(
        out, title, "Positional activation patching", patching_section, result, interactive
    )


def _one_section_page(
    out: Path,
    title: str | None,
    what: str,
    section: Callable[[Any, Path], str],
    result: Any,
    interactive: bool,
    provenance: Any = None,
) -> Path:
    """Draw the section of ``result`` (its figures into ``out``, off-screen) and write its
    ``report.html``, headed ``title`` or ``"<what>: <model>"`` (``provenance``: the result's
    own unless given)."""
    provenance = result.provenance if provenance is None else provenance
    heading = title or f"{what}: {provenance.model}"
    out = Path(out)
    _off_screen()
    with interactive_figures(interactive):
        return section_page(out, heading, section(result, out), provenance)


def _off_screen() -> None:
    """Draw with matplotlib's Agg backend unless the user chose another one."""
    import matplotlib

    matplotlib.use("Agg", force=False)


def write_comparison_report(
    comparison: ModelComparison, out: Path, *, title: str | None = None, interactive: bool = False
) -> Path:
    """Write a model comparison (``comparison/``, ``comparison_*.csv``, figure,
    ``report.html``) into the prepared folder ``out`` (``interactive``: see
    :func:`write_profile_report`).

    Returns:
        The path of ``report.html``.
    """
    _off_screen()
    with interactive_figures(interactive):
        return _comparison_page(comparison, Path(out), title)


def _comparison_page(comparison: ModelComparison, out: Path, title: str | None) -> Path:
    heading = title or "Controlled comparison: " + ", ".join(comparison.labels)
    body = (
        comparison_section(comparison, out)
        + "<h2>Provenance</h2>"
        + provenance_table(
            {
                **{f"backend ({k})": v for k, v in comparison.settings.get("backends", {}).items()},
                **{f"weights ({k})": v for k, v in comparison.settings.get("weights", {}).items()},
                "modes": ", ".join(comparison.settings.get("modes", [])),
            }
        )
    )
    path = out / "report.html"
    path.write_text(page_html(heading, body), encoding="utf-8")
    return path


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
    bias: AttentionBiasStudy | None = None,
    massive: PositionAblationStudy | None = None,
    readings: CalibratedReadings | list[CalibratedReadings] | None = None,
    standardized: PositionalSimilarity | None = None,
    dims_dropped: PositionalSimilarity | None = None,
    interactive: bool = False,
) -> Path:
    """Write profile files, figures and ``report.html`` into the (prepared) folder ``out``.

    Files: ``profile/profile.safetensors`` + ``profile/profile.json`` (reload with
    ``HomogenizationProfile.load``), ``profile.csv`` (tidy), ``edge_summary.csv``,
    ``figures/curves.png``, ``figures/curves_adjusted.png``, ``figures/heatmap.png``,
    ``report.html``; with a ``study``: ``study/``, ``ablation_loss.csv``,
    ``ablation_layers.csv``, ``figures/ablation.png`` and a report section; with ``sinks``:
    ``sinks/``, ``sink_*.csv``, sink figures and a section; with ``patching``: ``patching/``,
    ``patching.csv``, heatmaps and a section; with ``similarity``: ``similarity/``,
    ``similarity*.csv``, figures and a position-resolved section; with ``bias``:
    ``attention_bias/``, ``attention_bias_*.csv``, a figure and a dose-response section; with
    ``massive`` (a :func:`~homoglens.massive_ablation_study`): ``massive_ablation/``,
    ``massive_ablation_*.csv``, a figure and a section; with ``readings`` (a
    :func:`~homoglens.calibrated_readings`, or a list of them, one per design):
    ``readings/``, ``readings.csv`` (the second: ``readings_1/``, ``readings_1.csv``, ...) and
    a section each of the three readings of C2 against their reference (the CLI report: the
    start-of-sequence contrast and the positional attribution against the model-matched null),
    whose verdicts the summary shows; with
    ``standardized`` (a ``positional_similarity(..., centre="global", standardize=True)``): the
    C1 headline after standardisation, and with ``dims_dropped`` (a
    ``positional_similarity(..., drop_dims=k)``) after removing the k dimensions of largest
    energy, beside the other corrections in the summary. The
    page opens with a summary (the
    headline numbers with their intervals and what they mean, ``summary.csv``) and a table of
    contents.

    With ``interactive``, every figure of the page is an interactive plotly figure (hover
    values with units, zoom, legend toggles) and plotly.js is inlined once, so the page still
    opens offline (about 5 MB more); the PNGs are written to ``figures/`` all the same.

    Returns:
        The path of ``report.html``.

    Raises:
        MissingDependencyError: ``interactive`` without plotly installed.
        InvalidInputError: ``profile`` or another result of the wrong kind, a massive-activation
            study given as ``study`` or a positional one as ``massive`` (before anything is
            written).
    """
    check_results(
        profile, study=study, sinks=sinks, patching=patching, similarity=similarity, bias=bias,
        massive=massive, readings=readings, standardized=standardized, dims_dropped=dims_dropped,
    )  # fmt: skip
    _off_screen()
    with interactive_figures(interactive):
        return _profile_page(
            profile, Path(out), edge_k=edge_k, title=title, study=study, sinks=sinks,
            patching=patching, similarity=similarity, bias=bias, massive=massive,
            readings=readings, standardized=standardized, dims_dropped=dims_dropped,
        )  # fmt: skip


def _profile_page(
    profile: HomogenizationProfile,
    out: Path,
    *,
    edge_k: int,
    title: str | None,
    study: PositionAblationStudy | None,
    sinks: SinkAnalysis | None,
    patching: PositionalPatchingResult | list[PositionalPatchingResult] | None,
    similarity: PositionalSimilarity | None,
    bias: AttentionBiasStudy | None,
    massive: PositionAblationStudy | None = None,
    readings: CalibratedReadings | list[CalibratedReadings] | None = None,
    standardized: PositionalSimilarity | None = None,
    dims_dropped: PositionalSimilarity | None = None,
) -> Path:
    """The body of :func:`write_profile_report`."""
    curves, adjusted, heat = _profile_files(profile, out)
    counted = int((profile.count > 0).sum())
    most = (counted - 1) // 2
    k = (
        at_most("edge_k", edge_k, most, "positions per edge the counted ones allow")
        if most >= 1
        else 0
    )  # here, not in _edge_table: the warning names the line that called _profile_page
    edge_html = _edge_table(profile, out, k, counted, study)
    per_layer = profile.to_pandas()
    per_layer = per_layer[per_layer["pos"].isna()].pivot(
        index="layer", columns="metric", values="value"
    )
    per_layer.columns.name = None
    per_layer = per_layer.reset_index()

    prov = asdict(profile.provenance)
    prov.pop("data_rows", None)  # one fingerprint per window: the hash above names the data
    prov["hook_points"] = (
        f"{prov['hook_points'][0]} ... {prov['hook_points'][-1]}" if prov["hook_points"] else ""
    )
    prov.update(n_sequences=profile.n_sequences, n_tokens=profile.n_tokens, positions=profile.n_pos)
    ablation = _result_sections(
        out, similarity=similarity, readings=readings, study=study, bias=bias, massive=massive,
        sinks=sinks, patching=patching,
    )  # fmt: skip
    source = (
        f"Model source: {html.escape(profile.provenance.model_source)}."
        if profile.provenance.model_source
        else ""
    )
    warning = first_token_warning(profile)
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
{curves}
<h2>Adjusted homogenization (raw minus baseline)</h2>
{adjusted}
<h2>Layer x position: mean cosine to the other tokens (to_others)</h2>
{heat}
<h2>Edge versus middle (to_others, first/last {max(k, 0)} positions)</h2>
{edge_html}
<h2>Per-layer values</h2>
{per_layer.to_html(index=False, float_format=lambda v: f"{v:.4f}")}
{ablation}
<h2>Provenance</h2>
{provenance_table(prov)}
<p class="note">Files beside this report: profile/ (safetensors + JSON, reload with
<code>HomogenizationProfile.load</code>), profile.csv (tidy), edge_summary.csv, figures/.</p>
"""
    rows = summary_rows(
        profile,
        study=study,
        similarity=similarity,
        sinks=sinks,
        bias=bias,
        massive=massive,
        readings=readings,
        standardized=standardized,
        dims_dropped=dims_dropped,
    )
    import pandas as pd

    pd.DataFrame(rows).to_csv(out / "summary.csv", index=False)
    body = with_contents(summary_html(rows) + body)
    path = out / "report.html"
    path.write_text(page_html(heading, body), encoding="utf-8")
    return path


def _profile_files(profile: HomogenizationProfile, out: Path) -> tuple[str, str, str]:
    """Save ``profile`` (``profile/``, ``profile.csv``) into ``out`` and draw its three figures
    into ``figures/``: the curves, the adjusted curves and the heatmap, as the page's tags."""
    from homoglens.profile.figure import profile_adjusted, profile_curves, profile_heatmap

    profile.save(out / "profile")
    profile.to_pandas().to_csv(out / "profile.csv", index=False)
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    curves = figure_tag(
        lambda backend: profile_curves(profile, backend=backend), figures / "curves.png", "curves"
    )
    adjusted = figure_tag(
        lambda backend: profile_adjusted(profile, backend=backend),
        figures / "curves_adjusted.png", "adjusted",
    )  # fmt: skip
    heat = figure_tag(
        lambda backend: profile_heatmap(profile, backend=backend), figures / "heatmap.png",
        "heatmap",
    )  # fmt: skip
    return curves, adjusted, heat


def _edge_table(
    profile: HomogenizationProfile,
    out: Path,
    k: int,
    counted: int,
    study: PositionAblationStudy | None,
) -> str:
    """The HTML of the edge-versus-middle table with ``k`` positions per edge (with intervals
    from ``study``), also written to ``edge_summary.csv`` in ``out``; with ``k`` 0, a note that
    the ``counted`` positions are too few for one."""
    if k >= 1:
        edge = edge_intervals(profile.edge_summary(k), profile, study, k)
        edge.to_csv(out / "edge_summary.csv", index=False)
        edge_html = edge.to_html(index=False, float_format=lambda v: f"{v:.4f}")
    else:
        edge_html = f"<p>Too few counted positions ({counted}) for an edge-versus-middle table.</p>"
    return edge_html


def _result_sections(
    out: Path,
    *,
    similarity: PositionalSimilarity | None,
    readings: CalibratedReadings | list[CalibratedReadings] | None,
    study: PositionAblationStudy | None,
    bias: AttentionBiasStudy | None,
    massive: PositionAblationStudy | None,
    sinks: SinkAnalysis | None,
    patching: PositionalPatchingResult | list[PositionalPatchingResult] | None,
) -> str:
    """The HTML of the profile page's optional sections, in page order (position-resolved
    similarity, readings, ablations, attention bias, massive activations, sinks, patching),
    each written with its files into ``out``; empty when none is given."""
    ablation = similarity_section(similarity, out) if similarity is not None else ""
    for i, one in enumerate(listed(readings)):
        ablation += readings_section(one, out, "readings" if i == 0 else f"readings_{i}")
    if study is not None:
        ablation += study_section(study, out)
    if bias is not None:
        ablation += bias_section(bias, out)
    if massive is not None:
        ablation += massive_section(massive, out)
    if sinks is not None:
        ablation += sinks_section(sinks, out)
    if patching is not None:
        sweeps = patching if isinstance(patching, list) else [patching]
        for sweep in sweeps:
            ablation += patching_section(sweep, out, name=f"patching_{sweep.component}")
    return ablation
