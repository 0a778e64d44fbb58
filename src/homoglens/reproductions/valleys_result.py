"""``CompressionValleys``: the first token's norm spike, the matrix-entropy valley and the sink
rate per layer, with the first token's massive activations ablated (Queipo-de-Llano et al.
2025, arXiv 2510.06477), and its figure (:func:`valleys_figure`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
from jaxtyping import Float

from homoglens.results.base import Plotted, SavedResult, keyword_repr
from homoglens.results.figure_parts import (
    LAYER_AXIS,
    AnyFigure,
    figure_kit,
    headline,
    sink_rate_label,
)
from homoglens.results.provenance import Provenance
from homoglens.results.validation import (
    FINITE_OR_NAN,
    NON_NEGATIVE,
    UNIT,
    Bounds,
    FieldError,
)

if TYPE_CHECKING:
    import pandas as pd

HEADLINES: tuple[str, ...] = ("depth", "recovery")
"""Rows of :attr:`CompressionValleys.headline`: H[peak] - H[valley] and H_ablated[valley] -
H[valley] (normalised entropy, per window)."""


def valley_entries(
    mean: Float[torch.Tensor, " layer"], layers: tuple[int, ...], n_layers: int
) -> tuple[int, int | None]:
    """Indices into ``layers`` of the valley v (lowest ``mean`` entropy among the middle entries
    1..n_layers - 1, or among all when none is measured; the first on ties) and of the peak u
    before it (highest mean entropy at an earlier entry; ``None`` when v is the first)."""
    middle = [i for i, e in enumerate(layers) if 0 < e < n_layers] or list(range(len(layers)))
    v = min(middle, key=lambda i: (float(mean[i]), i))
    u = max(range(v), key=lambda i: (float(mean[i]), -i)) if v > 0 else None
    return v, u


_ABLATED = ("ablated_first_norm", "ablated_median_norm", "ablated_entropy", "ablated_sink_rate")


@dataclass(frozen=True, eq=False)
class CompressionValleys(SavedResult, Plotted):
    """The first token's norm spike, the compression valley and the attention sinks, aligned by
    layer, and the valley with the first token's massive activations set to zero.

    ``plot()`` redraws the paper's figure 1 for one model on one layer axis: the first token's
    norm over the median norm of the others (log axis), the normalised matrix entropy (intact
    and ablated) and the sink rate of each block (block l reads entry l), intact and ablated.

    Attributes:
        layers: Residual entries read (0 = embeddings, l = output of block l - 1).
        eps: Gu et al.'s threshold of the sink rate, in (0, 1).
        first_norm: ``[batch layer]`` ||x_0|| of each window (model units).
        median_norm: ``[batch layer]`` the lower median of ||x_p|| over the window's other
            real tokens p >= 1 (model units).
        entropy: ``[batch layer]`` the window's matrix entropy: the Shannon entropy of
            sigma_i^2 / sum sigma_j^2 (singular values of the raw, uncentred ``[T d_model]``
            token matrix) over log min(T, d_model), in [0, 1].
        sink_rate: ``[batch block]`` fraction of the block's heads whose Gu et al. importance
            on key 0 exceeds ``eps``, in [0, 1].
        ablated_first_norm: ``[batch layer]`` ``first_norm`` with the ablation (``None``
            without it); likewise ``ablated_median_norm``, ``ablated_entropy``,
            ``ablated_sink_rate``.
        ablation_layer: The entry whose first-token dims were zeroed (-1: no ablation); the
            entries before it are unchanged.
        ablation_dims: The residual dimensions zeroed at position 0.
        ablation_sites: ``"none"``, ``"given"``, or found by Sun et al.'s rule.
        valley_layer: The entry of lowest mean entropy among the middle entries measured.
        peak_layer: The entry of highest mean entropy before ``valley_layer``.
        headline: ``[2 3]``: rows :data:`HEADLINES` (depth, recovery), columns (value, low,
            high): mean over windows and its block-bootstrap interval; NaN where undefined.
        n_boot: Bootstrap resamples; ``ci``: coverage; ``seed``: bootstrap seed.
        provenance: Model, data, versions.

    References:
        Queipo-de-Llano et al. 2025, arXiv 2510.06477; Gu et al. 2024, arXiv 2410.10781;
        Sun et al. 2024, arXiv 2402.17762; Skean et al. 2025, arXiv 2502.02013.
    """

    _stem: ClassVar[str] = "valleys"
    _figure: ClassVar[str] = "reproductions.valleys_result.valleys_figure"
    _bounds: ClassVar[dict[str, Bounds]] = {
        **dict.fromkeys(
            ("first_norm", "median_norm", "ablated_first_norm", "ablated_median_norm"),
            NON_NEGATIVE,
        ),
        "entropy": UNIT,
        "ablated_entropy": UNIT,
        "sink_rate": UNIT,
        "ablated_sink_rate": UNIT,
        "headline": FINITE_OR_NAN,
    }

    layers: tuple[int, ...]
    eps: float
    first_norm: Float[torch.Tensor, "batch layer"]
    median_norm: Float[torch.Tensor, "batch layer"]
    entropy: Float[torch.Tensor, "batch layer"]
    sink_rate: Float[torch.Tensor, "batch block"]
    ablated_first_norm: Float[torch.Tensor, "batch layer"] | None
    ablated_median_norm: Float[torch.Tensor, "batch layer"] | None
    ablated_entropy: Float[torch.Tensor, "batch layer"] | None
    ablated_sink_rate: Float[torch.Tensor, "batch block"] | None
    ablation_layer: int
    ablation_dims: tuple[int, ...]
    ablation_sites: str
    valley_layer: int
    peak_layer: int
    headline: Float[torch.Tensor, "2 3"]
    n_boot: int
    ci: float
    seed: int
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        n, n_l = int(self.first_norm.shape[0]), len(self.layers)
        if not self.layers or list(self.layers) != sorted(set(self.layers)):
            raise FieldError("layers", f"layers={list(self.layers)} must be distinct, ascending")
        if not 0.0 < self.eps < 1.0 or not 0.0 < self.ci < 1.0:
            raise FieldError("eps", f"eps={self.eps} and ci={self.ci} must lie in (0, 1)")
        n_blocks = int(self.sink_rate.shape[-1])
        for name in ("first_norm", "median_norm", "entropy", *_ABLATED, "sink_rate"):
            value = getattr(self, name)
            want = (n, n_blocks if name.endswith("sink_rate") else n_l)
            if value is not None and tuple(value.shape) != want:
                raise FieldError(name, f"{name} has shape {tuple(value.shape)}, expected {want}")
        missing = [name for name in _ABLATED if getattr(self, name) is None]
        if missing not in ([], list(_ABLATED)) or (not missing) != (self.ablation_layer >= 1):
            raise FieldError(
                "ablation_layer", "the ablated fields come all together, with an ablation_layer"
            )
        if tuple(self.headline.shape) != (2, 3):
            raise FieldError("headline", f"headline has shape {tuple(self.headline.shape)}")
        for name in ("valley_layer", "peak_layer"):
            if getattr(self, name) not in self.layers:
                raise FieldError(name, f"{name}={getattr(self, name)} is not in layers")
        if max(self.layers) > n_blocks or list(self.ablation_dims) != sorted(
            set(self.ablation_dims)
        ):
            raise FieldError("layers", "an entry beyond the blocks, or unsorted ablation_dims")

    def _check_values(self) -> None:
        """Run on load: ``valley_layer`` / ``peak_layer`` are where the entropy says; the
        headline values are the means over windows they summarise, inside their intervals."""
        n_blocks = int(self.sink_rate.shape[-1])
        v, u = valley_entries(self.entropy.double().mean(0), self.layers, n_blocks)
        if (
            self.valley_layer != self.layers[v]
            or self.peak_layer != self.layers[v if u is None else u]
        ):
            raise FieldError("valley_layer", "valley_layer / peak_layer are not the entropy's")
        diffs = [
            None if u is None else self.entropy[:, u] - self.entropy[:, v],
            None
            if self.ablated_entropy is None
            else self.ablated_entropy[:, v] - self.entropy[:, v],
        ]
        for row, diff in zip(self.headline.double(), diffs, strict=True):
            value, low, high = (float(x) for x in row)
            if diff is None:
                if not torch.isnan(row).all():
                    raise FieldError("headline", "headline holds a value with nothing to measure")
                continue
            if abs(value - float(diff.double().mean())) > 1e-9 or low > value or value > high:
                raise FieldError("headline", "headline is not the mean over windows it names")

    @property
    def ablated(self) -> bool:
        """Whether the ablated pass ran."""
        return self.ablated_entropy is not None

    @property
    def norm_ratio(self) -> Float[torch.Tensor, "batch layer"]:
        """``[batch layer]`` first_norm / median_norm of each window."""
        return self.first_norm / self.median_norm

    def to_pandas(self) -> pd.DataFrame:
        """One row per residual entry: the means over windows of ``first_norm``,
        ``median_norm``, ``norm_ratio`` (of each window's ratio), ``entropy``, ``sink_rate``
        (of block ``layer``, the block that reads the entry; NaN for the last entry) and the
        ablated twins (NaN without the ablation)."""
        import pandas as pd

        nan = torch.full((len(self.layers),), float("nan"), dtype=torch.float64)

        def block_mean(rates: torch.Tensor | None) -> torch.Tensor:
            if rates is None:
                return nan
            n_blocks = int(rates.shape[-1])
            return torch.tensor(
                [float(rates[:, e].mean()) if e < n_blocks else float("nan") for e in self.layers],
                dtype=torch.float64,
            )

        def mean(t: torch.Tensor | None) -> torch.Tensor:
            return nan if t is None else t.double().nanmean(0)

        ratio = None
        if self.ablated_first_norm is not None and self.ablated_median_norm is not None:
            ratio = self.ablated_first_norm / self.ablated_median_norm
        columns = {
            "layer": list(self.layers),
            "first_norm": mean(self.first_norm).tolist(),
            "median_norm": mean(self.median_norm).tolist(),
            "norm_ratio": mean(self.norm_ratio).tolist(),
            "entropy": mean(self.entropy).tolist(),
            "sink_rate": block_mean(self.sink_rate).tolist(),
            "ablated_norm_ratio": mean(ratio).tolist(),
            "ablated_entropy": mean(self.ablated_entropy).tolist(),
            "ablated_sink_rate": block_mean(self.ablated_sink_rate).tolist(),
        }
        return pd.DataFrame(columns)

    def headline_table(self) -> pd.DataFrame:
        """The headline numbers: ``depth`` (H[peak_layer] - H[valley_layer]) and ``recovery``
        (H_ablated - H at ``valley_layer``), with their intervals (unit: windows)."""
        import pandas as pd

        rows = [
            {"statistic": name, "value": float(row[0]), "low": float(row[1]),
             "high": float(row[2])}
            for name, row in zip(HEADLINES, self.headline, strict=True)
        ]  # fmt: skip
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        depth, recovery = (float(v) for v in self.headline[:, 0])
        return keyword_repr(
            "CompressionValleys",
            model=repr(self.provenance.model),
            windows=int(self.first_norm.shape[0]),
            entries=len(self.layers),
            valley_layer=self.valley_layer,
            depth=f"{depth:.3g}",
            recovery=f"{recovery:.3g}",
            ablation_layer=self.ablation_layer,
            ablation_dims=list(self.ablation_dims),
        )


def valleys_figure(cv: CompressionValleys, *, backend: str = "matplotlib") -> AnyFigure:
    """Three panels on one layer axis: the first token's norm ratio (log), the normalised
    matrix entropy (intact and ablated) and the sink rate per block (intact and ablated)."""
    kit = figure_kit(backend)
    table = cv.to_pandas()
    fig, (left, middle, right) = kit.new_figure(14, 4, ncols=3)
    x = table["layer"].to_numpy()
    with_ablation = cv.ablated
    ablated = f"first-token dims zeroed at {cv.ablation_layer}"
    styles = {"intact": "o-", ablated: "s--"}

    def series(name: str) -> dict[str, object]:
        out: dict[str, object] = {"intact": table[name].to_numpy()}
        if with_ablation:
            out[ablated] = table[f"ablated_{name}"].to_numpy()
        return out

    kit.curves(
        left, x, series("norm_ratio"), styles=styles, xlabel=LAYER_AXIS,
        ylabel="||x_0|| / median_p ||x_p||", title="first-token norm spike",
    )  # fmt: skip
    kit.log_scale(left, "y")
    kit.curves(
        middle, x, series("entropy"), styles=styles, xlabel=LAYER_AXIS,
        ylabel="matrix entropy / log min(T, d_model)",
        title=f"compression valley (lowest: entry {cv.valley_layer})",
    )  # fmt: skip
    kit.curves(
        right, x, series("sink_rate"), styles=styles, xlabel=LAYER_AXIS,
        ylabel=f"{sink_rate_label(0, cv.eps)} (fraction of heads)",
        title="attention sinks (block l reads entry l)",
    )  # fmt: skip
    depth, low, high = (float(v) for v in cv.headline[1 if with_ablation else 0])
    what = "the ablation raises the entropy" if with_ablation else "the valley's depth"
    default = (
        f"Compression valley and sinks: at entry {cv.valley_layer} {what} by {depth:.3f} "
        f"[{low:.3f}, {high:.3f}] (mean over windows, {cv.ci:.0%} interval)"
    )
    headline(kit, fig, None, default, matplotlib=True, provenance=cv.provenance)
    return fig
