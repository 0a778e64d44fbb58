"""The tables of an :class:`~homoglens.AttentionBiasStudy`: the dose-response of one metric,
paired against the baseline (with intervals and the dose per unit of attention mass and of
KL), and the tidy export of every metric at every strength."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from homoglens.results.bias_metrics import ATTENTION_CHECKS
from homoglens.results.bias_slope import dose_per_mass
from homoglens.similarity_math import SIMILARITY_STATISTICS
from homoglens.stats import estimate

if TYPE_CHECKING:
    import pandas as pd

    from homoglens.results.bias import AttentionBiasStudy
    from homoglens.results.bias_metrics import MetricRead


def curve_table(study: AttentionBiasStudy, read: MetricRead, *, n_boot: int) -> pd.DataFrame:
    """The dose-response table of ``study``: one row per strength, the metric ``read`` and its
    paired change from the baseline, as :meth:`AttentionBiasStudy.curve` (its arguments,
    returns and errors)."""
    import pandas as pd

    metric, li, values, per, ci, block, seed = read
    base = study._index(study.baseline)
    mass = study._mass()
    sesoi = study._sesoi(metric, li)
    rows = []
    for i, s in enumerate(study.strengths):
        se = lo = hi = math.nan
        delta = float(values[i] - values[base])
        paired = None if per is None else per[i] - per[base]
        known = paired is not None and not bool(paired.isnan().all())  # NaN: not defined
        if paired is not None and known and i != base and study.n_sequences > 1:
            est = estimate([paired[None]], block=block, n_boot=n_boot, ci=ci, seed=seed)
            se, lo, hi = est.se, est.ci_low, est.ci_high  # paired: the same windows
        moved = math.nan
        ratio = (math.nan,) * 5
        if mass is not None and i != base:
            moved = float((mass[i] - mass[base]).mean())
            ratio = dose_per_mass(
                delta, paired, mass[i] - mass[base], sesoi=sesoi, ci=ci, block=block,
                seed=seed, n_boot=n_boot,
            )  # fmt: skip
        kl = float(study.kl[i])
        temperature = study.kind == "temperature"
        rows.append(
            {
                "strength": s,
                "b": 0.0 if temperature else s,
                "beta": s if temperature else 1.0,
                "kl": kl,
                "mass_moved": moved,
                "value": float(values[i]),
                "delta": delta,
                "se": se,
                "ci_low": lo,
                "ci_high": hi,
                "per_mass": ratio[0],
                "per_mass_ci_low": ratio[1],
                "per_mass_ci_high": ratio[2],
                "per_kl": delta / kl if i != base and kl > 0 else math.nan,
                "n_sequences": study.n_sequences,
            }
        )
    return pd.DataFrame(rows)


def bias_frame(study: AttentionBiasStudy) -> pd.DataFrame:
    """The tidy DataFrame of :meth:`AttentionBiasStudy.to_pandas`: one row per (strength,
    metric, layer) with ``value`` and ``kl``.

    Args:
        study: The study.

    Returns:
        The DataFrame (the loss has ``layer`` = -1).
    """
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for i, s in enumerate(study.strengths):
        for li, layer in enumerate(study.layers):
            for e, stat in enumerate(SIMILARITY_STATISTICS):
                value = float(study.statistics[i, li, e])
                rows.append({"strength": s, "metric": stat, "layer": layer, "value": value})
        for bi, blk in enumerate(study.blocks):
            for c, check in enumerate(ATTENTION_CHECKS):
                value = float(study.attention[i, bi, c])
                rows.append({"strength": s, "metric": check, "layer": blk, "value": value})
        loss = float(study.loss[i])
        rows.append({"strength": s, "metric": "loss", "layer": -1, "value": loss})
    frame = pd.DataFrame(rows)
    doses = dict(zip(study.strengths, study.kl.tolist(), strict=True))
    frame["kl"] = frame["strength"].map(doses)
    return frame
