"""``HomogenizationProfile``: the sufficient statistics of a streamed corpus, and every
value derived from them.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float, Int

from homoglens.core.errors import (
    IncompatibleResultsError,
    InvalidInputError,
    NonFiniteActivationError,
)
from homoglens.core.validate import as_int
from homoglens.profile.homogenization import (
    homogenization_sums,
    nan_div,
    positions_from_mask,
)
from homoglens.profile.rank_metrics import RANK_FIELDS
from homoglens.results.base import TitledPlotted, checked_result, selected_layers
from homoglens.results.cache import cached_residuals
from homoglens.results.provenance import Provenance, check_mergeable, merge_parts
from homoglens.results.storage import folder_path, read_saved, save_folder, write_pair
from homoglens.results.validation import COSINE_OR_NAN, Bounds, FieldError

if TYPE_CHECKING:
    import pandas as pd


# How a :class:`~homoglens.HomogenizationProfile` is written, read and checked on load:
# ``profile.safetensors`` (the tensors) + ``profile.json`` (everything else), the names of the
# stored tensors, and the checks that its counts and sums fit together.

PROFILE_FORMAT = "homoglens.HomogenizationProfile/1"
"""The format tag of a saved profile's JSON."""

TENSOR_FIELDS = (
    "to_others_sum",
    "to_prefix_sum",
    "to_mean_sum",
    "norm_sum",
    "count",
    "prefix_count",
    "mean_pairwise_sum",
    "relative_residual_sum",
    "unit_sum",
    "unit_sum_sq",
)
"""The tensors every saved profile holds (the rank metrics come on top when measured)."""

UNIT_RANK_FIELDS = (
    "unit_effective_rank_sum",
    "matrix_entropy_sum",
    "unit_effective_rank_no_first_sum",
    "matrix_entropy_no_first_sum",
)
"""The unit-row rank metrics' sums: all present or all absent (profiles saved before they
existed lack them)."""


def write_profile(profile: HomogenizationProfile, folder: Path) -> None:
    """Write ``profile.safetensors`` + ``profile.json`` of ``profile`` into ``folder``.

    Args:
        profile: The profile to write.
        folder: An existing folder (the atomic save of :func:`save_folder` prepares it).
    """
    tensors = {
        f.name: getattr(profile, f.name).contiguous()
        for f in fields(profile)
        if isinstance(getattr(profile, f.name), torch.Tensor)
    }
    meta = {
        "format": PROFILE_FORMAT,
        "layers": list(profile.layers),
        "n_sequences": profile.n_sequences,
        "n_tokens": profile.n_tokens,
        "n_tokens_sq": profile.n_tokens_sq,
        "has_effective_rank": profile.effective_rank_sum is not None,
        "provenance": asdict(profile.provenance),
    }
    write_pair(folder, "profile", tensors, meta)


def load_profile(cls: type[HomogenizationProfile], path: str | Path) -> HomogenizationProfile:
    """A ``cls`` (:class:`HomogenizationProfile`) loaded from the folder ``path`` with its keys,
    tensors and values checked, as :meth:`HomogenizationProfile.load` (its errors)."""
    folder = folder_path(path, "load")
    meta, tensors = read_saved(folder, "profile")
    if not isinstance(meta, dict) or meta.get("format") != PROFILE_FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise IncompatibleResultsError(
            f"{folder} holds format {got!r}, expected {PROFILE_FORMAT!r}"
        )
    keys = {
        "layers",
        "n_sequences",
        "n_tokens",
        "n_tokens_sq",
        "has_effective_rank",
        "provenance",
    }
    if set(meta) - {"format"} != keys:
        raise IncompatibleResultsError(
            f"{folder}/profile.json has keys {sorted(set(meta) - {'format'})}, expected "
            f"{sorted(keys)} (missing: {sorted(keys - set(meta))}, extra: "
            f"{sorted(set(meta) - keys - {'format'})})"
        )
    if not isinstance(meta["has_effective_rank"], bool):
        raise IncompatibleResultsError(
            f"{folder}/profile.json has has_effective_rank={meta['has_effective_rank']!r}, "
            "not true or false; the file was edited: save the profile again"
        )
    expected = set(TENSOR_FIELDS) | (
        {"effective_rank_sum"} if meta["has_effective_rank"] else set()
    )
    if meta["has_effective_rank"] and set(UNIT_RANK_FIELDS) <= set(tensors):
        expected |= set(UNIT_RANK_FIELDS)  # profiles saved before the unit-row metrics lack them
    if set(tensors) != expected:
        raise IncompatibleResultsError(
            f"{folder}/profile.safetensors has tensors {sorted(tensors)}, expected "
            f"{sorted(expected)} (missing: {sorted(expected - set(tensors))}, extra: "
            f"{sorted(set(tensors) - expected)})"
        )
    prov = meta["provenance"]
    known = {f.name for f in fields(Provenance)}
    if not isinstance(prov, dict) or not set(prov) <= known:
        extra = sorted(set(prov) - known) if isinstance(prov, dict) else prov
        raise IncompatibleResultsError(f"{folder}/profile.json has unknown provenance {extra}")
    kwargs = {k: meta[k] for k in ("layers", "n_sequences", "n_tokens", "n_tokens_sq")}
    if isinstance(kwargs["layers"], list):
        kwargs["layers"] = tuple(kwargs["layers"])
    return checked_result(cls, folder, {**kwargs, "provenance": prov, **tensors}, stem="profile")


