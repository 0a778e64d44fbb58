"""Throughput of homogenization_profile with 2 data-parallel processes (torchrun, gloo) versus one.

    python benchmarks/distributed.py                       # GPT-2 small shape, 64 x 128 tokens
    python benchmarks/distributed.py --model homoglens/tiny-learned --n-seq 256

One process uses all ``--threads``; each of the ``--nproc`` ranks gets ``threads / nproc``, so both
runs use the same cores. Each figure is the median of ``--repeats`` timed profiles after one
warm-up, timed inside the processes (model loading excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORKER = r"""
import json, os, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from performance import load, tokens_for
from homoglens import homogenization_profile
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    dist.init_process_group("gloo")
torch.set_num_threads(int(sys.argv[2]))
model = load(sys.argv[3], "cpu", torch.float32)
tokens = tokens_for(model, int(sys.argv[4]), int(sys.argv[5]))
homogenization_profile(model, tokens, batch_size=8, progress=False)
times = []
for _ in range(int(sys.argv[6])):
    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    homogenization_profile(model, tokens, batch_size=8, progress=False)
    times.append(time.perf_counter() - start)
if not dist.is_initialized() or dist.get_rank() == 0:
    print(json.dumps({"median_s": statistics.median(times)}))
"""


def run(nproc: int, args: argparse.Namespace) -> float:
    here = str(Path(__file__).resolve().parent)
    script = Path("/tmp") / "homoglens_dist_bench.py"
    script.write_text(WORKER)
    threads = max(1, args.threads // nproc)
    tail = [here, str(threads), args.model, str(args.n_seq), str(args.seq_len), str(args.repeats)]
    if nproc == 1:
        cmd = [sys.executable, str(script), *tail]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc_per_node", str(nproc), str(script), *tail]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["median_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-small-shape")
    parser.add_argument("--n-seq", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    one = run(1, args)
    many = run(args.nproc, args)
    tokens = args.n_seq * args.seq_len
    print(
        f"{args.model}, {args.n_seq} x {args.seq_len} tokens, {args.threads} cores: 1 process "
        f"{one:.2f} s ({tokens / one:.0f} tokens/s); {args.nproc} processes {many:.2f} s "
        f"({tokens / many:.0f} tokens/s); speed-up {one / many:.2f}x"
    )
    print(time.strftime("%Y-%m-%d"))


if __name__ == "__main__":
    main()
