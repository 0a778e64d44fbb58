"""Pure hook factories: ``(activation, hook) -> activation``; no model access here.

A :class:`PositionPlan` says, for a sequence of T positions, which source position each token
takes its positional signal from, and which tokens change at all. The factories below apply a
plan at the hook points where position enters (see :mod:`homoglens.models.architectures`): a learned
absolute table (``hook_pos_embed``), the rotary tables of the bridge (``hook_cos``/``hook_sin``),
or the rotated queries/keys of ``HookedTransformer`` (``hook_rot_q``/``hook_rot_k``).

Positions are column indices: the hooks assume position i of a row is its i-th token, which
holds for unpadded and right-padded batches (homoglens always runs right-padded).

The sink and massive-activation hooks (remove a sink, mean-ablate heads, set residual entries)
follow; the attention-bias hook and its maths are in :mod:`homoglens.bias.hooks`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import HookFn, PositionAblation

__all__ = [
    "PositionAblation",
    "PositionPlan",
    "alibi_score_hook",
    "learned_position_hook",
    "mean_head_hook",
    "remove_sink_hook",
    "rerotate_hook",
    "rotary_table_hook",
    "set_massive_hook",
    "sink_removal_delta",
]


@dataclass(frozen=True)
class PositionPlan:
    """Which positional signal each token receives, for any sequence length.

    Attributes:
        how: The ablation mode.
        n_ctx: The model's context length (source positions must lie in ``[0, n_ctx)``).
        positions: Only these positions change (``None``: all).
        perm: For ``"permute"``: a permutation of ``0..T-1`` (T = sequence length).
        shift: For ``"shift"``: the offset added to each position.
        seed: For ``"permute"`` without ``perm``: seed of the random permutation (of the chosen
            positions among themselves when ``positions`` is given).
    """

    how: PositionAblation
    n_ctx: int
    positions: tuple[int, ...] | None = None
    perm: tuple[int, ...] | None = None
    shift: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        def ints(value: Any) -> bool:
            return isinstance(value, tuple) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            )

        if self.how not in ("none", "zero", "permute", "shift", "mean"):
            raise InvalidInputError(f"how={self.how!r} is not a position ablation")
        if not isinstance(self.n_ctx, int) or self.n_ctx < 1:
            raise InvalidInputError(f"n_ctx={self.n_ctx!r} must be a positive int")
        if self.positions is not None and (
            not ints(self.positions) or any(not 0 <= p < self.n_ctx for p in self.positions)
        ):
            raise InvalidInputError(
                f"positions={self.positions!r} must be a tuple of ints in [0, {self.n_ctx})"
            )
        if self.perm is not None:
            if not ints(self.perm) or sorted(self.perm) != list(range(len(self.perm))):
                raise InvalidInputError(f"perm={self.perm!r} must be a tuple permutation of 0..T-1")
            if self.positions is not None:
                moved = [i for i, p in enumerate(self.perm) if p != i]
                if not set(moved) <= set(self.positions):
                    raise InvalidInputError(
                        f"perm moves positions {moved[:8]} but positions={list(self.positions)}; "
                        "with positions=, perm may only permute those positions among themselves"
                    )

    def source(self, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(source [pos] int64, changed [pos] bool)`` for a sequence of ``n_pos``.

        The tensors are fresh copies (the hooks share cached ones internally).

        Raises:
            InvalidInputError: ``n_pos`` is not a positive int, ``perm`` does not match the
                sequence length, or a shifted position leaves ``[0, n_ctx)``.
        """
        if isinstance(n_pos, bool) or not isinstance(n_pos, int) or n_pos < 1:
            raise InvalidInputError(f"n_pos={n_pos!r} must be a positive int")
        source, changed = _source(self, n_pos)
        return source.clone(), changed.clone()


