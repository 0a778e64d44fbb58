"""NaN and inf: detected where they enter, a typed error, never averaged into a result."""

from __future__ import annotations

import pytest
import torch

from helpers import BACKENDS, THREE_OPENINGS, TWO_OPENINGS, hook_count
from homoglens import (
    NonFiniteActivationError,
    corpus_windows,
    load_model,
    massive_activations,
    position_ablation_study,
    positional_patching,
    sink_attribution,
    sink_scores,
)
from homoglens.models.loading import attached_hooks
from homoglens.testing import tiny_model_folder


def _nan_model(backend, where: str = "attn"):
    """A NaN in one query weight of block 1 (``attn``) or in block 0's MLP (``mlp``, which
    reaches the residual stream and the logits on both backends; HookedTransformer turns a NaN
    attention pattern into zeros, so the attention NaN stays inside the pattern)."""
    model = load_model(tiny_model_folder("gpt2"), backend=backend)
    block = model.blocks[1 if where == "attn" else 0]
    module = block.attn if where == "attn" else block.mlp
    weight = getattr(module, "W_Q" if where == "attn" else "W_in", None)
    with torch.no_grad():
        if weight is None or backend != "hooked":
            weight = next(module.parameters())
        weight[(0,) * weight.ndim] = float("nan")
    return model


def test_non_finite_activations_everywhere(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    handle = model.hook_dict["blocks.0.hook_resid_post"].register_forward_hook(
        lambda module, inputs, output: output * float("inf")
    )
    try:
        from homoglens import NonFiniteActivationError

        for call in (
            lambda: massive_activations(model, TWO_OPENINGS, progress=False),
            lambda: sink_attribution(model, TWO_OPENINGS, method="fast", edge_k=2, progress=False),
        ):
            with pytest.raises(NonFiniteActivationError):
                call()
    finally:
        handle.remove()
    assert hook_count(model) == 0


def test_non_finite_activations_are_detected_not_averaged(get_model) -> None:
    model = get_model("llama", BACKENDS[-1])
    handle = model.hook_dict["blocks.1.hook_resid_post"].register_forward_hook(
        lambda module, inputs, output: output * float("nan")
    )
    try:
        with pytest.raises(NonFiniteActivationError, match="blocks.1.hook_resid_post"):
            position_ablation_study(model, THREE_OPENINGS, progress=False)
    finally:
        handle.remove()
    assert hook_count(model) == 0


@pytest.mark.parametrize("metric", ["loss", "mean_pairwise"])
def test_nan_in_the_model_is_an_error_in_patching(backend, metric) -> None:
    from homoglens import NonFiniteActivationError

    model = _nan_model(backend, "mlp")
    tokens = corpus_windows(model, n_seq=2, seq_len=24).tokens
    with pytest.raises(NonFiniteActivationError, match="NaN or inf"):
        positional_patching(model, tokens, metric=metric, progress=False)
    assert hook_count(model) == 0


def test_nan_in_the_model_is_an_error_in_sink_scores(backend) -> None:
    from homoglens import NonFiniteActivationError

    model = _nan_model(backend)
    tokens = corpus_windows(model, n_seq=2, seq_len=24).tokens
    with pytest.raises(NonFiniteActivationError, match="hook_pattern"):
        sink_scores(model, tokens, progress=False)
    assert hook_count(model) == 0


def test_nan_in_a_block_is_an_error_in_attention_received(backend) -> None:
    """Issue 39, finding 2: NaN vectors were counted as zero vectors (a NaN norm is not > 0)
    and attention_received returned finite slopes."""
    from homoglens import attention_received

    model = _nan_model(backend, "mlp")
    with pytest.raises(NonFiniteActivationError, match="NaN or inf"):
        attention_received(model, THREE_OPENINGS, progress=False)
    assert hook_count(model) == 0


@pytest.mark.parametrize("arch", ["opt", "gptj"])
def test_a_pattern_that_never_fires_is_a_typed_error_not_nan(arch, monkeypatch) -> None:
    """Issue 39, finding 8: with the eager pattern asked for (HOMOGLENS_EAGER=1) and the
    Hugging Face config on "sdpa", these bridges never fire hook_pattern: an error naming the
    config and the fix, not all-NaN scores (or a bare RuntimeError)."""
    from homoglens import ModelStateError

    monkeypatch.setattr("homoglens.run.fast_attention.ENABLED", False)
    model = load_model(tiny_model_folder(arch), backend="bridge")
    model.original_model.config._attn_implementation = "sdpa"
    with pytest.raises(ModelStateError, match="_attn_implementation = 'eager'"):
        sink_scores(model, TWO_OPENINGS, progress=False)
    assert attached_hooks(model) == ()  # OPT's bridge keeps its own permanent mirror hooks
