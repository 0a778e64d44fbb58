"""What each family's positions are made of, read from the model itself: the learned table,
the rotary tables (the model's own rotary module), GPT-J's rotary tables on the bridge, and the
ALiBi slopes. :mod:`homoglens.run.interventions` builds the positional ablations from them.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from homoglens.core.errors import UnsupportedArchitectureError
from homoglens.core.types import HookedModel
from homoglens.models.architectures import ArchitectureSpec
from homoglens.models.loading import is_hooked_transformer


def hf_module(model: HookedModel, path: str) -> Any:
    """The Hugging Face submodule at dotted ``path`` of a bridge's ``original_model``."""
    module = model.original_model
    for part in path.split("."):
        module = getattr(module, part)
    return module


def bridge_rotary(
    model: HookedModel, spec: ArchitectureSpec, layer: int, caches: dict[Any, Any]
) -> Any:
    """The model's own rotary module as ``(source positions, device) -> (cos, sin)`` for block
    ``layer`` (Gemma 3: the module is asked for that layer's kind, local or global base).
    Blocks of one kind share a table cache in ``caches``."""
    module = hf_module(model, spec.hf_position_module)
    dtype = next(model.parameters()).dtype
    extra: tuple[Any, ...] = ()
    if spec.rotary_per_layer is not None:
        extra = (getattr(model.original_model.config, spec.rotary_per_layer)[layer],)
    cache: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    cache = caches.setdefault(extra, {})

    def rotary(source: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # Every block and both tables of one forward ask for the same source positions (the
        # plan caches them per length), so compute the tables once per source and device.
        key = (id(source), str(device))
        hit = cache.get(key)
        if hit is not None and hit[0] is source:
            return hit[1], hit[2]
        dummy = torch.zeros(1, dtype=dtype, device=device)
        # Cached across passes: made outside inference mode so a pass with gradients can use it.
        with torch.inference_mode(False), torch.no_grad():
            cos, sin = module(dummy, source.to(device)[None], *extra)
        if len(cache) > 64:
            cache.clear()
        cache[key] = (source, cos, sin)
        return cos, sin

    return rotary


def bridge_prerotary(
    model: HookedModel, spec: ArchitectureSpec
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """GPT-J on the bridge: ``(cos [n_ctx rotary_dim], sin [n_ctx rotary_dim], rotate)`` from
    the Hugging Face rotary module (``GPTJRotaryEmbedding``, which returns ``(sin, cos)`` at
    the ``position_ids`` it is given, each ``[1 pos rotary_dim/2]``), repeated per interleaved
    pair as its ``apply_rotary_pos_emb`` does; ``rotate`` is the module file's own
    ``rotate_every_two``. Row p rotates by position p, as ``rerotate_hook`` expects.

    Raises:
        UnsupportedArchitectureError: the installed ``transformers`` has no such module (its
            GPT-J predates ``GPTJRotaryEmbedding``).
    """
    try:
        module = hf_module(model, spec.hf_position_module)
        rotate = sys.modules[type(module).__module__].rotate_every_two
    except AttributeError as err:
        raise UnsupportedArchitectureError(
            f"positional ablations of {spec.family} on the bridge read the Hugging Face module "
            f"{spec.hf_position_module!r} and its rotate_every_two, which this transformers "
            "version lacks; upgrade transformers (>= 5) or load with backend='hooked' "
            "(TransformerLens 3.9)"
        ) from err
    n_ctx = int(model.cfg.n_ctx)
    device = module.embed_positions.device
    # Made outside inference mode: the hooks index them in passes with gradients too.
    with torch.inference_mode(False), torch.no_grad():
        dummy = torch.zeros(1, dtype=torch.float32, device=device)
        sin, cos = module(dummy, torch.arange(n_ctx, device=device)[None])
        cos = cos[0].float().repeat_interleave(2, dim=-1)
        sin = sin[0].float().repeat_interleave(2, dim=-1)
    return cos, sin, rotate


def alibi_slopes(model: HookedModel, spec: ArchitectureSpec) -> torch.Tensor:
    """Per-head ALiBi slopes ``[head_index]``, read from the model's own bias builder (BLOOM's
    ``build_alibi_tensor``, MPT's ``build_mpt_alibi_tensor``) as the bias step from key 0 to
    key 1, so they are the slopes the model uses (HookedTransformer: its own
    ``create_alibi_multipliers``)."""
    n_heads = int(model.cfg.n_heads)
    if is_hooked_transformer(model):
        from transformer_lens.components import (  # pyright: ignore[reportMissingImports]
            AbstractAttention,  # TransformerLens 3.9 only
        )

        return AbstractAttention.create_alibi_multipliers(n_heads, device="cpu").float()
    build = hf_module(model, spec.hf_position_module)
    with torch.no_grad():
        if spec.family == "mpt":
            bias_max = model.original_model.config.attn_config.alibi_bias_max
            bias = build(n_heads, 2, bias_max).reshape(n_heads, 2)
        else:
            bias = build(torch.ones(1, 2, device="cpu"), n_heads, torch.float32).reshape(n_heads, 2)
    return (bias[:, 1] - bias[:, 0]).float()


def learned_table(model: HookedModel, spec: ArchitectureSpec) -> torch.Tensor:
    """The table as the model adds it: row p is position p (OPT's first ``position_offset``
    rows, which no token uses, are dropped; HookedTransformer drops them when it converts)."""
    if is_hooked_transformer(model):
        return model.W_pos.detach()
    table = hf_module(model, spec.hf_position_module).weight.detach()
    return table[spec.position_offset :]
