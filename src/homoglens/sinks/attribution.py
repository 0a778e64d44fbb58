"""Which sink heads drive homogenization: exact reruns with heads ablated, or attribution
patching (first order, every head at once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int

from homoglens.core.errors import InvalidInputError, NonFiniteActivationError
from homoglens.core.types import (
    ATTRIBUTION_METRICS,
    AttributionMethod,
    AttributionMetric,
    BosPolicy,
    HeadAblation,
    HookedModel,
    HookFn,
    ModelInput,
)
from homoglens.core.validate import check_heads, check_key_eps
from homoglens.models.architectures import (
    component_hook_name,
    pattern_hook_name,
    z_hook_name,
)
from homoglens.models.loading import model_info
from homoglens.profile.homogenization import nan_div
from homoglens.run.data import DataInput, TokenBatch
from homoglens.run.engine import Pass, PassPlan, Sums, model_device, provenance_of, stream
from homoglens.run.entrance import entrance
from homoglens.sinks.attribution_result import SinkAttribution
from homoglens.sinks.maths import edge_totals, scalar_metric_weights, token_to_others
from homoglens.sinks.scores import check_edge, sink_scores

if TYPE_CHECKING:
    pass

GRADIENT_BYTES = 2**30
"""Memory (bytes) the fast attribution's gradient pass may hold at once: the sequences of a
batch go through the forward and backward pass in micro-batches whose autograd graph (about
five pattern-sized and five ``[pos d_model + d_mlp]``-sized tensors per block and sequence) fits
it. The result is the same sum over sequences; only the peak memory and the speed change."""


def gradient_micro_batch(model: HookedModel, n_pos: int, batch_size: int) -> int:
    """Sequences per forward-and-backward pass of the fast attribution: ``batch_size``, or
    fewer when their estimated autograd graph would exceed :data:`GRADIENT_BYTES`.

    Args:
        model: The model the attribution runs.
        n_pos: Tokens per sequence (the padded length of the batch).
        batch_size: Sequences in the batch.

    Returns:
        The micro-batch size, in ``[1, batch_size]``.

    Examples:
        >>> from homoglens import load_model
        >>> from homoglens.sinks.attribution import gradient_micro_batch
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> gradient_micro_batch(model, 32, 8)
        8
    """
    cfg = model.cfg
    d_mlp = int(getattr(cfg, "d_mlp", None) or 4 * int(cfg.d_model))
    width = next(iter(model.parameters())).element_size()
    per_block = 5 * int(cfg.n_heads) * n_pos * n_pos + 5 * n_pos * (int(cfg.d_model) + d_mlp)
    per_sequence = int(cfg.n_layers) * per_block * max(width, 4)
    return max(1, min(batch_size, GRADIENT_BYTES // max(per_sequence, 1)))


def _choose_heads(
    model: HookedModel,
    batch: TokenBatch,
    heads: Any,
    top_k: Any,
    target: int,
    key: int,
    batch_size: int,
) -> list[tuple[int, int]]:
    """``heads`` checked (blocks before ``target`` only), or the ``top_k`` by sink mass."""
    from homoglens.core.validate import as_int

    n_heads = int(model.cfg.n_heads)
    if heads is not None:
        return check_heads(heads, target, n_heads)
    top_k = min(as_int("top_k", top_k, low=1), target * n_heads)
    scores = sink_scores(model, batch, key=key, batch_size=batch_size, progress=False)
    mass = scores.mass[:target].flatten()  # heads after the measured entry cannot matter
    order = torch.argsort(mass, descending=True)[:top_k]
    return [(int(i) // n_heads, int(i) % n_heads) for i in order]


def _mean_z(
    model: HookedModel, batch: TokenBatch, layers: list[int], batch_size: int
) -> dict[int, torch.Tensor]:
    """Mean of ``blocks.{l}.attn.hook_z`` over every real token: ``{l: [head_index d_head]}``."""
    device = model_device(model)
    shape = (int(model.cfg.n_heads), int(model.cfg.d_head))
    f64 = {"dtype": torch.float64, "device": device}
    red = Sums(
        sums={
            **{f"z.{lay}": torch.zeros(shape, **f64) for lay in layers},
            "n_tokens": torch.zeros((), **f64),
        }
    )

    def make_hook(layer: int) -> HookFn:
        def hook(z: torch.Tensor, hook: Any) -> None:
            w = red.batch["mask"].to(torch.float64)[..., None, None]
            red.sums[f"z.{layer}"] += (z.double() * w).sum((0, 1)).to(device)
            if layer == layers[0]:
                red.sums["n_tokens"] += red.batch["mask"].sum()

        return hook

    red.add_hooks([(z_hook_name(lay), make_hook(lay)) for lay in layers])
    stream(model, batch, [red], batch_size=batch_size, desc="mean z", progress=False)
    return {lay: red.sums[f"z.{lay}"] / red.sums["n_tokens"] for lay in layers}


def _ablation_hooks(
    pairs: list[tuple[int, int]], ablation: str, key: int, mean_z: dict[int, torch.Tensor]
) -> list[tuple[str, Any]]:
    from homoglens.run.hooks import mean_head_hook, remove_sink_hook

    by_layer: dict[int, list[int]] = {}
    for lay, head in pairs:
        by_layer.setdefault(lay, []).append(head)
    if ablation == "sink":
        return [
            (pattern_hook_name(lay), remove_sink_hook(hs, key))
            for lay, hs in sorted(by_layer.items())
        ]
    return [
        (z_hook_name(lay), mean_head_hook(hs, mean_z[lay][hs]))
        for lay, hs in sorted(by_layer.items())
    ]


def _can_start_at_layer(model: HookedModel) -> bool:
    """Whether ``start_at_layer`` skips the earlier blocks: HookedTransformer only. The
    TransformerLens 4 bridge accepts it but still runs blocks 0..l-1 (its ``forward``
    docstring); the 3.9 bridge raises ``NotImplementedError``."""
    return model_info(model).backend == "hooked"


def sink_attribution(
    model: ModelInput,
    data: DataInput,
    *,
    method: AttributionMethod = "exact",
    ablation: HeadAblation = "sink",
    heads: list[tuple[int, int]] | None = None,
    top_k: int = 5,
    layer: int | None = None,
    key: int = 0,
    edge_k: int = 8,
    joint: bool = True,
    metrics: Sequence[AttributionMetric] = ATTRIBUTION_METRICS,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> SinkAttribution:
    """Attribute homogenization at one residual entry to attention sinks, head by head.

    For each head, ``ablation="sink"`` removes its attention to ``key`` and renormalises every
    row over the other keys (a query whose only key is the sink keeps its row);
    ``ablation="mean"`` replaces the head's output ``z`` (``blocks.{l}.attn.hook_z``) at every
    position by its mean over the corpus' real tokens. The change (ablated - base) of the
    :data:`ATTRIBUTION_METRICS` at residual entry ``layer`` is reported per head.

    * ``method="exact"``: one ablated rerun per head, plus one joint ablation of all ``heads``.
      With a HookedTransformer each rerun starts at the ablated block from the cached
      ``blocks.{l}.hook_resid_pre`` of the base run (``start_at_layer``); a TransformerBridge
      reruns the full forward pass. ``rerun`` says which. Also gives per-position curves.
    * ``method="fast"``: attribution patching, for every head before ``layer`` at once
      (``heads``/``top_k`` are ignored): per batch one forward pass with gradients and one
      backward pass (``torch.autograd.grad`` on the patterns or ``z`` only) per metric in
      ``metrics``; each
      head's estimate is the gradient times the ablation's change of its pattern (or ``z``).
      First-order: exact for small changes, an approximation for strong sinks.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        method: ``"exact"`` or ``"fast"``.
        ablation: ``"sink"`` or ``"mean"``.
        heads: ``(layer, head)`` pairs (exact); default the ``top_k`` heads by sink mass on
            ``key`` among blocks before ``layer``.
        top_k: How many heads when ``heads`` is not given.
        layer: Residual entry measured, in ``[1, n_layers]`` (default ``n_layers``).
        key: Sink key position (0-indexed; tokens ``<= key`` are left out of the edge groups).
        edge_k: Tokens per edge; every sequence needs ``key + 2 * edge_k + 2`` tokens.
        joint: Exact mode: also ablate all ``heads`` together.
        metrics: Fast mode: the :data:`ATTRIBUTION_METRICS` to attribute, one backward pass
            each (the others are NaN). The exact mode always gives all three.
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show progress bars.

    Returns:
        :class:`SinkAttribution` (values are cosines; ``delta`` = ablated - base).

    Raises:
        InvalidInputError: a head or layer that does not exist, a head at or after ``layer``,
            bad ``key``/``method``/``ablation``/``edge_k``, sequences too short, bad data.
            No hook stays attached after any error.
        UnsupportedArchitectureError: the model only reads the hook point the ablation writes
            (``hook_pattern`` / ``hook_z`` on the bridge of GPT-Neo, OPT, GPT-J).

    References:
        Gu et al. 2024, arXiv 2410.10781; Barbero et al. 2025, arXiv 2504.02732;
        Syed, Rager, Conmy 2023, arXiv 2310.10348; Nanda 2023, "Attribution Patching".

    Examples:
        >>> from homoglens import load_model, sink_attribution
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> text = ["The cat sat on the mat and looked at the dog for a long time."] * 2
        >>> result = sink_attribution(model, text, heads=[(1, 0)], edge_k=2, progress=False)
        >>> tuple(result.delta.shape)
        (1, 3)
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    from homoglens.core.validate import as_bool, as_int

    info = call.info
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    _check_method(method, ablation)
    key, _ = check_key_eps(key, 0.3, int(model.cfg.n_ctx))
    target = n_layers if layer is None else as_int("layer", layer, low=1, high=n_layers)
    edge_k = as_int("edge_k", edge_k, low=1)
    joint = as_bool("joint", joint)
    metric_names = _checked_metrics(metrics)
    _check_ablation_point(model, ablation)
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    check_edge(batch, key, edge_k)
    if method == "fast":
        chosen = [(lay, h) for lay in range(target) for h in range(n_heads)]
    else:
        chosen = _choose_heads(model, batch, heads, top_k, target, key, call.batch_size)
    totals = edge_totals(batch.lengths, key, edge_k)
    layers = sorted({lay for lay, _ in chosen})
    mean_z = _mean_z(model, batch, layers, call.batch_size) if ablation == "mean" else {}
    run = _fast_attribution if method == "fast" else _exact_attribution
    job = _Job(
        batch, chosen, target, key, edge_k, ablation, mean_z, totals, call.batch_size,
        call.progress, joint, metric_names,
    )  # fmt: skip
    fields_ = run(model, job)
    return SinkAttribution(
        heads=tuple(chosen),
        layer=target,
        key=key,
        edge_k=edge_k,
        method=method,
        ablation=ablation,
        n_sequences=len(batch),
        provenance=provenance_of(info, batch, (target,), False),
        **fields_,
    )


