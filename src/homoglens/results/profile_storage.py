"""How a :class:`~homoglens.results.HomogenizationProfile` is written, read and checked on
load: ``profile.safetensors`` (the tensors) + ``profile.json`` (everything else), the names of
the stored tensors, and the checks that its counts and sums fit together."""

from __future__ import annotations

import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from homoglens.errors import IncompatibleResultsError
from homoglens.results.base import checked_result
from homoglens.results.provenance import Provenance
from homoglens.results.storage import folder_path, read_saved, write_pair
from homoglens.results.validation import FieldError

if TYPE_CHECKING:
    from homoglens.results.profile import HomogenizationProfile

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
