"""Massive activations on SmolLM2-135M-Instruct, as Sun et al. 2024 (arXiv 2402.17762) define
and intervene on them: their layer-median ratios (``main_llm.py --exp2``) against a brute force
over plain Hugging Face hidden states, and their ``set_mean`` / ``set_zero`` intervention
(``main_llm.py --exp3``, ``lib/hook.py`` of locuslab/massive-activations): mean ablation changes
the loss far less than zeroing."""

from __future__ import annotations

import pytest
import torch

from helpers import BACKENDS
from homoglens import (
    ablated_massive_activations,
    corpus_windows,
    load_model,
    massive_activation_means,
    massive_activations,
)
from homoglens.models.loading import embedded_model_folder

pytestmark = pytest.mark.smollm2

N_SEQ, SEQ_LEN = 12, 64
LAYER = 12  # the massive activations of SmolLM2 appear at the output of decoder layer 12
CHECKED = [2, 12, 24, 29]  # decoder layers whose Sun et al. ratio is checked by brute force


@pytest.fixture(scope="module")
def setting():
    folder = embedded_model_folder("smollm2-135m-instruct")
    model = load_model(folder, backend=BACKENDS[-1])
    windows = corpus_windows(model, n_seq=N_SEQ, seq_len=SEQ_LEN)
    return folder, model, windows


def test_sun_layer_median_ratios_match_a_brute_force_over_hf_hidden_states(setting) -> None:
    from transformers import AutoModelForCausalLM

    folder, model, windows = setting
    found = massive_activations(model, windows.tokens[:4], median="layer", progress=False)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    tops, medians = [], []
    for row in windows.tokens[:4]:  # batch 1, as Sun et al.; hidden_states[l] = layer l's output
        with torch.no_grad():
            hidden = hf(row[None], output_hidden_states=True).hidden_states
        feats = [hidden[layer][0].abs().double() for layer in CHECKED]
        tops.append(torch.stack([f.flatten().sort(descending=True).values[0] for f in feats]))
        medians.append(torch.stack([torch.median(f) for f in feats]))
    top, med = torch.stack(tops).mean(0), torch.stack(medians).mean(0)
    assert torch.allclose(found.layer_top[CHECKED, 0], top, rtol=1e-3)
    assert torch.allclose(found.layer_median[CHECKED], med, rtol=1e-3)
    assert torch.allclose(found.layer_ratio[CHECKED], top / med, rtol=2e-3)
    # the massive activations: > 100 and > 1000 x the layer median from layer 12 on, not before
    assert found.layer_ratio[LAYER] > 1000 and found.layer_top[LAYER, 0] > 100
    assert found.layer_ratio[2] < 1000
    assert 507 in found.top_dims(1).loc[LAYER, "dims"]


def test_mean_ablation_changes_the_loss_less_than_zeroing(setting) -> None:
    _, model, windows = setting
    reference, held_out = windows.tokens[: N_SEQ // 2], windows.tokens[N_SEQ // 2 :]
    name = f"blocks.{LAYER - 1}.hook_resid_post"
    with torch.no_grad():
        _, cache = model.run_with_cache(reference[:1], names_filter=name)
    x = cache[name][0].abs()
    rule = torch.clamp(1000 * torch.median(x), min=100.0)  # Sun et al.: > 100 and > 1000 x
    dims = torch.nonzero(x[0] > rule).flatten().tolist()  # on the first token (a BOS)
    print(f"massive dims at layer {LAYER}, position 0: {dims} ({x[0, dims].tolist()})")
    assert 507 in dims and len(dims) <= 8 and not bool((x[1:] > rule).any())
    means = massive_activation_means(
        model, reference, layer=LAYER, dims=dims, positions=[0], progress=False
    )

    def loss() -> float:
        with torch.no_grad():
            return float(model(held_out, return_type="loss"))

    base = loss()
    with ablated_massive_activations(model, "mean", layer=LAYER, dims=dims, means=means):
        mean = loss()
    with ablated_massive_activations(model, "zero", layer=LAYER, dims=dims):
        zero = loss()
    print(f"SmolLM2 loss (nats): base {base:.4f}, set_mean {mean:.4f}, set_zero {zero:.4f}")
    assert abs(mean - base) < 0.05  # Sun et al.: harmless
    assert zero - base > 1.0  # Sun et al.: destroys the model
    assert abs(mean - base) < abs(zero - base)
