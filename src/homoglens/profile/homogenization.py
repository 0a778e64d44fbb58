"""Pure math: residual vectors + which positions count -> mergeable homogenization sums.

No forward passes here. For one sequence with T counted positions x_1..x_T (one hook point),
u_i = x_i / ||x_i|| (u_i = 0 when x_i = 0) and S = sum_i u_i:

* to_others[p]  = mean_{j != p} cos(x_p, x_j)        = (u_p . S - u_p . u_p) / (T - 1)
* to_prefix[p]  = mean_{j < p}  cos(x_p, x_j)        = u_p . (sum_{j<p} u_j) / #{j < p}
  (computed chunk by chunk with matrix products, see :mod:`homoglens.profile.position_dots`)
* to_mean[p]    = cos(x_p, mean_i x_i)               (Ethayarajh 2019, IntraSim)
* mean_pairwise = mean_{i != j} cos(x_i, x_j)        = (||S||^2 - sum_i u_i . u_i) / (T(T - 1))
* relative_residual = ||X - 1 xbar^T||_F / ||X||_F  (Dong et al. 2021, token uniformity)
* effective_rank = exp(-sum_i p_i log p_i), p_i = sigma_i / sum_j sigma_j (Roy & Vetterli 2007),
  also on unit rows, with the matrix entropy of the unit rows
  (:mod:`homoglens.profile.rank_metrics`)

Everything is O(T d) per sequence except the effective rank (an SVD). Per-position values are
returned as sums over sequences with counts, per-sequence values as sums over sequences, and the
anisotropy baseline as the summed unit vector G and sum ||S||^2, so that any split of a corpus
adds up to the same result.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError, NonFiniteActivationError
from homoglens.profile.position_dots import Chunks, chunk_for, position_dots
from homoglens.profile.rank_metrics import rank_sums

__all__ = [
    "SUM_FIELDS",
    "CountedTokens",
    "EntryTerms",
    "check_terms",
    "counted_tokens",
    "entry_terms",
    "homogenization_sums",
    "nan_div",
    "positions_from_mask",
    "prepare_entry",
    "prepared_terms",
    "split_terms",
    "stack_terms",
    "sums_of_terms",
    "unsynced",
    "work_dtype",
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
    reads the vectors themselves, as raw products of the vectors with the few per-sequence
    vectors of the statistics. The rest (:func:`sums_of_terms`) is arithmetic on ``[batch pos]``
    values, done once for a stack of entries (a profile stacks every layer of a batch, so its
    small tensor operations run once per batch instead of once per layer; in the hook only a
    few dozen run, most of them the reads of the vectors).

    Fields with a ``work`` dtype are float32 (float64 if the vectors are); a stack of entries
    carries a leading ``layer`` axis on every field.
    """

    norms: Float[torch.Tensor, "batch pos"]
    """||x_p|| in units of 2**exponent (work dtype); scale_p = 1 / ||x_p|| on counted nonzero
    vectors, 0 elsewhere, is recomputed from it bit for bit (u_p = scale_p x_p)."""
    exponent: Int[torch.Tensor, " batch"] | None
    """Each sequence's power-of-two rescaling (see :func:`unit_scale`); None: all 0."""
    sums: Float[torch.Tensor, "batch 2 d_model"]
    """S = sum_p u_p and the sum of the counted x_p (work dtype)."""
    within: Float[torch.Tensor, "batch pos"]
    """x_p . sum of scale_j x_j over the earlier counted j of p's chunk (see position_dots)."""
    proj: Float[torch.Tensor, "batch pos 3"]
    """x_p . (sum of u_j over the chunks before p's), x_p . S and x_p . sum_j x_j."""
    centred_sq: Float[torch.Tensor, " batch"] | None
    """||X - 1 xbar^T||_F^2 (float64) summed directly, for sequences whose rows are nearly
    constant (NaN on the others, which take sum ||x_p||^2 - ||sum x_p||^2 / T); None: none."""
    rank: dict[str, torch.Tensor]
    """The fields of :data:`~homoglens.profile.rank_metrics.RANK_FIELDS` (float64 sums over
    sequences), if asked for."""
    bad: torch.Tensor | None = None
    """On a device read without host synchronisation: a ``[]`` bool, whether a counted vector
    held NaN or inf (:func:`check_terms` raises once per batch); None: already checked."""

    def to(self, device: torch.device) -> EntryTerms:
        """The same terms on ``device``."""
        if self.norms.device == device:
            return self
        exponent, centred = self.exponent, self.centred_sq
        return EntryTerms(
            self.norms.to(device),
            None if exponent is None else exponent.to(device),
            self.sums.to(device),
            self.within.to(device),
            self.proj.to(device),
            None if centred is None else centred.to(device),
            {k: v.to(device) for k, v in self.rank.items()},
            None if self.bad is None else self.bad.to(device),
        )


