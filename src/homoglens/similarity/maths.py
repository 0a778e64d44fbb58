"""Pure maths of position-resolved similarity: the per-window statistics without a ``[pos
pos]`` matrix (:func:`window_statistics`, :class:`WindowSums`, :func:`cross_shares`), the
passes over activations you hold (:func:`activation_fields`), and the names of
:mod:`homoglens.similarity.passes` (the ``[layer pos pos]`` sums, their passes and the
statistics' coefficients) that other modules read from here. No forward pass here."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError, NonFiniteActivationError
from homoglens.core.types import Centring
from homoglens.core.validate import as_bool, as_int, check_attention_mask
from homoglens.similarity.options import (
    SimilarityOptions,
    check_drop_dims,
    check_similarity_options,
)
from homoglens.similarity.passes import (
    SIMILARITY_STATISTICS,
    Feed,
    Merged,
    SimilaritySums,
    Take,
    centre_moments,
    cross_pass,
    drop_dimensions,
    edge_groups,
    finish_fields,
    main_pass,
    similarity_coefficients,
    unit_rows,
)

__all__ = [
    "ACTIVATION_CACHE_BYTES",
    "SIMILARITY_STATISTICS",
    "SimilaritySums",
    "WindowSums",
    "activation_fields",
    "cross_shares",
    "edge_groups",
    "first_counted",
    "pseudo_values",
    "run_similarity_passes",
    "similarity_coefficients",
    "similarity_fields",
    "window_statistics",
]

ACTIVATION_CACHE_BYTES = 2 * 2**30
"""Memory (bytes) a measurement with more than one pass over the same windows
(:func:`~homoglens.positional_similarity`'s centring and pseudo-values, the pseudo-values of
:func:`~homoglens.attention_bias_study` and :func:`~homoglens.length_study`) may use to keep
the vectors of its first pass (per rank), so that the later passes read them instead of running
the model again; above it, every pass runs the model."""

RECORDED_OPTIONS: tuple[str, ...] = (
    "edge_k",
    "space",
    "centre",
    "standardize",
    "massive_threshold",
)
"""The fields of a :class:`~homoglens.similarity.result.PositionalSimilarity` that record a
:class:`~homoglens.similarity.options.SimilarityOptions`' values as they are, in the result's
order."""

_C_STATS = (2, 3, 4)
"""The statistics of ``W = M - C`` that subtract ``C`` (matched_first, matched_last,
homogenization); the naive ones read ``M`` only."""


ONE_WINDOW = (
    "one window: the cross-window matrix C (and so W, SP, the matched excess) is NaN; pass "
    "several windows"
)
"""The warning of a similarity measured on one window."""


class WindowSums:
    """Float64 running sums of one run, for every window's :data:`SIMILARITY_STATISTICS` (of
    ``W = M - C``), ``SP`` and ``M[:, 0]`` without a ``[pos pos]`` matrix: per window its
    statistics (:func:`window_statistics`), and over windows the sums of unit vectors, of their
    squares and of their cosine to position 0: O(T d_model) memory per layer, where
    :class:`SimilaritySums` holds ``[layer pos pos]`` (the attention-bias study at long
    windows; uncentred vectors only). A second pass (:meth:`add_cross`, or
    :meth:`cross_from_kept` after :meth:`keep_units`) gives each window's share of the
    cross-window terms, for jackknife pseudo-values."""

    def __init__(self, n_layer: int, n_pos: int, d_model: int, edge_k: int, device: torch.device):
        f64 = {"dtype": torch.float64, "device": device}
        edge_groups(n_pos, edge_k)
        self.n_layer, self.n_pos, self.d_model, self.edge_k = n_layer, n_pos, d_model, edge_k
        self.units = torch.zeros(n_layer, n_pos, d_model, **f64)
        self.squares = torch.zeros(n_layer, n_pos, **f64)
        self.first = torch.zeros(n_layer, n_pos, **f64)
        self.n = torch.zeros((), **f64)
        self.rows: list[torch.Tensor] = []  # [batch layer stat] per batch
        self.cross_rows: list[torch.Tensor] = []  # [batch layer stat] per batch, second pass
        self.same_rows: list[torch.Tensor] = []  # [batch layer pos] per batch, second pass
        # every window's unit vectors [layer window pos d] (float32), when kept for the second
        # pass (keep_units): one preallocated block, filled in stream order
        self.kept: torch.Tensor | None = None
        self._kept_rows = [0] * n_layer

    def keep_units(self, n_windows: int, dtype: torch.dtype = torch.float32) -> None:
        """Keep the unit vectors of the next ``n_windows`` windows (in ``dtype``, the work
        dtype: float64 for a float64 model; on the device of the activations), so that
        :meth:`cross_from_kept` needs no second forward pass."""
        self.kept = torch.empty(
            (self.n_layer, n_windows, self.n_pos, self.d_model),
            dtype=dtype,
            device=self.units.device,
        )

    def units_of(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit vectors of ``x [batch pos d]`` (0 for zero vectors) and their norms."""
        return unit_rows(x)

    def add(self, i: int, x: torch.Tensor, row: torch.Tensor) -> None:
        """Add layer ``i`` of a batch; its per-window statistics go into ``row``."""
        u, _ = self.units_of(i, x)
        if self.kept is not None:
            start = self._kept_rows[i]
            self.kept[i, start : start + u.shape[0]] = u.to(self.kept.device, self.kept.dtype)
            self._kept_rows[i] = start + int(u.shape[0])
        row[:, i] = window_statistics(u, self.edge_k)
        u64 = u.double()
        self.units[i] += u64.sum(0).to(self.units.device)
        self.squares[i] += (u64 * u64).sum((0, 2)).to(self.squares.device)
        self.first[i] += (u64 @ u64[:, 0, :, None])[..., 0].sum(0).to(self.first.device)

    def add_cross(self, i: int, x: torch.Tensor) -> None:
        """Second pass, after the final (merged) sums: layer ``i`` of a batch ``x [batch
        pos d]`` (raw vectors: a forward pass run again). Each window's share of the
        cross-window terms goes to :attr:`cross_rows` / :attr:`same_rows` (:func:`cross_shares`);
        batches in the order of the first pass, every layer of a batch before the next."""
        u, _ = self.units_of(i, x)
        self._add_cross(i, u)

    def cross_from_kept(self, batch_size: int = 64) -> None:
        """The second pass from the kept unit vectors (:meth:`keep_units`), no forward pass."""
        if self.kept is None:
            raise RuntimeError("no unit vectors were kept")
        for start in range(0, self._kept_rows[0], batch_size):
            stop = min(start + batch_size, self._kept_rows[0])
            for i in range(self.n_layer):
                self._add_cross(i, self.kept[i, start:stop])
        self.kept = None

    def _add_cross(self, i: int, u: torch.Tensor) -> None:
        if i == 0:
            f64 = {"dtype": torch.float64, "device": "cpu"}
            b = int(u.shape[0])
            self.cross_rows.append(torch.zeros(b, self.n_layer, len(SIMILARITY_STATISTICS), **f64))
            self.same_rows.append(torch.zeros(b, self.n_layer, self.n_pos, **f64))
        cross, same = cross_shares(u, self.units[i], self.edge_k)
        self.cross_rows[-1][:, i] = cross.cpu()
        self.same_rows[-1][:, i] = same.cpu()

    def finish(
        self,
        window_rows: torch.Tensor,
        cross_rows: torch.Tensor | None = None,
        same_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """From every window's rows ``[batch layer stat]`` (all ranks, CPU) and, after the second
        pass, its shares of the cross-window terms (``[batch layer stat]``, ``[batch layer pos]``):
        ``([batch layer stat]`` per-window statistics as :meth:`PositionalSimilarity.per_window`
        gives them (jackknife pseudo-values with the shares, else ``C`` held fixed),
        ``[layer pos]`` SP, ``[layer pos]`` the cosine to position 0, ``[batch layer 2]`` the
        pseudo-values of ``sp_first`` / ``sp_last`` or None without the shares). Windows
        fewer than 2: the C-subtracted statistics and SP are NaN."""
        n = int(window_rows.shape[0])
        units = self.units.cpu()
        out = window_rows.clone()
        if n < 2:
            c_stats = torch.full(
                (self.n_layer, len(SIMILARITY_STATISTICS)),
                math.nan,
                dtype=torch.float64,
                device="cpu",
            )
            sp = torch.full((self.n_layer, self.n_pos), math.nan, dtype=torch.float64, device="cpu")
        else:
            pair = n * (n - 1)
            together = torch.cat(  # stat(U U^T), one layer at a time where the sums are
                [window_statistics(u[None], self.edge_k).cpu() for u in self.units]
            )
            c_stats = (together - window_rows.sum(0)) / pair
            sp = ((units * units).sum(-1) - self.squares.cpu()) / pair
        pseudo = cross_rows is not None and n >= 2
        for e in _C_STATS:
            out[..., e] = window_rows[..., e] - c_stats[None, :, e].to(out.dtype)
            if pseudo:
                assert cross_rows is not None
                out[..., e] += c_stats[None, :, e] - pseudo_values(
                    cross_rows[..., e], c_stats[None, :, e], n
                )
        sp_edges = None
        if same_rows is not None:
            first, middle, last = edge_groups(self.n_pos, self.edge_k)
            psi = pseudo_values(2 * same_rows, sp[None], max(n, 2))  # [batch layer pos]; mean: SP
            mid = psi[..., list(middle)].mean(-1)
            sp_edges = torch.stack(
                [psi[..., list(first)].mean(-1) - mid, psi[..., list(last)].mean(-1) - mid], -1
            )
        return out, sp, self.first.cpu() / max(n, 1), sp_edges


def pseudo_values(cross: torch.Tensor, u: torch.Tensor, n: int) -> torch.Tensor:
    """Jackknife pseudo-values ``n U - (n-1) U_(-s)`` of a cross-window U-statistic ``u`` (a
    mean over ordered pairs of different windows) from ``cross``, each window's sum of the
    pair terms it takes part in (both orders). Exact delete-one for n > 2, where ``U_(-s) =
    (n (n-1) U - cross_s) / ((n-1) (n-2))``, so ``(cross_s - n U) / (n - 2)``; the first-order
    (Hajek) ``cross_s / (n-1) - U`` for n = 2. The first-order values are ``(n-2)/(n-1)`` of
    the exact deviations: a standard error 3 % too small at 32 windows (issue 51, point 5)."""
    if n <= 2:
        return cross / (n - 1) - u
    return (cross - n * u) / (n - 2)


def cross_shares(
    u: Float[torch.Tensor, "batch pos d_model"],
    unit_sum: Float[torch.Tensor, "pos d_model"],
    edge_k: int,
) -> tuple[Float[torch.Tensor, "batch stat"], Float[torch.Tensor, "batch pos"]]:
    """Each window's share of the cross-window terms of ``C`` (the second pass of the jackknife
    pseudo-values), without a ``[pos pos]`` matrix: with ``V = sum_t U_t`` over every window,
    ``cross_s = sum_{t != s} stat(U_s U_t^T + U_t U_s^T)``, which by polarisation of the
    quadratic form :func:`window_statistics` is ``stat(V) - stat(U_s) - stat(V - U_s)``, and
    ``same_s[p] = sum_{t != s} u_{s,p} . u_{t,p}``. Float64.

    Args:
        u: ``[batch pos d_model]`` unit vectors of a batch of windows.
        unit_sum: ``[pos d_model]`` their sum over every window (all ranks).
        edge_k: Positions per edge.

    Returns:
        ``([batch 5]`` shares of :data:`SIMILARITY_STATISTICS`, ``[batch pos]`` same-position
        shares``)``.

    References:
        Efron & Stein 1981 (jackknife of U-statistics); docs/similarity.md, "Intervals".
    """
    u64 = u.to(torch.float64)
    total = unit_sum.to(u64.device, torch.float64)[None]
    rest = total - u64
    cross = window_statistics(total, edge_k) - window_statistics(u64, edge_k)
    cross = cross - window_statistics(rest, edge_k)
    same = (u64 * rest).sum(-1)
    return cross, same


def activation_fields(
    resid: Any,  # the user's input, checked below: [batch pos d_model] or [layer batch pos d_model]
    attention_mask: Any = None,  # checked below (check_attention_mask): a typed error names the fix
    *,
    centre: Centring | None = None,
    standardize: bool = False,
    exclude_first: bool = False,
    edge_k: int = 8,
    massive_threshold: float = 100.0,
    pseudo_values: bool = True,
    drop_dims: int = 0,
    batch_size: int = 64,
) -> dict[str, Any]:
    """The fields (but the provenance) of :func:`~homoglens.similarity_from_activations`'s
    result: checks the input, then runs the passes over the given vectors."""
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
    options = check_similarity_options(
        "resid", centre, standardize, edge_k, massive_threshold, pseudo_values
    )
    edge_k = options.edge_k
    first = int(as_bool("exclude_first", exclude_first))
    drop_dims = check_drop_dims(drop_dims, d_model)
    batch_size = as_int("batch_size", batch_size, low=1)
    mask = check_attention_mask(
        torch.zeros(n_seq, width, dtype=torch.long, device="cpu"), attention_mask
    ).to(x_all.device)
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
    if n_seq == 1:
        warnings.warn(ONE_WINDOW, stacklevel=3)
    keep = mask.bool()
    work = torch.float64 if x_all.dtype == torch.float64 else torch.float32
    if not bool(torch.isfinite(x_all[:, keep]).all()):
        raise NonFiniteActivationError(
            "resid holds NaN or inf at real tokens; nothing was averaged in"
        )
    device = x_all.device
    sums = SimilaritySums(n_layer, n_pos, d_model, edge_k, device)

    def feed(fn: Take, merged: Merged) -> None:
        """Every window, here: the sums and rows ``merged`` declares hold them all as fed."""
        for start in range(0, n_seq, batch_size):
            stop = min(start + batch_size, n_seq)
            rows = keep[start:stop]
            for i in range(n_layer):
                x = x_all[i, start:stop][rows].view(stop - start, length, d_model)
                fn(i, x.to(work), first)

    run_similarity_passes(sums, lambda _desc: feed, options, drop_dims, n_layer, device)
    return similarity_fields(sums, tuple(range(n_layer)), n_seq, first=first, options=options)


def run_similarity_passes(
    sums: SimilaritySums,
    feed: Callable[[str], Feed],
    options: SimilarityOptions,
    drop_dims: int,
    n_layer: int,
    device: torch.device,
) -> None:
    """The passes a similarity measurement with the checked ``options`` asks for, in this
    order: ``drop_dims``'s dimension energy, the centring, the main pass, the pseudo-values'
    cross-window shares; ``feed(desc)`` feeds the pass that ``desc`` names."""
    if drop_dims:
        drop_dimensions(sums, feed("similarity (dimension energy)"), drop_dims, device)
    if options.centre is not None:
        centre_moments(
            sums,
            feed("similarity (centring)"),
            options.centre,
            options.standardize,
            options.massive_threshold,
            device,
        )
    main_pass(sums, feed("similarity"), n_layer)
    if options.pseudo_values:
        cross_pass(sums, feed("similarity (pseudo-values)"), n_layer)


def similarity_fields(
    sums: SimilaritySums,
    layers: tuple[int, ...],
    n_all: int,
    *,
    first: int,
    options: SimilarityOptions,
) -> dict[str, Any]:
    """:func:`~homoglens.similarity.passes.finish_fields` of a measurement with the checked
    ``options``: the result's fields but its provenance."""
    recorded = {name: getattr(options, name) for name in RECORDED_OPTIONS}
    pseudo = options.pseudo_values
    return finish_fields(sums, layers, n_all, first=first, pseudo=pseudo, recorded=recorded)


def first_counted(exclude_first: Any, bos: bool | None) -> int:
    """The first counted position (0 or 1) for ``exclude_first`` (``"auto"``: 1 when position
    0 holds a BOS; mixed windows warn and leave it out of all).

    Raises:
        InvalidInputError: ``exclude_first`` not a bool or ``"auto"``.
    """
    if isinstance(exclude_first, str) and exclude_first == "auto":
        if bos is None:
            warnings.warn(
                "some windows start with a BOS and some do not; exclude_first='auto' leaves "
                "position 0 out of all of them",
                stacklevel=3,
            )
            return 1
        return int(bool(bos))
    return int(as_bool("exclude_first", exclude_first))


def window_statistics(
    x: Float[torch.Tensor, "batch pos d_model"], edge_k: int
) -> Float[torch.Tensor, "batch stat"]:
    """Each window's :data:`SIMILARITY_STATISTICS` of its Gram matrix ``G = X X^T`` (what
    :func:`similarity_coefficients` gives against the ``[pos pos]`` matrix), without the
    ``[pos pos]`` matrix: O(T d_model) for the naive statistics and the mean off-diagonal
    (from each row's sum, x_p . sum_j x_j), and for the matched ones the edge rows of G and
    the middle's lag sums ``L[d] = sum_a G[a, a + d]`` over middle pairs, read a block of
    rows at a time (O(block x T) memory, O(T^2 d_model) work). Products in ``x``'s dtype,
    sums in float64.

    Args:
        x: ``[batch pos d_model]`` vectors (unit vectors for cosines; any vectors work).
        edge_k: Positions per edge.

    Returns:
        ``[batch 5]`` float64.

    Raises:
        InvalidInputError: ``pos < 2 * edge_k + 2``.
    """
    from homoglens.run.blocked_attention import query_blocks

    first, middle, last = edge_groups(int(x.shape[1]), edge_k)
    n_batch, n_pos = int(x.shape[0]), int(x.shape[1])
    f64 = torch.float64
    dev = x.device
    x64 = x.to(f64)
    total = x64.sum(1)  # [batch d]
    diag = (x64 * x64).sum(-1)  # [batch pos]
    off = (x64 @ total[..., None])[..., 0] - diag  # sum_{j != p} G[p, j]
    out = torch.empty(n_batch, len(SIMILARITY_STATISTICS), dtype=f64, device=dev)
    m = len(middle)
    for e, edge in enumerate((first, last)):
        out[:, e] = off[:, edge.start : edge.stop].sum(1) / (len(edge) * (n_pos - 1)) - off[
            :, middle.start : middle.stop
        ].sum(1) / (m * (n_pos - 1))
    out[:, 4] = (off.sum(1)) / (n_pos * (n_pos - 1))
    # the middle's lag sums L[d], d = 1 .. m - 1, a block of middle rows at a time
    mid = x[:, middle.start : middle.stop]
    lags = torch.zeros(n_batch, m, dtype=f64, device=dev)
    size = torch.finfo(x.dtype).bits // 8 if x.is_floating_point() else 4
    for a0, a1 in query_blocks(m, n_batch * m * (size + 16), dev):
        g = (mid[:, a0:a1] @ mid.transpose(1, 2)).to(f64)  # [batch rows m]
        d = torch.arange(m, device=dev)[None, :] - torch.arange(a0, a1, device=dev)[:, None]
        g = torch.where(d > 0, g, 0.0)
        lags.scatter_add_(1, d.clamp_min(0).flatten()[None].expand(n_batch, -1), g.flatten(1))
    for e, edge in enumerate((first, last)):
        coef_pairs, coef_lags = _matched_weights(n_pos, edge_k, e)
        rows = x[:, edge.start : edge.stop]
        g = (rows @ mid.transpose(1, 2)).to(f64)  # [batch k m]
        out[:, 2 + e] = (g * coef_pairs.to(dev)).sum((1, 2)) - lags @ coef_lags.to(dev)
    return out


@lru_cache(maxsize=8)
def _matched_weights(n_pos: int, edge_k: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For edge ``e`` (0 first, 1 last): ``[k m]`` weights of the edge-middle pairs (1 / P on
    pairs at most m - 1 apart) and ``[m]`` weights of the middle's lag sums (lags[d] / (m - d),
    lags[d] the share of those pairs at lag d): matched_e = sum of the first against the
    edge rows of G minus the second against L (:func:`similarity_coefficients`)."""
    first, middle, last = edge_groups(n_pos, edge_k)
    edge = (first, last)[e]
    m = len(middle)
    i = torch.tensor(list(edge), device="cpu")[:, None]
    j = torch.tensor(list(middle), device="cpu")[None, :]
    pair = ((i - j).abs() <= m - 1).to(torch.float64)
    n_pairs = float(pair.sum())
    lag = torch.where(pair > 0, (i - j).abs(), 0)
    per_lag = torch.zeros(m, dtype=torch.float64, device="cpu")
    per_lag.index_add_(0, lag.flatten(), pair.flatten())
    per_lag = per_lag / n_pairs
    per_lag[0] = 0.0
    divisor = (m - torch.arange(m, device="cpu")).to(torch.float64)
    return pair / n_pairs, per_lag / divisor
