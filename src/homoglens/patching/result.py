"""The result of :func:`~homoglens.positional_patching`: normalised patching effects per
layer and cell, with the normal and ablated baselines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, overload

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import PATCH_COMPONENTS, POSITION_ABLATIONS
from homoglens.results import Provenance, SavedResult
from homoglens.results.base import Plotted
from homoglens.results.validation import NON_NEGATIVE, Bounds, FieldError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from plotly.graph_objects import Figure as PlotlyFigure

    from homoglens.core.types import PlotBackend


def rounding_tolerance(dtype: str) -> float:
    """Relative difference below which two metrics of a model in ``dtype`` (a name such as
    ``"bfloat16"``; ``""`` or unknown: float32) are the same up to rounding: max(1e-6,
    2 * machine epsilon)."""
    kind = getattr(torch, dtype, None) if dtype else None
    eps = torch.finfo(kind).eps if isinstance(kind, torch.dtype) and kind.is_floating_point else 0.0
    return max(1e-6, 2.0 * eps)


@dataclass(frozen=True, eq=False)
class PositionalPatchingResult(SavedResult, Plotted):
    """Metric values of every patched cell, with the two unpatched runs.

    Attributes:
        component: One of :data:`PATCH_COMPONENTS`.
        how: The positional ablation of the ablated run.
        direction: ``"restore"`` (ablated run receives normal activations) or ``"break"``.
        metrics: Metric names (built-in or a callable's ``__name__``).
        metric_layer: Residual entry the homogenization metrics are measured at.
        layers: Blocks patched, one row each.
        cells: Position bins ``(start, stop)`` (or ``(head, head + 1)`` for ``head``).
        cell_axis: ``"pos"`` or ``"head_index"``.
        patched: ``[metric layer cell]`` metric of the patched run.
        normal: ``[metric]`` metric of the unablated run.
        ablated: ``[metric]`` metric of the position-ablated run.
        n_sequences: Number of sequences.
        forward_equivalents: Compute spent, in full forward passes over the data (counting the
            blocks each pass ran).
        batching: How cells were batched and where passes started and stopped.
        provenance: Model, backend, weights, BOS, data.

    References:
        Heimersheim & Nanda 2024, arXiv 2404.15255; Zhang & Nanda 2024, arXiv 2309.16042.
    """

    _stem: ClassVar[str] = "patching"
    _figure: ClassVar[str] = "patching.figure.patching_figure"
    _choices: ClassVar[dict[str, tuple[str, ...]]] = {
        "component": PATCH_COMPONENTS,
        "how": POSITION_ABLATIONS,
        "direction": ("restore", "break"),
        "cell_axis": ("pos", "head_index"),
    }
    _bounds: ClassVar[dict[str, Bounds]] = {
        "metric_layer": NON_NEGATIVE,
        "layers": NON_NEGATIVE,
        "cells": NON_NEGATIVE,
        "n_sequences": Bounds(1.0),
        "forward_equivalents": NON_NEGATIVE,
        # patched / normal / ablated: finite (every metric returns a finite scalar)
    }

    component: str
    how: str
    direction: str
    metrics: tuple[str, ...]
    metric_layer: int
    layers: tuple[int, ...]
    cells: tuple[tuple[int, int], ...]
    cell_axis: str
    patched: Float[torch.Tensor, "metric layer cell"]
    normal: Float[torch.Tensor, " metric"]
    ablated: Float[torch.Tensor, " metric"]
    n_sequences: int
    forward_equivalents: float
    batching: str
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        shape = (len(self.metrics), len(self.layers), len(self.cells))
        if tuple(self.patched.shape) != shape:
            raise ValueError(f"patched has shape {tuple(self.patched.shape)}, expected {shape}")

    def _check_values(self) -> None:
        """Run on load: cells are ``(start, stop)`` with start < stop (one head each on the
        head axis); the built-in metrics in their ranges (loss >= 0 nats, the mean pairwise
        cosine in [-1, 1], edge excesses in [-2, 2])."""
        for start, stop in self.cells:
            if not start < stop or (self.cell_axis == "head_index" and stop != start + 1):
                raise FieldError("cells", f"cell {(start, stop)} is not a (start, stop) bin")
        ranges = {"loss": (0.0, math.inf), "mean_pairwise": (-1.0, 1.0)}
        for m, name in enumerate(self.metrics):
            low, high = ranges.get(
                name, (-2.0, 2.0) if name.endswith("_excess") else (-math.inf, math.inf)
            )
            for field_name in ("patched", "normal", "ablated"):
                values = getattr(self, field_name)[m].double()
                if bool(((values < low - 1e-4) | (values > high + 1e-4)).any()):
                    raise FieldError(
                        field_name,
                        f"{field_name} of metric {name!r} reaches "
                        f"{float(values.abs().max()):.6g}, outside [{low:g}, {high:g}]",
                    )

    @property
    def receiving(self) -> Float[torch.Tensor, " metric"]:
        """Metric of the run that receives the patches (ablated for restore)."""
        return self.ablated if self.direction == "restore" else self.normal

    @property
    def source(self) -> Float[torch.Tensor, " metric"]:
        """Metric of the run the patched activations come from."""
        return self.normal if self.direction == "restore" else self.ablated

    @property
    def effect(self) -> Float[torch.Tensor, "metric layer cell"]:
        """(patched - receiving) / (source - receiving): 0 = no change, 1 = the source run's
        value; NaN where source and receiving agree within the rounding of the model's dtype:
        ``|gap| <= tol * max(|source|, |receiving|, 1)`` with ``tol`` = max(1e-6, 2 * eps of
        ``provenance.dtype``) (float32: 1e-6, ~8 eps; bfloat16: 0.0156; float16: 0.00195).
        A smaller gap is rounding noise (bfloat16 passes of a rotary model under a global shift,
        which changes nothing, differ by ~1e-4), and dividing by it turns noise into arbitrary
        effects."""
        gap = (self.source - self.receiving)[:, None, None]
        scale = torch.maximum(self.source.abs(), self.receiving.abs())[:, None, None]
        out = (self.patched - self.receiving[:, None, None]) / gap
        tol = rounding_tolerance(self.provenance.dtype)
        return torch.where(
            gap.abs() > tol * scale.clamp_min(1.0), out, torch.full_like(out, math.nan)
        )

    def _metric(self, metric: str | None) -> int:
        if metric is None:
            return 0
        if metric not in self.metrics:
            raise InvalidInputError(f"metric={metric!r} is not one of {self.metrics}")
        return self.metrics.index(metric)

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per (metric, layer, cell) with ``patched`` and ``effect``."""
        import pandas as pd

        rows = []
        effect = self.effect
        for m, name in enumerate(self.metrics):
            for i, layer in enumerate(self.layers):
                for j, (start, stop) in enumerate(self.cells):
                    rows.append(
                        {
                            "metric": name,
                            "layer": layer,
                            self.cell_axis: start if self.cell_axis == "head_index" else None,
                            "pos_start": start if self.cell_axis == "pos" else None,
                            "pos_stop": stop if self.cell_axis == "pos" else None,
                            "patched": float(self.patched[m, i, j]),
                            "effect": float(effect[m, i, j]),
                        }
                    )
        frame = pd.DataFrame(rows)
        drop = ["pos_start", "pos_stop"] if self.cell_axis == "head_index" else ["pos"]
        return frame.drop(columns=[c for c in drop if c in frame])

    @overload
    def plot(
        self, metric: str | None = None, *, backend: Literal["matplotlib"] = "matplotlib"
    ) -> Figure: ...
    @overload
    def plot(self, metric: str | None = None, *, backend: Literal["plotly"]) -> PlotlyFigure: ...
    def plot(
        self, metric: str | None = None, *, backend: PlotBackend = "matplotlib"
    ) -> Figure | PlotlyFigure:
        """Heatmap of the normalised effect, layer x cell (one metric; default the first), or a
        curve over blocks when there is one cell per block.

        Args:
            metric: One of :attr:`metrics` (default: the first).
            backend: As in :meth:`homoglens.results.base.Plotted.plot`, which says what is
                returned and raised.

        Raises:
            InvalidInputError: ``metric`` not measured.
        """
        return self._draw(self._metric(metric), backend=backend)

    def __repr__(self) -> str:
        return (
            f"PositionalPatchingResult(model={self.provenance.model!r}, {self.direction} "
            f"{self.component}, how={self.how}, metrics={list(self.metrics)}, "
            f"layers={len(self.layers)}, cells={len(self.cells)}, n_sequences={self.n_sequences}, "
            f"forward_equivalents={self.forward_equivalents:.1f})"
        )
