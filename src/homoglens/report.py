"""Write a homogenization profile as files: safetensors + JSON, tidy CSV, PNG figures, and one
self-contained HTML report (figures embedded, no network needed to view it)."""

from __future__ import annotations

import base64
import html
import io
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homoglens.errors import InvalidInputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from homoglens.results import HomogenizationProfile, PositionAblationStudy

__all__ = ["prepare_output_dir", "write_profile_report"]

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


def prepare_output_dir(out: str | Path, *, overwrite: bool) -> Path:
    """Create ``out``; refuse a non-empty folder unless ``overwrite`` (then clear it).

    Raises:
        InvalidInputError: ``out`` is a file, or is not empty and ``overwrite`` is False.
    """
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"--out {str(folder)!r} is a file; give a folder")
    if folder.exists() and any(folder.iterdir()):
        if not overwrite:
            raise InvalidInputError(
                f"output folder {str(folder)!r} is not empty; choose another --out or pass "
                "--overwrite to replace its contents"
            )
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
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

    layers["cell"] = [cell(r) for r in layers.itertuples()]
    wide = layers.pivot(index="layer", columns="mode", values="cell")[list(study.modes)]
    pct = int(round(study.ci * 100))
    settings = html.escape(", ".join(f"{k}={v}" for k, v in study.settings.items()))
    return f"""
<h2>Positional ablations: homogenization and loss</h2>
<p class="note">Same sequences under each mode ({", ".join(study.modes)}); {settings}.
'zero' removes the explicit positional signal (learned: zero embedding; rotary: no rotation),
'permute' gives token i the signal of a random position, 'shift' of position i + shift.
NoPE models still infer position from the causal mask (Kazemnejad et al. 2023), so this removes
explicit positional information only. Intervals: {pct}% paired bootstrap over sequences
({study.n_boot} resamples).</p>
<img alt="ablation" src="data:image/png;base64,{figure}">
<h3>Next-token loss (nats/token)</h3>
{loss.to_html(index=False, float_format=lambda v: f"{v:.4f}")}
<h3>Mean pairwise cosine by layer: value (difference to none [{pct}% CI])</h3>
{wide.to_html()}
"""


def write_profile_report(
    profile: HomogenizationProfile,
    out: Path,
    *,
    edge_k: int = 8,
    title: str | None = None,
    study: PositionAblationStudy | None = None,
) -> Path:
    """Write profile files, figures and ``report.html`` into the (prepared) folder ``out``.

    Files: ``profile/profile.safetensors`` + ``profile/profile.json`` (reload with
    ``HomogenizationProfile.load``), ``profile.csv`` (tidy), ``edge_summary.csv``,
    ``figures/curves.png``, ``figures/curves_adjusted.png``, ``figures/heatmap.png``,
    ``report.html``; with a ``study``: ``study/``, ``ablation_loss.csv``,
    ``ablation_layers.csv``, ``figures/ablation.png`` and a report section.

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

    k = min(edge_k, max(1, (int((profile.count > 0).sum()) - 1) // 2))
    edge = profile.edge_summary(k)
    edge.to_csv(out / "edge_summary.csv", index=False)
    per_layer = profile.to_pandas()
    per_layer = per_layer[per_layer["pos"].isna()].pivot(
        index="layer", columns="metric", values="value"
    )

    prov = asdict(profile.provenance)
    prov["hook_points"] = (
        f"{prov['hook_points'][0]} ... {prov['hook_points'][-1]}" if prov["hook_points"] else ""
    )
    prov.update(n_sequences=profile.n_sequences, n_tokens=profile.n_tokens, positions=profile.n_pos)
    prov_rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in prov.items()
    )
    ablation = _study_section(study, out) if study is not None else ""
    p = profile.provenance
    heading = title or f"Token homogenization: {p.model}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(heading)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(heading)}</h1>
<p class="note">{profile.n_sequences} sequences, {profile.n_tokens} tokens; {p.backend} backend,
{p.weights} weights; BOS at position 0: {p.bos}; exclude_first: {p.exclude_first}.
Metrics are homoglens' operationalisation of token homogenization (Yusupov et al. 2025,
arXiv 2508.17126); they do not reproduce the paper's numbers. Raw cosines include anisotropy:
read them against the baseline (mean cosine between tokens of different sequences).</p>
<h2>Homogenization by layer (raw and baseline)</h2>
<img alt="curves" src="data:image/png;base64,{curves}">
<h2>Adjusted homogenization (raw minus baseline)</h2>
<img alt="adjusted" src="data:image/png;base64,{adjusted}">
<h2>Layer x position: mean cosine to the other tokens (to_others)</h2>
<img alt="heatmap" src="data:image/png;base64,{heat}">
<h2>Edge versus middle (to_others, first/last {k} positions)</h2>
{edge.to_html(index=False, float_format=lambda v: f"{v:.4f}")}
<h2>Per-layer values</h2>
{per_layer.to_html(float_format=lambda v: f"{v:.4f}")}
{ablation}
<h2>Provenance</h2>
<table>{prov_rows}</table>
<p class="note">Files beside this report: profile/ (safetensors + JSON, reload with
<code>HomogenizationProfile.load</code>), profile.csv (tidy), edge_summary.csv, figures/.</p>
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
