"""Analytic golden values and brute-force checks of the pure statistics (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from homoglens import (
    HomogenizationProfile,
    InvalidInputError,
    NonFiniteActivationError,
    cosine_homogenization,
)


def brute(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sequence statistics written the slow, obvious way (float64, explicit loops)."""
    x = x.double()
    t = x.shape[0]
    cos = torch.nn.functional.cosine_similarity(x[:, None, :], x[None, :, :], dim=-1)
    others = torch.stack([(cos[p].sum() - cos[p, p]) / (t - 1) for p in range(t)])
    prefix = torch.stack(
        [cos[p, :p].mean() if p > 0 else torch.tensor(math.nan) for p in range(t)]
    ).double()
    mean = x.mean(0)
    to_mean = torch.nn.functional.cosine_similarity(x, mean[None], dim=-1)
    pairwise = (cos.sum() - cos.diagonal().sum()) / (t * (t - 1))
    rel = torch.linalg.norm(x - mean) / torch.linalg.norm(x)
    return {
        "to_others": others,
        "to_prefix": prefix,
        "to_mean": to_mean,
        "mean_pairwise": pairwise,
        "relative_residual": rel,
    }


def test_identical_vectors_give_one() -> None:
    x = torch.randn(1, 1, 16, dtype=torch.float64).expand(3, 7, 16).clone() * 3.0
    prof = cosine_homogenization(x)
    assert torch.allclose(prof.to_others[0], torch.ones(7, dtype=torch.float64))
    assert prof.mean_pairwise.item() == pytest.approx(1.0, abs=1e-12)
    assert prof.baseline.item() == pytest.approx(1.0, abs=1e-12)
    assert prof.adjusted.item() == pytest.approx(0.0, abs=1e-12)
    assert prof.relative_residual.item() == pytest.approx(0.0, abs=1e-7)


def test_nearly_constant_rows_keep_their_relative_residual() -> None:
    """float32 rows that differ by 1e-3 of their norm (sequence 0) beside ordinary ones
    (sequence 1): ||X - 1 xbar^T|| would lose its digits to cancellation in sum ||x||^2 -
    ||sum x||^2 / T, so such sequences take the direct sum; both match float64 brute force."""
    torch.manual_seed(6)
    base = torch.randn(1, 1, 64, dtype=torch.float64) * 5.0
    near = base + 5e-3 * torch.randn(1, 40, 64, dtype=torch.float64)
    x64 = torch.cat([near, torch.randn(1, 40, 64, dtype=torch.float64)])
    x = x64.float()
    got = [cosine_homogenization(x[b : b + 1]).relative_residual.item() for b in range(2)]
    want = [brute(x[b].double())["relative_residual"].item() for b in range(2)]
    assert got[0] == pytest.approx(want[0], rel=1e-4)  # ~1e-3; the formula alone: 2 % off
    assert got[1] == pytest.approx(want[1], rel=1e-6)
    both = cosine_homogenization(x).relative_residual.item()  # one batch, one row of each
    assert both == pytest.approx(sum(want) / 2, rel=1e-6)


def test_orthonormal_set_gives_zero() -> None:
    q, _ = torch.linalg.qr(torch.randn(32, 32, dtype=torch.float64))
    x = q[:10][None]  # ten orthonormal rows
    prof = cosine_homogenization(x, effective_rank=True)
    assert prof.mean_pairwise.item() == pytest.approx(0.0, abs=1e-12)
    assert torch.allclose(prof.to_others[0], torch.zeros(10, dtype=torch.float64), atol=1e-12)
    assert prof.effective_rank.item() == pytest.approx(10.0, abs=1e-9)


def test_effective_rank_identity_and_rank_one() -> None:
    assert cosine_homogenization(
        torch.eye(6, dtype=torch.float64)[None], effective_rank=True
    ).effective_rank.item() == pytest.approx(6.0, abs=1e-9)
    rank1 = torch.outer(torch.arange(1.0, 6.0), torch.randn(8)).double()[None]
    assert cosine_homogenization(rank1, effective_rank=True).effective_rank.item() == pytest.approx(
        1.0, abs=1e-6
    )


def test_statistics_match_brute_force_per_position() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 9, 12, dtype=torch.float64) + 0.5
    prof = cosine_homogenization(x)
    expected = [brute(x[b]) for b in range(4)]
    for name in ("to_others", "to_prefix", "to_mean"):
        want = torch.stack([e[name] for e in expected]).mean(0)
        assert torch.allclose(getattr(prof, name)[0], want, atol=1e-12, equal_nan=True), name
    for name in ("mean_pairwise", "relative_residual"):
        want = torch.stack([e[name] for e in expected]).mean()
        assert getattr(prof, name)[0].item() == pytest.approx(want.item(), abs=1e-12)
    assert torch.allclose(prof.norm[0], x.double().norm(dim=-1).mean(0), atol=1e-12)
    assert prof.count.tolist() == [4.0] * 9


