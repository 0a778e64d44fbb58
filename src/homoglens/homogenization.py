"""Pure math: residual vectors + which positions count -> mergeable homogenization sums.

No forward passes here. For one sequence with T counted positions x_1..x_T (one hook point),
u_i = x_i / ||x_i|| (u_i = 0 when x_i = 0) and S = sum_i u_i:

* to_others[p]  = mean_{j != p} cos(x_p, x_j)        = (u_p . S - u_p . u_p) / (T - 1)
* to_prefix[p]  = mean_{j < p}  cos(x_p, x_j)        = u_p . (sum_{j<p} u_j) / #{j < p}
  (computed chunk by chunk with matrix products, see ``_position_dots``)
* to_mean[p]    = cos(x_p, mean_i x_i)               (Ethayarajh 2019, IntraSim)
* mean_pairwise = mean_{i != j} cos(x_i, x_j)        = (||S||^2 - sum_i u_i . u_i) / (T(T - 1))
* relative_residual = ||X - 1 xbar^T||_F / ||X||_F  (Dong et al. 2021, token uniformity)
* effective_rank = exp(-sum_i p_i log p_i), p_i = sigma_i / sum_j sigma_j (Roy & Vetterli 2007),
  also on unit rows, with the matrix entropy of the unit rows (see ``rank_sums``)

Everything is O(T d) per sequence except the effective rank (an SVD). Per-position values are
returned as sums over sequences with counts, per-sequence values as sums over sequences, and the
anisotropy baseline as the summed unit vector G and sum ||S||^2, so that any split of a corpus
adds up to the same result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from jaxtyping import Float, Int

from homoglens.errors import InvalidInputError, NonFiniteActivationError

__all__ = [
    "homogenization_sums",
    "EntryTerms",
    "entry_terms",
    "stack_terms",
    "sums_of_terms",
    "positions_from_mask",
    "SUM_FIELDS",
    "scalar_metric_weights",
    "token_to_others",
    "edge_totals",
    "RANK_FIELDS",
    "rank_sums",
    "nan_div",
    "massive_sums",
]

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


_SAFE_MAGNITUDE = (2.0**-20, 2.0**20)
"""Largest counted entries inside this range need no rescaling: their squares, and sums of
T * d_model of them, stay far from float32's under- and overflow."""


def unit_scale(
    x: Float[torch.Tensor, "batch pos d_model"],
    counted: torch.Tensor,
    largest: Float[torch.Tensor, "batch pos"] | None = None,
) -> tuple[Float[torch.Tensor, "batch pos d_model"], Int[torch.Tensor, " batch"]]:
    """Rescale each sequence by a power of two so that its largest counted entry lies in
    [0.5, 1): exact (no rounding), so cosines and norm ratios are bit-identical, while squares
    no longer overflow (float32 entries above ~1.8e19) or underflow (below ~1e-19). When every
    sequence's largest entry already lies in a safe range (2**-20 to 2**20), ``x`` is returned
    as it is with exponents 0, which gives the same values bit for bit without a copy (scaling
    by a power of two commutes with rounding; only entries in float32's subnormal range, below
    ~1e-38, could round differently, far below any cosine's precision).

    Args:
        x: ``[batch pos d_model]`` vectors.
        counted: ``[batch pos]`` bool, the vectors that count.
        largest: ``[batch pos]`` max |entry| of each vector, if already known.

    Returns:
        The rescaled ``x`` and the ``[batch]`` exponents e with ``x_original = x * 2**e``.
    """
    if largest is None:
        largest = x.abs().amax(-1)
    amax = largest.masked_fill(~counted, 0.0).amax(1)
    low, high = _SAFE_MAGNITUDE
    if bool(((amax >= low) & (amax <= high)).all()):
        return x, torch.zeros(amax.shape, dtype=torch.int32, device=x.device)
    exponent = torch.where(
        amax > 0, torch.frexp(amax).exponent, torch.zeros_like(amax, dtype=torch.int32)
    )
    return torch.ldexp(x, (-exponent)[:, None, None].to(x.dtype)), exponent


