"""Adding profiles up: :class:`ProfileSums`, the running sums a measurement accumulates batch
by batch, and :func:`merge_profiles`, the sum of finished profiles of disjoint data."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from homoglens.rank_metrics import RANK_FIELDS
from homoglens.results.profile_storage import UNIT_RANK_FIELDS
from homoglens.results.provenance import Provenance

if TYPE_CHECKING:
    from homoglens.results.profile import HomogenizationProfile


class ProfileSums:
    """Float64 running sums of a :class:`HomogenizationProfile`, on the activations' device:
    what :func:`~homoglens.homogenization.homogenization_sums` returns for each batch and
    entry of the layer axis, added up (the streamed model path and
    :meth:`HomogenizationProfile.from_cache` share it)."""

    def __init__(
        self, n_layer: int, n_pos: int, d_model: int, device: torch.device, effective_rank: bool
    ) -> None:
        f64 = {"dtype": torch.float64, "device": device}
        self.layer_pos = {
            name: torch.zeros(n_layer, n_pos, **f64)
            for name in ("to_others_sum", "to_prefix_sum", "to_mean_sum", "norm_sum")
        }
        self.layer = {
            name: torch.zeros(n_layer, **f64)
            for name in ("mean_pairwise_sum", "relative_residual_sum", "unit_sum_sq")
            + (RANK_FIELDS if effective_rank else ())
        }
        self.unit_sum = torch.zeros(n_layer, d_model, **f64)
        self.pos = {name: torch.zeros(n_pos, **f64) for name in ("count", "prefix_count")}
        # counts accumulate where the activations are (no host sync per batch), read at the end
        self.scalars = {
            name: torch.zeros((), **f64) for name in ("n_sequences", "n_tokens", "n_tokens_sq")
        }

    def add(self, i: int, sums: dict[str, torch.Tensor], first: bool) -> None:
        """Add one batch's sums of layer-axis entry ``i``; ``first``: the batch's first entry
        (the layer-independent counts are added once per batch)."""
        self._add(i, sums, counts=first)

    def add_layers(self, sums: dict[str, torch.Tensor]) -> None:
        """Add one batch's sums of every layer-axis entry at once: the output of
        :func:`~homoglens.homogenization.sums_of_terms` on a stack of all entries."""
        self._add(slice(None), sums, counts=True)

    def _add(self, at: int | slice, sums: dict[str, torch.Tensor], *, counts: bool) -> None:
        # .to(): with a model split over devices, later blocks run on other devices
        for name, acc in (*self.layer_pos.items(), *self.layer.items()):
            acc[at] += sums[name].to(acc.device)
        self.unit_sum[at] += sums["unit_sum"].to(self.unit_sum.device)
        if counts:  # layer-independent quantities, counted once per batch
            for name, acc in self.pos.items():
                acc += sums[name].to(acc.device)
            for name, acc in self.scalars.items():
                acc += sums[name].to(acc.device)

    def profile(self, layers: tuple[int, ...], provenance: Provenance) -> HomogenizationProfile:
        """The finished profile of the sums (CPU tensors, exact integer counts)."""
        from homoglens.results.profile import HomogenizationProfile

        cpu: dict[str, Any] = {k: v.cpu() for k, v in {**self.layer_pos, **self.layer}.items()}
        cpu.update({k: v.round().long().cpu() for k, v in self.pos.items()})  # exact counts
        return HomogenizationProfile(
            layers=layers,
            unit_sum=self.unit_sum.cpu(),
            provenance=provenance,
            **{name: int(round(float(v))) for name, v in self.scalars.items()},
            **cpu,
        )


def merge_profiles(
    first: HomogenizationProfile, profiles: tuple[HomogenizationProfile, ...]
) -> HomogenizationProfile:
    """Add up the statistics of profiles that :meth:`HomogenizationProfile.merge` has checked
    (same layers, width and provenance, no overlapping data) into one profile, whose position
    axis is the longest of the parts; the rank metrics are kept only when every part measured
    them (else dropped, with a warning).

    Args:
        first: The first of ``profiles`` (its layers and provenance label the result).
        profiles: The checked profiles.

    Returns:
        The merged profile.
    """
    from homoglens.results.profile import HomogenizationProfile

    n_pos = max(p.n_pos for p in profiles)

    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, n_pos - t.shape[-1]))

    def total(name: str, pad: bool = False) -> torch.Tensor:
        parts = [padded(getattr(p, name)) if pad else getattr(p, name) for p in profiles]
        return torch.stack(parts).sum(0)

    has_rank = all(p.effective_rank_sum is not None for p in profiles)
    has_unit = all(p.unit_effective_rank_sum is not None for p in profiles)
    some = any(p.effective_rank_sum is not None for p in profiles)
    if some and not (has_rank and has_unit):
        warnings.warn(
            "homoglens: only some of the merged profiles measured the rank metrics "
            "(effective_rank=True); the merged profile has none. Measure every part with "
            "effective_rank=True to keep them",
            UserWarning,
            stacklevel=3,  # the caller of HomogenizationProfile.merge
        )
    datas = list(dict.fromkeys(p.provenance.data for p in profiles))
    bos_values = {p.provenance.bos for p in profiles}
    return HomogenizationProfile(
        layers=first.layers,
        to_others_sum=total("to_others_sum", True),
        to_prefix_sum=total("to_prefix_sum", True),
        to_mean_sum=total("to_mean_sum", True),
        norm_sum=total("norm_sum", True),
        count=total("count", True),
        prefix_count=total("prefix_count", True),
        mean_pairwise_sum=total("mean_pairwise_sum"),
        relative_residual_sum=total("relative_residual_sum"),
        unit_sum=total("unit_sum"),
        unit_sum_sq=total("unit_sum_sq"),
        n_sequences=sum(p.n_sequences for p in profiles),
        n_tokens=sum(p.n_tokens for p in profiles),
        n_tokens_sq=sum(p.n_tokens_sq for p in profiles),
        effective_rank_sum=total("effective_rank_sum") if has_rank else None,
        **{name: total(name) if has_unit else None for name in UNIT_RANK_FIELDS},
        provenance=replace(
            first.provenance,
            data=" + ".join(datas) if len(datas) <= 3 else f"{len(profiles)} merged parts",
            data_sha256=" + ".join(p.provenance.data_sha256 for p in profiles),
            data_rows="".join(p.provenance.data_rows for p in profiles),
            bos=bos_values.pop() if len(bos_values) == 1 else None,
        ),
    )