def stack_terms(entries: Sequence[EntryTerms]) -> EntryTerms:
    """Entries of one batch (same device) stacked on a leading ``layer`` axis (their ``bad``
    flags checked first by the caller, :func:`check_terms`)."""

    def stack(field: str, fill: float | int) -> torch.Tensor | None:
        values = [getattr(e, field) for e in entries]
        if all(v is None for v in values):
            return None
        like = next(v for v in values if v is not None)
        return torch.stack([torch.full_like(like, fill) if v is None else v for v in values])

    rank = {k: torch.stack([e.rank[k] for e in entries]) for k in entries[0].rank}
    return EntryTerms(
        torch.stack([e.norms for e in entries]),
        stack("exponent", 0),
        torch.stack([e.sums for e in entries]),
        torch.stack([e.within for e in entries]),
        torch.stack([e.proj for e in entries]),
        stack("centred_sq", float("nan")),
        rank,
    )


def check_terms(entries: Sequence[EntryTerms], names: Sequence[str] | None = None) -> None:
    """Raise for the first entry whose counted vectors held NaN or inf (one host
    synchronisation for all entries read without one).

    Raises:
        NonFiniteActivationError: names the entry (``names[i]``, else its index).
    """
    flags = [(i, e.bad) for i, e in enumerate(entries) if e.bad is not None]
    if not flags:
        return
    found = torch.stack([flag.to(flags[0][1].device) for _, flag in flags])
    if bool(found.any()):
        i = flags[int(found.long().argmax())][0]
        where = names[i] if names is not None else f"entry {i}"
        raise NonFiniteActivationError(
            f"{where}: counted residual vectors hold NaN or inf; nothing was averaged in. Check "
            "the model dtype (float16 overflows) or the weights"
        )


class CountedTokens(NamedTuple):
    """What :func:`entry_terms` needs to know of a batch's counted tokens, computed once per
    batch (and device / dtype) from its ``pos_index``."""

    weight: Float[torch.Tensor, "batch pos"]
    """1 on counted tokens, 0 elsewhere (work dtype)."""
    n_tokens: Float[torch.Tensor, " batch"]
    """Counted tokens per sequence (work dtype)."""
    rest: Float[torch.Tensor, "batch pos"]
    """1 on counted tokens after position 0 (work dtype; for the rank metrics)."""


def counted_tokens(
    pos_index: Int[torch.Tensor, "batch pos"], dtype: torch.dtype, device: torch.device
) -> CountedTokens:
    """The :class:`CountedTokens` of ``pos_index`` in ``dtype`` on ``device``.

    Raises:
        InvalidInputError: a sequence has fewer than 2 counted tokens.
    """
    pos_index = pos_index.to(device)
    inc = pos_index >= 0
    weight = inc.to(dtype)
    return CountedTokens(weight, _counted_tokens(inc).to(dtype), (pos_index >= 1).to(dtype))


