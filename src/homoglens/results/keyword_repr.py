"""The one-line ``repr`` of the results that name their settings: ``Name(key=value, ...)``."""

from __future__ import annotations

from typing import Any


def keyword_repr(name: str, **values: Any) -> str:
    """``name(key=value, ...)``: each value as an f-string writes it (pass ``repr(v)`` for a
    quoted one), in the order given.

    Args:
        name: The class name.
        **values: The keys and values shown.

    Returns:
        The one-line text.
    """
    return f"{name}({', '.join(f'{key}={value}' for key, value in values.items())})"
