"""``homogenization_profile``: stream a corpus through a model, reduce each batch in hooks.

Each batch's residual stream is reduced inside the forward hooks to per-(layer, position)
sums (:func:`homoglens.homogenization.homogenization_sums`); no activation outlives its hook,
and nothing caches every layer's ``[batch pos d_model]`` at once. Peak memory therefore depends
on ``batch_size``, not on the number of sequences.
"""

from __future__ import annotations

import operator
import os
import warnings
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from typing import Any

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from homoglens._checks import as_bool, as_int
from homoglens.data import TokenBatch, _check_mask, right_aligned, to_token_batch
from homoglens.distributed import (
    all_reduce_sum,
    check_same_data,
    gather_rows,
    shard_bounds,
    world,
)
from homoglens.errors import InvalidInputError, ModelStateError, NonFiniteActivationError
from homoglens.homogenization import RANK_FIELDS, homogenization_sums, positions_from_mask
from homoglens.models import model_info
from homoglens.results import HomogenizationProfile, Provenance
from homoglens.types import BosPolicy, HookedModel

__all__ = [
    "homogenization_profile",
    "cosine_homogenization",
    "resid_hook_name",
    "NonFiniteActivationError",
]


def _version(package: str) -> str:
    try:
        return _pkg_version(package)
    except PackageNotFoundError:
        return ""


def resid_hook_name(layer: int) -> str:
    """TransformerLens hook name of entry ``layer`` of the ``n_layers + 1`` residual axis.

    Entry 0 is the input of block 0 (``blocks.0.hook_resid_pre``: token plus positional
    embeddings); entry l >= 1 is the output of block l - 1 (``blocks.{l-1}.hook_resid_post``).
    This is the Hugging Face ``output_hidden_states`` convention, without the final norm.
    """
    layer = as_int("layer", layer, low=0)
    return "blocks.0.hook_resid_pre" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"


def _check_layers(layers: Any, n_layers: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(n_layers + 1))
    if type(layers).__module__ == "numpy" and getattr(layers, "ndim", 0) >= 1:
        layers = torch.as_tensor(layers)
    if isinstance(layers, torch.Tensor):
        if layers.is_floating_point() or layers.is_complex() or layers.ndim > 1:
            raise InvalidInputError(
                f"layers must be ints, got a {layers.dtype} tensor of shape {tuple(layers.shape)}"
            )
        layers = layers.reshape(-1).tolist()
    elif hasattr(layers, "__index__") and not isinstance(layers, bool):
        layers = [layers]
    try:
        chosen = list(layers)
    except TypeError as err:
        raise InvalidInputError(f"layers={layers!r} must be a list of ints") from err
    if not chosen:
        raise InvalidInputError("layers is empty; give entries in 0..n_layers or None for all")
    not_int = [
        layer for layer in chosen if isinstance(layer, bool) or not hasattr(layer, "__index__")
    ]
    if not_int:
        raise InvalidInputError(f"layers must hold ints, got {not_int[:5]}")
    chosen = [operator.index(layer) for layer in chosen]  # numpy and torch integers too
    bad = [layer for layer in chosen if not 0 <= layer <= n_layers]
    if bad:
        raise InvalidInputError(
            f"layers {bad} are out of range: entries of the residual axis are 0..{n_layers} "
            f"(0 = embeddings, l = output of block l-1; this model has {n_layers} blocks)"
        )
    if len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"layers={chosen} has repeats")
    return tuple(sorted(chosen))


def _check_positive_int(name: str, value: Any) -> int:
    return as_int(name, value, low=1)


