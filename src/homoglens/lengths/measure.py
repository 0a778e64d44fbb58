"""The length sweep: one forward pass of the longest windows, every shorter length read as a
prefix (causal models), for end-of-sequence effects that only show over lengths."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import (
    InvalidInputError,
    SequenceTooLongError,
    UnsupportedArchitectureError,
)
from homoglens.core.types import BosPolicy, HookedModel, HookFn, ModelInput
from homoglens.core.validate import as_bool, as_int
from homoglens.lengths.result import LengthStudy
from homoglens.models.architectures import resid_hook_name
from homoglens.run.blocked_attention import AttentionJob, PatternRows
from homoglens.run.data import DataInput, TokenBatch, to_token_batch
from homoglens.run.engine import Sums, merge, model_device, provenance_of, rank_windows, stream
from homoglens.run.entrance import entrance
from homoglens.similarity.maths import (
    ACTIVATION_CACHE_BYTES,
    SIMILARITY_STATISTICS,
    SimilaritySums,
    cross_shares,
    edge_groups,
    first_counted,
    similarity_coefficients,
)
from homoglens.similarity.result import PositionalSimilarity

__all__ = ["length_study"]

_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def _check_length_free(model: HookedModel) -> None:
    """Refuse a model whose positional scaling depends on the sequence length (dynamic NTK or
    LongRoPE rotary scaling): its prefixes are not the shorter windows' runs."""
    hf = getattr(model, "original_model", None)
    config = getattr(hf, "config", None)
    scaling = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    kind = ""
    if isinstance(scaling, dict):
        kind = str(scaling.get("rope_type", scaling.get("type", "")))
    if kind in _LENGTH_DEPENDENT_ROPE:
        raise UnsupportedArchitectureError(
            f"this model scales its rotary embedding by the sequence length (rope_type "
            f"{kind!r}), so a prefix of a long window is not the short window's run; measure "
            "each length separately with positional_similarity(model, windows[:, :T])"
        )


def _lengths(values: Any, n_ctx: int, low: int) -> tuple[int, ...]:
    if getattr(values, "ndim", 1) == 1 and hasattr(values, "tolist"):
        values = values.tolist()  # a 1-d numpy array or tensor
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, torch.Tensor)):
        raise InvalidInputError(f"lengths={values!r} must be a list of integers, e.g. (64, 128)")
    out = [as_int("lengths", v, low=1) for v in values]
    if not out:
        raise InvalidInputError("lengths is empty; pass e.g. lengths=(64, 128, 256)")
    if out != sorted(set(out)):
        raise InvalidInputError(f"lengths={out} must be distinct and ascending")
    if out[-1] > n_ctx:
        raise SequenceTooLongError(
            f"lengths={out} go past the model's context window cfg.n_ctx={n_ctx}; keep every "
            f"length <= {n_ctx}"
        )
    if out[0] < low:
        raise InvalidInputError(
            f"length {out[0]} is too short for the edge statistics (edge_k and a middle of 2 "
            f"positions need {low} tokens); raise it or lower edge_k"
        )
    return tuple(out)


