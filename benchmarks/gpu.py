"""homoglens on a CUDA GPU in half precision: tokens/s and GPU memory against plain Hugging
Face, side by side in one process (``benchmarks/performance.py --device cuda`` runs this).

Models: random weights of real shapes built from ``transformers`` configs on the GPU (speed
does not depend on the weights): GPT-2 small, Pythia-410M (rotary on a quarter of d_head) and
Llama-3.2-1B (grouped-query attention), saved once to a temporary folder and loaded with
``load_model`` (the TransformerLens 4.x bridge); random token ids.

Methods, on the same ``[batch T]`` tokens, interleaved round-robin, medians of ``--repeats``:

* ``plain HF``: the Hugging Face decoder (SDPA) with ``output_hidden_states=True``, then per
  hidden state a float32 O(T d_model) reduction: unit rows, the mean pairwise cosine and each
  token's mean cosine to the others (what a researcher writes by hand);
* ``bridge forward``: the bridge's forward through the last block on the fast path, no hooks
  (the floor of any profile);
* ``profile``: ``homogenization_profile(model, tokens, batch_size=batch)``.

GPU working memory of a method: ``max_memory_allocated`` during it minus ``memory_allocated``
just before it (the model and the tokens), in the same process, peak statistics reset before
each. Then the other measurements once each (tokens/s, memory), and long windows at batch 1.
Every figure goes into a JSON file as it is measured (a run cut short keeps what it had).

    python benchmarks/performance.py --device cuda --dtype bfloat16 --json gpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

warnings.filterwarnings("ignore")

SHAPES: dict[str, dict[str, Any]] = {
    "gpt2-small": {
        "kind": "gpt2",
        "n_layer": 12,
        "n_embd": 768,
        "n_head": 12,
        "n_positions": 32768,
        "vocab_size": 50257,
    },
    "pythia-410m": {
        "kind": "gpt_neox",
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "rotary_pct": 0.25,
        "vocab_size": 50304,
        "max_position_embeddings": 32768,
    },
    "llama-3.2-1b": {
        "kind": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    },
}
"""The shapes measured (random weights)."""

SIZES = ((512, 64), (2048, 16), (8192, 4), (32768, 1))
"""(T, batch) of the throughput rows: 32k tokens a batch."""

DEVICE = "cuda"
"""``--smoke`` runs tiny shapes on the CPU (to catch errors before a GPU run)."""
LONG = (8192, 16384, 32768)
MEASURE = (2048, 4)


def _smoke() -> None:
    global DEVICE, SIZES, LONG, MEASURE
    DEVICE, SIZES, LONG, MEASURE = "cpu", ((64, 4), (128, 2)), (64, 128), (64, 2)
    SHAPES["gpt2-small"].update(n_layer=2, n_embd=64, n_head=4)
    SHAPES["pythia-410m"].update(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    SHAPES["llama-3.2-1b"].update(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    )


def _sync() -> None:  # noqa: D103
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build(name: str, dtype: torch.dtype, root: Path) -> tuple[Any, Any]:
    """``(plain Hugging Face model, homoglens bridge)`` of one shape, same weights, on CUDA."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from homoglens import load_model
    from homoglens.models.assets import gpt2_tokenizer_folder

    spec = dict(SHAPES[name])
    config = AutoConfig.for_model(spec.pop("kind"), **spec)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf.eval()
    folder = root / name
    hf.save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(gpt2_tokenizer_folder())).save_pretrained(folder)
    model = load_model(folder, backend="bridge", device=DEVICE, dtype=dtype)
    return hf, model


def plain_hf(hf: Any) -> Callable[[torch.Tensor], Any]:
    """The plain Hugging Face competitor (see the module docstring)."""

    def run(tokens: torch.Tensor) -> Any:
        out = []
        with torch.inference_mode():
            states = hf.base_model(tokens, output_hidden_states=True).hidden_states
            for h in states:
                u = torch.nn.functional.normalize(h.float(), dim=-1)  # [batch pos d_model]
                s = u.sum(1)
                t = u.shape[1]
                out.append(((s * s).sum(-1) - t).mean() / (t * (t - 1)))
                out.append((((u * s[:, None]).sum(-1) - 1) / (t - 1)).mean(0))
        return out

    return run


def bridge_forward(model: Any) -> Callable[[torch.Tensor], Any]:
    from homoglens.run.engine import run_through

    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"

    def run(tokens: torch.Tensor) -> None:
        with torch.inference_mode():
            run_through(model, tokens, last, [])

    return run


