"""The opening of the profile report: the headline numbers with their intervals and what each
means, and a table of contents of the sections below it.

Every number here is also in its section (and CSV); the summary only picks, per question, the
one a reader looks for first: how alike the tokens are at the last layer (raw and net of
anisotropy), whether that grows with depth (C1), whether the edges stand out once distance is
matched (C2), what removing positions costs (C3), how strongly the model sinks attention into
its first token, and what its massive activations do. Signs are read from the intervals only
("interval above 0"), never from a point estimate.

References:
    Yusupov et al. 2025, arXiv 2508.17126 (claims C1-C3); Gu et al. 2024, arXiv 2410.10781
    (sink rate); Sun et al. 2024, arXiv 2402.17762 (massive activations).
"""

from __future__ import annotations

import html
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from homoglens.ablation.result import PositionAblationStudy
    from homoglens.bias.result import AttentionBiasStudy
    from homoglens.profile.result import HomogenizationProfile
    from homoglens.similarity.calibration import CalibratedReadings
    from homoglens.similarity.result import PositionalSimilarity
    from homoglens.sinks.result import SinkAnalysis

__all__ = [
    "check_results",
    "check_studies",
    "edge_intervals",
    "same_run",
    "summary_html",
    "summary_rows",
    "with_contents",
]


def _sign(low: float, high: float) -> str:
    """How an interval reads: above 0, below 0, or containing it."""
    if math.isnan(low) or math.isnan(high):
        return "no interval"
    if low > 0:
        return "interval above 0"
    if high < 0:
        return "interval below 0"
    return "interval contains 0"


def _row(
    measure: str, value: float, low: float, high: float, reading: str, verdict: str = ""
) -> dict[str, Any]:
    return {
        "measure": measure,
        "value": float(value),
        "ci_low": float(low),
        "ci_high": float(high),
        "sign": _sign(float(low), float(high)),
        "verdict": verdict,
        "reading": reading,
    }


def same_run(profile: HomogenizationProfile, study: PositionAblationStudy | None) -> bool:
    """Whether ``study``'s intact run measured the same windows as ``profile`` (same layers,
    sequence count, data hash and ``exclude_first``) with at least 2 sequences: only then do
    its per-sequence values give ``profile``'s numbers intervals."""
    if study is None:
        return False
    base = study.profiles["none"]
    a, b = profile.provenance, base.provenance
    return (
        tuple(study.layers) == tuple(profile.layers)
        and base.n_sequences == profile.n_sequences >= 2
        and a.exclude_first == b.exclude_first
        and a.data_sha256 == b.data_sha256
    )


def check_results(profile: Any, **results: Any) -> None:
    """Refuse a report input of the wrong kind before anything is written: ``profile`` must be
    a :class:`~homoglens.HomogenizationProfile`, each of ``results`` (by the
    :func:`~homoglens.report.write_profile_report` argument it was given as) None or its
    result type."""
    from homoglens.ablation.result import PositionAblationStudy
    from homoglens.bias.result import AttentionBiasStudy
    from homoglens.core.errors import InvalidInputError
    from homoglens.patching.result import PositionalPatchingResult
    from homoglens.profile.result import HomogenizationProfile
    from homoglens.similarity.calibration import CalibratedReadings
    from homoglens.similarity.result import PositionalSimilarity
    from homoglens.sinks.result import SinkAnalysis

    expected: dict[str, tuple[type, ...]] = {
        "study": (PositionAblationStudy,),
        "massive": (PositionAblationStudy,),
        "sinks": (SinkAnalysis,),
        "patching": (PositionalPatchingResult, list),
        "similarity": (PositionalSimilarity,),
        "bias": (AttentionBiasStudy,),
        "readings": (CalibratedReadings, list),
        "standardized": (PositionalSimilarity,),
        "dims_dropped": (PositionalSimilarity,),
    }
    if not isinstance(profile, HomogenizationProfile):
        raise InvalidInputError(
            f"the report is built on a HomogenizationProfile (homogenization_profile), not a "
            f"{type(profile).__name__}; pass the others by name (study=, sinks=, ...)"
        )
    for name, value in results.items():
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        if not isinstance(value, expected[name]) or not all(
            isinstance(v, expected[name][0]) for v in items
        ):
            raise InvalidInputError(
                f"{name}= takes a {expected[name][0].__name__}"
                f"{' or a list of them' if name in ('patching', 'readings') else ''}, not a "
                f"{type(value).__name__}"
            )
    check_studies(results.get("study"), results.get("massive"))


