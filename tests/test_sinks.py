"""Sink scores (Gu et al. 2024 definitions) and massive activations (Sun et al. 2024)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import BACKENDS, hook_count
from homoglens import (
    InvalidInputError,
    corpus_windows,
    massive_activations,
    sink_scores,
    to_token_batch,
)
from homoglens.sinks import sink_sums

T = 64


def test_all_attention_on_key_zero() -> None:
    pattern = torch.zeros(2, 3, T, T)
    pattern[..., 0] = 1.0
    sums = sink_sums(pattern, torch.tensor([T, T]), key=0)
    assert torch.allclose(sums["mass_sum"] / sums["mass_count"], torch.ones(3, dtype=torch.float64))
    assert torch.allclose(sums["importance_sum"] / 2, torch.ones(3, dtype=torch.float64))
    assert torch.equal(sums["sink_count"], torch.full((3,), 2.0, dtype=torch.float64))  # 100 %


@pytest.mark.parametrize("key, alpha", [(0, 0.074123), (1, 0.059427), (63, 0.015625)])
def test_uniform_causal_attention_matches_gu_et_al(key: int, alpha: float) -> None:
    causal = torch.ones(T, T, dtype=torch.float64).tril()
    pattern = (causal / causal.sum(-1, keepdim=True))[None, None]
    sums = sink_sums(pattern, torch.tensor([T]), key=key, eps=0.3)
    assert sums["importance_sum"].item() == pytest.approx(alpha, abs=1e-6)
    assert sums["sink_count"].item() == 0.0  # Sink 0 %
    harmonic = sum(1 / i for i in range(1, T + 1))
    if key == 0:
        assert sums["importance_sum"].item() == pytest.approx(harmonic / T, abs=1e-12)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_mass_equals_hand_computation_with_padding(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    texts = ["The cat sat on the mat and looked around.", "A dog ran.", "Birds sing in trees"]
    scores = sink_scores(model, texts, batch_size=2, progress=False)
    batch = to_token_batch(model, texts)
    mass = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.float64)
    for i in range(len(texts)):
        n = int(batch.lengths[i])
        _, cache = model.run_with_cache(batch.tokens[i : i + 1, :n])
        for layer in range(model.cfg.n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0].double()  # [head q k]
            mass[layer] += pattern[:, 1:n, 0].mean(-1)
    assert torch.allclose(scores.mass, mass / len(texts), atol=1e-6)
    assert scores.n_sequences == 3 and scores.provenance.bos is not None
    assert hook_count(model) == 0


def test_sink_scores_tables_and_plot(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    scores = sink_scores(model, corpus_windows(model, n_seq=3, seq_len=16), progress=False)
    top = scores.top_heads(3)
    assert list(top.columns) == ["layer", "head", "mass", "importance", "sink_rate"]
    assert top["mass"].is_monotonic_decreasing
    assert len(scores.to_pandas()) == model.cfg.n_layers * model.cfg.n_heads
    assert 0.0 <= scores.sink_rate <= 100.0
    assert math.isnan(scores.mass_by_query[0, 0, 0].item())  # q <= key undefined
    assert len(scores.plot().axes) >= 2


def test_sink_bad_input(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    for kwargs, match in (
        ({"key": 200}, "key="),
        ({"key": -1}, "key="),
        ({"eps": 1.5}, "eps="),
        ({"eps": 0}, "eps="),
        ({"key": 5}, "lies outside"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            sink_scores(model, ["one two three"], progress=False, **kwargs)
    assert hook_count(model) == 0


def test_massive_activations_find_a_planted_dimension(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    name = "blocks.0.hook_resid_post"

    def plant(resid, hook):
        resid = resid.clone()
        resid[:, 0, 7] = 1e4  # a massive activation on the first token, dimension 7
        return resid

    model.add_hook(name, plant)
    try:
        found = massive_activations(
            model, corpus_windows(model, n_seq=2, seq_len=10), progress=False
        )
    finally:
        model.reset_hooks()
    assert found.top_dims(1).loc[1, "dims"] == [7]
    assert found.ratio_mean[1, 0] > 1000 and found.ratio_mean[1, 1:].max() < 100
    assert hook_count(model) == 0
    with pytest.raises(InvalidInputError, match="threshold"):
        massive_activations(model, ["one two"], threshold=1)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_exact_attribution_equals_hand_written_ablation(arch, backend, get_model) -> None:
    from homoglens import homogenization_profile, sink_attribution

    model = get_model(arch, backend)
    batch = corpus_windows(model, n_seq=3, seq_len=24)
    layer, head, measured = 0, 1, model.cfg.n_layers

    def hand(pattern, hook):  # written independently of homoglens.hooks
        out = pattern.clone()
        rows = out[:, head].clone()
        rest = 1.0 - rows[..., 0]
        rows[..., 0] = 0.0
        scaled = rows / rest.clamp_min(1e-30)[..., None]
        out[:, head] = torch.where((rest > 0)[..., None], scaled, pattern[:, head])
        return out

    base = homogenization_profile(model, batch, layers=[measured], progress=False)
    with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", hand)]):
        ablated = homogenization_profile(model, batch, layers=[measured], progress=False)
    want = ablated.to_others[0] - base.to_others[0]
    result = sink_attribution(model, batch, heads=[(layer, head), (1, 0)], edge_k=3, progress=False)
    assert want.abs().max() > 1e-4  # the ablation matters
    assert torch.allclose(result.delta_to_others[0], want, atol=1e-5)
    assert result.delta_mean_pairwise[0].item() == pytest.approx(
        (ablated.mean_pairwise - base.mean_pairwise).item(), abs=1e-5
    )
    table = result.summary()
    assert list(table["layer"]) == [0, 1, "joint"]
    assert hook_count(model) == 0


def test_attribution_bad_input(get_model) -> None:
    from homoglens import sink_attribution

    model = get_model("gpt2", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=2, seq_len=24)
    for kwargs, match in (
        ({"heads": [(5, 0)]}, "head layer"),
        ({"heads": [(0, 9)]}, "head index"),
        ({"heads": [(0, 1), (0, 1)]}, "repeats"),
        ({"heads": [3]}, "pairs"),
        ({"method": "fast"}, "only 'exact'"),
        ({"layer": 9}, "layer="),
        ({"key": -1}, "key="),
        ({"edge_k": 20}, "edge_k"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            sink_attribution(model, batch, progress=False, **kwargs)
    assert hook_count(model) == 0


def test_fast_attribution_is_the_first_order_of_exact(backend) -> None:
    """Attribution patching == (exact effect of a tiny partial sink removal) / its size, and
    ranks heads like the full exact removal."""
    from homoglens import (
        fast_sink_attribution,
        homogenization_profile,
        load_model,
        sink_attribution,
    )
    from homoglens.hooks import remove_sink_hook
    from homoglens.testing import tiny_model_folder

    model = load_model(tiny_model_folder("llama"), backend=backend, dtype=torch.float64)
    batch = corpus_windows(model, n_seq=3, seq_len=20)
    fast = fast_sink_attribution(model, batch, progress=False)
    assert tuple(fast.shape) == (model.cfg.n_layers, model.cfg.n_heads)
    last = model.cfg.n_layers
    base = homogenization_profile(model, batch, layers=[last], progress=False).mean_pairwise
    eps = 1e-4
    for layer, head in ((0, 1), (1, 2)):
        hook = remove_sink_hook([head], 0, scale=eps)
        with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", hook)]):
            moved = homogenization_profile(model, batch, layers=[last], progress=False)
        slope = ((moved.mean_pairwise - base) / eps).item()
        assert slope == pytest.approx(fast[layer, head].item(), rel=2e-3, abs=1e-7)
    heads = [(i, h) for i in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    exact = sink_attribution(model, batch, heads=heads, edge_k=3, progress=False)
    corr = torch.corrcoef(torch.stack([exact.delta_mean_pairwise.float(), fast.flatten()]))[0, 1]
    assert corr > 0.9
    assert all(p.grad is None for p in model.parameters())  # no parameter gradients touched
    assert hook_count(model) == 0 and not torch.is_inference_mode_enabled()
