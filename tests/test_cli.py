"""The `homoglens profile` command end to end on a tiny offline model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from homoglens import (
    HomogenizationProfile,
    PositionalPatchingResult,
    PositionalSimilarity,
    SinkAnalysis,
)
from homoglens.cli import main
from homoglens.testing import tiny_model_folder


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_profile_writes_report(tmp_path) -> None:
    out = tmp_path / "report"
    result = run(
        "profile",
        "--model",
        str(tiny_model_folder("gpt2")),
        "--n-seq",
        "6",
        "--seq-len",
        "32",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    for name in (
        "report.html",
        "profile.csv",
        "edge_summary.csv",
        "profile/profile.json",
        "profile/profile.safetensors",
        "figures/curves.png",
        "figures/heatmap.png",
        "figures/curves_adjusted.png",
    ):
        assert (out / name).is_file(), name
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "Edge versus middle" in html
    assert "Provenance" in html and "raw" in html
    prof = HomogenizationProfile.load(out / "profile")
    assert prof.n_sequences == 6 and prof.n_tokens == 6 * 32
    assert prof.effective_rank is not None
    meta = json.loads((out / "profile" / "profile.json").read_text())
    assert meta["provenance"]["bos"] is True
    assert "Attention sinks" in html and "Barbero" in html  # the sinks section (default on)
    sinks = SinkAnalysis.load(out / "sinks")
    assert sinks.scores.n_sequences == 6 and sinks.exact.n_sequences == 6
    assert len(sinks.exact.heads) == 3 and sinks.fast.method == "fast"
    assert "Activation patching" in html
    patched = PositionalPatchingResult.load(out / "patching_resid_pre")
    entry = PositionalPatchingResult.load(out / "patching_positions")
    assert entry.component == "positions" and entry.layers == (0,)  # learned: embeddings only
    assert patched.metrics == ("mean_pairwise", "loss") and len(patched.cells) == 8
    assert patched.provenance.data and patched.layers == (0, 1)
    assert "Position-resolved similarity" in html and "matched" in html
    sim = PositionalSimilarity.load(out / "similarity")
    assert sim.n_sequences == 6 and sim.first_position == 1 and sim.has_pseudo_values
    assert (out / "similarity_edge_excess.csv").is_file() and (
        out / "figures/similarity.png"
    ).is_file()
    assert prof.unit_effective_rank is not None and prof.matrix_entropy_no_first is not None


def test_patch_command(tmp_path) -> None:
    out = tmp_path / "patch"
    result = run(
        "patch",
        "--model",
        str(tiny_model_folder("neox")),
        "--component",
        "head",
        "--metrics",
        "loss,first_excess",
        "--patch-n-seq",
        "2",
        "--n-seq",
        "3",
        "--seq-len",
        "20",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert (out / "patching.csv").is_file() and (out / "figures" / "patching_loss.png").is_file()
    loaded = PositionalPatchingResult.load(out / "patching")
    assert loaded.cell_axis == "head_index" and loaded.metrics == ("loss", "first_excess")
    bad = run(
        "patch",
        "--model",
        str(tiny_model_folder("neox")),
        "--component",
        "resid_mid",
        "--n-seq",
        "2",
        "--seq-len",
        "20",
        "--out",
        str(tmp_path / "bad"),
        "--no-progress",
    )
    assert bad.exit_code != 0 and "resid_mid" in bad.output and not (tmp_path / "bad").exists()


def test_sinks_command_writes_its_report(tmp_path) -> None:
    out = tmp_path / "sinks"
    args = ["--n-seq", "4", "--seq-len", "24", "--out", str(out), "--no-progress"]
    result = run("sinks", "--model", str(tiny_model_folder("llama")), "--sink-top-k", "2", *args)
    assert result.exit_code == 0, result.output
    for name in (
        "report.html",
        "sink_heads.csv",
        "sink_attribution_exact.csv",
        "figures/sink_scores.png",
        "sinks/exact/attribution.json",
    ):
        assert (out / name).is_file(), name
    html = (out / "report.html").read_text()
    assert "Strongest sink heads" in html and "Massive activations" in html
    analysis = SinkAnalysis.load(out / "sinks")
    assert len(analysis.exact.heads) == 2 and analysis.exact.joint_delta is not None
    bad = run(
        "sinks",
        "--model",
        str(tiny_model_folder("llama")),
        "--seq-len",
        "3",
        *args[:2],
        "--no-progress",
        "--out",
        str(tmp_path / "bad"),
    )
    assert bad.exit_code != 0 and "too short" in bad.output
    assert not (tmp_path / "bad").exists()


def test_profile_refuses_non_empty_out_unless_overwrite(tmp_path) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = [
        "profile",
        "--model",
        str(tiny_model_folder("neox")),
        "--n-seq",
        "2",
        "--seq-len",
        "16",
        "--out",
        str(out),
        "--no-progress",
        "--no-effective-rank",
    ]
    result = run(*args)
    assert result.exit_code != 0 and "--overwrite" in result.output
    assert (out / "keep.txt").exists()
    result = run(*args, "--overwrite")
    assert result.exit_code == 0, result.output
    assert not (out / "keep.txt").exists() and (out / "report.html").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "no-such-model"], "unknown model"),
        (["--seq-len", "5000"], "n_ctx"),
    ],
)
def test_profile_errors_are_clean(tmp_path, args, message) -> None:
    base = [
        "profile",
        "--model",
        str(tiny_model_folder("gpt2")),
        "--n-seq",
        "2",
        "--out",
        str(tmp_path / "o"),
        "--no-progress",
    ]
    result = run(*base, *args)
    assert result.exit_code == 1 and message in result.output
    assert "Traceback" not in result.output


def test_text_option(tmp_path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    result = run(
        "profile",
        "--model",
        str(tiny_model_folder("llama")),
        "--text",
        str(text),
        "--n-seq",
        "3",
        "--seq-len",
        "20",
        "--out",
        str(tmp_path / "o"),
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert "text file t.txt" in (tmp_path / "o" / "report.html").read_text()


def test_ablate_command(tmp_path) -> None:
    out = tmp_path / "abl"
    result = run(
        "ablate",
        "--model",
        str(tiny_model_folder("neox")),
        "--modes",
        "zero,permute",
        "--positions",
        "0,1,2",
        "--n-seq",
        "4",
        "--seq-len",
        "16",
        "--out",
        str(out),
        "--no-progress",
        "--no-effective-rank",
    )
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert "Positional ablations" in html and "permute" in html
    assert (out / "study" / "study.json").is_file() and (out / "ablation_loss.csv").is_file()
    bad = run(
        "ablate",
        "--model",
        str(tiny_model_folder("neox")),
        "--modes",
        "mean",
        "--n-seq",
        "2",
        "--seq-len",
        "8",
        "--out",
        str(tmp_path / "bad"),
        "--no-progress",
    )
    assert bad.exit_code == 1 and "rotary" in bad.output


def test_profile_without_ablation(tmp_path) -> None:
    out = tmp_path / "plain"
    result = run(
        "profile",
        "--model",
        str(tiny_model_folder("gpt2")),
        "--no-ablation",
        "--n-seq",
        "3",
        "--seq-len",
        "16",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert not (out / "study").exists()
    assert "Positional ablations" not in (out / "report.html").read_text()
