"""The options of :func:`homoglens.comparison.compare_models`: the models given, the numeric
settings, and how labels group into variants (``group_by``) and which one has no positions
(``no_positions``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from homoglens.errors import InvalidInputError
from homoglens.stats import as_block
from homoglens.types import GroupBy, HookedModel
from homoglens.validate import as_float, as_int, check_model

__all__ = ["ComparisonNumbers", "check_numbers", "named_models", "resolve_grouping"]


def named_models(
    models: Any, no_positions: Any, group_by: Any, centre: Any
) -> dict[str, HookedModel | str]:
    """``{label: model or name}`` of :func:`compare_models`' ``models`` (every model given as
    an object checked), after which ``no_positions``, ``group_by`` and ``centre`` are checked.

    Raises:
        InvalidInputError: not a list or mapping, empty or repeated names, a bad model or a bad
            ``no_positions`` / ``group_by`` / ``centre``.
    """
    if isinstance(models, str) or not isinstance(models, Mapping | Sequence):
        raise InvalidInputError(
            "models must be a list of names or a {label: model} mapping, "
            f"not {type(models).__name__}"
        )
    named = dict(models) if isinstance(models, Mapping) else {str(m): m for m in models}
    if not named or (not isinstance(models, Mapping) and len(named) != len(models)):
        raise InvalidInputError(f"models {list(models)} must be non-empty and unique")
    for m in named.values():
        if not isinstance(m, str | os.PathLike):
            check_model(m)
    if no_positions not in (None, "auto") and not isinstance(no_positions, str):
        raise InvalidInputError(f"no_positions={no_positions!r} must be a model label or None")
    if group_by not in (None, "auto", "variant"):
        raise InvalidInputError(f"group_by={group_by!r} must be None, 'auto' or 'variant'")
    if centre not in (None, "global", "position"):
        raise InvalidInputError(f"centre={centre!r} must be None, 'global' or 'position'")
    return named


class ComparisonNumbers(NamedTuple):
    """The checked numeric options of :func:`compare_models`."""

    n_seq: int | None
    seq_len: int | None
    edge_k: int
    batch_size: int
    n_boot: int
    block: int | Literal["auto"]
    ci: float
    sesoi: float | None
    loss_sesoi: float
    seed: int


def check_numbers(
    *,
    n_seq: Any,
    seq_len: Any,
    edge_k: Any,
    batch_size: Any,
    n_boot: Any,
    block: Any,
    ci: Any,
    sesoi: Any,
    loss_sesoi: Any,
    seed: Any,
) -> ComparisonNumbers:
    """Check the numeric options of :func:`compare_models`, in this order: ``n_seq``,
    ``edge_k``, ``seq_len`` (at least ``2 * edge_k + 2``), ``batch_size``, ``n_boot``,
    ``block``, ``ci``, ``sesoi``, ``loss_sesoi`` and ``seed``."""
    n_seq = None if n_seq is None else as_int("n_seq", n_seq, low=1)
    edge_k = as_int("edge_k", edge_k, low=1)
    seq_len = None if seq_len is None else as_int("seq_len", seq_len, low=2 * edge_k + 2)
    batch_size = as_int("batch_size", batch_size, low=1)
    n_boot = as_int("n_boot", n_boot, low=1)
    block = as_block(block)
    ci = as_float("ci", ci, low=0.0, high=1.0)
    sesoi = None if sesoi is None else as_float("sesoi", sesoi, low=0.0, high=1e9)
    loss_sesoi = as_float("loss_sesoi", loss_sesoi, low=0.0, high=1e9)
    seed = as_int("seed", seed, low=0, high=2**63 - 1)
    return ComparisonNumbers(
        n_seq, seq_len, edge_k, batch_size, n_boot, block, ci, sesoi, loss_sesoi, seed
    )


def _variant(label: str, record: Mapping[str, Any]) -> str:
    """A label's variant: the one ``training.json`` records (``-bos`` when trained with a
    BOS), else the label itself."""
    if not record.get("variant"):
        return label
    return str(record["variant"]) + ("-bos" if record.get("bos") else "")


def resolve_grouping(
    order: list[str],
    heldout: dict[str, Any],
    group_by: GroupBy | None | Literal["auto"],
    no_positions: str | None,
) -> tuple[dict[str, str], GroupBy | None, str | None]:
    """Each label's variant, ``group_by`` resolved (``"auto"``: ``"variant"`` when a variant
    has several labels) and ``no_positions`` resolved (``"auto"``: the one variant-``none``
    label or variant) or checked.

    Raises:
        InvalidInputError: ``no_positions`` names no label (or variant).
    """
    variants = {label: _variant(label, heldout.get(label, {})) for label in order}
    if group_by == "auto":
        counts: dict[str, int] = {}
        for v in variants.values():
            counts[v] = counts.get(v, 0) + 1
        group_by = "variant" if any(c > 1 for c in counts.values()) else None
    if no_positions == "auto":
        nope = [label for label in order if heldout.get(label, {}).get("variant") == "none"]
        if group_by == "variant":
            names = {variants[label] for label in nope}
            no_positions = names.pop() if len(names) == 1 else None
        else:
            no_positions = nope[0] if len(nope) == 1 else None
    elif no_positions is not None:
        allowed = set(variants.values()) if group_by == "variant" else set(order)
        if no_positions not in allowed:
            raise InvalidInputError(
                f"no_positions={no_positions!r} is not a model"
                + (" variant" if group_by == "variant" else " label")
                + f"; choose from {sorted(allowed)}"
            )
    return variants, group_by, no_positions
