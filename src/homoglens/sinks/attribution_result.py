"""The result of sink attribution, how homogenization at one residual entry changes when
attention heads lose their sink: ``SinkAttribution``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args, overload

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import ATTRIBUTION_METRICS, AttributionMethod, HeadAblation
from homoglens.results import Provenance, SavedResult
from homoglens.results.base import Plotted
from homoglens.results.validation import COSINE_OR_NAN, NON_NEGATIVE, Bounds, FieldError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from plotly.graph_objects import Figure as PlotlyFigure

    from homoglens.core.types import PlotBackend


@dataclass(frozen=True, eq=False)
class SinkAttribution(SavedResult, Plotted):
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
    _figure: ClassVar[str] = "sinks.figure.attribution_figure"
    _choices: ClassVar[dict[str, tuple[str, ...]]] = {
        "method": get_args(AttributionMethod),
        "ablation": get_args(HeadAblation),
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
            metric: One of :data:`~homoglens.core.types.ATTRIBUTION_METRICS`.
            backend: As in :meth:`homoglens.results.base.Plotted.plot`, which says what is
                returned and raised.

        Raises:
            InvalidInputError: ``metric`` not measured.
        """
        return self._draw(metric, self._metric(metric), backend=backend)

    def __repr__(self) -> str:
        shown = [m for j, m in enumerate(ATTRIBUTION_METRICS) if not self.delta[:, j].isnan().all()]
        j = ATTRIBUTION_METRICS.index(shown[0]) if shown else 0
        return (
            f"SinkAttribution(model={self.provenance.model!r}, method={self.method}, "
            f"ablation={self.ablation}, heads={len(self.heads)}, layer={self.layer}, "
            f"largest |delta {ATTRIBUTION_METRICS[j]}|="
            f"{float(self.delta[:, j].abs().nan_to_num().max()):.4f})"
        )
