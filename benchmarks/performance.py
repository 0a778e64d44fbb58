"""homoglens against a bare forward pass and against the hand-written way, in time and memory.

One command, one process for the timings (methods interleaved round-robin on the same batches,
medians of ``--repeats``), fresh subprocesses for CPU memory (peak resident set size is monotone
within a process), and the tables written into ``docs/performance.md`` between markers:

    python benchmarks/performance.py                     # CPU: GPT-2 small shape + SmolLM2-135M
    python benchmarks/performance.py --quick             # small sizes, a smoke run
    python benchmarks/performance.py --device cuda --dtype bfloat16 --no-write

Methods, on the same ``[8, T]`` batch of Austen tokens:

* ``bare``: ``model(tokens)`` under ``torch.inference_mode()`` (the same TransformerLens model, no
  hooks): the floor, since a profile must compute the activations;
* ``profile``: ``homogenization_profile(model, tokens, batch_size=8)`` (every layer entry);
* ``hand-written``: what researchers write today: ``run_with_cache`` of the ``n_layers + 1``
  residual hook points, then per layer the T x T cosine matrix of every sequence, its mean
  off-diagonal value and each row's mean (``to_others``).

Memory "above bare" = peak of the method minus the peak of the bare forward, in the same fresh
process (CPU: ``ru_maxrss``; CUDA: ``torch.cuda.max_memory_allocated``). An out-of-memory is
reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

warnings.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- performance.py:begin -->", "<!-- performance.py:end -->"

# SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M config), for a random model where the GGUF
# cannot go (the GPU machine).
SMOLLM2_SHAPE = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}


def load(name: str, device: str, dtype: torch.dtype) -> Any:
    """``gpt2-small-shape``: GPT-2 small (124M) from a local config, random weights;
    ``smollm2-shape``: SmolLM2-135M's shape, random weights; anything else: ``load_model``."""
    from homoglens import load_model
    from homoglens.testing import tiny_model_folder

    if name == "gpt2-small-shape":
        folder = tiny_model_folder("gpt2", n_layers=12, d_model=768, n_heads=12, n_ctx=1024)
    elif name == "smollm2-shape":
        folder = _smollm2_shape_folder()
    else:
        folder = name
    return load_model(folder, backend="bridge", device=device, dtype=dtype)


def _smollm2_shape_folder() -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from homoglens.models import _gpt2_tokenizer_folder, cache_dir

    folder = cache_dir() / "bench" / "smollm2-shape"
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_SHAPE))
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(str(_gpt2_tokenizer_folder())).save_pretrained(folder)
    return folder


def tokens_for(model: Any, n_seq: int, seq_len: int) -> torch.Tensor:
    from homoglens import corpus_windows

    return corpus_windows(model, n_seq=n_seq, seq_len=seq_len, bos="never").tokens


# ---------------------------------------------------------------------------- the methods
def bare(model: Any, tokens: torch.Tensor) -> None:
    with torch.inference_mode():
        model(tokens)


def profile(model: Any, tokens: torch.Tensor) -> None:
    from homoglens import homogenization_profile

    homogenization_profile(model, tokens, batch_size=len(tokens), progress=False)


def hand_written(model: Any, tokens: torch.Tensor) -> dict[str, list[float]]:
    """The plain way: cache every residual hook point, then a T x T cosine matrix per layer."""
    names = ["blocks.0.hook_resid_pre"] + [
        f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)
    ]
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        out: dict[str, list[float]] = {"mean_pairwise": [], "to_others": []}
        for name in names:
            x = torch.nn.functional.normalize(cache[name].float(), dim=-1)  # [batch pos d_model]
            cos = x @ x.transpose(1, 2)  # [batch pos pos]
            t = cos.shape[-1]
            off = cos.sum((1, 2)) - cos.diagonal(dim1=1, dim2=2).sum(-1)
            out["mean_pairwise"].append(float((off / (t * (t - 1))).mean()))
            out["to_others"].append(float(((cos.sum(-1) - 1) / (t - 1)).mean()))
    return out


def ablation(mode: str) -> Callable[[Any, torch.Tensor], None]:
    def run(model: Any, tokens: torch.Tensor) -> None:
        from homoglens import ablated_positions

        options = {"seed": 0} if mode == "permute" else {}
        with torch.inference_mode(), ablated_positions(model, mode, **options):
            model(tokens)

    return run


