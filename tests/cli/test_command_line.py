"""The `homoglens profile` command end to end on a tiny offline model."""

from __future__ import annotations

import json
import os
from pathlib import Path

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
    assert sim.centre is None  # uncentred: the SP readings mean something
    assert "three readings" in html and (out / "readings.csv").is_file()
    summary = (out / "summary.csv").read_text()
    assert "verdict" in summary.splitlines()[0]
    # the CLI's offset readings are a start-of-sequence contrast, never called a causal null
    assert "model - same tokens later (start-of-sequence contrast)" in summary
    assert "causal null" not in summary
    # beside it, the positional attribution against the model-matched null, with its loss cost
    assert "model - positions removed (positional attribution, model-matched null)" in summary
    assert "the model-matched null's cost" in summary and (out / "readings_1.csv").is_file()
    assert "Positional attribution" in html and "The null's cost" in html
    assert (out / "similarity_edge_excess.csv").is_file() and (
        out / "figures/similarity.png"
    ).is_file()
    assert prof.unit_effective_rank is not None and prof.matrix_entropy_no_first is not None
    assert "Attention bias (first)" in html and "Context-task costs" in html
    from homoglens import AttentionBiasStudy

    biased = AttentionBiasStudy.load(out / "attention_bias")
    assert biased.strengths == (-1.0, -0.25, 0.0, 0.25, 1.0) and biased.n_sequences == 6


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


