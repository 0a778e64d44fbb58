"""The report's opening: the summary rows against the results they quote, the edge table's
intervals against a per-sequence recomputation, the table of contents, the massive section."""

from __future__ import annotations

import re
import warnings
from typing import get_args

import pytest
import torch

from helpers import BACKENDS
from homoglens import (
    corpus_windows,
    massive_ablation_study,
    position_ablation_study,
)
from homoglens.core.types import Verdict
from homoglens.report import write_profile_report
from homoglens.report.summary import edge_intervals, summary_rows, with_contents


@pytest.fixture(scope="module")
def results(get_model):
    model = get_model("gpt2", BACKENDS[-1])
    windows = corpus_windows(model, n_seq=6, seq_len=24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = position_ablation_study(model, windows, progress=False, n_boot=200)
        massive = massive_ablation_study(
            model, windows[2:], reference=windows[:2], layer=1, dims=[3], progress=False,
            n_boot=200,
        )  # fmt: skip
    return windows, study, massive


def test_summary_rows_quote_their_results(results) -> None:
    _, study, massive = results
    profile = study.profiles["none"]
    rows = {r["measure"]: r for r in summary_rows(profile, study=study, massive=massive)}
    raw = next(r for m, r in rows.items() if m.endswith("(raw)"))
    assert raw["value"] == pytest.approx(float(profile.mean_pairwise[-1]), abs=1e-12)
    assert raw["ci_low"] <= raw["value"] <= raw["ci_high"]
    adjusted = next(r for m, r in rows.items() if m.startswith("adjusted"))
    assert adjusted["value"] == pytest.approx(float(profile.adjusted[-1]), abs=1e-12)
    loss = study.loss_table().set_index("mode").loc["zero"]
    c3 = next(r for m, r in rows.items() if m.startswith("next-token loss: positions zeroed"))
    assert c3["value"] == pytest.approx(loss["diff_vs_none"], abs=1e-9)
    assert (c3["ci_low"], c3["ci_high"]) == pytest.approx(
        (loss["diff_ci_low"], loss["diff_ci_high"]), abs=1e-9
    )
    for r in rows.values():
        assert r["sign"] in {"interval above 0", "interval below 0", "interval contains 0",
                             "no interval"}  # fmt: skip


def test_edge_intervals_match_a_per_sequence_recomputation(results) -> None:
    """Equal windows: the mean over sequences of each one's (first k - middle) to_others is the
    pooled edge value, and the interval brackets it."""
    windows, study, _ = results
    profile = study.profiles["none"]
    k = 3
    edge = edge_intervals(profile.edge_summary(k), profile, study, k)
    others = study.to_others[0].double()  # [seq layer pos]
    per_seq = others[:, :, :k].mean(-1) - others[:, :, k:-k].mean(-1)
    assert torch.allclose(
        torch.tensor(edge["first_minus_middle"].to_numpy()), per_seq.mean(0), atol=1e-6
    )
    assert (edge["first_minus_middle_ci_low"] <= edge["first_minus_middle"] + 1e-12).all()
    assert (edge["first_minus_middle"] <= edge["first_minus_middle_ci_high"] + 1e-12).all()
    bare = edge_intervals(profile.edge_summary(k), profile, None, k)
    assert bare["last_minus_middle_ci_low"].isna().all()  # no per-sequence values, no interval


def test_contents_link_every_section_once() -> None:
    body = with_contents("<h2>Summary</h2><p>x</p><h2>A &amp; B</h2><h2>Summary</h2>")
    ids = re.findall(r'<h2 id="([^"]+)">', body)
    assert ids == ["summary", "a-b", "summary-2"]
    assert all(f'href="#{i}"' in body for i in ids)


def test_report_opens_with_summary_and_holds_the_massive_section(results, tmp_path) -> None:
    _, study, massive = results
    page = write_profile_report(study.profiles["none"], tmp_path, study=study, massive=massive)
    text = page.read_text()
    assert text.index('<nav class="contents">') < text.index('id="summary"')
    assert text.index('id="summary"') < text.index('<h2 id="homogenization-by-layer')
    assert "Massive activations set to their mean or to zero" in text
    assert "Anisotropy-adjusted" in text
    assert (tmp_path / "summary.csv").exists()
    assert (tmp_path / "massive_ablation_loss.csv").exists()


def test_studies_from_other_windows_or_of_the_other_kind_are_refused_or_not_quoted(
    results, get_model, tmp_path
) -> None:
    from homoglens import InvalidInputError

    windows, study, massive = results
    other = study.profiles["none"]
    model = get_model("gpt2", BACKENDS[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        foreign = position_ablation_study(
            model, corpus_windows(model, n_seq=4, seq_len=24), progress=False, n_boot=50
        )
    rows = summary_rows(other, study=foreign)
    raw = next(r for r in rows if r["measure"].endswith("(raw)"))
    assert raw["sign"] == "no interval"  # another study's windows give this profile no interval
    edge = edge_intervals(other.edge_summary(3), other, foreign, 3)
    assert edge["first_minus_middle_ci_low"].isna().all()
    with pytest.raises(InvalidInputError, match="massive="):
        write_profile_report(other, tmp_path / "a", study=massive)
    with pytest.raises(InvalidInputError, match="massive_ablation_study"):
        write_profile_report(other, tmp_path / "b", massive=study)
    with pytest.raises(InvalidInputError, match="HomogenizationProfile"):
        write_profile_report(study, tmp_path / "c")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="sinks= takes a SinkAnalysis"):
        write_profile_report(other, tmp_path / "d", sinks=study)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="patching= takes"):
        write_profile_report(other, tmp_path / "e", patching=[other])  # type: ignore[list-item]
    assert not any((tmp_path / n).exists() for n in "abcde")


def test_summary_gives_calibrated_verdicts_adjusted_c3_and_no_mean_headline(
    results, get_model
) -> None:
    """Issue 38: the C2 rows are the three readings against the causal null, each with a
    verdict; C3 is the change of the adjusted (not raw) homogenization; the massive "set to
    mean" row (0 by construction: position 0 is the same BOS in every window) is no headline;
    every position-resolved row names the same (last) layer."""
    from homoglens import calibrated_readings, positional_similarity

    windows, study, massive = results
    model = get_model("gpt2", BACKENDS[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = positional_similarity(model, windows, edge_k=3, progress=False)
        readings = calibrated_readings(model, windows, edge_k=3, progress=False)
        standardized = positional_similarity(
            model, windows, edge_k=3, centre="global", standardize=True, progress=False
        )
        dims_dropped = positional_similarity(model, windows, edge_k=3, drop_dims=3, progress=False)
    profile = study.profiles["none"]
    rows = summary_rows(
        profile, study=study, similarity=sim, massive=massive, readings=readings,
        standardized=standardized, dims_dropped=dims_dropped,
    )  # fmt: skip
    measures = [r["measure"] for r in rows]  # the corrections beside the C1 headline
    for start in (
        "C1 corrected for anisotropy",
        "C1 standardized",
        "C1 without the 3 largest dimensions",
        "residual norm growth",
    ):
        assert any(m.startswith(start) for m in measures), start
    h = dims_dropped.per_window("homogenization")
    row = next(r for r in rows if r["measure"].startswith("C1 without"))
    assert row["value"] == pytest.approx(float((h[:, -1] - h[:, 0]).mean()), abs=1e-12)
    anisotropy = next(r for r in rows if r["measure"].startswith("C1 corrected"))
    assert anisotropy["value"] == pytest.approx(
        float(profile.adjusted[-1] - profile.adjusted[0]), abs=1e-12
    )
    assert anisotropy["ci_low"] < anisotropy["value"] < anisotropy["ci_high"]
    c2 = [r for r in rows if r["measure"].startswith("C2 (")]
    assert len(c2) == 5
    assert all(r["verdict"] in get_args(Verdict) for r in c2)
    # the offset design is a start-of-sequence contrast, never a causal null (issue 51)
    assert all("start-of-sequence contrast" in r["measure"] for r in c2)
    assert not any("causal null" in r["measure"] for r in c2)
    table = readings.table()
    assert [r["value"] for r in c2] == pytest.approx(table["difference"].tolist(), abs=1e-12)
    assert not any("uncalibrated" in r["measure"] for r in rows)
    c3 = next(r for r in rows if "positions zeroed - intact (C3)" in r["measure"])
    assert c3["measure"].startswith("adjusted homogenization")
    m = study.modes.index("zero")
    want = float(
        (study.mean_pairwise[m][:, -1] - study.mean_pairwise[0][:, -1]).mean()
        - (study.profiles["zero"].baseline[-1] - study.profiles["none"].baseline[-1])
    )
    assert c3["value"] == pytest.approx(want, abs=1e-6)
    assert not any("set to mean" in r["measure"] for r in rows)
    layers = {int(x) for r in rows for x in re.findall(r"layer (\d+)", r["measure"])}
    assert layers == {profile.layers[-1]} | {sim.layers[0]}  # C1 reads last minus first
