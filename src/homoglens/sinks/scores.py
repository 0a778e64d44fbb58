"""Attention-sink scores: sink mass per head and Gu et al.'s importance and sink rate,
streamed over a corpus at every block's ``attn.hook_pattern``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError, NonFiniteActivationError
from homoglens.core.types import BosPolicy, HookedModel, ModelInput
from homoglens.core.validate import check_key_eps, positive_int
from homoglens.models.architectures import pattern_hook_name
from homoglens.models.loading import model_info
from homoglens.profile.homogenization import nan_div
from homoglens.run.blocked_attention import AttentionJob, PatternRows
from homoglens.run.data import DataInput, TokenBatch, to_token_batch
from homoglens.run.engine import Sums, model_device, provenance_of, stream
from homoglens.run.entrance import entrance
from homoglens.sinks.result import SinkScores

if TYPE_CHECKING:
    pass


def sink_sums(
    pattern: Float[torch.Tensor, "batch head_index query_pos key_pos"],
    lengths: Int[torch.Tensor, " batch"],
    *,
    key: int = 0,
    eps: float = 0.3,
) -> dict[str, torch.Tensor]:
    """Reduce one layer's attention pattern to sink statistics (pure function, float64).

    Rows must be right-aligned: query/key index i is position i of the sequence, and positions
    ``>= lengths[b]`` are padding. Only the sink's column is read: :func:`sink_column_sums`.

    Args:
        pattern: ``[batch head_index query_pos key_pos]`` attention probabilities.
        lengths: ``[batch]`` number of real tokens per sequence (each > ``key``).
        key: 0-indexed key position of the sink.
        eps: Threshold on the Gu et al. importance for counting a sink.

    Returns:
        As :func:`sink_column_sums`.
    """
    return sink_column_sums(pattern[..., key], lengths, key=key, eps=eps)


def sink_column_sums(
    column: Float[torch.Tensor, "batch head_index query_pos"],
    lengths: Int[torch.Tensor, " batch"],
    *,
    key: int = 0,
    eps: float = 0.3,
) -> dict[str, torch.Tensor]:
    """Reduce the sink's column of one layer's attention pattern, A[q, key] for every query q,
    to sink statistics (pure function, float64).

    Args:
        column: ``[batch head_index query_pos]`` attention probabilities on the sink key.
        lengths: ``[batch]`` number of real tokens per sequence (each > ``key``).
        key: 0-indexed key position of the sink.
        eps: Threshold on the Gu et al. importance for counting a sink.

    Returns:
        ``mass_sum [head_index]`` (sum over sequences of the per-sequence mean of A[q, key]
        over real q > key; sequences with no such q contribute 0 and are not counted in
        ``mass_count``), ``mass_count []``, ``by_query_sum [head_index query_pos]`` and
        ``by_query_count [query_pos]`` (sums of A[q, key] and sequence counts per query
        position q > key), ``importance_sum [head_index]`` (sum of alpha over sequences),
        ``sink_count [head_index]`` (how many sequences have alpha > eps), ``n_sequences []``,
        and per sequence
        ``importance_by_sequence [batch head_index]`` (alpha of each sequence).
    """
    batch, _, n_q = column.shape
    f64 = torch.float64
    column = column.to(f64)
    q = torch.arange(n_q, device=column.device)
    real = q[None, :] < lengths[:, None].to(column.device)  # [batch query_pos]
    after = (real & (q[None, :] > key)).to(f64)
    from_key = (real & (q[None, :] >= key)).to(f64)
    n_after = after.sum(1)  # [batch]
    has_after = n_after > 0
    per_seq_mass = (column * after[:, None, :]).sum(-1) / n_after.clamp_min(1)[:, None]
    importance = (column * from_key[:, None, :]).sum(-1) / from_key.sum(1).clamp_min(1)[:, None]
    return {
        "mass_sum": (per_seq_mass * has_after[:, None]).sum(0),
        "mass_count": has_after.to(f64).sum(),
        "by_query_sum": (column * after[:, None, :]).sum(0),
        "by_query_count": after.sum(0),
        "importance_sum": importance.sum(0),
        "sink_count": (importance > eps).to(f64).sum(0),
        "n_sequences": torch.tensor(float(batch), dtype=f64, device=column.device),
        "importance_by_sequence": importance,
    }


def check_key_in(batch: TokenBatch, key: int) -> None:
    """Refuse sequences too short to hold the sink ``key``.

    Raises:
        InvalidInputError: names the sequences of at most ``key`` tokens.
    """
    short = torch.nonzero(batch.lengths <= key).flatten().tolist()
    if short:
        raise InvalidInputError(
            f"key={key} lies outside sequences {short[:10]} (they have <= {key} tokens); use a "
            "smaller key or longer sequences"
        )


def check_edge(batch: TokenBatch, key: int, edge_k: int) -> None:
    """Every sequence must hold the key and, after it, two edges of ``edge_k`` and a middle."""
    check_key_in(batch, key)
    need = key + 2 * edge_k + 2
    short = torch.nonzero(batch.lengths < need).flatten().tolist()
    if short:
        raise InvalidInputError(
            f"sequences {short[:10]} have fewer than key + 2 * edge_k + 2 = {need} tokens; "
            "use a smaller key or edge_k, or longer sequences"
        )


def sink_scores(
    model: ModelInput,
    data: DataInput,
    *,
    key: int = 0,
    eps: float = 0.3,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> SinkScores:
    """Score every head as an attention sink on one key position.

    Streams the data; each batch's attention is read a block of queries at a time (the
    probabilities on the sink key, from each block's queries and keys: no ``[batch head_index
    query_pos key_pos]`` pattern of a whole layer where the model's attention runs through
    transformers' attention interface; elsewhere from ``blocks.{l}.attn.hook_pattern``) and
    reduced to sums, so memory grows with neither the number of sequences nor T^2. Pads never
    count; positions count from each sequence's first real token.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: As for :func:`homogenization_profile`.
        key: 0-indexed key position (0 = the first token, the BOS when one is used).
        eps: Importance threshold for the sink rate, in (0, 1) (Gu et al.: 0.3).
        batch_size: Sequences per forward pass.
        attention_mask: For token input.
        bos: For text input: ``"auto"``, ``"always"`` or ``"never"`` (Gu et al. use no BOS
            for GPT-2 / Pythia).
        progress: Show a progress bar.

    Returns:
        :class:`SinkScores`.

    Raises:
        InvalidInputError: ``key`` outside ``[0, n_ctx)`` or not before the end of every
            sequence, ``eps`` outside (0, 1), or bad data.

    References:
        Gu et al. 2024, arXiv 2410.10781; Xiao et al. 2023, arXiv 2309.17453.

    Examples:
        >>> from homoglens import load_model, sink_scores
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> scores = sink_scores(model, ["The cat sat on the mat.", "A dog ran."], progress=False)
        >>> tuple(scores.mass.shape)
        (2, 4)
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    return sink_pass(model, data, key, eps, call.batch_size, attention_mask, bos, call.progress)[0]