def length_study(
    model: ModelInput,
    data: DataInput,
    *,
    lengths: Sequence[int] = (64, 128, 256, 512, 1024),
    lags: Sequence[int] = (1, 4, 16),
    edge_k: int = 8,
    exclude_first: bool | Literal["auto"] = "auto",
    pseudo_values: bool = True,
    batch_size: int = 8,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> LengthStudy:
    """Measure similarity and attention over positions and over sequence lengths, from one pass.

    Windows of the longest length run once; in a causal decoder the vectors at positions
    p < T do not depend on the tokens after them, so each shorter length T is read from the
    first T positions of the same windows (the prefix). Per position p (the curves): the
    lag-controlled similarity M[p, p - delta] for each lag, ``to_first`` M[p, first], the
    same-position cross-input similarity SP[p], and per block the attention entropy of query p
    divided by log(p + 1) and its mass on key 0. Per length T: H_W and the naive and
    distance-matched edge statistics of the first T positions (docs/similarity.md, "Causal
    decoders and the last token": an end effect of a causal model shows as a trend in p, not as
    an edge).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` in eval mode (decoder-only).
        data: Windows of at least ``max(lengths)`` tokens, of equal length (longer ones are cut);
            token ids, a ``TokenBatch`` (e.g. ``corpus_windows(model, seq_len=1024)``), texts.
        lengths: Lengths T, ascending, each <= ``cfg.n_ctx``.
        lags: Lags delta >= 1 of the lag-controlled similarity.
        edge_k: Positions per edge of the per-length edge statistics.
        exclude_first: Leave position 0 out of the similarity; ``"auto"``: when it holds a BOS.
        pseudo_values: Each window's share of the cross-window terms too (a second pass: the
            unit vectors kept from the first when they fit in
            :data:`~homoglens.similarity.maths.ACTIVATION_CACHE_BYTES`, else a second forward
            pass), so that the per-window statistics that subtract ``C`` are jackknife
            pseudo-values (False: ``C`` held fixed, intervals wider than the truth on real data).
        batch_size: Windows per forward pass.
        attention_mask: ``[batch pos]`` 0/1 for token input.
        bos: BOS policy for text input.
        progress: Show a progress bar.

    Returns:
        A :class:`~homoglens.lengths.result.LengthStudy`.

    Raises:
        InvalidInputError: lengths not ascending, empty or too short for ``edge_k``, windows
            shorter than the longest length or of unequal lengths, fewer than 2 windows, bad lags.
        SequenceTooLongError: a length above ``cfg.n_ctx``.
        UnsupportedArchitectureError: rotary scaling that depends on the sequence length.

    References:
        Yusupov et al. 2025, arXiv 2508.17126; Barbero et al. 2024, arXiv 2406.04267;
        Hsieh et al. 2024, arXiv 2406.16008.

    Examples:
        >>> import torch
        >>> from homoglens import length_study, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> study = length_study(model, torch.randint(0, 1000, (4, 32)), lengths=(16, 32),
        ...                      edge_k=2, progress=False)
        >>> tuple(study.statistics.shape), tuple(study.sp.shape)
        ((2, 3, 5), (3, 32))
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    info = call.info
    _check_length_free(model)
    edge_k = as_int("edge_k", edge_k, low=1)
    pseudo_values = as_bool("pseudo_values", pseudo_values)
    lag_list = _lags(lags)
    batch = call.batch(data, attention_mask=attention_mask, bos=bos)
    first = first_counted(exclude_first, batch.bos)
    chosen = _lengths(lengths, int(model.cfg.n_ctx), 2 * edge_k + 2 + first)
    long = chosen[-1]
    if len(lag_list) == 0 or max(lag_list) >= long:
        raise InvalidInputError(f"lags={list(lag_list)} must be 1..{long - 1}")
    batch = _equal_windows(model, batch, long)
    device = model_device(model)
    n_layers = int(model.cfg.n_layers)
    n_entries = n_layers + 1
    n_pos = long - first
    sums = SimilaritySums(n_entries, n_pos, int(model.cfg.d_model), edge_k, device)
    coefs = [similarity_coefficients(t - first, edge_k).to(device) for t in chosen]
    for t in chosen:
        edge_groups(t - first, edge_k)
    attn = torch.zeros(2, n_layers, long, dtype=torch.float64, device=device)  # entropy, key-0
    kept = _kept_block(model, len(batch), n_entries, n_pos, pseudo_values, device)
    main, n_kept = _main_pass(
        model, batch, sums, attn, coefs, chosen, first, kept,
        batch_size=call.batch_size, progress=call.progress, device=device,
    )  # fmt: skip
    cross = None
    if pseudo_values:
        cross = _pseudo_value_rows(
            model, batch, sums, kept, n_kept, chosen, first, edge_k,
            batch_size=call.batch_size, progress=call.progress, device=device,
        )  # fmt: skip
    del kept
    return _study(info, batch, sums, attn, main, cross, chosen, lag_list, first, edge_k,
                  n_heads=int(model.cfg.n_heads))  # fmt: skip


def _lags(lags: Sequence[int]) -> tuple[int, ...]:
    """``lags`` as a tuple of integers >= 1 (a 1-d numpy array or tensor is accepted).

    Raises:
        InvalidInputError: not a sequence, or an entry that is not an integer >= 1.
    """
    given: Any = lags
    if getattr(given, "ndim", 1) == 1 and hasattr(given, "tolist"):
        given = given.tolist()  # a 1-d numpy array or tensor
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise InvalidInputError(f"lags={lags!r} must be a list of integers >= 1")
    return tuple(as_int("lags", v, low=1) for v in given)


def _equal_windows(model: HookedModel, batch: TokenBatch, long: int) -> TokenBatch:
    """``batch`` checked to hold at least 2 windows of one length >= ``long``, cut to their
    first ``long`` tokens.

    Raises:
        InvalidInputError: fewer than 2 windows, windows of unequal lengths, or shorter than
            ``long``.
    """
    lens = batch.lengths
    if int(lens.min()) != int(lens.max()) or len(batch) < 2:
        raise InvalidInputError(
            f"length_study needs at least 2 windows of equal length, got {len(batch)} of "
            f"{int(lens.min())}..{int(lens.max())} tokens"
        )
    if int(lens[0]) < long:
        raise InvalidInputError(
            f"the windows hold {int(lens[0])} tokens, fewer than the longest length {long}; "
            f"pass windows of >= {long} tokens (corpus_windows(model, seq_len={long}))"
        )
    if int(lens[0]) > long:  # keep the first `long` tokens of each window
        batch = to_token_batch(model, batch.tokens[:, :long])
    return batch


def _kept_block(
    model: HookedModel,
    n_windows: int,
    n_entries: int,
    n_pos: int,
    pseudo_values: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """The block ``[layer window pos d]`` that keeps this rank's unit vectors for the
    pseudo-value pass, when ``pseudo_values`` and it fits in
    :data:`~homoglens.similarity.maths.ACTIVATION_CACHE_BYTES`; else ``None``."""
    d_model = int(model.cfg.d_model)
    start, stop = rank_windows(n_windows)
    f64_model = next(iter(model.parameters())).dtype == torch.float64
    work = torch.float64 if f64_model else torch.float32
    size = n_entries * (stop - start) * n_pos * d_model * (8 if f64_model else 4)
    if pseudo_values and size <= ACTIVATION_CACHE_BYTES:
        return torch.empty(n_entries, stop - start, n_pos, d_model, dtype=work, device=device)
    return None


def _main_pass(
    model: HookedModel,
    batch: TokenBatch,
    sums: SimilaritySums,
    attn: torch.Tensor,
    coefs: list[torch.Tensor],
    chosen: tuple[int, ...],
    first: int,
    kept: torch.Tensor | None,
    *,
    batch_size: int,
    progress: bool,
    device: torch.device,
) -> tuple[Sums, int]:
    """The one pass of the longest windows: the similarity sums of every entry (``sums``),
    the attention entropy and key-0 mass of every block (``attn``), each window's statistics
    at every length (rows ``"window"`` of the returned reducer), and the unit vectors in
    ``kept``; the engine merges them over ranks. Returns the reducer and the number of
    windows kept."""
    n_layers = int(attn.shape[1])
    shape = (len(chosen), sums.n_layer, len(SIMILARITY_STATISTICS))
    red = Sums(
        sums={"within": sums.within, "units": sums.units, "n": sums.n, "attn": attn},
        rows={"window": shape},
    )
    filled = [0] * sums.n_layer
    red.add_hooks(
        [
            (resid_hook_name(e), _resid_hook(e, red, sums, coefs, chosen, first, kept, filled))
            for e in range(sums.n_layer)
        ]
    )
    red.add_jobs({b: AttentionJob(read=_pattern_reader(b, attn, device)) for b in range(n_layers)})
    stream(model, batch, [red], batch_size=batch_size, desc="length sweep", progress=progress)
    return red, filled[0]


def _resid_hook(
    i: int,
    red: Sums,
    sums: SimilaritySums,
    coefs: list[torch.Tensor],
    chosen: tuple[int, ...],
    first: int,
    kept: torch.Tensor | None,
    filled: list[int],
) -> HookFn:
    """The main pass's hook on residual entry ``i``: adds its unit vectors' Gram sums into
    ``sums``, each window's statistics at every length into the batch's row of ``red``, and
    keeps the vectors in ``kept`` (``filled``: windows kept per entry)."""
    f64 = torch.float64
    n_entries = sums.n_layer

    def hook(x: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
        rows = red.rows["window"]
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        x = x.detach().to(work)
        if i == 0:
            rows.append(
                torch.zeros(
                    x.shape[0],
                    len(chosen),
                    n_entries,
                    len(SIMILARITY_STATISTICS),
                    dtype=f64,
                    device=x.device,
                )
            )
            sums.n += x.shape[0]
        u, _ = sums.units_of(i, x[:, first:])
        if kept is not None:
            kept[i, filled[i] : filled[i] + u.shape[0]] = u.to(kept.device, kept.dtype)
            filled[i] += int(u.shape[0])
        gram = u @ u.transpose(1, 2)
        sums.within[i] += gram.sum(0, dtype=f64).to(sums.within.device)
        sums.units[i] += u.sum(0, dtype=f64).to(sums.units.device)
        g64 = gram.double()
        for t, coef in enumerate(coefs):
            n = chosen[t] - first
            rows[-1][:, t, i] = torch.einsum("bij,eij->be", g64[:, :n, :n], coef)
        if i == n_entries - 1:
            rows[-1] = rows[-1].cpu()

    return hook


def _pattern_reader(
    layer: int, attn: torch.Tensor, device: torch.device
) -> Callable[[PatternRows], None]:
    """The attention job of block ``layer``: adds each query's attention entropy and mass on
    key 0, summed over windows and heads, into ``attn[:, layer]``."""
    f64 = torch.float64

    def read(rows: PatternRows) -> None:
        for q0, q1 in rows.blocks():
            a = rows.rows(q0, q1)
            entropy = -torch.special.xlogy(a, a).sum(-1).to(f64)  # [batch head_index query_pos]
            attn[0, layer, q0:q1] += entropy.sum((0, 1)).to(device)
            attn[1, layer, q0:q1] += a[..., 0].sum((0, 1)).to(f64).to(device)

    return read


def _pseudo_value_rows(
    model: HookedModel,
    batch: TokenBatch,
    sums: SimilaritySums,
    kept: torch.Tensor | None,
    n_kept: int,
    chosen: tuple[int, ...],
    first: int,
    edge_k: int,
    *,
    batch_size: int,
    progress: bool,
    device: torch.device,
) -> Sums:
    """The second pass: each window's share of the cross-window terms at every length (rows
    ``"cross"`` and ``"same"`` of the returned reducer), from the merged ``sums``; replayed
    from ``kept`` (its first ``n_kept`` windows) when it holds the vectors, else by a second
    forward pass. Both ways the rows are merged over ranks by the engine."""
    n_entries = sums.n_layer
    n_stat = len(SIMILARITY_STATISTICS)
    red = Sums(rows={"cross": (len(chosen), n_entries, n_stat), "same": (n_entries, sums.n_pos)})
    if kept is not None:
        for a in range(0, n_kept, batch_size):
            for i in range(n_entries):
                _add_cross(red, i, kept[i, a : a + batch_size], sums, chosen, first, edge_k)
        merge([red], len(batch), device)  # no pass ran: the engine's merge, as stream's
        return red

    def again(i: int) -> HookFn:
        def hook(x: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> None:
            work = torch.float64 if x.dtype == torch.float64 else torch.float32
            u = sums.units_of(i, x.detach()[:, first:].to(work))[0]
            _add_cross(red, i, u, sums, chosen, first, edge_k)

        return hook

    red.add_hooks([(resid_hook_name(e), again(e)) for e in range(n_entries)])
    stream(
        model,
        batch,
        [red],
        batch_size=batch_size,
        desc="length sweep (pseudo-values)",
        progress=progress,
    )
    return red


def _add_cross(
    red: Sums,
    i: int,
    u: torch.Tensor,
    sums: SimilaritySums,
    chosen: tuple[int, ...],
    first: int,
    edge_k: int,
) -> None:
    """Each window's share of the cross-window terms of entry ``i`` (unit vectors ``u``), at
    every length, into the batch's rows ``"cross"`` and ``"same"`` of ``red`` (``i == 0``
    starts the batch's rows)."""
    f64 = torch.float64
    n_pos = sums.n_pos
    if i == 0:
        b = int(u.shape[0])
        n_stat = len(SIMILARITY_STATISTICS)
        cpu = {"dtype": f64, "device": "cpu"}
        red.rows["cross"].append(torch.zeros(b, len(chosen), sums.n_layer, n_stat, **cpu))
        red.rows["same"].append(torch.zeros(b, sums.n_layer, n_pos, **cpu))
    for t, length in enumerate(chosen):
        n = length - first
        shares, same = cross_shares(u[:, :n], sums.units[i, :n], edge_k)
        red.rows["cross"][-1][:, t, i] = shares.cpu()
        if n == n_pos:
            red.rows["same"][-1][:, i] = same.cpu()


