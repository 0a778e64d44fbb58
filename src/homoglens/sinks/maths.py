"""Pure math of the attention-sink and massive-activation measurements; no forward passes here.

* :func:`scalar_metric_weights`, :func:`edge_totals` and :func:`token_to_others`: the scalar
  homogenization metrics (``mean_pairwise``, ``first_excess``, ``last_excess``) as a weighted sum
  of every token's differentiable ``to_others``, so that a sink's attribution to them
  (:mod:`homoglens.sinks.attribution`, :mod:`homoglens.patching.measure`) adds up over batches;
* :func:`massive_sums`: mergeable sums of the massive activations of one batch at one hook point
  (Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int

__all__ = [
    "edge_totals",
    "massive_sums",
    "scalar_metric_weights",
    "token_to_others",
]


def scalar_metric_weights(
    lengths: Int[torch.Tensor, " batch"], n_pos: int, key: int, edge_k: int, totals: torch.Tensor
) -> Float[torch.Tensor, "metric batch pos"]:
    """Per-token weights W_m of the scalar metrics (``mean_pairwise``, ``first_excess``,
    ``last_excess``; see :data:`homoglens.sinks.ATTRIBUTION_METRICS`): over a corpus,
    metric_m = sum over every token of W_m * to_others (float64), so it adds up over batches.

    Args:
        lengths: ``[batch]`` real tokens per (right-aligned) sequence.
        n_pos: Width of the position axis.
        key: Tokens at or before ``key`` are left out of the edge groups.
        edge_k: Tokens per edge.
        totals: Corpus counts (sequences, first-edge tokens, middle tokens, last-edge tokens),
            from :func:`edge_totals`.

    Returns:
        ``[metric batch pos]`` weights.
    """
    p = torch.arange(n_pos, device="cpu")[None, :]
    t = lengths.cpu()[:, None]
    real = p < t
    first = (p > key) & (p <= key + edge_k)
    last = real & (p >= t - edge_k)
    middle = real & (p > key + edge_k) & (p < t - edge_k)
    # An empty group (no tokens) has zero weights; clamp its count so nothing divides by 0.
    n_seq, n_first, n_middle, n_last = (max(float(x), 1.0) for x in totals.tolist())
    f64 = torch.float64
    mid = middle.to(f64) / n_middle
    return torch.stack(
        [
            real.to(f64) / (t.to(f64) * n_seq),
            first.to(f64) / n_first - mid,
            last.to(f64) / n_last - mid,
        ]
    )


def token_to_others(
    resid: Float[torch.Tensor, "batch pos d_model"], mask: Int[torch.Tensor, "batch pos"]
) -> Float[torch.Tensor, "batch pos"]:
    """Differentiable ``to_others`` of every real token (float64; 0 at pads and zero vectors),
    the formula of :func:`homogenization_sums` (docs/metrics.md: (u_p . S - 1) / (T - 1)).

    Args:
        resid: ``[batch pos d_model]`` residual vectors (right-aligned rows).
        mask: ``[batch pos]`` 1 on real tokens.

    Returns:
        ``[batch pos]`` cosines in [-1, 1].
    """
    x = resid.double()
    w = mask.to(x.dtype)
    norm = x.norm(dim=-1)
    nonzero = (norm > 0) & (w > 0)
    u = x / torch.where(nonzero, norm, torch.ones_like(norm))[..., None] * nonzero[..., None]
    s = u.sum(1, keepdim=True)
    t = w.sum(1, keepdim=True)
    return ((u * s).sum(-1) - nonzero.to(x.dtype)) / (t - 1) * w


def edge_totals(lengths: Int[torch.Tensor, " batch"], key: int, edge_k: int) -> torch.Tensor:
    """(sequences, first-edge tokens, middle tokens, last-edge tokens) of a corpus, for
    :func:`scalar_metric_weights`; every length must be at least ``key + 2 * edge_k + 2``."""
    n = len(lengths)
    middle = float((lengths - key - 1 - 2 * edge_k).sum())
    return torch.tensor([n, edge_k * n, middle, edge_k * n], dtype=torch.float64, device="cpu")


def massive_sums(
    resid: Float[torch.Tensor, "batch pos d_model"],
    attention_mask: Int[torch.Tensor, "batch pos"],
    *,
    threshold: float,
    median: str = "token",
    min_magnitude: float = 0.0,
    top_k: int = 3,
    where: str = "residual stream",
) -> dict[str, torch.Tensor]:
    """Mergeable massive-activation sums of one batch at one hook point (Sun et al. 2024,
    arXiv 2402.17762): per real token, ratio = max_d |x_d| / m, m the token's median_d |x_d|
    (``median="token"``) or the median |x| over all real tokens and dimensions of its sequence
    (``median="layer"``, ``torch.median``: the lower middle value).

    Args:
        resid: ``[batch pos d_model]`` vectors, real tokens first in each row (right padding).
        attention_mask: ``[batch pos]`` 0/1, at least as wide as ``resid``.
        threshold: Ratio above which a token's largest dimension counts in ``dim_counts``.
        median: ``"token"`` or ``"layer"``.
        min_magnitude: Smallest max |x| (model units) that counts in ``dim_counts``.
        top_k: How many of each sequence's largest |x| enter ``layer_top_sum``.
        where: The hook point, for the error message.

    Returns:
        Float64 sums over the batch: ``ratio_sum``, ``top_sum`` (max |x|), ``count`` (real
        tokens) and ``ratio_max`` (``-inf`` where no real token), each ``[pos]``;
        ``dim_counts [d_model]``; ``layer_top_sum [top_k]`` and ``layer_median_sum [1]`` (sums
        over sequences of their top |x| and median |x|); ``n_seq [1]``.

    Raises:
        NonFiniteActivationError: NaN/inf at a real token.
    """
    from homoglens.core.validate import require_finite

    a = resid.detach().abs().float()
    real = attention_mask.bool()[:, : a.shape[1]]
    require_finite(a[real], where, "residual-stream entries")
    f64 = {"dtype": torch.float64, "device": a.device}
    top, arg = a.max(-1)
    per_seq = [a[b][real[b]].flatten() for b in range(a.shape[0])]
    seq_median = torch.stack([values.median() for values in per_seq])
    med = a.median(-1).values if median == "token" else seq_median[:, None].expand_as(top)
    ratio = (top / med.clamp_min(torch.finfo(torch.float32).tiny)).to(torch.float64)
    zero = torch.zeros_like(ratio)
    big = real & (ratio > threshold) & (top > min_magnitude)
    dim_counts = torch.zeros(a.shape[-1], **f64)
    dim_counts.index_add_(0, arg[big], torch.ones(int(big.sum()), **f64))
    layer_top = torch.zeros(top_k, **f64)
    for values in per_seq:
        k = min(top_k, int(values.numel()))
        layer_top[:k] += values.topk(k).values.to(torch.float64)
    return {
        "ratio_sum": torch.where(real, ratio, zero).sum(0),
        "top_sum": torch.where(real, top.to(torch.float64), zero).sum(0),
        "ratio_max": torch.where(real, ratio, torch.full_like(ratio, -math.inf)).max(0).values,
        "count": real.to(torch.float64).sum(0),
        "dim_counts": dim_counts,
        "layer_top_sum": layer_top,
        "layer_median_sum": seq_median.to(torch.float64).sum().reshape(1),
        "n_seq": torch.full((1,), float(a.shape[0]), **f64),
    }
