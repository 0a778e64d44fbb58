"""The tables of a :class:`~homoglens.results.HomogenizationProfile`: the edge summary (first
and last positions against the middle) and the tidy export of every derived value."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from homoglens.errors import InvalidInputError
from homoglens.validate import as_int

if TYPE_CHECKING:
    import pandas as pd

    from homoglens.results.profile import HomogenizationProfile


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
