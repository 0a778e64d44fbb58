"""``homogenization_profile``: stream a corpus through a model, reduce each batch in hooks.

Each batch's residual stream is reduced inside the forward hooks to per-(layer, position)
sums (:func:`homoglens.profile.homogenization.homogenization_sums`); no activation outlives its
hook, and nothing caches every layer's ``[batch pos d_model]`` at once. Peak memory therefore
depends on ``batch_size``, not on the number of sequences.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from homoglens.core.distributed import world
from homoglens.core.errors import InvalidInputError, NonFiniteActivationError
from homoglens.core.types import BosPolicy, HookedModel, HookFn, HookSpec, ModelInput
from homoglens.core.validate import as_bool, check_attention_mask, check_layers
from homoglens.models.architectures import resid_hook_name
from homoglens.models.assets import package_version
from homoglens.profile.homogenization import (
    CountedTokens,
    check_terms,
    counted_tokens,
    entry_terms,
    homogenization_sums,
    positions_from_mask,
    prepare_entry,
    prepared_terms,
    split_terms,
    stack_terms,
    sums_of_terms,
    unsynced,
    work_dtype,
)
from homoglens.profile.result import HomogenizationProfile, ProfileSums
from homoglens.results import Provenance
from homoglens.run.data import (
    DataInput,
    DatasetStream,
    TokenBatch,
    dataset_kind,
    require_min_tokens,
)
from homoglens.run.engine import (
    Sums,
    provenance_of,
    said_copies,
    stream,
)
from homoglens.run.entrance import entrance
from homoglens.run.losses import icl_score, mean_nll, next_token_nll

__all__ = [
    "NonFiniteActivationError",
    "cosine_homogenization",
    "homogenization_profile",
    "resid_hook_name",
]


def homogenization_profile(
    model: ModelInput,
    data: DataInput,
    *,
    layers: list[int] | tuple[int, ...] | int | None = None,
    batch_size: int = 8,
    exclude_first: bool = False,
    effective_rank: bool = False,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
    text_column: str = "text",
    n_seq: int | None = None,
) -> HomogenizationProfile:
    """Measure how alike the residual-stream token vectors are, per layer and position.

    Streams ``data`` through ``model`` in batches; each batch is reduced inside forward hooks
    to sums per (layer, position), so memory does not grow with the number of sequences.
    A Hugging Face dataset is streamed from its rows too: they are read and tokenized a batch
    at a time as the passes need them and nothing of a batch is kept after its pass, so an
    ``IterableDataset`` of any length (``n_seq`` bounds it) is measured with flat memory.
    Pads never enter any statistic; positions count from each sequence's first real token
    (left and right padding give the same result); statistics are accumulated in float64
    whatever the model dtype.

    Metrics (see :class:`HomogenizationProfile` and docs/metrics.md): ``to_others[layer pos]``
    (mean cosine of a token to the other tokens of its sequence), ``to_prefix``, ``to_mean``,
    ``mean_pairwise[layer]``, ``baseline[layer]`` (anisotropy: mean cosine across sequences,
    exact), ``adjusted = mean_pairwise - baseline``, ``relative_residual``, ``norm``,
    ``count[pos]``, and on request the rank metrics ``effective_rank`` (norm-weighted: it
    mostly measures the first token's massive activations), ``unit_effective_rank`` and
    ``matrix_entropy`` (unit rows) and their ``*_no_first`` variants. Cosines lie in [-1, 1].

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` (see :func:`load_model`).
        data: Token ids ``[batch pos]`` (used as given, no BOS added), a
            :class:`~homoglens.run.data.TokenBatch`, a ``str``, a ``list[str]``, a text-file path or
            a Hugging Face ``datasets.Dataset`` / ``IterableDataset`` (each row of
            ``text_column`` one text; see :func:`~homoglens.run.data.to_token_batch`, and
            :func:`~homoglens.run.data.corpus_windows` to cut a dataset into windows). For
            activations you already have, see :meth:`HomogenizationProfile.from_cache`.
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
        text_column: The column that holds the text, for a Hugging Face dataset.
        n_seq: Measure at most the first ``n_seq`` sequences of ``data`` (texts, dataset rows,
            token rows); a dataset is read only that far. Required for an ``IterableDataset``,
            which may never end.

    Returns:
        A :class:`HomogenizationProfile` with provenance (model, backend, raw or processed
        weights, BOS, data, counts, versions). ``provenance.data_sha256`` hashes each row's
        length, then its token ids, row by row: the same tokens give the same hash whether
        they came as texts, token ids or a dataset.

    Raises:
        InvalidInputError: empty input, empty strings, float tokens, a mask of the wrong shape,
            sequences with fewer than 2 counted tokens, bad ``layers``/``batch_size``/``n_seq``,
            an ``IterableDataset`` without ``n_seq``.
        SequenceTooLongError: a sequence longer than ``cfg.n_ctx``.
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
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    info = call.info
    chosen = check_layers(layers, int(model.cfg.n_layers))
    exclude_first = as_bool("exclude_first", exclude_first)
    effective_rank = as_bool("effective_rank", effective_rank)
    if dataset_kind(data) is not None:
        stream = _dataset_stream(
            model, data, attention_mask, bos, text_column, n_seq, call.batch_size
        )
        return _streamed_profile(
            model, info, stream, chosen, batch_size=call.batch_size, exclude_first=exclude_first,
            effective_rank=effective_rank, progress=call.progress,
        )  # fmt: skip
    batch = call.batch(
        data, attention_mask=attention_mask, bos=bos, text_column=text_column, n_seq=n_seq
    )
    require_min_tokens(batch, exclude_first)
    if len(batch) == 1:
        _warn_one_sequence()
    run = profile_pass(
        model,
        batch,
        chosen,
        batch_size=call.batch_size,
        exclude_first=exclude_first,
        effective_rank=effective_rank,
        progress=call.progress,
    )
    return run.accumulator.profile(chosen, provenance_of(info, batch, chosen, exclude_first))


def _dataset_stream(
    model: HookedModel,
    data: DataInput,
    attention_mask: torch.Tensor | None,
    bos: BosPolicy | bool,
    text_column: str,
    n_seq: int | None,
    batch_size: int,
) -> DatasetStream:
    """The :class:`~homoglens.run.data.DatasetStream` of the Hugging Face dataset ``data``, read
    ``batch_size`` rows per rank at a time (every rank reads the whole stream and takes its
    shard of each part).

    Raises:
        InvalidInputError: an ``attention_mask`` was given (text is padded by homoglens).
    """
    if attention_mask is not None:
        raise InvalidInputError(
            "attention_mask is only for token input; text is padded and masked by homoglens"
        )
    # every rank reads the whole stream and takes its shard of each part
    return DatasetStream(
        model,
        data,
        rows=batch_size * world()[1],
        n_seq=n_seq,
        bos=bos,
        text_column=text_column,
    )


def _warn_one_sequence(stacklevel: int = 3) -> None:
    """Warn that one sequence gives no anisotropy baseline (``stacklevel``: the user's call)."""
    warnings.warn(
        "one sequence: the anisotropy baseline (mean cosine across sequences) and so "
        "`adjusted` are NaN; pass several sequences (e.g. a list of texts) to get them",
        stacklevel=stacklevel,
    )


def _streamed_profile(
    model: HookedModel,
    info: Any,
    stream: DatasetStream,
    chosen: tuple[int, ...],
    *,
    batch_size: int,
    exclude_first: bool,
    effective_rank: bool,
    progress: bool,
) -> HomogenizationProfile:
    """The profile of the parts of ``stream``, each run through :func:`profile_pass` as it is
    read and added into running sums (whose position axis grows to the longest sequence
    seen); no part outlives its pass. Equal to the profile of all parts as one batch."""
    total: ProfileSums | None = None
    last: TokenBatch | None = None
    bar = tqdm(total=stream.n_seq, unit="seq", desc="homogenization", disable=not progress)
    try:
        for part in stream:
            require_min_tokens(part, exclude_first, offset=stream.n_read - len(part))
            run = profile_pass(
                model,
                part,
                chosen,
                batch_size=batch_size,
                exclude_first=exclude_first,
                effective_rank=effective_rank,
                progress=False,
            )
            total = _added(total, run.accumulator)
            last = part
            bar.update(len(part))
    finally:
        bar.close()
    if total is None or last is None:  # the stream refuses a dataset without text
        raise InvalidInputError(f"the {stream.label} holds no text")
    if stream.n_read == 1:
        _warn_one_sequence(stacklevel=4)
    provenance = replace(
        provenance_of(info, last, chosen, exclude_first),
        bos=stream.bos,
        data=stream.description,
        data_sha256=stream.sha256,
        data_rows=stream.row_fingerprints,
    )
    return total.profile(chosen, provenance)


def _added(total: ProfileSums | None, part: ProfileSums) -> ProfileSums:
    """``total + part`` (into ``total``), the position axis padded to the longer of the two."""
    if total is None:
        return part
    width = max(len(total.pos["count"]), len(part.pos["count"]))

    def grown(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[-1]))

    for mine, theirs in ((total.layer_pos, part.layer_pos), (total.pos, part.pos)):
        for name in mine:
            mine[name] = grown(mine[name]) + grown(theirs[name]).to(mine[name].device)
    for name, acc in total.layer.items():
        acc += part.layer[name].to(acc.device)
    total.unit_sum += part.unit_sum.to(total.unit_sum.device)
    for name in total.scalars:
        total.scalars[name] += part.scalars[name]
    return total


GROUP_BYTES = 256 << 20
"""Bytes of scaled vectors a profile reads at once on a GPU (entries of one batch grouped)."""


class ProfileReducer(Sums):
    """The profile's share of a streamed pass: the residual stream at the chosen entries,
    reduced inside hooks to mergeable sums (and, on request, per-sequence values and the
    next-token loss, for the paired ablation study). The sums of its
    :class:`~homoglens.profile.result.ProfileSums` and the per-sequence rows are declared
    to :class:`~homoglens.run.engine.Sums`, which merges them over ranks."""

    def __init__(
        self,
        model: HookedModel,
        n_pos: int,
        chosen: tuple[int, ...],
        *,
        exclude_first: bool,
        effective_rank: bool,
        per_sequence: bool = False,
        loss: bool = False,
    ) -> None:
        self.device = next(iter(model.parameters())).device  # stream() checks the model
        self.n_pos, self.chosen = n_pos, chosen
        self.exclude_first, self.effective_rank = exclude_first, effective_rank
        self.per_sequence = per_sequence
        self.accumulator = acc = ProfileSums(
            len(chosen), n_pos, int(model.cfg.d_model), self.device, effective_rank
        )
        rows: dict[str, tuple[int, ...]] = {}
        if per_sequence:
            rows["seq_to_others"] = (len(chosen), n_pos)  # [batch layer pos] float32, CPU
            rows["seq_mean_pairwise"] = (len(chosen),)  # [batch layer]
        if loss:
            rows["seq_loss"] = ()  # [batch] mean next-token loss, nats
            rows["seq_icl"] = ()  # [batch] in-context-learning score, nats
        sums = {**acc.layer_pos, **acc.layer, "unit_sum": acc.unit_sum, **acc.pos, **acc.scalars}
        super().__init__(sums=sums, rows=rows)
        self.needs_logits = loss
        self.state: dict[str, Any] = {}

    @property
    def seq_to_others(self) -> list[torch.Tensor]:
        """``[batch layer pos]`` float32 CPU parts: each sequence's mean cosine of a token to
        the other tokens, per entry and position (``per_sequence``; NaN where not counted)."""
        return [part.float() for part in self.rows.get("seq_to_others", [])]

    @property
    def seq_mean_pairwise(self) -> list[torch.Tensor]:
        """``[batch layer]`` float32 CPU parts: each sequence's mean pairwise cosine."""
        return [part.float() for part in self.rows.get("seq_mean_pairwise", [])]

    @property
    def seq_loss(self) -> list[torch.Tensor]:
        """``[batch]`` float32 CPU parts: each sequence's mean next-token loss (nats)."""
        return [part.float() for part in self.rows.get("seq_loss", [])]

    @property
    def seq_icl(self) -> list[torch.Tensor]:
        """``[batch]`` float64 CPU parts: each sequence's in-context-learning score (nats)."""
        return list(self.rows.get("seq_icl", []))

    def hooks(self) -> list[HookSpec]:
        names = [resid_hook_name(layer) for layer in self.chosen]
        return [(name, self._hook(i, name)) for i, name in enumerate(names)]

    def _hook(self, i: int, name: str) -> HookFn:
        def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
            state = self.state
            key = (resid.device, resid.dtype)
            counted = state["counted"].get(key)
            if counted is None:  # once per batch (and device / dtype)
                pos_index = state["pos_index"].to(resid.device)
                counted = state["counted"][key] = (
                    pos_index,
                    counted_tokens(pos_index, work_dtype(resid.dtype), resid.device),
                )
            if unsynced(resid.device) and not self.effective_rank:
                self._grouped(i, resid, counted[1])
                return
            try:  # the part that reads the vectors; the rest runs once per batch, in end()
                terms = entry_terms(
                    resid, counted[0], effective_rank=self.effective_rank, counted=counted[1]
                )
            except NonFiniteActivationError as err:
                raise NonFiniteActivationError(f"{name}: {err}") from None
            state["terms"][i] = terms.to(self.device)

        return hook

    def _grouped(self, i: int, resid: torch.Tensor, counted: CountedTokens) -> None:
        """On a GPU: scale the entry into a slot of the current group's buffer (a few kernels),
        and read a whole group of entries at once (one set of kernels for up to
        :data:`GROUP_BYTES` of vectors, instead of one per entry: the launches, not the
        arithmetic, bound a profile there)."""
        group = self.state.get("group")
        if group is not None and group["buffer"].device != resid.device:
            self._flush()  # a model split over devices: groups do not cross them
            group = None
        b, n_pos, d = (int(s) for s in resid.shape)
        if group is None:
            work = work_dtype(resid.dtype)
            per = b * n_pos * d * (torch.finfo(work).bits // 8)
            k = max(1, min(len(self.chosen) - i, GROUP_BYTES // per))
            buffer = torch.empty(k * b, n_pos, d, dtype=work, device=resid.device)
            group = self.state["group"] = {"buffer": buffer, "slots": [], "counted": counted}
        j = len(group["slots"])
        _, exponent, bad = prepare_entry(
            resid, counted.weight, out=group["buffer"][j * b : (j + 1) * b]
        )
        group["slots"].append((i, exponent, bad))
        if len(group["slots"]) * b == group["buffer"].shape[0] or i == len(self.chosen) - 1:
            self._flush()

    def _flush(self) -> None:
        group = self.state.pop("group", None)
        if group is None or not group["slots"]:
            return
        slots, c = group["slots"], group["counted"]
        n = len(slots)
        b = int(c.weight.shape[0])
        counted = CountedTokens(c.weight.repeat(n, 1), c.n_tokens.repeat(n), c.rest.repeat(n, 1))
        terms = prepared_terms(
            group["buffer"][: n * b],
            torch.cat([exponent for _, exponent, _ in slots]),
            torch.stack([bad for _, _, bad in slots]).any(),
            counted,
        )
        for (i, _, bad), part in zip(slots, split_terms(terms, n), strict=True):
            self.state["terms"][i] = part._replace(bad=bad).to(self.device)

    def begin(self, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        self.state["pos_index"] = positions_from_mask(mask, exclude_first=self.exclude_first)
        self.state["counted"] = {}
        self.state["terms"] = [None] * len(self.chosen)

    def end(self) -> None:
        self._flush()
        terms = self.state.pop("terms", None)
        if terms is not None:
            missing = [self.chosen[i] for i, t in enumerate(terms) if t is None]
            if missing:  # pragma: no cover - every pass runs through its last hook point
                raise RuntimeError(f"homoglens: the pass never reached layers {missing}")
            check_terms(terms, [resid_hook_name(layer) for layer in self.chosen])
            pos_index = self.state["pos_index"].to(self.device)
            sums = sums_of_terms(
                stack_terms(terms), pos_index, self.n_pos, per_sequence=self.per_sequence
            )
            self.accumulator.add_layers(sums)
            if self.per_sequence:  # [layer batch pos] -> [batch layer pos], padded to n_pos
                others = torch.full(
                    (pos_index.shape[0], len(self.chosen), self.n_pos),
                    float("nan"),
                    dtype=torch.float64,
                    device=self.device,
                )
                seq = sums["seq_to_others"].transpose(0, 1)
                others[..., : seq.shape[-1]] = seq
                self.rows["seq_to_others"].append(others.float().cpu())
                self.rows["seq_mean_pairwise"].append(sums["seq_mean_pairwise"].T.float().cpu())
        self.state.clear()

    def logits(self, logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        nll = next_token_nll(logits, tokens)
        self.rows["seq_loss"].append(mean_nll(nll, mask).cpu())
        self.rows["seq_icl"].append(icl_score(nll, mask).cpu())


def profile_pass(
    model: HookedModel,
    batch: TokenBatch,
    chosen: tuple[int, ...],
    *,
    batch_size: int,
    exclude_first: bool,
    effective_rank: bool,
    progress: bool,
    extra_hooks: Sequence[HookSpec] = (),
    per_sequence: bool = False,
    loss: bool = False,
    desc: str = "homogenization",
    uniform_length: bool = False,
) -> ProfileReducer:
    """Stream ``batch`` through ``model`` once (with ``extra_hooks`` attached: an ablation)
    and return the filled :class:`ProfileReducer`.

    With ``uniform_length`` no forward batch mixes sequence lengths (batches are cut where the
    length changes), so position hooks see each sequence's own length as the batch width.
    """
    n_pos = int(batch.lengths.max())  # of all sequences, so every rank sums the same shapes
    reducer = ProfileReducer(
        model,
        n_pos,
        chosen,
        exclude_first=exclude_first,
        effective_rank=effective_rank,
        per_sequence=per_sequence,
        loss=loss,
    )
    stream(
        model,
        batch,
        [reducer],
        batch_size=batch_size,
        desc=desc,
        progress=progress,
        extra_hooks=extra_hooks,
        uniform_length=uniform_length,
    )
    return reducer


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
        A :class:`HomogenizationProfile` with ``layers == (0,)``. A counted vector that is
        exactly zero has no direction: its cosines count as 0, with a warning (mask it out).

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
    shape_only = torch.zeros(resid.shape[:2], dtype=torch.long, device=resid.device)
    mask = check_attention_mask(shape_only, attention_mask).to(
        resid.device
    )  # same checks as the model path
    pos_index = positions_from_mask(mask, exclude_first=exclude_first)
    uncounted = pos_index < 0  # pads (and an excluded first token) do not tell copies apart
    said_copies(
        resid.detach().masked_fill(uncounted[..., None], 0.0)
        if bool(uncounted.any())
        else resid.detach()
    )
    n_pos = int(mask.sum(1).max())
    sums = homogenization_sums(resid, pos_index, n_pos, effective_rank=effective_rank)
    acc = ProfileSums(1, n_pos, int(resid.shape[-1]), resid.device, effective_rank)
    acc.add(0, sums, first=True)
    return acc.profile(
        (0,),
        Provenance(
            exclude_first=exclude_first,
            data="given activations",
            homoglens_version=package_version("homoglens"),
        ),
    )
