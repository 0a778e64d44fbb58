"""The attention-bias dose-response (C2, attention reading): position-resolved homogenization,
loss and manipulation checks at each strength of a bias on the attention pattern, paired over
the same windows, with the slope at zero by central difference and by forward-mode autograd."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.autograd.forward_ad as fwad
from jaxtyping import Float, Int

from homoglens.architectures import block_hook_name, resid_hook_name
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
from homoglens.hooks import AttentionBiasPlan, bias_pattern
from homoglens.interventions import attention_bias_plan
from homoglens.models import check_writable, model_info
from homoglens.results.bias import ATTENTION_CHECKS, AttentionBiasStudy
from homoglens.results.similarity import PositionalSimilarity
from homoglens.similarity_math import (
    SIMILARITY_STATISTICS,
    SimilaritySums,
    edge_groups,
    finish_fields,
    first_counted,
    on_cpu_rows,
    similarity_coefficients,
)
from homoglens.types import AttentionBiasKind, BosPolicy, HookedModel, HookSpec
from homoglens.validate import as_bool, as_float, as_int

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


class _Gradient:
    """Float64 sums of the first-order derivative at zero (forward-mode tangents) on the
    differentiated windows: their unit vectors, Gram matrices and derivatives."""

    def __init__(self, n_layer: int, n_pos: int, d: int, edge_k: int, device: torch.device):
        f64 = {"dtype": torch.float64, "device": device}
        self.within = torch.zeros(n_layer, n_pos, n_pos, **f64)
        self.units = torch.zeros(n_layer, n_pos, d, **f64)
        self.d_within = torch.zeros(n_layer, n_pos, n_pos, **f64)
        self.d_units = torch.zeros(n_layer, n_pos, d, **f64)
        self.coef = similarity_coefficients(n_pos, edge_k).to(device)
        self.rows: list[torch.Tensor] = []  # [g layer stat] d stat(U_s U_s^T)
        self.attention: list[torch.Tensor] = []  # [g block check]
        self.loss: list[torch.Tensor] = []  # [g]

    def add(self, i: int, u: torch.Tensor, norms: torch.Tensor, dx: torch.Tensor) -> None:
        """Layer ``i``: unit vectors ``u``, their norms and the tangent ``dx`` of the vectors."""
        u, dx = u.double(), dx.double()
        n = norms.double()
        safe = torch.where(n > 0, n, torch.ones_like(n))
        du = torch.where(n > 0, (dx - u * (u * dx).sum(-1, keepdim=True)) / safe, 0.0)
        gram = u @ u.transpose(1, 2)
        d_gram = du @ u.transpose(1, 2)
        d_gram = d_gram + d_gram.transpose(1, 2)
        self.within[i] += gram.sum(0)
        self.units[i] += u.sum(0)
        self.d_within[i] += d_gram.sum(0)
        self.d_units[i] += du.sum(0)
        if i == 0:
            self.rows.append(
                torch.zeros(
                    u.shape[0],
                    self.within.shape[0],
                    self.coef.shape[0],
                    dtype=torch.float64,
                    device=u.device,
                )
            )
        self.rows[-1][:, i] = torch.einsum("bij,eij->be", d_gram, self.coef)

    def finish(
        self, n: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``([g layer stat] per-window derivatives, [layer stat] their mean, [layer pos] dSP)``
        with C and its derivative from the differentiated windows."""
        rows = torch.cat(
            [
                torch.empty(0, *self.within.shape[:1], self.coef.shape[0], dtype=torch.float64),
                *(r.cpu() for r in self.rows),
            ]
        )
        rows = gather_rows(rows, n, device).cpu() if world()[1] > 1 else rows
        ub, dub = self.units.cpu(), self.d_units.cpu()
        d_cross = dub @ ub.transpose(1, 2)
        d_cross = (d_cross + d_cross.transpose(1, 2) - self.d_within.cpu()) / (n * (n - 1))
        d_stat = torch.einsum("lij,eij->le", d_cross, self.coef.cpu())
        rows[..., _C_STATS] -= d_stat[None, :, _C_STATS]
        return rows, rows.mean(0), torch.diagonal(d_cross, dim1=1, dim2=2).clone()


