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

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int

from homoglens.data import TokenBatch, to_token_batch
from homoglens.errors import InvalidInputError
from homoglens.models import model_info
from homoglens.profile import _check_positive_int, _model_device, _provenance, forward_batches
from homoglens.results import Provenance, _nan_div
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
    "SinkAttribution",
    "sink_attribution",
    "fast_sink_attribution",
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
        sequences have alpha > eps), ``n_sequences []``.
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
    }


@dataclass(frozen=True, eq=False)
class SinkScores:
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
    def sink_rate(self) -> float:
        """Sink_k^eps in percent: share of (sequence, layer, head) with alpha_k > eps."""
        return float(self.sink_rate_by_head.mean() * 100)

    def top_heads(self, k: int = 10, *, by: str = "mass") -> pd.DataFrame:
        """The ``k`` heads with the largest ``mass`` (or ``importance``), strongest first.

        Returns:
            DataFrame with columns ``layer, head, mass, importance, sink_rate``.
        """
        import pandas as pd

        if by not in ("mass", "importance"):
            raise ValueError(f"by={by!r} must be 'mass' or 'importance'")
        values = getattr(self, by).flatten()
        order = torch.argsort(values, descending=True)[: max(1, k)]
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
            f"layers={self.mass.shape[0]}, heads={self.mass.shape[1]}, "
            f"sink_rate={self.sink_rate:.1f}%, n_sequences={self.n_sequences})"
        )


def _check_key_eps(key: Any, eps: Any, n_ctx: int) -> tuple[int, float]:
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < n_ctx:
        raise InvalidInputError(f"key={key!r} must be an int position in [0, {n_ctx})")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise InvalidInputError(f"eps={eps!r} must lie in (0, 1); Gu et al. use 0.3")
    return key, float(eps)


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
    info = model_info(model)
    key, eps = _check_key_eps(key, eps, int(model.cfg.n_ctx))
    batch_size = _check_positive_int("batch_size", batch_size)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    short = torch.nonzero(batch.lengths <= key).flatten().tolist()
    if short:
        raise InvalidInputError(
            f"key={key} lies outside sequences {short[:10]} (they have <= {key} tokens); use a "
            "smaller key or longer sequences"
        )
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

    def make_hook(layer: int) -> Any:
        def hook(pattern: torch.Tensor, hook: Any) -> None:
            sums = sink_sums(pattern, state["lengths"], key=key, eps=eps)
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
    try:
        for tokens, mask in forward_batches(
            batch, batch_size, device, desc="sinks", progress=progress
        ):
            state["lengths"] = mask.sum(1)
            model.run_with_hooks(tokens, attention_mask=mask, return_type=None, fwd_hooks=fwd_hooks)
    finally:
        state.clear()
    n_seq = counts["n_sequences"]
    by_query = _nan_div(acc["by_query_sum"].cpu(), counts["by_query_count"].cpu())
    return SinkScores(
        key=key,
        eps=eps,
        mass=(acc["mass_sum"] / max(counts["mass_count"], 1.0)).cpu(),
        mass_by_query=by_query,
        importance=(acc["importance_sum"] / n_seq).cpu(),
        sink_rate_by_head=(acc["sink_count"] / n_seq).cpu(),
        n_sequences=int(n_seq),
        provenance=_provenance(info, batch, (), False),
    )


@dataclass(frozen=True, eq=False)
class MassiveActivations:
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
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold <= 1:
        raise InvalidInputError(f"threshold={threshold!r} must be a number > 1")
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
            model.run_with_hooks(
                tokens,
                attention_mask=mask,
                return_type=None,
                stop_at_layer=n_layers,
                fwd_hooks=fwd_hooks,
            )
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