def listed(value: Any) -> list[Any]:
    """A report input that may be one result or a list of them, as a list (``None``: empty)."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def check_studies(
    study: PositionAblationStudy | None, massive: PositionAblationStudy | None
) -> None:
    """Refuse a massive-activation study given as the positional one, or the reverse."""
    from homoglens.core.errors import InvalidInputError

    if study is not None and study.is_massive:
        raise InvalidInputError(
            "study= is a massive-activation study (massive_ablation_study); pass it as massive="
        )
    if massive is not None and not massive.is_massive:
        raise InvalidInputError(
            "massive= takes a massive_ablation_study result; a positional ablation study goes "
            "in study="
        )


def summary_rows(
    profile: HomogenizationProfile,
    *,
    study: PositionAblationStudy | None = None,
    similarity: PositionalSimilarity | None = None,
    sinks: SinkAnalysis | None = None,
    bias: AttentionBiasStudy | None = None,
    massive: PositionAblationStudy | None = None,
    readings: CalibratedReadings | list[CalibratedReadings] | None = None,
    standardized: PositionalSimilarity | None = None,
    dims_dropped: PositionalSimilarity | None = None,
) -> list[dict[str, Any]]:
    """The headline numbers of a report, one dict per row: ``measure``, ``value``, ``ci_low``,
    ``ci_high`` (NaN where the result holds no per-window values, or fewer than 2, or where
    ``study`` measured other windows than ``profile``), ``sign`` (how the interval reads),
    ``verdict`` (holds / equivalent / fails / inconclusive, qualified "possibly negligible"
    where a significant interval reaches inside the SESOI, for the calibrated C2 readings,
    empty for descriptive rows) and ``reading`` (what the number means).

    Every position-resolved row is at the last layer, as the position-resolved section. The
    C2 rows are the three readings against their reference (``readings``: one
    :class:`~homoglens.similarity.calibration.CalibratedReadings` or a list, one per design), when
    given, each named for its design, with a ``"no_positions"`` null's loss cost in a row of its
    own; without them the uncalibrated matched excess is shown, flagged as such. The C3 row is the
    change of the *adjusted* homogenization (raw minus the anisotropy baseline of each run).
    Beside the C1 headline stand the standard corrections: the anisotropy-adjusted change
    (Ethayarajh 2019), the change after standardising every dimension (``standardized``: a
    ``positional_similarity(..., centre="global", standardize=True)``, which takes the rogue
    dimensions' dominance out of the cosine, Timkey & van Schijndel 2021; its global mean leaves
    out massive tokens, Sun et al. 2024), the change with the massive / rogue dimensions removed
    (``dims_dropped``: a ``positional_similarity(..., drop_dims=k)``, the k dimensions of largest
    mean square zeroed in each layer) and the growth of the residual norm.

    Raises:
        InvalidInputError: a massive-activation study given as ``study`` or a positional one as
            ``massive``.

    Intervals: paired percentile bootstrap over windows for the ablation rows (as in their
    section); t intervals with moving-block bootstrap standard errors over windows (block length
    chosen from their autocorrelation) for the position-resolved rows and the readings; the
    bias slope's own interval. The adjusted value's interval is the raw one shifted by the
    anisotropy baseline, which is held fixed.
    """
    check_studies(study, massive)
    rows = _profile_rows(profile, study)
    rows += _c1_rows(similarity)
    if len(profile.layers) > 1:
        rows += _corrections(profile, study, standardized, dims_dropped)
    rows += _c2_rows(similarity, readings)
    rows += _c3_rows(study)
    rows += _bias_rows(bias)
    rows += _sink_rows(sinks)
    rows += _massive_rows(massive)
    return rows


def _profile_rows(
    profile: HomogenizationProfile, study: PositionAblationStudy | None
) -> list[dict[str, Any]]:
    """The raw and anisotropy-adjusted mean pairwise cosine at the last layer."""
    from homoglens.ablation.result import paired_bootstrap

    rows: list[dict[str, Any]] = []
    last = profile.layers[-1]
    raw, base = float(profile.mean_pairwise[-1]), float(profile.baseline[-1])
    lo = hi = math.nan
    if same_run(profile, study):
        assert study is not None
        _, low, high = paired_bootstrap(
            study.mean_pairwise[0][:, -1], n_boot=study.n_boot, ci=study.ci, seed=study.seed
        )
        lo, hi = float(low), float(high)
    rows.append(_row(
        f"mean pairwise cosine, layer {last} (raw)", raw, lo, hi,
        "how alike the tokens of one window are at the last layer (1: identical directions)",
    ))  # fmt: skip
    rows.append(_row(
        f"adjusted (raw - anisotropy baseline {base:.3f}), layer {last}", raw - base, lo - base,
        hi - base,
        "the same net of what tokens of different windows share (anisotropy); > 0: tokens of "
        "a window are more alike than tokens in general",
    ))  # fmt: skip
    return rows


def _c1_rows(similarity: PositionalSimilarity | None) -> list[dict[str, Any]]:
    """C1: contextual homogenization gained with depth (last minus first measured layer)."""
    from homoglens.core.stats import estimate

    rows: list[dict[str, Any]] = []
    if similarity is not None and len(similarity.layers) > 1 and similarity.n_sequences > 1:
        h = similarity.per_window("homogenization")
        est = estimate([(h[:, -1] - h[:, 0])[None]])
        rows.append(_row(
            f"H_W layer {similarity.layers[-1]} - layer {similarity.layers[0]} (C1)", est.value,
            est.ci_low, est.ci_high,
            "contextual homogenization (W = M - C, cross-window similarity of the same "
            "positions removed) gained with depth; C1 predicts > 0",
        ))  # fmt: skip
    return rows


def _c2_rows(
    similarity: PositionalSimilarity | None,
    readings: CalibratedReadings | list[CalibratedReadings] | None,
) -> list[dict[str, Any]]:
    """C2: the calibrated readings against their reference (named for its design), or the
    uncalibrated matched excess."""
    rows: list[dict[str, Any]] = []
    if similarity is not None and len(similarity.layers) > 1 and similarity.n_sequences > 1:
        if not listed(readings):
            edge = similarity.edge_excess()
            edge = edge[edge["layer"] == similarity.layers[-1]]
            for r in edge.itertuples():
                rows.append(_row(
                    f"matched {r.edge}-edge excess, layer {r.layer} (C2, uncalibrated)",
                    r.matched, r.ci_low, r.ci_high,
                    f"the {similarity.edge_k} {r.edge} positions against middle pairs at the "
                    "same distance; not a verdict on positional bias: causal mixing alone moves "
                    "it (measure the readings against a causal null: calibrated_readings)",
                ))  # fmt: skip
    meaning = {
        "matched_first": "within-window similarity of the first edge (distance-matched W)",
        "matched_last": "within-window similarity of the last edge (distance-matched W)",
        "sp_first": "first-edge tokens converging on a direction shared by all inputs (SP)",
        "sp_last": "last-edge tokens converging on a direction shared by all inputs (SP)",
        "sp_mean": "cross-input convergence from the embeddings to this layer (mean SP)",
    }
    against = {"offset": "same tokens later (start-of-sequence contrast)",
               "no_positions": "positions removed (positional attribution, model-matched null)",
               "model": "reference model"}  # fmt: skip
    for one in listed(readings):
        table = one.table()
        for r in table.to_dict("records"):
            rows.append(_row(
                f"C2 ({r['reading']}), layer {r['layer']}: model - {against[one.reference_kind]}",
                r["difference"], r["ci_low"], r["ci_high"],
                f"{meaning[r['statistic']]}, in the model minus in {one.reference_name}; C2 "
                f"predicts > 0 (Holm over the five readings, SESOI {r['sesoi']:.3g})",
                verdict=str(r["verdict"]),
            ))  # fmt: skip
        cost = one.null_cost()
        if cost is not None:
            rows.append(_row(
                "next-token loss, positions removed - intact (the model-matched null's cost)",
                cost.value, cost.ci_low, cost.ci_high,
                "nats/token the null adds over the model, paired over windows: how far out of "
                "distribution the positional attribution's reference runs (0: none)",
            ))  # fmt: skip
    return rows


def _c3_rows(study: PositionAblationStudy | None) -> list[dict[str, Any]]:
    """C3: adjusted homogenization and loss with the positions zeroed, minus intact."""
    from homoglens.ablation.result import paired_bootstrap

    rows: list[dict[str, Any]] = []
    if study is not None and "zero" in study.modes and study.loss.shape[1] >= 2:
        m = study.modes.index("zero")
        opts = {"n_boot": study.n_boot, "ci": study.ci, "seed": study.seed}
        shift = float(study.profiles["zero"].baseline[-1] - study.profiles["none"].baseline[-1])
        diff = study.mean_pairwise[m][:, -1] - study.mean_pairwise[0][:, -1] - shift
        d, dlo, dhi = (float(t) for t in paired_bootstrap(diff, **opts))
        rows.append(_row(
            f"adjusted homogenization, layer {study.layers[-1]}: positions zeroed - intact (C3)",
            d, dlo, dhi,
            "what removing the explicit positional signal at inference does to homogenization "
            "beyond anisotropy (raw minus each run's baseline; out of distribution; C3 predicts "
            "< 0)",
        ))  # fmt: skip
        loss = study.loss[m] - study.loss[0]
        d, dlo, dhi = (float(t) for t in paired_bootstrap(loss, **opts))
        rows.append(_row(
            "next-token loss: positions zeroed - intact (nats/token, C3)", d, dlo, dhi,
            "what it costs the model; C3 predicts > 0",
        ))  # fmt: skip
    return rows


def _bias_rows(bias: AttentionBiasStudy | None) -> list[dict[str, Any]]:
    """The attention-bias slope per unit of mass moved onto the first key, at b = 0."""
    rows: list[dict[str, Any]] = []
    if bias is not None:
        try:
            slope = bias.slope_at_zero("homogenization", -1)
        except Exception:  # a study without a symmetric pair of strengths: no slope
            slope = None
        if slope is not None:
            rows.append(_row(
                f"d H_W / d mass at b = 0, attention moved onto the first key, layer "
                f"{slope.layer}", slope.per_mass, slope.per_mass_ci_low, slope.per_mass_ci_high,
                "how homogenization responds per unit of attention mass moved onto the first "
                "key (1 = all of a row's attention; a nat of bias moves little where rows are "
                f"saturated); > 0: more attention to the first token makes tokens more alike "
                f"(C2, attention reading; SESOI {slope.sesoi:.3g} per unit of mass)",
                verdict=slope.verdict() if math.isfinite(slope.per_mass) else "",
            ))  # fmt: skip
    return rows


def _sink_rows(sinks: SinkAnalysis | None) -> list[dict[str, Any]]:
    """The sink rate (Gu et al. 2024)."""
    rows: list[dict[str, Any]] = []
    if sinks is not None:
        from homoglens.results.figure_parts import sink_rate_label

        scores = sinks.scores
        rows.append(_row(
            f"sink rate {sink_rate_label(scores.key, scores.eps)} (%)", scores.sink_rate,
            math.nan, math.nan,
            f"share of (window, layer, head) whose importance on key {scores.key} exceeds "
            f"{scores.eps:g} (Gu et al. 2024)",
        ))  # fmt: skip
    return rows


def _massive_rows(massive: PositionAblationStudy | None) -> list[dict[str, Any]]:
    """The loss with the massive activations set to zero, minus intact (Sun et al. 2024)."""
    from homoglens.ablation.result import paired_bootstrap

    rows: list[dict[str, Any]] = []
    if massive is not None and massive.loss.shape[1] >= 2:
        opts = {"n_boot": massive.n_boot, "ci": massive.ci, "seed": massive.seed}
        where = (
            f"layer {massive.settings.get('layer')}, dims {massive.settings.get('dims')}, "
            f"positions {massive.settings.get('positions')}"
        )
        # "set to mean" is no headline: the sites include position 0, which holds the same
        # token (the BOS) in every window, so its mean is its value and the row reads 0 by
        # construction (it stays in the massive-activation section)
        for mode, reading in (("zero", "Sun et al.: destroys the model"),):
            m = massive.modes.index(mode)
            d, dlo, dhi = (
                float(t) for t in paired_bootstrap(massive.loss[m] - massive.loss[0], **opts)
            )
            rows.append(_row(
                f"next-token loss, massive activations set to {mode} - intact (nats/token)",
                d, dlo, dhi, f"{where}; {reading}",
            ))  # fmt: skip
    return rows


def _corrections(
    profile: HomogenizationProfile,
    study: PositionAblationStudy | None,
    standardized: PositionalSimilarity | None,
    dims_dropped: PositionalSimilarity | None = None,
) -> list[dict[str, Any]]:
    """The standard corrections beside the C1 headline (see :func:`summary_rows`)."""
    from homoglens.ablation.result import paired_bootstrap
    from homoglens.core.stats import estimate

    rows = []
    first, last = profile.layers[0], profile.layers[-1]
    change = float(profile.adjusted[-1] - profile.adjusted[0])
    lo = hi = math.nan
    if same_run(profile, study):
        assert study is not None
        shift = float(profile.baseline[-1] - profile.baseline[0])
        per = study.mean_pairwise[0][:, -1] - study.mean_pairwise[0][:, 0] - shift
        _, low, high = paired_bootstrap(per, n_boot=study.n_boot, ci=study.ci, seed=study.seed)
        lo, hi = float(low), float(high)
    rows.append(_row(
        f"C1 corrected for anisotropy: adjusted layer {last} - layer {first}", change, lo, hi,
        "the raw homogenization's growth net of each layer's anisotropy baseline (Ethayarajh "
        "2019); C1 predicts > 0",
    ))  # fmt: skip
    if standardized is not None and len(standardized.layers) > 1:
        h = standardized.per_window("homogenization")
        est = estimate([(h[:, -1] - h[:, 0])[None]])
        rows.append(_row(
            f"C1 standardized: H_W layer {standardized.layers[-1]} - layer "
            f"{standardized.layers[0]}", est.value, est.ci_low, est.ci_high,
            "the same after centring and dividing every dimension by its corpus s.d., so that "
            "a few rogue (or massive) dimensions cannot dominate the cosine (Timkey & van "
            "Schijndel 2021); C1 predicts > 0",
        ))  # fmt: skip
    if dims_dropped is not None and dims_dropped.dropped_dims is not None:
        if len(dims_dropped.layers) > 1:
            k = int(dims_dropped.dropped_dims.shape[1])
            h = dims_dropped.per_window("homogenization")
            est = estimate([(h[:, -1] - h[:, 0])[None]])
            rows.append(_row(
                f"C1 without the {k} largest dimensions: H_W layer {dims_dropped.layers[-1]} - "
                f"layer {dims_dropped.layers[0]}", est.value, est.ci_low, est.ci_high,
                f"the C1 headline with the {k} dimensions of largest mean square zeroed in each "
                "layer (massive and rogue dimensions: Sun et al. 2024, Timkey & van Schijndel "
                "2021); C1 predicts > 0",
            ))  # fmt: skip
    counted = profile.count > 0
    norms = [float(profile.norm[i][counted].mean()) for i in (0, -1)]
    rows.append(_row(
        f"residual norm growth: mean norm layer {last} / layer {first}", norms[1] / norms[0],
        math.nan, math.nan,
        "how much the residual stream grows; cosines are scale-free, but a growing shared "
        "component (anisotropy, massive activations) raises raw similarity with it",
    ))  # fmt: skip
    return rows


def summary_html(rows: list[dict[str, Any]], *, ci: float = 0.95) -> str:
    """The summary section: a table of :func:`summary_rows` with a line on how to read it."""
    pct = int(round(ci * 100))

    def num(v: float) -> str:
        return "" if math.isnan(v) else f"{v:+.4f}" if abs(v) < 100 else f"{v:.1f}"

    def interval(low: float, high: float) -> str:
        return "" if math.isnan(low) else f"[{num(low)}, {num(high)}]"

    body = "".join(
        "<tr>"
        f"<td>{html.escape(r['measure'])}</td><td>{num(r['value'])}</td>"
        f"<td>{interval(r['ci_low'], r['ci_high'])}"
        f"</td><td>{html.escape(r['sign'])}</td><td>{html.escape(r.get('verdict', ''))}</td>"
        f"<td>{html.escape(r['reading'])}</td>"
        "</tr>"
        for r in rows
    )
    return f"""
