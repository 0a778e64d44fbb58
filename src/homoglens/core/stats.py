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

The block length is chosen from the data by default (:func:`auto_block`: twice the
Politis-White estimate, 1 for independent windows). A test reports the estimate, its bootstrap
standard error, a Wald interval ``value +- q * se`` (``q`` from Student's t on the blocks of a
resample minus one, or with Welch-Satterthwaite degrees of freedom over the window and seed parts
of the variance when seeds are resampled), a two-sided
p-value for "no effect", and a TOST p-value for "smaller than the smallest effect size of
interest" (Schuirmann 1987; Lakens 2017, "Equivalence tests",
doi:10.1177/1948550617697177). Families of primary tests are Holm-adjusted (Holm 1979).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.resampling import (
    LARGEST,
    as_block,
    auto_block,
    index_table,
    resampled_means,
    seed_resamples,
    window_resamples,
)
from homoglens.core.types import Verdict
from homoglens.core.validate import as_float

MIN_WINDOWS = 4
"""Fewest windows behind an interval over windows: fewer give NaN with a warning."""

MIN_RESAMPLES = 100
"""Fewest bootstrap resamples behind an interval without a warning."""

SESOI_FRACTION = 0.1
"""Default smallest effect of interest of a cosine statistic, as a fraction of its scale."""

SESOI_FLOOR = 1e-3
"""The smallest default SESOI of a cosine statistic (a scale near 0 gives no usable TOST)."""


