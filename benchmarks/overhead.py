"""Overhead of homoglens' hooks over a bare forward pass, measured side by side in one run.

For each model: the same batch goes through (a) a bare ``model(tokens)`` forward, (b) the same
forward inside ``ablated_positions(model, mode)`` for each mode, and (c)
``homogenization_profile`` (all layers, no effective rank). Runs are interleaved round-robin
and each figure is the median of ``--repeats`` runs; ratios are to the bare forward's median.

    python benchmarks/overhead.py                          # SmolLM2-135M and a GPT-2-shaped model
    python benchmarks/overhead.py --models tiny-gpt2 --repeats 5
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

    if name == "tiny-gpt2":
        return load_model(
            tiny_model_folder("gpt2", n_layers=4, d_model=256, n_ctx=512),
            backend="bridge",
            device="cpu",
        )
    if name == "gpt2-small-shape":  # GPT-2 small architecture (124M), random weights
        return load_model(
            tiny_model_folder("gpt2", n_layers=12, d_model=768, n_heads=12, n_ctx=1024),
            backend="bridge",
            device="cpu",
        )
    return load_model(name, backend=backend, device="cpu")


def bench(
    name: str, backend: str, seq_len: int, batch: int, repeats: int
) -> list[tuple[str, float, float]]:
    from homoglens import ablated_positions, corpus_windows, homogenization_profile
    from homoglens.architectures import architecture_of

    model = _model(name, backend)
    tokens = corpus_windows(model, n_seq=batch, seq_len=seq_len).tokens
    modes = ["zero", "permute"] + (
        ["shift", "mean"] if architecture_of(model).positional == "learned_absolute" else []
    )
    kwargs = {"permute": {"seed": 0}, "shift": {"shift": 0}}

    def bare() -> None:
        with torch.inference_mode():
            model(tokens)

    def ablated(mode: str):
        def run() -> None:
            with torch.inference_mode(), ablated_positions(model, mode, **kwargs.get(mode, {})):
                model(tokens)

        return run

    def profile() -> None:
        homogenization_profile(model, tokens, batch_size=batch, progress=False)

    cases = {
        "bare forward": bare,
        **{f"ablation {m}": ablated(m) for m in modes},
        "homogenization_profile": profile,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm-up
        fn()
    for _ in range(repeats):
        for key, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    base = statistics.median(times["bare forward"])
    return [(k, statistics.median(v), statistics.median(v) / base) for k, v in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "tiny-gpt2"])
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default="bridge", choices=["bridge", "hooked"])
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads; "
        f"torch {torch.__version__}, transformer-lens {version('transformer-lens')}, "
        f"homoglens {version('homoglens')}"
    )
    print(f"batch {args.batch} x seq_len {args.seq_len}, median of {args.repeats} interleaved runs")
    for name in args.models:
        print(f"\n| {name} ({args.backend}) | median s | x bare forward |\n|---|---|---|")
        for key, seconds, ratio in bench(
            name, args.backend, args.seq_len, args.batch, args.repeats
        ):
            print(f"| {key} | {seconds:.3f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
