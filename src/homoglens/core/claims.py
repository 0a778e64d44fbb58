"""The claims table: each reading of claims C1-C3 as a pre-declared test with a verdict.

Yusupov et al. 2025 (arXiv 2508.17126) claim that homogenization exists in every layer and
grows with depth (C1), that positional bias amplifies it most at the extremal positions (C2),
and that removing positional features lowers it but costs the model (C3). homoglens reads each
claim in several ways (docs/findings.md); every reading is one row, with a predicted sign, a
smallest effect size of interest (SESOI), and one *primary* test per reading and model. Primary
tests form one family, Holm-adjusted; every other row is *secondary* (unadjusted,
exploratory). Verdicts (:func:`homoglens.core.stats.verdict`): ``holds`` (significant on the
predicted side), ``equivalent`` (TOST: smaller than the SESOI), ``fails`` (significant on the
other side), ``inconclusive``.

Readings (``H`` is the contextual homogenization: mean off-diagonal ``W = M - C`` of
:class:`~homoglens.similarity.result.PositionalSimilarity`, "centred"; ``raw`` is the mean
pairwise cosine; ``L`` the last layer entry):

* **C1, grows with depth** (per model): primary ``H(L) - H(0) > 0``; secondary: the same raw,
  per-block increments ``H(l) - H(l - 1)``.
* **C1, exists in every layer** (per model): primary: ``H(l) - H(0) > 0`` at *every* entry
  ``l >= 1``, an intersection-union test (Berger 1982): the row is the weakest layer's (largest
  one-sided p), so it holds only if every layer does; each layer is a secondary row.
* **C2** has three readings of "edge tokens homogenize", each its own statistic:
  (a) **within**: the distance-matched excess of ``W`` at the first / last ``edge_k``
  positions; (b) **shared direction**: ``SP`` (same position, different inputs; measured on
  uncentred vectors) of an edge minus the middle's; (c) **over depth**: ``SP`` averaged over
  positions, ``SP(L) - SP(0)`` (inputs converge). Causal mixing alone, with no positional
  preference, moves every one of them (a random walk from position 0 reads matched first
  -0.30 / last +0.11), so a verdict about *positional* bias is given only for the difference
  from a calibrated reference that keeps the causal mask and the content but not the
  positions: the model without positions (``no_positions``). Those differences are the primary
  rows (**C2 vs causal null**); the model's own readings are secondary rows
  ("uncalibrated"), as is the naive (distance-biased) excess.
* **C3a**: primary: ``H`` of the model without positions minus that of each positional model
  < 0; secondary: raw and anisotropy-adjusted versions, and zeroing positions at inference.
* **C3b, first** and **C3b, last**: removing positions shrinks the edge anomaly ``|E|``:
  primary ``s (E_nope - E_pos) < 0`` with ``s`` the sign of the positional model's mean excess
  (``|E_nope| - |E_pos|`` to first order; the excess is negative in every model measured, so an
  unsigned "lower" would read a larger anomaly as support); secondary: zeroing at inference.
* **C3c**: primary: next-token loss without positions minus with them > 0 (SESOI in nats);
  secondary: zeroing positions at inference.

SESOI: by default (``sesoi=None``) a tenth (:data:`SESOI_FRACTION`) of the scale of the
homogenization at the layer tested, in the positional model: ``|H(L)|`` (no smaller than
:data:`SESOI_FLOOR`), for every cosine row, the SP readings included. A fixed 0.01 cosine is
20-25 % of the tiny models' whole centred H and accepts edge effects a fifth of the
homogenization as "no effect"; a fraction of the model's own homogenization means the same thing
in every model. The SP readings are scaled by it too, not by the level of SP: uncentred SP is
mostly anisotropy (0.6 in SmolLM2's last layer), which the readings are built to leave out, and
a tenth of it would call a +0.03 edge convergence "no effect". Loss keeps an absolute SESOI in
nats.

NoPE models' C1/C2 rows are secondary (the claims are about models with positions). Without
seeds (``resample_seeds=False``, or one seed in a group) an interval covers windows only: it says
nothing about another training run, and :func:`claims_table` warns when such a row compares
retrained models.
Inference-time ablation is out of distribution (attention flattens; Dong et al. 2021), so its
rows are secondary: retraining is the fair test, and its unit of replication is the seed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import torch

from homoglens.core.stats import (
    SESOI_FLOOR,
    SESOI_FRACTION,
    Estimate,
    as_block,
    default_sesoi,
    estimate,
    holm,
    verdict,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CLAIM_COLUMNS", "SESOI_FLOOR", "SESOI_FRACTION", "claims_table", "default_sesoi"]

CLAIM_COLUMNS: tuple[str, ...] = (
    "claim",
    "reading",
    "test",
    "model",
    "primary",
    "predicted",
    "value",
    "se",
    "ci_low",
    "ci_high",
    "p",
    "p_holm",
    "p_tost",
    "p_tost_holm",
    "sesoi",
    "verdict",
    "n_seeds",
    "seed_sd",
    "n_windows",
)
"""Columns of the claims table (see :func:`claims_table`)."""

Stats = Mapping[str, Mapping[str, torch.Tensor]]  # mode -> statistic -> [batch] or [batch layer]


@dataclass(frozen=True)
class _Test:
    claim: str
    reading: str
    test: str
    model: str
    primary: bool
    predicted: int
    groups: list[torch.Tensor]  # each [seed window]
    weights: list[float]
    sesoi: float
    every_layer: str = ""  # rows of an intersection-union family share this key


def _values(seeds: Sequence[Stats], mode: str, stat: str, li: int | None) -> torch.Tensor:
    """``[seed window]`` values of one statistic (at layer index ``li`` if per layer)."""
    rows = []
    for stats in seeds:
        v = stats[mode][stat].double()
        rows.append(v[:, li] if li is not None else v)
    return torch.stack(rows)


def _having(seeds: Sequence[Stats], stat: str) -> list[Stats]:
    """The seeds whose intact statistics hold ``stat`` (shipped replicates may lack the SP
    readings)."""
    return [s for s in seeds if stat in s["none"]]


def _scale(seeds: Sequence[Stats], stat: str, li: int) -> float:
    """``|mean|`` of ``stat`` at layer index ``li`` over seeds and windows (NaN if absent)."""
    have = _having(seeds, stat)
    if not have:
        return math.nan
    return abs(float(_values(have, "none", stat, li).nanmean()))


def _sesoi(fixed: float | None, scale: float) -> float:
    """The SESOI of a cosine row: ``fixed``, or :func:`default_sesoi` of ``scale``."""
    return default_sesoi(scale) if fixed is None else fixed


def _c1(name: str, seeds: Sequence[Stats], layers: list[int], primary: bool,
        sesoi: float | None) -> list[_Test]:  # fmt: skip
    """C1 rows of one model: growth, every layer (intersection-union), increments."""
    last, lname = len(layers) - 1, layers[-1]
    h = _values(seeds, "none", "homogenization", None)  # [seed window layer]
    raw = _values(seeds, "none", "mean_pairwise", None)
    unit = _sesoi(sesoi, _scale(seeds, "homogenization", last))
    peak = layers[int(h.nanmean((0, 1)).argmax())]
    tests = [
        _Test("C1", "grows with depth", f"centred H({lname}) - H(0) (maximum at layer {peak})",
              name, primary, +1, [h[..., last] - h[..., 0]], [1.0], unit),
        _Test("C1", "grows with depth", f"raw mean pairwise({lname}) - (0)", name, False, +1,
              [raw[..., last] - raw[..., 0]], [1.0], unit),
    ]  # fmt: skip
    for li in range(1, last + 1):
        tests.append(
            _Test("C1", "exists in every layer", f"centred H({layers[li]}) - H(0)", name, False,
                  +1, [h[..., li] - h[..., 0]], [1.0], unit, every_layer=name)
        )  # fmt: skip
        tests.append(
            _Test("C1", "per-block increment", f"centred H({layers[li]}) - H({layers[li - 1]})",
                  name, False, +1, [h[..., li] - h[..., li - 1]], [1.0], unit)
        )  # fmt: skip
    if last >= 1:  # filled with the weakest layer's estimate once the family is estimated
        tests.append(_Test("C1", "exists in every layer", "", name, primary, +1, [], [], unit,
                           every_layer=name))  # fmt: skip
    return tests


def _c2_readings(seeds: Sequence[Stats], last: int) -> list[tuple[str, str, str, torch.Tensor]]:
    """``(reading, test, scale statistic, [seed window] values)`` of the three C2 readings of
    one model (the SP readings from the seeds that hold them: replicates shipped before the
    SP readings were measured uncentred lack them, and the test says so)."""
    out = []
    for edge in ("first", "last"):
        out.append((f"a, within: the {edge} tokens more alike in context",
                    f"matched {edge}-edge excess of W", "homogenization",
                    _values(seeds, "none", f"matched_{edge}", last)))  # fmt: skip
    have = _having(seeds, "sp_mean")
    if have:
        note = "" if len(have) == len(seeds) else f", {len(have)} of {len(seeds)} seeds"
        for edge in ("first", "last"):
            out.append((f"b, shared direction: the {edge} tokens alike across inputs",
                        f"SP {edge} edge minus middle (uncentred{note})", "homogenization",
                        _values(have, "none", f"sp_{edge}", last)))  # fmt: skip
        sp = _values(have, "none", "sp_mean", None)
        out.append(("c, over depth: inputs converge", f"mean SP(L) - SP(0) (uncentred{note})",
                    "homogenization", sp[..., last] - sp[..., 0]))  # fmt: skip
    return out


def _c2(name: str, seeds: Sequence[Stats], reference: tuple[str, Sequence[Stats]] | None,
        layers: list[int], positional: bool, sesoi: float | None) -> list[_Test]:  # fmt: skip
    """C2 rows of one model: each reading uncalibrated (secondary), the naive excess
    (secondary), and each reading minus the no-positions reference's (primary)."""
    last, lname = len(layers) - 1, layers[-1]
    tests = []
    ref: dict[str, torch.Tensor] = {}
    if reference is not None and positional:
        ref = {r[0]: r[3] for r in _c2_readings(reference[1], last)}
    for reading, test, scale_stat, values in _c2_readings(seeds, last):
        unit = _sesoi(sesoi, _scale(seeds, scale_stat, last))
        tests.append(
            _Test("C2", reading, f"{test}, layer {lname} (uncalibrated: causal mixing alone "
                  "moves it)", name, False, +1, [values], [1.0], unit)
        )  # fmt: skip
        if reference is not None and reading in ref:
            tests.append(
                _Test("C2", f"{reading} (vs causal null)",
                      f"{test}, layer {lname}: positional minus {reference[0]}",
                      f"{name} - {reference[0]}", True, +1, [values, ref[reading]],
                      [1.0, -1.0], unit)
            )  # fmt: skip
    unit = _sesoi(sesoi, _scale(seeds, "homogenization", last))
    for edge in ("first", "last"):
        tests.append(
            _Test("C2", f"naive: the {edge} tokens more alike", f"naive {edge}-edge excess "
                  f"(biased by distance), layer {lname}", name, False, +1,
                  [_values(seeds, "none", f"naive_{edge}", last)], [1.0], unit)
        )  # fmt: skip
    return tests


