"""``PositionAblationStudy``: homogenization and loss under each positional ablation,
paired over the same sequences, with paired bootstrap intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float

from homoglens.core.errors import IncompatibleResultsError, InvalidInputError
from homoglens.core.types import POSITION_ABLATIONS
from homoglens.profile.result import HomogenizationProfile
from homoglens.results.base import FolderSaved, Plotted, checked_result, entry_index, keyword_repr
from homoglens.results.storage import folder_path, read_saved, write_pair
from homoglens.results.validation import (
    COSINE,
    COSINE_OR_NAN,
    FINITE_OR_NAN,
    NON_NEGATIVE,
    Bounds,
    FieldError,
)

if TYPE_CHECKING:
    import pandas as pd


def paired_bootstrap(
    values: Float[torch.Tensor, "seq ..."],
    *,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean over sequences with a bootstrap-t confidence interval.

    Sequences are resampled with replacement ``n_boot`` times; NaN entries (positions a
    sequence does not have) are left out of each mean. The interval is ``mean +- t * se``:
    ``se`` is the bootstrap standard deviation of the mean scaled by ``sqrt(n / (n - 1))``
    (the bootstrap's shrinkage of a variance undone) and ``t`` Student's quantile on ``n - 1``
    degrees of freedom, ``n`` the sequences holding a value. (A percentile interval of the
    resampled means claimed [min, max] of 2 sequences as "95 %": it covered 52 %.)

    Args:
        values: ``[seq ...]`` per-sequence values (e.g. a paired difference ablated - normal).
        n_boot: Bootstrap resamples.
        ci: Coverage of the interval, in (0, 1).
        seed: Seed of the resampling.

    Returns:
        ``(mean, low, high)``, each of shape ``values.shape[1:]``; ``low`` and ``high`` are NaN
        where fewer than :data:`homoglens.core.stats.MIN_WINDOWS` sequences hold a value, or where
        the values show no spread but are not all exactly 0 (identical or duplicated
        sequences: no interval can be read from them), with a warning; values that are all
        exactly 0 (a paired difference of identical runs) get ``[0, 0]``.
    """
    import warnings

    from scipy import stats as scipy_stats

    from homoglens.core.stats import MIN_WINDOWS

    gen = torch.Generator().manual_seed(seed)
    x = values.double()
    n_seq = x.shape[0]
    mean = x.nanmean(0)
    boots = []
    for chunk in range(0, n_boot, 100):
        idx = torch.randint(n_seq, (min(100, n_boot - chunk), n_seq), generator=gen, device="cpu")
        boots.append(x[idx].nanmean(1))
    dist = torch.cat(boots)
    n = (~torch.isnan(x)).sum(0).double()
    centred = dist - dist.nanmean(0)
    spread = (centred.pow(2).nansum(0) / ((~torch.isnan(dist)).sum(0) - 1).clamp_min(1)).sqrt()
    se = spread * (n / (n - 1).clamp_min(1)).sqrt()
    df = (n - 1).clamp_min(1).numpy()
    q = torch.as_tensor(scipy_stats.t.ppf(1 - (1 - ci) / 2, df), dtype=torch.float64)
    low, high = mean - q * se, mean + q * se
    zeros = (x.nan_to_num(0.0) == 0).all(0)
    few = n < MIN_WINDOWS
    flat = (se == 0) & ~zeros & ~few
    if bool(few.any()) and int(n.max()) > 1:
        warnings.warn(
            f"{int(n[few].min())} sequence(s) are too few for an interval (at least "
            f"{MIN_WINDOWS}): ci_low / ci_high are NaN; measure more sequences",
            stacklevel=2,
        )
    if bool(flat.any()):
        warnings.warn(
            "the sequences show no spread (identical values: duplicated sequences?): no "
            "interval; ci_low / ci_high are NaN",
            stacklevel=2,
        )
    bad = few | flat
    low, high = low.masked_fill(bad, math.nan), high.masked_fill(bad, math.nan)
    return mean, low.where(~zeros | bad, 0.0), high.where(~zeros | bad, 0.0)


