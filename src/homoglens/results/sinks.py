"""Result objects of the sink measurements: ``SinkScores``, ``MassiveActivations``,
``SinkAttribution``, ``SinkAnalysis``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

import torch
from jaxtyping import Float, Int

from homoglens.errors import IncompatibleResultsError, InvalidInputError
from homoglens.homogenization import massive_sums, nan_div
from homoglens.results import Provenance, SavedResult
from homoglens.results.base import (
    COSINE_OR_NAN,
    FINITE_OR_NAN,
    HASHES,
    NON_NEGATIVE,
    UNIT,
    UNIT_OR_NAN,
    Bounds,
    FieldError,
    read_json,
    save_folder,
    sha256_of,
    write_json,
)
from homoglens.results.cache import cached_residuals
from homoglens.types import ATTRIBUTION_METRICS, MASSIVE_MEDIANS, MassiveMedian

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from plotly.graph_objects import Figure as PlotlyFigure

    from homoglens.types import PlotBackend


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
    _bounds: ClassVar[dict[str, Bounds]] = {
        "key": NON_NEGATIVE,
        "n_sequences": Bounds(1.0),
        "mass": UNIT_OR_NAN,  # NaN: no query comes after key (every head: checked below)
        "mass_by_query": UNIT_OR_NAN,  # NaN for q <= key
        "importance": UNIT,  # every sequence reaches key: never NaN
        "sink_rate_by_head": UNIT,
    }

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

    def _check_values(self) -> None:
        """Run on load: ``key`` is a position of ``mass_by_query`` (NaN up to it, as no query
        there comes after it, and NaN for every head or none at each query), ``mass`` NaN only
        where no query comes after ``key`` at all, and ``sink_rate_by_head`` is a share of the
        ``n_sequences`` sequences (a whole number of them)."""
        n_query = int(self.mass_by_query.shape[-1])
        if self.key >= max(n_query, 1):
            raise FieldError("key", f"key={self.key} is not a position of the {n_query} queries")
        if not bool(torch.isnan(self.mass_by_query[..., : self.key + 1]).all()):
            raise FieldError(
                "mass_by_query",
                f"mass_by_query must be NaN at queries q <= key={self.key} (no attention to a "
                "later key): key and mass_by_query do not fit together",
            )
        # NaN says that no sequence has the query (mass: any query after key): the same for
        # every head, and mass NaN exactly when mass_by_query is NaN at every query
        by_query = torch.isnan(self.mass_by_query)
        if bool((by_query != by_query[:1, :1]).any()):
            raise FieldError(
                "mass_by_query",
                "mass_by_query is NaN for some heads but not others at one query position (NaN "
                "says no sequence has a query there, the same for every head)",
            )
        empty = bool(by_query[0, 0].all()) if by_query.numel() else True
        if bool((torch.isnan(self.mass) != empty).any()):
            raise FieldError(
                "mass",
                "mass must be NaN exactly when no query comes after key in any sequence "
                f"(mass_by_query NaN at every query: {empty}), for every head alike",
            )
        share = self.sink_rate_by_head.double() * self.n_sequences
        if bool(((share - share.round()).abs() > 1e-6 * max(self.n_sequences, 1)).any()):
            raise FieldError(
                "sink_rate_by_head",
                f"sink_rate_by_head must be a share of the {self.n_sequences} sequences (a whole "
                "number of them per head)",
            )

    @property
    def key_holds_bos(self) -> bool | None:
        """Whether position ``key`` held a BOS token (``None``: in some sequences only)."""
        return self.provenance.bos if self.key == 0 else False

    @property
    def sink_rate(self) -> float:
        """Gu et al.'s Sink_{key+1}^eps in percent (they count keys from 1: ``key=0`` is their
        Sink_1): share of (sequence, layer, head) with alpha > eps on ``key``."""
        return float(self.sink_rate_by_head.mean() * 100)

    def top_heads(self, k: int = 10, *, by: str = "mass") -> pd.DataFrame:
        """The ``k`` heads with the largest ``mass`` (or ``importance``), strongest first.

        Returns:
            DataFrame with columns ``layer, head, mass, importance, sink_rate``.
        """
        import pandas as pd

        from homoglens.validate import as_int

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
                "layer": torch.arange(n_layers, device="cpu").repeat_interleave(n_heads).numpy(),
                "head": torch.arange(n_heads, device="cpu").repeat(n_layers).numpy(),
                "mass": self.mass.flatten().numpy(),
                "importance": self.importance.flatten().numpy(),
                "sink_rate": self.sink_rate_by_head.flatten().numpy(),
            }
        )

    @overload
    def plot(self, *, backend: Literal["matplotlib"] = "matplotlib") -> Figure: ...
    @overload
    def plot(self, *, backend: Literal["plotly"]) -> PlotlyFigure: ...
    def plot(self, *, backend: PlotBackend = "matplotlib") -> Figure | PlotlyFigure:
        """Heatmaps of sink mass and importance per (layer, head).

        Args:
            backend: ``"matplotlib"`` (the default: a static figure for files) or ``"plotly"``
                (interactive: hover values with units, zoom, legend toggles; needs
                ``pip install "homoglens[plotly]"``).

        Returns:
            A matplotlib ``Figure`` (displays inline in Jupyter), or with ``backend="plotly"`` a
            ``plotly.graph_objects.Figure``.

        Raises:
            InvalidInputError: ``backend`` is neither ``"matplotlib"`` nor ``"plotly"``.
            MissingDependencyError: ``backend="plotly"`` without plotly installed.
        """
        from homoglens.results.figures import sink_scores_figure

        return sink_scores_figure(self, backend=backend)

    def __repr__(self) -> str:
        return (
            f"SinkScores(model={self.provenance.model!r}, key={self.key}, "
            f"key_holds_bos={self.key_holds_bos}, "
            f"layers={self.mass.shape[0]}, heads={self.mass.shape[1]}, "
            f"sink_rate={self.sink_rate:.1f}%, n_sequences={self.n_sequences})"
        )


@dataclass(frozen=True, eq=False)
class MassiveActivations(SavedResult):
    """Massive-activation statistics of the residual stream (Sun et al. 2024).

    Attributes:
        layers: Entries of the ``n_layers + 1`` residual axis (0 = embeddings).
        ratio_mean: ``[layer pos]`` mean over sequences of max_d |x| / m, where m is the
            token's median_d |x| (``median="token"``) or the median |x| over every real token
            and dimension of its sequence at that layer (``median="layer"``, Sun et al.).
        ratio_max: ``[layer pos]`` max over sequences of the same ratio.
        top_value: ``[layer pos]`` mean over sequences of max_d |x| (model units).
        dim_counts: ``[layer d_model]`` how often each dimension held a token's largest |x|
            among tokens whose ratio exceeds ``threshold`` and whose |x| exceeds
            ``min_magnitude``.
        threshold: Ratio above which a token counts as carrying a massive activation.
        n_sequences: Number of sequences.
        median: ``"token"`` or ``"layer"``: the median of ``ratio_mean`` / ``ratio_max``.
        min_magnitude: Smallest |x| (model units) that counts in ``dim_counts``.
        provenance: Model, backend, weights, BOS, data.
        layer_top: ``[layer k]`` mean over sequences of the k = 3 largest |x| over all real
            tokens and dimensions of the sequence (model units; Sun et al.'s "Top 1-3");
            ``None`` in results saved before it existed.
        layer_median: ``[layer]`` mean over sequences of the median |x| over all real tokens
            and dimensions of the sequence (model units; Sun et al.'s "Median"); ``None``
            likewise.

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762.
    """

    _stem: ClassVar[str] = "massive"
    _ranges: ClassVar[dict[str, tuple[float, float]]] = {
        "threshold": (1.0, math.inf),
        "min_magnitude": (-1e-300, math.inf),
    }
    _choices: ClassVar[dict[str, tuple[str, ...]]] = {"median": MASSIVE_MEDIANS}
    _bounds: ClassVar[dict[str, Bounds]] = {
        "n_sequences": Bounds(1.0),
        "ratio_mean": Bounds(0.0, nan=True),  # NaN: no real token at the position
        "ratio_max": Bounds(0.0, nan=True),
        "top_value": Bounds(0.0, nan=True),
        "layer_top": NON_NEGATIVE,
        "layer_median": NON_NEGATIVE,
    }

    layers: tuple[int, ...]
    ratio_mean: Float[torch.Tensor, "layer pos"]
    ratio_max: Float[torch.Tensor, "layer pos"]
    top_value: Float[torch.Tensor, "layer pos"]
    dim_counts: Float[torch.Tensor, "layer d_model"]
    threshold: float
    n_sequences: int
    median: str = "token"
    min_magnitude: float = 0.0
    provenance: Provenance = field(default_factory=Provenance)
    layer_top: Float[torch.Tensor, "layer k"] | None = None
    layer_median: Float[torch.Tensor, " layer"] | None = None

    def _check_values(self) -> None:
        """Run on load: the positions without a real token are NaN in every per-position
        field; a maximum over sequences is at least their mean; ``median="token"`` ratios are at
        least 1 (a token's largest |x| is at least its median); ``dim_counts`` counts at most
        every token once; ``layer_top`` is in decreasing order."""
        empty = torch.isnan(self.ratio_mean)
        for name in ("ratio_max", "top_value"):
            if not torch.equal(torch.isnan(getattr(self, name)), empty):
                raise FieldError(name, f"{name} and ratio_mean are NaN at different positions")
        mean, top = self.ratio_mean[~empty].double(), self.ratio_max[~empty].double()
        if bool((top < mean * (1 - 1e-9) - 1e-9).any()):
            raise FieldError("ratio_max", "ratio_max (over sequences) is below ratio_mean")
        if self.median == "token" and bool((mean < 1 - 1e-6).any()):
            raise FieldError(
                "ratio_mean",
                f"ratio_mean reaches {float(mean.min()):.6g}; a token's max |x| over its median "
                "|x| is at least 1",
            )
        tokens = self.n_sequences * int(self.ratio_mean.shape[-1])
        if bool((self.dim_counts.sum(-1) > tokens).any()):
            raise FieldError(
                "dim_counts",
                f"dim_counts counts {int(self.dim_counts.sum(-1).max())} tokens in a layer, "
                f"more than the {tokens} there are",
            )
        if self.layer_top is not None and bool(
            (self.layer_top[:, 1:] > self.layer_top[:, :-1] * (1 + 1e-9) + 1e-12).any()
        ):
            raise FieldError("layer_top", "layer_top must be in decreasing order (top 1, 2, 3)")

    @classmethod
    def from_sums(
        cls,
        layers: tuple[int, ...],
        sums: dict[str, torch.Tensor],
        *,
        threshold: float,
        n_sequences: int,
        median: str,
        min_magnitude: float,
        provenance: Provenance,
    ) -> MassiveActivations:
        """The result of accumulated :func:`~homoglens.homogenization.massive_sums` (one row
        per layer entry of each; ``ratio_max`` maximised, the rest added), as the streamed
        model path and :meth:`from_cache` finish them."""
        count, n_seq = sums["count"], sums["n_seq"]
        ratio_max = sums["ratio_max"]
        ratio_max = torch.where(count > 0, ratio_max, torch.full_like(ratio_max, float("nan")))
        return cls(
            layers=layers,
            ratio_mean=nan_div(sums["ratio_sum"], count).cpu(),
            ratio_max=ratio_max.cpu(),
            top_value=nan_div(sums["top_sum"], count).cpu(),
            dim_counts=sums["dim_counts"].cpu(),
            layer_top=nan_div(sums["layer_top_sum"], n_seq).cpu(),
            layer_median=nan_div(sums["layer_median_sum"], n_seq).cpu(),
            threshold=float(threshold),
            n_sequences=int(n_sequences),
            median=median,
            min_magnitude=float(min_magnitude),
            provenance=provenance,
        )

    @classmethod
    def from_cache(
        cls,
        cache: Any,
        *,
        layers: list[int] | tuple[int, ...] | int | None = None,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
        median: MassiveMedian = "token",
        threshold: float | None = None,
        min_magnitude: float | None = None,
        batch_size: int = 8,
    ) -> MassiveActivations:
        """Massive activations of activations you already have: the residual stream held by a
        TransformerLens ``ActivationCache``, with no second forward pass.

        Reads entry 0 from ``blocks.0.hook_resid_pre`` and entry l from
        ``blocks.{l-1}.hook_resid_post`` (the hook points :func:`~homoglens.massive_activations`
        reads) and reduces them with the same sums, so ``MassiveActivations.from_cache(cache)``
        of ``_, cache = model.run_with_cache(tokens)`` equals ``massive_activations(model,
        tokens)``.

        Args:
            cache: The ``ActivationCache`` of ``model.run_with_cache(tokens)``, or a dict of
                those hook names to ``[batch pos d_model]`` tensors.
            layers: Entries of the residual axis; default: every entry the cache holds.
            attention_mask: ``[batch pos]`` 0/1 of the cached tokens (left or right padding);
                default: all real.
            median: ``"token"`` or ``"layer"`` (Sun et al.), as in
                :func:`~homoglens.massive_activations`.
            threshold: As there (default 100 for ``"token"``, 1000 for ``"layer"``).
            min_magnitude: As there (default 0 for ``"token"``, 100 for ``"layer"``).
            batch_size: Sequences reduced at a time (memory, not results).

        Returns:
            :class:`MassiveActivations` whose provenance names the cache's model and backend
            (when the cache knows its model) and the hook points.

        Raises:
            InvalidInputError: not a cache, a missing hook point (the message says how to keep
                it), tensors of the wrong shape, a bad mask, bad options.
            NonFiniteActivationError: NaN/inf at a real token.

        References:
            Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762.

        Examples:
            >>> import torch
            >>> from homoglens import MassiveActivations, load_model
            >>> from homoglens.testing import tiny_model_folder
            >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
            >>> _, cache = model.run_with_cache(torch.randint(0, 1000, (2, 5)))
            >>> acts = MassiveActivations.from_cache(cache)
            >>> acts.layers, tuple(acts.ratio_mean.shape)
            ((0, 1, 2), (3, 5))
        """
        from homoglens.validate import as_float, positive_int

        if not isinstance(median, str) or median not in MASSIVE_MEDIANS:
            raise InvalidInputError(f"median={median!r} must be one of {list(MASSIVE_MEDIANS)}")
        sun = median == "layer"
        if threshold is None:  # the defaults of massive_activations
            threshold = 1000.0 if sun else 100.0
        if min_magnitude is None:
            min_magnitude = 100.0 if sun else 0.0
        threshold = as_float("threshold", threshold, low=1.0, high=math.inf)
        min_magnitude = as_float("min_magnitude", min_magnitude, low=-math.inf, high=math.inf)
        if min_magnitude < 0:
            raise InvalidInputError(f"min_magnitude={min_magnitude} must be >= 0 (0: no rule)")
        batch_size = positive_int("batch_size", batch_size)
        read = cached_residuals(cache, layers, attention_mask)
        mask, n_all = read.attention_mask, int(read.attention_mask.shape[0])
        rows: dict[str, list[torch.Tensor]] = {}  # one row per layer entry
        for i, x in enumerate(read.resid):
            parts = [
                massive_sums(
                    x[start : start + batch_size],
                    mask[start : start + batch_size],
                    threshold=threshold,
                    median=median,
                    min_magnitude=min_magnitude,
                    where=read.provenance.hook_points[i],
                )
                for start in range(0, n_all, batch_size)
            ]
            for name in parts[0]:
                stacked = torch.stack([part[name] for part in parts])
                row = stacked.amax(0) if name == "ratio_max" else stacked.sum(0)
                rows.setdefault(name, []).append(row)
        sums = {name: torch.stack(row) for name, row in rows.items()}
        sums["count"], sums["n_seq"] = sums["count"][0], sums["n_seq"][0]
        sums["layer_median_sum"] = sums["layer_median_sum"][:, 0]
        return cls.from_sums(
            read.layers,
            sums,
            threshold=threshold,
            n_sequences=n_all,
            median=median,
            min_magnitude=min_magnitude,
            provenance=read.provenance,
        )

    @property
    def layer_ratio(self) -> Float[torch.Tensor, " layer"]:
        """Sun et al.'s layer-wise ratio: ``layer_top[:, 0] / layer_median``, the mean largest
        |x| over the mean median |x| (their ``main_llm.py --exp2`` figure, as a ratio)."""
        if self.layer_top is None or self.layer_median is None:  # saved before they existed
            return torch.full((len(self.layers),), math.nan, dtype=torch.float64, device="cpu")
        return self.layer_top[:, 0] / self.layer_median

    def top_dims(self, k: int = 3) -> pd.DataFrame:
        """Per layer, the ``k`` dimensions that most often hold a massive activation."""
        import pandas as pd

        from homoglens.validate import as_int

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
                "layer": torch.tensor(self.layers, device="cpu").repeat_interleave(n_pos).numpy(),
                "pos": torch.arange(n_pos, device="cpu").repeat(n_layer).numpy(),
                "ratio_mean": self.ratio_mean.flatten().numpy(),
                "ratio_max": self.ratio_max.flatten().numpy(),
                "top_value": self.top_value.flatten().numpy(),
            }
        )

    @overload
    def plot(self, *, backend: Literal["matplotlib"] = "matplotlib") -> Figure: ...
    @overload
    def plot(self, *, backend: Literal["plotly"]) -> PlotlyFigure: ...
    def plot(self, *, backend: PlotBackend = "matplotlib") -> Figure | PlotlyFigure:
        """Heatmap of log10 of the mean max/median ratio per (layer, position).

        Args:
            backend: ``"matplotlib"`` (the default: a static figure for files) or ``"plotly"``
                (interactive: hover values with units, zoom, legend toggles; needs
                ``pip install "homoglens[plotly]"``).

        Returns:
            A matplotlib ``Figure`` (displays inline in Jupyter), or with ``backend="plotly"`` a
            ``plotly.graph_objects.Figure``.

        Raises:
            InvalidInputError: ``backend`` is neither ``"matplotlib"`` nor ``"plotly"``.
            MissingDependencyError: ``backend="plotly"`` without plotly installed.
        """
        from homoglens.results.figures import massive_figure

        return massive_figure(self, backend=backend)

    def __repr__(self) -> str:
        return (
            f"MassiveActivations(model={self.provenance.model!r}, layers={len(self.layers)}, "
            f"median={self.median!r}, max_ratio={float(self.ratio_max.nan_to_num().max()):.1f}, "
            f"n_sequences={self.n_sequences})"
        )


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
    _bounds: ClassVar[dict[str, Bounds]] = {
        "heads": NON_NEGATIVE,
        "layer": NON_NEGATIVE,
        "key": NON_NEGATIVE,
        "edge_k": Bounds(1.0),
        "n_sequences": Bounds(1.0),
        "base": Bounds(-2.0, 2.0, tol=1e-4),  # a cosine, or an edge excess of cosines
        "delta": Bounds(-4.0, 4.0, nan=True, tol=1e-4),  # NaN: a metric not attributed
        "joint_delta": Bounds(-4.0, 4.0, nan=True, tol=1e-4),
        "base_to_others": COSINE_OR_NAN,  # NaN: no sequence reaches the position
        "delta_to_others": Bounds(-2.0, 2.0, nan=True, tol=1e-4),
        "joint_delta_to_others": Bounds(-2.0, 2.0, nan=True, tol=1e-4),
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

    def _check_values(self) -> None:
        """Run on load: the fast method has no per-position or joint values; a joint change
        comes with its per-position curve; a metric not attributed is NaN for every head (and
        jointly); the per-position values are NaN exactly at the positions no sequence reaches,
        the last ones."""
        if self.method == "fast" and (
            self.delta_to_others is not None or self.joint_delta is not None
        ):
            raise FieldError(
                "method", "method='fast' has no delta_to_others nor joint_delta (exact only)"
            )
        if (self.joint_delta is None) != (self.joint_delta_to_others is None):
            raise FieldError("joint_delta", "joint_delta and joint_delta_to_others come together")
        if not bool(torch.isfinite(self.base[0])) or abs(float(self.base[0])) > 1 + 1e-4:
            raise FieldError("base", f"base mean_pairwise={float(self.base[0])!r} must be a cosine")
        nan = torch.isnan(self.delta)
        if not torch.equal(nan.all(0), nan.any(0)):
            raise FieldError(
                "delta", "delta is NaN for some heads only: a metric is attributed to every head "
                "or to none"
            )  # fmt: skip
        if self.joint_delta is not None and not torch.equal(
            torch.isnan(self.joint_delta), nan.all(0)
        ):
            raise FieldError(
                "joint_delta",
                "joint_delta is NaN where delta is not, or not NaN "
                "where it is (a metric not attributed)",
            )
        unreached = torch.isnan(self.base_to_others)  # no sequence reaches the position
        if bool((unreached[:-1] & ~unreached[1:]).any()):
            raise FieldError(
                "base_to_others",
                "base_to_others is NaN at a position that a "
                "later counted position follows (NaN: no sequence reaches it)",
            )
        for name in ("delta_to_others", "joint_delta_to_others"):
            values = getattr(self, name)
            if values is not None and bool((torch.isnan(values) != unreached).any()):
                raise FieldError(
                    name,
                    f"{name} is NaN at other positions than base_to_others "
                    "(NaN: no sequence reaches the position)",
                )

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
        out = torch.full((n_layer, n_head), float("nan"), dtype=torch.float64, device="cpu")
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
        pair = torch.tensor(
            [[mine[h], theirs[h]] for h in shared], dtype=torch.float64, device="cpu"
        ).T
        if rank:
            pair = pair.argsort(dim=1).argsort(dim=1).double()
        return float(torch.corrcoef(pair)[0, 1])

    @overload
    def plot(
        self, metric: str = "mean_pairwise", *, backend: Literal["matplotlib"] = "matplotlib"
    ) -> Figure: ...
    @overload
    def plot(
        self, metric: str = "mean_pairwise", *, backend: Literal["plotly"]
    ) -> PlotlyFigure: ...
    def plot(
        self, metric: str = "mean_pairwise", *, backend: PlotBackend = "matplotlib"
    ) -> Figure | PlotlyFigure:
        """Per-head change of ``metric`` (a ``[layer head]`` heatmap, or bars for a few heads)
        and, in exact mode, the change of ``to_others`` per position.

        Args:
            metric: One of :data:`~homoglens.types.ATTRIBUTION_METRICS`.
            backend: ``"matplotlib"`` (the default: a static figure for files) or ``"plotly"``
                (interactive: hover values with units, zoom, legend toggles; needs
                ``pip install "homoglens[plotly]"``).

        Returns:
            A matplotlib ``Figure`` (displays inline in Jupyter), or with ``backend="plotly"`` a
            ``plotly.graph_objects.Figure``.

        Raises:
            InvalidInputError: ``backend`` is neither ``"matplotlib"`` nor ``"plotly"``, or
                ``metric`` not measured.
            MissingDependencyError: ``backend="plotly"`` without plotly installed.
        """
        from homoglens.results.figures import attribution_figure

        return attribution_figure(self, metric, self._metric(metric), backend=backend)

    def __repr__(self) -> str:
        shown = [m for j, m in enumerate(ATTRIBUTION_METRICS) if not self.delta[:, j].isnan().all()]
        j = ATTRIBUTION_METRICS.index(shown[0]) if shown else 0
        return (
            f"SinkAttribution(model={self.provenance.model!r}, method={self.method}, "
            f"ablation={self.ablation}, heads={len(self.heads)}, layer={self.layer}, "
            f"largest |delta {ATTRIBUTION_METRICS[j]}|="
            f"{float(self.delta[:, j].abs().nan_to_num().max()):.4f})"
        )


_PARTS = ("scores", "massive", "fast", "exact")
_ANALYSIS = "homoglens.SinkAnalysis/1"
_ANALYSIS_PARTS = ("scores/sink_scores.json", "massive/massive.json", "fast/attribution.json",
                   "exact/attribution.json")  # fmt: skip
"""The part JSONs that ``analysis.json`` must record (each part's own ``_stem``)."""


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
        """Save each part in a subfolder (``scores``, ``massive``, ``fast``, ``exact``) and,
        last, ``analysis.json`` (the sha256 of each part's JSON), atomically: a save that fails
        or is interrupted leaves an older analysis in ``path`` loadable and unchanged, or
        refused on load, never a mix of the two.

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created."""
        return save_folder(path, self._write_into, own=(*_PARTS, "analysis.json"),
                           manifest="analysis.json")  # fmt: skip

    def _write_into(self, folder: Path) -> None:
        parts = []
        for name in _PARTS:
            part = getattr(self, name)
            (folder / name).mkdir()
            part._write_into(folder / name)
            parts.append(f"{name}/{part._stem}.json")
        hashes = {rel: sha256_of((folder / rel).read_bytes()) for rel in parts}
        write_json(folder / "analysis.json", {"format": _ANALYSIS, HASHES: hashes})

    @classmethod
    def load(cls, path: str | Path) -> SinkAnalysis:
        """Load what :meth:`save` wrote (``analysis.json`` and its four parts).

        Raises:
            ResultsNotFoundError: a part is missing. IncompatibleResultsError: a bad file, a
                part that does not match the sha256 recorded in ``analysis.json`` (saved
                incompletely or edited), or parts that do not belong together."""
        folder = Path(path).expanduser()
        meta = read_json(folder, "analysis.json", parts=_ANALYSIS_PARTS)
        if not isinstance(meta, dict) or meta.get("format") != _ANALYSIS:
            raise IncompatibleResultsError(f"{folder} does not hold a {_ANALYSIS} result")
        result = cls(
            scores=SinkScores.load(folder / "scores"),
            massive=MassiveActivations.load(folder / "massive"),
            fast=SinkAttribution.load(folder / "fast"),
            exact=SinkAttribution.load(folder / "exact"),
        )
        problem = result._mismatch()
        if problem:
            raise IncompatibleResultsError(
                f"{folder} holds parts that do not belong together: {problem}; save the "
                "analysis again"
            )
        return result

    def _mismatch(self) -> str:
        """Why the four parts are not one analysis ("" when they are)."""
        if (self.fast.method, self.exact.method) != ("fast", "exact"):
            return f"fast/ holds method={self.fast.method!r}, exact/ {self.exact.method!r}"
        if self.scores.n_sequences != self.massive.n_sequences:
            return (f"scores/ read {self.scores.n_sequences} sequences, massive/ "
                    f"{self.massive.n_sequences}")  # fmt: skip
        if self.fast.n_sequences != self.exact.n_sequences:
            return f"fast/ read {self.fast.n_sequences} sequences, exact/ {self.exact.n_sequences}"
        models = {p.provenance.model for p in (self.scores, self.massive, self.fast, self.exact)}
        if len(models) > 1:
            return f"the parts come from different models {sorted(models)}"
        return ""

    def __repr__(self) -> str:
        return f"SinkAnalysis({self.scores!r}, exact top heads={list(self.exact.heads)})"


@dataclass(frozen=True, eq=False)
class AttentionReceived(SavedResult):
    """Homogenization by attention received: how much attention each key position gets, and
    whether later tokens move toward it in proportion.

    For block l with pattern A (mean over heads) and residual entries l (its input) and l + 1
    (its output), for query q > k: the attention a[q, k] = mean_h A[h, q, k] and the attractor
    shift s[q, k] = cos(x^{l+1}_q, x^l_k) - cos(x^l_q, x^l_k) (does token q move toward token
    k's vector across the block). Pads never count.

    Attributes:
        blocks: Blocks measured.
        received: ``[block pos]`` mean over windows and later queries q > k of a[q, k] (the
            attention key position k receives).
        shift: ``[block pos]`` mean over the same of s[q, k] (cosine units).
        weighted_shift: ``[block pos]`` sum a s / sum a over the same (the shift where the
            attention goes).
        slope: ``[block]`` least-squares slope of s on a over every pair q > k (cosine per unit
            of attention): > 0 when tokens move toward the keys they attend, in proportion.
        correlation: ``[block]`` Pearson correlation of a and s over those pairs.
        n_pairs: ``[block]`` pairs counted.
        n_sequences: Windows.
        provenance: Model, backend, weights, BOS, data.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (C2, attention reading); Gu et al. 2024,
        arXiv 2410.10781 (sinks); Wu et al. 2024, arXiv 2405.18781 (attention as a broadcast of
        the first token).
    """

    _stem: ClassVar[str] = "received"
    _bounds: ClassVar[dict[str, Bounds]] = {
        "blocks": NON_NEGATIVE,
        "n_sequences": Bounds(1.0),
        "received": UNIT_OR_NAN,  # NaN: no later query (the last position)
        "shift": Bounds(-2.0, 2.0, nan=True, tol=1e-4),  # a difference of two cosines
        "weighted_shift": Bounds(-2.0, 2.0, nan=True, tol=1e-4),
        "slope": FINITE_OR_NAN,  # NaN: the attention does not vary
        "correlation": COSINE_OR_NAN,
    }

    blocks: tuple[int, ...]
    received: Float[torch.Tensor, "block pos"]
    shift: Float[torch.Tensor, "block pos"]
    weighted_shift: Float[torch.Tensor, "block pos"]
    slope: Float[torch.Tensor, " block"]
    correlation: Float[torch.Tensor, " block"]
    n_pairs: Float[torch.Tensor, " block"]
    n_sequences: int
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        n_b = len(self.blocks)
        for name in ("received", "shift", "weighted_shift"):
            got = getattr(self, name)
            if got.ndim != 2 or got.shape[0] != n_b:
                raise ValueError(f"{name} has shape {tuple(got.shape)}, expected [{n_b} pos]")
        for name in ("slope", "correlation", "n_pairs"):
            if tuple(getattr(self, name).shape) != (n_b,):
                raise ValueError(f"{name} must be [{n_b}]")

    def _check_values(self) -> None:
        """Run on load: every block counts the same pairs q > k of real tokens, at most
        ``n_sequences * T (T - 1) / 2``; ``received`` and ``shift`` are NaN at the same key
        positions (those no later query reaches)."""
        n_pos = int(self.received.shape[-1])
        most = self.n_sequences * n_pos * (n_pos - 1) / 2
        if bool((self.n_pairs != self.n_pairs[0]).any()) or float(self.n_pairs.max()) > most:
            raise FieldError(
                "n_pairs",
                f"n_pairs={self.n_pairs.tolist()} must be the same in every block and at most "
                f"{most:g} ({self.n_sequences} windows of {n_pos} positions)",
            )
        if not torch.equal(torch.isnan(self.received), torch.isnan(self.shift)):
            raise FieldError("received", "received and shift are NaN at different positions")

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per (block, key position) with ``received, shift, weighted_shift``,
        and the block's ``slope`` and ``correlation``."""
        import pandas as pd

        n_b, n_pos = self.received.shape
        return pd.DataFrame(
            {
                "block": torch.tensor(self.blocks, device="cpu").repeat_interleave(n_pos).numpy(),
                "key_pos": torch.arange(n_pos, device="cpu").repeat(n_b).numpy(),
                "received": self.received.flatten().numpy(),
                "shift": self.shift.flatten().numpy(),
                "weighted_shift": self.weighted_shift.flatten().numpy(),
                "slope": self.slope.repeat_interleave(n_pos).numpy(),
                "correlation": self.correlation.repeat_interleave(n_pos).numpy(),
            }
        )

    @overload
    def plot(self, *, backend: Literal["matplotlib"] = "matplotlib") -> Figure: ...
    @overload
    def plot(self, *, backend: Literal["plotly"]) -> PlotlyFigure: ...
    def plot(self, *, backend: PlotBackend = "matplotlib") -> Figure | PlotlyFigure:
        """Attention received and attractor shift per key position (a few blocks), and the
        slope of shift on attention per block.

        Args:
            backend: ``"matplotlib"`` (the default: a static figure for files) or ``"plotly"``
                (interactive: hover values with units, zoom, legend toggles; needs
                ``pip install "homoglens[plotly]"``).

        Returns:
            A matplotlib ``Figure`` (displays inline in Jupyter), or with ``backend="plotly"`` a
            ``plotly.graph_objects.Figure``.

        Raises:
            InvalidInputError: ``backend`` is neither ``"matplotlib"`` nor ``"plotly"``.
            MissingDependencyError: ``backend="plotly"`` without plotly installed.
        """
        from homoglens.results.figures import received_figure

        return received_figure(self, backend=backend)

    def __repr__(self) -> str:
        return (
            f"AttentionReceived(model={self.provenance.model!r}, blocks={len(self.blocks)}, "
            f"n_sequences={self.n_sequences})"
        )
