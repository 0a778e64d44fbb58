"""Intervals and verdicts: block and hierarchical bootstraps, TOST, Holm, three-way verdicts.

The windows homoglens reads come from consecutive stretches of one text, so neighbouring windows
are correlated; an i.i.d. bootstrap over them understates the uncertainty. Intervals here come
from a circular moving-block bootstrap over windows (Politis & Romano 1992; Kuensch 1989): each
resample concatenates randomly placed runs of ``block`` consecutive windows. Between retrained
models the unit of replication is the training seed, so a *hierarchical* bootstrap resamples
seeds first and then window blocks (Saravanan, Berman & Sober 2020, "Application of the
hierarchical bootstrap to multi-level data in neuroscience", arXiv 2007.07797). Window blocks
are drawn once per resample and shared by every model, which keeps the pairing by window
(every model reads the same windows).

A test reports the estimate, its bootstrap standard error, a Wald interval ``value +- q * se``
(``q`` from the normal distribution, or Student's t with Welch-Satterthwaite degrees of
freedom over the window and seed parts of the variance when seeds are resampled), a two-sided
p-value for "no effect", and a TOST p-value for "smaller than the smallest effect size of
interest" (Schuirmann 1987; Lakens 2017, "Equivalence tests",
doi:10.1177/1948550617697177). Families of primary tests are Holm-adjusted (Holm 1979).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from homoglens.errors import InvalidInputError
from homoglens.types import Verdict
from homoglens.validate import as_float, as_int

__all__ = [
    "Verdict",
    "Estimate",
    "window_resamples",
    "seed_resamples",
    "resampled_means",
    "estimate",
    "holm",
    "verdict",
]


@dataclass(frozen=True)
class Estimate:
    """A mean with its bootstrap uncertainty.

    Attributes:
        value: Point estimate (mean over seeds of the mean over windows).
        se: Bootstrap standard error.
        ci_low, ci_high: Wald interval ``value -+ q * se`` at the requested coverage (NaN, as
            ``se``, from a single window and no seeds to resample).
        p: Two-sided p-value of "the true value is 0".
        p_tost: TOST p-value of "|true value| >= sesoi" (small: equivalent to no effect).
        sesoi: Smallest effect size of interest used by ``p_tost``.
        df: Degrees of freedom of the t reference (``inf``: normal, windows only; with seeds,
            Welch-Satterthwaite over the window and seed parts of the variance).
        n_windows: Windows behind each seed's mean.
        n_seeds: Seeds (replicates) behind the estimate (summed over groups for a difference).
        seed_sd: Between-seed standard deviation of the per-seed means (pooled over groups for
            a difference; NaN with one seed per group).
    """

    value: float
    se: float
    ci_low: float
    ci_high: float
    p: float
    p_tost: float
    sesoi: float
    df: float
    n_windows: int
    n_seeds: int
    seed_sd: float


def window_resamples(n: int, *, block: int = 16, n_boot: int = 1000, seed: int = 0) -> torch.Tensor:
    """Window indices of a circular moving-block bootstrap.

    Each resample places ``ceil(n / block)`` runs of ``block`` consecutive windows at uniform
    random starts (wrapping around the end) and keeps the first ``n`` indices. ``block=1`` is
    the i.i.d. bootstrap. With fewer than 4 blocks the resamples would barely vary (one block
    of ``n`` windows only rotates them), so ``block`` is lowered to ``n // 4`` with a warning.

    Args:
        n: Number of windows (>= 1).
        block: Run length, in windows.
        n_boot: Resamples.
        seed: Seed of the draws.

    Returns:
        ``[n_boot n]`` int64 indices into the windows.

    Raises:
        InvalidInputError: bad ``n``, ``block``, ``n_boot`` or ``seed``.

    References:
        Politis & Romano 1992, "A circular block-resampling procedure for stationary data".

    Examples:
        >>> from homoglens.stats import window_resamples
        >>> idx = window_resamples(100, block=10, n_boot=3, seed=0)
        >>> tuple(idx.shape), bool(((idx[:, 1:10] - idx[:, :9]) % 100 == 1).all())
        ((3, 100), True)
    """
    n = as_int("n", n, low=1)
    block = as_int("block", block, low=1)
    if block > 1 and n < 4 * block:
        lowered = max(1, n // 4)
        warnings.warn(
            f"{n} windows make fewer than 4 blocks of {block}; the block bootstrap uses blocks "
            f"of {lowered} (more windows give intervals that respect their correlation)",
            stacklevel=3,
        )
        block = lowered
    n_boot = as_int("n_boot", n_boot, low=1)
    gen = torch.Generator().manual_seed(as_int("seed", seed, low=0, high=2**63 - 1))
    runs = -(-n // block)
    starts = torch.randint(n, (n_boot, runs, 1), generator=gen, device="cpu")
    idx = (starts + torch.arange(block, device="cpu")) % n
    return idx.reshape(n_boot, runs * block)[:, :n]


def seed_resamples(n_seeds: int, *, n_boot: int = 1000, seed: int = 0) -> torch.Tensor:
    """``[n_boot n_seeds]`` indices of seeds drawn with replacement (all 0 for one seed)."""
    n_seeds = as_int("n_seeds", n_seeds, low=1)
    gen = torch.Generator().manual_seed(as_int("seed", seed, low=0, high=2**63 - 1) + 7919)
    return torch.randint(
        n_seeds, (as_int("n_boot", n_boot, low=1), n_seeds), generator=gen, device="cpu"
    )


def resampled_means(
    values: Float[torch.Tensor, "seed window"],
    windows: Int[torch.Tensor, "boot window"],
    seeds: Int[torch.Tensor, "boot seed"] | None = None,
) -> Float[torch.Tensor, " boot"]:
    """Mean over (resampled) seeds of the mean over resampled windows, per resample.

    Args:
        values: ``[seed window]`` per-window values of each seed (NaN: left out of the mean).
        windows: ``[boot window]`` from :func:`window_resamples`, shared by every seed.
        seeds: ``[boot seed]`` from :func:`seed_resamples`, or ``None`` to keep every seed.

    Returns:
        ``[boot]`` float64.
    """
    x = values.double()
    per_seed = torch.stack([row[windows].nanmean(-1) for row in x], dim=-1)  # [boot seed]
    if seeds is not None:
        per_seed = torch.gather(per_seed, 1, seeds)
    return per_seed.mean(-1)


def _t_quantile(q: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (normal for infinite df)."""
    from scipy import stats

    return float(stats.norm.ppf(q) if math.isinf(df) else stats.t.ppf(q, df))


