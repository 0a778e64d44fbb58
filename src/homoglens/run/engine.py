"""The one streaming driver of homoglens.

Every measurement that runs a model over a corpus runs through :func:`stream`: it declares
*reducers* (which hook points they read, how one batch reduces into mergeable sums, how ranks
merge them), and the engine runs the batches: right-aligned padding, ``torch.inference_mode``
(or gradients, for attribution), device placement, the progress bar, the pass ended right after
the deepest hook point read, and the shard of the data and the all-reduce of the sums under
``torch.distributed``. A measurement that needs several passes per batch (patching, the
attention-bias study, attribution) hands the engine a pass plan: a generator of :class:`Pass`
es, each run here (:func:`run_plan`) through the single-pass primitives of
:mod:`homoglens.run.forward`, so every forward pass of a measurement is run by the engine. Hooks are
attached only there, through ``model.run_with_hooks`` (which removes them however the pass
ends).

Threads: every pass holds the model's lock (:func:`homoglens.models.loading.model_lock`), so two
threads measuring one model take turns, and the hooks a pass attaches act in the thread that
runs it only: a user's own ``model(x)`` in another thread passes through them untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from homoglens.core.distributed import (
    all_reduce_max,
    all_reduce_sum,
    check_same_data,
    gather_rows,
    shard_bounds,
    world,
)
from homoglens.core.errors import ModelStateError, NonFiniteActivationError
from homoglens.core.types import HookedModel, HookFn, HookSpec
from homoglens.core.validate import as_bool, first_few
from homoglens.models.architectures import component_hook_name
from homoglens.models.loading import model_lock
from homoglens.run.blocked_attention import AttentionJob, merged_jobs
from homoglens.run.data import TokenBatch, right_aligned
from homoglens.run.forward import Pass as Pass
from homoglens.run.forward import PassPlan as PassPlan
from homoglens.run.forward import run_logits as run_logits
from homoglens.run.forward import run_through as run_through
from homoglens.run.forward import this_thread as this_thread

# Re-exported (issue 40 moved them to homoglens.run.provenance; the measurements and the tests
# import them from here): provenance_of, token_sha256.
from homoglens.run.provenance import provenance_of as provenance_of
from homoglens.run.provenance import token_sha256 as token_sha256


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


def _run(model: HookedModel, p: Pass) -> torch.Tensor | None:
    """Run one :class:`Pass`: :func:`run_logits` without ``last`` (its logits), else
    :func:`run_through` (``None``); ``attention_mask`` and ``start_at_layer`` passed only when
    set."""
    kwargs: dict[str, Any] = {}
    if p.attention_mask is not None:
        kwargs["attention_mask"] = p.attention_mask
    if p.start_at_layer is not None:
        kwargs["start_at_layer"] = p.start_at_layer
    if p.last is None:
        return run_logits(model, p.inputs, p.hooks, jobs=p.jobs, **kwargs)
    run_through(model, p.inputs, p.last, p.hooks, return_type=p.return_type, jobs=p.jobs, **kwargs)
    return None


def run_plan(model: HookedModel, plan: PassPlan) -> Any:
    """Run every pass ``plan`` yields, sending each one's logits (or ``None``) back, and give
    the plan's return value. The plan is closed however this ends, so that no context it
    entered around a ``yield`` stays entered after an error.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        plan: The passes (see :data:`PassPlan`).

    Returns:
        What the plan returns.
    """
    with contextlib.closing(plan):
        try:
            asked = next(plan)
            while True:
                asked = plan.send(_run(model, asked))
        except StopIteration as done:
            return done.value


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
        of queries at a time (:mod:`homoglens.run.blocked_attention`); none by default. Reading
        jobs only (no ``edit``): a pass that changes attention runs its own ``passes``."""
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
    passes: Callable[[torch.Tensor, torch.Tensor], PassPlan] | None = None,
    uniform_length: bool = False,
    needs_grad: bool = False,
) -> torch.device:
    """Run ``batch`` through ``model`` once, feeding every reducer: the one streaming loop.

    Each rank takes its shard of ``batch`` (:func:`homoglens.core.distributed.shard_bounds`; all of
    it without a process group); batches are right-aligned and moved to the model's device and
    run under ``torch.inference_mode`` (``needs_grad``: with gradients on, for attribution).
    Without ``passes``, each batch runs one pass with ``extra_hooks`` (interventions) and every
    reducer's hooks, ended after the last hook point read, or to the logits if a reducer needs
    them. With ``passes``, ``passes(tokens, mask)`` is the batch's pass plan (several passes
    per batch: patching, the bias study's strengths, exact attribution): a generator that
    yields each :class:`Pass` and is sent back its logits (:data:`PassPlan`); the engine runs
    them, one after the other (:func:`run_plan`). Every forward pass of a measurement runs
    here. After the last batch, under ``torch.distributed``, each reducer merges its sums over
    ranks.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``, in eval mode.
        batch: The sequences (the same on every rank).
        reducers: What the pass feeds.
        batch_size: Sequences per forward pass.
        desc: Progress-bar label.
        progress: Show a tqdm progress bar.
        extra_hooks: Hooks that change the pass (interventions), attached before the reducers'.
        passes: A batch's pass plan, instead of the one pass per batch.
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
    check_same_data(batch.tokens, batch.attention_mask, device)
    warn_duplicates(batch)
    start, stop = rank_windows(n_all)
    guard = FiniteGuard()
    reader_hooks = guard.wrap([spec for reducer in reducers for spec in reducer.hooks()])
    fwd_hooks = [*extra_hooks, *reader_hooks]
    jobs = merged_jobs([reducer.jobs() for reducer in reducers])
    needs_logits = any(reducer.needs_logits for reducer in reducers)
    read = [name for name, _ in reader_hooks]
    if jobs:  # the deepest attention read has run (eager bridges fire some patterns late)
        read.append(component_hook_name(max(jobs), "resid_post"))
    if passes is None and not needs_logits and not read:
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
            if passes is not None:
                run_plan(model, passes(tokens, mask))
            elif needs_logits:
                logits = _run(model, Pass(tokens, fwd_hooks, jobs=jobs, attention_mask=mask))
                assert logits is not None
                for reducer in reducers:
                    if reducer.needs_logits:
                        reducer.logits(logits, tokens, mask)
                del logits
            else:
                _run(model, Pass(tokens, fwd_hooks, read, jobs=jobs, attention_mask=mask))
            guard.check()
            for reducer in reducers:
                reducer.end()
    merge(reducers, n_all, device)
    return device


def rank_windows(n: int) -> tuple[int, int]:
    """``(start, stop)``: the windows of ``n`` this rank runs, as :func:`stream` shards them
    (:func:`~homoglens.core.distributed.shard_bounds`; all ``n`` without a process group). The
    one place a measurement learns its shard."""
    rank, size = world()
    return shard_bounds(n, size)[rank]


def merge(reducers: Sequence[Reducer], n_all: int, device: torch.device) -> None:
    """Merge every reducer's sums over ranks under ``torch.distributed`` (nothing at world
    size 1): what :func:`stream` runs after its last batch, and what a measurement that replays
    activations it kept (no pass, so no stream) calls instead. The one place a measurement's
    sums cross ranks.

    Args:
        reducers: The reducers whose sums to merge (:meth:`Reducer.all_reduce`).
        n_all: Sequences over all ranks (per-sequence rows are gathered to this many).
        device: The model's device (NCCL needs CUDA tensors).

    Raises:
        DistributedError: a collective failed (another rank stopped).
    """
    if world()[1] > 1:
        for reducer in reducers:
            reducer.all_reduce(n_all, device)


class FiniteGuard:
    """The one check of the activations every reducer reads: NaN or inf at a real token of a
    ``[batch pos ...]`` activation is a :class:`~homoglens.core.errors.NonFiniteActivationError`
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