__all__ = [
    "MIN_RESAMPLES",
    "MIN_WINDOWS",
    "SESOI_FLOOR",
    "SESOI_FRACTION",
    "Estimate",
    "Verdict",
    "as_block",
    "auto_block",
    "default_sesoi",
    "estimate",
    "holm",
    "resampled_means",
    "seed_resamples",
    "verdict",
    "window_resamples",
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


def _real(name: str, value: object, *, nan: bool = True) -> float:
    """``value`` as a float (a Python, numpy or 0-d torch real number; NaN only if ``nan``)."""
    if isinstance(value, (bool, str, bytes, complex)) or getattr(value, "ndim", 0) != 0:
        raise InvalidInputError(f"{name}={value!r} must be a real number")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as err:
        raise InvalidInputError(f"{name}={value!r} must be a real number") from err
    if math.isnan(number) and not nan:
        raise InvalidInputError(f"{name} is NaN; give a number")
    return number


def default_sesoi(scale: float) -> float:
    """The default smallest effect of interest of a cosine statistic whose scale (e.g. the
    model's whole ``|H_W|`` at the layer) is ``scale``: :data:`SESOI_FRACTION` of it, no less
    than :data:`SESOI_FLOOR` (NaN scale: the floor). The sign of ``scale`` does not matter.

    Raises:
        InvalidInputError: ``scale`` is not a real number, or infinite.

    A fixed 0.01 cosine is 20-25 % of the tiny models' whole centred H and accepts edge
    effects a fifth of the homogenization as "no effect"; a fraction of the statistic's own
    scale means the same in every model (Lakens 2017, doi:10.1177/1948550617697177, on
    justifying a SESOI).

    Examples:
        >>> from homoglens.core.stats import default_sesoi
        >>> round(default_sesoi(0.05), 6), default_sesoi(float("nan"))
        (0.005, 0.001)
    """
    scale = _real("scale", scale)
    if math.isnan(scale):
        return SESOI_FLOOR
    if math.isinf(scale):
        raise InvalidInputError("scale is infinite; give the statistic's (finite) scale, or NaN")
    return max(SESOI_FLOOR, SESOI_FRACTION * abs(scale))


def _t_quantile(q: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (normal for infinite df)."""
    from scipy import stats

    return float(stats.norm.ppf(q) if math.isinf(df) else stats.t.ppf(q, df))


def _t_cdf(t: float, df: float) -> float:
    """CDF of Student's t with ``df`` degrees of freedom (normal for infinite df)."""
    from scipy import stats

    return float(stats.norm.cdf(t) if math.isinf(df) else stats.t.cdf(t, df))


def _group(i: int, values: object) -> torch.Tensor:
    """Group ``i`` of :func:`estimate` as a real ``[seed window]`` tensor (numpy accepted),
    finite or NaN, no seed without a value, no value too large to square."""
    if not isinstance(values, torch.Tensor) and hasattr(values, "__array__"):
        values = torch.as_tensor(values)  # a numpy array
    if not isinstance(values, torch.Tensor) or values.ndim != 2 or values.is_complex():
        raise InvalidInputError(
            f"group {i} must be a real [seed window] tensor (one seed: values[None]), got "
            f"{getattr(values, 'shape', type(values).__name__)}"
        )
    if not values.is_floating_point():
        values = values.double()
    if bool(torch.isinf(values).any()):
        raise InvalidInputError(
            f"group {i} holds inf; estimate() takes finite per-window values (NaN: a window "
            "without a value)"
        )
    if bool((values.abs() > LARGEST).any()):
        raise InvalidInputError(
            f"group {i} holds values above {LARGEST:g} in magnitude (their squares overflow); "
            "rescale them"
        )
    empty = torch.isnan(values).all(1)
    if values.shape[1] > 0 and bool(empty.any()):
        raise InvalidInputError(
            f"seed {int(empty.nonzero()[0])} of group {i} has no value (all NaN); leave it out"
        )
    return values


def _checked_groups(
    groups: Sequence[torch.Tensor],
    weights: Sequence[float | int] | None,
    windows: torch.Tensor | None,
) -> tuple[list[torch.Tensor], list[float], torch.Tensor]:
    """:func:`estimate`'s groups and weights checked, and ``[window]`` which windows have a
    value in every group (NaN elsewhere: those are masked in every group, and said)."""
    if isinstance(groups, (torch.Tensor, str, bytes)) or not isinstance(groups, Sequence):
        raise InvalidInputError(
            "groups must be a list of [seed window] tensors, one per group (one group: "
            f"[values]), got {type(groups).__name__}"
        )
    if not groups:
        raise InvalidInputError("estimate() needs at least one group of values")
    groups = [_group(i, g) for i, g in enumerate(groups)]
    if weights is None:
        weights = [1.0] * len(groups)
    elif isinstance(weights, (torch.Tensor, str, bytes)) or not isinstance(weights, Sequence):
        raise InvalidInputError(
            f"weights must be a list of numbers, one per group, got {weights!r}"
        )
    weights = [_real("weight", w, nan=False) for w in weights]
    if len(weights) != len(groups):
        raise InvalidInputError(f"{len(weights)} weights for {len(groups)} groups")
    if any(abs(w) > LARGEST for w in weights):
        raise InvalidInputError(f"weights {weights} must be finite and below {LARGEST:g}")
    n_window = int(groups[0].shape[1])
    if n_window == 0:
        raise InvalidInputError("the groups hold no window; estimate() needs per-window values")
    for g in groups:
        if int(g.shape[1]) != n_window:
            raise InvalidInputError(
                f"each group must be [seed window] with {n_window} windows, got {tuple(g.shape)}"
            )
    if windows is not None:
        index_table("windows", windows, n_window, n_window, "windows")
    # A window counts when every seed of every group has a value for it (the seeds and groups
    # are paired by window); the others are left out of every mean and of n_windows, and said.
    present = torch.stack([~torch.isnan(g).any(0) for g in groups]).all(0)
    n_real = int(present.sum())
    if n_real < n_window:
        warnings.warn(
            f"homoglens: {n_window - n_real} of the {n_window} windows have no value (NaN) and "
            f"are left out; the estimate rests on {n_real} windows",
            UserWarning,
            stacklevel=3,
        )
        return [g.double().masked_fill(~present, math.nan) for g in groups], weights, present
    return list(groups), weights, present


def _drawn_windows(
    groups: Sequence[torch.Tensor],
    weights: Sequence[float],
    present: torch.Tensor,
    block: int | Literal["auto"],
    n_boot: int,
    seed: int,
) -> tuple[torch.Tensor, int]:
    """``[boot window]`` resamples for :func:`estimate` and the block length they use (a
    chosen ``block`` too long for 4 blocks of the windows is lowered, and said)."""
    n_window, n_real = int(present.numel()), int(present.sum())
    asked = block != "auto"  # a block the caller chose: lowering it is said
    if block == "auto":
        series = sum(w * g.double().nanmean(0) for g, w in zip(groups, weights, strict=True))
        series = torch.as_tensor(series)[present]
        block = auto_block(series) if n_real else 1
    block = as_block(block)
    assert block != "auto"
    with warnings.catch_warnings():  # the block is lowered below 4 blocks: said here
        warnings.filterwarnings("ignore", r"\d+ windows make fewer than 4 blocks", UserWarning)
        windows = window_resamples(n_window, block=block, n_boot=n_boot, seed=seed)
    known_block = block if block == 1 or n_window >= 4 * block else max(1, n_window // 4)
    if asked and known_block != block and n_window >= MIN_WINDOWS:
        warnings.warn(
            f"homoglens: block={block} makes fewer than 4 blocks of the {n_window} windows; "
            f"the intervals use blocks of {known_block} windows",
            UserWarning,
            stacklevel=4,
        )
    return windows, known_block


def _window_se(
    se: float,
    window_df: float,
    present: torch.Tensor,
    groups: Sequence[torch.Tensor],
    weights: Sequence[float],
) -> tuple[float, float]:
    """:func:`estimate`'s standard error over windows alone and its degrees of freedom: the
    bootstrap's scaled by ``n / (n - block)``, or NaN (with a warning) below
    :data:`MIN_WINDOWS` windows or with no spread (but exact zeros: an exact no-op)."""
    n_window, n_real = int(present.numel()), int(present.sum())
    df = math.inf
    if n_real < MIN_WINDOWS:
        if n_real >= 1:
            warnings.warn(
                f"{n_real} windows are too few for an interval (at least {MIN_WINDOWS}): "
                "se, interval and p-values are NaN; measure more windows",
                stacklevel=3,
            )
        se = math.nan  # resampling so few units shows no honest spread
    else:
        used = n_window / (window_df + 1)  # the block length, from the runs of a resample
        se *= math.sqrt(n_window / max(n_window - used, 1.0))
        df = window_df
    exact_zero = all(bool((g.double().nan_to_num(1.0) == 0).all()) for g in groups)
    if exact_zero or math.isnan(se):  # every value exactly 0 (an exact no-op): [0, 0] is true
        return se, df
    series = sum(w * g.double().nanmean(0) for g, w in zip(groups, weights, strict=True))
    series = torch.as_tensor(series)[present]
    # Identical per-window values (up to float64 rounding of their sums) have no spread: their
    # bootstrap se is rounding noise (~1e-16), not an interval.
    scale = float(series.abs().max()) if series.numel() else 0.0
    flat = float(series.max() - series.min()) <= 64 * torch.finfo(torch.float64).eps * scale
    if flat or se == 0:
        why = (
            f"the {n_window} windows show no spread (identical per-window values)"
            if flat
            else "the resamples show no spread (each draws the same windows: check windows=)"
        )
        warnings.warn(f"{why}: no interval; se, interval and p-values are NaN", stacklevel=3)
        se = math.nan
    return se, df


class _GroupParts(NamedTuple):
    dist: torch.Tensor  # [boot] the estimate per resample (seeds resampled when asked)
    flat: torch.Tensor  # [boot] the same with every seed kept (the window part of the variance)
    value: float
    n_seeds: int
    seed_var: float  # Welch-Satterthwaite over the groups' seed means: sum w^2 var / n
    seed_df_den: float
    seed_sd: float  # pooled between-seed sd of the per-seed means (NaN: one seed per group)


_PART_FIELDS = ("value", "n_seeds", "seed_sd")
"""The fields of an :class:`Estimate` that :class:`_GroupParts` holds by the same name."""


def _group_parts(
    groups: Sequence[torch.Tensor],
    weights: Sequence[float],
    windows: torch.Tensor,
    resample_seeds: bool,
    seed: int,
) -> _GroupParts:
    """The weighted sum over groups of :func:`estimate`'s resampled means and seed moments."""
    n_boot = int(windows.shape[0])
    dist = torch.zeros(n_boot, dtype=torch.float64, device="cpu")
    flat = torch.zeros(n_boot, dtype=torch.float64, device="cpu")
    value, n_seeds, sd_num, sd_den = 0.0, 0, 0.0, 0
    seed_var, seed_df_den = 0.0, 0.0
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
    seed_sd = math.sqrt(sd_num / sd_den) if sd_den else math.nan
    return _GroupParts(dist, flat, value, n_seeds, seed_var, seed_df_den, seed_sd)


def _p_values(value: float, se: float, df: float, sesoi: float) -> tuple[float, float]:
    """Two-sided p of "no effect" and the TOST p of "|effect| >= sesoi", in [0, 1]; NaN
    when there is no spread to judge by (one window, or identical resamples)."""
    if not (se > 0 and math.isfinite(se)):
        return math.nan, math.nan
    p = 2 * (1 - _t_cdf(abs(value) / se, df))
    p_tost = max(1 - _t_cdf((value + sesoi) / se, df), _t_cdf((value - sesoi) / se, df))
    return min(1.0, max(0.0, p)), min(1.0, max(0.0, p_tost))


def estimate(
    groups: Sequence[Float[torch.Tensor, "seed window"]],
    *,
    weights: Sequence[float | int] | None = None,
    windows: Int[torch.Tensor, "boot window"] | None = None,
    resample_seeds: bool = False,
    block: int | Literal["auto"] = "auto",
    n_boot: int = 1000,
    sesoi: float = 0.01,
    ci: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Estimate ``sum_g weights[g] * mean_seed mean_window groups[g]`` with a bootstrap.

    One group of weight 1 is a mean; two groups with weights (1, -1) a difference between
    variants; paired differences within a model (ablated - intact) are one group of
    per-window differences.

    Over windows alone (one seed, or seeds kept) the interval is ``value +- t * se`` with
    Student's t on ``blocks - 1`` degrees of freedom (``blocks`` = runs of a resample) and the
    bootstrap variance scaled by ``n / (n - block)`` (the circular block bootstrap's variance of
    a mean is biased down by about ``block / n``). Fewer than :data:`MIN_WINDOWS` windows, or
    windows whose values show no spread, give NaN ``se`` / interval / p-values with a warning,
    never a zero-width interval; the one exception is values that are all exactly 0 (a paired
    difference of identical runs: an exact no-op), whose interval is ``[0, 0]``. The suite's
    coverage simulation (tests/unit/test_coverage.py) checks that the default covers >= 0.93
    at 95 %.

    Args:
        groups: Per group, ``[seed window]`` per-window values of each seed (the same windows,
            in the same order, for every group and seed). NaN is a missing value: a window
            with no value in some group is left out (of the means and of ``n_windows``), with a
            warning.
        weights: One weight per group (default: all 1).
        windows: ``[boot window]`` from :func:`window_resamples`, shared by every group; default
            (``None``): drawn here with ``block`` and ``n_boot``.
        block: Block length when ``windows`` is ``None``: ``"auto"`` (the default) chooses it
            from the windows' own autocorrelation (:func:`auto_block` on the per-window values
            of the estimated combination), an integer fixes it.
        n_boot: Resamples when ``windows`` is ``None``.
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
        InvalidInputError: no groups, mismatched shapes or weights, an infinite value, bad
            ``sesoi``/``ci``.

    References:
        Saravanan et al. 2020, arXiv 2007.07797 (hierarchical bootstrap); Lakens 2017 (TOST).

    Examples:
        >>> import torch
        >>> from homoglens.core.stats import estimate, window_resamples
        >>> values = torch.linspace(-1, 1, 200)[None] * 0.01 + 0.05  # [seed window]
        >>> est = estimate([values], windows=window_resamples(200, block=10), resample_seeds=False)
        >>> round(est.value, 3), est.ci_low < 0.05 < est.ci_high, est.p < 0.001
        (0.05, True, True)
    """
    sesoi = as_float("sesoi", sesoi, low=0.0, high=math.inf)
    ci = as_float("ci", ci, low=0.0, high=1.0)
    groups, weights, present = _checked_groups(groups, weights, windows)
    n_window, n_real = int(present.numel()), int(present.sum())
    known_block = None
    if windows is None:
        windows, known_block = _drawn_windows(groups, weights, present, block, n_boot, seed)
    n_boot = int(windows.shape[0])
    if n_boot < MIN_RESAMPLES and n_real >= MIN_WINDOWS:
        warnings.warn(
            f"homoglens: {n_boot} bootstrap resamples give a noisy (and with very few, too "
            f"narrow) interval; use n_boot >= {MIN_RESAMPLES} (1000 by default)",
            UserWarning,
            stacklevel=2,
        )
    parts = _group_parts(groups, weights, windows, resample_seeds, seed)
    dist, flat, value = parts.dist, parts.flat, parts.value
    seed_var, seed_df_den = parts.seed_var, parts.seed_df_den
    se = float(dist.std(unbiased=True)) if n_boot > 1 else math.nan
    fewest = min(int(g.shape[0]) for g in groups)
    steps = (windows[0, 1:] - windows[0, :-1]) % max(n_window, 1)
    window_df = max(1.0, float((steps != 1).sum()))  # blocks in a resample - 1
    if known_block is not None:
        window_df = max(1.0, float(-(-n_window // known_block) - 1))
    hierarchical = resample_seeds and fewest > 1
    if not hierarchical:
        se, df = _window_se(se, window_df, present, groups, weights)
    else:
        se *= math.sqrt(fewest / (fewest - 1))
        window_var = float(flat.var(unbiased=True)) if n_boot > 1 else 0.0
        num = (window_var + seed_var) ** 2
        den = window_var**2 / window_df + (seed_df_den if seed_var > 0 else 0.0)
        df = num / den if den > 0 else math.inf
    q = _t_quantile(1 - (1 - ci) / 2, df)
    p, p_tost = _p_values(value, se, df, sesoi)
    return Estimate(
        **{name: getattr(parts, name) for name in _PART_FIELDS},
        se=se,
        ci_low=value - q * se,
        ci_high=value + q * se,
        p=p,
        p_tost=p_tost,
        sesoi=sesoi,
        df=df,
        n_windows=n_real,
    )


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error).

    Sorted ascending, the i-th smallest of m p-values becomes ``max_{j <= i} min(1, (m - j + 1)
    p_(j))``. A NaN p-value (a test that could not be run) stays NaN but still counts in m, as
    if it were 1, so that it cannot make the others look stronger.

    Args:
        p: The family's p-values, each in [0, 1] or NaN.

    Returns:
        The adjusted p-values, in the given order.

    Raises:
        InvalidInputError: a p-value outside [0, 1], or not a real number (a bool or a
            string is not a p-value).

    References:
        Holm 1979, "A simple sequentially rejective multiple test procedure".

    Examples:
        >>> from homoglens.core.stats import holm
        >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03, 0.005])]
        [0.03, 0.06, 0.06, 0.02]
    """
    if isinstance(p, (str, bytes)) or not hasattr(p, "__iter__") or getattr(p, "ndim", 1) == 0:
        raise InvalidInputError(f"p must be a sequence of p-values, got {p!r}")
    values = [_real("p-value", x) for x in p]
    bad = [v for v in values if not (math.isnan(v) or 0.0 <= v <= 1.0)]
    if bad:
        raise InvalidInputError(
            f"p-values {bad[:8]} lie outside [0, 1]; give p-values (NaN: no test)"
        )
    order = sorted((v, i) for i, v in enumerate(values) if not math.isnan(v))
    m = len(values)
    out = [math.nan] * len(values)
    running = 0.0
    for rank, (v, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * v))
        out[i] = running
    return out


def verdict(
    value: float,
    p: float,
    p_tost: float,
    *,
    predicted: int,
    alpha: float = 0.05,
    ci: tuple[float, float] | None = None,
    sesoi: float | None = None,
) -> Verdict:
    """Verdict on a directional claim with a smallest effect size of interest (SESOI).

    * ``"equivalent"``: TOST rejects an effect as large as the SESOI (``p_tost < alpha``): the
      effect, if any, is too small to matter (this includes significant but negligible effects);
    * ``"holds"``: significantly different from 0 (``p < alpha``) on the predicted side;
    * ``"fails"``: significantly different from 0 on the other side;
    * ``"holds, possibly negligible"`` / ``"fails, possibly negligible"`` (with ``ci`` and
      ``sesoi``): significant, but the interval reaches inside the SESOI (its bound nearer 0 is
      below ``sesoi`` in size), so the effect may be smaller than what matters: not a bare
      "holds" (e.g. +0.0029 [0.0011, 0.0047] against a SESOI of 0.0034);
    * ``"inconclusive"``: none of these.

    Args:
        value: The estimate.
        p: Its (adjusted) two-sided p-value of "no effect".
        p_tost: Its (adjusted) TOST p-value.
        predicted: +1 or -1, the sign the claim predicts.
        alpha: Level of every test.
        ci: The estimate's interval ``(low, high)``; with ``sesoi``, a significant effect whose
            interval reaches inside ``(-sesoi, sesoi)`` is qualified "possibly negligible".
        sesoi: The smallest effect size of interest (>= 0, in the estimate's units).

    Returns:
        The verdict (``"inconclusive"`` when the value or either p-value is NaN: a test that
        could not be run decides nothing).

    Raises:
        InvalidInputError: ``predicted`` not +-1, a value or p-value that is not a real number,
            an infinite value, a p-value outside [0, 1], ``alpha`` outside (0, 1), a ``ci``
            that is not two real numbers, a negative ``sesoi``.

    References:
        Schuirmann 1987; Lakens 2017, doi:10.1177/1948550617697177 (TOST, equivalence).
    """
    if predicted not in (1, -1):
        raise InvalidInputError(f"predicted={predicted!r} must be +1 or -1")
    alpha = as_float("alpha", alpha, low=0.0, high=1.0)
    value = _real("value", value)
    if math.isinf(value):
        raise InvalidInputError("value is infinite; a verdict needs a finite estimate (or NaN)")
    p, p_tost = _real("p", p), _real("p_tost", p_tost)
    for name, q in (("p", p), ("p_tost", p_tost)):
        if not (math.isnan(q) or 0.0 <= q <= 1.0):
            raise InvalidInputError(f"{name}={q!r} must be a p-value in [0, 1] (NaN: no test)")
    if math.isnan(value) or math.isnan(p) or math.isnan(p_tost):  # a test not run: no verdict
        return "inconclusive"
    if not math.isnan(p_tost) and p_tost < alpha:
        return "equivalent"
    if not math.isnan(p) and p < alpha and value != 0:
        side = "holds" if (value > 0) == (predicted > 0) else "fails"
        if ci is not None and sesoi is not None and _reaches_inside(value, ci, sesoi):
            return "holds, possibly negligible" if side == "holds" else "fails, possibly negligible"
        return side
    return "inconclusive"


def _reaches_inside(value: float, ci: tuple[float, float], sesoi: float) -> bool:
    """Whether the interval ``ci`` of a nonzero ``value`` reaches inside ``(-sesoi, sesoi)``:
    its bound on the side of 0 is smaller in size than ``sesoi`` (or crosses 0)."""
    if not isinstance(ci, (tuple, list)) or len(ci) != 2:
        raise InvalidInputError(f"ci={ci!r} must be (low, high)")
    low, high = _real("ci_low", ci[0]), _real("ci_high", ci[1])
    size = _real("sesoi", sesoi)
    if math.isnan(low) or math.isnan(high) or math.isnan(size):
        return False  # no interval or no SESOI: nothing to qualify
    if size < 0:
        raise InvalidInputError(f"sesoi={size!r} must be >= 0")
    inner = low if value > 0 else -high
    return inner < size
