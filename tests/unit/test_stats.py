"""stats: block and hierarchical bootstraps, TOST, Holm and verdicts, against closed forms and
simulated coverage."""

from __future__ import annotations

import math

import pytest
import torch

from homoglens import InvalidInputError
from homoglens.core.stats import (
    MIN_WINDOWS,
    as_block,
    auto_block,
    estimate,
    holm,
    seed_resamples,
    verdict,
    window_resamples,
)


def test_block_resamples_are_runs_of_consecutive_windows() -> None:
    idx = window_resamples(100, block=10, n_boot=50, seed=1)
    assert idx.shape == (50, 100) and int(idx.min()) >= 0 and int(idx.max()) < 100
    steps = (idx[:, 1:] - idx[:, :-1]) % 100
    inside = torch.arange(1, 100) % 10 != 0  # within a run every step is +1 (mod n)
    assert bool((steps[:, inside] == 1).all())
    assert torch.equal(idx, window_resamples(100, block=10, n_boot=50, seed=1))
    with pytest.warns(UserWarning, match="fewer than 4 blocks"):
        small = window_resamples(12, block=16, n_boot=5)
    assert small.shape == (5, 12)
    with pytest.raises(InvalidInputError):
        window_resamples(0)


def test_iid_standard_error_and_coverage() -> None:
    """i.i.d. normal values: the bootstrap SE is sd / sqrt(n) within 10 %, and the 95 % interval
    covers the true mean in about 95 % of 200 samples."""
    gen = torch.Generator().manual_seed(2)
    covered = 0
    for rep in range(200):
        x = torch.randn(1, 200, generator=gen, dtype=torch.float64) + 0.3
        est = estimate(
            [x], windows=window_resamples(200, block=1, n_boot=400, seed=rep), resample_seeds=False
        )
        covered += est.ci_low <= 0.3 <= est.ci_high
        if rep == 0:
            assert abs(est.se / (float(x.std()) / math.sqrt(200)) - 1) < 0.1
            # Student's t over the blocks of a resample (block 1: about n - 1 df)
            assert 150 < est.df < 200 and est.n_seeds == 1 and math.isnan(est.seed_sd)
    assert 0.90 <= covered / 200 <= 0.99


def test_block_bootstrap_sees_the_correlation_the_iid_one_misses() -> None:
    """AR(1) values (rho = 0.9): the i.i.d. SE is far too small; blocks of 32 come close to the
    long-run SE sd * sqrt((1 + rho) / (1 - rho) / n)."""
    gen = torch.Generator().manual_seed(3)
    n, rho = 2000, 0.9
    e = torch.randn(n, generator=gen, dtype=torch.float64)
    x = torch.empty(n, dtype=torch.float64)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = rho * x[i - 1] + math.sqrt(1 - rho * rho) * e[i]
    true_se = math.sqrt((1 + rho) / (1 - rho) / n)
    iid = estimate([x[None]], windows=window_resamples(n, block=1), resample_seeds=False)
    block = estimate([x[None]], windows=window_resamples(n, block=32), resample_seeds=False)
    assert iid.se < 0.4 * true_se
    assert 0.7 < block.se / true_se < 1.3


