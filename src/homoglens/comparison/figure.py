"""The figure of a :class:`~homoglens.comparison.result.ModelComparison`,
composed from :mod:`homoglens.results.figure_parts` and drawn by either backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from homoglens.results.figure_parts import (
    AnyFigure,
    figure_kit,
    headline,
    layer_curves,
)

if TYPE_CHECKING:
    from homoglens.comparison.result import ModelComparison


def comparison_figure(comparison: ModelComparison, *, backend: str = "matplotlib") -> AnyFigure:
    """Centred homogenization by layer per model; the matched and the naive edge excess at the
    last layer (block-bootstrap intervals); loss per model."""
    kit = figure_kit(backend)
    fig, (left, middle, right) = kit.new_figure(15, 4.4, ncols=3, width_ratios=[1.1, 1.5, 0.9])
    layer_curves(
        kit, left, comparison.layer_table(), "model", comparison.labels,
        ("homogenization", "h_ci_low", "h_ci_high"), lw=1, hlines=(0.0,), legend="x-small",
        ylabel="H = mean off-diagonal W (centred)", title="Homogenization by layer",
    )  # fmt: skip
    summary = comparison.summary().set_index(["model", "statistic"])
    stats = ["matched_first", "matched_last", "naive_first", "naive_last"]

    def column(label: str, key: str, names: list[str]) -> list[float]:
        return [float(summary.loc[(label, s)][key]) for s in names]

    kit.bars(
        middle, [s.replace("_", "\n") for s in stats], None,
        groups={k: column(k, "value", stats) for k in comparison.labels},
        group_low={k: column(k, "ci_low", stats) for k in comparison.labels},
        group_high={k: column(k, "ci_high", stats) for k in comparison.labels},
        ylabel="edge minus middle (cosine)",
        title=f"Edge excess at the last layer ({comparison.edge_k} positions per edge)",
    )  # fmt: skip
    loss = {key: [column(k, key, ["loss"])[0] for k in comparison.labels]
            for key in ("value", "ci_low", "ci_high")}  # fmt: skip
    kit.bars(
        right, [label.split("/")[-1] for label in comparison.labels], loss["value"],
        low=loss["ci_low"], high=loss["ci_high"], rotation=30,
        ylabel="next-token loss (nats/token)", title="Loss",
    )  # fmt: skip
    headline(
        kit, fig, None, f"Models compared on {comparison.n_sequences} windows", matplotlib=True
    )
    return fig