@dataclass(frozen=True, eq=False)
class SinkAttribution:
    """How homogenization at one residual entry changes when attention sinks are removed.

    Attributes:
        heads: ``(layer, head)`` pairs whose sink was removed, one at a time.
        layer: Entry of the residual axis measured (0 = embeddings, l = output of block l - 1).
        key: Sink key position.
        edge_k: Positions per edge in the edge-versus-middle summaries.
        base_to_others: ``[pos]`` to_others of the unablated model at ``layer``.
        delta_to_others: ``[head pos]`` ablated - base, one row per entry of ``heads``.
        delta_mean_pairwise: ``[head]`` change of mean pairwise cosine.
        joint_delta_to_others: ``[pos]`` change when all ``heads`` lose their sink together.
        joint_delta_mean_pairwise: change of mean pairwise cosine for the joint ablation.
        method: ``"exact"`` (one rerun per head).
        rerun: How ablated runs were computed (``"full forward pass"``).
        provenance: Model, backend, weights, BOS, data.

    References:
        Gu et al. 2024, arXiv 2410.10781; Barbero et al. 2025, arXiv 2504.02732 (sinks prevent
        over-mixing: removing them is predicted to raise homogenization downstream).
    """

    heads: tuple[tuple[int, int], ...]
    layer: int
    key: int
    edge_k: int
    base_to_others: Float[torch.Tensor, " pos"]
    delta_to_others: Float[torch.Tensor, "head pos"]
    delta_mean_pairwise: Float[torch.Tensor, " head"]
    joint_delta_to_others: Float[torch.Tensor, " pos"]
    joint_delta_mean_pairwise: float
    method: str = "exact"
    rerun: str = "full forward pass"
    provenance: Provenance = field(default_factory=Provenance)

    def _excess(self, to_others: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(first k - middle, last k - middle) of a ``[... pos]`` per-position curve."""
        k = self.edge_k
        x = to_others[..., self.key + 1 :] if self.key == 0 else to_others
        first, middle, last = x[..., :k], x[..., k:-k], x[..., -k:]
        mid = middle.nanmean(-1)
        return first.nanmean(-1) - mid, last.nanmean(-1) - mid

    def summary(self) -> pd.DataFrame:
        """Per head (and ``joint``): change of mean pairwise cosine and of the edge excess
        (first/last ``edge_k`` positions minus the middle; the sink key itself left out), and
        the share of the base edge excess that the removal takes away."""
        import pandas as pd

        base_first, base_last = self._excess(self.base_to_others)
        rows = []
        curves = list(
            zip(self.heads, self.delta_to_others, self.delta_mean_pairwise.tolist(), strict=True)
        )
        curves.append((("joint", ""), self.joint_delta_to_others, self.joint_delta_mean_pairwise))
        for (layer, head), delta, d_pair in curves:
            new_first, new_last = self._excess(self.base_to_others + delta)
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "delta_mean_pairwise": d_pair,
                    "delta_first_excess": float(new_first - base_first),
                    "delta_last_excess": float(new_last - base_last),
                    "share_first_excess_removed": float((base_first - new_first) / base_first)
                    if float(base_first) != 0
                    else float("nan"),
                }
            )
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return (
            f"SinkAttribution(model={self.provenance.model!r}, heads={len(self.heads)}, "
            f"layer={self.layer}, method={self.method}, "
            f"joint_delta_mean_pairwise={self.joint_delta_mean_pairwise:+.4f})"
        )


def sink_attribution(
    model: HookedModel,
    data: TokenBatch | Int[torch.Tensor, "batch pos"] | str | list[str] | os.PathLike[str],
    *,
    heads: list[tuple[int, int]] | None = None,
    top_k: int = 5,
    layer: int | None = None,
    key: int = 0,
    edge_k: int = 8,
    method: str = "exact",
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> SinkAttribution:
    """Attribute homogenization to attention sinks by removing them, head by head and jointly.

    For each head, its attention to ``key`` is removed and every row renormalised over the other
    keys (a query whose only key is the sink keeps its row), the model is rerun, and
    ``to_others`` per position and ``mean_pairwise`` are measured at residual entry ``layer``;
    the result holds ablated - base. A joint ablation removes all the heads' sinks at once.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        heads: ``(layer, head)`` pairs; default: the ``top_k`` heads by sink mass on ``key``.
        top_k: How many heads when ``heads`` is not given.
        layer: Residual entry to measure (default ``n_layers``: the last block's output).
        key: Sink key position (0-indexed).
        edge_k: Positions per edge in :meth:`SinkAttribution.summary`.
        method: ``"exact"`` (one rerun per head; the first-order ``"fast"`` mode is not
            implemented yet).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show progress bars.

    Returns:
        :class:`SinkAttribution`.

    Raises:
        InvalidInputError: a head or layer that does not exist, bad ``key``/``method``, or bad
            data. No hook stays attached after any error.

    References:
        Gu et al. 2024, arXiv 2410.10781; Barbero et al. 2025, arXiv 2504.02732.
    """
    from homoglens._checks import as_int
    from homoglens.hooks import remove_sink_hook
    from homoglens.profile import _check_min_tokens, _stream

    info = model_info(model)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if method != "exact":
        raise InvalidInputError(f"method={method!r}: only 'exact' is implemented so far")
    key, _ = _check_key_eps(key, 0.3, int(model.cfg.n_ctx))
    target = n_layers if layer is None else as_int("layer", layer, low=0, high=n_layers)
    edge_k = as_int("edge_k", edge_k, low=1)
    batch_size = as_int("batch_size", batch_size, low=1)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    _check_min_tokens(batch, False)
    if heads is None:
        scores = sink_scores(model, batch, key=key, batch_size=batch_size, progress=False)
        top = scores.top_heads(as_int("top_k", top_k, low=1, high=n_layers * n_heads))
        chosen = [(int(r.layer), int(r.head)) for r in top.itertuples()]
    else:
        chosen = []
        for pair in heads:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise InvalidInputError(f"heads must be (layer, head) pairs, got {pair!r}")
            lay = as_int("head layer", pair[0], low=0, high=n_layers - 1)
            head = as_int("head index", pair[1], low=0, high=n_heads - 1)
            chosen.append((lay, head))
        if not chosen or len(set(chosen)) != len(chosen):
            raise InvalidInputError(f"heads={heads!r} must be non-empty and without repeats")
    counted = int(batch.lengths.min()) - (1 if key == 0 else 0)
    if 2 * edge_k >= counted:
        raise InvalidInputError(f"edge_k={edge_k} needs sequences longer than {2 * edge_k + 1}")

    def run(hooks: list[tuple[str, Any]], desc: str) -> Any:
        out = _stream(
            model,
            batch,
            (target,),
            batch_size=batch_size,
            exclude_first=False,
            effective_rank=False,
            progress=progress,
            extra_hooks=hooks,
            desc=desc,
        )
        return out.accumulator.profile((target,), _provenance(info, batch, (target,), False))

    def hooks_for(pairs: list[tuple[int, int]]) -> list[tuple[str, Any]]:
        by_layer: dict[int, list[int]] = {}
        for lay, head in pairs:
            by_layer.setdefault(lay, []).append(head)
        return [
            (f"blocks.{lay}.attn.hook_pattern", remove_sink_hook(hs, key))
            for lay, hs in sorted(by_layer.items())
        ]

    base = run([], "sink attribution: base")
    deltas, pair_deltas = [], []
    for lay, head in chosen:
        ablated = run(hooks_for([(lay, head)]), f"remove sink L{lay}H{head}")
        deltas.append(ablated.to_others[0] - base.to_others[0])
        pair_deltas.append(float(ablated.mean_pairwise[0] - base.mean_pairwise[0]))
    joint = run(hooks_for(chosen), "remove sinks jointly")
    return SinkAttribution(
        heads=tuple(chosen),
        layer=target,
        key=key,
        edge_k=edge_k,
        base_to_others=base.to_others[0],
        delta_to_others=torch.stack(deltas),
        delta_mean_pairwise=torch.tensor(pair_deltas, dtype=torch.float64),
        joint_delta_to_others=joint.to_others[0] - base.to_others[0],
        joint_delta_mean_pairwise=float(joint.mean_pairwise[0] - base.mean_pairwise[0]),
        provenance=base.provenance,
    )


def fast_sink_attribution(
    model: HookedModel,
    data: TokenBatch | Int[torch.Tensor, "batch pos"] | str | list[str] | os.PathLike[str],
    *,
    layer: int | None = None,
    key: int = 0,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> Float[torch.Tensor, "layer head_index"]:
    """First-order estimate, for every head at once, of how removing its attention sink changes
    the mean pairwise cosine at residual entry ``layer`` (attribution patching).

    One forward and one backward pass per batch: the gradient of the summed per-sequence
    mean pairwise cosine with respect to every head's attention pattern, times the change
    that removing the sink (attention to ``key`` set to 0, rows renormalised) makes to that
    pattern, summed over queries and keys and averaged over sequences. Compare with
    :func:`sink_attribution` (exact, one rerun per head); the estimate is exact to first order
    in the size of the pattern change. Parameter gradients are never touched
    (``torch.autograd.grad`` on the patterns only).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        layer: Residual entry measured (default ``n_layers``).
        key: Sink key position (0-indexed).
        batch_size: Sequences per forward/backward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show a progress bar.

    Returns:
        ``[layer head_index]`` estimated change of mean pairwise cosine (same units as
        ``SinkAttribution.delta_mean_pairwise``).

    Raises:
        InvalidInputError: bad ``layer``/``key`` or data. No hook stays attached after errors.

    References:
        Nanda 2023, "Attribution Patching"; Syed, Rager, Conmy 2023, arXiv 2310.10348;
        Gu et al. 2024, arXiv 2410.10781.
    """
    from homoglens._checks import as_int
    from homoglens.hooks import sink_removal_delta
    from homoglens.profile import _check_min_tokens, resid_hook_name

    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    key, _ = _check_key_eps(key, 0.3, int(model.cfg.n_ctx))
    target = n_layers if layer is None else as_int("layer", layer, low=1, high=n_layers)
    batch_size = as_int("batch_size", batch_size, low=1)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    _check_min_tokens(batch, False)
    device = _model_device(model)
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    blocks = range(min(target, n_layers))  # blocks after the measured entry cannot matter
    store: dict[Any, torch.Tensor] = {}

    def keep(name: Any) -> Any:
        def hook(activation: torch.Tensor, hook: Any) -> None:
            store[name] = activation

        return hook

    fwd_hooks = [(f"blocks.{i}.attn.hook_pattern", keep(i)) for i in blocks]
    fwd_hooks.append((resid_hook_name(target), keep("resid")))
    for tokens, mask in forward_batches(
        batch, batch_size, device, desc="fast sink attribution", progress=progress
    ):
        with torch.inference_mode(False), torch.enable_grad():
            tokens_g, mask_g = tokens.clone(), mask.clone()  # leave inference-mode tensors
            model.run_with_hooks(
                tokens_g,
                attention_mask=mask_g,
                return_type=None,
                stop_at_layer=max(1, target),
                fwd_hooks=fwd_hooks,
            )
            x = store["resid"].double()
            w = mask_g.to(x.dtype)
            u = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30) * w[..., None]
            s = u.sum(1)
            t = w.sum(1)
            metric = (((s * s).sum(-1) - t) / (t * (t - 1))).sum()
            patterns = [store[i] for i in blocks]
            grads = torch.autograd.grad(metric, patterns, allow_unused=True)
        for i, pattern, grad in zip(blocks, patterns, grads, strict=True):
            if grad is None:
                continue
            delta = sink_removal_delta(pattern.detach().double(), key)
            total[i] += (grad.double() * delta).sum(dim=(0, 2, 3)).cpu()
        store.clear()
    return (total / len(batch)).float()