<h2>Summary</h2>
<p class="note">The headline numbers of the sections below, each with its {pct}% interval over
windows (the unit of replication for one model; another training run needs seeds, see
homoglens compare). A sign is read from the interval only; verdicts (holds / equivalent to no
effect / fails / inconclusive; "possibly negligible" where a significant interval reaches inside
the SESOI) only where a claim is tested against a reference (a start-of-sequence contrast is
descriptive; only a model-matched or NoPE null speaks of positional bias). Details,
all layers and CSVs are in each section.</p>
<table class="dataframe summary"><thead><tr><th>measure</th><th>value</th>
<th>{pct}% interval</th><th>sign</th><th>verdict</th><th>what it means</th></tr></thead>
<tbody>{body}</tbody></table>
"""


def with_contents(body: str) -> str:
    """Give every ``<h2>`` of ``body`` an id and put a table of contents linking them first."""
    entries: list[tuple[str, str]] = []

    def anchor(match: re.Match[str]) -> str:
        text = match.group(1)
        plain = html.unescape(re.sub(r"<[^>]+>", "", text))
        slug = re.sub(r"[^a-z0-9]+", "-", plain.lower()).strip("-") or "section"
        base, n = slug, 2
        while any(slug == s for s, _ in entries):
            slug, n = f"{base}-{n}", n + 1
        entries.append((slug, plain))
        return f'<h2 id="{slug}">{text}</h2>'

    body = re.sub(r"<h2>(.*?)</h2>", anchor, body, flags=re.S)
    if len(entries) < 2:
        return body
    links = "".join(f'<li><a href="#{s}">{html.escape(t)}</a></li>' for s, t in entries)
    return f'<nav class="contents"><h2>Contents</h2><ol>{links}</ol></nav>\n{body}'


def edge_intervals(
    edge: Any, profile: HomogenizationProfile, study: PositionAblationStudy | None, k: int
) -> Any:
    """``profile.edge_summary(k)`` with percentile bootstrap intervals over sequences on
    ``first_minus_middle`` and ``last_minus_middle`` (columns ``*_ci_low`` / ``*_ci_high``),
    from the per-sequence ``to_others`` of the study's intact run; NaN without a study (a
    profile keeps sums only) or when its layers differ from the profile's."""
    from homoglens.ablation.result import paired_bootstrap

    edge = edge.copy()
    names = ("first_minus_middle", "last_minus_middle")
    for name in names:
        edge[f"{name}_ci_low"] = math.nan
        edge[f"{name}_ci_high"] = math.nan
    if not same_run(profile, study):
        return edge
    assert study is not None
    counted = (profile.count > 0).nonzero().flatten()
    others = study.to_others[0]  # [batch layer pos], NaN where a sequence has no token
    if others.shape[-1] < int(counted.max()) + 1:
        return edge
    groups = {"first": counted[:k], "middle": counted[k:-k], "last": counted[-k:]}
    mean = {g: others[:, :, pos].double().nanmean(-1) for g, pos in groups.items()}
    opts = {"n_boot": study.n_boot, "ci": study.ci, "seed": study.seed}
    for name, g in zip(names, ("first", "last"), strict=True):
        _, low, high = paired_bootstrap(mean[g] - mean["middle"], **opts)
        edge[f"{name}_ci_low"] = low.numpy()
        edge[f"{name}_ci_high"] = high.numpy()
    return edge
