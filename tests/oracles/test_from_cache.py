"""``from_cache``: results built from the ``ActivationCache`` of ``model.run_with_cache`` equal
the streamed model path (its hooks, its batches, SDPA attention on the bridge) within 1e-6, on
every backend of the installed TransformerLens line."""

from __future__ import annotations

import pytest
import torch

from helpers import ARCHS, BACKENDS, hook_count
from homoglens import (
    HomogenizationProfile,
    InvalidInputError,
    MassiveActivations,
    PositionalSimilarity,
    homogenization_profile,
    massive_activations,
    positional_similarity,
)

PROFILE_VALUES = (
    "to_others",
    "to_prefix",
    "to_mean",
    "norm",
    "mean_pairwise",
    "baseline",
    "adjusted",
    "relative_residual",
    "effective_rank",
    "unit_effective_rank",
    "matrix_entropy",
)


def _cache(model, tokens, **kwargs):
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, **kwargs)
    return cache


def _close(a, b, names, *, rtol=0.0) -> None:
    for name in names:
        torch.testing.assert_close(
            getattr(a, name),
            getattr(b, name),
            atol=1e-6,
            rtol=rtol,
            equal_nan=True,
            msg=lambda m, name=name: f"{name}: {m}",
        )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_profile_from_cache_equals_the_streamed_profile(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    tokens = torch.randint(0, 1000, (5, 12), generator=torch.Generator().manual_seed(0))
    cache = _cache(model, tokens)
    for kwargs in ({}, {"exclude_first": True, "layers": [0, 2]}):
        got = HomogenizationProfile.from_cache(cache, effective_rank=True, batch_size=2, **kwargs)
        want = homogenization_profile(model, tokens, effective_rank=True, progress=False, **kwargs)
        assert got.layers == want.layers and got.n_tokens == want.n_tokens
        assert torch.equal(got.count, want.count)
        _close(got, want, PROFILE_VALUES)
        prov = got.provenance
        assert prov.backend == backend and prov.hook_points == want.provenance.hook_points
        assert prov.data.startswith("given activations: ActivationCache") and prov.bos is None
        assert prov.exclude_first is kwargs.get("exclude_first", False)
    assert hook_count(model) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_profile_from_cache_with_left_padding(backend, get_model) -> None:
    model = get_model("gpt2", backend)
    tokens = torch.randint(0, 1000, (4, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens)
    mask[1, :3] = 0
    mask[3, :6] = 0
    cache = _cache(model, tokens, attention_mask=mask)
    got = HomogenizationProfile.from_cache(cache, attention_mask=mask)
    want = homogenization_profile(model, tokens, attention_mask=mask, progress=False)
    assert torch.equal(got.count, want.count)
    _close(got, want, PROFILE_VALUES[:6])


@pytest.mark.parametrize("backend", BACKENDS)
def test_similarity_from_cache_equals_the_streamed_similarity(backend, get_model) -> None:
    model = get_model("llama", backend)
    tokens = torch.randint(0, 1000, (6, 20), generator=torch.Generator().manual_seed(2))
    cache = _cache(model, tokens)
    for kwargs in ({}, {"centre": "global", "pseudo_values": True, "exclude_first": True}):
        got = PositionalSimilarity.from_cache(cache, edge_k=4, **kwargs)
        want = positional_similarity(
            model, tokens, edge_k=4, progress=False, **{"exclude_first": False, **kwargs}
        )
        assert got.layers == want.layers and got.first_position == want.first_position
        _close(got, want, ("M", "C", "W", "SP", "to_first", "homogenization", "lag"))
        torch.testing.assert_close(got.window_within, want.window_within, atol=1e-6, rtol=0)
    sub = PositionalSimilarity.from_cache(cache, layers=[1], edge_k=4)
    assert sub.layers == (1,) and sub.provenance.hook_points == ("blocks.0.hook_resid_post",)
    assert hook_count(model) == 0


@pytest.mark.parametrize("median", ["token", "layer"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_massive_from_cache_equals_the_streamed_scan(backend, median, get_model) -> None:
    model = get_model("gpt2", backend)
    tokens = torch.randint(0, 1000, (5, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(tokens)
    mask[2, 5:] = 0  # right padding
    cache = _cache(model, tokens, attention_mask=mask)
    got = MassiveActivations.from_cache(cache, attention_mask=mask, median=median, batch_size=2)
    want = massive_activations(model, tokens, attention_mask=mask, median=median, progress=False)
    assert got.median == want.median and got.threshold == want.threshold
    assert got.min_magnitude == want.min_magnitude and got.n_sequences == want.n_sequences
    _close(
        got,
        want,
        ("ratio_mean", "ratio_max", "top_value", "dim_counts", "layer_top", "layer_median"),
        rtol=1e-6,
    )
    assert hook_count(model) == 0


def test_from_cache_reads_dicts_filtered_caches_and_unbatched_caches(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(4))
    cache = _cache(model, tokens)
    plain = {name: cache[name] for name in ("blocks.0.hook_resid_pre", "blocks.1.hook_resid_post")}
    from_dict = HomogenizationProfile.from_cache(plain)
    assert from_dict.layers == (0, 2) and from_dict.provenance.backend == "none"
    full = HomogenizationProfile.from_cache(cache, layers=[0, 2])
    torch.testing.assert_close(from_dict.to_others, full.to_others, atol=0, rtol=0, equal_nan=True)
    single = {name: x[0] for name, x in plain.items()}  # remove_batch_dim=True
    torch.testing.assert_close(
        HomogenizationProfile.from_cache(single).to_others,
        from_dict.to_others,
        atol=0,
        rtol=0,
        equal_nan=True,
    )
    filtered = _cache(model, tokens, names_filter=["blocks.0.hook_resid_post"])
    assert MassiveActivations.from_cache(filtered).layers == (1,)
    with pytest.raises(InvalidInputError, match="names_filter"):
        HomogenizationProfile.from_cache(filtered, layers=[0, 1])


def test_from_cache_bad_input(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(5))
    cache = _cache(model, tokens)
    with pytest.raises(InvalidInputError, match="run_with_cache"):
        HomogenizationProfile.from_cache(torch.zeros(2, 8, 64))
    with pytest.raises(InvalidInputError, match="no residual-stream hook point"):
        PositionalSimilarity.from_cache({"blocks.0.attn.hook_pattern": torch.zeros(2, 4, 8, 8)})
    with pytest.raises(InvalidInputError, match="float"):
        HomogenizationProfile.from_cache({"blocks.0.hook_resid_pre": torch.zeros(2, 8, 4).long()})
    with pytest.raises(InvalidInputError, match="attention_mask"):
        HomogenizationProfile.from_cache(cache, attention_mask=torch.ones(3, 8))
    with pytest.raises(InvalidInputError, match="fewer than 3 tokens"):
        HomogenizationProfile.from_cache(
            cache, attention_mask=torch.tensor([[0] * 6 + [1] * 2, [1] * 8]), exclude_first=True
        )
    with pytest.raises(InvalidInputError, match="layers"):
        MassiveActivations.from_cache(cache, layers=[7])
    with pytest.raises(InvalidInputError, match="median="):
        MassiveActivations.from_cache(cache, median="sequence")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="equal length"):
        PositionalSimilarity.from_cache(
            cache, attention_mask=torch.tensor([[1] * 8, [0] + [1] * 7]), edge_k=2
        )
