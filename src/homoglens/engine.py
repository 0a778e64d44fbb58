"""The one streaming driver of homoglens.

Every measurement that runs a model over a corpus runs through :func:`stream`: it declares
*reducers* (which hook points they read, how one batch reduces into mergeable sums, how ranks
merge them), and the engine runs the batches: right-aligned padding, ``torch.inference_mode``
(or gradients, for attribution), device placement, the progress bar, the pass ended right after
the deepest hook point read, and the shard of the data and the all-reduce of the sums under
``torch.distributed``. Hooks are attached only here, through ``model.run_with_hooks`` (which
removes them however the pass ends).

Threads: every pass holds the model's lock (:func:`homoglens.models.model_lock`), so two
threads measuring one model take turns, and the hooks a pass attaches act in the thread that
runs it only: a user's own ``model(x)`` in another thread passes through them untouched.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from homoglens.architectures import block_hook_name, resid_hook_name
from homoglens.assets import package_version
from homoglens.blocked_attention import AttentionJob
from homoglens.data import TokenBatch, right_aligned
from homoglens.distributed import (
    all_reduce_max,
    all_reduce_sum,
    check_same_data,
    gather_rows,
    shard_bounds,
    world,
)
from homoglens.errors import ModelStateError, NonFiniteActivationError
from homoglens.fast_attention import fast_attention
from homoglens.models import model_lock
from homoglens.results import Provenance
from homoglens.results.provenance import ROW_DIGITS
from homoglens.types import HookedModel, HookFn, HookSpec
from homoglens.validate import as_bool, first_few


def _any_training(model: Any) -> bool:
    """Whether any submodule is in training mode: the check of :func:`model_device`, by an
    explicit walk of the module tree (a bridge holds ~2000 modules, which ``named_modules``'
    nested generators and name strings visit several times slower)."""
    seen = {id(model)}
    stack = [model]
    while stack:
        module = stack.pop()
        if module.training:
            return True
        for child in module._modules.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append(child)
    return False


def model_device(model: HookedModel, *, needs_grad: bool = False) -> torch.device:
    """The model's device, after the one check of its state every streaming function makes
    before its first pass.

    Refuses a model any of whose submodules is in training mode (dropout would make every
    measurement random; ``model.training`` alone misses a submodule switched back with
    ``.train()``), and, where gradients are needed (``needs_grad``), weights created under
    ``torch.inference_mode`` (autograd cannot save them for the backward pass).

    Raises:
        ModelStateError: names the submodules in training mode, or the inference-mode weights.
    """
    if _any_training(model):
        training = [name or "<model>" for name, m in model.named_modules() if m.training]
        shown = first_few(training, 5)
        raise ModelStateError(
            f"{len(training)} submodule(s) of the model are in training mode ({shown}): dropout "
            "would make every result random; call model.eval() first"
        )
    if needs_grad:
        frozen = [name for name, p in model.named_parameters() if p.is_inference()]
        if frozen:
            raise ModelStateError(
                f"{len(frozen)} weight(s) were created under torch.inference_mode ({frozen[0]}, "
                "...), so autograd cannot differentiate through them; load the model outside "
                "torch.inference_mode(), or use method='exact'"
            )
    return next(model.parameters()).device


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
        per sequence (nats, float32 as :func:`next_token_loss` gives it)."""
        hooks = [*fwd_hooks, ("unembed.hook_in", self._capture)]
        try:
            if self.exact:
                run_through(
                    self.model,
                    tokens,
                    "unembed.hook_in",
                    hooks,
                    return_type="logits",
                    jobs=jobs,
                    attention_mask=mask,
                )
                return self._from_hidden(tokens, mask)
            logits = run_logits(self.model, tokens, hooks, jobs=jobs, attention_mask=mask)
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


def batch_bounds(
    lengths: torch.Tensor, batch_size: int, uniform_length: bool
) -> list[tuple[int, int]]:
    """``(start, stop)`` of each forward batch; cut at length changes if ``uniform_length``."""
    bounds, start, n = [], 0, len(lengths)
    while start < n:
        stop = min(start + batch_size, n)
        if uniform_length:
            same = (lengths[start:stop] == lengths[start]).tolist()
            stop = start + (same.index(False) if False in same else len(same))
        bounds.append((start, stop))
        start = stop
    return bounds


