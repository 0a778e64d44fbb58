"""The shipped models of the controlled retraining (three positional schemes, with and without a
BOS at every training window): trained (held-out loss well below the unigram entropy), recorded,
and checked like every other model against Hugging Face oracles."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import AUSTEN_TEXTS as TEXTS
from helpers import cosine_oracle as oracle
from homoglens import (
    SHIPPED_MODELS,
    ablated_positions,
    homogenization_profile,
    load_model,
    model_info,
    to_token_batch,
)
from homoglens.models.loading import shipped_model_folder


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_shipped_model_is_trained_and_recorded(name: str) -> None:
    record = json.loads((shipped_model_folder(name) / "training.json").read_text())
    assert record["config"]["variant"] == name.split("-")[1]
    assert record["config"].get("bos", False) == name.endswith("-bos")
    assert record["heldout"] == "Sense And Sensibility"
    assert record["heldout_loss"] <= record["heldout_unigram_entropy"] - 1.0
    steps = [step for step, _ in record["loss_curve"]]
    assert steps[-1] == record["config"]["steps"]


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_shipped_models_match_hugging_face(name: str, backend: str) -> None:
    model = load_model(name, backend=backend, device="cpu")
    assert model_info(model).name == name and "held-out loss" in model_info(model).source
    hf = AutoModelForCausalLM.from_pretrained(
        str(shipped_model_folder(name)), attn_implementation="eager"
    ).eval()
    batch = to_token_batch(model, TEXTS)
    with torch.no_grad():
        hidden = hf(
            batch.tokens, attention_mask=batch.attention_mask, output_hidden_states=True
        ).hidden_states
    prof = homogenization_profile(model, batch, progress=False)
    for layer in range(model.cfg.n_layers):
        want_others, want_pairwise = oracle(hidden[layer], batch.attention_mask)
        assert torch.allclose(prof.to_others[layer], want_others, atol=1e-4), layer
        assert prof.mean_pairwise[layer].item() == pytest.approx(want_pairwise.item(), abs=1e-4)
    tokens = batch.tokens[:1, : int(batch.lengths[0])]
    perm = torch.randperm(tokens.shape[1], generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), ablated_positions(model, "permute", perm=perm):
        permuted = model(tokens)
    with torch.no_grad():
        want = hf(tokens, position_ids=perm[None]).logits
    assert torch.allclose(permuted, want, atol=1e-4)


def test_replicate_seeds_name_their_training_command() -> None:
    """Seeds 1 and 2 ship statistics only; loading one says how to reproduce its weights."""
    from homoglens import UnknownModelError

    with pytest.raises(UnknownModelError, match="homoglens train --variant rotary --seed 2"):
        load_model("homoglens/tiny-rotary-s2")
    with pytest.raises(UnknownModelError, match="--variant none --bos --seed 1"):
        load_model("homoglens/tiny-none-bos-s1")


def test_the_shipped_checkpoints_sweep_offline() -> None:
    """homoglens/tiny-rotary-bos ships the checkpoints of a re-run of its recipe (--save-steps
    0,25,50,100,200,400,800,1600 and its final, step 3000): each checkpoint's recorded loss
    curve is the prefix of the run's, and the sweep runs offline over them."""
    from homoglens import checkpoint_folders, corpus_windows, over_checkpoints

    name = "homoglens/tiny-rotary-bos"
    folders = checkpoint_folders(name)
    steps = [0, 25, 50, 100, 200, 400, 800, 1600, 3000]
    assert [f.name for f in folders] == [f"step{s}" for s in steps]
    final = json.loads((folders[-1] / "checkpoint.json").read_text())
    shipped = json.loads((shipped_model_folder(name) / "training.json").read_text())
    assert final["config"] == shipped["config"]  # the same recipe
    for folder in folders[1:-1]:
        curve = json.loads((folder / "checkpoint.json").read_text())["loss_curve"]
        assert curve == final["loss_curve"][: len(curve)]
    model = load_model(name, backend="bridge")
    windows = corpus_windows(model, "austen", n_seq=8, seq_len=64, bos="always")
    sweep = over_checkpoints(["sinks", "loss"], name, windows, backend="bridge", progress=False)
    assert sweep.steps.tolist() == steps
    loss = sweep.metric("loss")
    assert loss[0] > loss[-1] + 2.0  # an untrained model predicts far worse
