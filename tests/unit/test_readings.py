"""The three readings of "edge tokens homogenize" (issue 38), each with a negative and a
positive control from :mod:`homoglens.core.controls`, and the calibrated causal null."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from homoglens import PositionalSimilarity
from homoglens.core.claims import claims_table
from homoglens.core.controls import CONTROLS, control_activations

N, T, D = 96, 48, 32


def similarity(kind: str, seed: int = 1, **options: object) -> PositionalSimilarity:
    strength = {"edge_common": 0.5, "last_pulled": 0.3}.get(kind, 1.0)
    x = control_activations(kind, N, T, D, strength=strength, seed=seed)  # type: ignore[arg-type]
    entry0 = control_activations("stationary", N, T, D, seed=seed + 100)  # the "embeddings"
    return PositionalSimilarity.from_activations(
        torch.stack([entry0, x]), edge_k=8, pseudo_values=True, **options
    )


def sp_row(sim: PositionalSimilarity, edge: str) -> dict:
    table = sim.sp_excess(block=1)
    return table[(table["layer"] == 1) & (table["edge"] == edge)].iloc[0].to_dict()


def test_every_control_gives_windows_of_the_asked_shape() -> None:
    for kind in CONTROLS:
        x = control_activations(kind, 3, 20, 8, seed=0)  # type: ignore[arg-type]
        assert x.shape == (3, 20, 8) and x.dtype == torch.float64 and torch.isfinite(x).all()


def test_sp_of_position_centred_vectors_is_nan_with_a_warning() -> None:
    # centred by position SP is -1/(n-1) at every position: the old table read 0 +- 0, "no
    # effect", whatever the windows held
    sim = similarity("edge_common", centre="position")
    assert torch.allclose(sim.SP[1], torch.full_like(sim.SP[1], -1 / (N - 1)), atol=1e-3)
    with pytest.warns(UserWarning, match="centred by position"):
        row = sp_row(sim, "first")
    assert math.isnan(row["excess"]) and math.isnan(row["ci_low"])
    with pytest.warns(UserWarning, match="uncentred"):
        assert sim.per_window("sp_first").isnan().all()


def test_reading_b_finds_edge_tokens_plus_a_common_vector_and_nothing_in_nulls() -> None:
    planted = sp_row(similarity("edge_common"), "first")
    assert planted["ci_low"] > 0.05, planted
    for kind in ("stationary", "positional_code", "random_walk"):
        for edge in ("first", "last"):
            null = sp_row(similarity(kind), edge)
            assert null["ci_low"] < 0 < null["ci_high"], (kind, edge, null)


def test_reading_a_finds_a_planted_last_edge_pull() -> None:
    edge = similarity("last_pulled").edge_excess(block=1)
    last = edge[(edge["layer"] == 1) & (edge["edge"] == "last")].iloc[0]
    assert last["ci_low"] > 0, last
    null = similarity("stationary").edge_excess(block=1)
    null = null[null["layer"] == 1]
    se = (null["ci_high"] - null["ci_low"]) / (2 * 1.96)
    assert (null["matched"].abs() < 3 * se).all(), null  # SCIENCE: within 3 SE of 0


def test_global_centring_gets_no_sp_reading() -> None:
    # a stationary positional code of constant norm: global centring made a false SP edge
    # excess (44 % false positives); the reading is NaN with a warning now
    with pytest.warns(UserWarning, match="centred globally"):
        row = sp_row(similarity("positional_code", centre="global"), "first")
    assert math.isnan(row["excess"])


def claim_statistics(sim: PositionalSimilarity) -> dict:
    """Per-window statistics in the shape ``claims_table`` reads (no loss: zeros)."""
    stats = {s: sim.per_window(s) for s in ("homogenization", "matched_first", "matched_last",
                                             "naive_first", "naive_last", "sp_first",
                                             "sp_last", "sp_mean")}  # fmt: skip
    stats["mean_pairwise"] = sim.per_window("naive_first") * 0 + sim.mean_pairwise[None]
    stats["loss"] = torch.zeros(sim.n_sequences, dtype=torch.float64)
    stats["adjusted_last"] = torch.zeros(sim.n_sequences, dtype=torch.float64)
    return {"none": stats}


def c2_verdicts(model: str, reference: str, sesoi: float | None = None) -> dict[str, str]:
    """``{reading: verdict}`` of the C2 rows: the model's own (uncalibrated) and against the
    reference (an independent draw of ``reference``)."""
    entities = {
        "model": [claim_statistics(similarity(model, seed=1))],
        "null": [claim_statistics(similarity(reference, seed=2))],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = claims_table(entities, layers=(0, 1), no_positions="null", block=1, n_boot=400,
                             sesoi=sesoi)  # fmt: skip
    rows = table[(table["claim"] == "C2") & (table["model"].str.startswith("model"))]
    return dict(zip(rows["reading"], rows["verdict"], strict=True))


@pytest.mark.parametrize("kind", ["random_walk", "uniform_causal"])
def test_causal_mixing_alone_reads_an_edge_effect_that_the_calibrated_null_removes(
    kind: str,
) -> None:
    got = c2_verdicts(kind, kind)
    # uncalibrated, causal mixing reads a strong first-edge deficit ("C2 fails")...
    assert got["a, within: the first tokens more alike in context"] == "fails"
    # ...that says nothing about positional bias: against the causal null it is not there
    for reading, verdict in got.items():
        if reading.endswith("(vs causal null)"):
            assert verdict in ("equivalent", "inconclusive"), (reading, verdict)


def test_the_calibrated_reading_finds_a_planted_effect() -> None:
    got = c2_verdicts("last_pulled", "stationary")
    assert got["a, within: the last tokens more alike in context (vs causal null)"] == "holds"
    got = c2_verdicts("edge_common", "stationary")
    assert got["b, shared direction: the first tokens alike across inputs (vs causal null)"] == (
        "holds"
    )


def test_a_significant_reading_reaching_inside_its_sesoi_is_qualified() -> None:
    """Issue 51, point 3: a significant value whose interval reaches inside the SESOI is no bare
    "holds" in the claims table (nor in compare_models' claims, which is this table)."""
    reading = "a, within: the last tokens more alike in context (vs causal null)"
    assert c2_verdicts("last_pulled", "stationary")[reading] == "holds"
    # +0.097 [0.077, 0.117]: a SESOI of 0.09 lies inside the interval, so it may be negligible
    assert c2_verdicts("last_pulled", "stationary", sesoi=0.09)[reading] == (
        "holds, possibly negligible"
    )


@pytest.mark.parametrize(
    "statistic",
    ["matched_first", "matched_last", "sp_first", "sp_last", "sp_mean", "homogenization"],
)
def test_pseudo_values_are_the_exact_delete_one_jackknife(statistic: str) -> None:
    """Issue 51, point 5: each window's pseudo-value is n * theta - (n - 1) * theta_(-s), theta
    recomputed from scratch without window s (brute force), not the first-order (Hajek) value,
    whose deviations are (n-2)/(n-1) of these (standard errors 3 % too small at n = 32)."""
    n = 12
    x = control_activations("uniform_causal", n, 20, 8, seed=3)
    hidden = torch.stack([control_activations("stationary", n, 20, 8, seed=4), x])
    pv = PositionalSimilarity.from_activations(hidden, edge_k=3).per_window(statistic)
    theta = pv.mean(0)
    for s in range(n):
        rest = [i for i in range(n) if i != s]
        without = PositionalSimilarity.from_activations(hidden[:, rest], edge_k=3)
        exact = n * theta - (n - 1) * without.per_window(statistic).mean(0)
        assert torch.allclose(pv[s], exact, atol=1e-12), (s, pv[s], exact)


def test_a_sink_set_by_the_mask_alone_reads_no_positional_effect() -> None:
    """Issue 51's causal null with a first-token sink and no position in any logit: against
    another draw of itself (the matched null) no C2 reading is an effect."""
    got = c2_verdicts("sink_causal", "sink_causal")
    for reading, verdict in got.items():
        if reading.endswith("(vs causal null)"):
            assert verdict in ("equivalent", "inconclusive"), (reading, verdict)
