"""The report sections of the attention-bias study and the length study (figures embedded as
PNG, or as plotly figures in an interactive report: :func:`homoglens.report.html.figure_tag`)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from homoglens.core.errors import InvalidInputError
from homoglens.report.html import figure_tag, table_html

if TYPE_CHECKING:
    from homoglens.bias.result import AttentionBiasStudy
    from homoglens.lengths.result import LengthStudy


def bias_section(study: AttentionBiasStudy, out: Path) -> str:
    """Save an attention-bias study and return its HTML section: the dose-response figure,
    the slope at zero of each readout with its interval, and the curve of H_W."""
    study.save(out / "attention_bias")
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    figure = figure_tag(
        lambda backend: study.plot(backend=backend), figures / f"attention_bias_{study.kind}.png",
        "attention bias",
    )  # fmt: skip
    curve = study.curve("homogenization", -1)
    curve.to_csv(out / f"attention_bias_{study.kind}.csv", index=False)
    rows = []
    metrics = ["homogenization", "matched_first", "matched_last", "sp_last", "loss", "entropy"]
    if study.kind != "temperature":
        metrics.append("mass")
    for metric in metrics:
        try:
            slope = study.slope_at_zero(metric, None if metric in ("mass", "entropy") else -1)
        except InvalidInputError:
            continue
        rows.append({"metric": metric, "slope at zero": slope.central, "ci_low": slope.ci_low,
                     "ci_high": slope.ci_high, "per unit of mass": slope.per_mass,
                     "mass ci_low": slope.per_mass_ci_low, "mass ci_high": slope.per_mass_ci_high,
                     "sesoi (per mass)": slope.sesoi,
                     "verdict": slope.verdict() if metric != "mass" else "",
                     "step": slope.step, "gradient": slope.gradient,
                     "central, gradient windows": slope.central_gradient_windows,
                     })  # fmt: skip
    import pandas as pd

    slopes = pd.DataFrame(rows)
    slopes.to_csv(out / f"attention_bias_{study.kind}_slopes.csv", index=False)
    axis = "beta" if study.kind == "temperature" else "b"
    last = study.layers[-1]
    return f"""
<h2>Attention bias ({html.escape(study.kind)}): a dose-response (C2, attention reading)</h2>
<p class="note">Each row of the biased heads' attention becomes softmax(beta log A + b phi)
({html.escape(study.kind)}: {axis} = {", ".join(f"{s:g}" for s in study.strengths)}; blocks
{len(study.blocks)}, first_k={study.first_k}, window={study.window}) on the same
{study.n_sequences} windows. Readouts at residual entry {last}: H_W (mean off-diagonal W = M - C),
the distance-matched edge excess, SP; the next-token loss; and the manipulation checks (mass on
the biased keys, entropy, KL(A' || A), the dose as a perturbation size). The slope at zero is
the in-distribution answer: a central difference at the smallest +-{axis} run, with a
{int(round(study.ci * 100))}% moving-block bootstrap interval over paired windows, per unit of
{axis} and per unit of attention mass moved onto the biased keys (a nat of {axis} moves little
attention where the rows are saturated, so the verdict, against a SESOI of a tenth of the
metric's scale per unit of mass, is read per unit of mass; predicted sign &gt; 0). The gradient
(forward-mode autograd) is checked against the central difference on its own windows.</p>
{figure}
<h3>Slope at zero (per unit of {axis} and per unit of attention mass)</h3>
{table_html(slopes, missing=DASH)}
<p class="note">{_bias_slope_dashes(study)}</p>
<h3>H_W at entry {last} by strength (delta: paired change from the unbiased run)</h3>
{table_html(curve, missing=DASH)}
<p class="note">{DASH}: {axis} = {study.baseline:g} is the reference run; its delta is 0 by
construction, so it has no interval and no change per unit of mass or of KL.</p>
"""


DASH = "\u2013"
"""What an empty cell of a bias table shows (its note says why it is empty)."""


def _bias_slope_dashes(study: AttentionBiasStudy) -> str:
    """The note under the slope table: why its dashes (empty cells) are empty."""
    if study.gradient_windows:
        gradient = (
            f"gradient: the forward-mode derivative at {study.baseline:g} on the first "
            f"{study.gradient_windows} windows; a dash where a metric has none"
        )
    else:
        gradient = (
            "gradient and central, gradient windows: not computed in this report (the gradient "
            "at zero is taken only on request: <code>homoglens bias --gradient-windows N</code>)"
        )
    return (
        f"\u2013: {gradient}; an interval is a dash where the per-window values show no spread "
        "or fewer than 4 windows hold one, and the mass row has no verdict (it is the dose)."
    )


def length_section(study: LengthStudy, out: Path) -> str:
    """Save a length study and return its HTML section: curves over positions and the edge
    statistics by length."""
    study.save(out / "lengths")
    figures = out / "figures"
    figures.mkdir(exist_ok=True)
    figure = figure_tag(
        lambda backend: study.plot(backend=backend), figures / "lengths.png", "lengths"
    )
    import pandas as pd

    frames = [study.by_length(stat).assign(statistic=stat)
              for stat in ("homogenization", "matched_first", "matched_last")]  # fmt: skip
    table = pd.concat(frames, ignore_index=True)
    table.to_csv(out / "lengths.csv", index=False)
    return f"""
<h2>Over sequence length (nested prefixes of {study.n_sequences} windows)</h2>
<p class="note">One pass over windows of {max(study.lengths)} tokens; each length T in
{list(study.lengths)} is read from the first T positions (in a causal model x_p does not depend on
later tokens). An end-of-sequence effect shows as a trend over p (lag-controlled M[p, p - delta],
SP rising with p), not as an edge of the window.</p>
{figure}
<h3>By length, last entry</h3>
{table_html(table)}
"""