class _Accumulator:
    """Float64 running sums for a profile, on the model's device."""

    def __init__(
        self, n_layer: int, n_pos: int, d_model: int, device: torch.device, effective_rank: bool
    ) -> None:
        f64 = {"dtype": torch.float64, "device": device}
        self.layer_pos = {
            name: torch.zeros(n_layer, n_pos, **f64)
            for name in ("to_others_sum", "to_prefix_sum", "to_mean_sum", "norm_sum")
        }
        self.layer = {
            name: torch.zeros(n_layer, **f64)
            for name in ("mean_pairwise_sum", "relative_residual_sum", "unit_sum_sq")
            + (RANK_FIELDS if effective_rank else ())
        }
        self.unit_sum = torch.zeros(n_layer, d_model, **f64)
        self.pos = {name: torch.zeros(n_pos, **f64) for name in ("count", "prefix_count")}
        self.scalars = {"n_sequences": 0, "n_tokens": 0, "n_tokens_sq": 0}

    def add(self, i: int, sums: dict[str, torch.Tensor], first: bool) -> None:
        # .to(): with a model split over devices, later blocks run on other devices
        for name, acc in self.layer_pos.items():
            acc[i] += sums[name].to(acc.device)
        for name, acc in self.layer.items():
            acc[i] += sums[name].to(acc.device)
        self.unit_sum[i] += sums["unit_sum"].to(self.unit_sum.device)
        if first:  # layer-independent quantities, counted once per batch
            for name, acc in self.pos.items():
                acc += sums[name].to(acc.device)
            for name in self.scalars:
                self.scalars[name] += int(round(float(sums[name])))

    def profile(self, layers: tuple[int, ...], provenance: Provenance) -> HomogenizationProfile:
        cpu = {k: v.cpu() for k, v in {**self.layer_pos, **self.layer}.items()}
        cpu.update({k: v.round().long().cpu() for k, v in self.pos.items()})  # exact counts
        return HomogenizationProfile(
            layers=layers,
            unit_sum=self.unit_sum.cpu(),
            provenance=provenance,
            **self.scalars,
            **cpu,
        )


def _check_min_tokens(batch: TokenBatch, exclude_first: bool) -> None:
    need = 3 if exclude_first else 2
    short = torch.nonzero(batch.lengths < need).flatten().tolist()
    if short:
        raise InvalidInputError(
            f"sequences {short[:10]} have fewer than {need} tokens; homogenization compares "
            f"tokens with each other, so each sequence needs at least {need}"
            + (" (position 0 is excluded)" if exclude_first else "")
        )


def _model_device(model: HookedModel, *, needs_grad: bool = False) -> torch.device:
    """The model's device, after the one check of its state every streaming function makes
    before its first pass.

    Refuses a model any of whose submodules is in training mode (dropout would make every
    measurement random; ``model.training`` alone misses a submodule switched back with
    ``.train()``), and, where gradients are needed (``needs_grad``), weights created under
    ``torch.inference_mode`` (autograd cannot save them for the backward pass).

    Raises:
        ModelStateError: names the submodules in training mode, or the inference-mode weights.
    """
    training = [name or "<model>" for name, module in model.named_modules() if module.training]
    if training:
        shown = ", ".join(training[:5]) + (
            f" and {len(training) - 5} more" if len(training) > 5 else ""
        )
        raise ModelStateError(
            f"{len(training)} submodule(s) of the model are in training mode ({shown}): dropout "
            "would make every result random; call model.eval() first"
        )
    if needs_grad:
        frozen = [name for name, p in model.named_parameters() if p.is_inference()]
        if frozen:
            raise ModelStateError(
                f"{len(frozen)} weight(s) were created under torch.inference_mode ({frozen[0]}, "
                "...), so autograd cannot differentiate through them; load the model outside "
                "torch.inference_mode(), or use method='exact'"
            )
    return next(model.parameters()).device