class EntryTerms(NamedTuple):
    """The O(T d_model) part of :func:`homogenization_sums` for one hook point: everything that
    reads the vectors themselves. The rest (:func:`sums_of_terms`) is arithmetic on ``[batch
    pos]`` values, done once for a stack of entries (a profile stacks every layer of a batch, so
    its few hundred small tensor operations run once per batch instead of once per layer).

    Fields with a ``work`` dtype are float32 (float64 if the vectors are); a stack of entries
    carries a leading ``layer`` axis on every field.
    """

    norms: Float[torch.Tensor, "batch pos"]
    """||x_p|| in units of 2**exponent (work dtype)."""
    exponent: Int[torch.Tensor, " batch"]
    """Each sequence's power-of-two rescaling (see :func:`unit_scale`)."""
    scale: Float[torch.Tensor, "batch pos"]
    """1 / ||x_p|| on counted nonzero vectors, 0 elsewhere (so u_p = scale_p x_p)."""
    s: Float[torch.Tensor, "batch d_model"]
    """S = sum_p u_p (work dtype)."""
    u_dot_s: Float[torch.Tensor, "batch pos"]
    x_dot_xbar: Float[torch.Tensor, "batch pos"]
    u_dot_prefix: Float[torch.Tensor, "batch pos"]
    xsum_norm: Float[torch.Tensor, " batch"]
    """||sum_p x_p|| (float64)."""
    total_sq: Float[torch.Tensor, " batch"]
    """sum_p ||x_p||^2 (float64)."""
    centred_sq: Float[torch.Tensor, " batch"]
    """||X - 1 xbar^T||_F^2 (float64)."""
    rank: dict[str, torch.Tensor]
    """The fields of :data:`RANK_FIELDS` (float64 sums over sequences), if asked for."""

    def to(self, device: torch.device) -> EntryTerms:
        """The same terms on ``device``."""
        tensors = {f: getattr(self, f).to(device) for f in self._fields if f != "rank"}
        return EntryTerms(**tensors, rank={k: v.to(device) for k, v in self.rank.items()})


def stack_terms(entries: Sequence[EntryTerms]) -> EntryTerms:
    """Entries of one batch (same device) stacked on a leading ``layer`` axis."""
    names = [f for f in EntryTerms._fields if f != "rank"]
    tensors = {f: torch.stack([getattr(e, f) for e in entries]) for f in names}
    rank = {k: torch.stack([e.rank[k] for e in entries]) for k in entries[0].rank}
    return EntryTerms(**tensors, rank=rank)


def _counted_tokens(inc: torch.Tensor) -> torch.Tensor:
    """``[batch]`` counted tokens per sequence (float64); refuses a sequence with fewer than 2."""
    t = inc.sum(1).to(torch.float64)
    if bool((t < 2).any()):
        raise InvalidInputError(
            "homogenization needs at least 2 counted tokens per sequence; sequence(s) "
            f"{torch.nonzero(t < 2).flatten().tolist()} have fewer (pads and an excluded first "
            "token do not count)"
        )
    return t


