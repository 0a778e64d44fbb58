"""Combining :class:`~homoglens.PositionalSimilarity` results: the checks and the sums of a
merge of results over disjoint windows, and the selection of entries of the layer axis."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from homoglens.errors import IncompatibleResultsError
from homoglens.results.base import selected_layers

if TYPE_CHECKING:
    from homoglens.results.similarity import PositionalSimilarity


def check_similarity_parts(
    first: PositionalSimilarity, parts: tuple[PositionalSimilarity, ...]
) -> None:
    """Refuse parts of :meth:`PositionalSimilarity.merge` whose sums do not add up to a
    one-pass result: dimensions dropped or vectors centred per part, or different layers,
    positions, width, first position, ``edge_k``, space or standardisation.

    Args:
        first: The first part.
        parts: Every part.

    Raises:
        IncompatibleResultsError: naming what differs.
    """
    if len(parts) > 1 and any(p.dropped_dims is not None for p in parts):
        raise IncompatibleResultsError(
            "results with drop_dims zeroed the dimensions of each part's own corpus, so "
            "their sums do not add up to a one-pass result; run positional_similarity once "
            "over all the data"
        )
    if len(parts) > 1 and any(p.centre is not None for p in parts):
        raise IncompatibleResultsError(
            "centred results subtract each part's own corpus mean, so their sums do not "
            "add up to a one-pass result; run positional_similarity once over all the data "
            "(it streams, and shards under torch.distributed)"
        )
    for other in parts[1:]:
        for attr in ("layers", "n_pos", "d_model", "first_position", "edge_k", "space"):
            if getattr(other, attr) != getattr(first, attr):
                raise IncompatibleResultsError(
                    f"cannot merge results with different {attr}: "
                    f"{getattr(first, attr)} vs {getattr(other, attr)}"
                )
        if other.standardize != first.standardize:
            raise IncompatibleResultsError("cannot merge results with different standardize")


def merge_similarity(
    first: PositionalSimilarity, parts: tuple[PositionalSimilarity, ...]
) -> PositionalSimilarity:
    """Add up parts that :meth:`PositionalSimilarity.merge` has checked: the sums added, the
    per-window rows concatenated in the order given, the second-pass values dropped (with a
    warning) when more than one part is merged.

    Args:
        first: The first part (its settings and provenance label the result).
        parts: Every part.

    Returns:
        The merged result.
    """
    if len(parts) > 1 and any(p.has_pseudo_values for p in parts):
        warnings.warn(
            "merge() drops the second-pass (pseudo-value) columns: they depend on the "
            "whole corpus; per-window values fall back to C held fixed",
            stacklevel=3,  # the caller of PositionalSimilarity.merge
        )
    datas = list(dict.fromkeys(p.provenance.data for p in parts))
    single = len(parts) == 1
    # every other field is the first part's: layers and the settings; n_massive and
    # dropped_dims too (merging is refused for centred results and for those with
    # dimensions dropped)
    return replace(
        first,
        within_sum=torch.stack([p.within_sum for p in parts]).sum(0),
        unit_sum=torch.stack([p.unit_sum for p in parts]).sum(0),
        n_sequences=sum(p.n_sequences for p in parts),
        window_within=torch.cat([p.window_within for p in parts]),
        window_cross=first.window_cross if single else None,
        window_same_position=first.window_same_position if single else None,
        provenance=replace(
            first.provenance,
            data=" + ".join(datas) if len(datas) <= 3 else f"{len(parts)} merged parts",
            data_sha256=" + ".join(p.provenance.data_sha256 for p in parts),
            data_rows="".join(p.provenance.data_rows for p in parts),
        ),
    )


def select_layers(
    sim: PositionalSimilarity, layers: list[int] | tuple[int, ...] | int
) -> PositionalSimilarity:
    """The result of :meth:`PositionalSimilarity.sel`: only the given entries of the layer
    axis (values, not indices), in ascending order.

    Args:
        sim: The result.
        layers: Entries of ``sim.layers``, or one.

    Returns:
        A new result.

    Raises:
        InvalidInputError: not integers, empty, or a layer given twice.
        IncompatibleResultsError: a requested layer is not in this result.
    """
    chosen = selected_layers(layers, sim.layers, "this result")
    idx = torch.tensor([sim.layers.index(layer) for layer in chosen], device="cpu")
    hooks = sim.provenance.hook_points

    def pick(t: Any, dim: int) -> Any:
        return None if t is None else t.index_select(dim, idx)

    return replace(
        sim,
        layers=tuple(chosen),
        within_sum=pick(sim.within_sum, 0),
        unit_sum=pick(sim.unit_sum, 0),
        window_within=pick(sim.window_within, 1),
        window_cross=pick(sim.window_cross, 1),
        window_same_position=pick(sim.window_same_position, 1),
        dropped_dims=pick(sim.dropped_dims, 0),
        n_massive=tuple(sim.n_massive[i] for i in idx.tolist()) if sim.n_massive else (),
        provenance=replace(
            sim.provenance,
            hook_points=tuple(hooks[i] for i in idx.tolist()) if hooks else (),
        ),
    )
