"""Cost of a positional patching sweep, measured side by side in one run.

For each ``--cell-batch`` value, a full ``layers x position-bins`` restore sweep (metrics
mean_pairwise and loss) runs on the same windows; the figures are wall time over a bare forward
pass of the same windows, and ``forward_equivalents`` as counted by homoglens (blocks run / blocks
of one pass). With ``cell_batch=1`` every cell is its own forward pass.

    python benchmarks/patching.py --model smollm2-135m-instruct
    python benchmarks/patching.py --model smollm2-135m-instruct --backend hooked   # TL 3.9
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings
from importlib.metadata import version

import torch

warnings.filterwarnings("ignore")


def main() -> None:
    from homoglens import corpus_windows, load_model, positional_patching
    from homoglens.testing import tiny_model_folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--backend", default="bridge")
    parser.add_argument("--n-seq", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--bins", type=int, default=16)
    parser.add_argument("--layer-step", type=int, default=3)
    parser.add_argument("--cell-batch", default="1,8")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.model == "tiny-gpt2":
        folder = tiny_model_folder("gpt2", n_layers=6, d_model=256, n_heads=8, n_ctx=512)
        model = load_model(folder, backend=args.backend, device="cpu")
    else:
        model = load_model(args.model, backend=args.backend, device="cpu")
    batch = corpus_windows(model, n_seq=args.n_seq, seq_len=args.seq_len)
    n_layers = model.cfg.n_layers
    layers = sorted(set(range(0, n_layers, args.layer_step)) | {n_layers - 1})

    def bare() -> None:
        with torch.inference_mode():
            model(batch.tokens)

    times: dict[str, list[float]] = {"bare forward": []}
    results = {}
    sizes = [int(x) for x in args.cell_batch.split(",")]
    bare()  # warm-up
    for _ in range(args.repeats):
        start = time.perf_counter()
        bare()
        times["bare forward"].append(time.perf_counter() - start)
        for size in sizes:
            start = time.perf_counter()
            results[size] = positional_patching(
                model,
                batch,
                metric=["mean_pairwise", "loss"],
                layers=layers,
                bins=args.bins,
                batch_size=args.n_seq,
                cell_batch=size,
                progress=False,
            )
            times.setdefault(f"sweep, cell_batch={size}", []).append(time.perf_counter() - start)
    base = statistics.median(times["bare forward"])
    cells = len(layers) * args.bins
    print(
        f"# {args.model} ({args.backend}), {args.n_seq} x {args.seq_len} tokens, "
        f"{len(layers)} blocks x {args.bins} bins = {cells} cells, {platform.machine()}, "
        f"torch {version('torch')}, transformer-lens {version('transformer-lens')}"
    )
    print("| run | wall / bare forward | counted forward equivalents | median s |")
    print("|---|---|---|---|")
    for name, values in times.items():
        med = statistics.median(values)
        size = int(name.split("=")[1]) if "=" in name else None
        counted = f"{results[size].forward_equivalents:.1f}" if size else "1"
        print(f"| {name} | {med / base:.1f} | {counted} | {med:.2f} |")
    first, last = results[sizes[0]], results[sizes[-1]]
    print(f"\nbatching: {last.batching}")
    gap = float((first.patched - last.patched).abs().max())
    print(f"max |difference| between cell_batch values: {gap:.2e}")


if __name__ == "__main__":
    main()