def test_hierarchical_difference_uses_seeds_as_the_unit() -> None:
    """Two variants x 3 seeds, each seed offset by a large seed effect: the hierarchical SE
    reflects the between-seed spread (t with about 4 Welch-Satterthwaite df: the shared windows
    cancel in the difference) and the window-only SE does not; with seeds that agree and noisy
    windows the df rise toward the number of blocks."""
    gen = torch.Generator().manual_seed(4)
    windows = torch.randn(300, generator=gen, dtype=torch.float64) * 0.1  # shared by all
    a = torch.stack([windows + 0.2 + 0.05 * s for s in (-1, 0, 1)])
    b = torch.stack([windows + 0.0 + 0.05 * s for s in (-1.2, 0.1, 1.1)])
    idx = window_resamples(300, block=10, seed=0)
    hier = estimate([a, b], weights=[1, -1], windows=idx, resample_seeds=True)
    with pytest.warns(UserWarning, match="no spread"):  # shared windows cancel exactly
        flat = estimate([a, b], weights=[1, -1], windows=idx, resample_seeds=False)
    assert abs(hier.value - (a.mean() - b.mean()).item()) < 1e-12
    assert 3.5 < hier.df <= 4.0 + 1e-9 and hier.n_seeds == 6
    assert abs(hier.seed_sd - 0.05 * math.sqrt(((1 + 0 + 1) + (1.44 + 0.01 + 1.21)) / 4)) < 0.01
    assert math.isnan(flat.se) and hier.se > 0.01  # windows alone: no spread, no interval
    assert hier.ci_high - hier.ci_low > 2 * 2.776 * hier.se
    noisy = torch.randn(3, 300, generator=gen, dtype=torch.float64) * 1e-4 + windows
    same = estimate([noisy], windows=idx, resample_seeds=True)
    assert same.df > 20  # window-dominated: 30 blocks, seeds barely differ


def test_tost_and_verdicts() -> None:
    idx = window_resamples(400, block=1, seed=0)
    gen = torch.Generator().manual_seed(5)
    noise = torch.randn(1, 400, generator=gen, dtype=torch.float64) * 0.02
    null = estimate([noise - noise.mean()], windows=idx, resample_seeds=False, sesoi=0.01)
    assert null.p_tost < 0.05 and null.p > 0.5
    assert verdict(null.value, null.p, null.p_tost, predicted=+1) == "equivalent"
    big = estimate([noise + 0.05], windows=idx, resample_seeds=False, sesoi=0.01)
    assert verdict(big.value, big.p, big.p_tost, predicted=+1) == "holds"
    assert verdict(big.value, big.p, big.p_tost, predicted=-1) == "fails"
    vague = estimate([noise * 20], windows=idx, resample_seeds=False, sesoi=0.01)
    assert verdict(vague.value, vague.p, vague.p_tost, predicted=+1) == "inconclusive"
    flat = estimate([torch.zeros(1, 400, dtype=torch.float64)], windows=idx, resample_seeds=False)
    assert math.isnan(flat.p) and verdict(flat.value, flat.p, flat.p_tost, predicted=1) == (
        "inconclusive"
    )


def test_holm_matches_the_textbook_example() -> None:
    # p = (0.01, 0.04, 0.03, 0.005): sorted 0.005, 0.01, 0.03, 0.04 -> 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm([0.2, math.nan, 0.01])  # the NaN test still counts in the family
    assert out[0] == pytest.approx(0.4) and math.isnan(out[1]) and out[2] == pytest.approx(0.03)


def test_seed_resamples_shape() -> None:
    assert seed_resamples(3, n_boot=7).shape == (7, 3)
    assert bool((seed_resamples(1, n_boot=4) == 0).all())


def test_one_window_gives_no_interval() -> None:
    """One window (the unit of replication of one model) shows no spread when resampled: the
    estimate keeps its value with a NaN interval and no test, not a zero-width interval."""
    x = torch.tensor([[0.25]])
    est = estimate([x], windows=window_resamples(1, block=1, n_boot=50), resample_seeds=False)
    assert est.value == pytest.approx(0.25)
    assert math.isnan(est.ci_low) and math.isnan(est.ci_high) and math.isnan(est.p)
    seeds = torch.tensor([[0.2], [0.3], [0.25]])  # three seeds of one window each: an interval
    est = estimate([seeds], windows=window_resamples(1, block=1, n_boot=200), resample_seeds=True)
    assert est.ci_low < est.value < est.ci_high


def _ar(n: int, rho: float, gen: torch.Generator) -> torch.Tensor:
    e = torch.randn(n, generator=gen, dtype=torch.float64)
    x = torch.empty(n, dtype=torch.float64)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = rho * x[i - 1] + math.sqrt(1 - rho * rho) * e[i]
    return x


