"""Oracle: compression_valleys' per-layer first-token norm, median norm, raw-row matrix entropy
and sink rate against plain Hugging Face forward passes (``output_hidden_states``,
``output_attentions``, eager attention) in float64 on the shipped tiny-rotary-bos model, the
entropy by brute-force SVD; a null (rows of equal norm: the raw-row entropy is the unit-row
entropy) and an invariant (an ablation of no dims is no ablation)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import BACKENDS
from homoglens import compression_valleys, load_model
from homoglens.models.loading import shipped_model_folder
from homoglens.profile.rank_metrics import raw_matrix_entropy

MODEL = "homoglens/tiny-rotary-bos"
EPS = 0.3
TOL = 1e-6


def _tokens() -> torch.Tensor:
    """Five windows of 16 tokens, each opening with the model's BOS (id 1 here)."""
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(5, 500, (5, 16), generator=gen)
    tokens[:, 0] = 1
    return tokens


def _oracle(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """``[batch layer]`` first norm, lower-median other norm, entropy and ``[batch block]``
    sink rate from a float64 Hugging Face forward pass."""
    hf = AutoModelForCausalLM.from_pretrained(
        str(shipped_model_folder(MODEL)), torch_dtype=torch.float64, attn_implementation="eager"
    ).eval()
    last: list[torch.Tensor] = []
    handle = hf.base_model.layers[-1].register_forward_hook(
        lambda mod, args, out: last.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            out = hf(tokens, output_hidden_states=True, output_attentions=True)
    finally:
        handle.remove()
    hidden = [*out.hidden_states[:-1], last[0]]  # the last HF state has the final norm
    first, median, entropy = [], [], []
    for h in hidden:
        norms = h.norm(dim=-1)
        first.append(norms[:, 0])
        median.append(norms[:, 1:].median(dim=1).values)  # the lower median, as torch's
        ent = []
        for x in h:
            s2 = torch.linalg.svdvals(x) ** 2
            p = s2 / s2.sum()
            p = p[p > 0]
            ent.append(float(-(p * p.log()).sum()) / math.log(min(x.shape)))
        entropy.append(torch.tensor(ent, dtype=torch.float64))
    rates = []
    for a in out.attentions:  # [batch head query key]
        alpha = a[..., 0].mean(-1)  # Gu et al.: mean over queries q >= 0 of A[q, 0]
        rates.append((alpha > EPS).double().mean(-1))
    return {
        "first_norm": torch.stack(first, 1),
        "median_norm": torch.stack(median, 1),
        "entropy": torch.stack(entropy, 1),
        "sink_rate": torch.stack(rates, 1),
    }


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return _tokens()


@pytest.fixture(scope="module")
def oracle(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    return _oracle(tokens)


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_hugging_face_in_float64(backend: str, tokens, oracle) -> None:
    model = load_model(
        shipped_model_folder(MODEL), backend=backend, device="cpu", dtype=torch.float64
    )
    cv = compression_valleys(model, tokens, eps=EPS, ablate=False, n_boot=100, progress=False)
    assert cv.layers == tuple(range(model.cfg.n_layers + 1))
    for name, want in oracle.items():
        got = getattr(cv, name)
        assert got.shape == want.shape, name
        assert torch.allclose(got, want, atol=TOL, rtol=0), (name, (got - want).abs().max())
    assert 0 < float(cv.sink_rate.mean()) < 1 or float(cv.sink_rate.std()) == 0
    # the headline: the depth is the mean over windows of H[peak] - H[valley]
    v, u = cv.layers.index(cv.valley_layer), cv.layers.index(cv.peak_layer)
    depth = oracle["entropy"][:, u] - oracle["entropy"][:, v]
    assert float(cv.headline[0, 0]) == pytest.approx(float(depth.mean()), abs=TOL)


def test_equal_norms_give_the_unit_row_entropy() -> None:
    """Null: with every row of the same norm, no token dominates, and the raw-row entropy is
    the unit-row matrix entropy of the profile (rank_sums' matrix_entropy / log min(T, d))."""
    from homoglens.profile.rank_metrics import rank_sums

    gen = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(
        torch.randn(3, 10, 7, generator=gen, dtype=torch.float64), dim=-1
    )
    x = 5.0 * x
    ones = torch.ones(3, 10, dtype=torch.float64)
    raw = raw_matrix_entropy(x, ones)
    for b in range(3):
        unit = rank_sums(x[b : b + 1], ones[b : b + 1] / 5.0, ones[b : b + 1], ones[b : b + 1])
        want = float(unit["matrix_entropy_sum"]) / math.log(7)
        assert float(raw[b]) == pytest.approx(want, abs=1e-10)
    # and a massive first row drives the raw-row entropy towards 0, the unit-row one not
    spiked = x.clone()
    spiked[:, 0] *= 1e4
    assert bool((raw_matrix_entropy(spiked, ones) < 0.01).all())


def test_ablating_no_dims_is_no_ablation(tokens) -> None:
    model = load_model(shipped_model_folder(MODEL), backend=BACKENDS[-1], device="cpu")
    cv = compression_valleys(model, tokens, ablation_layer=1, dims=[], n_boot=100, progress=False)
    assert cv.ablated and cv.ablation_dims == ()
    for name in ("first_norm", "median_norm", "entropy", "sink_rate"):
        assert torch.equal(getattr(cv, f"ablated_{name}"), getattr(cv, name)), name
    assert tuple(cv.headline[1].tolist()) == (0.0, 0.0, 0.0)  # an exact no-op: [0, 0]
    # a real ablation of the first token's dims changes what follows, not what precedes
    zeroed = compression_valleys(
        model, tokens, ablation_layer=1, dims=list(range(8)), n_boot=100, progress=False
    )
    assert torch.equal(zeroed.ablated_entropy[:, 0], zeroed.entropy[:, 0])
    assert not torch.allclose(zeroed.ablated_first_norm[:, 1], zeroed.first_norm[:, 1])
