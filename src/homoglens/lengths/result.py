"""``LengthStudy``: position-resolved similarity and attention over nested prefixes of one set
of long windows (where an end-of-sequence effect of a causal model can show)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.stats import estimate
from homoglens.results.base import LayerPlotted, SavedResult, entry_index
from homoglens.results.provenance import Provenance
from homoglens.results.validation import (
    COSINE_OR_NAN,
    NON_NEGATIVE,
    UNIT,
    UNIT_OR_NAN,
    Bounds,
    FieldError,
)
from homoglens.similarity.maths import SIMILARITY_STATISTICS

if TYPE_CHECKING:
    import pandas as pd


PREFIX_CURVES: tuple[str, ...] = ("lag", "to_first", "sp", "attention_entropy", "first_key_mass")
"""Curves over the absolute position p of :meth:`LengthStudy.curve`."""


@dataclass(frozen=True, eq=False)
class LengthStudy(SavedResult, LayerPlotted):
    """Similarity and attention over positions p, and edge statistics per sequence length T,
    read from one forward pass of windows of the longest length (a causal model's vectors at
    p < T do not depend on what follows, so every shorter length is a prefix).

    ``plot(layer)`` draws the lag-controlled similarity and SP over p (entry ``layer``), the
    last block's normalised attention entropy and key-0 mass over p, and H_W / the matched
    edges by T.

    Stored fields (float64):
        lengths: Lengths T, ascending; the windows held ``max(lengths)`` tokens.
        lags: Lags delta of ``lag_similarity``.
        layers: Residual entries read (0 = embeddings, l = output of block l - 1).
        n_blocks: Blocks whose attention was read.
        edge_k: Positions per edge of the edge statistics.
        first_position: 0, or 1 when position 0 (a BOS) was left out of the similarity.
        n_sequences: Windows.
        lag_similarity: ``[layer lag pos]`` M[p, p - delta] (mean cosine of the vectors at p
            and p - delta within a window; NaN where p - delta is not counted).
        to_first: ``[layer pos]`` M[p, first counted position].
        sp: ``[layer pos]`` same-position cross-input similarity C[p, p].
        attention_entropy: ``[n_blocks pos]`` entropy of query p's attention row over its p + 1
            keys divided by log(p + 1) (1: uniform; NaN at p = 0), mean over heads and windows.
        first_key_mass: ``[n_blocks pos]`` attention of query p on key 0, mean over heads and
            windows.
        statistics: ``[length layer stat]`` each of
            :data:`~homoglens.similarity.maths.SIMILARITY_STATISTICS` on the first T positions.
        window_statistics: ``[length batch layer stat]`` per-window values whose mean is
            ``statistics``: jackknife pseudo-values for the statistics that subtract ``C`` when
            ``pseudo_values``, else ``C`` held fixed
            (:meth:`~homoglens.PositionalSimilarity.per_window`).
        pseudo_values: Whether the second pass ran (results saved before it existed load
            with False).
        provenance: :class:`~homoglens.results.Provenance`.

    References:
        Yusupov et al. 2025, arXiv 2508.17126; Barbero et al. 2024, arXiv 2406.04267 (SP);
        Hsieh et al. 2024, arXiv 2406.16008 (U-shaped attention); docs/bias.md, "Over
        sequence length"; docs/similarity.md.
    """

    _stem: ClassVar[str] = "lengths"
    _figure: ClassVar[str] = "lengths.figure.length_figure"
    _layer_axis: ClassVar[bool] = True
    _bounds: ClassVar[dict[str, Bounds]] = {
        "lengths": Bounds(2.0),
        "lags": Bounds(1.0),
        "layers": NON_NEGATIVE,
        "n_blocks": Bounds(1.0),
        "edge_k": Bounds(1.0),
        "lag_similarity": COSINE_OR_NAN,  # NaN where p - lag is not counted
        "to_first": COSINE_OR_NAN,  # NaN before the first counted position
        "sp": COSINE_OR_NAN,
        "attention_entropy": UNIT_OR_NAN,  # NaN at p = 0 (one key)
        "first_key_mass": UNIT,
        "statistics": Bounds(-2.0, 2.0, tol=1e-4),  # differences of means of cosines
    }

    lengths: tuple[int, ...]
    lags: tuple[int, ...]
    layers: tuple[int, ...]
    n_blocks: int
    edge_k: int
    first_position: int
    n_sequences: int
    lag_similarity: Float[torch.Tensor, "layer lag pos"]
    to_first: Float[torch.Tensor, "layer pos"]
    sp: Float[torch.Tensor, "layer pos"]
    attention_entropy: Float[torch.Tensor, "block pos"]
    first_key_mass: Float[torch.Tensor, "block pos"]
    statistics: Float[torch.Tensor, "length layer stat"]
    window_statistics: Float[torch.Tensor, "length batch layer stat"]
    pseudo_values: bool = False
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        if not self.lengths or list(self.lengths) != sorted(set(self.lengths)):
            raise ValueError(f"lengths={list(self.lengths)} must be distinct and ascending")
        n_l, n_t, n_s = len(self.layers), len(self.lengths), len(SIMILARITY_STATISTICS)
        p = max(self.lengths)
        want = {
            "lag_similarity": (n_l, len(self.lags), p),
            "to_first": (n_l, p),
            "sp": (n_l, p),
            "attention_entropy": (self.n_blocks, p),
            "first_key_mass": (self.n_blocks, p),
            "statistics": (n_t, n_l, n_s),
            "window_statistics": (n_t, self.n_sequences, n_l, n_s),
        }
        for name, shape in want.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"{name} has shape {got}, expected {shape}")
        if self.n_sequences < 2 or self.first_position not in (0, 1):
            raise ValueError(f"n_sequences={self.n_sequences} < 2 or bad first_position")

    def _check_values(self) -> None:
        """Run on load: NaN only where documented: ``to_first`` and ``sp`` before the first
        counted position, ``attention_entropy`` at p = 0, ``lag_similarity`` where p - lag is
        not counted; a lag of at most the longest length."""
        first = self.first_position
        for name in ("to_first", "sp"):
            nan = torch.isnan(getattr(self, name))
            if bool(nan[:, first:].any()) or not bool(nan[:, :first].all()):
                raise FieldError(
                    name, f"{name} must be NaN before position {first} and finite from it on"
                )
        nan = torch.isnan(self.attention_entropy)
        if not bool(nan[:, 0].all()) or bool(nan[:, 1:].any()):
            raise FieldError("attention_entropy", "attention_entropy is NaN at p = 0 only")
        for d, lag in enumerate(self.lags):
            nan = torch.isnan(self.lag_similarity[:, d])
            if bool(nan[:, first + lag :].any()):
                raise FieldError(
                    "lag_similarity", f"lag_similarity at lag {lag} is NaN where it is counted"
                )
        if max(self.lags) >= max(self.lengths):
            raise FieldError("lags", f"lags={list(self.lags)} reach the longest length")

    def _li(self, layer: int) -> int:
        return entry_index(layer, self.layers, "this study")

    def curve(self, metric: str = "lag", layer: int = -1) -> pd.DataFrame:
        """A curve over the absolute position p (tidy).

        Args:
            metric: One of :data:`PREFIX_CURVES`: ``lag`` (M[p, p - delta], one curve per lag),
                ``to_first``, ``sp`` (residual entry ``layer``), ``attention_entropy``,
                ``first_key_mass`` (block ``layer``).
            layer: Residual entry, or block for the attention curves (negative: from the end).

        Returns:
            DataFrame with columns ``position, lag, value`` (``lag`` 0 but for ``lag``).

        Raises:
            InvalidInputError: unknown metric or layer.
        """
        import pandas as pd

        if metric not in PREFIX_CURVES:
            raise InvalidInputError(f"metric={metric!r} must be one of {list(PREFIX_CURVES)}")
        positions = range(max(self.lengths))
        if metric in ("attention_entropy", "first_key_mass"):
            n = self.n_blocks
            if not -n <= layer < n or isinstance(layer, bool):
                raise InvalidInputError(f"layer={layer} is not a block (0..{n - 1})")
            values = getattr(self, metric)[layer]
            rows = [{"position": p, "lag": 0, "value": float(values[p])} for p in positions]
        elif metric == "lag":
            li = self._li(layer)
            rows = [
                {"position": p, "lag": lag, "value": float(self.lag_similarity[li, d, p])}
                for d, lag in enumerate(self.lags)
                for p in positions
            ]
        else:
            values = getattr(self, metric)[self._li(layer)]
            rows = [{"position": p, "lag": 0, "value": float(values[p])} for p in positions]
        return pd.DataFrame(rows)

    def by_length(
        self,
        statistic: str = "homogenization",
        layer: int = -1,
        *,
        ci: float = 0.95,
        block: int | Literal["auto"] = "auto",
        seed: int = 0,
        n_boot: int = 1000,
    ) -> pd.DataFrame:
        """One statistic on the first T positions, per length T, with a block-bootstrap
        interval over windows.

        Args:
            statistic: One of :data:`~homoglens.similarity.maths.SIMILARITY_STATISTICS`.
            layer: Residual entry (negative: from the end).
            ci: Interval coverage.
            block: Bootstrap block length (consecutive windows): ``"auto"`` (from the
                windows' autocorrelation, :func:`homoglens.core.stats.auto_block`) or an integer.
            seed: Bootstrap seed.
            n_boot: Bootstrap resamples.

        Returns:
            DataFrame with columns ``length, value, se, ci_low, ci_high, n_sequences``.

        Raises:
            InvalidInputError: unknown statistic or layer.
        """
        import pandas as pd

        if statistic not in SIMILARITY_STATISTICS:
            raise InvalidInputError(
                f"statistic={statistic!r} must be one of {list(SIMILARITY_STATISTICS)}"
            )
        li, e = self._li(layer), SIMILARITY_STATISTICS.index(statistic)
        rows = []
        for t, length in enumerate(self.lengths):
            per = self.window_statistics[t, :, li, e]
            est = estimate([per[None]], block=block, n_boot=n_boot, ci=ci, seed=seed)
            rows.append(
                {
                    "length": length,
                    "value": float(self.statistics[t, li, e]),
                    "se": est.se,
                    "ci_low": est.ci_low,
                    "ci_high": est.ci_high,
                    "n_sequences": self.n_sequences,
                }
            )
        return pd.DataFrame(rows)

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: the per-length statistics, one row per (length, layer, statistic)."""
        import pandas as pd

        rows = [
            {
                "length": length,
                "layer": layer,
                "statistic": stat,
                "value": float(self.statistics[t, li, e]),
            }
            for t, length in enumerate(self.lengths)
            for li, layer in enumerate(self.layers)
            for e, stat in enumerate(SIMILARITY_STATISTICS)
        ]
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return (
            f"LengthStudy(lengths {list(self.lengths)}, {self.n_sequences} windows, "
            f"{len(self.layers)} entries, {self.provenance.model})"
        )