def check_profile_values(profile: HomogenizationProfile) -> None:
    """Check that the counts and sums of a loaded profile fit together (the work of
    :meth:`HomogenizationProfile._check_values`, whose docstring lists the checks).

    Args:
        profile: The profile read from disk.

    Raises:
        FieldError: the field that does not fit, and why.
    """
    count = profile.count.long()
    counted = torch.nonzero(count > 0).flatten()
    if len(counted) == 0:
        raise FieldError("count", "count is 0 at every position: nothing was counted")
    first = int(counted[0])
    if first != int(profile.provenance.exclude_first):
        raise FieldError(
            "provenance",
            f"provenance.exclude_first={profile.provenance.exclude_first} but the first counted "
            f"position is {first} (count={count.tolist()}): position 0 is counted exactly "
            "when it is not excluded",
        )
    run = count[first:]
    if int(run[0]) != profile.n_sequences or bool((run[1:] > run[:-1]).any()):
        raise FieldError(
            "count",
            f"count={count.tolist()} must start at n_sequences={profile.n_sequences} at the "
            "first counted position and never rise after it",
        )
    if int(count.sum()) != profile.n_tokens:
        raise FieldError(
            "n_tokens", f"n_tokens={profile.n_tokens} but count sums to {int(count.sum())}"
        )
    odd = torch.arange(1, 2 * len(run), 2, device="cpu")
    if int((run * odd).sum()) != profile.n_tokens_sq:
        raise FieldError(
            "n_tokens_sq",
            f"n_tokens_sq={profile.n_tokens_sq} but the counts give a sum of T^2 of "
            f"{int((run * odd).sum())}",
        )
    want = count.clone()
    want[first] = 0
    if not torch.equal(profile.prefix_count.long(), want):
        raise FieldError(
            "prefix_count",
            f"prefix_count={profile.prefix_count.tolist()} must equal count but 0 at the first "
            f"counted position ({want.tolist()})",
        )
    if bool((profile.norm_sum[:, count == 0] != 0).any()):
        raise FieldError("norm_sum", "norm_sum is not 0 at a position where nothing is counted")
    g2 = float((profile.unit_sum.double() ** 2).sum(-1).max())
    if g2 > float(profile.n_tokens) ** 2 * (1 + 1e-5):
        raise FieldError(
            "unit_sum",
            f"unit_sum has a squared norm of {g2:.6g}, more than n_tokens^2 = "
            f"{profile.n_tokens**2} (a sum of {profile.n_tokens} unit vectors)",
        )
    if profile.n_sequences > 1 and bool(torch.isnan(profile.baseline).any()):
        raise FieldError("baseline", "the baseline is NaN with more than one sequence")
    top = float(min(profile.d_model, max(profile.n_tokens - 1, 1)))
    for name, high in (
        ("effective_rank", float(profile.d_model)),
        ("unit_effective_rank", float(profile.d_model)),
        ("unit_effective_rank_no_first", float(profile.d_model)),
        ("matrix_entropy", math.log(profile.d_model)),
        ("matrix_entropy_no_first", math.log(profile.d_model)),
    ):
        values = getattr(profile, name)
        if values is not None and bool((values > high * (1 + 1e-9) + 1e-9).any()):
            raise FieldError(
                f"{name}_sum",
                f"{name} reaches {float(values.max()):.6g}, above its maximum {high:.6g} "
                f"(d_model={profile.d_model}, {top:g} tokens at most)",
            )


