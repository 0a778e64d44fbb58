"""Blocked dot products of each position's vector with the unit sums before it and in total.

For one sequence of vectors x_1..x_T with per-position scales (u_p = scale_p x_p, the unit
vectors of the counted positions) and weights, :func:`position_dots` gives S = sum_p u_p, the
weighted sum of the x_p, and for every p the dot products x_p . (sum of u_j over the earlier j),
x_p . S and x_p . sum_j weight_j x_j: the O(T d_model) reads of
:mod:`homoglens.profile.homogenization`'s statistics. The positions are cut into chunks of a few
dozen (:class:`Chunks`): the prefix term is the lower triangle of each chunk's Gram matrix plus a
dot with the sum of the earlier chunks, so no ``[pos pos]`` matrix of a whole sequence is ever held
and u_p is never materialised.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from jaxtyping import Float

__all__ = ["Chunks", "chunk_for", "position_dots"]


def chunk_for(n_pos: int, target: int = 32) -> int:
    """``target`` positions per chunk, or the divisor of ``n_pos`` nearest to it in
    target / 4 .. 2 target, so that the chunks tile the sequence exactly."""
    if n_pos % target == 0 or n_pos <= target:
        return target
    divisors = [c for c in range(max(2, target // 4), 2 * target + 1) if n_pos % c == 0]
    return min(divisors, key=lambda c: abs(c - target)) if divisors else target


_COLUMNS_UP_TO = 256
"""Sequences up to this long take the cross-chunk dot products as one matrix product against
every chunk's sum (fewer, larger products; the fastest on CPU at these lengths); longer ones dot
each chunk with the sum of the chunks before it (O(T d_model) work instead of O(T^2 / chunk))."""


class Chunks(NamedTuple):
    """``x`` ``[batch pos d_model]`` cut into chunks of positions: runs of equal chunks
    ``[batch n k d_model]`` in order (a whole-chunk run and / or one shorter tail chunk), with
    each chunk's Gram matrix ``[batch n k k]``."""

    x: torch.Tensor
    pieces: list[torch.Tensor]
    grams: list[torch.Tensor]

    @classmethod
    def of(cls, x: torch.Tensor, chunk: int) -> Chunks:
        """``x`` ``[batch pos d_model]`` cut into chunks of ``chunk`` positions."""
        batch, n_pos, d_model = x.shape
        full = n_pos // chunk * chunk
        pieces = []
        if full:
            pieces.append(x[:, :full].view(batch, full // chunk, chunk, d_model))
        if full < n_pos:
            pieces.append(x[:, None, full:])
        return cls(x, pieces, [xs @ xs.transpose(-1, -2) for xs in pieces])

    def norms(self) -> torch.Tensor:
        """``[batch pos]`` ||x_p||, from the Grams' diagonals."""
        parts = [g.diagonal(dim1=-2, dim2=-1).reshape(g.shape[0], -1) for g in self.grams]
        return (parts[0] if len(parts) == 1 else torch.cat(parts, 1)).sqrt()

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """``[batch pos]`` values as ``[batch n k]`` per piece."""
        out, start = [], 0
        for xs in self.pieces:
            n, k = xs.shape[1:3]
            out.append(values[:, start : start + n * k].view(-1, n, k))
            start += n * k
        return out


@functools.lru_cache(maxsize=32)
def _column_masks(
    n_pos: int, chunk: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """For :func:`position_dots` on ``n_pos`` positions in chunks of ``chunk``: ``[n_chunk
    pos]`` one-hot of each position's chunk, and ``[n_chunk + 1 pos 3]`` weights that turn the dot
    products of x_p with every chunk's unit sum and with sum_j x_j into x_p . (sum of the
    chunks before p's), x_p . S and x_p . sum_j x_j."""
    chunk_of = torch.arange(n_pos, device=device) // chunk
    n_chunk = int(chunk_of[-1]) + 1
    columns = torch.arange(n_chunk + 1, device=device)[:, None]  # [n_chunk + 1, 1]
    every = torch.ones(n_pos, dtype=torch.bool, device=device)
    weights = torch.stack(
        [columns < chunk_of, (columns < n_chunk) & every, (columns == n_chunk) & every], dim=-1
    )
    return (columns[:-1] == chunk_of).to(dtype), weights.to(dtype)


def position_dots(
    chunks: Chunks,
    scale: Float[torch.Tensor, "batch pos"],
    weight: Float[torch.Tensor, "batch pos"],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dot products of :func:`~homoglens.profile.homogenization.homogenization_sums`, from the
    chunks' Gram matrices and two more reads of ``x`` in matrix products, with u_p = scale_p *
    x_p never materialised.

    Returns:
        ``[batch 2 d_model]``: S = sum_p u_p and sum_p weight_p x_p; ``[batch pos]``: x_p .
        sum of u_j over the earlier j of p's chunk; ``[batch pos 3]``: x_p . (sum of u_j over
        the chunks before p's), x_p . S and x_p . sum_j weight_j x_j. So u_p . (sum_{j<p} u_j)
        = scale_p (within_p + proj_p0): the prefix term is the strictly lower triangle of each
        chunk's Gram matrix plus a dot with the sum of all earlier chunks, O(T * chunk *
        d_model) work in a few matrix products, several times faster on CPU than a cumulative
        sum over ``pos`` followed by a dot product.
    """
    pieces = chunks.pieces
    batch, n_pos = scale.shape
    scales, weights = chunks.split(scale), chunks.split(weight)
    within = [
        (g * sc[..., None, :]).tril_(-1).sum(-1).view(batch, -1)
        for g, sc in zip(chunks.grams, scales, strict=True)
    ]
    within_all = within[0] if len(within) == 1 else torch.cat(within, 1)
    if n_pos <= _COLUMNS_UP_TO:
        x = chunks.x
        onehot, combine = _column_masks(n_pos, pieces[0].shape[2], x.device, x.dtype)
        rows = torch.cat([scale[:, None] * onehot, weight[:, None]], 1)  # [batch n_chunk+1 pos]
        chunk_sums = rows @ x  # every chunk's unit sum, then sum_p weight_p x_p
        dots = chunk_sums @ x.transpose(1, 2)  # [batch n_chunk+1 pos]
        proj = (dots[..., None] * combine).sum(1)  # [batch pos 3]
        sums = torch.stack([chunk_sums[:, :-1].sum(1), chunk_sums[:, -1]], 1)
        return sums, within_all, proj
    # Per chunk: sum of its unit vectors and of its counted vectors -> [batch n_chunk 2 d_model]
    parts = [
        torch.stack([sc, wt], dim=-2) @ xs
        for xs, sc, wt in zip(pieces, scales, weights, strict=True)
    ]
    chunk_sums = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    sums = chunk_sums.sum(1)  # [batch 2 d_model]
    unit = chunk_sums[:, :, 0]  # [batch n_chunk d_model]
    earlier = torch.cumsum(unit, dim=1) - unit  # sum of the chunks before each
    totals = sums.transpose(1, 2)[:, None]  # [batch 1 d_model 2]
    proj, start = [], 0
    for xs in pieces:
        n = xs.shape[1]
        vectors = torch.cat(
            [earlier[:, start : start + n, :, None], totals.expand(-1, n, -1, -1)], dim=-1
        )  # [batch n d_model 3]
        proj.append((xs @ vectors).view(batch, -1, 3))
        start += n
    return sums, within_all, proj[0] if len(proj) == 1 else torch.cat(proj, 1)