def _anomaly_sign(seeds: Sequence[Stats], stat: str, li: int) -> float:
    """The sign of a model's mean edge excess (``-1`` when it is 0 or NaN: the excess is
    negative in every model measured)."""
    mean = float(_values(seeds, "none", stat, li).nanmean())
    return 1.0 if mean > 0 else -1.0


def _c3(name: str, seeds: Sequence[Stats], nope_name: str, nope: Sequence[Stats],
        layers: list[int], sesoi: float | None, loss_sesoi: float) -> list[_Test]:  # fmt: skip
    """C3 rows of one positional model against the model without positions."""
    last, lname = len(layers) - 1, layers[-1]
    pair = f"{nope_name} - {name}"
    unit = _sesoi(sesoi, _scale(seeds, "homogenization", last))
    tests = []
    for stat, text, li, primary in (
        ("homogenization", f"centred H({lname})", last, True),
        ("mean_pairwise", f"raw mean pairwise({lname})", last, False),
        ("adjusted_last", f"raw minus anisotropy baseline ({lname})", None, False),
    ):
        tests.append(
            _Test("C3", "a: lowers homogenization", f"{text}: no positions minus positional",
                  pair, primary, -1, [_values(nope, "none", stat, li),
                                      _values(seeds, "none", stat, li)], [1.0, -1.0], unit)
        )  # fmt: skip
    for edge in ("first", "last"):
        stat = f"matched_{edge}"
        sign = _anomaly_sign(seeds, stat, last)
        tests.append(
            _Test("C3", f"b: shrinks the {edge}-edge anomaly |E|",
                  f"{sign:+.0f} x (matched {edge}-edge excess without positions minus with), "
                  f"{sign:+.0f} = sign of the positional model's excess", pair, True, -1,
                  [_values(nope, "none", stat, last), _values(seeds, "none", stat, last)],
                  [sign, -sign], unit)
        )  # fmt: skip
    tests.append(
        _Test("C3", "c: costs the model",
              "next-token loss (nats/token): no positions minus positional", pair, True, +1,
              [_values(nope, "none", "loss", None), _values(seeds, "none", "loss", None)],
              [1.0, -1.0], loss_sesoi)
    )  # fmt: skip
    return tests


