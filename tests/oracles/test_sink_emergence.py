"""sink_emergence_study against plain Hugging Face attention (Gu et al. 2024, arXiv 2410.10781).

Oracle: Gu et al.'s importance alpha of each (window, block, head) on key 0, the mean over
queries 0..T-1 of the attention probability A[q, 0], computed in float64 from Hugging Face's
own ``output_attentions`` (eager) on the shipped ``tiny-rotary-bos`` checkpoint after 3000
steps, equals homoglens' ``step_alpha`` at 1e-6; the sink rate, the percent of (window, block,
head) with alpha > eps, equals homoglens' at 1e-6, at Gu et al.'s eps = 0.3 (where it is 0) and
at eps = 0.1 (where some heads pass). Null: with every block's query/key/value projection set
to zero, attention is uniform over the causal prefix, so alpha = H_T / T exactly (H_T the
harmonic number; 0.042 at T = 128), far under 0.3: sink rate 0 with interval [0, 0]; the
random initialisation (step 0) has no sink either, and its alpha lies within 1e-3 of H_T / T.
Invariant: the windows in reverse order give the same rates and mean importance, and the
per-window alphas reversed.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from homoglens import sink_emergence_study
from homoglens.models.assets import shipped_model_folder
from homoglens.run.data import TokenBatch
from homoglens.training.train import heldout_windows

RUN = "homoglens/tiny-rotary-bos"
N_SEQ = 4


def _step(step: int) -> Path:
    return shipped_model_folder(RUN) / "checkpoints" / f"step{step}"


def _windows(folder: Path) -> TokenBatch:
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return heldout_windows(tokenizer, n_seq=N_SEQ, seq_len=128, bos=True)


def _hf_alpha(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    """``[window layer head]`` alpha from Hugging Face's eager attention in float64."""
    hf = AutoModelForCausalLM.from_pretrained(
        str(folder), attn_implementation="eager", dtype=torch.float64
    ).eval()
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions
    return torch.stack([a[:, :, :, 0].mean(-1) for a in attentions], 1)  # queries 0..T-1


def _one(folder: Path, batch: TokenBatch, eps: float = 0.3) -> object:
    return sink_emergence_study([folder], None, batch, eps=eps, n_boot=200, progress=False)


@pytest.mark.parametrize("eps", [0.3, 0.1])
def test_sink_rate_equals_hugging_face_attention(eps: float) -> None:
    folder = _step(3000)
    batch = _windows(folder)
    alpha = _hf_alpha(folder, batch.tokens)
    result = _one(folder, batch, eps)
    assert torch.allclose(result.step_alpha[0], alpha, atol=1e-6, rtol=0)
    assert float((alpha - eps).abs().min()) > 1e-5  # no alpha at the threshold: same indicators
    rate = float((alpha > eps).double().mean() * 100)
    assert abs(float(result.step_rate[0]) - rate) < 1e-6
    by_layer = (alpha > eps).double().mean((0, 2)) * 100
    assert torch.allclose(result.by_layer()[0], by_layer, atol=1e-6, rtol=0)
    if eps == 0.1:
        assert 0 < rate < 100  # a non-trivial comparison
    else:
        assert rate == 0.0  # the shipped tiny model has no head with alpha > 0.3


def test_uniform_causal_attention_has_no_sink(tmp_path: Path) -> None:
    source = _step(3000)
    hf = AutoModelForCausalLM.from_pretrained(str(source), attn_implementation="eager")
    with torch.no_grad():
        for layer in hf.gpt_neox.layers:
            layer.attention.query_key_value.weight.zero_()
            layer.attention.query_key_value.bias.zero_()
    hf.save_pretrained(tmp_path / "uniform")
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(tmp_path / "uniform")
    batch = _windows(source)
    result = _one(tmp_path / "uniform", batch)
    n = batch.tokens.shape[1]
    harmonic = sum(1.0 / k for k in range(1, n + 1)) / n
    assert torch.allclose(result.step_alpha, torch.full_like(result.step_alpha, harmonic),
                          atol=1e-6, rtol=0)  # fmt: skip
    assert float(result.step_rate[0]) == 0.0
    assert result.step_interval[0, 0].tolist() == [0.0, 0.0]
    init = _one(_step(0), batch)  # the random initialisation: no sink yet
    assert float(init.step_rate[0]) == 0.0
    assert abs(float(init.step_alpha.mean()) - harmonic) < 1e-3
    assert math.isclose(harmonic, 0.0424, abs_tol=1e-3)


def test_window_order_does_not_change_the_rates() -> None:
    folder = _step(3000)
    batch = _windows(folder)
    forward = _one(folder, batch, 0.1)
    flipped = TokenBatch(
        tokens=batch.tokens.flip(0),
        attention_mask=batch.attention_mask.flip(0),
        bos=batch.bos,
        description=batch.description,
    )
    backward = _one(folder, flipped, 0.1)
    assert torch.allclose(backward.step_alpha[0], forward.step_alpha[0].flip(0), atol=1e-6)
    assert abs(float(backward.step_rate[0]) - float(forward.step_rate[0])) < 1e-9
    mean = forward.window_values("importance").mean(1)
    assert torch.allclose(backward.window_values("importance").mean(1), mean, atol=1e-9)
    assert torch.allclose(forward.by_layer().mean(1), forward.step_rate, atol=1e-9)
