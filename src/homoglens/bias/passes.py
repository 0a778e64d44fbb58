"""The passes of :func:`homoglens.bias.measure.attention_bias_study`: at each strength one forward
pass over every window with the strength's attention jobs and the residual readers (the baseline's
first windows with forward-mode tangents: the gradient pass), then the pseudo-values' second
pass; the stream merges every sum and per-window row over ranks
(:class:`~homoglens.run.engine.Sums`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.autograd.forward_ad as fwad
from jaxtyping import Float, Int

from homoglens.bias.hooks import AttentionBiasPlan, bias_pattern
from homoglens.bias.result import ATTENTION_CHECKS
from homoglens.core.distributed import world
from homoglens.core.types import HookedModel, HookFn, HookSpec
from homoglens.models.architectures import resid_hook_name
from homoglens.run.blocked_attention import AttentionJob
from homoglens.run.data import TokenBatch
from homoglens.run.engine import Pass, PassPlan, Sums, stream
from homoglens.run.losses import LossHead, next_token_loss
from homoglens.similarity.maths import SIMILARITY_STATISTICS, WindowSums, similarity_coefficients
from homoglens.similarity.passes import on_cpu_rows

__all__ = ["BiasReadouts", "BiasRun", "GradientSums", "run_passes"]

_C_STATS = [e for e, name in enumerate(SIMILARITY_STATISTICS) if not name.startswith("naive")]


@dataclass(frozen=True)
class BiasRun:
    """An attention-bias study's checked arguments and what the passes run on: the plans (one
    per strength), the windows and the layout of the readouts."""

    model: HookedModel
    batch: TokenBatch
    kind: str
    values: tuple[float, ...]  # the strengths, ascending
    plans: list[AttentionBiasPlan]  # one per strength
    base: int  # the unbiased strength's index: its pass carries the tangents
    entries: tuple[int, ...]  # the residual entries read, 0..n_layers
    first: int  # the first position read
    n_pos: int
    edge_k: int
    value_zero_first: bool
    gradient_windows: int
    pseudo_values: bool
    replay: bool  # the unit vectors kept from the first pass for the second
    work: torch.dtype | None  # float64 for a float64 model, else None (float32)
    shard: tuple[int, int]  # this rank's windows
    device: torch.device
    batch_size: int
    progress: bool
    ci: float
    block: int | str
    seed: int
    info: Any  # the model's model_info


class BiasReadouts(NamedTuple):
    """What the passes read, over every window of every rank (CPU, float64)."""

    window_statistics: torch.Tensor  # [strength batch layer stat]
    sp: torch.Tensor  # [strength layer pos]
    to_first: torch.Tensor  # [strength layer pos]
    window_sp: torch.Tensor | None  # [strength batch layer 2], with the pseudo-values
    window_attention: torch.Tensor  # [strength batch block check]
    window_loss: torch.Tensor  # [strength batch]
    gradient: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    # per-window derivatives of the statistics, their mean, dSP, of the checks, of the loss


class GradientSums(Sums):
    """Float64 sums of the first-order derivative at zero (forward-mode tangents) on the
    differentiated windows: their unit vectors, Gram matrices and derivatives (``[layer pos
    pos]``: the cross-check is for windows of moderate T); and per window the derivatives of
    the statistics, the checks and the loss. Every window has a row (zero past the
    differentiated ones, :meth:`fill`), so the stream's merge keeps input order."""

    def __init__(
        self, n_layer: int, n_pos: int, d: int, edge_k: int, n_blocks: int, device: torch.device
    ) -> None:
        f64 = {"dtype": torch.float64, "device": device}
        sums = {
            "within": torch.zeros(n_layer, n_pos, n_pos, **f64),  # Gram matrices of the units
            "units": torch.zeros(n_layer, n_pos, d, **f64),  # their sums
            "d_within": torch.zeros(n_layer, n_pos, n_pos, **f64),  # the derivatives of both
            "d_units": torch.zeros(n_layer, n_pos, d, **f64),
        }
        self.coef = similarity_coefficients(n_pos, edge_k).to(device)  # [stat pos pos]
        self.row_shapes: dict[str, tuple[int, ...]] = {
            "statistics": (n_layer, int(self.coef.shape[0])),  # [g layer stat] d stat(U U^T)
            "attention": (n_blocks, len(ATTENTION_CHECKS)),  # [g block check]
            "loss": (),  # [g]
        }
        super().__init__(sums=sums, rows=self.row_shapes)

    def add(self, i: int, u: torch.Tensor, norms: torch.Tensor, dx: torch.Tensor) -> None:
        """Layer ``i``: unit vectors ``u``, their norms and the tangent ``dx`` of the vectors."""
        u, dx = u.double(), dx.double()
        n = norms.double()
        safe = torch.where(n > 0, n, torch.ones_like(n))
        du = torch.where(n > 0, (dx - u * (u * dx).sum(-1, keepdim=True)) / safe, 0.0)
        gram = u @ u.transpose(1, 2)
        d_gram = du @ u.transpose(1, 2)
        d_gram = d_gram + d_gram.transpose(1, 2)
        self.sums["within"][i] += gram.sum(0)
        self.sums["units"][i] += u.sum(0)
        self.sums["d_within"][i] += d_gram.sum(0)
        self.sums["d_units"][i] += du.sum(0)
        rows = self.rows["statistics"]
        if i == 0:
            rows.append(
                torch.zeros(
                    u.shape[0],
                    self.sums["within"].shape[0],
                    self.coef.shape[0],
                    dtype=torch.float64,
                    device=u.device,
                )
            )
        rows[-1][:, i] = torch.einsum("bij,eij->be", d_gram, self.coef)

    def fill(self, n: int) -> None:
        """Zero rows up to ``n`` windows in each per-window list: the windows seen on this rank
        that were not differentiated."""
        for name, parts in self.rows.items():
            have = sum(int(part.shape[0]) for part in parts)
            if have < n:
                shape = self.row_shapes[name]
                parts.append(torch.zeros(n - have, *shape, dtype=torch.float64, device="cpu"))

    def finish(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``([g layer stat] per-window derivatives, [layer stat] their mean, [layer pos] dSP)``
        with C and its derivative from the ``n`` differentiated windows (after the merge)."""
        rows = self.row_values("statistics")[:n].clone()
        ub, dub = self.sums["units"].cpu(), self.sums["d_units"].cpu()
        d_cross = dub @ ub.transpose(1, 2)
        d_cross = (d_cross + d_cross.transpose(1, 2) - self.sums["d_within"].cpu()) / (n * (n - 1))
        d_stat = torch.einsum("lij,eij->le", d_cross, self.coef.cpu())
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
    """The ``edit`` of one biased block's :class:`~homoglens.run.blocked_attention.AttentionJob`:
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
        """The same without tangents, in probability space (:func:`homoglens.bias.hooks.
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


class _Checks:
    """One pass's manipulation checks over a batch: the biased blocks' edits add each window's
    sums into :attr:`checks` (and, differentiated, :attr:`tangents`) ``{block index: [batch
    3]}``; :meth:`collect`, after the pass, appends their means per window ``[batch block
    check]`` to ``out`` (the first ``g`` windows' derivatives to ``tangent_out``)."""

    def __init__(
        self,
        plan: AttentionBiasPlan,
        n_heads: int,
        out: list[torch.Tensor],
        g: int,
        tangent_out: list[torch.Tensor] | None,
    ) -> None:
        self.plan, self.n_heads, self.g = plan, n_heads, g
        self.out, self.tangent_out = out, tangent_out
        self.checks: dict[int, torch.Tensor] = {}
        self.tangents: dict[int, torch.Tensor] = {}

    def collect(self, n_query: int) -> None:
        """After the pass: the mean checks per window ``[batch block check]``."""
        plan = self.plan
        n_heads = len(plan.heads) if plan.heads is not None else self.n_heads
        scale = 1.0 / (n_heads * n_query)
        self.out.append(
            (torch.stack([self.checks[bi] for bi in range(len(plan.blocks))], 1) * scale).cpu()
        )
        if self.g:
            assert self.tangent_out is not None
            found = torch.stack([self.tangents[bi] for bi in range(len(plan.blocks))], 1)
            self.tangent_out.append((found * scale)[: self.g].cpu())
        self.checks.clear()
        self.tangents.clear()


def _resid_hook(
    sums: WindowSums,
    feed: Callable[[int, torch.Tensor, int], None],
    grad: GradientSums | None,
    i: int,
    g: int,
    first: int,
) -> HookFn:
    """The reader of residual entry ``i`` in a strength's pass: its vectors into ``sums`` (by
    ``feed``); with ``g`` windows differentiated, their unit vectors and tangents into
    ``grad``."""

    def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
        x, dx = fwad.unpack_dual(resid) if g else (resid, None)
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        x = x.detach().to(work)
        feed(i, x, first)
        if g and dx is not None:
            assert grad is not None
            u, norms = sums.units_of(i, x[:g, first:])
            grad.add(i, u, norms, dx[:g, first:].to(work))
        elif g:
            assert grad is not None
            u, norms = sums.units_of(i, x[:g, first:])
            grad.add(i, u, norms, torch.zeros_like(u))

    return hook


def _cross_hook(sums: WindowSums, i: int, first: int) -> HookFn:
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


class _Replay:
    """The pseudo-values' second pass from the unit vectors kept in the first (no forward
    pass): computes every window's shares on its first call (as a stream's pass plan,
    :meth:`passes`, a plan of no pass)."""

    def __init__(self, sums: list[WindowSums]) -> None:
        self.sums = sums

    def __call__(self, tokens: torch.Tensor | None, mask: torch.Tensor | None) -> None:
        for s_sums in self.sums:
            if s_sums.kept is not None:
                s_sums.cross_from_kept()

    def passes(self, tokens: torch.Tensor, mask: torch.Tensor) -> PassPlan:
        """The replay as a stream's pass plan: no forward pass."""
        self(tokens, mask)
        yield from ()


class _Passes:
    """The passes of one study over this rank's windows, and the reducers they fill: the
    strengths' sums and per-window rows (:attr:`main`), the derivatives (:attr:`grad`, with
    differentiated windows) and the pseudo-values' shares (:attr:`cross`)."""

    def __init__(self, run: BiasRun) -> None:
        self.run = run
        model = run.model
        self.n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
        n_entries, n_stat = len(run.entries), len(SIMILARITY_STATISTICS)
        self.sums = [
            WindowSums(n_entries, run.n_pos, d_model, run.edge_k, run.device) for _ in run.plans
        ]
        if run.replay:
            for s_sums in self.sums:
                s_sums.keep_units(run.shard[1] - run.shard[0], run.work or torch.float32)
        self.grad = None
        if run.gradient_windows:
            n_blocks = len(run.plans[0].blocks)
            self.grad = GradientSums(
                n_entries, run.n_pos, d_model, run.edge_k, n_blocks, run.device
            )
        self.main = Sums(
            sums={
                f"{name}.{si}": getattr(s_sums, name)
                for si, s_sums in enumerate(self.sums)
                for name in ("units", "squares", "first", "n")
            },
            rows={
                **{f"statistics.{si}": (n_entries, n_stat) for si in range(len(self.sums))},
                **{
                    f"attention.{si}": (len(p.blocks), len(ATTENTION_CHECKS))
                    for si, p in enumerate(run.plans)
                },
                **{f"loss.{si}": () for si in range(len(self.sums))},
            },
        )
        for si, s_sums in enumerate(self.sums):  # the sums fill their rows' lists in place
            self.main.rows[f"statistics.{si}"] = s_sums.rows
        self.cross = Sums(
            rows={
                **{f"cross.{si}": (n_entries, n_stat) for si in range(len(self.sums))},
                **{f"same.{si}": (n_entries, run.n_pos) for si in range(len(self.sums))},
            }
        )
        for si, s_sums in enumerate(self.sums):
            self.cross.rows[f"cross.{si}"] = s_sums.cross_rows
            self.cross.rows[f"same.{si}"] = s_sums.same_rows
        self.head = LossHead(model)  # the loss without [batch pos d_vocab] logits
        self.seen = 0

    def jobs_of(
        self, plan: AttentionBiasPlan, out: list[torch.Tensor], g: int
    ) -> tuple[dict[int, AttentionJob], _Checks]:
        """Each chosen block's attention, biased (or, at the baseline, only read) a block of
        queries at a time; its checks into ``out``; with ``g`` windows differentiated, b (or
        beta) enters as a dual number and the checks' derivatives go to ``grad``."""
        tangent_out = self.grad.rows["attention"] if g and self.grad is not None else None
        checks = _Checks(plan, int(self.run.model.cfg.n_heads), out, g, tangent_out)
        jobs = {
            block: AttentionJob(
                edit=_biased_rows(
                    plan,
                    bi,
                    checks.checks,
                    checks.tangents,
                    value_zero_first=self.run.value_zero_first,
                    dual=g > 0,
                )
            )
            for bi, block in enumerate(plan.blocks)
        }
        if g:  # dual numbers run through every block's attention in the blocks' own arithmetic
            # (forward-mode autograd has no rule for the fused SDPA kernels of a GPU)
            for block in range(self.n_layers):
                jobs.setdefault(block, AttentionJob(edit=_unchanged))
        return jobs, checks

    def resid_hooks(self, si: int, g: int) -> list[HookSpec]:
        """Strength ``si``'s residual readers (``g`` windows differentiated)."""
        run = self.run
        feed = on_cpu_rows(self.sums[si], len(run.entries))
        return [
            (resid_hook_name(layer), _resid_hook(self.sums[si], feed, self.grad, i, g, run.first))
            for i, layer in enumerate(run.entries)
        ]

    def step(self, tokens: torch.Tensor, mask: torch.Tensor) -> PassPlan:
        """The main pass over a batch: one forward pass per strength (a stream's pass plan)."""
        run = self.run
        b = int(tokens.shape[0])
        here = max(0, min(b, run.gradient_windows - (run.shard[0] + self.seen)))
        self.seen += b
        for si, plan in enumerate(run.plans):
            g = here if si == run.base else 0
            hooks = self.resid_hooks(si, g)
            if not g:
                jobs, checks = self.jobs_of(plan, self.main.rows[f"attention.{si}"], 0)
                full = Pass(tokens, hooks, jobs=jobs, attention_mask=mask)
                loss = yield from self.head.loss_of(full)
                self.main.rows[f"loss.{si}"].append(loss.double().cpu())
                checks.collect(int(tokens.shape[1]))
                continue
            yield from self.gradient_pass(si, plan, tokens, mask, hooks, g)
        if self.grad is not None:
            self.grad.fill(self.seen)

    def gradient_pass(
        self,
        si: int,
        plan: AttentionBiasPlan,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        hooks: list[HookSpec],
        g: int,
    ) -> Generator[Pass, torch.Tensor | None, None]:
        """The baseline's pass over a batch whose first ``g`` windows are differentiated:
        forward-mode tangents through the logits (the loss's derivative from them), as a pass
        plan: the dual level and the modes stay entered while the engine runs its pass."""
        assert self.grad is not None
        with torch.inference_mode(False), torch.no_grad(), fwad.dual_level():
            jobs, checks = self.jobs_of(plan, self.main.rows[f"attention.{si}"], g)
            dual = yield Pass(tokens.clone(), hooks, jobs=jobs, attention_mask=mask.clone())
            assert dual is not None
            logits, d_logits = fwad.unpack_dual(dual)
            self.main.rows[f"loss.{si}"].append(
                next_token_loss(logits, tokens, mask).double().cpu()
            )
            self.grad.rows["loss"].append(_loss_tangent(logits[:g], d_logits, tokens[:g], mask[:g]))
            checks.collect(int(tokens.shape[1]))
        del dual, logits, d_logits

    def cross_step(self, tokens: torch.Tensor, mask: torch.Tensor) -> PassPlan:
        """The pseudo-values' second forward pass over a batch, one per strength (a stream's
        pass plan)."""
        run = self.run
        for si, plan in enumerate(run.plans):
            hooks = [
                (resid_hook_name(layer), _cross_hook(self.sums[si], i, run.first))
                for i, layer in enumerate(run.entries)
            ]
            jobs, checks = self.jobs_of(plan, [], 0)
            yield from self.head.loss_of(Pass(tokens, hooks, jobs=jobs, attention_mask=mask))
            checks.collect(int(tokens.shape[1]))

    def readouts(self) -> BiasReadouts:
        """Every window's readouts, from the merged sums and rows."""
        run = self.run
        window_stats, sp, to_first, window_sp = [], [], [], []
        for si, s_sums in enumerate(self.sums):
            per_window = self.main.row_values(f"statistics.{si}")
            cross = same = None
            if run.pseudo_values:
                cross = self.cross.row_values(f"cross.{si}")
                same = self.cross.row_values(f"same.{si}")
            stats, s_sp, s_first, s_edges = s_sums.finish(per_window, cross, same)
            window_stats.append(stats)
            sp.append(s_sp)
            to_first.append(s_first)
            window_sp.append(s_edges)
        n = run.gradient_windows
        if self.grad is not None:
            g_rows, g_stats, g_sp = self.grad.finish(n)
            g_attention = self.grad.row_values("attention")[:n].clone()
            g_loss = self.grad.row_values("loss")[:n].clone()
            gradient = (g_rows, g_stats, g_sp, g_attention, g_loss)
        else:
            gradient = _no_gradient(len(run.entries), run.n_pos, len(run.plans[0].blocks))
        main = self.main
        return BiasReadouts(
            window_statistics=torch.stack(window_stats),
            sp=torch.stack(sp),
            to_first=torch.stack(to_first),
            window_sp=torch.stack(window_sp) if run.pseudo_values else None,
            window_attention=torch.stack(
                [main.row_values(f"attention.{si}") for si in range(len(run.plans))]
            ),
            window_loss=torch.stack(
                [main.row_values(f"loss.{si}") for si in range(len(run.plans))]
            ),
            gradient=gradient,
        )


def _no_gradient(
    n_layer: int, n_pos: int, n_blocks: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The derivative readouts of a study that differentiates no window: empty and NaN."""
    f64, n_stat, n_checks = torch.float64, len(SIMILARITY_STATISTICS), len(ATTENTION_CHECKS)
    return (
        torch.zeros(0, n_layer, n_stat, dtype=f64, device="cpu"),
        torch.full((n_layer, n_stat), math.nan, dtype=f64, device="cpu"),
        torch.full((n_layer, n_pos), math.nan, dtype=f64, device="cpu"),
        torch.zeros(0, n_blocks, n_checks, dtype=f64, device="cpu"),
        torch.zeros(0, dtype=f64, device="cpu"),
    )


def run_passes(run: BiasRun) -> BiasReadouts:
    """Run an attention-bias study's passes: the main pass (every strength; the gradient pass
    on the baseline's first windows), then, with ``pseudo_values``, the second pass (from the
    kept unit vectors, or a second forward pass per strength). The stream merges each pass's
    sums and rows over ranks.

    Args:
        run: The checked arguments and plans.

    Returns:
        Every window's readouts.
    """
    passes = _Passes(run)
    reducers: list[Sums] = [passes.main] if passes.grad is None else [passes.main, passes.grad]
    stream(
        run.model,
        run.batch,
        reducers,
        batch_size=run.batch_size,
        desc=f"attention bias ({run.kind})",
        progress=run.progress,
        passes=passes.step,
    )
    if run.replay and world()[1] == 1:  # nothing to merge: no stream needed
        _Replay(passes.sums)(None, None)
    elif run.pseudo_values:
        replay = _Replay(passes.sums) if run.replay else None
        stream(
            run.model,
            run.batch,
            [passes.cross],
            batch_size=run.batch_size,
            desc=f"attention bias ({run.kind}, pseudo-values)",
            progress=run.progress and replay is None,
            passes=passes.cross_step if replay is None else replay.passes,
        )
    return passes.readouts()