@pytest.mark.parametrize("n_pos", [70, 71, 300, 307])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_dot_products_match_brute_force_across_chunks(dtype, n_pos: int) -> None:
    """Up to T = 256 the cross-chunk products run against every chunk's sum, beyond against
    the sum of the earlier chunks: T = 70 is tiled by five chunks of 14 positions, T = 71
    (prime) by four of 16 and a tail of 7, T = 300 by ten of 30, T = 307 (prime) by nine of 32
    and a tail of 19; padded rows end mid-chunk."""
    torch.manual_seed(3)
    x = (torch.randn(3, n_pos, 24, dtype=torch.float64) + 0.4).to(dtype)
    mask = torch.ones(3, n_pos, dtype=torch.long)
    mask[1, 40:] = 0
    mask[2, 65:] = 0
    prof = cosine_homogenization(x, mask)
    expected = [brute(x[b][mask[b].bool()]) for b in range(3)]
    atol = 1e-12 if dtype == torch.float64 else 2e-6
    for name in ("to_others", "to_prefix", "to_mean"):
        for p in (0, 13, 14, 15, 16, 31, 32, 35, 39, 40, 64, 69, 149, 255, 270, 288, n_pos - 1):
            if p >= n_pos:
                continue
            rows = [e[name][p] for e in expected if p < len(e[name])]
            want = torch.stack(rows).mean()
            got = getattr(prof, name)[0, p]
            assert got.item() == pytest.approx(want.item(), abs=atol, nan_ok=True), (name, p)
    for name in ("mean_pairwise", "relative_residual"):
        want = torch.stack([e[name] for e in expected]).mean()
        assert getattr(prof, name)[0].item() == pytest.approx(want.item(), abs=atol), name


@pytest.mark.parametrize("magnitude", [1e18, 1e-18])
def test_extreme_norms_give_the_same_cosines(magnitude: float) -> None:
    """float32 vectors with norms far from 1 (their dot products would overflow or underflow)
    give the statistics of the same vectors at unit scale."""
    torch.manual_seed(4)
    x = torch.randn(2, 40, 16) + 0.3
    base = cosine_homogenization(x)
    far = cosine_homogenization(x * magnitude)
    for name in ("to_others", "to_prefix", "to_mean", "mean_pairwise", "relative_residual"):
        assert torch.allclose(getattr(far, name), getattr(base, name), atol=1e-6, equal_nan=True)
    assert torch.allclose(far.norm, base.norm * magnitude, rtol=1e-6)


def test_baseline_equals_brute_force_over_cross_sequence_pairs() -> None:
    torch.manual_seed(1)
    x = torch.randn(5, 6, 8, dtype=torch.float64) + 0.3
    mask = torch.ones(5, 6, dtype=torch.long)
    mask[1, 4:] = 0  # unequal lengths: 6, 4, 6, 6, 3
    mask[3, :3] = 0  # left padding
    prof = cosine_homogenization(x, mask)
    vecs = [x[b][mask[b].bool()].double() for b in range(5)]
    total, pairs = 0.0, 0
    for a in range(5):
        for b in range(5):
            if a == b:
                continue
            cos = torch.nn.functional.cosine_similarity(vecs[a][:, None], vecs[b][None], dim=-1)
            total += cos.sum().item()
            pairs += cos.numel()
    assert prof.baseline.item() == pytest.approx(total / pairs, abs=1e-12)


def test_exclude_first_drops_position_zero_everywhere() -> None:
    torch.manual_seed(2)
    x = torch.randn(3, 7, 10, dtype=torch.float64)
    x[:, 0] *= 100.0  # a massive first token
    prof = cosine_homogenization(x, exclude_first=True)
    ref = cosine_homogenization(x[:, 1:])
    assert math.isnan(prof.to_others[0, 0].item()) and prof.count[0].item() == 0
    assert torch.allclose(prof.to_others[0, 1:], ref.to_others[0], atol=1e-12)
    assert prof.mean_pairwise.item() == pytest.approx(ref.mean_pairwise.item(), abs=1e-12)
    assert prof.baseline.item() == pytest.approx(ref.baseline.item(), abs=1e-12)


def test_zero_vector_is_guarded() -> None:
    x = torch.randn(1, 5, 4)
    x[0, 2] = 0.0
    prof = cosine_homogenization(x)
    assert torch.isfinite(prof.to_others).all()


