"""GPT-J's positional ablations on every backend that loads it (issue 41, item 3), against the
plain Hugging Face ``GPTJForCausalLM`` given the corresponding ``position_ids``.

The bridge fires neither ``hook_rot_q/k`` nor ``hook_cos/sin`` for GPT-J; homoglens rotates
its queries/keys at ``hook_q/hook_k`` by (source - position) just before the Hugging Face module
rotates them by their position. The oracle is Hugging Face itself: ``position_ids`` for the
whole model, and, for ``layers=``, the rotary tables one block's attention module is handed.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import BACKENDS, hook_count
from homoglens import (
    InvalidInputError,
    ablated_positions,
    architecture_of,
    load_model,
    position_ablation_hooks,
)
from homoglens.run.hooks import PositionPlan
from homoglens.testing import tiny_model_folder

T = 20
TOKENS = torch.randint(0, 50257, (2, T), generator=torch.Generator().manual_seed(41))
PERM = torch.randperm(T, generator=torch.Generator().manual_seed(7))
TOL = 1e-4


@functools.cache
def _hf() -> Any:
    folder = str(tiny_model_folder("gptj"))
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


@functools.cache
def _model(backend: Any) -> Any:
    return load_model(tiny_model_folder("gptj"), backend=backend, device="cpu")


@functools.cache
def _own_hooks(backend: str) -> int:
    return hook_count(_model(backend))


def _oracle(positions: torch.Tensor, *, layers: list[int] | None = None) -> torch.Tensor:
    """Hugging Face logits with every token at ``positions``; with ``layers``, only those
    blocks' attention modules are handed the rotary tables of ``positions`` (the others keep
    0..T-1), through a forward pre-hook removed before returning."""
    hf = _hf()
    ids = positions[None].expand(TOKENS.shape[0], -1)
    with torch.no_grad():
        if layers is None:
            return hf(TOKENS, position_ids=ids).logits
        dummy = torch.zeros(1)
        tables = hf.transformer.rotary_emb(dummy, ids)

        def swap(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
            return args, {**kwargs, "position_embeddings": tables}

        handles = [
            hf.transformer.h[i].attn.register_forward_pre_hook(swap, with_kwargs=True)
            for i in layers
        ]
        try:
            return hf(TOKENS).logits
        finally:
            for handle in handles:
                handle.remove()


def _run(model: Any, how: Any = None, **options: Any) -> torch.Tensor:
    with torch.no_grad():
        if how is None:
            return model(TOKENS)
        with ablated_positions(model, how, **options):
            return model(TOKENS)


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> float:
    diff = float((got - want).abs().max())
    print(f"{what}: max abs diff {diff:.3g}")  # shown with -s: the measured figures
    assert diff <= TOL, (what, diff)
    return diff


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_permute_shift_equal_hugging_face_position_ids(backend: str) -> None:
    model = _model(backend)
    own = _own_hooks(backend)
    assert architecture_of(model).family == "gptj"
    base = _run(model)
    _close(base, _oracle(torch.arange(T)), f"{backend} none")
    zero = _run(model, "zero")
    assert float((zero - base).abs().max()) > 1e-3, "the ablation must matter"
    _close(zero, _oracle(torch.zeros(T, dtype=torch.long)), f"{backend} zero")
    _close(_run(model, "permute", perm=PERM), _oracle(PERM), f"{backend} permute perm")
    seeded, _ = PositionPlan(how="permute", n_ctx=int(model.cfg.n_ctx), seed=3).source(T)
    _close(_run(model, "permute", seed=3), _oracle(seeded), f"{backend} permute seed=3")
    _close(_run(model, "shift", shift=7), _oracle(torch.arange(T) + 7), f"{backend} shift 7")
    # identities: a permutation that moves nothing, and a shift of 0
    assert torch.equal(_run(model, "permute", perm=torch.arange(T)), base)
    assert torch.equal(_run(model, "shift", shift=0), base)
    assert hook_count(model) == own


@pytest.mark.parametrize("backend", BACKENDS)
def test_positions_and_layers_restrict_the_change(backend: str) -> None:
    model = _model(backend)
    own = _own_hooks(backend)
    chosen = torch.arange(T)
    chosen[[3, 5, 11]] = 0
    _close(_run(model, "zero", positions=[3, 5, 11]), _oracle(chosen), f"{backend} zero at 3,5,11")
    _close(
        _run(model, "shift", shift=4, layers=[1]),
        _oracle(torch.arange(T) + 4, layers=[1]),
        f"{backend} shift 4 in block 1",
    )
    _close(
        _run(model, "permute", perm=PERM, layers=[0]),
        _oracle(PERM, layers=[0]),
        f"{backend} permute in block 0",
    )
    assert hook_count(model) == own


def test_the_bridge_hooks_the_queries_and_keys_before_the_rotation() -> None:
    model = _model("bridge")
    own = _own_hooks("bridge")
    hooks = position_ablation_hooks(model, "zero", layers=[1])
    assert [name for name, _ in hooks] == ["blocks.1.attn.hook_q", "blocks.1.attn.hook_k"]
    with torch.no_grad():
        got = model.run_with_hooks(TOKENS, fwd_hooks=hooks)  # the pairs work without the CM
    _close(got, _oracle(torch.zeros(T, dtype=torch.long), layers=[1]), "run_with_hooks zero")
    with pytest.raises(InvalidInputError, match="rotary"):
        position_ablation_hooks(model, "mean")
    assert hook_count(model) == own


def test_zero_pattern_is_the_softmax_of_unrotated_q_dot_k() -> None:
    """Under "zero" every token is rotated as position 0 (no rotation): block 0's pattern is
    softmax(q.k / sqrt(d_head)) over the causal keys, q and k read at ``hook_q/hook_k`` of a
    normal pass (before the Hugging Face rotation). The bridge fires GPT-J's
    ``hook_attn_scores`` as the softmaxed pattern, so the pattern is what is compared."""
    model = _model("bridge")
    names = ["blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_pattern"]
    with torch.no_grad():
        _, normal = model.run_with_cache(TOKENS, names_filter=names)
        with ablated_positions(model, "zero"):
            _, zeroed = model.run_with_cache(TOKENS, names_filter=names[2:])
    q, k = normal[names[0]].double(), normal[names[1]].double()  # [batch pos head d_head]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    want = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    got = zeroed[names[2]].double()
    _close(got, want, "zero pattern vs softmax(unrotated q.k)")
    moved = float((normal[names[2]].double() - got).abs().max())
    assert moved > 1e-4, "the rotation must matter"
    assert hook_count(model) == _own_hooks("bridge")


@pytest.mark.parametrize("backend", BACKENDS)
def test_hooks_are_removed_on_every_exit(backend: str) -> None:
    model = _model(backend)
    own = _own_hooks(backend)
    with ablated_positions(model, "zero"):
        assert hook_count(model) > own
    assert hook_count(model) == own
    with pytest.raises(RuntimeError, match="inside"), ablated_positions(model, "shift", shift=2):
        model(TOKENS)
        raise RuntimeError("inside the block")
    assert hook_count(model) == own
    with (  # an error raised by a hook during the forward pass
        pytest.raises(InvalidInputError, match="perm has length"),
        ablated_positions(model, "permute", perm=[1, 0, 2]),
    ):
        model(TOKENS)
    assert hook_count(model) == own
    with pytest.raises(InvalidInputError, match="shift"):  # refused before anything attaches
        ablated_positions(model, "shift", shift=10_000).__enter__()
    assert hook_count(model) == own


def test_hooks_made_under_inference_mode_serve_a_pass_with_gradients() -> None:
    model = _model("bridge")
    with torch.inference_mode():
        hooks = position_ablation_hooks(model, "shift", shift=3)
    try:
        with model.hooks(fwd_hooks=hooks):
            logits = model(TOKENS)
        logits.sum().backward()  # no "inference tensor" error; gradients reach the weights
        assert any(p.grad is not None for p in model.parameters())
    finally:
        model.zero_grad(set_to_none=True)
    assert hook_count(model) == _own_hooks("bridge")
