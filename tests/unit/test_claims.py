"""The claims table on synthetic per-window statistics: a null where no claim should hold, known
effects that must be found, the hierarchical (seed) path, Holm over the primary rows."""

from __future__ import annotations

import torch

from homoglens.claims import CLAIM_COLUMNS, claims_table
from homoglens.comparison import LAYER_STATISTICS

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
    assert len(primary) == 2 * 4 + 2 * 4  # C1, C2 loc x 2, C2 cross; C3 a, b x 2, c
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
    assert got["matched last-edge excess, layer 2"] == "holds"
    assert got["next-token loss (nats/token): no positions minus positional"] == "holds"
    # layer 2: NoPE 0.03 against learned 0.05, so removing positions lowers H there
    assert got["centred H(2): no positions minus positional"] == "holds"
    assert got["matched first-edge excess, layer 2"] in ("equivalent", "inconclusive")
