"""The fast attention path: passes that read no attention pattern run PyTorch SDPA.

TransformerLens' ``TransformerBridge`` forces eager attention on every pass, and for most
families it re-implements attention step by step, so that ``hook_attn_scores`` and
``hook_pattern`` can fire: every pass materialises ``[batch head query_pos key_pos]`` scores and
patterns, even when nothing reads them. A profile, a position-resolved similarity, a
massive-activation scan or a residual-stream patching pass reads only the residual stream.
For such a pass :func:`fast_attention` hands each block's attention back to the wrapped Hugging
Face module (``AttentionBridge``'s plain delegating forward, which still fires ``attn.hook_in``
and ``attn.hook_out``) with the model's attention implementation set to ``"sdpa"``, and restores
both when the pass ends, however it ends. Every hook point outside the attention internals
fires with the same values (equal to eager within float rounding: 3e-6 on the 16 families of
the table it serves, tests/oracles/test_fast_attention.py); user hooks there keep working.

The pass stays eager, exactly as before, whenever the fast path could not be exact:

* a hook of the pass, or one the user attached (``model.add_hook``, ``model.hooks()``), sits
  on an attention-internal hook point (``hook_pattern``, ``hook_attn_scores``, ``hook_q``,
  ``hook_rot_k``, ``hook_cos``, ...: everything under ``blocks.{l}.attn`` but its
  ``hook_in`` / ``hook_out``); positional and attention-bias interventions hook there;
* the backend is ``HookedTransformer`` (TransformerLens computes its own attention);
* the Hugging Face model does not support SDPA (GPT-Neo, BLOOM, MPT), soft-caps its attention
  logits (Gemma 2), or the bridge is configured to split the attention input per head
  (``use_split_qkv_input``, ``use_attn_in``, ``use_attn_result``);
* the weights are float16 / bfloat16 (SDPA rounds differently from eager's float32 softmax).

The last two print a one-line notice, once per model. ``homoglens.fast_attention.ENABLED =
False`` (or the environment variable ``HOMOGLENS_EAGER=1``) turns the fast path off everywhere.
"""

from __future__ import annotations

import os
import types
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from homoglens.types import HookedModel, HookSpec

__all__ = ["ENABLED", "fast_attention", "fast_attention_status"]

ENABLED: bool = os.environ.get("HOMOGLENS_EAGER", "") not in ("1", "true", "yes")
"""Whether residual-only passes may run SDPA attention (see the module's docstring)."""

_SPEAKING = ("hook_in", "hook_out")  # attention hook points the delegating forward fires
_STATUS: weakref.WeakKeyDictionary[Any, tuple[str, frozenset[int]]] = weakref.WeakKeyDictionary()
_TOLD: weakref.WeakSet[Any] = weakref.WeakSet()


def fast_attention_status(model: HookedModel) -> str:
    """``"sdpa"`` where residual-only passes of ``model`` run SDPA attention, else the reason
    they stay eager (one line). Passes that hook attention internals are eager either way.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.

    Returns:
        ``"sdpa"`` or ``"eager: "`` and the reason (the backend, the family, the dtype, or the
        switch turned off).

    References:
        PyTorch ``torch.nn.functional.scaled_dot_product_attention``; Hugging Face transformers'
        ``attn_implementation`` ("sdpa", "eager"); Dao et al. 2022, arXiv 2205.14135
        (FlashAttention, the memory-efficient kernels SDPA dispatches to).

    Examples:
        >>> from homoglens import fast_attention_status, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> fast_attention_status(load_model(tiny_model_folder("llama"), backend="bridge"))
        'sdpa'
    """
    if not ENABLED:
        return "eager: turned off (homoglens.fast_attention.ENABLED = False or HOMOGLENS_EAGER=1)"
    status = _status(model)[0]
    return status if status != "sdpa" else _dtype_status(model)


def _dtype_status(model: Any) -> str:
    """``"sdpa"``, or why the weights' dtype keeps the pass eager."""
    dtype = next(iter(model.parameters())).dtype
    if dtype in (torch.float32, torch.float64):
        return "sdpa"
    return (
        f"eager: {dtype} weights (SDPA rounds differently from eager's float32 softmax, so it "
        "is not exact there)"
    )


def _status(model: Any) -> tuple[str, frozenset[int]]:
    """``(status, ids of the attention-internal hook points)``, cached per model."""
    try:
        return _STATUS[model]
    except (KeyError, TypeError):
        pass
    found = _inspect(model)
    try:
        _STATUS[model] = found
    except TypeError:
        pass
    return found


