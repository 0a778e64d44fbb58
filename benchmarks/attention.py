"""Measurements that read or change attention, on the CPU: working memory over T (blocked
against eager) and the cost of a rotary position ablation against the unablated profile.

Memory: ``sink_scores`` on one window of T tokens (batch 1, float32), in a fresh process per
row, after the model and the tokens are loaded and one short warm-up pass has run: the
resident-set high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` just before)
minus the resident set at that moment, with glibc's mmap threshold fixed so that the resident
set follows live tensors (the method of ``benchmarks/performance.py``). ``eager`` rows run
with ``HOMOGLENS_EAGER=1``: the bridge's eager attention and its ``hook_pattern``.

Cost: ``homogenization_profile`` of the same ``[batch T]`` windows, unablated and inside
``ablated_positions(model, "zero")`` / ``"permute"``, interleaved round-robin, medians of
``--repeats``; the ratio is ablated / unablated time.

    python benchmarks/attention.py                     # SmolLM2-135M-Instruct
    python benchmarks/attention.py --lens 256 512 --cost-len 128 --repeats 1   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

warnings.filterwarnings("ignore")


def _rss_mib() -> tuple[float, float]:
    status = Path("/proc/self/status").read_text()
    rss, hwm = (
        int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM")
    )
    return rss, hwm


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: MiB of working memory of one measurement on one window."""
    import gc

    from homoglens import corpus_windows, load_model, sink_scores

    torch.set_num_threads(2)
    model = load_model(spec["model"], backend="bridge", device="cpu")
    tokens = corpus_windows(model, n_seq=1, seq_len=spec["T"], bos="never").tokens
    sink_scores(model, tokens[:, :16], progress=False)  # one-time allocations
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _rss_mib()[0]
    start = time.perf_counter()
    sink_scores(model, tokens, batch_size=1, progress=False)
    seconds = time.perf_counter() - start
    return {"working_mib": _rss_mib()[1] - before, "seconds": seconds}


def memory(model: str, seq_len: int, eager: bool) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    if eager:
        env["HOMOGLENS_EAGER"] = "1"
    spec = json.dumps({"model": model, "T": seq_len})
    done = subprocess.run(
        [sys.executable, __file__, "--child", spec], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:160]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def cost(model_name: str, seq_len: int, batch: int, repeats: int) -> dict[str, float]:
    from homoglens import ablated_positions, corpus_windows, homogenization_profile, load_model

    torch.set_num_threads(2)
    model = load_model(model_name, backend="bridge", device="cpu")
    tokens = corpus_windows(model, n_seq=batch, seq_len=seq_len, bos="never").tokens

    def profile() -> None:
        homogenization_profile(model, tokens, batch_size=batch, progress=False)

    def ablated(how: str, **options: Any) -> Any:
        def run() -> None:
            with ablated_positions(model, how, **options):
                profile()

        return run

    runs = {"none": profile, "zero": ablated("zero"), "permute": ablated("permute", seed=0)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {
        "none_s": med["none"],
        "zero / none": med["zero"] / med["none"],
        "permute / none": med["permute"] / med["none"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--eager-up-to", type=int, default=4096)
    parser.add_argument("--cost-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    print(f"# {args.model}, bridge, float32, {os.cpu_count()} cores, torch {torch.__version__}")
    print("| T | sink_scores working memory, blocked (MiB) | s | eager (MiB) | s |")
    print("|---|---|---|---|---|")
    for seq_len in args.lens:
        fast = memory(args.model, seq_len, eager=False)
        slow = memory(args.model, seq_len, eager=True) if seq_len <= args.eager_up_to else {}

        def cells(got: dict[str, Any]) -> str:
            if not got:
                return "- | -"
            if "failed" in got:
                return f"{got['failed']} | -"
            return f"{got['working_mib']:.0f} | {got['seconds']:.1f}"

        print(f"| {seq_len} | {cells(fast)} | {cells(slow)} |", flush=True)
    got = cost(args.model, args.cost_len, args.batch, args.repeats)
    print(
        f"\nProfile of {args.batch} x {args.cost_len} windows: unablated {got['none_s']:.2f} s; "
        f"zero ablation {got['zero / none']:.3f} x, permute {got['permute / none']:.3f} x "
        f"(medians of {args.repeats} interleaved runs)"
    )


if __name__ == "__main__":
    main()
