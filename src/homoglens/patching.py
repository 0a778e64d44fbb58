"""Activation patching between a normal run and a run with positional information ablated.

``restore``: the receiving run has its positions ablated (``ablated_positions``) and gets one
activation from the normal run; ``break``: the normal run gets one activation from the ablated
run. Each cell patches one component at one layer, at one bin of positions (or one head at every
position); the metric is measured on the patched run and normalised as in TransformerLens'
``patching`` conventions: 0 = the patch changed nothing, 1 = the metric reached the source run.

Cells are batched: one forward pass runs ``cell_batch`` copies of a batch, each copy patched at a
different cell. On a HookedTransformer each pass starts at the patched block from the receiving
run's cached ``blocks.{l}.hook_resid_pre`` (``start_at_layer``); passes stop at the measured
residual entry when no metric needs the logits.

References:
    Meng et al. 2022, "Locating and Editing Factual Associations in GPT", arXiv 2202.05262
    (causal tracing); Heimersheim & Nanda 2024, "How to use and interpret activation
    patching", arXiv 2404.15255; Zhang & Nanda 2024, arXiv 2309.16042 (metrics and methods).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int

from homoglens.architectures import architecture_of, block_hook_name, family_of, resid_hook_name
from homoglens.data import DataInput, to_token_batch
from homoglens.engine import (
    Sums,
    next_token_loss,
    provenance_of,
    run_logits,
    run_through,
    stream,
)
from homoglens.errors import InvalidInputError
from homoglens.homogenization import homogenization_sums, positions_from_mask
from homoglens.interventions import position_ablation_hooks, residual_write_hooks
from homoglens.models import model_info
from homoglens.results.patching import PositionalPatchingResult
from homoglens.sink_math import edge_totals, scalar_metric_weights
from homoglens.types import (
    PATCH_COMPONENTS,
    PATCH_METRICS,
    POSITION_ABLATIONS,
    RESIDUAL_SITES,
    BosPolicy,
    FwdHooks,
    HookedModel,
    HookFn,
    HookSpec,
    PatchComponent,
    PatchDirection,
    PatchMetric,
    PositionAblation,
)
from homoglens.validate import as_bool, as_int, require_finite

if TYPE_CHECKING:
    pass

__all__ = [
    "PATCH_COMPONENTS",
    "PATCH_METRICS",
    "PositionalPatchingResult",
    "positional_patching",
]


MetricFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | float]

_HOOK_POINTS = {  # the block hook point each component is read and written at
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "head": "attn.hook_z",
}


def _check_metrics(metric: Any) -> tuple[list[str | MetricFn], tuple[str, ...]]:
    chosen = list(metric) if isinstance(metric, (list, tuple)) else [metric]
    if not chosen:
        raise InvalidInputError("metric is empty; give a name from PATCH_METRICS or a callable")
    names = []
    for m in chosen:
        if callable(m):
            names.append(getattr(m, "__name__", "custom"))
        elif isinstance(m, str) and m in PATCH_METRICS:
            names.append(m)
        else:
            raise InvalidInputError(
                f"metric {m!r} must be one of {PATCH_METRICS} or a callable "
                "f(logits [batch pos d_vocab], tokens, attention_mask) -> scalar"
            )
    if len(set(names)) != len(names):
        raise InvalidInputError(
            f"metric names {names} repeat; give each metric function its own name (def, not "
            "lambda, or set fn.__name__)"
        )
    return chosen, tuple(names)


def _check_cells(
    component: str, bins: Any, n_pos: int, n_heads: int
) -> tuple[tuple[tuple[int, int], ...], str]:
    if component == "head":
        return tuple((h, h + 1) for h in range(n_heads)), "head_index"
    if bins is None:
        return tuple((p, p + 1) for p in range(n_pos)), "pos"
    if hasattr(bins, "__index__") or (isinstance(bins, torch.Tensor) and bins.ndim == 0):
        n = as_int("bins", bins, low=1, high=n_pos)
        edges = [round(i * n_pos / n) for i in range(n + 1)]
        return tuple((edges[i], edges[i + 1]) for i in range(n)), "pos"
    if isinstance(bins, (str, bytes, float, bool)) or not hasattr(bins, "__iter__"):
        raise InvalidInputError(
            f"bins={bins!r} must be None, a number of bins, or (start, stop) pairs"
        )
    cells = []
    for pair in bins:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidInputError(f"bins must be an int or (start, stop) pairs, got {pair!r}")
        start = as_int("bin start", pair[0], low=0, high=n_pos - 1)
        stop = as_int("bin stop", pair[1], low=start + 1, high=n_pos)
        cells.append((start, stop))
    if not cells:
        raise InvalidInputError("bins is empty")
    return tuple(cells), "pos"


def positional_patching(
    model: HookedModel,
    data: DataInput,
    *,
    how: PositionAblation = "zero",
    component: PatchComponent = "resid_pre",
    metric: PatchMetric | MetricFn | Sequence[PatchMetric | MetricFn] = "mean_pairwise",
    direction: PatchDirection = "restore",
    layers: Sequence[int] | None = None,
    bins: int | Sequence[tuple[int, int]] | None = None,
    metric_layer: int | None = None,
    edge_k: int = 8,
    seed: int = 0,
    shift: int = 1,
    batch_size: int = 4,
    cell_batch: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> PositionalPatchingResult:
    """Activation patching between the normal run and a position-ablated run, layer x position
    (or layer x head).

    Each cell copies the source run's activation of ``component`` at one block, at one bin of
    positions (every position for ``component="head"``), into the receiving run, and measures
    ``metric``. ``restore``: receiving = ablated run, source = normal run; ``break``: the other
    way round. ``effect`` = (patched - receiving) / (source - receiving).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        how: Positional ablation of the ablated run (:func:`position_ablation_hooks`).
        component: One of :data:`PATCH_COMPONENTS`.
        metric: A name from :data:`PATCH_METRICS`, a callable
            ``f(logits [batch pos d_vocab], tokens [batch pos], attention_mask [batch pos])``
            returning the scalar mean over the given sequences, or a list of them (all measured
            on the same patched runs).
        direction: ``"restore"`` or ``"break"``.
        layers: Blocks to patch (default: every block that can change the metric).
        bins: ``None`` (every position is a cell), a number of equal position bins, or
            ``(start, stop)`` pairs. Ignored for ``component="head"``.
        metric_layer: Residual entry of the homogenization metrics (default ``n_layers``).
        edge_k: Tokens per edge for ``first_excess`` / ``last_excess``.
        seed: Seed of ``how="permute"``.
        shift: Offset of ``how="shift"``.
        batch_size: Sequences per forward pass before cell copies.
        cell_batch: Cells per forward pass (the pass holds ``batch_size * cell_batch`` rows).
        attention_mask: For token input.
        bos: For text input.
        progress: Show a progress bar.

    Returns:
        :class:`PositionalPatchingResult`.

    Raises:
        InvalidInputError: unknown ``component``/``direction``/``metric``/``how``, a component
            the architecture lacks (``resid_mid`` on GPT-NeoX), a metric that does not return a
            scalar, bad layers or bins, or bad data. No hook stays attached after any error.

    References:
        Heimersheim & Nanda 2024, arXiv 2404.15255; Zhang & Nanda 2024, arXiv 2309.16042;
        Yusupov et al. 2025, arXiv 2508.17126.
    """
    progress = as_bool("progress", progress)
    info = model_info(model)
    # only component="positions" needs to know where position enters (a table row)
    spec = architecture_of(model) if component == "positions" else None
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if component not in PATCH_COMPONENTS:
        raise InvalidInputError(f"component={component!r} must be one of {PATCH_COMPONENTS}")
    if component == "resid_mid" and "blocks.0.hook_resid_mid" not in model.hook_dict:
        raise InvalidInputError(  # e.g. GPT-NeoX / Pythia with parallel attention and MLP
            f"component='resid_mid' does not exist in this {family_of(model)} model (attention and "
            "MLP run in parallel); patch 'attn_out' or 'mlp_out' instead"
        )
    if direction not in ("restore", "break"):
        raise InvalidInputError(f"direction={direction!r} must be 'restore' or 'break'")
    if how not in POSITION_ABLATIONS:
        raise InvalidInputError(f"how={how!r} must be one of {list(POSITION_ABLATIONS)}")
    chosen_metrics, names = _check_metrics(metric)
    measured = n_layers if metric_layer is None else as_int("metric_layer", metric_layer, low=0)
    if measured > n_layers:
        raise InvalidInputError(f"metric_layer={measured} must be in [0, {n_layers}]")
    needs_logits = any(m == "loss" or callable(m) for m in chosen_metrics)
    homog = [i for i, m in enumerate(chosen_metrics) if isinstance(m, str) and m != "loss"]
    learned = spec is not None and spec.positional == "learned_absolute"
    if layers is None and component == "positions" and learned:
        chosen_layers: tuple[int, ...] = (0,)
    elif layers is None:  # every block that can change the metrics
        chosen_layers = tuple(range(n_layers if needs_logits else measured))
    else:
        given: Any = (
            [layers] if hasattr(layers, "__index__") and not isinstance(layers, bool) else layers
        )
        if isinstance(given, (str, bytes)) or not hasattr(given, "__iter__"):
            raise InvalidInputError(f"layers={layers!r} must be a list of block indices")
        chosen_layers = tuple(as_int("layer", x, low=0, high=n_layers - 1) for x in given)
        if not chosen_layers or len(set(chosen_layers)) != len(chosen_layers):
            raise InvalidInputError(f"layers={layers!r} must be distinct blocks")
        # resid_pre of block l is residual entry l itself (where the metric is read); every
        # other component of block l, and any later block, comes after it.
        late = [
            x for x in chosen_layers if x > measured or (x == measured and component != "resid_pre")
        ]
        if late and not needs_logits:
            raise InvalidInputError(
                f"blocks {late} come at or after residual entry metric_layer={measured} (the "
                f"output of block {measured - 1}), so they cannot change a homogenization metric "
                "measured there; patch earlier blocks, raise metric_layer, or add 'loss'"
            )
    if component == "positions" and learned and chosen_layers != (0,):
        raise InvalidInputError(
            f"layers={list(chosen_layers)}: a learned-absolute model ({family_of(model)}) gets its "
            "positions once, at the embeddings; component='positions' has only block 0"
        )
    if not chosen_layers:
        raise InvalidInputError(
            f"no block before metric_layer={measured} can change the metric; raise metric_layer"
        )
    batch_size = as_int("batch_size", batch_size, low=1)
    cell_batch = as_int("cell_batch", cell_batch, low=1)
    edge_k = as_int("edge_k", edge_k, low=1)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    if any(chosen_metrics[i] in ("first_excess", "last_excess") for i in homog):
        short = torch.nonzero(batch.lengths < 2 * edge_k + 2).flatten().tolist()
        if short:
            raise InvalidInputError(
                f"sequences {short[:10]} have fewer than 2 * edge_k + 2 = {2 * edge_k + 2} "
                "tokens; use a smaller edge_k or longer sequences"
            )
    if needs_logits and bool((batch.lengths < 2).any()):
        short = torch.nonzero(batch.lengths < 2).flatten().tolist()
        raise InvalidInputError(
            f"sequences {short[:10]} have a single token, so no next-token loss; drop them or "
            "use a homogenization metric"
        )
    n_pos = int(batch.lengths.max())
    if component == "positions":
        cells, cell_axis = ((0, n_pos),), "pos"
    else:
        cells, cell_axis = _check_cells(component, bins, n_pos, n_heads)
    options: dict[str, Any] = {"permute": {"seed": seed}, "shift": {"shift": shift}}.get(how, {})
    ablation = position_ablation_hooks(model, how, **options)
    order = torch.sort(batch.lengths, stable=True).indices  # uniform-length batches
    batch = batch[order]
    totals = edge_totals(batch.lengths, 0, edge_k) if homog else None
    skip = info.backend == "hooked"
    runner = _Runner(
        model, chosen_metrics, homog, measured, needs_logits, totals, edge_k, len(batch)
    )
    n_m, n_l, n_c = len(names), len(chosen_layers), len(cells)
    cpu = {"dtype": torch.float64, "device": "cpu"}
    patched = torch.zeros(n_m, n_l, n_c, **cpu)
    normal = torch.zeros(n_m, **cpu)
    ablated = torch.zeros(n_m, **cpu)
    # Homogenization only: each pass ends where the metric is read (entry l is read at
    # blocks.{l}.hook_resid_pre, before block l), so blocks 0 .. l - 1 run.
    end = n_layers if needs_logits else measured
    hook_names = (
        [block_hook_name(layer, _HOOK_POINTS[component]) for layer in chosen_layers]
        if component in _HOOK_POINTS
        else []
    )
    ablation_of: list[list[HookSpec]] = []
    if component == "positions":  # the ablation's own hooks, one set per cell
        ablation_of = _positions_cells(model, how, options, chosen_layers, direction, learned)
    source_run = "normal" if direction == "restore" else "ablated"
    receiving_hooks = ablation if direction == "restore" else []
    starts = {
        layer: skip and (not homog or layer < measured or layer == measured == 0)
        for layer in chosen_layers
    }
    red = Sums(
        sums={
            "patched": patched,
            "normal": normal,
            "ablated": ablated,
            "blocks_run": torch.zeros((), dtype=torch.float64, device="cpu"),
        }
    )

    def step(tokens: torch.Tensor, mask: torch.Tensor) -> None:
        stores: dict[str, dict[str, torch.Tensor]] = {"normal": {}, "ablated": {}}
        for run, hooks, out in (("normal", [], normal), ("ablated", ablation, ablated)):
            wanted = hook_names if run == source_run and component != "positions" else []
            if run != source_run:  # the receiving run: its resid_pre, to start passes from
                wanted = [block_hook_name(x, "hook_resid_pre") for x in chosen_layers if starts[x]]
                wanted = wanted if component != "positions" else []
            grab = [(name, _keep(stores[run], name)) for name in dict.fromkeys(wanted)]
            out += runner.run(tokens, mask, [*hooks, *grab], copies=1, start=None)[:, 0]
        red.sums["blocks_run"] += 2 * end * len(tokens)
        if component == "positions":
            for i, hooks in enumerate(ablation_of):
                values = runner.run(tokens, mask, hooks, copies=1, start=None)
                patched[:, i, 0] += values[:, 0]
                red.sums["blocks_run"] += end * len(tokens)
            return
        for i, (layer, name) in enumerate(zip(chosen_layers, hook_names, strict=True)):
            source = stores[source_run][name]
            receiving = stores["ablated" if direction == "restore" else "normal"]
            for lo in range(0, n_c, cell_batch):
                chunk = cells[lo : lo + cell_batch]
                patch = _patch_hook(source, chunk, cell_axis)
                values = runner.run(
                    tokens,
                    mask,
                    [*receiving_hooks, *_write(model, component, layer, name, patch)],
                    copies=len(chunk),
                    start=receiving[block_hook_name(layer, "hook_resid_pre")]
                    if starts[layer]
                    else None,
                    start_layer=layer if starts[layer] else None,
                )
                patched[:, i, lo : lo + len(chunk)] += values
                begin = layer if starts[layer] else 0
                red.sums["blocks_run"] += max(end - begin, 0) * len(tokens) * len(chunk)

    stream(
        model,
        batch,
        [red],
        batch_size=batch_size,
        desc="patching",
        progress=progress,
        step=step,
        uniform_length=True,
    )
    blocks_run = float(red.sums["blocks_run"])
    full = n_layers * len(batch)
    if component == "positions":
        batching = "one forward pass per block (each cell changes which blocks are ablated)"
    else:
        batching = (
            f"up to {cell_batch} cells per forward pass, each a copy of up to {batch_size} "
            "sequences"
            + (
                "; each pass starts at the patched block (HookedTransformer start_at_layer on the "
                "receiving run's cached resid_pre)"
                if skip
                else "; each pass runs from the embeddings (TransformerBridge)"
            )
        )
    batching += "" if needs_logits else f"; passes end at residual entry {measured}"
    return PositionalPatchingResult(
        component=component,
        how=how,
        direction=direction,
        metrics=names,
        metric_layer=measured,
        layers=chosen_layers,
        cells=cells,
        cell_axis=cell_axis,
        patched=patched,
        normal=normal,
        ablated=ablated,
        n_sequences=len(batch),
        forward_equivalents=blocks_run / full,
        batching=batching,
        provenance=provenance_of(info, batch, (measured,), False),
    )


def _positions_cells(
    model: HookedModel,
    how: PositionAblation,
    options: dict[str, Any],
    layers: tuple[int, ...],
    direction: str,
    learned: bool,
) -> list[list[tuple[str, Any]]]:
    """Hooks of each ``positions`` cell: restore = ablate every block but this one; break =
    ablate this block only (learned models: the embedding is the only place)."""
    n_layers = int(model.cfg.n_layers)
    cells = []
    for layer in layers:
        if learned:
            cells.append(
                [] if direction == "restore" else position_ablation_hooks(model, how, **options)
            )
            continue
        blocks = [b for b in range(n_layers) if b != layer] if direction == "restore" else [layer]
        cells.append(
            position_ablation_hooks(model, how, layers=blocks, **options) if blocks else []
        )
    return cells


def _write(model: HookedModel, component: str, layer: int, name: str, patch: HookFn) -> FwdHooks:
    """Hooks that write ``patch`` at ``component`` of block ``layer``: the residual stream itself
    for ``resid_*`` (:func:`~homoglens.interventions.residual_write_hooks`), else the hook."""
    if component in RESIDUAL_SITES:
        return residual_write_hooks(model, component, layer, patch)
    return [(name, patch)]


def _keep(store: dict[str, torch.Tensor], name: str) -> Callable[[torch.Tensor, Any], None]:
    def hook(activation: torch.Tensor, hook: Any) -> None:
        store[name] = activation.detach().clone()

    return hook


def _patch_hook(
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


class _Runner:
    """Runs (copies of) a batch with hooks and returns each metric summed per copy."""

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
    ) -> Float[torch.Tensor, "metric copy"]:
        """Metric contributions (already divided by the corpus size) of each copy."""
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
                block_hook_name(self.measured, "hook_resid_pre")
                if 0 < self.measured < n_layers
                else resid_hook_name(self.measured)
            )
            fwd_hooks.append((measured, measure))
        kwargs: dict[str, Any] = {"attention_mask": rows_mask}
        if start is not None:
            inputs = start.repeat(copies, *([1] * (start.ndim - 1)))
            kwargs["start_at_layer"] = start_layer
        else:
            inputs = tokens.repeat(copies, 1)
        logits = torch.empty(0, device=tokens.device)
        if self.needs_logits or not self.homog:
            logits = run_logits(self.model, inputs, fwd_hooks, **kwargs)
        else:  # end the pass at the measured entry: no later block, no unembedding
            run_through(self.model, inputs, measured, fwd_hooks, **kwargs)
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
