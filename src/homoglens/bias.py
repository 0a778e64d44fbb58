"""The attention-bias dose-response (C2, attention reading): position-resolved homogenization,
loss and manipulation checks at each strength of a bias on the attention pattern, paired over
the same windows, with the slope at zero by central difference and by forward-mode autograd."""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch
import torch.autograd.forward_ad as fwad
from jaxtyping import Float, Int

from homoglens.architectures import resid_hook_name
from homoglens.bias_hooks import AttentionBiasPlan, bias_pattern
from homoglens.bias_interventions import attention_bias_plan
from homoglens.blocked_attention import AttentionJob
from homoglens.data import DataInput, to_token_batch
from homoglens.distributed import all_reduce_sum, gather_rows, shard_bounds, world
from homoglens.engine import (
    LossHead,
    model_device,
    next_token_loss,
    provenance_of,
    run_logits,
    stream,
)
from homoglens.errors import InvalidInputError
from homoglens.fast_attention import serves_jobs
from homoglens.models import check_writable, model_info
from homoglens.results.bias import ATTENTION_CHECKS, AttentionBiasStudy
from homoglens.similarity_math import (
    ACTIVATION_CACHE_BYTES,
    SIMILARITY_STATISTICS,
    WindowSums,
    edge_groups,
    first_counted,
    on_cpu_rows,
    similarity_coefficients,
)
from homoglens.stats import MIN_WINDOWS, as_block
from homoglens.types import AttentionBiasKind, BosPolicy, HookedModel, HookSpec
from homoglens.validate import as_bool, as_float, as_int, at_most

__all__ = ["DEFAULT_STRENGTHS", "attention_bias_study"]

DEFAULT_STRENGTHS: dict[str, tuple[float, ...]] = {
    "b": (-2.0, -1.0, -0.25, 0.0, 0.25, 1.0, 2.0),
    "temperature": (0.5, 0.8, 0.95, 1.0, 1.05, 1.25, 2.0),
}
"""Default strengths: b for every kind but temperature (nats per unit of phi), beta for it; each
holds a small symmetric pair around the baseline for :meth:`AttentionBiasStudy.slope_at_zero`."""

_C_STATS = [e for e, name in enumerate(SIMILARITY_STATISTICS) if not name.startswith("naive")]


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


class _GradientSums(NamedTuple):
    within: torch.Tensor  # [layer pos pos] Gram matrices of the unit vectors
    units: torch.Tensor  # [layer pos d_model] their sums
    d_within: torch.Tensor  # the derivatives of both
    d_units: torch.Tensor
    coef: torch.Tensor  # [stat pos pos] similarity_coefficients


