"""``CheckpointSweep``: one measurement repeated over a model's training checkpoints."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.results.base import SavedResult, TitledPlotted
from homoglens.results.provenance import Provenance
from homoglens.results.validation import FINITE_OR_NAN, NON_NEGATIVE, Bounds, FieldError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, eq=False)
class CheckpointSweep(SavedResult, TitledPlotted):
    """Measurements of the same windows at each training checkpoint of one model.

    ``plot()`` draws each scalar metric against the training step (symmetric-log axis when
    step 0 is included; linear on the plotly side, which has none), and the first per-entry
    metric as a heatmap (residual entry x checkpoint); its default title names the model and
    the number of checkpoints.

    Attributes:
        checkpoints: Label of each checkpoint, in training order (a folder name such as
            ``step100``, a Hub revision, or ``index=<i>`` for a TransformerLens checkpoint index).
        steps: ``[checkpoint]`` training step of each checkpoint (optimiser steps; NaN where
            unknown).
        metrics: Names of the scalar measurements (e.g. ``sink_rate`` in percent,
            ``homogenization_adjusted`` at the last residual entry; see
            :func:`homoglens.over_checkpoints`).
        values: ``[checkpoint metric]`` the scalar measurements.
        layer_metrics: Names of the measurements per residual entry.
        layers: Residual-stream entries of ``layer_values`` (0 = ``blocks.0.hook_resid_pre``,
            l >= 1 = ``blocks.{l-1}.hook_resid_post``).
        layer_values: ``[checkpoint layer_metric layer]`` the per-entry measurements.
        provenance: Of the first checkpoint's measurement; the data is the same windows for
            every checkpoint, and ``model_source`` lists the checkpoints.

    References:
        Gu et al. 2024, arXiv 2410.10781 (when attention sinks emerge in training);
        Biderman et al. 2023, arXiv 2304.01373 (Pythia's training checkpoints).
    """

    _stem: ClassVar[str] = "checkpoint_sweep"
    _figure: ClassVar[str] = "training.figure.sweep_figure"
    _bounds: ClassVar[dict[str, Bounds]] = {
        "steps": Bounds(0.0, nan=True),  # NaN where unknown
        "values": FINITE_OR_NAN,  # NaN: a measurement undefined at a checkpoint
        "layer_values": FINITE_OR_NAN,
        "layers": NON_NEGATIVE,
    }

    checkpoints: tuple[str, ...]
    steps: Float[torch.Tensor, " checkpoint"]
    metrics: tuple[str, ...]
    values: Float[torch.Tensor, "checkpoint metric"]
    layer_metrics: tuple[str, ...]
    layers: tuple[int, ...]
    layer_values: Float[torch.Tensor, "checkpoint layer_metric layer"]
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        n = len(self.checkpoints)
        want = {
            "steps": (n,),
            "values": (n, len(self.metrics)),
            "layer_values": (n, len(self.layer_metrics), len(self.layers)),
        }
        for name, shape in want.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"{name} has shape {got}, expected {shape}")
        if len(set(self.checkpoints)) != n:
            raise ValueError(f"checkpoints={list(self.checkpoints)} repeats a label")

    def _check_values(self) -> None:
        """Run on load: the known steps are whole numbers in training order."""
        known = self.steps[~torch.isnan(self.steps)].double()
        if not bool((known == known.round()).all()) or bool((known[1:] < known[:-1]).any()):
            raise FieldError(
                "steps", f"steps={self.steps.tolist()} must be whole numbers in training order"
            )

    def to_pandas(self) -> pd.DataFrame:
        """Tidy rows: ``checkpoint, step, metric, layer, value`` (``layer`` is missing, <NA>,
        for the scalar metrics)."""
        import pandas as pd

        rows = []
        for c, label in enumerate(self.checkpoints):
            step = float(self.steps[c])
            for m, name in enumerate(self.metrics):
                rows.append((label, step, name, None, float(self.values[c, m])))
            for m, name in enumerate(self.layer_metrics):
                for j, layer in enumerate(self.layers):
                    rows.append((label, step, name, layer, float(self.layer_values[c, m, j])))
        frame = pd.DataFrame(rows, columns=["checkpoint", "step", "metric", "layer", "value"])
        frame["layer"] = frame["layer"].astype("Int64")
        return frame

    def metric(self, name: str) -> Float[torch.Tensor, " checkpoint"]:
        """``[checkpoint]`` one scalar metric over the checkpoints.

        Raises:
            InvalidInputError: not one of :attr:`metrics`.
        """
        if name not in self.metrics:
            raise InvalidInputError(f"metric {name!r} is not in this sweep: {list(self.metrics)}")
        return self.values[:, self.metrics.index(name)]

    def __repr__(self) -> str:
        steps = [("?" if math.isnan(s) else str(int(s))) for s in self.steps.tolist()]
        return (
            f"CheckpointSweep({self.provenance.model!r}, {len(self.checkpoints)} checkpoints "
            f"(steps {', '.join(steps)}), metrics={list(self.metrics)}, "
            f"layer_metrics={list(self.layer_metrics)})"
        )
