"""The ``[layer pos pos]`` sums of a position-resolved similarity run and the passes that fill
them: the linear statistics of a position x position matrix (:data:`SIMILARITY_STATISTICS`,
their coefficients), float64 running sums of unit vectors (:class:`SimilaritySums`), the
``drop_dims``, centring, main and cross-window passes over any source of vectors (a ``feed``:
a model streamed by :func:`~homoglens.positional_similarity`, or activations you hold), and the
fields of the result. Pure maths: a feed that runs windows on several processes merges what a
pass declares (:class:`Merged`); nothing here talks to other ranks or runs a model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError, NonFiniteActivationError

__all__ = [
    "SIMILARITY_STATISTICS",
    "Feed",
    "Merged",
    "RowSums",
    "SimilaritySums",
    "Take",
    "centre_moments",
    "cross_pass",
    "drop_dimensions",
    "edge_groups",
    "finish_fields",
    "main_pass",
    "on_cpu_rows",
    "similarity_coefficients",
    "unit_rows",
]


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


Take = Callable[[int, torch.Tensor, int], None]
"""What a pass runs on each batch of windows: ``take(i, x, first)`` with layer ``i``'s
``[batch T d_model]`` vectors, counted from position ``first``."""


@dataclass
class Merged:
    """What a pass adds up over windows, for a feed to merge over every window it runs:
    ``sums`` (named tensors summed over windows, in place) and ``rows`` (per name, the list of
    ``[batch ...]`` per-window parts the pass appends to, and the shape of one row). A feed
    that runs the windows on several processes leaves every sum holding all windows and every
    list holding all windows' rows in input order; one that runs them all here has nothing to
    do."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    rows: dict[str, tuple[list[torch.Tensor], tuple[int, ...]]] = field(default_factory=dict)


Feed = Callable[[Take, Merged], None]
"""``feed(take, merged)``: run ``take`` on every window (in input order), then leave
``merged``'s sums and rows holding every window."""


def centre_moments(
    sums: SimilaritySums,
    feed: Feed,
    centre: str,
    standardize: bool,
    massive_threshold: float,
    device: torch.device,
) -> None:
    """First pass: the corpus mean (and s.d.) per layer (its sums merged over every window by
    the feed)."""
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

    feed(take, Merged(sums={"total": total, "square": square, "count": count, "massive": massive}))
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
    feed: Feed,
    drop_dims: int,
    device: torch.device,
) -> None:
    """First pass of ``drop_dims``: each layer's mean square per dimension over the counted
    tokens (merged over every window by the feed), of the vectors as measured (before any
    centring: the dimensions that carry a large shared value or huge values at a few tokens);
    its ``drop_dims`` largest dimensions (the massive / rogue ones) are zeroed in every later
    pass, after the centring."""
    energy = torch.zeros(sums.n_layer, sums.d_model, dtype=torch.float64, device=device)

    def take(i: int, x: torch.Tensor, first: int) -> None:
        xs = x[:, first:].double()
        energy[i] += (xs * xs).sum((0, 1)).to(device)

    feed(take, Merged(sums={"energy": energy}))
    top = energy.topk(drop_dims, dim=-1).indices.sort(-1).values
    sums.keep = torch.ones_like(energy).scatter_(1, top, 0.0)
    sums.dropped = top.cpu()


def main_pass(
    sums: SimilaritySums,
    feed: Feed,
    n_layer: int,
) -> None:
    """Main pass: the sums and one row of statistics per window (merged over every window by
    the feed)."""
    merged = Merged(
        sums={"within": sums.within, "units": sums.units, "n": sums.n},
        rows={"window": (sums.rows, (n_layer, len(SIMILARITY_STATISTICS)))},
    )
    feed(on_cpu_rows(sums, n_layer), merged)


class RowSums(Protocol):
    """Sums that :func:`on_cpu_rows` fills: :class:`SimilaritySums` or
    :class:`~homoglens.similarity.maths.WindowSums`."""

    rows: list[torch.Tensor]
    n: torch.Tensor

    def add(self, i: int, x: torch.Tensor, row: torch.Tensor) -> None:
        """Add layer ``i`` of a batch; its per-window statistics go into ``row``."""


def on_cpu_rows(sums: RowSums, n_layer: int) -> Callable[[int, torch.Tensor, int], None]:
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
    feed: Feed,
    n_layer: int,
) -> None:
    """Last pass: each window's share of the cross-window terms (needs the final sums; its
    rows merged over every window by the feed)."""

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

    n_stat = len(SIMILARITY_STATISTICS)
    rows = {
        "cross": (sums.cross_rows, (n_layer, n_stat)),
        "same": (sums.same_rows, (n_layer, sums.n_pos)),
    }
    feed(run, Merged(rows=rows))


def finish_fields(
    sums: SimilaritySums,
    layers: tuple[int, ...],
    n_all: int,
    *,
    first: int,
    pseudo: bool,
    recorded: Mapping[str, Any],
) -> dict[str, Any]:
    """The fields of a :class:`~homoglens.similarity.result.PositionalSimilarity` but its
    provenance, from the sums and every window's rows (merged over ranks by the passes'
    feed); ``recorded``: the fields that record the measurement's options as they are
    (``edge_k``, ``space``, ``centre``, ``standardize``, ``massive_threshold``, in this
    order)."""
    n_layer, n_stat = len(layers), len(SIMILARITY_STATISTICS)

    def rows(parts: list[torch.Tensor], width: int) -> torch.Tensor:
        empty = torch.empty(0, n_layer, width, dtype=torch.float64, device="cpu")
        return torch.cat([empty, *(p.cpu() for p in parts)])

    return dict(
        layers=layers,
        within_sum=sums.within.cpu(),
        unit_sum=sums.units.cpu(),
        n_sequences=n_all,
        window_within=rows(sums.rows, n_stat),
        window_cross=rows(sums.cross_rows, n_stat) if pseudo else None,
        window_same_position=rows(sums.same_rows, sums.n_pos) if pseudo else None,
        first_position=first,
        **recorded,
        n_massive=sums.n_massive,
        dropped_dims=sums.dropped,
    )
