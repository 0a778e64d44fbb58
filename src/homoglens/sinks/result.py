"""Result objects of the attention-sink measurements: ``SinkScores`` (sink mass, importance
and sink rate of every head), ``AttentionReceived`` (attention received and the attractor
shift), and ``SinkAnalysis``, everything measured about sinks on one corpus (its parts are
:class:`~homoglens.sinks.massive_result.MassiveActivations` and
:class:`~homoglens.sinks.attribution_result.SinkAttribution`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from jaxtyping import Float

from homoglens.core.errors import IncompatibleResultsError, InvalidInputError
from homoglens.results import Provenance, SavedResult
from homoglens.results.base import Plotted
from homoglens.results.storage import (
    HASHES,
    folder_path,
    read_json,
    save_folder,
    sha256_of,
    write_json,
)
from homoglens.results.validation import (
    COSINE_OR_NAN,
    FINITE_OR_NAN,
    NON_NEGATIVE,
    UNIT,
    UNIT_OR_NAN,
    Bounds,
    FieldError,
)
from homoglens.sinks.attribution_result import SinkAttribution
from homoglens.sinks.massive_result import MassiveActivations, grid_frame

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, eq=False)
class SinkScores(SavedResult, Plotted):
    """Attention-sink statistics of every head on one key position.

    ``plot()`` draws heatmaps of sink mass and importance per (layer, head).

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
    _figure: ClassVar[str] = "sinks.figure.sink_scores_figure"
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

        from homoglens.core.validate import as_int

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
        grids = {
            "mass": self.mass,
            "importance": self.importance,
            "sink_rate": self.sink_rate_by_head,
        }
        layers = torch.arange(self.mass.shape[0], device="cpu")
        return grid_frame(("layer", layers), "head", grids)

    def __repr__(self) -> str:
        return (
            f"SinkScores(model={self.provenance.model!r}, key={self.key}, "
            f"key_holds_bos={self.key_holds_bos}, "
            f"layers={self.mass.shape[0]}, heads={self.mass.shape[1]}, "
            f"sink_rate={self.sink_rate:.1f}%, n_sequences={self.n_sequences})"
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
        folder = folder_path(path, "load")
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
class AttentionReceived(SavedResult, Plotted):
    """Homogenization by attention received: how much attention each key position gets, and
    whether later tokens move toward it in proportion.

    ``plot()`` draws the attention received and the attractor shift per key position (a few
    blocks), and the slope of the shift on attention per block.

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
    _figure: ClassVar[str] = "sinks.figure.received_figure"
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

    def __repr__(self) -> str:
        return (
            f"AttentionReceived(model={self.provenance.model!r}, blocks={len(self.blocks)}, "
            f"n_sequences={self.n_sequences})"
        )
