"""The metrics of an :class:`~homoglens.AttentionBiasStudy`: the manipulation checks of the
attention and every metric whose dose-response a study reports."""

from __future__ import annotations

from homoglens.similarity_math import SIMILARITY_STATISTICS

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