def _zeroed(name: str, seeds: Sequence[Stats], layers: list[int], sesoi: float | None,
            loss_sesoi: float) -> list[_Test]:  # fmt: skip
    """Secondary C3 rows: positions zeroed at inference minus intact (out of distribution)."""
    last = len(layers) - 1
    label = f"{name}: positions zeroed minus intact (inference, out of distribution)"
    unit = _sesoi(sesoi, _scale(seeds, "homogenization", last))

    def diff(stat: str, li: int | None) -> torch.Tensor:
        return _values(seeds, "zero", stat, li) - _values(seeds, "none", stat, li)

    tests = [_Test("C3", "a: lowers homogenization", f"homogenization: {label}", name, False,
                   -1, [diff("homogenization", last)], [1.0], unit)]  # fmt: skip
    for edge in ("first", "last"):
        stat = f"matched_{edge}"
        sign = _anomaly_sign(seeds, stat, last)
        tests.append(_Test("C3", f"b: shrinks the {edge}-edge anomaly |E|",
                           f"{sign:+.0f} x {stat}: {label}", name, False, -1,
                           [sign * diff(stat, last)], [1.0], unit))  # fmt: skip
    tests.append(_Test("C3", "c: costs the model", f"loss: {label}", name, False, +1,
                       [diff("loss", None)], [1.0], loss_sesoi))  # fmt: skip
    return tests


