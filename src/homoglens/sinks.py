"""Attention sinks and massive activations, streamed and padding-aware.

* Sink mass of head (layer, head) on key k: the mean over query positions q > k of A[q, k]
  (k = 0, the first token or BOS, by default), averaged over sequences.
* Gu et al. 2024 importance: alpha_k = (1 / (T - k + 1)) sum_{i >= k} A[i, k] with 1-indexed k;
  here ``key`` is 0-indexed, so ``key=0`` is their alpha_1. Sink_k^eps is the percentage of
  (sequence, layer, head) with alpha_k > eps (eps = 0.3 in the paper).
* Massive activations (Sun et al. 2024): per token, max_d |x_d| / median_d |x_d| over its
  ``d_model`` entries.

References:
    Gu et al. 2024, "When Attention Sink Emerges in Language Models: An Empirical View",
    arXiv 2410.10781 (official script eval_sink_open_source.py).
    Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks", arXiv 2309.17453.
    Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float, Int

from homoglens._checks import require_finite
from homoglens.data import TokenBatch, to_token_batch
from homoglens.distributed import (
    all_reduce_sum,
    check_same_data,
    gather_rows,
    shard_bounds,
    world,
)
from homoglens.errors import InvalidInputError, NonFiniteActivationError
from homoglens.homogenization import edge_totals, scalar_metric_weights, token_to_others
from homoglens.models import model_info
from homoglens.profile import (
    _check_positive_int,
    _model_device,
    _provenance,
    _run_through,
    forward_batches,
)
from homoglens.results import Provenance, SavedResult, _nan_div, prepare_folder
from homoglens.types import BosPolicy, HookedModel

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = [
    "SinkScores",
    "MassiveActivations",
    "sink_sums",
    "sink_scores",
    "massive_activations",
    "ATTRIBUTION_METRICS",
    "SinkAttribution",
    "sink_attribution",
    "attention_view",
    "SinkAnalysis",
    "sink_analysis",
]


def sink_sums(
    pattern: Float[torch.Tensor, "batch head_index query_pos key_pos"],
    lengths: Int[torch.Tensor, " batch"],
    *,
    key: int = 0,
    eps: float = 0.3,
) -> dict[str, torch.Tensor]:
    """Reduce one layer's attention pattern to sink statistics (pure function, float64).

    Rows must be right-aligned: query/key index i is position i of the sequence, and positions
    ``>= lengths[b]`` are padding.

    Args:
        pattern: ``[batch head_index query_pos key_pos]`` attention probabilities.
        lengths: ``[batch]`` number of real tokens per sequence (each > ``key``).
        key: 0-indexed key position of the sink.
        eps: Threshold on the Gu et al. importance for counting a sink.

    Returns:
        ``mass_sum [head]`` (sum over sequences of the per-sequence mean of A[q, key] over real
        q > key; sequences with no such q contribute 0 and are not counted in ``mass_count``),
        ``mass_count []``, ``by_query_sum [head query_pos]`` and ``by_query_count [query_pos]``
        (sums of A[q, key] and sequence counts per query position q > key),
        ``importance_sum [head]`` (sum of alpha over sequences), ``sink_count [head]`` (how many
        sequences have alpha > eps), ``n_sequences []``, and per sequence
        ``importance_by_sequence [batch head]`` (alpha of each sequence).
    """
    batch, _, n_q, _ = pattern.shape
    f64 = torch.float64
    column = pattern[..., key].to(f64)  # [batch head query_pos]
    q = torch.arange(n_q, device=pattern.device)
    real = q[None, :] < lengths[:, None].to(pattern.device)  # [batch query_pos]
    after = (real & (q[None, :] > key)).to(f64)
    from_key = (real & (q[None, :] >= key)).to(f64)
    n_after = after.sum(1)  # [batch]
    has_after = n_after > 0
    per_seq_mass = (column * after[:, None, :]).sum(-1) / n_after.clamp_min(1)[:, None]
    importance = (column * from_key[:, None, :]).sum(-1) / from_key.sum(1).clamp_min(1)[:, None]
    return {
        "mass_sum": (per_seq_mass * has_after[:, None]).sum(0),
        "mass_count": has_after.to(f64).sum(),
        "by_query_sum": (column * after[:, None, :]).sum(0),
        "by_query_count": after.sum(0),
        "importance_sum": importance.sum(0),
        "sink_count": (importance > eps).to(f64).sum(0),
        "n_sequences": torch.tensor(float(batch), dtype=f64),
        "importance_by_sequence": importance,
    }


@dataclass(frozen=True, eq=False)
class SinkScores(SavedResult):
    """Attention-sink statistics of every head on one key position.

    Attributes:
        key: 0-indexed key position (0 = first real token; a BOS if ``provenance.bos``).
        eps: Importance threshold of the sink rate.
        mass: ``[layer head_index]`` mean over real queries q > key of A[q, key], averaged over
            sequences; in [0, 1].
        mass_by_query: ``[layer head_index query_pos]`` mean over sequences of A[q, key]; NaN for
            q <= key.
        importance: ``[layer head_index]`` Gu et al. alpha (0-indexed ``key``), mean over
            sequences; in [0, 1].
        sink_rate_by_head: ``[layer head_index]`` fraction of sequences with alpha > eps.
        n_sequences: Number of sequences.
        provenance: Model, backend, weights, BOS, data.

    References:
        Gu et al. 2024, arXiv 2410.10781; Xiao et al. 2023, arXiv 2309.17453.
    """

    _stem: ClassVar[str] = "sink_scores"
    _ranges: ClassVar[dict[str, tuple[float, float]]] = {"eps": (0.0, 1.0)}

    key: int
    eps: float
    mass: Float[torch.Tensor, "layer head_index"]
    mass_by_query: Float[torch.Tensor, "layer head_index query_pos"]
    importance: Float[torch.Tensor, "layer head_index"]
    sink_rate_by_head: Float[torch.Tensor, "layer head_index"]
    n_sequences: int
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        shape = tuple(self.mass.shape)
        for name in ("importance", "sink_rate_by_head"):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(
                    f"{name} has shape {tuple(getattr(self, name).shape)}, expected {shape}"
                )
        if tuple(self.mass_by_query.shape[:2]) != shape:
            raise ValueError(
                f"mass_by_query has shape {tuple(self.mass_by_query.shape)}, "
                f"expected {shape} + (query_pos,)"
            )

    @property
    def key_holds_bos(self) -> bool | None:
        """Whether position ``key`` held a BOS token (``None``: in some sequences only)."""
        return self.provenance.bos if self.key == 0 else False

    @property
    def sink_rate(self) -> float:
        """Sink_k^eps in percent: share of (sequence, layer, head) with alpha_k > eps."""
        return float(self.sink_rate_by_head.mean() * 100)

    def top_heads(self, k: int = 10, *, by: str = "mass") -> pd.DataFrame:
        """The ``k`` heads with the largest ``mass`` (or ``importance``), strongest first.

        Returns:
            DataFrame with columns ``layer, head, mass, importance, sink_rate``.
        """
        import pandas as pd

        from homoglens._checks import as_int

        if by not in ("mass", "importance"):
            raise InvalidInputError(f"by={by!r} must be 'mass' or 'importance'")
        k = as_int("k", k, low=1)
        values = getattr(self, by).flatten()
        undefined = int(torch.isnan(values).sum())
        if undefined:
            warnings.warn(
                f"{undefined} head(s) have no {by} (NaN: no query comes after key {self.key}, "
                "or no sequence was long enough); they are ranked last",
                stacklevel=2,
            )
        values = values.nan_to_num(float("-inf"))
        order = torch.argsort(values, descending=True)[:k]
        n_heads = self.mass.shape[1]
        return pd.DataFrame(
            {
                "layer": (order // n_heads).tolist(),
                "head": (order % n_heads).tolist(),
                "mass": self.mass.flatten()[order].tolist(),
                "importance": self.importance.flatten()[order].tolist(),
                "sink_rate": self.sink_rate_by_head.flatten()[order].tolist(),
            }
        )

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per (layer, head) with ``mass, importance, sink_rate``."""
        import pandas as pd

        n_layers, n_heads = self.mass.shape
        return pd.DataFrame(
            {
                "layer": torch.arange(n_layers).repeat_interleave(n_heads).numpy(),
                "head": torch.arange(n_heads).repeat(n_layers).numpy(),
                "mass": self.mass.flatten().numpy(),
                "importance": self.importance.flatten().numpy(),
                "sink_rate": self.sink_rate_by_head.flatten().numpy(),
            }
        )

    def plot(self) -> Figure:
        """Heatmaps of sink mass and importance per (layer, head)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 4), layout="constrained")
        for ax, (name, values) in zip(
            fig.subplots(1, 2),
            (("sink mass", self.mass), ("importance alpha", self.importance)),
            strict=True,
        ):
            image = ax.imshow(
                values.numpy(),
                aspect="auto",
                origin="lower",
                vmin=0,
                vmax=1,
                cmap="magma",
                interpolation="nearest",
            )
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(f"{name} on key {self.key}")
            fig.colorbar(image, ax=ax)
        fig.suptitle(f"Attention sinks: Sink_{self.key}^{self.eps} = {self.sink_rate:.1f} %")
        return fig

    def __repr__(self) -> str:
        return (
            f"SinkScores(model={self.provenance.model!r}, key={self.key}, "
            f"key_holds_bos={self.key_holds_bos}, "
            f"layers={self.mass.shape[0]}, heads={self.mass.shape[1]}, "
            f"sink_rate={self.sink_rate:.1f}%, n_sequences={self.n_sequences})"
        )


def _check_key_eps(key: Any, eps: Any, n_ctx: int) -> tuple[int, float]:
    from homoglens._checks import as_float, as_int

    key = as_int("key", key, low=0, high=n_ctx - 1)
    try:
        eps = as_float("eps", eps, low=0.0, high=1.0)
    except InvalidInputError as err:
        raise InvalidInputError(f"{err}; Gu et al. use eps=0.3") from None
    return key, eps


def _check_key_in(batch: TokenBatch, key: int) -> None:
    short = torch.nonzero(batch.lengths <= key).flatten().tolist()
    if short:
        raise InvalidInputError(
            f"key={key} lies outside sequences {short[:10]} (they have <= {key} tokens); use a "
            "smaller key or longer sequences"
        )


def _check_edge(batch: TokenBatch, key: int, edge_k: int) -> None:
    """Every sequence must hold the key and, after it, two edges of ``edge_k`` and a middle."""
    _check_key_in(batch, key)
    need = key + 2 * edge_k + 2
    short = torch.nonzero(batch.lengths < need).flatten().tolist()
    if short:
        raise InvalidInputError(
            f"sequences {short[:10]} have fewer than key + 2 * edge_k + 2 = {need} tokens; "
            "use a smaller key or edge_k, or longer sequences"
        )


def sink_scores(
    model: HookedModel,
    data: TokenBatch | Int[torch.Tensor, "batch pos"] | str | list[str] | os.PathLike[str],
    *,
    key: int = 0,
    eps: float = 0.3,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> SinkScores:
    """Score every head as an attention sink on one key position.

    Streams the data; each batch's attention patterns (``blocks.{l}.attn.hook_pattern``) are
    reduced inside hooks, so memory does not grow with the number of sequences. Pads never count;
    positions count from each sequence's first real token.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        key: 0-indexed key position (0 = the first token, the BOS when one is used).
        eps: Importance threshold for the sink rate, in (0, 1) (Gu et al.: 0.3).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input: ``"auto"``, ``"always"`` or ``"never"`` (Gu et al. use no BOS
            for GPT-2 / Pythia).
        progress: Show a progress bar.

    Returns:
        :class:`SinkScores`.

    Raises:
        InvalidInputError: ``key`` outside ``[0, n_ctx)`` or not before the end of every
            sequence, ``eps`` outside (0, 1), or bad data.

    References:
        Gu et al. 2024, arXiv 2410.10781; Xiao et al. 2023, arXiv 2309.17453.

    Examples:
        >>> from homoglens import load_model, sink_scores
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> scores = sink_scores(model, ["The cat sat on the mat.", "A dog ran."], progress=False)
        >>> tuple(scores.mass.shape)
        (2, 4)
    """
    return _sink_pass(model, data, key, eps, batch_size, attention_mask, bos, progress)[0]


def _sink_pass(
    model: HookedModel,
    data: Any,
    key: int,
    eps: float,
    batch_size: int,
    attention_mask: Any,
    bos: Any,
    progress: bool,
) -> tuple[SinkScores, Float[torch.Tensor, "seq layer head_index"]]:
    """One streamed pass: the :class:`SinkScores` and every sequence's importance alpha
    ``[seq layer head_index]`` (in input order; gathered across ranks when distributed)."""
    info = model_info(model)
    key, eps = _check_key_eps(key, eps, int(model.cfg.n_ctx))
    batch_size = _check_positive_int("batch_size", batch_size)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    _check_key_in(batch, key)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    device = _model_device(model)
    n_q = int(batch.lengths.max())
    f64 = {"dtype": torch.float64, "device": device}
    acc = {
        "mass_sum": torch.zeros(n_layers, n_heads, **f64),
        "by_query_sum": torch.zeros(n_layers, n_heads, n_q, **f64),
        "importance_sum": torch.zeros(n_layers, n_heads, **f64),
        "sink_count": torch.zeros(n_layers, n_heads, **f64),
    }
    counts = {"mass_count": 0.0, "n_sequences": 0.0, "by_query_count": torch.zeros(n_q, **f64)}
    state: dict[str, Any] = {}
    per_seq: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]

    def make_hook(layer: int) -> Any:
        def hook(pattern: torch.Tensor, hook: Any) -> None:
            real = torch.arange(pattern.shape[2], device=pattern.device) < state["lengths"][:, None]
            # One reduction, no copy: a NaN/inf weight makes its row sum non-finite, and
            # HookedTransformer turns a NaN pattern into a zero row; either way the row of a
            # real query does not sum to 1.
            sums = pattern.sum(-1).transpose(1, 2)[real]  # [real query, head]
            lost = ~((sums - 1).abs() <= 1e-3)
            if bool(lost.any()):
                raise NonFiniteActivationError(
                    f"{hook.name}: {int(lost.sum())} attention rows of real queries do not sum "
                    "to 1 (NaN scores, which TransformerLens turns into zero rows); nothing was "
                    "averaged in. Check the model's weights and dtype"
                )
            sums = sink_sums(pattern, state["lengths"], key=key, eps=eps)
            per_seq[layer].append(sums["importance_by_sequence"].cpu())
            width = pattern.shape[2]
            acc["mass_sum"][layer] += sums["mass_sum"]
            acc["by_query_sum"][layer, :, :width] += sums["by_query_sum"]
            acc["importance_sum"][layer] += sums["importance_sum"]
            acc["sink_count"][layer] += sums["sink_count"]
            if layer == 0:
                counts["mass_count"] += float(sums["mass_count"])
                counts["n_sequences"] += float(sums["n_sequences"])
                counts["by_query_count"][:width] += sums["by_query_count"]

        return hook

    fwd_hooks = [
        (f"blocks.{layer}.attn.hook_pattern", make_hook(layer)) for layer in range(n_layers)
    ]
    rank, size = world()
    check_same_data(batch.tokens, batch.attention_mask, device)
    start, stop = shard_bounds(len(batch), size)[rank]  # data parallel under torch.distributed
    try:
        for tokens, mask in forward_batches(
            batch[start:stop], batch_size, device, desc="sinks", progress=progress
        ):
            state["lengths"] = mask.sum(1)
            last = f"blocks.{n_layers - 1}.attn.hook_pattern"
            _run_through(model, tokens, last, fwd_hooks, attention_mask=mask)
    finally:
        state.clear()
    if size > 1:
        totals = torch.tensor([counts["mass_count"], counts["n_sequences"]], **f64)
        all_reduce_sum([*acc.values(), counts["by_query_count"], totals])
        counts["mass_count"], counts["n_sequences"] = (float(v) for v in totals)
    n_local = stop - start
    alpha = (
        torch.stack(
            [torch.cat([torch.empty(0, n_heads, dtype=torch.float64), *rows]) for rows in per_seq],
            dim=1,
        )
        if n_local
        else torch.empty(0, n_layers, n_heads, dtype=torch.float64)
    )
    alpha = gather_rows(alpha, len(batch), device)
    n_seq = counts["n_sequences"]
    by_query = _nan_div(acc["by_query_sum"].cpu(), counts["by_query_count"].cpu())
    scores = SinkScores(
        key=key,
        eps=eps,
        mass=(acc["mass_sum"] / counts["mass_count"]).cpu()  # NaN: no query after key
        if counts["mass_count"] > 0
        else torch.full_like(acc["mass_sum"], float("nan")).cpu(),
        mass_by_query=by_query,
        importance=(acc["importance_sum"] / n_seq).cpu(),
        sink_rate_by_head=(acc["sink_count"] / n_seq).cpu(),
        n_sequences=int(n_seq),
        provenance=_provenance(info, batch, (), False),
    )
    return scores, alpha


@dataclass(frozen=True, eq=False)
class MassiveActivations(SavedResult):
    """Massive-activation statistics of the residual stream (Sun et al. 2024).

    Attributes:
        layers: Entries of the ``n_layers + 1`` residual axis (0 = embeddings).
        ratio_mean: ``[layer pos]`` mean over sequences of max_d |x| / median_d |x|.
        ratio_max: ``[layer pos]`` max over sequences of the same ratio.
        top_value: ``[layer pos]`` mean over sequences of max_d |x| (model units).
        dim_counts: ``[layer d_model]`` how often each dimension held a token's largest |x|
            among tokens whose ratio exceeds ``threshold``.
        threshold: Ratio above which a token counts as carrying a massive activation.
        n_sequences: Number of sequences.
        provenance: Model, backend, weights, BOS, data.

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762.
    """

    _stem: ClassVar[str] = "massive"
    _ranges: ClassVar[dict[str, tuple[float, float]]] = {"threshold": (1.0, math.inf)}

    layers: tuple[int, ...]
    ratio_mean: Float[torch.Tensor, "layer pos"]
    ratio_max: Float[torch.Tensor, "layer pos"]
    top_value: Float[torch.Tensor, "layer pos"]
    dim_counts: Float[torch.Tensor, "layer d_model"]
    threshold: float
    n_sequences: int
    provenance: Provenance = field(default_factory=Provenance)

    def top_dims(self, k: int = 3) -> pd.DataFrame:
        """Per layer, the ``k`` dimensions that most often hold a massive activation."""
        import pandas as pd

        from homoglens._checks import as_int

        k = as_int("k", k, low=1)
        rows = []
        for i, layer in enumerate(self.layers):
            counts = self.dim_counts[i]
            order = torch.argsort(counts, descending=True)[:k]
            rows.append(
                {
                    "layer": layer,
                    "dims": [int(d) for d in order if counts[d] > 0],
                    "tokens": int(counts.sum()),
                    "max_ratio": float(self.ratio_max[i].nan_to_num().max()),
                }
            )
        return pd.DataFrame(rows)

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per (layer, pos) with ``ratio_mean, ratio_max, top_value``."""
        import pandas as pd

        n_layer, n_pos = self.ratio_mean.shape
        return pd.DataFrame(
            {
                "layer": torch.tensor(self.layers).repeat_interleave(n_pos).numpy(),
                "pos": torch.arange(n_pos).repeat(n_layer).numpy(),
                "ratio_mean": self.ratio_mean.flatten().numpy(),
                "ratio_max": self.ratio_max.flatten().numpy(),
                "top_value": self.top_value.flatten().numpy(),
            }
        )

    def plot(self) -> Figure:
        """Heatmap of log10 of the mean max/median ratio per (layer, position)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 4), layout="constrained")
        ax = fig.add_subplot()
        image = ax.imshow(
            self.ratio_mean.clamp_min(1).log10().numpy(),
            aspect="auto",
            origin="lower",
            cmap="viridis",
            interpolation="nearest",
        )
        ax.set_xlabel("position")
        ax.set_ylabel("layer (0 = embeddings)")
        ax.set_title("Massive activations: log10 mean(max |x| / median |x|)")
        fig.colorbar(image, ax=ax)
        return fig

    def __repr__(self) -> str:
        return (
            f"MassiveActivations(model={self.provenance.model!r}, layers={len(self.layers)}, "
            f"max_ratio={float(self.ratio_max.nan_to_num().max()):.1f}, "
            f"n_sequences={self.n_sequences})"
        )


def massive_activations(
    model: HookedModel,
    data: TokenBatch | Int[torch.Tensor, "batch pos"] | str | list[str] | os.PathLike[str],
    *,
    threshold: float = 100.0,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> MassiveActivations:
    """Find massive activations: per layer and token, max_d |x| / median_d |x|.

    Streamed over the residual axis of :func:`homogenization_profile` (0 = embeddings,
    l = output of block l - 1); pads never count.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        threshold: Ratio above which a token's largest entry counts in ``dim_counts`` (> 1).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show a progress bar.

    Returns:
        :class:`MassiveActivations`.

    Raises:
        InvalidInputError: ``threshold`` <= 1 or bad data.

    References:
        Sun et al. 2024, arXiv 2402.17762.
    """
    from homoglens.profile import resid_hook_name

    info = model_info(model)
    from homoglens._checks import as_float

    threshold = as_float("threshold", threshold, low=1.0, high=float("inf"))
    batch_size = _check_positive_int("batch_size", batch_size)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    layers = tuple(range(n_layers + 1))
    device = _model_device(model)
    n_pos = int(batch.lengths.max())
    f64 = {"dtype": torch.float64, "device": device}
    ratio_sum = torch.zeros(len(layers), n_pos, **f64)
    ratio_max = torch.full((len(layers), n_pos), float("nan"), **f64)
    top_sum = torch.zeros(len(layers), n_pos, **f64)
    dim_counts = torch.zeros(len(layers), d_model, **f64)
    count = torch.zeros(n_pos, **f64)
    state: dict[str, Any] = {}

    def make_hook(i: int) -> Any:
        def hook(resid: torch.Tensor, hook: Any) -> None:
            a = resid.detach().abs().float()
            real_now = state["real"][:, : a.shape[1]]
            require_finite(a[real_now], hook.name, "residual-stream entries")
            top, arg = a.max(-1)
            median = a.median(-1).values
            ratio = (top / median.clamp_min(torch.finfo(torch.float32).tiny)).to(torch.float64)
            real = state["real"][:, : a.shape[1]]
            width = a.shape[1]
            ratio_sum[i, :width] += (ratio * real).sum(0)
            top_sum[i, :width] += (top.to(torch.float64) * real).sum(0)
            col_max = torch.where(real, ratio, torch.full_like(ratio, float("-inf"))).max(0).values
            col_max = torch.where(real.any(0), col_max, torch.full_like(col_max, float("nan")))
            ratio_max[i, :width] = torch.fmax(ratio_max[i, :width], col_max)
            big = real & (ratio > threshold)
            dim_counts[i].index_add_(0, arg[big], torch.ones(int(big.sum()), **f64))
            if i == 0:
                count[:width] += real.to(torch.float64).sum(0)

        return hook

    fwd_hooks = [(resid_hook_name(layer), make_hook(i)) for i, layer in enumerate(layers)]
    try:
        for tokens, mask in forward_batches(
            batch, batch_size, device, desc="massive activations", progress=progress
        ):
            state["real"] = mask.bool()
            last = resid_hook_name(max(layers))
            _run_through(model, tokens, last, fwd_hooks, attention_mask=mask)
    finally:
        state.clear()
    return MassiveActivations(
        layers=layers,
        ratio_mean=_nan_div(ratio_sum, count).cpu(),
        ratio_max=ratio_max.cpu(),
        top_value=_nan_div(top_sum, count).cpu(),
        dim_counts=dim_counts.cpu(),
        threshold=float(threshold),
        n_sequences=len(batch),
        provenance=_provenance(info, batch, layers, False),
    )


ATTRIBUTION_METRICS = ("mean_pairwise", "first_excess", "last_excess")
"""Scalar homogenization metrics that :func:`sink_attribution` attributes to heads:
``mean_pairwise`` (mean over sequences of the per-sequence mean pairwise cosine), and
``first_excess`` / ``last_excess`` (mean ``to_others`` over the first / last ``edge_k`` tokens of
every sequence minus the mean over all middle tokens, each pooled over the corpus' tokens;
tokens at or before the sink key are left out)."""


@dataclass(frozen=True, eq=False)
class SinkAttribution(SavedResult):
    """How homogenization at one residual entry changes when attention heads lose their sink.

    Attributes:
        heads: ``(layer, head)`` pairs, one row of ``delta`` each.
        layer: Entry of the residual axis measured (l = output of block l - 1).
        key: Sink key position (0-indexed).
        edge_k: Tokens per edge in ``first_excess`` / ``last_excess``.
        method: ``"exact"`` (one ablated rerun per head) or ``"fast"`` (attribution patching:
            first-order, one forward and backward pass for all heads).
        ablation: ``"sink"`` (attention to ``key`` removed, rows renormalised) or ``"mean"``
            (the head's output ``z`` replaced by its corpus mean).
        rerun: How ablated runs were computed (exact) or the gradient pass (fast).
        base: ``[metric]`` unablated values of :data:`ATTRIBUTION_METRICS` (cosines).
        delta: ``[head metric]`` ablated - base, per head.
        joint_delta: ``[metric]`` ablated - base with all ``heads`` ablated together (exact
            mode with more than one head; else ``None``).
        base_to_others: ``[pos]`` unablated per-position ``to_others`` at ``layer``.
        delta_to_others: ``[head pos]`` its change per head (exact mode; else ``None``).
        joint_delta_to_others: ``[pos]`` its change in the joint ablation (or ``None``).
        n_sequences: Number of sequences.
        provenance: Model, backend, weights, BOS, data.

    References:
        Gu et al. 2024, arXiv 2410.10781; Barbero et al. 2025, arXiv 2504.02732 (sinks prevent
        over-mixing: removing them is predicted to raise homogenization downstream);
        Syed, Rager, Conmy 2023, arXiv 2310.10348 (attribution patching).
    """

    _stem: ClassVar[str] = "attribution"
    _choices: ClassVar[dict[str, tuple[str, ...]]] = {
        "method": ("exact", "fast"),
        "ablation": ("sink", "mean"),
    }

    heads: tuple[tuple[int, int], ...]
    layer: int
    key: int
    edge_k: int
    method: str
    ablation: str
    rerun: str
    base: Float[torch.Tensor, " metric"]
    delta: Float[torch.Tensor, "head metric"]
    joint_delta: Float[torch.Tensor, " metric"] | None
    base_to_others: Float[torch.Tensor, " pos"]
    delta_to_others: Float[torch.Tensor, "head pos"] | None
    joint_delta_to_others: Float[torch.Tensor, " pos"] | None
    n_sequences: int
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        n, m = len(self.heads), len(ATTRIBUTION_METRICS)
        if tuple(self.base.shape) != (m,) or tuple(self.delta.shape) != (n, m):
            raise ValueError(
                f"base {tuple(self.base.shape)} and delta {tuple(self.delta.shape)} must be "
                f"[{m}] and [{n} {m}]"
            )
        if self.delta_to_others is not None and self.delta_to_others.shape[0] != n:
            raise ValueError(f"delta_to_others needs one row per head ({n})")

    def _metric(self, metric: str) -> int:
        if metric not in ATTRIBUTION_METRICS:
            raise InvalidInputError(f"metric={metric!r} must be one of {ATTRIBUTION_METRICS}")
        return ATTRIBUTION_METRICS.index(metric)

    def grid(self, metric: str = "mean_pairwise") -> Float[torch.Tensor, "layer head_index"]:
        """``delta`` of one metric as a ``[layer head_index]`` grid (NaN for heads not run).

        The grid has ``max layer + 1`` rows and ``max head + 1`` columns of ``heads``."""
        j = self._metric(metric)
        n_layer = max(lay for lay, _ in self.heads) + 1
        n_head = max(h for _, h in self.heads) + 1
        out = torch.full((n_layer, n_head), float("nan"), dtype=torch.float64)
        for (lay, head), value in zip(self.heads, self.delta[:, j].tolist(), strict=True):
            out[lay, head] = value
        return out

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per head with ``delta_{metric}`` for every metric."""
        import pandas as pd

        frame = pd.DataFrame(
            {
                "layer": [lay for lay, _ in self.heads],
                "head": [h for _, h in self.heads],
            }
        )
        for j, name in enumerate(ATTRIBUTION_METRICS):
            frame[f"delta_{name}"] = self.delta[:, j].numpy()
        return frame

    def summary(self) -> pd.DataFrame:
        """Per head, then ``sum`` of the single heads and ``joint`` (exact, several heads):
        the change of each metric and the share of the base first/last edge excess removed
        (``share_first_removed = -delta_first_excess / base_first_excess``)."""
        import pandas as pd

        rows = [(str(lay), str(h), d) for (lay, h), d in zip(self.heads, self.delta, strict=True)]
        if len(self.heads) > 1:
            rows.append(("sum", "", self.delta.sum(0)))
        if self.joint_delta is not None:
            rows.append(("joint", "", self.joint_delta))
        table = []
        for lay, head, d in rows:
            row: dict[str, Any] = {"layer": lay, "head": head}
            for j, name in enumerate(ATTRIBUTION_METRICS):
                row[f"delta_{name}"] = float(d[j])
            for j, edge in ((1, "first"), (2, "last")):
                base = float(self.base[j])
                row[f"share_{edge}_removed"] = -float(d[j]) / base if base else float("nan")
            table.append(row)
        return pd.DataFrame(table)

    def correlation(
        self, other: SinkAttribution, metric: str = "mean_pairwise", *, rank: bool = False
    ) -> float:
        """Pearson correlation of ``delta`` over the heads both results share (e.g. fast versus
        exact), or Spearman's with ``rank=True``; NaN with fewer than 3 shared heads."""
        if not isinstance(other, SinkAttribution):
            raise InvalidInputError(f"other must be a SinkAttribution, got {type(other).__name__}")
        j = self._metric(metric)
        mine = dict(zip(self.heads, self.delta[:, j].tolist(), strict=True))
        theirs = dict(zip(other.heads, other.delta[:, j].tolist(), strict=True))
        shared = [h for h in self.heads if h in theirs]
        if len(shared) < 3:
            return float("nan")
        pair = torch.tensor([[mine[h], theirs[h]] for h in shared], dtype=torch.float64).T
        if rank:
            pair = pair.argsort(dim=1).argsort(dim=1).double()
        return float(torch.corrcoef(pair)[0, 1])

    def plot(self, metric: str = "mean_pairwise") -> Figure:
        """Per-head change of ``metric`` (a ``[layer head]`` heatmap, or bars for a few heads)
        and, in exact mode, the change of ``to_others`` per position."""
        from matplotlib.figure import Figure

        j = self._metric(metric)
        exact = self.delta_to_others is not None
        fig = Figure(figsize=(11 if exact else 6, 4), layout="constrained")
        axes = fig.subplots(1, 2 if exact else 1, squeeze=False)[0]
        values = self.delta[:, j].numpy()
        if len(self.heads) > 12:
            grid = self.grid(metric).numpy()
            lim = max(float(abs(values).max()), 1e-12)
            image = axes[0].imshow(
                grid, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-lim, vmax=lim
            )
            axes[0].set_xlabel("head")
            axes[0].set_ylabel("layer")
            fig.colorbar(image, ax=axes[0], label=f"delta {metric}")
        else:
            labels = [f"L{lay}H{h}" for lay, h in self.heads]
            if self.joint_delta is not None:
                labels.append("joint")
                values = [*values, float(self.joint_delta[j])]
            axes[0].bar(labels, values, color="tab:purple")
            axes[0].axhline(0, color="black", lw=0.8)
            axes[0].set_ylabel(f"delta {metric} (cosine)")
        axes[0].set_title(
            f"{self.method} attribution, {self.ablation} ablation, layer {self.layer}"
        )
        if exact:
            ax = axes[1]
            assert self.delta_to_others is not None
            for (lay, h), curve in zip(self.heads, self.delta_to_others, strict=True):
                ax.plot(curve.numpy(), lw=1, label=f"L{lay}H{h}")
            if self.joint_delta_to_others is not None:
                ax.plot(self.joint_delta_to_others.numpy(), color="black", lw=2, label="joint")
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel("position")
            ax.set_ylabel("delta to_others (cosine)")
            ax.legend(fontsize=7, ncol=2)
        return fig

    def __repr__(self) -> str:
        shown = [m for j, m in enumerate(ATTRIBUTION_METRICS) if not self.delta[:, j].isnan().all()]
        j = ATTRIBUTION_METRICS.index(shown[0]) if shown else 0
        return (
            f"SinkAttribution(model={self.provenance.model!r}, method={self.method}, "
            f"ablation={self.ablation}, heads={len(self.heads)}, layer={self.layer}, "
            f"largest |delta {ATTRIBUTION_METRICS[j]}|="
            f"{float(self.delta[:, j].abs().nan_to_num().max()):.4f})"
        )


def _check_heads(heads: Any, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """Validate ``(layer, head)`` pairs with ``layer < n_layers``."""
    from homoglens._checks import as_int

    if hasattr(heads, "columns") and {"layer", "head"} <= set(heads.columns):  # a DataFrame
        heads = list(zip(heads["layer"], heads["head"], strict=True))
    elif hasattr(heads, "tolist") and not isinstance(heads, (str, bytes)):  # numpy / torch [k 2]
        heads = heads.tolist()
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise InvalidInputError(f"heads={heads!r} must be a list of (layer, head) pairs")
    chosen = []
    for pair in heads:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidInputError(f"heads must be (layer, head) pairs, got {pair!r}")
        lay = as_int("head layer", pair[0], low=0)
        if lay >= n_layers:
            raise InvalidInputError(
                f"head ({pair[0]}, {pair[1]}): layer {lay} must be below {n_layers} (heads must "
                "exist and, for sink_attribution, come before the measured residual entry)"
            )
        chosen.append((lay, as_int("head index", pair[1], low=0, high=n_heads - 1)))
    if not chosen or len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"heads={heads!r} must be non-empty and without repeats")
    return chosen


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
    from homoglens._checks import as_int

    n_heads = int(model.cfg.n_heads)
    if heads is not None:
        return _check_heads(heads, target, n_heads)
    top_k = min(as_int("top_k", top_k, low=1), target * n_heads)
    scores = sink_scores(model, batch, key=key, batch_size=batch_size, progress=False)
    mass = scores.mass[:target].flatten()  # heads after the measured entry cannot matter
    order = torch.argsort(mass, descending=True)[:top_k]
    return [(int(i) // n_heads, int(i) % n_heads) for i in order]


def _mean_z(
    model: HookedModel, batch: TokenBatch, layers: list[int], batch_size: int
) -> dict[int, torch.Tensor]:
    """Mean of ``blocks.{l}.attn.hook_z`` over every real token: ``{l: [head_index d_head]}``."""
    device = _model_device(model)
    sums: dict[int, torch.Tensor] = {}
    state: dict[str, Any] = {}

    def make_hook(layer: int) -> Any:
        def hook(z: torch.Tensor, hook: Any) -> None:
            w = state["mask"].to(torch.float64)[..., None, None]
            total = (z.double() * w).sum((0, 1))
            sums[layer] = sums[layer] + total if layer in sums else total

        return hook

    n_tokens = 0.0
    hooks = [(f"blocks.{lay}.attn.hook_z", make_hook(lay)) for lay in layers]
    for tokens, mask in forward_batches(batch, batch_size, device, desc="mean z", progress=False):
        state["mask"] = mask
        n_tokens += float(mask.sum())
        _run_through(model, tokens, f"blocks.{max(layers)}.attn.hook_z", hooks, attention_mask=mask)
    return {lay: (total / n_tokens) for lay, total in sums.items()}


def _ablation_hooks(
    pairs: list[tuple[int, int]], ablation: str, key: int, mean_z: dict[int, torch.Tensor]
) -> list[tuple[str, Any]]:
    from homoglens.hooks import mean_head_hook, remove_sink_hook

    by_layer: dict[int, list[int]] = {}
    for lay, head in pairs:
        by_layer.setdefault(lay, []).append(head)
    if ablation == "sink":
        return [
            (f"blocks.{lay}.attn.hook_pattern", remove_sink_hook(hs, key))
            for lay, hs in sorted(by_layer.items())
        ]
    return [
        (f"blocks.{lay}.attn.hook_z", mean_head_hook(hs, mean_z[lay][hs]))
        for lay, hs in sorted(by_layer.items())
    ]


def _can_start_at_layer(model: HookedModel) -> bool:
    """Whether ``start_at_layer`` skips the earlier blocks: HookedTransformer only. The
    TransformerLens 4 bridge accepts it but still runs blocks 0..l-1 (its ``forward``
    docstring); the 3.9 bridge raises ``NotImplementedError``."""
    return model_info(model).backend == "hooked"


def sink_attribution(
    model: HookedModel,
    data: TokenBatch | Int[torch.Tensor, "batch pos"] | str | list[str] | os.PathLike[str],
    *,
    method: str = "exact",
    ablation: str = "sink",
    heads: list[tuple[int, int]] | None = None,
    top_k: int = 5,
    layer: int | None = None,
    key: int = 0,
    edge_k: int = 8,
    joint: bool = True,
    metrics: tuple[str, ...] | list[str] = ATTRIBUTION_METRICS,
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
    from homoglens._checks import as_bool, as_int

    info = model_info(model)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if method not in ("exact", "fast"):
        raise InvalidInputError(f"method={method!r} must be 'exact' or 'fast'")
    if ablation not in ("sink", "mean"):
        raise InvalidInputError(f"ablation={ablation!r} must be 'sink' or 'mean'")
    key, _ = _check_key_eps(key, 0.3, int(model.cfg.n_ctx))
    target = n_layers if layer is None else as_int("layer", layer, low=1, high=n_layers)
    edge_k = as_int("edge_k", edge_k, low=1)
    batch_size = as_int("batch_size", batch_size, low=1)
    joint = as_bool("joint", joint)
    if isinstance(metrics, str):
        metrics = (metrics,)
    if not isinstance(metrics, (tuple, list)):
        raise InvalidInputError(f"metrics={metrics!r} must be a list of {ATTRIBUTION_METRICS}")
    metrics = tuple(metrics)
    unknown = [name for name in metrics if name not in ATTRIBUTION_METRICS]
    if not metrics or unknown or len(set(metrics)) != len(metrics):
        raise InvalidInputError(
            f"metrics={metrics!r} must be distinct names from {ATTRIBUTION_METRICS}"
        )
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    _check_edge(batch, key, edge_k)
    if method == "fast":
        chosen = [(lay, h) for lay in range(target) for h in range(n_heads)]
    else:
        chosen = _choose_heads(model, batch, heads, top_k, target, key, batch_size)
    totals = edge_totals(batch.lengths, key, edge_k)
    layers = sorted({lay for lay, _ in chosen})
    mean_z = _mean_z(model, batch, layers, batch_size) if ablation == "mean" else {}
    run = _fast_attribution if method == "fast" else _exact_attribution
    fields_ = run(
        model,
        batch,
        chosen,
        target,
        key,
        edge_k,
        ablation,
        mean_z,
        totals,
        batch_size,
        progress,
        joint,
        metrics,
    )
    return SinkAttribution(
        heads=tuple(chosen),
        layer=target,
        key=key,
        edge_k=edge_k,
        method=method,
        ablation=ablation,
        n_sequences=len(batch),
        provenance=_provenance(info, batch, (target,), False),
        **fields_,
    )


def _exact_attribution(
    model: HookedModel,
    batch: TokenBatch,
    chosen: list[tuple[int, int]],
    target: int,
    key: int,
    edge_k: int,
    ablation: str,
    mean_z: dict[int, torch.Tensor],
    totals: torch.Tensor,
    batch_size: int,
    progress: bool,
    joint: bool,
    metrics: tuple[str, ...],  # the exact mode always measures all of them
) -> dict[str, Any]:
    from homoglens.homogenization import homogenization_sums, positions_from_mask
    from homoglens.profile import resid_hook_name

    device = _model_device(model)
    variants = [[pair] for pair in chosen] + ([chosen] if joint and len(chosen) > 1 else [])
    starts = [min(lay for lay, _ in pairs) for pairs in variants]
    skip = _can_start_at_layer(model)
    n_pos = int(batch.lengths.max())
    f64 = torch.float64
    values = torch.zeros(len(variants) + 1, len(ATTRIBUTION_METRICS), dtype=f64)
    curve = torch.zeros(len(variants) + 1, n_pos, dtype=f64)
    count = torch.zeros(n_pos, dtype=f64)
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
        [(f"blocks.{s}.hook_resid_pre", cache(s)) for s in sorted(set(starts))] if skip else []
    )
    hooks = {i: _ablation_hooks(pairs, ablation, key, mean_z) for i, pairs in enumerate(variants)}
    try:
        for tokens, mask in forward_batches(
            batch, batch_size, device, desc="sink attribution", progress=progress
        ):
            lengths = mask.sum(1)
            state.update(
                mask=mask,
                cache={},
                w=scalar_metric_weights(lengths, mask.shape[1], key, edge_k, totals),
                v=0,
            )
            count[: mask.shape[1]] += mask.sum(0).to(f64).cpu()
            _run_through(
                model, tokens, measure_hook[0], [*cache_hooks, measure_hook], attention_mask=mask
            )
            for i, start in enumerate(starts):
                state["v"] = i + 1
                fwd_hooks = [*hooks[i], measure_hook]
                if skip:
                    _run_through(
                        model,
                        state["cache"][start],
                        measure_hook[0],
                        fwd_hooks,
                        start_at_layer=start,
                        attention_mask=mask,
                    )
                else:
                    _run_through(model, tokens, measure_hook[0], fwd_hooks, attention_mask=mask)
    finally:
        state.clear()
    to_others = _nan_div(curve, count)
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


def _fast_attribution(
    model: HookedModel,
    batch: TokenBatch,
    chosen: list[tuple[int, int]],
    target: int,
    key: int,
    edge_k: int,
    ablation: str,
    mean_z: dict[int, torch.Tensor],
    totals: torch.Tensor,
    batch_size: int,
    progress: bool,
    joint: bool,
    metrics: tuple[str, ...],
) -> dict[str, Any]:
    from homoglens.hooks import sink_removal_delta
    from homoglens.profile import resid_hook_name

    n_layers, n_heads = target, int(model.cfg.n_heads)
    device = _model_device(model, needs_grad=True)
    f64 = torch.float64
    m = len(ATTRIBUTION_METRICS)
    total = torch.zeros(n_layers, n_heads, m, dtype=f64)
    base = torch.zeros(m, dtype=f64)
    curve = torch.zeros(int(batch.lengths.max()), dtype=f64)
    count = torch.zeros_like(curve)
    point = "hook_pattern" if ablation == "sink" else "hook_z"
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

    fwd_hooks = [(f"blocks.{i}.attn.{point}", probe(i)) for i in range(n_layers)]
    fwd_hooks.append((resid_hook_name(target), keep))
    try:
        for tokens, mask in forward_batches(
            batch, batch_size, device, desc="fast sink attribution", progress=progress
        ):
            with torch.inference_mode(False), torch.enable_grad():
                tokens_g, mask_g = tokens.clone(), mask.clone()  # leave inference-mode tensors
                last = resid_hook_name(target)
                _run_through(model, tokens_g, last, fwd_hooks, attention_mask=mask_g)
                to_others = token_to_others(store["resid"], mask_g)
                w = scalar_metric_weights(mask_g.sum(1), mask_g.shape[1], key, edge_k, totals).to(
                    device
                )
                values = (w * to_others).sum((1, 2))
                acts = [store[i] for i in range(n_layers)]
                grads = {  # one backward pass per metric, to the activations only
                    j: torch.autograd.grad(
                        values[j], acts, retain_graph=j != wanted[-1], allow_unused=True
                    )
                    for j in wanted
                }
            with torch.no_grad():
                base += values.detach().cpu()
                curve[: mask.shape[1]] += to_others.detach().sum(0).cpu()
                count[: mask.shape[1]] += mask.sum(0).to(f64).cpu()
                for i in range(n_layers):
                    act = store[("act", i)]
                    if ablation == "sink":
                        change = sink_removal_delta(act, key)  # [batch head query key]
                        dims = (0, 2, 3)
                    else:
                        real = mask[..., None, None].to(act.dtype)
                        mean = mean_z[i].to(device=device, dtype=act.dtype)
                        change = (mean[None, None] - act) * real  # [batch pos head d_head]
                        dims = (0, 1, 3)
                    for j in wanted:
                        grad = grads[j][i]
                        if grad is not None:
                            total[i, :, j] += (grad * change).sum(dims, dtype=f64).cpu()
            store.clear()
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
        "base_to_others": _nan_div(curve, count),
        "delta_to_others": None,
        "joint_delta_to_others": None,
    }


def attention_view(
    model: HookedModel,
    text: str,
    heads: list[tuple[int, int]],
    *,
    bos: BosPolicy | bool = "auto",
) -> Any:
    """A circuitsvis view of the chosen heads' attention patterns on one text, for notebooks.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        text: One text (at most ``n_ctx`` tokens).
        heads: ``(layer, head)`` pairs, e.g. ``scores.top_heads(4)`` rows.
        bos: BOS policy, as for :func:`sink_scores`.

    Returns:
        ``circuitsvis.attention.attention_heads`` output (renders in Jupyter; ``str()`` gives
        HTML), with the heads named ``L{layer}H{head}``.

    Raises:
        InvalidInputError: a head that does not exist, or bad text.

    References:
        Cooney & Nanda, CircuitsVis (github.com/TransformerLensOrg/CircuitsVis).
    """
    import circuitsvis as cv

    chosen = _check_heads(heads, int(model.cfg.n_layers), int(model.cfg.n_heads))
    if not isinstance(text, str):
        raise InvalidInputError(f"text must be one string, got {type(text).__name__}")
    batch = to_token_batch(model, [text], bos=bos)
    names = {f"blocks.{lay}.attn.hook_pattern" for lay, _ in chosen}
    with torch.inference_mode():
        _, cache = model.run_with_cache(
            batch.tokens.to(_model_device(model)), names_filter=lambda n: n in names
        )
    patterns = torch.stack(
        [cache[f"blocks.{lay}.attn.hook_pattern"][0, h].float().cpu() for lay, h in chosen]
    )
    tokenizer = model.tokenizer
    tokens = [tokenizer.decode([int(t)]) for t in batch.tokens[0]]
    return cv.attention.attention_heads(
        attention=patterns,
        tokens=tokens,
        attention_head_names=[f"L{lay}H{h}" for lay, h in chosen],
    )


@dataclass(frozen=True, eq=False)
class SinkAnalysis:
    """Everything homoglens measures about attention sinks on one corpus, for reports.

    Attributes:
        scores: Sink mass, importance and sink rate of every head.
        massive: Massive-activation statistics.
        fast: First-order attribution of every head (sink removal).
        exact: Exact attribution of the top sink heads, one by one and jointly.
    """

    scores: SinkScores
    massive: MassiveActivations
    fast: SinkAttribution
    exact: SinkAttribution

    def save(self, path: str | Path) -> Path:
        """Save each part in a subfolder (``scores``, ``massive``, ``fast``, ``exact``)."""
        folder = prepare_folder(path)
        for name in ("scores", "massive", "fast", "exact"):
            getattr(self, name).save(folder / name)
        return folder

    @classmethod
    def load(cls, path: str | Path) -> SinkAnalysis:
        """Load what :meth:`save` wrote.

        Raises:
            ResultsNotFoundError: a part is missing. IncompatibleResultsError: a bad file."""
        folder = Path(path).expanduser()
        return cls(
            scores=SinkScores.load(folder / "scores"),
            massive=MassiveActivations.load(folder / "massive"),
            fast=SinkAttribution.load(folder / "fast"),
            exact=SinkAttribution.load(folder / "exact"),
        )

    def __repr__(self) -> str:
        return f"SinkAnalysis({self.scores!r}, exact top heads={list(self.exact.heads)})"


def sink_analysis(
    model: HookedModel,
    data: TokenBatch | Int[torch.Tensor, "batch pos"] | str | list[str] | os.PathLike[str],
    *,
    key: int = 0,
    eps: float = 0.3,
    top_k: int = 3,
    edge_k: int = 8,
    attribution_n_seq: int | None = None,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> SinkAnalysis:
    """Sink scores and massive activations on all of ``data``, then fast attribution of every
    head and exact attribution of the ``top_k`` heads by sink mass (plus their joint removal)
    at the last block's output, on the first ``attribution_n_seq`` sequences (default: all).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        key: Sink key position.
        eps: Sink-rate threshold (Gu et al.: 0.3).
        top_k: Heads for the exact attribution.
        edge_k: Tokens per edge in the attribution metrics.
        attribution_n_seq: Sequences used by the attributions (they cost several passes).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show progress bars.

    Returns:
        :class:`SinkAnalysis`.

    Raises:
        InvalidInputError: bad arguments or data (see :func:`sink_scores`,
            :func:`sink_attribution`).

    References:
        Gu et al. 2024, arXiv 2410.10781; Sun et al. 2024, arXiv 2402.17762;
        Barbero et al. 2025, arXiv 2504.02732; Syed, Rager, Conmy 2023, arXiv 2310.10348.
    """
    from homoglens._checks import as_int

    key, eps = _check_key_eps(key, eps, int(model.cfg.n_ctx))
    top_k = as_int("top_k", top_k, low=1)
    edge_k = as_int("edge_k", edge_k, low=1)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    n_attr = len(batch)
    if attribution_n_seq is not None:
        n_attr = as_int("attribution_n_seq", attribution_n_seq, low=1)
    _check_edge(batch[: min(n_attr, len(batch))], key, edge_k)  # fail before any pass
    common = {"batch_size": batch_size, "progress": progress}
    scores = sink_scores(model, batch, key=key, eps=eps, **common)
    massive = massive_activations(model, batch, **common)
    subset = batch[: min(n_attr, len(batch))]
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    top = scores.top_heads(min(top_k, n_layers * n_heads))
    heads = [(int(r.layer), int(r.head)) for r in top.itertuples()]
    attr = {"key": key, "edge_k": edge_k, **common}
    fast = sink_attribution(model, subset, method="fast", **attr)
    exact = sink_attribution(model, subset, heads=heads, **attr)
    return SinkAnalysis(scores=scores, massive=massive, fast=fast, exact=exact)