@dataclass(frozen=True, eq=False)
class PositionAblationStudy(FolderSaved, Plotted):
    """Homogenization and next-token loss under several positional ablations, paired by
    sequence (every mode ran on the same sequences).

    ``plot()`` draws the mean pairwise cosine by layer for each mode (with CI bands), and the
    loss per mode.

    Attributes:
        modes: Ablation modes run; ``"none"`` (the unablated model) first, the reference.
        profiles: ``{mode: HomogenizationProfile}``.
        loss: ``[mode batch]`` mean next-token cross-entropy per sequence (nats/token).
        mean_pairwise: ``[mode batch layer]`` per-sequence mean pairwise cosine.
        to_others: ``[mode batch layer pos]`` per-sequence to_others (NaN where absent).
        icl: ``[mode batch]`` in-context-learning score per sequence: mean loss of its last
            eighth minus its second eighth (nats; negative: context helps; NaN under 16 tokens).
        induction_loss: ``[mode rep]`` mean loss on the second half of repeated random-token
            sequences (nats; low when induction copies from the first half).
        settings: How the modes were run (seed, shift, positions, layers).
        n_boot: Bootstrap resamples for confidence intervals.
        ci: Interval coverage.
        seed: Bootstrap seed.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (claim C3: removing positional features lowers
        homogenization but costs the model on context).
    """

    _figure: ClassVar[str] = "ablation.figure.study_figure"
    _own: ClassVar[tuple[str, ...]] = ("study.json", "study.safetensors", "profile_*")
    _manifest: ClassVar[str] = "study.json"

    _choices: ClassVar[dict[str, tuple[str, ...]]] = {"modes": POSITION_ABLATIONS}
    _ranges: ClassVar[dict[str, tuple[float, float]]] = {"ci": (0.0, 1.0)}
    _bounds: ClassVar[dict[str, Bounds]] = {
        "loss": NON_NEGATIVE,
        "mean_pairwise": COSINE,
        "to_others": COSINE_OR_NAN,  # NaN where a sequence has no such position
        "icl": FINITE_OR_NAN,  # NaN under 16 tokens (the same sequences in every mode)
        "induction_loss": Bounds(0.0, nan=True),  # NaN: a mode not measured (all of its row)
        "n_boot": Bounds(1.0),
    }

    modes: tuple[str, ...]
    profiles: dict[str, HomogenizationProfile]
    loss: Float[torch.Tensor, "mode batch"]
    mean_pairwise: Float[torch.Tensor, "mode batch layer"]
    to_others: Float[torch.Tensor, "mode batch layer pos"]
    icl: Float[torch.Tensor, "mode batch"] | None = None
    induction_loss: Float[torch.Tensor, "mode rep"] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    n_boot: int = 1000
    ci: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < float(self.ci) < 1 or int(self.n_boot) < 1:
            raise IncompatibleResultsError(
                f"ci={self.ci!r} must lie in (0, 1) and n_boot={self.n_boot!r} be >= 1"
            )
        n_mode = len(self.modes)
        if not self.modes or self.modes[0] != "none" or set(self.profiles) != set(self.modes):
            raise ValueError(
                f"modes {self.modes} must start with 'none' and match profiles "
                f"{sorted(self.profiles)}"
            )
        n_seq = int(self.loss.shape[1]) if self.loss.ndim == 2 else -1
        for name, want in (
            ("loss", (n_mode, n_seq)),
            ("mean_pairwise", (n_mode, n_seq, len(self.layers))),
            ("to_others", (n_mode, n_seq, len(self.layers), int(self.to_others.shape[-1]))),
        ):
            got = tuple(getattr(self, name).shape)
            if got != want:
                raise ValueError(f"{name} has shape {got}, expected {want}")
        if self.icl is not None and tuple(self.icl.shape) != (n_mode, n_seq):
            raise ValueError(f"icl has shape {tuple(self.icl.shape)}, expected {(n_mode, n_seq)}")
        if self.induction_loss is not None and (
            self.induction_loss.ndim != 2 or self.induction_loss.shape[0] != n_mode
        ):
            raise ValueError(f"induction_loss must be [{n_mode} rep]")

    def _check_values(self) -> None:
        """Run on load: every mode's profile holds the same layers and the study's sequences,
        and the per-sequence values are those its sums were made of (the sequences with a
        value at each position are the profile's ``count``; their means are the profile's
        ``mean_pairwise`` and ``to_others``); ``icl`` is NaN for the same sequences in every
        mode measured, ``induction_loss`` for a whole mode or not at all."""
        n_seq = int(self.loss.shape[1])
        if self.icl is not None:  # NaN: a sequence under 16 tokens, whatever the mode
            nan = torch.isnan(self.icl)
            rows = nan[~nan.all(1)]
            if len(rows) and bool((rows != rows[:1]).any()):
                raise FieldError(
                    "icl", "icl is NaN for a sequence in some modes only (NaN: under 16 tokens)"
                )
        if self.induction_loss is not None:  # NaN: a whole mode not measured
            nan = torch.isnan(self.induction_loss)
            if not torch.equal(nan.all(1), nan.any(1)):
                raise FieldError(
                    "induction_loss",
                    "induction_loss is NaN for some repeats of a mode only (NaN: not measured)",
                )
        present = ~torch.isnan(self.to_others)  # [mode batch layer pos]
        for m, mode in enumerate(self.modes):
            prof = self.profiles[mode]
            if prof.layers != self.layers or prof.n_sequences != n_seq:
                raise FieldError(
                    "profiles",
                    f"profile_{mode} holds layers {list(prof.layers)} and {prof.n_sequences} "
                    f"sequences; the study {list(self.layers)} and {n_seq}",
                )
            n_pos = min(prof.n_pos, int(self.to_others.shape[-1]))
            seen = present[m].sum(0)  # [layer pos]
            if not bool((seen[:, :n_pos] == prof.count[None, :n_pos]).all()):
                raise FieldError(
                    "to_others",
                    f"to_others of mode {mode!r} has values for {seen[0].tolist()} sequences "
                    f"per position, but profile_{mode} counts {prof.count.tolist()}",
                )
            means = {
                "mean_pairwise": (self.mean_pairwise[m].double().mean(0), prof.mean_pairwise),
                "to_others": (
                    self.to_others[m, :, :, :n_pos].double().nanmean(0),
                    prof.to_others[:, :n_pos],
                ),
            }
            for name, (mine, theirs) in means.items():
                gap = (mine - theirs).abs().nan_to_num(0.0)
                if float(gap.max()) > 1e-4:
                    raise FieldError(
                        name,
                        f"{name} of mode {mode!r} averages to values {float(gap.max()):.3g} "
                        f"away from profile_{mode}'s: the study and its profiles do not fit",
                    )

    @property
    def layers(self) -> tuple[int, ...]:
        """Entries of the residual axis measured."""
        return self.profiles["none"].layers

    @property
    def is_massive(self) -> bool:
        """Whether this is a :func:`~homoglens.massive_ablation_study` (modes none / mean /
        zero on massive activations) rather than a positional ablation study."""
        return str(self.settings.get("intervention", "")).startswith("massive")

    def _index(self, mode: str) -> int:
        if mode not in self.modes:
            raise InvalidInputError(f"mode {mode!r} not in this study; it has {list(self.modes)}")
        return self.modes.index(mode)

    def _with_change(self, values: torch.Tensor, m: int) -> tuple[torch.Tensor, ...]:
        """Mode ``m`` of ``values`` (``[mode seq ...]``): mean, CI low, CI high, then the same
        for its paired difference to ``"none"`` (bootstrap over sequences)."""
        opts = {"n_boot": self.n_boot, "ci": self.ci, "seed": self.seed}
        return (
            *paired_bootstrap(values[m], **opts),
            *paired_bootstrap(values[m] - values[0], **opts),
        )

    def loss_table(self) -> pd.DataFrame:
        """Per mode: mean loss (nats/token) with CI, and the paired difference to ``"none"``."""
        import pandas as pd

        rows = []
        for m, mode in enumerate(self.modes):
            mean, lo, hi, d, dlo, dhi = self._with_change(self.loss, m)
            rows.append(
                {
                    "mode": mode,
                    "loss": mean.item(),
                    "ci_low": lo.item(),
                    "ci_high": hi.item(),
                    "diff_vs_none": d.item(),
                    "diff_ci_low": dlo.item(),
                    "diff_ci_high": dhi.item(),
                }
            )
        return pd.DataFrame(rows)

    def context_table(self) -> pd.DataFrame:
        """Per mode: the context-task costs (C3c) beside the mean loss: the in-context-learning
        score (``icl``, over windows) and the induction loss (over repeated sequences), each with
        its bootstrap interval and paired difference to ``"none"`` (NaN when not measured)."""
        import pandas as pd

        rows = []
        for m, mode in enumerate(self.modes):
            row: dict[str, Any] = {"mode": mode}
            for name, values in (("icl", self.icl), ("induction_loss", self.induction_loss)):
                if values is None or bool(torch.isnan(values[m]).all()):
                    row.update({name: math.nan, f"{name}_ci_low": math.nan,
                                f"{name}_ci_high": math.nan, f"{name}_diff_vs_none": math.nan,
                                f"{name}_diff_ci_low": math.nan,
                                f"{name}_diff_ci_high": math.nan})  # fmt: skip
                    continue
                mean, lo, hi, d, dlo, dhi = self._with_change(values, m)
                row.update({name: mean.item(), f"{name}_ci_low": lo.item(),
                            f"{name}_ci_high": hi.item(), f"{name}_diff_vs_none": d.item(),
                            f"{name}_diff_ci_low": dlo.item(),
                            f"{name}_diff_ci_high": dhi.item()})  # fmt: skip
            rows.append(row)
        return pd.DataFrame(rows)

    def layer_table(self) -> pd.DataFrame:
        """Per mode and layer: mean pairwise cosine with CI, the paired difference to
        ``"none"`` with CI, and the anisotropy-adjusted value from the profile."""
        import pandas as pd

        frames = []
        for m, mode in enumerate(self.modes):
            mean, lo, hi, d, dlo, dhi = self._with_change(self.mean_pairwise, m)
            frames.append(
                pd.DataFrame(
                    {
                        "mode": mode,
                        "layer": list(self.layers),
                        "mean_pairwise": mean.numpy(),
                        "ci_low": lo.numpy(),
                        "ci_high": hi.numpy(),
                        "adjusted": self.profiles[mode].adjusted.numpy(),
                        "diff_vs_none": d.numpy(),
                        "diff_ci_low": dlo.numpy(),
                        "diff_ci_high": dhi.numpy(),
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)

    def position_table(self, layer: int) -> pd.DataFrame:
        """Per mode and position at one layer: to_others and its paired difference to
        ``"none"``, with CIs.

        Args:
            layer: An entry of ``self.layers``.
        """
        import pandas as pd

        li = entry_index(layer, self.layers, "this study")
        frames = []
        for m, mode in enumerate(self.modes):
            mean, lo, hi, d, dlo, dhi = self._with_change(self.to_others[:, :, li], m)
            frames.append(
                pd.DataFrame(
                    {
                        "mode": mode,
                        "layer": layer,
                        "pos": range(self.to_others.shape[-1]),
                        "to_others": mean.numpy(),
                        "ci_low": lo.numpy(),
                        "ci_high": hi.numpy(),
                        "diff_vs_none": d.numpy(),
                        "diff_ci_low": dlo.numpy(),
                        "diff_ci_high": dhi.numpy(),
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)

    def to_pandas(self) -> pd.DataFrame:
        """Tidy: one row per (mode, metric, layer); ``metric`` is ``mean_pairwise`` (per layer)
        or ``loss`` (``layer`` is ``<NA>``); columns ``value, ci_low, ci_high, diff_vs_none,
        diff_ci_low, diff_ci_high``."""
        import pandas as pd

        layers = self.layer_table().rename(columns={"mean_pairwise": "value"})
        layers.insert(1, "metric", "mean_pairwise")
        layers = layers.drop(columns=["adjusted"])
        loss = self.loss_table().rename(columns={"loss": "value"})
        loss.insert(1, "metric", "loss")
        loss.insert(2, "layer", pd.array([None] * len(loss), dtype="Int64"))
        layers["layer"] = layers["layer"].astype("Int64")
        return pd.concat([layers, loss], ignore_index=True)

    def save(self, path: str | Path) -> Path:
        """Save as ``study.safetensors`` + one profile folder per mode + ``study.json`` (last:
        the sha256 of the safetensors and of each profile's JSON), atomically: a save that
        fails or is interrupted leaves an older study in ``path`` loadable and unchanged, or
        refused on load, never a mix.

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created.
        """
        return self._save_folder(path)

    def _write_into(self, folder: Path) -> None:
        """Write the study's files into ``folder``."""
        tensors = {
            "loss": self.loss.contiguous(),
            "mean_pairwise": self.mean_pairwise.contiguous(),
            "to_others": self.to_others.contiguous(),
        }
        if self.icl is not None:
            tensors["icl"] = self.icl.contiguous()
        if self.induction_loss is not None:
            tensors["induction_loss"] = self.induction_loss.contiguous()
        parts = []
        for mode, prof in self.profiles.items():
            (folder / f"profile_{mode}").mkdir()
            prof._write_into(folder / f"profile_{mode}")
            parts.append(f"profile_{mode}/profile.json")
        meta = {
            "format": "homoglens.PositionAblationStudy/1",
            "modes": list(self.modes),
            "settings": self.settings,
            "n_boot": self.n_boot,
            "ci": self.ci,
            "seed": self.seed,
        }
        write_pair(folder, "study", tensors, meta, parts)

    @classmethod
    def load(cls, path: str | Path) -> PositionAblationStudy:
        """Load a study written by :meth:`save` (no pickle), with its values checked
        (:func:`~homoglens.results.validate_result`).

        Raises:
            ResultsNotFoundError: a file of the study is missing.
            IncompatibleResultsError: wrong format, keys, tensors or settings; values out of
                range (a loss < 0, cosines outside [-1, 1], ...), modes repeated or unknown,
                ``ci``/``n_boot``/``seed`` of the wrong type, per-sequence values that do not
                fit the profiles; a file that does not match the sha256 recorded in
                ``study.json`` (saved incompletely or edited).
        """
        folder = folder_path(path, "load")
        meta, tensors = read_saved(folder, "study", parts=_profile_parts)
        if not isinstance(meta, dict) or meta.get("format") != "homoglens.PositionAblationStudy/1":
            raise IncompatibleResultsError(f"{folder} does not hold a PositionAblationStudy")
        keys = {"format", "modes", "settings", "n_boot", "ci", "seed"}
        if set(meta) != keys:
            raise IncompatibleResultsError(
                f"{folder}/study.json has keys {sorted(meta)}, expected {sorted(keys)}"
            )
        required = {"loss", "mean_pairwise", "to_others"}
        if not required <= set(tensors) <= required | {"icl", "induction_loss"}:
            raise IncompatibleResultsError(f"{folder}/study.safetensors has {sorted(tensors)}")
        modes = meta["modes"]
        if (
            not isinstance(modes, list)
            or not all(isinstance(m, str) and m in POSITION_ABLATIONS for m in modes)
            or len(set(modes)) != len(modes)
        ):
            raise IncompatibleResultsError(
                f"{folder}/study.json has modes={modes!r}; expected distinct modes among "
                f"{list(POSITION_ABLATIONS)}: the file was edited, save the study again"
            )
        profiles = {m: HomogenizationProfile.load(folder / f"profile_{m}") for m in modes}
        kwargs = {
            "modes": tuple(modes),
            "profiles": profiles,
            **{k: meta[k] for k in ("settings", "n_boot", "ci", "seed")},
            **tensors,
        }
        return checked_result(cls, folder, kwargs, stem="study")

    def __repr__(self) -> str:
        return keyword_repr(
            "PositionAblationStudy",
            model=repr(self.profiles["none"].provenance.model),
            modes=list(self.modes),
            n_sequences=self.loss.shape[1],
            layers=len(self.layers),
        )


def _profile_parts(meta: dict[str, Any]) -> list[str]:
    """The profile JSONs a study's loader reads (one per mode of ``study.json``)."""
    modes = meta.get("modes")
    return (
        [f"profile_{m}/profile.json" for m in modes if isinstance(m, str)]
        if isinstance(modes, list)
        else []
    )
