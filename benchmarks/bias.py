"""Cost of ``attention_bias_study``, in forward-pass equivalents, measured side by side.

Per repeat, interleaved: ``attention_bias_study`` with 7 strengths (the default ones) over the
windows, with and without the gradient cross-check, each run bracketed by a bare
``model(tokens)`` forward over the same windows (batches of ``--batch-size``) before and after
it; a run's cost is its time over the mean of its two brackets, and the figures are medians of
``--repeats`` runs. The target (issue 20): at most 8 forward-pass equivalents for 7
strengths on SmolLM2, 32 x 256 windows.

    python benchmarks/bias.py                      # SmolLM2-135M, 32 x 256, about 10 min on 2 cores
    python benchmarks/bias.py --n-seq 8 --seq-len 64 --repeats 1  # a smoke run
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version

import torch

warnings.filterwarnings("ignore")


def main() -> None:
    from homoglens import attention_bias_study, corpus_windows, load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--backend", default="bridge")
    parser.add_argument("--n-seq", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--kind", default="first")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--no-gradient", action="store_true", help="time the default study only (half the time)"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = load_model(args.model, backend=args.backend, device="cpu")
    batch = corpus_windows(model, n_seq=args.n_seq, seq_len=args.seq_len)
    device = next(model.parameters()).device

    def bare() -> None:
        with torch.inference_mode():
            for start in range(0, args.n_seq, args.batch_size):
                model(batch.tokens[start : start + args.batch_size].to(device))

    common = {"kind": args.kind, "batch_size": args.batch_size, "progress": False}
    runs = {
        "bare forward": bare,
        "study, 7 strengths (default)": lambda: attention_bias_study(model, batch, **common),
        "study, 7 strengths, gradient cross-check on 8 windows": lambda: attention_bias_study(
            model, batch, gradient_windows=8, **common
        ),
    }
    if args.no_gradient:
        del runs["study, 7 strengths, gradient cross-check on 8 windows"]
    times: dict[str, list[float]] = {name: [] for name in runs}
    ratios: dict[str, list[float]] = {name: [] for name in runs}

    def timed(fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    # Each study run is bracketed by a bare forward before and after it: its ratio is taken
    # against the mean of the two, so that a drift of the shared machine's speed during the
    # run cancels; the table gives the median ratio over the repeats.
    before = timed(bare)
    for _ in range(args.repeats):
        for name, fn in runs.items():
            if name == "bare forward":
                continue
            took = timed(fn)
            after = timed(bare)
            times[name].append(took)
            times["bare forward"] += [before, after]
            ratios[name].append(took / ((before + after) / 2))
            before = after
    print(
        f"# {args.model} ({args.backend}), {args.n_seq} x {args.seq_len} tokens, batch "
        f"{args.batch_size}, kind {args.kind}, {platform.machine()}, torch {version('torch')}, "
        f"transformer-lens {version('transformer-lens')}, {args.repeats} repeats"
    )
    print("| run | forward-pass equivalents (median; each run) | median s |\n|---|---|---|")
    print(f"| bare forward | 1.00 | {statistics.median(times['bare forward']):.1f} |")
    for name in list(runs)[1:]:
        each = ", ".join(f"{r:.2f}" for r in ratios[name])
        med = statistics.median(times[name])
        print(f"| {name} | {statistics.median(ratios[name]):.2f} ({each}) | {med:.1f} |")


if __name__ == "__main__":
    main()
