"""The attention-bias findings of docs/findings.md: for each kind, the slope at zero of H_W and
of the matched edge excess at the last residual entry (central difference at +-0.25, or beta
1 +- 0.05, with a moving-block bootstrap interval over paired windows), per nat of b and per
unit of attention mass moved onto the biased keys (with its SESOI, a tenth of H_W, and its
verdict), the mass slope as the manipulation check, on SmolLM2-135M-Instruct and the shipped
controlled models (with and without BOS).

    .venv/bin/python scripts/bias_findings.py                 # about 12 min on 2 cores
    .venv/bin/python scripts/bias_findings.py --models homoglens/tiny-rotary --n-seq 16
"""

from __future__ import annotations

import argparse
import warnings

import torch

warnings.filterwarnings("ignore")

KINDS = {
    "first": (-1.0, -0.25, 0.0, 0.25, 1.0),
    "recent": (-1.0, -0.25, 0.0, 0.25, 1.0),
    "self": (-1.0, -0.25, 0.0, 0.25, 1.0),
    "middle": (-1.0, -0.25, 0.0, 0.25, 1.0),
    "alibi": (-0.1, -0.025, 0.0, 0.025, 0.1),
    "temperature": (0.8, 0.95, 1.0, 1.05, 1.25),
}


def main() -> None:
    """Print the findings table (markdown) to stdout."""
    from homoglens import attention_bias_study, corpus_windows, load_model
    from homoglens.training.train import heldout_windows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["smollm2-135m-instruct", "homoglens/tiny-learned", "homoglens/tiny-rotary",
                 "homoglens/tiny-none", "homoglens/tiny-learned-bos", "homoglens/tiny-rotary-bos",
                 "homoglens/tiny-none-bos"],
    )  # fmt: skip
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--n-seq", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print("| model | kind | KL at the largest push | mass slope | H_W per nat [95% CI] | "
          "H_W per unit of mass [95% CI] (SESOI; verdict) | matched_first per mass [95% CI] | "
          "matched_last per mass [95% CI] | loss per nat |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model = load_model(name)
        if name.startswith("homoglens/"):
            windows = heldout_windows(model.tokenizer, n_seq=args.n_seq, bos=name.endswith("-bos"))
        else:
            windows = corpus_windows(model, n_seq=args.n_seq, seq_len=args.seq_len)
        for kind in args.kinds:
            strengths = KINDS[kind]
            study = attention_bias_study(model, windows, kind=kind, strengths=strengths,
                                         progress=False)  # fmt: skip
            h = study.slope_at_zero("homogenization")
            cells = [f"{h.central:+.4f} [{h.ci_low:+.4f}, {h.ci_high:+.4f}]"]
            if kind == "temperature":
                cells += ["n/a"] * 3
            else:
                verdict = f"({h.sesoi:.4f}; {h.verdict()})"
                cells.append(f"{h.per_mass:+.4f} [{h.per_mass_ci_low:+.4f}, "
                             f"{h.per_mass_ci_high:+.4f}] {verdict}")  # fmt: skip
                for metric in ("matched_first", "matched_last"):
                    s = study.slope_at_zero(metric)
                    cells.append(f"{s.per_mass:+.4f} [{s.per_mass_ci_low:+.4f}, "
                                 f"{s.per_mass_ci_high:+.4f}]")  # fmt: skip
            mass = (
                "n/a"
                if kind == "temperature"
                else f"{study.slope_at_zero('mass', None).central:+.3f}"
            )
            loss = study.slope_at_zero("loss").central
            print(f"| {name} | {kind} | {float(study.kl[-1]):.3f} | {mass} | "
                  f"{' | '.join(cells)} | {loss:+.4f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
