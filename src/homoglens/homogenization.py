"""Pure math: residual vectors + which positions count -> mergeable homogenization sums.

No forward passes here. For one sequence with T counted positions x_1..x_T (one hook point),
u_i = x_i / ||x_i|| (u_i = 0 when x_i = 0) and S = sum_i u_i:

* to_others[p]  = mean_{j != p} cos(x_p, x_j)        = (u_p . S - u_p . u_p) / (T - 1)
* to_prefix[p]  = mean_{j < p}  cos(x_p, x_j)        = u_p . (sum_{j<p} u_j) / #{j < p}
* to_mean[p]    = cos(x_p, mean_i x_i)               (Ethayarajh 2019, IntraSim)
* mean_pairwise = mean_{i != j} cos(x_i, x_j)        = (||S||^2 - sum_i u_i . u_i) / (T(T - 1))
* relative_residual = ||X - 1 xbar^T||_F / ||X||_F  (Dong et al. 2021, token uniformity)
* effective_rank = exp(-sum_i p_i log p_i), p_i = sigma_i / sum_j sigma_j (Roy & Vetterli 2007)

Everything is O(T d) per sequence except the effective rank (an SVD). Per-position values are
returned as sums over sequences with counts, per-sequence values as sums over sequences, and the
anisotropy baseline as the summed unit vector G and sum ||S||^2, so that any split of a corpus
adds up to the same result.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int

from homoglens.errors import InvalidInputError

__all__ = ["homogenization_sums", "positions_from_mask", "SUM_FIELDS"]

SUM_FIELDS = ("to_others_sum", "to_prefix_sum", "to_mean_sum", "norm_sum")


def positions_from_mask(
    attention_mask: Int[torch.Tensor, "batch pos"], *, exclude_first: bool = False
) -> Int[torch.Tensor, "batch pos"]:
    """Position of each token counted from its sequence's first real token; -1 where excluded.

    Args:
        attention_mask: ``[batch pos]`` 0/1, real tokens contiguous in each row (any padding side).
        exclude_first: Also mark position 0 (the first real token, often a BOS) with -1.

    Returns:
        ``[batch pos]`` int64: 0, 1, 2, ... on counted tokens, -1 on pads (and position 0 if
        ``exclude_first``).
    """
    mask = attention_mask.to(torch.long)
    pos = torch.cumsum(mask, dim=1) - 1
    keep = mask.bool() & ((pos >= 1) if exclude_first else torch.ones_like(mask, dtype=torch.bool))
    return torch.where(keep, pos, torch.full_like(pos, -1))


def homogenization_sums(
    resid: Float[torch.Tensor, "batch pos d_model"],
    pos_index: Int[torch.Tensor, "batch pos"],
    n_pos: int,
    *,
    effective_rank: bool = False,
    per_sequence: bool = False,
) -> dict[str, torch.Tensor]:
    """Reduce one batch at one hook point to mergeable homogenization sums (float64).

    Args:
        resid: ``[batch pos d_model]`` residual vectors, any float dtype.
        pos_index: ``[batch pos]`` from :func:`positions_from_mask`: the position of each counted
            token, -1 for tokens that enter no statistic (pads, an excluded first token).
        n_pos: Length of the position axis of the returned per-position sums (> max position).
        effective_rank: Also sum each sequence's effective rank (one SVD per sequence).
        per_sequence: Also return ``seq_to_others`` ``[batch pos]`` (NaN where not counted;
            columns are positions, so rows must be right-aligned) and ``seq_mean_pairwise``
            ``[batch]``, for paired statistics over sequences.

    Returns:
        Dict of float64 tensors on ``resid``'s device:
        ``to_others_sum, to_prefix_sum, to_mean_sum, norm_sum`` ``[pos]`` (sums over sequences),
        ``count, prefix_count`` ``[pos]`` (how many sequences contributed; to_prefix needs an
        earlier counted token), ``mean_pairwise_sum, relative_residual_sum,
        effective_rank_sum`` ``[]`` (sums of per-sequence values), ``unit_sum`` ``[d_model]``
        (G = sum over sequences of S), ``unit_sum_sq`` ``[]`` (sum over sequences of ||S||^2),
        ``n_sequences, n_tokens, n_tokens_sq`` ``[]`` (sequences, counted tokens, sum T^2).

    Raises:
        InvalidInputError: a sequence has fewer than 2 counted tokens, or shapes disagree.
    """
    if resid.ndim != 3 or tuple(pos_index.shape) != tuple(resid.shape[:2]):
        raise InvalidInputError(
            f"resid {tuple(resid.shape)} must be [batch pos d_model] and pos_index "
            f"{tuple(pos_index.shape)} must be its [batch pos]"
        )
    x = resid.detach().to(torch.float64)
    inc = pos_index >= 0
    w = inc.to(torch.float64)
    t = w.sum(1)  # [batch] counted tokens per sequence
    if bool((t < 2).any()):
        raise InvalidInputError(
            "homogenization needs at least 2 counted tokens per sequence; sequence(s) "
            f"{torch.nonzero(t < 2).flatten().tolist()} have fewer (pads and an excluded first "
            "token do not count)"
        )
    norms = torch.linalg.vector_norm(x, dim=-1)  # [batch pos]
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    u = x / safe[..., None] * w[..., None]  # zero vectors and excluded tokens -> 0
    uu = (u * u).sum(-1)  # 1 on counted nonzero vectors
    s = u.sum(1)  # [batch d_model]
    to_others = (torch.einsum("bpd,bd->bp", u, s) - uu) / (t - 1)[:, None]

    before = torch.cumsum(u, dim=1) - u
    n_before = torch.cumsum(w, dim=1) - w
    has_prefix = inc & (n_before > 0)
    to_prefix = torch.einsum("bpd,bpd->bp", u, before) / n_before.clamp_min(1)

    xbar = (x * w[..., None]).sum(1) / t[:, None]  # [batch d_model]
    xbar_norm = torch.linalg.vector_norm(xbar, dim=-1)
    to_mean = (
        torch.einsum("bpd,bd->bp", u, xbar)
        / torch.where(xbar_norm > 0, xbar_norm, torch.ones_like(xbar_norm))[:, None]
    )

    mean_pairwise = ((s * s).sum(-1) - uu.sum(1)) / (t * (t - 1))
    centred = (x - xbar[:, None, :]) * w[..., None]
    num = torch.linalg.vector_norm(centred.flatten(1), dim=-1)
    den = torch.linalg.vector_norm((x * w[..., None]).flatten(1), dim=-1)
    relative_residual = num / torch.where(den > 0, den, torch.ones_like(den))

    idx = pos_index[inc]

    def per_pos(values: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
        sel = inc if where is None else where
        out = torch.zeros(n_pos, dtype=torch.float64, device=x.device)
        return out.index_add_(0, pos_index[sel], values[sel].to(torch.float64))

    ones = torch.ones_like(idx, dtype=torch.float64)
    out = {
        "to_others_sum": per_pos(to_others),
        "to_prefix_sum": per_pos(to_prefix, has_prefix),
        "to_mean_sum": per_pos(to_mean),
        "norm_sum": per_pos(norms),
        "count": torch.zeros(n_pos, dtype=torch.float64, device=x.device).index_add_(0, idx, ones),
        "prefix_count": per_pos(torch.ones_like(w), has_prefix),
        "mean_pairwise_sum": mean_pairwise.sum(),
        "relative_residual_sum": relative_residual.sum(),
        "unit_sum": s.sum(0),
        "unit_sum_sq": (s * s).sum(),
        "n_sequences": torch.tensor(float(x.shape[0]), dtype=torch.float64),
        "n_tokens": t.sum(),
        "n_tokens_sq": (t * t).sum(),
    }
    if per_sequence:
        nan = torch.full_like(to_others, float("nan"))
        out["seq_to_others"] = torch.where(inc, to_others, nan)[:, :n_pos]
        out["seq_mean_pairwise"] = mean_pairwise
    if effective_rank:
        sigma = torch.linalg.svdvals(x * w[..., None])  # zero rows add no singular value
        p = sigma / sigma.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        entropy = -(torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))).sum(-1)
        out["effective_rank_sum"] = torch.exp(entropy).sum()
    return out
