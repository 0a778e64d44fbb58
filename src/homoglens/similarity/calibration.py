"""Calibrated readings of "edge tokens homogenize": the model against a reference read on the
same windows, each design named for what it answers.

A causal decoder mixes a prefix whatever its positional encoding, and causal mixing alone makes
edge effects of either sign (a random walk from position 0 reads matched first -0.30 / last
+0.11; :mod:`homoglens.core.controls`). A verdict about *positional* bias therefore compares the
model with a reference that keeps the weights, the content, the causal mask and the first-token
sink but not the positional information, and speaks only of the difference
(docs/similarity.md, "Three readings"). The designs:

* ``reference="no_positions"``, the **model-matched causal null** (positional attribution):
  the same model on the same windows with its positions removed at inference
  (:func:`homoglens.ablated_positions` ``"zero"``: no learned table, no rotation, no ALiBi
  bias). It keeps the weights, the content, the causal mask and whatever sink the mask alone
  sustains; the difference model - null is the part of each edge reading that needs positional
  information. The null is out of distribution for a model trained with positions, so its cost
  (the next-token loss it adds, paired over windows, :meth:`CalibratedReadings.null_cost`)
  stands beside every verdict: a null that breaks the model licenses no "holds".
* ``reference=<model>``: the same windows through another model, e.g. the NoPE twin trained on
  the same data (the controlled models; the right null there), or a randomly initialised copy
  read without positions (:func:`random_reference`).
* ``reference="offset"``, a **start-of-sequence contrast** (descriptive, not a causal null):
  each window of ``offset + T`` tokens read twice, its last ``T`` tokens as a window of their
  own (positions 0..T-1) and inside the whole window (positions offset.., the same tokens after
  a prefix). A fresh start and a late copy differ through the causal mask alone (the prefix
  length, the sink's share): a causal mixer with a first-token sink and no position in any
  logit reads SmolLM2's whole pattern under this design. Its verdicts say "the first / last
  tokens of a sequence differ from the same tokens later in a sequence", nothing positional.

The three readings, each a per-window statistic (jackknife pseudo-values), all on uncentred
vectors (a cross-input reading on position-centred vectors is 0 by construction):
(a) ``within``: the distance-matched edge excess of ``W = M - C``; (b) ``shared direction``:
``SP`` of an edge minus the middle's; (c) ``over depth``: mean ``SP`` at the layer minus at
the first layer entry read.

References:
    Yusupov et al. 2025, arXiv 2508.17126 (the claim); Wu et al. 2025, arXiv 2502.01951 (the
    causal mask alone biases attention toward early positions); Kazemnejad et al. 2023, arXiv
    2305.19466 (models without positional encodings infer position from the causal mask);
    Barbero et al. 2024, arXiv 2406.04267 (SP); Gu et al. 2024, arXiv 2410.10781 (sinks
    without positional encodings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from jaxtyping import Float

from homoglens.core.errors import (
    IncompatibleResultsError,
    InvalidInputError,
    UnsupportedArchitectureError,
)
from homoglens.core.stats import (
    Estimate,
    as_block,
    auto_block,
    default_sesoi,
    estimate,
    holm,
    verdict,
)
from homoglens.core.types import HookedModel, ModelInput, PositionAblation
from homoglens.core.validate import as_float, as_int, check_model
from homoglens.models.architectures import architecture_of
from homoglens.models.assets import atomic_folder, cache_dir
from homoglens.models.loading import load_model, model_info, model_lock
from homoglens.models.positions import learned_table
from homoglens.results.base import entry_index
from homoglens.results.storage import HASHES, read_json, save_folder, sha256_of, write_json
from homoglens.run.data import DataInput, TokenBatch, to_token_batch
from homoglens.run.engine import stream
from homoglens.run.entrance import entrance
from homoglens.run.interventions import ablated_positions
from homoglens.run.losses import WindowLoss
from homoglens.similarity.measure import positional_similarity
from homoglens.similarity.result import PositionalSimilarity

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DESIGNS", "READINGS", "CalibratedReadings", "calibrated_readings", "random_reference"]

READINGS: tuple[tuple[str, str], ...] = (
    ("a, within: first edge", "matched_first"),
    ("a, within: last edge", "matched_last"),
    ("b, shared direction: first edge", "sp_first"),
    ("b, shared direction: last edge", "sp_last"),
    ("c, over depth", "sp_mean"),
)
"""``(reading, statistic)`` of the three readings of "edge tokens homogenize"."""

DESIGNS: dict[str, str] = {
    "no_positions": "positional attribution: the model against itself with positions removed "
    "(model-matched causal null)",
    "model": "against a reference model",
    "offset": "start-of-sequence contrast: the same tokens later in a sequence (descriptive, "
    "not a causal null)",
}
"""What each ``reference_kind`` answers, as the tables name it (module docstring)."""

_FORMAT = "homoglens.CalibratedReadings/1"
_FORMAT_LOSS = "homoglens.CalibratedReadings/2"
"""/2 adds the per-window loss of the model and of a ``"no_positions"`` null."""
_PARTS = ("model/similarity.json", "reference/similarity.json")
"""The similarity JSONs that ``calibrated.json`` records (and the loader reads)."""


@dataclass(frozen=True, eq=False)
class CalibratedReadings:
    """The three readings of the model and of its causal-null reference, on the same windows.

    Attributes:
        model: The model's :class:`PositionalSimilarity` (uncentred, with pseudo-values) at
            positions 0..T-1 of its windows.
        reference: The reference's, on the same windows in the same order: the same tokens at
            positions ``offset``.. of the longer windows, or another model's.
        reference_kind: ``"no_positions"`` (the model-matched causal null), ``"model"`` or
            ``"offset"`` (the start-of-sequence contrast); :data:`DESIGNS`.
        reference_name: What the reference is, in words.
        offset: Tokens of prefix before the late copy (0 for a model reference).
        loss: ``[2 batch]`` mean next-token loss per window (nats/token) of the model (row 0)
            and of the ``"no_positions"`` null (row 1), the null's cost; ``None`` for the other
            designs.
    """

    model: PositionalSimilarity
    reference: PositionalSimilarity
    reference_kind: str
    reference_name: str
    offset: int = 0
    loss: Float[torch.Tensor, "2 batch"] | None = None

    def __post_init__(self) -> None:
        if self.reference_kind not in DESIGNS:
            raise InvalidInputError(
                f"reference_kind={self.reference_kind!r} must be one of {list(DESIGNS)}"
            )
        self._check_loss()
        if not isinstance(self.reference_name, str):
            raise InvalidInputError(f"reference_name={self.reference_name!r} must be a string")
        offset = self.offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset={offset!r} must be an integer >= 0")
        if self.reference_kind != "offset" and offset != 0:
            raise InvalidInputError(f"offset={offset} must be 0 for a model reference")
        if self.reference_kind == "offset" and (
            offset < 1
            or self.reference.first_position - self.model.first_position not in (offset, offset + 1)
        ):  # the same tokens offset positions later (one more when a BOS is kept at 0)
            raise InvalidInputError(
                f"an offset reference reads the same tokens {offset} positions later, but the "
                f"model starts at position {self.model.first_position} and the reference at "
                f"{self.reference.first_position}"
            )
        a, b = self.model, self.reference
        if a.n_sequences != b.n_sequences or a.n_pos != b.n_pos or a.layers != b.layers:
            raise InvalidInputError(
                "the model and the reference must read the same number of windows, positions "
                f"and layers: {a.n_sequences} x {a.n_pos} x {a.layers} against "
                f"{b.n_sequences} x {b.n_pos} x {b.layers}"
            )
        if not (a.has_pseudo_values and b.has_pseudo_values) or a.centre or b.centre:
            raise InvalidInputError(
                "calibrated readings need uncentred similarities with pseudo-values "
                "(positional_similarity(..., centre=None, pseudo_values=True))"
            )

    def _check_loss(self) -> None:
        loss = self.loss
        if loss is None:
            if self.reference_kind == "no_positions":
                raise InvalidInputError(
                    "a 'no_positions' null needs its loss cost (loss=[2 batch]: the model's and "
                    "the null's per-window loss)"
                )
            return
        if self.reference_kind != "no_positions":
            raise InvalidInputError("loss is the cost of a 'no_positions' null only")
        n = self.model.n_sequences
        if not isinstance(loss, torch.Tensor) or tuple(loss.shape) != (2, n):
            raise InvalidInputError(f"loss must be a [2 {n}] tensor (model, null per window)")
        if not bool(torch.isfinite(loss).all()) or bool((loss < 0).any()):
            raise InvalidInputError("loss must hold finite losses >= 0 (nats/token)")

    @property
    def design(self) -> str:
        """What this comparison answers, in words (:data:`DESIGNS`)."""
        return DESIGNS[self.reference_kind]

    def null_cost(
        self, *, ci: float = 0.95, block: int | Literal["auto"] = "auto", seed: int = 0
    ) -> Estimate | None:
        """The next-token loss the ``"no_positions"`` null adds over the model (null - model,
        nats/token, paired over windows, with its interval): how far out of distribution the
        null is. ``None`` for the other designs."""
        if self.loss is None:
            return None
        return estimate([(self.loss[1] - self.loss[0])[None]], block=as_block(block), ci=ci,
                        seed=seed)  # fmt: skip

    def values(self, statistic: str, layer: int | None = None) -> tuple[torch.Tensor, ...]:
        """``([batch] model, [batch] reference)`` per-window values of one reading's statistic at
        ``layer`` (default: the last entry read); ``sp_mean`` is the change from the first
        entry read (reading (c))."""
        li = self._layer_index(layer)
        out = []
        for sim in (self.model, self.reference):
            v = sim.per_window(statistic)
            out.append(v[:, li] - v[:, 0] if statistic == "sp_mean" else v[:, li])
        return tuple(out)

    def _layer_index(self, layer: int | None) -> int:
        layers = self.model.layers
        return len(layers) - 1 if layer is None else entry_index(layer, layers, "these readings")

    def table(
        self,
        layer: int | None = None,
        *,
        sesoi: float | None = None,
        alpha: float = 0.05,
        ci: float = 0.95,
        block: int | Literal["auto"] = "auto",
        n_boot: int = 1000,
        seed: int = 0,
    ) -> pd.DataFrame:
        """Each reading: the model's value, the reference's, and their paired difference with
        an interval and a verdict (Holm over the five readings; predicted sign > 0: the edges
        of the model homogenize more than the causal null's).

        Args:
            layer: Residual entry (default: the last read).
            sesoi: Smallest effect of interest (cosine); ``None``: a tenth of the model's
                contextual homogenization ``|H_W|`` at the layer, for every reading
                (:func:`homoglens.core.stats.default_sesoi`; not the level of SP, which is mostly
                anisotropy).
            alpha: Level (family-wise over the five readings).
            ci: Interval coverage in (0, 1).
            block: Consecutive windows per bootstrap block: ``"auto"`` (from the windows'
                autocorrelation, :func:`homoglens.core.stats.auto_block`) or an integer that leaves
                at least 4 blocks.
            n_boot: Bootstrap resamples.
            seed: Bootstrap seed.

        Raises:
            InvalidInputError: a bad ``sesoi``, ``alpha``, ``ci`` or ``block``, or a ``block``
                that leaves fewer than 4 blocks of the windows (name a smaller one, or read
                more windows).

        Returns:
            DataFrame with columns ``reading, statistic, layer, model, reference, difference,
            se, ci_low, ci_high, p, p_holm, p_tost_holm, sesoi, verdict, n_windows, design,
            null_loss_change, null_loss_ci_low, null_loss_ci_high, block``: ``block`` is the
            bootstrap block each reading used (chosen from its paired differences when
            ``"auto"``); ``design`` says what the
            verdicts answer (:data:`DESIGNS`: only a ``"no_positions"`` null or a NoPE
            reference model speaks of positional bias; the offset design is a
            start-of-sequence contrast); the ``null_loss_*`` columns give a ``"no_positions"``
            null's cost (NaN for the other designs), beside every verdict.
        """
        import pandas as pd

        li = self._layer_index(layer)
        alpha = as_float("alpha", alpha, low=0.0, high=1.0)
        block = as_block(block)
        h_scale = abs(float(self.model.homogenization[li]))
        rows, ests, blocks = [], [], []
        for reading, stat in READINGS:
            mine, ref = self.values(stat, self.model.layers[li])
            unit = default_sesoi(h_scale) if sesoi is None else as_float("sesoi", sesoi, low=0.0,
                                                                        high=1e9)  # fmt: skip
            used = _block_for(mine - ref, block)
            est = estimate([(mine - ref)[None]], block=used, n_boot=n_boot, sesoi=unit, ci=ci,
                           seed=seed)  # fmt: skip
            ests.append(est)
            rows.append([reading, stat, self.model.layers[li], float(mine.mean()),
                         float(ref.mean()), est.value, est.se, est.ci_low, est.ci_high, est.p,
                         unit, est.n_windows])  # fmt: skip
            blocks.append(used)
        p_holm = holm([e.p for e in ests])
        tost_holm = holm([e.p_tost for e in ests])
        cost = self.null_cost(ci=ci, block=block, seed=seed)
        cost_cells = [math.nan] * 3 if cost is None else [cost.value, cost.ci_low, cost.ci_high]
        for row, est, p, pt, used in zip(rows, ests, p_holm, tost_holm, blocks, strict=True):
            row[10:10] = [p, pt]
            row.insert(13, verdict(est.value, p, pt, predicted=+1, alpha=alpha,
                                   ci=(est.ci_low, est.ci_high), sesoi=row[12]))  # fmt: skip
            row.extend([self.design, *cost_cells, used])
        return pd.DataFrame(
            rows,
            columns=[
                "reading",
                "statistic",
                "layer",
                "model",
                "reference",
                "difference",
                "se",
                "ci_low",
                "ci_high",
                "p",
                "p_holm",
                "p_tost_holm",
                "sesoi",
                "verdict",
                "n_windows",
                "design",
                "null_loss_change",
                "null_loss_ci_low",
                "null_loss_ci_high",
                "block",
            ],  # fmt: skip
        )

    def save(self, path: str | Path) -> Path:
        """Save as the two similarities (``model/``, ``reference/``) + ``calibrated.json`` (last:
        the sha256 of each similarity's JSON), atomically: a save that fails or is interrupted
        leaves older readings in ``path`` loadable and unchanged, or refused on load, never a
        mix of the two.

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created.
        """
        return save_folder(path, self._write_into, own=("calibrated.json", "model", "reference"),
                           manifest="calibrated.json")  # fmt: skip

    def _write_into(self, folder: Path) -> None:
        parts = []
        for name in ("model", "reference"):
            (folder / name).mkdir()
            getattr(self, name)._write_into(folder / name)
            parts.append(f"{name}/similarity.json")
        meta = {"format": _FORMAT, "reference_kind": self.reference_kind,
                "reference_name": self.reference_name, "offset": self.offset,
                HASHES: {rel: sha256_of((folder / rel).read_bytes()) for rel in parts}}  # fmt: skip
        if self.loss is not None:
            meta.update(format=_FORMAT_LOSS, loss=self.loss.tolist())
        write_json(folder / "calibrated.json", meta)

    @classmethod
    def load(cls, path: str | Path) -> CalibratedReadings:
        """Load what :meth:`save` wrote (checked as :meth:`PositionalSimilarity.load` checks
        each similarity).

        Raises:
            ResultsNotFoundError: a file is missing.
            IncompatibleResultsError: another format, keys or values of the wrong type, a model
                and a reference that do not fit together, or a similarity that does not match
                the sha256 recorded in ``calibrated.json`` (saved incompletely or edited).
        """
        folder = Path(path).expanduser()
        meta = read_json(folder, "calibrated.json", parts=_PARTS)
        if not isinstance(meta, dict) or meta.get("format") not in (_FORMAT, _FORMAT_LOSS):
            raise IncompatibleResultsError(f"{folder} does not hold {_FORMAT_LOSS}")
        keys = {"format", "reference_kind", "reference_name", "offset"}
        if meta["format"] == _FORMAT_LOSS:
            keys.add("loss")
        if set(meta) != keys:
            raise IncompatibleResultsError(
                f"{folder}/calibrated.json has keys {sorted(meta)}, expected {sorted(keys)}: "
                "the file was edited, save the readings again"
            )
        model = PositionalSimilarity.load(folder / "model")
        reference = PositionalSimilarity.load(folder / "reference")
        try:
            loss = _loss_of(meta.get("loss"), model.n_sequences)
            return cls(model, reference, meta["reference_kind"], meta["reference_name"],
                       meta["offset"], loss)  # fmt: skip
        except InvalidInputError as err:
            raise IncompatibleResultsError(
                f"{folder}/calibrated.json does not hold consistent readings: {err}; the files "
                "were edited: save the readings again"
            ) from None

    def __repr__(self) -> str:
        return (
            f"CalibratedReadings({self.model.n_sequences} windows x {self.model.n_pos} "
            f"positions, reference: {self.reference_name})"
        )


def _block_for(values: torch.Tensor, block: int | Literal["auto"]) -> int:
    """The bootstrap block of one reading's paired differences: chosen from them (``"auto"``,
    at most a quarter of the windows) or the caller's, which must leave 4 blocks."""
    n = int((~torch.isnan(values)).sum())
    if block == "auto":
        return min(auto_block(values), max(1, n // 4)) if n else 1
    if block > 1 and n < 4 * block:
        raise InvalidInputError(
            f"block={block} leaves fewer than 4 blocks of the {n} windows (the interval needs 4 "
            f"to vary); use block <= {max(1, n // 4)}, block='auto', or read at least "
            f"{4 * block} windows"
        )
    return block


def _loss_of(value: object, n: int) -> torch.Tensor | None:
    """The ``loss`` of a saved ``calibrated.json`` (bounded: two rows of ``n`` numbers)."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(
        isinstance(row, list) and len(row) == n
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row)
        for row in value
    )):  # fmt: skip
        raise InvalidInputError(f"loss must be two rows of {n} numbers")
    return torch.tensor(value, dtype=torch.float64, device="cpu")


def _why_no_positions(model: HookedModel) -> str | None:
    """Why the model has no positions to remove, or ``None`` when it has some: a learned table
    of zeros (a NoPE model stored as GPT-2, like the shipped ``tiny-none``)."""
    spec = architecture_of(model)
    if spec.positional == "learned_absolute" and not bool(learned_table(model, spec).any()):
        return "its learned position table is all zeros (a model trained without positions)"
    return None


def _window_losses(model: HookedModel, batch: TokenBatch, batch_size: int,
                   progress: bool) -> torch.Tensor:  # fmt: skip
    """``[batch]`` mean next-token loss of each window (nats/token), one streamed pass."""
    reducer = WindowLoss()
    stream(model, batch, [reducer], batch_size=batch_size, desc="loss", progress=progress)
    return reducer.row_values("loss")


def _late_copy(batch: TokenBatch, offset: int) -> TokenBatch:
    """The last tokens of each window after ``offset`` (keeping a BOS at position 0)."""
    keep = 1 if batch.bos else 0
    tokens = torch.cat([batch.tokens[:, :keep], batch.tokens[:, keep + offset :]], dim=1)
    mask = torch.ones_like(tokens)
    return TokenBatch(tokens, mask, batch.bos, f"{batch.description}, last tokens after {offset}")


def calibrated_readings(
    model: ModelInput,
    data: DataInput,
    *,
    reference: Literal["offset", "no_positions"] | ModelInput = "offset",
    offset: int | None = None,
    reference_positions: PositionAblation | None = None,
    layers: list[int] | tuple[int, ...] | int | None = None,
    edge_k: int = 8,
    batch_size: int = 8,
    progress: bool = True,
) -> CalibratedReadings:
    """Measure the three readings of "edge tokens homogenize" in ``model`` and in a reference on
    the same windows: the model-matched causal null, another model, or the start-of-sequence
    contrast (module docstring; :data:`DESIGNS`).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        data: Equal-length windows (:func:`~homoglens.positional_similarity` takes the same),
            without padding. With ``reference="offset"`` each window holds ``offset + T``
            tokens (plus a BOS if it starts with one): the model reads its last ``T`` alone.
        reference: ``"no_positions"`` (the model-matched causal null: the same model with
            its positions removed at inference, and its loss cost; the reference for a claim
            about *positional* bias in a pretrained model), another model with the same
            tokenizer and depth (e.g. a NoPE twin), or ``"offset"`` (the same tokens at a late
            offset: a start-of-sequence contrast, descriptive, not a causal null).
        offset: Prefix tokens before the late copy (default: half the window).
        reference_positions: A positional ablation under which the reference model is read
            (e.g. ``"zero"`` for a randomly initialised copy read without positions).
        layers: Residual entries (default: all; reading (c) is against the first one read).
        edge_k: Positions per edge.
        batch_size: Windows per forward pass.
        progress: Show progress bars.

    Returns:
        A :class:`CalibratedReadings`.

    Raises:
        InvalidInputError: fewer than 2 windows, windows of unequal length or with padding, an
            ``offset`` that leaves fewer than ``2 * edge_k + 2`` positions, a reference of
            another depth, ``reference_positions`` without a reference model, a
            ``"no_positions"`` null on a model without positions.
        UnsupportedArchitectureError: a ``"no_positions"`` null on a family outside the
            architecture table (whose positions homoglens cannot remove).

    References:
        Yusupov et al. 2025, arXiv 2508.17126; Wu et al. 2025, arXiv 2502.01951.
    """
    call = entrance(model, batch_size=batch_size, progress=progress)
    model = call.model
    if not isinstance(reference, str):  # a design name stays; a model is wrapped as the model
        reference = entrance(reference).model
    batch = call.batch(data)
    if int(batch.attention_mask.min()) == 0:
        raise InvalidInputError(
            "calibrated_readings needs windows without padding; cut text into equal windows "
            "with corpus_windows(model, ..., seq_len=T)"
        )
    if len(batch) < 2:
        raise InvalidInputError(
            f"calibrated_readings needs at least 2 windows (got {len(batch)}): each reading is "
            "paired over windows, and the cross-window terms need two; pass more windows"
        )
    options = {"layers": layers, "edge_k": edge_k, "centre": None, "pseudo_values": True,
               "batch_size": call.batch_size, "progress": call.progress}  # fmt: skip
    width = int(batch.tokens.shape[1]) - int(bool(batch.bos))
    if isinstance(reference, str) and reference == "no_positions":
        return _against_no_positions(model, batch, offset, reference_positions, options)
    if isinstance(reference, str):
        if reference != "offset":
            raise InvalidInputError(
                f"reference={reference!r} must be 'no_positions', 'offset' or a model"
            )
        if reference_positions is not None:
            raise InvalidInputError("reference_positions applies to a reference model only")
        given = offset is not None
        offset = width // 2 if offset is None else as_int("offset", offset, low=1)
        if width - offset < 2 * edge_k + 2:
            whose = "" if given else " (the default: half the window)"
            raise InvalidInputError(
                f"the causal null reads the windows after a prefix of offset={offset}{whose} "
                f"tokens, which leaves {width - offset} of their {width} positions; the edges "
                f"of edge_k={edge_k} need {2 * edge_k + 2}: use longer windows (at least "
                f"{2 * (2 * edge_k + 2) + int(bool(batch.bos))} tokens at the default offset)"
                + (
                    f", a smaller edge_k (at most {(width - offset - 2) // 2})"
                    if (width - offset - 2) // 2 >= 1
                    else ""
                )
                + " or a smaller offset"
            )
        start = positional_similarity(model, _late_copy(batch, offset), **options)
        late = positional_similarity(model, batch, offset=offset + int(bool(batch.bos)), **options)
        name = f"the same tokens after a prefix of {offset} tokens"
        return CalibratedReadings(start, late, "offset", name, offset)
    check_model(reference)
    if int(reference.cfg.n_layers) != int(model.cfg.n_layers):
        raise InvalidInputError(
            f"the reference has {reference.cfg.n_layers} layers and the model "
            f"{model.cfg.n_layers}; readings per layer need the same depth"
        )
    mine = positional_similarity(model, batch, **options)
    ref_batch = to_token_batch(reference, batch)
    if reference_positions is None:
        theirs = positional_similarity(reference, ref_batch, **options)
    else:
        with model_lock(reference), ablated_positions(reference, reference_positions):
            theirs = positional_similarity(reference, ref_batch, **options)
    name = "another model" + ("" if reference_positions is None else
                              f", positions {reference_positions}")  # fmt: skip
    return CalibratedReadings(mine, theirs, "model", name, 0)


def _against_no_positions(
    model: HookedModel,
    batch: TokenBatch,
    offset: int | None,
    reference_positions: PositionAblation | None,
    options: dict[str, Any],
) -> CalibratedReadings:
    """The model against itself with its positions removed (``"zero"``), and the null's loss
    cost on the same windows."""
    if offset is not None or reference_positions is not None:
        raise InvalidInputError(
            "offset and reference_positions do not apply to reference='no_positions' (it reads "
            "the same windows with positions removed); leave them out"
        )
    try:
        missing = _why_no_positions(model)
    except UnsupportedArchitectureError as err:
        raise UnsupportedArchitectureError(
            f"reference='no_positions' removes the positions of families in homoglens' table "
            f"only: {err} Pass reference=<a model> (a NoPE twin, or random_reference(model) with "
            "reference_positions='zero') instead"
        ) from None
    if missing is not None:
        raise InvalidInputError(
            f"reference='no_positions' needs positions to remove, and this model has none: "
            f"{missing}. Its readings are already position-free; compare it with a twin that "
            "has positions (reference=<model>)"
        )
    size, shown = int(options["batch_size"]), bool(options["progress"])
    mine = positional_similarity(model, batch, **options)
    loss_mine = _window_losses(model, batch, size, shown)
    with model_lock(model), ablated_positions(model, "zero"):
        theirs = positional_similarity(model, batch, **options)
        loss_null = _window_losses(model, batch, size, shown)
    return CalibratedReadings(mine, theirs, "no_positions",
                              "the same model with its positions removed (zero)", 0,
                              torch.stack([loss_mine, loss_null]))  # fmt: skip


def _hf_config(model: HookedModel) -> object:
    """The Hugging Face config of ``model``: its own (bridge), or its folder's / Hub name's."""
    from transformers import AutoConfig

    hf = getattr(model, "original_model", None)
    if hf is not None and getattr(hf, "config", None) is not None:
        return hf.config
    name = model_info(model).name
    try:
        return AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise InvalidInputError(
            f"no Hugging Face config for {name!r} ({err}); load the model from a folder or "
            "with backend='bridge', or pass your own reference model"
        ) from None


def random_reference(model: ModelInput, *, seed: int = 0) -> HookedModel:
    """A randomly initialised copy of ``model``'s architecture: its causal null.

    Random weights attend almost uniformly and have learned no positional preference, so read
    with its positions zeroed (``calibrated_readings(model, data, reference=random_reference(
    model), reference_positions="zero")``) it is causal mixing of the same tokens through the
    same architecture with no positions. Hugging Face's own initialisation of the config
    (``AutoModelForCausalLM.from_config``, seeded without touching the global RNG), saved once
    per config and seed under the homoglens cache (``references/``) and loaded like ``model``
    (same backend, device and dtype).

    Args:
        model: The model studied.
        seed: Seed of the initialisation.

    Returns:
        The reference model.

    Raises:
        InvalidInputError: no Hugging Face config can be found for ``model``.

    References:
        Kazemnejad et al. 2023, arXiv 2305.19466 (NoPE); Wu et al. 2025, arXiv 2502.01951.
    """
    import hashlib

    from transformers import AutoModelForCausalLM

    call = entrance(model)
    model = call.model
    seed = as_int("seed", seed, low=0, high=2**31 - 1)
    config = _hf_config(model)
    text = config.to_json_string(use_diff=False)  # type: ignore[attr-defined]
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = cache_dir() / "references" / f"{key}-s{seed}"
    if not (folder / "config.json").is_file():
        with atomic_folder(folder) as tmp, torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            hf = AutoModelForCausalLM.from_config(config)
            hf.save_pretrained(tmp, safe_serialization=True)
            if model.tokenizer is not None:
                model.tokenizer.save_pretrained(tmp)
    param = next(iter(model.parameters()))
    info = call.info
    return load_model(folder, backend=info.backend, device=param.device,  # type: ignore[arg-type]
                      dtype=param.dtype)  # fmt: skip
