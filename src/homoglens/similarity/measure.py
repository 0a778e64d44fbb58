"""``positional_similarity``: position x position similarity of the residual stream, streamed.

Edge statements ("the first and last tokens homogenize more") need pairs of positions compared
at the same distance, because similarity falls with distance in every language model and an
edge token is farther from the rest of its window than a middle token is; and they need what
all windows share at a position (a BOS, large early positional rows, massive activations)
separated from what a window's tokens share among themselves. This module accumulates, per
layer entry, the within-window cosine matrix ``M [layer pos pos]`` and the per-position sums of
unit vectors, from which :class:`~homoglens.similarity.result.PositionalSimilarity` derives
the cross-window matrix ``C``, the contextual similarity ``W = M - C``, ``SP``, ``to_first``,
the lag profile and the distance-matched edge excess.

Passes over the data (each a streamed forward pass that stops after the deepest measured hook):
an optional first pass for the corpus means (``centre``), the main pass, and an optional last
pass for jackknife pseudo-values (``pseudo_values=True``). Sums are float64; under
``torch.distributed`` each rank takes a shard of the windows and the sums are all-reduced.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import (
    CENTRES,
    SPACES,
    BosPolicy,
    Centring,
    HookedModel,
    ModelInput,
    SimilaritySpace,
    signature_of,
)
from homoglens.core.validate import as_bool, as_int, check_layers
from homoglens.models.architectures import resid_hook_name
from homoglens.results import Provenance
from homoglens.run.data import DataInput, TokenBatch
from homoglens.run.engine import Sums, merge, model_device, provenance_of, rank_windows, stream
from homoglens.run.entrance import entrance
from homoglens.similarity.maths import (
    ACTIVATION_CACHE_BYTES,
    ONE_WINDOW,
    activation_fields,
    edge_groups,
    first_counted,
    run_similarity_passes,
    similarity_fields,
)
from homoglens.similarity.options import (
    SimilarityOptions,
    check_drop_dims,
    check_similarity_options,
)
from homoglens.similarity.passes import Feed, Merged, SimilaritySums, Take
from homoglens.similarity.result import PositionalSimilarity

# SPACES and CENTRES (the option vocabularies) live in homoglens.core.types; importable from here.
__all__ = [
    "ACTIVATION_CACHE_BYTES",
    "CENTRES",
    "SPACES",
    "positional_similarity",
    "similarity_from_activations",
]


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


def positional_similarity(
    model: ModelInput,
    data: DataInput,
    *,
    layers: list[int] | tuple[int, ...] | int | None = None,
    space: SimilaritySpace = "resid",
    centre: Centring | None = None,
    standardize: bool = False,
    exclude_first: bool | Literal["auto"] = "auto",
    offset: int = 0,
    edge_k: int = 8,
    massive_threshold: float = 100.0,
    pseudo_values: bool = True,
    drop_dims: int = 0,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
    text_column: str = "text",
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
            padding), a :class:`~homoglens.run.data.TokenBatch` (e.g. from
            :func:`~homoglens.run.data.corpus_windows`, which also cuts a Hugging Face dataset),
            texts, a text file or a Hugging Face ``datasets.Dataset`` / ``IterableDataset``
            (each row of ``text_column`` one text). Each window must hold the same number of
            real tokens (a pair of positions must exist in every window). For activations you
            already have, see :meth:`PositionalSimilarity.from_cache`.
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
        offset: Count positions from ``offset`` on (the statistics of the later part of each
            window: its tokens at a late position, after a prefix of ``offset`` tokens; the
            result's ``first_position``). 0: from the first counted position.
        edge_k: Positions per edge of the per-window statistics (the windows need at least
            ``2 * edge_k + 2`` counted positions).
        massive_threshold: Ratio above which a token counts as massive (Sun et al. 2024).
        pseudo_values: Run a last pass that stores each window's share of the cross-window
            terms (jackknife pseudo-values), so that intervals of ``matched``/``homogenization``
            include ``C``'s own sampling noise and the SP readings get intervals (one more
            forward pass). On by default: without it ``C`` is held fixed, and the standard error
            is 2.5-5.5 x too wide on real text (SmolLM2 on Austen) and off either way on
            nulls; ``False`` halves the cost and leaves the SP readings without intervals.
        drop_dims: Zero, in every layer, the ``drop_dims`` dimensions with the largest mean
            square over the counted tokens (of the vectors as measured, before any centring)
            before the cosines (after the centring): the
            massive-dimension removal of Sun et al. 2024 / Timkey & van Schijndel 2021, one more
            pass (the indices are in the result's ``dropped_dims``). 0: none.
        batch_size: Windows per forward pass.
        attention_mask: ``[batch pos]`` 0/1 for token input.
        bos: BOS policy for text input (``"auto"``, ``"always"``, ``"never"``).
        progress: Show a progress bar.
        text_column: The column that holds the text, for a Hugging Face dataset.

    Returns:
        A :class:`~homoglens.similarity.result.PositionalSimilarity`.

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
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    info = call.info
    options = check_similarity_options(
        space, centre, standardize, edge_k, massive_threshold, pseudo_values
    )
    chosen, _, drop_dims, _ = _check_run(
        model, layers, options.space, call.batch_size, drop_dims, call.progress
    )
    batch = call.batch(data, attention_mask=attention_mask, bos=bos, text_column=text_column)
    first = _first_position(batch, exclude_first, offset, options.edge_k)
    passes = _Passes(model, batch, chosen, first, options, drop_dims, call.batch_size)
    passes.run(call.progress)
    provenance = _provenance(info, batch, chosen, first, options.space)
    return PositionalSimilarity(**passes.fields(), provenance=provenance)


def _check_run(
    model: HookedModel,
    layers: Any,
    space: SimilaritySpace,
    batch_size: Any,
    drop_dims: Any,
    progress: Any,
) -> tuple[tuple[int, ...], int, int, bool]:
    """:func:`positional_similarity`'s run options, checked: the layer entries measured
    (``final_norm``: the last one only), ``batch_size``, ``drop_dims`` and ``progress``."""
    n_layers = int(model.cfg.n_layers)
    if space == "final_norm":
        if layers is not None and check_layers(layers, n_layers) != (n_layers,):
            raise InvalidInputError(
                f"space='final_norm' reads the last entry ({n_layers}) after the final norm; "
                f"pass layers=None or [{n_layers}], or use space='resid' for other entries"
            )
        chosen: tuple[int, ...] = (n_layers,)
    else:
        chosen = check_layers(layers, n_layers)
    batch_size = as_int("batch_size", batch_size, low=1)
    drop_dims = check_drop_dims(drop_dims, int(model.cfg.d_model))
    progress = as_bool("progress", progress)
    return chosen, batch_size, drop_dims, progress


def _first_position(batch: TokenBatch, exclude_first: Any, offset: Any, edge_k: int) -> int:
    """The first counted position of windows of one length (``exclude_first``, ``offset``),
    checked to leave room for two edges of ``edge_k`` positions and a middle."""
    lengths = batch.lengths
    if int(lengths.min()) != int(lengths.max()):
        raise InvalidInputError(
            f"positional_similarity needs windows of equal length, got lengths "
            f"{int(lengths.min())}..{int(lengths.max())}: M[i, j] averages a pair of positions "
            "over windows, so every window must have positions 0..T-1. Cut text into equal "
            "windows with corpus_windows(model, ..., seq_len=T), or pass token ids of one length"
        )
    offset = as_int("offset", offset, low=0, high=int(lengths[0]) - 1)
    first = max(first_counted(exclude_first, batch.bos), offset)
    n_pos = int(lengths[0]) - first
    edge_groups(n_pos, edge_k)
    return first


def _provenance(
    info: Any, batch: TokenBatch, chosen: tuple[int, ...], first: int, space: str
) -> Provenance:
    """The result's provenance (``final_norm``: the hook point read is the final norm's
    output)."""
    provenance = provenance_of(info, batch, chosen, bool(first))
    if space == "final_norm":
        provenance = _with_hooks(provenance, ("ln_final (output, with its weights)",))
    return provenance


def _replay_rows(model: HookedModel, batch: TokenBatch, n_entries: int, several: bool) -> int:
    """Windows of this rank's shard whose vectors the first pass keeps for the later ones:
    the whole shard when there are later passes (``several``) and it fits in
    :data:`ACTIVATION_CACHE_BYTES`, else 0 (every pass runs the model)."""
    # With more than one pass (centring, pseudo-values), the passes after the first replay this
    # rank's vectors when they fit in the budget, instead of running the model again.
    start, stop = rank_windows(len(batch))
    shard = stop - start
    width = 8 if next(iter(model.parameters())).dtype == torch.float64 else 4
    size = shard * int(batch.lengths[0]) * int(model.cfg.d_model) * n_entries * width
    keep = several and size <= ACTIVATION_CACHE_BYTES
    return shard if keep else 0


class _Passes:
    """The passes of :func:`positional_similarity` over this rank's shard into one
    :class:`~homoglens.similarity.passes.SimilaritySums`: the first runs the model, the later
    ones replay its vectors when ``shard`` > 0 (they fit in the budget); the engine merges each
    pass over ranks.

    The vectors are kept in one preallocated block ``[layer window pos d]`` (not one tensor per
    batch and layer): freed at the end as a whole, it goes back to the operating system instead
    of staying in the allocator's heap as fragments (which held ~1.7 GB of resident memory after
    the measurement returned, on SmolLM2 at 64 x 256)."""

    def __init__(
        self,
        model: HookedModel,
        batch: TokenBatch,
        chosen: tuple[int, ...],
        first: int,
        options: SimilarityOptions,
        drop_dims: int,
        batch_size: int,
    ) -> None:
        self.model, self.batch, self.chosen, self.first = model, batch, chosen, first
        self.options, self.drop_dims, self.batch_size = options, drop_dims, batch_size
        self.device = model_device(model)
        if len(batch) == 1:
            warnings.warn(ONE_WINDOW, stacklevel=3)
        n_pos, d_model = int(batch.lengths[0]) - first, int(model.cfg.d_model)
        self.sums = SimilaritySums(len(chosen), n_pos, d_model, options.edge_k, self.device)
        self.to_space = _space_fn(model, options.space)
        self.names = [resid_hook_name(layer) for layer in chosen]
        several = options.centre is not None or options.pseudo_values or drop_dims > 0
        self.shard = _replay_rows(model, batch, len(chosen), several)
        self.cache: torch.Tensor | None = None
        self.bounds: list[tuple[int, int]] = []  # rows of each forward batch, in stream order
        self.replay = False

    def run(self, progress: bool) -> None:
        """The passes asked for, in this order: ``drop_dims``'s dimension energy, the
        centring, the main pass, the pseudo-values' cross-window shares; then the kept vectors
        are freed."""

        def feed(desc: str) -> Feed:
            return lambda fn, merged: self.feed(fn, merged, desc, progress=progress)

        n_layer = len(self.chosen)
        run_similarity_passes(self.sums, feed, self.options, self.drop_dims, n_layer, self.device)
        self.cache = None

    def fields(self) -> dict[str, Any]:
        """The result's fields but its provenance, after :meth:`run`."""
        n_all = len(self.batch)
        return similarity_fields(
            self.sums, self.chosen, n_all, first=self.first, options=self.options
        )

    def feed(self, fn: Take, merged: Merged, desc: str, *, progress: bool) -> None:
        """Run this rank's shard once (or replay it); ``fn(i, x, first)`` gets layer ``i``'s
        ``[batch T d]`` vectors in the measured space (work dtype: float32, or float64 for a
        float64 model). ``merged``'s sums and rows are declared on the pass's
        :class:`~homoglens.run.engine.Sums` reducer, which the engine merges over ranks after the
        pass (a replay runs no pass: then the reducer's own merge, as :func:`stream` runs it)."""
        shapes = {name: shape for name, (_, shape) in merged.rows.items()}
        reducer = Sums(sums=merged.sums, rows=shapes)
        for name, (parts, _) in merged.rows.items():
            reducer.rows[name] = parts  # the pass appends its rows to the reducer's lists
        if self.replay and self.cache is not None:
            with torch.inference_mode():
                for start, end in self.bounds:
                    for i in range(len(self.names)):
                        fn(i, self.cache[i, start:end], self.first)
            merge([reducer], len(self.batch), self.device)  # no pass: as stream merges
        else:
            reducer.add_hooks([(name, self._hook(i, fn)) for i, name in enumerate(self.names)])
            stream(
                self.model,
                self.batch,
                [reducer],
                batch_size=self.batch_size,
                desc=desc,
                progress=progress,
            )
            self.replay = True
        for name, (parts, _) in merged.rows.items():
            parts[:] = reducer.rows[name]  # every rank's rows, in input order

    def _hook(self, i: int, fn: Take) -> Any:
        def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
            x = self.to_space(resid)
            work = torch.float64 if x.dtype == torch.float64 else torch.float32
            x = x.detach().to(work)
            if self.shard:
                if self.cache is None:
                    shape = (len(self.names), self.shard, *x.shape[1:])
                    self.cache = torch.empty(shape, dtype=work, device=x.device)
                if i == 0:
                    start = self.bounds[-1][1] if self.bounds else 0
                    self.bounds.append((start, start + int(x.shape[0])))
                start, end = self.bounds[-1]
                self.cache[i, start:end] = x
            fn(i, x, self.first)

        return hook


