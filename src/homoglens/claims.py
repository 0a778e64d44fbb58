"""The claims table: each reading of claims C1-C3 as a pre-declared test with a verdict.

Yusupov et al. 2025 (arXiv 2508.17126) claim that homogenization exists in every layer and
grows with depth (C1), that positional bias amplifies it most at the extremal positions (C2),
and that removing positional features lowers it but costs the model (C3). homoglens reads each
claim in several ways (docs/findings.md); every reading is one row, with a
predicted sign, a smallest effect size of interest (SESOI), and one *primary* test per reading
and model. Primary tests form one family, Holm-adjusted; every other row is *secondary*
(unadjusted, exploratory). Verdicts (:func:`homoglens.stats.verdict`): ``holds`` (significant
on the predicted side), ``equivalent`` (TOST: smaller than the SESOI), ``fails`` (significant
on the other side), ``inconclusive``.

Readings (``H`` is the contextual homogenization: mean off-diagonal ``W = M - C`` of
:class:`~homoglens.results.similarity.PositionalSimilarity`, "centred"; ``raw`` is the mean
pairwise cosine; ``L`` the last layer entry):

* **C1** (per model): primary ``H(L) - H(0) > 0``; secondary: the same raw, ``H(l) - H(0)``
  for every ``l``, per-block increments ``H(l) - H(l - 1)``, the smallest ``H(l)`` for
  ``l >= 1``; the layer of the maximum is named in the test.
* **C2 loc, first** and **C2 loc, last** (per model, one reading per edge: the claim names both
  ends): primary: the distance-matched excess of the first (last) ``edge_k`` positions at ``L``
  is > 0; secondary: the naive (distance-biased) excess.
* **C2 cross** (per model): primary: ``SP`` of the last ``edge_k`` positions minus the middle's
  > 0 (late tokens of different inputs converge, Barbero et al. 2024); secondary: the first.
* **C3a**: primary: ``H`` of the model without positions minus that of each positional model
  < 0; secondary: raw and anisotropy-adjusted versions, and zeroing positions at inference.
* **C3b, first** and **C3b, last**: primary: the matched excess of that edge without positions
  minus with them < 0; secondary: zeroing positions at inference.
* **C3c**: primary: next-token loss without positions minus with them > 0 (SESOI in nats);
  secondary: zeroing positions at inference.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from homoglens.stats import estimate, holm, verdict, window_resamples

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CLAIM_COLUMNS", "claims_table"]

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

Stats = Mapping[str, Mapping[str, torch.Tensor]]  # mode -> statistic -> [seq] or [seq layer]


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


def _values(seeds: Sequence[Stats], mode: str, stat: str, li: int | None) -> torch.Tensor:
    """``[seed window]`` values of one statistic (at layer index ``li`` if per layer)."""
    rows = []
    for stats in seeds:
        v = stats[mode][stat].double()
        rows.append(v[:, li] if li is not None else v)
    return torch.stack(rows)


def claims_table(
    entities: Mapping[str, Sequence[Stats]],
    *,
    layers: Sequence[int],
    no_positions: str | None,
    sesoi: float = 0.01,
    loss_sesoi: float = 0.01,
    alpha: float = 0.05,
    ci: float = 0.95,
    block: int = 16,
    n_boot: int = 1000,
    seed: int = 0,
    resample_seeds: bool = False,
) -> pd.DataFrame:
    """Test every reading of claims C1-C3 (see the module docstring) and give verdicts.

    Args:
        entities: ``{model or variant: [per seed: {mode: {statistic: values}}]}``, the
            per-window statistics of :class:`~homoglens.comparison.ModelComparison` (``[seq]``,
            or ``[seq layer]`` on ``layers``); every seed reads the same windows.
        layers: The layer axis of the per-layer statistics (entry 0 first).
        no_positions: The entity trained without positions (C3 compares the others with it).
        sesoi: Smallest effect size of interest for cosines.
        loss_sesoi: Smallest effect size of interest for loss (nats/token).
        alpha: Level of each test (family-wise for the primary ones).
        ci: Interval coverage.
        block: Consecutive windows per bootstrap block.
        n_boot: Bootstrap resamples.
        seed: Bootstrap seed.
        resample_seeds: Resample seeds, then window blocks (hierarchical bootstrap); the
            intervals then use Student's t with Welch-Satterthwaite degrees of freedom over the
            seed and window parts of the variance (:func:`homoglens.stats.estimate`).

    Returns:
        DataFrame with the columns of :data:`CLAIM_COLUMNS`: ``p_holm`` / ``p_tost_holm`` are
        Holm-adjusted over the primary rows (NaN on secondary rows, whose verdicts use the
        unadjusted values); ``n_seeds`` counts the seeds behind a row (over both sides of a
        difference) and ``seed_sd`` is their between-seed s.d. (NaN with one seed).

    References:
        Holm 1979; Lakens 2017 (TOST); Saravanan et al. 2020, arXiv 2007.07797 (hierarchical
        bootstrap); Yusupov et al. 2025, arXiv 2508.17126.
    """
    import pandas as pd

    layers = list(layers)
    last = len(layers) - 1
    lname = layers[last]
    tests: list[_Test] = []
    n_window = None
    for name, seeds in entities.items():
        n_window = int(next(iter(seeds[0]["none"].values())).shape[0])
        positional = name != no_positions
        h = _values(seeds, "none", "homogenization", None)  # [seed window layer]
        raw = _values(seeds, "none", "mean_pairwise", None)
        peak = layers[int(h.nanmean((0, 1)).argmax())]
        tests.append(
            _Test(
                "C1",
                "grows with depth",
                f"centred H({lname}) - H(0) (maximum at layer {peak})",
                name,
                positional,
                +1,
                [h[..., last] - h[..., 0]],
                [1.0],
                sesoi,
            )  # fmt: skip
        )
        tests.append(
            _Test(
                "C1",
                "grows with depth",
                f"raw mean pairwise({lname}) - (0)",
                name,
                False,
                +1,
                [raw[..., last] - raw[..., 0]],
                [1.0],
                sesoi,
            )  # fmt: skip
        )
        for li in range(1, last):
            tests.append(
                _Test(
                    "C1",
                    "grows with depth",
                    f"centred H({layers[li]}) - H(0)",
                    name,
                    False,
                    +1,
                    [h[..., li] - h[..., 0]],
                    [1.0],
                    sesoi,
                )  # fmt: skip
            )
        for li in range(1, last + 1):
            tests.append(
                _Test(
                    "C1",
                    "per-block increment",
                    f"centred H({layers[li]}) - H({layers[li - 1]})",
                    name,
                    False,
                    +1,
                    [h[..., li] - h[..., li - 1]],
                    [1.0],
                    sesoi,
                )  # fmt: skip
            )
        if last >= 1:
            low = 1 + int(h[..., 1:].nanmean((0, 1)).argmin())
            tests.append(
                _Test(
                    "C1",
                    "exists in every layer",
                    f"centred H at its smallest layer >= 1 (layer {layers[low]})",
                    name,
                    False,
                    +1,
                    [h[..., low]],
                    [1.0],
                    sesoi,
                )  # fmt: skip
            )
        for edge in ("first", "last"):
            tests.append(
                _Test(
                    "C2",
                    f"loc: the {edge} tokens more homogenized",
                    f"matched {edge}-edge excess, layer {lname}",
                    name,
                    positional,
                    +1,
                    [_values(seeds, "none", f"matched_{edge}", last)],
                    [1.0],
                    sesoi,
                )  # fmt: skip
            )
            tests.append(
                _Test(
                    "C2",
                    f"loc: the {edge} tokens more homogenized",
                    f"naive {edge}-edge excess (biased by distance), layer {lname}",
                    name,
                    False,
                    +1,
                    [_values(seeds, "none", f"naive_{edge}", last)],
                    [1.0],
                    sesoi,
                )  # fmt: skip
            )
        if "sp_last" in seeds[0]["none"]:
            for edge in ("last", "first"):
                tests.append(
                    _Test(
                        "C2",
                        "cross: edges alike across inputs",
                        f"SP {edge} edge minus middle, layer {lname}",
                        name,
                        positional and edge == "last",
                        +1,
                        [_values(seeds, "none", f"sp_{edge}", last)],
                        [1.0],
                        sesoi,
                    )  # fmt: skip
                )
    if no_positions is not None and no_positions in entities:
        nope = entities[no_positions]
        for name, seeds in entities.items():
            if name == no_positions:
                continue
            pair = f"{no_positions} - {name}"
            for stat, text, li, primary in (
                ("homogenization", f"centred H({lname})", last, True),
                ("mean_pairwise", f"raw mean pairwise({lname})", last, False),
                ("adjusted_last", f"raw minus anisotropy baseline ({lname})", None, False),
            ):
                tests.append(
                    _Test(
                        "C3",
                        "a: lowers homogenization",
                        f"{text}: no positions minus positional",
                        pair,
                        primary,
                        -1,
                        [_values(nope, "none", stat, li), _values(seeds, "none", stat, li)],
                        [1.0, -1.0],
                        sesoi,
                    )  # fmt: skip
                )
            for edge in ("first", "last"):
                stat = f"matched_{edge}"
                tests.append(
                    _Test(
                        "C3",
                        f"b: lowers the {edge}-edge excess",
                        f"matched {edge}-edge excess: no positions minus positional",
                        pair,
                        True,
                        -1,
                        [_values(nope, "none", stat, last), _values(seeds, "none", stat, last)],
                        [1.0, -1.0],
                        sesoi,
                    )  # fmt: skip
                )
            tests.append(
                _Test(
                    "C3",
                    "c: costs the model",
                    "next-token loss (nats/token): no positions minus positional",
                    pair,
                    True,
                    +1,
                    [_values(nope, "none", "loss", None), _values(seeds, "none", "loss", None)],
                    [1.0, -1.0],
                    loss_sesoi,
                )  # fmt: skip
            )
    for name, seeds in entities.items():
        if name == no_positions or "zero" not in seeds[0]:
            continue
        label = f"{name}: positions zeroed minus intact (inference, out of distribution)"
        for claim, reading, stat, li, sign, unit in (
            ("C3", "a: lowers homogenization", "homogenization", last, -1, sesoi),
            ("C3", "b: lowers the first-edge excess", "matched_first", last, -1, sesoi),
            ("C3", "b: lowers the last-edge excess", "matched_last", last, -1, sesoi),
            ("C3", "c: costs the model", "loss", None, +1, loss_sesoi),
        ):
            diff = _values(seeds, "zero", stat, li) - _values(seeds, "none", stat, li)
            tests.append(_Test(claim, reading, f"{stat}: {label}", name, False, sign, [diff],
                               [1.0], unit))  # fmt: skip
    if n_window is None:
        return pd.DataFrame(columns=list(CLAIM_COLUMNS))
    single = [name for name, seeds in entities.items() if len(seeds) < 2]
    if no_positions in entities and len(entities) > 1 and (not resample_seeds or single):
        warnings.warn(
            "the C3 rows compare retrained models with "
            + ("one training seed each" if not resample_seeds else f"one seed for {single}")
            + ": their intervals cover windows only and say nothing about another seed; train "
            "more seeds (homoglens train --seed S) and compare with group_by='variant'",
            stacklevel=3,
        )
    windows = window_resamples(n_window, block=block, n_boot=n_boot, seed=seed)
    rows = []
    for t in tests:
        est = estimate(
            t.groups,
            weights=t.weights,
            windows=windows,
            resample_seeds=resample_seeds,
            sesoi=t.sesoi,
            ci=ci,
            seed=seed,
        )
        rows.append((t, est))
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
                    math.nan if p is None else p,
                    math.nan if pt is None else pt,
                    predicted=t.predicted,
                    alpha=alpha,
                ),
                "n_seeds": est.n_seeds,
                "seed_sd": est.seed_sd,
                "n_windows": est.n_windows,
            }
        )
    return pd.DataFrame(out, columns=list(CLAIM_COLUMNS))