def _one_sided(est: Estimate, predicted: int) -> float:
    """One-sided p of "the effect lies on the predicted side" (NaN as +inf: weakest)."""
    if math.isnan(est.p):
        return math.inf
    on_side = (est.value > 0) == (predicted > 0)
    return est.p / 2 if on_side else 1 - est.p / 2


def _weakest(rows: list[tuple[_Test, Estimate]], key: str) -> tuple[_Test, Estimate] | None:
    """The estimated row of an intersection-union family with the largest one-sided p."""
    family = [(t, e) for t, e in rows if t.every_layer == key]
    if not family:
        return None
    return max(family, key=lambda r: _one_sided(r[1], r[0].predicted))


def claims_table(
    entities: Mapping[str, Sequence[Stats]],
    *,
    layers: Sequence[int],
    no_positions: str | None,
    sesoi: float | None = None,
    loss_sesoi: float = 0.01,
    alpha: float = 0.05,
    ci: float = 0.95,
    block: int | Literal["auto"] = "auto",
    n_boot: int = 1000,
    seed: int = 0,
    resample_seeds: bool = False,
) -> pd.DataFrame:
    """Test every reading of claims C1-C3 (see the module docstring) and give verdicts.

    Args:
        entities: ``{model or variant: [per seed: {mode: {statistic: values}}]}``, the
            per-window statistics of :class:`~homoglens.comparison.measure.ModelComparison`
            (``[batch]``, or ``[batch layer]`` on ``layers``); every seed reads the same windows.
            The SP readings (``sp_first``, ``sp_last``, ``sp_mean``) must come from uncentred
            vectors; their rows use the seeds that hold them (the test names how many).
        layers: The layer axis of the per-layer statistics (entry 0 first).
        no_positions: The entity trained without positions: the calibrated causal null of C2
            and the comparison of C3.
        sesoi: Smallest effect size of interest for cosines; ``None`` (default): a tenth of
            the scale of each statistic (module docstring).
        loss_sesoi: Smallest effect size of interest for loss (nats/token).
        alpha: Level of each test (family-wise for the primary ones).
        ci: Interval coverage.
        block: Consecutive windows per bootstrap block: ``"auto"`` (the default, chosen per
            test from the windows' autocorrelation, :func:`homoglens.core.stats.auto_block`) or an
            integer.
        n_boot: Bootstrap resamples.
        seed: Bootstrap seed.
        resample_seeds: Resample seeds, then window blocks (hierarchical bootstrap); the
            intervals then use Student's t with Welch-Satterthwaite degrees of freedom over the
            seed and window parts of the variance (:func:`homoglens.core.stats.estimate`).

    Returns:
        DataFrame with the columns of :data:`CLAIM_COLUMNS`: ``p_holm`` / ``p_tost_holm`` are
        Holm-adjusted over the primary rows (NaN on secondary rows, whose verdicts use the
        unadjusted values); ``n_seeds`` counts the seeds behind a row (over both sides of a
        difference) and ``seed_sd`` is their between-seed s.d. (NaN with one seed). The C1
        "every layer" primary row repeats its weakest layer's estimate (intersection-union:
        it holds only when that layer, and so every layer, does).

    References:
        Holm 1979; Lakens 2017 (TOST); Berger 1982 (intersection-union tests); Saravanan et
        al. 2020, arXiv 2007.07797 (hierarchical bootstrap); Wu et al. 2025, arXiv 2502.01951
        (the causal mask alone biases toward early positions); Yusupov et al. 2025,
        arXiv 2508.17126.
    """
    layers = list(layers)
    sesoi = None if sesoi is None else float(sesoi)
    nope = None
    if no_positions is not None and no_positions in entities:
        nope = (no_positions, entities[no_positions])
    tests: list[_Test] = []
    for name, seeds in entities.items():
        positional = name != no_positions
        tests += _c1(name, seeds, layers, positional, sesoi)
        tests += _c2(name, seeds, nope, layers, positional, sesoi)
    for name, seeds in entities.items():
        if nope is not None and name != no_positions:
            tests += _c3(name, seeds, nope[0], nope[1], layers, sesoi, loss_sesoi)
    for name, seeds in entities.items():
        if name != no_positions and "zero" in seeds[0]:
            tests += _zeroed(name, seeds, layers, sesoi, loss_sesoi)
    if not entities:
        return _table([], alpha)
    single = [name for name, seeds in entities.items() if len(seeds) < 2]
    if nope is not None and len(entities) > 1 and (not resample_seeds or single):
        warnings.warn(
            "the C2 and C3 rows compare retrained models with "
            + ("one training seed each" if not resample_seeds else f"one seed for {single}")
            + ": their intervals cover windows only and say nothing about another seed; train "
            "more seeds (homoglens train --seed S) and compare with group_by='variant'",
            stacklevel=3,
        )
    block = as_block(block)
    rows: list[tuple[_Test, Estimate]] = []
    for t in tests:
        if not t.groups:  # an intersection-union row: the weakest of its family
            weakest = _weakest(rows, t.every_layer)
            if weakest is not None:
                shown = replace(t, test=f"{weakest[0].test} > 0 at every layer >= 1 "
                                "(weakest layer shown)")  # fmt: skip
                rows.append((shown, weakest[1]))
            continue
        est = estimate(t.groups, weights=t.weights, block=block, n_boot=n_boot,
                       resample_seeds=resample_seeds, sesoi=t.sesoi, ci=ci, seed=seed)  # fmt: skip
        rows.append((t, est))
    return _table(rows, alpha)


