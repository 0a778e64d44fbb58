"""Hook hygiene: a fault raised inside the forward pass of every function that attaches hooks
leaves no hook behind, and passes that need no logits end before the final norm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import THREE_OPENINGS, hook_count, state_hash
from homoglens import (
    ablated_massive_activations,
    ablated_positions,
    attention_view,
    compare_models,
    homogenization_profile,
    massive_activation_means,
    massive_activations,
    position_ablation_study,
    positional_patching,
    positional_similarity,
    sink_analysis,
    sink_attribution,
    sink_scores,
)

HOOKING: dict[str, Callable[[Any], Any]] = {
    "homogenization_profile": lambda m: homogenization_profile(m, THREE_OPENINGS, progress=False),
    "position_ablation_study": lambda m: position_ablation_study(m, THREE_OPENINGS, progress=False),
    "sink_scores": lambda m: sink_scores(m, THREE_OPENINGS, progress=False),
    "massive_activations": lambda m: massive_activations(m, THREE_OPENINGS, progress=False),
    "sink_attribution exact": lambda m: sink_attribution(m, THREE_OPENINGS, top_k=1, edge_k=2),
    "sink_attribution fast": lambda m: sink_attribution(m, THREE_OPENINGS, method="fast", edge_k=2),
    "sink_attribution mean": lambda m: sink_attribution(
        m, THREE_OPENINGS, ablation="mean", top_k=1, edge_k=2
    ),
    "sink_analysis": lambda m: sink_analysis(m, THREE_OPENINGS, top_k=1, edge_k=2, progress=False),
    "positional_patching": lambda m: positional_patching(m, THREE_OPENINGS, bins=2, progress=False),
    "positional_patching head": lambda m: positional_patching(
        m, THREE_OPENINGS, component="head", progress=False
    ),
    "ablated_positions": lambda m: _ablated_forward(m),
    "ablated_massive_activations": lambda m: _massive_forward(m),
    "massive_activation_means": lambda m: massive_activation_means(
        m, THREE_OPENINGS, layer=2, dims=[3], progress=False
    ),
    "attention_view": lambda m: attention_view(m, "Hello there, world", [(1, 0)]),
    "compare_models": lambda m: compare_models({"m": m}, n_seq=2, seq_len=24, edge_k=2),
    "positional_similarity": lambda m: positional_similarity(
        m, torch.randint(0, 1000, (3, 12)), edge_k=2, progress=False
    ),
    "positional_similarity centred, pseudo": lambda m: positional_similarity(
        m,
        torch.randint(0, 1000, (3, 12)),
        edge_k=2,
        centre="global",
        pseudo_values=True,
        progress=False,
    ),
}


def _ablated_forward(model: Any) -> None:
    with ablated_positions(model, "permute", seed=0):
        model(torch.tensor([[464, 3290, 3332, 319, 262, 2603]]))


def _massive_forward(model: Any) -> None:
    with ablated_massive_activations(model, "zero", layer=1, dims=[3, 7], positions=[0, 2]):
        model(torch.tensor([[464, 3290, 3332, 319, 262, 2603]]))


def test_massive_ablation_leaves_no_hook_after_an_error_in_its_body(backend, get_model) -> None:
    model = get_model("gpt2", backend)
    before = state_hash(model)
    means = torch.ones(1, 2)
    with pytest.raises(KeyError, match="raised in the body"):
        with ablated_massive_activations(model, "mean", layer=2, dims=[1, 5], means=means):
            assert hook_count(model) >= 1  # the bridge lists an aliased hook point twice
            raise KeyError("raised in the body")
    assert hook_count(model) == 0 and state_hash(model) == before
    with pytest.raises(ValueError, match="after the block"):
        with ablated_massive_activations(model, "zero", layer=1, dims=5):
            model(torch.tensor([[1, 2, 3]]))
        assert hook_count(model) == 0
        raise ValueError("after the block")


@pytest.mark.parametrize("name", list(HOOKING))
def test_fault_inside_the_forward_pass_leaves_no_hook(name: str, backend: str, get_model) -> None:
    model = get_model("gpt2", backend)
    before = state_hash(model)
    grad = torch.is_grad_enabled()

    def bomb(module: Any, inputs: Any, output: Any) -> None:
        raise RuntimeError("fault injected into blocks.1 (its input)")

    handle = model.hook_dict["blocks.1.hook_resid_pre"].register_forward_hook(bomb)
    try:
        with pytest.raises(RuntimeError, match="fault injected"):
            HOOKING[name](model)
    finally:
        handle.remove()
    assert hook_count(model) == 0, name
    assert state_hash(model) == before
    assert torch.is_grad_enabled() == grad and not torch.is_inference_mode_enabled()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(
    "name",
    [
        "homogenization_profile",
        "sink_scores",
        "massive_activations",
        "massive_activation_means",
        "sink_attribution exact",
        "sink_attribution fast",
        "sink_attribution mean",
        "positional_similarity",
        "positional_similarity centred, pseudo",
    ],
)
def test_measurements_that_need_no_logits_run_no_final_norm(
    name: str, backend: str, get_model
) -> None:
    """Each forward pass ends at the last hook point it reads (no final norm, no unembedding)."""
    model = get_model("gpt2", backend)
    calls = []
    model.add_hook("ln_final.hook_normalized", lambda x, hook: calls.append(1))
    try:
        HOOKING[name](model)
        assert calls == [], name
        with torch.inference_mode():
            model(torch.tensor([[1, 2, 3]]))
        assert calls == [1]  # the counting hook itself works
    finally:
        model.reset_hooks()
