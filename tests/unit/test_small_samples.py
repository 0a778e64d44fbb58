"""Issue 39, finding 3: intervals that refuse to claim precision they do not have."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from homoglens.ablation.result import paired_bootstrap
from homoglens.run.data import TokenBatch
from homoglens.run.engine import warn_duplicates


def test_two_sequences_give_no_interval() -> None:
    values = torch.tensor([[0.1], [0.3]])
    with pytest.warns(UserWarning, match="too few"):
        mean, low, high = paired_bootstrap(values)
    assert mean.item() == pytest.approx(0.2)
    assert torch.isnan(low).all() and torch.isnan(high).all()


def test_identical_sequences_give_no_zero_width_interval() -> None:
    values = torch.full((8, 2), 0.25)
    with pytest.warns(UserWarning, match="no spread"):
        _, low, high = paired_bootstrap(values)
    assert torch.isnan(low).all() and torch.isnan(high).all()
    _, zlow, zhigh = paired_bootstrap(torch.zeros(8, 2))  # an exact no-op: [0, 0]
    assert (zlow == 0).all() and (zhigh == 0).all()


@pytest.mark.parametrize("n", [4, 8])
def test_the_interval_covers_at_small_n(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    draws = torch.randn(300, n, 1, generator=gen)
    hits = 0
    for r in range(draws.shape[0]):
        _, low, high = paired_bootstrap(draws[r], n_boot=300, seed=r)
        hits += int(low.item() <= 0.0 <= high.item())
    assert hits / draws.shape[0] >= 0.92  # the percentile interval covered ~0.8 at n = 4


def test_duplicated_windows_are_said() -> None:
    ids = torch.tensor([[5, 6, 7, 0], [0, 5, 6, 7], [1, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1]])
    batch = TokenBatch(ids, mask, bos=False, description="ids")
    with pytest.warns(UserWarning, match="1 of the 3 sequences are exact copies"):
        assert warn_duplicates(batch) == 1
    distinct = TokenBatch(ids[1:], mask[1:], bos=False, description="ids")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_duplicates(distinct) == 0


@pytest.mark.parametrize("n", [4, 16])
def test_estimate_covers_at_small_n(n: int) -> None:
    """The bias curves' and slope_at_zero's intervals (stats.estimate) covered 59 % at n = 2
    and 83 % at n = 16 with a normal quantile; Student's t over the blocks covers."""
    from homoglens.core.stats import estimate

    gen = torch.Generator().manual_seed(100 + n)
    hits = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(200):
            est = estimate(
                [torch.randn(1, n, generator=gen, dtype=torch.float64)], n_boot=300, seed=r
            )
            hits += int(est.ci_low <= 0.0 <= est.ci_high)
    assert hits / 200 >= 0.92
    with pytest.warns(UserWarning, match="too few"):
        assert math.isnan(estimate([torch.tensor([[0.1, 0.3]])]).ci_low)


def test_a_chosen_block_too_long_for_the_windows_is_said() -> None:
    """block=100 on 16 windows used blocks of 4 without a word (the result recorded 100)."""
    import warnings

    import torch

    from homoglens.core.stats import estimate

    values = torch.randn(1, 16, generator=torch.Generator().manual_seed(0)).double()
    with pytest.warns(UserWarning, match="block=100 makes fewer than 4 blocks"):
        estimate([values], block=100, n_boot=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "auto" chooses what fits: nothing to say
        estimate([values], block="auto", n_boot=200)
