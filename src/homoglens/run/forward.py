"""One forward pass through a TransformerLens model, with hooks attached for it alone: the
primitives :mod:`homoglens.run.engine` runs every pass of a measurement with.

:func:`run_through` ends a pass right after the hook points it reads; :func:`run_logits` runs it
to the logits; :class:`Pass` is one such pass as a measurement's pass plan asks for it
(:data:`PassPlan`). Only the engine calls them for a measurement (``homoglens.run.engine.run_plan``
and ``stream``); they are public for tests and benchmarks. Hooks are attached only through
``model.run_with_hooks`` (which removes them however the pass ends), act in the attaching
thread only (:func:`this_thread`), and every pass holds the model's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from homoglens.core.errors import ModelStateError
from homoglens.core.types import HookedModel, HookFn, HookSpec
from homoglens.models.loading import model_lock
from homoglens.run.blocked_attention import AttentionJob
from homoglens.run.fast_attention import fast_attention


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
    (:mod:`homoglens.run.fast_attention`).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        inputs: ``[batch pos]`` token ids, or the residual stream with ``start_at_layer``.
        last: The hook point(s) read; the pass ends once all of them have fired.
        fwd_hooks: ``(hook name, hook function)`` pairs, attached for this pass only.
        return_type: Passed to ``run_with_hooks``: ``"logits"`` to end at a hook point of the
            unembedding (``HookedTransformer`` skips the unembedding with ``None``).
        jobs: ``{block: AttentionJob}``: what the pass reads from (or changes in) attention,
            a block of queries at a time (:mod:`homoglens.run.blocked_attention`); ``last`` must
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
    (:mod:`homoglens.run.fast_attention`); ``jobs`` as for :func:`run_through`."""
    hooks = list(fwd_hooks)
    with model_lock(model), fast_attention(model, hooks, jobs) as job_hooks:
        hooks = this_thread([*hooks, *job_hooks])
        logits = model.run_with_hooks(inputs, return_type="logits", fwd_hooks=hooks, **kwargs)
    _check_jobs(jobs, model)
    return logits


@dataclass(frozen=True)
class Pass:
    """One forward pass a measurement asks the engine for (what its pass plan yields, see
    :func:`stream`): what :func:`run_through` / :func:`run_logits` take.

    Attributes:
        inputs: ``[batch pos]`` token ids, or the residual stream with ``start_at_layer``.
        hooks: ``(hook name, hook function)`` pairs, attached for this pass only.
        last: The hook point(s) read: the pass ends once all of them have fired
            (:func:`run_through`); ``None`` runs to the logits and hands them back
            (:func:`run_logits`).
        jobs: ``{block: AttentionJob}``: the attention read (or changed) a block of queries at
            a time (:mod:`homoglens.run.blocked_attention`).
        attention_mask: ``[batch pos]`` 0/1 real tokens (``None``: none passed).
        start_at_layer: The block the pass starts at (``None``: none passed).
        return_type: As for :func:`run_through` (with ``last`` only).
    """

    inputs: torch.Tensor
    hooks: Sequence[HookSpec] = ()
    last: str | Sequence[str] | None = None
    jobs: Mapping[int, AttentionJob] | None = None
    attention_mask: torch.Tensor | None = None
    start_at_layer: int | None = None
    return_type: str | None = None


PassPlan = Generator[Pass, torch.Tensor | None, Any]
"""A measurement's passes over one batch: a generator that yields each :class:`Pass` and is
sent back its logits (``None`` for a pass with ``last``): ``logits = yield Pass(...)``. What a
pass needs of the thread (``torch.enable_grad``, ``fwad.dual_level``) it enters around its
``yield``; a plan's ``return`` value is what ``yield from`` it gives."""