# Adding profiles up: :class:`ProfileSums`, the running sums a measurement accumulates batch by
# batch, and :func:`merge_profiles`, the sum of finished profiles of disjoint data.


class ProfileSums:
    """Float64 running sums of a :class:`HomogenizationProfile`, on the activations' device:
    what :func:`~homoglens.profile.homogenization.homogenization_sums` returns for each batch and
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
        :func:`~homoglens.profile.homogenization.sums_of_terms` on a stack of all entries."""
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


# The tables of a :class:`~homoglens.HomogenizationProfile`: the edge summary (first and
# last positions against the middle) and the tidy export of every derived value.


def edge_summary_table(profile: HomogenizationProfile, k: int, metric: str) -> pd.DataFrame:
    """Per layer of ``profile``, the count-weighted mean of ``metric`` over the edges and the
    middle, as :meth:`HomogenizationProfile.edge_summary` (its arguments, returns and errors)."""
    import pandas as pd

    sums = {
        "to_others": (profile.to_others_sum, profile.count),
        "to_prefix": (profile.to_prefix_sum, profile.prefix_count),
        "to_mean": (profile.to_mean_sum, profile.count),
        "norm": (profile.norm_sum, profile.count),
    }
    if metric not in sums:
        raise InvalidInputError(f"metric={metric!r} must be one of {sorted(sums)}")
    total, count = sums[metric]
    counted = torch.nonzero(count > 0).flatten()
    k = as_int("k", k, low=1)  # numpy integers too; a bool or a float is refused
    if 2 * k >= len(counted):
        raise InvalidInputError(
            f"k={k!r} must be a positive int with 2k < {len(counted)} "
            "(the number of counted positions)"
        )
    groups = {"first": counted[:k], "middle": counted[k:-k], "last": counted[-k:]}
    out: dict[str, Any] = {"layer": list(profile.layers)}
    for name, pos in groups.items():
        out[name] = (total[:, pos].sum(1) / count[pos].sum()).tolist()
    frame = pd.DataFrame(out)
    frame["first_minus_middle"] = frame["first"] - frame["middle"]
    frame["last_minus_middle"] = frame["last"] - frame["middle"]
    return frame


