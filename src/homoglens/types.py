"""Shared type aliases, option literals and the model protocol homoglens talks to.

The dimension names follow TransformerLens exactly: ``batch pos d_model layer head_index
query_pos key_pos d_head d_vocab``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int

__all__ = [
    "Backend",
    "BosPolicy",
    "WeightsKind",
    "Tokens",
    "AttentionMask",
    "Residual",
    "HookFn",
    "FwdHooks",
    "HookedModel",
    "SimilaritySpace",
    "Centring",
    "GroupBy",
    "Verdict",
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

Centring: TypeAlias = Literal["global", "position"]
"""Corpus centring before cosines: one mean per layer (without position 0 and massive tokens),
or one mean per position and layer."""

GroupBy: TypeAlias = Literal["variant"]
"""How :func:`~homoglens.compare_models` groups labels: by the positional variant recorded in
``training.json`` (labels of one variant are training seeds of one model)."""

Verdict: TypeAlias = Literal["holds", "equivalent", "fails", "inconclusive"]
"""Outcome of a directional test with a smallest effect size of interest."""

Tokens: TypeAlias = Int[torch.Tensor, "batch pos"]
AttentionMask: TypeAlias = Int[torch.Tensor, "batch pos"] | Bool[torch.Tensor, "batch pos"]
Residual: TypeAlias = Float[torch.Tensor, "batch pos d_model"]

HookFn: TypeAlias = Callable[..., Any]
"""A TransformerLens forward hook: ``(activation, hook) -> activation | None``."""

FwdHooks: TypeAlias = list[tuple[str, HookFn]]


@runtime_checkable
class HookedModel(Protocol):
    """The small surface homoglens uses; ``HookedTransformer`` and ``TransformerBridge`` both
    provide it."""

    cfg: Any
    tokenizer: Any

    def hooks(
        self, fwd_hooks: Sequence[tuple[str, HookFn]] = ..., *args: Any, **kwargs: Any
    ) -> AbstractContextManager[Any]: ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    def run_with_cache(self, *args: Any, **kwargs: Any) -> Any: ...

    def to_tokens(self, *args: Any, **kwargs: Any) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...
