"""The result of the one-token perturbation spread (Barbero et al. 2025, "Why do LLMs attend
to the first token?", arXiv 2504.02732): ``PerturbationSpread`` and its figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import PERTURBATIONS
from homoglens.results import Provenance, SavedResult
from homoglens.results.base import Plotted
from homoglens.results.figure_parts import LAYER_AXIS, AnyFigure, figure_kit, headline
from homoglens.results.validation import (
    NON_NEGATIVE,
    UNIT,
    UNIT_OR_NAN,
    Bounds,
    FieldError,
)

if TYPE_CHECKING:
    import pandas as pd

    from homoglens.core.stats import Estimate

__all__ = ["PerturbationSpread", "perturbation_figure"]


@dataclass(frozen=True, eq=False)
class PerturbationSpread(SavedResult, Plotted):
    """How far a one-token perturbation spreads through the residual stream (Barbero et al.
    2025): per layer and per distance from the perturbed token, the relative change
    ``||h'_{l,p} - h_{l,p}|| / ||h_{l,p}||`` of the residual stream between a clean pass and a
    pass with one token perturbed (the same window otherwise).

    ``plot()`` draws the spread by layer (mean change over the positions after the perturbed
    token, with its interval) and the change by distance from the perturbed token (one curve
    per layer).

    Attributes:
        layers: Entries of the ``n_layers + 1`` residual axis (0 = embeddings).
        position: The perturbed token, counted among the window's tokens after its BOS (0 = the
            first token of the text), so BOS on and off perturb the same token.
        how: ``"replace"`` (the token replaced by another id) or ``"noise"`` (Gaussian noise
            added to the token's block-0 input).
        scale: The noise's norm relative to the token's block-0 input (``how="noise"``); 0 for
            ``"replace"``.
        threshold: Relative change above which a later position counts as reached.
        change: ``[layer distance]`` mean over windows of the relative change at distance d
            after the perturbed token (d = 0: the token itself); NaN where no window reaches d.
        window_spread: ``[window layer]`` each window's mean relative change over the positions
            after the perturbed token (d >= 1): the unit of the intervals.
        window_reach: ``[window layer]`` each window's fraction of those positions whose change
            exceeds ``threshold``.
        spread: ``[layer]`` mean over windows of ``window_spread``.
        spread_low: ``[layer]`` lower end of the block-bootstrap interval of ``spread``
            (windows; NaN with too few windows).
        spread_high: ``[layer]`` its upper end.
        before_max: ``[layer]`` the largest relative change at a position before the perturbed
            token over every window (0 in a causal model).
        n_sequences: Windows.
        provenance: Model, backend, weights, BOS, data.

    References:
        Barbero et al. 2025, "Why do LLMs attend to the first token?", arXiv 2504.02732.
    """

    _stem: ClassVar[str] = "perturbation"
    _figure: ClassVar[str] = "reproductions.perturbation_result.perturbation_figure"
    _choices: ClassVar[dict[str, tuple[str, ...]]] = {"how": PERTURBATIONS}
    _ranges: ClassVar[dict[str, tuple[float, float]]] = {
        "scale": (-1e-300, math.inf),  # >= 0
        "threshold": (0.0, math.inf),
    }
    _bounds: ClassVar[dict[str, Bounds]] = {
        "n_sequences": Bounds(1.0),
        "position": Bounds(0.0),
        "change": Bounds(0.0, nan=True),
        "window_spread": Bounds(0.0, nan=True),
        "window_reach": UNIT_OR_NAN,
        "spread": Bounds(0.0, nan=True),
        "spread_low": Bounds(nan=True),
        "spread_high": Bounds(nan=True),
        "before_max": NON_NEGATIVE,
        "reach": UNIT,
    }

    layers: tuple[int, ...]
    position: int
    how: str
    scale: float
    threshold: float
    change: Float[torch.Tensor, "layer distance"]
    window_spread: Float[torch.Tensor, "window layer"]
    window_reach: Float[torch.Tensor, "window layer"]
    spread: Float[torch.Tensor, " layer"]
    spread_low: Float[torch.Tensor, " layer"]
    spread_high: Float[torch.Tensor, " layer"]
    before_max: Float[torch.Tensor, " layer"]
    n_sequences: int
    provenance: Provenance = field(default_factory=Provenance)

    def _check_values(self) -> None:
        """Run on load: one row per layer in every per-layer field, one per window in the
        per-window fields; ``spread`` is the mean of ``window_spread``."""
        n_layer = len(self.layers)
        for name in ("change", "spread", "spread_low", "spread_high", "before_max"):
            if int(getattr(self, name).shape[0]) != n_layer:
                raise FieldError(name, f"{name} must have one row per layer ({n_layer})")
        for name in ("window_spread", "window_reach"):
            if tuple(getattr(self, name).shape) != (self.n_sequences, n_layer):
                raise FieldError(
                    name, f"{name} must be [window layer] = [{self.n_sequences} {n_layer}]"
                )
        mean = self.window_spread.double().nanmean(0)
        if not torch.allclose(mean, self.spread.double(), rtol=1e-6, atol=1e-9, equal_nan=True):
            raise FieldError("spread", "spread is not the mean over windows of window_spread")

    @property
    def reach(self) -> Float[torch.Tensor, " layer"]:
        """``[layer]`` mean over windows of the fraction of later positions whose relative
        change exceeds ``threshold``; in [0, 1]."""
        return self.window_reach.double().nanmean(0).nan_to_num(0.0)

    def difference(
        self, other: PerturbationSpread, *, ci: float = 0.95, seed: int = 0
    ) -> pd.DataFrame:
        """The paired per-layer difference ``self.spread - other.spread`` over the same
        windows (e.g. BOS on minus BOS off), each with its block-bootstrap interval over
        windows (:func:`homoglens.core.stats.estimate` of the per-window differences).

        Args:
            other: The same measurement on the same windows (same count, layers, position,
                perturbation), under another condition.
            ci: Coverage of the intervals, in (0, 1).
            seed: Seed of the bootstrap resamples.

        Returns:
            One row per layer: ``layer, value, ci_low, ci_high, p, n_windows``.

        Raises:
            InvalidInputError: ``other`` is not a ``PerturbationSpread`` of the same design.
        """
        import pandas as pd

        estimates = self._paired(other, ci=ci, seed=seed)
        return pd.DataFrame(
            [
                {
                    "layer": layer,
                    "value": e.value,
                    "ci_low": e.ci_low,
                    "ci_high": e.ci_high,
                    "p": e.p,
                    "n_windows": e.n_windows,
                }
                for layer, e in zip(self.layers, estimates, strict=True)
            ]
        )

    def _paired(self, other: PerturbationSpread, *, ci: float, seed: int) -> list[Estimate]:
        """Per layer, the :class:`~homoglens.core.stats.Estimate` of the paired difference."""
        from homoglens.core.stats import estimate

        if not isinstance(other, PerturbationSpread):
            raise InvalidInputError(
                f"other must be a PerturbationSpread, not {type(other).__name__}"
            )
        mine = (self.n_sequences, self.layers, self.position, self.how, self.scale)
        theirs = (other.n_sequences, other.layers, other.position, other.how, other.scale)
        if mine != theirs:
            raise InvalidInputError(
                "a paired difference needs the same windows, layers, position and perturbation: "
                f"(n_sequences, layers, position, how, scale) = {mine} here and {theirs} in "
                "other; measure both on the same windows (only bos= may differ)"
            )
        diff = self.window_spread.double() - other.window_spread.double()
        return [estimate([diff[:, i][None]], ci=ci, seed=seed) for i in range(len(self.layers))]

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per (layer, distance) with ``change``, and the layer's ``spread``,
        ``spread_low``, ``spread_high`` and ``reach``."""
        import pandas as pd

        n_dist = int(self.change.shape[1])
        rows = []
        reach = self.reach
        for i, layer in enumerate(self.layers):
            for d in range(n_dist):
                rows.append(
                    {
                        "layer": layer,
                        "distance": d,
                        "change": float(self.change[i, d]),
                        "spread": float(self.spread[i]),
                        "spread_low": float(self.spread_low[i]),
                        "spread_high": float(self.spread_high[i]),
                        "reach": float(reach[i]),
                    }
                )
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return (
            f"PerturbationSpread(model={self.provenance.model!r}, how={self.how!r}, "
            f"position={self.position}, layers={len(self.layers)}, "
            f"last_spread={float(self.spread[-1]):.4g}, bos={self.provenance.bos}, "
            f"n_sequences={self.n_sequences})"
        )


def perturbation_figure(
    result: PerturbationSpread, *, backend: str = "matplotlib", **_: Any
) -> AnyFigure:
    """Two panels: the spread by layer (mean relative change after the perturbed token, with
    its block-bootstrap interval over windows) and the change by distance from the perturbed
    token (the first, a middle and the last layer read)."""
    kit = figure_kit(backend)
    fig, (left, right) = kit.new_figure(12, 4.2, ncols=2)
    layers = torch.tensor(result.layers, dtype=torch.float64, device="cpu")
    bos = {True: "BOS", False: "no BOS", None: "mixed BOS"}[result.provenance.bos]
    kit.curves(
        left,
        layers.numpy(),
        {bos: result.spread.numpy()},
        bands={bos: (result.spread_low.numpy(), result.spread_high.numpy())},
        xlabel=LAYER_AXIS,
        ylabel="mean ||h' - h|| / ||h|| after the token",
        title="spread by layer",
    )
    picks = dict.fromkeys([0, len(result.layers) // 2, len(result.layers) - 1])
    n_dist = int(result.change.shape[1])
    distance = torch.arange(n_dist, dtype=torch.float64, device="cpu").numpy()
    kit.curves(
        right,
        distance,
        {f"layer {result.layers[i]}": result.change[i].numpy() for i in picks},
        xlabel="distance from the perturbed token (positions)",
        ylabel="mean ||h' - h|| / ||h||",
        title="change by distance",
    )
    what = f"one-token perturbation ({result.how}) at position {result.position}, {bos}"
    headline(kit, fig, None, what, matplotlib=True, provenance=result.provenance)
    return fig
