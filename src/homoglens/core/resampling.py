"""Resampling of per-window values: the circular moving-block bootstrap's block length, the
index tables of window and seed resamples, and resampled means.

The windows homoglens reads come from consecutive stretches of one text, so neighbouring windows
are correlated: a resample concatenates randomly placed runs of ``block`` consecutive windows
(circular moving-block bootstrap; Kuensch 1989, Politis & Romano 1992), the block length chosen
from the data by default (:func:`auto_block`: twice the Politis-White 2004 estimate). Between
retrained models seeds are resampled first (hierarchical bootstrap; Saravanan, Berman & Sober
2020, arXiv 2007.07797). :mod:`homoglens.core.stats` builds its intervals on these; every name here
is also importable from it.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.validate import as_int

__all__ = [
    "LARGEST",
    "MOST_RESAMPLED",
    "as_block",
    "auto_block",
    "index_table",
    "resampled_means",
    "seed_resamples",
    "window_resamples",
]

LARGEST = 1e150
"""Largest magnitude of a per-window value or weight: its square must not overflow float64."""

MOST_RESAMPLED = 1 << 28
"""Most resampled indices (``n_boot * windows``) held at once: 2 GiB of int64."""


def index_table(
    name: str, table: object, high: int, width: int, what: str
) -> Int[torch.Tensor, "boot k"]:
    """A ``[boot k]`` integer tensor of indices in ``[0, high)`` with ``k == width``."""
    if (
        not isinstance(table, torch.Tensor)
        or table.ndim != 2
        or table.dtype not in (torch.int64, torch.int32)
    ):
        raise InvalidInputError(
            f"{name} must be a [boot {what}] int64 tensor of indices (e.g. from "
            f"window_resamples / seed_resamples), got {getattr(table, 'shape', type(table))}"
        )
    if int(table.shape[0]) < 1 or int(table.shape[1]) != width:
        raise InvalidInputError(
            f"{name} has shape {tuple(table.shape)}; it must be [boot {what}] with boot >= 1 and "
            f"{width} {what} (one index per {what} of the values)"
        )
    if bool(((table < 0) | (table >= high)).any()):
        raise InvalidInputError(f"{name} holds indices outside [0, {high}) (the {what} there are)")
    return table


def auto_block(values: Float[torch.Tensor, "*any"]) -> int:
    """Block length of the circular block bootstrap, chosen from the data: twice the
    Politis-White estimate.

    Politis & White's automatic choice (with Patton, Politis & White's correction) minimises the
    mean squared error of the bootstrap variance; it is 1 for independent values and grows with
    their autocorrelation. That choice still under-covers a 95 % Wald interval on correlated
    values (its variance is biased down by the autocorrelations beyond the block), so homoglens
    doubles it: on AR(1) series of windows the doubled block with Student's t over the blocks
    covers 0.94 (n = 48, independent), 0.93 (n = 256, lag-1 correlation 0.3) and 0.925 (0.6),
    where the plain estimate covers 0.94 / 0.92 / 0.90 and the old fixed block of 16 with the
    normal quantile 0.85 at n = 48. At a few dozen windows Politis-White's significance bound
    misses strong dependence; a significantly positive lag-1 autocorrelation (bias-corrected)
    then sets a floor, twice Andrews' AR(1) plug-in block: consecutive windows of one long
    series (a fast AR(1) plus a slow component spanning about two windows) are covered >= 0.93
    at n = 24, 48 and 96 (tests/unit/test_coverage.py). NaN values are left out.

    Args:
        values: Per-window values in window order (flattened).

    Returns:
        The block length, >= 1 and at most ``min(3 sqrt(n), n / 3)`` (1 for fewer than 8
        values or no spread).

    Raises:
        InvalidInputError: no value that is not NaN, or an infinite value.

    References:
        Politis & White 2004, "Automatic block-length selection for the dependent bootstrap",
        doi:10.1081/ETC-120028836; Patton, Politis & White 2009 (correction),
        doi:10.1080/07474930802459016; Andrews 1991, "Heteroskedasticity and autocorrelation
        consistent covariance matrix estimation", doi:10.2307/2938229 (the AR(1) plug-in);
        Kendall 1954 (bias of the lag-1 autocorrelation).

    Examples:
        >>> import torch
        >>> from homoglens.core.stats import auto_block
        >>> auto_block(torch.randn(200, generator=torch.Generator().manual_seed(2)))
        1
    """
    if not isinstance(values, torch.Tensor) or values.is_complex():
        raise InvalidInputError("values must be a real tensor of per-window values")
    x = values.double().flatten()
    x = x[~torch.isnan(x)]
    n = int(x.numel())
    if n == 0:
        raise InvalidInputError(
            f"auto_block needs per-window values, got {values.numel()} and none that is not NaN"
        )
    if not bool(torch.isfinite(x).all()):
        raise InvalidInputError("values hold inf; a block length needs finite values")
    largest = float(x.abs().max())
    if largest > LARGEST:  # the autocovariances would overflow; the block is scale invariant
        x = x / largest
    if n < 8:
        return 1
    x = x - x.mean()
    var0 = float((x * x).mean())
    if var0 <= 0:
        return 1
    kn = max(5, math.ceil(math.sqrt(math.log10(n))))
    m_max = min(n - 1, math.ceil(math.sqrt(n)) + kn)
    acv = torch.stack([(x[k:] * x[: n - k]).sum() / n for k in range(m_max + 1)])
    cap = math.ceil(min(3 * math.sqrt(n), n / 3))
    doubled = round(2 * _politis_white(acv, n, m_max, kn))
    return int(min(max(1, doubled, _ar1_floor(float(acv[1] / acv[0]), n)), cap))


def _politis_white(acv: torch.Tensor, n: int, m_max: int, kn: int) -> float:
    """Politis & White's block length (with Patton et al.'s correction) from the
    autocovariances ``acv[0..m_max]`` of ``n`` values; 0 when no lag is significant."""
    rho = acv / acv[0]
    bound = 2.0 * math.sqrt(math.log10(n) / n)
    insignificant = (rho[1:].abs() < bound).tolist()  # lag k at index k - 1
    m_hat = None
    for m in range(0, m_max - kn + 1):
        if all(insignificant[m : m + kn]):
            m_hat = m
            break
    if m_hat is None:
        significant = [k + 1 for k, ok in enumerate(insignificant) if not ok]
        m_hat = max(significant) if significant else 0
    big_m = min(2 * m_hat, m_max)
    if big_m == 0:
        return 0.0
    k = torch.arange(1, big_m + 1, dtype=torch.float64)
    t = k / big_m
    lam = torch.where(t <= 0.5, torch.ones_like(t), 2 * (1 - t))
    g = 2 * float((lam * k * acv[1 : big_m + 1]).sum())
    s = float(acv[0] + 2 * (lam * acv[1 : big_m + 1]).sum())
    if s <= 0:
        return 0.0
    d = 4.0 / 3.0 * s * s
    return (2 * g * g / d) ** (1 / 3) * n ** (1 / 3)


def _ar1_floor(r1: float, n: int) -> int:
    """The doubled block of Andrews' AR(1) plug-in (1991, eq. 6.4, Bartlett kernel) at the
    bias-corrected lag-1 autocorrelation (1 when it is not positive).

    At a few dozen windows Politis-White's significance bound (``2 sqrt(log10 n / n)``, 0.49 at
    n = 24) misses a lag-1 correlation of 0.6 (whose estimate is biased down by about
    ``(1 + 3 rho) / n``, Kendall 1954), and the block falls to 1: intervals on consecutive
    windows of one text then cover 0.81-0.90 (issue 51). A significance gate on the estimate
    fails the same way at n = 24, so the floor has none: on independent windows it gives blocks
    of 1-4 (2 on average at n = 48), which costs a little width, not coverage."""
    r = r1 + (1 + 3 * r1) / n  # Kendall's bias correction of the lag-1 estimate
    if r <= 0:
        return 1
    r = min(r, 0.95)
    alpha = 4 * r * r / ((1 - r) ** 2 * (1 + r) ** 2)
    return max(1, round(2 * 1.1447 * (alpha * n) ** (1 / 3)))


def as_block(value: object) -> int | Literal["auto"]:
    """A bootstrap block length: ``"auto"`` (chosen from the data, :func:`auto_block`) or an
    integer >= 1 (1: the i.i.d. bootstrap).

    Raises:
        InvalidInputError: anything else.
    """
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(
            f"block={value!r} must be 'auto' (chosen from the windows' autocorrelation) or an "
            "integer >= 1 (consecutive windows per bootstrap block; 1: i.i.d.)"
        )
    return int(value)


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
        InvalidInputError: bad ``n``, ``block``, ``n_boot`` or ``seed``, or more than 2**28
            indices in all (2 GiB).

    References:
        Politis & Romano 1992, "A circular block-resampling procedure for stationary data".

    Examples:
        >>> from homoglens.core.stats import window_resamples
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
    if n_boot * n > MOST_RESAMPLED:
        raise InvalidInputError(
            f"n_boot={n_boot} resamples of {n} windows hold {8 * n_boot * n / 2**30:.0f} GiB of "
            f"indices; use n_boot <= {MOST_RESAMPLED // n} (1000-10000 is plenty for a 95 % "
            "interval)"
        )
    gen = torch.Generator().manual_seed(as_int("seed", seed, low=0, high=2**63 - 1))
    runs = -(-n // block)
    starts = torch.randint(n, (n_boot, runs, 1), generator=gen, device="cpu")
    idx = (starts + torch.arange(block, device="cpu")) % n
    return idx.reshape(n_boot, runs * block)[:, :n]


def seed_resamples(n_seeds: int, *, n_boot: int = 1000, seed: int = 0) -> torch.Tensor:
    """``[n_boot n_seeds]`` indices of seeds drawn with replacement (all 0 for one seed)."""
    n_seeds = as_int("n_seeds", n_seeds, low=1)
    n_boot = as_int("n_boot", n_boot, low=1)
    if n_boot * n_seeds > MOST_RESAMPLED:
        raise InvalidInputError(f"n_boot={n_boot} resamples of {n_seeds} seeds are too many")
    gen = torch.Generator().manual_seed(as_int("seed", seed, low=0, high=2**63 - 1) + 7919)
    return torch.randint(n_seeds, (n_boot, n_seeds), generator=gen, device="cpu")


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

    Raises:
        InvalidInputError: ``values`` not ``[seed window]``; ``windows`` / ``seeds`` not
            integer tables of the values' windows / seeds (shape or indices out of range).
    """
    if not isinstance(values, torch.Tensor) or values.ndim != 2 or values.is_complex():
        raise InvalidInputError(
            f"values must be a real [seed window] tensor, got {getattr(values, 'shape', values)}"
        )
    n_seed, n_window = (int(d) for d in values.shape)
    index_table("windows", windows, n_window, n_window, "windows")
    if seeds is not None:
        index_table("seeds", seeds, n_seed, n_seed, "seeds")
        if int(seeds.shape[0]) != int(windows.shape[0]):
            raise InvalidInputError(
                f"seeds has {int(seeds.shape[0])} resamples, windows {int(windows.shape[0])}"
            )
    x = values.double()
    per_seed = torch.stack([row[windows].nanmean(-1) for row in x], dim=-1)  # [boot seed]
    if seeds is not None:
        per_seed = torch.gather(per_seed, 1, seeds)
    return per_seed.mean(-1)
