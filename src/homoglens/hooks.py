"""Pure hook factories: ``(activation, hook) -> activation``; no model access here.

A :class:`PositionPlan` says, for a sequence of T positions, which source position each token
takes its positional signal from, and which tokens change at all. The factories below apply a
plan at the hook points where position enters (see :mod:`homoglens.architectures`): a learned
absolute table (``hook_pos_embed``), the rotary tables of the bridge (``hook_cos``/``hook_sin``),
or the rotated queries/keys of ``HookedTransformer`` (``hook_rot_q``/``hook_rot_k``).

Positions are column indices: the hooks assume position i of a row is its i-th token, which
holds for unpadded and right-padded batches (homoglens always runs right-padded).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import Any, Literal

import torch
from jaxtyping import Float

from homoglens.errors import InvalidInputError
from homoglens.types import HookFn, PositionAblation

__all__ = [
    "PositionAblation",
    "PositionPlan",
    "learned_position_hook",
    "rotary_table_hook",
    "rerotate_hook",
    "alibi_score_hook",
    "AttentionBiasPlan",
    "attention_bias_phi",
    "attention_bias_hook",
    "bias_pattern",
    "remove_sink_hook",
    "sink_removal_delta",
    "mean_head_hook",
    "set_massive_hook",
]


@dataclass(frozen=True)
class PositionPlan:
    """Which positional signal each token receives, for any sequence length.

    Attributes:
        how: The ablation mode.
        n_ctx: The model's context length (source positions must lie in ``[0, n_ctx)``).
        positions: Only these positions change (``None``: all).
        perm: For ``"permute"``: a permutation of ``0..T-1`` (T = sequence length).
        shift: For ``"shift"``: the offset added to each position.
        seed: For ``"permute"`` without ``perm``: seed of the random permutation (of the chosen
            positions among themselves when ``positions`` is given).
    """

    how: PositionAblation
    n_ctx: int
    positions: tuple[int, ...] | None = None
    perm: tuple[int, ...] | None = None
    shift: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        def ints(value: Any) -> bool:
            return isinstance(value, tuple) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            )

        if self.how not in ("none", "zero", "permute", "shift", "mean"):
            raise InvalidInputError(f"how={self.how!r} is not a position ablation")
        if not isinstance(self.n_ctx, int) or self.n_ctx < 1:
            raise InvalidInputError(f"n_ctx={self.n_ctx!r} must be a positive int")
        if self.positions is not None and (
            not ints(self.positions) or any(not 0 <= p < self.n_ctx for p in self.positions)
        ):
            raise InvalidInputError(
                f"positions={self.positions!r} must be a tuple of ints in [0, {self.n_ctx})"
            )
        if self.perm is not None:
            if not ints(self.perm) or sorted(self.perm) != list(range(len(self.perm))):
                raise InvalidInputError(f"perm={self.perm!r} must be a tuple permutation of 0..T-1")
            if self.positions is not None:
                moved = [i for i, p in enumerate(self.perm) if p != i]
                if not set(moved) <= set(self.positions):
                    raise InvalidInputError(
                        f"perm moves positions {moved[:8]} but positions={list(self.positions)}; "
                        "with positions=, perm may only permute those positions among themselves"
                    )

    def source(self, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(source [pos] int64, changed [pos] bool)`` for a sequence of ``n_pos``.

        The tensors are fresh copies (the hooks share cached ones internally).

        Raises:
            InvalidInputError: ``n_pos`` is not a positive int, ``perm`` does not match the
                sequence length, or a shifted position leaves ``[0, n_ctx)``.
        """
        if isinstance(n_pos, bool) or not isinstance(n_pos, int) or n_pos < 1:
            raise InvalidInputError(f"n_pos={n_pos!r} must be a positive int")
        source, changed = _source(self, n_pos)
        return source.clone(), changed.clone()


