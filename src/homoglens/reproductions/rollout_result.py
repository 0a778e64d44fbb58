"""The result of attention rollout (Abnar & Zuidema 2020) read as Wu et al.'s position bias of
causal attention over depth: ``AttentionRollout``, its uniform-causal null in closed form and
its figure (``rollout_figure``, drawn by ``plot()``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError
from homoglens.results.base import SavedResult, TitledPlotted
from homoglens.results.figure_parts import AnyFigure, figure_kit, headline
from homoglens.results.provenance import Provenance
from homoglens.results.validation import UNIT, UNIT_OR_NAN, Bounds, FieldError

if TYPE_CHECKING:
    import pandas as pd

    from homoglens.core.stats import Estimate


def uniform_causal_rollout(
    n_pos: int, depth: int, *, residual: bool = True
) -> Float[torch.Tensor, "layer query_pos key_pos"]:
    """The exact rollout of uniform causal attention: every query attends equally to its
    prefix, ``A[q, k] = 1 / (q + 1)`` for ``k <= q``, the same in every block.

    The rollout after ``d`` blocks is ``M^d`` with ``M = A`` (``residual=False``, Wu et al.'s
    plain product) or ``M = (A + I) / 2`` (``residual=True``, Abnar & Zuidema). For the plain
    product the entries are, in closed form, ``(A^d)[q, k] = h_{d-1}(1/(k+1), ..., 1/(q+1)) /
    (q + 1)`` with ``h`` the complete homogeneous symmetric polynomial (a chain of ``d - 1``
    intermediate positions ``k <= j <= q``); here the powers are taken by float64 matrix
    products, exact to rounding. This is causal mixing with no positional preference: what
    concentrates on the first keys here comes from the mask alone (Wu et al. 2025).

    Args:
        n_pos: Sequence length (>= 1).
        depth: Blocks (>= 1).
        residual: Mix in the identity, ``(A + I) / 2``, as :func:`~homoglens.attention_rollout`.

    Returns:
        ``[depth query_pos key_pos]`` float64 (CPU): entry ``d - 1`` is the rollout after
        ``d`` blocks; lower triangular, rows sum to 1.

    Raises:
        InvalidInputError: ``n_pos`` or ``depth`` is not a positive integer.

    References:
        Wu et al. 2025, "On the Emergence of Position Bias in Transformers", arXiv 2502.01951;
        Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", arXiv 2005.00928.
    """
    for name, value in (("n_pos", n_pos), ("depth", depth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name}={value!r} must be a positive integer")
    q = torch.arange(n_pos, device="cpu")
    step = (q[None, :] <= q[:, None]).double() / (q[:, None] + 1).double()
    if residual:
        step = 0.5 * step + 0.5 * torch.eye(n_pos, dtype=torch.float64, device="cpu")
    out = torch.empty(depth, n_pos, n_pos, dtype=torch.float64, device="cpu")
    current = step
    for d in range(depth):
        out[d] = current
        current = step @ current
    return out


@dataclass(frozen=True, eq=False)
class AttentionRollout(SavedResult, TitledPlotted):
    """Cumulative attention over depth (attention rollout) and its position bias.

    ``plot()`` draws Wu et al.'s two panels: the mean cumulative attention each key position
    receives, per depth (log scale, the uniform-causal null dashed in the same colour), and the
    mass on the first ``first_k`` keys against depth with its block-bootstrap interval over
    windows, against the null.

    Attributes:
        blocks: The blocks after which the rollout is read (the rollout always starts at block
            0's input: ``R_l = M_l R_{l-1}``, ``R_{-1} = I``); depth = block + 1.
        received: ``[layer key_pos]`` mean over windows of the mean over a window's real
            queries q of ``R[q, k]``: a distribution over keys for windows of one length
            (sums to 1); NaN at key positions no window reaches.
        window_first_k: ``[window layer]`` per window, the mean over its queries of the
            rollout mass on keys ``0 .. first_k - 1``; in [0, 1].
        null_received: ``[layer key_pos]`` the same as ``received`` for uniform causal
            attention (:func:`uniform_causal_rollout`) on the same window lengths.
        null_first_k: ``[layer]`` the null's mean first-``first_k`` mass (exact).
        first_k: Keys counted as "first".
        residual: ``True``: ``M_l = (A_l + I) / 2`` (Abnar & Zuidema); ``False``: ``M_l =
            A_l``, the plain product of Wu et al.'s analysis. ``A_l`` is block l's attention
            averaged over heads.
        n_sequences: Windows read.
        provenance: Model, backend, weights, data.

    References:
        Wu et al. 2025, "On the Emergence of Position Bias in Transformers", arXiv 2502.01951;
        Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", arXiv 2005.00928.
    """

    _stem: ClassVar[str] = "rollout"
    _figure: ClassVar[str] = "reproductions.rollout_result.rollout_figure"
    _bounds: ClassVar[dict[str, Bounds]] = {
        "received": UNIT_OR_NAN,
        "null_received": UNIT_OR_NAN,
        "window_first_k": UNIT,
        "null_first_k": UNIT,
    }

    blocks: tuple[int, ...]
    received: Float[torch.Tensor, "layer key_pos"]
    window_first_k: Float[torch.Tensor, "window layer"]
    null_received: Float[torch.Tensor, "layer key_pos"]
    null_first_k: Float[torch.Tensor, " layer"]
    first_k: int
    residual: bool
    n_sequences: int
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        nb = len(self.blocks)
        if nb == 0 or list(self.blocks) != sorted(set(self.blocks)) or min(self.blocks) < 0:
            raise FieldError("blocks", f"blocks={list(self.blocks)} must be distinct, >= 0, sorted")
        n_pos = int(self.received.shape[-1]) if self.received.ndim == 2 else -1
        want = {
            "received": (nb, n_pos),
            "null_received": (nb, n_pos),
            "window_first_k": (self.n_sequences, nb),
            "null_first_k": (nb,),
        }
        for name, shape in want.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise FieldError(name, f"{name} has shape {got}, expected {shape}")
        if self.first_k < 1 or self.first_k > max(n_pos, 1):
            raise FieldError("first_k", f"first_k={self.first_k} must be in 1 .. {n_pos}")

    def _check_values(self) -> None:
        """Run on load: ``received`` and the null are NaN at the same key positions, and the
        first key receives something at every depth (every query's prefix holds it)."""
        if not torch.equal(torch.isnan(self.received), torch.isnan(self.null_received)):
            raise FieldError("received", "received and null_received are NaN at different keys")
        if bool(torch.isnan(self.received[:, 0]).any()):
            raise FieldError("received", "received is NaN at key 0, which every window holds")

    @staticmethod
    def uniform_causal(
        n_pos: int, depth: int, *, residual: bool = True
    ) -> Float[torch.Tensor, "layer query_pos key_pos"]:
        """:func:`uniform_causal_rollout`: the exact rollout of uniform causal attention
        (``[depth query_pos key_pos]``, float64; see there for the closed form and errors)."""
        return uniform_causal_rollout(n_pos, depth, residual=residual)

    def first_k_estimates(
        self, *, n_boot: int = 1000, block: int | Literal["auto"] = "auto", ci: float = 0.95
    ) -> list[Estimate]:
        """Per reported block, the mean first-``first_k`` mass over windows with its
        circular block-bootstrap interval (:func:`homoglens.core.stats.estimate`; unit: windows).

        Args:
            n_boot: Bootstrap resamples.
            block: Block length (windows), or ``"auto"``.
            ci: Coverage of the interval.

        Returns:
            One :class:`~homoglens.core.stats.Estimate` per entry of :attr:`blocks`.

        Raises:
            InvalidInputError: bad ``n_boot``, ``block`` or ``ci``.
        """
        from homoglens.core.stats import estimate

        return [
            estimate([self.window_first_k[:, i][None]], n_boot=n_boot, block=block, ci=ci)
            for i in range(len(self.blocks))
        ]

    def first_k_table(self, *, n_boot: int = 1000, ci: float = 0.95) -> pd.DataFrame:
        """Rows ``block, depth, first_k_mass, ci_low, ci_high, null, excess`` (``excess`` =
        model - null; the null is exact, so the interval of the excess is the model's shifted).
        """
        import pandas as pd

        rows = []
        for i, (b, e) in enumerate(zip(self.blocks, self.first_k_estimates(n_boot=n_boot, ci=ci),
                                       strict=True)):  # fmt: skip
            null = float(self.null_first_k[i])
            rows.append((b, b + 1, e.value, e.ci_low, e.ci_high, null, e.value - null))
        columns = ["block", "depth", "first_k_mass", "ci_low", "ci_high", "null", "excess"]
        return pd.DataFrame(rows, columns=columns)

    def to_pandas(self) -> pd.DataFrame:
        """Tidy rows ``block, depth, key_pos, received, null`` (the mean cumulative attention
        each key position receives, and the uniform-causal null's)."""
        import pandas as pd

        rows = [
            (b, b + 1, k, float(self.received[i, k]), float(self.null_received[i, k]))
            for i, b in enumerate(self.blocks)
            for k in range(int(self.received.shape[-1]))
        ]
        return pd.DataFrame(rows, columns=["block", "depth", "key_pos", "received", "null"])

    def __repr__(self) -> str:
        last = float(self.window_first_k[:, -1].mean()) if self.n_sequences else float("nan")
        return (
            f"AttentionRollout({self.provenance.model!r}, blocks={list(self.blocks)}, "
            f"residual={self.residual}, {self.n_sequences} windows, first {self.first_k} keys "
            f"at the last block: {last:.4f} (null {float(self.null_first_k[-1]):.4f}))"
        )


def _depth_subset(blocks: Sequence[int], most: int = 6) -> list[int]:
    """Indices of at most ``most`` blocks, evenly spread, the first and last included."""
    n = len(blocks)
    if n <= most:
        return list(range(n))
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


def rollout_figure(
    result: AttentionRollout, *, title: str | None = None, backend: str = "matplotlib"
) -> AnyFigure:
    """Wu et al.'s figure: cumulative attention received by key position per depth (model
    solid, uniform-causal null dashed, same colour), and the first-k mass against depth with its
    95 % block-bootstrap band over windows, against the null."""
    kit = figure_kit(backend)
    fig, axes = kit.new_figure(10.0, 3.8, ncols=2)
    keys = torch.arange(int(result.received.shape[-1]), device="cpu").double()
    chosen = _depth_subset(result.blocks)
    model = {f"depth {result.blocks[i] + 1}": result.received[i] for i in chosen}
    null = {f"null, depth {result.blocks[i] + 1}": result.null_received[i] for i in chosen}
    ylabel = "mean cumulative attention received"
    kit.curves(axes[0], keys, model, xlabel="key position", ylabel=ylabel, legend="x-small")
    dashed = dict.fromkeys(null, "--")
    title_left = "rollout by key (dashed: uniform causal)"
    kit.curves(axes[0], keys, null, styles=dashed, xlabel="key position", ylabel=ylabel,
               title=title_left, legend=None)  # fmt: skip
    kit.log_scale(axes[0], "y")
    ests = result.first_k_estimates()
    depth = torch.tensor([b + 1 for b in result.blocks], dtype=torch.float64, device="cpu")
    label = f"first {result.first_k} keys"
    band: dict[str, tuple[Any, Any]] = {
        label: ([e.ci_low for e in ests], [e.ci_high for e in ests])
    }
    kit.curves(
        axes[1], depth, {label: [e.value for e in ests], "uniform causal": result.null_first_k},
        bands=band, styles={"uniform causal": "--"}, xlabel="depth (blocks)",
        ylabel="rollout mass on the first keys", title="mass on the first keys (95 % CI, windows)",
        marker="o", ms=3,
    )  # fmt: skip
    kind = "rollout (A+I)/2" if result.residual else "rollout (plain product)"
    default = f"{result.provenance.model}: {kind}, {result.n_sequences} windows"
    headline(kit, fig, title, default, matplotlib=True, provenance=result.provenance)
    return fig
