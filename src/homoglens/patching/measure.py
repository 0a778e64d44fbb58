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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import (
    PATCH_COMPONENTS,
    PATCH_METRICS,
    POSITION_ABLATIONS,
    BosPolicy,
    HookedModel,
    HookSpec,
    ModelInput,
    PatchComponent,
    PatchDirection,
    PatchMetric,
    PositionAblation,
)
from homoglens.core.validate import as_int, block_index
from homoglens.models.architectures import (
    BLOCK_POINTS,
    architecture_of,
    component_hook_name,
    family_of,
)
from homoglens.patching.passes import PatchPasses, PatchRunner
from homoglens.patching.result import PositionalPatchingResult
from homoglens.run.data import DataInput, TokenBatch
from homoglens.run.engine import (
    Sums,
    provenance_of,
)
from homoglens.run.entrance import entrance
from homoglens.run.interventions import position_ablation_hooks
from homoglens.sinks.maths import edge_totals

if TYPE_CHECKING:
    pass

__all__ = [
    "PATCH_COMPONENTS",
    "PATCH_METRICS",
    "PositionalPatchingResult",
    "positional_patching",
]


MetricFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | float]


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
    model: ModelInput,
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
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    info = call.info
    request = _check_request(model, how, component, metric, direction, layers, metric_layer)
    cell_batch = as_int("cell_batch", cell_batch, low=1)
    edge_k = as_int("edge_k", edge_k, low=1)
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    _check_lengths(batch, request, edge_k)
    n_pos = int(batch.lengths.max())
    if component == "positions":
        cells, cell_axis = ((0, n_pos),), "pos"
    else:
        cells, cell_axis = _check_cells(component, bins, n_pos, int(model.cfg.n_heads))
    options: dict[str, Any] = {"permute": {"seed": seed}, "shift": {"shift": shift}}.get(how, {})
    ablation = position_ablation_hooks(model, how, **options)
    order = torch.sort(batch.lengths, stable=True).indices  # uniform-length batches
    batch = batch[order]
    passes = _patch_passes(
        model, info, request, batch, component=component, direction=direction, how=how,
        options=options, ablation=ablation, cells=cells, cell_axis=cell_axis,
        cell_batch=cell_batch, edge_k=edge_k,
    )  # fmt: skip
    call.stream(
        batch,
        [passes.red],
        desc="patching",
        passes=passes.step,
        uniform_length=True,
    )
    blocks_run = float(passes.red.sums["blocks_run"])
    full = int(model.cfg.n_layers) * len(batch)
    batching = _batching(
        component, cell_batch, call.batch_size, info.backend == "hooked", request.needs_logits,
        request.measured,
    )  # fmt: skip
    return PositionalPatchingResult(
        component=component,
        how=how,
        direction=direction,
        metrics=request.names,
        metric_layer=request.measured,
        layers=request.layers,
        cells=cells,
        cell_axis=cell_axis,
        patched=passes.patched,
        normal=passes.normal,
        ablated=passes.ablated,
        n_sequences=len(batch),
        forward_equivalents=blocks_run / full,
        batching=batching,
        provenance=provenance_of(info, batch, (request.measured,), False),
    )


@dataclass(frozen=True)
class _Request:
    """The checked choices of one :func:`positional_patching` call: the metrics (and their
    names), the residual entry they are read at, whether any needs the logits, the indices of
    the homogenization metrics, whether positions are learned-absolute, and the blocks patched."""

    metrics: list[str | MetricFn]
    names: tuple[str, ...]
    measured: int
    needs_logits: bool
    homog: list[int]
    learned: bool
    layers: tuple[int, ...]


def _check_request(
    model: HookedModel,
    how: Any,
    component: Any,
    metric: Any,
    direction: Any,
    layers: Any,
    metric_layer: Any,
) -> _Request:
    """Check ``component``, ``direction``, ``how``, ``metric``, ``metric_layer`` and ``layers``
    of :func:`positional_patching` in that order, and resolve the metrics and the blocks."""
    # only component="positions" needs to know where position enters (a table row)
    spec = architecture_of(model) if component == "positions" else None
    n_layers = int(model.cfg.n_layers)
    if component not in PATCH_COMPONENTS:
        raise InvalidInputError(f"component={component!r} must be one of {PATCH_COMPONENTS}")
    if component == "resid_mid" and component_hook_name(0, "resid_mid") not in model.hook_dict:
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
    chosen_layers = _choose_layers(model, layers, component, measured, needs_logits, learned)
    return _Request(chosen_metrics, names, measured, needs_logits, homog, learned, chosen_layers)


