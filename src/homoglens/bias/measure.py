"""The attention-bias dose-response (C2, attention reading): position-resolved homogenization,
loss and manipulation checks at each strength of a bias on the attention pattern, paired over
the same windows, with the slope at zero by central difference and by forward-mode autograd."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal

import torch
from jaxtyping import Int

from homoglens.bias.interventions import attention_bias_plan
from homoglens.bias.passes import BiasReadouts, BiasRun, run_passes
from homoglens.bias.result import AttentionBiasStudy
from homoglens.core.errors import InvalidInputError, warn_user
from homoglens.core.stats import MIN_WINDOWS, as_block
from homoglens.core.types import AttentionBiasKind, BosPolicy, ModelInput
from homoglens.core.validate import as_bool, as_float, as_int, at_most
from homoglens.models.loading import check_writable
from homoglens.run.data import DataInput
from homoglens.run.engine import model_device, provenance_of, rank_windows
from homoglens.run.entrance import Entrance, entrance
from homoglens.run.fast_attention import serves_jobs
from homoglens.similarity.maths import ACTIVATION_CACHE_BYTES, edge_groups, first_counted

__all__ = ["DEFAULT_STRENGTHS", "attention_bias_study"]

DEFAULT_STRENGTHS: dict[str, tuple[float, ...]] = {
    "b": (-2.0, -1.0, -0.25, 0.0, 0.25, 1.0, 2.0),
    "temperature": (0.5, 0.8, 0.95, 1.0, 1.05, 1.25, 2.0),
}
"""Default strengths: b for every kind but temperature (nats per unit of phi), beta for it; each
holds a small symmetric pair around the baseline for :meth:`AttentionBiasStudy.slope_at_zero`."""

_RUN_FIELDS = (
    "kind",
    "value_zero_first",
    "edge_k",
    "pseudo_values",
    "gradient_windows",
    "ci",
    "block",
    "seed",
)
"""The fields of an :class:`AttentionBiasStudy` that its :class:`BiasRun` holds by the same
name."""

_READ_FIELDS = ("window_sp", "sp", "to_first", "window_attention", "window_loss")
"""The fields of an :class:`AttentionBiasStudy` that its :class:`BiasReadouts` hold by the same
name."""

_PLAN_FIELDS = ("first_k", "window", "blocks")
"""The fields of an :class:`AttentionBiasStudy` that every strength's plan holds by the same
name."""

_GRADIENT_FIELDS = (
    "window_gradient_statistics",
    "gradient_statistics",
    "gradient_sp",
    "window_gradient_attention",
    "window_gradient_loss",
)
"""The fields of an :class:`AttentionBiasStudy` that ``BiasReadouts.gradient`` holds, in its
order."""


def _strengths(kind: str, strengths: Any) -> tuple[float, ...]:
    """Ascending distinct strengths, the baseline added (values are checked by the plans)."""
    baseline = 1.0 if kind == "temperature" else 0.0
    if strengths is None:
        return DEFAULT_STRENGTHS["temperature" if kind == "temperature" else "b"]
    if getattr(strengths, "ndim", 1) == 1 and hasattr(strengths, "tolist"):
        strengths = strengths.tolist()  # a 1-d numpy array or tensor
    if isinstance(strengths, (str, bytes)) or not isinstance(strengths, Sequence):
        raise InvalidInputError(
            f"strengths={strengths!r} must be a list of numbers, e.g. [-1, 0, 1]"
        )
    values = []
    for v in strengths:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise InvalidInputError(
                f"strengths holds {v!r}; every strength must be a finite real number"
            )
        values.append(float(v))
    if not values:
        raise InvalidInputError("strengths is empty; pass e.g. strengths=[-1, 0, 1]")
    if len(set(values)) != len(values):
        raise InvalidInputError(f"strengths={values} repeats a value")
    return tuple(sorted({*values, baseline}))


def attention_bias_study(
    model: ModelInput,
    data: DataInput,
    *,
    kind: AttentionBiasKind,
    strengths: Sequence[float] | None = None,
    first_k: int = 1,
    window: int = 8,
    layers: Sequence[int] | int | None = None,
    heads: Sequence[int] | int | None = None,
    value_zero_first: bool = False,
    edge_k: int = 8,
    exclude_first: bool | Literal["auto"] = "auto",
    gradient_windows: int = 0,
    pseudo_values: bool = True,
    ci: float = 0.95,
    block: int | Literal["auto"] = "auto",
    seed: int = 0,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> AttentionBiasStudy:
    """Bias attention toward (or away from) chosen keys at several strengths and measure, on the
    same windows, what happens to homogenization, the edges, the loss and the attention itself.

    At each strength every window runs one full forward pass with
    A'[q, k] = softmax_k(beta * scores[q, k] + b phi[q, k]) in the chosen blocks and heads (b =
    strength, beta = 1, or b = 0 and beta = strength for ``"temperature"``). Where the model's
    Hugging Face attention runs through transformers' attention interface (the bridge of every
    SDPA family), each block's attention is computed a block of query rows at a time from its
    queries and keys (:mod:`homoglens.run.blocked_attention`: no ``[batch head_index query_pos
    key_pos]`` tensor of a layer, so windows of 32k tokens fit), every strength in the same
    arithmetic (eager attention's float32 softmax); elsewhere at ``attn.hook_pattern`` as
    :func:`~homoglens.attention_bias_hooks` does. Each pass reads:

    * the manipulation checks per biased row: E_{A'}[phi] (the mass on the biased keys), the
      entropy of A' and KL(A' || A) (nats), averaged over the chosen heads and queries;
    * the residual stream at every entry 0..n_layers, as :func:`~homoglens.positional_similarity`
      reads it without centring: H_W (mean off-diagonal W = M - C), the naive and
      distance-matched edge excess, SP by position;
    * the next-token loss.

    The unbiased strength (0, or beta = 1) is always run, and changes nothing: on the eager
    pattern its logits and readouts are those of the unhooked model bit for bit; in the blocked
    arithmetic, those of the unhooked model within float32 rounding (and, like every strength,
    the same arithmetic as the biased passes, so the effects compare like with like). On the first
    ``gradient_windows`` windows that pass also carries forward-mode autograd tangents (b enters
    as a dual number; the primal values are unchanged), which give the exact derivative at zero
    of every readout for :meth:`~AttentionBiasStudy.slope_at_zero`'s cross-check.

    Cost: one forward pass per strength, plus the tangent pass's overhead on the differentiated
    windows (docs/performance.md). The passes compute no ``[batch pos d_vocab]`` logits: the
    loss is read from the unembedding's input (:class:`homoglens.run.losses.LossHead`, checked bit
    for bit against the model's logits on the first pass).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` in eval mode (any family whose
            ``hook_pattern`` can be written).
        data: Windows of equal length (token ids, a ``TokenBatch``, texts or a text file).
        kind: ``"first"``, ``"self"``, ``"recent"``, ``"alibi"``, ``"middle"`` (the specificity
            control) or ``"temperature"`` (:data:`~homoglens.core.types.ATTENTION_BIAS_KINDS`).
        strengths: b values (|b| < 1e4), or beta values (> 0) for temperature; the baseline is
            added if missing. Default: :data:`DEFAULT_STRENGTHS`.
        first_k: Keys counted as "first" (< the window length).
        window: Keys counted as "recent" (<= the window length).
        layers: Blocks to bias (default: all).
        heads: Heads to bias in each (default: all).
        value_zero_first: Also zero the value vectors of the first ``first_k`` keys in the
            biased heads, at every strength (separates attention allocated to the first token
            from what it writes): the pattern's first columns are zeroed after the bias, without
            renormalising, which is the same sum over values.
        edge_k: Positions per edge of the edge statistics.
        exclude_first: Leave position 0 out of the similarity; ``"auto"``: when it holds a BOS.
        gradient_windows: Windows (the first ones) differentiated at zero; 0: none, else >= 2.
        pseudo_values: Each window's share of the cross-window terms too (a second pass over
            the windows: the unit vectors kept from the first when they fit in
            :data:`~homoglens.similarity.maths.ACTIVATION_CACHE_BYTES`, else a second forward
            pass per strength), so that the intervals of the statistics that subtract ``C`` and
            of ``sp_*`` use jackknife pseudo-values (False: ``C`` held fixed, wider than the
            truth on real data, and no interval for ``sp_*``).
        ci: Default interval coverage of the result's tables.
        block: Default bootstrap block length (consecutive windows; ``"auto"``: chosen from
            the windows' autocorrelation, :func:`homoglens.core.stats.auto_block`).
        seed: Default bootstrap seed.
        batch_size: Windows per forward pass.
        attention_mask: ``[batch pos]`` 0/1 for token input.
        bos: BOS policy for text input.
        progress: Show a progress bar.

    Returns:
        An :class:`~homoglens.bias.result.AttentionBiasStudy`.

    Raises:
        InvalidInputError: unknown kind, strengths not finite or out of range, beta <= 0, blocks
            or heads out of range, ``first_k`` / ``window`` outside the windows, windows of
            different lengths or fewer than 2, ``edge_k`` too large, ``gradient_windows`` of 1.
        UnsupportedArchitectureError: the attention function cannot serve the model and its
            ``hook_pattern`` is read-only (the bridge of GPT-Neo).
        SequenceTooLongError: a window longer than ``cfg.n_ctx``.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (C2: "biased toward extremal positions");
        Hsieh et al. 2024, arXiv 2406.16008; Wu et al. 2025, arXiv 2502.01951 (position bias);
        Press et al. 2022, arXiv 2108.12409 (ALiBi); Gu et al. 2024, arXiv 2410.10781 (sinks).

    Examples:
        >>> import torch
        >>> from homoglens import attention_bias_study, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> study = attention_bias_study(model, torch.randint(0, 1000, (4, 20)), kind="first",
        ...                              strengths=[-1, 0, 1], edge_k=4, gradient_windows=0,
        ...                              progress=False)
        >>> study.curve("homogenization").shape
        (3, 15)
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    del model, batch_size, progress  # the call carries them
    run = _checked(**locals())  # the call and every other parameter above, by name
    return _assembled(run, run_passes(run))


def _checked(
    *,
    call: Entrance,
    data: DataInput,
    kind: AttentionBiasKind,
    strengths: Sequence[float] | None,
    first_k: int,
    window: int,
    layers: Sequence[int] | int | None,
    heads: Sequence[int] | int | None,
    value_zero_first: bool,
    edge_k: int,
    exclude_first: bool | Literal["auto"],
    gradient_windows: int,
    pseudo_values: bool,
    ci: float,
    block: int | Literal["auto"],
    seed: int,
    attention_mask: Int[torch.Tensor, "batch pos"] | None,
    bos: BosPolicy | bool,
) -> BiasRun:
    """:func:`attention_bias_study`'s arguments checked, its plans made (one per strength) and
    its windows laid out: what its passes run on (raising and warning as documented there)."""
    model, info = call.model, call.info
    values = _strengths(kind, strengths) if isinstance(kind, str) else ()
    options = {"first_k": first_k, "window": window, "layers": layers, "heads": heads}
    plans = [attention_bias_plan(model, kind, s, **options) for s in values or (0.0,)]
    value_zero_first = as_bool("value_zero_first", value_zero_first)
    edge_k = as_int("edge_k", edge_k, low=1)
    gradient_windows = as_int("gradient_windows", gradient_windows, low=0)
    pseudo_values = as_bool("pseudo_values", pseudo_values)
    if gradient_windows == 1:
        raise InvalidInputError(
            "gradient_windows=1: the derivative of C needs two windows; pass 0 or >= 2"
        )
    ci = as_float("ci", ci, low=0.0, high=1.0)
    block = as_block(block)
    seed = as_int("seed", seed, low=0)
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    lengths = batch.lengths
    if int(lengths.min()) != int(lengths.max()) or len(batch) < 2:
        raise InvalidInputError(
            f"attention_bias_study needs at least 2 windows of equal length, got {len(batch)} "
            f"of lengths {int(lengths.min())}..{int(lengths.max())}; cut text with "
            "corpus_windows(model, ..., seq_len=T)"
        )
    length = int(lengths[0])
    n_windows = len(batch)
    if block != "auto" and block > 1 and n_windows < 4 * block and n_windows >= MIN_WINDOWS:
        lowered = max(1, n_windows // 4)  # what every interval would use: said once, recorded
        warn_user(
            f"homoglens: block={block} makes fewer than 4 blocks of the {n_windows} windows; the "
            f"intervals use (and the result records) block={lowered}"
        )
        block = lowered
    plan0 = plans[0]
    if plan0.first_k >= length or plan0.window > length:
        raise InvalidInputError(
            f"first_k={plan0.first_k} and window={plan0.window} must lie inside the windows of "
            f"{length} tokens (first_k < {length}, window <= {length})"
        )
    first = first_counted(exclude_first, batch.bos)
    n_pos = length - first
    edge_groups(n_pos, edge_k)
    base = values.index(1.0 if kind == "temperature" else 0.0)
    changes = value_zero_first or any(not p.identity for p in plans) or gradient_windows
    if changes and not serves_jobs(model):  # the jobs will write the eager pattern
        check_writable(model, "pattern", "an attention bias")
    device = model_device(model)
    n_all = len(batch)
    gradient_windows = at_most("gradient_windows", gradient_windows, n_all, "windows given")
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    entries = tuple(range(n_layers + 1))
    offset, stop = rank_windows(n_all)  # this rank's windows, as the engine shards them
    # The pseudo-values' second pass reads every window's unit vectors again: kept from the
    # first pass when they fit in the activation budget, else a second forward pass.
    work = torch.float64 if next(iter(model.parameters())).dtype == torch.float64 else None
    width = 8 if work is not None else 4
    kept = len(plans) * (stop - offset) * len(entries) * n_pos * d_model * width
    replay = pseudo_values and kept <= ACTIVATION_CACHE_BYTES
    return BiasRun(
        model=model,
        batch=batch,
        kind=kind,
        values=values,
        plans=plans,
        base=base,
        entries=entries,
        first=first,
        n_pos=n_pos,
        edge_k=edge_k,
        value_zero_first=value_zero_first,
        gradient_windows=gradient_windows,
        pseudo_values=pseudo_values,
        replay=replay,
        work=work,
        shard=(offset, stop),
        device=device,
        batch_size=call.batch_size,
        progress=call.progress,
        ci=ci,
        block=block,
        seed=seed,
        info=info,
    )


def _assembled(run: BiasRun, read: BiasReadouts) -> AttentionBiasStudy:
    """The study's result: its checked arguments and every window's readouts."""
    plan0 = run.plans[0]
    provenance = provenance_of(run.info, run.batch, run.entries, bool(run.first))
    same = {name: getattr(run, name) for name in _RUN_FIELDS}
    same.update((name, getattr(plan0, name)) for name in _PLAN_FIELDS)
    same.update((name, getattr(read, name)) for name in _READ_FIELDS)
    same.update(zip(_GRADIENT_FIELDS, read.gradient, strict=True))
    stacked = read.window_statistics  # [strength batch layer stat]
    return AttentionBiasStudy(
        **same,
        strengths=run.values,
        heads=() if plan0.heads is None else plan0.heads,
        layers=run.entries,
        first_position=run.first,
        n_sequences=len(run.batch),
        statistics=stacked.mean(1),
        window_statistics=stacked,
        provenance=provenance,
    )
