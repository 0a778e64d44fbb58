"""The claims table on synthetic per-window statistics: a null where no claim should hold, known
effects that must be found, the hierarchical (seed) path, Holm over the primary rows."""

from __future__ import annotations

import torch

from homoglens.comparison.measure import LAYER_STATISTICS
from homoglens.core.claims import CLAIM_COLUMNS, claims_table

LAYERS = (0, 1, 2)


def fake_seed(gen: torch.Generator, n: int, shift: dict[str, float]) -> dict:
    """One seed's statistics: AR(1)-correlated noise over windows plus per-statistic shifts."""

    def series(shape: tuple[int, ...]) -> torch.Tensor:
        e = torch.randn(n, *shape, generator=gen, dtype=torch.float64) * 0.02
        x = torch.empty_like(e)
        x[0] = e[0]
        for i in range(1, n):
            x[i] = 0.8 * x[i - 1] + 0.6 * e[i]
        return x

    stats = {"loss": 4.0 + series(()) + shift.get("loss", 0.0)}
    stats["adjusted_last"] = series(())
    for name in LAYER_STATISTICS:
        stats[name] = series((len(LAYERS),)) + shift.get(name, 0.0)
    return {"none": stats, "zero": {k: v.clone() for k, v in stats.items()}}


def test_a_null_comparison_holds_nothing() -> None:
    gen = torch.Generator().manual_seed(0)
    entities = {
        name: [fake_seed(gen, 400, {}) for _ in range(3)] for name in ("learned", "rotary", "none")
    }
    table = claims_table(
        entities, layers=LAYERS, no_positions="none", resample_seeds=True, n_boot=300
    )
    assert list(table.columns) == list(CLAIM_COLUMNS)
    primary = table[table["primary"]]
    # per positional model: C1 x 2 (grows, every layer); C2 vs the causal null: a x 2, b x 2, c;
    # C3: a, b x 2, c
    assert len(primary) == 2 * (2 + 5 + 4)
    assert not primary.duplicated(["reading", "model"]).any()  # one primary per reading
    assert not (primary["verdict"].isin(["holds", "fails"])).any(), primary
    assert (primary["n_seeds"].isin([3, 6])).all() and primary["seed_sd"].notna().all()
    assert (table.loc[table["primary"], "p_holm"] >= table.loc[table["primary"], "p"]).all()


def test_known_effects_are_found_with_their_sign() -> None:
    gen = torch.Generator().manual_seed(1)
    learned = {"homogenization": 0.0, "matched_last": 0.05}
    nope = {"loss": 0.3, "homogenization": 0.03}
    entities = {
        "learned": [fake_seed(gen, 400, learned) for _ in range(3)],
        "none": [fake_seed(gen, 400, nope) for _ in range(3)],
    }
    # H grows with depth in the positional model
    for seed in entities["learned"]:
        seed["none"]["homogenization"][:, 2] += 0.05
    table = claims_table(
        entities, layers=LAYERS, no_positions="none", resample_seeds=True, n_boot=300
    )
    rows = table[table["primary"]].set_index(["reading", "test"])
    got = dict(zip(rows.index.get_level_values("test"), rows["verdict"], strict=True))
    assert got["centred H(2) - H(0) (maximum at layer 2)"] == "holds"
    assert got["matched last-edge excess of W, layer 2: positional minus none"] == "holds"
    assert got["next-token loss (nats/token): no positions minus positional"] == "holds"
    # layer 2: NoPE 0.03 against learned 0.05, so removing positions lowers H there
    assert got["centred H(2): no positions minus positional"] == "holds"
    first = "matched first-edge excess of W, layer 2: positional minus none"
    assert got[first] in ("equivalent", "inconclusive")


def _table(learned: dict, nope: dict, seed: int = 2, **options) -> dict:
    """``{test: verdict}`` of the primary rows, learned against none (3 seeds each)."""
    gen = torch.Generator().manual_seed(seed)
    entities = {
        "learned": [fake_seed(gen, 400, learned) for _ in range(3)],
        "none": [fake_seed(gen, 400, nope) for _ in range(3)],
    }
    table = claims_table(
        entities, layers=LAYERS, no_positions="none", resample_seeds=True, n_boot=300, **options
    )
    rows = table[table["primary"]]
    return dict(zip(rows["reading"] + " | " + rows["test"], rows["verdict"], strict=True))


def test_c1_every_layer_is_its_own_primary_and_needs_every_layer() -> None:
    gen = torch.Generator().manual_seed(3)
    seeds = [fake_seed(gen, 400, {}) for _ in range(3)]
    for s in seeds:  # H(2) - H(0) = +0.05 but H(1) - H(0) = -0.05
        s["none"]["homogenization"][:, 2] += 0.05
        s["none"]["homogenization"][:, 1] -= 0.05
    table = claims_table({"m": seeds}, layers=LAYERS, no_positions=None, resample_seeds=True,
                         n_boot=300)  # fmt: skip
    primary = table[table["primary"]].set_index("reading")
    assert primary.loc["grows with depth", "verdict"] == "holds"
    every = primary.loc["exists in every layer"]
    assert every["verdict"] == "fails" and "H(1) - H(0)" in every["test"]
    for s in seeds:
        s["none"]["homogenization"][:, 1] += 0.1  # now every layer is above H(0)
    table = claims_table({"m": seeds}, layers=LAYERS, no_positions=None, resample_seeds=True,
                         n_boot=300)  # fmt: skip
    assert (
        table[table["primary"]].set_index("reading").loc["exists in every layer", "verdict"]
        == "holds"
    )


def test_c3b_reads_a_shrinking_anomaly_not_a_lower_excess() -> None:
    # the positional model's first-edge excess is -0.05; without positions -0.01: |E| shrinks
    # (today's unsigned "lower" reading called this a failure), -0.09: |E| grows
    key = "b: shrinks the first-edge anomaly |E|"
    shrinks = _table({"matched_first": -0.05}, {"matched_first": -0.01})
    grows = _table({"matched_first": -0.05}, {"matched_first": -0.09})
    assert [v for k, v in shrinks.items() if k.startswith(key)] == ["holds"]
    assert [v for k, v in grows.items() if k.startswith(key)] == ["fails"]


def test_c2_verdicts_are_against_the_causal_null() -> None:
    # both models share the same (causal-mixing) first-edge deficit: no positional effect
    same = _table({"matched_first": -0.05}, {"matched_first": -0.05})
    reading = "a, within: the first tokens more alike in context (vs causal null)"
    (verdict,) = [v for k, v in same.items() if k.startswith(reading)]
    assert verdict in ("equivalent", "inconclusive")
    more = _table({"matched_first": 0.04}, {"matched_first": -0.05})
    (verdict,) = [v for k, v in more.items() if k.startswith(reading)]
    assert verdict == "holds"


def test_the_default_sesoi_is_a_fraction_of_the_statistics_scale() -> None:
    gen = torch.Generator().manual_seed(4)
    seeds = [fake_seed(gen, 100, {"homogenization": 0.2}) for _ in range(2)]
    table = claims_table({"m": seeds}, layers=LAYERS, no_positions=None, n_boot=50)
    growth = table[table["test"].str.startswith("centred H(2) - H(0)")]
    assert abs(float(growth["sesoi"].iloc[0]) - 0.02) < 2e-3  # a tenth of |H(2)| = 0.2
    fixed = claims_table({"m": seeds}, layers=LAYERS, no_positions=None, n_boot=50, sesoi=0.01)
    assert (fixed.loc[fixed["test"].str.startswith("centred"), "sesoi"] == 0.01).all()
