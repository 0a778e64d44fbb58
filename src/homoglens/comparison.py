"""Compare models that differ in their positional scheme on the same windows (claims C1-C3).

Every model reads the same token windows (they must share a tokenizer), so every statistic is
paired by window: across models (e.g. no positions minus learned) and across positional
ablations of one model (e.g. zeroed minus intact). Intervals come from a moving-block bootstrap
over windows (consecutive windows of one novel are correlated); with several training seeds per
variant (``group_by="variant"``) from a hierarchical bootstrap over seeds, then windows
(:mod:`homoglens.stats`). :meth:`ModelComparison.claims` turns the readings of claims C1-C3 into
pre-declared, Holm-adjusted tests with a smallest effect size of interest (:mod:`homoglens.claims`).

Per-window statistics (:data:`STATISTICS`; ``[seq]``, or ``[seq layer]`` over the layer axis):

* ``loss``: mean next-token cross-entropy (nats/token);
* ``mean_pairwise`` ``[seq layer]``: mean pairwise cosine of the window (raw);
* ``adjusted_last``: ``mean_pairwise`` at the last layer minus that layer's anisotropy baseline;
* ``homogenization`` ``[seq layer]``: mean off-diagonal ``W = M - C`` (centred: what a window's
  tokens share beyond what every window shares at those positions);
* ``matched_first`` / ``matched_last`` ``[seq layer]``: the distance-matched edge excess;
* ``naive_first`` / ``naive_last`` ``[seq layer]``: the naive edge excess (biased by distance);
* ``sp_first`` / ``sp_last`` ``[seq layer]``: same-position cross-input similarity of an edge
  minus the middle's;
* ``sink_rate``: percentage of (layer, head) whose Gu et al. importance on key 0 exceeds eps
  (intact model only); ``sink_importance_top``: importance of the strongest key-0 head.

The ``C``-dependent statistics are jackknife pseudo-values (a second pass of
:func:`~homoglens.similarity.positional_similarity`), whose mean over windows is the corpus
statistic exactly.

References:
    Yusupov et al. 2025, "Token Homogenization under Positional Bias", arXiv 2508.17126 (claims
    C1-C3; only the abstract is available, the metrics are homoglens' own).
    Ethayarajh 2019 (anisotropy). Gu et al. 2024, arXiv 2410.10781 (sinks).
    Kazemnejad et al. 2023, arXiv 2305.19466 (models without positional encodings still infer
    position from the causal mask).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from homoglens._checks import as_float, as_int
from homoglens.architectures import check_model
from homoglens.claims import claims_table
from homoglens.data import TokenBatch, corpus_windows, to_token_batch
from homoglens.errors import IncompatibleResultsError, InvalidInputError
from homoglens.interventions import ablated_positions
from homoglens.models import SHIPPED_MODELS, load_model, model_info, shipped_model_folder
from homoglens.results import PositionAblationStudy, _read_saved, prepare_folder
from homoglens.results.similarity import PositionalSimilarity
from homoglens.similarity import positional_similarity
from homoglens.sinks import SinkScores, _check_key_eps, _sink_pass
from homoglens.stats import estimate, window_resamples
from homoglens.studies import position_ablation_study
from homoglens.types import Backend, Centring, GroupBy, HookedModel

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["STATISTICS", "REPLICATED_MODELS", "ModelComparison", "compare_models"]

LAYER_STATISTICS: tuple[str, ...] = (
    "mean_pairwise",
    "homogenization",
    "matched_first",
    "matched_last",
    "naive_first",
    "naive_last",
    "sp_first",
    "sp_last",
)
STATISTICS: tuple[str, ...] = (
    "loss",
    "adjusted_last",
    *LAYER_STATISTICS,
    "sink_rate",
    "sink_importance_top",
)
"""Per-window statistics of :class:`ModelComparison` (see the module docstring)."""

REPLICATED_MODELS: tuple[str, ...] = tuple(
    f"homoglens/tiny-{variant}{suffix}"
    for variant in ("learned", "rotary", "none")
    for suffix in ("", "-s1", "-s2")
)
"""The controlled models over three training seeds each. Seed 0 ships with its weights; seeds 1
and 2 ship their per-window statistics on the held-out novel (``homoglens train --variant V
--seed S`` reproduces their weights bit for bit)."""

_REPLICATES = Path(str(files("homoglens") / "assets" / "replicates"))


@dataclass(frozen=True, eq=False)
class ModelComparison:
    """Several models measured on the same windows, paired by window.

    Attributes:
        labels: Model labels, in the order given.
        statistics: ``{label: {mode: {statistic: values}}}``: every per-window statistic
            (:data:`STATISTICS`; ``[seq]`` or ``[seq layer]``) of every model, intact
            (``"none"``) and under each positional ablation (no sink statistics then).
        layers: The layer axis of the ``[seq layer]`` statistics.
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
        n_boot, ci, seed, block: Bootstrap resamples, coverage, seed, block length (windows).
        sesoi, loss_sesoi: Smallest effects of interest (cosine; nats/token).
        settings: How the comparison was run.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (claims C1-C3).
    """

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
    block: int = 16
    sesoi: float = 0.01
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
            ``{statistic: [seq] or [seq layer]}`` float64 tensors (cosines; loss in nats/token;
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

    def _last(self, values: torch.Tensor) -> torch.Tensor:
        return values[:, -1] if values.ndim == 2 else values

    @cached_property
    def _resamples(self) -> torch.Tensor:
        return window_resamples(
            self.n_sequences, block=self.block, n_boot=self.n_boot, seed=self.seed
        )

    def _estimate(self, groups: list[torch.Tensor], weights: list[float] | None = None) -> Any:
        return estimate(
            groups,
            weights=weights,
            windows=self._resamples,
            resample_seeds=False,
            ci=self.ci,
            sesoi=self.sesoi,
            seed=self.seed,
        )

    # ------------------------------------------------------------------ tables
    def summary(self) -> pd.DataFrame:
        """One row per (model, statistic), at the last layer for per-layer statistics: mean
        over windows with a block-bootstrap interval.

        Returns:
            DataFrame with columns ``model, statistic, value, ci_low, ci_high``.
        """
        import pandas as pd

        rows = []
        for label in self.labels:
            for stat, values in self.per_sequence(label).items():
                est = self._estimate([self._last(values)[None]])
                rows.append((label, stat, est.value, est.ci_low, est.ci_high))
        return pd.DataFrame(rows, columns=["model", "statistic", "value", "ci_low", "ci_high"])

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
        import pandas as pd

        reference = self.labels[0] if reference is None else reference
        self._check_label(reference)
        ref = self.per_sequence(reference)
        rows = []
        for label in self.labels:
            if label == reference:
                continue
            for stat, values in self.per_sequence(label).items():
                est = self._estimate([(self._last(values) - self._last(ref[stat]))[None]])
                rows.append((label, reference, stat, est.value, est.ci_low, est.ci_high))
        return pd.DataFrame(
            rows, columns=["model", "reference", "statistic", "diff", "ci_low", "ci_high"]
        )

    def ablation_effects(self) -> pd.DataFrame:
        """Paired effect of each positional ablation within each model (ablated minus intact),
        at the last layer for per-layer statistics.

        Returns:
            DataFrame with columns ``model, mode, statistic, diff, ci_low, ci_high``.
        """
        import pandas as pd

        rows = []
        for label in self.labels:
            intact = self.per_sequence(label)
            for mode in self.statistics[label]:
                if mode == "none":
                    continue
                for stat, values in self.per_sequence(label, mode).items():
                    diff = self._last(values) - self._last(intact[stat])
                    est = self._estimate([diff[None]])
                    rows.append((label, mode, stat, est.value, est.ci_low, est.ci_high))
        return pd.DataFrame(
            rows, columns=["model", "mode", "statistic", "diff", "ci_low", "ci_high"]
        )

    def layer_table(self) -> pd.DataFrame:
        """Per model and layer entry (intact): the raw mean pairwise cosine and the centred
        homogenization ``H`` (mean off-diagonal ``W``), each with a block-bootstrap interval.

        Returns:
            DataFrame with columns ``model, layer, mean_pairwise, ci_low, ci_high,
            homogenization, h_ci_low, h_ci_high``.
        """
        import pandas as pd

        rows = []
        for label in self.labels:
            stats = self.per_sequence(label)
            for li, layer in enumerate(self.layers):
                raw = self._estimate([stats["mean_pairwise"][:, li][None]])
                h = self._estimate([stats["homogenization"][:, li][None]])
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

    def claims(
        self,
        *,
        sesoi: float | None = None,
        loss_sesoi: float | None = None,
        alpha: float = 0.05,
        block: int | None = None,
    ) -> pd.DataFrame:
        """Test every reading of claims C1-C3 (:mod:`homoglens.claims`) on these models.

        One pre-declared primary test per reading and model, Holm-adjusted; the rest secondary.
        With ``group_by="variant"`` a model is a variant and its training seeds are the unit of
        replication (hierarchical bootstrap: seeds, then window blocks; t intervals with
        Welch-Satterthwaite degrees of freedom), and ``seed_sd`` gives the between-seed s.d.

        Args:
            sesoi: Smallest effect size of interest for cosines (default: ``self.sesoi``).
            loss_sesoi: The same for loss, nats/token (default: ``self.loss_sesoi``).
            alpha: Level of each test (family-wise over the primary tests).
            block: Windows per bootstrap block (default: ``self.block``).

        Returns:
            DataFrame with columns ``claim, reading, test, model, primary, predicted, value,
            se, ci_low, ci_high, p, p_holm, p_tost, p_tost_holm, sesoi, verdict, n_seeds,
            seed_sd, n_windows`` (see :func:`homoglens.claims.claims_table`).
        """
        entities = {
            name: [self.statistics[label] for label in labels]
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
            block=self.block if block is None else as_int("block", block, low=1),
            n_boot=self.n_boot,
            seed=self.seed,
            resample_seeds=self.group_by is not None,
        )

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: :meth:`summary` (one row per model and statistic)."""
        return self.summary()

    def plot(self) -> Figure:
        """Left: centred homogenization by layer per model; middle: the matched and the naive
        edge excess at the last layer (block-bootstrap intervals); right: loss per model."""
        import numpy as np
        from matplotlib.figure import Figure

        fig = Figure(figsize=(15, 4.4), layout="constrained")
        left, middle, right = fig.subplots(1, 3, width_ratios=[1.1, 1.5, 0.9])
        layers = self.layer_table()
        for i, label in enumerate(self.labels):
            rows = layers[layers["model"] == label]
            left.plot(rows["layer"], rows["homogenization"], "o-", ms=3, lw=1, label=label,
                      color=f"C{i % 10}")  # fmt: skip
            left.fill_between(rows["layer"], rows["h_ci_low"], rows["h_ci_high"], alpha=0.15,
                              color=f"C{i % 10}")  # fmt: skip
        left.axhline(0.0, color="grey", lw=0.5)
        left.set_xlabel("layer (0 = embeddings, l = output of block l-1)")
        left.set_ylabel("H = mean off-diagonal W (centred)")
        left.set_title("Homogenization by layer")
        left.legend(fontsize="x-small")
        summary = self.summary().set_index(["model", "statistic"])
        stats = ["matched_first", "matched_last", "naive_first", "naive_last"]
        width = 0.8 / len(self.labels)
        for i, label in enumerate(self.labels):
            vals = [summary.loc[(label, s)] for s in stats]
            x = np.arange(len(stats)) + (i - (len(self.labels) - 1) / 2) * width
            err = np.array([[v["value"] - v["ci_low"], v["ci_high"] - v["value"]] for v in vals])
            middle.bar(x, [v["value"] for v in vals], width, yerr=err.T, capsize=2,
                       label=label, color=f"C{i % 10}")  # fmt: skip
        middle.axhline(0.0, color="grey", lw=0.5)
        middle.set_xticks(np.arange(len(stats)), [s.replace("_", "\n") for s in stats])
        middle.set_ylabel("edge minus middle (cosine)")
        middle.set_title(f"Edge excess at the last layer ({self.edge_k} positions per edge)")
        loss = [summary.loc[(label, "loss")] for label in self.labels]
        x = np.arange(len(loss))
        err = np.array([[v["value"] - v["ci_low"], v["ci_high"] - v["value"]] for v in loss])
        right.bar(x, [v["value"] for v in loss], yerr=err.T, capsize=4,
                  color=[f"C{i % 10}" for i in x])  # fmt: skip
        right.set_xticks(x, [label.split("/")[-1] for label in self.labels], rotation=30)
        right.set_ylabel("next-token loss (nats/token)")
        right.set_title("Loss")
        fig.suptitle(f"Models compared on {self.n_sequences} windows")
        return fig

    # ------------------------------------------------------------------ persistence
    def export_statistics(self, label: str, path: str | Path) -> Path:
        """Write one model's per-window statistics (every mode) as ``{name}.safetensors`` +
        ``{name}.json`` into ``path``, the format :func:`compare_models` reads for shipped
        replicates (the training record and the comparison settings go into the JSON).

        Returns:
            The JSON file's path.
        """
        from safetensors.torch import save_file

        self._check_label(label)
        folder = prepare_folder(path)
        stem = label.split("/")[-1]
        tensors = {
            f"{mode}/{stat}": values.float().contiguous()
            for mode, stats in self.statistics[label].items()
            for stat, values in stats.items()
        }
        save_file(tensors, str(folder / f"{stem}.safetensors"))
        meta = {
            "format": "homoglens.ReplicateStatistics/1",
            "label": label,
            "variant": self.variants[label],
            "heldout": self.heldout.get(label, {}),
            "layers": list(self.layers),
            "edge_k": self.edge_k,
            "centre": self.settings.get("centre"),
            "eps": self.eps,
            "seed": self.seed,
            "n_windows": self.n_sequences,
            "data": self.settings.get("data", ""),
            "window_index": self.settings.get("window_index"),
        }
        out = folder / f"{stem}.json"
        out.write_text(json.dumps(meta, indent=2))
        return out

    def save(self, path: str | Path) -> Path:
        """Save as ``comparison.json`` + ``comparison.safetensors`` (every per-window
        statistic) + a study, a similarity and a sink-score folder per computed model."""
        from safetensors.torch import save_file

        folder = prepare_folder(path)
        for i, label in enumerate(self.labels):
            if label in self.computed:
                self.studies[label].save(folder / f"model_{i}" / "study")
                self.similarity[label].save(folder / f"model_{i}" / "similarity")
                self.sinks[label].save(folder / f"model_{i}" / "sinks")
        tensors = {
            f"{i}/{mode}/{stat}": values.contiguous()
            for i, label in enumerate(self.labels)
            for mode, stats in self.statistics[label].items()
            for stat, values in stats.items()
        }
        save_file(tensors, str(folder / "comparison.safetensors"))
        meta = {
            "format": "homoglens.ModelComparison/2",
            "labels": list(self.labels),
            "layers": list(self.layers),
            "variants": self.variants,
            "computed": list(self.computed),
            "heldout": self.heldout,
            "no_positions": self.no_positions,
            "group_by": self.group_by,
            **{k: getattr(self, k) for k in _SCALARS},
            "settings": self.settings,
        }
        (folder / "comparison.json").write_text(json.dumps(meta, indent=2))
        return folder

    @classmethod
    def load(cls, path: str | Path) -> ModelComparison:
        """Load what :meth:`save` wrote.

        Raises:
            ResultsNotFoundError: a file is missing.
            IncompatibleResultsError: wrong format or inconsistent content.
        """
        folder = Path(path).expanduser()
        meta, tensors = _read_saved(folder, "comparison")
        if not isinstance(meta, dict) or meta.get("format") != "homoglens.ModelComparison/2":
            raise IncompatibleResultsError(f"{folder} does not hold a ModelComparison/2")
        keys = {"format", "labels", "layers", "variants", "computed", "heldout", "no_positions"}
        keys |= {"group_by", "settings", *_SCALARS}
        if set(meta) != keys:
            raise IncompatibleResultsError(
                f"{folder}/comparison.json has keys {sorted(meta)}, expected {sorted(keys)}"
            )
        try:
            labels = tuple(meta["labels"])
            statistics: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
            for key, values in tensors.items():
                i, mode, stat = key.split("/")
                statistics.setdefault(labels[int(i)], {}).setdefault(mode, {})[stat] = values
            computed = tuple(meta["computed"])
            where = {label: folder / f"model_{labels.index(label)}" for label in computed}
            return cls(
                labels=labels,
                statistics=statistics,
                layers=tuple(meta["layers"]),
                variants=meta["variants"],
                computed=computed,
                studies={k: PositionAblationStudy.load(v / "study") for k, v in where.items()},
                similarity={
                    k: PositionalSimilarity.load(v / "similarity") for k, v in where.items()
                },
                sinks={k: SinkScores.load(v / "sinks") for k, v in where.items()},
                heldout=meta["heldout"],
                no_positions=meta["no_positions"],
                group_by=meta["group_by"],
                settings=meta["settings"],
                **{k: meta[k] for k in _SCALARS},
            )
        except (KeyError, ValueError, TypeError, IndexError) as err:
            raise IncompatibleResultsError(
                f"{folder} does not hold a consistent comparison: {err!r}"
            ) from None

    def __repr__(self) -> str:
        return (
            f"ModelComparison(models={list(self.entities())}, labels={len(self.labels)}, "
            f"n_sequences={self.n_sequences}, group_by={self.group_by!r}, "
            f"no_positions={self.no_positions!r}, edge_k={self.edge_k})"
        )