def homogenization_profile(
    model: HookedModel,
    data: TokenBatch | Int[torch.Tensor, "batch pos"] | str | list[str] | os.PathLike[str],
    *,
    layers: list[int] | tuple[int, ...] | int | None = None,
    batch_size: int = 8,
    exclude_first: bool = False,
    effective_rank: bool = False,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> HomogenizationProfile:
    """Measure how alike the residual-stream token vectors are, per layer and position.

    Streams ``data`` through ``model`` in batches; each batch is reduced inside forward hooks
    to sums per (layer, position), so memory does not grow with the number of sequences.
    Pads never enter any statistic; positions count from each sequence's first real token
    (left and right padding give the same result); statistics are accumulated in float64
    whatever the model dtype.

    Metrics (see :class:`HomogenizationProfile` and SCIENCE.md): ``to_others[layer pos]``
    (mean cosine of a token to the other tokens of its sequence), ``to_prefix``, ``to_mean``,
    ``mean_pairwise[layer]``, ``baseline[layer]`` (anisotropy: mean cosine across sequences,
    exact), ``adjusted = mean_pairwise - baseline``, ``relative_residual``, ``norm``,
    ``count[pos]``, and on request the rank metrics ``effective_rank`` (norm-weighted: it
    mostly measures the first token's massive activations), ``unit_effective_rank`` and
    ``matrix_entropy`` (unit rows) and their ``*_no_first`` variants. Cosines lie in [-1, 1].

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` (see :func:`load_model`).
        data: Token ids ``[batch pos]`` (used as given, no BOS added), a
            :class:`~homoglens.data.TokenBatch`, a ``str``, a ``list[str]`` or a text-file path
            (see :func:`~homoglens.data.to_token_batch`).
        layers: Entries of the ``n_layers + 1`` residual axis to measure: 0 = input of block 0
            (embeddings, positional included), l = output of block l - 1. Default: all.
        batch_size: Sequences per forward pass (memory scales with it).
        exclude_first: Leave position 0 (the first real token, often BOS, which carries massive
            activations) out of every statistic; its row is NaN.
        effective_rank: Also compute each sequence's rank metrics: the effective rank of the
            vectors as they are, and on unit rows the effective rank and the matrix entropy,
            with and without position 0 (three SVDs per sequence and layer).
        attention_mask: ``[batch pos]`` 0/1 mask for token input (left or right padding).
        bos: For text input: ``"auto"`` (``model.cfg.default_prepend_bos``), ``"always"``,
            ``"never"``.
        progress: Show a tqdm progress bar.

    Returns:
        A :class:`HomogenizationProfile` with provenance (model, backend, raw or processed
        weights, BOS, data, counts, versions).

    Raises:
        InvalidInputError: empty input, empty strings, float tokens, a mask of the wrong shape,
            sequences with fewer than 2 counted tokens, bad ``layers``/``batch_size``.
        SequenceTooLongError: a sequence longer than ``cfg.n_ctx``.
        UnsupportedArchitectureError: the model's architecture is not supported.
        NonFiniteActivationError: NaN/inf in the residual stream (nothing is averaged in).

    References:
        Yusupov et al. 2025, "Token Homogenization under Positional Bias", arXiv 2508.17126.
        Ethayarajh 2019 (anisotropy, IntraSim). Dong, Cordonnier, Loukas 2021, arXiv 2103.03404.

    Examples:
        >>> from homoglens import load_model, homogenization_profile
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> prof = homogenization_profile(model, ["The cat sat.", "A dog ran far away."],
        ...                               progress=False)
        >>> tuple(prof.to_others.shape), tuple(prof.mean_pairwise.shape)
        ((3, 7), (3,))
    """
    info = model_info(model)
    chosen = _check_layers(layers, int(model.cfg.n_layers))
    batch_size = _check_positive_int("batch_size", batch_size)
    exclude_first = as_bool("exclude_first", exclude_first)
    effective_rank = as_bool("effective_rank", effective_rank)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    _check_min_tokens(batch, exclude_first)
    if len(batch) == 1:
        warnings.warn(
            "one sequence: the anisotropy baseline (mean cosine across sequences) and so "
            "`adjusted` are NaN; pass several sequences (e.g. a list of texts) to get them",
            stacklevel=2,
        )
    run = _stream(
        model,
        batch,
        chosen,
        batch_size=batch_size,
        exclude_first=exclude_first,
        effective_rank=effective_rank,
        progress=progress,
    )
    return run.accumulator.profile(chosen, _provenance(info, batch, chosen, exclude_first))


def _provenance(
    info: Any, batch: TokenBatch, chosen: tuple[int, ...], exclude_first: bool
) -> Provenance:
    return Provenance(
        model=info.name,
        family=info.family,
        backend=info.backend,
        weights=info.weights,
        dtype=info.dtype,
        model_source=info.source,
        hook_points=tuple(resid_hook_name(layer) for layer in chosen),
        bos=batch.bos,
        data=batch.description,
        exclude_first=exclude_first,
        homoglens_version=_version("homoglens"),
        transformer_lens_version=_version("transformer-lens"),
    )


class _StreamResult:
    """What one streamed pass produced: summed statistics, and optional per-sequence values."""

    def __init__(self, accumulator: _Accumulator) -> None:
        self.accumulator = accumulator
        self.seq_to_others: list[torch.Tensor] = []  # [batch layer pos] float32, CPU
        self.seq_mean_pairwise: list[torch.Tensor] = []  # [batch layer]
        self.seq_loss: list[torch.Tensor] = []  # [batch] mean next-token loss, nats

    def all_reduce(
        self,
        n_all: int,
        shape: tuple[int, int],
        device: torch.device,
        per_sequence: bool,
        loss: bool,
    ) -> None:
        """Sum the statistics over all ranks and gather per-sequence values in input order."""
        acc = self.accumulator
        scalars = torch.tensor(
            [float(acc.scalars[k]) for k in acc.scalars], dtype=torch.float64, device=device
        )
        tensors = [*acc.layer_pos.values(), *acc.layer.values(), acc.unit_sum, *acc.pos.values()]
        all_reduce_sum([*tensors, scalars])
        acc.scalars = {k: int(round(float(v))) for k, v in zip(acc.scalars, scalars, strict=True)}
        n_layer, n_pos = shape
        if per_sequence:
            others = torch.cat([torch.empty(0, n_layer, n_pos), *self.seq_to_others])
            pairwise = torch.cat([torch.empty(0, n_layer), *self.seq_mean_pairwise])
            self.seq_to_others = [gather_rows(others, n_all, device)]
            self.seq_mean_pairwise = [gather_rows(pairwise, n_all, device)]
        if loss:
            losses = torch.cat([torch.empty(0), *self.seq_loss])
            self.seq_loss = [gather_rows(losses, n_all, device)]


def _next_token_loss(
    logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) per sequence over real target tokens (computed a few
    sequences at a time, so no float32 copy of the whole [batch pos d_vocab] logits is made)."""
    target = tokens[:, 1:]
    nll = torch.cat(
        [
            torch.nn.functional.cross_entropy(
                chunk[:, :-1].float().transpose(1, 2), tgt, reduction="none"
            )
            for chunk, tgt in zip(logits.split(4), target.split(4), strict=True)
        ]
    )
    valid = (mask[:, 1:] * mask[:, :-1]).to(nll.dtype)
    return (nll * valid).sum(1) / valid.sum(1).clamp_min(1)


def _batch_bounds(
    lengths: torch.Tensor, batch_size: int, uniform_length: bool
) -> list[tuple[int, int]]:
    """``(start, stop)`` of each forward batch; cut at length changes if ``uniform_length``."""
    bounds, start, n = [], 0, len(lengths)
    while start < n:
        stop = min(start + batch_size, n)
        if uniform_length:
            same = (lengths[start:stop] == lengths[start]).tolist()
            stop = start + (same.index(False) if False in same else len(same))
        bounds.append((start, stop))
        start = stop
    return bounds


class _Through(Exception):
    """Raised by the hook that ends a forward pass after the last hook point it needs."""


def _end_here(activation: torch.Tensor, hook: Any) -> None:
    raise _Through


def _run_through(
    model: HookedModel,
    inputs: torch.Tensor,
    last: str,
    fwd_hooks: list[tuple[str, Any]],
    **kwargs: Any,
) -> None:
    """``model.run_with_hooks(inputs, return_type=None, fwd_hooks=..., **kwargs)``, ended right
    after the hook point ``last`` (and every hook on it) has run: no later block, no final norm
    and no unembedding run. TransformerLens' ``stop_at_layer`` stops before a block, so on the
    bridge it cannot stop after the last one; this stops anywhere, on every backend. The hooks
    are removed by ``run_with_hooks`` as the exception leaves it."""
    try:
        model.run_with_hooks(
            inputs, return_type=None, fwd_hooks=[*fwd_hooks, (last, _end_here)], **kwargs
        )
    except _Through:
        pass


def _stream(
    model: HookedModel,
    batch: TokenBatch,
    chosen: tuple[int, ...],
    *,
    batch_size: int,
    exclude_first: bool,
    effective_rank: bool,
    progress: bool,
    extra_hooks: list[tuple[str, Any]] | None = None,
    per_sequence: bool = False,
    loss: bool = False,
    desc: str = "homogenization",
    uniform_length: bool = False,
) -> _StreamResult:
    """Run ``batch`` through ``model`` once, reducing the residual stream inside hooks.

    With ``uniform_length`` no forward batch mixes sequence lengths (batches are cut where the
    length changes), so position hooks see each sequence's own length as the batch width.
    """
    device = _model_device(model)
    names = [resid_hook_name(layer) for layer in chosen]
    n_pos = int(batch.lengths.max())  # of all sequences, so every rank sums the same shapes
    n_all = len(batch)
    rank, size = world()
    check_same_data(batch.tokens, batch.attention_mask, device)
    start, stop = shard_bounds(n_all, size)[rank]
    batch = batch[start:stop]
    result = _StreamResult(
        _Accumulator(len(chosen), n_pos, int(model.cfg.d_model), device, effective_rank)
    )
    state: dict[str, Any] = {}

    def make_hook(i: int, name: str) -> Any:
        def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
            try:
                sums = homogenization_sums(
                    resid,
                    state["pos_index"].to(resid.device),
                    n_pos,
                    effective_rank=effective_rank,
                    per_sequence=per_sequence,
                )
            except NonFiniteActivationError as err:
                raise NonFiniteActivationError(f"{name}: {err}") from None
            result.accumulator.add(i, sums, first=(i == 0))
            if per_sequence:
                state["to_others"][:, i, : sums["seq_to_others"].shape[1]] = sums["seq_to_others"]
                state["mean_pairwise"][:, i] = sums["seq_mean_pairwise"]

        return hook

    fwd_hooks = list(extra_hooks or []) + [
        (name, make_hook(i, name)) for i, name in enumerate(names)
    ]
    try:
        for tokens, mask in forward_batches(
            batch, batch_size, device, desc=desc, progress=progress, uniform_length=uniform_length
        ):
            state["pos_index"] = positions_from_mask(mask, exclude_first=exclude_first)
            if per_sequence:
                shape = (tokens.shape[0], len(chosen))
                state["to_others"] = torch.full(
                    (*shape, n_pos), float("nan"), dtype=torch.float64, device=device
                )
                state["mean_pairwise"] = torch.zeros(shape, dtype=torch.float64, device=device)
            if loss:
                logits = model.run_with_hooks(
                    tokens, attention_mask=mask, return_type="logits", fwd_hooks=fwd_hooks
                )
                result.seq_loss.append(_next_token_loss(logits, tokens, mask).cpu())
                del logits
            else:
                last = resid_hook_name(max(chosen))  # nothing after it is measured
                _run_through(model, tokens, last, fwd_hooks, attention_mask=mask)
            if per_sequence:
                result.seq_to_others.append(state["to_others"].float().cpu())
                result.seq_mean_pairwise.append(state["mean_pairwise"].float().cpu())
    finally:
        state.clear()
    if size > 1:
        result.all_reduce(n_all, (len(chosen), n_pos), device, per_sequence, loss)
    return result


def forward_batches(
    batch: TokenBatch,
    batch_size: int,
    device: torch.device,
    *,
    desc: str,
    progress: bool,
    uniform_length: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield right-aligned ``(tokens, attention_mask)`` batches on ``device``, under
    ``torch.inference_mode`` and with a tqdm progress bar (the one streaming loop of homoglens:
    profiles, studies, sink scores and massive activations all run through it)."""
    bar = tqdm(total=len(batch), unit="seq", desc=desc, disable=not progress)
    try:
        with torch.inference_mode():
            for start, stop in _batch_bounds(batch.lengths, batch_size, uniform_length):
                tokens, mask = right_aligned(
                    batch.tokens[start:stop], batch.attention_mask[start:stop]
                )
                yield tokens.to(device), mask.to(device)
                bar.update(stop - start)
    finally:
        bar.close()


def cosine_homogenization(
    resid: Float[torch.Tensor, "batch pos d_model"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    *,
    exclude_first: bool = False,
    effective_rank: bool = False,
) -> HomogenizationProfile:
    """Homogenization of given residual vectors (one hook point), no model needed.

    The same statistics as :func:`homogenization_profile`, for activations you already have
    (e.g. from ``run_with_cache``); the result has a single entry on its layer axis (0).

    Args:
        resid: ``[batch pos d_model]`` vectors of one hook point.
        attention_mask: ``[batch pos]`` 0/1, real tokens contiguous per row; default all real.
        exclude_first: Leave each sequence's position 0 out of every statistic.
        effective_rank: Also compute the effective rank per sequence.

    Returns:
        A :class:`HomogenizationProfile` with ``layers == (0,)``.

    Raises:
        InvalidInputError: wrong shapes, or a sequence with fewer than 2 counted tokens.

    Examples:
        >>> import torch
        >>> from homoglens import cosine_homogenization
        >>> same = torch.ones(1, 5, 8)                       # identical vectors
        >>> round(cosine_homogenization(same).mean_pairwise.item(), 6)
        1.0
        >>> round(cosine_homogenization(torch.eye(4)[None]).mean_pairwise.item(), 6)
        0.0
    """
    if not isinstance(resid, torch.Tensor) or resid.ndim != 3 or not resid.is_floating_point():
        raise InvalidInputError(
            "resid must be a float tensor [batch pos d_model], got "
            f"{getattr(resid, 'shape', type(resid).__name__)}"
        )
    exclude_first = as_bool("exclude_first", exclude_first)
    effective_rank = as_bool("effective_rank", effective_rank)
    if resid.shape[0] == 0 or resid.shape[1] == 0 or resid.shape[2] == 0:
        raise InvalidInputError(
            f"resid {tuple(resid.shape)} is empty; give at least one sequence of 2 vectors"
        )
    shape_only = torch.zeros(resid.shape[:2], dtype=torch.long)
    mask = _check_mask(shape_only, attention_mask).to(resid.device)  # same checks as the model path
    pos_index = positions_from_mask(mask, exclude_first=exclude_first)
    n_pos = int(mask.sum(1).max())
    sums = homogenization_sums(resid, pos_index, n_pos, effective_rank=effective_rank)
    acc = _Accumulator(1, n_pos, int(resid.shape[-1]), resid.device, effective_rank)
    acc.add(0, sums, first=True)
    return acc.profile(
        (0,),
        Provenance(
            exclude_first=exclude_first,
            data="given activations",
            homoglens_version=_version("homoglens"),
        ),
    )
