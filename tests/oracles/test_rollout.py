"""Oracles of ``attention_rollout`` (Abnar & Zuidema 2020, arXiv 2005.00928; Wu et al. 2025,
arXiv 2502.01951): the rollout by hand from Hugging Face's ``output_attentions`` (eager, float64
matrix products) on the tiny models; the uniform-causal null against its closed form and a model
whose attention is uniform causal; invariants; bad inputs."""

from __future__ import annotations

import pytest
import torch

from helpers import hf_model, hf_run
from homoglens import AttentionRollout, attention_rollout, uniform_causal_rollout
from homoglens.core.errors import InvalidInputError

T = 12


def _tokens(n: int = 5, t: int = T, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 1000, (n, t), generator=torch.Generator().manual_seed(seed))


def _by_hand(arch: str, tokens: torch.Tensor, residual: bool, mask=None) -> list[torch.Tensor]:
    """Per block, the rollout ``[batch query key]`` from HF's attention, float64."""
    hf = hf_model(arch)
    out = hf_run(hf, tokens, output_attentions=True, attention_mask=mask)
    eye = torch.eye(tokens.shape[1], dtype=torch.float64)
    r, rollouts = eye.expand(tokens.shape[0], -1, -1), []
    for attn in out.attentions:
        m = attn.double().mean(1)
        if residual:
            m = 0.5 * m + 0.5 * eye
        r = m @ r
        rollouts.append(r)
    return rollouts


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("residual", [True, False])
def test_rollout_matches_hf_by_hand(arch, residual, backend, get_model) -> None:
    model = get_model(arch, backend)
    tokens = _tokens()
    got = attention_rollout(model, tokens, residual=residual, first_k=3, batch_size=2,
                            progress=False)  # fmt: skip
    want = _by_hand(arch, tokens, residual)
    assert got.blocks == tuple(range(len(want)))
    for i, r in enumerate(want):
        rows = r.mean(1)  # [batch key]: mean over queries
        assert torch.allclose(got.received[i], rows.mean(0), atol=1e-6, rtol=0)
        assert torch.allclose(got.window_first_k[:, i], rows[:, :3].sum(-1), atol=1e-6, rtol=0)
    # the test can fail: the model's rollout is not the null's
    assert (got.received - got.null_received).abs().max() > 1e-4


def test_padded_windows_match_each_window_alone(get_model) -> None:
    model = get_model("llama", "bridge")
    tokens = _tokens(3)
    mask = torch.ones_like(tokens)
    mask[0, :4] = 0  # left padding: window 0 has 8 real tokens
    got = attention_rollout(model, tokens, attention_mask=mask, progress=False, first_k=2)
    alone = attention_rollout(model, tokens[:1, 4:], progress=False, first_k=2)
    assert torch.allclose(got.window_first_k[0], alone.window_first_k[0], atol=1e-6)
    want = _by_hand("llama", tokens[:1, 4:], True)
    assert torch.allclose(alone.received[-1], want[-1].mean(1)[0], atol=1e-6)
    assert torch.isnan(got.received).sum() == 0  # key 8.. reached by the other windows
    assert torch.allclose(got.null_received[:, 8:], uniform_causal_rollout(T, 2)[:, :, 8:].mean(1))


def _closed_form(n: int, depth: int) -> torch.Tensor:
    """(A^d)[q, k] = h_{d-1}(1/(k+1), ..., 1/(q+1)) / (q + 1), h by its recurrence."""
    out = torch.zeros(n, n, dtype=torch.float64)
    for q in range(n):
        for k in range(q + 1):
            x = [1.0 / (j + 1) for j in range(k, q + 1)]
            h = [1.0] + [0.0] * (depth - 1)  # h_0 .. h_{d-1} of the variables so far
            for v in x:  # h_m(x_1..x_j) = h_m(x_1..x_{j-1}) + v h_{m-1}(x_1..x_j)
                for m in range(1, depth):
                    h[m] = h[m] + v * h[m - 1]
            out[q, k] = h[depth - 1] / (q + 1)
    return out


def test_uniform_causal_null_closed_form_and_invariants() -> None:
    n, depth = 9, 5
    plain = uniform_causal_rollout(n, depth, residual=False)
    for d in range(1, depth + 1):
        assert torch.allclose(plain[d - 1], _closed_form(n, d), atol=1e-12, rtol=0)
    for residual in (True, False):
        r = uniform_causal_rollout(n, depth, residual=residual)
        assert torch.allclose(r.sum(-1), torch.ones(depth, n, dtype=torch.float64), atol=1e-12)
        assert bool((r.triu(1) == 0).all())
        first = r.mean(1)[:, 0]
        assert bool((first[1:] > first[:-1]).all())  # mass on key 0 grows with depth
    assert torch.equal(AttentionRollout.uniform_causal(n, 2), uniform_causal_rollout(n, 2))


def test_model_with_uniform_causal_attention_equals_null() -> None:
    """With every query projection zeroed, the scores are 0: softmax over the causal prefix is
    uniform, and the rollout is the null's (a model, not the formula)."""
    from homoglens import load_model
    from homoglens.testing import tiny_model_folder

    model = load_model(tiny_model_folder("llama"), backend="bridge", device="cpu")  # a copy
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj" in name:
                p.zero_()
    for residual in (True, False):
        got = attention_rollout(model, _tokens(4), residual=residual, progress=False)
        assert torch.allclose(got.received, got.null_received, atol=1e-6, rtol=0)
        assert torch.allclose(got.window_first_k.mean(0), got.null_first_k, atol=1e-6)


def test_one_block_is_its_head_mean_attention_and_rows_sum_to_one(get_model) -> None:
    model = get_model("neox", "bridge")
    tokens = _tokens(3)
    got = attention_rollout(model, tokens, residual=False, layers=[0], progress=False)
    attn = hf_run(hf_model("neox"), tokens, output_attentions=True).attentions[0].double()
    assert torch.allclose(got.received[0], attn.mean(1).mean(1).mean(0), atol=1e-6, rtol=0)
    assert torch.allclose(got.received.sum(-1), torch.ones(1, dtype=torch.float64), atol=1e-9)
    deep = attention_rollout(model, tokens, layers=[1], progress=False)  # starts at block 0
    assert deep.blocks == (1,)
    want = _by_hand("neox", tokens, True)[1]
    assert torch.allclose(deep.received[0], want.mean(1).mean(0), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"first_k": 0}, "first_k"),
        ({"first_k": T + 1}, "first_k"),
        ({"first_k": 1.5}, "first_k"),
        ({"layers": [5]}, "layers|block"),
        ({"residual": "yes"}, "residual"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_inputs(options, match, get_model) -> None:
    model = get_model("gpt2", "bridge")
    with pytest.raises(InvalidInputError, match=match):
        attention_rollout(model, _tokens(2), progress=False, **options)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_null_bad_inputs(bad) -> None:
    with pytest.raises(InvalidInputError, match="positive integer"):
        uniform_causal_rollout(bad, 2)
    with pytest.raises(InvalidInputError, match="positive integer"):
        uniform_causal_rollout(4, bad)
