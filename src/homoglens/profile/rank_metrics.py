"""Pure math: rank metrics of each sequence's matrix of vectors, as mergeable sums.

The effective rank (Roy & Vetterli 2007) of X and of its unit rows, and the matrix entropy of
the unit rows (Giraldo et al. 2014; Skean et al. 2025, arXiv 2502.02013), with and without the
first token, from the singular values of one float64 Gram matrix per sequence; the
homogenization sums (:mod:`homoglens.profile.homogenization`) add them per hook point when asked
(``effective_rank=True``).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float

__all__ = [
    "RANK_FIELDS",
    "rank_sums",
    "raw_matrix_entropy",
]


RANK_FIELDS = (
    "effective_rank_sum",
    "unit_effective_rank_sum",
    "matrix_entropy_sum",
    "unit_effective_rank_no_first_sum",
    "matrix_entropy_no_first_sum",
)
"""Summed per-sequence rank metrics of :func:`rank_sums` (names of the profile's fields)."""


def _entropies(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(entropy of sigma / sum sigma) and entropy of sigma^2 / sum sigma^2 (nats), per row."""
    tiny = torch.finfo(sigma.dtype).tiny

    def entropy(p: torch.Tensor) -> torch.Tensor:
        p = p / p.sum(-1, keepdim=True).clamp_min(tiny)
        return -(torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))).sum(-1)

    return torch.exp(entropy(sigma)), entropy(sigma * sigma)


def _singular_values(
    x: Float[torch.Tensor, "batch pos d_model"], row_scales: tuple[torch.Tensor, ...]
) -> list[torch.Tensor]:
    """Singular values (float64, ascending) of ``diag(r) X`` for each ``[batch pos]`` row scale
    ``r``, from the eigenvalues of one float64 Gram matrix per sequence: ``X X^T`` scaled by
    ``r r^T`` when ``pos <= d_model``, else ``X^T diag(r^2) X``. A symmetric eigensolver on
    the smaller Gram is several times faster than an SVD of each matrix, and float64 keeps
    sigma = sqrt(lambda) accurate to ~1e-8 of the largest."""
    x64 = x.to(torch.float64)
    rows = [r.to(torch.float64) for r in row_scales]
    if x.shape[1] <= x.shape[2]:
        gram = x64 @ x64.transpose(1, 2)  # [batch pos pos]
        grams = [gram * (r[:, :, None] * r[:, None, :]) for r in rows]
    else:
        grams = [(x64 * (r * r)[..., None]).transpose(1, 2) @ x64 for r in rows]
    return [torch.linalg.eigvalsh(g).clamp_min(0.0).sqrt() for g in grams]


def rank_sums(
    x: Float[torch.Tensor, "batch pos d_model"],
    scale: Float[torch.Tensor, "batch pos"],
    weight: Float[torch.Tensor, "batch pos"],
    rest: Float[torch.Tensor, "batch pos"],
) -> dict[str, torch.Tensor]:
    """Rank metrics of each sequence's matrix of vectors, summed over sequences (float64).

    * ``effective_rank`` of X itself (rows weighted by their norms): exp of the entropy of the
      normalised singular values (Roy & Vetterli 2007); dominated by the largest rows, e.g. a
      first token with massive activations;
    * ``unit_effective_rank``: the same on unit rows U (every token counts equally);
    * ``matrix_entropy``: entropy (nats) of the eigenvalues of U U^T / tr, the matrix-based
      Renyi entropy of order 1 (Giraldo et al. 2014; Skean et al. 2025, arXiv 2502.02013), in
      [0, log min(T, d_model)];
    * ``*_no_first``: the unit-row metrics without position 0 (the BOS or first token).

    Args:
        x: ``[batch pos d_model]`` vectors.
        scale: ``[batch pos]`` 1/||x|| on counted tokens, 0 elsewhere.
        weight: ``[batch pos]`` 1 on counted tokens, 0 elsewhere.
        rest: ``[batch pos]`` 1 on counted tokens after position 0, 0 elsewhere.

    Returns:
        The fields of :data:`RANK_FIELDS`, each a float64 scalar.
    """
    raw, unit, rest_sigma = _singular_values(x, (weight, scale, scale * rest))
    erank_raw, _ = _entropies(raw)
    erank, entropy = _entropies(unit)
    erank_rest, entropy_rest = _entropies(rest_sigma)
    return {
        "effective_rank_sum": erank_raw.sum(),
        "unit_effective_rank_sum": erank.sum(),
        "matrix_entropy_sum": entropy.sum(),
        "unit_effective_rank_no_first_sum": erank_rest.sum(),
        "matrix_entropy_no_first_sum": entropy_rest.sum(),
    }


def raw_matrix_entropy(
    x: Float[torch.Tensor, "batch pos d_model"], weight: Float[torch.Tensor, "batch pos"]
) -> Float[torch.Tensor, " batch"]:
    """Normalised matrix entropy of each sequence's raw (uncentred, not unit-normalised) rows.

    The Shannon entropy of p_i = sigma_i^2 / sum_j sigma_j^2 (sigma: the singular values of the
    sequence's counted rows X, every row with its own norm, so that a token with a massive norm
    dominates the spectrum), divided by log of the rank bound min(T, d_model) (T: the counted
    rows): in [0, 1], 1 for a flat spectrum, 0 for rank one. The sigma_i^2 are the eigenvalues
    of the smaller of the two float64 second-moment matrices: X^T X ``[d_model d_model]``,
    or the Gram X X^T while pos <= d_model (so never larger than the former; an eigensolver on
    a ``[64 64]`` Gram is ~100x faster than on ``[576 576]``). Their spectrum is that of the
    Gram / tr, the matrix-based entropy of Skean et al. 2025 (arXiv 2502.02013) as
    Queipo-de-Llano et al. 2025 (arXiv 2510.06477) use it. Unlike the unit-row
    ``matrix_entropy`` of :func:`rank_sums` it keeps the rows' norms.

    Args:
        x: ``[batch pos d_model]`` vectors.
        weight: ``[batch pos]`` 1 on counted rows, 0 elsewhere (at least 2 counted per row).

    Returns:
        ``[batch]`` float64 entropies in [0, 1] (NaN for a sequence whose rows are all 0).
    """
    (sigma,) = _singular_values(x, (weight,))
    _, entropy = _entropies(sigma)
    total = (sigma * sigma).sum(-1)
    bound = torch.clamp(weight.to(torch.float64).sum(-1), max=float(x.shape[-1])).clamp_min(2.0)
    return torch.where(total > 0, entropy / torch.log(bound), torch.full_like(entropy, math.nan))
