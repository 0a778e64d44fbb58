"""Pure maths of position-resolved similarity: mergeable float64 sums of unit vectors, the
centring, main and cross-window passes over any source of vectors (a model streamed by
:func:`~homoglens.positional_similarity`, or activations you hold), and the fields of the
result. No forward pass here."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
from jaxtyping import Float

from homoglens.distributed import all_reduce_sum, gather_rows
from homoglens.errors import InvalidInputError, NonFiniteActivationError
from homoglens.types import CENTRES, SPACES, Centring, SimilaritySpace
from homoglens.validate import as_bool, as_float, as_int, check_attention_mask

__all__ = [
    "ACTIVATION_CACHE_BYTES",
    "SIMILARITY_STATISTICS",
    "SimilaritySums",
    "activation_fields",
    "edge_groups",
    "first_counted",
    "similarity_coefficients",
    "window_statistics",
    "WindowSums",
    "cross_shares",
]

ACTIVATION_CACHE_BYTES = 2 * 2**30
"""Memory (bytes) a measurement with more than one pass over the same windows
(:func:`~homoglens.positional_similarity`'s centring and pseudo-values, the pseudo-values of
:func:`~homoglens.attention_bias_study` and :func:`~homoglens.length_study`) may use to keep
the vectors of its first pass (per rank), so that the later passes read them instead of running
the model again; above it, every pass runs the model."""

_C_STATS = (2, 3, 4)
"""The statistics of ``W = M - C`` that subtract ``C`` (matched_first, matched_last,
homogenization); the naive ones read ``M`` only."""


ONE_WINDOW = (
    "one window: the cross-window matrix C (and so W, SP, the matched excess) is NaN; pass "
    "several windows"
)
"""The warning of a similarity measured on one window."""


def unit_rows(x: Float[torch.Tensor, "batch pos d_model"]) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit vectors of ``x`` (0 for zero vectors) and ``[batch pos 1]`` their norms.

    Raises:
        NonFiniteActivationError: a vector holds NaN or inf.
    """
    # Fast path: plain norms, when every norm is finite and far from float32's under- and
    # overflow (one reduction checks it); else an exact power-of-two rescaling per vector
    # first (squares of entries above ~1.8e19 overflow, below ~1e-19 underflow).
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    tiny = torch.finfo(x.dtype).tiny ** 0.25
    big = torch.finfo(x.dtype).max ** 0.25
    if bool(((norms > tiny) & (norms < big)).all()):
        return x / norms, norms
    finite = torch.isfinite(x).all(-1)
    if not bool(finite.all()):
        raise NonFiniteActivationError(
            f"{int((~finite).sum())} vectors hold NaN or inf; nothing was averaged in. Check "
            "the model dtype (float16 overflows) or the weights"
        )
    amax = x.abs().amax(-1, keepdim=True)
    exponent = torch.where(amax > 0, torch.frexp(amax).exponent, 0).to(x.dtype)
    x = torch.ldexp(x, -exponent)
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    return torch.where(norms > 0, x / safe, torch.zeros_like(x)), torch.ldexp(norms, exponent)


