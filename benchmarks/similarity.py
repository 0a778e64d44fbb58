"""positional_similarity against homogenization_profile on the same data, side by side.

    python benchmarks/similarity.py              # SmolLM2-135M, 64 x 256 Austen windows
    python benchmarks/similarity.py --quick      # a smoke run on a tiny model

The methods run interleaved round-robin in one process on the same windows (every layer entry,
batch 8), one warm-up each on the first batch, and the medians of ``--repeats`` are compared:

* ``profile``: ``homogenization_profile`` (the reference);
* ``similarity``: ``positional_similarity`` (one pass: M, unit sums, per-window statistics);
* ``similarity, pseudo-values``: ``pseudo_values=True`` (a second pass);
* ``similarity, centre="position"``: a first pass for the position means, then the main one.

The target (issue 16) is ``similarity / profile <= 1.5``. The table goes into
``docs/performance.md`` between the ``similarity.py`` markers.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from performance import DOC, machine  # noqa: E402

warnings.filterwarnings("ignore")
BEGIN, END = "<!-- similarity.py:begin -->", "<!-- similarity.py:end -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n-seq", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from homoglens import (
        corpus_windows,
        homogenization_profile,
        load_model,
        positional_similarity,
    )
    from homoglens.testing import tiny_model_folder

    if args.quick:
        args.model, args.n_seq, args.seq_len, args.repeats = "tiny-llama", 16, 64, 1
    name = tiny_model_folder("llama") if args.model == "tiny-llama" else args.model
    model = load_model(name, backend="bridge")
    windows = corpus_windows(model, n_seq=args.n_seq, seq_len=args.seq_len, bos="auto")
    common = {"batch_size": 8, "progress": False}
    methods = {
        "profile": lambda w: homogenization_profile(model, w, exclude_first=bool(w.bos), **common),
        "similarity": lambda w: positional_similarity(model, w, **common),
        "similarity, pseudo-values": lambda w: positional_similarity(
            model, w, pseudo_values=True, **common
        ),
        'similarity, centre="position"': lambda w: positional_similarity(
            model, w, centre="position", **common
        ),
    }
    for fn in methods.values():
        fn(windows[:8])
    times: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(args.repeats):
        for key, fn in methods.items():
            start = time.perf_counter()
            fn(windows)
            times[key].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [
        "| method | median (s) | min - max (s) | x profile |",
        "|---|---|---|---|",
    ]
    for key, t in times.items():
        rows.append(
            f"| {key} | {med[key]:.2f} | {min(t):.2f} - {max(t):.2f} | "
            f"{med[key] / med['profile']:.2f} |"
        )
    section = (
        f"Run: `python benchmarks/similarity.py` on {time.strftime('%Y-%m-%d')}; {args.model}, "
        f"{args.n_seq} windows x {args.seq_len} tokens (BOS: {windows.bos}), every layer entry, "
        f"batch 8, bridge backend, medians of {args.repeats} interleaved runs.\n"
        f"Machine: {machine('cpu', torch.get_num_threads())}.\n\n" + "\n".join(rows) + "\n"
    )
    print(section)
    if not args.no_write and not args.quick:
        text = DOC.read_text()
        block = f"{BEGIN}\n{section}{END}"
        pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
        text = (
            pattern.sub(lambda _: block, text)
            if pattern.search(text)
            else text.rstrip() + "\n\n## Positional similarity against the profile\n\n"
            + block + "\n"
        )  # fmt: skip
        DOC.write_text(text)


if __name__ == "__main__":
    main()