def _inspect(model: Any) -> tuple[str, frozenset[int]]:
    try:
        from transformer_lens.hook_points import HookPoint
        from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
    except ImportError:  # pragma: no cover - every supported TransformerLens has both
        return "eager: this TransformerLens has no AttentionBridge", frozenset()
    hf = getattr(model, "original_model", None)
    blocks = getattr(model, "blocks", None)
    if hf is None or blocks is None:
        return "eager: HookedTransformer computes its own attention", frozenset()
    attns = [getattr(block, "attn", None) for block in blocks]
    if not attns or not all(isinstance(a, AttentionBridge) for a in attns):
        return "eager: a block's attention is not a TransformerLens AttentionBridge", frozenset()
    attns = [a for a in attns if isinstance(a, AttentionBridge)]  # (for the type checker)
    internal = frozenset(
        id(module)
        for attn in attns
        for name, module in attn.named_modules()
        if isinstance(module, HookPoint) and name not in _SPEAKING
    )
    cfg = model.cfg
    for flag in ("use_split_qkv_input", "use_attn_in", "use_attn_result"):
        if getattr(cfg, flag, False):
            return f"eager: cfg.{flag} is set (the bridge splits attention per head)", internal
    config = getattr(hf, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return "eager: the Hugging Face model has no attention implementation to switch", internal
    if not getattr(hf, "_supports_sdpa", False):
        return f"eager: {type(hf).__name__} does not support SDPA attention", internal
    for attn in attns:
        original = attn.original_component
        cap = getattr(original, "attn_logit_softcapping", None)
        cap = cap if cap is not None else getattr(config, "attn_logit_softcapping", None)
        if cap is not None:
            return "eager: the attention logits are soft-capped (SDPA cannot)", internal
    return "sdpa", internal


def _touches_internals(model: Any, fwd_hooks: Sequence[HookSpec], internal: frozenset[int]) -> bool:
    """Whether a hook of the pass, or one already attached, sits on an internal hook point."""
    hook_dict = getattr(model, "hook_dict", {})
    for name, _ in fwd_hooks:
        if not isinstance(name, str) or name not in hook_dict:
            return True  # a name filter or an unknown name: let the eager pass handle it
        if id(hook_dict[name]) in internal:
            return True
    for point in hook_dict.values():
        if id(point) in internal and (
            point._forward_hooks or point._forward_pre_hooks or point._backward_hooks
        ):
            return True
    return False


def _configs(model: Any) -> list[Any]:
    """Every distinct config object whose ``_attn_implementation`` the pass reads."""
    hf = model.original_model
    found: dict[int, Any] = {}
    for config in (
        getattr(hf, "config", None),
        getattr(getattr(hf, "config", None), "text_config", None),
        *(getattr(block.attn.original_component, "config", None) for block in model.blocks),
    ):
        if config is not None and hasattr(config, "_attn_implementation"):
            found[id(config)] = config
    return list(found.values())


@contextmanager
def fast_attention(model: HookedModel, fwd_hooks: Sequence[HookSpec] = ()) -> Iterator[bool]:
    """For the pass run inside the block: SDPA attention where it is exact for the hooks
    attached (see the module docstring), restored however the block ends.

    Args:
        model: The model the pass runs.
        fwd_hooks: The ``(hook name, function)`` pairs the pass will attach.

    Yields:
        Whether the pass runs SDPA attention.
    """
    if not ENABLED:
        yield False
        return
    status, internal = _status(model)
    if status != "sdpa":
        if internal and model not in _TOLD:  # a bridge that could not: say so once
            _TOLD.add(model)
            warnings.warn(
                f"homoglens: residual-only passes run eager attention ({status[7:]})",
                stacklevel=3,
            )
        yield False
        return
    precision = _dtype_status(model)
    if precision != "sdpa":
        if model not in _TOLD:
            _TOLD.add(model)
            warnings.warn(
                f"homoglens: residual-only passes run eager attention ({precision[7:]})",
                stacklevel=3,
            )
        yield False
        return
    if _touches_internals(model, fwd_hooks, internal):
        yield False
        return
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    attns = [block.attn for block in model.blocks]  # type: ignore[attr-defined]
    configs = _configs(model)
    saved = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = "sdpa"
        for attn in attns:  # an instance attribute, past the bridge's own __setattr__
            object.__setattr__(attn, "forward", types.MethodType(AttentionBridge.forward, attn))
        yield True
    finally:
        for attn in attns:
            if "forward" in attn.__dict__:
                object.__delattr__(attn, "forward")
        for config, value in zip(configs, saved, strict=True):
            config._attn_implementation = value
