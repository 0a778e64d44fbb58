"""Attention-bias maths: the bias direction phi of each kind, the checked plan, and the biased
pattern of chosen heads with its manipulation checks; no model access here.

The method (docs/bias.md, "The intervention"): at ``blocks.{l}.attn.hook_pattern`` each row
becomes A'[q, k] = softmax_k(beta log A[q, k] + b phi[q, k]) = softmax(beta * scores + b * phi),
phi a direction over keys per kind (the first keys, the query itself, a recent window, ALiBi's
-(q - k), the middle of the prefix; the temperature scales by beta instead).
:func:`bias_pattern` computes it from A alone (a closed form in probability space where it can,
log space otherwise) and :func:`attention_bias_hook` applies it. It serves the attention-bias
dose-response study of :mod:`homoglens.bias.measure`: do tokens lose distinctiveness "particularly
when biased toward extremal positions" (Yusupov et al. 2025, arXiv 2508.17126)?
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import Any

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import HookFn

__all__ = [
    "AttentionBiasPlan",
    "attention_bias_hook",
    "attention_bias_phi",
    "bias_pattern",
]


def attention_bias_phi(
    kind: str,
    n_query: int,
    n_key: int,
    *,
    first_k: int = 1,
    window: int = 8,
    q_offset: int = 0,
    device: torch.device | str | None = None,
) -> Float[torch.Tensor, "query_pos key_pos"]:
    """The bias direction phi[q, k] of an attention-bias kind (docs/bias.md, "The
    intervention"), float64, for keys k <= q (entries k > q are 0; the causal mask removes them).

    ``"first"``: 1[k < first_k]; ``"self"``: 1[k = q]; ``"recent"``: 1[q - window < k <= q];
    ``"alibi"``: -(q - k) (Press et al. 2022, arXiv 2108.12409); ``"middle"``:
    1[q/4 <= k <= 3q/4]; ``"temperature"``: zeros (it scales the scores instead).

    Args:
        kind: The bias kind.
        n_query: Query rows (queries ``q_offset .. q_offset + n_query - 1``).
        n_key: Keys.
        first_k: Keys counted as "first".
        window: Keys counted as "recent".
        q_offset: The first query's position (a block of rows of a longer pattern).
        device: Where to build it (default: the CPU).
    """
    device = torch.device("cpu") if device is None else device
    q = torch.arange(q_offset, q_offset + n_query, dtype=torch.float64, device=device)[:, None]
    k = torch.arange(n_key, dtype=torch.float64, device=device)[None, :]
    allowed = k <= q
    phi = {
        "first": (k < first_k) & allowed,
        "self": k == q,
        "recent": (q - window < k) & allowed,
        "middle": (4 * k >= q) & (4 * k <= 3 * q),
    }.get(kind)
    if phi is not None:
        return phi.to(torch.float64)
    if kind == "alibi":
        return torch.where(allowed, -(q - k), 0.0)
    if kind == "temperature":
        return torch.zeros(n_query, n_key, dtype=torch.float64, device=device)
    raise InvalidInputError(f"unknown attention-bias kind {kind!r}")


@dataclass(frozen=True)
class AttentionBiasPlan:
    """A checked attention bias: A'[q, k] = softmax_k(beta log A[q, k] + b phi[q, k]) on the
    chosen heads of the chosen blocks (built by
    :func:`homoglens.bias.interventions.attention_bias_plan`).

    Attributes:
        kind: The bias kind.
        bias: b (0 for ``"temperature"``).
        beta: The factor on the log-attention (1 but for ``"temperature"``).
        first_k: Keys counted as "first".
        window: Keys counted as "recent".
        blocks: Blocks biased.
        heads: Heads biased in each block (``None``: every head).
    """

    kind: str
    bias: float
    beta: float
    first_k: int
    window: int
    blocks: tuple[int, ...]
    heads: tuple[int, ...] | None

    @property
    def identity(self) -> bool:
        """Whether the plan changes nothing (b = 0 and beta = 1)."""
        return self.bias == 0.0 and self.beta == 1.0

    def phi(
        self,
        n_query: int,
        n_key: int,
        q_offset: int = 0,
        device: torch.device | str | None = None,
    ) -> Float[torch.Tensor, "query_pos key_pos"]:
        """Phi of this kind for a ``[n_query n_key]`` pattern (float64; cached when small);
        with ``q_offset``, the rows of queries ``q_offset ..`` of a longer one, on ``device``."""
        if n_query * n_key <= _CACHED_ENTRIES:
            return _cached_phi(self.kind, n_query, n_key, self.first_k, self.window, q_offset).to(
                device
            )
        return attention_bias_phi(
            self.kind,
            n_query,
            n_key,
            first_k=self.first_k,
            window=self.window,
            q_offset=q_offset,
            device=device,
        )


_CACHED_ENTRIES = 1 << 18
"""Largest ``[query_pos key_pos]`` table of phi / the bias weights kept in a cache (2 MiB of
float64): short windows reuse theirs over every block and pass; the blocks of rows of a long one are
made where they are used (a cache of them would hold O(T^2))."""


@lru_cache(maxsize=64)
def _cached_phi(
    kind: str, n_query: int, n_key: int, first_k: int, window: int, q_offset: int = 0
) -> torch.Tensor:
    with torch.inference_mode(False):
        return attention_bias_phi(
            kind, n_query, n_key, first_k=first_k, window=window, q_offset=q_offset
        )


def _bias_weights(
    kind: str,
    bias: float,
    n_query: int,
    n_key: int,
    first_k: int,
    window: int,
    q_offset: int = 0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, stack of w, w * phi, w * log w)``, float64 ``[query_pos key_pos]`` (and
    ``[3 query_pos key_pos]``), with w[q, k] = exp(b phi[q, k] - max_{k' <= q} b phi[q, k'])
    on keys k <= q (in (0, 1]), else 0 (rows of queries ``q_offset ..``), on ``device``
    (cached when small)."""
    args = (kind, bias, n_query, n_key, first_k, window, q_offset)
    if n_query * n_key <= _CACHED_ENTRIES:
        w, stacked = _cached_bias_weights(args)
        return w.to(device), stacked.to(device)
    return _make_bias_weights(args, device)


@lru_cache(maxsize=64)
def _cached_bias_weights(args: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode(False):
        return _make_bias_weights(args, None)


def _make_bias_weights(
    args: tuple[Any, ...], device: torch.device | str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    kind, bias, n_query, n_key, first_k, window, q_offset = args
    device = torch.device("cpu") if device is None else device
    phi = attention_bias_phi(
        kind, n_query, n_key, first_k=first_k, window=window, q_offset=q_offset, device=device
    )
    q = torch.arange(q_offset, q_offset + n_query, device=device)[:, None]
    allowed = torch.arange(n_key, device=device)[None, :] <= q
    scaled = torch.where(allowed, bias * phi, -torch.inf)
    log_w = scaled - scaled.amax(-1, keepdim=True)
    log_w = torch.where(allowed, log_w, 0.0)
    w = torch.where(allowed, log_w.exp(), 0.0)
    return w, torch.stack([w, w * phi, w * log_w])


_CHUNK_ELEMENTS = 1 << 19
"""Pattern entries per chunk of :func:`bias_pattern` on the CPU (2 MiB of float32, a core's L2
cache): every pass over a chunk (row sums, A log A, the biased write) runs while it is still
cached. On a GPU each row block is one chunk (the kernels' launches, not the cache, bound it)."""

_ROW_BLOCK = 64
"""Queries per row block of a causal pattern in :func:`bias_pattern`: a block of queries
q0..q1 - 1 reads only keys up to q1 - 1, so about half of the square (the masked keys above the
diagonal, exactly 0) is never read or written."""


def bias_pattern(
    chosen: Float[torch.Tensor, "batch head_index query_pos key_pos"],
    plan: AttentionBiasPlan,
    *,
    checks: bool = False,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
    q_offset: int | None = None,
) -> tuple[torch.Tensor, Float[torch.Tensor, "batch head_index query_pos 3"] | None]:
    """A' = softmax_k(beta log A + b phi) of the chosen heads' pattern, and optionally the
    manipulation checks of each row: (E_{A'}[phi], entropy of A', KL(A' || A)), nats, float64.

    With beta = 1 the softmax has a closed form computed without leaving probability space:
    A'[q, k] = A[q, k] w[q, k] / z[q], w = exp(b phi - max_k' b phi) in (0, 1] (so nothing
    overflows) and z = sum_k A w; the checks follow from row sums: E_{A'}[phi] = sum A w phi / z,
    KL = sum A w log w / z - log z, entropy = -sum A w log A / z - KL. A row whose z underflows
    (|b| so large that every key it attends has w = 0) and the temperature (beta != 1) are
    computed in log space. Both equal softmax(beta * scores + b * phi) exactly in exact
    arithmetic; keys a row never attends (A = 0: the causal mask, a sliding window) stay at 0.
    Work is done in the pattern's dtype (float32 for half precision), a cache-sized chunk of
    rows at a time (A log A as A log max(A, tiny), which is exact for A = 0 and differs by under
    1e-36 below float32's smallest normal number). When the pattern is causal (query 0 attends
    no key after its own), the keys above the diagonal, all 0, are neither read nor written.

    Args:
        chosen: ``[batch head_index query_pos key_pos]`` attention probabilities.
        plan: The bias (:class:`AttentionBiasPlan`).
        checks: Also return the checks.
        out: A float32/float64 tensor of ``chosen``'s shape and dtype to write the biased
            pattern into (saves an allocation per block; the closed form only). Its entries above
            the diagonal are not written for a causal pattern: allocate it with ``torch.zeros``
            and use it for causal patterns only (a non-causal pattern never writes into it).
        scratch: A tensor like ``out`` whose storage holds a chunk's A log A (saves another).
        q_offset: ``chosen`` holds the rows of queries ``q_offset ..`` of a longer pattern
            (a block of rows; a causal one's query q attends keys up to q). ``None``: the
            whole pattern.

    Returns:
        ``(biased pattern in chosen's dtype, [batch head_index query_pos 3] checks or None)``; the
        mass is NaN for ``"temperature"`` (phi = 0).
    """
    work = chosen if chosen.dtype in (torch.float32, torch.float64) else chosen.float()
    rows = q_offset or 0
    if plan.beta != 1.0:
        return _log_space(chosen, work, plan, checks, rows)
    if out is not None and (
        out.shape != work.shape or out.dtype != work.dtype or not out.is_contiguous()
    ):
        out = None
    if torch.is_grad_enabled() and work.requires_grad and not plan.identity:
        done = _closed_form(work.detach(), plan, checks, None, scratch, q_offset)
        if done is None:  # some row's z underflowed
            return _log_space(chosen, work, plan, checks, rows)
        found = done[1]
        biased = work * _weights(plan, work, rows)  # the same closed form, differentiable
        biased = biased / biased.sum(-1, keepdim=True)
    else:
        done = _closed_form(work, plan, checks, out, scratch, q_offset)
        if done is None:  # some row's z underflowed
            return _log_space(chosen, work, plan, checks, rows)
        biased, found = done
    if found is not None and plan.kind == "temperature":
        found[..., 0] = math.nan
    return biased.to(chosen.dtype), found


def _weights(plan: AttentionBiasPlan, work: torch.Tensor, q_offset: int = 0) -> torch.Tensor:
    """``[query_pos key_pos]`` w of the closed form (beta = 1), in ``work``'s dtype."""
    n_q, n_k = int(work.shape[-2]), int(work.shape[-1])
    if plan.kind == "first":
        b = plan.bias
        hi, lo = (1.0, math.exp(-b)) if b >= 0 else (math.exp(b), 1.0)
        w = torch.full((n_q, n_k), lo, dtype=work.dtype, device=work.device)
        w[:, : plan.first_k] = hi
        return w
    w64, _ = _bias_weights(
        plan.kind, plan.bias, n_q, n_k, plan.first_k, plan.window, q_offset, work.device
    )
    return w64.to(work.dtype)


def _row_blocks(flat: torch.Tensor, q_offset: int | None = None) -> list[tuple[int, int, int]]:
    """``(first query, end query, keys read)`` per row block of ``flat [n query key]``: one
    block of every key unless the pattern is causal (row i attends key i + offset and
    earlier, checked on row 0; offset ``q_offset``, else n_key - n_query), then blocks of
    :data:`_ROW_BLOCK` queries."""
    n_q, n_k = int(flat.shape[-2]), int(flat.shape[-1])
    offset = n_k - n_q if q_offset is None else q_offset
    if n_q < 2 * _ROW_BLOCK or offset < 0 or bool(flat[:, 0, offset + 1 :].any()):
        return [(0, n_q, n_k)]
    edges = [*range(0, n_q, _ROW_BLOCK), n_q]
    if n_q - edges[-2] < _ROW_BLOCK // 2:  # no short last block
        del edges[-2]
    return [(q0, q1, q1 + offset) for q0, q1 in pairwise(edges)]


def _closed_form(
    work: torch.Tensor,
    plan: AttentionBiasPlan,
    checks: bool,
    out: torch.Tensor | None,
    scratch: torch.Tensor | None,
    q_offset: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """:func:`bias_pattern` for beta = 1, chunk by chunk; ``None`` if a row's z underflows.

    Per row it gathers, in the work dtype, the row sums the checks need, then finishes them in
    float64: for ``"first"`` (w takes two values, so no full-size product with phi or w is made)
    the mass on the first keys and on the others, and sum A log A over each; for the other
    kinds z = sum A w, sum A w phi, sum A w log w and sum A w log A."""
    f64, dtype, device = torch.float64, work.dtype, work.device
    n_q, n_k = int(work.shape[-2]), int(work.shape[-1])
    flat = work.reshape(-1, n_q, n_k)
    n = int(flat.shape[0])
    first, identity, k, b = plan.kind == "first", plan.identity, plan.first_k, plan.bias
    if identity and not checks:
        return work, None
    blocks = _row_blocks(flat, q_offset)
    q_offset = q_offset or 0
    causal = len(blocks) > 1
    hi, lo = (1.0, math.exp(-b)) if b >= 0 else (math.exp(b), 1.0)
    log_hi, log_lo = min(0.0, b), min(0.0, -b)  # log hi, log lo
    w: torch.Tensor | None = None
    stacked: torch.Tensor | None = None
    phi: torch.Tensor | None = None
    if identity:
        phi = None if first else plan.phi(n_q, n_k, q_offset, device).to(dtype)
    elif not first:
        w64, stacked64 = _bias_weights(
            plan.kind, b, n_q, n_k, plan.first_k, plan.window, q_offset, device
        )
        w, stacked = w64.to(dtype), stacked64.to(dtype)
    dest = None
    if not identity:
        if out is None or not causal:  # a reused buffer only ever holds causal patterns
            dest = (torch.zeros if causal else torch.empty)(work.shape, dtype=dtype, device=device)
        else:
            dest = out
        dest = dest.view(flat.shape)
    room = None
    if checks and scratch is not None and scratch.dtype == dtype and scratch.is_contiguous():
        room = scratch.view(-1)
    tiny = torch.finfo(dtype).tiny
    # per row, in the work dtype: "first": mass on keys < first_k, on the others, and sum A log A
    # over each; else z = sum A w, sum A w phi, sum A w log w, sum A w log A (identity: [1] and
    # [3] only)
    sums = torch.zeros(4, n, n_q, dtype=dtype, device=device)
    for q0, q1, keys in blocks:
        kk = min(k, keys)
        per = max(1, _CHUNK_ELEMENTS // ((q1 - q0) * keys)) if device.type == "cpu" else n
        w_blk = stacked_blk = None
        if w is not None and stacked is not None:
            w_blk = w[q0:q1, :keys].contiguous()
            stacked_blk = stacked[:, q0:q1, :keys].contiguous()
        phi_blk = None if phi is None else phi[q0:q1, :keys].contiguous()
        for c0 in range(0, n, per):
            a = flat[c0 : c0 + per, q0:q1, :keys]
            s = sums[:, c0 : c0 + per, q0:q1]
            x = None
            if checks:
                size = a.numel()
                if room is not None and room.numel() >= size:
                    x = room[:size].view(a.shape)
                else:
                    x = torch.empty(a.shape, dtype=dtype, device=device)
                x = torch.clamp(a, min=tiny, out=x).log_().mul_(a)  # A log A
            if first:
                if not identity or checks:
                    torch.sum(a[..., :kk], -1, out=s[0])
                    torch.sum(a[..., kk:], -1, out=s[1])
                if x is not None:
                    torch.sum(x[..., :kk], -1, out=s[2])
                    torch.sum(x[..., kk:], -1, out=s[3])
                if identity:
                    continue
                z = s[0] * hi + s[1] * lo
            elif identity:
                if x is not None:
                    assert phi_blk is not None
                    s[1] = torch.einsum("nqk,qk->nq", a, phi_blk)
                    torch.sum(x, -1, out=s[3])
                continue
            else:
                assert w_blk is not None and stacked_blk is not None
                s[:3] = torch.einsum("nqk,eqk->enq", a, stacked_blk)
                if x is not None:
                    s[3] = torch.einsum("nqk,qk->nq", x, w_blk)
                z = s[0]
            if not bool((z > 0).all()):
                return None
            assert dest is not None
            d = dest[c0 : c0 + per, q0:q1, :keys]
            inv = z.reciprocal()[..., None]
            if first:
                torch.mul(a, inv * lo, out=d)
                d[..., :kk] = a[..., :kk] * (inv * hi)
            else:
                assert w_blk is not None
                torch.mul(a, w_blk, out=d).mul_(inv)
    biased = work if dest is None else dest.view(work.shape)
    if not checks:
        return biased, None
    s64 = sums.to(f64).view(4, *work.shape[:-1])
    return biased, _checks_of_sums(s64, first, identity, (hi, lo, log_hi, log_lo))


def _checks_of_sums(
    s64: torch.Tensor, first: bool, identity: bool, weights: tuple[float, float, float, float]
) -> torch.Tensor:
    """The checks ``[... 3]`` (E_{A'}[phi], the entropy of A', KL(A' || A)) in float64 from
    :func:`_closed_form`'s per-row sums ``s64`` ``[4 ...]`` (their meaning depends on
    ``first`` and ``identity``, as there); ``weights`` are its ``(hi, lo, log hi, log lo)``."""
    hi, lo, log_hi, log_lo = weights
    if identity:
        if first:
            mass, entropy = s64[0], -(s64[2] + s64[3])
        else:
            mass, entropy = s64[1], -s64[3]
        return torch.stack([mass, entropy, torch.zeros_like(mass)], -1)
    if first:
        z = s64[0] * hi + s64[1] * lo
        mass, other = s64[0] * (hi / z), s64[1] * (lo / z)
        kl = mass * log_hi + other * log_lo - torch.log(z)  # sum_k A' log(A' / A)
        cross = (s64[2] * hi + s64[3] * lo) / z  # sum_k A' log A
    else:
        z = s64[0]
        mass = s64[1] / z
        kl = s64[2] / z - torch.log(z)
        cross = s64[3] / z
    return torch.stack([mass, -cross - kl, kl.clamp_min(0.0)], -1)


def _log_space(
    chosen: torch.Tensor,
    work: torch.Tensor,
    plan: AttentionBiasPlan,
    checks: bool,
    q_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`bias_pattern` in log space: log A' = log_softmax(beta log A + b phi)."""
    f64 = torch.float64
    n_q, n_k = int(work.shape[-2]), int(work.shape[-1])
    phi = plan.phi(n_q, n_k, q_offset, work.device).to(work.dtype)
    log_b = torch.log(work)
    if plan.beta != 1.0:
        log_b.mul_(plan.beta)
    if plan.bias != 0.0:
        log_b.add_(plan.bias * phi)
    log_b = torch.log_softmax(log_b, dim=-1).nan_to_num_(nan=-torch.inf)  # a row with no key
    biased = log_b.exp()
    out = None
    if checks:
        mass = torch.einsum("bhqk,qk->bhq", biased, phi).to(f64)
        if plan.kind == "temperature":
            mass = torch.full_like(mass, math.nan)
        entropy = -torch.special.xlogy(biased, biased).sum(-1).to(f64)
        kl = -entropy - torch.special.xlogy(biased, work).sum(-1).to(f64)
        out = torch.stack([mass, entropy, kl.clamp_min(0.0)], -1)
    return biased.to(chosen.dtype), out


def attention_bias_hook(plan: AttentionBiasPlan) -> HookFn:
    """Hook for ``blocks.{l}.attn.hook_pattern`` ``[batch head_index query_pos key_pos]``: bias
    the plan's heads, A'[q, k] = A[q, k]^beta exp(b phi[q, k]) / sum over k' of the same,
    computed by :func:`bias_pattern`, which equals softmax(beta * scores + b * phi) exactly.

    Args:
        plan: The checked bias (:class:`AttentionBiasPlan`).

    Returns:
        A TransformerLens hook function returning the biased pattern.
    """
    heads = None if plan.heads is None else list(plan.heads)

    def hook(pattern: Float[torch.Tensor, "batch head_index query_pos key_pos"], hook: Any) -> Any:
        chosen = pattern if heads is None else pattern[:, heads]
        biased, _ = bias_pattern(chosen, plan)
        if heads is None:
            return biased
        out = pattern.clone()
        out[:, heads] = biased
        return out

    return hook
