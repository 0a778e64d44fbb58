"""Compare models that differ in their positional scheme on the same sequences (claims C1-C3).

Every model runs on the same token windows (they must share a tokenizer), so every statistic is
paired by sequence: across models (e.g. no positions minus learned) and across positional
ablations of one model (e.g. zeroed minus intact). Confidence intervals are percentile bootstraps
over sequences (:func:`homoglens.results.paired_bootstrap`).

Per-sequence statistics (``STATISTICS``), on the unablated model unless stated:

* ``loss``: mean next-token cross-entropy (nats/token);
* ``mean_pairwise_last``: mean pairwise cosine at the last layer entry (raw);
* ``adjusted_last``: the same minus the anisotropy baseline of that layer (cross-sequence mean
  cosine, Ethayarajh 2019), treated as fixed: it averages over all cross-sequence pairs;
* ``depth_slope`` / ``adjusted_depth_slope``: least-squares slope of mean pairwise cosine over the
  layer entries (cosine per layer; adjusted subtracts the baseline's slope);
* ``first_token_excess``, ``first_excess``, ``last_excess``: at the last layer entry, mean
  ``to_others`` of position 0, of positions 1..edge_k and of the last edge_k positions, minus the
  mean over the middle positions (the rest);
* ``sink_rate``: percentage of (layer, head) whose Gu et al. importance on key 0 exceeds eps;
* ``sink_importance_top``: importance on key 0 of the head with the highest mean importance (for
  scale: uniform causal attention over T = 128 tokens gives H_128 / 128 = 0.042).

References:
    Yusupov et al. 2025, "Token Homogenization under Positional Bias", arXiv 2508.17126 (claims
    C1-C3; only the abstract is available, the metrics are homoglens' own).
    Ethayarajh 2019, "How Contextual are Contextualized Word Representations?" (anisotropy).
    Gu et al. 2024, "When Attention Sink Emerges in Language Models", arXiv 2410.10781.
    Kazemnejad et al. 2023, arXiv 2305.19466 (models without positional encodings still infer
    position from the causal mask).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from homoglens._checks import as_float, as_int
from homoglens.architectures import check_model
from homoglens.data import TokenBatch, corpus_windows, to_token_batch
from homoglens.errors import IncompatibleResultsError, InvalidInputError
from homoglens.models import SHIPPED_MODELS, load_model, model_info, shipped_model_folder
from homoglens.results import (
    PositionAblationStudy,
    _read_saved,
    paired_bootstrap,
    prepare_folder,
)
from homoglens.sinks import SinkScores, _check_key_eps, _sink_pass
from homoglens.studies import position_ablation_study
from homoglens.types import Backend, HookedModel

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["STATISTICS", "ModelComparison", "compare_models"]

STATISTICS: tuple[str, ...] = (
    "loss",
    "mean_pairwise_last",
    "adjusted_last",
    "depth_slope",
    "adjusted_depth_slope",
    "first_token_excess",
    "first_excess",
    "last_excess",
    "sink_rate",
    "sink_importance_top",
)
"""Per-sequence statistics of :class:`ModelComparison` (see the module docstring)."""

_ABLATION_STATISTICS = STATISTICS[:-2]  # sinks are measured on the intact model only


def _slope(values: torch.Tensor) -> torch.Tensor:
    """Least-squares slope over the last axis (unit spacing)."""
    x = torch.arange(values.shape[-1], dtype=torch.float64)
    x = x - x.mean()
    return (values.double() * x).sum(-1) / (x * x).sum()


@dataclass(frozen=True, eq=False)
class ModelComparison:
    """Several models measured on the same sequences, paired by sequence.

    Attributes:
        labels: Model labels, in the order given.
        studies: ``{label: PositionAblationStudy}``: loss, homogenization per layer and position,
            per sequence, for the intact model (``"none"``) and each positional ablation.
        sinks: ``{label: SinkScores}`` on key 0 (intact model).
        sink_importance: ``{label: [seq layer head]}`` Gu et al. importance alpha on key 0 of
            every sequence, in [0, 1].
        heldout: ``{label: {...}}`` what ``training.json`` records (held-out loss over the whole
            held-out novel, unigram entropy, variant); empty for models without one.
        no_positions: Label of the model trained without positional information, or ``None``.
        edge_k: Positions per edge in the edge statistics.
        eps: Importance threshold of the sink rate.
        n_boot: Bootstrap resamples.
        ci: Interval coverage, in (0, 1).
        seed: Bootstrap seed.
        settings: How the comparison was run (data, modes, backend).

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (claims C1-C3).
    """

    labels: tuple[str, ...]
    studies: dict[str, PositionAblationStudy]
    sinks: dict[str, SinkScores]
    sink_importance: dict[str, Float[torch.Tensor, "seq layer head_index"]]
    heldout: dict[str, dict[str, Any]] = field(default_factory=dict)
    no_positions: str | None = None
    edge_k: int = 8
    eps: float = 0.3
    n_boot: int = 1000
    ci: float = 0.95
    seed: int = 0
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.labels) < 1 or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels {self.labels} must be unique and at least one")
        for name in ("studies", "sinks", "sink_importance"):
            if set(getattr(self, name)) != set(self.labels):
                raise ValueError(
                    f"{name} has {sorted(getattr(self, name))}, expected {self.labels}"
                )
        n_seq = {int(s.loss.shape[1]) for s in self.studies.values()}
        n_seq |= {int(v.shape[0]) for v in self.sink_importance.values()}
        if len(n_seq) != 1:
            raise ValueError(f"models hold different numbers of sequences {sorted(n_seq)}")
        if self.no_positions is not None and self.no_positions not in self.labels:
            raise ValueError(f"no_positions={self.no_positions!r} is not one of {self.labels}")
        if not 0 < float(self.ci) < 1 or int(self.n_boot) < 1 or int(self.edge_k) < 1:
            raise IncompatibleResultsError(
                f"ci={self.ci!r} must lie in (0, 1), n_boot={self.n_boot!r} and "
                f"edge_k={self.edge_k!r} be >= 1"
            )

    @property
    def n_sequences(self) -> int:
        """Number of sequences every model ran on."""
        return int(next(iter(self.studies.values())).loss.shape[1])

    def _check_label(self, label: str) -> None:
        if label not in self.labels:
            raise InvalidInputError(f"model {label!r} not in this comparison; it has {self.labels}")

    # ------------------------------------------------------------------ per sequence
    def per_sequence(self, label: str, mode: str = "none") -> dict[str, torch.Tensor]:
        """Every statistic of :data:`STATISTICS` for each sequence of one model and mode.

        Args:
            label: A model label.
            mode: ``"none"`` (intact) or a positional ablation the study ran (no
                ``sink_rate`` then).

        Returns:
            ``{statistic: [seq]}`` float64 tensors (cosines; loss in nats/token; sink_rate
            in percent; importance in [0, 1]).

        Raises:
            InvalidInputError: unknown label or mode.
        """
        self._check_label(label)
        study = self.studies[label]
        m = study._index(mode)
        profile = study.profiles[mode]
        pairwise = study.mean_pairwise[m].double()  # [seq layer]
        baseline = profile.baseline.double()  # [layer]
        others = study.to_others[m, :, -1].double()  # [seq pos], last layer entry, NaN-padded
        k = int(self.edge_k)
        lengths = (~others.isnan()).sum(1)  # each sequence's own length (positions 0..T-1)
        if int(lengths.min()) <= 2 * k + 1:
            raise InvalidInputError(
                f"sequences of {int(lengths.min())} tokens are too short for edge_k={k}"
            )
        pos = torch.arange(others.shape[1])[None, :]
        filled = others.nan_to_num(0.0)
        middle_w = ((pos > k) & (pos < lengths[:, None] - k)).double()
        last_w = ((pos >= lengths[:, None] - k) & (pos < lengths[:, None])).double()
        middle = (filled * middle_w).sum(1) / middle_w.sum(1)
        out = {
            "loss": study.loss[m].double(),
            "mean_pairwise_last": pairwise[:, -1],
            "adjusted_last": pairwise[:, -1] - baseline[-1],
            "depth_slope": _slope(pairwise),
            "adjusted_depth_slope": _slope(pairwise) - _slope(baseline),
            "first_token_excess": others[:, 0] - middle,
            "first_excess": others[:, 1 : k + 1].mean(1) - middle,
            "last_excess": (filled * last_w).sum(1) / k - middle,
        }
        if mode == "none":
            alpha = self.sink_importance[label].double()
            out["sink_rate"] = (alpha > self.eps).double().mean((1, 2)) * 100
            flat = alpha.flatten(1)
            out["sink_importance_top"] = flat[:, int(flat.mean(0).argmax())]
        return out

    def _boot(self, values: torch.Tensor) -> tuple[float, float, float]:
        mean, low, high = paired_bootstrap(values, n_boot=self.n_boot, ci=self.ci, seed=self.seed)
        return float(mean), float(low), float(high)

    # ------------------------------------------------------------------ tables
    def summary(self) -> pd.DataFrame:
        """One row per (model, statistic): mean over sequences with a bootstrap CI.

        Returns:
            DataFrame with columns ``model, statistic, value, ci_low, ci_high``.
        """
        import pandas as pd

        rows = []
        for label in self.labels:
            for stat, values in self.per_sequence(label).items():
                rows.append((label, stat, *self._boot(values)))
        return pd.DataFrame(rows, columns=["model", "statistic", "value", "ci_low", "ci_high"])

    def differences(self, reference: str | None = None) -> pd.DataFrame:
        """Paired differences between models (model minus ``reference``) on the same sequences.

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
                rows.append((label, reference, stat, *self._boot(values - ref[stat])))
        return pd.DataFrame(
            rows, columns=["model", "reference", "statistic", "diff", "ci_low", "ci_high"]
        )

    def ablation_effects(self) -> pd.DataFrame:
        """Paired effect of each positional ablation within each model (ablated minus intact).

        Returns:
            DataFrame with columns ``model, mode, statistic, diff, ci_low, ci_high``.
        """
        import pandas as pd

        rows = []
        for label in self.labels:
            study = self.studies[label]
            intact = self.per_sequence(label)
            for mode in study.modes[1:]:
                ablated = self.per_sequence(label, mode)
                for stat in _ABLATION_STATISTICS:
                    rows.append((label, mode, stat, *self._boot(ablated[stat] - intact[stat])))
        return pd.DataFrame(
            rows, columns=["model", "mode", "statistic", "diff", "ci_low", "ci_high"]
        )

    def layer_table(self) -> pd.DataFrame:
        """Per model and layer entry (intact model): mean pairwise cosine (raw, with CI), the
        anisotropy baseline and the adjusted value (raw - baseline, with CI).

        Returns:
            DataFrame with columns ``model, layer, mean_pairwise, ci_low, ci_high, baseline,
            adjusted, adjusted_ci_low, adjusted_ci_high``.
        """
        import pandas as pd

        frames = []
        for label in self.labels:
            table = self.studies[label].layer_table()
            table = table[table["mode"] == "none"].drop(columns=["mode"])
            base = self.studies[label].profiles["none"].baseline.double().numpy()
            frames.append(
                pd.DataFrame(
                    {
                        "model": label,
                        "layer": table["layer"].to_numpy(),
                        "mean_pairwise": table["mean_pairwise"].to_numpy(),
                        "ci_low": table["ci_low"].to_numpy(),
                        "ci_high": table["ci_high"].to_numpy(),
                        "baseline": base,
                        "adjusted": table["mean_pairwise"].to_numpy() - base,
                        "adjusted_ci_low": table["ci_low"].to_numpy() - base,
                        "adjusted_ci_high": table["ci_high"].to_numpy() - base,
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)

    def claims(self) -> pd.DataFrame:
        """Test claims C1-C3 of Yusupov et al. 2025 on these models, each with a CI.

        A row's ``verdict`` is ``"holds"`` when the whole CI lies on the side the claim predicts,
        ``"fails"`` when it lies wholly on the other side, else ``"inconclusive"``.

        * C1: adjusted homogenization above 0 at every layer entry (the row reports the layer
          with the lowest CI bound), and growing with depth (``adjusted_depth_slope`` > 0).
        * C2: edges above the middle at the last layer (``first_excess``, ``last_excess`` > 0);
          positional bias amplifies this: the edge excess of each positional model minus that
          of the ``no_positions`` model > 0, and zeroing positions lowers it (< 0).
        * C3: removing positions lowers homogenization (``no_positions`` minus positional
          model, and zeroing positions: ``adjusted_last`` < 0) but costs next-token loss (> 0).

        Returns:
            DataFrame with columns ``claim, test, model, value, ci_low, ci_high, predicted,
            verdict``.
        """
        import pandas as pd

        rows: list[tuple[Any, ...]] = []

        def add(claim: str, test: str, model: str, stats: tuple[float, ...], sign: int) -> None:
            value, low, high = stats
            if (low > 0 and sign > 0) or (high < 0 and sign < 0):
                verdict = "holds"
            elif (high < 0 and sign > 0) or (low > 0 and sign < 0):
                verdict = "fails"
            else:
                verdict = "inconclusive"
            rows.append((claim, test, model, value, low, high, ">0" if sign > 0 else "<0", verdict))

        layers = self.layer_table()
        for label in self.labels:
            own = layers[layers["model"] == label]
            worst = own.loc[own["adjusted_ci_low"].idxmin()]
            add(
                "C1",
                f"adjusted mean pairwise cosine at every layer (lowest: layer {worst['layer']})",
                label,
                (worst["adjusted"], worst["adjusted_ci_low"], worst["adjusted_ci_high"]),
                +1,
            )
            seq = self.per_sequence(label)
            add("C1", "adjusted_depth_slope (cosine per layer)", label,
                self._boot(seq["adjusted_depth_slope"]), +1)  # fmt: skip
            for stat in ("first_excess", "last_excess"):
                add("C2", f"{stat} at the last layer", label, self._boot(seq[stat]), +1)
        positional = [label for label in self.labels if label != self.no_positions]
        if self.no_positions is not None:
            nope = self.per_sequence(self.no_positions)
            for label in positional:
                seq = self.per_sequence(label)
                pair = f"{label} - {self.no_positions}"
                for stat in ("first_excess", "last_excess"):
                    add("C2", f"{stat}: positional minus no positions", pair,
                        self._boot(seq[stat] - nope[stat]), +1)  # fmt: skip
                pair = f"{self.no_positions} - {label}"
                add("C3", "adjusted_last: no positions minus positional", pair,
                    self._boot(nope["adjusted_last"] - seq["adjusted_last"]), -1)  # fmt: skip
                add("C3", "loss: no positions minus positional", pair,
                    self._boot(nope["loss"] - seq["loss"]), +1)  # fmt: skip
        for label in positional:
            if "zero" not in self.studies[label].modes:
                continue
            intact, zeroed = self.per_sequence(label), self.per_sequence(label, "zero")
            for stat, claim, sign in (
                ("first_excess", "C2", -1),
                ("last_excess", "C2", -1),
                ("adjusted_last", "C3", -1),
                ("loss", "C3", +1),
            ):
                add(claim, f"{stat}: positions zeroed minus intact", label,
                    self._boot(zeroed[stat] - intact[stat]), sign)  # fmt: skip
        return pd.DataFrame(
            rows,
            columns=[
                "claim",
                "test",
                "model",
                "value",
                "ci_low",
                "ci_high",
                "predicted",
                "verdict",
            ],
        )

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: :meth:`summary` (one row per model and statistic)."""
        return self.summary()

    def plot(self) -> Figure:
        """Left: adjusted homogenization by layer per model (CI bands); middle: ``to_others``
        by position at the last layer; right: held-out loss per model (CI)."""
        import numpy as np
        from matplotlib.figure import Figure

        fig = Figure(figsize=(14, 4.2), layout="constrained")
        left, middle, right = fig.subplots(1, 3, width_ratios=[1.2, 1.4, 0.8])
        layers = self.layer_table()
        for label in self.labels:
            rows = layers[layers["model"] == label]
            left.plot(rows["layer"], rows["adjusted"], "o-", ms=3, label=label)
            left.fill_between(
                rows["layer"], rows["adjusted_ci_low"], rows["adjusted_ci_high"], alpha=0.2
            )
            others = self.studies[label].to_others[0, :, -1]
            middle.plot(others.nanmean(0).numpy(), lw=1, label=label)
        left.axhline(0.0, color="grey", lw=0.5)
        left.set_xlabel("layer (0 = embeddings, l = output of block l-1)")
        left.set_ylabel("adjusted mean pairwise cosine")
        left.set_title("Homogenization by layer")
        left.legend(fontsize="small")
        middle.set_xlabel("position")
        middle.set_ylabel("to_others (mean over sequences)")
        middle.set_title("Per position, last layer")
        summary = self.summary()
        loss = summary[summary["statistic"] == "loss"]
        x = np.arange(len(loss))
        err = np.vstack([loss["value"] - loss["ci_low"], loss["ci_high"] - loss["value"]])
        right.bar(x, loss["value"], yerr=err, capsize=4, color=[f"C{i}" for i in x])
        right.set_xticks(x, list(loss["model"]), rotation=20)
        right.set_ylabel("next-token loss (nats/token)")
        right.set_title("Loss")
        fig.suptitle(f"Models compared on {self.n_sequences} sequences")
        return fig

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Save as ``comparison.json`` + ``comparison.safetensors`` (sink importance) + one
        study and one sink-score folder per model; never pickle."""
        from safetensors.torch import save_file

        folder = prepare_folder(path)
        for i, label in enumerate(self.labels):
            self.studies[label].save(folder / f"model_{i}" / "study")
            self.sinks[label].save(folder / f"model_{i}" / "sinks")
        save_file(
            {
                f"model_{i}": self.sink_importance[label].contiguous()
                for i, label in enumerate(self.labels)
            },  # fmt: skip
            str(folder / "comparison.safetensors"),
        )
        meta = {
            "format": "homoglens.ModelComparison/1",
            "labels": list(self.labels),
            "heldout": self.heldout,
            "no_positions": self.no_positions,
            "edge_k": self.edge_k,
            "eps": self.eps,
            "n_boot": self.n_boot,
            "ci": self.ci,
            "seed": self.seed,
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
        if not isinstance(meta, dict) or meta.get("format") != "homoglens.ModelComparison/1":
            raise IncompatibleResultsError(f"{folder} does not hold a ModelComparison")
        keys = {"format", "labels", "heldout", "no_positions", "edge_k", "eps", "n_boot", "ci"}
        keys |= {"seed", "settings"}
        if set(meta) != keys:
            raise IncompatibleResultsError(
                f"{folder}/comparison.json has keys {sorted(meta)}, expected {sorted(keys)}"
            )
        try:
            labels = tuple(meta["labels"])
            return cls(
                labels=labels,
                studies={
                    label: PositionAblationStudy.load(folder / f"model_{i}" / "study")
                    for i, label in enumerate(labels)
                },
                sinks={
                    label: SinkScores.load(folder / f"model_{i}" / "sinks")
                    for i, label in enumerate(labels)
                },
                sink_importance={label: tensors[f"model_{i}"] for i, label in enumerate(labels)},
                heldout=meta["heldout"],
                no_positions=meta["no_positions"],
                edge_k=meta["edge_k"],
                eps=meta["eps"],
                n_boot=meta["n_boot"],
                ci=meta["ci"],
                seed=meta["seed"],
                settings=meta["settings"],
            )
        except (KeyError, ValueError, TypeError, IndexError) as err:
            raise IncompatibleResultsError(
                f"{folder} does not hold a consistent comparison: {err!r}"
            ) from None

    def __repr__(self) -> str:
        return (
            f"ModelComparison(models={list(self.labels)}, n_sequences={self.n_sequences}, "
            f"no_positions={self.no_positions!r}, edge_k={self.edge_k})"
        )


def _training_record(name: str) -> dict[str, Any]:
    """What ``training.json`` beside a shipped or local model records (empty if none)."""
    folder = shipped_model_folder(name) if name in SHIPPED_MODELS else Path(name)
    path = folder / "training.json"
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    keep = ("heldout_loss", "heldout_unigram_entropy", "heldout", "heldout_tokens")
    out = {k: record[k] for k in keep if k in record}
    out["variant"] = record.get("config", {}).get("variant")
    return out


def compare_models(
    models: Mapping[str, HookedModel | str] | Sequence[str] = SHIPPED_MODELS,
    data: TokenBatch | str | os.PathLike[str] | None = None,
    *,
    n_seq: int | None = None,
    seq_len: int | None = None,
    modes: Sequence[str] = ("none", "zero", "permute"),
    no_positions: str | None = "auto",
    backend: Backend = "auto",
    edge_k: int = 8,
    eps: float = 0.3,
    batch_size: int = 16,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    progress: bool = True,
) -> ModelComparison:
    """Measure several models side by side on the same sequences, paired by sequence.

    For each model: a :func:`~homoglens.studies.position_ablation_study` (loss and
    homogenization per layer and position, intact and under each ablation in ``modes``) and
    attention-sink scores on key 0; per-sequence statistics then give paired differences between
    models and between ablations, with bootstrap CIs, and :meth:`ModelComparison.claims` tests
    claims C1-C3.

    Args:
        models: Model names (``load_model`` names or folders; label = name) or
            ``{label: model or name}``. Default: the three shipped tiny models, which differ
            only in their positional scheme.
        data: ``None`` (default): the novel held out from the tiny models' training, tokenized
            as in training (:func:`homoglens.training.heldout_windows`); a corpus name or text
            file, cut into ``n_seq`` windows of ``seq_len`` tokens (no BOS,
            :func:`~homoglens.data.corpus_windows`); or a :class:`TokenBatch`.
        n_seq: Windows to take (default: all windows of the held-out novel, 1379 of 128
            tokens; 64 for a corpus).
        seq_len: Tokens per window (default: the smallest ``n_ctx`` of the models).
        modes: Positional ablations (``"none"`` is always run); each must suit every model.
        no_positions: Label of the model trained without positions (``"auto"``: the one whose
            ``training.json`` says variant ``none``; ``None``: no such model).
        backend: For models given by name.
        edge_k: Positions per edge (every window needs more than ``2 * edge_k + 1`` tokens).
        eps: Sink importance threshold (Gu et al.: 0.3).
        batch_size: Sequences per forward pass.
        n_boot: Bootstrap resamples.
        ci: Interval coverage in (0, 1).
        seed: Seed of the ``"permute"`` ablation and of the bootstrap.
        progress: Show progress bars.

    Returns:
        A :class:`ModelComparison`.

    Raises:
        InvalidInputError: no models, duplicate labels, models with different tokenizers (they
            would not read the same token ids), an unknown ``no_positions`` label, bad options.

    References:
        Yusupov et al. 2025, arXiv 2508.17126; Gu et al. 2024, arXiv 2410.10781.

    Examples:
        >>> from homoglens import compare_models
        >>> result = compare_models(n_seq=8, n_boot=50, progress=False)  # doctest: +SKIP
        >>> result.claims()[["claim", "model", "verdict"]]  # doctest: +SKIP
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
    n_seq = None if n_seq is None else as_int("n_seq", n_seq, low=1)
    seq_len = None if seq_len is None else as_int("seq_len", seq_len, low=2 * edge_k + 2)
    edge_k = as_int("edge_k", edge_k, low=1)
    batch_size = as_int("batch_size", batch_size, low=1)
    n_boot = as_int("n_boot", n_boot, low=1)
    ci = as_float("ci", ci, low=0.0, high=1.0)
    seed = as_int("seed", seed, low=0, high=2**63 - 1)
    loaded = {
        label: load_model(m, backend=backend) if isinstance(m, str | os.PathLike) else m
        for label, m in named.items()
    }
    _, eps = _check_key_eps(0, eps, min(int(m.cfg.n_ctx) for m in loaded.values()))
    heldout = {label: _training_record(model_info(m).name) for label, m in loaded.items()}
    if no_positions == "auto":
        nope = [label for label, rec in heldout.items() if rec.get("variant") == "none"]
        no_positions = nope[0] if len(nope) == 1 else None
    elif no_positions is not None and no_positions not in loaded:
        raise InvalidInputError(
            f"no_positions={no_positions!r} is not a model label; labels: {list(loaded)}"
        )
    first_label, first = next(iter(loaded.items()))
    vocab = first.tokenizer.get_vocab() if first.tokenizer is not None else None
    for label, m in loaded.items():
        if m.tokenizer is None or m.tokenizer.get_vocab() != vocab:
            raise InvalidInputError(
                f"model {label!r} has no tokenizer or another one than {first_label!r}; compare "
                "models that share a tokenizer, so that every model reads the same token ids"
            )
    width = seq_len or min(int(m.cfg.n_ctx) for m in loaded.values())
    if isinstance(data, TokenBatch):
        batch = data
    elif data is None:
        from homoglens.training import heldout_windows

        batch = heldout_windows(first.tokenizer, n_seq=n_seq, seq_len=width)
    else:
        batch = corpus_windows(first, data, n_seq=n_seq or 64, seq_len=width, bos="never")
    if int(batch.lengths.min()) <= 2 * edge_k + 1:
        raise InvalidInputError(
            f"sequences of {int(batch.lengths.min())} tokens are too short for edge_k={edge_k}; "
            f"use longer windows or a smaller edge_k"
        )
    studies, sinks, importance = {}, {}, {}
    for label, m in loaded.items():
        batch_m = to_token_batch(m, batch)
        studies[label] = position_ablation_study(
            m, batch_m, modes=modes, seed=seed, batch_size=batch_size, n_boot=n_boot, ci=ci,
            progress=progress,
        )  # fmt: skip
        sinks[label], importance[label] = _sink_pass(
            m, batch_m, 0, eps, batch_size, None, "auto", progress
        )
    return ModelComparison(
        labels=tuple(loaded),
        studies=studies,
        sinks=sinks,
        sink_importance=importance,
        heldout=heldout,
        no_positions=no_positions,
        edge_k=edge_k,
        eps=eps,
        n_boot=n_boot,
        ci=ci,
        seed=seed,
        settings={
            "data": batch.description,
            "modes": list(studies[next(iter(loaded))].modes),
            "backends": {label: model_info(m).backend for label, m in loaded.items()},
            "weights": {label: model_info(m).weights for label, m in loaded.items()},
        },
    )
