"""The options of a position-resolved similarity measurement (of a model streamed by
:func:`~homoglens.positional_similarity`, or of activations you hold), checked: typed errors
that name the choices, and the values as their types. No maths, no forward pass here."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import CENTRES, SPACES, Centring, SimilaritySpace
from homoglens.core.validate import as_bool, as_float, as_int

__all__ = ["SimilarityOptions", "check_drop_dims", "check_similarity_options"]


class SimilarityOptions(NamedTuple):
    """The checked options of a similarity measurement, in the order of
    :func:`check_similarity_options`'s arguments (a tuple: it unpacks as one)."""

    space: SimilaritySpace
    centre: Centring | None
    standardize: bool
    edge_k: int
    massive_threshold: float
    pseudo_values: bool


def check_drop_dims(drop_dims: Any, d_model: int) -> int:
    """``drop_dims`` as an int in ``0 .. d_model - 1`` (a typed error that names the range)."""
    value = as_int("drop_dims", drop_dims)
    if value < 0:
        raise InvalidInputError(
            f"drop_dims={value} is negative; it counts the dimensions to zero: pass 0 (none) .. "
            f"{d_model - 1}"
        )
    if value >= d_model:
        raise InvalidInputError(
            f"drop_dims={value} would zero every dimension of d_model={d_model}; pass 0 .. "
            f"{d_model - 1} (a few: the massive or rogue dimensions, e.g. 1-3)"
        )
    return value


def check_similarity_options(
    space: Any, centre: Any, standardize: Any, edge_k: Any, massive_threshold: Any, pseudo: Any
) -> SimilarityOptions:
    """Check :func:`~homoglens.positional_similarity`'s options (typed errors that name the
    choices) and return them as their types."""
    if space not in SPACES:
        raise InvalidInputError(f"space={space!r} must be one of {list(SPACES)}")
    if centre not in CENTRES:
        raise InvalidInputError(
            f"centre={centre!r} must be None, 'global' (one corpus mean per layer) or "
            "'position' (one per position)"
        )
    standardize = as_bool("standardize", standardize)
    if standardize and centre is None:
        raise InvalidInputError(
            "standardize=True divides each dimension by its corpus s.d. around the corpus "
            "mean; pass centre='global' or centre='position' with it"
        )
    edge_k = as_int("edge_k", edge_k, low=1)
    massive_threshold = as_float("massive_threshold", massive_threshold, low=1.0, high=math.inf)
    return SimilarityOptions(
        space, centre, standardize, edge_k, massive_threshold, as_bool("pseudo_values", pseudo)
    )
