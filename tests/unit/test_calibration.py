"""Calibrated readings: the model against a causal null (the same tokens at a late offset, or
a randomly initialised copy read without positions)."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from homoglens import PositionalSimilarity, TokenBatch, load_model
from homoglens.calibration import CalibratedReadings, calibrated_readings, random_reference
from homoglens.errors import InvalidInputError
from homoglens.testing import tiny_model_folder

COLUMNS = ["reading", "statistic", "layer", "model", "reference", "difference", "se", "ci_low",
           "ci_high", "p", "p_holm", "p_tost_holm", "sesoi", "verdict", "n_windows"]  # fmt: skip


@pytest.fixture(scope="module")
def model():
    return load_model(tiny_model_folder("llama"), backend="bridge")


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, 1000, (10, 48), generator=torch.Generator().manual_seed(0))


def test_the_late_copy_is_hugging_faces_hidden_states_after_the_prefix(model, tokens) -> None:
    result = calibrated_readings(model, tokens, offset=20, edge_k=4, progress=False)
    assert result.offset == 20 and result.model.n_pos == result.reference.n_pos == 28
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_folder("llama")).eval()
    with torch.no_grad():
        long = torch.stack(hf(tokens, output_hidden_states=True).hidden_states)
        short = torch.stack(hf(tokens[:, 20:], output_hidden_states=True).hidden_states)
    for got, hidden in ((result.reference, long[:, :, 20:]), (result.model, short)):
        want = PositionalSimilarity.from_activations(hidden.double(), edge_k=4,
                                                     pseudo_values=True)  # fmt: skip
        for stat in ("matched_first", "matched_last", "sp_first", "sp_last", "sp_mean"):
            assert torch.allclose(got.per_window(stat), want.per_window(stat), atol=1e-5), stat
    table = result.table()
    assert list(table.columns) == COLUMNS and len(table) == 5
    assert (table["ci_low"] <= table["difference"]).all()
    assert torch.allclose(
        torch.tensor(table["difference"].to_numpy()),
        torch.tensor((table["model"] - table["reference"]).to_numpy()), atol=1e-12,
    )  # fmt: skip


def test_a_model_against_itself_reads_no_difference(model, tokens) -> None:
    result = calibrated_readings(model, tokens, reference=model, edge_k=4, progress=False)
    table = result.table()
    assert (table["difference"] == 0).all()
    assert not table["verdict"].isin(["holds", "fails"]).any()


def test_a_random_reference_is_seeded_cached_and_leaves_the_global_rng(model, tokens) -> None:
    state = torch.random.get_rng_state()
    a = random_reference(model, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = random_reference(model, seed=3)
    c = random_reference(model, seed=4)
    pa, pb, pc = (next(iter(m.parameters())) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    result = calibrated_readings(model, tokens, reference=a, reference_positions="zero",
                                 edge_k=4, progress=False)  # fmt: skip
    assert "positions zero" in result.reference_name


def test_save_load_round_trip(model, tokens, tmp_path) -> None:
    result = calibrated_readings(model, tokens, edge_k=4, progress=False)
    back = CalibratedReadings.load(result.save(tmp_path / "c"))
    assert back.table().equals(result.table()) and back.offset == result.offset


def test_bad_inputs_raise_clear_errors(model, tokens) -> None:
    with pytest.raises(InvalidInputError, match="edges"):
        calibrated_readings(model, tokens, offset=40, edge_k=4, progress=False)
    with pytest.raises(InvalidInputError, match="reference model only"):
        calibrated_readings(model, tokens, reference_positions="zero", progress=False)
    with pytest.raises(InvalidInputError, match="padding"):
        mask = torch.ones_like(tokens)
        mask[0, :3] = 0
        calibrated_readings(model, TokenBatch(tokens, mask, False, "padded"), progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = calibrated_readings(model, tokens, edge_k=4, progress=False)
    with pytest.raises(InvalidInputError, match="layer 9"):
        result.table(layer=9)