def _source(plan: PositionPlan, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Cached tensors are made outside inference mode: a plan first used under
    # torch.inference_mode must still work in a later forward pass that tracks gradients.
    with torch.inference_mode(False):
        return _cached_source(plan, n_pos)


@lru_cache(maxsize=256)
def _cached_source(plan: PositionPlan, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    cpu = torch.device("cpu")  # the plan's tables are made once, on the CPU, then moved
    own = torch.arange(n_pos, device=cpu)
    changed = torch.ones(n_pos, dtype=torch.bool, device=cpu)
    if plan.positions is not None:
        changed = torch.zeros(n_pos, dtype=torch.bool, device=cpu)
        chosen = [p for p in plan.positions if p < n_pos]
        changed[chosen] = True
        if not chosen and plan.how != "none":  # said once per plan and length (cached)
            warnings.warn(
                f"homoglens: positions {list(plan.positions)[:8]} lie beyond these "
                f"{n_pos}-token sequences; the {plan.how!r} ablation changes nothing in them "
                "(give positions below the sequence length)",
                UserWarning,
                stacklevel=2,
            )
    if plan.how in ("none", "mean"):
        return own, changed & (plan.how == "mean")
    if plan.how == "zero":
        return torch.where(changed, torch.zeros_like(own), own), changed
    if plan.how == "permute":
        if plan.perm is not None:
            if len(plan.perm) != n_pos:
                raise InvalidInputError(
                    f"perm has length {len(plan.perm)} but the sequence has {n_pos} positions; "
                    "give a permutation of 0..T-1 for the T you run, or use seed="
                )
            source = torch.tensor(plan.perm, dtype=torch.long, device=cpu)
        else:
            gen = torch.Generator().manual_seed(int(plan.seed or 0))
            idx = torch.nonzero(changed).flatten()
            source = own.clone()
            source[idx] = idx[torch.randperm(len(idx), generator=gen, device=cpu)]
        return torch.where(changed, source, own), changed
    if plan.how == "shift":
        shifted = own + int(plan.shift or 0)
        bad = changed & ((shifted < 0) | (shifted >= plan.n_ctx))
        if bool(bad.any()):
            first = int(torch.nonzero(bad)[0])
            raise InvalidInputError(
                f"shift={plan.shift} moves position {first} to {first + int(plan.shift or 0)}, "
                f"outside the context window [0, {plan.n_ctx}); use a smaller shift or restrict "
                "positions="
            )
        return torch.where(changed, shifted, own), changed
    raise InvalidInputError(f"unknown position ablation {plan.how!r}")


def learned_position_hook(
    table: Float[torch.Tensor, "n_ctx d_model"], plan: PositionPlan
) -> HookFn:
    """Hook for ``hook_pos_embed`` ``[batch pos d_model]`` of a learned absolute table.

    Args:
        table: The model's positional embedding table ``W_pos`` (as the model uses it).
        plan: What each token receives: zeros (``"zero"``), ``table[source]``, or the mean of
            ``table[:T]`` over the T positions of the sequence (``"mean"``).

    Returns:
        A TransformerLens hook function returning the changed positional embeddings.
    """

    def hook(pos_embed: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
        n_pos = pos_embed.shape[1]
        source, changed = _source(plan, n_pos)
        rows = table.to(device=pos_embed.device, dtype=pos_embed.dtype)
        if plan.how == "zero":
            new = torch.zeros_like(pos_embed[0])
        elif plan.how == "mean":
            new = rows[:n_pos].mean(0, keepdim=True).expand(n_pos, -1)
        else:
            new = rows[source.to(pos_embed.device)]
        mask = changed.to(pos_embed.device)[None, :, None]
        return torch.where(mask, new[None], pos_embed)

    return hook


def rotary_table_hook(
    rotary: Callable[[torch.Tensor, torch.device], tuple[torch.Tensor, torch.Tensor]],
    which: Literal["cos", "sin"],
    plan: PositionPlan,
) -> HookFn:
    """Hook for a rotary table ``[1|batch pos rotary_dim]`` (``hook_cos`` / ``hook_sin``).

    Args:
        rotary: The model's own rotary function: ``(source positions [pos], device)`` ->
            ``(cos, sin)`` each ``[1 pos rotary_dim]``; so "zero" equals every token at index 0
            exactly.
        which: Which of the two tables this hook point carries.
        plan: Source position of each token.

    Returns:
        A TransformerLens hook function returning the replaced table.
    """
    pick = 0 if which == "cos" else 1

    def hook(table: Float[torch.Tensor, "batch pos rotary_dim"], hook: Any) -> torch.Tensor:
        source, changed = _source(plan, table.shape[1])
        new = rotary(source, table.device)[pick].to(table.dtype)
        if plan.positions is None:  # every position changes
            return new.expand_as(table)
        return torch.where(changed.to(table.device)[None, :, None], new, table)

    return hook


def rerotate_hook(
    cos: Float[torch.Tensor, "n_ctx rotary_dim"],
    sin: Float[torch.Tensor, "n_ctx rotary_dim"],
    rotate: Callable[[torch.Tensor], torch.Tensor],
    plan: PositionPlan,
) -> HookFn:
    """Hook for ``hook_rot_q``/``hook_rot_k`` ``[batch pos head_index d_head]`` of a
    ``HookedTransformer``: turn each token's rotation for position p into the rotation for its
    source position, by rotating the already rotated vector once more by (source - p).

    Rotary rotations of one frequency compose, R(a) R(b) = R(a + b), so R(source - p) R(p) q =
    R(source) q; a token whose source is its own position is returned unchanged, bitwise.

    Args:
        cos: The attention layer's ``rotary_cos`` buffer (rows = positions 0..n_ctx-1).
        sin: The attention layer's ``rotary_sin`` buffer.
        rotate: The layer's own ``rotate_every_two`` (handles both pairing conventions).
        plan: Source position of each token.

    Returns:
        A TransformerLens hook function returning the re-rotated queries or keys.
    """
    rotary_dim = int(cos.shape[-1])
    tables: dict[str, Any] = {}

    def rows(source: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Any:
        # The plan returns the same source tensor for every forward of a given length. The
        # cache is built outside inference mode, so passes with gradients can use it too.
        if tables.get("source") is not source or tables.get("key") != (device, dtype):
            with torch.inference_mode(False):
                delta = source - torch.arange(len(source), device=source.device)
                index = delta.abs().to(cos.device)
                sign = torch.where(delta < 0, -1.0, 1.0).to(cos.device, sin.dtype)[:, None]
                tables.update(
                    source=source,
                    key=(device, dtype),
                    c=cos[index].to(device=device, dtype=dtype)[None, :, None, :],
                    s=(sin[index] * sign).to(device=device, dtype=dtype)[None, :, None, :],
                )
        return tables["c"], tables["s"]

    def hook(rotated: Float[torch.Tensor, "batch pos head d_head"], hook: Any) -> torch.Tensor:
        source, changed = _source(plan, rotated.shape[1])
        c, s = rows(source, rotated.device, rotated.dtype)
        if rotary_dim == rotated.shape[-1]:
            new = rotated * c + rotate(rotated) * s
        else:
            x_rot, x_pass = rotated[..., :rotary_dim], rotated[..., rotary_dim:]
            new = torch.cat([x_rot * c + rotate(x_rot) * s, x_pass], dim=-1)
        if plan.positions is None:  # every position changes
            return new
        return torch.where(changed.to(rotated.device)[None, :, None, None], new, rotated)

    return hook


def alibi_score_hook(slopes: Float[torch.Tensor, " head_index"], plan: PositionPlan) -> HookFn:
    """Hook for ``blocks.{l}.attn.hook_attn_scores`` ``[batch head_index query_pos key_pos]`` of
    an ALiBi model (BLOOM, MPT): give each token the bias of its source position.

    ALiBi adds ``-slope_h * (i - j)`` to the score of query i and key j (Press et al. 2022).
    Under a softmax over keys that equals ``slope_h * j`` plus a constant per row, which is how
    BLOOM and MPT build it; with positions ``s`` it is ``slope_h * s_j`` plus a row constant
    for any assignment of positions. The hook therefore adds ``slope_h * (s_j - j)``: nothing
    where a token keeps its position; the whole bias removed under ``"zero"`` (every s_j = 0);
    the bias of the permuted or shifted positions otherwise (a global shift changes nothing).
    Masked scores stay masked (a finite change to a -inf or dtype-minimum entry).

    Args:
        slopes: The model's per-head ALiBi slopes (from its own bias builder).
        plan: Source position of each token.

    Returns:
        A TransformerLens hook function returning the changed scores.
    """

    def hook(scores: Float[torch.Tensor, "batch head query_pos key_pos"], hook: Any) -> Any:
        source, _ = _source(plan, scores.shape[-1])
        moved = (source - torch.arange(len(source))).to(scores.device, torch.float64)
        delta = slopes.to(scores.device, torch.float64)[:, None] * moved[None, :]
        return scores + delta.to(scores.dtype)[None, :, None, :]

    return hook


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
    chosen heads of the chosen blocks (built by :func:`homoglens.attention_bias_plan`).

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
"""Largest ``[query key]`` table of phi / the bias weights kept in a cache (2 MiB of float64):
short windows reuse theirs over every block and pass; the blocks of rows of a long one are
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
    chosen: Float[torch.Tensor, "batch head query_pos key_pos"],
    plan: AttentionBiasPlan,
    *,
    checks: bool = False,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
    q_offset: int | None = None,
) -> tuple[torch.Tensor, Float[torch.Tensor, "batch head query_pos 3"] | None]:
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
        chosen: ``[batch head query_pos key_pos]`` attention probabilities.
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
        ``(biased pattern in chosen's dtype, [batch head query_pos 3] checks or None)``; the
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
    if identity:
        if first:
            mass, entropy = s64[0], -(s64[2] + s64[3])
        else:
            mass, entropy = s64[1], -s64[3]
        return biased, torch.stack([mass, entropy, torch.zeros_like(mass)], -1)
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
    return biased, torch.stack([mass, -cross - kl, kl.clamp_min(0.0)], -1)


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

    def hook(pattern: Float[torch.Tensor, "batch head query_pos key_pos"], hook: Any) -> Any:
        chosen = pattern if heads is None else pattern[:, heads]
        biased, _ = bias_pattern(chosen, plan)
        if heads is None:
            return biased
        out = pattern.clone()
        out[:, heads] = biased
        return out

    return hook


def sink_removal_delta(
    pattern: Float[torch.Tensor, "batch head_index query_pos key_pos"], key: int
) -> Float[torch.Tensor, "batch head_index query_pos key_pos"]:
    """The change of every head's pattern when its attention to ``key`` is removed and each row
    renormalised over the other keys (rows whose only key is the sink: no change)."""
    rest = 1.0 - pattern[..., key]
    removed = pattern.clone()
    removed[..., key] = 0.0
    renormalised = removed / torch.where(rest > 0, rest, torch.ones_like(rest))[..., None]
    return torch.where((rest > 0)[..., None], renormalised, pattern) - pattern


def remove_sink_hook(heads: list[int], key: int, *, scale: float = 1.0) -> HookFn:
    """Hook for ``blocks.{l}.attn.hook_pattern`` ``[batch head_index query_pos key_pos]``:
    remove the chosen heads' attention to ``key`` and renormalise each row over the other keys.

    A query whose only attended key is the sink (its row holds nothing else) keeps its row
    unchanged, so no row ever becomes all zeros.

    Args:
        heads: Head indices of this layer to change.
        key: 0-indexed key position of the sink.
        scale: Apply only this fraction of the change (1 = full removal); small values probe
            the first-order effect.

    Returns:
        A TransformerLens hook function returning the changed pattern.
    """
    index = list(heads)

    def hook(pattern: Float[torch.Tensor, "batch head query_pos key_pos"], hook: Any) -> Any:
        out = pattern.clone()
        out[:, index] = out[:, index] + scale * sink_removal_delta(out[:, index], key)
        return out

    return hook


def mean_head_hook(heads: list[int], mean_z: Float[torch.Tensor, "head d_head"]) -> HookFn:
    """Hook for ``blocks.{l}.attn.hook_z`` ``[batch pos head_index d_head]``: mean-ablate the
    chosen heads, replacing their output at every position by ``mean_z`` (one row per entry of
    ``heads``: the head's mean ``z`` over the real tokens of a corpus).

    Returns:
        A TransformerLens hook function returning the changed ``z``.
    """
    index = list(heads)

    def hook(z: Float[torch.Tensor, "batch pos head_index d_head"], hook: Any) -> Any:
        out = z.clone()
        out[:, :, index] = mean_z.to(device=z.device, dtype=z.dtype)[None, None]
        return out

    return hook


def set_massive_hook(
    positions: list[int] | tuple[int, ...],
    dims: list[int] | tuple[int, ...],
    values: Float[torch.Tensor, "pos d_model"],
) -> HookFn:
    """Hook for a residual stream ``[batch pos d_model]`` (``blocks.{l}.hook_resid_post``):
    set the entries at ``positions`` x ``dims`` to ``values`` in every row, the rest unchanged.

    Sun et al.'s ``set_zero`` (``values`` all 0) and ``set_mean`` (``values`` the entries' means
    over a reference corpus); positions beyond a batch's width are skipped.

    Args:
        positions: Column indices (0 = first token of a right-padded row).
        dims: Residual dimensions.
        values: ``[len(positions) len(dims)]``, the value of each (position, dimension).

    Returns:
        A TransformerLens hook function returning the changed stream (a copy).

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762
        (``lib/hook.py`` of locuslab/massive-activations).
    """
    pos, dim = list(positions), list(dims)

    def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> Any:
        keep = [i for i, p in enumerate(pos) if p < resid.shape[1]]
        if not keep:
            return resid
        out = resid.clone()
        rows = torch.tensor([pos[i] for i in keep], device=resid.device)
        cols = torch.tensor(dim, device=resid.device)
        new = values[keep].to(device=resid.device, dtype=resid.dtype)
        out[:, rows[:, None], cols[None, :]] = new[None]
        return out

    return hook