def _check_tangents(
    chosen: torch.Tensor, tangent: torch.Tensor, phi: torch.Tensor, temperature: bool
) -> torch.Tensor:
    """``[batch check]`` d(mass, entropy, KL) / db at zero from the pattern's total tangent."""
    a, t = chosen.double(), tangent.double()
    d_mass = (t * phi).sum(-1) if not temperature else torch.full(a.shape[:-1], math.nan)
    log_a = torch.where(a > 0, torch.log(a), 0.0)
    d_entropy = -(t * log_a).sum(-1)
    out = torch.stack([d_mass.to(a.device), d_entropy, torch.zeros_like(d_entropy)], -1)
    return out.mean((1, 2))


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
    ci: float = 0.95,
    block: int = 16,
    seed: int = 0,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> AttentionBiasStudy:
    """Bias attention toward (or away from) chosen keys at several strengths and measure, on the
    same windows, what happens to homogenization, the edges, the loss and the attention itself.

    At each strength every window runs one full forward pass with
    A'[q, k] = softmax_k(beta log A[q, k] + b phi[q, k]) at ``attn.hook_pattern`` of the chosen
    blocks and heads (:func:`~homoglens.attention_bias_hooks`; b = strength, beta = 1, or b = 0
    and beta = strength for ``"temperature"``). Each pass reads:

    * the manipulation checks per biased row: E_{A'}[phi] (the mass on the biased keys), the
      entropy of A' and KL(A' || A) (nats), averaged over the chosen heads and queries;
    * the residual stream at every entry 0..n_layers, as :func:`~homoglens.positional_similarity`
      reads it without centring: H_W (mean off-diagonal W = M - C), the naive and
      distance-matched edge excess, SP by position;
    * the next-token loss.

    The unbiased strength (0, or beta = 1) is always run, and run with no hook that changes
    anything: its logits and readouts are those of the unhooked model bit for bit. On the first
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
        ci: Default interval coverage of the result's tables.
        block: Default bootstrap block length (consecutive windows).
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
        UnsupportedArchitectureError: ``hook_pattern`` is read-only on this model.
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
        (3, 10)
    """
    info = model_info(model)
    values = _strengths(kind, strengths) if isinstance(kind, str) else ()
    options = {"first_k": first_k, "window": window, "layers": layers, "heads": heads}
    plans = [attention_bias_plan(model, kind, s, **options) for s in values or (0.0,)]
    value_zero_first = as_bool("value_zero_first", value_zero_first)
    edge_k = as_int("edge_k", edge_k, low=1)
    gradient_windows = as_int("gradient_windows", gradient_windows, low=0)
    if gradient_windows == 1:
        raise InvalidInputError(
            "gradient_windows=1: the derivative of C needs two windows; pass 0 or >= 2"
        )
    ci = as_float("ci", ci, low=0.0, high=1.0)
    block = as_int("block", block, low=1)
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
    if value_zero_first or any(not p.identity for p in plans) or gradient_windows:
        check_writable(model, "attn.hook_pattern", "an attention bias")
    device = model_device(model)
    n_all = len(batch)
    gradient_windows = min(gradient_windows, n_all)
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    entries = tuple(range(n_layers + 1))
    sums = [SimilaritySums(len(entries), n_pos, d_model, edge_k, device) for _ in plans]
    grad = _Gradient(len(entries), n_pos, d_model, edge_k, device)
    attention: list[list[torch.Tensor]] = [[] for _ in plans]
    losses: list[list[torch.Tensor]] = [[] for _ in plans]
    rank, size = world()
    offset = shard_bounds(n_all, size)[rank][0]
    buffers: dict[str, Any] = {}
    head = LossHead(model)  # the loss without [batch pos d_vocab] logits
    seen = 0
    temperature = kind == "temperature"

    def pattern_hooks(plan: AttentionBiasPlan, out: list[torch.Tensor], g: int) -> list[HookSpec]:
        """Bias (or only read) each chosen block's pattern; checks into ``out``; with ``g``
        windows differentiated, add the local tangent of b to the pattern's own."""
        heads = None if plan.heads is None else list(plan.heads)
        rows: dict[int, torch.Tensor] = {}

        def make(bi: int) -> Any:
            def hook(
                pattern: Float[torch.Tensor, "batch head query_pos key_pos"], hook: Any
            ) -> Any:
                primal, tangent = fwad.unpack_dual(pattern) if g else (pattern, None)
                chosen = primal if heads is None else primal[:, heads]
                key = (tuple(chosen.shape), chosen.dtype, chosen.device)
                if not g and buffers.get("key") != key:  # reused by every block and pass
                    buffers.clear()
                    buffers.update(
                        key=key,
                        a=torch.zeros_like(chosen),  # zero above the diagonal
                        b=torch.zeros_like(chosen),
                        x=torch.empty_like(chosen),
                    )
                # two output buffers in turn: a block's pattern stays intact through the next
                own = None if g else buffers["ab"[bi % 2]]
                biased, row_checks = bias_pattern(
                    chosen, plan, checks=True, out=own, scratch=None if g else buffers["x"]
                )
                assert row_checks is not None
                checks = row_checks.mean((1, 2))
                if bi == 0:
                    rows[0] = torch.zeros(
                        primal.shape[0],
                        len(plan.blocks),
                        len(ATTENTION_CHECKS),
                        dtype=torch.float64,
                        device=primal.device,
                    )
                rows[0][:, bi] = checks
                if bi == len(plan.blocks) - 1:
                    out.append(rows.pop(0).cpu())
                if plan.identity and not value_zero_first and not g:
                    return None  # read only: the pass stays the unhooked one bit for bit
                if heads is None:
                    new = biased if not plan.identity else primal.clone()
                else:
                    new = primal.clone()
                    new[:, heads] = biased
                total: torch.Tensor | None = None
                if g:
                    phi = plan.phi(primal.shape[-2], primal.shape[-1]).to(primal.device)
                    a = chosen.double()
                    psi = torch.where(a > 0, torch.log(a), 0.0) if temperature else phi
                    local = a * (psi - (a * psi).sum(-1, keepdim=True))
                    total = torch.zeros_like(primal) if tangent is None else tangent.clone()
                    if heads is None:
                        total = total + local.to(total.dtype)
                    else:
                        total[:, heads] += local.to(total.dtype)
                    sel = total if heads is None else total[:, heads]
                    if bi == 0:
                        rows[1] = torch.zeros(
                            g, len(plan.blocks), len(ATTENTION_CHECKS), dtype=torch.float64
                        )
                    rows[1][:, bi] = _check_tangents(chosen, sel, phi, temperature)[:g].cpu()
                    if bi == len(plan.blocks) - 1:
                        grad.attention.append(rows.pop(1))
                if value_zero_first:  # what the first keys write is gone: so is its derivative
                    cols = slice(0, plan.first_k)
                    for t in (new, total) if total is not None else (new,):
                        if heads is None:
                            t[..., cols] = 0.0
                        else:
                            t[:, heads, :, cols] = 0.0
                return new if total is None else fwad.make_dual(new, total)

            return hook

        return [
            (block_hook_name(b, "attn.hook_pattern"), make(bi)) for bi, b in enumerate(plan.blocks)
        ]

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

    def step(tokens: torch.Tensor, mask: torch.Tensor) -> None:
        nonlocal seen
        b = int(tokens.shape[0])
        here = max(0, min(b, gradient_windows - (offset + seen)))
        seen += b
        for si, plan in enumerate(plans):
            g = here if si == base else 0
            hooks = [*pattern_hooks(plan, attention[si], g), *resid_hooks(si, g)]
            if not g:
                losses[si].append(head.loss(tokens, hooks, mask).double().cpu())
                continue
            with torch.inference_mode(False), torch.no_grad(), fwad.dual_level():
                dual = run_logits(model, tokens.clone(), hooks, attention_mask=mask.clone())
                logits, d_logits = fwad.unpack_dual(dual)
                losses[si].append(next_token_loss(logits, tokens, mask).double().cpu())
                grad.loss.append(_loss_tangent(logits[:g], d_logits, tokens[:g], mask[:g]))
            del dual, logits, d_logits

    try:
        stream(
            model,
            batch,
            [],
            batch_size=batch_size,
            desc=f"attention bias ({kind})",
            progress=progress,
            step=step,
        )
    finally:
        buffers.clear()
    provenance = provenance_of(info, batch, entries, bool(first))
    window_stats, sp, to_first = [], [], []
    for s_sums in sums:
        if size > 1:
            all_reduce_sum([s_sums.within, s_sums.units, s_sums.n])
        fields = finish_fields(
            s_sums,
            entries,
            n_all,
            device,
            first=first,
            edge_k=edge_k,
            space="resid",
            centre=None,
            standardize=False,
            massive_threshold=100.0,
            pseudo=False,
        )
        sim = PositionalSimilarity(**fields, provenance=provenance)
        window_stats.append(torch.stack([sim.per_window(s) for s in SIMILARITY_STATISTICS], -1))
        sp.append(sim.SP)
        to_first.append(sim.to_first)

    def rows(parts: list[torch.Tensor], shape: tuple[int, ...], n: int) -> torch.Tensor:
        local = torch.cat([torch.empty(0, *shape, dtype=torch.float64), *parts])
        return gather_rows(local, n, device).cpu() if size > 1 else local

    n_blocks, n_checks = len(plan0.blocks), len(ATTENTION_CHECKS)
    f64 = torch.float64
    if gradient_windows:
        if size > 1:
            all_reduce_sum([grad.within, grad.units, grad.d_within, grad.d_units])
        g_rows, g_stats, g_sp = grad.finish(gradient_windows, device)
        g_attention = rows(grad.attention, (n_blocks, n_checks), gradient_windows)
        g_loss = rows(grad.loss, (), gradient_windows)
    else:
        g_rows = torch.zeros(0, len(entries), len(SIMILARITY_STATISTICS), dtype=f64)
        g_stats = torch.full((len(entries), len(SIMILARITY_STATISTICS)), math.nan, dtype=f64)
        g_sp = torch.full((len(entries), n_pos), math.nan, dtype=f64)
        g_attention = torch.zeros(0, n_blocks, n_checks, dtype=f64)
        g_loss = torch.zeros(0, dtype=f64)
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
        return torch.zeros(n, dtype=torch.float64)
    target = tokens[:, 1:]
    parts = []
    for z, dz, tgt in zip(logits.split(2), d_logits[:n].split(2), target.split(2), strict=True):
        p = torch.softmax(z[:, :-1].double(), -1)
        dzz = dz[:, :-1].double()
        parts.append((p * dzz).sum(-1) - dzz.gather(-1, tgt[..., None]).squeeze(-1))
    d_nll = torch.cat(parts)
    valid = (mask[:, 1:] * mask[:, :-1]).to(d_nll.dtype)
    return ((d_nll * valid).sum(1) / valid.sum(1).clamp_min(1)).cpu()
