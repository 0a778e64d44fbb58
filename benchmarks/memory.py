"""Peak memory of homogenization_profile versus the number of sequences.

Each measurement runs in a fresh subprocess: load a model, then profile ``n_seq`` windows with a
fixed ``batch_size``; report the peak resident set size (``ru_maxrss``) measured after the
model is loaded and before/after the profile. Streaming means the growth stays flat as
``n_seq`` grows; caching every layer's ``[batch pos d_model]`` would add
``n_seq * seq_len * d_model * (n_layers + 1) * 4`` bytes.

    python benchmarks/memory.py                      # tiny GPT-2 (d_model 256, 4 layers)
    python benchmarks/memory.py --model smollm2-135m-instruct --n-seq 8 32 128
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import gc, json, resource, sys, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(2)
from homoglens import corpus_windows, homogenization_profile, load_model
from homoglens.testing import tiny_model_folder
model_name = sys.argv[1]
n_seq, seq_len, batch_size = (int(a) for a in sys.argv[2:5])
if model_name == "tiny":
    model_name = str(tiny_model_folder("gpt2", n_layers=4, d_model=256, n_ctx=256))
model = load_model(model_name, backend="bridge", device="cpu")
windows = corpus_windows(model, n_seq=n_seq, seq_len=seq_len)
# warm up with one batch so lazy allocations are not counted as growth
homogenization_profile(model, windows[:batch_size], batch_size=batch_size, progress=False)
gc.collect()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prof = homogenization_profile(model, windows, batch_size=batch_size, progress=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = model.cfg
cache_all = n_seq * seq_len * cfg.d_model * (cfg.n_layers + 1) * 4
print(json.dumps({"n_seq": n_seq, "peak_before_mib": before / 1024, "peak_after_mib": after / 1024,
                  "growth_mib": (after - before) / 1024, "cache_all_mib": cache_all / 2**20,
                  "n_tokens": prof.n_tokens}))
"""


def measure(model: str, n_seq: int, seq_len: int, batch_size: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(n_seq), str(seq_len), str(batch_size)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--n-seq", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print JSON lines only")
    args = parser.parse_args()
    rows = [measure(args.model, n, args.seq_len, args.batch_size) for n in args.n_seq]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"model={args.model} seq_len={args.seq_len} batch_size={args.batch_size}")
    print(f"{'n_seq':>6} {'peak MiB':>9} {'growth MiB':>11} {'cache-all would add MiB':>24}")
    for r in rows:
        print(
            f"{r['n_seq']:>6} {r['peak_after_mib']:>9.1f} {r['growth_mib']:>11.1f} "
            f"{r['cache_all_mib']:>24.1f}"
        )


if __name__ == "__main__":
    main()
