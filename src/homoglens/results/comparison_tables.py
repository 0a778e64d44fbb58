"""The tables of a :class:`~homoglens.ModelComparison`: per model and statistic with
block-bootstrap intervals, the paired differences between models and under each positional
ablation, the context-task costs and the per-layer homogenization."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from homoglens.results.comparison import ModelComparison


def summary_table(comparison: ModelComparison) -> pd.DataFrame:
    """One row per (model, statistic) of ``comparison``, the mean over windows with its
    interval, as :meth:`ModelComparison.summary` (its returns)."""
    import pandas as pd

    rows = []
    for label in comparison.labels:
        for stat, values in comparison.per_sequence(label).items():
            est = comparison._estimate([comparison._last(values)[None]])
            rows.append((label, stat, est.value, est.ci_low, est.ci_high))
    return pd.DataFrame(rows, columns=["model", "statistic", "value", "ci_low", "ci_high"])


def differences_table(comparison: ModelComparison, reference: str | None) -> pd.DataFrame:
    """The paired differences (model minus ``reference``) of ``comparison``, as
    :meth:`ModelComparison.differences` (its arguments, returns and errors)."""
    import pandas as pd

    reference = comparison.labels[0] if reference is None else reference
    comparison._check_label(reference)
    ref = comparison.per_sequence(reference)
    rows = []
    for label in comparison.labels:
        if label == reference:
            continue
        for stat, values in comparison.per_sequence(label).items():
            if stat not in ref:  # e.g. icl of a model measured here, against shipped ones
                continue
            est = comparison._estimate(
                [(comparison._last(values) - comparison._last(ref[stat]))[None]]
            )
            rows.append((label, reference, stat, est.value, est.ci_low, est.ci_high))
    return pd.DataFrame(
        rows, columns=["model", "reference", "statistic", "diff", "ci_low", "ci_high"]
    )


def ablation_effects_table(comparison: ModelComparison) -> pd.DataFrame:
    """The paired effect of each positional ablation within each model of ``comparison``
    (ablated minus intact), as :meth:`ModelComparison.ablation_effects` (its returns)."""
    import pandas as pd

    rows = []
    for label in comparison.labels:
        intact = comparison.per_sequence(label)
        for mode in comparison.statistics[label]:
            if mode == "none":
                continue
            for stat, values in comparison.per_sequence(label, mode).items():
                diff = comparison._last(values) - comparison._last(intact[stat])
                est = comparison._estimate([diff[None]])
                rows.append((label, mode, stat, est.value, est.ci_low, est.ci_high))
    return pd.DataFrame(rows, columns=["model", "mode", "statistic", "diff", "ci_low", "ci_high"])


def context_costs_table(comparison: ModelComparison) -> pd.DataFrame:
    """The table of :meth:`ModelComparison.context_table`: the context table of each computed
    model's study, with a ``model`` column first.

    Args:
        comparison: The comparison.

    Returns:
        DataFrame with a ``model`` column and the columns of the study's context table.
    """
    import pandas as pd

    frames = [
        comparison.studies[label].context_table().assign(model=label)
        for label in comparison.computed
    ]
    if not frames:
        return pd.DataFrame(columns=["model", "mode", "icl", "induction_loss"])
    frame = pd.concat(frames, ignore_index=True)
    return frame.reindex(columns=["model", *[c for c in frame.columns if c != "model"]])


def layer_homogenization_table(comparison: ModelComparison) -> pd.DataFrame:
    """Per model and layer entry of ``comparison``, the mean pairwise cosine and ``H`` with
    their intervals, as :meth:`ModelComparison.layer_table` (its returns)."""
    import pandas as pd

    rows = []
    for label in comparison.labels:
        stats = comparison.per_sequence(label)
        for li, layer in enumerate(comparison.layers):
            raw = comparison._estimate([stats["mean_pairwise"][:, li][None]])
            h = comparison._estimate([stats["homogenization"][:, li][None]])
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
