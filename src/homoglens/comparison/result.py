"""The result of :func:`~homoglens.compare_models`: per-window statistics of every model,
intact and position-ablated, with the bootstrap contrasts and the claims table.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from homoglens.ablation.result import PositionAblationStudy
from homoglens.core.claims import claims_table
from homoglens.core.errors import IncompatibleResultsError, InvalidInputError
from homoglens.core.stats import as_block, estimate
from homoglens.core.types import POSITION_ABLATIONS
from homoglens.core.validate import as_float
from homoglens.results import prepare_folder, read_saved
from homoglens.results.base import FolderSaved, Plotted, checked_result, keyword_repr
from homoglens.results.storage import folder_path, write_pair
from homoglens.results.validation import (
    COSINE,
    FINITE_OR_NAN,
    NON_NEGATIVE,
    UNIT_OR_NAN,
    Bounds,
    FieldError,
    check_bounds,
)
from homoglens.similarity.result import CROSS_INPUT_STATISTICS, PositionalSimilarity
from homoglens.sinks.result import SinkScores

if TYPE_CHECKING:
    import pandas as pd


# How a :class:`~homoglens.ModelComparison` is written and read: ``comparison.safetensors`` (every
# per-window statistic) + a folder per computed model + ``comparison.json``, and one model's
# statistics exported in the format :func:`~homoglens.compare_models` reads for shipped
# replicates.

COMPARISON_SCALARS = ("edge_k", "eps", "n_boot", "ci", "seed", "block", "sesoi", "loss_sesoi")
"""The scalar settings of a comparison, saved as they are in ``comparison.json``."""


def model_parts(meta: dict[str, Any]) -> list[str]:
    """The part JSONs a comparison's loader reads: the study, similarity and sink scores of
    each computed model (``model_<i>/``, ``i`` its index among the labels)."""
    labels, computed = meta.get("labels"), meta.get("computed")
    if not isinstance(labels, list) or not isinstance(computed, list):
        return []
    return [
        f"model_{labels.index(label)}/{name}"
        for label in computed
        if label in labels
        for name in ("study/study.json", "similarity/similarity.json", "sinks/sink_scores.json")
    ]


def export_replicate(comparison: ModelComparison, label: str, path: str | Path) -> Path:
    """Write one model's per-window statistics as :meth:`ModelComparison.export_statistics`
    says: ``{name}.safetensors`` + ``{name}.json`` into ``path``, the JSON last.

    Args:
        comparison: The comparison.
        label: A model label.
        path: The folder (created if missing).

    Returns:
        The JSON file's path.

    Raises:
        InvalidInputError: unknown label, or ``path`` is a file or cannot be created.
    """
    comparison._check_label(label)
    folder = prepare_folder(path)
    stem = label.split("/")[-1]
    tensors = {
        f"{mode}/{stat}": values.float().contiguous()
        for mode, stats in comparison.statistics[label].items()
        for stat, values in stats.items()
    }
    meta = {
        "format": "homoglens.ReplicateStatistics/1",
        "label": label,
        "variant": comparison.variants[label],
        "heldout": comparison.heldout.get(label, {}),
        "layers": list(comparison.layers),
        "edge_k": comparison.edge_k,
        "centre": comparison.settings.get("centre"),
        "sp_uncentred": comparison._sp_uncentred,
        "eps": comparison.eps,
        "seed": comparison.seed,
        "n_windows": comparison.n_sequences,
        "data": comparison.settings.get("data", ""),
        "window_index": comparison.settings.get("window_index"),
    }
    out = folder / f"{stem}.json"
    with contextlib.suppress(FileNotFoundError):  # never old JSON beside new tensors
        out.unlink()
    write_pair(folder, stem, tensors, meta)
    return out


def write_comparison(comparison: ModelComparison, folder: Path) -> None:
    """Write a comparison into ``folder``: the study, similarity and sink scores of each
    computed model (``model_<i>/``), then ``comparison.safetensors`` + ``comparison.json``
    (last, with the sha256 of the safetensors and of each part's JSON).

    Args:
        comparison: The comparison.
        folder: An existing folder (the atomic save of :func:`save_folder` prepares it).
    """
    parts = []
    for i, label in enumerate(comparison.labels):
        if label in comparison.computed:
            for name, part in (
                ("study", comparison.studies[label]),
                ("similarity", comparison.similarity[label]),
                ("sinks", comparison.sinks[label]),
            ):
                (folder / f"model_{i}" / name).mkdir(parents=True)
                part._write_into(folder / f"model_{i}" / name)
                stem = "study" if name == "study" else part._stem  # type: ignore[union-attr]
                parts.append(f"model_{i}/{name}/{stem}.json")
    tensors = {
        f"{i}/{mode}/{stat}": values.contiguous()
        for i, label in enumerate(comparison.labels)
        for mode, stats in comparison.statistics[label].items()
        for stat, values in stats.items()
    }
    meta = {
        "format": "homoglens.ModelComparison/2",
        "labels": list(comparison.labels),
        "layers": list(comparison.layers),
        "variants": comparison.variants,
        "computed": list(comparison.computed),
        "heldout": comparison.heldout,
        "no_positions": comparison.no_positions,
        "group_by": comparison.group_by,
        **{k: getattr(comparison, k) for k in COMPARISON_SCALARS},
        "settings": comparison.settings,
    }
    write_pair(folder, "comparison", tensors, meta, parts)


def _saved_order(key: str) -> tuple[int, int, int, str]:
    """Where the tensor ``key`` (``"<label index>/<mode>/<statistic>"``) stands when a loaded
    comparison's statistics are rebuilt: labels in order, modes and statistics in their
    canonical order (:data:`~homoglens.core.types.POSITION_ABLATIONS`, ``STATISTICS``), unknown
    names last, by name; the same order on every load."""
    i, mode, stat = (key.split("/") + ["", "", ""])[:3]
    modes, stats = tuple(POSITION_ABLATIONS), tuple(STATISTICS)
    return (
        int(i) if i.isdigit() else -1,
        modes.index(mode) if mode in modes else len(modes),
        stats.index(stat) if stat in stats else len(stats),
        key,
    )


def load_comparison(cls: type[ModelComparison], path: str | Path) -> ModelComparison:
    """Load what :meth:`ModelComparison.save` wrote, with its values checked.

    Args:
        cls: The class built (:class:`ModelComparison`).
        path: The folder.

    Returns:
        The comparison.

    Raises:
        ResultsNotFoundError: a file is missing.
        IncompatibleResultsError: wrong format, inconsistent content, values out of range, or a
            file that does not match the sha256 recorded in ``comparison.json``.
    """
    folder = folder_path(path, "load")
    meta, tensors = read_saved(folder, "comparison", parts=model_parts)
    if not isinstance(meta, dict) or meta.get("format") != "homoglens.ModelComparison/2":
        raise IncompatibleResultsError(f"{folder} does not hold a ModelComparison/2")
    keys = {"format", "labels", "layers", "variants", "computed", "heldout", "no_positions"}
    keys |= {"group_by", "settings", *COMPARISON_SCALARS}
    if set(meta) != keys:
        raise IncompatibleResultsError(
            f"{folder}/comparison.json has keys {sorted(meta)}, expected {sorted(keys)}"
        )
    labels, computed = meta["labels"], meta["computed"]
    if (
        not isinstance(labels, list)
        or not all(isinstance(v, str) for v in labels)
        or not isinstance(computed, list)
        or not all(isinstance(v, str) and v in labels for v in computed)
    ):
        raise IncompatibleResultsError(
            f"{folder}/comparison.json has labels={labels!r}, computed={computed!r}: "
            "expected strings, the computed ones among the labels; save it again"
        )
    statistics: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for key in sorted(tensors, key=_saved_order):  # safetensors gives no stable order
        values = tensors[key]
        i, mode, stat = (key.split("/") + ["", "", ""])[:3]
        if not i.isdigit() or int(i) >= len(labels) or key.count("/") != 2:
            raise IncompatibleResultsError(
                f"{folder}/comparison.safetensors has a tensor {key!r}, not "
                "'<label index>/<mode>/<statistic>'; save the comparison again"
            )
        statistics.setdefault(labels[int(i)], {}).setdefault(mode, {})[stat] = values
    where = {label: folder / f"model_{labels.index(label)}" for label in computed}
    kwargs = {
        "labels": tuple(labels),
        "statistics": statistics,
        "layers": meta["layers"],
        "variants": meta["variants"],
        "computed": tuple(computed),
        "studies": {k: PositionAblationStudy.load(v / "study") for k, v in where.items()},
        "similarity": {k: PositionalSimilarity.load(v / "similarity") for k, v in where.items()},
        "sinks": {k: SinkScores.load(v / "sinks") for k, v in where.items()},
        "heldout": meta["heldout"],
        "no_positions": meta["no_positions"],
        "group_by": meta["group_by"],
        "settings": meta["settings"],
        **{k: meta[k] for k in COMPARISON_SCALARS},
    }
    if isinstance(kwargs["layers"], list):
        kwargs["layers"] = tuple(kwargs["layers"])
    return checked_result(cls, folder, kwargs, stem="comparison")


# The tables of a :class:`~homoglens.ModelComparison`: per model and statistic with block-
# bootstrap intervals, the paired differences between models and under each positional ablation,
# the context-task costs and the per-layer homogenization.


def summary_table(comparison: ModelComparison) -> pd.DataFrame:
    """One row per (model, statistic) of ``comparison``, the mean over windows with its
    interval, as :meth:`ModelComparison.summary` (its returns)."""
    import pandas as pd

    rows = []
    for label in comparison.labels:
        for stat, values in comparison.per_sequence(label).items():
            est = comparison._estimate([comparison._last(values)[None]])
            rows.append((label, stat, est.value, est.ci_low, est.ci_high))
    return pd.DataFrame(rows, columns=["model", "statistic", "value", "ci_low", "ci_high"])


def differences_table(comparison: ModelComparison, reference: str | None) -> pd.DataFrame:
    """The paired differences (model minus ``reference``) of ``comparison``, as
    :meth:`ModelComparison.differences` (its arguments, returns and errors)."""
    import pandas as pd

    reference = comparison.labels[0] if reference is None else reference
    comparison._check_label(reference)
    ref = comparison.per_sequence(reference)
    rows = []
    for label in comparison.labels:
        if label == reference:
            continue
        for stat, values in comparison.per_sequence(label).items():
            if stat not in ref:  # e.g. icl of a model measured here, against shipped ones
                continue
            est = comparison._estimate(
                [(comparison._last(values) - comparison._last(ref[stat]))[None]]
            )
            rows.append((label, reference, stat, est.value, est.ci_low, est.ci_high))
    return pd.DataFrame(
        rows, columns=["model", "reference", "statistic", "diff", "ci_low", "ci_high"]
    )


def ablation_effects_table(comparison: ModelComparison) -> pd.DataFrame:
    """The paired effect of each positional ablation within each model of ``comparison``
    (ablated minus intact), as :meth:`ModelComparison.ablation_effects` (its returns)."""
    import pandas as pd

    rows = []
    for label in comparison.labels:
        intact = comparison.per_sequence(label)
        for mode in comparison.statistics[label]:
            if mode == "none":
                continue
            for stat, values in comparison.per_sequence(label, mode).items():
                diff = comparison._last(values) - comparison._last(intact[stat])
                est = comparison._estimate([diff[None]])
                rows.append((label, mode, stat, est.value, est.ci_low, est.ci_high))
    return pd.DataFrame(rows, columns=["model", "mode", "statistic", "diff", "ci_low", "ci_high"])


def context_costs_table(comparison: ModelComparison) -> pd.DataFrame:
    """The table of :meth:`ModelComparison.context_table`: the context table of each computed
    model's study, with a ``model`` column first.

    Args:
        comparison: The comparison.

    Returns:
        DataFrame with a ``model`` column and the columns of the study's context table.
    """
    import pandas as pd

    frames = [
        comparison.studies[label].context_table().assign(model=label)
        for label in comparison.computed
    ]
    if not frames:
        return pd.DataFrame(columns=["model", "mode", "icl", "induction_loss"])
    frame = pd.concat(frames, ignore_index=True)
    return frame.reindex(columns=["model", *[c for c in frame.columns if c != "model"]])


def layer_homogenization_table(comparison: ModelComparison) -> pd.DataFrame:
    """Per model and layer entry of ``comparison``, the mean pairwise cosine and ``H`` with
    their intervals, as :meth:`ModelComparison.layer_table` (its returns)."""
    import pandas as pd

    rows = []
    for label in comparison.labels:
        stats = comparison.per_sequence(label)
        for li, layer in enumerate(comparison.layers):
            raw = comparison._estimate([stats["mean_pairwise"][:, li][None]])
            h = comparison._estimate([stats["homogenization"][:, li][None]])
            rows.append(
                (
                    label,
                    layer,
                    raw.value,
                    raw.ci_low,
                    raw.ci_high,
                    h.value,
                    h.ci_low,
                    h.ci_high,
                )  # fmt: skip
            )
    return pd.DataFrame(
        rows,
        columns=[
            "model",
            "layer",
            "mean_pairwise",
            "ci_low",
            "ci_high",
            "homogenization",
            "h_ci_low",
            "h_ci_high",
        ],  # fmt: skip
    )


LAYER_STATISTICS: tuple[str, ...] = (
    "mean_pairwise",
    "homogenization",
    "matched_first",
    "matched_last",
    "naive_first",
    "naive_last",
    "sp_first",
    "sp_last",
    "sp_mean",
)


STATISTICS: tuple[str, ...] = (
    "loss",
    "icl",
    "adjusted_last",
    *LAYER_STATISTICS,
    "sink_rate",
    "sink_importance_top",
)
"""Per-window statistics of :class:`ModelComparison` (see the module docstring)."""


@dataclass(frozen=True, eq=False)
class ModelComparison(FolderSaved, Plotted):
    """Several models measured on the same windows, paired by window.

    ``plot()`` draws, left: centred homogenization by layer per model; middle: the matched and
    the naive edge excess at the last layer (block-bootstrap intervals); right: loss per model.

    Attributes:
        labels: Model labels, in the order given.
        statistics: ``{label: {mode: {statistic: values}}}``: every per-window statistic
            (:data:`STATISTICS`; ``[batch]`` or ``[batch layer]``) of every model, intact
            (``"none"``) and under each positional ablation (no sink statistics then).
        layers: The layer axis of the ``[batch layer]`` statistics.
        variants: ``{label: variant}``, the grouping key of ``group_by="variant"`` (the
            positional scheme recorded in ``training.json``, ``-bos`` appended for BOS-trained
            models; the label itself for other models).
        computed: Labels measured here (the others came as shipped statistics).
        studies: ``{label: PositionAblationStudy}`` of the computed labels.
        similarity: ``{label: PositionalSimilarity}`` of the computed labels (intact model).
        sinks: ``{label: SinkScores}`` on key 0 (computed labels, intact model).
        heldout: ``{label: {...}}`` what ``training.json`` records (held-out loss over the whole
            held-out novel, unigram entropy, variant, seed, bos).
        no_positions: The label (or, with ``group_by``, the variant) without positions.
        group_by: ``None`` (every label its own model) or ``"variant"`` (labels of one variant
            are training seeds of one model; seeds are the unit of replication).
        edge_k: Positions per edge.
        eps: Sink importance threshold.
        n_boot, ci, seed, block: Bootstrap resamples, coverage, seed, block length (windows;
            ``"auto"``: chosen from the windows' autocorrelation).
        sesoi, loss_sesoi: Smallest effects of interest (cosine, ``None``: a tenth of each
            statistic's scale; nats/token).
        settings: How the comparison was run.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (claims C1-C3).
    """

    _ranges: ClassVar[dict[str, tuple[float, float]]] = {"ci": (0.0, 1.0), "eps": (0.0, 1.0)}
    _bounds: ClassVar[dict[str, Bounds]] = {
        "layers": NON_NEGATIVE,
        "edge_k": Bounds(1.0),
        "n_boot": Bounds(1.0),
        "sesoi": NON_NEGATIVE,
        "loss_sesoi": NON_NEGATIVE,
    }

    labels: tuple[str, ...]
    statistics: dict[str, dict[str, dict[str, torch.Tensor]]]
    layers: tuple[int, ...]
    variants: dict[str, str]
    computed: tuple[str, ...] = ()
    studies: dict[str, PositionAblationStudy] = field(default_factory=dict)
    similarity: dict[str, PositionalSimilarity] = field(default_factory=dict)
    sinks: dict[str, SinkScores] = field(default_factory=dict)
    heldout: dict[str, dict[str, Any]] = field(default_factory=dict)
    no_positions: str | None = None
    group_by: str | None = None
    edge_k: int = 8
    eps: float = 0.3
    n_boot: int = 1000
    ci: float = 0.95
    seed: int = 0
    block: int | str = "auto"
    sesoi: float | None = None
    loss_sesoi: float = 0.01
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.labels) < 1 or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels {self.labels} must be unique and at least one")
        if set(self.statistics) != set(self.labels) or set(self.variants) != set(self.labels):
            raise ValueError(
                f"statistics {sorted(self.statistics)} and variants {sorted(self.variants)} "
                f"must cover the labels {self.labels}"
            )
        for name in ("studies", "similarity", "sinks"):
            if set(getattr(self, name)) != set(self.computed):
                raise ValueError(f"{name} has {sorted(getattr(self, name))}, expected "
                                 f"the computed labels {self.computed}")  # fmt: skip
        n_seq = set()
        for label, modes in self.statistics.items():
            if "none" not in modes:
                raise ValueError(f"{label} has no intact ('none') statistics")
            for mode, stats in modes.items():
                for stat, values in stats.items():
                    n_seq.add(int(values.shape[0]))
                    if stat in LAYER_STATISTICS and tuple(values.shape[1:]) != (len(self.layers),):
                        raise ValueError(
                            f"{label}/{mode}/{stat} has shape {tuple(values.shape)}, expected "
                            f"(seq, {len(self.layers)})"
                        )
        if len(n_seq) != 1:
            raise ValueError(f"models hold different numbers of windows {sorted(n_seq)}")
        if self.group_by not in (None, "variant"):
            raise ValueError(f"group_by={self.group_by!r} must be None or 'variant'")
        if self.no_positions is not None and self.no_positions not in self.entities():
            raise ValueError(f"no_positions={self.no_positions!r} is not one of the models")
        if not 0 < float(self.ci) < 1 or int(self.n_boot) < 1 or int(self.edge_k) < 1:
            raise IncompatibleResultsError(
                f"ci={self.ci!r} must lie in (0, 1), n_boot={self.n_boot!r} and "
                f"edge_k={self.edge_k!r} be >= 1"
            )

    def _check_values(self) -> None:
        """Run on load: modes and statistics by their known names, each statistic in its
        range (:data:`STATISTIC_BOUNDS`: NaN only where a statistic can be undefined), the
        computed labels among the labels, the variants strings, ``block`` an integer >= 1 or
        ``"auto"``, and the statistics of each computed model those of its own study (the same
        per-window loss and mean pairwise cosine, mode by mode)."""
        if not set(self.computed) <= set(self.labels):
            raise FieldError("computed", f"computed={list(self.computed)} are not all labels")
        if not all(isinstance(v, str) for v in self.variants.values()):
            raise FieldError("variants", f"variants={self.variants!r} must map labels to strings")
        try:
            as_block(self.block)
        except (ValueError, TypeError) as err:
            raise FieldError("block", f"block={self.block!r}: {err}") from None
        for label, modes in self.statistics.items():
            for mode, stats in modes.items():
                if mode not in POSITION_ABLATIONS:
                    raise FieldError("statistics", f"{label} has an unknown mode {mode!r}")
                for stat, values in stats.items():
                    if stat not in STATISTICS:
                        raise FieldError("statistics", f"{label} has an unknown statistic {stat!r}")
                    where = f"statistics[{label!r}][{mode!r}][{stat!r}]"
                    bounds = STATISTIC_BOUNDS.get(stat, FINITE_OR_NAN)
                    check_bounds(self, where, bounds, values)
        for label in self.computed:
            study = self.studies[label]
            for m, mode in enumerate(study.modes):
                stats = self.statistics[label].get(mode, {})
                for stat, mine in (
                    ("loss", study.loss[m]),
                    ("mean_pairwise", study.mean_pairwise[m]),
                ):
                    if stat in stats and not torch.allclose(
                        stats[stat].double(), mine.double(), rtol=0, atol=1e-6
                    ):
                        raise FieldError(
                            "statistics",
                            f"{label}/{mode}/{stat} differs from the {stat} of the model's own "
                            "study: the statistics and the saved study do not belong together",
                        )

    @property
    def n_sequences(self) -> int:
        """Number of windows every model read."""
        return int(self.statistics[self.labels[0]]["none"]["loss"].shape[0])

    def entities(self) -> dict[str, list[str]]:
        """``{model: [labels]}``: each label alone, or labels grouped by variant (seeds)."""
        if self.group_by is None:
            return {label: [label] for label in self.labels}
        out: dict[str, list[str]] = {}
        for label in self.labels:
            out.setdefault(self.variants[label], []).append(label)
        return out

    def _check_label(self, label: str) -> None:
        if label not in self.labels:
            raise InvalidInputError(f"model {label!r} not in this comparison; it has {self.labels}")

    def per_sequence(self, label: str, mode: str = "none") -> dict[str, torch.Tensor]:
        """Every statistic of one model and mode, per window.

        Args:
            label: A model label.
            mode: ``"none"`` (intact) or a positional ablation that was run.

        Returns:
            ``{statistic: [batch] or [batch layer]}`` float64 tensors (cosines; loss in nats/token;
            sink_rate in percent; importance in [0, 1]).

        Raises:
            InvalidInputError: unknown label or mode.
        """
        self._check_label(label)
        if mode not in self.statistics[label]:
            raise InvalidInputError(
                f"mode {mode!r} was not run for {label!r}; it has {list(self.statistics[label])}"
            )
        return {k: v.double() for k, v in self.statistics[label][mode].items()}

    @property
    def _sp_uncentred(self) -> bool:
        """Whether the ``sp_*`` readings were measured on uncentred vectors (comparisons
        saved before issue 38 measured them with ``centre``, which makes them 0 by
        construction when centred by position)."""
        return self.settings.get("centre") is None or bool(self.settings.get("sp_uncentred"))

    def _claim_statistics(self, label: str) -> dict[str, dict[str, torch.Tensor]]:
        """A model's statistics for the claims: centred ``sp_*`` readings left out."""
        stats = self.statistics[label]
        if self._sp_uncentred:
            return dict(stats)
        return {
            mode: {k: v for k, v in values.items() if k not in CROSS_INPUT_STATISTICS}
            for mode, values in stats.items()
        }

    def _last(self, values: torch.Tensor) -> torch.Tensor:
        return values[:, -1] if values.ndim == 2 else values

    def _estimate(self, groups: list[torch.Tensor], weights: list[float] | None = None) -> Any:
        return estimate(
            groups,
            weights=weights,
            block=as_block(self.block),
            n_boot=self.n_boot,
            resample_seeds=False,
            ci=self.ci,
            sesoi=0.01 if self.sesoi is None else self.sesoi,  # (summary tables show no TOST)
            seed=self.seed,
        )

    # ------------------------------------------------------------------ tables
    def summary(self) -> pd.DataFrame:
        """One row per (model, statistic), at the last layer for per-layer statistics: mean
        over windows with a block-bootstrap interval.

        Returns:
            DataFrame with columns ``model, statistic, value, ci_low, ci_high``.
        """
        return summary_table(self)

    def differences(self, reference: str | None = None) -> pd.DataFrame:
        """Paired differences between models (model minus ``reference``) on the same windows,
        at the last layer for per-layer statistics.

        Args:
            reference: The label subtracted (default: the first label).

        Returns:
            DataFrame with columns ``model, reference, statistic, diff, ci_low, ci_high``.

        Raises:
            InvalidInputError: unknown label.
        """
        return differences_table(self, reference)

    def ablation_effects(self) -> pd.DataFrame:
        """Paired effect of each positional ablation within each model (ablated minus intact),
        at the last layer for per-layer statistics.

        Returns:
            DataFrame with columns ``model, mode, statistic, diff, ci_low, ci_high``.
        """
        return ablation_effects_table(self)

    def context_table(self) -> pd.DataFrame:
        """Per computed model and mode: the context-task costs of C3c (in-context-learning
        score and induction loss, with intervals and the paired change under each ablation;
        :meth:`~homoglens.PositionAblationStudy.context_table`).

        Returns:
            DataFrame with a ``model`` column and the columns of the study's context table.
        """
        return context_costs_table(self)

    def layer_table(self) -> pd.DataFrame:
        """Per model and layer entry (intact): the raw mean pairwise cosine and the centred
        homogenization ``H`` (mean off-diagonal ``W``), each with a block-bootstrap interval.

        Returns:
            DataFrame with columns ``model, layer, mean_pairwise, ci_low, ci_high,
            homogenization, h_ci_low, h_ci_high``.
        """
        return layer_homogenization_table(self)

    def claims(
        self,
        *,
        sesoi: float | None = None,
        loss_sesoi: float | None = None,
        alpha: float = 0.05,
        block: int | Literal["auto"] | None = None,
    ) -> pd.DataFrame:
        """Test every reading of claims C1-C3 (:mod:`homoglens.core.claims`) on these models.

        One pre-declared primary test per reading and model, Holm-adjusted; the rest secondary.
        With ``group_by="variant"`` a model is a variant and its training seeds are the unit of
        replication (hierarchical bootstrap: seeds, then window blocks; t intervals with
        Welch-Satterthwaite degrees of freedom), and ``seed_sd`` gives the between-seed s.d.

        Args:
            sesoi: Smallest effect size of interest for cosines (default: ``self.sesoi``;
                ``None`` there: a tenth of each statistic's scale, :mod:`homoglens.core.claims`).
            loss_sesoi: The same for loss, nats/token (default: ``self.loss_sesoi``).
            alpha: Level of each test (family-wise over the primary tests).
            block: Windows per bootstrap block (default: ``self.block``).

        Returns:
            DataFrame with columns ``claim, reading, test, model, primary, predicted, value,
            se, ci_low, ci_high, p, p_holm, p_tost, p_tost_holm, sesoi, verdict, n_seeds,
            seed_sd, n_windows`` (see :func:`homoglens.core.claims.claims_table`).
        """
        entities = {
            name: [self._claim_statistics(label) for label in labels]
            for name, labels in self.entities().items()
        }
        return claims_table(
            entities,
            layers=self.layers,
            no_positions=self.no_positions,
            sesoi=self.sesoi if sesoi is None else as_float("sesoi", sesoi, low=0, high=1e9),
            loss_sesoi=self.loss_sesoi
            if loss_sesoi is None
            else as_float("loss_sesoi", loss_sesoi, low=0, high=1e9),
            alpha=as_float("alpha", alpha, low=0.0, high=1.0),
            ci=self.ci,
            block=as_block(self.block if block is None else block),
            n_boot=self.n_boot,
            seed=self.seed,
            resample_seeds=self.group_by is not None,
        )

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: :meth:`summary` (one row per model and statistic)."""
        return self.summary()

    _figure: ClassVar[str] = "comparison.figure.comparison_figure"

    # ------------------------------------------------------------------ persistence
    _own: ClassVar[tuple[str, ...]] = ("comparison.json", "comparison.safetensors", "model_[0-9]*")
    _manifest: ClassVar[str] = "comparison.json"

    def export_statistics(self, label: str, path: str | Path) -> Path:
        """Write one model's per-window statistics (every mode) as ``{name}.safetensors`` +
        ``{name}.json`` into ``path``, the format :func:`compare_models` reads for shipped
        replicates (the training record and the comparison settings go into the JSON, with the
        sha256 of the safetensors). Each file is written atomically, the JSON last (an older
        JSON is removed first, so a failed write never leaves it beside new tensors).

        Returns:
            The JSON file's path.
        """
        return export_replicate(self, label, path)

    def save(self, path: str | Path) -> Path:
        """Save as ``comparison.safetensors`` (every per-window statistic) + a study, a
        similarity and a sink-score folder per computed model (``model_<i>/``) +
        ``comparison.json`` (last: the sha256 of the safetensors and of each part's JSON),
        atomically: a save that fails or is interrupted leaves an older comparison in ``path``
        loadable and unchanged, or refused on load, never a mix.

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created.
        """
        return self._save_folder(path)

    def _write_into(self, folder: Path) -> None:
        write_comparison(self, folder)

    @classmethod
    def load(cls, path: str | Path) -> ModelComparison:
        """Load what :meth:`save` wrote, with its values checked.

        Raises:
            ResultsNotFoundError: a file is missing.
            IncompatibleResultsError: wrong format, inconsistent content, values out of range
                or of the wrong type, statistics that do not fit the saved studies, or a file
                that does not match the sha256 recorded in ``comparison.json`` (saved
                incompletely or edited).
        """
        return load_comparison(cls, path)

    def __repr__(self) -> str:
        return keyword_repr(
            "ModelComparison",
            models=list(self.entities()),
            labels=len(self.labels),
            n_sequences=self.n_sequences,
            group_by=repr(self.group_by),
            no_positions=repr(self.no_positions),
            edge_k=self.edge_k,
        )


STATISTIC_BOUNDS: dict[str, Bounds] = {
    "loss": NON_NEGATIVE,
    "mean_pairwise": COSINE,
    "sink_rate": Bounds(0.0, 100.0, tol=1e-6),
    "sink_importance_top": UNIT_OR_NAN,
}
"""Values a saved per-window statistic of :class:`ModelComparison` may hold (nats, cosine,
percent, importance); every other statistic is finite or NaN (``icl`` under 16 tokens, the
cross-input readings on centred vectors, jackknife pseudo-values are not bounded)."""
