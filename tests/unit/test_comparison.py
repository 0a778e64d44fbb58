"""compare_models on the shipped tiny models: per-window statistics checked against Hugging Face
forward passes and positional_similarity run by hand, invariants of the NoPE model, the claims
table (Holm, SESOI, primary rows, verdicts), shipped replicate statistics, persistence, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from helpers import BACKENDS
from homoglens import (
    SHIPPED_MODELS,
    InvalidInputError,
    ModelComparison,
    compare_models,
    corpus_windows,
    load_corpus,
    load_model,
    positional_similarity,
)
from homoglens.cli import main
from homoglens.comparison.measure import REPLICATED_MODELS, STATISTICS
from homoglens.core.claims import CLAIM_COLUMNS
from homoglens.core.stats import holm, verdict
from homoglens.models.loading import shipped_model_folder
from homoglens.run.data import TokenBatch
from homoglens.testing import tiny_model_folder
from homoglens.training.train import heldout_loss, heldout_windows

PLAIN = ("homoglens/tiny-learned", "homoglens/tiny-rotary", "homoglens/tiny-none")
_CACHE: dict[str, ModelComparison] = {}


@pytest.fixture
def comparison(backend: str) -> ModelComparison:
    if backend not in _CACHE:
        models = {name: load_model(name, backend=backend, device="cpu") for name in PLAIN}
        _CACHE[backend] = compare_models(models, n_seq=12, n_boot=200, progress=False)
    return _CACHE[backend]


def test_loss_matches_hugging_face(comparison: ModelComparison) -> None:
    tokenizer = load_model(PLAIN[0], backend="bridge", device="cpu").tokenizer
    windows = heldout_windows(tokenizer, n_seq=12, seq_len=128).tokens
    for label in PLAIN:
        hf = AutoModelForCausalLM.from_pretrained(str(shipped_model_folder(label))).eval()
        with torch.no_grad():
            logits = hf(windows).logits[:, :-1]
        want = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), windows[:, 1:], reduction="none"
        ).mean(1)
        got = comparison.per_sequence(label)["loss"]
        assert torch.allclose(got.float(), want, atol=1e-4), label


def test_per_window_statistics_are_those_of_positional_similarity(
    comparison: ModelComparison, backend: str
) -> None:
    label = PLAIN[1]
    seq = comparison.per_sequence(label)
    assert set(seq) == set(STATISTICS)
    model = load_model(label, backend=backend)
    windows = heldout_windows(model.tokenizer, n_seq=12)
    sim = positional_similarity(
        model, windows, centre="position", pseudo_values=True, progress=False
    )
    for stat in ("homogenization", "matched_first", "matched_last", "naive_last"):
        assert torch.allclose(seq[stat], sim.per_window(stat), atol=1e-6), stat
    # the cross-input readings come from uncentred vectors (centred by position, SP is
    # -1/(n-1) everywhere by construction)
    raw = positional_similarity(model, windows, centre=None, pseudo_values=True, progress=False)
    for stat in ("sp_first", "sp_last", "sp_mean"):
        assert torch.allclose(seq[stat], raw.per_window(stat), atol=1e-6), stat
    assert seq["sp_mean"].std(0).max() > 1e-3  # not the constant of a centred SP
    assert comparison.layers == sim.layers == (0, 1, 2, 3, 4)
    study = comparison.studies[label]
    assert torch.allclose(seq["mean_pairwise"], study.mean_pairwise[0].double())
    baseline = study.profiles["none"].baseline.double()
    assert torch.allclose(seq["adjusted_last"], seq["mean_pairwise"][:, -1] - baseline[-1])
    assert seq["sink_rate"].mean().item() == pytest.approx(comparison.sinks[label].sink_rate)


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


def test_claims_table_is_pre_declared_holm_adjusted_and_consistent(
    comparison: ModelComparison,
) -> None:
    claims = comparison.claims()
    assert list(claims.columns) == list(CLAIM_COLUMNS)
    assert comparison.no_positions == "homoglens/tiny-none" and comparison.group_by is None
    assert set(claims["claim"]) == {"C1", "C2", "C3"}
    primary = claims[claims["primary"]]
    # one primary test per reading and model, per positional model: C1 (grows, every layer);
    # C2 against the NoPE model: a and b at 2 edges, c; C3 a, b (2 edges), c
    assert len(primary) == 2 * (2 + 5 + 4)
    assert not primary.duplicated(["reading", "model"]).any()  # one primary per reading
    assert not claims[claims["model"] == "homoglens/tiny-none"]["primary"].any()
    assert primary["p_holm"].tolist() == pytest.approx(holm(primary["p"].tolist()))
    assert claims[~claims["primary"]]["p_holm"].isna().all()
    assert (claims["sesoi"] > 0).all()
    for row in claims.itertuples():
        p = row.p_holm if row.primary else row.p
        pt = row.p_tost_holm if row.primary else row.p_tost
        want = verdict(row.value, p, pt, predicted=1 if row.predicted == ">0" else -1,
                       ci=(row.ci_low, row.ci_high), sesoi=row.sesoi)  # fmt: skip
        assert row.verdict == want, row
        assert row.ci_low <= row.value <= row.ci_high
        if row.verdict == "holds":
            assert (row.ci_low > 0) if row.predicted == ">0" else (row.ci_high < 0)
    assert "naive" in " ".join(claims[~claims["primary"]]["test"])
    wider = comparison.claims(sesoi=0.5)
    assert (wider["verdict"] == "equivalent").sum() >= (claims["verdict"] == "equivalent").sum()


def test_save_load_round_trip(comparison: ModelComparison, tmp_path: Path) -> None:
    comparison.save(tmp_path / "c")
    back = ModelComparison.load(tmp_path / "c")
    assert back.labels == comparison.labels and back.no_positions == comparison.no_positions
    assert back.claims().equals(comparison.claims())
    # a loaded comparison's tables come in one order, whatever order safetensors reads
    # the tensors in (it gave a different one on every run)
    for label in back.labels:
        for mode, stats in back.statistics[label].items():
            known = [s for s in STATISTICS if s in stats]
            assert list(stats)[: len(known)] == known, mode
    assert back.summary().equals(ModelComparison.load(tmp_path / "c").summary())


def test_shipped_replicates_join_by_variant(tmp_path: Path) -> None:
    """Seeds 1 and 2 come as shipped per-window statistics; with them a variant is a model and
    its seeds are the unit of replication (t intervals on seeds - groups degrees of freedom)."""
    shipped = [m for m in REPLICATED_MODELS if m not in SHIPPED_MODELS]
    if not all(
        (
            shipped_model_folder(PLAIN[0]).parents[1] / "replicates" / f"{m.split('/')[-1]}.json"
        ).is_file()
        for m in shipped
    ):
        pytest.skip("replicate statistics not built")
    result = compare_models(n_seq=16, n_boot=100, modes=("none", "zero"), progress=False)
    assert result.group_by == "variant" and result.no_positions == "none"
    assert set(result.entities()) == {"learned", "rotary", "none"}
    assert result.computed == PLAIN and set(result.settings["shipped_statistics"]) == set(shipped)
    claims = result.claims()
    loss = claims[(claims["reading"] == "c: costs the model") & claims["primary"]]
    assert (loss["n_seeds"] == 6).all() and (loss["seed_sd"] > 0).all()
    # the shipped rows are the held-out windows this comparison reads
    full = json.loads((shipped_model_folder(PLAIN[0]).parents[1] / "replicates"
                       / "tiny-learned-s1.json").read_text())  # fmt: skip
    assert full["n_windows"] == 1365 and result.settings["window_index"][1] == 1365 // 16
    with pytest.raises(InvalidInputError, match="train"):
        compare_models(n_seq=16, edge_k=4, progress=False)


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(InvalidInputError, match="tokenizer"):
        compare_models([PLAIN[0], str(tiny_model_folder("gpt2"))], n_seq=2, progress=False)
    with pytest.raises(InvalidInputError, match="no_positions"):
        compare_models(PLAIN[:1], n_seq=2, no_positions="x", progress=False)
    with pytest.raises(InvalidInputError, match="edge_k"):
        compare_models(PLAIN[:1], n_seq=2, edge_k=64, progress=False)
    with pytest.raises(InvalidInputError, match="non-empty"):
        compare_models([], progress=False)
    with pytest.raises(InvalidInputError, match="group_by"):
        compare_models(PLAIN[:1], n_seq=2, group_by="seed", progress=False)
    with pytest.raises(InvalidInputError, match="n_seq"):
        heldout_windows(load_model(PLAIN[0]).tokenizer, n_seq=10**6)


def test_heldout_split_covers_the_corpus() -> None:
    whole, train, held = (load_corpus(n) for n in ("austen", "austen-train", "austen-heldout"))
    assert held.startswith("SENSE AND SENSIBILITY") and "SENSE AND SENSIBILITY" not in train
    assert whole == train + "\n\n" + held


def test_cli_compare_writes_report(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        main,
        [
            "compare",
            "--models",
            ",".join(PLAIN),
            "--n-seq",
            "6",
            "--n-boot",
            "50",
            "--modes",
            "none,zero",
            "--no-progress",
            "--out",
            str(out),
        ],  # fmt: skip
    )
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert "Claims C1-C3" in html and "homoglens/tiny-none" in html and "Holm" in html
    back: Any = ModelComparison.load(out / "comparison")
    assert back.n_sequences == 6
    claims = (out / "comparison_claims.csv").read_text()
    assert "p_holm" in claims.splitlines()[0]


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
    assert not math.isnan(loss)


def test_compare_models_arguments_and_mixed_lengths(get_model) -> None:
    with pytest.raises(InvalidInputError, match="no_positions"):
        compare_models(["homoglens/tiny-none"], n_seq=2, no_positions=["x"])
    with pytest.raises(InvalidInputError, match="seq_len"):
        compare_models(["homoglens/tiny-none"], n_seq=2, seq_len=0)
    model = load_model("homoglens/tiny-none", backend=BACKENDS[-1])
    windows = corpus_windows(model, "austen-heldout", n_seq=2, seq_len=60, bos="never")
    mask = windows.attention_mask.clone()
    mask[1, 40:] = 0  # the second sequence has 40 tokens
    batch = TokenBatch(windows.tokens, mask, False, "mixed lengths")
    with pytest.raises(InvalidInputError, match="equal length"):  # position pairs need them
        compare_models({"m": model}, batch, edge_k=4, n_boot=10, progress=False)
    result = compare_models({"m": model}, windows, edge_k=4, n_boot=10, progress=False)
    assert isinstance(result, ModelComparison) and result.n_sequences == 2
