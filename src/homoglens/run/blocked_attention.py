"""Attention read, and changed, a block of queries at a time: no ``[batch head_index query_pos
key_pos]`` tensor of a whole layer.

What the measurements read from attention needs only rows of the pattern: the sink mass is a
column (exp(q . k_key / sqrt(d_head) - logsumexp) per row), Gu et al.'s importance a sum of it
over queries, the attention received a sum over queries, an entropy a sum over keys; the
attention-bias study changes each row's logits, softmax(beta * scores + b * phi). TransformerLens'
eager attention hands every one of them the whole pattern of a layer (O(T^2) memory: 4 GiB per
head at T = 32768 in float32). Here the Hugging Face attention module itself computes the
queries and keys (projections, rotary, q/k norms, grouped heads), and hands them to its
attention function, which transformers looks up by the model's ``_attn_implementation``:
homoglens registers one, ``"homoglens"`` (:data:`ATTENTION_NAME`, with SDPA's mask function),
that runs PyTorch SDPA for the output and, for the blocks a pass asked about, gives the
measurement a :class:`PatternRows`: the pattern computed from those queries and keys,
``query_block`` rows at a time (float32, or float64 for float64 models), so working memory is
O(query block x T). A pass that changes attention (:attr:`AttentionJob.edit`) computes its
output block by block from the changed rows (float32 rows times float32 values, the output
cast to the model's dtype): eager attention's arithmetic, a block of rows at a time.

Where the attention function cannot be used (``HookedTransformer``, a family whose Hugging Face
attention has no SDPA route, a pass with a hook on an attention internal), the same job runs at
``attn.hook_pattern`` on the eager pattern (:func:`pattern_hook`), with the same numbers up to
rounding. :mod:`homoglens.run.fast_attention` decides which, per pass.

References:
    Hugging Face transformers, ``AttentionInterface`` / ``AttentionMaskInterface`` (custom
    attention functions); PyTorch ``scaled_dot_product_attention``; Rabe & Staats 2021,
    "Self-attention does not need O(n^2) memory", arXiv 2112.05682 (attention a block of
    queries at a time).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from jaxtyping import Float

from homoglens.core.types import HookFn

__all__ = [
    "ATTENTION_NAME",
    "BLOCK_BYTES",
    "AttentionJob",
    "PatternRows",
    "active_jobs",
    "merged_jobs",
    "pattern_hook",
    "query_blocks",
]

ATTENTION_NAME = "homoglens"
"""The attention implementation homoglens registers with transformers (its mask: SDPA's)."""

BLOCK_BYTES: dict[str, int] = {"cpu": 16 << 20, "default": 1 << 30}
"""Bytes of one block of scores ``[batch head_index query_block key_pos]`` (work dtype), per
device type: a block's few temporaries stay a small multiple of it (CPU: cache-sized blocks;
GPU: large enough that each block keeps the device busy)."""


KEEP_BYTES = 64 << 20
"""On the CPU, a pattern of at most this many float32 bytes keeps the rows a read job read, and
the block's output is computed from them (no second softmax in SDPA)."""


def query_blocks(
    n_query: int, row_bytes: int, device: torch.device, *, budget: int | None = None
) -> list[tuple[int, int]]:
    """``(first query, end query)`` of each block of rows of ``row_bytes`` bytes each, within
    :data:`BLOCK_BYTES` of ``device`` (at least one row per block)."""
    if budget is None:
        budget = BLOCK_BYTES.get(device.type, BLOCK_BYTES["default"])
    rows = max(1, min(n_query, budget // max(row_bytes, 1)))
    n_blocks = -(-n_query // rows)
    rows = -(-n_query // n_blocks)  # equal blocks: no short last one
    return [(q0, min(q0 + rows, n_query)) for q0 in range(0, n_query, rows)]


class PatternRows:
    """One layer's attention pattern in one pass, ``[batch head_index query_pos key_pos]``
    probabilities, read a block of query rows at a time.

    Attributes:
        batch, n_heads, n_query, n_key: The pattern's shape.
        dtype: The work dtype of the rows (float32; float64 for float64 models).
        device: Where the rows are computed.
        row_tolerance: How far a healthy row's sum may lie from 1 (rounding): 1e-3 for rows
            computed here in the work dtype; for an eager pattern in half precision, its
            dtype's epsilon (a sum of T values each rounded to bfloat16 drifts by up to half
            of it).
    """

    batch: int
    n_heads: int
    n_query: int
    n_key: int
    dtype: torch.dtype
    device: torch.device
    row_tolerance: float = 1e-3

    def scores(self, q0: int, q1: int) -> Float[torch.Tensor, "batch head_index query_pos key_pos"]:
        """Rows ``q0 .. q1 - 1`` as logits: the attention scores (scaled, soft-capped where the
        model caps them), masked keys at the dtype's lowest finite value, so that their softmax
        is the pattern and masked keys get exactly 0."""
        raise NotImplementedError

    def rows(self, q0: int, q1: int) -> Float[torch.Tensor, "batch head_index query_pos key_pos"]:
        """Rows ``q0 .. q1 - 1`` of the pattern (probabilities, masked keys exactly 0)."""
        return torch.softmax(self.scores(q0, q1), dim=-1)

    def blocks(self) -> list[tuple[int, int]]:
        """The query blocks ``(q0, q1)`` that keep one block of rows within :data:`BLOCK_BYTES`."""
        size = torch.finfo(self.dtype).bits // 8
        return query_blocks(
            self.n_query, self.batch * self.n_heads * self.n_key * size, self.device
        )


def _lowest(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).min)


def _work(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _QueryKeyRows(PatternRows):
    """The pattern from the queries and keys a Hugging Face attention module hands its attention
    function: ``query [batch head_index query_pos d_head]``, ``key [batch kv_head key_pos
    d_head]`` (grouped-query heads share a key head: head h reads key head h // group, as
    transformers' ``repeat_kv``), the mask as transformers made it for SDPA (``None``: causal;
    boolean: True attends; float: additive)."""

    def __init__(
        self,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None,
        is_causal: bool | None,
        softcap: float | None,
    ) -> None:
        self.batch, self.n_heads, self.n_query, d_head = (int(s) for s in query.shape)
        self.n_key = int(key.shape[-2])
        self.dtype, self.device = _work(query.dtype), query.device
        self.group = self.n_heads // int(key.shape[1])
        self.query = query
        self.key_t = key.to(self.dtype).transpose(-1, -2)  # [batch kv_head d_head key_pos]
        self.mask = attention_mask
        self.scaling = float(scaling) if scaling is not None else d_head**-0.5
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        self.causal = bool(causal) and self.n_query > 1 and attention_mask is None
        self.softcap = softcap
        # On the CPU, where the whole pattern is small (KEEP_BYTES), the rows a read job reads
        # are kept, so that the block's output reuses them (no second softmax inside SDPA).
        size = self.batch * self.n_heads * self.n_query * self.n_key * 4
        self.kept: dict[int, torch.Tensor] | None = (
            {} if self.device.type == "cpu" and size <= KEEP_BYTES else None
        )

    def rows(self, q0: int, q1: int) -> torch.Tensor:
        if self.kept is not None and q0 in self.kept and self.kept[q0].shape[-2] == q1 - q0:
            return self.kept[q0]
        out = torch.softmax(self.scores(q0, q1), dim=-1)
        if self.kept is not None:
            self.kept[q0] = out
        return out

    def scores(self, q0: int, q1: int) -> torch.Tensor:
        n = q1 - q0
        # the scale on the queries (a block of [query d_head]), not on the scores
        q = self.query[:, :, q0:q1].to(self.dtype) * self.scaling
        if self.group == 1:
            s = q @ self.key_t
        else:
            b, kv = self.batch, self.n_heads // self.group
            s = q.reshape(b, kv, self.group * n, -1) @ self.key_t
            s = s.view(b, self.n_heads, n, self.n_key)
        if self.softcap is not None:
            s = torch.tanh(s / self.softcap) * self.softcap
        low = _lowest(self.dtype)
        if self.mask is not None:
            m = self.mask[..., q0:q1, :]
            if m.dtype == torch.bool:
                s = s.masked_fill_(~m, low) if m.shape == s.shape else s.masked_fill(~m, low)
            else:
                s = (s + m.to(self.dtype)).clamp_min_(low)  # an additive -inf: the same 0
        elif self.causal:
            offset = self.n_key - self.n_query
            q_pos = torch.arange(q0, q1, device=self.device)[:, None] + offset
            above = torch.arange(self.n_key, device=self.device)[None, :] > q_pos
            s.masked_fill_(above, low)
        return s

    def output(self, value: torch.Tensor) -> torch.Tensor | None:
        """On the CPU, where a read job's kept rows cover every query (a small pattern): the
        output from those rows (eager attention's arithmetic), instead of SDPA computing the
        scores and their softmax a second time; ``None`` otherwise."""
        if not self.kept:
            return None
        starts = sorted(self.kept)
        ends = [q0 + int(self.kept[q0].shape[-2]) for q0 in starts]
        if starts[0] != 0 or ends[-1] != self.n_query or starts[1:] != ends[:-1]:
            return None
        parts = [self._apply(self.kept[q0], value).to(value.dtype) for q0 in starts]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, 2)
        return out.transpose(1, 2).contiguous()

    def _apply(self, p: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Rows ``p`` ``[batch head_index q key_pos]`` times the values (work dtype)."""
        v = value.to(self.dtype)
        if self.group == 1:
            return p @ v
        b, n = self.batch, int(p.shape[-2])
        o = p.reshape(b, self.n_heads // self.group, self.group * n, self.n_key) @ v
        return o.view(b, self.n_heads, n, -1)

    def attend(
        self, value: torch.Tensor, edit: Callable[[int, torch.Tensor], torch.Tensor | None]
    ) -> torch.Tensor:
        """The attention output ``[batch query_pos head_index d_head]`` (SDPA's layout) with each
        block's rows replaced by ``edit(q0, scores)``: changed rows times the values, float32
        (float64) arithmetic, cast to the values' dtype."""
        parts = []  # (concatenated, not written into a buffer: forward-mode duals stay whole)
        for q0, q1 in self.blocks():
            s = self.scores(q0, q1)
            p = edit(q0, s)
            p = torch.softmax(s, dim=-1) if p is None else p
            parts.append(self._apply(p, value).to(value.dtype))
        out = parts[0] if len(parts) == 1 else torch.cat(parts, 2)
        return out.transpose(1, 2).contiguous()


class _MaterializedRows(PatternRows):
    """The rows of a pattern that already exists (the eager pass's ``attn.hook_pattern``)."""

    def __init__(self, pattern: torch.Tensor) -> None:
        self.batch, self.n_heads, self.n_query, self.n_key = (int(s) for s in pattern.shape)
        self.dtype, self.device = _work(pattern.dtype), pattern.device
        self.row_tolerance = max(1e-3, float(torch.finfo(pattern.dtype).eps))
        self.pattern = pattern

    def rows(self, q0: int, q1: int) -> torch.Tensor:
        return self.pattern[:, :, q0:q1].to(self.dtype)

    def scores(self, q0: int, q1: int) -> torch.Tensor:
        # log A: a logit whose softmax is the row (up to the row's rounding from 1)
        a = self.rows(q0, q1)
        return torch.where(a > 0, torch.log(a), _lowest(self.dtype))


@dataclass(eq=False)
class AttentionJob:
    """What a pass does with one block's attention, beyond running it.

    Attributes:
        read: Called once per pass with the block's :class:`PatternRows` (unchanged by
            ``edit``), inside the attention call; it may keep the rows object until the
            block's output is read (:func:`homoglens.sinks.attention_received` does).
        edit: ``edit(q0, scores)``: from the masked scores of query rows ``q0 ..`` ``[batch
            head_index query key_pos]`` (work dtype), the pattern rows the block uses instead
            (probabilities; a row need not sum to 1), or ``None`` for rows left as they are
            (their softmax; on the eager pattern, the pattern itself, bit for bit). A job with
            an edit runs every block of the layer in the edit's arithmetic (float32 rows times
            values), so that passes that differ only in the edit compare like with like.
            ``None`` (no edit): the pattern is not changed, and the output is SDPA's.
        calls: Attention calls served in the current pass (set to 0 as each pass starts).
    """

    read: Callable[[PatternRows], None] | None = None
    edit: Callable[[int, torch.Tensor], torch.Tensor | None] | None = None
    calls: int = field(default=0)


_NO_JOBS: Mapping[int, AttentionJob] = MappingProxyType({})
_JOBS: ContextVar[Mapping[int, AttentionJob]] = ContextVar(
    "homoglens_attention_jobs", default=_NO_JOBS
)


@contextlib.contextmanager
def active_jobs(jobs: Mapping[int, AttentionJob]) -> Iterator[None]:
    """Serve ``jobs`` (keyed by ``id`` of each Hugging Face attention module) in this thread's
    passes while the block runs (a context variable: passes of other threads do not see them)."""
    token = _JOBS.set(jobs)
    try:
        yield
    finally:
        _JOBS.reset(token)


def _sdpa(*args: Any, **kwargs: Any) -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``"homoglens"`` attention function: SDPA, plus the job of this module if the current
    pass has one (see the module docstring)."""
    job = _JOBS.get().get(id(module))
    sdpa_kwargs = {"dropout": dropout, "scaling": scaling, "is_causal": is_causal, **kwargs}
    if job is None:
        return _sdpa(module, query, key, value, attention_mask, **sdpa_kwargs)
    job.calls += 1
    rows = _QueryKeyRows(
        module, query, key, attention_mask, scaling, is_causal, kwargs.get("softcap")
    )
    if job.read is not None:
        job.read(rows)
    if job.edit is None:
        out = rows.output(value)
        if out is not None:
            return out, None
        return _sdpa(module, query, key, value, attention_mask, **sdpa_kwargs)
    return rows.attend(value, job.edit), None


def pattern_hook(job: AttentionJob) -> HookFn:
    """``job`` as a hook on ``blocks.{l}.attn.hook_pattern`` ``[batch head_index query_pos
    key_pos]`` (the eager pass): ``read`` gets the pattern's rows, and ``edit`` (given log A as
    the scores) replaces the pattern, a block of rows at a time."""

    def hook(pattern: torch.Tensor, hook: Any) -> torch.Tensor | None:
        job.calls += 1
        rows = _MaterializedRows(pattern)
        if job.read is not None:
            job.read(rows)
        if job.edit is None:
            return None
        out: torch.Tensor | None = None
        for q0, q1 in rows.blocks():
            new = job.edit(q0, rows.scores(q0, q1))
            if new is None:
                if out is not None:
                    out[:, :, q0:q1] = pattern[:, :, q0:q1]
                continue
            if out is None:
                out = pattern.clone()
            out[:, :, q0:q1] = new.to(out.dtype)
        return out

    return hook


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, _attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


_register()


def merged_jobs(parts: Sequence[Mapping[int, AttentionJob]]) -> dict[int, AttentionJob]:
    """The reading jobs of several reducers, one per block (a block read by several reducers
    gets one job that hands its rows to each in turn).

    Raises:
        ValueError: a reducer's job changes attention (only a pass plan,
            ``stream(passes=...)``, may run such passes).
    """
    grouped: dict[int, list[AttentionJob]] = {}
    for part in parts:
        for layer, job in part.items():
            if job.edit is not None:
                raise ValueError("stream: a reducer's attention job changes attention")
            grouped.setdefault(layer, []).append(job)
    out = {}
    for layer, group in sorted(grouped.items()):
        if len(group) == 1:
            out[layer] = group[0]
            continue
        reads = [job.read for job in group if job.read is not None]

        def read(rows: Any, reads: list[Any] = reads) -> None:
            for fn in reads:
                fn(rows)

        out[layer] = AttentionJob(read=read)
    return out
