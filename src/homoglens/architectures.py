"""How position enters each supported model family: one declarative table, no ``if`` chains.

Each row says which Hugging Face architectures belong to the family, how positional
information enters (learned absolute embedding added to the residual stream, or rotary
embedding applied to queries and keys, to part or all of ``d_head``), and which residual hook
points exist. Later modules (positional interventions, sinks) read the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from homoglens.errors import UnsupportedArchitectureError
from homoglens.validate import as_int, check_model

__all__ = [
    "ArchitectureSpec",
    "ARCHITECTURES",
    "architecture_of",
    "spec_for_hf_architecture",
    "resid_hook_name",
    "block_hook_name",
    "pattern_hook_name",
    "z_hook_name",
]


@dataclass(frozen=True)
class ArchitectureSpec:
    """One model family.

    Attributes:
        family: Short name used in results (``"gpt2"``, ``"neox"``, ``"llama"``).
        hf_architectures: Hugging Face ``config.architectures`` entries of this family.
        positional: ``"learned_absolute"`` (a ``[n_ctx d_model]`` table added at
            ``hook_pos_embed``) or ``"rotary"`` (queries and keys rotated per position).
        rotary: ``"none"``, ``"partial"`` (only ``rotary_dim < d_head`` channels rotate, e.g.
            Pythia's ``rotary_pct=0.25``) or ``"full"`` (all ``d_head`` channels, Llama).
        has_resid_mid: Whether ``blocks.{i}.hook_resid_mid`` exists; GPT-NeoX runs attention
            and MLP in parallel and has none.
        examples: Hub names of models of this family.
        hooked_position_hooks: Where position enters on ``HookedTransformer`` (``{i}`` = block):
            ``hook_pos_embed`` for learned tables; for rotary, the rotated queries/keys
            ``hook_rot_q``/``hook_rot_k``.
        bridge_position_hooks: The same on ``TransformerBridge``: ``hook_pos_embed``, or the
            per-block rotary tables ``hook_cos``/``hook_sin`` (``hook_rot_q/k`` do not fire
            there for GPT-NeoX, so the tables serve both rotary families).
        hf_position_module: Attribute path, inside the Hugging Face model, of the module that
            makes the positional signal (the ``wpe`` table or the rotary-embedding module).
    """

    family: str
    hf_architectures: tuple[str, ...]
    positional: Literal["learned_absolute", "rotary"]
    rotary: Literal["none", "partial", "full"]
    has_resid_mid: bool
    examples: tuple[str, ...]
    hooked_position_hooks: tuple[str, ...]
    bridge_position_hooks: tuple[str, ...]
    hf_position_module: str


_HOOKED_ROTARY = ("blocks.{i}.attn.hook_rot_q", "blocks.{i}.attn.hook_rot_k")
_BRIDGE_ROTARY = ("blocks.{i}.attn.hook_cos", "blocks.{i}.attn.hook_sin")

ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "gpt2": ArchitectureSpec(
        family="gpt2",
        hf_architectures=("GPT2LMHeadModel",),
        positional="learned_absolute",
        rotary="none",
        has_resid_mid=True,
        examples=("gpt2", "gpt2-medium", "distilgpt2"),
        hooked_position_hooks=("hook_pos_embed",),
        bridge_position_hooks=("hook_pos_embed",),
        hf_position_module="transformer.wpe",
    ),
    "neox": ArchitectureSpec(
        family="neox",
        hf_architectures=("GPTNeoXForCausalLM",),
        positional="rotary",
        rotary="partial",
        has_resid_mid=False,
        examples=("EleutherAI/pythia-70m", "EleutherAI/pythia-160m"),
        hooked_position_hooks=_HOOKED_ROTARY,
        bridge_position_hooks=_BRIDGE_ROTARY,
        hf_position_module="gpt_neox.rotary_emb",
    ),
    "llama": ArchitectureSpec(
        family="llama",
        hf_architectures=("LlamaForCausalLM",),
        positional="rotary",
        rotary="full",
        has_resid_mid=True,
        examples=("smollm2-135m-instruct", "meta-llama/Llama-3.2-1B"),
        hooked_position_hooks=_HOOKED_ROTARY,
        bridge_position_hooks=_BRIDGE_ROTARY,
        hf_position_module="model.rotary_emb",
    ),
}
"""The architecture table, one row per family (``gpt2``, ``neox``, ``llama``): how position
enters (learned absolute or rotary, and the rotary fraction) and which hook names carry it on
each backend. Read it with :func:`architecture_of`."""


def _supported() -> str:
    return ", ".join(
        f"{spec.family} ({'/'.join(spec.hf_architectures)})" for spec in ARCHITECTURES.values()
    )


def spec_for_hf_architecture(hf_architecture: str | None) -> ArchitectureSpec:
    """Return the table row for a Hugging Face architecture name.

    Args:
        hf_architecture: e.g. ``"GPT2LMHeadModel"`` (from ``config.architectures[0]``).

    Returns:
        The matching :class:`ArchitectureSpec`.

    Raises:
        UnsupportedArchitectureError: the architecture is not in the table; the message lists
            the supported ones.
    """
    for spec in ARCHITECTURES.values():
        if hf_architecture in spec.hf_architectures:
            return spec
    raise UnsupportedArchitectureError(
        f"architecture {hf_architecture!r} is not supported by homoglens; supported: "
        f"{_supported()}. Convert the model to one of these, or open an issue."
    )


def architecture_of(model: Any) -> ArchitectureSpec:
    """Return the table row for a loaded TransformerLens model (either backend).

    Args:
        model: A ``HookedTransformer`` (reads ``cfg.original_architecture``) or a
            ``TransformerBridge`` (reads ``cfg.architecture``).

    Returns:
        The matching :class:`ArchitectureSpec`.

    Raises:
        InvalidInputError: ``model`` is not a TransformerLens model.
        UnsupportedArchitectureError: the model's architecture is not in the table.
    """
    if isinstance(model, (str, bytes)) or not hasattr(model, "cfg"):
        check_model(model)  # raises the one message for non-models
    cfg = getattr(model, "cfg")  # noqa: B009 - `model` is Any until check_model has run
    name = getattr(cfg, "original_architecture", None) or getattr(cfg, "architecture", None)
    return spec_for_hf_architecture(name)


def resid_hook_name(layer: int) -> str:
    """TransformerLens hook name of entry ``layer`` of the ``n_layers + 1`` residual axis.

    Entry 0 is the input of block 0 (``blocks.0.hook_resid_pre``: token plus positional
    embeddings); entry l >= 1 is the output of block l - 1 (``blocks.{l-1}.hook_resid_post``).
    This is the Hugging Face ``output_hidden_states`` convention, without the final norm.
    """
    layer = as_int("layer", layer, low=0)
    return (
        block_hook_name(0, "hook_resid_pre")
        if layer == 0
        else block_hook_name(layer - 1, "hook_resid_post")
    )


def block_hook_name(layer: int, point: str) -> str:
    """TransformerLens hook name of ``point`` in block ``layer``: ``blocks.{layer}.{point}``
    (``point`` as TransformerLens spells it: ``"hook_resid_pre"``, ``"attn.hook_pattern"``,
    ``"ln2.hook_in"``); the one place homoglens builds a block's hook name."""
    return f"blocks.{as_int('layer', layer, low=0)}.{point}"


def pattern_hook_name(layer: int) -> str:
    """``blocks.{layer}.attn.hook_pattern``: the attention pattern ``[batch head_index
    query_pos key_pos]`` of block ``layer``."""
    return block_hook_name(layer, "attn.hook_pattern")


def z_hook_name(layer: int) -> str:
    """``blocks.{layer}.attn.hook_z``: each head's weighted values ``[batch pos head_index
    d_head]`` in block ``layer``, before the output projection."""
    return block_hook_name(layer, "attn.hook_z")
