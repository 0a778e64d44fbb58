"""The null suite of the calibrated readings (issue 51), sized for CI; the full simulation
(every null x every planted preference at SmolLM2's width, 100 replicates) is
benchmarks/null_suite.py, its figures in docs/similarity.md.

The reference is another draw of the same process with nothing planted: the model-matched null
of a planted positional preference. On causal mixing with no positional preference the five
readings (Holm, SESOI 0.0034: SmolLM2's at layer 30) read no effect; a planted preference of
SmolLM2's size is found."""

from __future__ import annotations

import warnings

import pytest
import torch

from homoglens import PositionalSimilarity
from homoglens.core.controls import control_activations, planted
from homoglens.similarity.calibration import CalibratedReadings

SESOI = 0.0034


def _table(null: str, plant: str, strength: float, n: int, d: int, rep: int):  # noqa: ANN202
    def side(seed: int, s: float) -> PositionalSimilarity:
        x = control_activations(null, n, 32, d, edge_k=4, seed=seed)  # type: ignore[arg-type]
        layers = torch.stack([x, planted(x, plant, s, edge_k=4, seed=12345)])  # type: ignore[arg-type]
        return PositionalSimilarity.from_activations(layers, edge_k=4)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, ref = side(2 * rep, strength), side(2 * rep + 1, 0.0)
        return CalibratedReadings(model, ref, "model", "null").table(sesoi=SESOI, n_boot=300)


def _significant(verdicts) -> list[bool]:  # noqa: ANN001
    return [str(v).startswith(("holds", "fails")) for v in verdicts]


@pytest.mark.parametrize("null", ["stationary", "uniform_causal", "random_walk", "sink_causal"])
def test_causal_nulls_read_no_effect(null: str) -> None:
    """No preference planted on either side: >= 90 % of replicates read no effect anywhere."""
    quiet = [not any(_significant(_table(null, "last_pulled", 0.0, 48, 32, r)["verdict"]))
             for r in range(30)]  # fmt: skip
    assert sum(quiet) / len(quiet) >= 0.9, sum(quiet)


@pytest.mark.parametrize(
    ("plant", "strength", "target"),
    [
        ("first_key_bias", 0.2, "matched_first"),
        ("recency_bias", 0.3, "matched_first"),
        ("last_pulled", 0.04, "matched_last"),
        ("edge_common", 0.3, "sp_first"),
    ],
)
def test_planted_preferences_of_smollm2s_size_are_found(
    plant: str, strength: float, target: str
) -> None:
    """A preference planted on uniform causal mixing, its target reading no larger than
    SmolLM2's largest of its kind ((a) 0.018, (b) 0.061): found in >= 80 % at n = 48."""
    found, sizes = [], []
    for rep in range(20):
        table = _table("uniform_causal", plant, strength, 48, 576, rep).set_index("statistic")
        found.append(_significant([table.loc[target, "verdict"]])[0])
        sizes.append(float(table.loc[target, "difference"]))
    size = abs(sum(sizes) / len(sizes))
    assert size <= (0.061 if target.startswith("sp") else 0.018), size
    assert sum(found) / len(found) >= 0.8, (sum(found), size)


def test_planted_leaves_its_input_and_refuses_bad_sizes() -> None:
    from homoglens.core.errors import InvalidInputError

    x = control_activations("uniform_causal", 4, 16, 8, strength=0)  # 0: nothing planted
    before = x.clone()
    assert torch.equal(planted(x, "last_pulled", 0.0), x) and torch.equal(x, before)
    assert not torch.equal(planted(x, "edge_common", 0.5, edge_k=2), x)
    assert torch.equal(x, before)
    for kwargs, match in [({"kind": "bogus", "strength": 1}, "must be one of"),
                          ({"kind": "last_pulled", "strength": -1}, ">= 0"),
                          ({"kind": "last_pulled", "strength": 2}, r"\[0, 1\]")]:  # fmt: skip
        with pytest.raises(InvalidInputError, match=match):
            planted(x, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="batch pos d_model"):
        planted(x[0], "last_pulled", 0.1)
