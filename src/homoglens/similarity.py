"""``positional_similarity``: position x position similarity of the residual stream, streamed.

Edge statements ("the first and last tokens homogenize more") need pairs of positions compared
at the same distance, because similarity falls with distance in every language model and an
edge token is farther from the rest of its window than a middle token is; and they need what
all windows share at a position (a BOS, large early positional rows, massive activations)
separated from what a window's tokens share among themselves. This module accumulates, per
layer entry, the within-window cosine matrix ``M [layer pos pos]`` and the per-position sums of
unit vectors, from which :class:`~homoglens.results.similarity.PositionalSimilarity` derives
the cross-window matrix ``C``, the contextual similarity ``W = M - C``, ``SP``, ``to_first``,
the lag profile and the distance-matched edge excess.

Passes over the data (each a streamed forward pass that stops after the deepest measured hook):
an optional first pass for the corpus means (``centre``), the main pass, and an optional last
pass for jackknife pseudo-values (``pseudo_values=True``). Sums are float64; under
``torch.distributed`` each rank takes a shard of the windows and the sums are all-reduced.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Any, Literal

import torch
from jaxtyping import Float, Int

from homoglens._checks import as_bool, as_float, as_int
from homoglens.data import TokenBatch, _check_mask, to_token_batch
from homoglens.distributed import all_reduce_sum, check_same_data, gather_rows, shard_bounds, world
from homoglens.errors import InvalidInputError, NonFiniteActivationError
from homoglens.homogenization import SIMILARITY_STATISTICS, edge_groups, similarity_coefficients
from homoglens.models import model_info
from homoglens.profile import (
    _check_layers,
    _model_device,
    _provenance,
    _run_through,
    forward_batches,
    resid_hook_name,
)
from homoglens.results import Provenance
from homoglens.results.similarity import PositionalSimilarity
from homoglens.types import BosPolicy, Centring, HookedModel, SimilaritySpace

__all__ = ["positional_similarity", "similarity_from_activations", "SPACES", "CENTRES"]

SPACES: tuple[str, ...] = ("resid", "ln_input", "final_norm")
"""Where vectors are read: the residual stream; what the next block's first normalisation
makes of it without its affine weights; the last entry after the final norm (with its weights,
Hugging Face's last ``hidden_states``)."""
CENTRES: tuple[str | None, ...] = (None, "global", "position")
"""Corpus centring: none, one mean per layer (without position 0 and massive tokens), or one
mean per position and layer."""


class _Sums:
    """Float64 running sums of one run: centring moments, the main sums, the second pass."""

    def __init__(
        self, n_layer: int, n_pos: int, d_model: int, edge_k: int, device: torch.device
    ) -> None:
        f64 = {"dtype": torch.float64, "device": device}
        self.n_layer, self.n_pos, self.d_model = n_layer, n_pos, d_model
        self.within = torch.zeros(n_layer, n_pos, n_pos, **f64)
        self.units = torch.zeros(n_layer, n_pos, d_model, **f64)
        self.n = torch.zeros((), **f64)
        self.coef = similarity_coefficients(n_pos, edge_k).to(device)
        self.rows: list[torch.Tensor] = []  # [batch layer stat] per batch
        self.cross_rows: list[torch.Tensor] = []
        self.same_rows: list[torch.Tensor] = []
        # centring
        self.mean: torch.Tensor | None = None  # [layer d] or [layer pos d]
        self.scale: torch.Tensor | None = None  # [layer d]
        self.n_massive: tuple[int, ...] = ()

    def units_of(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Centre, standardise and normalise ``x [batch pos d]`` of layer ``i``: unit vectors
        (0 for zero vectors) in the work dtype, and their norms."""
        if self.mean is not None:
            mean = self.mean[i].to(x.device, x.dtype)
            x = x - (mean if mean.ndim == 2 else mean[None, None])
        if self.scale is not None:
            x = x / self.scale[i].to(x.device, x.dtype)
        finite = torch.isfinite(x).all(-1)
        if not bool(finite.all()):
            raise NonFiniteActivationError(
                f"{int((~finite).sum())} vectors hold NaN or inf; nothing was averaged in. Check "
                "the model dtype (float16 overflows) or the weights"
            )
        # An exact power-of-two rescaling per vector first: float32 squares of entries above
        # ~1.8e19 overflow and below ~1e-19 underflow; the unit vector does not change.
        amax = x.abs().amax(-1, keepdim=True)
        exponent = torch.where(amax > 0, torch.frexp(amax).exponent, 0).to(x.dtype)
        x = torch.ldexp(x, -exponent)
        norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        safe = torch.where(norms > 0, norms, torch.ones_like(norms))
        return torch.where(norms > 0, x / safe, torch.zeros_like(x)), torch.ldexp(norms, exponent)

    def add(self, i: int, x: torch.Tensor, row: torch.Tensor) -> None:
        """Main pass: add layer ``i`` of a batch; per-window statistics go into ``row``."""
        u, _ = self.units_of(i, x)
        gram = u @ u.transpose(1, 2)  # [batch pos pos]
        self.within[i] += gram.sum(0, dtype=torch.float64).to(self.within.device)
        self.units[i] += u.sum(0, dtype=torch.float64).to(self.units.device)
        row[:, i] = torch.einsum("bij,eij->be", gram.double(), self.coef.to(gram.device))

    def add_cross(self, i: int, x: torch.Tensor, cross: torch.Tensor, same: torch.Tensor) -> None:
        """Second pass: each window's share of the cross-window terms, given the final sums."""
        u, _ = self.units_of(i, x)
        u64 = u.double()
        ub = self.units[i].to(u.device)
        vectors = torch.einsum("eij,jd->eid", self.sym.to(u.device), ub)  # S_e Ub
        gram = u64 @ u64.transpose(1, 2)
        own = torch.einsum("bij,eij->be", gram, self.coef.to(u.device))  # stat_e(U_s U_s^T)
        cross[:, i] = torch.einsum("bpd,epd->be", u64, vectors) - 2 * own
        same[:, i] = (u64 * ub[None]).sum(-1) - (u64 * u64).sum(-1)

    @property
    def sym(self) -> torch.Tensor:
        """``S_e = A_e + A_e^T`` (full symmetric coefficients)."""
        return self.coef + self.coef.transpose(1, 2)


def _space_fn(model: HookedModel, space: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The map from a residual vector to the vector measured in ``space``."""
    if space == "resid":
        return lambda x: x
    if space == "final_norm":
        return lambda x: model.ln_final(x)
    eps = float(getattr(model.cfg, "eps", 1e-5) or 1e-5)
    norm = str(getattr(model.cfg, "normalization_type", "LN") or "")
    if norm.startswith("LN"):  # LayerNorm without its affine weights

        def layer_norm(x: torch.Tensor) -> torch.Tensor:
            x = x - x.mean(-1, keepdim=True)
            return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()

        return layer_norm
    if norm.startswith("RMS"):  # RMSNorm without its weight

        def rms_norm(x: torch.Tensor) -> torch.Tensor:
            return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()

        return rms_norm
    return lambda x: x  # no normalisation


def _centre_moments(
    sums: _Sums,
    feed: Callable[[Callable[[int, torch.Tensor, int], None]], None],
    centre: str,
    standardize: bool,
    massive_threshold: float,
    device: torch.device,
    reduce: bool,
) -> None:
    """First pass: the corpus mean (and s.d.) per layer (all-reduced over ranks if ``reduce``)."""
    f64 = {"dtype": torch.float64, "device": device}
    n_layer, n_pos, d = sums.n_layer, sums.n_pos, sums.d_model
    if centre == "global":
        total = torch.zeros(n_layer, d, **f64)
    else:
        total = torch.zeros(n_layer, n_pos, d, **f64)
    square = torch.zeros(n_layer, d, **f64)
    count = torch.zeros(n_layer, **f64)
    massive = torch.zeros(n_layer, **f64)

    def take(i: int, x: torch.Tensor, first: int) -> None:
        x64 = x.double()
        if centre == "global":
            ax = x64.abs()
            ratio = ax.amax(-1) / ax.median(-1).values.clamp_min(torch.finfo(torch.float64).tiny)
            keep = ratio <= massive_threshold
            keep[:, 0] = False  # position 0 (a BOS or the first token) never enters it
            massive[i] += float((ratio > massive_threshold)[:, 1:].sum())
            w = keep[..., None].to(x64.dtype)
            total[i] += (x64 * w).sum((0, 1)).to(device)
            square[i] += (x64 * x64 * w).sum((0, 1)).to(device)
            count[i] += float(keep.sum())
        else:
            xs = x64[:, first:]
            total[i] += xs.sum(0).to(device)
            square[i] += (xs * xs).sum((0, 1)).to(device)
            count[i] += float(xs.shape[0])

    feed(take)
    if reduce:
        all_reduce_sum([total, square, count, massive])
    if bool((count < 1).any()):
        raise InvalidInputError(
            "centre='global' found no token to average: every token is position 0 or massive "
            f"(max |x| / median |x| > {massive_threshold}); raise massive_threshold"
        )
    if centre == "global":
        mean = total / count[:, None]
        var = square / count[:, None] - mean * mean
    else:
        mean = total / count[:, None, None]
        var = (square - count[:, None] * (mean * mean).sum(1)) / (count[:, None] * n_pos)
    sums.mean = mean
    sums.n_massive = tuple(int(v) for v in massive.round().tolist()) if centre == "global" else ()
    if standardize:
        sd = var.clamp_min(0).sqrt()
        sums.scale = torch.where(sd > 0, sd, torch.ones_like(sd))


def _finish(
    sums: _Sums,
    layers: tuple[int, ...],
    n_all: int,
    device: torch.device,
    *,
    first: int,
    edge_k: int,
    space: str,
    centre: str | None,
    standardize: bool,
    massive_threshold: float,
    provenance: Provenance,
    pseudo: bool,
    gather: bool = True,
) -> PositionalSimilarity:
    """Gather the per-window rows (over ranks if ``gather``) and build the result."""
    n_layer, n_stat = len(layers), len(SIMILARITY_STATISTICS)

    def rows(parts: list[torch.Tensor], width: int) -> torch.Tensor:
        local = torch.cat([torch.empty(0, n_layer, width, dtype=torch.float64), *parts])
        return (gather_rows(local, n_all, device) if gather else local).cpu()

    return PositionalSimilarity(
        layers=layers,
        within_sum=sums.within.cpu(),
        unit_sum=sums.units.cpu(),
        n_sequences=n_all,
        window_within=rows(sums.rows, n_stat),
        window_cross=rows(sums.cross_rows, n_stat) if pseudo else None,
        window_same_position=rows(sums.same_rows, sums.n_pos) if pseudo else None,
        first_position=first,
        edge_k=edge_k,
        space=space,
        centre=centre,
        standardize=standardize,
        massive_threshold=massive_threshold,
        n_massive=sums.n_massive,
        provenance=provenance,
    )


def _check_options(
    space: Any, centre: Any, standardize: Any, edge_k: Any, massive_threshold: Any, pseudo: Any
) -> tuple[str, str | None, bool, int, float, bool]:
    if space not in SPACES:
        raise InvalidInputError(f"space={space!r} must be one of {list(SPACES)}")
    if centre not in CENTRES:
        raise InvalidInputError(
            f"centre={centre!r} must be None, 'global' (one corpus mean per layer) or "
            "'position' (one per position)"
        )
    standardize = as_bool("standardize", standardize)
    if standardize and centre is None:
        raise InvalidInputError(
            "standardize=True divides each dimension by its corpus s.d. around the corpus "
            "mean; pass centre='global' or centre='position' with it"
        )
    edge_k = as_int("edge_k", edge_k, low=1)
    massive_threshold = as_float("massive_threshold", massive_threshold, low=1.0, high=math.inf)
    return space, centre, standardize, edge_k, massive_threshold, as_bool("pseudo_values", pseudo)


def positional_similarity(
    model: HookedModel,
    data: TokenBatch | Int[torch.Tensor, "batch pos"] | str | list[str] | os.PathLike[str],
    *,
    layers: list[int] | tuple[int, ...] | int | None = None,
    space: SimilaritySpace = "resid",
    centre: Centring | None = None,
    standardize: bool = False,
    exclude_first: bool | Literal["auto"] = "auto",
    edge_k: int = 8,
    massive_threshold: float = 100.0,
    pseudo_values: bool = False,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> PositionalSimilarity:
    """Measure position x position similarity of the residual stream over equal-length windows.

    Accumulates, per layer entry, the within-window mean cosine matrix ``M [layer pos pos]`` and
    the per-position sums of unit vectors (float64, streamed: memory does not grow with the
    number of windows), from which the result derives the cross-window matrix ``C``, the
    contextual similarity ``W = M - C``, the same-position cross-input similarity ``SP``,
    ``to_first``, the lag profile, ``homogenization`` (mean off-diagonal ``W``) and the naive and
    distance-matched edge excess (:meth:`~PositionalSimilarity.edge_excess`). Pads never enter
    (left and right padding give the same result).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` in eval mode.
        data: Windows of equal length: token ids ``[batch pos]`` (with ``attention_mask`` for
            padding), a :class:`~homoglens.data.TokenBatch` (e.g. from
            :func:`~homoglens.data.corpus_windows`), texts or a text file. Each window must hold
            the same number of real tokens (a pair of positions must exist in every window).
        layers: Entries of the residual axis (0 = embeddings, l = output of block l - 1).
            Default: all; ``space="final_norm"`` measures the last entry only.
        space: ``"resid"``; ``"ln_input"`` (what the next normalisation makes of the stream,
            without its affine weights: ``(x - mean) / sqrt(var + eps)`` for LayerNorm,
            ``x / sqrt(mean(x^2) + eps)`` for RMSNorm; with ``centre`` this is what the corpus
            mean is taken over); ``"final_norm"`` (the last entry after the final norm with its
            weights, Hugging Face's last ``hidden_states``).
        centre: ``None``; ``"global"`` (a first pass subtracts each layer's corpus mean,
            computed without position 0 and without tokens whose max |x| / median |x| exceeds
            ``massive_threshold``); ``"position"`` (a first pass subtracts each position's
            corpus mean: Song & Zhong 2023's mean + positional components).
        standardize: Also divide each dimension by its corpus s.d. (Timkey & van Schijndel
            2021); needs ``centre``.
        exclude_first: Leave position 0 out; ``"auto"``: when it holds a BOS.
        edge_k: Positions per edge of the per-window statistics (the windows need at least
            ``2 * edge_k + 2`` counted positions).
        massive_threshold: Ratio above which a token counts as massive (Sun et al. 2024).
        pseudo_values: Run a last pass that stores each window's share of the cross-window
            terms, so that intervals of ``matched``/``homogenization`` include ``C``'s own
            sampling noise and ``SP`` gets intervals (one more forward pass).
        batch_size: Windows per forward pass.
        attention_mask: ``[batch pos]`` 0/1 for token input.
        bos: BOS policy for text input (``"auto"``, ``"always"``, ``"never"``).
        progress: Show a progress bar.

    Returns:
        A :class:`~homoglens.results.similarity.PositionalSimilarity`.

    Raises:
        InvalidInputError: windows of different lengths, unknown ``space``/``centre``,
            ``standardize`` without ``centre``, ``edge_k`` too large for the windows, bad
            ``layers`` (``final_norm`` other than the last entry), a model in training mode.
        SequenceTooLongError: a window longer than ``cfg.n_ctx``.
        NonFiniteActivationError: NaN/inf in a measured vector.

    References:
        Yusupov et al. 2025, "Token Homogenization under Positional Bias", arXiv 2508.17126.
        Ethayarajh 2019 (anisotropy); Barbero et al. 2024, arXiv 2406.04267 (SP); Song & Zhong
        2023, arXiv 2310.04861 (positional mean components); Timkey & van Schijndel 2021,
        arXiv 2109.04404 (standardisation); Sun et al. 2024, arXiv 2402.17762 (massive
        activations).

    Examples:
        >>> import torch
        >>> from homoglens import load_model, positional_similarity
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> sim = positional_similarity(model, torch.randint(0, 50000, (6, 24)), edge_k=4,
        ...                             progress=False)
        >>> tuple(sim.M.shape), tuple(sim.SP.shape)
        ((3, 24, 24), (3, 24))
    """
    info = model_info(model)
    n_layers = int(model.cfg.n_layers)
    space, centre, standardize, edge_k, massive_threshold, pseudo_values = _check_options(
        space, centre, standardize, edge_k, massive_threshold, pseudo_values
    )
    if space == "final_norm":
        if layers is not None and _check_layers(layers, n_layers) != (n_layers,):
            raise InvalidInputError(
                f"space='final_norm' reads the last entry ({n_layers}) after the final norm; "
                f"pass layers=None or [{n_layers}], or use space='resid' for other entries"
            )
        chosen: tuple[int, ...] = (n_layers,)
    else:
        chosen = _check_layers(layers, n_layers)
    batch_size = as_int("batch_size", batch_size, low=1)
    progress = as_bool("progress", progress)
    batch = to_token_batch(model, data, attention_mask=attention_mask, bos=bos)
    lengths = batch.lengths
    if int(lengths.min()) != int(lengths.max()):
        raise InvalidInputError(
            f"positional_similarity needs windows of equal length, got lengths "
            f"{int(lengths.min())}..{int(lengths.max())}: M[i, j] averages a pair of positions "
            "over windows, so every window must have positions 0..T-1. Cut text into equal "
            "windows with corpus_windows(model, ..., seq_len=T), or pass token ids of one length"
        )
    first = _exclude_first(exclude_first, batch.bos)
    n_pos = int(lengths[0]) - first
    edge_groups(n_pos, edge_k)
    device = _model_device(model)
    n_all = len(batch)
    if n_all == 1:
        warnings.warn(
            "one window: the cross-window matrix C (and so W, SP, the matched excess) is NaN; "
            "pass several windows",
            stacklevel=2,
        )
    rank, size = world()
    check_same_data(batch.tokens, batch.attention_mask, device)
    start, stop = shard_bounds(n_all, size)[rank]
    shard = batch[start:stop]
    sums = _Sums(len(chosen), n_pos, int(model.cfg.d_model), edge_k, device)
    to_space = _space_fn(model, space)
    names = [resid_hook_name(layer) for layer in chosen]
    last = names[-1] if space != "final_norm" else resid_hook_name(n_layers)

    def feed(fn: Callable[[int, torch.Tensor, int], None], desc: str) -> None:
        """Run the shard once; ``fn(i, x, first)`` gets layer ``i``'s ``[batch T d]`` vectors
        in ``space`` (work dtype: float32, or float64 for a float64 model)."""

        def make_hook(i: int) -> Any:
            def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
                x = to_space(resid)
                work = torch.float64 if x.dtype == torch.float64 else torch.float32
                fn(i, x.detach().to(work), first)

            return hook

        hooks = [(name, make_hook(i)) for i, name in enumerate(names)]
        for tokens, mask in forward_batches(
            shard, batch_size, device, desc=desc, progress=progress
        ):
            _run_through(model, tokens, last, hooks, attention_mask=mask)

    if centre is not None:
        _centre_moments(
            sums,
            lambda fn: feed(fn, "similarity (centring)"),
            centre,
            standardize,
            massive_threshold,
            device,
            reduce=True,
        )
    _main_pass(sums, lambda fn: feed(fn, "similarity"), len(chosen), reduce=True)
    if pseudo_values:
        _cross_pass(sums, lambda fn: feed(fn, "similarity (pseudo-values)"), len(chosen))
    provenance = _provenance(info, batch, chosen, bool(first))
    if space == "final_norm":
        provenance = _with_hooks(provenance, ("ln_final (output, with its weights)",))
    return _finish(
        sums,
        chosen,
        n_all,
        device,
        first=first,
        edge_k=edge_k,
        space=space,
        centre=centre,
        standardize=standardize,
        massive_threshold=massive_threshold,
        provenance=provenance,
        pseudo=pseudo_values,
    )


def _with_hooks(provenance: Provenance, hooks: tuple[str, ...]) -> Provenance:
    from dataclasses import replace

    return replace(provenance, hook_points=hooks)


def _exclude_first(exclude_first: Any, bos: bool | None) -> int:
    if exclude_first == "auto":
        if bos is None:
            warnings.warn(
                "some windows start with a BOS and some do not; exclude_first='auto' leaves "
                "position 0 out of all of them",
                stacklevel=3,
            )
            return 1
        return int(bool(bos))
    return int(as_bool("exclude_first", exclude_first))


def _main_pass(
    sums: _Sums,
    feed: Callable[[Callable[[int, torch.Tensor, int], None]], None],
    n_layer: int,
    reduce: bool,
) -> None:
    """Main pass: the sums and one row of statistics per window; all-reduced over ranks."""
    feed(_on_cpu_rows(sums, n_layer))
    if reduce:
        all_reduce_sum([sums.within, sums.units, sums.n])


def _on_cpu_rows(sums: _Sums, n_layer: int) -> Callable[[int, torch.Tensor, int], None]:
    """Per-window rows are filled where the activations are, then kept on the CPU."""

    def run(i: int, x: torch.Tensor, first: int) -> None:
        if i == 0:
            sums.rows.append(
                torch.zeros(
                    x.shape[0],
                    n_layer,
                    len(SIMILARITY_STATISTICS),
                    dtype=torch.float64,
                    device=x.device,
                )
            )
            sums.n += x.shape[0]
        sums.add(i, x[:, first:], sums.rows[-1])
        if i == n_layer - 1:
            sums.rows[-1] = sums.rows[-1].cpu()

    return run


def _cross_pass(
    sums: _Sums,
    feed: Callable[[Callable[[int, torch.Tensor, int], None]], None],
    n_layer: int,
) -> None:
    """Last pass: each window's share of the cross-window terms (needs the final sums)."""

    def run(i: int, x: torch.Tensor, first: int) -> None:
        if i == 0:
            b = x.shape[0]
            f64 = {"dtype": torch.float64, "device": x.device}
            sums.cross_rows.append(torch.zeros(b, n_layer, len(SIMILARITY_STATISTICS), **f64))
            sums.same_rows.append(torch.zeros(b, n_layer, sums.n_pos, **f64))
        sums.add_cross(i, x[:, first:], sums.cross_rows[-1], sums.same_rows[-1])
        if i == n_layer - 1:
            sums.cross_rows[-1] = sums.cross_rows[-1].cpu()
            sums.same_rows[-1] = sums.same_rows[-1].cpu()

    feed(run)


def similarity_from_activations(
    resid: Float[torch.Tensor, "batch pos d_model"]
    | Float[torch.Tensor, "layer batch pos d_model"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    *,
    centre: Centring | None = None,
    standardize: bool = False,
    exclude_first: bool = False,
    edge_k: int = 8,
    massive_threshold: float = 100.0,
    pseudo_values: bool = False,
    batch_size: int = 64,
) -> PositionalSimilarity:
    """:func:`positional_similarity` of activations you already have, no model needed.

    Also available as :meth:`PositionalSimilarity.from_activations`.

    Args:
        resid: ``[batch pos d_model]`` vectors of one hook point (layer axis ``(0,)``) or
            ``[layer batch pos d_model]`` (layer axis ``0 .. layer - 1``), e.g. from an
            ``ActivationCache``. Float64 input is reduced in float64 throughout.
        attention_mask: ``[batch pos]`` 0/1 (left or right padding); every row must hold the
            same number of real tokens. Default: all real.
        centre, standardize, exclude_first, edge_k, massive_threshold, pseudo_values: As for
            :func:`positional_similarity` (``exclude_first`` is a bool here).
        batch_size: Windows reduced at a time (memory).

    Returns:
        A :class:`~homoglens.results.similarity.PositionalSimilarity`.

    Raises:
        InvalidInputError: not a float tensor of 3 or 4 dims, a mask of the wrong shape or with
            rows of different lengths, bad options.
        NonFiniteActivationError: NaN/inf in a counted vector.

    Examples:
        >>> import torch
        >>> from homoglens import PositionalSimilarity
        >>> sim = PositionalSimilarity.from_activations(torch.randn(10, 20, 16), edge_k=4)
        >>> edge = sim.edge_excess(block=2)
        >>> tuple(sim.M.shape), list(edge.columns)
        ((1, 20, 20), ['layer', 'edge', 'naive', 'matched', 'ci_low', 'ci_high', 'n_sequences'])
    """
    if (
        not isinstance(resid, torch.Tensor)
        or resid.ndim not in (3, 4)
        or not resid.is_floating_point()
    ):
        raise InvalidInputError(
            "resid must be a float tensor [batch pos d_model] or [layer batch pos d_model], "
            f"got {getattr(resid, 'shape', type(resid).__name__)}"
        )
    x_all = resid.detach()[None] if resid.ndim == 3 else resid.detach()
    n_layer, n_seq, width, d_model = (int(s) for s in x_all.shape)
    if min(n_layer, n_seq, width, d_model) == 0:
        raise InvalidInputError(f"resid {tuple(resid.shape)} is empty")
    _, centre, standardize, edge_k, massive_threshold, pseudo_values = _check_options(
        "resid", centre, standardize, edge_k, massive_threshold, pseudo_values
    )
    first = int(as_bool("exclude_first", exclude_first))
    batch_size = as_int("batch_size", batch_size, low=1)
    mask = _check_mask(torch.zeros(n_seq, width, dtype=torch.long), attention_mask).to(x_all.device)
    lengths = mask.sum(1)
    if int(lengths.min()) != int(lengths.max()):
        raise InvalidInputError(
            f"attention_mask rows hold {int(lengths.min())}..{int(lengths.max())} real tokens; "
            "positional similarity needs windows of equal length (every pair of positions in "
            "every window)"
        )
    length = int(lengths[0])
    n_pos = length - first
    edge_groups(n_pos, edge_k)
    keep = mask.bool()
    work = torch.float64 if x_all.dtype == torch.float64 else torch.float32
    if not bool(torch.isfinite(x_all[:, keep]).all()):
        raise NonFiniteActivationError(
            "resid holds NaN or inf at real tokens; nothing was averaged in"
        )
    device = x_all.device
    sums = _Sums(n_layer, n_pos, d_model, edge_k, device)

    def feed(fn: Callable[[int, torch.Tensor, int], None]) -> None:
        for start in range(0, n_seq, batch_size):
            stop = min(start + batch_size, n_seq)
            rows = keep[start:stop]
            for i in range(n_layer):
                x = x_all[i, start:stop][rows].view(stop - start, length, d_model)
                fn(i, x.to(work), first)

    if centre is not None:
        _centre_moments(sums, feed, centre, standardize, massive_threshold, device, reduce=False)
    _main_pass(sums, feed, n_layer, reduce=False)
    if pseudo_values:
        _cross_pass(sums, feed, n_layer)
    from homoglens.profile import _version

    return _finish(
        sums,
        tuple(range(n_layer)),
        n_seq,
        device,
        first=first,
        edge_k=edge_k,
        space="resid",
        centre=centre,
        standardize=standardize,
        massive_threshold=massive_threshold,
        provenance=Provenance(
            exclude_first=bool(first),
            data=f"given activations {tuple(resid.shape)}",
            homoglens_version=_version("homoglens"),
        ),
        pseudo=pseudo_values,
        gather=False,
    )
