"""Residual-stream activations you already have: the entries of the residual axis read from a
TransformerLens ``ActivationCache`` (or a plain dict of its hook names), for the ``from_cache``
constructors of the result classes (no second forward pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.validate import check_attention_mask, check_layers
from homoglens.models.architectures import family_of, resid_hook_name
from homoglens.models.assets import package_version
from homoglens.results.provenance import Provenance

__all__ = ["CachedResiduals", "cached_residuals"]


@dataclass(frozen=True)
class CachedResiduals:
    """The residual stream at some entries of the residual axis, read from a cache.

    Attributes:
        layers: Entries of the ``n_layers + 1`` residual axis held (0 = ``blocks.0.hook_resid_pre``,
            l = ``blocks.{l-1}.hook_resid_post``).
        resid: One ``[batch pos d_model]`` tensor per entry, real tokens first in every row
            (right padding, as the streamed model path sees them), detached.
        attention_mask: ``[batch pos]`` int64 0/1, right padding, on the activations' device.
        provenance: Model name (when the cache knows its model), backend, hook points, data.
    """

    layers: tuple[int, ...]
    resid: tuple[Float[torch.Tensor, "batch pos d_model"], ...]
    attention_mask: Int[torch.Tensor, "batch pos"]
    provenance: Provenance


def _backend_of(model: Any) -> str:
    names = {cls.__name__ for cls in type(model).__mro__}
    if "HookedTransformer" in names:
        return "hooked"
    if "TransformerBridge" in names:
        return "bridge"
    return "none"


def _entries(cache: Any, n_layers: int | None) -> list[int]:
    """The residual-axis entries whose hook point the cache holds, in order."""
    top = n_layers if n_layers is not None else len(list(cache.keys()))
    return [layer for layer in range(top + 1) if resid_hook_name(layer) in cache]


def cached_residuals(
    cache: Any,
    layers: list[int] | tuple[int, ...] | int | None = None,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    *,
    exclude_first: bool = False,
) -> CachedResiduals:
    """Read the residual stream at ``layers`` from a TransformerLens ``ActivationCache``.

    Entry 0 is ``blocks.0.hook_resid_pre``, entry l >= 1 ``blocks.{l-1}.hook_resid_post``, the
    hook points the streamed measurements read (on ``HookedTransformer`` and on
    ``TransformerBridge``, whose caches hold these names too). Rows are moved so that real
    tokens come first (right padding); ``[pos d_model]`` tensors (a cache made with
    ``remove_batch_dim=True``) are one sequence.

    Args:
        cache: An ``ActivationCache`` from ``model.run_with_cache(tokens)``, or a dict from hook
            names to ``[batch pos d_model]`` tensors.
        layers: Entries to read; default: every entry the cache holds.
        attention_mask: ``[batch pos]`` 0/1 mask of the tokens the cache was made from (left
            or right padding); default: every token real.
        exclude_first: Recorded in the provenance.

    Returns:
        The :class:`CachedResiduals`.

    Raises:
        InvalidInputError: not a cache, a hook point missing (the message names it and the
            fix), tensors that are not float ``[batch pos d_model]`` of one shape, a bad mask.
    """
    if not (isinstance(cache, Mapping) or hasattr(cache, "keys")) or not hasattr(
        cache, "__getitem__"
    ):
        raise InvalidInputError(
            f"cache is a {type(cache).__name__}; give the ActivationCache of "
            "model.run_with_cache(tokens), or a dict of hook names to activations"
        )
    model = getattr(cache, "model", None)
    cfg = getattr(model, "cfg", None)
    n_layers = int(cfg.n_layers) if cfg is not None else None
    present = _entries(cache, n_layers)
    if layers is None:
        if not present:
            raise InvalidInputError(
                "the cache holds no residual-stream hook point (blocks.0.hook_resid_pre, "
                "blocks.{l}.hook_resid_post); run model.run_with_cache(tokens) without a "
                "names_filter, or with one that keeps them"
            )
        chosen = tuple(present)
    else:
        chosen = check_layers(layers, n_layers if n_layers is not None else max(present, default=0))
        missing = [resid_hook_name(layer) for layer in chosen if layer not in present]
        if missing:
            raise InvalidInputError(
                f"the cache has no {missing[:4]}; run model.run_with_cache(tokens) without a "
                "names_filter, or with one that keeps these hook points, or pick layers among "
                f"{present}"
            )
    tensors = []
    for layer in chosen:
        name = resid_hook_name(layer)
        x = cache[name]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim not in (2, 3):
            raise InvalidInputError(
                f"cache[{name!r}] must be a float [batch pos d_model] tensor, got "
                f"{getattr(x, 'shape', type(x).__name__)}"
            )
        x = x.detach()
        tensors.append(x[None] if x.ndim == 2 else x)
    shapes = {tuple(x.shape) for x in tensors}
    if len(shapes) != 1:
        raise InvalidInputError(f"the cached hook points have different shapes {sorted(shapes)}")
    n_batch, width, _ = tensors[0].shape
    if n_batch == 0 or width == 0:
        raise InvalidInputError(f"the cached activations {tuple(tensors[0].shape)} are empty")
    mask = check_attention_mask(
        torch.zeros(n_batch, width, dtype=torch.long, device="cpu"), attention_mask
    )
    device = tensors[0].device
    mask = mask.to(device)
    lengths, starts = mask.sum(1), mask.argmax(1)
    if bool((lengths < width).any()):  # move every row's real tokens to its start
        pos = torch.arange(width, device=device)
        index = (starts[:, None] + pos).clamp(max=width - 1)
        tensors = [x.gather(1, index[..., None].expand_as(x)) for x in tensors]
        mask = (pos < lengths[:, None]).to(torch.long)
    model_name = str(getattr(cfg, "model_name", "") or "none") if cfg is not None else "none"
    provenance = Provenance(
        model=model_name,
        family=family_of(model) if model is not None else "none",
        backend=_backend_of(model) if model is not None else "none",
        dtype=str(tensors[0].dtype).removeprefix("torch."),
        hook_points=tuple(resid_hook_name(layer) for layer in chosen),
        data=f"given activations: {type(cache).__name__} of {n_batch} sequences x {width} "
        "positions (no forward pass)",
        exclude_first=exclude_first,
        homoglens_version=package_version("homoglens"),
        transformer_lens_version=package_version("transformer-lens") if model is not None else "",
    )
    return CachedResiduals(chosen, tuple(tensors), mask, provenance)