def entry_terms(
    resid: Float[torch.Tensor, "batch pos d_model"],
    pos_index: Int[torch.Tensor, "batch pos"],
    *,
    effective_rank: bool = False,
) -> EntryTerms:
    """The vector-reading part of :func:`homogenization_sums` for one hook point (same
    arguments); :func:`sums_of_terms` of a stack of these gives the sums.

    Raises:
        InvalidInputError: a sequence has fewer than 2 counted tokens, or shapes disagree.
        NonFiniteActivationError: a counted vector holds NaN or inf.
    """
    if resid.ndim != 3 or tuple(pos_index.shape) != tuple(resid.shape[:2]):
        raise InvalidInputError(
            f"resid {tuple(resid.shape)} must be [batch pos d_model] and pos_index "
            f"{tuple(pos_index.shape)} must be its [batch pos]"
        )
    f64 = torch.float64
    work = f64 if resid.dtype == f64 else torch.float32
    x = resid.detach().to(work)
    inc = pos_index >= 0
    w = inc.to(work)
    t = _counted_tokens(inc)
    # Usually one norm per vector is all the checking needed: when every norm is finite and
    # each sequence's largest counted norm lies in [2**-20 sqrt(d_model), 2**20], every vector
    # is finite and each sequence's largest entry lies in unit_scale's safe range, so x needs
    # no rescaling (the general path below would give the same values, bit for bit).
    norms = torch.linalg.vector_norm(x, dim=-1)  # [batch pos]
    top = norms.masked_fill(~inc, 0.0).amax(1)
    low, high = _SAFE_MAGNITUDE
    fast = torch.isfinite(norms).all() & (top >= low * math.sqrt(x.shape[-1])).all()
    if bool(fast & (top <= high).all()):
        exponent = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    else:
        # Two reductions give each vector's largest |entry| and its finiteness (NaN and inf
        # propagate through amax / amin), with no full-size temporary.
        largest = torch.maximum(x.amax(-1), -x.amin(-1))  # [batch pos]
        finite = torch.isfinite(largest)
        if not bool(finite[inc].all()):
            bad = int((~finite[inc]).sum())
            raise NonFiniteActivationError(
                f"{bad} counted residual vectors hold NaN or inf; nothing was averaged in. "
                "Check the model dtype (float16 overflows) or the weights"
            )
        if not bool(finite.all()):  # NaN/inf on pads only: keep them out
            x = x.masked_fill(~inc[..., None], 0.0)
        x, exponent = unit_scale(x, inc, largest.masked_fill(~finite, 0.0))
        norms = torch.linalg.vector_norm(x, dim=-1)  # in units of 2**exponent
    nonzero = inc & (norms > 0)
    # The dot products below are taken on x itself (the unit vectors u = x / ||x|| are never
    # materialised): |x_i . x_j| <= ||x_i|| ||x_j||, finite wherever the norms (checked above) are.
    scale = torch.where(  # u_p = scale_p * x_p; 0 for zero vectors and uncounted tokens
        nonzero,
        1.0 / torch.where(nonzero, norms, torch.ones_like(norms)),
        torch.zeros_like(norms),
    )
    s, xsum, u_dot_s, x_dot_xbar, u_dot_prefix = _position_dots(x, scale, w, t.to(work))
    xsum_norm = torch.linalg.vector_norm(xsum.to(f64), dim=-1)
    # ||X - 1 xbar^T||_F^2 = sum_p ||x_p||^2 - ||sum_p x_p||^2 / T; where that difference is
    # small against sum_p ||x_p||^2 (nearly constant rows) it loses digits, so those sequences
    # take the direct sum of ||x_p - xbar||^2.
    total_sq = ((norms.to(f64) ** 2) * inc).sum(1)
    centred_sq = total_sq - xsum_norm**2 / t
    near_constant = centred_sq < 1e-2 * total_sq
    if bool(near_constant.any()):
        rows = torch.nonzero(near_constant).flatten()
        xbar = (xsum[rows] / t[rows, None].to(work))[:, None, :]
        direct = torch.linalg.vector_norm(x[rows] - xbar, dim=-1).to(f64) ** 2
        centred_sq[rows] = (direct * inc[rows]).sum(1)
    rank = rank_sums(x, scale, w, (pos_index >= 1).to(work)) if effective_rank else {}
    return EntryTerms(
        norms,
        exponent,
        scale,
        s,
        u_dot_s,
        x_dot_xbar,
        u_dot_prefix,
        xsum_norm,
        total_sq,
        centred_sq,
        rank,
    )