class _Gradient:
    """Float64 sums of the first-order derivative at zero (forward-mode tangents) on the
    differentiated windows: their unit vectors, Gram matrices and derivatives."""

    def __init__(self, n_layer: int, n_pos: int, d: int, edge_k: int, device: torch.device):
        self.shape, self.edge_k, self.device = (n_layer, n_pos, d), edge_k, device
        self.rows: list[torch.Tensor] = []  # [g layer stat] d stat(U_s U_s^T)
        self.attention: list[torch.Tensor] = []  # [g block check]
        self.loss: list[torch.Tensor] = []  # [g]

    @functools.cached_property
    def sums(self) -> _GradientSums:
        """The float64 sums, made on first use only (they are ``[layer pos pos]``: the
        cross-check is for windows of moderate T)."""
        n_layer, n_pos, d = self.shape
        f64 = {"dtype": torch.float64, "device": self.device}
        return _GradientSums(
            torch.zeros(n_layer, n_pos, n_pos, **f64),
            torch.zeros(n_layer, n_pos, d, **f64),
            torch.zeros(n_layer, n_pos, n_pos, **f64),
            torch.zeros(n_layer, n_pos, d, **f64),
            similarity_coefficients(n_pos, self.edge_k).to(self.device),
        )

    def add(self, i: int, u: torch.Tensor, norms: torch.Tensor, dx: torch.Tensor) -> None:
        """Layer ``i``: unit vectors ``u``, their norms and the tangent ``dx`` of the vectors."""
        u, dx = u.double(), dx.double()
        n = norms.double()
        safe = torch.where(n > 0, n, torch.ones_like(n))
        du = torch.where(n > 0, (dx - u * (u * dx).sum(-1, keepdim=True)) / safe, 0.0)
        gram = u @ u.transpose(1, 2)
        d_gram = du @ u.transpose(1, 2)
        d_gram = d_gram + d_gram.transpose(1, 2)
        self.sums.within[i] += gram.sum(0)
        self.sums.units[i] += u.sum(0)
        self.sums.d_within[i] += d_gram.sum(0)
        self.sums.d_units[i] += du.sum(0)
        if i == 0:
            self.rows.append(
                torch.zeros(
                    u.shape[0],
                    self.sums.within.shape[0],
                    self.sums.coef.shape[0],
                    dtype=torch.float64,
                    device=u.device,
                )
            )
        self.rows[-1][:, i] = torch.einsum("bij,eij->be", d_gram, self.sums.coef)

    def finish(
        self, n: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``([g layer stat] per-window derivatives, [layer stat] their mean, [layer pos] dSP)``
        with C and its derivative from the differentiated windows."""
        rows = torch.cat(
            [
                torch.empty(
                    0,
                    *self.sums.within.shape[:1],
                    self.sums.coef.shape[0],
                    dtype=torch.float64,
                    device="cpu",
                ),
                *(r.cpu() for r in self.rows),
            ]
        )
        rows = gather_rows(rows, n, device).cpu() if world()[1] > 1 else rows
        ub, dub = self.sums.units.cpu(), self.sums.d_units.cpu()
        d_cross = dub @ ub.transpose(1, 2)
        d_cross = (d_cross + d_cross.transpose(1, 2) - self.sums.d_within.cpu()) / (n * (n - 1))
        d_stat = torch.einsum("lij,eij->le", d_cross, self.sums.coef.cpu())
        rows[..., _C_STATS] -= d_stat[None, :, _C_STATS]
        return rows, rows.mean(0), torch.diagonal(d_cross, dim1=1, dim2=2).clone()


def _unchanged(q0: int, scores: torch.Tensor) -> None:
    """An attention job's ``edit`` that leaves the rows as they are (their softmax)."""
    return None


def _biased_rows(
    plan: AttentionBiasPlan,
    bi: int,
    checks: dict[int, torch.Tensor],
    tangents: dict[int, torch.Tensor],
    *,
    value_zero_first: bool,
    dual: bool,
) -> Any:
    """The ``edit`` of one biased block's :class:`~homoglens.blocked_attention.AttentionJob`:
    from a block of query rows' masked scores s, the chosen heads' rows
    A' = softmax(beta * s + b * phi) (the others softmax(s)), and each window's sums over the
    block's chosen heads and queries of the checks (E_{A'}[phi], the entropy of A', KL(A' || A),
    nats) into ``checks[bi]`` ``[batch 3]``. With ``dual``, b (beta for ``"temperature"``)
    enters as a forward-mode dual number at the plan's value, so every readout downstream
    carries its derivative, and the checks' derivatives go to ``tangents[bi]``. With
    ``value_zero_first``, the chosen heads' first ``first_k`` columns are zeroed after the
    checks, without renormalising (what the first keys write is gone)."""
    heads = None if plan.heads is None else list(plan.heads)
    temperature = plan.kind == "temperature"

    def edit(q0: int, s: torch.Tensor) -> torch.Tensor | None:
        if not dual:
            return closed_form(q0, s)
        n, n_key = int(s.shape[-2]), int(s.shape[-1])
        chosen = s if heads is None else s[:, heads]
        phi = plan.phi(n, n_key, q0, s.device).to(s.dtype)
        strength = plan.beta if temperature else plan.bias
        value: Any = strength
        if dual:
            value = fwad.make_dual(
                torch.tensor(strength, dtype=phi.dtype, device=s.device),
                torch.ones((), dtype=phi.dtype, device=s.device),
            )
        logits = chosen * value if temperature else chosen + value * phi
        log_a = torch.log_softmax(chosen, -1)
        log_b = torch.log_softmax(logits, -1)
        biased = log_b.exp()
        some = biased > 0
        found = torch.stack(
            [
                (biased * phi).sum(-1),
                -torch.where(some, biased * log_b, 0.0).sum(-1),
                torch.where(some, biased * (log_b - log_a), 0.0).sum(-1),
            ],
            -1,
        ).sum((1, 2))  # [batch 3], summed over the chosen heads and the block's queries
        primal, tangent = fwad.unpack_dual(found) if dual else (found, None)
        primal = primal.double()
        if temperature:
            primal[:, 0] = math.nan
        checks[bi] = primal if q0 == 0 else checks[bi] + primal
        if dual:
            t = torch.zeros_like(primal) if tangent is None else tangent.double()
            if temperature:
                t[:, 0] = math.nan
            t[:, 2] = 0.0  # KL is flat at the baseline
            tangents[bi] = t if q0 == 0 else tangents[bi] + t
        if value_zero_first:
            keep = torch.ones(n_key, dtype=biased.dtype, device=biased.device)
            keep[: plan.first_k] = 0.0
            biased = biased * keep
        if heads is None:
            return biased
        rows = torch.softmax(s, -1)
        rows[:, heads] = biased
        return rows

    def closed_form(q0: int, s: torch.Tensor) -> torch.Tensor | None:
        """The same without tangents, in probability space (:func:`homoglens.bias_hooks.
        bias_pattern`'s closed form: the checks from a few row sums, cache-sized chunks)."""
        rows = torch.softmax(s, -1)
        chosen = rows if heads is None else rows[:, heads]
        biased, found = bias_pattern(chosen, plan, checks=True, q_offset=q0)
        assert found is not None
        block = found.sum((1, 2))  # [batch 3], summed over the chosen heads and the queries
        checks[bi] = block if q0 == 0 else checks[bi] + block
        if plan.identity and not value_zero_first:
            return None  # rows unchanged (the eager pattern: bit for bit)
        if value_zero_first:
            biased = biased.clone() if biased is chosen else biased
            biased[..., : plan.first_k] = 0.0
        if heads is None:
            return biased
        rows[:, heads] = biased
        return rows

    return edit


def attention_bias_study(
    model: HookedModel,
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
    queries and keys (:mod:`homoglens.blocked_attention`: no ``[batch head_index query_pos
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
    loss is read from the unembedding's input (:class:`homoglens.engine.LossHead`, checked bit
    for bit against the model's logits on the first pass).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` in eval mode (any family whose
            ``hook_pattern`` can be written).
        data: Windows of equal length (token ids, a ``TokenBatch``, texts or a text file).
        kind: ``"first"``, ``"self"``, ``"recent"``, ``"alibi"``, ``"middle"`` (the specificity
            control) or ``"temperature"`` (:data:`~homoglens.types.ATTENTION_BIAS_KINDS`).
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
            :data:`~homoglens.similarity_math.ACTIVATION_CACHE_BYTES`, else a second forward
            pass per strength), so that the intervals of the statistics that subtract ``C`` and
            of ``sp_*`` use jackknife pseudo-values (False: ``C`` held fixed, wider than the
            truth on real data, and no interval for ``sp_*``).
        ci: Default interval coverage of the result's tables.
        block: Default bootstrap block length (consecutive windows; ``"auto"``: chosen from
            the windows' autocorrelation, :func:`homoglens.stats.auto_block`).
        seed: Default bootstrap seed.
        batch_size: Windows per forward pass.
        attention_mask: ``[batch pos]`` 0/1 for token input.
        bos: BOS policy for text input.
        progress: Show a progress bar.

    Returns:
        An :class:`~homoglens.results.bias.AttentionBiasStudy`.

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
    info = model_info(model)
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
    batch_size = as_int("batch_size", batch_size, low=1)
    progress = as_bool("progress", progress)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
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
        warnings.warn(
            f"homoglens: block={block} makes fewer than 4 blocks of the {n_windows} windows; the "
            f"intervals use (and the result records) block={lowered}",
            UserWarning,
            stacklevel=2,
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
        check_writable(model, "attn.hook_pattern", "an attention bias")
    device = model_device(model)
    n_all = len(batch)
    gradient_windows = at_most("gradient_windows", gradient_windows, n_all, "windows given")
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    entries = tuple(range(n_layers + 1))
    sums = [WindowSums(len(entries), n_pos, d_model, edge_k, device) for _ in plans]
    rank, size = world()
    offset, stop = shard_bounds(n_all, size)[rank]
    # The pseudo-values' second pass reads every window's unit vectors again: kept from the
    # first pass when they fit in the activation budget, else a second forward pass.
    work = torch.float64 if next(iter(model.parameters())).dtype == torch.float64 else None
    width = 8 if work is not None else 4
    kept = len(plans) * (stop - offset) * len(entries) * n_pos * d_model * width
    replay = pseudo_values and kept <= ACTIVATION_CACHE_BYTES
    if replay:
        for s_sums in sums:
            s_sums.keep_units(stop - offset, work or torch.float32)
    grad = _Gradient(len(entries), n_pos, d_model, edge_k, device)
    attention: list[list[torch.Tensor]] = [[] for _ in plans]
    losses: list[list[torch.Tensor]] = [[] for _ in plans]
    head = LossHead(model)  # the loss without [batch pos d_vocab] logits
    seen = 0

    def jobs_of(plan: AttentionBiasPlan, out: list[torch.Tensor], g: int) -> dict[int, Any]:
        """Each chosen block's attention, biased (or, at the baseline, only read) a block of
        queries at a time; its checks into ``out``; with ``g`` windows differentiated, b (or
        beta) enters as a dual number and the checks' derivatives go to ``grad.attention``."""
        checks: dict[int, torch.Tensor] = {}
        tangents: dict[int, torch.Tensor] = {}
        jobs = {
            block: AttentionJob(
                edit=_biased_rows(
                    plan, bi, checks, tangents, value_zero_first=value_zero_first, dual=g > 0
                )
            )
            for bi, block in enumerate(plan.blocks)
        }
        if g:  # dual numbers run through every block's attention in the blocks' own arithmetic
            # (forward-mode autograd has no rule for the fused SDPA kernels of a GPU)
            for block in range(n_layers):
                jobs.setdefault(block, AttentionJob(edit=_unchanged))

        def collect(n_query: int) -> None:
            """After the pass: the mean checks per window ``[batch block check]``."""
            n_heads = len(plan.heads) if plan.heads is not None else int(model.cfg.n_heads)
            scale = 1.0 / (n_heads * n_query)
            out.append(
                (torch.stack([checks[bi] for bi in range(len(plan.blocks))], 1) * scale).cpu()
            )
            if g:
                found = torch.stack([tangents[bi] for bi in range(len(plan.blocks))], 1)
                grad.attention.append((found * scale)[:g].cpu())
            checks.clear()
            tangents.clear()

        jobs_collect[id(jobs)] = collect
        return jobs

    def resid_hooks(si: int, g: int) -> list[HookSpec]:
        feed = on_cpu_rows(sums[si], len(entries))

        def make(i: int) -> Any:
            def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
                x, dx = fwad.unpack_dual(resid) if g else (resid, None)
                work = torch.float64 if x.dtype == torch.float64 else torch.float32
                x = x.detach().to(work)
                feed(i, x, first)
                if g and dx is not None:
                    u, norms = sums[si].units_of(i, x[:g, first:])
                    grad.add(i, u, norms, dx[:g, first:].to(work))
                elif g:
                    u, norms = sums[si].units_of(i, x[:g, first:])
                    grad.add(i, u, norms, torch.zeros_like(u))

            return hook

        return [(resid_hook_name(layer), make(i)) for i, layer in enumerate(entries)]

    jobs_collect: dict[int, Any] = {}

    def step(tokens: torch.Tensor, mask: torch.Tensor) -> None:
        nonlocal seen
        b = int(tokens.shape[0])
        here = max(0, min(b, gradient_windows - (offset + seen)))
        seen += b
        for si, plan in enumerate(plans):
            g = here if si == base else 0
            hooks = resid_hooks(si, g)
            if not g:
                jobs = jobs_of(plan, attention[si], 0)
                losses[si].append(head.loss(tokens, hooks, mask, jobs=jobs).double().cpu())
                jobs_collect.pop(id(jobs))(int(tokens.shape[1]))
                continue
            with torch.inference_mode(False), torch.no_grad(), fwad.dual_level():
                jobs = jobs_of(plan, attention[si], g)
                dual = run_logits(
                    model, tokens.clone(), hooks, jobs=jobs, attention_mask=mask.clone()
                )
                logits, d_logits = fwad.unpack_dual(dual)
                losses[si].append(next_token_loss(logits, tokens, mask).double().cpu())
                grad.loss.append(_loss_tangent(logits[:g], d_logits, tokens[:g], mask[:g]))
                jobs_collect.pop(id(jobs))(int(tokens.shape[1]))
            del dual, logits, d_logits

    stream(
        model,
        batch,
        [],
        batch_size=batch_size,
        desc=f"attention bias ({kind})",
        progress=progress,
        step=step,
    )
    provenance = provenance_of(info, batch, entries, bool(first))
    if size > 1:
        for s_sums in sums:
            s_sums.all_reduce()
    if replay:
        for s_sums in sums:
            s_sums.cross_from_kept()
    elif pseudo_values:

        def cross_step(tokens: torch.Tensor, mask: torch.Tensor) -> None:
            for si, plan in enumerate(plans):
                hooks = [
                    (resid_hook_name(layer), _cross_hook(sums[si], i, first))
                    for i, layer in enumerate(entries)
                ]
                jobs = jobs_of(plan, [], 0)
                head.loss(tokens, hooks, mask, jobs=jobs)
                jobs_collect.pop(id(jobs))(int(tokens.shape[1]))

        stream(
            model,
            batch,
            [],
            batch_size=batch_size,
            desc=f"attention bias ({kind}, pseudo-values)",
            progress=progress,
            step=cross_step,
        )

    def rows(parts: list[torch.Tensor], shape: tuple[int, ...], n: int) -> torch.Tensor:
        empty = torch.empty(0, *shape, dtype=torch.float64, device="cpu")
        local = torch.cat([empty, *(part.cpu() for part in parts)])
        return gather_rows(local, n, device).cpu() if size > 1 else local

    window_stats, sp, to_first, window_sp = [], [], [], []
    n_stat = len(SIMILARITY_STATISTICS)
    for s_sums in sums:
        per_window = rows(s_sums.rows, (len(entries), n_stat), n_all)
        cross = same = None
        if pseudo_values:
            cross = rows(s_sums.cross_rows, (len(entries), n_stat), n_all)
            same = rows(s_sums.same_rows, (len(entries), n_pos), n_all)
        stats, s_sp, s_first, s_edges = s_sums.finish(per_window, cross, same)
        window_stats.append(stats)
        sp.append(s_sp)
        to_first.append(s_first)
        window_sp.append(s_edges)

    n_blocks, n_checks = len(plan0.blocks), len(ATTENTION_CHECKS)
    f64 = torch.float64
    if gradient_windows:
        if size > 1:
            all_reduce_sum(
                [grad.sums.within, grad.sums.units, grad.sums.d_within, grad.sums.d_units]
            )
        g_rows, g_stats, g_sp = grad.finish(gradient_windows, device)
        g_attention = rows(grad.attention, (n_blocks, n_checks), gradient_windows)
        g_loss = rows(grad.loss, (), gradient_windows)
    else:
        g_rows = torch.zeros(0, len(entries), len(SIMILARITY_STATISTICS), dtype=f64, device="cpu")
        g_stats = torch.full(
            (len(entries), len(SIMILARITY_STATISTICS)), math.nan, dtype=f64, device="cpu"
        )
        g_sp = torch.full((len(entries), n_pos), math.nan, dtype=f64, device="cpu")
        g_attention = torch.zeros(0, n_blocks, n_checks, dtype=f64, device="cpu")
        g_loss = torch.zeros(0, dtype=f64, device="cpu")
    stacked = torch.stack(window_stats)  # [strength seq layer stat]
    return AttentionBiasStudy(
        kind=kind,
        strengths=values,
        first_k=plan0.first_k,
        window=plan0.window,
        blocks=plan0.blocks,
        heads=() if plan0.heads is None else plan0.heads,
        value_zero_first=value_zero_first,
        layers=entries,
        edge_k=edge_k,
        first_position=first,
        n_sequences=n_all,
        statistics=stacked.mean(1),
        window_statistics=stacked,
        pseudo_values=pseudo_values,
        window_sp=torch.stack(window_sp) if pseudo_values else None,
        sp=torch.stack(sp),
        to_first=torch.stack(to_first),
        window_attention=torch.stack([rows(a, (n_blocks, n_checks), n_all) for a in attention]),
        window_loss=torch.stack([rows(loss, (), n_all) for loss in losses]),
        gradient_windows=gradient_windows,
        gradient_statistics=g_stats,
        window_gradient_statistics=g_rows,
        gradient_sp=g_sp,
        window_gradient_attention=g_attention,
        window_gradient_loss=g_loss,
        ci=ci,
        block=block,
        seed=seed,
        provenance=provenance,
    )


def _cross_hook(sums: WindowSums, i: int, first: int) -> Any:
    """The pseudo-values' second forward pass: entry ``i``'s vectors into ``sums``."""

    def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
        work = torch.float64 if resid.dtype == torch.float64 else torch.float32
        sums.add_cross(i, resid.detach()[:, first:].to(work))

    return hook


def _loss_tangent(
    logits: Float[torch.Tensor, "batch pos d_vocab"],
    d_logits: Float[torch.Tensor, "batch pos d_vocab"] | None,
    tokens: Int[torch.Tensor, "batch pos"],
    mask: Int[torch.Tensor, "batch pos"],
) -> Float[torch.Tensor, " batch"]:
    """D (mean next-token loss) / db per sequence from the logits' tangent: d nll =
    E_softmax(z)[dz] - dz[target], averaged over the real targets (float64, CPU)."""
    n = int(logits.shape[0])
    if d_logits is None:
        return torch.zeros(n, dtype=torch.float64, device="cpu")
    target = tokens[:, 1:]
    parts = []
    for z, dz, tgt in zip(logits.split(2), d_logits[:n].split(2), target.split(2), strict=True):
        p = torch.softmax(z[:, :-1].double(), -1)
        dzz = dz[:, :-1].double()
        parts.append((p * dzz).sum(-1) - dzz.gather(-1, tgt[..., None]).squeeze(-1))
    d_nll = torch.cat(parts)
    valid = (mask[:, 1:] * mask[:, :-1]).to(d_nll.dtype)
    return ((d_nll * valid).sum(1) / valid.sum(1).clamp_min(1)).cpu()
