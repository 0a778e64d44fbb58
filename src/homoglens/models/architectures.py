"""How position enters each supported model family: one declarative table, no ``if`` chains.

Each row says which Hugging Face architectures belong to the family, how positional
information enters (learned absolute embedding added to the residual stream, or rotary
embedding applied to queries and keys, to part or all of ``d_head``), and which residual hook
points exist. Later modules (positional interventions, sinks) read the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from homoglens.core.errors import UnsupportedArchitectureError
from homoglens.core.validate import as_int, check_model

__all__ = [
    "ARCHITECTURES",
    "BLOCK_POINTS",
    "UNEMBED_IN",
    "ArchitectureSpec",
    "architecture_of",
    "block_hook_name",
    "component_hook_name",
    "family_of",
    "find_architecture",
    "hf_architecture_of",
    "is_decoder_only",
    "pattern_hook_name",
    "resid_hook_name",
    "spec_for_hf_architecture",
    "supported_families",
    "z_hook_name",
]


@dataclass(frozen=True)
class ArchitectureSpec:
    """One model family: how position enters it, declaratively.

    Attributes:
        family: Short name used in results (``"gpt2"``, ``"neox"``, ``"llama"``, ...).
        hf_architectures: Hugging Face ``config.architectures`` entries of this family.
        positional: ``"learned_absolute"`` (a ``[n_ctx d_model]`` table added at
            ``hook_pos_embed``), ``"rotary"`` (queries and keys rotated per position) or
            ``"alibi"`` (no positional embedding; a per-head linear bias
            ``-slope_h * (i - j)`` added to the attention scores: BLOOM, MPT).
        rotary: ``"none"``, ``"partial"`` (only ``rotary_dim < d_head`` channels rotate, e.g.
            Pythia's ``rotary_pct=0.25``) or ``"full"`` (all ``d_head`` channels, Llama).
        rotary_layout: ``"none"``, ``"half"`` (channel i pairs with i + rotary_dim/2: NeoX,
            Llama) or ``"interleaved"`` (channels 2i and 2i + 1 pair: GPT-J).
        has_resid_mid: Whether ``blocks.{i}.hook_resid_mid`` exists; GPT-NeoX, Phi and GPT-J
            run attention and MLP in parallel and have none.
        examples: Hub names of models of this family.
        hooked_position_hooks: Where position enters on ``HookedTransformer`` (``{i}`` = block):
            ``hook_pos_embed`` for learned tables; for rotary, the rotated queries/keys
            ``hook_rot_q``/``hook_rot_k``.
        bridge_position_hooks: The same on ``TransformerBridge``: ``hook_pos_embed``, or the
            per-block rotary tables ``hook_cos``/``hook_sin``, or (GPT-J, see
            ``bridge_prerotates``) the queries/keys ``hook_q``/``hook_k`` that the Hugging Face
            module rotates next; empty where TransformerLens exposes no hook that carries
            position (the ablations then refuse the bridge).
        bridge_prerotates: Whether the bridge's position hooks carry the queries/keys *before*
            the Hugging Face attention module rotates them by the positions it is given (GPT-J:
            its bridge fires neither ``hook_rot_q/k`` nor ``hook_cos/sin``). The ablations then
            rotate them beforehand by (source - position) with the Hugging Face module's own
            sin/cos table, so the module's rotation by p lands on the source position.
        hf_position_module: Attribute path, inside the Hugging Face model, of the module that
            makes the positional signal (the ``wpe`` table or the rotary-embedding module; for
            ALiBi, the model method that builds the bias, whose slopes homoglens reads).
        position_offset: Rows of the learned table before position 0 (OPT: 2); the table is
            read from that row on.
        rotary_per_layer: Name of the Hugging Face config list that gives each layer its rotary
            kind, passed to the rotary module per block (Gemma 3's ``layer_types``: local
            sliding-window layers use base 10 000, global layers 1 000 000), or ``None``.
        nope_layers: Name of the Hugging Face config list whose 0 entries mark layers without
            rotary (SmolLM3's ``no_rope_layers``: every fourth layer), or ``None``.
        sliding_window: Whether some layers attend only within a window (Mistral, Gemma 2/3,
            GPT-Neo's local layers); ablations change positions, not the window.
        caveats: Known traps of this family, for the docs and the results.
    """

    family: str
    hf_architectures: tuple[str, ...]
    positional: Literal["learned_absolute", "rotary", "alibi"]
    rotary: Literal["none", "partial", "full"]
    has_resid_mid: bool
    examples: tuple[str, ...]
    hooked_position_hooks: tuple[str, ...]
    bridge_position_hooks: tuple[str, ...]
    hf_position_module: str
    rotary_layout: Literal["none", "half", "interleaved"] = "none"
    bridge_prerotates: bool = False
    position_offset: int = 0
    rotary_per_layer: str | None = None
    nope_layers: str | None = None
    sliding_window: bool = False
    caveats: str = ""

    def position_hook_names(self, block: int, *, bridge: bool) -> tuple[str, ...]:
        """The hook names where position enters block ``block`` (or the embedding, for a
        learned table), on ``TransformerBridge`` (``bridge``) or ``HookedTransformer``: this
        row's ``bridge_position_hooks`` / ``hooked_position_hooks`` with ``{i}`` = ``block``, in
        the order the table lists them (rotary: queries then keys, or cos then sin)."""
        table = self.bridge_position_hooks if bridge else self.hooked_position_hooks
        return tuple(name.format(i=as_int("block", block, low=0)) for name in table)


_HOOKED_ROTARY = ("blocks.{i}.attn.hook_rot_q", "blocks.{i}.attn.hook_rot_k")
_BRIDGE_ROTARY = ("blocks.{i}.attn.hook_cos", "blocks.{i}.attn.hook_sin")
_BRIDGE_PROJECTIONS = ("blocks.{i}.attn.hook_q", "blocks.{i}.attn.hook_k")  # before the rotation
_LEARNED = ("hook_pos_embed",)


def _learned(family: str, archs: tuple[str, ...], module: str, *examples: str, **kw: Any) -> Any:
    return ArchitectureSpec(
        family=family,
        hf_architectures=archs,
        positional="learned_absolute",
        rotary="none",
        has_resid_mid=True,
        examples=examples,
        hooked_position_hooks=_LEARNED,
        bridge_position_hooks=_LEARNED,
        hf_position_module=module,
        **kw,
    )


def _rotary(
    family: str,
    archs: tuple[str, ...],
    *examples: str,
    rotary: Literal["partial", "full"] = "full",
    module: str = "model.rotary_emb",
    parallel: bool = False,
    **kw: Any,
) -> Any:
    return ArchitectureSpec(
        family=family,
        hf_architectures=archs,
        positional="rotary",
        rotary=rotary,
        rotary_layout=kw.pop("rotary_layout", "half"),
        has_resid_mid=not parallel,
        examples=examples,
        hooked_position_hooks=_HOOKED_ROTARY,
        bridge_position_hooks=kw.pop("bridge_position_hooks", _BRIDGE_ROTARY),
        hf_position_module=module,
        **kw,
    )


def _alibi(family: str, archs: tuple[str, ...], builder: str, *examples: str, **kw: Any) -> Any:
    scores = ("blocks.{i}.attn.hook_attn_scores",)
    return ArchitectureSpec(
        family=family,
        hf_architectures=archs,
        positional="alibi",
        rotary="none",
        has_resid_mid=True,
        examples=examples,
        hooked_position_hooks=scores,
        bridge_position_hooks=scores,
        hf_position_module=builder,
        **kw,
    )


_POST_NORM = (
    "post-norm blocks: attn_out / mlp_out are normalised before they join the stream, so on "
    "the bridge they are not additive residual components (TransformerLens #1648)"
)
_EAGER = (
    "TransformerLens switches Gemma 2/3 to eager attention process-wide when it boots one "
    "(TransformerLens #1795); logits are soft-capped"
)

ARCHITECTURES: dict[str, ArchitectureSpec] = {
    spec.family: spec
    for spec in (
        # learned absolute tables added to the residual stream at hook_pos_embed
        _learned("gpt2", ("GPT2LMHeadModel",), "transformer.wpe", "gpt2", "gpt2-medium"),
        _learned(
            "gptneo",
            ("GPTNeoForCausalLM",),
            "transformer.wpe",
            "EleutherAI/gpt-neo-125M",
            sliding_window=True,
            caveats="alternating global and local (windowed) attention layers",
        ),
        _learned(
            "opt",
            ("OPTForCausalLM",),
            "model.decoder.embed_positions",
            "facebook/opt-125m",
            "facebook/opt-1.3b",
            position_offset=2,
            caveats="the learned table has 2 rows before position 0 (offset 2)",
        ),
        _learned(
            "gpt_bigcode",
            ("GPTBigCodeForCausalLM",),
            "transformer.wpe",
            "bigcode/gpt_bigcode-santacoder",
            caveats="multi-query attention",
        ),
        # rotary, every channel of d_head
        _rotary("llama", ("LlamaForCausalLM",), "smollm2-135m-instruct", "meta-llama/Llama-3.2-1B"),
        _rotary(
            "mistral",
            ("MistralForCausalLM",),
            "mistralai/Mistral-7B-v0.1",
            sliding_window=True,
        ),
        _rotary("qwen2", ("Qwen2ForCausalLM",), "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B"),
        _rotary("qwen3", ("Qwen3ForCausalLM",), "Qwen/Qwen3-0.6B", caveats="q/k RMSNorm"),
        _rotary("gemma", ("GemmaForCausalLM",), "google/gemma-2b"),
        _rotary(
            "gemma2",
            ("Gemma2ForCausalLM",),
            "google/gemma-2-2b",
            sliding_window=True,
            caveats=f"{_EAGER}; {_POST_NORM}",
        ),
        _rotary(
            "gemma3",
            ("Gemma3ForCausalLM",),
            "google/gemma-3-1b-pt",
            "google/gemma-3-270m",
            rotary_per_layer="layer_types",
            sliding_window=True,
            caveats=f"local layers rotate with base 10 000, global with 1 000 000; {_EAGER}; "
            f"{_POST_NORM}",
        ),
        _rotary(
            "olmo2",
            ("Olmo2ForCausalLM",),
            "allenai/OLMo-2-0425-1B",
            caveats=_POST_NORM,
        ),
        _rotary("phi3", ("Phi3ForCausalLM",), "microsoft/Phi-3-mini-4k-instruct"),
        _rotary(
            "smollm3",
            ("SmolLM3ForCausalLM",),
            "HuggingFaceTB/SmolLM3-3B",
            nope_layers="no_rope_layers",
            caveats="no rotary in every fourth layer (NoPE); layers= there changes nothing",
        ),
        # rotary on part of d_head
        _rotary(
            "neox",
            ("GPTNeoXForCausalLM",),
            "EleutherAI/pythia-70m",
            "EleutherAI/pythia-160m",
            rotary="partial",
            module="gpt_neox.rotary_emb",
            parallel=True,
        ),
        _rotary("phi", ("PhiForCausalLM",), "microsoft/phi-2", rotary="partial", parallel=True),
        _rotary(
            "stablelm", ("StableLmForCausalLM",), "stabilityai/stablelm-2-1_6b", rotary="partial"
        ),
        # ALiBi: a linear bias on the attention scores, no positional embedding
        _alibi(
            "bloom",
            ("BloomForCausalLM",),
            "transformer.build_alibi_tensor",
            "bigscience/bloom-560m",
            "bigscience/bloomz-560m",
            caveats="LayerNorm on the embeddings (entry 0 is the normalised embedding)",
        ),
        _alibi(
            "mpt",
            ("MptForCausalLM",),
            "transformer.build_mpt_alibi_tensor",
            "mosaicml/mpt-7b",
            caveats="HookedTransformer (TransformerLens 3.9) does not load MPT",
        ),
        # rotary on interleaved channel pairs; the bridge never fires hook_rot_q/k (nor has
        # hook_cos/sin) for GPT-J: its queries/keys are rotated at hook_q/k, before the
        # Hugging Face module rotates them, with that module's own sin/cos table
        _rotary(
            "gptj",
            ("GPTJForCausalLM",),
            "EleutherAI/gpt-j-6b",
            rotary="partial",
            rotary_layout="interleaved",
            module="transformer.rotary_emb",
            parallel=True,
            bridge_position_hooks=_BRIDGE_PROJECTIONS,
            bridge_prerotates=True,
            caveats="on the bridge, queries and keys are rotated by (source - position) at "
            "hook_q/hook_k, before the Hugging Face module rotates them by their position",
        ),
    )
}
"""The architecture table, one row per family: how position enters (learned absolute or
rotary; the rotary fraction and channel layout; per-layer bases; NoPE layers) and which hook
names carry it on each backend. Read it with :func:`architecture_of`; see the supported-families
page of the docs."""


def supported_families() -> str:
    """The table's families with their Hugging Face classes, for error messages:
    ``"gpt2 (GPT2LMHeadModel), gptneo (GPTNeoForCausalLM), ..."``."""
    return ", ".join(
        f"{spec.family} ({'/'.join(spec.hf_architectures)})" for spec in ARCHITECTURES.values()
    )


def find_architecture(hf_architecture: str | None) -> ArchitectureSpec | None:
    """The table row of a Hugging Face architecture name, or ``None`` when it has none."""
    for spec in ARCHITECTURES.values():
        if hf_architecture in spec.hf_architectures:
            return spec
    return None


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
    spec = find_architecture(hf_architecture)
    if spec is None:
        raise UnsupportedArchitectureError(
            f"architecture {hf_architecture!r} is not in homoglens' architecture table, so "
            "homoglens does not know where position enters it (profiles, sinks, massive "
            "activations work on it all the same); supported for "
            f"positional interventions: {supported_families()}. Open an issue to add a row."
        )
    return spec


def is_decoder_only(hf_architecture: str | None) -> bool:
    """Whether a Hugging Face architecture name is a causal (decoder-only) language model:
    ``...ForCausalLM`` or ``...LMHeadModel``, or a row of the table."""
    name = hf_architecture or ""
    return find_architecture(name) is not None or name.endswith(("ForCausalLM", "LMHeadModel"))


def hf_architecture_of(model: Any) -> str:
    """The Hugging Face architecture name of a TransformerLens model (either backend):
    ``cfg.original_architecture`` (HookedTransformer) or ``cfg.architecture`` (bridge).

    Raises:
        InvalidInputError: ``model`` is not a TransformerLens model.
    """
    if isinstance(model, (str, bytes)) or not hasattr(model, "cfg"):
        check_model(model)  # raises the one message for non-models
    cfg = getattr(model, "cfg")  # noqa: B009 - `model` is Any until check_model has run
    name = getattr(cfg, "original_architecture", None) or getattr(cfg, "architecture", None)
    return str(name) if name else "unknown"


def family_of(model: Any) -> str:
    """The family name of a model: its table row's ``family`` when the table knows it, its
    Hugging Face architecture name (e.g. ``"FalconForCausalLM"``) otherwise.

    Raises:
        InvalidInputError: ``model`` is not a TransformerLens model.
    """
    name = hf_architecture_of(model)
    spec = find_architecture(name)
    return spec.family if spec is not None else name


def architecture_of(model: Any) -> ArchitectureSpec:
    """Return the table row for a loaded TransformerLens model (either backend).

    Only the features that must know where position enters (positional ablations,
    ``component="positions"`` patching) need a row; everything that reads the residual stream
    or attention patterns works on any decoder-only model (see :func:`family_of`).

    Args:
        model: A ``HookedTransformer`` (reads ``cfg.original_architecture``) or a
            ``TransformerBridge`` (reads ``cfg.architecture``).

    Returns:
        The matching :class:`ArchitectureSpec`.

    Raises:
        InvalidInputError: ``model`` is not a TransformerLens model.
        UnsupportedArchitectureError: the model's architecture is not in the table (the
            message lists the supported ones).
    """
    return spec_for_hf_architecture(hf_architecture_of(model))


def resid_hook_name(layer: int) -> str:
    """TransformerLens hook name of entry ``layer`` of the ``n_layers + 1`` residual axis.

    Entry 0 is the input of block 0 (``blocks.0.hook_resid_pre``: token plus positional
    embeddings); entry l >= 1 is the output of block l - 1 (``blocks.{l-1}.hook_resid_post``).
    This is the Hugging Face ``output_hidden_states`` convention, without the final norm.
    """
    layer = as_int("layer", layer, low=0)
    return (
        component_hook_name(0, "resid_pre")
        if layer == 0
        else component_hook_name(layer - 1, "resid_post")
    )


def block_hook_name(layer: int, point: str) -> str:
    """TransformerLens hook name of ``point`` in block ``layer``: ``blocks.{layer}.{point}``
    (``point`` as TransformerLens spells it: ``"hook_resid_pre"``, ``"attn.hook_pattern"``,
    ``"ln2.hook_in"``); the one place homoglens builds a block's hook name."""
    return f"blocks.{as_int('layer', layer, low=0)}.{point}"


UNEMBED_IN = "unembed.hook_in"
"""The input of the unembedding ``[batch pos d_model]`` (after the final norm): the last hook
a pass that needs only the logits' input reaches."""


def pattern_hook_name(layer: int) -> str:
    """``blocks.{layer}.attn.hook_pattern``: the attention pattern ``[batch head_index
    query_pos key_pos]`` of block ``layer``."""
    return block_hook_name(layer, "attn.hook_pattern")


BLOCK_POINTS: dict[str, str] = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "head": "attn.hook_z",
    "z": "attn.hook_z",
    "pattern": "attn.hook_pattern",
}
"""The block hook point of each component that homoglens reads or writes (patching's
components, the residual sites of :func:`homoglens.run.interventions.residual_write_hooks`)."""

ATTENTION_SPEAKING_POINTS = ("hook_in", "hook_out")
"""Hook points of a bridge attention component that its delegating forward fires."""

ATTENTION_POSITION_POINTS = ("hook_cos", "hook_sin")
"""Hook points of a bridge attention component that carry the rotary tables."""


def component_hook_name(layer: int, component: str) -> str:
    """TransformerLens hook name of ``component`` (a key of :data:`BLOCK_POINTS`) in block
    ``layer``: ``component_hook_name(2, "attn_out") == "blocks.2.hook_attn_out"``."""
    return block_hook_name(layer, BLOCK_POINTS[component])


def z_hook_name(layer: int) -> str:
    """``blocks.{layer}.attn.hook_z``: each head's weighted values ``[batch pos head_index
    d_head]`` in block ``layer``, before the output projection."""
    return block_hook_name(layer, "attn.hook_z")
