"""``AttentionBiasStudy``: position-resolved homogenization, loss and manipulation checks at
each strength of an attention bias, paired over the same windows, with the slope at zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.stats import as_block, default_sesoi, estimate, verdict
from homoglens.core.types import ATTENTION_BIAS_KINDS, Verdict
from homoglens.results.base import LayerPlotted, SavedResult, entry_index
from homoglens.results.provenance import Provenance
from homoglens.results.validation import COSINE, FINITE_OR_NAN, NON_NEGATIVE, Bounds, FieldError
from homoglens.similarity.maths import SIMILARITY_STATISTICS, edge_groups

if TYPE_CHECKING:
    import pandas as pd
    import torch


# The metrics of an :class:`~homoglens.AttentionBiasStudy`: the manipulation checks of the
# attention, every metric whose dose-response a study reports, and one metric read for a table
# (:class:`MetricRead`).


class MetricRead(NamedTuple):
    """One metric of a study read for a table (``AttentionBiasStudy._read``): the index into
    its axis, its values and the bootstrap settings, the study's defaults filled in."""

    metric: str
    li: int
    values: torch.Tensor
    per: torch.Tensor | None
    ci: float
    block: int | Literal["auto"]
    seed: int


ATTENTION_CHECKS: tuple[str, ...] = ("mass", "entropy", "kl")
"""Manipulation checks per biased row (means over the chosen heads and query positions):
``mass`` = E_{A'}[phi] (the attention on the biased keys for the indicator kinds; minus the
mean distance attended for ``"alibi"``; NaN for ``"temperature"``), ``entropy`` of A' (nats),
``kl`` = KL(A' || A) (nats)."""

