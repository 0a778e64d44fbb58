"""Numbers unchanged across a refactor: every measurement saved by one commit, loaded and
recomputed by another, must agree (bitwise or float noise).

    python benchmarks/numbers_unchanged.py save DIR     # on the commit before the move
    python benchmarks/numbers_unchanged.py check DIR    # on the commit after it

``save`` runs each public measurement on the shipped tiny models (a few short windows, CPU,
float32) and saves the results into ``DIR/<name>``; ``check`` loads each saved result with the
code at hand (so the old files must still load and validate), recomputes it, and compares every
tensor field: equal, or within ``--atol`` (default 1e-6, float32 accumulation noise). It prints
one line per result and exits 1 on any difference. Not a test: CI's tests pin the numbers to
independent oracles; this pins them to the previous commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import homoglens as hg
from homoglens.testing import tiny_model_folder


def _model(arch: str) -> Any:
    return hg.load_model(tiny_model_folder(arch), backend="bridge", device="cpu")


def _windows(n: int = 6, t: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 1000, (n, t), generator=torch.Generator().manual_seed(seed))


def measurements() -> dict[str, Callable[[], Any]]:
    """Name -> a call that measures (small, deterministic)."""
    quiet = {"progress": False}
    llama, gpt2 = _model("llama"), _model("gpt2")
    w = _windows()
    return {
        "profile_llama": lambda: hg.homogenization_profile(llama, w, effective_rank=True, **quiet),
        "profile_gpt2": lambda: hg.homogenization_profile(gpt2, w, **quiet),
        "similarity_llama": lambda: hg.positional_similarity(llama, w, edge_k=4, **quiet),
        "ablation_study_gpt2": lambda: hg.position_ablation_study(
            gpt2, w, modes=["zero", "permute", "shift"], n_boot=50, **quiet
        ),
        "bias_study_llama": lambda: hg.attention_bias_study(
            llama, w, kind="first", strengths=[-1.0, 0.0, 1.0], edge_k=4, **quiet
        ),
        "length_study_llama": lambda: hg.length_study(
            llama, _windows(4, 32), lengths=(8, 16, 32), edge_k=2, **quiet
        ),
        "sink_scores_llama": lambda: hg.sink_scores(llama, w, **quiet),
        "massive_llama": lambda: hg.massive_activations(llama, w, **quiet),
        "attribution_llama": lambda: hg.sink_attribution(llama, w, top_k=2, edge_k=4, **quiet),
        "patching_gpt2": lambda: hg.positional_patching(gpt2, w, edge_k=4, **quiet),
        "received_llama": lambda: hg.attention_received(llama, w, **quiet),
        "massive_study_llama": lambda: hg.massive_ablation_study(
            llama, w, layer=1, dims=[0, 1], positions=[0], n_boot=50, **quiet
        ),
        "rollout_llama": lambda: hg.attention_rollout(llama, w, **quiet),
        "perturbation_llama": lambda: hg.perturbation_spread(llama, w, **quiet),
        "valleys_llama": lambda: hg.compression_valleys(
            llama, w, ablation_layer=1, dims=[0], n_boot=50, **quiet
        ),
        "readings_gpt2": lambda: hg.calibrated_readings(
            gpt2, w, reference="no_positions", edge_k=4, **quiet
        ),
    }


def _fields(result: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(result):
        return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    return dict(vars(result))


def _differences(old: Any, new: Any, atol: float, where: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        if old.shape != new.shape:
            return [f"{where}: shape {tuple(old.shape)} != {tuple(new.shape)}"]
        if old.is_floating_point():
            a, b = old.double(), new.double()
            same = torch.isclose(a, b, atol=atol, rtol=0, equal_nan=True)
            if not bool(same.all()):
                gap = float((a - b).abs().nan_to_num(math.inf).max())
                out.append(f"{where}: max |diff| {gap:.3g}")
        elif not torch.equal(old, new):
            out.append(f"{where}: integer values differ")
        return out
    if dataclasses.is_dataclass(old) and not isinstance(old, type):
        if type(old).__name__ == "Provenance":
            return out  # versions, times and hashes of the run itself differ by design
        for name, value in _fields(old).items():
            out += _differences(value, getattr(new, name, None), atol, f"{where}.{name}")
        return out
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            out += _differences(old[key], new.get(key), atol, f"{where}[{key!r}]")
        return out
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        if len(old) != len(new):
            return [f"{where}: length {len(old)} != {len(new)}"]
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            out += _differences(a, b, atol, f"{where}[{i}]")
        return out
    if isinstance(old, float) and isinstance(new, float):
        if not (math.isclose(old, new, abs_tol=atol, rel_tol=0) or (old != old and new != new)):
            out.append(f"{where}: {old!r} != {new!r}")
        return out
    if old != new:
        out.append(f"{where}: {old!r} != {new!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Save or check; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["save", "check"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    failed = 0
    for name, measure in measurements().items():
        result = measure()
        path = args.folder / name
        if args.mode == "save":
            result.save(path)
            print(f"saved {name} ({type(result).__name__})")
            continue
        old = type(result).load(path)
        found = _differences(old, result, args.atol, name)
        failed += bool(found)
        print(f"{'DIFFERS' if found else 'same   '} {name}" + "".join(f"\n  {f}" for f in found))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