def _check_method(method: str, ablation: str) -> None:
    """Refuse a ``method`` other than ``"exact"``/``"fast"`` or an ``ablation`` other than
    ``"sink"``/``"mean"``.

    Raises:
        InvalidInputError: names the bad value and the choices.
    """
    if method not in ("exact", "fast"):
        raise InvalidInputError(f"method={method!r} must be 'exact' or 'fast'")
    if ablation not in ("sink", "mean"):
        raise InvalidInputError(f"ablation={ablation!r} must be 'sink' or 'mean'")


def _checked_metrics(metrics: Any) -> tuple[str, ...]:
    """``metrics`` (one name or a list) as a tuple of distinct :data:`ATTRIBUTION_METRICS`.

    Raises:
        InvalidInputError: not a list, empty, repeated or unknown names.
    """
    given: Any = (metrics,) if isinstance(metrics, str) else metrics
    if not isinstance(given, (tuple, list)):
        raise InvalidInputError(f"metrics={metrics!r} must be a list of {ATTRIBUTION_METRICS}")
    metrics = tuple(given)
    unknown = [name for name in metrics if name not in ATTRIBUTION_METRICS]
    if not metrics or unknown or len(set(metrics)) != len(metrics):
        raise InvalidInputError(
            f"metrics={metrics!r} must be distinct names from {ATTRIBUTION_METRICS}"
        )
    return metrics


