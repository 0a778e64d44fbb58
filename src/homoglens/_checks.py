"""Small argument checks shared by the public functions (typed errors with clear messages)."""

from __future__ import annotations

import operator
from typing import Any

from homoglens.errors import InvalidInputError, NonFiniteActivationError

__all__ = ["as_int", "as_bool", "as_float", "require_finite"]


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


def require_finite(values: Any, where: str, what: str = "activations") -> None:
    """The one non-finite check of every measurement: raise before anything is averaged in.

    Args:
        values: The tensor a result is computed from (already restricted to real tokens).
        where: The hook or quantity, for the message.
        what: What the values are.

    Raises:
        NonFiniteActivationError: ``values`` holds NaN or inf.
    """
    import torch

    finite = torch.isfinite(values)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise NonFiniteActivationError(
            f"{where}: {bad} of {finite.numel()} {what} are NaN or inf; nothing was averaged in. "
            "Check the model's weights and dtype (float16 overflows; try float32 or bfloat16)"
        )
