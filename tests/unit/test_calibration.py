"""Calibrated readings: the model against a causal null (the same tokens at a late offset, or
a randomly initialised copy read without positions)."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from homoglens import PositionalSimilarity, TokenBatch, load_model
from homoglens.core.errors import InvalidInputError, UnsupportedArchitectureError
from homoglens.similarity.calibration import (
    DESIGNS,
    CalibratedReadings,
    calibrated_readings,
    random_reference,
)
from homoglens.testing import tiny_model_folder

COLUMNS = ["reading", "statistic", "layer", "model", "reference", "difference", "se", "ci_low",
           "ci_high", "p", "p_holm", "p_tost_holm", "sesoi", "verdict", "n_windows", "design",
           "null_loss_change", "null_loss_ci_low", "null_loss_ci_high", "block"]  # fmt: skip


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
    with pytest.raises(InvalidInputError, match="layer=9"):
        result.table(layer=9)


def test_the_offset_design_is_named_a_start_of_sequence_contrast(model, tokens) -> None:
    """Issue 51, point 1: the offset design is descriptive; nothing in its table calls it
    positional or a causal null."""
    table = calibrated_readings(model, tokens, edge_k=4, progress=False).table()
    design = table["design"].iloc[0]
    assert design.startswith("start-of-sequence contrast") and "not a causal null" in design
    assert "positional" not in design
    assert table["null_loss_change"].isna().all()


def test_the_model_matched_null_is_hugging_face_without_positions(tmp_path) -> None:
    """reference="no_positions" on GPT-2: the null's readings and losses equal plain Hugging Face
    passes with the position table zeroed, the model's those of the intact model (float64
    oracle at 1e-5), and its loss cost is paired over the same windows."""
    folder = tiny_model_folder("gpt2")
    model = load_model(folder, backend="bridge")
    tokens = torch.randint(0, 1000, (6, 40), generator=torch.Generator().manual_seed(2))
    result = calibrated_readings(model, tokens, reference="no_positions", edge_k=4,
                                 progress=False)  # fmt: skip
    assert result.reference_kind == "no_positions" and result.design == DESIGNS["no_positions"]
    hf = AutoModelForCausalLM.from_pretrained(folder).eval().double()
    bos = torch.full((6, 1), 50256)
    ids = torch.cat([bos, tokens], 1) if result.model.first_position else tokens
    for got, zero in ((result.model, False), (result.reference, True)):
        if zero:
            hf.transformer.wpe.weight.data.zero_()
        resid: list[torch.Tensor] = []  # the last residual entry before ln_f (HF's is after)
        hook = hf.transformer.ln_f.register_forward_hook(
            lambda m, i, o, kept=resid: kept.append(i[0])
        )
        with torch.no_grad():
            out = hf(ids, output_hidden_states=True, labels=ids)
        hook.remove()
        hidden = torch.stack([*out.hidden_states[:-1], resid[0]])[:, :, got.first_position :]
        want = PositionalSimilarity.from_activations(hidden, edge_k=4, pseudo_values=True)
        for stat in ("matched_first", "matched_last", "sp_first", "sp_last", "sp_mean"):
            assert torch.allclose(got.per_window(stat), want.per_window(stat), atol=1e-5), stat
        logp = torch.log_softmax(out.logits[:, :-1], -1)
        nll = -logp.gather(-1, ids[:, 1:, None])[..., 0].mean(1)
        assert result.loss is not None
        assert torch.allclose(result.loss[int(zero)], nll, atol=1e-4), (zero, nll)
    table = result.table()
    cost = result.null_cost()
    assert cost is not None and table["null_loss_change"].eq(cost.value).all()
    assert cost.value == pytest.approx(float((result.loss[1] - result.loss[0]).mean()))
    back = CalibratedReadings.load(result.save(tmp_path / "null"))
    assert back.loss is not None and torch.equal(back.loss, result.loss)
    assert back.table().equals(table)


def test_the_model_matched_null_refuses_what_it_cannot_do(model, tokens) -> None:
    with pytest.raises(InvalidInputError, match="leave them out"):
        calibrated_readings(model, tokens, reference="no_positions", offset=8, progress=False)
    with pytest.raises(InvalidInputError, match="leave them out"):
        calibrated_readings(model, tokens, reference="no_positions", reference_positions="zero",
                            progress=False)  # fmt: skip
    nope = load_model("homoglens/tiny-none")
    with pytest.raises(InvalidInputError, match="needs positions to remove"):
        calibrated_readings(nope, tokens[:4, :40] % 4000, reference="no_positions",
                            progress=False)  # fmt: skip
    with pytest.raises(InvalidInputError, match="'no_positions', 'offset' or a model"):
        calibrated_readings(model, tokens, reference="positions", progress=False)  # type: ignore[arg-type]
    result = calibrated_readings(model, tokens, edge_k=4, progress=False)
    with pytest.raises(InvalidInputError, match="loss is the cost"):
        CalibratedReadings(result.model, result.reference, "offset", "x", result.offset,
                           torch.zeros(2, 10))  # fmt: skip
    with pytest.raises(InvalidInputError, match="needs its loss cost"):
        CalibratedReadings(result.model, result.model, "no_positions", "x")
    n = result.model.n_sequences
    with pytest.raises(
        InvalidInputError, match=rf"fewer than 4 blocks of the {n} windows.*block <="
    ):
        result.table(block=n)
    assert set(result.table(block=1)["block"]) == {1}  # the block each reading used, said


def test_a_family_outside_the_table_gets_a_typed_error_naming_the_fix(monkeypatch, tokens) -> None:
    import homoglens.similarity.calibration as calibration

    def unknown(model):
        raise UnsupportedArchitectureError("family 'foo' is not in the table.")

    monkeypatch.setattr(calibration, "architecture_of", unknown)
    model = load_model(tiny_model_folder("llama"), backend="bridge")
    with pytest.raises(UnsupportedArchitectureError, match="random_reference"):
        calibrated_readings(model, tokens, reference="no_positions", progress=False)
