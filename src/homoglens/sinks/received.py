"""Homogenization by attention received: per key position, the attention it gets and the
attractor shift of the tokens that attend it (docs/bias.md, "Homogenization by attention
received")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

from homoglens.core.types import BosPolicy, HookFn, ModelInput
from homoglens.core.validate import check_layers
from homoglens.models.architectures import resid_hook_name
from homoglens.profile.homogenization import nan_div
from homoglens.run.blocked_attention import AttentionJob, PatternRows
from homoglens.run.data import DataInput, TokenBatch
from homoglens.run.engine import Sums, model_device, provenance_of
from homoglens.run.entrance import entrance
from homoglens.sinks.result import AttentionReceived


def _units(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().double()
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return torch.where(norms > 0, x / torch.where(norms > 0, norms, 1.0), 0.0)


def attention_received(
    model: ModelInput,
    data: DataInput,
    *,
    layers: Sequence[int] | int | None = None,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> AttentionReceived:
    """Measure, per block and key position k, the attention k receives and whether the tokens
    that attend it move toward it (the attractor shift), in one streamed pass.

    The pattern is read a block of queries at a time (no ``[batch head_index query_pos
    key_pos]`` tensor of a whole layer, where the model's attention runs through transformers'
    attention interface). For block l (input x^l = residual entry l, output x^{l+1}) and each
    pair q > k of real tokens: a[q, k] = mean over heads of A[q, k] and s[q, k] = cos(x^{l+1}_q,
    x^l_k) - cos(x^l_q, x^l_k). Per key position: mean a (attention received), mean s (shift)
    and sum a s / sum a; per block: the least-squares slope of s on a over all pairs and their
    correlation. A sink that homogenizes shows high received mass *and* a positive slope; a
    no-op sink (small value norm) shows mass without shift (Gu et al. 2024).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` in eval mode.
        data: Token ids, a ``TokenBatch``, texts or a text file (padding allowed).
        layers: Blocks to measure (default: all).
        batch_size: Sequences per forward pass.
        attention_mask: ``[batch pos]`` 0/1 for token input.
        bos: BOS policy for text input.
        progress: Show a progress bar.

    Returns:
        An :class:`~homoglens.sinks.result.AttentionReceived`.

    Raises:
        InvalidInputError: bad ``layers`` (block indices), bad data.

    References:
        Yusupov et al. 2025, arXiv 2508.17126; Gu et al. 2024, arXiv 2410.10781; Wu et al.
        2024, arXiv 2405.18781.

    Examples:
        >>> import torch
        >>> from homoglens import attention_received, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> got = attention_received(model, torch.randint(0, 1000, (3, 10)), progress=False)
        >>> tuple(got.received.shape), tuple(got.slope.shape)
        ((2, 10), (2,))
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    info = call.info
    n_layers = int(model.cfg.n_layers)
    blocks = check_layers(layers, n_layers, blocks=True)
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    device = model_device(model)
    n_pos = int(batch.lengths.max())
    f64 = {"dtype": torch.float64, "device": device}
    nb = len(blocks)
    sums = {name: torch.zeros(nb, n_pos, **f64) for name in ("a", "s", "as", "count")}
    moments = torch.zeros(nb, 6, **f64)  # n, sum a, sum s, sum a^2, sum s^2, sum a s
    state: dict[Any, Any] = {}  # unit vectors, or a block's PatternRows
    reader = Sums(sums={**sums, "moments": moments})  # stream merges them over ranks
    hooks = []
    for bi, block in enumerate(blocks):
        hooks.append((resid_hook_name(block), _entry_in(bi, state)))
        hooks.append((resid_hook_name(block + 1), _entry_out(bi, state, reader, sums, moments)))
    reader.add_hooks(hooks)
    reader.add_jobs(
        {block: AttentionJob(read=_pattern(bi, state)) for bi, block in enumerate(blocks)}
    )
    try:
        call.stream(
            batch,
            [reader],
            desc="attention received",
        )
    finally:
        state.clear()
    return _received(sums, moments, blocks, info, batch)


def _entry_in(bi: int, state: dict[Any, Any]) -> HookFn:
    """The hook on block ``bi``'s input: keeps its unit vectors in ``state``."""

    def hook(x: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
        state[("in", bi)] = _units(x)

    return hook


def _pattern(bi: int, state: dict[Any, Any]) -> Callable[[PatternRows], None]:
    """The attention job of block ``bi``: keeps its pattern rows in ``state``."""

    def read(rows: PatternRows) -> None:
        state[("a", bi)] = rows  # read a block of queries at a time once x^{l+1} is known

    return read


def _entry_out(
    bi: int,
    state: dict[Any, Any],
    reader: Sums,
    sums: dict[str, torch.Tensor],
    moments: torch.Tensor,
) -> HookFn:
    """The hook on block ``bi``'s output: with the input's unit vectors and the pattern rows
    from ``state`` and the batch's mask from ``reader``, adds each pair q > k of real tokens
    into the per-key ``sums`` and the block's ``moments``."""

    def hook(x: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
        u_in, rows = state.pop(("in", bi)), state.pop(("a", bi))
        u_out = _units(x)
        mask = reader.batch["mask"].double()
        t = mask.shape[1]
        keys = torch.arange(t, device=mask.device)
        for q0, q1 in rows.blocks():  # [batch query_pos key_pos] for queries q0 .. q1 - 1
            a = rows.rows(q0, q1).double().mean(1)
            u_q = u_in[:, q0:q1]
            shift = u_out[:, q0:q1] @ u_in.transpose(1, 2) - u_q @ u_in.transpose(1, 2)
            below = (keys[None, :] < torch.arange(q0, q1, device=mask.device)[:, None]).double()
            pairs = below[None] * mask[:, q0:q1, None] * mask[:, None]
            a, shift = a * pairs, shift * pairs
            sums["a"][bi, :t] += a.sum((0, 1))
            sums["s"][bi, :t] += shift.sum((0, 1))
            sums["as"][bi, :t] += (a * shift).sum((0, 1))
            sums["count"][bi, :t] += pairs.sum((0, 1))
            moments[bi] += torch.stack(
                [
                    pairs.sum(),
                    a.sum(),
                    shift.sum(),
                    (a * a).sum(),
                    (shift * shift).sum(),
                    (a * shift).sum(),
                ]
            )

    return hook


def _received(
    sums: dict[str, torch.Tensor],
    moments: torch.Tensor,
    blocks: tuple[int, ...],
    info: Any,
    batch: TokenBatch,
) -> AttentionReceived:
    """The :class:`~homoglens.sinks.result.AttentionReceived` of the merged per-key ``sums``
    and per-block ``moments`` of ``batch`` (``info``: the model's, for the provenance)."""
    n, sa, ss, saa, sss, sas = moments.cpu().unbind(-1)
    cov = sas / n - (sa / n) * (ss / n)
    var_a = saa / n - (sa / n) ** 2
    var_s = sss / n - (ss / n) ** 2
    cpu = {k: v.cpu() for k, v in sums.items()}
    return AttentionReceived(
        blocks=blocks,
        received=nan_div(cpu["a"], cpu["count"]),
        shift=nan_div(cpu["s"], cpu["count"]),
        weighted_shift=nan_div(cpu["as"], cpu["a"]),
        slope=nan_div(cov, var_a),
        correlation=nan_div(cov, (var_a * var_s).clamp_min(0).sqrt()),
        n_pairs=n,
        n_sequences=len(batch),
        provenance=provenance_of(info, batch, (), False),
    )