def _check_ablation_point(model: HookedModel, ablation: str) -> None:
    """Refuse a model that only reads the hook point ``ablation`` writes (``hook_pattern``
    for ``"sink"``, ``hook_z`` for ``"mean"``): see
    :func:`homoglens.models.loading.check_writable`."""
    from homoglens.models.loading import check_writable

    point = "pattern" if ablation == "sink" else "z"
    check_writable(model, point, f"sink attribution (ablation={ablation!r})")


@dataclasses.dataclass(frozen=True)
class _Job:
    """What both attribution methods read: the windows, the heads, the ablation and the
    metric weights (already checked by :func:`sink_attribution`)."""

    batch: TokenBatch
    chosen: list[tuple[int, int]]  # (layer, head) pairs
    target: int  # the resid_pre layer measured
    key: int
    edge_k: int
    ablation: str
    mean_z: dict[int, torch.Tensor]  # layer -> [pos head_index d_head] mean of hook_z ("mean")
    totals: torch.Tensor  # edge_totals(lengths, key, edge_k)
    batch_size: int
    progress: bool
    joint: bool
    metrics: tuple[str, ...]  # the exact method always measures all of them


def _exact_attribution(model: HookedModel, job: _Job) -> dict[str, Any]:
    batch, chosen, target, key, edge_k = job.batch, job.chosen, job.target, job.key, job.edge_k
    ablation, mean_z, totals, joint = job.ablation, job.mean_z, job.totals, job.joint
    from homoglens.models.architectures import resid_hook_name
    from homoglens.profile.homogenization import homogenization_sums, positions_from_mask

    variants = [[pair] for pair in chosen] + ([chosen] if joint and len(chosen) > 1 else [])
    starts = [min(lay for lay, _ in pairs) for pairs in variants]
    skip = _can_start_at_layer(model)
    n_pos = int(batch.lengths.max())
    f64 = torch.float64
    values = torch.zeros(len(variants) + 1, len(ATTRIBUTION_METRICS), dtype=f64, device="cpu")
    curve = torch.zeros(len(variants) + 1, n_pos, dtype=f64, device="cpu")
    count = torch.zeros(n_pos, dtype=f64, device="cpu")
    state: dict[str, Any] = {}

    def measure(resid: torch.Tensor, hook: Any) -> None:
        sums = homogenization_sums(
            resid, positions_from_mask(state["mask"]), n_pos, per_sequence=True
        )
        to_others = sums["seq_to_others"].nan_to_num(0.0).cpu()
        width = to_others.shape[1]
        values[state["v"]] += (state["w"][..., :width] * to_others).sum((1, 2))
        curve[state["v"], :width] += to_others.sum(0)

    def cache(layer: int) -> Any:
        def hook(resid: torch.Tensor, hook: Any) -> None:
            state["cache"][layer] = resid.clone()

        return hook

    measure_hook = (resid_hook_name(target), measure)
    cache_hooks = (
        [(component_hook_name(s, "resid_pre"), cache(s)) for s in sorted(set(starts))]
        if skip
        else []
    )
    hooks = {i: _ablation_hooks(pairs, ablation, key, mean_z) for i, pairs in enumerate(variants)}
    red = Sums(sums={"values": values, "curve": curve, "count": count})

    def step(tokens: torch.Tensor, mask: torch.Tensor) -> PassPlan:
        lengths = mask.sum(1)
        state.update(
            mask=mask,
            cache={},
            w=scalar_metric_weights(lengths, mask.shape[1], key, edge_k, totals),
            v=0,
        )
        count[: mask.shape[1]] += mask.sum(0).to(f64).cpu()
        yield Pass(tokens, [*cache_hooks, measure_hook], measure_hook[0], attention_mask=mask)
        for i, start in enumerate(starts):
            state["v"] = i + 1
            fwd_hooks = [*hooks[i], measure_hook]
            if skip:
                yield Pass(
                    state["cache"][start],
                    fwd_hooks,
                    measure_hook[0],
                    attention_mask=mask,
                    start_at_layer=start,
                )
            else:
                yield Pass(tokens, fwd_hooks, measure_hook[0], attention_mask=mask)

    try:
        stream(model, batch, [red], batch_size=job.batch_size, desc="sink attribution",
               progress=job.progress, passes=step)  # fmt: skip
    finally:
        state.clear()
    to_others = nan_div(curve, count)
    delta = values[1:] - values[0]
    delta_curve = to_others[1:] - to_others[0]
    has_joint = len(variants) > len(chosen)
    rerun = (
        "from the ablated block (HookedTransformer start_at_layer on the cached "
        "blocks.{l}.hook_resid_pre)"
        if skip
        else "full forward pass (a TransformerBridge cannot skip the blocks before the ablated one)"
    )
    return {
        "rerun": rerun,
        "base": values[0],
        "delta": delta[: len(chosen)],
        "joint_delta": delta[-1] if has_joint else None,
        "base_to_others": to_others[0],
        "delta_to_others": delta_curve[: len(chosen)],
        "joint_delta_to_others": delta_curve[-1] if has_joint else None,
    }