class _Through(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the hook that ends a forward pass after the last hook point it needs."""


def run_through(
    model: HookedModel,
    inputs: torch.Tensor,
    last: str | Sequence[str],
    fwd_hooks: Sequence[HookSpec],
    *,
    return_type: str | None = None,
    jobs: Mapping[int, AttentionJob] | None = None,
    **kwargs: Any,
) -> None:
    """``model.run_with_hooks(inputs, return_type=None, fwd_hooks=..., **kwargs)``, ended right
    after every hook point in ``last`` has fired (and every hook on it has run): no later block,
    no final norm and no unembedding run.

    TransformerLens' ``stop_at_layer`` stops before a block, so on the bridge it cannot stop
    after the last one; this stops anywhere, on every backend, and needs no table of which hook
    point fires last. The hooks are removed by ``run_with_hooks`` as the exception leaves it.
    A pass that hooks no attention internals runs SDPA attention on the bridge
    (:mod:`homoglens.fast_attention`).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        inputs: ``[batch pos]`` token ids, or the residual stream with ``start_at_layer``.
        last: The hook point(s) read; the pass ends once all of them have fired.
        fwd_hooks: ``(hook name, hook function)`` pairs, attached for this pass only.
        return_type: Passed to ``run_with_hooks``: ``"logits"`` to end at a hook point of the
            unembedding (``HookedTransformer`` skips the unembedding with ``None``).
        jobs: ``{block: AttentionJob}``: what the pass reads from (or changes in) attention,
            a block of queries at a time (:mod:`homoglens.blocked_attention`); ``last`` must
            reach every block named.
        **kwargs: Passed to ``run_with_hooks`` (``attention_mask``, ``start_at_layer``).
    """
    names = {last} if isinstance(last, str) else set(last)
    fired: set[str] = set()

    def ender(name: str) -> HookFn:
        # Keyed by the name it was attached under: the bridge hands hooks its canonical name
        # (``hook.name``), which can differ from the alias the caller used.
        def end_when_all_fired(activation: torch.Tensor, hook: Any) -> None:
            fired.add(name)
            if fired >= names:
                raise _Through

        return end_when_all_fired

    enders = [(name, ender(name)) for name in sorted(names)]
    hooks = [*fwd_hooks, *enders]
    with model_lock(model):
        try:
            with fast_attention(model, hooks, jobs) as job_hooks:
                hooks = this_thread([*fwd_hooks, *job_hooks, *enders])
                model.run_with_hooks(inputs, return_type=return_type, fwd_hooks=hooks, **kwargs)
        except _Through:
            pass
    _check_jobs(jobs, model)


def this_thread(hooks: Sequence[HookSpec]) -> list[HookSpec]:
    """``hooks`` that act only in the thread attaching them: in another thread's pass through
    the same model (a user's ``model(x)`` while a measurement runs) each returns ``None``,
    leaving the activation as it was, and reads nothing."""
    owner = threading.get_ident()

    def owned(fn: HookFn) -> HookFn:
        def hook(activation: torch.Tensor, hook: Any) -> Any:
            if threading.get_ident() != owner:
                return None
            return fn(activation, hook=hook)

        return hook

    return [(name, owned(fn)) for name, fn in hooks]


def _check_jobs(jobs: Mapping[int, AttentionJob] | None, model: HookedModel) -> None:
    """Every attention job of a finished pass ran (else its block's attention was computed
    where homoglens could not see it, and the measurement would be silently empty).

    Raises:
        ModelStateError: names the blocks, the attention implementation the model's Hugging
            Face config asks for, and the fix.
    """
    missing = sorted(layer for layer, job in (jobs or {}).items() if job.calls == 0)
    if not missing:
        return
    config = getattr(getattr(model, "original_model", None), "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in (None, "eager"):
        fix = (
            f"its Hugging Face config asks for {implementation!r} attention, which computes the "
            "pattern where no hook sees it; set model.original_model.config."
            "_attn_implementation = 'eager' (homoglens.load_model does), or unset "
            "HOMOGLENS_EAGER so that homoglens serves the attention itself"
        )
    else:
        fix = "set HOMOGLENS_EAGER=1 to read the eager pattern instead, and please report it"
    raise ModelStateError(
        f"homoglens: the attention of blocks {missing} ran without the measurement's attention "
        f"job, so nothing of it was read: {fix}"
    )


def run_logits(
    model: HookedModel,
    inputs: torch.Tensor,
    fwd_hooks: Sequence[HookSpec],
    *,
    jobs: Mapping[int, AttentionJob] | None = None,
    **kwargs: Any,
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """A full pass with ``fwd_hooks`` attached for it only: ``model.run_with_hooks(inputs,
    return_type="logits", fwd_hooks=..., **kwargs)``; the hooks are removed however it ends.
    A pass that hooks no attention internals runs SDPA attention on the bridge
    (:mod:`homoglens.fast_attention`); ``jobs`` as for :func:`run_through`."""
    hooks = list(fwd_hooks)
    with model_lock(model), fast_attention(model, hooks, jobs) as job_hooks:
        hooks = this_thread([*hooks, *job_hooks])
        logits = model.run_with_hooks(inputs, return_type="logits", fwd_hooks=hooks, **kwargs)
    _check_jobs(jobs, model)
    return logits


class Reducer:
    """One measurement's share of a streamed pass; override what the measurement needs.

    A reducer declares the hook points it reads (:meth:`hooks`: read-only hook functions that
    reduce activations into sums the reducer holds), hears of each batch before and after its
    pass (:meth:`begin`, :meth:`end`), may ask for the logits (``needs_logits``), and merges its
    sums over ranks under ``torch.distributed`` (:meth:`all_reduce`). Sums must be mergeable:
    the result of a split corpus equals the result of one pass.
    """

    needs_logits: bool = False

    def hooks(self) -> list[HookSpec]:
        """``(hook name, hook function)`` pairs the pass attaches; none by default."""
        return []

    def jobs(self) -> dict[int, AttentionJob]:
        """``{block: AttentionJob}``: what the pass reads from each block's attention, a block
        of queries at a time (:mod:`homoglens.blocked_attention`); none by default. Reading
        jobs only (no ``edit``): a pass that changes attention runs its own ``step``."""
        return {}

    def begin(
        self, tokens: Int[torch.Tensor, "batch pos"], mask: Int[torch.Tensor, "batch pos"]
    ) -> None:
        """Called before each batch's pass (right-aligned tokens and mask, on the device)."""

    def logits(
        self,
        logits: Float[torch.Tensor, "batch pos d_vocab"],
        tokens: Int[torch.Tensor, "batch pos"],
        mask: Int[torch.Tensor, "batch pos"],
    ) -> None:
        """Called after a full pass when ``needs_logits`` is set."""

    def end(self) -> None:
        """Called after each batch's pass."""

    def all_reduce(self, n_all: int, device: torch.device) -> None:
        """Merge this rank's sums with the other ranks' (only called when the world size is
        above 1; ``n_all`` is the number of sequences over all ranks)."""


class Sums(Reducer):
    """A reducer whose state is named tensors that merge over ranks: ``sums`` by addition,
    ``maxima`` by elementwise maximum, ``rows`` (per-sequence values, a list of
    ``[batch ...]`` parts) by gathering in input order.

    The hooks are closures of the measurement that add into those tensors; ``batch`` holds the
    current batch's ``tokens``, ``mask`` and ``lengths`` while its pass runs.
    """

    def __init__(
        self,
        hooks: Sequence[HookSpec] = (),
        *,
        sums: dict[str, torch.Tensor] | None = None,
        maxima: dict[str, torch.Tensor] | None = None,
        rows: dict[str, tuple[int, ...]] | None = None,
        jobs: Mapping[int, AttentionJob] | None = None,
    ) -> None:
        self._hooks = list(hooks)
        self._jobs = dict(jobs or {})
        self.sums = dict(sums or {})
        self.maxima = dict(maxima or {})
        self._row_shapes = dict(rows or {})
        self.rows: dict[str, list[torch.Tensor]] = {name: [] for name in self._row_shapes}
        self.batch: dict[str, torch.Tensor] = {}

    def hooks(self) -> list[HookSpec]:
        """The hooks declared at construction and with :meth:`add_hooks`."""
        return list(self._hooks)

    def add_hooks(self, hooks: Sequence[HookSpec]) -> None:
        """Declare more hook points read (built after the sums they add into)."""
        self._hooks.extend(hooks)

    def jobs(self) -> dict[int, AttentionJob]:
        """The attention jobs declared at construction and with :meth:`add_jobs`."""
        return dict(self._jobs)

    def add_jobs(self, jobs: Mapping[int, AttentionJob]) -> None:
        """Declare attention read in more blocks."""
        self._jobs.update(jobs)

    def begin(self, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        """Hold the batch's ``tokens``, ``mask`` and ``lengths`` for the hooks."""
        self.batch.update(tokens=tokens, mask=mask, lengths=mask.sum(1))

    def end(self) -> None:
        """Drop the batch."""
        self.batch.clear()

    def row_values(self, name: str) -> torch.Tensor:
        """The per-sequence values ``name`` of every sequence seen, concatenated (CPU)."""
        empty = torch.empty(0, *self._row_shapes[name], dtype=torch.float64, device="cpu")
        return torch.cat([empty, *(part.cpu().to(torch.float64) for part in self.rows[name])])

    def all_reduce(self, n_all: int, device: torch.device) -> None:
        """Sum ``sums``, maximise ``maxima`` and gather ``rows`` over ranks, in place."""
        # The collectives run on the model's device (NCCL needs CUDA tensors); results are
        # copied back into the tensors the measurement holds, wherever they live.
        for merge, tensors in ((all_reduce_sum, self.sums), (all_reduce_max, self.maxima)):
            moved = {name: t.to(device) for name, t in tensors.items()}
            merge(moved.values())
            for name, t in tensors.items():
                t.copy_(moved[name])
        for name in self.rows:
            self.rows[name] = [gather_rows(self.row_values(name), n_all, device)]


def stream(
    model: HookedModel,
    batch: TokenBatch,
    reducers: Sequence[Reducer],
    *,
    batch_size: int,
    desc: str,
    progress: bool,
    extra_hooks: Sequence[HookSpec] = (),
    step: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    uniform_length: bool = False,
    needs_grad: bool = False,
) -> torch.device:
    """Run ``batch`` through ``model`` once, feeding every reducer: the one streaming loop.

    Each rank takes its shard of ``batch`` (:func:`homoglens.distributed.shard_bounds`; all of
    it without a process group); batches are right-aligned and moved to the model's device and
    run under ``torch.inference_mode`` (``needs_grad``: with gradients on, for attribution).
    Without ``step``, each batch runs one pass with ``extra_hooks`` (interventions) and every
    reducer's hooks, ended after the last hook point read, or to the logits if a reducer needs
    them. With ``step``, ``step(tokens, mask)`` runs the batch's passes itself (several per
    batch: patching, exact attribution) through :func:`run_through` / :func:`run_logits`.
    After the last batch, under ``torch.distributed``, each reducer merges its sums over ranks.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``, in eval mode.
        batch: The sequences (the same on every rank).
        reducers: What the pass feeds.
        batch_size: Sequences per forward pass.
        desc: Progress-bar label.
        progress: Show a tqdm progress bar.
        extra_hooks: Hooks that change the pass (interventions), attached before the reducers'.
        step: Runs a batch's passes itself, instead of the one pass per batch.
        uniform_length: No forward batch mixes sequence lengths.
        needs_grad: Run with gradients enabled (and check the weights allow a backward pass).

    Returns:
        The model's device.

    Raises:
        InvalidInputError: ``progress`` is not a bool.
        ModelStateError: a submodule is in training mode (or inference-mode weights with
            ``needs_grad``).
        DistributedError: the ranks hold different data, or a collective failed.
    """
    progress = as_bool("progress", progress)  # every measurement's progress= lands here
    device = model_device(model, needs_grad=needs_grad)
    n_all = len(batch)
    rank, size = world()
    check_same_data(batch.tokens, batch.attention_mask, device)
    warn_duplicates(batch)
    start, stop = shard_bounds(n_all, size)[rank]
    guard = FiniteGuard()
    reader_hooks = guard.wrap([spec for reducer in reducers for spec in reducer.hooks()])
    fwd_hooks = [*extra_hooks, *reader_hooks]
    jobs = merged_jobs([reducer.jobs() for reducer in reducers])
    needs_logits = any(reducer.needs_logits for reducer in reducers)
    read = [name for name, _ in reader_hooks]
    if jobs:  # the deepest attention read has run (eager bridges fire some patterns late)
        read.append(block_hook_name(max(jobs), "hook_resid_post"))
    if step is None and not needs_logits and not read:
        raise ValueError("stream: no reducer reads a hook point and none needs the logits")
    batches = forward_batches(
        batch[start:stop],
        batch_size,
        device,
        desc=desc,
        progress=progress,
        uniform_length=uniform_length,
        needs_grad=needs_grad,
    )
    # Closed however the loop ends: a generator left suspended by an error would keep its
    # inference mode (or enabled grad) switched on for the caller until the garbage collector
    # found it, which a traceback held in a reference cycle can delay indefinitely.
    with model_lock(model), contextlib.closing(batches):
        for tokens, mask in batches:
            guard.mask = mask
            for reducer in reducers:
                reducer.begin(tokens, mask)
            if step is not None:
                step(tokens, mask)
            elif needs_logits:
                logits = run_logits(model, tokens, fwd_hooks, jobs=jobs, attention_mask=mask)
                for reducer in reducers:
                    if reducer.needs_logits:
                        reducer.logits(logits, tokens, mask)
                del logits
            else:
                run_through(model, tokens, read, fwd_hooks, jobs=jobs, attention_mask=mask)
            guard.check()
            for reducer in reducers:
                reducer.end()
    if size > 1:
        for reducer in reducers:
            reducer.all_reduce(n_all, device)
    return device


class FiniteGuard:
    """The one check of the activations every reducer reads: NaN or inf at a real token of a
    ``[batch pos ...]`` activation is a :class:`~homoglens.errors.NonFiniteActivationError`
    naming the hook point, never a vector silently counted as zero (a norm that is NaN is not
    ``> 0``). The hooks only OR a flag on the device; :meth:`check` reads the flags back once
    per batch, after its pass (nothing in a per-layer hook syncs with the host)."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None
        self.flags: dict[str, torch.Tensor] = {}

    def wrap(self, hooks: Sequence[HookSpec]) -> list[HookSpec]:
        """``hooks``, each first marking a non-finite value at a real token of its input."""

        def guarded(name: str, fn: HookFn) -> HookFn:
            def hook(activation: torch.Tensor, hook: Any) -> Any:
                mask = self.mask
                if (
                    mask is not None
                    and activation.is_floating_point()
                    and activation.ndim >= 3
                    and tuple(activation.shape[:2]) == tuple(mask.shape)
                ):
                    bad = ~torch.isfinite(activation.detach()).flatten(2).all(-1)
                    hit = (bad & mask.bool()).any()
                    old = self.flags.get(name)
                    self.flags[name] = hit if old is None else old | hit
                return fn(activation, hook=hook)

            return hook

        return [(name, guarded(str(name), fn)) for name, fn in hooks]

    def check(self) -> None:
        """Raise if a hook saw NaN or inf at a real token in this batch; reset the flags.

        Raises:
            NonFiniteActivationError: names the hook points.
        """
        if not self.flags:
            return
        names = list(self.flags)
        hits = torch.stack([flag.reshape(()) for flag in self.flags.values()]).cpu().tolist()
        self.flags = {}
        bad = [name for name, hit in zip(names, hits, strict=True) if hit]
        if bad:
            raise NonFiniteActivationError(
                f"the residual stream (or the activation read) holds NaN or inf at real tokens "
                f"at {first_few(bad, 4)}; nothing was averaged in. Check the model's weights and "
                "dtype (float16 overflows; try float32 or bfloat16)"
            )


def warn_duplicates(batch: TokenBatch) -> int:
    """Warn when some sequences of ``batch`` are exact copies of others (the same real tokens):
    intervals over windows count each copy as an independent unit of replication, so they come
    out too narrow (a text repeated 50 times shows no spread at all). Returns the number of
    surplus copies."""
    if len(batch) < 2:
        return 0
    mask = batch.attention_mask.detach().cpu().bool()
    lengths = mask.sum(1)
    # Rows compared by their real tokens, left-aligned (the padding side does not matter).
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    rows = torch.gather(batch.tokens.detach().cpu().long(), 1, order)
    rows = rows.masked_fill(torch.arange(rows.shape[1], device=rows.device) >= lengths[:, None], -1)
    return said_copies(rows, stacklevel=4)


def said_copies(rows: torch.Tensor, *, stacklevel: int = 3) -> int:
    """The number of rows of ``rows`` (``[batch ...]``) that are exact copies of others, said
    with a warning when there are any (see :func:`warn_duplicates`)."""
    n = int(rows.shape[0])
    copies = n - int(torch.unique(rows.reshape(n, -1), dim=0).shape[0]) if n > 1 else 0
    if copies:
        import warnings

        warnings.warn(
            f"homoglens: {copies} of the {n} sequences are exact copies of others; "
            "intervals over windows treat every copy as an independent window and come out "
            "too narrow (and a baseline pairs tokens with their own copies). Measure distinct "
            "windows (deduplicate the texts)",
            UserWarning,
            stacklevel=stacklevel,
        )
    return copies


def merged_jobs(parts: Sequence[Mapping[int, AttentionJob]]) -> dict[int, AttentionJob]:
    """The reading jobs of several reducers, one per block (a block read by several reducers
    gets one job that hands its rows to each in turn).

    Raises:
        ValueError: a reducer's job changes attention (only a ``step`` may run such passes).
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


def forward_batches(
    batch: TokenBatch,
    batch_size: int,
    device: torch.device,
    *,
    desc: str,
    progress: bool,
    uniform_length: bool = False,
    needs_grad: bool = False,
) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
    """Yield right-aligned ``(tokens, attention_mask)`` batches on ``device``, under
    ``torch.inference_mode`` (``needs_grad``: with gradients on) and with a tqdm progress bar;
    the batches of :func:`stream`."""
    bar = tqdm(total=len(batch), unit="seq", desc=desc, disable=not progress)
    mode = torch.enable_grad() if needs_grad else torch.inference_mode()
    try:
        with mode:
            for start, stop in batch_bounds(batch.lengths, batch_size, uniform_length):
                tokens, mask = right_aligned(
                    batch.tokens[start:stop], batch.attention_mask[start:stop]
                )
                yield tokens.to(device), mask.to(device)
                bar.update(stop - start)
    finally:
        bar.close()


def provenance_of(
    info: Any, batch: TokenBatch, chosen: Sequence[int], exclude_first: bool
) -> Provenance:
    """The :class:`~homoglens.results.Provenance` of a measurement of ``model_info`` ``info``
    on ``batch`` at the residual-axis entries ``chosen``: the model, the data and its
    :func:`token_sha256`, and the homoglens, TransformerLens, torch and transformers versions."""
    return Provenance(
        model=info.name,
        family=info.family,
        backend=info.backend,
        weights=info.weights,
        dtype=info.dtype,
        model_source=info.source,
        hook_points=tuple(resid_hook_name(layer) for layer in chosen),
        bos=batch.bos,
        data=batch.description,
        exclude_first=exclude_first,
        homoglens_version=package_version("homoglens"),
        transformer_lens_version=package_version("transformer-lens"),
        torch_version=torch.__version__,
        transformers_version=package_version("transformers"),
        model_revision=info.revision,
        data_sha256=token_sha256(batch),
        data_rows=token_rows(batch),
        foreign_hooks=info.hooks,
    )


def token_sha256(batch: TokenBatch) -> str:
    """The content hash of a batch's tokens: sha256 over the rows in order, each row its
    length and then its real token ids (pads left out, so the padding side and pad ids do not
    matter), as little-endian int64. The same tokens streamed from a dataset hash the same
    (``DatasetStream.sha256``), so merges see overlapping data
    whichever way it was given.

    Examples:
        >>> import torch
        >>> from homoglens.data import TokenBatch
        >>> ids = torch.tensor([[5, 6, 7]])
        >>> batch = TokenBatch(ids, torch.ones_like(ids), bos=False, description="ids")
        >>> len(token_sha256(batch))
        64
    """
    import hashlib

    digest = hashlib.sha256()
    for row in row_bytes(batch):
        digest.update(row)
    return digest.hexdigest()


def row_bytes(batch: TokenBatch) -> Iterator[bytes]:
    """Each sequence of ``batch`` as the bytes its hashes read: its length, then its real
    token ids (pads left out), as little-endian int64."""
    import numpy as np

    mask = batch.attention_mask.detach().cpu().bool()
    tokens = batch.tokens.detach().cpu().long()
    for row, keep in zip(tokens, mask, strict=True):
        real = row[keep].numpy().astype("<i8")
        yield np.asarray([len(real)], dtype="<i8").tobytes() + real.tobytes()


def row_fingerprint(row: bytes) -> str:
    """The fingerprint of one sequence in ``Provenance.data_rows``: the first 8 bytes of the
    sha256 of its :func:`row_bytes`, as 16 hex digits."""
    import hashlib

    return hashlib.sha256(row).hexdigest()[:ROW_DIGITS]


def token_rows(batch: TokenBatch) -> str:
    """``Provenance.data_rows`` of ``batch``: the fingerprint of each sequence, in order."""
    return "".join(row_fingerprint(row) for row in row_bytes(batch))