def sums_of_terms(
    terms: EntryTerms,
    pos_index: Int[torch.Tensor, "batch pos"],
    n_pos: int,
    *,
    per_sequence: bool = False,
) -> dict[str, torch.Tensor]:
    """The sums of :func:`homogenization_sums` from a stack of :func:`entry_terms` of one
    batch (every field with a leading ``layer`` axis, on ``pos_index``'s device).

    Returns:
        The fields of :func:`homogenization_sums`, each layer-dependent one with a leading
        ``layer`` axis; ``count``, ``prefix_count``, ``n_sequences``, ``n_tokens`` and
        ``n_tokens_sq`` without (they do not depend on the layer).
    """
    f64 = torch.float64
    inc = pos_index >= 0
    t = _counted_tokens(inc)  # [batch]
    uu = (terms.scale != 0).to(f64)  # u . u, exactly: 1 on counted nonzero vectors
    to_others = (terms.u_dot_s.to(f64) - uu) / (t - 1)[:, None]

    incf = inc.to(f64)
    n_before = torch.cumsum(incf, dim=1) - incf
    has_prefix = inc & (n_before > 0)
    to_prefix = terms.u_dot_prefix.to(f64) / n_before.clamp_min(1)

    xsum_norm = terms.xsum_norm
    safe = torch.where(xsum_norm > 0, xsum_norm, torch.ones_like(xsum_norm))
    to_mean = (terms.scale * terms.x_dot_xbar).to(f64) * (t / safe)[..., None]  # cos(x_p, xbar)

    s64 = terms.s.to(f64)
    s_sq = (s64 * s64).sum(-1)  # [layer batch]
    mean_pairwise = (s_sq - uu.sum(-1)) / (t * (t - 1))
    total_sq = terms.total_sq
    relative_residual = (
        terms.centred_sq.clamp_min(0).sqrt()
        / torch.where(total_sq > 0, total_sq, torch.ones_like(total_sq)).sqrt()
    )

    # Per-position sums: tokens that are not counted go to a spare last bin, then dropped.
    bins = torch.where(inc, pos_index, torch.full_like(pos_index, n_pos)).flatten()
    n_layer = terms.norms.shape[0]

    def per_pos(values: torch.Tensor) -> torch.Tensor:
        rows = values.to(f64).reshape(-1, bins.numel())
        out = torch.zeros(rows.shape[0], n_pos + 1, dtype=f64, device=bins.device)
        return out.index_add_(1, bins, rows)[:, :n_pos].reshape(*values.shape[:-2], n_pos)

    norms = torch.ldexp(terms.norms.to(f64), terms.exponent[..., None].to(f64))
    prefix_w = has_prefix.to(f64)
    layer_pos = per_pos(
        torch.stack([to_others * incf, to_prefix * prefix_w, to_mean * incf, norms * incf]).reshape(
            4 * n_layer, *incf.shape
        )
    )
    layer_pos = layer_pos.reshape(4, n_layer, n_pos)
    counts = per_pos(torch.stack([incf, prefix_w]))
    out = {
        "to_others_sum": layer_pos[0],
        "to_prefix_sum": layer_pos[1],
        "to_mean_sum": layer_pos[2],
        "norm_sum": layer_pos[3],
        "count": counts[0],
        "prefix_count": counts[1],
        "mean_pairwise_sum": mean_pairwise.sum(-1),
        "relative_residual_sum": relative_residual.sum(-1),
        "unit_sum": s64.sum(-2),
        "unit_sum_sq": s_sq.sum(-1),
        "n_sequences": torch.tensor(float(inc.shape[0]), dtype=f64),
        "n_tokens": t.sum(),
        "n_tokens_sq": (t * t).sum(),
        **terms.rank,
    }
    if per_sequence:
        nan = torch.full_like(to_others, float("nan"))
        out["seq_to_others"] = torch.where(inc, to_others, nan)[..., :n_pos]
        out["seq_mean_pairwise"] = mean_pairwise
    return out


_LAYER_INDEPENDENT = ("count", "prefix_count", "n_sequences", "n_tokens", "n_tokens_sq")


def homogenization_sums(
    resid: Float[torch.Tensor, "batch pos d_model"],
    pos_index: Int[torch.Tensor, "batch pos"],
    n_pos: int,
    *,
    effective_rank: bool = False,
    per_sequence: bool = False,
) -> dict[str, torch.Tensor]:
    """Reduce one batch at one hook point to mergeable homogenization sums.

    Elementwise work over ``[batch pos d_model]`` runs in float32 (float64 if ``resid`` is
    float64); every reduction that is summed across batches is returned in float64. (The same
    as :func:`entry_terms` then :func:`sums_of_terms`, for one entry.)

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
        NonFiniteActivationError: a counted vector holds NaN or inf.
    """
    terms = entry_terms(resid, pos_index, effective_rank=effective_rank)
    sums = sums_of_terms(
        stack_terms([terms]), pos_index.to(resid.device), n_pos, per_sequence=per_sequence
    )
    return {k: v if k in _LAYER_INDEPENDENT else v[0] for k, v in sums.items()}


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


