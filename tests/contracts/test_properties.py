"""Property-based tests (hypothesis): invariances of the cosine statistics, exact merging,
permutation round trips, padding, and float16/bfloat16 accumulation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import BACKENDS
from homoglens import (
    HomogenizationProfile,
    ablated_positions,
    architecture_of,
    cosine_homogenization,
    homogenization_profile,
)

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FIELDS = ("to_others", "to_prefix", "to_mean", "mean_pairwise", "baseline", "relative_residual")


def _resid(seed: int, batch: int, pos: int, d: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, pos, d, generator=gen, dtype=torch.float64) + 0.5


def _close(a: HomogenizationProfile, b: HomogenizationProfile, atol: float = 1e-9) -> None:
    for name in FIELDS:
        assert torch.allclose(getattr(a, name), getattr(b, name), atol=atol, equal_nan=True), name


shapes = st.tuples(st.integers(0, 10_000), st.integers(2, 5), st.integers(3, 9), st.integers(2, 12))


@SETTINGS
@given(shapes)
def test_invariant_to_positive_rescaling_of_any_vector(shape) -> None:
    seed, batch, pos, d = shape
    x = _resid(seed, batch, pos, d)
    scale = torch.rand(batch, pos, 1, generator=torch.Generator().manual_seed(seed + 1)) * 50
    base = cosine_homogenization(x)
    scaled = cosine_homogenization(x * (scale.double() + 0.01))
    for name in ("to_others", "to_prefix", "mean_pairwise", "baseline"):
        assert torch.allclose(getattr(base, name), getattr(scaled, name), atol=1e-9, equal_nan=True)


@SETTINGS
@given(shapes, st.randoms(use_true_random=False))
def test_invariant_to_the_order_of_sequences(shape, rnd) -> None:
    seed, batch, pos, d = shape
    x = _resid(seed, batch, pos, d)
    order = list(range(batch))
    rnd.shuffle(order)
    _close(cosine_homogenization(x), cosine_homogenization(x[order]))


@SETTINGS
@given(shapes, st.integers(1, 4))
def test_merging_is_associative_and_equals_one_pass(shape, extra) -> None:
    seed, batch, pos, d = shape
    x = _resid(seed, batch + extra, pos, d)
    a, b, c = (cosine_homogenization(part) for part in (x[:1], x[1:batch], x[batch:]))
    left = HomogenizationProfile.merge(HomogenizationProfile.merge(a, b), c)
    right = HomogenizationProfile.merge(a, HomogenizationProfile.merge(b, c))
    _close(left, right)
    _close(left, cosine_homogenization(x))


@SETTINGS
@given(st.integers(0, 10_000), st.lists(st.integers(2, 8), min_size=1, max_size=4), st.booleans())
def test_padded_equals_unpadded(seed, lengths, left) -> None:
    width, d = max(lengths) + 2, 6
    x = _resid(seed, len(lengths), width, d)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    parts = []
    for i, t in enumerate(lengths):
        sl = slice(width - t, width) if left else slice(0, t)
        mask[i, sl] = 1
        x[i][mask[i] == 0] = 1e6  # garbage in the pads must not matter
        parts.append(cosine_homogenization(x[i : i + 1, sl]))
    _close(cosine_homogenization(x, mask), HomogenizationProfile.merge(*parts), atol=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(perm=st.permutations(list(range(8))))
def test_permute_then_inverse_permute_is_the_identity(backend, get_model, perm) -> None:
    """The hooks give token i the positional signal of position perm[i]; gathering what they
    produce with the inverse permutation gives back the unpermuted signal (the logits follow
    Hugging Face ``position_ids=perm``: tested in test_interventions)."""
    from homoglens.run.hooks import _source
    from homoglens.run.interventions import _plan

    model = get_model("gpt2", backend)
    inverse = torch.argsort(torch.tensor(perm)).tolist()
    spec = architecture_of(model)
    source, _ = _source(_plan(model, spec, "permute", None, perm, None, None), 8)
    back, _ = _source(_plan(model, spec, "permute", None, inverse, None, None), 8)
    assert source[back].tolist() == list(range(8))
    captured = {}
    tokens = torch.tensor([[464, 3290, 3332, 319, 262, 2603, 13, 198]])

    def keep(name: str):
        def hook(x, hook):
            captured[name] = x.detach().clone()

        return hook

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("hook_pos_embed", keep("base"))])
        with ablated_positions(model, "permute", perm=perm):
            model.run_with_hooks(tokens, fwd_hooks=[("hook_pos_embed", keep("permuted"))])
    assert torch.equal(captured["permuted"][:, inverse], captured["base"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_models_accumulate_in_high_precision(dtype, get_model) -> None:
    """The statistics of a float16/bfloat16 model equal a float64 computation over the same
    activations within 1e-5 (they are accumulated in float64); the gap to a float64 forward
    pass is a property of the model's dtype, printed, not asserted. (Both passes eager, so
    that the activations are the same; the fast path's distance from the float32 model is
    tests/oracles/test_half_precision.py's.)"""
    from helpers import eager_attention
    from homoglens import load_model
    from homoglens.testing import tiny_model_folder

    folder = tiny_model_folder("llama")
    low = load_model(folder, backend=BACKENDS[-1], device="cpu", dtype=dtype)
    texts = [
        "It is a truth universally acknowledged, that a single man",
        "Emma Woodhouse, handsome",
    ]
    with eager_attention():
        prof = homogenization_profile(low, texts, progress=False)
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(2)]
    from homoglens import to_token_batch

    batch = to_token_batch(low, texts)
    tokens, mask = batch.tokens, batch.attention_mask
    with torch.no_grad():
        _, cache = low.run_with_cache(tokens, attention_mask=mask, names_filter=names.__contains__)
    for i, name in enumerate(names):
        assert cache[name].dtype == dtype
        ref = cosine_homogenization(cache[name].double(), mask)
        assert torch.allclose(prof.to_others[i], ref.to_others[0], atol=1e-5, equal_nan=True)
        assert abs(float(prof.mean_pairwise[i] - ref.mean_pairwise[0])) < 1e-5
    high = load_model(folder, backend=BACKENDS[-1], device="cpu", dtype=torch.float64)
    gap = prof.mean_pairwise - homogenization_profile(high, texts, progress=False).mean_pairwise
    print(f"{dtype}: max |mean_pairwise - float64 forward| = {float(gap.abs().max()):.2e}")
