"""The forward passes of :func:`homoglens.patching.measure.positional_patching`: per batch the
normal and the position-ablated run (caching the activations the patches copy and the receiving
run's ``resid_pre`` that passes start from), then each cell's patched run, every run measured on
``copies`` stacked copies of the batch (:class:`PatchRunner`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import RESIDUAL_SITES, FwdHooks, HookedModel, HookFn, HookSpec
from homoglens.core.validate import require_finite
from homoglens.models.architectures import component_hook_name, resid_hook_name
from homoglens.profile.homogenization import homogenization_sums, positions_from_mask
from homoglens.run.engine import Pass, PassPlan, Sums
from homoglens.run.interventions import residual_write_hooks
from homoglens.run.losses import next_token_loss
from homoglens.sinks.maths import scalar_metric_weights

__all__ = ["PatchPasses", "PatchRunner", "keep_hook", "patch_hook", "write_hooks"]


@dataclass
class PatchPasses:
    """The passes of one batch of :func:`~homoglens.patching.measure.positional_patching`, as the
    pass plan of :func:`~homoglens.run.engine.stream` (:meth:`step`): the normal and the ablated
    run (adding into ``normal`` / ``ablated``, caching what the source run's patches copy and
    the receiving run's ``resid_pre`` at the blocks whose passes start there), then the patched
    runs of every cell (adding into ``patched``; ``red.sums["blocks_run"]`` counts the blocks
    run)."""

    model: HookedModel
    runner: PatchRunner
    component: str
    direction: str
    layers: tuple[int, ...]
    cells: tuple[tuple[int, int], ...]
    cell_axis: str
    cell_batch: int
    hook_names: list[str]
    ablation: list[HookSpec]
    ablation_of: list[list[HookSpec]]
    source_run: str
    receiving_hooks: list[HookSpec]
    starts: dict[int, bool]
    end: int
    patched: torch.Tensor
    normal: torch.Tensor
    ablated: torch.Tensor
    red: Sums

    def step(self, tokens: torch.Tensor, mask: torch.Tensor) -> PassPlan:
        """One batch's pass plan: both unpatched runs, then every cell's patched run.

        Args:
            tokens: The batch's token ids ``[batch pos]`` (sequences of one length).
            mask: Its attention mask ``[batch pos]``.
        """
        stores: dict[str, dict[str, torch.Tensor]] = {"normal": {}, "ablated": {}}
        for run, hooks, out in (
            ("normal", [], self.normal),
            ("ablated", self.ablation, self.ablated),
        ):
            wanted = (
                self.hook_names if run == self.source_run and self.component != "positions" else []
            )
            if run != self.source_run:  # the receiving run: its resid_pre, to start passes from
                wanted = [
                    component_hook_name(x, "resid_pre") for x in self.layers if self.starts[x]
                ]
                wanted = wanted if self.component != "positions" else []
            grab = [(name, keep_hook(stores[run], name)) for name in dict.fromkeys(wanted)]
            out += (
                yield from self.runner.run(tokens, mask, [*hooks, *grab], copies=1, start=None)
            )[:, 0]
        self.red.sums["blocks_run"] += 2 * self.end * len(tokens)
        if self.component == "positions":
            for i, hooks in enumerate(self.ablation_of):
                values = yield from self.runner.run(tokens, mask, hooks, copies=1, start=None)
                self.patched[:, i, 0] += values[:, 0]
                self.red.sums["blocks_run"] += self.end * len(tokens)
            return
        yield from self._cell_runs(tokens, mask, stores)

    def _cell_runs(
        self, tokens: torch.Tensor, mask: torch.Tensor, stores: dict[str, dict[str, torch.Tensor]]
    ) -> PassPlan:
        """The patched runs of one batch: per block, ``cell_batch`` cells per pass, each pass
        from the receiving run's cached ``resid_pre`` where ``starts`` says so.

        Args:
            tokens: The batch's token ids ``[batch pos]``.
            mask: Its attention mask ``[batch pos]``.
            stores: The activations cached by the normal and the ablated run, by run and hook.
        """
        n_c = len(self.cells)
        for i, (layer, name) in enumerate(zip(self.layers, self.hook_names, strict=True)):
            source = stores[self.source_run][name]
            receiving = stores["ablated" if self.direction == "restore" else "normal"]
            for lo in range(0, n_c, self.cell_batch):
                chunk = self.cells[lo : lo + self.cell_batch]
                patch = patch_hook(source, chunk, self.cell_axis)
                values = yield from self.runner.run(
                    tokens,
                    mask,
                    [
                        *self.receiving_hooks,
                        *write_hooks(self.model, self.component, layer, name, patch),
                    ],
                    copies=len(chunk),
                    start=receiving[component_hook_name(layer, "resid_pre")]
                    if self.starts[layer]
                    else None,
                    start_layer=layer if self.starts[layer] else None,
                )
                self.patched[:, i, lo : lo + len(chunk)] += values
                begin = layer if self.starts[layer] else 0
                self.red.sums["blocks_run"] += max(self.end - begin, 0) * len(tokens) * len(chunk)


def write_hooks(
    model: HookedModel, component: str, layer: int, name: str, patch: HookFn
) -> FwdHooks:
    """Hooks that write ``patch`` at ``component`` of block ``layer``: the residual stream itself
    for ``resid_*`` (:func:`~homoglens.run.interventions.residual_write_hooks`), else the hook."""
    if component in RESIDUAL_SITES:
        return residual_write_hooks(model, component, layer, patch)
    return [(name, patch)]


def keep_hook(store: dict[str, torch.Tensor], name: str) -> Callable[[torch.Tensor, Any], None]:
    """Hook storing a detached copy of its activation in ``store[name]``."""

    def hook(activation: torch.Tensor, hook: Any) -> None:
        store[name] = activation.detach().clone()

    return hook


def patch_hook(
    source: torch.Tensor, cells: tuple[tuple[int, int], ...], cell_axis: str
) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """Hook patching ``source`` into copy j of the batch at cell j (positions or a head)."""
    b, width = source.shape[0], source.shape[1]
    n = len(cells)
    if cell_axis == "pos":
        where = torch.zeros(n, 1, width, dtype=torch.bool, device="cpu")
        for j, (start, stop) in enumerate(cells):
            where[j, 0, start:stop] = True
        where = where.view(n, 1, width, *([1] * (source.ndim - 2)))
    else:  # one head per copy: source is [batch pos head_index d_head]
        where = torch.zeros(n, 1, 1, source.shape[2], 1, dtype=torch.bool, device="cpu")
        for j, (head, _) in enumerate(cells):
            where[j, 0, 0, head, 0] = True
    where = where.to(source.device)

    def hook(activation: torch.Tensor, hook: Any) -> torch.Tensor:
        view = activation.view(n, b, *activation.shape[1:])
        return torch.where(where, source[None], view).view_as(activation)

    return hook


class PatchRunner:
    """Runs (copies of) a batch with hooks and returns each metric summed per copy (a pass
    plan, :meth:`run`)."""

    def __init__(
        self,
        model: HookedModel,
        metrics: list[Any],
        homog: list[int],
        measured: int,
        needs_logits: bool,
        totals: torch.Tensor | None,
        edge_k: int,
        n_sequences: int,
    ) -> None:
        self.model, self.metrics, self.homog = model, metrics, homog
        self.measured, self.needs_logits = measured, needs_logits
        self.totals, self.edge_k, self.n = totals, edge_k, n_sequences

    def run(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        hooks: list[tuple[str, Any]],
        *,
        copies: int,
        start: torch.Tensor | None,
        start_layer: int | None = None,
    ) -> Generator[Pass, torch.Tensor | None, Float[torch.Tensor, "metric copy"]]:
        """Metric contributions (already divided by the corpus size) of each copy: the pass
        plan of one run, whose ``yield from`` gives them."""
        b = tokens.shape[0]
        out = torch.zeros(len(self.metrics), copies, dtype=torch.float64, device="cpu")
        rows_mask = mask.repeat(copies, 1)
        captured: dict[str, torch.Tensor] = {}

        def measure(resid: torch.Tensor, hook: Any) -> None:
            captured["resid"] = resid

        fwd_hooks = list(hooks)
        measured = ""
        if self.homog:
            # Entry l of the residual axis is read at blocks.{l}.hook_resid_pre (the same vector
            # as blocks.{l-1}.hook_resid_post), so a patch of resid_pre at block l reaches it.
            n_layers = int(self.model.cfg.n_layers)
            measured = (
                component_hook_name(self.measured, "resid_pre")
                if 0 < self.measured < n_layers
                else resid_hook_name(self.measured)
            )
            fwd_hooks.append((measured, measure))
        if start is not None:
            inputs = start.repeat(copies, *([1] * (start.ndim - 1)))
            asked = Pass(inputs, fwd_hooks, attention_mask=rows_mask, start_at_layer=start_layer)
        else:
            inputs = tokens.repeat(copies, 1)
            asked = Pass(inputs, fwd_hooks, attention_mask=rows_mask)
        logits = torch.empty(0, device=tokens.device)
        if self.needs_logits or not self.homog:
            full = yield asked
            assert full is not None
            logits = full
        else:  # end the pass at the measured entry: no later block, no unembedding
            yield replace(asked, last=measured)
        if self.homog:
            lengths = rows_mask.sum(1)
            sums = homogenization_sums(
                captured.pop("resid"),
                positions_from_mask(rows_mask),
                tokens.shape[1],
                per_sequence=True,
            )
            assert self.totals is not None
            w = scalar_metric_weights(lengths, tokens.shape[1], 0, self.edge_k, self.totals)
            per_row = (w * sums["seq_to_others"].nan_to_num(0.0).cpu()).sum(-1)  # [3 rows]
            index = {"mean_pairwise": 0, "first_excess": 1, "last_excess": 2}
            for m in self.homog:
                out[m] = per_row[index[self.metrics[m]]].view(copies, b).sum(1)
        if self.needs_logits:
            rows_tokens = tokens.repeat(copies, 1)
            for m, metric in enumerate(self.metrics):
                if metric == "loss":
                    loss = next_token_loss(logits, rows_tokens, rows_mask).double().cpu()
                    # NaN/inf logits make a sequence's loss non-finite: checked there, without
                    # a copy of [rows pos d_vocab]
                    require_finite(loss, "logits (unembed.hook_out)", "per-sequence losses")
                    out[m] = loss.view(copies, b).sum(1) / self.n
                elif callable(metric):
                    for j in range(copies):
                        rows = slice(j * b, (j + 1) * b)
                        try:  # a copy: a metric that edits its input cannot touch the others
                            value = metric(logits[rows].clone(), rows_tokens[rows], rows_mask[rows])
                        except TypeError as err:
                            name = getattr(metric, "__name__", "metric")
                            raise InvalidInputError(
                                f"metric {name} failed: {err}; it must accept (logits [batch pos "
                                "d_vocab], tokens [batch pos], attention_mask [batch pos])"
                            ) from err
                        out[m, j] = _scalar(value, metric) * b / self.n
        return out


def _scalar(value: Any, metric: Any) -> float:
    """The value of a callable metric as a finite float; an error naming ``metric`` if not."""
    name = getattr(metric, "__name__", "metric")
    if hasattr(value, "shape") and not isinstance(value, torch.Tensor):  # numpy scalar/array
        value = torch.as_tensor(value)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            raise InvalidInputError(
                f"metric {name} returned a tensor of shape {tuple(value.shape)}; it must return "
                "a scalar (the mean over the given sequences)"
            )
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(f"metric {name} returned {value!r}; it must return a finite scalar")
    return float(value)