def profile(model: Any) -> Callable[[torch.Tensor], Any]:
    from homoglens import homogenization_profile

    def run(tokens: torch.Tensor) -> Any:
        return homogenization_profile(model, tokens, batch_size=len(tokens), progress=False)

    return run


def timed(fn: Callable[[], Any]) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def peak_memory(fn: Callable[[], Any]) -> float:
    """GiB above what was allocated just before ``fn``, at its peak (0 on the CPU)."""
    if DEVICE != "cuda":
        fn()
        return 0.0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def attempt(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except torch.OutOfMemoryError:
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        return "out of memory"


class Recorder:
    """Figures written to a JSON file as they come (a run cut short keeps them)."""

    def __init__(self, path: Path, deadline: float) -> None:
        self.path, self.deadline, self.data = path, deadline, {"rows": []}
        self.start = time.perf_counter()

    def left(self) -> float:
        return self.deadline - (time.perf_counter() - self.start)

    def add(self, **row: Any) -> None:
        row["at_s"] = round(time.perf_counter() - self.start, 1)
        self.data["rows"].append(row)
        print(json.dumps(row), flush=True)
        self.path.write_text(json.dumps(self.data, indent=1))


def throughput(rec: Recorder, name: str, hf: Any, model: Any, repeats: int) -> None:
    methods = {"plain HF": plain_hf(hf), "bridge forward": bridge_forward(model)}
    methods["profile"] = profile(model)
    for seq_len, batch in SIZES:
        if rec.left() < 60:
            rec.add(skipped=f"{name} T={seq_len}: deadline")
            return
        tokens = torch.randint(0, 50000, (batch, seq_len), device=DEVICE)
        times: dict[str, list[float] | str] = {m: [] for m in methods}
        for m, fn in methods.items():  # warm-up, and memory
            got = attempt(lambda fn=fn, t=tokens: peak_memory(lambda: fn(t)))
            times[m] = [] if not isinstance(got, str) else got
            rec.data.setdefault("memory", {})[f"{name}/{seq_len}/{m}"] = got
        for _ in range(repeats):
            for m, fn in methods.items():
                if isinstance(times[m], list):
                    got = attempt(lambda fn=fn, t=tokens: timed(lambda: fn(t)))
                    if isinstance(got, str):
                        times[m] = got
                    else:
                        times[m].append(got)  # type: ignore[union-attr]
        tokens_n = batch * seq_len
        row: dict[str, Any] = {"model": name, "T": seq_len, "batch": batch}
        for m in methods:
            t = times[m]
            row[f"{m} k tok/s"] = (
                t if isinstance(t, str) else round(tokens_n / statistics.median(t) / 1e3, 1)
            )
            row[f"{m} GiB"] = rec.data["memory"][f"{name}/{seq_len}/{m}"]
            if isinstance(row[f"{m} GiB"], float):
                row[f"{m} GiB"] = round(row[f"{m} GiB"], 3)
        if all(isinstance(times[m], list) for m in ("plain HF", "profile")):
            row["profile / plain HF throughput"] = round(
                statistics.median(times["plain HF"]) / statistics.median(times["profile"]), 3
            )
            hf_mem, prof_mem = row["plain HF GiB"], row["profile GiB"]
            if isinstance(hf_mem, float) and isinstance(prof_mem, float):
                row["profile / plain HF memory"] = round(prof_mem / max(hf_mem, 1e-6), 3)
        rec.add(**row)
        del tokens


def measurements(rec: Recorder, name: str, model: Any, seq_len: int, batch: int) -> None:
    """Every other measurement once on one batch: seconds, tokens/s, GPU memory."""
    import homoglens as hg

    tokens = torch.randint(0, 50000, (batch, seq_len))
    quiet = {"progress": False, "batch_size": batch}
    runs = {
        "sink_scores": lambda: hg.sink_scores(model, tokens, **quiet),
        "attention_received": lambda: hg.attention_received(model, tokens, **quiet),
        "massive_activations": lambda: hg.massive_activations(model, tokens, **quiet),
        "positional_similarity": lambda: hg.positional_similarity(model, tokens, **quiet),
        "position_ablation_study (none, zero, permute)": lambda: hg.position_ablation_study(
            model, tokens, **quiet
        ),
        "attention_bias_study (3 strengths)": lambda: hg.attention_bias_study(
            model, tokens, kind="first", strengths=[-1.0, 0.0, 1.0], **quiet
        ),
        "length_study": lambda: hg.length_study(
            model, tokens, lengths=[seq_len // 2, seq_len], **quiet
        ),
    }
    for label, fn in runs.items():
        if rec.left() < 45:
            rec.add(skipped=f"{name} {label}: deadline")
            return
        attempt(fn)  # warm-up (compiles nothing; first-use allocations)
        mem = attempt(lambda fn=fn: peak_memory(fn))
        sec = attempt(lambda fn=fn: timed(fn))
        rec.add(
            model=name,
            measurement=label,
            T=seq_len,
            batch=batch,
            seconds=sec if isinstance(sec, str) else round(sec, 3),
            k_tok_per_s=sec if isinstance(sec, str) else round(batch * seq_len / sec / 1e3, 1),
            GiB=mem if isinstance(mem, str) else round(mem, 3),
        )


def long_windows(rec: Recorder, name: str, model: Any) -> None:
    """Batch 1 at growing T: the profile and sink scores; the attention-bias study on 2 windows
    and 2 strengths (it needs 2 windows)."""
    import homoglens as hg

    for seq_len in LONG:
        tokens = torch.randint(0, 50000, (2, seq_len))
        runs = {
            "profile": lambda t=tokens: hg.homogenization_profile(
                model, t[:1], batch_size=1, progress=False
            ),
            "sink_scores": lambda t=tokens: hg.sink_scores(
                model, t[:1], batch_size=1, progress=False
            ),
            "attention_bias_study (2 windows, 2 strengths)": lambda t=tokens: (
                hg.attention_bias_study(
                    model, t, kind="first", strengths=[0.0, 1.0], batch_size=1, progress=False
                )
            ),
        }
        for label, fn in runs.items():
            if rec.left() < 40:
                rec.add(skipped=f"{name} T={seq_len} {label}: deadline")
                continue
            start = time.perf_counter()
            mem = attempt(lambda fn=fn: peak_memory(fn))
            rec.add(
                model=name,
                long=label,
                T=seq_len,
                seconds=round(time.perf_counter() - start, 2),
                GiB=mem if isinstance(mem, str) else round(mem, 3),
            )


def half_precision(rec: Recorder, name: str, model: Any, dtype: torch.dtype) -> None:
    """Distance of the half-precision profile from the same weights in float32, on the GPU."""
    from homoglens import homogenization_profile

    tokens = torch.randint(0, 50000, (8, MEASURE[0] // 2))
    high = model.to(torch.float32)
    truth = homogenization_profile(high, tokens, progress=False)
    model.to(dtype)
    got = homogenization_profile(model, tokens, progress=False)
    rec.add(
        model=name,
        half_precision=str(dtype),
        T=MEASURE[0] // 2,
        batch=8,
        to_others=float((got.to_others - truth.to_others).abs().max()),
        mean_pairwise=float((got.mean_pairwise - truth.mean_pairwise).abs().max()),
        adjusted=float((got.adjusted - truth.adjusted).abs().nan_to_num().max()),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--models", nargs="+", default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=420.0, help="seconds for everything")
    parser.add_argument("--json", default="gpu.json")
    parser.add_argument(
        "--skip", nargs="*", default=[], help="parts: throughput measurements long half"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    args = parser.parse_args(argv)
    if args.smoke:
        _smoke()
    dtype = getattr(torch, args.dtype)
    rec = Recorder(Path(args.json), args.deadline)
    rec.data["machine"] = {
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)",
        "torch": torch.__version__,
        "dtype": args.dtype,
    }
    from importlib.metadata import version

    for lib in ("transformers", "transformer-lens"):
        rec.data["machine"][lib] = version(lib)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            if rec.left() < 60:
                rec.add(skipped=f"{name}: deadline")
                break
            hf, model = build(name, dtype, Path(tmp))
            rec.add(model=name, status=__import__("homoglens").fast_attention_status(model))
            if "throughput" not in args.skip:
                throughput(rec, name, hf, model, args.repeats)
            del hf
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            if name == "llama-3.2-1b":
                if "long" not in args.skip:
                    long_windows(rec, name, model)
                if "measurements" not in args.skip:
                    measurements(rec, name, model, *MEASURE)
                if "half" not in args.skip:
                    half_precision(rec, name, model, dtype)
            del model
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    rec.add(done=True)


if __name__ == "__main__":
    main()
