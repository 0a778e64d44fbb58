"""Unit tests of homoglens.run.hooks: the pure hook factories and position plans."""

from __future__ import annotations

import torch

from helpers import BACKENDS
from homoglens import ablated_positions
from homoglens.run.hooks import PositionPlan


def test_position_plan_source_returns_copies(get_model):
    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.tensor([[50256, 15496, 995, 383, 2068, 7586]])
    base = model(tokens)
    src, _ = PositionPlan("shift", 128, shift=0).source(6)
    src[0] = 5
    with ablated_positions(model, "shift", shift=0):
        assert torch.equal(model(tokens), base)