def test_scale_invariance_and_sequence_order() -> None:
    torch.manual_seed(3)
    x = torch.randn(4, 6, 8, dtype=torch.float64)
    scale = torch.rand(4, 6, 1, dtype=torch.float64) * 10 + 0.1
    a, b = cosine_homogenization(x), cosine_homogenization(x * scale)
    c = cosine_homogenization(x.flip(0))
    for other in (b, c):
        assert torch.allclose(a.to_others, other.to_others, atol=1e-12)
        assert torch.allclose(a.baseline, other.baseline, atol=1e-12)


def test_too_few_tokens_is_an_error() -> None:
    with pytest.raises(InvalidInputError, match="at least 2"):
        cosine_homogenization(torch.randn(2, 1, 4))
    with pytest.raises(InvalidInputError, match="at least 2"):
        cosine_homogenization(torch.randn(2, 2, 4), exclude_first=True)


def test_bad_shapes_are_errors() -> None:
    with pytest.raises(InvalidInputError, match="batch pos d_model"):
        cosine_homogenization(torch.randn(4, 8))
    with pytest.raises(InvalidInputError, match="attention_mask"):
        cosine_homogenization(torch.randn(2, 4, 8), torch.ones(2, 5))


def test_post_init_checks_shapes() -> None:
    prof = cosine_homogenization(torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match="to_others_sum has shape"):
        HomogenizationProfile(**{**prof.__dict__, "to_others_sum": torch.zeros(2, 4)})


def test_float32_and_low_precision_inputs_agree_with_float64() -> None:
    """Elementwise work runs in float32 for float32/bf16/fp16 inputs; sums are float64."""
    torch.manual_seed(4)
    x = torch.randn(6, 40, 64, dtype=torch.float64) + 0.2
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-5), (torch.float16, 1e-5)):
        low = x.to(dtype)
        exact = cosine_homogenization(low.double(), effective_rank=True)  # same inputs, float64
        got = cosine_homogenization(low, effective_rank=True)
        for name in (
            "to_others",
            "to_prefix",
            "to_mean",
            "mean_pairwise",
            "baseline",
            "relative_residual",
        ):
            diff = (getattr(got, name) - getattr(exact, name)).abs().nan_to_num().max().item()
            assert diff < tol, (dtype, name, diff)
        assert abs(got.effective_rank.item() - exact.effective_rank.item()) < 1e-3


def test_non_finite_vectors_are_reported() -> None:
    from homoglens import NonFiniteActivationError

    x = torch.randn(2, 5, 4)
    x[1, 3, 2] = float("nan")
    with pytest.raises(NonFiniteActivationError, match="1 counted residual"):
        cosine_homogenization(x)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0  # the NaN sits on a pad: not counted, not an error
    assert torch.isfinite(cosine_homogenization(x, mask).mean_pairwise).all()


def test_unit_row_rank_metrics_equal_brute_force_and_ignore_massive_activations() -> None:
    """Unit-row effective rank and matrix entropy (with and without position 0) equal a float64
    SVD by hand; one massive entry on x_0 collapses the norm-weighted effective rank but moves
    the unit-row metrics little, and the *_no_first ones not at all."""
    from homoglens import cosine_homogenization

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, 64, generator=gen, dtype=torch.float64) + 0.5

    def by_hand(v: torch.Tensor) -> tuple[float, float]:
        u = v / v.norm(dim=-1, keepdim=True)
        s = torch.linalg.svdvals(u)
        p = s / s.sum()
        lam = s**2 / (s**2).sum()
        return float(torch.exp(-(p * p.log()).sum())), float(-(lam * lam.log()).sum())

    prof = cosine_homogenization(x, effective_rank=True)
    ranks, ents = zip(*(by_hand(x[b]) for b in range(6)), strict=True)
    rest = [by_hand(x[b, 1:]) for b in range(6)]
    assert abs(float(prof.unit_effective_rank[0]) - sum(ranks) / 6) < 1e-10
    assert abs(float(prof.matrix_entropy[0]) - sum(ents) / 6) < 1e-10
    assert abs(float(prof.unit_effective_rank_no_first[0]) - sum(r for r, _ in rest) / 6) < 1e-10
    assert abs(float(prof.matrix_entropy_no_first[0]) - sum(e for _, e in rest) / 6) < 1e-10
    spiked = x.clone()
    spiked[:, 0, 3] = 1000.0
    after = cosine_homogenization(spiked, effective_rank=True)
    assert float(after.effective_rank[0]) < 0.3 * float(prof.effective_rank[0])
    assert abs(float(after.unit_effective_rank[0]) / float(prof.unit_effective_rank[0]) - 1) < 0.05
    assert torch.allclose(after.unit_effective_rank_no_first, prof.unit_effective_rank_no_first)
    assert torch.allclose(after.matrix_entropy_no_first, prof.matrix_entropy_no_first)
    identity = cosine_homogenization(torch.eye(8, dtype=torch.float64)[None], effective_rank=True)
    assert abs(float(identity.unit_effective_rank[0]) - 8) < 1e-9
    assert abs(float(identity.matrix_entropy[0]) - math.log(8)) < 1e-9