def profile_frame(profile: HomogenizationProfile) -> pd.DataFrame:
    """The tidy DataFrame of :meth:`HomogenizationProfile.to_pandas`: one row per (metric,
    layer, pos) cell, with columns ``metric, layer, pos, value, count``.

    Args:
        profile: The profile.

    Returns:
        The DataFrame (``pos`` is ``<NA>`` for per-layer metrics).
    """
    import pandas as pd

    frames = []
    layer_col = torch.tensor(profile.layers, device="cpu")
    pos = torch.arange(profile.n_pos, device="cpu")
    for name in ("to_others", "to_prefix", "to_mean", "norm"):
        values = getattr(profile, name)
        count = profile.prefix_count if name == "to_prefix" else profile.count
        frames.append(
            pd.DataFrame(
                {
                    "metric": name,
                    "layer": layer_col.repeat_interleave(profile.n_pos).numpy(),
                    "pos": pd.array(pos.repeat(len(profile.layers)).numpy(), dtype="Int64"),
                    "value": values.flatten().numpy(),
                    "count": count.repeat(len(profile.layers)).numpy().astype("int64"),
                }
            )
        )
    for name in (
        "mean_pairwise",
        "baseline",
        "adjusted",
        "relative_residual",
        "effective_rank",
        "unit_effective_rank",
        "matrix_entropy",
        "unit_effective_rank_no_first",
        "matrix_entropy_no_first",
    ):
        values = getattr(profile, name)
        if values is None:
            continue
        frames.append(
            pd.DataFrame(
                {
                    "metric": name,
                    "layer": layer_col.numpy(),
                    "pos": pd.array([None] * len(profile.layers), dtype="Int64"),
                    "value": values.numpy(),
                    "count": profile.n_sequences,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True, eq=False)
class HomogenizationProfile(TitledPlotted):
    """Cosine homogenization of the residual stream per layer and position, with provenance.

    ``plot()`` draws the per-layer curves (raw, baseline, adjusted) and a layer x position
    heatmap; its default title names the model, backend, weights and data size.

    The layer axis indexes hook points: entry 0 is the input of block 0 (embeddings, positional
    included; ``blocks.0.hook_resid_pre``), entry l >= 1 the output of block l - 1
    (``blocks.{l-1}.hook_resid_post``), the Hugging Face ``hidden_states`` convention without the
    final norm. ``layers`` says which entries this profile holds. Positions count from each
    sequence's first real (non-pad) token.

    Stored fields (sufficient statistics, float64 unless noted; all mergeable by addition):
        layers: Entries of the ``n_layers + 1`` axis held, in order.
        to_others_sum, to_prefix_sum, to_mean_sum, norm_sum: ``[layer pos]`` sums over sequences.
        count: ``[pos]`` int64, sequences with a counted token at each position.
        prefix_count: ``[pos]`` int64, sequences whose position has >= 1 counted earlier token.
        mean_pairwise_sum, relative_residual_sum: ``[layer]`` sums of per-sequence values.
        effective_rank_sum: ``[layer]`` or ``None`` if not requested.
        unit_effective_rank_sum, matrix_entropy_sum, unit_effective_rank_no_first_sum,
        matrix_entropy_no_first_sum: ``[layer]`` sums of the unit-row rank metrics, or ``None``
            (not requested, or a profile saved before they existed).
        unit_sum: ``[layer d_model]`` G, the sum over all sequences of S = sum of unit vectors.
        unit_sum_sq: ``[layer]`` sum over sequences of ||S||^2.
        n_sequences, n_tokens, n_tokens_sq: sequences, counted tokens and sum of T^2.
        provenance: :class:`Provenance`.

    Derived values (properties; cosines in [-1, 1], NaN where undefined) are documented on
    each property: ``to_others, to_prefix, to_mean, norm, mean_pairwise, baseline, adjusted,
    relative_residual, effective_rank, unit_effective_rank, matrix_entropy,
    unit_effective_rank_no_first, matrix_entropy_no_first``.

    References:
        Yusupov et al. 2025, "Token Homogenization under Positional Bias", arXiv 2508.17126
        (the phenomenon; these metrics are homoglens' own operationalisation).
        Ethayarajh 2019, "How Contextual are Contextualized Word Representations?" (anisotropy
        baseline, IntraSim). Dong, Cordonnier, Loukas 2021, arXiv 2103.03404 (relative residual).
        Roy & Vetterli 2007 (effective rank).
    """

    _layer_axis: ClassVar[bool] = True
    _bounds: ClassVar[dict[str, Bounds]] = {
        # sums over the sequences counted at each position (or in the profile) of values whose
        # range is known: bounded by their counts (0 where nothing is counted)
        "to_others_sum": Bounds(-1.0, 1.0, scale="count", tol=1e-6),
        "to_prefix_sum": Bounds(-1.0, 1.0, scale="prefix_count", tol=1e-6),
        "to_mean_sum": Bounds(-1.0, 1.0, scale="count", tol=1e-6),
        "norm_sum": Bounds(0.0),
        "mean_pairwise_sum": Bounds(-1.0, 1.0, scale="n_sequences", tol=1e-6),
        "relative_residual_sum": Bounds(0.0, 1.0, scale="n_sequences", tol=1e-6),
        "unit_sum_sq": Bounds(0.0, 1.0, scale="n_tokens_sq", tol=1e-6),
        "effective_rank_sum": Bounds(1.0, math.inf, scale="n_sequences", tol=1e-6),
        "unit_effective_rank_sum": Bounds(1.0, math.inf, scale="n_sequences", tol=1e-6),
        "unit_effective_rank_no_first_sum": Bounds(1.0, math.inf, scale="n_sequences", tol=1e-6),
        "matrix_entropy_sum": Bounds(0.0, math.inf, tol=1e-9),
        "matrix_entropy_no_first_sum": Bounds(0.0, math.inf, tol=1e-9),
        "baseline": COSINE_OR_NAN,  # NaN for one sequence (checked below)
    }

    layers: tuple[int, ...]
    to_others_sum: Float[torch.Tensor, "layer pos"]
    to_prefix_sum: Float[torch.Tensor, "layer pos"]
    to_mean_sum: Float[torch.Tensor, "layer pos"]
    norm_sum: Float[torch.Tensor, "layer pos"]
    count: Int[torch.Tensor, " pos"]
    prefix_count: Int[torch.Tensor, " pos"]
    mean_pairwise_sum: Float[torch.Tensor, " layer"]
    relative_residual_sum: Float[torch.Tensor, " layer"]
    unit_sum: Float[torch.Tensor, "layer d_model"]
    unit_sum_sq: Float[torch.Tensor, " layer"]
    n_sequences: int
    n_tokens: int
    n_tokens_sq: int
    effective_rank_sum: Float[torch.Tensor, " layer"] | None = None
    provenance: Provenance = field(default_factory=Provenance)
    unit_effective_rank_sum: Float[torch.Tensor, " layer"] | None = None
    matrix_entropy_sum: Float[torch.Tensor, " layer"] | None = None
    unit_effective_rank_no_first_sum: Float[torch.Tensor, " layer"] | None = None
    matrix_entropy_no_first_sum: Float[torch.Tensor, " layer"] | None = None

    def __post_init__(self) -> None:
        n_layer, n_pos = len(self.layers), int(self.count.shape[0])
        expected = {
            "to_others_sum": (n_layer, n_pos),
            "to_prefix_sum": (n_layer, n_pos),
            "to_mean_sum": (n_layer, n_pos),
            "norm_sum": (n_layer, n_pos),
            "prefix_count": (n_pos,),
            "mean_pairwise_sum": (n_layer,),
            "relative_residual_sum": (n_layer,),
            "unit_sum_sq": (n_layer,),
        }
        for name in UNIT_RANK_FIELDS:
            if (getattr(self, name) is None) != (getattr(self, UNIT_RANK_FIELDS[0]) is None):
                raise ValueError(f"the unit-row rank fields {UNIT_RANK_FIELDS} come together")
            if getattr(self, name) is not None and self.effective_rank_sum is None:
                raise ValueError(f"{name} needs effective_rank_sum")
        for name in ("effective_rank_sum", *UNIT_RANK_FIELDS):
            if getattr(self, name) is not None:
                expected[name] = (n_layer,)
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(
                    f"{name} has shape {got}, expected {shape} (layers={n_layer}, pos={n_pos})"
                )
        if self.unit_sum.ndim != 2 or self.unit_sum.shape[0] != n_layer:
            raise ValueError(
                f"unit_sum has shape {tuple(self.unit_sum.shape)}, expected ({n_layer}, d_model)"
            )
        if self.n_sequences < 1 or self.n_tokens < 2 * self.n_sequences:
            raise ValueError(
                f"n_sequences={self.n_sequences} and n_tokens={self.n_tokens}: a profile holds at "
                "least one sequence of at least 2 counted tokens"
            )

    def _check_values(self) -> None:
        """The counts of a saved profile fit together (run by
        :func:`~homoglens.results.validate_result` on load): ``count[p]`` is the number of
        sequences with a counted token at position p, so from the first counted position on
        it starts at ``n_sequences`` and never rises, sums to ``n_tokens``, and fixes
        ``n_tokens_sq`` (the sum of T^2); ``prefix_count`` is ``count`` but at the first
        counted position (0), which is 0 unless ``provenance.exclude_first`` (then 1);
        nothing is summed where nothing is counted; the baseline is a
        cosine (NaN only for one sequence) and the rank metrics lie in their ranges."""
        check_profile_values(self)

    @classmethod
    def from_cache(
        cls,
        cache: Any,
        *,
        layers: list[int] | tuple[int, ...] | int | None = None,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
        exclude_first: bool = False,
        effective_rank: bool = False,
        batch_size: int = 8,
    ) -> HomogenizationProfile:
        """Profile activations you already have: the residual stream held by a TransformerLens
        ``ActivationCache``, with no second forward pass.

        Reads entry 0 from ``blocks.0.hook_resid_pre`` and entry l from
        ``blocks.{l-1}.hook_resid_post`` (the hook points :func:`~homoglens.homogenization_profile`
        reads) and reduces them with the same sums, so ``HomogenizationProfile.from_cache(cache)``
        of ``_, cache = model.run_with_cache(tokens)`` equals
        ``homogenization_profile(model, tokens)`` (to float32 rounding of the activations).

        Args:
            cache: The ``ActivationCache`` of ``model.run_with_cache(tokens)`` (a
                ``HookedTransformer`` or ``TransformerBridge``), or a dict of those hook names
                to ``[batch pos d_model]`` tensors.
            layers: Entries of the residual axis (0 = embeddings, l = output of block l - 1);
                default: every entry the cache holds.
            attention_mask: ``[batch pos]`` 0/1 mask of the cached tokens (left or right
                padding); default: all real.
            exclude_first: Leave position 0 out of every statistic.
            effective_rank: Also compute the rank metrics.
            batch_size: Sequences reduced at a time (memory, not results).

        Returns:
            A profile whose provenance names the cache's model and backend (when the cache
            knows its model), the hook points and ``data="given activations: ..."``; its
            ``weights`` are ``"unknown"`` and ``bos`` is ``None`` (no tokens are seen).

        Raises:
            InvalidInputError: not a cache, a missing hook point (the message says how to keep
                it), tensors of the wrong shape, a bad mask, sequences with fewer than 2 counted
                tokens.
            NonFiniteActivationError: NaN/inf at a counted token.

        References:
            Yusupov et al. 2025, "Token Homogenization under Positional Bias", arXiv 2508.17126.

        Examples:
            >>> import torch
            >>> from homoglens import HomogenizationProfile, load_model
            >>> from homoglens.testing import tiny_model_folder
            >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
            >>> _, cache = model.run_with_cache(torch.randint(0, 50000, (4, 12)))
            >>> prof = HomogenizationProfile.from_cache(cache)
            >>> prof.layers, tuple(prof.to_others.shape)
            ((0, 1, 2), (3, 12))
        """
        from homoglens.core.validate import as_bool, positive_int

        exclude_first = as_bool("exclude_first", exclude_first)
        effective_rank = as_bool("effective_rank", effective_rank)
        batch_size = positive_int("batch_size", batch_size)
        read = cached_residuals(cache, layers, attention_mask, exclude_first=exclude_first)
        mask = read.attention_mask
        need = 3 if exclude_first else 2
        short = torch.nonzero(mask.sum(1) < need).flatten().tolist()
        if short:
            raise InvalidInputError(
                f"sequences {short[:10]} have fewer than {need} tokens; homogenization compares "
                f"tokens with each other, so each sequence needs at least {need}"
            )
        pos_index = positions_from_mask(mask, exclude_first=exclude_first)
        n_pos = int(mask.sum(1).max())
        x0 = read.resid[0]
        acc = ProfileSums(len(read.layers), n_pos, int(x0.shape[-1]), x0.device, effective_rank)
        for start in range(0, int(x0.shape[0]), batch_size):
            rows = slice(start, start + batch_size)
            width = int(mask[rows].sum(1).max())
            for i, x in enumerate(read.resid):
                try:
                    sums = homogenization_sums(
                        x[rows, :width],
                        pos_index[rows, :width],
                        n_pos,
                        effective_rank=effective_rank,
                    )
                except NonFiniteActivationError as err:
                    name = read.provenance.hook_points[i]
                    raise NonFiniteActivationError(f"{name}: {err}") from None
                acc.add(i, sums, first=(i == 0))
        return acc.profile(read.layers, read.provenance)

    # ----------------------------------------------------------------- derived values
    @cached_property
    def to_others(self) -> Float[torch.Tensor, "layer pos"]:
        """``[layer pos]`` mean over sequences of mean_{j != p} cos(x_p, x_j)."""
        return nan_div(self.to_others_sum, self.count)

    @cached_property
    def to_prefix(self) -> Float[torch.Tensor, "layer pos"]:
        """``[layer pos]`` mean over sequences of mean_{j < p} cos(x_p, x_j); NaN at p = 0."""
        return nan_div(self.to_prefix_sum, self.prefix_count)

    @cached_property
    def to_mean(self) -> Float[torch.Tensor, "layer pos"]:
        """``[layer pos]`` mean over sequences of cos(x_p, mean of the sequence's x)."""
        return nan_div(self.to_mean_sum, self.count)

    @cached_property
    def norm(self) -> Float[torch.Tensor, "layer pos"]:
        """``[layer pos]`` mean residual norm ||x_p|| (model units)."""
        return nan_div(self.norm_sum, self.count)

    @cached_property
    def mean_pairwise(self) -> Float[torch.Tensor, " layer"]:
        """``[layer]`` mean over sequences (equal weight) of mean_{i != j} cos(x_i, x_j)."""
        return self.mean_pairwise_sum / self.n_sequences

    @cached_property
    def baseline(self) -> Float[torch.Tensor, " layer"]:
        """``[layer]`` anisotropy: mean cosine over all pairs of tokens from *different*
        sequences, exact: (||G||^2 - sum ||S||^2) / ((sum T)^2 - sum T^2). NaN for 1 sequence."""
        pairs = float(self.n_tokens) ** 2 - float(self.n_tokens_sq)
        if pairs <= 0:
            return torch.full_like(self.unit_sum_sq, math.nan)
        return ((self.unit_sum * self.unit_sum).sum(-1) - self.unit_sum_sq) / pairs

    @cached_property
    def adjusted(self) -> Float[torch.Tensor, " layer"]:
        """``[layer]`` mean_pairwise - baseline: homogenization beyond anisotropy."""
        return self.mean_pairwise - self.baseline

    @cached_property
    def relative_residual(self) -> Float[torch.Tensor, " layer"]:
        """``[layer]`` mean over sequences of ||X - 1 xbar^T||_F / ||X||_F, in [0, 1]; 0 iff
        all positions are identical."""
        return self.relative_residual_sum / self.n_sequences

    @cached_property
    def effective_rank(self) -> Float[torch.Tensor, " layer"] | None:
        """``[layer]`` mean over sequences of the effective rank of X as it is (1 .. min(T,
        d_model)), or ``None`` if it was not requested. Rows weigh by their norms, so one
        token with massive activations (usually the first, or a BOS) dominates it: one entry of
        1000 on x_0 moves it from 56.5 to 10.2 while the mean cosine moves from 0.199 to 0.197.
        Prefer :attr:`unit_effective_rank` / :attr:`matrix_entropy` (``*_no_first``)."""
        if self.effective_rank_sum is None:
            return None
        return self.effective_rank_sum / self.n_sequences

    def _rank(self, name: str) -> torch.Tensor | None:
        total = getattr(self, f"{name}_sum")
        return None if total is None else total / self.n_sequences

    @property
    def unit_effective_rank(self) -> Float[torch.Tensor, " layer"] | None:
        """``[layer]`` mean over sequences of the effective rank of the *unit* rows (every
        token weighs the same; 1 .. min(T, d_model)), or ``None``."""
        return self._rank("unit_effective_rank")

    @property
    def matrix_entropy(self) -> Float[torch.Tensor, " layer"] | None:
        """``[layer]`` mean over sequences of the entropy (nats) of the eigenvalues of
        U U^T / T for unit rows U (matrix-based entropy, Skean et al. 2025, arXiv 2502.02013;
        0 .. log min(T, d_model); lower = more homogenized), or ``None``."""
        return self._rank("matrix_entropy")

    @property
    def unit_effective_rank_no_first(self) -> Float[torch.Tensor, " layer"] | None:
        """``[layer]`` :attr:`unit_effective_rank` without position 0 (the BOS), or ``None``."""
        return self._rank("unit_effective_rank_no_first")

    @property
    def matrix_entropy_no_first(self) -> Float[torch.Tensor, " layer"] | None:
        """``[layer]`` :attr:`matrix_entropy` without position 0 (the BOS), or ``None``."""
        return self._rank("matrix_entropy_no_first")

    @property
    def n_pos(self) -> int:
        """Length of the position axis."""
        return int(self.count.shape[0])

    @property
    def d_model(self) -> int:
        """Residual width."""
        return int(self.unit_sum.shape[1])

    # ----------------------------------------------------------------- combining
    @staticmethod
    def merge(*profiles: HomogenizationProfile) -> HomogenizationProfile:
        """Add the statistics of profiles of disjoint data into one profile.

        Any split of a corpus merges to the one-pass result (up to float64 rounding).

        Args:
            *profiles: Profiles over the same layers, model, weights and ``exclude_first``.

        Returns:
            The merged profile; its position axis is the longest of the inputs. The rank
            metrics are kept only when every part measured them (else dropped, with a warning).

        Raises:
            IncompatibleResultsError: no profiles; they differ in layers, width, or a
                provenance field that must agree (model, family, backend, weights, dtype,
                model_revision, hook_points, exclude_first: the merged profile would carry the
                first one's label); their data overlap (the same ``provenance.data_sha256``, or
                the same profile given twice), which would count sequences twice and pair
                tokens with their own copies in the baseline.
        """
        first = merge_parts(profiles, HomogenizationProfile)
        for other in profiles[1:]:
            for attr in ("layers", "d_model"):
                if getattr(other, attr) != getattr(first, attr):
                    raise IncompatibleResultsError(
                        f"cannot merge profiles with different {attr}: "
                        f"{getattr(first, attr)} vs {getattr(other, attr)}"
                    )
        check_mergeable(profiles, "HomogenizationProfile")
        return merge_profiles(first, profiles)

    def sel(self, layers: list[int] | tuple[int, ...] | int) -> HomogenizationProfile:
        """Return a new profile with only the given entries of the layer axis.

        Args:
            layers: Values from ``self.layers`` (not indices into it), or one value; the
                result holds them in ascending order, as a measurement's ``layers=`` does.

        Raises:
            InvalidInputError: not integers, empty, or a layer given twice.
            IncompatibleResultsError: a requested layer is not in this profile.
        """
        layers = selected_layers(layers, self.layers, "this profile")
        idx = torch.tensor([self.layers.index(layer) for layer in layers], device="cpu")
        per_layer = {
            f.name: getattr(self, f.name).index_select(0, idx)
            for f in fields(self)
            if f.name in _PER_LAYER and getattr(self, f.name) is not None
        }
        hooks = self.provenance.hook_points
        prov = replace(
            self.provenance, hook_points=tuple(hooks[i] for i in idx.tolist()) if hooks else ()
        )
        return replace(self, layers=tuple(layers), provenance=prov, **per_layer)

    # ----------------------------------------------------------------- reports
    def edge_summary(self, k: int = 8, *, metric: str = "to_others") -> pd.DataFrame:
        """Compare the first and last ``k`` positions with the middle, per layer.

        Each value is the count-weighted mean of a per-position metric over the positions in
        that group (first k counted positions; last k positions of the position axis; the rest).
        With unequal sequence lengths "last" means the last positions of the longest sequences.

        Args:
            k: Positions per edge; ``2k`` must be smaller than the number of counted positions.
            metric: ``"to_others"``, ``"to_prefix"``, ``"to_mean"`` or ``"norm"``.

        Returns:
            DataFrame with columns ``layer, first, middle, last, first_minus_middle,
            last_minus_middle`` (cosines, or model units for ``norm``).

        Raises:
            ValueError: bad ``k`` or ``metric``.
        """
        return edge_summary_table(self, k, metric)

    def to_pandas(self) -> pd.DataFrame:
        """Return a tidy DataFrame: one row per (metric, layer, pos) cell.

        Columns: ``metric`` (name of a derived value), ``layer`` (entry of the layer axis),
        ``pos`` (position; ``<NA>`` for per-layer metrics), ``value``, ``count`` (sequences
        behind the cell).
        """
        return profile_frame(self)

    _figure: ClassVar[str] = "profile.figure.profile_figure"

    # ----------------------------------------------------------------- I/O
    def save(self, path: str | Path) -> Path:
        """Save as ``profile.safetensors`` (tensors) + ``profile.json`` (everything else, and
        the sha256 of the safetensors), atomically: a save that fails or is interrupted leaves
        an older profile in ``path`` loadable and unchanged, or refused on load, never a mix.

        Args:
            path: A folder; created if missing. An existing profile in it is replaced (other
                files in it are left alone).

        Returns:
            The folder.

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created.
        """
        return save_folder(
            path, self._write_into, own=("profile.json", "profile.safetensors"),
            manifest="profile.json",
        )  # fmt: skip

    def _write_into(self, folder: Path) -> None:
        """Write ``profile.safetensors`` + ``profile.json`` into ``folder``."""
        write_profile(self, folder)

    @classmethod
    def load(cls, path: str | Path) -> HomogenizationProfile:
        """Load a profile written by :meth:`save` (safetensors + JSON; no pickle).

        Raises:
            ResultsNotFoundError: the folder lacks ``profile.safetensors`` or ``profile.json``.
            IncompatibleResultsError: unknown format, unreadable files, missing/extra keys or
                tensors, shapes that do not fit together, values out of their range or counts
                that do not fit together (:meth:`_check_values`), or a safetensors file that
                does not match the sha256 recorded in the JSON (saved incompletely or edited).
        """
        return load_profile(cls, path)

    def __repr__(self) -> str:
        p = self.provenance
        return (
            f"HomogenizationProfile(model={p.model!r}, backend={p.backend}, "
            f"weights={p.weights}, layers={len(self.layers)}, pos={self.n_pos}, "
            f"n_sequences={self.n_sequences}, n_tokens={self.n_tokens}, bos={p.bos}, "
            f"exclude_first={p.exclude_first})"
        )


_PER_LAYER = (
    "to_others_sum",
    "to_prefix_sum",
    "to_mean_sum",
    "norm_sum",
    "mean_pairwise_sum",
    "relative_residual_sum",
    "unit_sum",
    "unit_sum_sq",
    "effective_rank_sum",
    "unit_effective_rank_sum",
    "matrix_entropy_sum",
    "unit_effective_rank_no_first_sum",
    "matrix_entropy_no_first_sum",
)