def _with_hooks(provenance: Provenance, hooks: tuple[str, ...]) -> Provenance:
    from dataclasses import replace

    return replace(provenance, hook_points=hooks)


@signature_of(activation_fields)
def similarity_from_activations(
    resid: Float[torch.Tensor, "batch pos d_model"]
    | Float[torch.Tensor, "layer batch pos d_model"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    **options: Any,
) -> PositionalSimilarity:
    """:func:`positional_similarity` of activations you already have, no model needed.

    Also available as :meth:`PositionalSimilarity.from_activations`.

    Args:
        resid: ``[batch pos d_model]`` vectors of one hook point (layer axis ``(0,)``) or
            ``[layer batch pos d_model]`` (layer axis ``0 .. layer - 1``), e.g. from an
            ``ActivationCache``. Float64 input is reduced in float64 throughout.
        attention_mask: ``[batch pos]`` 0/1 (left or right padding); every row must hold the
            same number of real tokens. Default: all real.
        **options: Keywords of :func:`positional_similarity` that apply without a model:
            ``centre``, ``standardize``, ``edge_k``, ``massive_threshold``, ``pseudo_values``,
            ``drop_dims`` (defaults as there), ``exclude_first`` (a bool here: there is no BOS
            record; default ``False``) and ``batch_size`` (windows reduced at a time, default
            64).

    Returns:
        A :class:`~homoglens.similarity.result.PositionalSimilarity`.

    Raises:
        InvalidInputError: not a float tensor of 3 or 4 dims, a mask of the wrong shape or with
            rows of different lengths, bad options.
        NonFiniteActivationError: NaN/inf in a counted vector.

    Examples:
        >>> import torch
        >>> from homoglens import PositionalSimilarity
        >>> sim = PositionalSimilarity.from_activations(torch.randn(10, 20, 16), edge_k=4)
        >>> edge = sim.edge_excess(block=2)
        >>> tuple(sim.M.shape)
        (1, 20, 20)
        >>> list(edge.columns)
        ['layer', 'edge', 'naive', 'matched', 'se', 'ci_low', 'ci_high', 'n_sequences']
    """
    return PositionalSimilarity.from_activations(resid, attention_mask, **options)