def test_a_family_outside_the_table_gets_a_report_without_ablations(tmp_path) -> None:
    from helpers import outside_the_table

    out = tmp_path / "granite-report"
    model = outside_the_table(tmp_path / "granite")
    result = run(
        "profile",
        "--model",
        model,
        "--n-seq",
        "3",
        "--seq-len",
        "16",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert "GraniteForCausalLM is not in the architecture table" in result.output
    page = (out / "report.html").read_text()
    assert "GraniteForCausalLM" in page and "Positional ablations" not in page


def _cli(*args):
    from click.testing import CliRunner

    from homoglens.cli import main

    return CliRunner().invoke(main, list(args))


def test_cli_out_paths_are_checked_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    (tmp_path / "afile").write_text("x")
    for out in ("link", "afile/sub"):
        result = CliRunner().invoke(main, ["compare", "--n-seq", "2", "--out", str(tmp_path / out)])
        assert result.exit_code != 0 and "Error:" in result.output, out
        assert not isinstance(result.exception, OSError)
    result = CliRunner().invoke(main, ["train", "--steps", "1", "--out", str(tmp_path / "afile")])
    assert result.exit_code != 0 and "is a file" in result.output


def test_overwrite_never_deletes_before_success_nor_protected_folders(tmp_path, monkeypatch):
    keep = tmp_path / "work"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    monkeypatch.chdir(keep)
    for out in (".", "..", str(keep)):
        result = CliRunner().invoke(
            main, ["profile", "--model", "/nope", "--out", out, "--overwrite", "--no-progress"]
        )
        assert result.exit_code == 1 and "never replaces" in result.output
    assert (keep / "notes.txt").read_text() == "precious"
    old = keep / "r1"
    old.mkdir()
    (old / "report.html").write_text("previous report")
    result = CliRunner().invoke(
        main, ["profile", "--model", "/nope", "--out", "r1", "--overwrite", "--no-progress"]
    )
    assert result.exit_code == 1
    assert (old / "report.html").read_text() == "previous report"  # failed run: untouched
    assert sorted(p.name for p in keep.iterdir()) == ["notes.txt", "r1"]  # no leftovers


def test_report_files_are_readable_by_group_and_others(tmp_path):
    out = tmp_path / "rep"
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "--model",
            str(tiny_model_folder("gpt2")),
            "--n-seq",
            "2",
            "--seq-len",
            "12",
            "--no-ablation",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    umask = os.umask(0)
    os.umask(umask)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~umask
    assert ((out / "profile" / "profile.safetensors").stat().st_mode & 0o777) == 0o666 & ~umask


def test_short_windows_with_exclude_first_still_write_a_report(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "--model",
            str(tiny_model_folder("gpt2")),
            "--n-seq",
            "2",
            "--seq-len",
            "3",
            "--exclude-first",
            "--no-ablation",
            "--out",
            str(tmp_path / "r"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Too few counted positions" in (tmp_path / "r" / "report.html").read_text()
    assert "no sinks section" in result.output


def test_cli_refuses_a_non_empty_output_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["compare", "--n-seq", "2", "--out", str(out)])
    assert result.exit_code != 0 and "--overwrite" in result.output
    assert (out / "keep.txt").read_text() == "mine"


def test_train_cli_with_invalid_sizes_leaves_no_folder(tmp_path) -> None:
    from click.testing import CliRunner

    from homoglens.cli import main

    out = tmp_path / "models"
    result = CliRunner().invoke(
        main,
        ["train", "--variant", "learned", "--d-model", "30", "--n-heads", "4", "--out", str(out)],
    )
    assert result.exit_code != 0 and "multiple" in result.output
    assert not out.exists()


def test_a_full_disk_is_a_clear_cli_error(tmp_path, monkeypatch) -> None:
    import errno

    import homoglens.report

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r"))

    monkeypatch.setattr(homoglens.report, "write_profile_report", full)
    out = tmp_path / "r"
    args = ["--model", str(tiny_model_folder("gpt2")), "--n-seq", "2", "--seq-len", "16"]
    result = _cli("profile", *args, "--out", str(out), "--no-progress", "--no-ablation")
    assert result.exit_code == 1 and "No space left on device" in result.output
    assert isinstance(result.exception, SystemExit)  # a message, not a traceback
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_world_size_without_rank_is_a_clear_cli_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    args = ["--model", str(tiny_model_folder("gpt2")), "--n-seq", "2", "--seq-len", "16"]
    result = _cli("profile", *args, "--out", str(tmp_path / "r"), "--no-progress")
    assert result.exit_code == 1 and "torchrun" in result.output and "RANK" in result.output
    assert isinstance(result.exception, SystemExit)


def test_bias_and_length_commands_write_their_reports(tmp_path) -> None:
    from homoglens import AttentionBiasStudy, LengthStudy

    model = str(tiny_model_folder("llama"))
    common = ("--model", model, "--n-seq", "6", "--seq-len", "24", "--no-progress", "--edge-k", "2")
    result = run(
        "bias",
        *common,
        "--seq-len",
        "24",
        "--kind",
        "recent",
        "--window",
        "3",
        "--strengths",
        "-1,0,1",
        "--layers",
        "1",
        "--out",
        str(tmp_path / "b"),
    )
    assert result.exit_code == 0, result.output
    study = AttentionBiasStudy.load(tmp_path / "b" / "attention_bias")
    assert study.kind == "recent" and study.blocks == (1,) and study.window == 3
    assert "Slope at zero" in (tmp_path / "b" / "report.html").read_text()
    result = run(
        "length", *common, "--lengths", "12,24", "--lags", "1,2", "--out", str(tmp_path / "l")
    )
    assert result.exit_code == 0, result.output
    lengths = LengthStudy.load(tmp_path / "l" / "lengths")
    assert lengths.lengths == (12, 24) and lengths.lags == (1, 2)
    bad = CliRunner().invoke(
        main, ["bias", *common, "--strengths", "1,x", "--out", str(tmp_path / "x")]
    )
    assert bad.exit_code != 0 and "comma-separated numbers" in bad.output
    bad = CliRunner().invoke(
        main,
        [
            "bias",
            *common,
            "--kind",
            "temperature",
            "--strengths",
            "0,1",
            "--out",
            str(tmp_path / "y"),
        ],
    )
    assert bad.exit_code != 0 and "must be > 0" in bad.output