_SCALARS = ("edge_k", "eps", "n_boot", "ci", "seed", "block", "sesoi", "loss_sesoi")


def _training_record(name: str) -> dict[str, Any]:
    """What ``training.json`` beside a shipped or local model records (empty if none)."""
    folder = shipped_model_folder(name) if name in SHIPPED_MODELS else Path(name)
    path = folder / "training.json"
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    keep = ("heldout_loss", "heldout_unigram_entropy", "heldout", "heldout_tokens")
    out = {k: record[k] for k in keep if k in record}
    config = record.get("config", {})
    out.update(variant=config.get("variant"), seed=config.get("seed"), bos=config.get("bos", False))
    return out


def _variant(label: str, record: Mapping[str, Any]) -> str:
    if not record.get("variant"):
        return label
    return str(record["variant"]) + ("-bos" if record.get("bos") else "")


def _window_statistics(
    study: PositionAblationStudy,
    similarity: Mapping[str, PositionalSimilarity],
    importance: torch.Tensor,
    eps: float,
) -> dict[str, dict[str, torch.Tensor]]:
    """Every per-window statistic of one model, per mode."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for m, mode in enumerate(study.modes):
        sim = similarity[mode]
        pairwise = study.mean_pairwise[m].double()
        stats = {
            "loss": study.loss[m].double(),
            "adjusted_last": pairwise[:, -1] - study.profiles[mode].baseline.double()[-1],
            "mean_pairwise": pairwise,
        }
        for stat in LAYER_STATISTICS[1:]:
            stats[stat] = sim.per_window(stat)
        if mode == "none":
            alpha = importance.double()
            stats["sink_rate"] = (alpha > eps).double().mean((1, 2)) * 100
            flat = alpha.flatten(1)
            stats["sink_importance_top"] = flat[:, int(flat.mean(0).argmax())]
        out[mode] = stats
    return out


def _shipped_statistics(
    name: str,
    *,
    modes: Sequence[str],
    edge_k: int,
    seed: int,
    window_index: list[int] | None,
    bos: bool,
    centre: str | None,
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """The shipped per-window statistics of a replicate whose weights are not shipped, for the
    held-out windows ``window_index`` of the default comparison.

    Raises:
        InvalidInputError: the comparison's settings differ from the ones the statistics were
            computed with (then train the model and pass its folder).
    """
    from safetensors.torch import load_file

    stem = name.split("/")[-1]
    meta = json.loads((_REPLICATES / f"{stem}.json").read_text())
    variant, s = stem.removeprefix("tiny-").rsplit("-s", 1)
    fix = (
        f"`homoglens train --variant {variant} --seed {s} --out models` reproduces its weights "
        f"bit for bit; then pass models/{stem}"
    )
    tensors = load_file(str(_REPLICATES / f"{stem}.safetensors"))
    have = {key.split("/")[0] for key in tensors}
    problems = []
    if bos:
        problems.append("BOS windows")
    if meta["edge_k"] != edge_k:
        problems.append(f"edge_k={edge_k} (shipped: {meta['edge_k']})")
    if meta.get("centre") != centre:
        problems.append(f"centre={centre!r} (shipped: {meta.get('centre')!r})")
    if meta["seed"] != seed and "permute" in modes:
        problems.append(f"seed={seed} for 'permute' (shipped: {meta['seed']})")
    if not set(modes) <= have:
        problems.append(f"modes {sorted(set(modes) - have)} (shipped: {sorted(have)})")
    if window_index is None or max(window_index) >= meta["n_windows"]:
        problems.append("other windows than the held-out novel's 128-token windows")
    if problems:
        raise InvalidInputError(
            f"{name} ships only its per-window statistics for the default comparison; this one "
            f"asks for {', '.join(problems)}. {fix}"
        )
    idx = torch.tensor(window_index)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, values in tensors.items():
        mode, stat = key.split("/")
        if mode in modes:
            out.setdefault(mode, {})[stat] = values.double()[idx]
    return out, meta


def _is_statistics_only(name: Any) -> bool:
    if not isinstance(name, str) or name not in REPLICATED_MODELS or name in SHIPPED_MODELS:
        return False
    return (_REPLICATES / f"{name.split('/')[-1]}.json").is_file()


def compare_models(
    models: Mapping[str, HookedModel | str] | Sequence[str] = REPLICATED_MODELS,
    data: TokenBatch | str | os.PathLike[str] | None = None,
    *,
    n_seq: int | None = None,
    seq_len: int | None = None,
    modes: Sequence[str] = ("none", "zero", "permute"),
    no_positions: str | None = "auto",
    group_by: GroupBy | None | Literal["auto"] = "auto",
    centre: Centring | None = "position",
    backend: Backend = "auto",
    edge_k: int = 8,
    eps: float = 0.3,
    batch_size: int = 16,
    n_boot: int = 1000,
    ci: float = 0.95,
    block: int = 16,
    sesoi: float = 0.01,
    loss_sesoi: float = 0.01,
    seed: int = 0,
    progress: bool = True,
) -> ModelComparison:
    """Measure several models side by side on the same windows, paired by window.

    For each model: a :func:`~homoglens.studies.position_ablation_study` (loss and raw
    homogenization per layer, intact and under each ablation in ``modes``), a
    :func:`~homoglens.similarity.positional_similarity` per mode (centred homogenization, the
    matched and the naive edge excess, ``SP``; with pseudo-values) and attention-sink scores on
    key 0. Models named in :data:`REPLICATED_MODELS` whose weights are not shipped contribute
    their shipped per-window statistics instead (default data only). :meth:`ModelComparison.
    claims` then tests the readings of claims C1-C3.

    Args:
        models: Model names (``load_model`` names or folders; label = name) or ``{label: model
            or name}``. Default: :data:`REPLICATED_MODELS`, the three positional schemes over
            three training seeds each.
        data: ``None`` (default): the novel held out from the tiny models' training, tokenized
            as in training (:func:`homoglens.training.heldout_windows`; windows start with
            ``<|endoftext|>`` when the models were trained so); a corpus name or text file,
            cut into ``n_seq`` windows of ``seq_len`` tokens (no BOS); or a
            :class:`TokenBatch` of equal-length windows.
        n_seq: Windows (default: all 1365 windows of 128 tokens; 64 for a corpus).
        seq_len: Tokens per window (default: the smallest ``n_ctx`` of the models).
        modes: Positional ablations (``"none"`` is always run); each must suit every model.
        no_positions: The model trained without positions (``"auto"``: the one whose
            ``training.json`` says variant ``none``; ``None``: no such model).
        group_by: ``"variant"``: labels of one variant (``training.json``) are seeds of one
            model, and seeds are the unit of replication; ``None``: every label is a model;
            ``"auto"``: ``"variant"`` when some variant has several labels.
        centre: Centring of the positional-similarity statistics (``"position"``: subtract
            each position's corpus mean first, which removes what every window shares at a
            position, e.g. learned positional rows or a BOS direction, whose dilution of the
            cosines would otherwise bias the edge statistics; ``None``: none).
        backend: For models given by name.
        edge_k: Positions per edge (windows need ``2 * edge_k + 2`` counted positions).
        eps: Sink importance threshold (Gu et al.: 0.3).
        batch_size: Windows per forward pass.
        n_boot: Bootstrap resamples.
        ci: Interval coverage in (0, 1).
        block: Consecutive windows per bootstrap block.
        sesoi: Smallest effect size of interest for cosines.
        loss_sesoi: Smallest effect size of interest for loss (nats/token).
        seed: Seed of the ``"permute"`` ablation and of the bootstrap.
        progress: Show progress bars.

    Returns:
        A :class:`ModelComparison`.

    Raises:
        InvalidInputError: no models, duplicate labels, models with different tokenizers,
            models trained with and without BOS together, an unknown ``no_positions``, windows
            of unequal length, shipped statistics asked for other settings, bad options.

    References:
        Yusupov et al. 2025, arXiv 2508.17126; Gu et al. 2024, arXiv 2410.10781;
        Saravanan et al. 2020, arXiv 2007.07797 (hierarchical bootstrap).

    Examples:
        >>> from homoglens import compare_models
        >>> result = compare_models(n_seq=8, n_boot=50, progress=False)  # doctest: +SKIP
        >>> result.claims()[["claim", "model", "primary", "verdict"]]  # doctest: +SKIP
    """
    if isinstance(models, str) or not isinstance(models, Mapping | Sequence):
        raise InvalidInputError(
            "models must be a list of names or a {label: model} mapping, "
            f"not {type(models).__name__}"
        )
    named = dict(models) if isinstance(models, Mapping) else {str(m): m for m in models}
    if not named or (not isinstance(models, Mapping) and len(named) != len(models)):
        raise InvalidInputError(f"models {list(models)} must be non-empty and unique")
    for m in named.values():
        if not isinstance(m, str | os.PathLike):
            check_model(m)
    if no_positions not in (None, "auto") and not isinstance(no_positions, str):
        raise InvalidInputError(f"no_positions={no_positions!r} must be a model label or None")
    if group_by not in (None, "auto", "variant"):
        raise InvalidInputError(f"group_by={group_by!r} must be None, 'auto' or 'variant'")
    if centre not in (None, "global", "position"):
        raise InvalidInputError(f"centre={centre!r} must be None, 'global' or 'position'")
    n_seq = None if n_seq is None else as_int("n_seq", n_seq, low=1)
    edge_k = as_int("edge_k", edge_k, low=1)
    seq_len = None if seq_len is None else as_int("seq_len", seq_len, low=2 * edge_k + 2)
    batch_size = as_int("batch_size", batch_size, low=1)
    n_boot = as_int("n_boot", n_boot, low=1)
    block = as_int("block", block, low=1)
    ci = as_float("ci", ci, low=0.0, high=1.0)
    sesoi = as_float("sesoi", sesoi, low=0.0, high=1e9)
    loss_sesoi = as_float("loss_sesoi", loss_sesoi, low=0.0, high=1e9)
    seed = as_int("seed", seed, low=0, high=2**63 - 1)
    shipped_only = [label for label, m in named.items() if _is_statistics_only(m)]
    loaded = {
        label: load_model(m, backend=backend) if isinstance(m, str | os.PathLike) else m
        for label, m in named.items()
        if label not in shipped_only
    }
    if not loaded:
        raise InvalidInputError(
            "every model given ships only statistics; add at least one model with weights "
            "(e.g. homoglens/tiny-learned) to define the windows"
        )
    _, eps = _check_key_eps(0, eps, min(int(m.cfg.n_ctx) for m in loaded.values()))
    records = {label: _training_record(model_info(m).name) for label, m in loaded.items()}
    bos_flags = {bool(r.get("bos")) for r in records.values() if r}
    if len(bos_flags) > 1:
        raise InvalidInputError(
            "some models were trained with a BOS at every window and some without; they read "
            "different windows, so compare each group on its own"
        )
    bos = bos_flags.pop() if bos_flags else False
    first_label, first = next(iter(loaded.items()))
    vocab = first.tokenizer.get_vocab() if first.tokenizer is not None else None
    for label, m in loaded.items():
        if m.tokenizer is None or m.tokenizer.get_vocab() != vocab:
            raise InvalidInputError(
                f"model {label!r} has no tokenizer or another one than {first_label!r}; compare "
                "models that share a tokenizer, so that every model reads the same token ids"
            )
    width = seq_len or min(int(m.cfg.n_ctx) for m in loaded.values())
    window_index: list[int] | None = None
    if isinstance(data, TokenBatch):
        batch = data
    elif data is None:
        from homoglens.training import heldout_windows

        everything = heldout_windows(first.tokenizer, seq_len=width, bos=bos)
        available = len(everything)
        count = available if n_seq is None else n_seq
        batch = heldout_windows(first.tokenizer, n_seq=n_seq, seq_len=width, bos=bos)
        window_index = (torch.arange(count) * available // count).tolist()
        if width != 128:
            window_index = None
    else:
        batch = corpus_windows(first, data, n_seq=n_seq or 64, seq_len=width, bos="never")
    if int(batch.lengths.min()) < 2 * edge_k + 2 + int(bool(batch.bos)):
        raise InvalidInputError(
            f"windows of {int(batch.lengths.min())} tokens are too short for edge_k={edge_k}; "
            "use longer windows or a smaller edge_k"
        )
    statistics, studies, similarity, sinks = {}, {}, {}, {}
    layers: tuple[int, ...] | None = None
    for label, m in loaded.items():
        batch_m = to_token_batch(m, batch)
        study = position_ablation_study(
            m, batch_m, modes=modes, seed=seed, batch_size=batch_size, n_boot=n_boot, ci=ci,
            exclude_first=bool(batch_m.bos), progress=progress,
        )  # fmt: skip
        per_mode = {}
        for mode in study.modes:
            options = {"seed": seed} if mode == "permute" else {}
            with ablated_positions(m, mode, **options):
                per_mode[mode] = positional_similarity(
                    m, batch_m, edge_k=edge_k, centre=centre, pseudo_values=True,
                    batch_size=batch_size, progress=progress,
                )  # fmt: skip
        scores, importance = _sink_pass(m, batch_m, 0, eps, batch_size, None, "auto", progress)
        statistics[label] = _window_statistics(study, per_mode, importance, eps)
        studies[label], sinks[label] = study, scores
        similarity[label] = per_mode["none"].sel([per_mode["none"].layers[-1]])
        if layers is not None and layers != study.layers:
            raise InvalidInputError(
                f"{label} has {len(study.layers)} layer entries and {first_label} "
                f"{len(layers)}; per-layer statistics need the same depth"
            )
        layers = study.layers
    heldout = dict(records)
    run_modes = list(studies[first_label].modes)
    for label in shipped_only:
        stats, meta = _shipped_statistics(
            str(named[label]), modes=run_modes, edge_k=edge_k, seed=seed,
            window_index=window_index, bos=bos, centre=centre,
        )  # fmt: skip
        if tuple(meta["layers"]) != layers:
            raise InvalidInputError(f"{label}'s shipped statistics have other layers")
        statistics[label], heldout[label] = stats, meta["heldout"]
    order = list(named)
    variants = {label: _variant(label, heldout.get(label, {})) for label in order}
    if group_by == "auto":
        counts: dict[str, int] = {}
        for v in variants.values():
            counts[v] = counts.get(v, 0) + 1
        group_by = "variant" if any(c > 1 for c in counts.values()) else None
    if no_positions == "auto":
        nope = [label for label in order if heldout.get(label, {}).get("variant") == "none"]
        if group_by == "variant":
            names = {variants[label] for label in nope}
            no_positions = names.pop() if len(names) == 1 else None
        else:
            no_positions = nope[0] if len(nope) == 1 else None
    elif no_positions is not None:
        allowed = set(variants.values()) if group_by == "variant" else set(order)
        if no_positions not in allowed:
            raise InvalidInputError(
                f"no_positions={no_positions!r} is not a model"
                + (" variant" if group_by == "variant" else " label")
                + f"; choose from {sorted(allowed)}"
            )
    return ModelComparison(
        labels=tuple(order),
        statistics={label: statistics[label] for label in order},
        layers=tuple(layers or ()),
        variants=variants,
        computed=tuple(label for label in order if label in loaded),
        studies=studies,
        similarity=similarity,
        sinks=sinks,
        heldout=heldout,
        no_positions=no_positions,
        group_by=group_by,
        edge_k=edge_k,
        eps=eps,
        n_boot=n_boot,
        ci=ci,
        seed=seed,
        block=block,
        sesoi=sesoi,
        loss_sesoi=loss_sesoi,
        settings={
            "data": batch.description,
            "window_index": window_index,
            "modes": run_modes,
            "centre": centre,
            "backends": {label: model_info(m).backend for label, m in loaded.items()},
            "weights": {label: model_info(m).weights for label, m in loaded.items()},
            "shipped_statistics": shipped_only,
        },
    )
