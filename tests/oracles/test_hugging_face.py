"""Oracles: positional ablations against plain Hugging Face forward passes with the same
``position_ids`` (or a zeroed position table), on the tiny offline models and every backend.
(The residual-stream oracles, against ``output_hidden_states``, sit with each measurement's unit
tests, next to the brute-force float64 versions they share helpers with.)"""

from __future__ import annotations

import pytest
import torch

from helpers import PERM, T, hf_logits, run_ablated


def test_gpt2_matches_hf_oracles(backend, get_model) -> None:
    model = get_model("gpt2", backend)
    base = run_ablated(model)
    zero = run_ablated(model, "zero")
    assert (zero - base).abs().max() > 1e-2  # the test can fail: zeroing matters
    assert torch.allclose(zero, hf_logits("gpt2", zero_wpe=True), atol=1e-5)
    assert torch.allclose(
        run_ablated(model, "permute", perm=PERM),
        hf_logits("gpt2", position_ids=PERM[None]),
        atol=1e-5,
    )
    assert torch.allclose(
        run_ablated(model, "shift", shift=5),
        hf_logits("gpt2", position_ids=torch.arange(T)[None] + 5),
        atol=1e-5,
    )


@pytest.mark.parametrize("arch", ["neox", "llama"])
def test_rotary_matches_hf_position_ids(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    base = run_ablated(model)
    zero = run_ablated(model, "zero")
    assert (zero - base).abs().max() > 1e-3
    assert torch.allclose(
        zero, hf_logits(arch, position_ids=torch.zeros(1, T, dtype=torch.long)), atol=1e-5
    )
    assert torch.allclose(
        run_ablated(model, "permute", perm=PERM),
        hf_logits(arch, position_ids=PERM[None]),
        atol=1e-5,
    )
    assert torch.allclose(
        run_ablated(model, "shift", shift=9),
        hf_logits(arch, position_ids=torch.arange(T)[None] + 9),
        atol=1e-5,
    )
    # rotary attention depends only on i - j: shifting every position changes nothing
    assert torch.allclose(run_ablated(model, "shift", shift=9), base, atol=1e-4)