def test_extreme_magnitudes_give_the_right_cosines() -> None:
    from homoglens import PositionalSimilarity
    from homoglens.profile.homogenization import homogenization_sums

    torch.manual_seed(0)
    x = torch.randn(2, 12, 16)
    pos = torch.arange(12).repeat(2, 1)
    ref = homogenization_sums(x, pos, 12)
    for factor in (1e20, 1e-30):
        got = homogenization_sums(x * factor, pos, 12)
        for name in ("to_others_sum", "mean_pairwise_sum", "relative_residual_sum"):
            torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=0)
        torch.testing.assert_close(got["norm_sum"] / factor, ref["norm_sum"], rtol=1e-5, atol=0)
    same = torch.full((2, 5, 8), 1e-30)
    ones = homogenization_sums(same, torch.arange(5).repeat(2, 1), 5)
    assert float(ones["mean_pairwise_sum"]) == pytest.approx(2.0)
    sim = PositionalSimilarity.from_activations(torch.randn(8, 20, 16) * 1e20, edge_k=4)
    assert bool(torch.isfinite(sim.M).all())
    tiny = PositionalSimilarity.from_activations(torch.full((4, 20, 8), 1e-30), edge_k=4)
    torch.testing.assert_close(tiny.M, torch.ones_like(tiny.M))


@pytest.mark.parametrize("shape", [(3, 12, 20), (3, 20, 12)])  # pos <= d_model and pos > d_model
def test_rank_singular_values_equal_float64_svd(shape: tuple[int, int, int]) -> None:
    """The Gram-eigenvalue route of the rank metrics equals float64 SVD of each scaled matrix
    (both branches), with a massive first row and a pad row."""
    from homoglens.profile.rank_metrics import _singular_values

    torch.manual_seed(0)
    x = torch.randn(*shape)
    x[:, 0] *= 1000.0
    weight = torch.ones(shape[:2])
    weight[1, -2:] = 0.0
    scale = weight / x.norm(dim=-1)
    rest = weight.clone()
    rest[:, 0] = 0.0
    rows = (weight, scale, scale * rest)
    for got, r in zip(_singular_values(x, rows), rows, strict=True):
        want = torch.linalg.svdvals(x.double() * r.double()[..., None])
        top = want.max(-1, keepdim=True).values
        assert torch.allclose(got.sort(-1).values / top, want.sort(-1).values / top, atol=1e-12)


@pytest.mark.parametrize("case", ["plain", "huge", "tiny", "near_constant", "nan_pad", "zero"])
def test_the_unsynchronised_path_equals_the_cpu_path(case: str, monkeypatch) -> None:
    """On a GPU the vectors are read without a host synchronisation per layer (every sequence
    rescaled by its power of two, NaN/inf flagged for one check per batch, the centred sum
    taken directly everywhere): the same sums as the CPU path, and the same error."""
    import homoglens.profile.homogenization as hom

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 40, 16, generator=gen)
    mask = torch.ones(3, 40, dtype=torch.long)
    mask[1, 30:] = 0
    if case == "huge":
        x[0] *= 1e25
    elif case == "tiny":
        x[2] *= 1e-25
    elif case == "near_constant":
        x[1] = 5.0 + 1e-4 * x[1]
    elif case == "nan_pad":
        x[1, 35] = float("nan")
    elif case == "zero":
        x[0, 3] = 0.0
    pos = hom.positions_from_mask(mask)
    counted = hom.counted_tokens(pos, torch.float32, torch.device("cpu"))
    want = hom.entry_terms(x, pos, effective_rank=True)
    got = hom.prepared_terms(*hom.prepare_entry(x, counted.weight), counted, effective_rank=True)
    hom.check_terms([got])
    a = hom.sums_of_terms(hom.stack_terms([want]), pos, 40)
    b = hom.sums_of_terms(hom.stack_terms([got]), pos, 40)
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-6, atol=1e-9, equal_nan=True), name
    x[0, 5] = float("inf")  # a counted vector: flagged, then refused once per batch
    bad = hom.prepared_terms(*hom.prepare_entry(x, counted.weight), counted)
    with pytest.raises(NonFiniteActivationError, match="blocks.3.hook_resid_post"):
        hom.check_terms([got, bad], ["blocks.2.hook_resid_post", "blocks.3.hook_resid_post"])
