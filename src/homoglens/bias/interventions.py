"""Push attention toward (or away from) chosen keys, with a dose: hook specs and a context manager.

``attention_bias_hooks`` builds ``(hook_name, hook_fn)`` pairs that bias the attention pattern
of chosen blocks and heads, A' = softmax(beta * scores + b * phi) (the maths:
:mod:`homoglens.bias.hooks`; docs/bias.md, "The intervention"), ready for
``model.run_with_hooks(..., fwd_hooks=...)`` or ``model.hooks(...)``; ``biased_attention``
attaches them through TransformerLens' level-scoped ``model.hooks()``, which removes them on
exit, normally or by an exception. ``attention_bias_plan`` checks the arguments once for both
and for the dose-response study (:mod:`homoglens.bias.measure`; Yusupov et al. 2025, arXiv
2508.17126).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from homoglens.bias.hooks import AttentionBiasPlan, attention_bias_hook
from homoglens.core.errors import InvalidInputError
from homoglens.core.types import (
    ATTENTION_BIAS_KINDS,
    AttentionBiasKind,
    FwdHooks,
    HookedModel,
    signature_of,
)
from homoglens.core.validate import as_float, as_int, check_layers, chosen_indices
from homoglens.models.architectures import pattern_hook_name
from homoglens.models.loading import check_writable
from homoglens.run.interventions import hooks_attached

__all__ = [
    "ATTENTION_BIAS_KINDS",
    "attention_bias_hooks",
    "attention_bias_plan",
    "biased_attention",
]


_MAX_STRENGTH = 1e4


def attention_bias_plan(
    model: HookedModel,
    kind: AttentionBiasKind,
    strength: float,
    *,
    first_k: int = 1,
    window: int = 8,
    layers: Sequence[int] | int | None = None,
    heads: Sequence[int] | int | None = None,
) -> AttentionBiasPlan:
    """Check an attention bias's arguments and return them as an :class:`AttentionBiasPlan`
    (b, beta, blocks, heads); the arguments and errors of :func:`attention_bias_hooks`.

    Raises:
        InvalidInputError: as :func:`attention_bias_hooks`.
    """
    if not isinstance(kind, str) or kind not in ATTENTION_BIAS_KINDS:
        raise InvalidInputError(f"kind={kind!r} must be one of {list(ATTENTION_BIAS_KINDS)}")
    # |b| or beta past 1e4 saturates every row long before; far past it exp overflows
    strength = as_float("strength", strength, low=-_MAX_STRENGTH, high=_MAX_STRENGTH)
    first_k = as_int("first_k", first_k, low=1)
    window = as_int("window", window, low=1)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    blocks = check_layers(layers, n_layers, blocks=True)
    chosen_heads = (
        None if heads is None else chosen_indices("heads", heads, n_heads, "head indices")
    )
    if kind == "temperature":
        if strength <= 0:
            raise InvalidInputError(
                f"strength={strength} is beta for kind='temperature' and must be > 0 (1: no "
                "change, < 1 flatter, > 1 sharper attention)"
            )
        bias, beta = 0.0, strength
    else:
        bias, beta = strength, 1.0
    return AttentionBiasPlan(kind, bias, beta, first_k, window, blocks, chosen_heads)


@signature_of(attention_bias_plan)
def attention_bias_hooks(
    model: HookedModel, kind: AttentionBiasKind, strength: float, **options: Any
) -> FwdHooks:
    """Build forward hooks that push attention toward (or away from) chosen keys, with a dose.

    At ``blocks.{l}.attn.hook_pattern`` of the chosen blocks and heads, each row's pattern
    becomes A'[q, k] = A[q, k]^beta exp(b phi[q, k]) / sum_k' (same), computed in log space,
    which equals softmax(beta * scores + b * phi) (docs/bias.md, "The intervention"):
    Hugging Face eager attention given the 4D additive mask ``causal + b * phi`` computes the
    same logits. For every kind but ``"temperature"`` b = ``strength`` and beta = 1; for
    ``"temperature"`` b = 0 and beta = ``strength`` (beta < 1 flattens attention). It works on
    every family and backend with attention patterns (the table is not needed).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        kind: One of :data:`~homoglens.core.types.ATTENTION_BIAS_KINDS`: ``"first"`` (the first
            ``first_k`` keys: the sink / primacy), ``"self"``, ``"recent"`` (the last
            ``window`` keys up to the query: recency), ``"alibi"`` (-(q - k), ALiBi's shape),
            ``"middle"`` (keys q/4 .. 3q/4: the specificity control) or ``"temperature"``.
        strength: b in nats per unit of phi (|b| < 1e4; 0 changes nothing), or beta in
            (0, 1e4) for ``"temperature"`` (1 changes nothing).
        **options: ``first_k`` (keys counted as "first", >= 1), ``window`` (keys counted as
            "recent", >= 1, the query itself included), ``layers`` (blocks to bias, default
            every block), ``heads`` (heads to bias in each chosen block, default every head);
            declared once, by :func:`attention_bias_plan`.

    Returns:
        ``[(hook_name, hook_fn), ...]``; empty at strength 0 (temperature: 1), so the run is the
        unhooked one bit for bit.

    Raises:
        InvalidInputError: unknown ``kind``, a strength that is not a real number in
            (-1e4, 1e4), ``beta <= 0``,
            ``first_k`` / ``window`` < 1, blocks or heads out of range or repeated.
        UnsupportedArchitectureError: the model only reads ``hook_pattern`` (the bridge of
            GPT-Neo, OPT, GPT-J; see :func:`check_writable`).

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (C2: homogenization under positional bias);
        Press et al. 2022, arXiv 2108.12409 (ALiBi); Xiao et al. 2024, arXiv 2309.17453 and Gu
        et al. 2024, arXiv 2410.10781 (attention sinks); Hsieh et al. 2024, arXiv 2406.16008.

    Examples:
        >>> from homoglens import attention_bias_hooks, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> [name for name, _ in attention_bias_hooks(model, "first", 2.0, layers=[1])]
        ['blocks.1.attn.hook_pattern']
        >>> attention_bias_hooks(model, "first", 0.0)
        []
    """
    plan = attention_bias_plan(model, kind, strength, **options)
    if plan.identity:
        return []
    check_writable(model, "pattern", "an attention bias")
    hook = attention_bias_hook(plan)
    return [(pattern_hook_name(i), hook) for i in plan.blocks]


@contextlib.contextmanager
@signature_of(attention_bias_hooks)
def biased_attention(
    model: HookedModel, kind: AttentionBiasKind, strength: float, **options: Any
) -> Iterator[HookedModel]:
    """Context manager: every forward pass inside runs with biased attention, then the model is
    restored (the hooks of :func:`attention_bias_hooks`, attached with ``model.hooks()``;
    removed on exit, also when the body raises).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        kind: The bias kind (see :func:`attention_bias_hooks`).
        strength: b (or beta for ``"temperature"``).
        **options: ``first_k``, ``window``, ``layers``, ``heads``.

    Yields:
        The same model, with the hooks attached.

    Raises:
        InvalidInputError: as :func:`attention_bias_hooks`, before anything is attached; a
            ``transformers`` / nnsight model object (wrap it with ``load_model(obj)`` first).

    Examples:
        >>> import torch
        >>> from homoglens import biased_attention, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> with biased_attention(model, kind="first", strength=3.0):
        ...     logits = model(torch.tensor([[50256, 15496, 995]]))
        >>> tuple(logits.shape)
        (1, 3, 50257)
    """
    with hooks_attached(model, "biased_attention", attention_bias_hooks, kind, strength, **options):
        yield model
