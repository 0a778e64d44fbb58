"""The slope at zero of an :class:`~homoglens.AttentionBiasStudy`: :class:`SlopeAtZero`, the
central difference at the unbiased point cross-checked with the derivative, and the dose per
unit of attention mass moved (:func:`dose_per_mass`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from homoglens.errors import InvalidInputError
from homoglens.results.bias_metrics import ATTENTION_CHECKS
from homoglens.similarity_math import SIMILARITY_STATISTICS
from homoglens.stats import estimate, verdict
from homoglens.types import Verdict

if TYPE_CHECKING:
    from homoglens.results.bias import AttentionBiasStudy


@dataclass(frozen=True)
class SlopeAtZero:
    """The slope of a metric at the unbiased point (b = 0, or beta = 1), two ways.

    Attributes:
        metric: The metric.
        layer: Residual entry (similarity metrics) or block (checks); -1 for the loss.
        step: The b (or beta - 1) of the central difference.
        central: (metric(+step) - metric(-step)) / (2 step), over every window.
        se: Block-bootstrap standard error of ``central`` (paired windows).
        ci_low: Lower interval bound of ``central``.
        ci_high: Upper interval bound.
        gradient: The first-order (forward-mode autograd) derivative at zero, on the first
            ``gradient_windows`` windows (NaN if none were differentiated).
        gradient_ci_low: Its interval (NaN when it has no per-window spread).
        gradient_ci_high: Its interval.
        gradient_windows: Windows behind ``gradient``.
        central_gradient_windows: ``central`` on the ``gradient_windows`` windows only: the
            like-for-like cross-check of ``gradient`` (same windows, same estimand; they differ
            by O(step^2)). NaN without a gradient, and for the statistics that involve the
            cross-window ``C`` (``homogenization``, ``matched_*``) and ``sp_*`` when the gradient
            covers fewer windows than the study: the gradient's ``C`` is that of its own
            windows, which the stored sums do not hold at the other strengths (differentiate
            every window, ``gradient_windows = n``, for that cross-check).
        per_mass: The dose in attention moved: d metric / d mass at zero, the central
            difference of the metric over that of the mass on the biased keys (``mass`` of
            :data:`ATTENTION_CHECKS`, averaged over the biased blocks), i.e. the change of the
            metric per unit of attention mass moved onto the biased keys (1 = all of a row's
            attention). NaN for ``"temperature"`` (no biased keys) and where the mass does not
            move.
        per_mass_ci_low: Its interval (delta method over the paired windows; NaN for the
            cross-window ``sp_*`` metrics of a study without pseudo-values).
        per_mass_ci_high: Its interval.
        sesoi: Smallest effect of interest of ``per_mass``, in the metric's unit per unit of
            mass: a tenth of the metric's own scale at the baseline
            (:func:`homoglens.stats.default_sesoi`), i.e. moving all of the attention changes
            the metric by less than a tenth of its value; for ``loss``, 0.01 nats.
        p: Two-sided p-value of ``per_mass`` = 0.
        p_tost: TOST p-value of ``|per_mass| >= sesoi`` (small: equivalent to no effect).
    """

    metric: str
    layer: int
    step: float
    central: float
    se: float
    ci_low: float
    ci_high: float
    gradient: float
    gradient_ci_low: float
    gradient_ci_high: float
    gradient_windows: int
    central_gradient_windows: float = math.nan
    per_mass: float = math.nan
    per_mass_ci_low: float = math.nan
    per_mass_ci_high: float = math.nan
    sesoi: float = math.nan
    p: float = math.nan
    p_tost: float = math.nan

    def verdict(self, *, predicted: int = 1, alpha: float = 0.05) -> Verdict:
        """Three-way verdict on ``per_mass`` (:func:`homoglens.stats.verdict`): ``"holds"``
        when the metric moves with the attention mass on the side ``predicted`` (+1: more
        mass, higher metric), ``"equivalent"`` when TOST bounds it inside ``+-sesoi`` per unit
        of mass, ``"fails"`` on the other side, else ``"inconclusive"``; a significant slope
        whose interval reaches inside ``+-sesoi`` is "..., possibly negligible"."""
        interval = (self.per_mass_ci_low, self.per_mass_ci_high)
        return verdict(
            self.per_mass,
            self.p,
            self.p_tost,
            predicted=predicted,
            alpha=alpha,
            ci=interval,
            sesoi=self.sesoi,
        )

    def __repr__(self) -> str:
        return (
            f"SlopeAtZero({self.metric}, layer {self.layer}: central {self.central:.4g} "
            f"[{self.ci_low:.4g}, {self.ci_high:.4g}] per unit of b at step {self.step:g}; "
            f"{self.per_mass:.4g} [{self.per_mass_ci_low:.4g}, {self.per_mass_ci_high:.4g}] per "
            f"unit of attention mass moved (SESOI {self.sesoi:.3g}); gradient "
            f"{self.gradient:.4g} against central {self.central_gradient_windows:.4g} on the "
            f"same {self.gradient_windows} windows)"
        )


def dose_per_mass(
    value: float,
    per: torch.Tensor | None,
    mass: torch.Tensor,
    *,
    sesoi: float,
    ci: float,
    block: Any,
    seed: int,
    n_boot: int,
) -> tuple[float, float, float, float, float]:
    """``value`` (a change of a metric) per unit of the mean change ``mass`` ``[batch]`` of the
    attention on the biased keys, with a delta-method interval over the paired windows:
    ``(ratio, ci_low, ci_high, p, p_tost)`` (NaN where the mass does not move, or the bounds
    where ``per`` is None)."""
    moved = float(mass.mean())
    if not math.isfinite(moved) or abs(moved) < 1e-12:
        return math.nan, math.nan, math.nan, math.nan, math.nan
    ratio = value / moved
    if per is None or per.shape[0] < 2:
        return ratio, math.nan, math.nan, math.nan, math.nan
    linear = ratio + (per.double() - ratio * mass.double()) / moved  # mean: ratio
    est = estimate([linear[None]], block=block, n_boot=n_boot, ci=ci, seed=seed, sesoi=sesoi)
    return ratio, est.ci_low, est.ci_high, est.p, est.p_tost


def slope_at_zero(
    study: AttentionBiasStudy,
    metric: str,
    layer: int | None,
    *,
    ci: float | None,
    block: int | Literal["auto"] | None,
    seed: int | None,
    n_boot: int,
) -> SlopeAtZero:
    """The :class:`SlopeAtZero` of ``study``: the central difference at the smallest symmetric
    pair of strengths and the slope per unit of attention mass moved, as
    :meth:`AttentionBiasStudy.slope_at_zero` (its arguments, returns and errors)."""
    ci, block, seed = study._bootstrap(ci, block, seed)
    li = study._layer(metric, layer)
    values, per = study._values(metric, li)
    base = study.baseline
    steps = [
        s - base
        for s in study.strengths
        if s > base
        and any(math.isclose(2 * base - s, t, rel_tol=1e-9, abs_tol=1e-12) for t in study.strengths)
    ]
    if not steps:
        raise InvalidInputError(
            f"no symmetric pair of strengths around {base} in {list(study.strengths)}; a "
            f"central difference needs {base} +- d (e.g. strengths=(..., {base - 0.25}, "
            f"{base}, {base + 0.25}, ...))"
        )
    step = min(steps)
    up, down = study._index(base + step), study._index(base - step)
    central = float((values[up] - values[down]) / (2 * step))
    se = lo = hi = math.nan
    diff = None if per is None else (per[up] - per[down]) / (2 * step)
    if diff is not None and study.n_sequences > 1 and not bool(diff.isnan().all()):
        est = estimate([diff[None]], block=block, n_boot=n_boot, ci=ci, seed=seed)
        se, lo, hi = est.se, est.ci_low, est.ci_high
    grad, gper = study._gradient(metric, li)
    g_lo = g_hi = math.nan
    if gper is not None and study.gradient_windows > 1 and not bool(gper.isnan().all()):
        g = estimate([gper[None]], block=block, n_boot=n_boot, ci=ci, seed=seed)
        g_lo, g_hi = g.ci_low, g.ci_high
    like = math.nan  # the central difference on the gradient's own windows
    g = study.gradient_windows
    cross = metric.startswith("sp_") or (
        metric in SIMILARITY_STATISTICS and not metric.startswith("naive")
    )
    if g == study.n_sequences:
        like = central  # the same windows: the same estimand
    elif diff is not None and g and not cross:
        like = float(diff[:g].mean())  # per-window values that do not involve C
    mass = study._mass()
    sesoi = study._sesoi(metric, li)
    ratio: tuple[float, ...] = (math.nan,) * 5
    if mass is not None:
        own = None if metric == "mass" else diff  # the mass per unit of itself: exactly 1
        ratio = dose_per_mass(
            central, own, (mass[up] - mass[down]) / (2 * step), sesoi=sesoi, ci=ci,
            block=block, seed=seed, n_boot=n_boot,
        )  # fmt: skip
    shown = (
        -1
        if metric == "loss"
        else (
            -1 if li == -1 else (study.blocks if metric in ATTENTION_CHECKS else study.layers)[li]
        )
    )
    return SlopeAtZero(
        metric=metric,
        layer=shown,
        step=step,
        central=central,
        se=se,
        ci_low=lo,
        ci_high=hi,
        gradient=grad,
        gradient_ci_low=g_lo,
        gradient_ci_high=g_hi,
        gradient_windows=study.gradient_windows,
        central_gradient_windows=like,
        per_mass=ratio[0],
        per_mass_ci_low=ratio[1],
        per_mass_ci_high=ratio[2],
        sesoi=sesoi,
        p=ratio[3],
        p_tost=ratio[4],
    )
