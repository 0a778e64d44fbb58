"""position_ablation_study: loss against an independent Hugging Face oracle, consistency with
homogenization_profile under the same ablation, bootstrap intervals, result objects."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import BACKENDS, MIXED_LENGTHS, hook_count
from homoglens import (
    InvalidInputError,
    PositionAblationStudy,
    ablated_positions,
    corpus_windows,
    homogenization_profile,
    load_model,
    position_ablation_study,
)
from homoglens.ablation.result import paired_bootstrap
from homoglens.testing import tiny_model_folder


@pytest.fixture(scope="module")
def study_and_batch(get_model):
    model = get_model("gpt2", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=10, seq_len=24)
    return (
        model,
        batch,
        position_ablation_study(model, batch, batch_size=4, n_boot=200, progress=False),
    )


def test_default_modes_and_shapes(study_and_batch) -> None:
    model, _, study = study_and_batch
    assert study.modes == ("none", "zero", "permute", "shift")
    assert tuple(study.loss.shape) == (4, 10)
    assert tuple(study.mean_pairwise.shape) == (4, 10, 3)
    assert tuple(study.to_others.shape) == (4, 10, 3, 24)
    rotary = position_ablation_study(
        tiny_model_llama(model),
        corpus_windows(model, n_seq=2, seq_len=8),
        n_boot=10,
        progress=False,
    )
    assert rotary.modes == ("none", "zero", "permute")


def tiny_model_llama(_model):

    return load_model(tiny_model_folder("llama"), backend=BACKENDS[-1])


def test_loss_matches_hf(study_and_batch) -> None:
    _, batch, study = study_and_batch
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_folder("gpt2"))).eval()
    with torch.no_grad():
        logits = hf(batch.tokens).logits
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch.tokens[:, 1:], reduction="none"
    ).mean(1)
    assert torch.allclose(study.loss[0], nll, atol=1e-4)
    hf.transformer.wpe.weight.data.zero_()
    with torch.no_grad():
        logits = hf(batch.tokens).logits
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch.tokens[:, 1:], reduction="none"
    ).mean(1)
    assert torch.allclose(study.loss[1], nll, atol=1e-4)


def test_profiles_equal_profile_under_same_ablation(study_and_batch) -> None:
    model, batch, study = study_and_batch
    base = homogenization_profile(model, batch, progress=False)
    with ablated_positions(model, "permute", seed=0):
        perm = homogenization_profile(model, batch, progress=False)
    for mode, want in (("none", base), ("permute", perm)):
        got = study.profiles[mode]
        assert torch.allclose(got.to_others, want.to_others, atol=1e-6, equal_nan=True)
        assert torch.allclose(got.baseline, want.baseline, atol=1e-6)
    # per-sequence values average to the profile's
    assert torch.allclose(study.mean_pairwise[0].double().mean(0), base.mean_pairwise, atol=1e-6)
    assert torch.allclose(
        study.to_others[0].double().nanmean(0), base.to_others, atol=1e-6, equal_nan=True
    )
    assert hook_count(model) == 0


def test_tables_and_intervals(study_and_batch) -> None:
    _, _, study = study_and_batch
    loss = study.loss_table()
    assert list(loss["mode"]) == list(study.modes)
    assert loss.loc[0, "diff_vs_none"] == 0.0
    assert (loss["ci_low"] <= loss["loss"]).all() and (loss["loss"] <= loss["ci_high"]).all()
    layers = study.layer_table()
    assert len(layers) == 4 * 3
    positions = study.position_table(layer=2)
    assert len(positions) == 4 * 24
    tidy = study.to_pandas()
    assert set(tidy["metric"]) == {"mean_pairwise", "loss"}
    assert len(study.plot().axes) == 2


def test_paired_bootstrap_gives_no_interval_from_one_sequence() -> None:
    """One sequence (or one value in a column) gives the mean and a NaN interval, not a
    zero-width one."""
    mean, low, high = paired_bootstrap(torch.tensor([[0.3, 0.5]]), n_boot=50)
    assert mean.tolist() == pytest.approx([0.3, 0.5])
    assert low.isnan().all() and high.isnan().all()
    nan = float("nan")
    rows = [[0.1, nan], [0.2, 0.4], [0.4, nan], [0.3, nan], [0.25, nan]]
    mean, low, high = paired_bootstrap(torch.tensor(rows))
    assert mean[1].item() == pytest.approx(0.4) and low[1].isnan() and high[1].isnan()
    assert low[0] < high[0]  # five sequences: an interval; fewer than 4 (issue 39): NaN


def test_paired_bootstrap_covers_known_mean() -> None:
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(400, 2, generator=gen) + torch.tensor([0.0, 3.0])
    mean, low, high = paired_bootstrap(values, n_boot=500, seed=1)
    assert torch.allclose(mean, values.double().mean(0))
    assert (low < mean).all() and (mean < high).all()
    assert ((high - low) < 0.4).all()  # ~ 2 * 1.96 / sqrt(400) = 0.196
    const = torch.ones(5, 3)  # identical sequences show no spread: no interval (issue 39)
    m, lo, hi = paired_bootstrap(const, n_boot=50)
    assert lo.isnan().all() and hi.isnan().all() and (m == 1).all()


def test_save_load(study_and_batch, tmp_path) -> None:
    _, _, study = study_and_batch
    loaded = PositionAblationStudy.load(study.save(tmp_path / "s"))
    assert loaded.modes == study.modes and torch.equal(loaded.loss, study.loss)
    assert torch.allclose(
        loaded.profiles["zero"].to_others, study.profiles["zero"].to_others, equal_nan=True
    )


def test_bad_study_options(get_model) -> None:
    model = get_model("llama", BACKENDS[-1])
    texts = ["one two three four", "five six seven eight"]
    with pytest.raises(InvalidInputError, match="rotary"):
        position_ablation_study(model, texts, modes=["mean"], progress=False)
    with pytest.raises(InvalidInputError, match="must be from"):
        position_ablation_study(model, texts, modes=["scramble"], progress=False)
    with pytest.raises(InvalidInputError, match="ci="):
        position_ablation_study(model, texts, ci=1.5, progress=False)
    gpt2 = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="shift=200"):
        position_ablation_study(gpt2, texts, modes=["shift"], shift=200, progress=False)
    assert hook_count(model) == 0 and hook_count(gpt2) == 0


@pytest.mark.parametrize("mode", ["permute", "mean"])
def test_study_independent_of_batch_size_with_mixed_lengths(mode, get_model):
    model = get_model("gpt2", BACKENDS[-1])
    runs = [
        position_ablation_study(
            model, MIXED_LENGTHS, modes=[mode], batch_size=b, n_boot=20, progress=False
        )
        for b in (1, 3)
    ]
    assert torch.allclose(runs[0].mean_pairwise, runs[1].mean_pairwise, atol=1e-5)
    assert torch.allclose(runs[0].loss, runs[1].loss, atol=1e-5)
    # per-sequence results stay in input order: sequence 1 is the longest
    assert runs[0].to_others[0, 1].isfinite().sum() > runs[0].to_others[0, 0].isfinite().sum()


def test_ablation_positions_beyond_every_window_are_refused(get_model) -> None:
    """positions=[100] on 32-token windows ablated nothing: the 'zero' row equalled 'none'."""
    from homoglens import InvalidInputError, corpus_windows, position_ablation_study

    model = get_model("gpt2", BACKENDS[-1])
    windows = corpus_windows(model, n_seq=2, seq_len=32)
    with pytest.raises(InvalidInputError, match=r"positions \[100\] lie beyond every window"):
        position_ablation_study(model, windows, modes=["zero"], positions=[5, 100], progress=False)


def test_one_mode_given_as_a_string_is_that_mode(get_model) -> None:
    from homoglens import corpus_windows, position_ablation_study

    model = get_model("gpt2", BACKENDS[-1])
    windows = corpus_windows(model, n_seq=4, seq_len=16)
    study = position_ablation_study(model, windows, modes="zero", n_boot=20, progress=False)
    assert study.modes == ("none", "zero")