def _choose_layers(
    model: HookedModel,
    layers: Any,
    component: str,
    measured: int,
    needs_logits: bool,
    learned: bool,
) -> tuple[int, ...]:
    """The blocks to patch: ``layers`` checked (distinct blocks that can change the metrics
    read at residual entry ``measured``), or by default every block that can change them."""
    n_layers = int(model.cfg.n_layers)
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
        chosen_layers = tuple(block_index("layers", x, n_layers) for x in given)
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
    return chosen_layers


def _check_lengths(batch: TokenBatch, request: _Request, edge_k: int) -> None:
    """Reject sequences too short for the edge metrics (``2 * edge_k + 2`` tokens) or, when a
    metric needs the logits, for a next-token loss (2 tokens)."""
    chosen_metrics, homog = request.metrics, request.homog
    if any(chosen_metrics[i] in ("first_excess", "last_excess") for i in homog):
        short = torch.nonzero(batch.lengths < 2 * edge_k + 2).flatten().tolist()
        if short:
            raise InvalidInputError(
                f"sequences {short[:10]} have fewer than 2 * edge_k + 2 = {2 * edge_k + 2} "
                "tokens; use a smaller edge_k or longer sequences"
            )
    if request.needs_logits and bool((batch.lengths < 2).any()):
        short = torch.nonzero(batch.lengths < 2).flatten().tolist()
        raise InvalidInputError(
            f"sequences {short[:10]} have a single token, so no next-token loss; drop them or "
            "use a homogenization metric"
        )


def _patch_passes(
    model: HookedModel,
    info: Any,
    request: _Request,
    batch: TokenBatch,
    *,
    component: str,
    direction: str,
    how: PositionAblation,
    options: dict[str, Any],
    ablation: list[HookSpec],
    cells: tuple[tuple[int, int], ...],
    cell_axis: str,
    cell_batch: int,
    edge_k: int,
) -> PatchPasses:
    """The per-batch passes of :func:`positional_patching` over the length-sorted ``batch``:
    the metric runner, the zeroed sums, the hooks of every cell and the blocks each pass
    starts at (HookedTransformer: the patched block) and ends at."""
    n_layers = int(model.cfg.n_layers)
    chosen_metrics, homog, measured = request.metrics, request.homog, request.measured
    needs_logits, chosen_layers = request.needs_logits, request.layers
    totals = edge_totals(batch.lengths, 0, edge_k) if homog else None
    skip = info.backend == "hooked"
    runner = PatchRunner(
        model, chosen_metrics, homog, measured, needs_logits, totals, edge_k, len(batch)
    )
    n_m, n_l, n_c = len(request.names), len(chosen_layers), len(cells)
    cpu = {"dtype": torch.float64, "device": "cpu"}
    patched = torch.zeros(n_m, n_l, n_c, **cpu)
    normal = torch.zeros(n_m, **cpu)
    ablated = torch.zeros(n_m, **cpu)
    # Homogenization only: each pass ends where the metric is read (entry l is read at
    # blocks.{l}.hook_resid_pre, before block l), so blocks 0 .. l - 1 run.
    end = n_layers if needs_logits else measured
    hook_names = (
        [component_hook_name(layer, component) for layer in chosen_layers]
        if component in BLOCK_POINTS
        else []
    )
    ablation_of: list[list[HookSpec]] = []
    if component == "positions":  # the ablation's own hooks, one set per cell
        ablation_of = _positions_cells(
            model, how, options, chosen_layers, direction, request.learned
        )
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
    return PatchPasses(
        model=model,
        runner=runner,
        component=component,
        direction=direction,
        layers=chosen_layers,
        cells=cells,
        cell_axis=cell_axis,
        cell_batch=cell_batch,
        hook_names=hook_names,
        ablation=ablation,
        ablation_of=ablation_of,
        source_run=source_run,
        receiving_hooks=receiving_hooks,
        starts=starts,
        end=end,
        patched=patched,
        normal=normal,
        ablated=ablated,
        red=red,
    )


def _batching(
    component: str,
    cell_batch: int,
    batch_size: int,
    skip: bool,
    needs_logits: bool,
    measured: int,
) -> str:
    """How :func:`positional_patching` batched its passes, in words (``skip``: passes start at
    the patched block)."""
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
    return batching


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