def sink_pass(
    model: HookedModel,
    data: Any,
    key: int,
    eps: float,
    batch_size: int,
    attention_mask: Any,
    bos: Any,
    progress: bool,
) -> tuple[SinkScores, Float[torch.Tensor, "batch layer head_index"]]:
    """One streamed pass: the :class:`SinkScores` and every sequence's importance alpha
    ``[batch layer head_index]`` (in input order; gathered across ranks when distributed)."""
    key, eps = check_key_eps(key, eps, int(model.cfg.n_ctx))
    batch_size = positive_int("batch_size", batch_size)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    check_key_in(batch, key)
    red, finish = sink_reducer(model, batch, key, eps)
    stream(model, batch, [red], batch_size=batch_size, desc="sinks", progress=progress)
    return finish()


def sink_reducer(
    model: HookedModel, batch: TokenBatch, key: int, eps: float
) -> tuple[Sums, Callable[[], tuple[SinkScores, torch.Tensor]]]:
    """The reducer of :func:`sink_pass` (checked arguments) and the function that finishes it
    into the scores and ``[batch layer head_index]`` importances once the batches are streamed;
    to share a pass with other reducers (:func:`homoglens.sinks.sink_analysis`)."""
    info = model_info(model)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    device = model_device(model)
    n_q = int(batch.lengths.max())
    f64 = {"dtype": torch.float64, "device": device}
    red = Sums(
        sums={
            "mass_sum": torch.zeros(n_layers, n_heads, **f64),
            "by_query_sum": torch.zeros(n_layers, n_heads, n_q, **f64),
            "importance_sum": torch.zeros(n_layers, n_heads, **f64),
            "sink_count": torch.zeros(n_layers, n_heads, **f64),
            "mass_count": torch.zeros((), **f64),
            "n_sequences": torch.zeros((), **f64),
            "by_query_count": torch.zeros(n_q, **f64),
        },
        rows={f"importance.{layer}": (n_heads,) for layer in range(n_layers)},
    )
    acc = red.sums

    def make_read(layer: int) -> Callable[[PatternRows], None]:
        def read(rows: PatternRows) -> None:
            lengths = red.batch["lengths"].to(rows.device)
            width = rows.n_query
            column = torch.empty(
                rows.batch, rows.n_heads, width, dtype=rows.dtype, device=rows.device
            )
            lost = torch.zeros((), dtype=torch.long, device=rows.device)
            for q0, q1 in rows.blocks():
                p = rows.rows(q0, q1)
                real = torch.arange(q0, q1, device=rows.device) < lengths[:, None]
                # A NaN/inf weight makes its row sum non-finite, and TransformerLens turns a
                # NaN pattern into a zero row: either way the row of a real query does not
                # sum to 1.
                row_sums = p.sum(-1).transpose(1, 2)[real]  # [real query, head]
                lost += (~((row_sums - 1).abs() <= rows.row_tolerance)).sum()
                column[:, :, q0:q1] = p[..., key]
            if bool(lost > 0):
                raise NonFiniteActivationError(
                    f"{pattern_hook_name(layer)}: {int(lost)} attention rows of real queries do "
                    "not sum to 1 (NaN scores, which TransformerLens turns into zero rows); "
                    "nothing was averaged in. Check the model's weights and dtype"
                )
            sums = sink_column_sums(column, lengths, key=key, eps=eps)
            red.rows[f"importance.{layer}"].append(sums["importance_by_sequence"].cpu())
            acc["mass_sum"][layer] += sums["mass_sum"]
            acc["by_query_sum"][layer, :, :width] += sums["by_query_sum"]
            acc["importance_sum"][layer] += sums["importance_sum"]
            acc["sink_count"][layer] += sums["sink_count"]
            if layer == 0:
                acc["mass_count"] += sums["mass_count"]
                acc["n_sequences"] += sums["n_sequences"]
                acc["by_query_count"][:width] += sums["by_query_count"]

        return read

    red.add_jobs({layer: AttentionJob(read=make_read(layer)) for layer in range(n_layers)})
    return red, functools.partial(_finish_scores, red, info, batch, key, eps)


def _finish_scores(
    red: Sums, info: Any, batch: TokenBatch, key: int, eps: float
) -> tuple[SinkScores, torch.Tensor]:
    acc, n_layers = red.sums, int(red.sums["mass_sum"].shape[0])
    alpha = torch.stack([red.row_values(f"importance.{layer}") for layer in range(n_layers)], 1)
    n_seq, mass_count = float(acc["n_sequences"]), float(acc["mass_count"])
    by_query = nan_div(acc["by_query_sum"].cpu(), acc["by_query_count"].cpu())
    scores = SinkScores(
        key=key,
        eps=eps,
        mass=(acc["mass_sum"] / mass_count).cpu()  # NaN: no query after key
        if mass_count > 0
        else torch.full_like(acc["mass_sum"], float("nan")).cpu(),
        mass_by_query=by_query,
        importance=(acc["importance_sum"] / n_seq).cpu(),
        sink_rate_by_head=(acc["sink_count"] / n_seq).cpu(),
        n_sequences=int(round(n_seq)),
        provenance=provenance_of(info, batch, (), False),
    )
    return scores, alpha
