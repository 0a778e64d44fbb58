"""Attention rollout (Abnar & Zuidema 2020) over depth, read as Wu et al.'s position bias of
causal attention: ``attention_rollout``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import BosPolicy, ModelInput
from homoglens.core.validate import as_bool, check_layers, positive_int
from homoglens.reproductions.rollout_result import AttentionRollout, uniform_causal_rollout
from homoglens.run.blocked_attention import AttentionJob, PatternRows
from homoglens.run.data import DataInput, TokenBatch
from homoglens.run.engine import Sums, provenance_of
from homoglens.run.entrance import entrance


def attention_rollout(
    model: ModelInput,
    data: DataInput,
    *,
    residual: bool = True,
    layers: Sequence[int] | int | None = None,
    first_k: int = 1,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> AttentionRollout:
    """Roll each window's attention out through the blocks and measure where the cumulative
    attention lands, per depth: Wu et al.'s position bias of causal masking.

    Per block l, ``A_l`` is the block's attention averaged over heads (``[query_pos key_pos]``
    per sequence, read a block of query rows at a time: no ``[batch head_index query_pos
    key_pos]`` tensor of a whole layer is held), ``M_l = (A_l + I) / 2`` (``residual=True``,
    Abnar & Zuidema's account of the residual stream) or ``M_l = A_l`` (``residual=False``, the
    plain product of Wu et al.'s analysis), and the rollout is ``R_l = M_l R_{l-1}`` from
    ``R_{-1} = I`` (float64, ``[pos pos]`` per sequence, held for the current batch only). Per
    reported block and window: the mean over real queries q of ``R_l[q, k]`` (the cumulative
    attention key k receives; a distribution over keys) and its mass on keys ``0 .. first_k -
    1``. The same numbers for uniform causal attention (every query attends equally to its
    prefix; exact, :func:`~homoglens.reproductions.rollout_result.uniform_causal_rollout`) are the
    null: causal mixing with no positional preference, which already concentrates on the first keys
    as depth grows. Wu et al. predict that the model's rollout concentrates on the first keys
    with depth and that positional encodings (decay, rotary) counteract it in part.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` in eval mode.
        data: Token ids, a ``TokenBatch``, texts or a text file (padding allowed).
        residual: Mix in the identity, ``(A + I) / 2`` (default), or not.
        layers: Blocks after which the rollout is reported (default: all). The rollout always
            runs from block 0 through the last block asked for.
        first_k: Keys counted as "first" (>= 1, at most the longest window).
        batch_size: Sequences per forward pass.
        attention_mask: ``[batch pos]`` 0/1 for token input.
        bos: BOS policy for text input.
        progress: Show a progress bar.

    Returns:
        An :class:`~homoglens.reproductions.rollout_result.AttentionRollout`: ``received[layer,
        key_pos]``, the per-window first-k mass ``[window layer]`` and the null of both.

    Raises:
        InvalidInputError: bad ``layers`` (block indices), ``first_k`` not a positive integer
            or longer than the longest window, bad ``residual``, ``batch_size`` or data.
        NonFiniteActivationError: NaN/inf in the attention.

    References:
        Wu et al. 2025, "On the Emergence of Position Bias in Transformers", arXiv 2502.01951;
        Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", arXiv 2005.00928.

    Examples:
        >>> import torch
        >>> from homoglens import attention_rollout, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> got = attention_rollout(model, torch.randint(0, 1000, (3, 10)), progress=False)
        >>> tuple(got.received.shape), tuple(got.window_first_k.shape)
        ((2, 10), (3, 2))
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    info = call.info
    residual = as_bool("residual", residual)
    blocks = check_layers(layers, int(model.cfg.n_layers), blocks=True)
    first_k = positive_int("first_k", first_k)
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    n_pos = int(batch.lengths.max())
    if first_k > n_pos:
        raise InvalidInputError(
            f"first_k={first_k} is longer than the longest window ({n_pos} tokens): give "
            f"first_k <= {n_pos}"
        )
    nb = len(blocks)
    reader = Sums(rows={"received": (nb, n_pos), "first_k": (nb,)})
    state: dict[str, Any] = {"n_blocks": nb}
    reader.add_jobs(
        {
            b: AttentionJob(read=_step(b, blocks, reader, state, residual, first_k, n_pos))
            for b in range(blocks[-1] + 1)
        }
    )
    try:
        call.stream(batch, [reader], desc="attention rollout")  # fmt: skip
    finally:
        state.clear()
    received = reader.row_values("received")  # [window layer key_pos], NaN past a window
    null_received, null_first_k = _null(batch, blocks, residual, first_k, n_pos)
    return AttentionRollout(
        blocks=blocks,
        received=received.nanmean(0),
        window_first_k=reader.row_values("first_k"),
        null_received=null_received,
        null_first_k=null_first_k,
        first_k=first_k,
        residual=residual,
        n_sequences=len(batch),
        provenance=provenance_of(info, batch, (), False),
    )


def _step(
    block: int,
    blocks: tuple[int, ...],
    reader: Sums,
    state: dict[str, Any],
    residual: bool,
    first_k: int,
    n_pos: int,
) -> Callable[[PatternRows], None]:
    """The attention job of ``block``: ``R <- M R`` for the batch (``M``: the head-mean rows,
    a block of queries at a time, mixed with the identity when ``residual``); at a reported
    block, the per-window received mass and first-k mass go to ``reader``'s rows."""

    def read(rows: PatternRows) -> None:
        mask = reader.batch["mask"].to(device=rows.device, dtype=torch.float64)
        b, t = mask.shape
        eye = torch.eye(t, dtype=torch.float64, device=rows.device)
        prev = eye.expand(b, t, t) if block == 0 else state.pop("R")
        new = torch.empty(b, t, t, dtype=torch.float64, device=rows.device)
        for q0, q1 in rows.blocks():
            a = rows.rows(q0, q1).double().mean(1)  # [batch query_pos key_pos], head mean
            a = a * mask[:, q0:q1, None] * mask[:, None, :]
            if residual:
                a = 0.5 * a + 0.5 * eye[q0:q1] * mask[:, q0:q1, None]
            new[:, q0:q1] = a @ prev
        if block < blocks[-1]:
            state["R"] = new
        if block in blocks:
            _record(blocks.index(block), new, mask, reader, state, first_k, n_pos)

    return read


def _record(
    index: int,
    rollout: Float[torch.Tensor, "batch query_pos key_pos"],
    mask: Float[torch.Tensor, "batch pos"],
    reader: Sums,
    state: dict[str, Any],
    first_k: int,
    n_pos: int,
) -> None:
    """Add the batch's per-window received mass (mean over real queries, NaN past a window's
    end) and first-``first_k`` mass at reported block ``index`` to ``reader``'s rows."""
    b, t = mask.shape
    nb = state["n_blocks"]
    if index == 0:  # kept on the model's device: no read-back inside a hook
        here = {"dtype": torch.float64, "device": mask.device}
        state["received"] = torch.full((b, nb, n_pos), float("nan"), **here)
        state["first_k"] = torch.zeros(b, nb, **here)
    lengths = mask.sum(1)
    mean_row = (rollout * mask[:, :, None]).sum(1) / lengths[:, None]  # [batch key_pos]
    mean_row = torch.where(mask.bool(), mean_row, float("nan"))
    state["received"][:, index, :t] = mean_row
    state["first_k"][:, index] = mean_row[:, :first_k].nan_to_num(0.0).sum(-1)
    if index == nb - 1:  # Sums.row_values moves the parts to the CPU after the last batch
        reader.rows["received"].append(state.pop("received"))
        reader.rows["first_k"].append(state.pop("first_k"))


def _null(
    batch: TokenBatch, blocks: tuple[int, ...], residual: bool, first_k: int, n_pos: int
) -> tuple[Float[torch.Tensor, "layer key_pos"], Float[torch.Tensor, " layer"]]:
    """The uniform-causal null of ``received`` (mean over windows, NaN where none reaches) and
    of the mean first-``first_k`` mass, for the window lengths of ``batch``."""
    nb = len(blocks)
    total = torch.zeros(nb, n_pos, dtype=torch.float64, device="cpu")
    count = torch.zeros(n_pos, dtype=torch.float64, device="cpu")
    first = torch.zeros(nb, dtype=torch.float64, device="cpu")
    depths = torch.tensor(blocks, device="cpu")
    lengths, counts = torch.unique(batch.lengths.cpu(), return_counts=True)
    for length, c in zip(lengths.tolist(), counts.tolist(), strict=True):
        rollout = uniform_causal_rollout(int(length), blocks[-1] + 1, residual=residual)
        mean_row = rollout[depths].mean(1)  # [layer key_pos]
        total[:, :length] += c * mean_row
        count[:length] += c
        first += c * mean_row[:, :first_k].sum(-1)
    received = torch.where(count > 0, total / count.clamp_min(1), float("nan"))
    return received, first / len(batch)