def _counted_tokens(inc: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """``[batch]`` counted tokens per sequence (float64); refuses a sequence with fewer than 2
    (``check``: off where :func:`counted_tokens` checked the batch already)."""
    t = inc.sum(1).to(torch.float64)
    if check and bool((t < 2).any()):
        raise InvalidInputError(
            "homogenization needs at least 2 counted tokens per sequence; sequence(s) "
            f"{torch.nonzero(t < 2).flatten().tolist()} have fewer (pads and an excluded first "
            "token do not count)"
        )
    return t


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the vectors are read in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def entry_terms(
    resid: Float[torch.Tensor, "batch pos d_model"],
    pos_index: Int[torch.Tensor, "batch pos"],
    *,
    effective_rank: bool = False,
    counted: CountedTokens | None = None,
) -> EntryTerms:
    """The vector-reading part of :func:`homogenization_sums` for one hook point (same
    arguments); :func:`sums_of_terms` of a stack of these gives the sums.

    Args:
        resid: ``[batch pos d_model]`` residual vectors, any float dtype.
        pos_index: ``[batch pos]`` from :func:`positions_from_mask`.
        effective_rank: Also sum each sequence's rank metrics.
        counted: ``counted_tokens(pos_index, work dtype, resid.device)``, if already at hand
            (a profile computes it once per batch, not once per layer).

    Raises:
        InvalidInputError: a sequence has fewer than 2 counted tokens, or shapes disagree.
        NonFiniteActivationError: a counted vector holds NaN or inf.
    """
    if resid.ndim != 3 or tuple(pos_index.shape) != tuple(resid.shape[:2]):
        raise InvalidInputError(
            f"resid {tuple(resid.shape)} must be [batch pos d_model] and pos_index "
            f"{tuple(pos_index.shape)} must be its [batch pos]"
        )
    work = work_dtype(resid.dtype)
    if counted is None:
        counted = counted_tokens(pos_index, work, resid.device)
    w, t = counted.weight, counted.n_tokens
    if unsynced(resid.device):
        scaled, exponent, bad = prepare_entry(resid, w)
        return prepared_terms(scaled, exponent, bad, counted, effective_rank=effective_rank)
    x = resid.detach()
    if x.dtype != work:
        x = x.to(work)
    # Usually one norm per vector is all the checking needed: when each sequence's largest
    # counted norm is finite and lies in [2**-20 sqrt(d_model), 2**20] (NaN and inf anywhere
    # make it NaN: 0 * inf is NaN), every vector is finite and each sequence's largest entry
    # lies in unit_scale's safe range, so x needs no rescaling (the general path below would
    # give the same values, bit for bit).
    chunk = chunk_for(x.shape[1], 16 if x.shape[1] <= 128 else 32)
    chunks = Chunks.of(x, chunk)  # the Gram matrices first: their diagonals give the norms
    norms = chunks.norms()  # [batch pos]
    top = (norms * w).amax(1)
    bottom = norms.masked_fill(w == 0, 1.0).amin(1)  # 0: a counted zero vector
    low, high = _SAFE_MAGNITUDE
    exponent = None
    if not bool(((top >= low * math.sqrt(x.shape[-1])) & (top <= high) & (bottom > 0)).all()):
        # Two reductions give each vector's largest |entry| and its finiteness (NaN and inf
        # propagate through amax / amin), with no full-size temporary.
        inc = w > 0
        largest = torch.maximum(x.amax(-1), -x.amin(-1))  # [batch pos]
        finite = torch.isfinite(largest)
        if not bool(finite[inc].all()):
            bad = int((~finite[inc]).sum())
            raise NonFiniteActivationError(
                f"{bad} counted residual vectors hold NaN or inf; nothing was averaged in. "
                "Check the model dtype (float16 overflows) or the weights"
            )
        zero = int(((largest == 0) & inc).sum())
        if zero:
            warnings.warn(
                f"homoglens: {zero} counted vectors are exactly zero; a cosine with a zero "
                "vector is undefined and counts as 0 in every similarity statistic (leave "
                "them out with attention_mask)",
                UserWarning,
                stacklevel=2,
            )
        if not bool(finite.all()):  # NaN/inf on pads only: keep them out
            x = x.masked_fill(~inc[..., None], 0.0)
        x, exponent = unit_scale(x, inc, largest.masked_fill(~finite, 0.0))
        chunks = Chunks.of(x, chunk)
        norms = chunks.norms()  # in units of 2**exponent
    # u_p = scale_p x_p (never materialised); 0 for zero vectors and uncounted tokens. The dot
    # products below are taken on x itself: |x_i . x_j| <= ||x_i|| ||x_j||, finite wherever the
    # norms (checked above) are.
    scale = _unit_scale_factor(norms, w)
    sums, within, proj = position_dots(chunks, scale, w)
    # ||X - 1 xbar^T||_F^2 = sum_p ||x_p||^2 - ||sum_p x_p||^2 / T (in sums_of_terms); where
    # that difference is small against sum_p ||x_p||^2 (nearly constant rows) it loses digits,
    # so those sequences take the direct sum of ||x_p - xbar||^2, here, while x is at hand.
    xsum = sums[:, 1]
    near_constant = (xsum * xsum).sum(-1) > (0.99 * t) * (norms * norms * w).sum(1)
    centred_sq = None
    if bool(near_constant.any()):
        rows = torch.nonzero(near_constant).flatten()
        xbar = (xsum[rows] / t[rows, None])[:, None, :]
        direct = torch.linalg.vector_norm(x[rows] - xbar, dim=-1).to(torch.float64) ** 2
        centred_sq = torch.full(t.shape, float("nan"), dtype=torch.float64, device=t.device)
        centred_sq[rows] = (direct * w[rows].to(torch.float64)).sum(1)
    rank = rank_sums(x, scale, w, counted.rest) if effective_rank else {}
    return EntryTerms(norms, exponent, sums, within, proj, centred_sq, rank)


UNSYNCED_ON_CPU = False
"""Read the vectors the GPU way on the CPU too (tests: the two ways give the same sums)."""


def unsynced(device: torch.device) -> bool:
    """Whether vectors on ``device`` are read without host synchronisation (:func:`prepare_entry`
    and :func:`prepared_terms`: every device but the CPU)."""
    return device.type != "cpu" or UNSYNCED_ON_CPU


def prepare_entry(
    resid: Float[torch.Tensor, "batch pos d_model"],
    weight: Float[torch.Tensor, "batch pos"],
    out: Float[torch.Tensor, "batch pos d_model"] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first stage of the read without host synchronisation (a GPU's: a ``bool(tensor)``
    per layer stalls the queue of kernels), a few kernels per entry: each sequence's vectors
    scaled by the power of two that brings its largest counted entry into [0.5, 1) (exact: the
    same cosines as unscaled vectors), in the work dtype, NaN/inf entries set to 0, and a flag
    of counted vectors that held NaN/inf (refused once per batch by :func:`check_terms`).

    Args:
        resid: ``[batch pos d_model]`` vectors, any float dtype.
        weight: ``[batch pos]`` 1 on counted tokens, 0 elsewhere.
        out: Where to write the scaled vectors (a slot of a group's buffer), if given.

    Returns:
        ``(scaled vectors, [batch] int32 exponents e with x = scaled * 2**e, [] bool flag)``.
    """
    x = resid.detach()
    work = work_dtype(x.dtype)
    low, high = torch.aminmax(x, dim=-1)
    largest = torch.maximum(high, -low).to(work)  # [batch pos]; NaN/inf propagate
    finite = torch.isfinite(largest)
    inc = weight > 0
    bad = (inc & ~finite).any()
    amax = largest.masked_fill(~(finite & inc), 0.0).amax(1)
    exponent = torch.where(
        amax > 0, torch.frexp(amax).exponent, torch.zeros_like(amax, dtype=torch.int32)
    )
    factor = torch.exp2((-exponent).to(work))[:, None, None]
    clean = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    if out is None:
        return clean.to(work) * factor, exponent, bad
    return torch.mul(clean, factor, out=out), exponent, bad


def prepared_terms(
    x: Float[torch.Tensor, "batch pos d_model"],
    exponent: Int[torch.Tensor, " batch"],
    bad: torch.Tensor,
    counted: CountedTokens,
    *,
    effective_rank: bool = False,
) -> EntryTerms:
    """The second stage: :func:`entry_terms` of vectors :func:`prepare_entry` scaled, without
    host synchronisation; the centred sum of squares is taken directly for every sequence and
    kept where the rows are nearly constant. ``x`` may stack several entries along ``batch``
    (``counted`` repeated to match), so that a group of entries costs one set of kernels."""
    w, t = counted.weight, counted.n_tokens
    chunks = Chunks.of(x, chunk_for(x.shape[1], 16 if x.shape[1] <= 128 else 32))
    norms = chunks.norms()
    scale = _unit_scale_factor(norms, w)
    sums, within, proj = position_dots(chunks, scale, w)
    xsum = sums[:, 1]
    near_constant = (xsum * xsum).sum(-1) > (0.99 * t) * (norms * norms * w).sum(1)
    xbar = (xsum / t[:, None])[:, None, :]
    direct = torch.linalg.vector_norm(x - xbar, dim=-1).to(torch.float64) ** 2
    direct = (direct * w.to(torch.float64)).sum(1)
    centred_sq = torch.where(near_constant, direct, torch.full_like(direct, float("nan")))
    rank = rank_sums(x, scale, w, counted.rest) if effective_rank else {}
    return EntryTerms(norms, exponent, sums, within, proj, centred_sq, rank, bad)


def split_terms(terms: EntryTerms, n: int) -> list[EntryTerms]:
    """The entries of a group (:func:`prepared_terms` of ``n`` entries stacked along
    ``batch``), each its own :class:`EntryTerms` (no rank sums: those add over sequences)."""
    if n == 1:
        return [terms]
    b = int(terms.norms.shape[0]) // n

    def part(t: torch.Tensor | None, j: int) -> torch.Tensor | None:
        return None if t is None else t[j * b : (j + 1) * b]

    assert not terms.rank, "rank sums of a group cannot be split"
    return [
        EntryTerms(
            terms.norms[j * b : (j + 1) * b],
            part(terms.exponent, j),
            terms.sums[j * b : (j + 1) * b],
            terms.within[j * b : (j + 1) * b],
            terms.proj[j * b : (j + 1) * b],
            part(terms.centred_sq, j),
            {},
            None,
        )
        for j in range(n)
    ]


def _unit_scale_factor(
    norms: Float[torch.Tensor, "*entry batch pos"], weight: Float[torch.Tensor, "batch pos"]
) -> Float[torch.Tensor, "*entry batch pos"]:
    """1 / ||x_p|| on counted nonzero vectors, 0 elsewhere (the same bits wherever computed)."""
    return torch.where(norms > 0, weight / norms, 0.0)


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
    t = _counted_tokens(inc, check=pos_index.device.type == "cpu")  # [batch]
    incf = inc.to(f64)
    norms = terms.norms
    scale = _unit_scale_factor(norms, inc.to(norms.dtype))  # the bits entry_terms used
    uu = (scale != 0).to(f64)  # u . u, exactly: 1 on counted nonzero vectors
    to_others = (scale * terms.proj[..., 1]).to(f64) - uu
    to_others = to_others / (t - 1)[:, None]

    n_before = torch.cumsum(incf, dim=1) - incf
    has_prefix = inc & (n_before > 0)
    to_prefix = (scale * (terms.within + terms.proj[..., 0])).to(f64) / n_before.clamp_min(1)

    sums = terms.sums.to(f64)
    s64, xsum = sums[..., 0, :], sums[..., 1, :]
    xsum_norm = torch.linalg.vector_norm(xsum, dim=-1)  # [layer batch]
    safe = torch.where(xsum_norm > 0, xsum_norm, torch.ones_like(xsum_norm))
    to_mean = (scale * terms.proj[..., 2]).to(f64) / safe[..., None]  # cos(x_p, xbar)

    s_sq = (s64 * s64).sum(-1)  # [layer batch]
    mean_pairwise = (s_sq - uu.sum(-1)) / (t * (t - 1))
    total_sq = ((norms.to(f64) ** 2) * incf).sum(-1)
    centred_sq = total_sq - xsum_norm**2 / t
    if terms.centred_sq is not None:  # sequences summed directly (nearly constant rows)
        centred_sq = torch.where(terms.centred_sq.isnan(), centred_sq, terms.centred_sq)
    relative_residual = (
        centred_sq.clamp_min(0).sqrt()
        / torch.where(total_sq > 0, total_sq, torch.ones_like(total_sq)).sqrt()
    )

    # Per-position sums: tokens that are not counted go to a spare last bin, then dropped.
    bins = torch.where(inc, pos_index, torch.full_like(pos_index, n_pos)).flatten()
    n_layer = terms.norms.shape[0]

    def per_pos(values: torch.Tensor) -> torch.Tensor:
        rows = values.to(f64).reshape(-1, bins.numel())
        out = torch.zeros(rows.shape[0], n_pos + 1, dtype=f64, device=bins.device)
        return out.index_add_(1, bins, rows)[:, :n_pos].reshape(*values.shape[:-2], n_pos)

    norms = norms.to(f64)
    if terms.exponent is not None:
        norms = torch.ldexp(norms, terms.exponent[..., None].to(f64))
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
        "n_sequences": torch.tensor(float(inc.shape[0]), dtype=f64, device=t.device),
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
    check_terms([terms])
    sums = sums_of_terms(
        stack_terms([terms]), pos_index.to(resid.device), n_pos, per_sequence=per_sequence
    )
    return {k: v if k in _LAYER_INDEPENDENT else v[0] for k, v in sums.items()}


def nan_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``, NaN elsewhere (a mean over nothing is undefined)."""
    out = num / torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, out, torch.full_like(out, math.nan))
