"""The result of the massive-activation measurement of the residual stream (Sun et al.
2024): ``MassiveActivations``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import MASSIVE_MEDIANS, MassiveMedian
from homoglens.profile.homogenization import nan_div
from homoglens.results import Provenance, SavedResult
from homoglens.results.base import Plotted
from homoglens.results.cache import cached_residuals
from homoglens.results.validation import NON_NEGATIVE, Bounds, FieldError
from homoglens.sinks.maths import massive_sums

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from plotly.graph_objects import Figure as PlotlyFigure

    from homoglens.core.types import PlotBackend


@dataclass(frozen=True, eq=False)
class MassiveActivations(SavedResult, Plotted):
    """Massive-activation statistics of the residual stream (Sun et al. 2024).

    ``plot()`` draws a heatmap of log10 of the mean max/median ratio per (layer, position);
    ``plot(kind="layers")`` Sun et al.'s Fig. 2: the mean top 1-3 |x| and median |x| of the
    hidden state by layer, log y (:meth:`layer_table` holds its numbers).

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
    _figure: ClassVar[str] = "sinks.figure.massive_plot"
    _ranges: ClassVar[dict[str, tuple[float, float]]] = {
        "threshold": (1.0, math.inf),
        "min_magnitude": (-1e-300, math.inf),
    }
    _choices: ClassVar[dict[str, tuple[str, ...]]] = {"median": MASSIVE_MEDIANS}
    _bounds: ClassVar[dict[str, Bounds]] = {
        "n_sequences": Bounds(1.0),
        # NaN: no real token at the position
        **dict.fromkeys(("ratio_mean", "ratio_max", "top_value"), Bounds(0.0, nan=True)),
        **dict.fromkeys(("layer_top", "layer_median"), NON_NEGATIVE),
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
        """The result of accumulated :func:`~homoglens.sinks.maths.massive_sums` (one row
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
        from homoglens.core.validate import as_float, positive_int

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

    @overload
    def plot(
        self, kind: str = "positions", *, backend: Literal["matplotlib"] = "matplotlib"
    ) -> Figure: ...
    @overload
    def plot(self, kind: str = "positions", *, backend: Literal["plotly"]) -> PlotlyFigure: ...
    def plot(
        self, kind: str = "positions", *, backend: PlotBackend = "matplotlib"
    ) -> Figure | PlotlyFigure:
        """Draw one of this result's figures.

        Args:
            kind: ``"positions"`` (default): heatmap of log10 of the mean max/median ratio per
                (layer, position), position 0 in a panel of its own; ``"layers"``: Sun et al.'s
                Fig. 2 (arXiv 2402.17762), the mean over sequences of the 1st, 2nd and 3rd
                largest |x| of the hidden state and of its median |x|, by layer, log y (model
                units).
            backend: As in :meth:`Plotted.plot`, which says what is returned and raised.

        Raises:
            InvalidInputError: an unknown ``kind`` (or ``backend``); ``kind="layers"`` on a
                result saved before ``layer_top`` existed.
        """
        return self._draw(kind, backend=backend)

    def layer_table(self) -> pd.DataFrame:
        """Sun et al.'s layer-wise numbers (their Fig. 2), one row per layer entry: ``top1``,
        ``top2``, ``top3`` (mean over sequences of the largest |x| of the hidden state, model
        units), ``median`` (mean of its median |x|) and ``ratio`` = top1 / median.

        Raises:
            InvalidInputError: a result saved before ``layer_top`` existed.
        """
        import pandas as pd

        if self.layer_top is None or self.layer_median is None:
            raise InvalidInputError(
                "this MassiveActivations has no layer_top / layer_median (saved before they "
                "existed): measure again with massive_activations(...)"
            )
        top = self.layer_top.double()
        frame: dict[str, Any] = {"layer": list(self.layers)}
        frame.update({f"top{k + 1}": top[:, k].numpy() for k in range(top.shape[1])})
        frame.update(median=self.layer_median.double().numpy(), ratio=self.layer_ratio.numpy())
        return pd.DataFrame(frame)

    def top_dims(self, k: int = 3) -> pd.DataFrame:
        """Per layer, the ``k`` dimensions that most often hold a massive activation."""
        import pandas as pd

        from homoglens.core.validate import as_int

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
        grids = {
            "ratio_mean": self.ratio_mean,
            "ratio_max": self.ratio_max,
            "top_value": self.top_value,
        }
        return grid_frame(("layer", torch.tensor(self.layers, device="cpu")), "pos", grids)

    def __repr__(self) -> str:
        return (
            f"MassiveActivations(model={self.provenance.model!r}, layers={len(self.layers)}, "
            f"median={self.median!r}, max_ratio={float(self.ratio_max.nan_to_num().max()):.1f}, "
            f"n_sequences={self.n_sequences})"
        )


def grid_frame(
    rows: tuple[str, torch.Tensor], column: str, grids: dict[str, torch.Tensor]
) -> pd.DataFrame:
    """Tidy rows of ``[row column]`` grids of one shape, one per cell in row-major order: the
    row's label from ``rows = (name, [row] labels)``, the column index ``0..n-1`` named
    ``column``, then each grid's value.

    Args:
        rows: The row column's name and its ``[row]`` labels (e.g. the layers).
        column: The name of the column index (e.g. ``"pos"``, ``"head"``).
        grids: ``{name: [row column] values}``, each a column of the frame.

    Returns:
        The frame, ``n_row * n_column`` rows.
    """
    import pandas as pd

    name, labels = rows
    n_row, n_column = next(iter(grids.values())).shape
    return pd.DataFrame(
        {
            name: labels.repeat_interleave(n_column).numpy(),
            column: torch.arange(n_column, device="cpu").repeat(n_row).numpy(),
            **{key: grid.flatten().numpy() for key, grid in grids.items()},
        }
    )
