"""The one-token perturbation spread of Barbero et al. 2025 ("Why do LLMs attend to the first
token?", arXiv 2504.02732): how far a change of one token spreads through the residual stream
of the later positions, layer by layer, with and without a BOS (an attention sink).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.stats import estimate
from homoglens.core.types import (
    PERTURBATIONS,
    BosPolicy,
    HookedModel,
    HookFn,
    ModelInput,
    Perturbation,
)
from homoglens.core.validate import (
    as_float,
    as_int,
    check_layers,
    require_finite,
)
from homoglens.models.architectures import resid_hook_name
from homoglens.models.loading import model_info
from homoglens.reproductions.perturbation_result import PerturbationSpread
from homoglens.run.data import DataInput, TokenBatch, to_token_batch
from homoglens.run.data.batch import packed, resolve_bos, tokenizer_bos
from homoglens.run.engine import Pass, PassPlan, Sums
from homoglens.run.entrance import entrance
from homoglens.run.interventions import residual_write_hooks
from homoglens.run.provenance import provenance_of

__all__ = ["perturbation_spread"]


def perturbation_spread(
    model: ModelInput,
    data: DataInput,
    *,
    position: int = 4,
    how: Perturbation = "replace",
    token: int | None = None,
    scale: float = 1.0,
    layers: list[int] | tuple[int, ...] | int | None = None,
    bos: BosPolicy | bool = "auto",
    threshold: float = 0.1,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = True,
) -> PerturbationSpread:
    """How far a one-token perturbation spreads through the residual stream (Barbero et al.
    2025, Section 4: attention sinks slow the mixing of a perturbation into later tokens).

    Each window runs twice in one engine stream (a pass plan of two passes per batch): clean,
    and with the token at ``position`` perturbed. At every residual entry l and every position
    p at or after the perturbed token the relative change ``||h'_{l,p} - h_{l,p}|| /
    ||h_{l,p}||`` (float64 on the model's stream) is kept per window; the per-layer spread is
    its mean over the positions after the token (d >= 1), with a block-bootstrap interval over
    windows (:func:`homoglens.core.stats.estimate`).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` in eval mode.
        data: Token ids ``[batch pos]``, a ``TokenBatch``, texts, a text file or a dataset.
        position: The perturbed token, counted among the window's tokens after its BOS (0 =
            the first token of the text), so that BOS on and BOS off perturb the same token.
            It must leave at least one later token in every window.
        how: ``"replace"``: the token's id replaced by ``token``; ``"noise"``: Gaussian noise
            of norm ``scale * ||x||`` (a random direction per window) added to the token's
            block-0 input x (its embedding, plus learned positions where the model has them).
        token: The replacing id (``how="replace"``); ``None``: per window a token drawn (with
            ``seed``) from the windows' own tokens, never the original or the BOS.
        scale: The noise's norm relative to the block-0 input (``how="noise"``), >= 0; 0 is
            the null (no change).
        layers: Entries of the ``n_layers + 1`` residual axis (0 = embeddings); default all.
        bos: For text: the usual policy (``"auto"``, ``"always"``/``True``, ``"never"``/
            ``False``). For token ids: ``"auto"`` keeps them as given, ``"always"``/``True``
            puts a BOS in front of each window that lacks one, ``"never"``/``False`` drops a
            leading BOS: the same windows with or without the sink, for a paired comparison
            (:meth:`PerturbationSpread.difference`).
        threshold: Relative change above which a later position counts as reached, > 0.
        seed: Seed of the replacing tokens and noise directions.
        batch_size: Windows per forward pass.
        progress: Show a progress bar.

    Returns:
        :class:`~homoglens.results.PerturbationSpread`: ``change[layer distance]``, the
        per-layer ``spread`` with its interval, the per-window values.

    Raises:
        InvalidInputError: an unknown ``how`` or ``bos``; ``position`` out of range (the
            message names the shortest window's length); ``token`` outside the vocabulary;
            bad ``layers``, ``scale``, ``threshold`` or ``batch_size``.
        SequenceTooLongError: a window with its BOS is longer than ``cfg.n_ctx``.
        NonFiniteActivationError: NaN/inf in the residual stream.

    References:
        Barbero et al. 2025, "Why do LLMs attend to the first token?", arXiv 2504.02732.

    Examples:
        >>> import torch
        >>> from homoglens import load_model, perturbation_spread
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> tokens = torch.randint(1, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
        >>> r = perturbation_spread(model, tokens, position=3, progress=False)
        >>> tuple(r.change.shape), float(r.before_max.max())
        ((3, 9), 0.0)
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    if not isinstance(how, str) or how not in PERTURBATIONS:
        raise InvalidInputError(f"how={how!r} must be one of {list(PERTURBATIONS)}")
    tokens_given = isinstance(data, (torch.Tensor, TokenBatch))
    batch = call.batch(data, bos="auto" if tokens_given else bos)
    batch = _with_bos(model, batch, bos) if tokens_given else batch
    chosen = check_layers(layers, int(model.cfg.n_layers))
    position = as_int("position", position, low=0)
    scale = as_float("scale", scale, low=-math.inf, high=math.inf) if how == "noise" else 0.0
    if scale < 0:
        raise InvalidInputError(f"scale={scale} must be >= 0 (0: no noise, the null)")
    threshold = as_float("threshold", threshold, low=0.0, high=math.inf)
    if threshold <= 0:
        raise InvalidInputError(f"threshold={threshold} must be > 0 (a relative change)")
    seed = as_int("seed", seed)
    bos_id = tokenizer_bos(model)
    at = _perturbed_positions(batch, position, bos_id)
    n_dist = int((batch.lengths - at).max())
    d_model = int(model.cfg.d_model)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if how == "replace":
        new = _replacements(model, batch, at, token, bos_id, gen)
    else:
        new = torch.randn(len(batch), d_model, generator=gen, dtype=torch.float64, device="cpu")
        new = torch.nn.functional.normalize(new, dim=-1)
    red = Sums(rows={"change": (len(chosen), n_dist), "before": (len(chosen),)})
    plan = _Plan(model, chosen, how, scale, bos_id, position, new, n_dist, red)
    plan.window = call.shard(len(batch))[0]
    call.stream(
        batch,
        [red],
        desc="perturbation",
        passes=plan.step,
    )
    return _result(red, batch, chosen, how, position, scale, threshold, model)


def _result(
    red: Sums,
    batch: TokenBatch,
    chosen: tuple[int, ...],
    how: str,
    position: int,
    scale: float,
    threshold: float,
    model: HookedModel,
) -> PerturbationSpread:
    """The result of the merged per-window rows."""
    change = red.row_values("change")  # [window layer distance]
    after = change[:, :, 1:]
    window_spread = after.nanmean(-1)
    counted = (~after.isnan()).sum(-1).double()
    window_reach = (after > threshold).sum(-1).double() / counted
    spread = window_spread.nanmean(0)
    low, high = [], []
    for i in range(len(chosen)):
        e = estimate([window_spread[:, i][None]])
        low.append(e.ci_low)
        high.append(e.ci_high)
    f64 = {"dtype": torch.float64, "device": "cpu"}
    return PerturbationSpread(
        layers=chosen,
        position=position,
        how=how,
        scale=scale,
        threshold=threshold,
        change=change.nanmean(0),
        window_spread=window_spread,
        window_reach=window_reach,
        spread=spread,
        spread_low=torch.tensor(low, **f64),
        spread_high=torch.tensor(high, **f64),
        before_max=red.row_values("before").amax(0),
        n_sequences=len(batch),
        provenance=provenance_of(model_info(model), batch, chosen, False),
    )


@dataclass
class _Plan:
    """The two passes of each batch (clean, then perturbed) and the per-window rows they
    add to ``red``; ``window`` is the index of the batch's first window in the corpus."""

    model: HookedModel
    layers: tuple[int, ...]
    how: str
    scale: float
    bos_id: int | None
    position: int
    new: torch.Tensor  # [window] replacing ids, or [window d_model] unit noise directions
    n_dist: int
    red: Sums
    window: int = 0

    def step(self, tokens: Int[torch.Tensor, "batch pos"], mask: torch.Tensor) -> PassPlan:
        """One batch's pass plan: the clean pass (keeping the entries read), then the
        perturbed pass (adding each window's relative changes to ``red``)."""
        b = int(tokens.shape[0])
        first = mask.long().argmax(1)  # right-aligned rows: the first real token
        lead = tokens.gather(1, first[:, None])[:, 0]
        at = first + self.position
        if self.bos_id is not None:
            at = at + (lead == self.bos_id).long()
        rows = torch.arange(b, device=tokens.device)
        new = self.new[self.window : self.window + b]
        self.window += b
        names = [resid_hook_name(layer) for layer in self.layers]
        clean: dict[str, torch.Tensor] = {}
        yield Pass(tokens, [(n, _keep(clean, n)) for n in names], names, attention_mask=mask)
        changed: dict[str, torch.Tensor] = {}  # [batch pos] relative changes, not the stream
        hooks = [(n, _relative_change(clean, changed, n)) for n in names]
        inputs = tokens
        if self.how == "replace":
            inputs = tokens.clone()
            inputs[rows, at] = new.to(tokens.device)
        else:
            noise = _noise_hook(rows, at, new, self.scale)
            hooks = [*residual_write_hooks(self.model, "resid_pre", 0, noise), *hooks]
        yield Pass(inputs, hooks, names, attention_mask=mask)
        self._add(changed, names, mask, at)

    def _add(
        self,
        changed: dict[str, torch.Tensor],
        names: list[str],
        mask: torch.Tensor,
        at: torch.Tensor,
    ) -> None:
        """Each window's relative change per entry (``changed``), by distance from the perturbed
        token."""
        b, width = mask.shape
        pos = torch.arange(width, device=mask.device)
        distance = pos[None, :] - at[:, None]  # [batch pos]
        real = mask.bool()
        out = torch.full(
            (b, len(names), self.n_dist), math.nan, dtype=torch.float64, device=mask.device
        )
        before = torch.zeros(b, len(names), dtype=torch.float64, device=mask.device)
        for i, name in enumerate(names):
            rel = changed.pop(name)  # [batch pos]
            require_finite(rel[real], name, "relative changes of the residual stream")
            keep = real & (distance >= 0)
            out[:, i][keep.nonzero(as_tuple=True)[0], distance[keep]] = rel[keep]
            early = real & (distance < 0)
            before[:, i] = torch.where(early, rel, torch.zeros_like(rel)).amax(-1)
        self.red.rows["change"].append(out.cpu())
        self.red.rows["before"].append(before.cpu())


def _keep(store: dict[str, torch.Tensor], name: str) -> HookFn:
    """A hook keeping a detached copy of its activation in ``store[name]``."""

    def hook(activation: torch.Tensor, hook: Any) -> None:
        store[name] = activation.detach().clone()

    return hook


def _relative_change(
    clean: dict[str, torch.Tensor], changed: dict[str, torch.Tensor], name: str
) -> HookFn:
    """A hook of the perturbed pass: ``||h' - h|| / ||h||`` per position against the clean
    pass's kept ``h`` (float64), stored in ``changed[name]``; the clean copy is dropped, so
    only one pass's stream is held."""

    def hook(activation: torch.Tensor, hook: Any) -> None:
        h = clean.pop(name).double()
        changed[name] = (activation.detach().double() - h).norm(dim=-1) / h.norm(dim=-1)

    return hook


def _noise_hook(
    rows: torch.Tensor, at: torch.Tensor, directions: torch.Tensor, scale: float
) -> HookFn:
    """A write of the block-0 input adding ``scale * ||x|| * direction`` at each row's token."""

    def hook(x: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
        x = x.clone()
        token = x[rows, at]
        unit = directions.to(device=x.device, dtype=torch.float64)
        size = token.double().norm(dim=-1, keepdim=True) * scale
        x[rows, at] = (token.double() + size * unit).to(x.dtype)
        return x

    return hook


def _with_bos(model: HookedModel, batch: TokenBatch, bos: BosPolicy | bool) -> TokenBatch:
    """Token input under the ``bos`` policy: ``"auto"`` as given, else a BOS put in front of
    (or dropped from) every window."""
    if bos == "auto":
        return batch
    want = resolve_bos(model, bos)
    bos_id = tokenizer_bos(model)
    if bos_id is None:
        if want:
            raise InvalidInputError(
                "bos=True needs a BOS token, and the model's tokenizer has none; use bos='auto'"
            )
        return batch
    rows = []
    for tokens, mask in zip(batch.tokens, batch.attention_mask, strict=True):
        row = [int(t) for t in tokens[mask.bool()]]
        has = bool(row) and row[0] == bos_id
        rows.append([bos_id, *row] if want and not has else row[1:] if has and not want else row)
    if any(not row for row in rows):
        raise InvalidInputError("bos='never' left a window empty (it held only a BOS)")
    return to_token_batch(model, packed(model, rows, batch.description))


def _perturbed_positions(
    batch: TokenBatch, position: int, bos_id: int | None
) -> Int[torch.Tensor, " window"]:
    """Each window's perturbed index among its real tokens; an error naming the shortest
    window when ``position`` leaves no later token."""
    first = batch.attention_mask.long().argmax(1)
    lead = batch.tokens.gather(1, first[:, None])[:, 0]
    offset = (lead == bos_id).long() if bos_id is not None else torch.zeros_like(lead)
    at = offset + position
    short = at >= batch.lengths - 1
    if bool(short.any()):
        i = int(short.nonzero()[0, 0])
        raise InvalidInputError(
            f"position={position} leaves no later token in window {i}, whose length is "
            f"{int(batch.lengths[i])} tokens (BOS {'included' if int(offset[i]) else 'none'}); "
            f"use position <= {int(batch.lengths.min() - offset.max()) - 2}, or longer windows"
        )
    return at


def _replacements(
    model: HookedModel,
    batch: TokenBatch,
    at: torch.Tensor,
    token: int | None,
    bos_id: int | None,
    gen: torch.Generator,
) -> Int[torch.Tensor, " window"]:
    """The replacing id of each window: ``token``, or one drawn from the windows' own tokens
    (never the original, nor the BOS)."""
    rows = torch.arange(len(batch), device="cpu")
    original = batch.tokens[rows, batch.attention_mask.long().argmax(1) + at]
    if token is not None:
        token = as_int("token", token, low=0, high=int(model.cfg.d_vocab) - 1)
        return torch.full((len(batch),), token, dtype=torch.long, device="cpu")
    pool = batch.tokens[batch.attention_mask.bool()].unique()
    if bos_id is not None:
        pool = pool[pool != bos_id]
    out = torch.empty(len(batch), dtype=torch.long, device="cpu")
    for i in range(len(batch)):
        choices = pool[pool != original[i]]
        if len(choices) == 0:
            raise InvalidInputError(
                "the windows hold no token other than the perturbed one to replace it by; "
                "pass token= (an id of the vocabulary)"
            )
        drawn = torch.randint(len(choices), (1,), generator=gen, device="cpu")
        out[i] = choices[int(drawn)]
    return out
