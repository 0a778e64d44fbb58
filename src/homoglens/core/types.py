"""Shared type aliases, option literals and the model protocol homoglens talks to.

The dimension names follow TransformerLens exactly: ``batch pos d_model layer head_index
query_pos key_pos d_head d_vocab``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
    get_args,
    runtime_checkable,
)

import torch
from jaxtyping import Bool, Float, Int

if TYPE_CHECKING:  # the model objects a measurement also takes (for static checkers only)
    from nnsight import LanguageModel
    from transformers import PreTrainedModel

__all__ = [
    "ATTENTION_BIAS_KINDS",
    "ATTRIBUTION_METRICS",
    "CENTRES",
    "MASSIVE_ABLATIONS",
    "MASSIVE_MEDIANS",
    "PATCH_COMPONENTS",
    "PATCH_METRICS",
    "PERTURBATIONS",
    "PLOT_BACKENDS",
    "POSITION_ABLATIONS",
    "RESIDUAL_SITES",
    "SPACES",
    "AttentionBiasKind",
    "AttentionMask",
    "AttributionMethod",
    "AttributionMetric",
    "Backend",
    "BosPolicy",
    "Centring",
    "FwdHooks",
    "GroupBy",
    "HeadAblation",
    "HookFn",
    "HookSpec",
    "HookedModel",
    "MassiveAblation",
    "MassiveMedian",
    "ModelInput",
    "PatchComponent",
    "PatchDirection",
    "PatchMetric",
    "Perturbation",
    "PlotBackend",
    "PositionAblation",
    "Residual",
    "ResidualSite",
    "SimilaritySpace",
    "Tokens",
    "Verdict",
    "WeightsKind",
    "signature_of",
]

Backend: TypeAlias = Literal["auto", "hooked", "bridge"]
"""Which TransformerLens class wraps a model: ``HookedTransformer``, ``TransformerBridge``,
or ``"auto"`` (HookedTransformer where the installed TransformerLens has it, else the bridge)."""

BosPolicy: TypeAlias = Literal["auto", "always", "never"]
"""Whether text gets a BOS token at position 0: ``"auto"`` follows the model's own default
(``model.cfg.default_prepend_bos``, what ``model.to_tokens`` does)."""

WeightsKind: TypeAlias = Literal["raw", "processed", "unknown"]
"""Raw checkpoint weights, or TransformerLens-processed (LayerNorm folded, writing weights
centred), or not known (a model homoglens did not load)."""

SimilaritySpace: TypeAlias = Literal["resid", "ln_input", "final_norm"]
"""Where :func:`~homoglens.positional_similarity` reads vectors: the residual stream, what the
next normalisation makes of it without its affine weights, or the last entry after the final
norm (Hugging Face's last ``hidden_states``)."""

SPACES: tuple[SimilaritySpace, ...] = get_args(SimilaritySpace)

Centring: TypeAlias = Literal["global", "position"]
"""Corpus centring before cosines: one mean per layer (without position 0 and massive tokens),
or one mean per position and layer."""

CENTRES: tuple[Centring | None, ...] = (None, *get_args(Centring))

GroupBy: TypeAlias = Literal["variant"]
"""How :func:`~homoglens.compare_models` groups labels: by the positional variant recorded in
``training.json`` (labels of one variant are training seeds of one model)."""

Verdict: TypeAlias = Literal[
    "holds",
    "holds, possibly negligible",
    "equivalent",
    "fails",
    "fails, possibly negligible",
    "inconclusive",
]
"""Outcome of a directional test with a smallest effect size of interest (SESOI). A
significant effect whose interval reaches inside the SESOI is "..., possibly negligible": it
differs from 0, but it may be smaller than what matters (:func:`homoglens.core.stats.verdict`)."""

PositionAblation: TypeAlias = Literal["none", "zero", "permute", "shift", "mean"]
"""How to change the positional signal: ``"none"`` (unchanged), ``"zero"`` (no positional
signal: a zero embedding, or no rotation = every token at index 0), ``"permute"`` (token i gets
the signal of ``perm[i]``), ``"shift"`` (token i gets the signal of i + shift), ``"mean"``
(learned absolute only: every token gets the mean positional embedding)."""

POSITION_ABLATIONS: tuple[PositionAblation, ...] = get_args(PositionAblation)
"""Every positional ablation mode, in the order studies run them (see :data:`PositionAblation`;
``"mean"`` exists for learned absolute positions only)."""

AttentionBiasKind: TypeAlias = Literal["first", "self", "recent", "alibi", "middle", "temperature"]
"""Where an attention-bias intervention pushes attention (query q, key k <= q): ``"first"``
phi = 1[k < first_k]; ``"self"`` 1[k = q]; ``"recent"`` 1[q - window < k <= q]; ``"alibi"``
-(q - k); ``"middle"`` (specificity control) 1[q/4 <= k <= 3q/4]; ``"temperature"``: no phi,
the scores are scaled by beta = strength."""

ATTENTION_BIAS_KINDS: tuple[AttentionBiasKind, ...] = get_args(AttentionBiasKind)
"""Every attention-bias kind (see :data:`AttentionBiasKind`)."""

ResidualSite: TypeAlias = Literal["resid_pre", "resid_mid", "resid_post"]
"""A point of a block's residual stream: before the block, between attention and MLP (not in
parallel blocks such as GPT-NeoX's), after the block."""

RESIDUAL_SITES: tuple[ResidualSite, ...] = get_args(ResidualSite)

PatchComponent: TypeAlias = Literal[
    "resid_pre", "resid_mid", "attn_out", "mlp_out", "head", "positions"
]
"""What a patching cell patches: ``blocks.{l}.hook_resid_pre`` / ``hook_resid_mid`` (not on
GPT-NeoX, whose attention and MLP run in parallel) / ``hook_attn_out`` / ``hook_mlp_out`` at a
bin of positions; ``head``: one head's ``blocks.{l}.attn.hook_z`` at every position;
``positions``: the positional signal of one block (rotary) or of the embedding (learned)."""

PATCH_COMPONENTS: tuple[PatchComponent, ...] = get_args(PatchComponent)

PatchMetric: TypeAlias = Literal["mean_pairwise", "first_excess", "last_excess", "loss"]
"""A built-in patching metric: homogenization statistics at the measured residual entry, or
the mean next-token cross-entropy (nats)."""

PATCH_METRICS: tuple[PatchMetric, ...] = get_args(PatchMetric)

PatchDirection: TypeAlias = Literal["restore", "break"]
"""``"restore"``: the position-ablated run receives one activation of the normal run;
``"break"``: the normal run receives one activation of the ablated run."""

AttributionMetric: TypeAlias = Literal["mean_pairwise", "first_excess", "last_excess"]
"""Scalar homogenization metrics that :func:`~homoglens.sink_attribution` attributes to heads."""

ATTRIBUTION_METRICS: tuple[AttributionMetric, ...] = get_args(AttributionMetric)

AttributionMethod: TypeAlias = Literal["exact", "fast"]
"""Exact reruns with the heads ablated, or first-order attribution patching."""

HeadAblation: TypeAlias = Literal["sink", "mean"]
"""How a head is removed: its attention to the sink key moved to the other keys, or its output
``hook_z`` replaced by its corpus mean."""

MassiveMedian: TypeAlias = Literal["token", "layer"]
"""The denominator of a massive-activation ratio: ``"token"`` the median |x_d| over the token's
own d_model entries; ``"layer"`` the median |x| over every real token and dimension of the
sequence at that layer (Sun et al. 2024's definition)."""

MASSIVE_MEDIANS: tuple[MassiveMedian, ...] = get_args(MassiveMedian)

Perturbation: TypeAlias = Literal["replace", "noise"]
"""How one token is perturbed (Barbero et al. 2025): its id replaced by another, or Gaussian
noise added to its block-0 input."""

PERTURBATIONS: tuple[Perturbation, ...] = get_args(Perturbation)

MassiveAblation: TypeAlias = Literal["zero", "mean"]
"""How massive activations are set: to 0 (Sun et al.'s ``set_zero``) or to their mean over a
reference corpus (``set_mean``)."""

MASSIVE_ABLATIONS: tuple[MassiveAblation, ...] = get_args(MassiveAblation)

PlotBackend: TypeAlias = Literal["matplotlib", "plotly"]
"""What a result's ``plot()`` draws with: a matplotlib ``Figure`` (static; the default, for
files and papers) or a ``plotly.graph_objects.Figure`` (interactive: hover values, zoom, legend
toggles; needs the ``plotly`` extra)."""

PLOT_BACKENDS: tuple[PlotBackend, ...] = get_args(PlotBackend)

Tokens: TypeAlias = Int[torch.Tensor, "batch pos"]
AttentionMask: TypeAlias = Int[torch.Tensor, "batch pos"] | Bool[torch.Tensor, "batch pos"]
Residual: TypeAlias = Float[torch.Tensor, "batch pos d_model"]

HookFn: TypeAlias = Callable[..., Any]
"""A TransformerLens forward hook: ``(activation, hook) -> activation | None``."""

HookSpec: TypeAlias = tuple[str, HookFn]
"""One forward hook as TransformerLens' ``fwd_hooks`` takes it: ``(hook name, hook function)``."""

FwdHooks: TypeAlias = list[HookSpec]


@runtime_checkable
class HookedModel(Protocol):
    """The surface homoglens uses; ``HookedTransformer`` and ``TransformerBridge`` both
    provide it. Both are ``torch.nn.Module`` s with TransformerLens' hook points; the
    architecture-specific parts (``blocks``, ``W_pos``, ``ln_final``, the bridge's
    ``original_model``) are reached through :mod:`homoglens.models.architectures`' table and typed
    ``Any`` here (``__getattr__``)."""

    cfg: Any
    tokenizer: Any
    hook_dict: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        """Any other module attribute (``blocks``, ``ln_final``, ...)."""
        ...

    def named_modules(self) -> Iterator[tuple[str, torch.nn.Module]]:
        """The model's submodules (``torch.nn.Module.named_modules``)."""
        ...

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The model's parameters by name (``torch.nn.Module.named_parameters``)."""
        ...

    def hooks(
        self, fwd_hooks: Sequence[tuple[str, HookFn]] = ..., *args: Any, **kwargs: Any
    ) -> AbstractContextManager[Any]:
        """Attach ``fwd_hooks`` for the ``with`` block (TransformerLens' level-scoped hooks)."""
        ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any:
        """Run a forward pass with hooks attached for it only."""
        ...

    def run_with_cache(self, *args: Any, **kwargs: Any) -> Any:
        """Run a forward pass and return its output and an ``ActivationCache``."""
        ...

    def to_tokens(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Tokenize text as the model does (BOS by ``cfg.default_prepend_bos``)."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        """The model's parameters (``torch.nn.Module.parameters``)."""
        ...


ModelInput: TypeAlias = "HookedModel | PreTrainedModel | LanguageModel"
"""What a public measurement takes as ``model``: a TransformerLens model (``HookedTransformer``
or ``TransformerBridge``), a ``transformers`` decoder-only causal LM or an nnsight
``LanguageModel`` (both wrapped by :func:`homoglens.models.objects.as_hooked` without copying
weights). A type for static checkers only (the entry points check the object themselves)."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def signature_of(
    source: Callable[_P, Any],
) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """Give a forwarding function ``source``'s keyword parameters (for type checkers,
    ``help()`` and notebooks' ``?``): one typed list of options and defaults, not two copies.

    The function keeps the parameters it names itself (and their annotations) and its return
    type; its ``*args`` / ``**kwargs`` are replaced by ``source``'s remaining parameters.
    """

    def apply(func: Callable[..., _R]) -> Callable[_P, _R]:
        own = inspect.signature(func)
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        named = [p for p in own.parameters.values() if p.kind not in variadic]
        rest = [
            p
            for name, p in inspect.signature(source).parameters.items()
            if name not in own.parameters
        ]
        func.__dict__["__signature__"] = own.replace(parameters=named + rest)
        return func

    return apply