def sinks(model: Any, tokens: torch.Tensor) -> None:
    from homoglens import sink_scores

    sink_scores(model, tokens, batch_size=len(tokens), progress=False)


def attribution(method: str) -> Callable[[Any, torch.Tensor], None]:
    def run(model: Any, tokens: torch.Tensor) -> None:
        from homoglens import sink_attribution

        kwargs = {"top_k": 1} if method == "exact" else {}
        sink_attribution(
            model,
            tokens,
            method=method,
            metrics=["mean_pairwise"],
            batch_size=len(tokens),
            progress=False,
            **kwargs,
        )

    return run


def patching(model: Any, tokens: torch.Tensor) -> None:
    from homoglens import positional_patching

    positional_patching(
        model,
        tokens,
        how="zero",
        component="resid_pre",
        metric=["mean_pairwise"],
        layers=[0, model.cfg.n_layers // 2],
        bins=4,
        batch_size=len(tokens),
        progress=False,
    )


METHODS: dict[str, Callable[[Any, torch.Tensor], Any]] = {
    "bare": bare,
    "profile": profile,
    "hand-written": hand_written,
}
COSTS: dict[str, Callable[[Any, torch.Tensor], Any]] = {
    "bare": bare,
    "ablation zero": ablation("zero"),
    "ablation permute": ablation("permute"),
    "sink scores": sinks,
    "sink attribution fast (all heads, 1 metric)": attribution("fast"),
    "sink attribution exact (1 head + joint)": attribution("exact"),
    "patching sweep (2 blocks x 4 bins = 8 cells)": patching,
}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timings(
    model: Any, tokens: torch.Tensor, methods: dict[str, Callable], repeats: int, device: str
) -> dict[str, float]:
    """Median seconds of each method; methods interleaved round-robin, one warm-up each."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    for fn in methods.values():  # warm-up
        fn(model, tokens)
    for _ in range(repeats):
        for name, fn in methods.items():
            _sync(device)
            start = time.perf_counter()
            fn(model, tokens)
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# ---------------------------------------------------------------------------- memory
def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: peak of a bare forward, then peak of the method (MiB)."""
    import gc
    import resource

    torch.set_num_threads(spec["threads"])
    dtype = getattr(torch, spec["dtype"])
    model = load(spec["model"], spec["device"], dtype)
    tokens = tokens_for(model, spec["n_seq"], spec["seq_len"])
    cuda = spec["device"].startswith("cuda")
    batch = tokens[: spec["batch"]].to(spec["device"])

    def peak() -> float:
        if cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    bare(model, batch)
    gc.collect()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        bare(model, batch)
    bare_peak = peak()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    method = spec["method"]
    try:
        if method == "profile-n":  # the whole corpus of n_seq sequences, streamed in batches
            from homoglens import homogenization_profile

            homogenization_profile(model, tokens, batch_size=spec["batch"], progress=False)
        else:
            METHODS[method](model, batch)
    except (torch.OutOfMemoryError, MemoryError) as err:
        return {"oom": f"{type(err).__name__}"}
    method_peak = peak()
    return {
        "bare_peak_mib": bare_peak,
        "peak_mib": method_peak,
        "above_mib": method_peak - bare_peak,
    }


def memory(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--memory-child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["?"]
        killed = done.returncode in (-9, 137)
        return {"oom": "killed (out of memory)" if killed else f"failed: {tail[0][:120]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- report
def machine(device: str, threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        name = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        cpu = name
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name()}" if device.startswith("cuda") else ""
    libs = ", ".join(
        f"{lib} {version(lib)}"
        for lib in ("torch", "transformer-lens", "transformers", "homoglens")
    )
    return (
        f"{cpu} ({os.cpu_count()} cores, {threads} torch threads){gpu}; Python "
        f"{platform.python_version()}; {libs}"
    )


def _mib(value: dict[str, Any], key: str = "above_mib") -> str:
    return value["oom"] if "oom" in value else f"{value[key]:.0f}"


def run(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    lines = [
        f"Run: `{' '.join(['python', 'benchmarks/performance.py', *sys.argv[1:]])}` on "
        f"{time.strftime('%Y-%m-%d')}; device {args.device}, {args.dtype}, batch {args.batch}, "
        f"medians of {args.repeats} interleaved runs.",
        "",
        f"Machine: {machine(args.device, args.threads)}.",
        "",
        "### Time and memory per batch: bare forward, homogenization_profile, hand-written",
        "",
        "| model | T | bare forward (s) | profile / bare (time) | profile throughput | "
        "hand-written / bare (time) | memory above bare: profile (MiB) | hand-written (MiB) | "
        "hand-written / profile (memory) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    checks: list[str] = []
    for name in args.models:
        model = load(name, args.device, dtype)
        for seq_len in args.seq_lens:
            if seq_len > model.cfg.n_ctx:
                continue
            tokens = tokens_for(model, args.batch, seq_len).to(args.device)
            t = timings(model, tokens, METHODS, args.repeats, args.device)
            spec = {
                "model": name,
                "device": args.device,
                "dtype": args.dtype,
                "threads": args.threads,
                "n_seq": args.batch,
                "seq_len": seq_len,
                "batch": args.batch,
            }
            mem = {m: memory({**spec, "method": m}) for m in ("profile", "hand-written")}
            ratio = "-"
            if "oom" not in mem["profile"] and "oom" not in mem["hand-written"]:
                above = mem["profile"]["above_mib"]
                ratio = f"{mem['hand-written']['above_mib'] / max(above, 1):.0f}x"
                ratio += " (profile < 1 MiB: ratio to 1 MiB)" if above < 1 else ""
            lines.append(
                f"| {name} | {seq_len} | {t['bare']:.3f} | {t['profile'] / t['bare']:.3f} | "
                f"{t['bare'] / t['profile']:.2f} | {t['hand-written'] / t['bare']:.2f} | "
                f"{_mib(mem['profile'])} | {_mib(mem['hand-written'])} | {ratio} |"
            )
            checks.append(
                f"{name} T={seq_len}: profile throughput {t['bare'] / t['profile']:.2f} x bare"
            )
            print(lines[-1], flush=True)
        del model
    lines += [
        "",
        f"### Peak memory versus the number of sequences ({args.models[0]}, T = "
        f"{args.n_scan_len}, batch {args.batch})",
        "",
        "| sequences | peak (MiB) | above bare forward (MiB) |",
        "|---|---|---|",
    ]
    scan = {}
    for n in args.n_scan:
        scan[n] = memory(
            {
                "model": args.models[0],
                "device": args.device,
                "dtype": args.dtype,
                "threads": args.threads,
                "n_seq": n,
                "seq_len": args.n_scan_len,
                "batch": args.batch,
                "method": "profile-n",
            }
        )
        lines.append(f"| {n} | {_mib(scan[n], 'peak_mib')} | {_mib(scan[n])} |")
        print(lines[-1], flush=True)
    small, large = scan[min(scan)], scan[max(scan)]
    if "oom" not in small and "oom" not in large:
        lines += ["", f"Peak for N = {max(scan)} / N = {min(scan)}: "
                  f"{large['peak_mib'] / small['peak_mib']:.3f}."]  # fmt: skip
    lines += [
        "",
        f"### Cost of the other measurements, in forward-pass equivalents (T = {args.cost_len}, "
        f"batch {args.batch}; time / bare forward)",
        "",
        "| model | " + " | ".join(COSTS) + " |",
        "|---|" + "---|" * len(COSTS),
    ]
    for name in args.models:
        model = load(name, args.device, dtype)
        tokens = tokens_for(model, args.batch, args.cost_len).to(args.device)
        t = timings(model, tokens, COSTS, args.repeats, args.device)
        lines.append(f"| {name} | " + " | ".join(f"{t[k] / t['bare']:.3f}" for k in COSTS) + " |")
        print(lines[-1], flush=True)
        del model
    return "\n".join(lines) + "\n"


def write(section: str, heading: str) -> None:
    text = DOC.read_text()
    block = f"{BEGIN}\n## {heading}\n\n{section}{END}"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if pattern.search(text) and f"## {heading}\n" in pattern.search(text).group(0):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["gpt2-small-shape", "smollm2-135m-instruct"]
    )
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-scan", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--n-scan-len", type=int, default=128)
    parser.add_argument("--cost-len", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return
    if args.quick:
        args.seq_lens, args.n_scan, args.repeats, args.cost_len = [64], [8, 32], 1, 64
    section = run(args)
    print(section)
    if not args.no_write and not args.quick:
        write(section, f"Measured: {args.device}, {args.dtype}")


if __name__ == "__main__":
    main()
