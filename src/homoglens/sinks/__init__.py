"""Attention sinks and massive activations, streamed and padding-aware.

* Sink mass of head (layer, head) on key k: the mean over query positions q > k of A[q, k]
  (k = 0, the first token or BOS, by default), averaged over sequences.
* Gu et al. 2024 importance: alpha_k = (1 / (T - k + 1)) sum_{i >= k} A[i, k] with 1-indexed k;
  here ``key`` is 0-indexed, so ``key=0`` is their alpha_1. Their sink rate Sink_k^eps (k
  1-indexed) is the percentage of (sequence, layer, head) with alpha_k > eps (eps = 0.3 in the
  paper); homoglens labels it as they write it with its 0-indexed key, ``"Sink_1^0.3 (key 0)"``.
* Massive activations (Sun et al. 2024): per token, max_d |x_d| / median_d |x_d| over its
  ``d_model`` entries.

References:
    Gu et al. 2024, "When Attention Sink Emerges in Language Models: An Empirical View",
    arXiv 2410.10781 (official script eval_sink_open_source.py).
    Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks", arXiv 2309.17453.
    Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762.
"""

from homoglens.core.types import ATTRIBUTION_METRICS
from homoglens.sinks.analysis import attention_view, sink_analysis
from homoglens.sinks.attribution import sink_attribution
from homoglens.sinks.attribution_result import SinkAttribution
from homoglens.sinks.massive import (
    find_massive_sites,
    massive_activation_means,
    massive_activations,
)
from homoglens.sinks.massive_result import MassiveActivations
from homoglens.sinks.received import attention_received
from homoglens.sinks.result import AttentionReceived, SinkAnalysis, SinkScores
from homoglens.sinks.scores import sink_pass, sink_scores, sink_sums

__all__ = [
    "ATTRIBUTION_METRICS",
    "AttentionReceived",
    "MassiveActivations",
    "SinkAnalysis",
    "SinkAttribution",
    "SinkScores",
    "attention_received",
    "attention_view",
    "find_massive_sites",
    "massive_activation_means",
    "massive_activations",
    "sink_analysis",
    "sink_attribution",
    "sink_pass",
    "sink_scores",
    "sink_sums",
]
