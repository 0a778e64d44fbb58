"""homoglens against a bare forward pass and against the hand-written way, in time and memory.

One command, one process for the timings (methods interleaved round-robin on the same batches,
medians of ``--repeats``), fresh subprocesses for CPU memory (peak resident set size is monotone
within a process), and the tables written into ``docs/performance.md`` between markers:

    python benchmarks/performance.py                     # CPU: GPT-2 small shape + SmolLM2-135M
    python benchmarks/performance.py --quick             # small sizes, a smoke run
    python benchmarks/performance.py --versus-hf-only    # only the plain Hugging Face rows
    python benchmarks/performance.py --device cuda --dtype bfloat16   # benchmarks/gpu.py

Methods, on the same ``[8, T]`` batch of Austen tokens:

* ``bare``: ``model(tokens)`` under ``torch.inference_mode()`` (the same TransformerLens model, no
  hooks): the floor, since a profile must compute the activations;
* ``blocks only``: the same forward stopped after the last block (no final norm, no
  unembedding; one hook ends it): the stricter floor, since a profile needs no logits;
* ``profile``: ``homogenization_profile(model, tokens, batch_size=8)`` (every layer entry);
* ``hand-written``: what researchers write today: ``run_with_cache`` of the ``n_layers + 1``
  residual hook points, then per layer the T x T cosine matrix of every sequence, its mean
  off-diagonal value and each row's mean (``to_others``).

Memory: each method runs once in a fresh process, after the model and the tokens are loaded and
one short warm-up forward has run. Its working memory is the peak during the method minus the
memory in use just before it (CPU: the kernel's resident-set high-water mark ``VmHWM``, reset
through ``/proc/self/clear_refs`` just before the method, minus ``VmRSS`` at that moment; CUDA:
``torch.cuda.max_memory_allocated`` minus ``memory_allocated``). "Above bare" is a method's
working memory minus the bare forward's. An out-of-memory is reported as such.
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


def folder_of(name: str) -> Any:
    """The Hugging Face folder (or Hub name) behind a benchmark model name."""
    from homoglens.models.assets import embedded_model_folder
    from homoglens.testing import tiny_model_folder

    if name == "gpt2-small-shape":
        return tiny_model_folder("gpt2", n_layers=12, d_model=768, n_heads=12, n_ctx=2048)
    if name == "smollm2-shape":
        return _smollm2_shape_folder()
    if name == "smollm2-135m-instruct":
        return embedded_model_folder(name)
    return name


def load(name: str, device: str, dtype: torch.dtype, backend: str = "bridge") -> Any:
    """``gpt2-small-shape``: GPT-2 small (124M) from a local config (n_ctx 2048 so that the
    T = 2048 rows fit), random weights; ``smollm2-shape``: SmolLM2-135M's shape, random
    weights; anything else: ``load_model``."""
    from homoglens import load_model

    return load_model(folder_of(name), backend=backend, device=device, dtype=dtype)


def load_plain_hf(name: str, device: str, dtype: torch.dtype, attn: str) -> Any:
    """The same weights as a plain Hugging Face ``AutoModelForCausalLM`` (no TransformerLens),
    with ``attn_implementation=attn`` ("sdpa" or "eager"), in eval mode."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        str(folder_of(name)), attn_implementation=attn, dtype=dtype
    )
    return hf.to(device).eval()


def _smollm2_shape_folder() -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from homoglens.models.assets import cache_dir, gpt2_tokenizer_folder

    folder = cache_dir() / "bench" / "smollm2-shape"
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_SHAPE))
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(str(gpt2_tokenizer_folder())).save_pretrained(folder)
    return folder


def tokens_for(model: Any, n_seq: int, seq_len: int) -> torch.Tensor:
    from homoglens import corpus_windows

    return corpus_windows(model, n_seq=n_seq, seq_len=seq_len, bos="never").tokens