def _table(rows: list[tuple[_Test, Estimate]], alpha: float) -> pd.DataFrame:
    """The claims table of estimated rows: Holm over the primary ones, verdicts."""
    import pandas as pd

    primary = [i for i, (t, _) in enumerate(rows) if t.primary]
    p_holm = dict(zip(primary, holm([rows[i][1].p for i in primary]), strict=True))
    tost_holm = dict(zip(primary, holm([rows[i][1].p_tost for i in primary]), strict=True))
    out = []
    for i, (t, est) in enumerate(rows):
        p = p_holm.get(i, est.p)
        pt = tost_holm.get(i, est.p_tost)
        out.append(
            {
                "claim": t.claim,
                "reading": t.reading,
                "test": t.test,
                "model": t.model,
                "primary": t.primary,
                "predicted": ">0" if t.predicted > 0 else "<0",
                "value": est.value,
                "se": est.se,
                "ci_low": est.ci_low,
                "ci_high": est.ci_high,
                "p": est.p,
                "p_holm": p_holm.get(i, math.nan),
                "p_tost": est.p_tost,
                "p_tost_holm": tost_holm.get(i, math.nan),
                "sesoi": t.sesoi,
                "verdict": verdict(
                    est.value,
                    p,
                    pt,
                    predicted=t.predicted,
                    alpha=alpha,
                    ci=(est.ci_low, est.ci_high),
                    sesoi=t.sesoi,
                ),  # fmt: skip
                "n_seeds": est.n_seeds,
                "seed_sd": est.seed_sd,
                "n_windows": est.n_windows,
            }
        )
    return pd.DataFrame(out, columns=list(CLAIM_COLUMNS))
