"""Small argument checks shared by the public functions (typed errors with clear messages)."""

from __future__ import annotations

import operator
from typing import Any

from homoglens.errors import InvalidInputError

__all__ = ["as_int", "as_bool", "as_float"]


def as_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as a Python int (numpy/torch integers accepted), within [low, high]."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidInputError(f"{name}={value!r} must be an integer")
    try:  # a float or multi-element tensor/array has __index__ but refuses it
        number = operator.index(value)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidInputError(f"{name}={value!r} must be a single integer") from None
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise InvalidInputError(f"{name}={number} must lie in {bounds}")
    return number


def as_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool (numpy bools accepted); refuse strings and numbers."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if (
        hasattr(value, "dtype")
        and getattr(value, "shape", None) == ()
        and "bool" in str(value.dtype)
    ):
        return bool(value)  # a 0-d bool tensor or array
    raise InvalidInputError(f"{name}={value!r} must be True or False")


def as_float(name: str, value: Any, *, low: float, high: float) -> float:
    """Return ``value`` as a float strictly inside (low, high)."""
    if isinstance(value, (bool, str, bytes)):
        raise InvalidInputError(f"{name}={value!r} must be a number")
    try:
        number = float(value)
    except (TypeError, ValueError) as err:
        raise InvalidInputError(f"{name}={value!r} must be a number") from err
    if not low < number < high:  # also refuses NaN
        raise InvalidInputError(f"{name}={number} must lie in ({low}, {high})")
    return number
