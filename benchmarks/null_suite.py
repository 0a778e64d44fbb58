"""The null suite of the calibrated readings (issue 51): causal nulls, planted positional
preferences, and coverage on consecutive windows, by simulation.

    python benchmarks/null_suite.py            # 100 replicates per cell (about 45 min, 2 cores)
    python benchmarks/null_suite.py --quick    # 20 replicates (a smoke run)

Each replicate reads the five readings of "edge tokens homogenize"
(:class:`homoglens.similarity.calibration.CalibratedReadings`) on ``n`` windows of activations from
a generator (:func:`homoglens.core.controls.control_activations`), two entries each: the draw itself
and the draw with a positional preference planted on top (:func:`homoglens.core.controls.planted`).
The reference is another draw of the same process with nothing planted (strength 0): the
model-matched null of the planted preference. Verdicts use Holm over the five readings and a
fixed SESOI of 0.0034 (SmolLM2's at layer 30, docs/findings.md).

* Nulls (nothing planted on either side): a verdict other than equivalent / inconclusive on
  any reading is a false positive; the suite asks for >= 90 % of replicates with none.
* Planted preferences: detected when the reading the preference moves (its *target*) is
  significant (holds or fails, Holm); the suite asks for >= 80 % at n = 48, with the target's
  mean difference no larger than SmolLM2's largest reading of the same kind ((a) 0.018,
  (b) 0.061). The strength of each preference is set per null to give about that size (the
  same logit bias moves the readings of a sink-dominated mixer far less than those of uniform
  mixing; on the sink mixer a first-key bias moves reading (a) by at most 0.0023, below the
  SESOI, even at 20 nats: the sink already holds the mass it would move).
* Coverage: paired readings (model - another draw) on consecutive windows of one long series
  (a fast AR(1) plus a slow component spanning about two windows), n = 24, 48, 96: the 95 %
  interval should cover 0 in >= 93 % of replicates.

The tables go into ``docs/similarity.md`` between the ``null_suite.py`` markers.
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from performance import machine  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "similarity.md"
BEGIN, END = "<!-- null_suite.py:begin -->", "<!-- null_suite.py:end -->"
NULLS = ("stationary", "uniform_causal", "random_walk", "sink_causal")
PLANTS = {  # preference: (target reading, strength on each null)
    # strengths chosen so that the target's mean difference is about SmolLM2's size
    # ((a) <= 0.018, (b) <= 0.061): the same preference moves the readings by different
    # amounts on different processes
    "first_key_bias": ("matched_first", {"stationary": 0.35, "uniform_causal": 0.2,
                                         "random_walk": 0.25, "sink_causal": 20.0}),
    "recency_bias": ("matched_first", {"stationary": 0.65, "uniform_causal": 0.3,
                                       "random_walk": 0.45, "sink_causal": 3.0}),
    "last_pulled": ("matched_last", {"stationary": 0.07, "uniform_causal": 0.04,
                                     "random_walk": 0.1, "sink_causal": 0.5}),
    "edge_common": ("sp_first", {"stationary": 0.25, "uniform_causal": 0.45,
                                 "random_walk": 0.09, "sink_causal": 0.3}),
}  # fmt: skip
SIZES = {"seq_len": 32, "d_model": 576, "edge_k": 4}  # SmolLM2's d_model
SESOI = 0.0034


def _side(null: str, plant: str, strength: float, n: int, seed: int):  # noqa: ANN202
    from homoglens import PositionalSimilarity
    from homoglens.core.controls import control_activations, planted

    k = SIZES["edge_k"]
    x = control_activations(null, n, SIZES["seq_len"], SIZES["d_model"], edge_k=k, seed=seed)
    layers = torch.stack([x, planted(x, plant, strength, edge_k=k, seed=12345)])  # type: ignore[arg-type]
    return PositionalSimilarity.from_activations(layers, edge_k=k)


def cell(null: str, plant: str | None, n: int, replicates: int) -> dict[str, object]:
    """One row of the suite: rates over ``replicates`` of a null (``plant`` None) or a planted
    preference."""
    from homoglens.similarity.calibration import CalibratedReadings

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    target, strengths = PLANTS[plant] if plant else (None, {})
    strength = strengths.get(null, 0.0)
    any_effect, hit, diffs = 0, 0, []
    for rep in range(replicates):
        model = _side(null, plant or "last_pulled", strength, n, 2 * rep)
        ref = _side(null, plant or "last_pulled", 0.0, n, 2 * rep + 1)
        table = CalibratedReadings(model, ref, "model", "null").table(sesoi=SESOI, n_boot=500)
        effect = table["verdict"].str.startswith(("holds", "fails"))
        any_effect += bool(effect.any())
        if target is not None:
            row = table[table["statistic"] == target].iloc[0]
            hit += bool(str(row["verdict"]).startswith(("holds", "fails")))
            diffs.append(float(row["difference"]))
    out: dict[str, object] = {"null": null, "plant": plant or "none", "n": n}
    if plant is None:
        out["no_effect"] = 1 - any_effect / replicates
    else:
        out.update(strength=strength, target=target, detected=hit / replicates,
                   mean_difference=sum(diffs) / len(diffs))  # fmt: skip
    return out


def coverage(n: int, replicates: int) -> dict[str, object]:
    """Coverage of the five paired readings on consecutive windows (truth 0)."""
    from homoglens import PositionalSimilarity
    from homoglens.core.controls import control_activations
    from homoglens.similarity.calibration import CalibratedReadings

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    hits: dict[str, int] = {}
    for rep in range(replicates):
        sides = [
            PositionalSimilarity.from_activations(torch.stack([
                control_activations("consecutive", n, 32, 16, seed=4 * rep + which + 2 * k)
                for k in range(2)]), edge_k=4)
            for which in range(2)
        ]  # fmt: skip
        table = CalibratedReadings(*sides, "model", "another draw").table(n_boot=500)
        for row in table.itertuples():
            hits[str(row.statistic)] = hits.get(str(row.statistic), 0) + int(
                row.ci_low <= 0 <= row.ci_high
            )
    return {"n": n, **{k: v / replicates for k, v in hits.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=100)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    reps = 20 if args.quick else args.replicates
    import pandas as pd

    with ProcessPoolExecutor(args.workers) as pool:
        jobs = [pool.submit(cell, null, None, 48, reps) for null in NULLS]
        jobs += [pool.submit(cell, null, plant, 48, reps) for null in NULLS for plant in PLANTS]
        cover = [pool.submit(coverage, n, reps) for n in (24, 48, 96)]
        rows = [j.result() for j in jobs]
        covered = [c.result() for c in cover]
    nulls = pd.DataFrame([r for r in rows if r["plant"] == "none"])[["null", "n", "no_effect"]]
    plants = pd.DataFrame([r for r in rows if r["plant"] != "none"])
    plants = plants[["null", "plant", "strength", "target", "mean_difference", "detected"]]
    cov = pd.DataFrame(covered)

    def md(frame: pd.DataFrame) -> str:
        cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
                 for row in frame.itertuples(index=False)]  # fmt: skip
        lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])

    text = (
        f"{machine('cpu', 1)}, {args.workers} workers; {reps} replicates per row, n = 48 "
        f"windows of {SIZES['seq_len']} "
        f"positions x {SIZES['d_model']} dimensions, edge_k {SIZES['edge_k']}, SESOI {SESOI}.\n\n"
        "Nulls (share of replicates with no effect on any reading; target >= 0.90):\n\n"
        + md(nulls)
        + "\n\nPlanted preferences (share detected on the target reading; target >= 0.80):\n\n"
        + md(plants)
        + "\n\nCoverage of the paired readings on consecutive windows (target >= 0.93):\n\n"
        + md(cov)
        + "\n"
    )
    print(text)
    if not args.no_write and not args.quick:
        doc = DOC.read_text(encoding="utf-8")
        block = f"{BEGIN}\n{text}{END}"
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        doc = pattern.sub(lambda _: block, doc) if BEGIN in doc else doc + "\n" + block + "\n"
        DOC.write_text(doc, encoding="utf-8")


if __name__ == "__main__":
    main()
