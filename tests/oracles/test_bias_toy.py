"""The attention-bias study on a one-layer attention-only toy whose limits are known in closed
form (written in numpy here): W_V = W_O = I, no MLP, so the residual after block 0 is
y_q = x_q + sum_k A'[q, k] n(x_k), with n the block's input normalisation (none in the
HookedTransformer toy, LayerNorm in the GPT-2 toy the bridge loads).

* b -> +inf on ``first`` (first_k = 1): y_q = x_q + n(x_0);
* beta -> 0 (``temperature``): y_q = x_q + mean_{k <= q} n(x_k).

The study's H_W at entry 1 must equal the closed forms' within 1e-6.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from homoglens import attention_bias_study, load_model
from homoglens.models.loading import has_hooked_transformer
from homoglens.testing import tiny_model_folder

D, T, N = 16, 12, 5
TOKENS = torch.randint(0, 1000, (N, T), generator=torch.Generator().manual_seed(3))
H_W = 4  # SIMILARITY_STATISTICS.index("homogenization")


def _h_w(y: np.ndarray) -> float:
    """Brute-force H_W of windows ``y [n T d]`` (float64): mean off-diagonal of M - C."""
    u = y / np.linalg.norm(y, axis=-1, keepdims=True)
    n = u.shape[0]
    grams = np.einsum("sid,sjd->sij", u, u)
    m = grams.mean(0)
    ub = u.sum(0)
    c = (ub @ ub.T - grams.sum(0)) / (n * (n - 1))
    w = m - c
    off = ~np.eye(w.shape[0], dtype=bool)
    return float(w[off].mean())


def _limits(x: np.ndarray, normed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    first = x + normed[:, :1]
    counts = np.arange(1, x.shape[1] + 1)[None, :, None]
    flat = x + np.cumsum(normed, axis=1) / counts
    return first, flat


def _check(model, x: np.ndarray, normed: np.ndarray) -> None:
    first, flat = _limits(x, normed)
    common = {"edge_k": 2, "exclude_first": False, "progress": False, "batch_size": N}
    hard = attention_bias_study(model, TOKENS, kind="first", strengths=[0.0, 1e3], **common)
    assert abs(float(hard.statistics[1, 1, H_W]) - _h_w(first)) < 1e-6
    assert abs(float(hard.statistics[1, 0, H_W]) - _h_w(x)) < 1e-6  # entry 0: the embeddings
    assert float(hard.attention[1, 0, 0]) > 1 - 1e-6  # all the mass on key 0
    cold = attention_bias_study(model, TOKENS, kind="temperature", strengths=[1e-9, 1.0], **common)
    assert abs(float(cold.statistics[0, 1, H_W]) - _h_w(flat)) < 1e-6
    # and the unbiased run is neither limit
    assert abs(float(hard.statistics[0, 1, H_W]) - _h_w(first)) > 1e-4


@pytest.mark.skipif(not has_hooked_transformer(), reason="HookedTransformer needs TL 3.9")
def test_closed_forms_on_an_attention_only_hooked_transformer() -> None:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=1,
        d_model=D,
        n_heads=1,
        d_head=D,
        n_ctx=T,
        d_vocab=1000,
        attn_only=True,
        normalization_type=None,
        act_fn="gelu",
        seed=0,
        default_prepend_bos=False,
    )
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        attn = model.blocks[0].attn
        attn.W_Q.copy_(torch.randn(attn.W_Q.shape, generator=gen))
        attn.W_K.copy_(torch.randn(attn.W_K.shape, generator=gen))
        attn.W_V.copy_(torch.eye(D)[None])
        attn.W_O.copy_(torch.eye(D)[None])
        attn.b_V.zero_()
        attn.b_O.zero_()
    x = (model.W_E[TOKENS] + model.W_pos[:T][None]).detach().double().numpy()
    _check(model, x, x)


def test_closed_forms_on_a_gpt2_toy_through_the_bridge(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    source = tiny_model_folder("gpt2", n_layers=1, d_model=D, n_heads=1)
    hf = AutoModelForCausalLM.from_pretrained(str(source)).eval()
    block = hf.transformer.h[0]
    with torch.no_grad():
        block.attn.c_attn.weight[:, 2 * D :] = torch.eye(D)  # W_V = I
        block.attn.c_attn.bias.zero_()
        block.attn.c_proj.weight.copy_(torch.eye(D))  # W_O = I
        block.attn.c_proj.bias.zero_()
        block.mlp.c_proj.weight.zero_()  # no MLP
        block.mlp.c_proj.bias.zero_()
    folder = tmp_path / "toy"
    hf.save_pretrained(folder)
    for item in source.iterdir():
        if "token" in item.name or item.name in ("vocab.json", "merges.txt"):
            shutil.copy(item, folder / item.name)
    model = load_model(folder, backend="bridge", device="cpu")
    wte, wpe = hf.transformer.wte.weight, hf.transformer.wpe.weight
    x = (wte[TOKENS] + wpe[:T][None]).detach().double().numpy()
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    normed = (x - mean) / np.sqrt(var + hf.config.layer_norm_epsilon)
    _check(model, x, normed)
