"""The metrics of an :class:`~homoglens.AttentionBiasStudy`: the manipulation checks of the
attention, every metric whose dose-response a study reports, and one metric read for a table
(:class:`MetricRead`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

from homoglens.similarity_math import SIMILARITY_STATISTICS

if TYPE_CHECKING:
    import torch


class MetricRead(NamedTuple):
    """One metric of a study read for a table (``AttentionBiasStudy._read``): the index into
    its axis, its values and the bootstrap settings, the study's defaults filled in."""

    metric: str
    li: int
    values: torch.Tensor
    per: torch.Tensor | None
    ci: float
    block: int | Literal["auto"]
    seed: int


ATTENTION_CHECKS: tuple[str, ...] = ("mass", "entropy", "kl")
"""Manipulation checks per biased row (means over the chosen heads and query positions):
``mass`` = E_{A'}[phi] (the attention on the biased keys for the indicator kinds; minus the
mean distance attended for ``"alibi"``; NaN for ``"temperature"``), ``entropy`` of A' (nats),
``kl`` = KL(A' || A) (nats)."""

BIAS_METRICS: tuple[str, ...] = (
    *SIMILARITY_STATISTICS,
    "sp_first",
    "sp_last",
    "loss",
    *ATTENTION_CHECKS,
)
"""Metrics of :meth:`~homoglens.AttentionBiasStudy.curve`: the position-resolved statistics of the
residual stream (``homogenization`` = H_W, the naive and distance-matched edge excess), the
same-position cross-input similarity of each edge minus the middle's (``sp_*``), the next-token
loss (nats) and the manipulation checks (:data:`ATTENTION_CHECKS`)."""
