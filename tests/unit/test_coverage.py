"""Intervals that cover (issue 38, point 4): the default 95 % interval of every edge and SP
statistic covers the truth (0: no position is special) at least 0.93 of the time, on
independent AR(1) windows at n = 48 and on block-correlated windows (consecutive windows of one
long series, as of one novel) at n = 256. The old default (blocks of 16, normal quantile, C held
fixed) covered 0.80-0.84 at n = 48."""

from __future__ import annotations

import warnings

import pytest
import torch

from homoglens import PositionalSimilarity
from homoglens.core.controls import control_activations


def _coverage(kind: str, n: int, replicates: int) -> dict[str, float]:
    hits: dict[str, list[bool]] = {}
    for seed in range(replicates):
        x = control_activations(kind, n, 32, 16, edge_k=4, seed=seed)
        sim = PositionalSimilarity.from_activations(x, edge_k=4)  # pseudo-values by default
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning: enough windows, real spread
            edge, sp = sim.edge_excess(n_boot=500), sim.sp_excess(n_boot=500)
        for row in edge.itertuples():
            hits.setdefault(f"matched_{row.edge}", []).append(row.ci_low <= 0 <= row.ci_high)
        for row in sp.itertuples():
            hits.setdefault(f"sp_{row.edge}", []).append(row.ci_low <= 0 <= row.ci_high)
    return {name: sum(v) / len(v) for name, v in hits.items()}


@pytest.mark.parametrize(
    ("kind", "n", "replicates"), [("stationary", 48, 200), ("consecutive", 256, 60)]
)
def test_default_intervals_cover_on_nulls(kind: str, n: int, replicates: int) -> None:
    coverage = _coverage(kind, n, replicates)
    pooled = sum(coverage.values()) / len(coverage)
    assert pooled >= 0.93, coverage
    assert min(coverage.values()) >= 0.90, coverage


def _paired_coverage(n: int, replicates: int) -> dict[str, float]:
    """Coverage of the five paired readings (model - reference) on consecutive windows of one
    long series, the reference another draw of the same process (truth 0)."""
    from homoglens.similarity.calibration import CalibratedReadings

    hits: dict[str, list[bool]] = {}
    for rep in range(replicates):

        def draw(which: int, rep: int = rep) -> PositionalSimilarity:
            layers = [control_activations("consecutive", n, 32, 16, seed=4 * rep + which + 2 * k)
                      for k in range(2)]  # fmt: skip
            return PositionalSimilarity.from_activations(torch.stack(layers), edge_k=4)

        table = CalibratedReadings(draw(0), draw(1), "model", "another draw").table(n_boot=500)
        for row in table.itertuples():
            hits.setdefault(str(row.statistic), []).append(row.ci_low <= 0 <= row.ci_high)
    return {name: sum(v) / len(v) for name, v in hits.items()}


@pytest.mark.parametrize("n", [24, 48])
def test_paired_readings_cover_on_consecutive_windows(n: int) -> None:
    """Issue 51, point 2: Politis-White alone chose blocks of 1 for reading (c) at a few dozen
    windows (its significance bound misses a lag-1 correlation of 0.6), covering 0.81 (n 24)
    and 0.90 (n 48); the AR(1) floor of :func:`homoglens.core.stats.auto_block` covers >= 0.93 (n 96
    in benchmarks/null_suite.py)."""
    coverage = _paired_coverage(n, 100)
    assert min(coverage.values()) >= 0.93, coverage