def _source(plan: PositionPlan, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Cached tensors are made outside inference mode: a plan first used under
    # torch.inference_mode must still work in a later forward pass that tracks gradients.
    with torch.inference_mode(False):
        return _cached_source(plan, n_pos)


@lru_cache(maxsize=256)
def _cached_source(plan: PositionPlan, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    cpu = torch.device("cpu")  # the plan's tables are made once, on the CPU, then moved
    own = torch.arange(n_pos, device=cpu)
    changed = torch.ones(n_pos, dtype=torch.bool, device=cpu)
    if plan.positions is not None:
        changed = torch.zeros(n_pos, dtype=torch.bool, device=cpu)
        chosen = [p for p in plan.positions if p < n_pos]
        changed[chosen] = True
        if not chosen and plan.how != "none":  # said once per plan and length (cached)
            warnings.warn(
                f"homoglens: positions {list(plan.positions)[:8]} lie beyond these "
                f"{n_pos}-token sequences; the {plan.how!r} ablation changes nothing in them "
                "(give positions below the sequence length)",
                UserWarning,
                stacklevel=2,
            )
    if plan.how in ("none", "mean"):
        return own, changed & (plan.how == "mean")
    if plan.how == "zero":
        return torch.where(changed, torch.zeros_like(own), own), changed
    if plan.how == "permute":
        if plan.perm is not None:
            if len(plan.perm) != n_pos:
                raise InvalidInputError(
                    f"perm has length {len(plan.perm)} but the sequence has {n_pos} positions; "
                    "give a permutation of 0..T-1 for the T you run, or use seed="
                )
            source = torch.tensor(plan.perm, dtype=torch.long, device=cpu)
        else:
            gen = torch.Generator().manual_seed(int(plan.seed or 0))
            idx = torch.nonzero(changed).flatten()
            source = own.clone()
            source[idx] = idx[torch.randperm(len(idx), generator=gen, device=cpu)]
        return torch.where(changed, source, own), changed
    if plan.how == "shift":
        shifted = own + int(plan.shift or 0)
        bad = changed & ((shifted < 0) | (shifted >= plan.n_ctx))
        if bool(bad.any()):
            first = int(torch.nonzero(bad)[0])
            raise InvalidInputError(
                f"shift={plan.shift} moves position {first} to {first + int(plan.shift or 0)}, "
                f"outside the context window [0, {plan.n_ctx}); use a smaller shift or restrict "
                "positions="
            )
        return torch.where(changed, shifted, own), changed
    raise InvalidInputError(f"unknown position ablation {plan.how!r}")


def learned_position_hook(
    table: Float[torch.Tensor, "n_ctx d_model"], plan: PositionPlan
) -> HookFn:
    """Hook for ``hook_pos_embed`` ``[batch pos d_model]`` of a learned absolute table.

    Args:
        table: The model's positional embedding table ``W_pos`` (as the model uses it).
        plan: What each token receives: zeros (``"zero"``), ``table[source]``, or the mean of
            ``table[:T]`` over the T positions of the sequence (``"mean"``).

    Returns:
        A TransformerLens hook function returning the changed positional embeddings.
    """

    def hook(pos_embed: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
        n_pos = pos_embed.shape[1]
        source, changed = _source(plan, n_pos)
        rows = table.to(device=pos_embed.device, dtype=pos_embed.dtype)
        if plan.how == "zero":
            new = torch.zeros_like(pos_embed[0])
        elif plan.how == "mean":
            new = rows[:n_pos].mean(0, keepdim=True).expand(n_pos, -1)
        else:
            new = rows[source.to(pos_embed.device)]
        mask = changed.to(pos_embed.device)[None, :, None]
        return torch.where(mask, new[None], pos_embed)

    return hook


def rotary_table_hook(
    rotary: Callable[[torch.Tensor, torch.device], tuple[torch.Tensor, torch.Tensor]],
    which: Literal["cos", "sin"],
    plan: PositionPlan,
) -> HookFn:
    """Hook for a rotary table ``[1|batch pos rotary_dim]`` (``hook_cos`` / ``hook_sin``).

    Args:
        rotary: The model's own rotary function: ``(source positions [pos], device)`` ->
            ``(cos, sin)`` each ``[1 pos rotary_dim]``; so "zero" equals every token at index 0
            exactly.
        which: Which of the two tables this hook point carries.
        plan: Source position of each token.

    Returns:
        A TransformerLens hook function returning the replaced table.
    """
    pick = 0 if which == "cos" else 1

    def hook(table: Float[torch.Tensor, "batch pos rotary_dim"], hook: Any) -> torch.Tensor:
        source, changed = _source(plan, table.shape[1])
        new = rotary(source, table.device)[pick].to(table.dtype)
        if plan.positions is None:  # every position changes
            return new.expand_as(table)
        return torch.where(changed.to(table.device)[None, :, None], new, table)

    return hook


def rerotate_hook(
    cos: Float[torch.Tensor, "n_ctx rotary_dim"],
    sin: Float[torch.Tensor, "n_ctx rotary_dim"],
    rotate: Callable[[torch.Tensor], torch.Tensor],
    plan: PositionPlan,
) -> HookFn:
    """Hook for ``hook_rot_q``/``hook_rot_k`` ``[batch pos head_index d_head]`` of a
    ``HookedTransformer``: turn each token's rotation for position p into the rotation for its
    source position, by rotating the already rotated vector once more by (source - p).

    Rotary rotations of one frequency compose, R(a) R(b) = R(a + b), so R(source - p) R(p) q =
    R(source) q; a token whose source is its own position is returned unchanged, bitwise.
    They also commute, so the same hook serves *before* a rotation by p: GPT-J's bridge
    (``blocks.{l}.attn.hook_q/hook_k`` ``[batch pos head_index d_head]``, rotated next by the
    Hugging Face module) gets R(p) R(source - p) q = R(source) q.

    Args:
        cos: The attention layer's ``rotary_cos`` buffer (rows = positions 0..n_ctx-1), or
            GPT-J's Hugging Face table in the same layout (each frequency repeated per pair).
        sin: The attention layer's ``rotary_sin`` buffer (or GPT-J's, likewise).
        rotate: The layer's own ``rotate_every_two`` (handles both pairing conventions).
        plan: Source position of each token.

    Returns:
        A TransformerLens hook function returning the re-rotated queries or keys.
    """
    rotary_dim = int(cos.shape[-1])
    tables: dict[str, Any] = {}

    def rows(source: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Any:
        # The plan returns the same source tensor for every forward of a given length. The
        # cache is built outside inference mode, so passes with gradients can use it too.
        if tables.get("source") is not source or tables.get("key") != (device, dtype):
            with torch.inference_mode(False):
                delta = source - torch.arange(len(source), device=source.device)
                index = delta.abs().to(cos.device)
                sign = torch.where(delta < 0, -1.0, 1.0).to(cos.device, sin.dtype)[:, None]
                tables.update(
                    source=source,
                    key=(device, dtype),
                    c=cos[index].to(device=device, dtype=dtype)[None, :, None, :],
                    s=(sin[index] * sign).to(device=device, dtype=dtype)[None, :, None, :],
                )
        return tables["c"], tables["s"]

    def hook(
        rotated: Float[torch.Tensor, "batch pos head_index d_head"], hook: Any
    ) -> torch.Tensor:
        source, changed = _source(plan, rotated.shape[1])
        c, s = rows(source, rotated.device, rotated.dtype)
        if rotary_dim == rotated.shape[-1]:
            new = rotated * c + rotate(rotated) * s
        else:
            x_rot, x_pass = rotated[..., :rotary_dim], rotated[..., rotary_dim:]
            new = torch.cat([x_rot * c + rotate(x_rot) * s, x_pass], dim=-1)
        if plan.positions is None:  # every position changes
            return new
        return torch.where(changed.to(rotated.device)[None, :, None, None], new, rotated)

    return hook


def alibi_score_hook(slopes: Float[torch.Tensor, " head_index"], plan: PositionPlan) -> HookFn:
    """Hook for ``blocks.{l}.attn.hook_attn_scores`` ``[batch head_index query_pos key_pos]`` of
    an ALiBi model (BLOOM, MPT): give each token the bias of its source position.

    ALiBi adds ``-slope_h * (i - j)`` to the score of query i and key j (Press et al. 2022).
    Under a softmax over keys that equals ``slope_h * j`` plus a constant per row, which is how
    BLOOM and MPT build it; with positions ``s`` it is ``slope_h * s_j`` plus a row constant
    for any assignment of positions. The hook therefore adds ``slope_h * (s_j - j)``: nothing
    where a token keeps its position; the whole bias removed under ``"zero"`` (every s_j = 0);
    the bias of the permuted or shifted positions otherwise (a global shift changes nothing).
    Masked scores stay masked (a finite change to a -inf or dtype-minimum entry).

    Args:
        slopes: The model's per-head ALiBi slopes (from its own bias builder).
        plan: Source position of each token.

    Returns:
        A TransformerLens hook function returning the changed scores.
    """

    def hook(scores: Float[torch.Tensor, "batch head_index query_pos key_pos"], hook: Any) -> Any:
        source, _ = _source(plan, scores.shape[-1])
        moved = (source - torch.arange(len(source))).to(scores.device, torch.float64)
        delta = slopes.to(scores.device, torch.float64)[:, None] * moved[None, :]
        return scores + delta.to(scores.dtype)[None, :, None, :]

    return hook


def sink_removal_delta(
    pattern: Float[torch.Tensor, "batch head_index query_pos key_pos"], key: int
) -> Float[torch.Tensor, "batch head_index query_pos key_pos"]:
    """The change of every head's pattern when its attention to ``key`` is removed and each row
    renormalised over the other keys (rows whose only key is the sink: no change)."""
    rest = 1.0 - pattern[..., key]
    removed = pattern.clone()
    removed[..., key] = 0.0
    renormalised = removed / torch.where(rest > 0, rest, torch.ones_like(rest))[..., None]
    return torch.where((rest > 0)[..., None], renormalised, pattern) - pattern


def remove_sink_hook(heads: list[int], key: int, *, scale: float = 1.0) -> HookFn:
    """Hook for ``blocks.{l}.attn.hook_pattern`` ``[batch head_index query_pos key_pos]``:
    remove the chosen heads' attention to ``key`` and renormalise each row over the other keys.

    A query whose only attended key is the sink (its row holds nothing else) keeps its row
    unchanged, so no row ever becomes all zeros.

    Args:
        heads: Head indices of this layer to change.
        key: 0-indexed key position of the sink.
        scale: Apply only this fraction of the change (1 = full removal); small values probe
            the first-order effect.

    Returns:
        A TransformerLens hook function returning the changed pattern.
    """
    index = list(heads)

    def hook(pattern: Float[torch.Tensor, "batch head_index query_pos key_pos"], hook: Any) -> Any:
        out = pattern.clone()
        out[:, index] = out[:, index] + scale * sink_removal_delta(out[:, index], key)
        return out

    return hook


def mean_head_hook(heads: list[int], mean_z: Float[torch.Tensor, "head d_head"]) -> HookFn:
    """Hook for ``blocks.{l}.attn.hook_z`` ``[batch pos head_index d_head]``: mean-ablate the
    chosen heads, replacing their output at every position by ``mean_z`` (one row per entry of
    ``heads``: the head's mean ``z`` over the real tokens of a corpus).

    Returns:
        A TransformerLens hook function returning the changed ``z``.
    """
    index = list(heads)

    def hook(z: Float[torch.Tensor, "batch pos head_index d_head"], hook: Any) -> Any:
        out = z.clone()
        out[:, :, index] = mean_z.to(device=z.device, dtype=z.dtype)[None, None]
        return out

    return hook


def set_massive_hook(
    positions: list[int] | tuple[int, ...],
    dims: list[int] | tuple[int, ...],
    values: Float[torch.Tensor, "pos d_model"],
) -> HookFn:
    """Hook for a residual stream ``[batch pos d_model]`` (``blocks.{l}.hook_resid_post``):
    set the entries at ``positions`` x ``dims`` to ``values`` in every row, the rest unchanged.

    Sun et al.'s ``set_zero`` (``values`` all 0) and ``set_mean`` (``values`` the entries' means
    over a reference corpus); positions beyond a batch's width are skipped (a pass where all
    are beyond is said with a warning).

    Args:
        positions: Column indices (0 = first token of a right-padded row).
        dims: Residual dimensions.
        values: ``[len(positions) len(dims)]``, the value of each (position, dimension).

    Returns:
        A TransformerLens hook function returning the changed stream (a copy).

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762
        (``lib/hook.py`` of locuslab/massive-activations).
    """
    pos, dim = list(positions), list(dims)
    said: set[int] = set()

    def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> Any:
        keep = [i for i, p in enumerate(pos) if p < resid.shape[1]]
        if not keep:
            if int(resid.shape[1]) not in said:  # said once per width
                said.add(int(resid.shape[1]))
                warnings.warn(
                    f"homoglens: positions {pos[:8]} lie beyond these {int(resid.shape[1])}-token "
                    "sequences; setting the massive activations changes nothing in them (give "
                    "positions below the sequence length)",
                    UserWarning,
                    stacklevel=2,
                )
            return resid
        out = resid.clone()
        rows = torch.tensor([pos[i] for i in keep], device=resid.device)
        cols = torch.tensor(dim, device=resid.device)
        new = values[keep].to(device=resid.device, dtype=resid.dtype)
        out[:, rows[:, None], cols[None, :]] = new[None]
        return out

    return hook
