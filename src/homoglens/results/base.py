"""The one save/load of every result: safetensors + JSON with a format tag, and the
validation of a result's fields (dtypes, shapes, ranges) driven by its annotations.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from homoglens.architectures import resid_hook_name
from homoglens.errors import IncompatibleResultsError, InvalidInputError, ResultsNotFoundError

if TYPE_CHECKING:  # plotting stays a lazy import
    pass


@dataclass(frozen=True)
class Provenance:
    """Where a result came from.

    Attributes:
        model: Model name or path.
        family: Architecture family (``gpt2``, ``neox``, ``llama``, ...; the Hugging Face
            architecture name for a family outside the table) or ``"none"``.
        backend: ``"hooked"``, ``"bridge"`` or ``"none"`` (computed from given activations).
        weights: ``"raw"``, ``"processed"`` (TransformerLens weight processing) or ``"unknown"``.
        dtype: Model dtype (statistics are always accumulated in float64).
        model_source: Extra model provenance (e.g. the embedded GGUF and its quantisation).
        hook_points: TransformerLens hook name of each entry of the layer axis.
        bos: Whether position 0 of every sequence held a BOS token (``None``: mixed).
        data: Description of the data.
        exclude_first: Whether position 0 was left out of every statistic.
        homoglens_version: Package version that computed the result.
        transformer_lens_version: TransformerLens version used (``""`` if none).
        torch_version: torch version used (``""`` if not recorded: results saved before it was).
        transformers_version: Hugging Face transformers version used (``""`` if not recorded).
        model_revision: The model's version: for a Hub name, the ``revision`` or training
            checkpoint asked for (``"revision step1000"``, ``"checkpoint_value 1000"``) and the
            commit of the cached snapshot when known (``"main @ 0123abcd..."``); ``""`` when not
            known (local folders: see ``model_source``).
        data_sha256: Content hash of the data measured: sha256 of the row lengths then the real
            token ids (pads left out), row by row, as little-endian int64 (``""`` if not
            recorded; merged parts join their hashes with ``" + "``).
    """

    model: str = "none"
    family: str = "none"
    backend: str = "none"
    weights: str = "unknown"
    dtype: str = ""
    model_source: str = ""
    hook_points: tuple[str, ...] = ()
    bos: bool | None = None
    data: str = ""
    exclude_first: bool = False
    homoglens_version: str = ""
    transformer_lens_version: str = ""
    torch_version: str = ""
    transformers_version: str = ""
    model_revision: str = ""
    data_sha256: str = ""


def read_saved(folder: Path, stem: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """Read ``{stem}.json`` and ``{stem}.safetensors`` of a saved result (never pickle).

    Raises:
        ResultsNotFoundError: a file is missing. IncompatibleResultsError: a file is corrupt.
    """
    from safetensors.torch import load_file

    for name in (f"{stem}.json", f"{stem}.safetensors"):
        if not (folder / name).is_file():
            raise ResultsNotFoundError(
                f"{folder / name} not found; is {str(folder)!r} a saved {stem}?"
            )
    try:
        meta = json.loads((folder / f"{stem}.json").read_text())
        tensors = load_file(str(folder / f"{stem}.safetensors"))
    except Exception as err:  # corrupt JSON or safetensors
        raise IncompatibleResultsError(f"cannot read the {stem} in {folder}: {err}") from None
    return meta, tensors


def _deep_tuple(value: Any) -> Any:
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, list) else value


def prepare_folder(path: str | Path) -> Path:
    """Create the folder ``path`` for :meth:`save` (parents too) and return it.

    Raises:
        InvalidInputError: ``path`` is a file, or cannot be created (e.g. a parent is a file).
    """
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"{str(folder)!r} is a file; save() needs a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInputError(f"cannot create the folder {str(folder)!r}: {err}") from None
    return folder


def save_result(result: Any, path: str | Path, stem: str) -> Path:
    """Save a frozen result dataclass as ``{stem}.safetensors`` (its tensor fields) and
    ``{stem}.json`` (every other field, and the format ``homoglens.{ClassName}/1``); no pickle.

    Raises:
        InvalidInputError: ``path`` is a file.
    """
    from safetensors.torch import save_file

    folder = prepare_folder(path)
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {"format": f"homoglens.{type(result).__name__}/1"}
    for f in fields(result):
        value = getattr(result, f.name)
        if isinstance(value, torch.Tensor):
            tensors[f.name] = value.contiguous()
        elif isinstance(value, Provenance):
            meta[f.name] = asdict(value)
        else:
            meta[f.name] = value
    save_file(tensors, str(folder / f"{stem}.safetensors"))
    (folder / f"{stem}.json").write_text(json.dumps(meta, indent=2))
    return folder


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


def check_scalars(cls: Any, values: dict[str, Any]) -> None:
    """Types of the plain (non-tensor) fields, before the dataclass sees them."""
    for f in fields(cls):
        if f.name not in values:
            continue
        value, annotation = values[f.name], str(f.type)
        count = f.name.startswith("n_") or "count" in f.name
        if annotation == "int":
            if not _is_int(value):
                raise ValueError(f"{f.name}={value!r} must be an integer")
            if count and value < 0:
                raise ValueError(f"{f.name}={value} must be >= 0")
        elif annotation == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{f.name}={value!r} must be a number")
            if not math.isfinite(value):
                raise ValueError(f"{f.name}={value!r} must be finite")
        elif annotation == "bool" and not isinstance(value, bool):
            raise ValueError(f"{f.name}={value!r} must be true or false")
        elif annotation == "str" and not isinstance(value, str):
            raise ValueError(f"{f.name}={value!r} must be a string")
        elif annotation.startswith("tuple[int"):
            if not isinstance(value, (tuple, list)) or not all(_is_int(v) for v in value):
                raise ValueError(f"{f.name}={value!r} must be a list of integers")
            if f.name in ("layers", "n_massive") and any(v < 0 for v in value):
                raise ValueError(f"{f.name}={list(value)} must be >= 0")


def validate_result(result: Any) -> None:
    """The one check of a result read from disk: names, dtypes, shapes, ranges and cross-field
    consistency, read from the dataclass' own annotations.

    * tensor fields: float / integral as annotated (``Float[...]`` / ``Int[...]``), the number
      of dimensions annotated, and every named dimension the same size in every field
      (``layer`` = ``len(layers)``, ``metric`` = ``len(metrics)``, ``cell`` = ``len(cells)``,
      ``head`` = ``len(heads)``); counts (``count``/``n_*`` fields) integral and >= 0;
    * ``int`` / ``float`` / ``bool`` / ``str`` fields of exactly that type (``n_sequences`` of
      3.7 is not 3), counts and indices >= 0, floats finite; ``layers`` distinct;
    * the class' ``_choices`` (allowed strings) and ``_ranges`` (open intervals);
    * ``provenance.hook_points``, when recorded by a result whose ``layers`` are residual entries
      (``_layer_axis``), one per entry and the residual hook of that entry (a reordered
      ``layers`` would silently relabel every row).

    Raises:
        ValueError: what is wrong, by field name.
    """
    check_scalars(type(result), {f.name: getattr(result, f.name) for f in fields(result)})
    sizes: dict[str, int] = {}
    for dim, attr in _LENGTH_OF.items():
        if isinstance(getattr(result, attr, None), tuple):
            sizes[dim] = len(getattr(result, attr))
    for f in fields(result):
        value, annotation = getattr(result, f.name), str(f.type)
        count = f.name.startswith("n_") or "count" in f.name
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
                    raise ValueError(f"{f.name} must hold non-negative whole counts")
    layers = getattr(result, "layers", None)
    if isinstance(layers, tuple) and len(set(layers)) != len(layers):
        raise ValueError(f"layers={list(layers)} repeats an entry")
    for name, allowed in getattr(type(result), "_choices", {}).items():
        if getattr(result, name) not in allowed:
            raise ValueError(f"{name}={getattr(result, name)!r} must be one of {list(allowed)}")
    for name, (low, high) in getattr(type(result), "_ranges", {}).items():
        value = getattr(result, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
            raise ValueError(f"{name}={value!r} must lie in ({low}, {high})")
    hooks = getattr(getattr(result, "provenance", None), "hook_points", ())
    if isinstance(layers, tuple) and hooks and getattr(type(result), "_layer_axis", False):
        if len(hooks) != len(layers):
            raise ValueError(
                f"provenance.hook_points has {len(hooks)} entries for {len(layers)} layers"
            )
        for layer, hook in zip(layers, hooks, strict=True):
            resid = resid_hook_name(layer)
            if re.fullmatch(r"blocks\.\d+\.hook_resid_(pre|post)", hook) and hook != resid:
                raise ValueError(
                    f"layer entry {layer} is recorded at {hook}, but entry {layer} is {resid}: "
                    "layers and hook_points disagree (reordered or edited layers)"
                )


def load_result(cls: Any, path: str | Path, stem: str) -> Any:
    """Load a result written by :func:`save_result` into ``cls`` (no pickle).

    Raises:
        ResultsNotFoundError: a file is missing.
        IncompatibleResultsError: wrong format, missing or unknown fields, bad shapes.
    """
    folder = Path(path).expanduser()
    meta, tensors = read_saved(folder, stem)
    fmt = f"homoglens.{cls.__name__}/1"
    if not isinstance(meta, dict) or meta.pop("format", None) != fmt:
        raise IncompatibleResultsError(f"{folder} does not hold a {fmt} result")
    names = {f.name: f for f in fields(cls)}
    given = set(meta) | set(tensors)
    if not given <= set(names):
        raise IncompatibleResultsError(f"{folder}: unknown fields {sorted(given - set(names))}")
    kwargs: dict[str, Any] = dict(tensors)
    for name, value in meta.items():
        tupled = name != "provenance" and str(names[name].type).startswith("tuple")
        kwargs[name] = _deep_tuple(value) if tupled else value
    return checked_result(cls, folder, kwargs)


def checked_result(cls: Any, folder: Path, kwargs: dict[str, Any]) -> Any:
    """``cls(**kwargs)`` read from ``folder``, with its scalars, invariants and cross-field
    constraints checked; any failure is an :class:`IncompatibleResultsError` naming it."""
    try:
        prov = kwargs.get("provenance")
        if isinstance(prov, dict):  # as saved in JSON
            hooks = tuple(prov.get("hook_points", ()))
            kwargs = {**kwargs, "provenance": Provenance(**{**prov, "hook_points": hooks})}
        check_scalars(cls, kwargs)
        result = cls(**kwargs)
        validate_result(result)
        return result
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise IncompatibleResultsError(
            f"{folder} does not hold a consistent {cls.__name__}: {err}"
        ) from None


def merge_parts(parts: Sequence[Any], cls: type) -> Any:
    """Check the argument of a ``merge()``: a non-empty sequence of ``cls`` results; return
    the first."""
    if not parts:
        raise IncompatibleResultsError("merge() needs at least one result")
    wrong = [type(p).__name__ for p in parts if not isinstance(p, cls)]
    if wrong:
        raise IncompatibleResultsError(f"merge() takes {cls.__name__} objects, got {wrong}")
    return parts[0]


class SavedResult:
    """Mixin of the result dataclasses: ``save(path)`` / ``load(path)`` as
    ``{_stem}.safetensors`` (tensor fields) + ``{_stem}.json`` (the rest); never pickle."""

    _stem: ClassVar[str]

    def save(self, path: str | Path) -> Path:
        """Save into the folder ``path`` (created if missing) as safetensors + JSON.

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created."""
        return save_result(self, path, self._stem)

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Load what :meth:`save` wrote.

        Raises:
            ResultsNotFoundError: a file is missing. IncompatibleResultsError: a bad file."""
        return load_result(cls, path, cls._stem)