def _chunk_for(n_pos: int) -> int:
    """32 positions per chunk (the fastest on CPU from T = 128 to 1024), or the divisor of
    ``n_pos`` nearest to it in 8..64, so that the chunks tile the sequence exactly."""
    if n_pos % 32 == 0 or n_pos <= 32:
        return 32
    divisors = [c for c in range(8, 65) if n_pos % c == 0]
    return min(divisors, key=lambda c: abs(c - 32)) if divisors else 32


def _position_dots(
    x: Float[torch.Tensor, "batch pos d_model"],
    scale: Float[torch.Tensor, "batch pos"],
    weight: Float[torch.Tensor, "batch pos"],
    n_tokens: Float[torch.Tensor, " batch"],
    chunk: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """The dot products of :func:`homogenization_sums`, from three reads of ``x`` in matrix
    products over chunks of ``chunk`` positions, with u_p = scale_p * x_p never materialised.

    Returns:
        ``S = sum_p u_p`` and ``sum_p weight_p x_p`` ``[batch d_model]``; ``u_p . S``,
        ``x_p . xbar`` (xbar = that sum / ``n_tokens``) and ``u_p . (sum_{j<p} u_j)``
        ``[batch pos]``. Per chunk, the prefix term is the strictly lower triangle of the
        chunk's Gram matrix plus a dot with the sum of all earlier chunks: O(T * chunk * d_model)
        work in a few matrix products, several times faster on CPU than a cumulative sum over
        ``pos`` followed by a dot product. The chunk length divides ``pos`` where it can (a
        split-off remainder makes the matrix products copy ``x``); else the positions beyond the
        last whole chunk form one more, shorter chunk.
    """
    batch, n_pos, d_model = x.shape
    chunk = chunk or _chunk_for(n_pos)
    full = n_pos // chunk * chunk
    # (x [batch n k d_model], scale and weight [batch n k]) per run of equal chunks, in order
    pieces = []
    if full:
        pieces.append(
            (
                x[:, :full].view(batch, full // chunk, chunk, d_model),
                scale[:, :full].view(batch, -1, chunk),
                weight[:, :full].view(batch, -1, chunk),
            )
        )
    if full < n_pos:
        pieces.append((x[:, None, full:], scale[:, None, full:], weight[:, None, full:]))
    # Per chunk: sum of its unit vectors and of its counted vectors -> [batch n_chunk 2 d_model]
    parts = [torch.stack([sc, wt], dim=-2) @ xs for xs, sc, wt in pieces]
    chunk_sums = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    s, xsum = chunk_sums.sum(1).unbind(1)
    unit = chunk_sums[:, :, 0]  # [batch n_chunk d_model]
    earlier = torch.cumsum(unit, dim=1) - unit  # sum of the chunks before each
    xbar = xsum / n_tokens[:, None]
    u_dot_s, x_dot_xbar, prefix, start = [], [], [], 0
    for xs, sc, _ in pieces:
        n = xs.shape[1]
        gram = xs @ xs.transpose(-1, -2)  # [batch n k k]
        within = (gram * sc[..., None, :]).tril_(-1).sum(-1) * sc  # earlier tokens of the chunk
        vectors = torch.stack(
            [
                earlier[:, start : start + n],
                s[:, None].expand(-1, n, -1),
                xbar[:, None].expand(-1, n, -1),
            ],
            dim=-1,
        )  # [batch n d_model 3]
        proj = xs @ vectors  # [batch n k 3]
        prefix.append((within + sc * proj[..., 0]).reshape(batch, -1))
        u_dot_s.append((sc * proj[..., 1]).reshape(batch, -1))
        x_dot_xbar.append(proj[..., 2].reshape(batch, -1))
        start += n
    if len(pieces) == 1:
        return s, xsum, u_dot_s[0], x_dot_xbar[0], prefix[0]
    return s, xsum, torch.cat(u_dot_s, 1), torch.cat(x_dot_xbar, 1), torch.cat(prefix, 1)


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
    p = torch.arange(n_pos)[None, :]
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
    return torch.tensor([n, edge_k * n, middle, edge_k * n], dtype=torch.float64)


def nan_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``, NaN elsewhere (a mean over nothing is undefined)."""
    out = num / torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, out, torch.full_like(out, math.nan))


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
    from homoglens.validate import require_finite

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