def _fast_attribution(model: HookedModel, job: _Job) -> dict[str, Any]:
    batch, target, key, edge_k, metrics = job.batch, job.target, job.key, job.edge_k, job.metrics
    ablation, mean_z, totals = job.ablation, job.mean_z, job.totals
    from homoglens.models.architectures import resid_hook_name
    from homoglens.run.hooks import sink_removal_delta

    n_layers, n_heads = target, int(model.cfg.n_heads)
    device = model_device(model, needs_grad=True)
    f64 = torch.float64
    m = len(ATTRIBUTION_METRICS)
    total = torch.zeros(n_layers, n_heads, m, dtype=f64, device="cpu")
    base = torch.zeros(m, dtype=f64, device="cpu")
    curve = torch.zeros(int(batch.lengths.max()), dtype=f64, device="cpu")
    count = torch.zeros_like(curve)
    point = "pattern" if ablation == "sink" else "z"
    store: dict[Any, torch.Tensor] = {}
    wanted = [ATTRIBUTION_METRICS.index(name) for name in metrics]

    def probe(i: int) -> Any:
        # Differentiate with respect to a zero added to the activation the hook hands on: that
        # is the tensor the rest of the forward pass uses, on every backend (a bridge may fire
        # a hook on a reshaped copy whose input is not on the gradient path).
        def hook(activation: torch.Tensor, hook: Any) -> torch.Tensor:
            zero = torch.zeros_like(activation, requires_grad=True)
            store[i], store[("act", i)] = zero, activation.detach()
            return activation + zero

        return hook

    def keep(resid: torch.Tensor, hook: Any) -> None:
        store["resid"] = resid

    fwd_hooks = [(component_hook_name(i, point), probe(i)) for i in range(n_layers)]
    fwd_hooks.append((resid_hook_name(target), keep))
    red = Sums(sums={"total": total, "base": base, "curve": curve, "count": count})

    def step(tokens: torch.Tensor, mask: torch.Tensor) -> PassPlan:
        micro = gradient_micro_batch(model, int(tokens.shape[1]), int(tokens.shape[0]))
        for part, part_mask in zip(tokens.split(micro), mask.split(micro), strict=True):
            yield from micro_step(part, part_mask)

    def micro_step(tokens: torch.Tensor, mask: torch.Tensor) -> PassPlan:
        with torch.enable_grad():  # on while the engine runs the pass
            yield Pass(tokens, fwd_hooks, resid_hook_name(target), attention_mask=mask)
            to_others = token_to_others(store["resid"], mask)
            w = scalar_metric_weights(mask.sum(1), mask.shape[1], key, edge_k, totals)
            w = w.to(device)
            values = (w * to_others).sum((1, 2))
            acts = [store[i] for i in range(n_layers)]
            grads = {  # one backward pass per metric, to the activations only
                j: torch.autograd.grad(
                    values[j], acts, retain_graph=j != wanted[-1], allow_unused=True
                )
                for j in wanted
            }
        with torch.no_grad():
            base.add_(values.detach().cpu())
            curve[: mask.shape[1]] += to_others.detach().sum(0).cpu()
            count[: mask.shape[1]] += mask.sum(0).to(f64).cpu()
            for i in range(n_layers):
                act = store[("act", i)]
                if ablation == "sink":
                    change = sink_removal_delta(act, key)  # [batch head_index query_pos key_pos]
                    dims = (0, 2, 3)
                else:
                    real = mask[..., None, None].to(act.dtype)
                    mean = mean_z[i].to(device=device, dtype=act.dtype)
                    change = (mean[None, None] - act) * real  # [batch pos head_index d_head]
                    dims = (0, 1, 3)
                for j in wanted:
                    grad = grads[j][i]
                    if grad is not None:
                        total[i, :, j] += (grad * change).sum(dims, dtype=f64).cpu()
        store.clear()

    try:
        stream(model, batch, [red], batch_size=job.batch_size, desc="fast sink attribution",
               progress=job.progress, passes=step, needs_grad=True)  # fmt: skip
    finally:
        store.clear()
    if not bool(torch.isfinite(total[..., list(wanted)]).all()):
        raise NonFiniteActivationError(
            "the first-order attribution is NaN or inf (non-finite activations or gradients); "
            "check the model dtype (float16 overflows) or the weights"
        )
    for j in set(range(m)) - set(wanted):
        total[..., j] = float("nan")
    return {
        "rerun": f"first order: per batch 1 forward pass with gradients and {len(wanted)} "
        "backward pass(es), one per metric (autograd.grad on the activations only)",
        "base": base,
        "delta": total.reshape(n_layers * n_heads, m),
        "joint_delta": None,
        "base_to_others": nan_div(curve, count),
        "delta_to_others": None,
        "joint_delta_to_others": None,
    }
