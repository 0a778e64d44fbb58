"""compare_models on the shipped tiny models: paired statistics checked against Hugging Face
forward passes and hand computations, invariants of the NoPE model, claims, persistence, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from homoglens import (
    SHIPPED_MODELS,
    InvalidInputError,
    ModelComparison,
    compare_models,
    load_corpus,
    load_model,
)
from homoglens.cli import main
from homoglens.comparison import STATISTICS, _slope
from homoglens.models import shipped_model_folder
from homoglens.testing import tiny_model_folder
from homoglens.training import heldout_loss, heldout_windows

_CACHE: dict[str, ModelComparison] = {}


@pytest.fixture
def comparison(backend: str) -> ModelComparison:
    if backend not in _CACHE:
        models = {name: load_model(name, backend=backend, device="cpu") for name in SHIPPED_MODELS}
        _CACHE[backend] = compare_models(models, n_seq=12, n_boot=200, progress=False)
    return _CACHE[backend]


def test_loss_matches_hugging_face(comparison: ModelComparison) -> None:
    tokenizer = load_model(SHIPPED_MODELS[0], backend="bridge", device="cpu").tokenizer
    windows = heldout_windows(tokenizer, n_seq=12, seq_len=128).tokens
    for label in SHIPPED_MODELS:
        hf = AutoModelForCausalLM.from_pretrained(str(shipped_model_folder(label))).eval()
        with torch.no_grad():
            logits = hf(windows).logits[:, :-1]
        want = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), windows[:, 1:], reduction="none"
        ).mean(1)
        got = comparison.per_sequence(label)["loss"]
        assert torch.allclose(got.float(), want, atol=1e-4), label


def test_per_sequence_statistics_by_hand(comparison: ModelComparison) -> None:
    label = SHIPPED_MODELS[1]
    study = comparison.studies[label]
    seq = comparison.per_sequence(label)
    assert set(seq) == set(STATISTICS)
    others = study.to_others[0, 3, -1].double()  # sequence 3, last layer entry
    k = comparison.edge_k
    middle = others[k + 1 : 128 - k].mean()
    assert seq["first_token_excess"][3].item() == pytest.approx((others[0] - middle).item())
    assert seq["first_excess"][3].item() == pytest.approx(
        (others[1 : k + 1].mean() - middle).item()
    )
    assert seq["last_excess"][3].item() == pytest.approx((others[-k:].mean() - middle).item())
    baseline = study.profiles["none"].baseline.double()
    pairwise = study.mean_pairwise[0].double()
    assert torch.allclose(seq["adjusted_last"], pairwise[:, -1] - baseline[-1])
    assert torch.allclose(seq["adjusted_depth_slope"], _slope(pairwise) - _slope(baseline))
    alpha = comparison.sink_importance[label]
    assert torch.allclose(alpha.mean(0), comparison.sinks[label].importance, atol=1e-6)
    assert seq["sink_rate"].mean().item() == pytest.approx(comparison.sinks[label].sink_rate)


def test_slope_is_least_squares() -> None:
    assert _slope(torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 3.0, 1.0, -1.0]])).tolist() == [1, -2]
    assert _slope(torch.tensor([2.0, 2.0, 2.0])).item() == 0


def test_ablations_change_nothing_without_positions(comparison: ModelComparison) -> None:
    effects = comparison.ablation_effects()
    nope = effects[effects["model"] == "homoglens/tiny-none"]
    assert len(nope) > 0 and (nope[["diff", "ci_low", "ci_high"]].abs() < 1e-6).all().all()
    learned = effects[(effects["model"] == "homoglens/tiny-learned") & (effects["mode"] == "zero")]
    assert learned.set_index("statistic").loc["loss", "ci_low"] > 0  # positions carry information


def test_differences_are_paired(comparison: ModelComparison) -> None:
    diff = comparison.differences(reference="homoglens/tiny-none")
    assert set(diff["model"]) == {"homoglens/tiny-learned", "homoglens/tiny-rotary"}
    row = diff[(diff["model"] == "homoglens/tiny-rotary") & (diff["statistic"] == "loss")]
    a = comparison.per_sequence("homoglens/tiny-rotary")["loss"]
    b = comparison.per_sequence("homoglens/tiny-none")["loss"]
    assert row["diff"].item() == pytest.approx((a - b).mean().item())
    summary = comparison.summary()
    assert (summary["ci_low"] <= summary["value"] + 1e-12).all()
    assert (summary["value"] <= summary["ci_high"] + 1e-12).all()


def test_claims_verdicts_follow_their_intervals(comparison: ModelComparison) -> None:
    claims = comparison.claims()
    assert comparison.no_positions == "homoglens/tiny-none"
    assert set(claims["claim"]) == {"C1", "C2", "C3"}
    for row in claims.itertuples():
        above, below = row.ci_low > 0, row.ci_high < 0
        want = (
            "holds"
            if (above and row.predicted == ">0") or (below and row.predicted == "<0")
            else "fails"
            if above or below
            else "inconclusive"
        )
        assert row.verdict == want, row
        assert row.ci_low <= row.value <= row.ci_high


def test_save_load_round_trip(comparison: ModelComparison, tmp_path: Path) -> None:
    comparison.save(tmp_path / "c")
    back = ModelComparison.load(tmp_path / "c")
    assert back.labels == comparison.labels and back.no_positions == comparison.no_positions
    assert back.claims().equals(comparison.claims())


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(InvalidInputError, match="tokenizer"):
        compare_models([SHIPPED_MODELS[0], str(tiny_model_folder("gpt2"))], n_seq=2, progress=False)
    with pytest.raises(InvalidInputError, match="no_positions"):
        compare_models(SHIPPED_MODELS[:1], n_seq=2, no_positions="x", progress=False)
    with pytest.raises(InvalidInputError, match="edge_k"):
        compare_models(SHIPPED_MODELS[:1], n_seq=2, edge_k=64, progress=False)
    with pytest.raises(InvalidInputError, match="non-empty"):
        compare_models([], progress=False)
    with pytest.raises(InvalidInputError, match="n_seq"):
        heldout_windows(load_model(SHIPPED_MODELS[0]).tokenizer, n_seq=10**6)


def test_heldout_split_covers_the_corpus() -> None:
    whole, train, held = (load_corpus(n) for n in ("austen", "austen-train", "austen-heldout"))
    assert held.startswith("SENSE AND SENSIBILITY") and "SENSE AND SENSIBILITY" not in train
    assert whole == train + "\n\n" + held


def test_cli_compare_writes_report(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        main,
        ["compare", "--n-seq", "6", "--n-boot", "50", "--no-progress", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert "Claims C1-C3" in html and "homoglens/tiny-none" in html
    back: Any = ModelComparison.load(out / "comparison")
    assert back.n_sequences == 6


def test_heldout_windows_reproduce_the_recorded_heldout_loss() -> None:
    name = "homoglens/tiny-rotary"
    record = json.loads((shipped_model_folder(name) / "training.json").read_text())
    windows = heldout_windows(load_model(name, backend="bridge").tokenizer, seq_len=128)
    assert windows.tokens.numel() == (record["heldout_tokens"] - 1) // 128 * 128
    hf = AutoModelForCausalLM.from_pretrained(str(shipped_model_folder(name))).eval()
    flat = windows.tokens.flatten()
    loss = heldout_loss(hf, torch.cat([flat, flat[:1]]), 128)  # + 1: the last target
    assert loss == pytest.approx(record["heldout_loss"], abs=1e-5)
    spaced = heldout_windows(load_model(name, backend="bridge").tokenizer, n_seq=4)
    assert torch.equal(spaced.tokens, windows.tokens[torch.arange(4) * len(windows.tokens) // 4])