BIAS_METRICS: tuple[str, ...] = (
    *SIMILARITY_STATISTICS,
    "sp_first",
    "sp_last",
    "loss",
    *ATTENTION_CHECKS,
)
"""Metrics of :meth:`~homoglens.AttentionBiasStudy.curve`: the position-resolved statistics of the
residual stream (``homogenization`` = H_W, the naive and distance-matched edge excess), the
same-position cross-input similarity of each edge minus the middle's (``sp_*``), the next-token
loss (nats) and the manipulation checks (:data:`ATTENTION_CHECKS`)."""


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
            (:func:`homoglens.core.stats.default_sesoi`), i.e. moving all of the attention changes
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
        """Three-way verdict on ``per_mass`` (:func:`homoglens.core.stats.verdict`): ``"holds"``
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


# The tables of an :class:`~homoglens.AttentionBiasStudy`: the dose-response of one metric, paired
# against the baseline (with intervals and the dose per unit of attention mass and of KL), and the
# tidy export of every metric at every strength.


def curve_table(study: AttentionBiasStudy, read: MetricRead, *, n_boot: int) -> pd.DataFrame:
    """The dose-response table of ``study``: one row per strength, the metric ``read`` and its
    paired change from the baseline, as :meth:`AttentionBiasStudy.curve` (its arguments,
    returns and errors)."""
    import pandas as pd

    metric, li, values, per, ci, block, seed = read
    base = study._index(study.baseline)
    mass = study._mass()
    sesoi = study._sesoi(metric, li)
    rows = []
    for i, s in enumerate(study.strengths):
        se = lo = hi = math.nan
        delta = float(values[i] - values[base])
        paired = None if per is None else per[i] - per[base]
        known = paired is not None and not bool(paired.isnan().all())  # NaN: not defined
        if paired is not None and known and i != base and study.n_sequences > 1:
            est = estimate([paired[None]], block=block, n_boot=n_boot, ci=ci, seed=seed)
            se, lo, hi = est.se, est.ci_low, est.ci_high  # paired: the same windows
        moved = math.nan
        ratio = (math.nan,) * 5
        if mass is not None and i != base:
            moved = float((mass[i] - mass[base]).mean())
            ratio = dose_per_mass(
                delta, paired, mass[i] - mass[base], sesoi=sesoi, ci=ci, block=block,
                seed=seed, n_boot=n_boot,
            )  # fmt: skip
        kl = float(study.kl[i])
        temperature = study.kind == "temperature"
        rows.append(
            {
                "strength": s,
                "b": 0.0 if temperature else s,
                "beta": s if temperature else 1.0,
                "kl": kl,
                "mass_moved": moved,
                "value": float(values[i]),
                "delta": delta,
                "se": se,
                "ci_low": lo,
                "ci_high": hi,
                "per_mass": ratio[0],
                "per_mass_ci_low": ratio[1],
                "per_mass_ci_high": ratio[2],
                "per_kl": delta / kl if i != base and kl > 0 else math.nan,
                "n_sequences": study.n_sequences,
            }
        )
    return pd.DataFrame(rows)


def bias_frame(study: AttentionBiasStudy) -> pd.DataFrame:
    """The tidy DataFrame of :meth:`AttentionBiasStudy.to_pandas`: one row per (strength,
    metric, layer) with ``value`` and ``kl``.

    Args:
        study: The study.

    Returns:
        The DataFrame (the loss has ``layer`` = -1).
    """
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for i, s in enumerate(study.strengths):
        for li, layer in enumerate(study.layers):
            for e, stat in enumerate(SIMILARITY_STATISTICS):
                value = float(study.statistics[i, li, e])
                rows.append({"strength": s, "metric": stat, "layer": layer, "value": value})
        for bi, blk in enumerate(study.blocks):
            for c, check in enumerate(ATTENTION_CHECKS):
                value = float(study.attention[i, bi, c])
                rows.append({"strength": s, "metric": check, "layer": blk, "value": value})
        loss = float(study.loss[i])
        rows.append({"strength": s, "metric": "loss", "layer": -1, "value": loss})
    frame = pd.DataFrame(rows)
    doses = dict(zip(study.strengths, study.kl.tolist(), strict=True))
    frame["kl"] = frame["strength"].map(doses)
    return frame


__all__ = ["ATTENTION_CHECKS", "BIAS_METRICS", "AttentionBiasStudy", "SlopeAtZero"]


@dataclass(frozen=True, eq=False)
class AttentionBiasStudy(SavedResult, LayerPlotted):
    """Homogenization, loss and attention under an attention bias, at each strength, paired.

    ``plot(layer)`` draws dose-response panels: H_W and the matched edge excess at residual
    entry ``layer`` against b (with paired intervals), the loss, and the mass on the biased keys
    and KL.

    At ``attn.hook_pattern`` of the biased blocks and heads each row becomes
    A'[q, k] = softmax_k(beta log A[q, k] + b phi[q, k]) (docs/bias.md, "The intervention");
    b = strength and beta = 1, or b = 0 and beta = strength for ``"temperature"``. The
    residual stream of every window is read at every entry of ``layers``, as
    :func:`~homoglens.positional_similarity` reads it (``W = M - C`` without centring), at each
    strength, on the same windows.

    Stored fields (float64):
        kind: The bias kind (:data:`~homoglens.core.types.ATTENTION_BIAS_KINDS`).
        strengths: Strengths run, ascending; the unbiased one (0, or 1 for temperature) among
            them.
        first_k: Keys counted as "first".
        window: Keys counted as "recent".
        blocks: Blocks biased.
        heads: Heads biased in each (every head if empty).
        value_zero_first: Whether the first ``first_k`` keys' value vectors were zeroed in the
            biased heads (at every strength, the baseline included).
        layers: Residual entries read (0 = embeddings, l = output of block l - 1).
        edge_k: Positions per edge of the edge statistics.
        first_position: 0, or 1 when position 0 (a BOS) was left out of the similarity.
        n_sequences: Windows.
        statistics: ``[strength layer stat]`` each of
            :data:`~homoglens.similarity.maths.SIMILARITY_STATISTICS` (cosines; ``naive_*`` of M,
            the rest of W).
        window_statistics: ``[strength batch layer stat]`` per-window values whose mean over
            windows is ``statistics``: for the statistics of ``W`` that subtract ``C``, jackknife
            pseudo-values when ``pseudo_values`` (as
            :meth:`~homoglens.PositionalSimilarity.per_window`), else ``C`` held at the corpus
            value (intervals then ignore ``C``'s noise and are too wide on real data).
        sp: ``[strength layer pos]`` same-position cross-input similarity SP[i] = C[i, i].
        to_first: ``[strength layer pos]`` M[i, first counted position].
        window_attention: ``[strength batch block check]`` per window, each of
            :data:`ATTENTION_CHECKS` averaged over its biased rows (heads x queries).
        window_loss: ``[strength batch]`` per-window mean next-token loss (nats).
        gradient_windows: Windows differentiated at zero (forward-mode autograd; 0: none).
        gradient_statistics: ``[layer stat]`` d statistics / d b at zero, on those windows.
        window_gradient_statistics: ``[gseq layer stat]`` per-window derivatives.
        gradient_sp: ``[layer pos]`` d SP / d b at zero.
        window_gradient_attention: ``[gseq block check]`` d check / d b at zero, per window.
        window_gradient_loss: ``[gseq]`` d loss / d b at zero, per window.
        pseudo_values: Whether the second pass ran (jackknife pseudo-values; results saved
            before it existed load with False).
        window_sp: ``[strength batch layer edge]`` or None: the jackknife pseudo-values of
            ``sp_first`` and ``sp_last`` (mean over windows: the corpus value), with the second
            pass.
        ci: Default interval coverage of :meth:`curve` and :meth:`slope_at_zero`.
        block: Default bootstrap block length (consecutive windows; ``"auto"``: chosen from the
            windows' autocorrelation, :func:`homoglens.core.stats.auto_block`).
        seed: Default bootstrap seed.
        provenance: :class:`~homoglens.results.Provenance`.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (C2); Hsieh et al. 2024, arXiv 2406.16008;
        Wu et al. 2025, arXiv 2502.01951; Gu et al. 2024, arXiv 2410.10781.
    """

    _stem: ClassVar[str] = "attention_bias"
    _figure: ClassVar[str] = "bias.figure.bias_figure"
    _layer_axis: ClassVar[bool] = True
    _ranges: ClassVar[dict[str, tuple[float, float]]] = {"ci": (0.0, 1.0)}
    _choices: ClassVar[dict[str, tuple[str, ...]]] = {"kind": ATTENTION_BIAS_KINDS}
    _bounds: ClassVar[dict[str, Bounds]] = {
        "first_k": Bounds(1.0),
        "window": Bounds(1.0),
        "blocks": NON_NEGATIVE,
        "heads": NON_NEGATIVE,
        "layers": NON_NEGATIVE,
        "edge_k": Bounds(1.0),
        "n_sequences": Bounds(1.0),
        "gradient_windows": NON_NEGATIVE,
        # edge statistics: differences of means of cosines
        "statistics": Bounds(-2.0, 2.0, tol=1e-4),
        "sp": COSINE,
        "to_first": COSINE,
        "window_attention": FINITE_OR_NAN,  # mass is NaN for "temperature" (checked below)
        "window_loss": NON_NEGATIVE,
        "gradient_statistics": FINITE_OR_NAN,  # NaN without gradient windows
        "gradient_sp": FINITE_OR_NAN,
        "window_gradient_attention": FINITE_OR_NAN,  # mass is NaN for "temperature"
    }

    kind: str
    strengths: tuple[float, ...]
    first_k: int
    window: int
    blocks: tuple[int, ...]
    heads: tuple[int, ...]
    value_zero_first: bool
    layers: tuple[int, ...]
    edge_k: int
    first_position: int
    n_sequences: int
    statistics: Float[torch.Tensor, "strength layer stat"]
    window_statistics: Float[torch.Tensor, "strength batch layer stat"]
    sp: Float[torch.Tensor, "strength layer pos"]
    to_first: Float[torch.Tensor, "strength layer pos"]
    window_attention: Float[torch.Tensor, "strength batch block check"]
    window_loss: Float[torch.Tensor, "strength batch"]
    gradient_windows: int
    gradient_statistics: Float[torch.Tensor, "layer stat"]
    window_gradient_statistics: Float[torch.Tensor, "gseq layer stat"]
    gradient_sp: Float[torch.Tensor, "layer pos"]
    window_gradient_attention: Float[torch.Tensor, "gseq block check"]
    window_gradient_loss: Float[torch.Tensor, " gseq"]
    pseudo_values: bool = False
    window_sp: Float[torch.Tensor, "strength batch layer edge"] | None = None
    ci: float = 0.95
    block: int | str = "auto"
    seed: int = 0
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        as_block(self.block)
        if self.kind not in ATTENTION_BIAS_KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {list(ATTENTION_BIAS_KINDS)}")
        s = list(self.strengths)
        if not s or sorted(set(s)) != s or not all(math.isfinite(v) for v in s):
            raise ValueError(f"strengths={s} must be finite, distinct and ascending")
        if self.baseline not in s:
            raise ValueError(f"strengths={s} must hold the unbiased strength {self.baseline}")
        n_s, n, n_l = len(s), self.n_sequences, len(self.layers)
        n_b, n_g = len(self.blocks), self.gradient_windows
        n_stat, n_c = len(SIMILARITY_STATISTICS), len(ATTENTION_CHECKS)
        n_pos = int(self.sp.shape[-1]) if self.sp.ndim == 3 else -1
        want = {
            "statistics": (n_s, n_l, n_stat),
            "window_statistics": (n_s, n, n_l, n_stat),
            "sp": (n_s, n_l, n_pos),
            "to_first": (n_s, n_l, n_pos),
            "window_attention": (n_s, n, n_b, n_c),
            "window_loss": (n_s, n),
            "gradient_statistics": (n_l, n_stat),
            "window_gradient_statistics": (n_g, n_l, n_stat),
            "gradient_sp": (n_l, n_pos),
            "window_gradient_attention": (n_g, n_b, n_c),
            "window_gradient_loss": (n_g,),
        }
        if self.window_sp is not None:
            want["window_sp"] = (n_s, n, n_l, 2)
        if (self.window_sp is not None) != bool(self.pseudo_values):
            raise ValueError(
                f"pseudo_values={self.pseudo_values} but window_sp is "
                f"{'absent' if self.window_sp is None else 'present'}: they come together"
            )
        for name, shape in want.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"{name} has shape {got}, expected {shape}")
        if n < 1 or n_b < 1 or not 0 <= n_g <= n or self.first_position not in (0, 1):
            raise ValueError(
                f"n_sequences={n}, blocks={list(self.blocks)}, gradient_windows={n_g} or "
                f"first_position={self.first_position} out of range"
            )
        edge_groups(n_pos, int(self.edge_k))

    def _check_values(self) -> None:
        """Run on load: the manipulation checks are in range (the mass on the biased keys a
        share in [0, 1], or minus a mean distance for ``"alibi"``, NaN for ``"temperature"``
        only; entropy and KL >= 0, KL 0 at the unbiased strength); the derivatives at zero are
        NaN exactly when no window was differentiated."""
        mass = self.window_attention[..., ATTENTION_CHECKS.index("mass")]
        rest = self.window_attention[..., 1:]
        if self.kind == "temperature":
            if not bool(torch.isnan(mass).all()):
                raise FieldError("window_attention", "the mass must be NaN for 'temperature'")
        elif bool(torch.isnan(mass).any()):
            raise FieldError("window_attention", f"the mass is NaN for kind={self.kind!r}")
        elif self.kind == "alibi" and bool((mass > 1e-9).any()):
            raise FieldError("window_attention", "the alibi mass (minus a distance) is > 0")
        elif self.kind != "alibi" and bool(((mass < -1e-9) | (mass > 1 + 1e-6)).any()):
            raise FieldError(
                "window_attention",
                f"the mass on the biased keys reaches {float(mass.abs().max()):.6g}, outside "
                "[0, 1]",
            )
        if bool(torch.isnan(rest).any()) or bool((rest < -1e-6).any()):
            raise FieldError("window_attention", "entropy and KL must be finite and >= 0 (nats)")
        kl = rest[self._index(self.baseline), ..., 1]
        if bool((kl.abs() > 1e-6).any()):
            raise FieldError(
                "window_attention", f"KL is {float(kl.abs().max()):.3g} at the unbiased strength"
            )
        for name in ("gradient_statistics", "gradient_sp"):
            nan = torch.isnan(getattr(self, name))
            if bool(nan.any()) if self.gradient_windows else not bool(nan.all()):
                raise FieldError(
                    name,
                    f"{name} must be NaN exactly when no window was differentiated "
                    f"(gradient_windows={self.gradient_windows})",
                )
        if self.kind != "temperature" and bool(torch.isnan(self.window_gradient_attention).any()):
            raise FieldError("window_gradient_attention", "NaN in the derivatives of the checks")

    # ------------------------------------------------------------------ basics
    @property
    def baseline(self) -> float:
        """The unbiased strength: 0 (b), or 1 (beta, for ``"temperature"``)."""
        return 1.0 if self.kind == "temperature" else 0.0

    @property
    def attention(self) -> Float[torch.Tensor, "strength block check"]:
        """Corpus means of the manipulation checks (every window has the same rows)."""
        return self.window_attention.mean(1)

    @property
    def loss(self) -> Float[torch.Tensor, " strength"]:
        """Mean next-token loss (nats) at each strength."""
        return self.window_loss.mean(1)

    @property
    def kl(self) -> Float[torch.Tensor, " strength"]:
        """The dose as a perturbation size: mean KL(A' || A) (nats) over the biased blocks'
        rows, per strength (0 at the baseline)."""
        return self.attention[..., ATTENTION_CHECKS.index("kl")].mean(-1)

    def _bootstrap(
        self, ci: Any, block: Any, seed: Any
    ) -> tuple[float, int | Literal["auto"], int]:
        return (
            self.ci if ci is None else ci,
            as_block(self.block if block is None else block),
            self.seed if seed is None else seed,
        )

    def _read(self, metric: str, layer: int | None, ci: Any, block: Any, seed: Any) -> MetricRead:
        """``metric`` at ``layer`` with the bootstrap settings (the study's by default), as a
        table of it reads them first."""
        ci, block, seed = self._bootstrap(ci, block, seed)
        li = self._layer(metric, layer)
        values, per = self._values(metric, li)
        return MetricRead(metric, li, values, per, ci, block, seed)

    def _mass(self) -> torch.Tensor | None:
        """``[strength batch]`` mass on the biased keys per window, averaged over the biased
        blocks (None for ``"temperature"``, which has no biased keys)."""
        if self.kind == "temperature":
            return None
        return self.window_attention[..., ATTENTION_CHECKS.index("mass")].mean(-1)

    def _scale(self, metric: str, li: int) -> float:
        """The metric's own scale at the baseline, for its default SESOI."""
        values, _ = self._values(metric, li)
        if metric.startswith("sp_"):
            sp = self.sp[self._index(self.baseline), li]
            return float(sp.abs().mean())
        if metric.startswith(("matched_", "naive_")):
            e = SIMILARITY_STATISTICS.index("homogenization")
            return float(self.statistics[self._index(self.baseline), li, e])
        return float(values[self._index(self.baseline)])

    def _index(self, strength: float) -> int:
        for i, s in enumerate(self.strengths):
            if math.isclose(s, float(strength), rel_tol=1e-9, abs_tol=1e-12):
                return i
        raise InvalidInputError(f"strength {strength} was not run; run: {list(self.strengths)}")

    def _layer(self, metric: str, layer: int | None) -> int:
        """Index into ``layers`` (similarity metrics) or ``blocks`` (checks)."""
        axis = self.blocks if metric in ATTENTION_CHECKS else self.layers
        what = "biased block" if metric in ATTENTION_CHECKS else "residual entry"
        if metric == "loss":
            return 0
        if layer is None:
            if metric in ATTENTION_CHECKS:
                return -1  # mean over the biased blocks
            raise InvalidInputError(f"{metric} needs a layer (a {what} of {list(axis)})")
        return entry_index(layer, axis, f"this study ({what} axis)")

    def _values(self, metric: str, li: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([strength] corpus values, [strength batch] per-window values or None)``."""
        if metric not in BIAS_METRICS:
            raise InvalidInputError(f"metric={metric!r} must be one of {list(BIAS_METRICS)}")
        if metric == "loss":
            return self.loss, self.window_loss
        if metric in ATTENTION_CHECKS:
            c = ATTENTION_CHECKS.index(metric)
            per = self.window_attention[..., c]  # [strength batch block]
            per = per.mean(-1) if li == -1 else per[..., li]
            return per.mean(1), per
        if metric.startswith("sp_"):
            first, middle, last = edge_groups(int(self.sp.shape[-1]), self.edge_k)
            edge = first if metric == "sp_first" else last
            sp = self.sp[:, li]
            corpus = sp[:, list(edge)].mean(-1) - sp[:, list(middle)].mean(-1)
            if self.window_sp is None:
                return corpus, None
            return corpus, self.window_sp[:, :, li, 0 if metric == "sp_first" else 1]
        e = SIMILARITY_STATISTICS.index(metric)
        return self.statistics[:, li, e], self.window_statistics[:, :, li, e]

    def _gradient(self, metric: str, li: int) -> tuple[float, torch.Tensor | None]:
        if self.gradient_windows == 0:
            return math.nan, None
        if metric == "loss":
            per = self.window_gradient_loss
        elif metric in ATTENTION_CHECKS:
            per = self.window_gradient_attention[..., ATTENTION_CHECKS.index(metric)]
            per = per.mean(-1) if li == -1 else per[:, li]
        elif metric.startswith("sp_"):
            first, middle, last = edge_groups(int(self.sp.shape[-1]), self.edge_k)
            edge = first if metric == "sp_first" else last
            sp = self.gradient_sp[li]
            return float(sp[list(edge)].mean() - sp[list(middle)].mean()), None
        else:
            e = SIMILARITY_STATISTICS.index(metric)
            return float(self.gradient_statistics[li, e]), self.window_gradient_statistics[:, li, e]
        return float(per.mean()), per

    # ------------------------------------------------------------------ tables
    def curve(
        self,
        metric: str = "homogenization",
        layer: int | None = -1,
        *,
        ci: float | None = None,
        block: int | Literal["auto"] | None = None,
        seed: int | None = None,
        n_boot: int = 1000,
    ) -> pd.DataFrame:
        """The dose-response of one metric: one row per strength, paired against the baseline.

        Args:
            metric: One of :data:`BIAS_METRICS`.
            layer: Residual entry for the similarity metrics (negative: from the end); biased
                block for the checks (``None``: their mean over the biased blocks); ignored
                for ``loss``.
            ci: Interval coverage, in (0, 1) (default: the study's).
            block: Consecutive windows per bootstrap block (windows of one text correlate;
                default: the study's).
            seed: Bootstrap seed (default: the study's).
            n_boot: Bootstrap resamples.

        Returns:
            DataFrame with columns ``strength, b, beta, kl, mass_moved, value, delta, se,
            ci_low, ci_high, per_mass, per_mass_ci_low, per_mass_ci_high, per_kl,
            n_sequences``: ``value`` the metric at that strength, ``delta`` = value - value at
            the baseline, and ``se`` / ``ci_low`` / ``ci_high`` the circular block-bootstrap
            standard error and t interval of ``delta`` over the paired windows (their
            jackknife pseudo-values for the statistics that involve ``C`` and for ``sp_*``; NaN
            for ``sp_*`` of a study without pseudo-values, and at the baseline). The dose in
            the units that matter: ``kl`` (:attr:`kl`, nats) and ``mass_moved`` (the change of
            the attention on the biased keys, averaged over the biased blocks; NaN for
            temperature); ``per_mass`` = delta / mass_moved with its delta-method interval
            over the paired windows, and ``per_kl`` = delta / kl (per nat of KL). A nat of b
            moves little attention when the rows are saturated, so compare effects per unit of
            mass, not per unit of b.

        Raises:
            InvalidInputError: unknown metric, a layer the study did not read, bad ``ci``.
        """
        return curve_table(self, self._read(metric, layer, ci, block, seed), n_boot=n_boot)

    def _sesoi(self, metric: str, li: int) -> float:
        """The default SESOI of ``metric`` per unit of attention mass moved (see
        :class:`SlopeAtZero`)."""
        if metric == "loss":
            return 0.01
        return default_sesoi(self._scale(metric, li))

    def slope_at_zero(
        self,
        metric: str = "homogenization",
        layer: int | None = -1,
        *,
        ci: float | None = None,
        block: int | Literal["auto"] | None = None,
        seed: int | None = None,
        n_boot: int = 1000,
    ) -> SlopeAtZero:
        """The in-distribution answer: d metric / d b at the unbiased point, as a central
        difference at the smallest symmetric pair of strengths run (+-b, or 1 +- d for
        temperature) with a paired block-bootstrap interval, and the same per unit of
        attention mass moved onto the biased keys (``per_mass``, with its SESOI, p-values and
        :meth:`SlopeAtZero.verdict`): b is a logit, and a nat of it moves little attention
        where the rows are saturated, so "no effect per nat of b" says nothing about the effect
        of the attention. Cross-checked with the exact first-order derivative (forward-mode
        autograd through the same bias at zero) on the first ``gradient_windows`` windows,
        against the central difference on those same windows (``central_gradient_windows``):
        the two agree to O(step^2).

        Args:
            metric: One of :data:`BIAS_METRICS`.
            layer: As in :meth:`curve`.
            ci: Interval coverage (default: the study's).
            block: Bootstrap block length (windows; default: the study's).
            seed: Bootstrap seed (default: the study's).
            n_boot: Bootstrap resamples.

        Returns:
            A :class:`SlopeAtZero`.

        Raises:
            InvalidInputError: no symmetric pair of strengths around the baseline was run
                (add e.g. -0.25 and 0.25), an unknown metric or layer.
        """
        return slope_at_zero(self, metric, layer, ci=ci, block=block, seed=seed, n_boot=n_boot)

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per (strength, metric, layer) with ``value`` and ``kl``: the
        similarity statistics per residual entry, the checks per biased block, the loss
        (``layer`` = -1)."""
        return bias_frame(self)

    def __repr__(self) -> str:
        return (
            f"AttentionBiasStudy({self.kind!r}, strengths {list(self.strengths)}, blocks "
            f"{list(self.blocks)}, {self.n_sequences} windows x {int(self.sp.shape[-1])} "
            f"positions, {self.provenance.model})"
        )
