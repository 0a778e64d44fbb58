"""``SinkEmergence``: Gu et al.'s sink rate over the training steps of one run and against the
weight decay of otherwise identical runs (Gu et al. 2024, arXiv 2410.10781), with its figure
(:func:`sink_emergence_figure`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.results.base import SavedResult, TitledPlotted
from homoglens.results.figure_parts import figure_kit, headline, sink_rate_label
from homoglens.results.provenance import Provenance
from homoglens.results.validation import FINITE_OR_NAN, NON_NEGATIVE, UNIT, Bounds, FieldError

if TYPE_CHECKING:
    import pandas as pd

    from homoglens.core.stats import Estimate

METRICS: tuple[str, ...] = ("sink_rate", "importance")
"""The two readings of :class:`SinkEmergence`: ``sink_rate`` (percent of (window, layer,
head) with alpha > eps) and ``importance`` (mean alpha over windows, layers and heads, in
[0, 1])."""


@dataclass(frozen=True, eq=False)
class SinkEmergence(SavedResult, TitledPlotted):
    """Gu et al.'s sink rate Sink_1^eps (percent of (window, layer, head) whose importance
    alpha on key 0, the mean attention of queries key..T-1 on it, exceeds ``eps``) over the
    training checkpoints of one run and over runs that differ only in their weight decay, with
    block-bootstrap intervals over windows (one training seed per run: no between-seed
    interval).

    ``plot()`` redraws Gu et al.'s two figures, each for the sink rate and for the mean
    importance: against the training step (symmetric-log x axis, so step 0 shows; linear on
    the plotly side), all layers with its interval and each block dashed (the importance with
    its strongest head and ``eps``); and against the weight decay (bars with intervals).

    Attributes:
        key: The sink key (0-indexed; 0 is Gu et al.'s Sink_1).
        eps: The importance threshold (Gu et al.: 0.3), in (0, 1).
        ci: Coverage of the intervals, in (0, 1).
        checkpoints: Label of each checkpoint of the run (``step<N>``), in training order.
        steps: ``[checkpoint]`` optimiser steps of each checkpoint (NaN where unknown).
        step_alpha: ``[checkpoint window layer head]`` Gu et al.'s importance alpha of each
            window, block and head, in [0, 1].
        step_interval: ``[checkpoint metric 2]`` interval (low, high) of each of
            :data:`METRICS` (percent; a fraction): block bootstrap over windows, Student's t;
            NaN where the windows show no spread, ``[0, 0]`` where every window's value is 0.
        runs: Label of each weight-decay run (``wd<value>``), by ascending weight decay.
        weight_decays: ``[run]`` AdamW weight decay of each run, ascending.
        run_steps: ``[run]`` optimiser steps of each run's weights.
        decay_alpha: ``[run window layer head]`` as ``step_alpha``.
        decay_interval: ``[run metric 2]`` as ``step_interval``.
        provenance: Of the first checkpoint's measurement; ``model_source`` lists every
            checkpoint and run.

    References:
        Gu et al. 2024, "When Attention Sink Emerges in Language Models: An Empirical View",
        arXiv 2410.10781 (sinks emerge after effective optimisation; more weight decay, more
        sinks).
    """

    _stem: ClassVar[str] = "sink_emergence"
    _figure: ClassVar[str] = "reproductions.sink_emergence_result.sink_emergence_figure"
    _ranges: ClassVar[dict[str, tuple[float, float]]] = {"eps": (0.0, 1.0), "ci": (0.0, 1.0)}
    _bounds: ClassVar[dict[str, Bounds]] = {
        **dict.fromkeys(("step_alpha", "decay_alpha"), UNIT),
        **dict.fromkeys(("step_interval", "decay_interval"), FINITE_OR_NAN),
        "steps": Bounds(0.0, nan=True),  # NaN where unknown
        **dict.fromkeys(("weight_decays", "run_steps"), NON_NEGATIVE),
    }

    key: int
    eps: float
    ci: float
    checkpoints: tuple[str, ...]
    steps: Float[torch.Tensor, " checkpoint"]
    step_alpha: Float[torch.Tensor, "checkpoint window layer head_index"]
    step_interval: Float[torch.Tensor, "checkpoint metric 2"]
    runs: tuple[str, ...]
    weight_decays: Float[torch.Tensor, " run"]
    run_steps: Float[torch.Tensor, " run"]
    decay_alpha: Float[torch.Tensor, "run window layer head_index"]
    decay_interval: Float[torch.Tensor, "run metric 2"]
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        n_c, n_r = len(self.checkpoints), len(self.runs)
        if self.step_alpha.ndim != 4 or self.decay_alpha.ndim != 4:
            raise ValueError("step_alpha and decay_alpha must be [model window layer head]")
        inner = tuple(self.step_alpha.shape[1:])
        want = {
            "steps": (n_c,),
            "step_alpha": (n_c, *inner),
            "step_interval": (n_c, len(METRICS), 2),
            "weight_decays": (n_r,),
            "run_steps": (n_r,),
            "decay_alpha": (n_r, *inner),
            "decay_interval": (n_r, len(METRICS), 2),
        }
        for name, shape in want.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"{name} has shape {got}, expected {shape}")
        if len(set(self.checkpoints)) != n_c or len(set(self.runs)) != n_r:
            raise ValueError(f"labels repeat: {list(self.checkpoints)}, {list(self.runs)}")

    def _check_values(self) -> None:
        """Run on load: steps in training order, weight decays ascending."""
        known = self.steps[~torch.isnan(self.steps)]
        if bool((known[1:] < known[:-1]).any()):
            raise FieldError("steps", f"steps={self.steps.tolist()} must be in training order")
        if bool((self.weight_decays[1:] < self.weight_decays[:-1]).any()):
            raise FieldError(
                "weight_decays", f"weight_decays={self.weight_decays.tolist()} must ascend"
            )

    @property
    def n_windows(self) -> int:
        """Windows read (the same windows for every checkpoint and run)."""
        return int(self.step_alpha.shape[1])

    def window_values(
        self, metric: str = "sink_rate", *, sweep: str = "step"
    ) -> Float[torch.Tensor, "model window"]:
        """Each window's value of one of :data:`METRICS` (the values the intervals resample):
        ``sink_rate`` in percent over the window's layers and heads, ``importance`` its mean
        alpha.

        Args:
            metric: ``"sink_rate"`` or ``"importance"``.
            sweep: ``"step"`` (the checkpoints) or ``"weight_decay"`` (the runs).

        Raises:
            InvalidInputError: an unknown metric or sweep.
        """
        alpha = self._alpha(sweep)
        if metric == "sink_rate":
            return (alpha > self.eps).double().mean((2, 3)) * 100
        if metric == "importance":
            return alpha.double().mean((2, 3))
        raise InvalidInputError(f"metric={metric!r} must be one of {list(METRICS)}")

    def _alpha(self, sweep: str) -> torch.Tensor:
        if sweep not in ("step", "weight_decay"):
            raise InvalidInputError(f"sweep={sweep!r} must be 'step' or 'weight_decay'")
        return self.step_alpha if sweep == "step" else self.decay_alpha

    def by_layer(self, *, sweep: str = "step") -> Float[torch.Tensor, "model layer"]:
        """``[model layer]`` the sink rate of each block's heads (percent)."""
        return (self._alpha(sweep) > self.eps).double().mean((1, 3)) * 100

    def top_importance(self, *, sweep: str = "step") -> Float[torch.Tensor, " model"]:
        """``[model]`` the largest mean alpha of one head (mean over windows), in [0, 1]: how
        close the strongest head comes to ``eps``."""
        return self._alpha(sweep).double().mean(1).flatten(1).amax(1)

    @property
    def step_rate(self) -> Float[torch.Tensor, " checkpoint"]:
        """``[checkpoint]`` the sink rate (percent over windows, layers and heads)."""
        return self.window_values("sink_rate").mean(1)

    @property
    def decay_rate(self) -> Float[torch.Tensor, " run"]:
        """``[run]`` the sink rate of each weight-decay run (percent)."""
        return self.window_values("sink_rate", sweep="weight_decay").mean(1)

    def difference(
        self,
        high: float,
        low: float,
        *,
        metric: str = "sink_rate",
        n_boot: int = 1000,
        seed: int = 0,
    ) -> Estimate:
        """The paired difference ``high - low`` between two weight-decay runs of one of
        :data:`METRICS` (percentage points; importance), with a block-bootstrap interval over
        the shared windows at :attr:`ci` coverage.

        Args:
            high: Weight decay of the first run (one of :attr:`weight_decays`).
            low: Weight decay of the run subtracted.
            metric: ``"sink_rate"`` or ``"importance"``.
            n_boot: Bootstrap resamples.
            seed: Seed of the resamples.

        Returns:
            A :class:`homoglens.core.stats.Estimate` (``value``, ``ci_low``, ``ci_high``, ``p``).

        Raises:
            InvalidInputError: a weight decay this result has no run of, an unknown metric.
        """
        from homoglens.core.stats import estimate

        def row(value: float) -> int:
            found = [i for i, w in enumerate(self.weight_decays.tolist()) if w == value]
            if not found:
                raise InvalidInputError(
                    f"weight decay {value!r} is not among the runs "
                    f"{self.weight_decays.tolist()}; pick one of them"
                )
            return found[0]

        values = self.window_values(metric, sweep="weight_decay")
        paired = values[row(high)] - values[row(low)]
        return estimate([paired[None]], n_boot=n_boot, ci=self.ci, seed=seed)

    def to_pandas(self) -> pd.DataFrame:
        """Tidy rows: ``sweep`` (``"step"`` or ``"weight_decay"``), ``label``, ``step``,
        ``weight_decay``, ``metric`` (``sink_rate`` percent, ``importance``), ``value``,
        ``low``, ``high`` (the interval over windows)."""
        import pandas as pd

        rows: list[tuple[Any, ...]] = []
        for sweep, labels, interval in (
            ("step", self.checkpoints, self.step_interval),
            ("weight_decay", self.runs, self.decay_interval),
        ):
            steps = self.steps if sweep == "step" else self.run_steps
            for m, metric in enumerate(METRICS):
                values = self.window_values(metric, sweep=sweep).mean(1)
                for i, label in enumerate(labels):
                    wd = float(self.weight_decays[i]) if sweep == "weight_decay" else math.nan
                    rows.append((sweep, label, float(steps[i]), wd, metric, float(values[i]),
                                 float(interval[i, m, 0]), float(interval[i, m, 1])))  # fmt: skip
        columns = ["sweep", "label", "step", "weight_decay", "metric", "value", "low", "high"]
        return pd.DataFrame(rows, columns=columns)

    def __repr__(self) -> str:
        steps = ", ".join(
            f"{s:g}: {r:.1f}%"
            for s, r in zip(self.steps.tolist(), self.step_rate.tolist(), strict=True)
        )
        decays = ", ".join(
            f"wd {w:g}: {r:.1f}%"
            for w, r in zip(self.weight_decays.tolist(), self.decay_rate.tolist(), strict=True)
        )
        return (
            f"SinkEmergence({self.provenance.model!r}, {sink_rate_label(self.key, self.eps)}, "
            f"{self.n_windows} windows; by step {{{steps}}}; by weight decay {{{decays}}})"
        )


def _ends(
    low: torch.Tensor, high: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """An interval to draw around ``values``: a NaN end (undefined) becomes the value itself (a
    zero-width interval, never a made-up one), and the interval holds the value."""
    low = torch.where(torch.isnan(low), values, low)
    high = torch.where(torch.isnan(high), values, high)
    return torch.minimum(low, values), torch.maximum(high, values)


def sink_emergence_figure(
    result: SinkEmergence, *, title: str | None = None, backend: str = "matplotlib"
) -> Any:
    """Gu et al.'s figures, for the sink rate and the mean importance: against the training
    step (all layers with its interval, each block dashed / the strongest head and ``eps``;
    symmetric-log x on matplotlib, linear on plotly, which has no symmetric-log axis), and
    against the weight decay (bars with intervals)."""
    kit = figure_kit(backend)
    n_panels = 2 + (2 if result.runs else 0)
    fig, axes = kit.new_figure(3.9 * n_panels, 3.6, ncols=n_panels)
    rate_label = sink_rate_label(result.key, result.eps) + ", %"
    rate, importance = result.step_rate, result.window_values("importance").mean(1)
    series = {"all blocks": rate}
    styles = {"all blocks": "o-"}
    for layer, values in enumerate(result.by_layer().T):
        series[f"block {layer}"], styles[f"block {layer}"] = values, "--"
    bands = {
        "all blocks": _ends(result.step_interval[:, 0, 0], result.step_interval[:, 0, 1], rate)
    }
    kit.curves(axes[0], result.steps, series, bands=bands, styles=styles, xlabel="training step",
               ylabel=rate_label, legend="x-small", ms=3)  # fmt: skip
    band = _ends(result.step_interval[:, 1, 0], result.step_interval[:, 1, 1], importance)
    top = result.top_importance()
    kit.curves(
        axes[1], result.steps, {"mean alpha": importance, "strongest head": top},
        bands={"mean alpha": band},
        styles={"mean alpha": "o-", "strongest head": "s--"}, xlabel="training step",
        ylabel="importance alpha on key 0", hlines=[result.eps], legend="x-small", ms=3,
    )  # fmt: skip
    positive = result.steps[result.steps > 0]  # NaN compares False
    for ax in axes[:2]:
        if len(positive):
            kit.log_scale(ax, "x", linthresh=max(float(positive.min()), 1.0))
    kit.panel_title(axes[0], "sink rate over training", fontsize=9)
    kit.panel_title(axes[1], f"importance over training (grey: eps = {result.eps:g})", fontsize=9)
    if result.runs:
        labels = [f"wd {w:g}" for w in result.weight_decays.tolist()]
        steps = "/".join(str(s) for s in sorted({int(s) for s in result.run_steps.tolist()}))
        for m, (ax, ylabel) in enumerate(
            zip(axes[2:], (rate_label, "mean importance alpha"), strict=True)
        ):
            values = result.window_values(METRICS[m], sweep="weight_decay").mean(1)
            low, high = _ends(
                result.decay_interval[:, m, 0], result.decay_interval[:, m, 1], values
            )
            kit.bars(ax, labels, values, low=low, high=high, ylabel=ylabel)
            kit.panel_title(ax, f"{METRICS[m]} against weight decay ({steps} steps)", fontsize=9)
    default = (
        f"{result.provenance.model}: when attention sinks emerge "
        f"({result.n_windows} windows, {result.ci:.0%} CI over windows)"
    )
    headline(kit, fig, title, default, matplotlib=True, provenance=result.provenance)
    return fig
