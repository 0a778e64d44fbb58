"""The sink section of a study in one call (scores, massive activations, attribution), and
the attention-pattern view of a sequence (circuitsvis).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
from jaxtyping import Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import BosPolicy, ModelInput
from homoglens.core.validate import (
    as_int,
    at_most,
    check_heads,
    check_key_eps,
    positive_int,
)
from homoglens.models.architectures import pattern_hook_name
from homoglens.run.data import DataInput
from homoglens.run.engine import Pass, PassPlan, stream
from homoglens.run.entrance import entrance
from homoglens.sinks.attribution import sink_attribution
from homoglens.sinks.massive import massive_reducer
from homoglens.sinks.result import SinkAnalysis
from homoglens.sinks.scores import check_edge, check_key_in, sink_reducer

if TYPE_CHECKING:
    pass


def attention_view(
    model: ModelInput,
    text: str,
    heads: list[tuple[int, int]],
    *,
    bos: BosPolicy | bool = "auto",
) -> Any:
    """A circuitsvis view of the chosen heads' attention patterns on one text, for notebooks.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        text: One text (at most ``n_ctx`` tokens).
        heads: ``(layer, head)`` pairs, e.g. ``scores.top_heads(4)`` rows.
        bos: BOS policy, as for :func:`sink_scores`.

    Returns:
        ``circuitsvis.attention.attention_heads`` output (renders in Jupyter; ``str()`` gives
        HTML), with the heads named ``L{layer}H{head}``.

    Raises:
        InvalidInputError: a head that does not exist, or bad text.

    References:
        Cooney & Nanda, CircuitsVis (github.com/TransformerLensOrg/CircuitsVis).
    """
    call = entrance(model)
    model = call.model
    import circuitsvis.attention as cv_attention

    chosen = check_heads(heads, int(model.cfg.n_layers), int(model.cfg.n_heads))
    if not isinstance(text, str):
        raise InvalidInputError(f"text must be one string, got {type(text).__name__}")
    batch = call.batch([text], bos=bos)
    names = {pattern_hook_name(lay) for lay, _ in chosen}
    cache: dict[str, torch.Tensor] = {}

    def keep(name: str, activation: torch.Tensor, hook: Any) -> None:
        cache[name] = activation.detach()

    def view(tokens: torch.Tensor, mask: torch.Tensor) -> PassPlan:
        yield Pass(tokens, [(name, partial(keep, name)) for name in sorted(names)], sorted(names))

    stream(model, batch, [], batch_size=1, desc="attention view", progress=False, passes=view)
    patterns = torch.stack([cache[pattern_hook_name(lay)][0, h].float().cpu() for lay, h in chosen])
    tokenizer = model.tokenizer
    tokens = [tokenizer.decode([int(t)]) for t in batch.tokens[0]]
    return cv_attention.attention_heads(
        attention=patterns,
        tokens=tokens,
        attention_head_names=[f"L{lay}H{h}" for lay, h in chosen],
    )


def sink_analysis(
    model: ModelInput,
    data: DataInput,
    *,
    key: int = 0,
    eps: float = 0.3,
    top_k: int = 3,
    edge_k: int = 8,
    attribution_n_seq: int | None = None,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> SinkAnalysis:
    """Sink scores and massive activations on all of ``data``, then fast attribution of every
    head and exact attribution of the ``top_k`` heads by sink mass (plus their joint removal)
    at the last block's output, on the first ``attribution_n_seq`` sequences (default: all).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        key: Sink key position.
        eps: Sink-rate threshold (Gu et al.: 0.3).
        top_k: Heads for the exact attribution.
        edge_k: Tokens per edge in the attribution metrics.
        attribution_n_seq: Sequences used by the attributions (they cost several passes).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input.
        progress: Show progress bars.

    Returns:
        :class:`SinkAnalysis`.

    Raises:
        InvalidInputError: bad arguments or data (see :func:`sink_scores`,
            :func:`sink_attribution`).

    References:
        Gu et al. 2024, arXiv 2410.10781; Sun et al. 2024, arXiv 2402.17762;
        Barbero et al. 2025, arXiv 2504.02732; Syed, Rager, Conmy 2023, arXiv 2310.10348.
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    key, eps = check_key_eps(key, eps, int(model.cfg.n_ctx))
    top_k = as_int("top_k", top_k, low=1)
    edge_k = as_int("edge_k", edge_k, low=1)
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    n_attr = len(batch)
    if attribution_n_seq is not None:
        n_attr = as_int("attribution_n_seq", attribution_n_seq, low=1)
    check_edge(batch[: min(n_attr, len(batch))], key, edge_k)  # fail before any pass
    check_key_in(batch, key)
    common = {"batch_size": positive_int("batch_size", call.batch_size), "progress": call.progress}
    # The scores read the attention patterns and massive activations the residual stream of
    # every block: one pass over the windows feeds both.
    score_red, finish_scores = sink_reducer(model, batch, key, eps)
    massive_red, finish_massive = massive_reducer(model, batch, 100.0)
    stream(model, batch, [score_red, massive_red], desc="sinks", **common)
    scores, massive = finish_scores()[0], finish_massive()
    subset = batch[: at_most("attribution_n_seq", n_attr, len(batch), "sequences given")]
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    top = scores.top_heads(at_most("top_k", top_k, n_layers * n_heads, "heads of the model"))
    heads = [(int(r.layer), int(r.head)) for r in cast(Iterable[Any], top.itertuples())]
    attr = {"key": key, "edge_k": edge_k, **common}
    fast = sink_attribution(model, subset, method="fast", **attr)
    exact = sink_attribution(model, subset, heads=heads, **attr)
    return SinkAnalysis(scores=scores, massive=massive, fast=fast, exact=exact)