def _t_cdf(t: float, df: float) -> float:
    """CDF of Student's t with ``df`` degrees of freedom (normal for infinite df)."""
    from scipy import stats

    return float(stats.norm.cdf(t) if math.isinf(df) else stats.t.cdf(t, df))


def estimate(
    groups: Sequence[Float[torch.Tensor, "seed window"]],
    *,
    weights: Sequence[float | int] | None = None,
    windows: Int[torch.Tensor, "boot window"],
    resample_seeds: bool,
    sesoi: float = 0.01,
    ci: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Estimate ``sum_g weights[g] * mean_seed mean_window groups[g]`` with a bootstrap.

    One group of weight 1 is a mean; two groups with weights (1, -1) a difference between
    variants; paired differences within a model (ablated - intact) are one group of
    per-window differences.

    Args:
        groups: Per group, ``[seed window]`` per-window values of each seed (the same windows,
            in the same order, for every group and seed).
        weights: One weight per group (default: all 1).
        windows: ``[boot window]`` from :func:`window_resamples`, shared by every group.
        resample_seeds: Resample seeds within each group too (hierarchical bootstrap). The
            bootstrap variance is then scaled by ``n / (n - 1)`` (``n``: fewest seeds of a
            group), undoing the bootstrap's shrinkage of the seed-level variance, and the
            interval uses Student's t with Welch-Satterthwaite degrees of freedom from its two
            parts: the window part (blocks of a resample - 1 degrees of freedom) and the seed
            part (``seeds - 1`` per group): with few seeds and a large between-seed spread
            ``df`` falls to ``seeds - groups``, with seeds that agree it rises with the blocks.
        sesoi: Smallest effect size of interest, > 0, in the unit of the values.
        ci: Coverage of the interval, in (0, 1).
        seed: Seed of the seed resampling.

    Returns:
        An :class:`Estimate`.

    Raises:
        InvalidInputError: no groups, mismatched shapes or weights, bad ``sesoi``/``ci``.

    References:
        Saravanan et al. 2020, arXiv 2007.07797 (hierarchical bootstrap); Lakens 2017 (TOST).

    Examples:
        >>> import torch
        >>> from homoglens.stats import estimate, window_resamples
        >>> values = torch.linspace(-1, 1, 200)[None] * 0.01 + 0.05  # [seed window]
        >>> est = estimate([values], windows=window_resamples(200, block=10), resample_seeds=False)
        >>> round(est.value, 3), est.ci_low < 0.05 < est.ci_high, est.p < 0.001
        (0.05, True, True)
    """
    if not groups:
        raise InvalidInputError("estimate() needs at least one group of values")
    weights = [1.0] * len(groups) if weights is None else [float(w) for w in weights]
    if len(weights) != len(groups):
        raise InvalidInputError(f"{len(weights)} weights for {len(groups)} groups")
    sesoi = as_float("sesoi", sesoi, low=0.0, high=math.inf)
    ci = as_float("ci", ci, low=0.0, high=1.0)
    n_window = int(windows.shape[1])
    for g in groups:
        if g.ndim != 2 or int(g.shape[1]) != n_window:
            raise InvalidInputError(
                f"each group must be [seed window] with {n_window} windows, got {tuple(g.shape)}"
            )
    n_boot = int(windows.shape[0])
    dist = torch.zeros(n_boot, dtype=torch.float64, device="cpu")
    flat = torch.zeros(n_boot, dtype=torch.float64, device="cpu")  # windows resampled, seeds kept
    value, n_seeds, sd_num, sd_den = 0.0, 0, 0.0, 0
    seed_var, seed_df_den = 0.0, 0.0  # Welch-Satterthwaite over the groups' seed means
    for i, (g, w) in enumerate(zip(groups, weights, strict=True)):
        seeds = seed_resamples(g.shape[0], n_boot=n_boot, seed=seed + i) if resample_seeds else None
        dist += w * resampled_means(g, windows, seeds)
        flat += w * resampled_means(g, windows, None)
        means = g.double().nanmean(1)
        value += w * float(means.mean())
        n_g = int(g.shape[0])
        n_seeds += n_g
        if n_g > 1:
            var = float(means.var(unbiased=True))
            sd_num += var * (n_g - 1)
            sd_den += n_g - 1
            part = w * w * var / n_g
            seed_var += part
            seed_df_den += part * part / (n_g - 1)
    se = float(dist.std(unbiased=True)) if n_boot > 1 else math.nan
    fewest = min(int(g.shape[0]) for g in groups)
    if n_window < 2 and not (resample_seeds and fewest > 1):
        se = math.nan  # one unit of replication: resampling it shows no spread, so no interval
    df = math.inf
    if resample_seeds and fewest > 1:
        se *= math.sqrt(fewest / (fewest - 1))
        window_var = float(flat.var(unbiased=True)) if n_boot > 1 else 0.0
        steps = (windows[0, 1:] - windows[0, :-1]) % max(n_window, 1)
        window_df = max(1.0, float((steps != 1).sum()))  # blocks in a resample - 1
        num = (window_var + seed_var) ** 2
        den = window_var**2 / window_df + (seed_df_den if seed_var > 0 else 0.0)
        df = num / den if den > 0 else math.inf
    q = _t_quantile(1 - (1 - ci) / 2, df)
    if se > 0 and math.isfinite(se):
        p = 2 * (1 - _t_cdf(abs(value) / se, df))
        p_tost = max(1 - _t_cdf((value + sesoi) / se, df), _t_cdf((value - sesoi) / se, df))
    else:  # no spread to judge by (one window, or identical resamples): no test
        p = p_tost = math.nan
    return Estimate(
        value=value,
        se=se,
        ci_low=value - q * se,
        ci_high=value + q * se,
        p=p if math.isnan(p) else min(1.0, max(0.0, p)),
        p_tost=p_tost if math.isnan(p_tost) else min(1.0, max(0.0, p_tost)),
        sesoi=sesoi,
        df=df,
        n_windows=n_window,
        n_seeds=n_seeds,
        seed_sd=math.sqrt(sd_num / sd_den) if sd_den else math.nan,
    )


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error).

    Sorted ascending, the i-th smallest of m p-values becomes ``max_{j <= i} min(1, (m - j + 1)
    p_(j))``. A NaN p-value (a test that could not be run) stays NaN but still counts in m, as
    if it were 1, so that it cannot make the others look stronger.

    References:
        Holm 1979, "A simple sequentially rejective multiple test procedure".

    Examples:
        >>> from homoglens.stats import holm
        >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03, 0.005])]
        [0.03, 0.06, 0.06, 0.02]
    """
    values = [float(x) for x in p]
    order = sorted((v, i) for i, v in enumerate(values) if not math.isnan(v))
    m = len(values)
    out = [math.nan] * len(values)
    running = 0.0
    for rank, (v, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * v))
        out[i] = running
    return out


def verdict(
    value: float, p: float, p_tost: float, *, predicted: int, alpha: float = 0.05
) -> Verdict:
    """Three-way verdict on a directional claim with a smallest effect size of interest.

    * ``"equivalent"``: TOST rejects an effect as large as the SESOI (``p_tost < alpha``): the
      effect, if any, is too small to matter (this includes significant but negligible effects);
    * ``"holds"``: significantly different from 0 (``p < alpha``) on the predicted side;
    * ``"fails"``: significantly different from 0 on the other side;
    * ``"inconclusive"``: none of these.

    Args:
        value: The estimate.
        p: Its (adjusted) two-sided p-value of "no effect".
        p_tost: Its (adjusted) TOST p-value.
        predicted: +1 or -1, the sign the claim predicts.
        alpha: Level of every test.

    Returns:
        The verdict.
    """
    if predicted not in (1, -1):
        raise InvalidInputError(f"predicted={predicted!r} must be +1 or -1")
    if not math.isnan(p_tost) and p_tost < alpha:
        return "equivalent"
    if not math.isnan(p) and p < alpha and value != 0:
        return "holds" if (value > 0) == (predicted > 0) else "fails"
    return "inconclusive"
