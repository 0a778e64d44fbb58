"""Build the shipped per-window statistics of the replicate seeds (issue 16, replication).

    homoglens train --variant all --seed 1 --out models     # ~10-20 min per model on 2 cores
    homoglens train --variant all --seed 2 --out models
    .venv/bin/python scripts/replicates.py models           # -> src/homoglens/assets/replicates/

For every folder ``models/tiny-<variant>-s<seed>`` this runs the default comparison (all 1365
held-out windows of 128 tokens, modes none / zero / permute, edge_k 8, seed 0) and writes the
model's per-window statistics (``ModelComparison.export_statistics``), which
``compare_models(REPLICATED_MODELS)`` then reads in place of the weights. Training is
deterministic, so the weights (and these statistics) are reproduced bit for bit from the
recorded settings; the weights themselves stay out of the package.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path, help="folder holding tiny-<variant>-s<seed>/")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "src" / "homoglens" / "assets" / "replicates"
    )
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--only", nargs="+", help="names to build (default: every replicate)")
    args = parser.parse_args()
    from homoglens.comparison.measure import REPLICATED_MODELS, compare_models
    from homoglens.models.loading import SHIPPED_MODELS

    wanted = [name for name in REPLICATED_MODELS if name not in SHIPPED_MODELS]
    if args.only:
        wanted = [name for name in wanted if name in args.only or name.split("/")[-1] in args.only]
    folders = {name: args.models / name.split("/")[-1] for name in wanted}
    missing = [str(f) for f in folders.values() if not (f / "config.json").is_file()]
    if missing:
        sys.exit(f"missing trained folders: {missing} (train them first, see the docstring)")
    for name, folder in folders.items():
        start = time.perf_counter()
        result = compare_models({name: str(folder)}, group_by=None, progress=args.progress)
        path = result.export_statistics(name, args.out)
        record = json.loads((folder / "training.json").read_text())
        print(
            f"{name}: held-out loss {record['heldout_loss']:.4f}, "
            f"{result.n_sequences} windows -> {path} ({time.perf_counter() - start:.0f} s)"
        )


if __name__ == "__main__":
    main()