def _study(
    info: Any,
    batch: TokenBatch,
    sums: SimilaritySums,
    attn: torch.Tensor,
    main: Sums,
    cross: Sums | None,
    chosen: tuple[int, ...],
    lag_list: tuple[int, ...],
    first: int,
    edge_k: int,
    *,
    n_heads: int,
) -> LengthStudy:
    """The :class:`~homoglens.lengths.result.LengthStudy` of the merged sums and rows: per
    length T the statistics of the first T positions, the curves of the longest length
    (``cross``: the pseudo-value rows, ``None`` without them)."""
    f64 = torch.float64
    n_all = len(batch)
    n_layers = int(attn.shape[1])
    entries = tuple(range(n_layers + 1))
    long = chosen[-1]
    n_pos = long - first
    pseudo_values = cross is not None
    norm = torch.log(torch.arange(1, long + 1, dtype=f64, device=attn.device))
    norm[0] = math.nan
    per_window = main.row_values("window")
    window_cross = cross.row_values("cross") if cross is not None else None
    window_same = cross.row_values("same") if cross is not None else None
    provenance = provenance_of(info, batch, entries, bool(first))
    stats, window_stats = [], []
    full: PositionalSimilarity | None = None
    for t, length in enumerate(chosen):
        n = length - first
        sim = PositionalSimilarity(
            layers=entries,
            within_sum=sums.within[:, :n, :n].cpu(),
            unit_sum=sums.units[:, :n].cpu(),
            n_sequences=n_all,
            window_within=per_window[:, t],
            window_cross=window_cross[:, t] if window_cross is not None else None,
            window_same_position=window_same[..., :n] if window_same is not None else None,
            first_position=first,
            edge_k=edge_k,
            provenance=provenance,
        )
        per = torch.stack([sim.per_window(s) for s in SIMILARITY_STATISTICS], -1)
        window_stats.append(per)
        stats.append(per.mean(0))
        full = sim
    assert full is not None
    m = full.M  # [layer pos pos] over counted positions
    pad = torch.full((len(entries), first), math.nan, dtype=f64, device="cpu")
    lag_sim = torch.full((len(entries), len(lag_list), long), math.nan, dtype=f64, device="cpu")
    for d, lag in enumerate(lag_list):
        if lag < n_pos:
            diag = torch.diagonal(m, offset=-lag, dim1=1, dim2=2)  # M[p, p - lag], p >= lag
            lag_sim[:, d, first + lag :] = diag
    scale = float(n_all * n_heads)
    return LengthStudy(
        lengths=chosen,
        lags=lag_list,
        layers=entries,
        n_blocks=n_layers,
        edge_k=edge_k,
        first_position=first,
        n_sequences=n_all,
        lag_similarity=lag_sim,
        to_first=torch.cat([pad, full.to_first], 1),
        sp=torch.cat([pad, full.SP], 1),
        attention_entropy=(attn[0] / scale / norm[None]).cpu(),
        first_key_mass=(attn[1] / scale).cpu(),
        statistics=torch.stack(stats),
        window_statistics=torch.stack(window_stats),
        pseudo_values=pseudo_values,
        provenance=provenance,
    )
