"""Massive activations (Sun et al. 2024, arXiv 2402.17762): per token, the largest
``|x_d|`` of the residual stream over the median ``|x_d|``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Int

from homoglens.architectures import resid_hook_name
from homoglens.data import DataInput, TokenBatch, to_token_batch
from homoglens.engine import Sums, model_device, provenance_of, stream
from homoglens.homogenization import nan_div
from homoglens.models import model_info
from homoglens.results.sinks import MassiveActivations
from homoglens.types import BosPolicy, HookedModel, HookFn
from homoglens.validate import as_float, positive_int, require_finite


def massive_activations(
    model: HookedModel,
    data: DataInput,
    *,
    threshold: float = 100.0,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> MassiveActivations:
    """Find massive activations: per layer and token, max_d |x| / median_d |x|.

    Streamed over the residual axis of :func:`homogenization_profile` (0 = embeddings,
    l = output of block l - 1); pads never count.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        threshold: Ratio above which a token's largest entry counts in ``dim_counts`` (> 1).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show a progress bar.

    Returns:
        :class:`MassiveActivations`.

    Raises:
        InvalidInputError: ``threshold`` <= 1 or bad data.

    References:
        Sun et al. 2024, arXiv 2402.17762.
    """
    threshold = as_float("threshold", threshold, low=1.0, high=float("inf"))
    batch_size = positive_int("batch_size", batch_size)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    red, finish = massive_reducer(model, batch, threshold)
    stream(
        model, batch, [red], batch_size=batch_size, desc="massive activations", progress=progress
    )
    return finish()


def massive_reducer(
    model: HookedModel, batch: TokenBatch, threshold: float
) -> tuple[Sums, Callable[[], MassiveActivations]]:
    """The reducer of :func:`massive_activations` (checked arguments) and the function that
    finishes it once the batches are streamed; to share a pass with other reducers."""
    info = model_info(model)
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    layers = tuple(range(n_layers + 1))
    device = model_device(model)
    n_pos = int(batch.lengths.max())
    f64 = {"dtype": torch.float64, "device": device}
    red = Sums(
        sums={
            "ratio_sum": torch.zeros(len(layers), n_pos, **f64),
            "top_sum": torch.zeros(len(layers), n_pos, **f64),
            "dim_counts": torch.zeros(len(layers), d_model, **f64),
            "count": torch.zeros(n_pos, **f64),
        },
        maxima={"ratio_max": torch.full((len(layers), n_pos), float("-inf"), **f64)},
    )
    acc, ratio_max = red.sums, red.maxima["ratio_max"]

    def make_hook(i: int) -> HookFn:
        def hook(resid: torch.Tensor, hook: Any) -> None:
            a = resid.detach().abs().float()
            real = red.batch["mask"].bool()[:, : a.shape[1]]
            require_finite(a[real], hook.name, "residual-stream entries")
            top, arg = a.max(-1)
            median = a.median(-1).values
            ratio = (top / median.clamp_min(torch.finfo(torch.float32).tiny)).to(torch.float64)
            width = a.shape[1]
            acc["ratio_sum"][i, :width] += (ratio * real).sum(0)
            acc["top_sum"][i, :width] += (top.to(torch.float64) * real).sum(0)
            col_max = torch.where(real, ratio, torch.full_like(ratio, float("-inf"))).max(0).values
            ratio_max[i, :width] = torch.maximum(ratio_max[i, :width], col_max)
            big = real & (ratio > threshold)
            acc["dim_counts"][i].index_add_(0, arg[big], torch.ones(int(big.sum()), **f64))
            if i == 0:
                acc["count"][:width] += real.to(torch.float64).sum(0)

        return hook

    red.add_hooks([(resid_hook_name(layer), make_hook(i)) for i, layer in enumerate(layers)])
    return red, functools.partial(_finish_massive, red, info, batch, layers, threshold)


def _finish_massive(
    red: Sums, info: Any, batch: TokenBatch, layers: tuple[int, ...], threshold: float
) -> MassiveActivations:
    acc, ratio_max = red.sums, red.maxima["ratio_max"]
    count = acc["count"]
    ratio_max = torch.where(count > 0, ratio_max, torch.full_like(ratio_max, float("nan")))
    return MassiveActivations(
        layers=layers,
        ratio_mean=nan_div(acc["ratio_sum"], count).cpu(),
        ratio_max=ratio_max.cpu(),
        top_value=nan_div(acc["top_sum"], count).cpu(),
        dim_counts=acc["dim_counts"].cpu(),
        threshold=float(threshold),
        n_sequences=len(batch),
        provenance=provenance_of(info, batch, layers, False),
    )
