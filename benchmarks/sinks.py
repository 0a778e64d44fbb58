"""Cost and agreement of sink attribution, measured side by side in one run.

Cost: per batch, a bare forward pass, ``sink_attribution(method="fast")`` (all heads) and
``method="exact"`` for ``--top-k`` heads (plus the joint ablation) run interleaved; figures are
medians of ``--repeats`` runs in forward-pass equivalents (time / bare forward). The exact
mode's ``rerun`` says whether it restarted at the ablated block (HookedTransformer
``start_at_layer``) or ran the full model (TransformerBridge).

Agreement (``--correlation``): fast versus exact over every head, Pearson correlation per
metric, for the sink removal and for mean ablation.

    python benchmarks/sinks.py --model smollm2-135m-instruct --correlation
    python benchmarks/sinks.py --model tiny-gpt2 --backend hooked      # TransformerLens 3.9
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


def _model(name: str, backend: str):
    from homoglens import load_model
    from homoglens.testing import tiny_model_folder

    if name == "tiny-gpt2":  # GPT-2 architecture, random weights
        folder = tiny_model_folder("gpt2", n_layers=6, d_model=256, n_heads=8, n_ctx=512)
        return load_model(folder, backend=backend, device="cpu")
    return load_model(name, backend=backend, device="cpu")


def main() -> None:
    from homoglens import corpus_windows, sink_attribution
    from homoglens.sinks import ATTRIBUTION_METRICS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--backend", default="bridge")
    parser.add_argument("--n-seq", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--edge-k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--correlation", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = _model(args.model, args.backend)
    batch = corpus_windows(model, n_seq=args.n_seq, seq_len=args.seq_len)
    common = {"edge_k": args.edge_k, "batch_size": args.n_seq, "progress": False}
    heads = sink_attribution(model, batch, top_k=args.top_k, **common).heads

    def bare() -> None:
        with torch.inference_mode():
            model(batch.tokens.to(next(model.parameters()).device))

    runs = {
        "bare forward": bare,
        "fast (all heads, 1 metric)": lambda: sink_attribution(
            model, batch, method="fast", metrics=["first_excess"], **common
        ),
        "fast (all heads, 3 metrics)": lambda: sink_attribution(
            model, batch, method="fast", **common
        ),
        f"exact ({len(heads)} heads + joint)": lambda: sink_attribution(
            model, batch, heads=list(heads), **common
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    exact = sink_attribution(model, batch, heads=list(heads), **common)
    base = statistics.median(times["bare forward"])
    print(
        f"# {args.model} ({args.backend}), {args.n_seq} x {args.seq_len} tokens, "
        f"{platform.machine()}, torch {version('torch')}, "
        f"transformer-lens {version('transformer-lens')}"
    )
    print(f"exact heads: {list(exact.heads)}; rerun: {exact.rerun}")
    print("| run | forward equivalents | median s |\n|---|---|---|")
    for name, values in times.items():
        med = statistics.median(values)
        per = f" ({med / base / (len(heads) + 2):.2f} per pass)" if name.startswith("exact") else ""
        print(f"| {name} | {med / base:.2f}{per} | {med:.2f} |")
    if args.correlation:
        n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
        every = [(i, h) for i in range(n_layers) for h in range(n_heads)]
        print(
            "\n| ablation | metric | Pearson (Spearman) fast vs exact, all heads | top exact head |"
        )
        print("|---|---|---|---|")
        for ablation in ("sink", "mean"):
            fast = sink_attribution(model, batch, method="fast", ablation=ablation, **common)
            full = sink_attribution(
                model, batch, heads=every, ablation=ablation, joint=False, **common
            )
            for j, metric in enumerate(ATTRIBUTION_METRICS):
                top = int(full.delta[:, j].abs().argmax())
                print(
                    f"| {ablation} | {metric} | {full.correlation(fast, metric):.3f} "
                    f"({full.correlation(fast, metric, rank=True):.3f}) | "
                    f"L{every[top][0]}H{every[top][1]} {float(full.delta[top, j]):+.4f} "
                    f"(fast {float(fast.delta[top, j]):+.4f}) |"
                )


if __name__ == "__main__":
    main()
