"""Known TransformerLens traps (issue numbers in the test names): left padding without a mask,
BOS handling, pads in attention statistics, parallel blocks without resid_mid, processed
weights."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import AUSTEN_OPENINGS, BACKENDS
from homoglens import (
    InvalidInputError,
    cosine_homogenization,
    homogenization_profile,
    load_model,
    positional_patching,
    sink_scores,
    to_token_batch,
)
from homoglens.testing import tiny_model_folder

NAMES = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]


def _left_padded(model):
    batch = to_token_batch(model, AUSTEN_OPENINGS)
    width = batch.tokens.shape[1]
    tokens = torch.full_like(batch.tokens, 50256)
    mask = torch.zeros_like(batch.tokens)
    for i, t in enumerate(batch.lengths.tolist()):
        tokens[i, width - t :] = batch.tokens[i, :t]
        mask[i, width - t :] = 1
    return batch, tokens, mask


@pytest.mark.parametrize("backend", BACKENDS)
def test_left_padding_without_a_mask_tl1609(backend: str, get_model) -> None:
    """TransformerLens #1609 / nnsight #672: a left-padded batch run without its attention mask
    gives the short sequence wrong activations, silently."""
    model = get_model("llama", backend)
    batch, tokens, mask = _left_padded(model)
    short = int(batch.lengths.argmin())
    t = int(batch.lengths[short])
    alone = homogenization_profile(model, batch[short : short + 1], progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=NAMES.__contains__)  # naive
    naive = cosine_homogenization(cache[NAMES[-1]][short : short + 1, -t:].double())
    assert abs(float(naive.mean_pairwise[0] - alone.mean_pairwise[-1])) > 1e-3
    ours = homogenization_profile(model, tokens, attention_mask=mask, progress=False)
    mine = homogenization_profile(
        model, tokens[short : short + 1], attention_mask=mask[short : short + 1], progress=False
    )
    assert torch.allclose(mine.to_others[:, :t], alone.to_others[:, :t], atol=1e-5)
    assert ours.n_sequences == 2 and int(ours.count[t - 1]) == 2


def test_bos_is_recorded_and_controlled_tl1418(get_model) -> None:
    """TransformerLens #1418 / #1628: whether position 0 is a BOS differs by model and call
    (``to_tokens`` prepends one for GPT-2); homoglens records it and lets you choose."""
    model = get_model("gpt2", BACKENDS[-1])
    naive = model.to_tokens(AUSTEN_OPENINGS[0])
    first_text_token = model.tokenizer.encode(AUSTEN_OPENINGS[0], add_special_tokens=False)[0]
    assert int(naive[0, 0]) != first_text_token  # naive: position 0 is not the text's first token
    never = homogenization_profile(model, AUSTEN_OPENINGS, bos="never", progress=False)
    always = homogenization_profile(model, AUSTEN_OPENINGS, bos="always", progress=False)
    assert never.provenance.bos is False and always.provenance.bos is True
    assert int(to_token_batch(model, AUSTEN_OPENINGS, bos="never").tokens[0, 0]) == first_text_token
    assert always.n_tokens == never.n_tokens + len(AUSTEN_OPENINGS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pads_never_enter_sink_scores_tl318(backend: str, get_model) -> None:
    """TransformerLens #318: masked attention leaking at large negative fill values; pad rows
    and keys must never count. The naive mean over every row of A[:, :, :, 0] counts pads."""
    model = get_model("gpt2", backend)
    batch, tokens, mask = _left_padded(model)
    ours = sink_scores(model, tokens, attention_mask=mask, progress=False)
    parts = [
        sink_scores(model, batch[i : i + 1], progress=False) for i in range(len(AUSTEN_OPENINGS))
    ]
    want = torch.stack([p.mass for p in parts]).mean(0)
    assert torch.allclose(ours.mass, want, atol=1e-5)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    naive = cache["blocks.0.attn.hook_pattern"][..., 1:, 0].mean((0, 2))  # rows, key 0 = a pad
    assert not torch.allclose(naive.double(), want[0].double(), atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_resid_mid_in_parallel_gpt_neox(backend: str, get_model) -> None:
    """Pythia (parallel GPT-NeoX) has no residual stream between attention and MLP: the naive
    lookup fails with a bare KeyError; homoglens says why and what to use."""
    model = get_model("neox", backend)
    with pytest.raises(KeyError):
        model.hook_dict["blocks.0.hook_resid_mid"]  # noqa: B018
    with pytest.raises(InvalidInputError, match="resid_mid"):
        positional_patching(model, AUSTEN_OPENINGS, component="resid_mid", bins=2, progress=False)


def test_weight_processing_changes_cosines_tl346() -> None:
    """TransformerLens #346: processed weights (fold LayerNorm, centre writing weights) change
    the residual stream; raw weights (homoglens' default) match Hugging Face."""
    folder = tiny_model_folder("gpt2")
    hf = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    raw = load_model(folder, backend=BACKENDS[0])
    processed = load_model(folder, backend=BACKENDS[0], process_weights=True)
    batch = to_token_batch(raw, AUSTEN_OPENINGS)
    with torch.no_grad():
        hidden = hf(batch.tokens, attention_mask=batch.attention_mask, output_hidden_states=True)
    want = cosine_homogenization(hidden.hidden_states[1].double(), batch.attention_mask)
    ours = homogenization_profile(raw, batch, layers=[1], progress=False)
    naive = homogenization_profile(processed, batch, layers=[1], progress=False)
    assert abs(float(ours.mean_pairwise[0] - want.mean_pairwise[0])) < 1e-5
    assert abs(float(naive.mean_pairwise[0] - want.mean_pairwise[0])) > 1e-3
    assert ours.provenance.weights == "raw" and naive.provenance.weights == "processed"