# ---------------------------------------------------------------------------- the methods
def bare(model: Any, tokens: torch.Tensor) -> None:
    with torch.inference_mode():
        model(tokens)


def blocks_only(model: Any, tokens: torch.Tensor) -> None:
    """The forward through the last block and no further (no final norm, no logits), ended by
    one hook as homoglens ends its own passes."""
    from homoglens.run.engine import run_through

    with torch.inference_mode():
        run_through(model, tokens, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", [])


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


def plain_hf(hf: Any) -> Callable[[Any, torch.Tensor], dict[str, Any]]:
    """The competitor a user would write without homoglens: the plain Hugging Face decoder
    (``hf.base_model``: no unembedding, which a profile does not need either) with
    ``output_hidden_states=True``, then per hidden state a float64 cosine reduction in O(T
    d_model): unit rows, their sum s per sequence, the mean pairwise cosine (|s|^2 - T) /
    (T (T - 1)) and each token's mean cosine to the others (u . s - 1) / (T - 1)."""

    def run(model: Any, tokens: torch.Tensor) -> dict[str, Any]:
        out: dict[str, Any] = {"mean_pairwise": [], "to_others": []}
        with torch.inference_mode():
            states = hf.base_model(tokens, output_hidden_states=True).hidden_states
            for h in states:
                u = torch.nn.functional.normalize(h.double(), dim=-1)  # [batch pos d_model]
                s = u.sum(1)  # [batch d_model]
                t = u.shape[1]
                out["mean_pairwise"].append(((s * s).sum(-1) - t).mean() / (t * (t - 1)))
                out["to_others"].append((((u * s[:, None]).sum(-1) - 1) / (t - 1)).mean(0))
        return out

    return run


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
    "blocks only": blocks_only,
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
    times = raw_timings(model, tokens, methods, repeats, device)
    return {name: statistics.median(t) for name, t in times.items()}


def raw_timings(
    model: Any, tokens: torch.Tensor, methods: dict[str, Callable], repeats: int, device: str
) -> dict[str, list[float]]:
    """Seconds of each method in each round; methods interleaved round-robin, one warm-up
    each."""
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
    return times


# ---------------------------------------------------------------------------- memory
def _rss_mib() -> tuple[float, float]:
    """(current, high-water) resident set size of this process in MiB (Linux)."""
    status = Path("/proc/self/status").read_text()
    rss, hwm = (
        int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM")
    )
    return rss, hwm


def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: working memory of one method (MiB above what was in use before it)."""
    import gc

    torch.set_num_threads(spec["threads"])
    dtype = getattr(torch, spec["dtype"])
    model = load(spec["model"], spec["device"], dtype, spec.get("backend", "bridge"))
    tokens = tokens_for(model, spec["n_seq"], spec["seq_len"]).to(spec["device"])
    cuda = spec["device"].startswith("cuda")
    bare(model, tokens[:1, :8])  # one-time allocations (thread pools, rotary tables)
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _rss_mib()[0]
    method = spec["method"]
    try:
        if method == "profile-n":  # the whole corpus of n_seq sequences, streamed in batches
            from homoglens import homogenization_profile

            homogenization_profile(model, tokens, batch_size=spec["batch"], progress=False)
        else:
            METHODS[method](model, tokens)
    except (torch.OutOfMemoryError, MemoryError) as err:
        return {"oom": f"{type(err).__name__}"}
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = _rss_mib()[1]
    return {"before_mib": before, "peak_mib": peak, "working_mib": peak - before}


def memory(spec: dict[str, Any]) -> dict[str, Any]:
    # A fixed mmap threshold: glibc then maps every large block and unmaps it on free, so the
    # resident set follows live tensors (the default, adaptive threshold varies by ~50 MiB).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run(
        [sys.executable, __file__, "--memory-child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
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


def _mib(value: dict[str, Any], key: str = "working_mib") -> str:
    return value["oom"] if "oom" in value else f"{value[key]:.0f}"


def _spec(args: argparse.Namespace, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "backend": args.backend,
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "batch": args.batch,
        **extra,
    }


def _memory_row(name: str, seq_len: int, mem: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """A table row and a one-line check of the memory target (hand-written vs profile)."""
    cells = [_mib(mem[m]) for m in METHODS]
    if any("oom" in mem[m] for m in METHODS):
        failed = ", ".join(f"{m}: {mem[m]['oom']}" for m in METHODS if "oom" in mem[m])
        row = f"| {name} | {seq_len} | " + " | ".join(cells) + " | - | - | - |"
        return row, f"{name} T={seq_len}: memory not compared ({failed})"
    work = {m: mem[m]["working_mib"] for m in METHODS}
    profile_above = work["profile"] - work["bare"]
    hand_above = work["hand-written"] - work["bare"]
    reduction = work["profile"] - work["blocks only"]  # what the in-hook reductions add
    ratio = hand_above / max(reduction, 1.0)
    row = (
        f"| {name} | {seq_len} | " + " | ".join(cells) + f" | {profile_above:+.0f} | "
        f"{hand_above:+.0f} | {ratio:.0f}x |"
    )
    below = " (below the bare forward's peak)" if profile_above <= 0 else ""
    check = (
        f"{name} T={seq_len}: memory above bare: profile {profile_above:+.0f} MiB{below}, "
        f"hand-written {hand_above:+.0f} MiB; the hand-written way's addition is {ratio:.0f}x "
        f"what the profile's reductions add above the blocks-only forward ({reduction:+.0f} MiB)"
    )
    return row, check


def run(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    lines = [
        f"Run: `{' '.join(['python', 'benchmarks/performance.py', *sys.argv[1:]])}` on "
        f"{time.strftime('%Y-%m-%d')}; device {args.device}, {args.dtype}, {args.backend} "
        f"backend, batch {args.batch}, medians of {args.repeats} interleaved runs.",
        "",
        f"Machine: {machine(args.device, args.threads)}.",
    ]
    time_rows = [
        "### Time per batch",
        "",
        "Throughput is bare time / method time (higher is better, 1.00 = as fast as "
        "`model(tokens)`).",
        "",
        "| model | T | bare forward (s) | blocks only / bare | profile throughput (x bare) | "
        "profile / blocks only (time) | hand-written / bare (time) |",
        "|---|---|---|---|---|---|---|",
    ]
    mem_rows = [
        "### Working memory per batch",
        "",
        "MiB above what was in use before the method (model, tokens); one fresh process each. "
        "Above bare: the method's working memory minus the bare forward's (negative: below its "
        "peak). The last column compares what the hand-written way adds above a bare forward "
        "with what the profile's in-hook reductions add above the blocks-only forward (at "
        "least 1 MiB).",
        "",
        "| model | T | bare | blocks only | profile | hand-written | profile above bare | "
        "hand-written above bare | hand-written above bare / profile reductions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    checks: list[str] = []
    for name in args.models:
        model = load(name, args.device, dtype, args.backend)
        for seq_len in args.seq_lens:
            if seq_len > model.cfg.n_ctx:
                continue
            tokens = tokens_for(model, args.batch, seq_len).to(args.device)
            try:
                t = timings(model, tokens, METHODS, args.repeats, args.device)
            except (torch.OutOfMemoryError, MemoryError) as err:
                time_rows.append(f"| {name} | {seq_len} | {type(err).__name__} | - | - | - | - |")
                checks.append(f"{name} T={seq_len}: timing ran out of memory")
                t = None
            if t is not None:
                time_rows.append(
                    f"| {name} | {seq_len} | {t['bare']:.3f} | "
                    f"{t['blocks only'] / t['bare']:.3f} | {t['bare'] / t['profile']:.2f} | "
                    f"{t['profile'] / t['blocks only']:.3f} | "
                    f"{t['hand-written'] / t['bare']:.2f} |"
                )
                checks.append(
                    f"{name} T={seq_len}: profile throughput {t['bare'] / t['profile']:.2f} x bare"
                )
            print(time_rows[-1], flush=True)
            spec = _spec(args, name, n_seq=args.batch, seq_len=seq_len)
            mem = {m: memory({**spec, "method": m}) for m in METHODS}
            row, check = _memory_row(name, seq_len, mem)
            mem_rows.append(row)
            checks += [check] if check else []
            print(row, flush=True)
        del model
    scan_rows = [
        f"### Peak memory versus the number of sequences ({args.models[0]}, T = "
        f"{args.n_scan_len}, batch {args.batch})",
        "",
        "`homogenization_profile` over the whole corpus, streamed in batches; one fresh process "
        "each. Peak: the process's resident-set (or CUDA allocated) high-water mark during the "
        "profile.",
        "",
        "| sequences | peak (MiB) | working memory (MiB) |",
        "|---|---|---|",
    ]
    scan = {}
    for n in args.n_scan:
        spec = _spec(args, args.models[0], n_seq=n, seq_len=args.n_scan_len, method="profile-n")
        scan[n] = memory(spec)
        scan_rows.append(f"| {n} | {_mib(scan[n], 'peak_mib')} | {_mib(scan[n])} |")
        print(scan_rows[-1], flush=True)
    small, large = scan[min(scan)], scan[max(scan)]
    if "oom" not in small and "oom" not in large:
        check = (
            f"Peak for N = {max(scan)} / N = {min(scan)}: "
            f"{large['peak_mib'] / small['peak_mib']:.3f}"
        )
        scan_rows += ["", check + "."]
        checks.append(check)
    cost_rows = [
        f"### Cost of the other measurements, in forward-pass equivalents (T = {args.cost_len}, "
        f"batch {args.batch}; time / bare forward)",
        "",
        "| model | " + " | ".join(COSTS) + " |",
        "|---|" + "---|" * len(COSTS),
    ]
    for name in args.models:
        model = load(name, args.device, dtype, args.backend)
        tokens = tokens_for(model, args.batch, args.cost_len).to(args.device)
        t = timings(model, tokens, COSTS, args.repeats, args.device)
        cost_rows.append(
            f"| {name} | " + " | ".join(f"{t[k] / t['bare']:.3f}" for k in COSTS) + " |"
        )
        print(cost_rows[-1], flush=True)
        del model
    hf_rows, hf_checks = versus_hf(args)
    checks += hf_checks
    lines += ["", *time_rows, "", *mem_rows, "", *scan_rows, "", *cost_rows, "", *hf_rows]
    lines += ["", "Checks against the targets:", "", *(f"- {c}" for c in checks)]
    return "\n".join(lines) + "\n"


def versus_hf(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Rows of the comparison with the plain Hugging Face competitor, and the target checks:
    per model and (T, batch), the profile against ``plain_hf`` with SDPA and with eager
    attention, interleaved on the same batch; then the profile's working memory at batch 1
    over T (a fresh process each)."""
    dtype = getattr(torch, args.dtype)
    rows = [
        "### Against the plain Hugging Face loop",
        "",
        "The competitor (`plain_hf` in the script): the same weights as a plain `transformers` "
        "model, its decoder run with `output_hidden_states=True` and a float64 cosine "
        "reduction per hidden state in O(T d_model) (mean pairwise cosine and each token's "
        "mean cosine to the others). Its best time is the faster of its SDPA and eager runs. "
        "Ratio: profile time / that best time (at most 1.05 is the target); per round: the "
        "median over rounds of the profile's time / that round's faster plain HF time (robust "
        "to the machine's speed drifting during the run).",
        "",
        "| model | T | batch | plain HF SDPA (s) | plain HF eager (s) | profile (s) | "
        "profile / best plain HF | per round (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    checks: list[str] = []
    for name in args.models:
        model = load(name, args.device, dtype, args.backend)
        hf = {a: load_plain_hf(name, args.device, dtype, a) for a in ("sdpa", "eager")}
        methods = {
            "plain HF sdpa": plain_hf(hf["sdpa"]),
            "plain HF eager": plain_hf(hf["eager"]),
            "profile": profile,
        }
        for spec in args.hf_sizes:
            seq_len, n, *more = (int(v) for v in spec.split(":"))
            repeats = more[0] if more else args.repeats
            if seq_len > model.cfg.n_ctx:
                continue
            tokens = tokens_for(model, n, seq_len).to(args.device)
            raw = raw_timings(model, tokens, methods, repeats, args.device)
            t = {k: statistics.median(v) for k, v in raw.items()}
            best = min(t["plain HF sdpa"], t["plain HF eager"])
            paired = statistics.median(  # each round against that round's faster plain HF run
                p / min(a, b)
                for p, a, b in zip(
                    raw["profile"], raw["plain HF sdpa"], raw["plain HF eager"], strict=True
                )
            )
            rows.append(
                f"| {name} | {seq_len} | {n} | {t['plain HF sdpa']:.3f} | "
                f"{t['plain HF eager']:.3f} | {t['profile']:.3f} | {t['profile'] / best:.3f} | "
                f"{paired:.3f} |"
            )
            checks.append(
                f"{name} T={seq_len} batch {n}: profile / plain HF {t['profile'] / best:.3f}"
            )
            print(rows[-1], flush=True)
        del model, hf
    mem_rows = [
        f"### Working memory of a profile at batch 1 over T ({args.models[-1]})",
        "",
        "MiB above the loaded model and tokens (fresh process each; see the memory method above).",
        "",
        "| T | profile working memory (MiB) | per 1024 tokens (MiB) |",
        "|---|---|---|",
    ]
    for seq_len in args.long_lens:
        spec = _spec(args, args.models[-1], n_seq=1, seq_len=seq_len, method="profile")
        mem = memory(spec)
        per = "-" if "oom" in mem else f"{mem['working_mib'] / (seq_len / 1024):.0f}"
        mem_rows.append(f"| {seq_len} | {_mib(mem)} | {per} |")
        print(mem_rows[-1], flush=True)
    return [*rows, "", *mem_rows], checks


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
    parser.add_argument("--backend", default="bridge", choices=["bridge", "hooked"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--hf-sizes",
        nargs="+",
        default=["128:8:21", "512:8", "1024:8", "2048:2", "4096:1"],
        help="T:batch pairs of the comparison with the plain Hugging Face loop (T:batch:repeats "
        "to run a size more often than --repeats)",
    )
    parser.add_argument(
        "--long-lens",
        type=int,
        nargs="*",
        default=[1024, 2048, 3072, 4096],
        help="T of the profile's working memory at batch 1 (the last model)",
    )
    parser.add_argument(
        "--versus-hf-only",
        action="store_true",
        help="only the comparison with plain Hugging Face and the long-T memory rows",
    )
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return
    if args.quick:
        args.seq_lens, args.n_scan, args.repeats, args.cost_len = [64], [8, 32], 1, 64
        args.hf_sizes, args.long_lens = ["64:2"], [64, 128]
    if args.device.startswith("cuda"):  # the GPU methodology: benchmarks/gpu.py
        sys.path.insert(0, str(Path(__file__).parent))
        import gpu

        gpu.main(
            [
                "--dtype",
                args.dtype if args.dtype != "float32" else "bfloat16",
                "--json",
                str(ROOT / "gpu.json"),
                "--repeats",
                str(args.repeats),
            ]
        )
        return
    if args.versus_hf_only:
        rows, checks = versus_hf(args)
        print("\n".join([*rows, "", *(f"- {c}" for c in checks)]))
        return
    section = run(args)
    print(section)
    if not args.no_write and not args.quick:
        write(section, f"Measured: {args.device}, {args.dtype}")


if __name__ == "__main__":
    main()