class SimilaritySums:
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
        # dimensions zeroed before the cosines (drop_dims): a 0/1 mask and their indices
        self.keep: torch.Tensor | None = None  # [layer d]
        self.dropped: torch.Tensor | None = None  # [layer k] long

    def units_of(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Centre, standardise and normalise ``x [batch pos d]`` of layer ``i``: unit vectors
        (0 for zero vectors) in the work dtype, and their norms."""
        if self.mean is not None:
            mean = self.mean[i].to(x.device, x.dtype)
            x = x - (mean if mean.ndim == 2 else mean[None, None])
        if self.scale is not None:
            x = x / self.scale[i].to(x.device, x.dtype)
        if self.keep is not None:
            x = x * self.keep[i].to(x.device, x.dtype)
        return unit_rows(x)

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


def centre_moments(
    sums: SimilaritySums,
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


def drop_dimensions(
    sums: SimilaritySums,
    feed: Callable[[Callable[[int, torch.Tensor, int], None]], None],
    drop_dims: int,
    device: torch.device,
    reduce: bool,
) -> None:
    """First pass of ``drop_dims``: each layer's mean square per dimension over the counted
    tokens (all-reduced over ranks if ``reduce``), of the vectors as measured (before any
    centring: the dimensions that carry a large shared value or huge values at a few tokens);
    its ``drop_dims`` largest dimensions (the massive / rogue ones) are zeroed in every later
    pass, after the centring."""
    energy = torch.zeros(sums.n_layer, sums.d_model, dtype=torch.float64, device=device)

    def take(i: int, x: torch.Tensor, first: int) -> None:
        xs = x[:, first:].double()
        energy[i] += (xs * xs).sum((0, 1)).to(device)

    feed(take)
    if reduce:
        all_reduce_sum([energy])
    top = energy.topk(drop_dims, dim=-1).indices.sort(-1).values
    sums.keep = torch.ones_like(energy).scatter_(1, top, 0.0)
    sums.dropped = top.cpu()


def check_drop_dims(drop_dims: Any, d_model: int) -> int:
    """``drop_dims`` as an int in ``0 .. d_model - 1`` (a typed error that names the range)."""
    value = as_int("drop_dims", drop_dims)
    if value < 0:
        raise InvalidInputError(
            f"drop_dims={value} is negative; it counts the dimensions to zero: pass 0 (none) .. "
            f"{d_model - 1}"
        )
    if value >= d_model:
        raise InvalidInputError(
            f"drop_dims={value} would zero every dimension of d_model={d_model}; pass 0 .. "
            f"{d_model - 1} (a few: the massive or rogue dimensions, e.g. 1-3)"
        )
    return value


def finish_fields(
    sums: SimilaritySums,
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
    pseudo: bool,
    gather: bool = True,
) -> dict[str, Any]:
    """Gather the per-window rows (over ranks if ``gather``): the fields of a
    :class:`~homoglens.results.similarity.PositionalSimilarity` but its provenance."""
    n_layer, n_stat = len(layers), len(SIMILARITY_STATISTICS)

    def rows(parts: list[torch.Tensor], width: int) -> torch.Tensor:
        empty = torch.empty(0, n_layer, width, dtype=torch.float64, device="cpu")
        local = torch.cat([empty, *(p.cpu() for p in parts)])
        return (gather_rows(local, n_all, device) if gather else local).cpu()

    return dict(
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
        dropped_dims=sums.dropped,
    )


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

    def all_reduce(self) -> None:
        """Sum over ranks (the per-window rows are gathered by the caller)."""
        all_reduce_sum([self.units, self.squares, self.first, self.n])

    def add_cross(self, i: int, x: torch.Tensor) -> None:
        """Second pass, after the final (all-reduced) sums: layer ``i`` of a batch ``x [batch
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
        """From every window's rows ``[seq layer stat]`` (all ranks, CPU) and, after the second
        pass, its shares of the cross-window terms (``[seq layer stat]``, ``[seq layer pos]``):
        ``([seq layer stat]`` per-window statistics as :meth:`PositionalSimilarity.per_window`
        gives them (jackknife pseudo-values with the shares, else ``C`` held fixed),
        ``[layer pos]`` SP, ``[layer pos]`` the cosine to position 0, ``[seq layer 2]`` the
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
                out[..., e] += 2 * c_stats[None, :, e] - cross_rows[..., e] / (n - 1)
        sp_edges = None
        if same_rows is not None:
            first, middle, last = edge_groups(self.n_pos, self.edge_k)
            psi = 2 * same_rows / max(n - 1, 1) - sp[None]  # [seq layer pos]; mean: SP
            mid = psi[..., list(middle)].mean(-1)
            sp_edges = torch.stack(
                [psi[..., list(first)].mean(-1) - mid, psi[..., list(last)].mean(-1) - mid], -1
            )
        return out, sp, self.first.cpu() / max(n, 1), sp_edges


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


def check_similarity_options(
    space: Any, centre: Any, standardize: Any, edge_k: Any, massive_threshold: Any, pseudo: Any
) -> tuple[SimilaritySpace, Centring | None, bool, int, float, bool]:
    """Check :func:`~homoglens.positional_similarity`'s options (typed errors that name the
    choices) and return them as their types."""
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


def main_pass(
    sums: SimilaritySums,
    feed: Callable[[Callable[[int, torch.Tensor, int], None]], None],
    n_layer: int,
    reduce: bool,
) -> None:
    """Main pass: the sums and one row of statistics per window; all-reduced over ranks."""
    feed(on_cpu_rows(sums, n_layer))
    if reduce:
        all_reduce_sum([sums.within, sums.units, sums.n])


def on_cpu_rows(
    sums: SimilaritySums | WindowSums, n_layer: int
) -> Callable[[int, torch.Tensor, int], None]:
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


def cross_pass(
    sums: SimilaritySums,
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
    _, centre, standardize, edge_k, massive_threshold, pseudo_values = check_similarity_options(
        "resid", centre, standardize, edge_k, massive_threshold, pseudo_values
    )
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

    def feed(fn: Callable[[int, torch.Tensor, int], None]) -> None:
        for start in range(0, n_seq, batch_size):
            stop = min(start + batch_size, n_seq)
            rows = keep[start:stop]
            for i in range(n_layer):
                x = x_all[i, start:stop][rows].view(stop - start, length, d_model)
                fn(i, x.to(work), first)

    if drop_dims:
        drop_dimensions(sums, feed, drop_dims, device, reduce=False)
    if centre is not None:
        centre_moments(sums, feed, centre, standardize, massive_threshold, device, reduce=False)
    main_pass(sums, feed, n_layer, reduce=False)
    if pseudo_values:
        cross_pass(sums, feed, n_layer)
    return finish_fields(
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
        pseudo=pseudo_values,
        gather=False,
    )


SIMILARITY_STATISTICS: tuple[str, ...] = (
    "naive_first",
    "naive_last",
    "matched_first",
    "matched_last",
    "homogenization",
)
"""Linear statistics of a position x position similarity matrix (see
:func:`similarity_coefficients`): the naive and the distance-matched edge excess at each end,
and the mean off-diagonal entry."""


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


def edge_groups(n_pos: int, edge_k: int) -> tuple[range, range, range]:
    """``(first, middle, last)`` index ranges of ``n_pos`` counted positions: the first
    ``edge_k``, the rest, and the last ``edge_k``.

    Raises:
        InvalidInputError: fewer than ``2 * edge_k + 2`` positions (the distance-matched
            reference needs two middle positions).
    """
    if n_pos < 2 * edge_k + 2:
        most = (n_pos - 2) // 2
        fix = (
            f"lower edge_k to at most {most} or use longer windows"
            if most >= 1
            else "use windows of at least 4 counted positions (longer texts)"
        )
        raise InvalidInputError(
            f"edge_k={edge_k} is too large for {n_pos} counted positions: the two edges and a "
            f"middle of at least 2 positions need {2 * edge_k + 2}; {fix}"
        )
    return range(edge_k), range(edge_k, n_pos - edge_k), range(n_pos - edge_k, n_pos)


def similarity_coefficients(n_pos: int, edge_k: int) -> Float[torch.Tensor, "stat pos pos"]:
    """Coefficients ``A_e`` with ``stat_e(X) = sum_{i<j} A_e[i, j] X[i, j]`` for a symmetric
    position x position matrix ``X``, one per :data:`SIMILARITY_STATISTICS` (float64, zero on
    and below the diagonal).

    With ``F`` the first ``edge_k`` positions, ``L`` the last ``edge_k`` and ``Mid`` the rest
    (``m = |Mid|``), and ``t[p] = mean_{j != p} X[p, j]``:

    * ``naive_first = mean_{p in F} t[p] - mean_{p in Mid} t[p]`` (``naive_last`` with ``L``):
      what ``edge_summary`` reports; biased whenever similarity falls with distance, because
      edge tokens are farther from the rest on average;
    * ``matched_first = mean over pairs (i in F, j in Mid, |i - j| <= m - 1) of X[i, j] -
      r[|i - j|]``, with the reference ``r[d] = mean{X[a, b] : a, b in Mid, |a - b| = d}``
      (middle-middle pairs only); ``matched_last`` likewise with ``L``; zero in expectation
      for any stationary process;
    * ``homogenization = mean_{i != j} X[i, j]``.

    Args:
        n_pos: Counted positions of a window.
        edge_k: Positions per edge.

    Returns:
        ``[5 pos pos]`` float64.

    Raises:
        InvalidInputError: ``n_pos < 2 * edge_k + 2``.

    References:
        docs/similarity.md, "Definitions" (distance-matched excess).
    """
    edge_groups(n_pos, edge_k)
    return _coefficients(n_pos, edge_k).clone()


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
    from homoglens.blocked_attention import query_blocks

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


@lru_cache(maxsize=8)
def _coefficients(n_pos: int, edge_k: int) -> torch.Tensor:
    first, middle, last = edge_groups(n_pos, edge_k)
    f64 = torch.float64
    cpu = torch.device("cpu")  # a table made once on the CPU, cached, moved where needed
    out = torch.zeros(len(SIMILARITY_STATISTICS), n_pos, n_pos, dtype=f64, device=cpu)
    # naive: t[p] = sum_{j != p} X[p, j] / (n - 1); a pair (i, j) enters t[i] and t[j]
    for e, edge in enumerate((first, last)):
        row = torch.zeros(n_pos, dtype=f64, device=cpu)
        row[list(edge)] = 1.0 / (len(edge) * (n_pos - 1))
        row[list(middle)] = -1.0 / (len(middle) * (n_pos - 1))
        full = row[:, None].expand(n_pos, n_pos) + row[None, :]
        out[e] = torch.triu(full, diagonal=1)
    # matched: edge-middle pairs at lag d, minus the middle-middle mean at the same lag
    m = len(middle)
    mid = torch.tensor(list(middle), device=cpu)
    for e, edge in enumerate((first, last)):
        coef = torch.zeros(n_pos, n_pos, dtype=f64, device=cpu)
        lags = torch.zeros(m, dtype=f64, device=cpu)  # pairs per lag
        pairs = [(i, j) for i in edge for j in middle if abs(i - j) <= m - 1]
        for i, j in pairs:
            a, b = min(i, j), max(i, j)
            coef[a, b] += 1.0 / len(pairs)
            lags[b - a] += 1.0 / len(pairs)
        for d in range(1, m):
            if lags[d] == 0:
                continue
            a = mid[: m - d]
            coef[a, a + d] -= lags[d] / (m - d)
        out[2 + e] = coef
    out[4] = torch.triu(
        torch.full((n_pos, n_pos), 2.0 / (n_pos * (n_pos - 1)), dtype=f64, device=cpu), 1
    )
    return out
