"""The figure of a :class:`~homoglens.lengths.result.LengthStudy`,
composed from :mod:`homoglens.results.figure_parts` and drawn by either backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from homoglens.results.figure_parts import (
    AnyFigure,
    figure_kit,
    headline,
)

if TYPE_CHECKING:
    from homoglens.lengths.result import LengthStudy


def length_figure(
    study: LengthStudy, layer: int, *, title: str | None = None, backend: str = "matplotlib"
) -> AnyFigure:
    """Over positions: lag-controlled similarity and SP at entry ``layer``, the last block's
    normalised attention entropy and key-0 mass; over lengths: H_W and the matched edges."""
    kit = figure_kit(backend)
    fig, axes = kit.new_figure(13, 3.4, ncols=3)
    lag = study.curve("lag", layer)
    series = {f"M[p, p-{d}]": lag.loc[lag["lag"] == d, "value"].to_numpy() for d in study.lags}
    series["SP[p]"] = study.curve("sp", layer)["value"].to_numpy()
    x = np.arange(max(study.lengths))
    entry = study.layers[layer]
    kit.curves(axes[0], x, series, xlabel="position p", ylabel=f"cosine (entry {entry})",
               title="similarity over positions")  # fmt: skip
    attn = {
        "entropy / log(p+1)": study.curve("attention_entropy", -1)["value"].to_numpy(),
        "mass on key 0": study.curve("first_key_mass", -1)["value"].to_numpy(),
    }
    kit.curves(axes[1], x, attn, xlabel="query position p", ylabel="last block, mean over heads",
               title="attention over positions")  # fmt: skip
    by = {stat: study.by_length(stat, layer)["value"].to_numpy()
          for stat in ("homogenization", "matched_first", "matched_last")}  # fmt: skip
    kit.curves(axes[2], np.asarray(study.lengths), by, styles=dict.fromkeys(by, "o-"),
               xlabel="length T", ylabel=f"cosine (entry {entry})", hlines=[0.0],
               title="by length")  # fmt: skip
    kit.log_scale(axes[2], "x", base=2)
    what = f"over sequence length, {study.n_sequences} windows"
    headline(kit, fig, title, what, matplotlib=False, provenance=study.provenance)
    return fig
