"""``PositionAblationStudy``: homogenization and loss under each positional ablation,
paired over the same sequences, with paired bootstrap intervals.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from jaxtyping import Float

from homoglens.errors import IncompatibleResultsError, InvalidInputError
from homoglens.results.base import prepare_folder, read_saved
from homoglens.results.profile import HomogenizationProfile

if TYPE_CHECKING:  # plotting stays a lazy import
    import pandas as pd
    from matplotlib.figure import Figure
    from plotly.graph_objects import Figure as PlotlyFigure

    from homoglens.types import PlotBackend


def paired_bootstrap(
    values: Float[torch.Tensor, "seq ..."],
    *,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean over sequences with a percentile bootstrap confidence interval.

    Sequences are resampled with replacement ``n_boot`` times; NaN entries (positions a
    sequence does not have) are left out of each mean.

    Args:
        values: ``[seq ...]`` per-sequence values (e.g. a paired difference ablated - normal).
        n_boot: Bootstrap resamples.
        ci: Coverage of the interval, in (0, 1).
        seed: Seed of the resampling.

    Returns:
        ``(mean, low, high)``, each of shape ``values.shape[1:]``; ``low`` and ``high`` are NaN
        where fewer than 2 sequences hold a value (resampling one value gives a zero-width
        interval, which would claim a precision that one unit of replication cannot show).
    """
    gen = torch.Generator().manual_seed(seed)
    x = values.double()
    n = x.shape[0]
    mean = x.nanmean(0)
    boots = []
    for chunk in range(0, n_boot, 100):
        idx = torch.randint(n, (min(100, n_boot - chunk), n), generator=gen, device="cpu")
        boots.append(x[idx].nanmean(1))
    dist = torch.cat(boots)
    alpha = (1 - ci) / 2
    low = dist.nanquantile(alpha, dim=0)
    high = dist.nanquantile(1 - alpha, dim=0)
    few = (~torch.isnan(x)).sum(0) < 2
    if bool(few.any()):
        low, high = low.masked_fill(few, math.nan), high.masked_fill(few, math.nan)
    return mean, low, high


@dataclass(frozen=True, eq=False)
class PositionAblationStudy:
    """Homogenization and next-token loss under several positional ablations, paired by
    sequence (every mode ran on the same sequences).

    Attributes:
        modes: Ablation modes run; ``"none"`` (the unablated model) first, the reference.
        profiles: ``{mode: HomogenizationProfile}``.
        loss: ``[mode seq]`` mean next-token cross-entropy per sequence (nats/token).
        mean_pairwise: ``[mode seq layer]`` per-sequence mean pairwise cosine.
        to_others: ``[mode seq layer pos]`` per-sequence to_others (NaN where absent).
        icl: ``[mode seq]`` in-context-learning score per sequence: mean loss of its last
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

    modes: tuple[str, ...]
    profiles: dict[str, HomogenizationProfile]
    loss: Float[torch.Tensor, "mode seq"]
    mean_pairwise: Float[torch.Tensor, "mode seq layer"]
    to_others: Float[torch.Tensor, "mode seq layer pos"]
    icl: Float[torch.Tensor, "mode seq"] | None = None
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

        if layer not in self.layers:
            raise InvalidInputError(f"layer {layer} not in this study (it has {list(self.layers)})")
        li = self.layers.index(layer)
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

    @overload
    def plot(self, *, backend: Literal["matplotlib"] = "matplotlib") -> Figure: ...
    @overload
    def plot(self, *, backend: Literal["plotly"]) -> PlotlyFigure: ...
    def plot(self, *, backend: PlotBackend = "matplotlib") -> Figure | PlotlyFigure:
        """Mean pairwise cosine by layer for each mode (with CI bands), and loss per mode.

        Args:
            backend: ``"matplotlib"`` (the default: a static figure for files) or ``"plotly"``
                (interactive: hover values with units, zoom, legend toggles; needs
                ``pip install "homoglens[plotly]"``).

        Returns:
            A matplotlib ``Figure`` (displays inline in Jupyter), or with ``backend="plotly"`` a
            ``plotly.graph_objects.Figure``.

        Raises:
            InvalidInputError: ``backend`` is neither ``"matplotlib"`` nor ``"plotly"``.
            MissingDependencyError: ``backend="plotly"`` without plotly installed.
        """
        from homoglens.results.figures import study_figure

        return study_figure(self, backend=backend)

    def save(self, path: str | Path) -> Path:
        """Save as ``study.safetensors`` + ``study.json`` + one profile folder per mode."""
        from safetensors.torch import save_file

        folder = prepare_folder(path)
        tensors = {
            "loss": self.loss.contiguous(),
            "mean_pairwise": self.mean_pairwise.contiguous(),
            "to_others": self.to_others.contiguous(),
        }
        if self.icl is not None:
            tensors["icl"] = self.icl.contiguous()
        if self.induction_loss is not None:
            tensors["induction_loss"] = self.induction_loss.contiguous()
        save_file(tensors, str(folder / "study.safetensors"))
        for mode, prof in self.profiles.items():
            prof.save(folder / f"profile_{mode}")
        meta = {
            "format": "homoglens.PositionAblationStudy/1",
            "modes": list(self.modes),
            "settings": self.settings,
            "n_boot": self.n_boot,
            "ci": self.ci,
            "seed": self.seed,
        }
        (folder / "study.json").write_text(json.dumps(meta, indent=2))
        return folder

    @classmethod
    def load(cls, path: str | Path) -> PositionAblationStudy:
        """Load a study written by :meth:`save` (no pickle).

        Raises:
            ResultsNotFoundError: a file of the study is missing.
            IncompatibleResultsError: wrong format, keys, tensors or settings.
        """
        folder = Path(path).expanduser()
        meta, tensors = read_saved(folder, "study")
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
        try:
            profiles = {
                m: HomogenizationProfile.load(folder / f"profile_{m}") for m in meta["modes"]
            }
            return cls(
                modes=tuple(meta["modes"]),
                profiles=profiles,
                settings=meta["settings"],
                n_boot=meta["n_boot"],
                ci=meta["ci"],
                seed=meta["seed"],
                **tensors,
            )
        except (ValueError, TypeError, IndexError, KeyError) as err:
            raise IncompatibleResultsError(
                f"{folder} does not hold a consistent study: {err}"
            ) from None

    def __repr__(self) -> str:
        p = self.profiles["none"].provenance
        return (
            f"PositionAblationStudy(model={p.model!r}, modes={list(self.modes)}, "
            f"n_sequences={self.loss.shape[1]}, layers={len(self.layers)})"
        )
