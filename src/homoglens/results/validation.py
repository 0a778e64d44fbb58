"""The validation of a result read from disk, driven by its dataclass' annotations and
declarations: exact types of the plain fields, dtypes and shapes of the tensors, value bounds
(:class:`Bounds`), choices, ranges, the provenance's fields and the class' own cross-field
checks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

import torch

from homoglens.models.architectures import resid_hook_name
from homoglens.results.provenance import ROW_DIGITS, Provenance

_TENSOR_ANNOTATION = re.compile(r"(Float|Int|Bool)\[torch\.Tensor, ['\"]([^'\"]*)['\"]\]")


_LENGTH_OF = {
    "layer": "layers",
    "metric": "metrics",
    "cell": "cells",
    "head": "heads",
    "mode": "modes",
}
"""Named dimensions whose size is the length of another field."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite_number(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


class FieldError(ValueError):
    """A bad value of one field of a result (``field``), for the message naming its file."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Bounds:
    """The values a field (or a derived property) of a saved result may hold, checked on load
    by :func:`validate_result` (declared per class in ``_bounds``; every float tensor field not
    declared must be finite).

    Attributes:
        low: Lower bound (closed; times ``scale``).
        high: Upper bound (closed; times ``scale``).
        nan: Whether NaN is meaningful in the field (documented by the class); inf never is.
        scale: Name of a field that multiplies both bounds: a count tensor (broadcast against
            the values) or an int, for sums of per-sequence values.
        tol: Absolute slack for float rounding (times ``scale``).
    """

    low: float = -math.inf
    high: float = math.inf
    nan: bool = False
    scale: str | None = None
    tol: float = 0.0


FINITE = Bounds()
"""Finite (no NaN, no inf)."""
FINITE_OR_NAN = Bounds(nan=True)
"""Finite or NaN (undefined)."""
COSINE = Bounds(-1.0, 1.0, tol=1e-4)
"""A cosine (or a mean of cosines)."""
COSINE_OR_NAN = Bounds(-1.0, 1.0, nan=True, tol=1e-4)
"""A cosine, or NaN where it is undefined."""
UNIT = Bounds(0.0, 1.0, tol=1e-6)
"""A mass, a rate or a fraction in [0, 1]."""
UNIT_OR_NAN = Bounds(0.0, 1.0, nan=True, tol=1e-6)
"""A mass, a rate or a fraction in [0, 1], or NaN where it is undefined."""
NON_NEGATIVE = Bounds(0.0)
"""A count, an index, a loss or a norm: >= 0."""


def _flat(value: tuple[Any, ...]) -> list[Any]:
    return [v for item in value for v in (_flat(item) if isinstance(item, tuple) else [item])]


def _first_bad(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(mask)[0].tolist())


def check_bounds(result: Any, name: str, bounds: Bounds, value: Any = None) -> None:
    """Check one field (or property) ``name`` of ``result`` against ``bounds``; ``None``
    values (optional fields) pass.

    Raises:
        FieldError: NaN where it is not meaningful, inf, or a value out of bounds (the first
            bad index and value named).
    """
    value = getattr(result, name) if value is None else value
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, torch.Tensor):
        x = value.detach().to("cpu", torch.float64)
    elif isinstance(value, tuple):
        flat = _flat(value)
        if not all(_is_number(v) for v in flat):
            return  # strings: their choices are checked elsewhere
        x = torch.tensor([float(v) for v in flat], dtype=torch.float64)
    elif _is_number(value):
        x = torch.tensor([float(value)], dtype=torch.float64)
    else:
        return
    nan = torch.isnan(x)
    if bool(nan.any()) and not bounds.nan:
        raise FieldError(
            name, f"{name} holds NaN at index {_first_bad(nan)}, where it must be finite"
        )
    if bool(torch.isinf(x).any()):
        raise FieldError(name, f"{name} holds inf at index {_first_bad(torch.isinf(x))}")
    scale: Any = 1.0
    if bounds.scale is not None:
        scale = getattr(result, bounds.scale)
        scale = scale.to("cpu", torch.float64) if isinstance(scale, torch.Tensor) else float(scale)
    low = -math.inf if bounds.low == -math.inf else bounds.low * scale
    high = math.inf if bounds.high == math.inf else bounds.high * scale
    if isinstance(scale, torch.Tensor):
        slack: Any = bounds.tol * scale.abs().clamp_min(1.0)
    else:
        slack = bounds.tol * max(1.0, abs(scale))
    bad = ~nan & ((x < low - slack) | (x > high + slack))
    if bool(bad.any()):
        at = _first_bad(bad)
        where = f"[{', '.join(map(str, at))}]" if x.ndim and x.numel() > 1 else ""
        unit = f" x {bounds.scale}" if bounds.scale else ""
        raise FieldError(
            name,
            f"{name}{where}={float(x[at]):.6g} lies outside [{bounds.low:g}, {bounds.high:g}]"
            f"{unit}",
        )


def _annotated(annotation: str, value: Any, name: str) -> None:
    """The exact JSON type of a plain field by its annotation (a string: postponed)."""
    kinds = [part.strip() for part in annotation.split("|")]
    if "None" in kinds and value is None:
        return
    ok = False
    for kind in kinds:
        if kind == "None":
            continue  # None itself passed above
        if kind == "int":
            ok = ok or _is_int(value)
        elif kind == "float":
            ok = ok or _is_finite_number(value)
        elif kind == "bool":
            ok = ok or isinstance(value, bool)
        elif kind == "str":
            ok = ok or isinstance(value, str)
        elif kind.startswith("tuple[tuple[int"):
            ok = ok or (
                isinstance(value, (tuple, list))
                and all(
                    isinstance(v, (tuple, list)) and len(v) == 2 and all(_is_int(i) for i in v)
                    for v in value
                )
            )
        elif kind.startswith("tuple[int"):
            ok = ok or (isinstance(value, (tuple, list)) and all(_is_int(v) for v in value))
        elif kind.startswith("tuple[float"):
            ok = ok or (
                isinstance(value, (tuple, list)) and all(_is_finite_number(v) for v in value)
            )
        elif kind.startswith("tuple[str"):
            ok = ok or (isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value))
        elif kind.startswith("dict"):
            ok = ok or isinstance(value, dict)
        else:
            return  # tensors, nested results, provenance: checked elsewhere
    if not ok:
        wanted = {
            "int": "an integer",
            "float": "a finite number",
            "bool": "true or false",
            "str": "a string",
        }
        what = " or ".join(wanted.get(k, k) for k in kinds)
        raise FieldError(name, f"{name}={value!r} must be {what}")


def check_scalars(cls: Any, values: dict[str, Any]) -> None:
    """Exact types of the plain (non-tensor) fields, before the dataclass sees them
    (``n_sequences`` of 3.7 is not 3, a ``ci`` of ``"0.95"`` is not 0.95); counts >= 0.

    Raises:
        FieldError: a value of the wrong type, a negative count.
    """
    for f in fields(cls):
        if f.name not in values or isinstance(values[f.name], torch.Tensor):
            continue
        value, annotation = values[f.name], str(f.type)
        _annotated(annotation, value, f.name)
        count = f.name.startswith("n_") or "count" in f.name
        if count and _is_int(value) and value < 0:
            raise FieldError(f.name, f"{f.name}={value} must be >= 0")
        if f.name in ("layers", "n_massive") and isinstance(value, (tuple, list)):
            if any(_is_int(v) and v < 0 for v in value):
                raise FieldError(f.name, f"{f.name}={list(value)} must be >= 0")


def check_provenance(prov: Any) -> dict[str, Any]:
    """The provenance of a saved result as read from JSON: known keys, each of the exact type
    :class:`Provenance` declares (lists become tuples).

    Raises:
        FieldError: an unknown key or a value of the wrong type.
    """
    if not isinstance(prov, dict):
        raise FieldError("provenance", f"provenance={prov!r} must be a JSON object")
    known = {f.name: str(f.type) for f in fields(Provenance)}
    extra = sorted(set(prov) - set(known))
    if extra:
        raise FieldError("provenance", f"provenance has unknown keys {extra}")
    out = dict(prov)
    for name, value in prov.items():
        _annotated(known[name], value, f"provenance.{name}")
        if isinstance(value, list):
            out[name] = tuple(value)
        allowed = _PROVENANCE_CHOICES.get(name)
        if allowed is not None and value not in allowed:
            raise FieldError("provenance", f"provenance.{name}={value!r} must be one of {allowed}")
    dtype = prov.get("dtype", "")
    if dtype and not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise FieldError("provenance", f"provenance.dtype={dtype!r} is not a torch dtype")
    digests = str(prov.get("data_sha256", "")).split(" + ")
    if not all(not d or re.fullmatch(r"[0-9a-f]{64}", d) for d in digests):
        raise FieldError(
            "provenance",
            f"provenance.data_sha256={prov.get('data_sha256')!r} must be empty or sha256 hex "
            "digests (64 characters 0-9a-f) joined by ' + '",
        )
    rows = str(prov.get("data_rows", ""))
    if len(rows) % ROW_DIGITS or not re.fullmatch(r"[0-9a-f]*", rows):
        raise FieldError(
            "provenance",
            f"provenance.data_rows must be {ROW_DIGITS} hex digits (0-9a-f) per sequence",
        )
    return out


_PROVENANCE_CHOICES: dict[str, list[Any]] = {
    "backend": ["hooked", "bridge", "none"],
    "weights": ["raw", "processed", "unknown"],
}
"""The values :class:`Provenance` documents for its fields with a fixed set (``bos``:
true/false/null, by its type)."""


_REPEATS = ("n_massive",)
"""Tuple fields whose entries may repeat (counts); every other tuple field lists distinct
entries (layers, modes, labels, metrics, cells, heads, blocks, lengths, ...)."""


def validate_result(result: Any) -> None:
    """The one check of a result read from disk: names, dtypes, shapes, values and cross-field
    consistency, read from the dataclass' own annotations and declarations.

    * tensor fields: float / integral as annotated (``Float[...]`` / ``Int[...]``), the number
      of dimensions annotated, and every named dimension the same size in every field
      (``layer`` = ``len(layers)``, ``metric`` = ``len(metrics)``, ``cell`` = ``len(cells)``,
      ``head`` = ``len(heads)``, ``mode`` = ``len(modes)``); counts (``count``/``n_*``
      fields) integral and >= 0;
    * ``int`` / ``float`` / ``bool`` / ``str`` fields of exactly that type (``n_sequences`` of
      3.7 is not 3), counts >= 0, floats finite; the entries of a tuple field distinct (but
      for counts such as ``n_massive``);
    * values: the class' ``_bounds`` (:class:`Bounds` of a field or a derived property: finite,
      NaN only where documented, ranges such as cosines in [-1, 1] or masses in [0, 1], sums
      bounded by their counts); every float tensor field not declared there must be finite;
    * the class' ``_choices`` (allowed strings, of a field or of every entry of a tuple field)
      and ``_ranges`` (open intervals);
    * the class' own cross-field checks (``_check_values``: counts consistent with each other,
      positions in range, ...);
    * ``provenance.hook_points``, when recorded by a result whose ``layers`` are residual entries
      (``_layer_axis``), one per entry and the residual hook of that entry (a reordered
      ``layers`` would silently relabel every row).

    Raises:
        ValueError: what is wrong, by field name (a :class:`FieldError` for a bad value).
    """
    cls = type(result)
    check_scalars(cls, {f.name: getattr(result, f.name) for f in fields(result)})
    sizes: dict[str, int] = {}
    for dim, attr in _LENGTH_OF.items():
        if isinstance(getattr(result, attr, None), tuple):
            sizes[dim] = len(getattr(result, attr))
    declared: dict[str, Bounds] = getattr(cls, "_bounds", {})
    for f in fields(result):
        value, annotation = getattr(result, f.name), str(f.type)
        count = f.name.startswith("n_") or "count" in f.name
        if isinstance(value, tuple) and f.name not in _REPEATS:
            if len(set(value)) != len(value):
                raise FieldError(f.name, f"{f.name}={list(value)} repeats an entry")
        if isinstance(value, torch.Tensor):
            match = _TENSOR_ANNOTATION.search(annotation)
            if match is None:
                continue
            kind, dims = match.group(1), match.group(2).split()
            if kind == "Float" and not value.is_floating_point():
                raise ValueError(f"{f.name} has dtype {value.dtype}, expected a float tensor")
            if kind == "Int" and (value.is_complex() or value.dtype == torch.bool):
                raise ValueError(f"{f.name} has dtype {value.dtype}, expected integers")
            if "..." not in dims and value.ndim != len(dims):
                raise ValueError(
                    f"{f.name} has {value.ndim} dimensions {tuple(value.shape)}, expected "
                    f"[{' '.join(dims)}]"
                )
            for dim, size in zip(dims, value.shape, strict=False):
                if dim == "...":
                    break
                if sizes.setdefault(dim, int(size)) != size:
                    raise ValueError(
                        f"{f.name} has {size} entries along {dim!r}, but the result has "
                        f"{sizes[dim]} (shape {tuple(value.shape)})"
                    )
            if kind == "Int" or count:
                finite = value[~torch.isnan(value)] if value.is_floating_point() else value
                if bool((finite < 0).any()) or not bool((finite == finite.round()).all()):
                    raise FieldError(f.name, f"{f.name} must hold non-negative whole counts")
            if kind == "Float" and f.name not in declared:
                check_bounds(result, f.name, FINITE)
    for name, allowed in getattr(cls, "_choices", {}).items():
        value = getattr(result, name)
        for entry in value if isinstance(value, tuple) else (value,):
            if entry not in allowed:
                raise FieldError(name, f"{name}={value!r} must be one of {list(allowed)}")
    for name, (low, high) in getattr(cls, "_ranges", {}).items():
        value = getattr(result, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
            raise FieldError(name, f"{name}={value!r} must lie in ({low}, {high})")
    for name, bounds in declared.items():
        check_bounds(result, name, bounds)
    check = getattr(result, "_check_values", None)
    if check is not None:
        check()
    layers = getattr(result, "layers", None)
    hooks = getattr(getattr(result, "provenance", None), "hook_points", ())
    if isinstance(layers, tuple) and hooks and getattr(cls, "_layer_axis", False):
        if len(hooks) != len(layers):
            raise FieldError(
                "provenance",
                f"provenance.hook_points has {len(hooks)} entries for {len(layers)} layers",
            )
        for layer, hook in zip(layers, hooks, strict=True):
            resid = resid_hook_name(layer)
            if re.fullmatch(r"blocks\.\d+\.hook_resid_(pre|post)", hook) and hook != resid:
                raise FieldError(
                    "layers",
                    f"layer entry {layer} is recorded at {hook}, but entry {layer} is {resid}: "
                    "layers and hook_points disagree (reordered or edited layers)",
                )
