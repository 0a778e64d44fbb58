"""The next-token losses of homoglens (moved out of :mod:`homoglens.run.engine`, issue 40).

Per-target cross-entropy read from the logits a block of rows at a time
(:func:`next_token_nll`), its mean per sequence over real targets (:func:`next_token_loss`,
:func:`mean_nll`), the loss of full passes read from the unembedding's input
(:class:`LossHead`, whose passes the engine runs: :class:`homoglens.run.engine.Pass`), and the
in-context-learning score and induction loss of Olsson et al. 2022 (:func:`icl_score`,
:func:`induction_tokens`, :func:`induction_loss`).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from jaxtyping import Float, Int

from homoglens.core.types import HookedModel, HookSpec
from homoglens.models.architectures import UNEMBED_IN
from homoglens.run.blocked_attention import AttentionJob
from homoglens.run.engine import Pass, Sums, run_plan


def next_token_nll(
    logits: Float[torch.Tensor, "batch pos d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
) -> Float[torch.Tensor, "batch target"]:
    """Next-token cross-entropy (nats) of every target: ``logsumexp(z) - z[target]`` of the
    logits at position p for the token at p + 1 (``target`` = pos - 1), along the vocabulary
    (the last, contiguous axis), in float32, a block of rows at a time: no copy of the
    ``[batch pos d_vocab]`` logits is made (the transposed ``[batch d_vocab pos]`` layout that
    ``cross_entropy`` wants for 3-d input cost 17 % of an ablation study's time; each block is
    passed as 2-d ``[row d_vocab]``), and the temporaries stay small (about 4 MB: fresh large
    buffers cost page faults on every call)."""
    n_batch, n_pos, n_vocab = (int(s) for s in logits.shape)
    out = torch.empty(n_batch, max(n_pos - 1, 0), dtype=torch.float32, device=logits.device)
    for b in range(n_batch):
        _nll_rows(logits[b, :-1], tokens[b, 1:], out[b])
    return out


def _nll_rows(
    z_all: Float[torch.Tensor, "row d_vocab"],
    targets: Int[torch.Tensor, " row"],
    out: Float[torch.Tensor, " row"],
) -> None:
    """``out = logsumexp(z) - z[target]`` per row, in float32, ~1M floats at a time: the fused
    ``cross_entropy`` kernel on ``[row d_vocab]`` blocks (one pass for the row maxima, one for
    the sums of exponentials; 3 x faster on CPU than ``logsumexp``'s max, subtract, exp, sum)."""
    rows = max(1, (1 << 20) // max(int(z_all.shape[-1]), 1))
    for start in range(0, int(z_all.shape[0]), rows):
        z = z_all[start : start + rows].float()
        tgt = targets[start : start + rows].long()
        out[start : start + rows] = torch.nn.functional.cross_entropy(z, tgt, reduction="none")


class LossHead:
    """The next-token loss of full passes, read from the unembedding's input a block of rows at
    a time through one reused buffer, instead of from ``[batch pos d_vocab]`` logits.

    A pass that needs only the loss (the attention-bias study's) ends at ``unembed.hook_in``;
    the head multiplies the final residual by the unembedding (``W_U``, ``b_U``: the bridge's
    ``lm_head`` or ``HookedTransformer``'s ``Unembed``) into a buffer of at most 32M values and
    takes each row's logsumexp there. The first pass it serves runs in full: where the
    per-sequence losses of the two ways are not bit for bit equal (a logit soft-cap or scale
    after the unembedding, an unembedding of another form, another matrix-product library) it
    keeps the model's own logits for every pass. No ``[batch pos d_vocab]`` tensor is
    allocated: each pass's fresh logits cost the page faults of their first touch (0.4 GB at
    8 x 256 for a 49k vocabulary; 2 GB for a 256k one), which on a 2-core virtual machine made
    a pass's unembedding take 1.5-4 x its usual time.
    """

    _BUFFER = 1 << 25

    def __init__(self, model: HookedModel) -> None:
        self.model = model
        self.exact: bool | None = None  # unknown until the first pass
        self.hidden: torch.Tensor | None = None
        self.buffer: torch.Tensor | None = None
        self.weights = _unembedding(model)
        if self.weights is None:
            self.exact = False

    def _capture(self, x: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
        self.hidden = x

    def loss(
        self,
        tokens: Int[torch.Tensor, "batch pos"],
        fwd_hooks: Sequence[HookSpec],
        mask: Int[torch.Tensor, "batch pos"],
        *,
        jobs: Mapping[int, AttentionJob] | None = None,
    ) -> Float[torch.Tensor, " batch"]:
        """One full pass with ``fwd_hooks`` (and attention ``jobs``): the mean next-token loss
        per sequence (nats, float32 as :func:`next_token_loss` gives it): the plan of
        :meth:`loss_of`, run by the engine (:func:`homoglens.run.engine.run_plan`)."""
        asked = Pass(tokens, fwd_hooks, jobs=jobs, attention_mask=mask)
        return run_plan(self.model, self.loss_of(asked))

    def loss_of(
        self, asked: Pass
    ) -> Generator[Pass, torch.Tensor | None, Float[torch.Tensor, " batch"]]:
        """The pass plan (:data:`homoglens.run.engine.PassPlan`) of :meth:`loss`: the full pass
        ``asked`` (token ids, hooks, attention jobs and mask; no ``last``), ended at the
        unembedding's input where the check allows; ``yield from`` it gives the mean
        next-token loss per sequence.

        Args:
            asked: The pass to the logits whose loss is read.
        """
        tokens, mask = asked.inputs, asked.attention_mask
        assert mask is not None
        hooks = [*asked.hooks, (UNEMBED_IN, self._capture)]
        try:
            if self.exact:
                yield replace(asked, hooks=hooks, last=UNEMBED_IN, return_type="logits")
                return self._from_hidden(tokens, mask)
            logits = yield replace(asked, hooks=hooks)
            assert logits is not None
            full = next_token_loss(logits, tokens, mask)
            del logits  # before the check allocates its buffer
            if self.exact is None:  # (a backend whose unembedding fires no hook_in: never)
                self.exact = self.hidden is not None and torch.equal(
                    full, self._from_hidden(tokens, mask)
                )
                if not self.exact:
                    self.buffer = None
            return full
        finally:
            self.hidden = None

    def _from_hidden(
        self, tokens: Int[torch.Tensor, "batch pos"], mask: Int[torch.Tensor, "batch pos"]
    ) -> Float[torch.Tensor, " batch"]:
        assert self.hidden is not None and self.weights is not None
        w_u, b_u = self.weights
        x = self.hidden[:, :-1]
        n_batch, n_target = int(x.shape[0]), int(x.shape[1])
        n_vocab = int(w_u.shape[-1])
        # whole sequences per block where they fit, so that every block has the same rows
        per = max(1, self._BUFFER // max(n_target * n_vocab, 1))
        rows = per * n_target if n_target * n_vocab <= self._BUFFER else self._BUFFER // n_vocab
        rows = max(1, min(rows, n_batch * n_target))
        if (
            self.buffer is None
            or self.buffer.shape[0] < rows
            or self.buffer.shape[1] != n_vocab
            or self.buffer.dtype != x.dtype
            or self.buffer.device != x.device
        ):
            self.buffer = torch.empty(rows, n_vocab, dtype=x.dtype, device=x.device)
        flat = x.reshape(-1, int(x.shape[-1]))
        targets = tokens[:, 1:].reshape(-1)
        nll = torch.empty(n_batch * n_target, dtype=torch.float32, device=x.device)
        for start in range(0, int(flat.shape[0]), rows):
            part = flat[start : start + rows]
            z = self.buffer[: int(part.shape[0])]
            if b_u is None:
                torch.mm(part, w_u, out=z)
            else:
                torch.addmm(b_u, part, w_u, out=z)
            _nll_rows(z, targets[start : start + rows], nll[start : start + rows])
        return mean_nll(nll.view(n_batch, n_target), mask)


def _unembedding(model: HookedModel) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(W_U [d_model d_vocab], b_U or None)`` of a plain linear unembedding, else ``None``."""
    unembed = getattr(model, "unembed", None)
    inner = getattr(unembed, "original_component", None)
    if isinstance(inner, torch.nn.Linear):
        return inner.weight.t(), inner.bias
    w_u, b_u = getattr(unembed, "W_U", None), getattr(unembed, "b_U", None)
    if isinstance(w_u, torch.Tensor) and w_u.ndim == 2:
        return w_u, b_u if isinstance(b_u, torch.Tensor) else None
    return None


def next_token_loss(
    logits: Float[torch.Tensor, "batch pos d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
    mask: Int[torch.Tensor, "batch pos"],
) -> Float[torch.Tensor, " batch"]:
    """Mean next-token cross-entropy (nats) per sequence over real target tokens
    (:func:`next_token_nll`)."""
    return mean_nll(next_token_nll(logits, tokens), mask)


class MeanLoss(Sums):
    """A reducer of one streamed pass to the logits: the mean over sequences of each
    sequence's mean next-token cross-entropy (nats/token, :func:`next_token_loss`), summed in
    float64 and merged over ranks by the engine."""

    needs_logits = True

    def __init__(self) -> None:
        here = {"dtype": torch.float64, "device": "cpu"}
        super().__init__(sums={"total": torch.zeros((), **here), "count": torch.zeros((), **here)})

    def logits(
        self,
        logits: Float[torch.Tensor, "batch pos d_vocab"],
        tokens: Int[torch.Tensor, "batch pos"],
        mask: Int[torch.Tensor, "batch pos"],
    ) -> None:
        """Add the batch's per-sequence losses."""
        loss = next_token_loss(logits, tokens, mask).double()
        self.sums["total"] += float(loss.sum())
        self.sums["count"] += int(loss.numel())

    @property
    def value(self) -> float:
        """The mean loss over every sequence seen (0 when none was)."""
        return float(self.sums["total"]) / max(float(self.sums["count"]), 1.0)


class WindowLoss(Sums):
    """A reducer of one streamed pass to the logits: each sequence's mean next-token
    cross-entropy (nats/token, :func:`next_token_loss`), gathered in input order and over ranks
    by the engine (``row_values("loss")``: ``[batch]`` float64)."""

    needs_logits = True

    def __init__(self) -> None:
        super().__init__(rows={"loss": ()})

    def logits(
        self,
        logits: Float[torch.Tensor, "batch pos d_vocab"],
        tokens: Int[torch.Tensor, "batch pos"],
        mask: Int[torch.Tensor, "batch pos"],
    ) -> None:
        """Keep the batch's per-sequence losses."""
        self.rows["loss"].append(next_token_loss(logits, tokens, mask).double())


def mean_nll(
    nll: Float[torch.Tensor, "batch target"], mask: Int[torch.Tensor, "batch pos"]
) -> Float[torch.Tensor, " batch"]:
    """Mean of per-target losses over real targets (a target and its context token real)."""
    valid = (mask[:, 1:] * mask[:, :-1]).to(nll.dtype)
    return (nll * valid).sum(1) / valid.sum(1).clamp_min(1)


def icl_score(
    nll: Float[torch.Tensor, "batch target"], mask: Int[torch.Tensor, "batch pos"]
) -> Float[torch.Tensor, " batch"]:
    """In-context-learning score per sequence (Olsson et al. 2022, arXiv 2209.11895): the mean
    loss of the last eighth of the sequence's real tokens minus that of the second eighth
    (nats; negative when later tokens, with more context, are predicted better). Tokens are
    counted from each sequence's own first real token; NaN for fewer than 16 real tokens.

    Args:
        nll: ``[batch target]`` per-target losses (:func:`next_token_nll`).
        mask: ``[batch pos]`` 0/1 real tokens (right-padded).

    Returns:
        ``[batch]`` float64.
    """
    n = mask.sum(1).to(torch.long)  # real tokens (right-padded: positions 0..n-1)
    p = torch.arange(1, mask.shape[1], device=nll.device)[None]  # position of each target
    eighth = n[:, None] // 8
    early = (p >= eighth) & (p < 2 * eighth)
    late = (p >= n[:, None] - eighth) & (p < n[:, None])
    x = nll.double()

    def mean(sel: torch.Tensor) -> torch.Tensor:
        w = sel.to(x.dtype)
        return (x * w).sum(1) / w.sum(1).clamp_min(1)

    out = mean(late) - mean(early)
    return torch.where(n >= 16, out, torch.full_like(out, math.nan))


def induction_tokens(
    d_vocab: int, *, n_seq: int = 8, half: int = 32, bos: int | None = None, seed: int = 0
) -> Int[torch.Tensor, "batch pos"]:
    """Repeated random-token sequences for the induction loss (Olsson et al. 2022): ``[BOS]`` +
    r + r, r of ``half`` tokens drawn uniformly from ids 0..d_vocab-1 (seeded).

    Returns:
        ``[n_seq, (1 if bos is not None else 0) + 2 * half]`` int64.
    """
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, d_vocab, (n_seq, half), generator=gen, device="cpu")
    out = torch.cat([r, r], 1)
    if bos is not None:
        out = torch.cat([torch.full((n_seq, 1), bos, dtype=out.dtype, device="cpu"), out], 1)
    return out


def induction_loss(
    nll: Float[torch.Tensor, "batch target"], half: int
) -> Float[torch.Tensor, " batch"]:
    """Mean loss over the second repeat's tokens but its first (the ones an induction head can
    copy) of :func:`induction_tokens` sequences, per sequence (nats, float64)."""
    return nll[:, -(half - 1) :].double().mean(1)
