"""Half precision on the fast path: a bfloat16 / float16 profile runs SDPA attention, and every
statistic lies within its documented tolerance of the same model's float32 profile (the truth
in half precision is the float32 model, not another rounding path; docs/performance.md, "Half
precision"). Tolerances: about 2.5 x the largest distance measured on SmolLM2-135M (16 x 128
Austen windows, CPU, 2026-12-04), the worst case of the models measured (random tiny models of
the families sit 10-100 x closer)."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import homoglens.run.fast_attention as fa
from homoglens import corpus_windows, fast_attention_status, homogenization_profile, load_model
from homoglens.testing import tiny_model_folder

TOLERANCE: dict[torch.dtype, dict[str, float]] = {
    torch.bfloat16: {
        "to_others": 5e-2,
        "to_prefix": 5e-2,
        "to_mean": 5e-2,
        "mean_pairwise": 2.5e-3,
        "baseline": 2.5e-3,
        "adjusted": 5e-4,
        "relative_residual": 1.5e-2,
        "unit_effective_rank": 0.25,
        "matrix_entropy": 1.2e-2,
        "norm": 6e-2,  # relative
    },
    torch.float16: {
        "to_others": 6e-3,
        "to_prefix": 6e-3,
        "to_mean": 6e-3,
        "mean_pairwise": 1.5e-4,
        "baseline": 1.5e-4,
        "adjusted": 5e-5,
        "relative_residual": 1e-3,
        "unit_effective_rank": 2e-2,
        "matrix_entropy": 6e-4,
        "norm": 5e-3,  # relative
    },
}
"""Largest |half-precision profile - float32 profile| over layers (and positions) per
statistic; ``norm`` relative to the float32 norm. The table of docs/performance.md."""


def distances(low, high) -> dict[str, float]:
    """Largest distance of each statistic of profile ``low`` from profile ``high``."""
    out = {}
    for name in TOLERANCE[torch.bfloat16]:
        a, b = getattr(low, name).double(), getattr(high, name).double()
        both = torch.isfinite(a) & torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), torch.isfinite(b)), name
        diff = (a - b)[both].abs()
        if name == "norm":
            diff = diff / b[both].abs().clamp_min(1e-12)
        out[name] = float(diff.max())
    return out


def _profile(model, data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return homogenization_profile(model, data, effective_rank=True, progress=False)


@functools.cache
def _smollm2():
    model = load_model("smollm2-135m-instruct", backend="bridge")
    batch = corpus_windows(model, n_seq=16, seq_len=128)
    return batch, _profile(model, batch)


@pytest.mark.smollm2
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_smollm2_half_precision_profile_runs_sdpa_within_tolerance(dtype) -> None:
    batch, truth = _smollm2()
    model = load_model("smollm2-135m-instruct", backend="bridge", dtype=dtype)
    assert fast_attention_status(model) == "sdpa"
    seen = []
    from homoglens.run.engine import run_through

    run_through(  # the pass runs the Hugging Face attention with SDPA
        model,
        batch.tokens[:1, :16],
        "blocks.0.hook_resid_post",
        [
            (
                "blocks.0.hook_resid_post",
                lambda x, hook: seen.append(model.original_model.config._attn_implementation),
            )
        ],
    )
    assert seen == ["sdpa"]
    got = distances(_profile(model, batch), truth)
    for name, tol in TOLERANCE[dtype].items():
        assert got[name] <= tol, (name, got[name], tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama", "gemma3", "qwen3", "phi"])
def test_tiny_families_half_precision_within_tolerance(arch, dtype, monkeypatch) -> None:
    folder = tiny_model_folder(arch)
    high = load_model(folder, backend="bridge", dtype=torch.float32)
    low = load_model(folder, backend="bridge", dtype=dtype)
    assert fast_attention_status(low) == "sdpa"
    data = corpus_windows(high, n_seq=6, seq_len=48)
    truth = _profile(high, data)
    fast = distances(_profile(low, data), truth)
    monkeypatch.setattr(fa, "ENABLED", False)
    eager = distances(_profile(low, data), truth)
    for name, tol in TOLERANCE[dtype].items():
        # within the documented tolerance, and no farther from the truth than the eager path
        # by more than rounding noise of the same order
        assert fast[name] <= tol, (name, fast[name], tol)
        assert fast[name] <= 3 * eager[name] + tol / 10, (name, fast[name], eager[name])
