"""Issue 39, finding 4: in bfloat16 a patching effect is read only where the gap between the
source and receiving runs is larger than the dtype's rounding (the float32 model is the truth)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from helpers import AUSTEN_TEXTS
from homoglens import load_model, positional_patching
from homoglens.testing import tiny_model_folder


def _patch(arch: str, dtype: torch.dtype, how: str) -> Any:
    model = load_model(tiny_model_folder(arch), backend="bridge").to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return positional_patching(
            model,
            AUSTEN_TEXTS[:2],
            how=how,
            metric=["loss", "mean_pairwise"],
            bins=2,
            progress=False,
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_global_shift_on_a_rotary_model_has_no_effect_in_half_precision(dtype) -> None:
    exact = _patch("llama", torch.float32, "shift")
    assert torch.isnan(exact.effect).all()  # a global shift changes nothing under rotary
    half = _patch("llama", dtype, "shift")
    assert torch.isnan(half.effect).all(), "rounding noise was read as an effect"


def test_a_real_effect_survives_in_bfloat16() -> None:
    exact = _patch("gpt2", torch.float32, "zero")
    half = _patch("gpt2", torch.bfloat16, "zero")
    assert not torch.isnan(exact.effect).all()
    both = ~torch.isnan(exact.effect) & ~torch.isnan(half.effect)
    assert both.any()
    assert (exact.effect[both] - half.effect[both]).abs().max() < 0.1