def test_auto_block_is_one_for_independent_windows_and_grows_with_correlation() -> None:
    gen = torch.Generator().manual_seed(5)
    iid = [auto_block(torch.randn(256, generator=gen)) for _ in range(20)]
    assert sum(b == 1 for b in iid) >= 12 and max(iid) <= 6  # the AR(1) floor: 1-5
    correlated = [auto_block(_ar(256, 0.6, gen)) for _ in range(20)]
    assert sorted(correlated)[10] >= 8
    assert auto_block(torch.zeros(50)) == 1 and auto_block(torch.ones(3)) == 1
    assert as_block("auto") == "auto" and as_block(3) == 3
    for bad in (0, -1, 2.5, "16", True, None):
        with pytest.raises(InvalidInputError, match="block"):
            as_block(bad)


def test_too_few_windows_or_no_spread_give_nan_with_a_warning_never_zero_width() -> None:
    """Issue 38: fewer than MIN_WINDOWS windows, or identical windows, give NaN (with a
    warning), not a zero-width or [min, max] interval."""
    x = torch.tensor([[0.1, 0.3, 0.2]], dtype=torch.float64)
    assert x.shape[1] < MIN_WINDOWS
    with pytest.warns(UserWarning, match="too few"):
        est = estimate([x])
    assert est.value == pytest.approx(0.2) and math.isnan(est.ci_low) and math.isnan(est.p)
    with pytest.warns(UserWarning, match="no spread"):
        flat = estimate([torch.full((1, 12), 0.5, dtype=torch.float64)])
    assert math.isnan(flat.se) and math.isnan(flat.ci_high) and math.isnan(flat.p_tost)


def test_the_default_interval_uses_t_over_blocks() -> None:
    """With the block drawn here, df = blocks - 1 exactly and the interval is value -+ t * se."""
    from scipy import stats as st

    x = torch.randn(1, 40, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    est = estimate([x], block=4)
    assert est.df == 9
    q = st.t.ppf(0.975, 9)
    assert est.ci_high - est.value == pytest.approx(q * est.se)


def test_a_significant_value_whose_interval_reaches_inside_the_sesoi_says_so() -> None:
    """Issue 51, point 3: SmolLM2's layer 30, (a) last, read +0.0029 against a SESOI of 0.0034
    and was a bare "holds". Significant but possibly below what matters is its own verdict."""
    small = dict(p=0.001, p_tost=0.3, predicted=+1, sesoi=0.0034)
    assert verdict(0.0029, ci=(0.0011, 0.0047), **small) == "holds, possibly negligible"
    assert verdict(0.0050, ci=(0.0040, 0.0060), **small) == "holds"  # wholly beyond the SESOI
    assert verdict(0.0050, ci=(0.0020, 0.0080), **small) == "holds, possibly negligible"
    assert verdict(-0.0029, ci=(-0.0047, -0.0011), **small) == "fails, possibly negligible"
    assert verdict(-0.0050, ci=(-0.0060, -0.0040), **small) == "fails"
    assert verdict(0.0029, 0.001, 0.3, predicted=+1) == "holds"  # no interval given: as before
    assert verdict(0.0029, 0.001, 0.3, predicted=+1, ci=(math.nan, math.nan), sesoi=0.0034) == (
        "holds"
    )
    assert verdict(0.0001, 0.001, 0.01, predicted=+1, ci=(0.0, 0.0002), sesoi=0.0034) == (
        "equivalent"  # TOST first, as before
    )
    with pytest.raises(InvalidInputError, match="sesoi"):
        verdict(0.0029, ci=(0.0011, 0.0047), p=0.001, p_tost=0.3, predicted=1, sesoi=-1.0)
    with pytest.raises(InvalidInputError, match=r"\(low, high\)"):
        verdict(0.0029, 0.001, 0.3, predicted=1, ci=(0.0011,), sesoi=0.0034)  # type: ignore[arg-type]
