"""The one save/load of every result: a frozen result dataclass as safetensors + JSON with a
format tag (:class:`SavedResult`, :func:`save_result`, :func:`load_result`), its values checked
on load (:mod:`homoglens.results.validation`); the files and their sha256 are
:mod:`homoglens.results.storage`'s, the provenance :mod:`homoglens.results.provenance`'s. And the
one ``plot()`` of every result (:class:`Plotted`), drawn by the figure function its class names
(in the measurement's package, composed from :mod:`homoglens.results.figure_parts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, fields
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

import torch

from homoglens.core.errors import IncompatibleResultsError, InvalidInputError
from homoglens.results.provenance import Provenance
from homoglens.results.storage import folder_path, read_saved, save_folder, write_pair
from homoglens.results.validation import check_provenance, check_scalars, validate_result

if TYPE_CHECKING:
    from pathlib import Path

    from matplotlib.figure import Figure
    from plotly.graph_objects import Figure as PlotlyFigure

    from homoglens.core.types import PlotBackend


# The one-line ``repr`` of the results that name their settings: ``Name(key=value, ...)``.


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


# The one atomic ``save`` of the composite results (a study, a comparison) saved as a folder of
# their own files and their parts' folders: :class:`FolderSaved`.


class FolderSaved:
    """Mixin of the composite results: :meth:`_save_folder` writes the result's files with
    :meth:`_write_into` into the folder it is given, atomically (:func:`save_folder`), owning the
    entry names :attr:`_own` and writing :attr:`_manifest` (the result's JSON) last."""

    _own: ClassVar[tuple[str, ...]]
    """Glob patterns of the entry names a saved result of this kind holds."""
    _manifest: ClassVar[str]
    """The entry written last: the JSON, which records the sha256 of the others."""

    def _write_into(self, folder: Path) -> None:
        """Write this result's files into ``folder`` (each composite result writes its own)."""
        raise NotImplementedError

    def _save_folder(self, path: str | Path) -> Path:
        """Save into the folder ``path`` atomically: a save that fails or is interrupted
        leaves an older result there loadable and unchanged, or refused on load, never a mix.

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created.
        """
        return save_folder(path, self._write_into, own=self._own, manifest=self._manifest)


def selected_layers(layers: Any, have: tuple[int, ...], what: str) -> list[int]:
    """The entries ``sel(layers)`` keeps: one layer or a list of them (Python, numpy or torch
    integers), distinct, each in ``have``, in ascending order (as a measurement's ``layers=``).

    Raises:
        InvalidInputError: not integers (a bool is not a layer), empty, or repeated.
        IncompatibleResultsError: a layer ``what`` does not hold.
    """
    from homoglens.core.validate import as_int

    one = getattr(layers, "ndim", None) == 0 or (
        isinstance(layers, int) and not isinstance(layers, bool)
    )
    if isinstance(layers, (str, bytes, bool)) or not (one or hasattr(layers, "__iter__")):
        raise InvalidInputError(f"sel() takes a layer or a list of layers, got {layers!r}")
    values: Any = [layers] if one else layers
    chosen = [as_int("layers", v) for v in values]
    if not chosen:
        raise InvalidInputError("sel() needs at least one layer")
    if len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"layers={chosen} repeats an entry; give each layer once")
    missing = [layer for layer in chosen if layer not in have]
    if missing:
        raise IncompatibleResultsError(f"layers {missing} are not in {what} (it has {list(have)})")
    return sorted(chosen)


def entry_index(layer: Any, have: Sequence[int], what: str) -> int:
    """The index in ``have`` of one residual entry ``layer`` of a result: an entry ``have``
    holds (a Python, numpy or torch integer), or a negative index counted from the end (-1: the
    last entry held). The one lookup of "which entry of this result" behind every method and
    figure that reads one entry.

    Raises:
        InvalidInputError: not an integer (a bool is not a layer), or an entry ``what`` does not
            hold (the message lists those it holds).
    """
    from homoglens.core.validate import as_int

    if isinstance(layer, (bool, str, bytes)) or not hasattr(layer, "__index__"):
        raise InvalidInputError(f"layer={layer!r} must be an integer entry of {what}")
    layer = as_int("layer", layer)
    if -len(have) <= layer < 0:
        return len(have) + layer
    if layer in have:
        return list(have).index(layer)
    raise InvalidInputError(f"layer={layer} is not an entry of {what}; it holds {list(have)}")


def _deep_tuple(value: Any) -> Any:
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, list) else value


def result_files(result: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensor fields and the JSON of a frozen result dataclass (with its format tag)."""
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
    return tensors, meta


def save_result(result: Any, path: str | Path, stem: str) -> Path:
    """Save a frozen result dataclass as ``{stem}.safetensors`` (its tensor fields) and
    ``{stem}.json`` (every other field, the format ``homoglens.{ClassName}/1`` and the sha256
    of the safetensors), atomically (:func:`save_folder`); no pickle.

    Raises:
        InvalidInputError: ``path`` is a file.
    """
    tensors, meta = result_files(result)
    return save_folder(
        path,
        lambda folder: write_pair(folder, stem, tensors, meta),
        own=(f"{stem}.json", f"{stem}.safetensors"),
        manifest=f"{stem}.json",
    )


def load_result(cls: Any, path: str | Path, stem: str) -> Any:
    """Load a result written by :func:`save_result` into ``cls`` (no pickle).

    Raises:
        ResultsNotFoundError: a file is missing.
        IncompatibleResultsError: wrong format, missing or unknown fields, bad shapes or
            values, a file that does not match the sha256 recorded in the JSON.
    """
    folder = folder_path(path, "load")
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
    return checked_result(cls, folder, kwargs, stem=stem)


def checked_result(
    cls: Any, folder: Path, kwargs: dict[str, Any], *, stem: str | None = None
) -> Any:
    """``cls(**kwargs)`` read from ``folder`` (``{stem}.json`` + ``{stem}.safetensors``), with
    its scalars, provenance, invariants, values and cross-field constraints checked.

    Raises:
        IncompatibleResultsError: any failure, naming the file, the field and the bad value.
    """
    stem = str(stem or getattr(cls, "_stem", None) or cls.__name__)
    try:
        if isinstance(kwargs.get("provenance"), dict):  # as saved in JSON
            kwargs = {**kwargs, "provenance": Provenance(**check_provenance(kwargs["provenance"]))}
        check_scalars(cls, kwargs)
        result = cls(**kwargs)
        validate_result(result)
        return result
    except (ValueError, TypeError, IndexError, KeyError) as err:
        field = str(getattr(err, "field", "")).split(".")[0]
        if field not in kwargs:  # a derived value, or no one field
            where = f"{folder / stem}.safetensors + .json"
        elif isinstance(kwargs[field], torch.Tensor):
            where = f"{folder / stem}.safetensors"
        else:
            where = f"{folder / stem}.json"
        raise IncompatibleResultsError(
            f"{where} does not hold a consistent {cls.__name__}: {err}; the file was edited or "
            "is corrupt: save the result again"
        ) from None


class SavedResult:
    """Mixin of the result dataclasses: ``save(path)`` / ``load(path)`` as
    ``{_stem}.safetensors`` (tensor fields) + ``{_stem}.json`` (the rest, and the sha256 of the
    safetensors); never pickle."""

    _stem: ClassVar[str]

    def save(self, path: str | Path) -> Path:
        """Save into the folder ``path`` (created if missing) as safetensors + JSON,
        atomically: a failed or interrupted save leaves an older result there loadable and
        unchanged, or refused on load; never a mix (:func:`save_folder`).

        Raises:
            InvalidInputError: ``path`` is a file or cannot be created."""
        return save_result(self, path, self._stem)

    def _write_into(self, folder: Path) -> None:
        """Write this result's files into ``folder`` (a part of a composite result)."""
        tensors, meta = result_files(self)
        write_pair(folder, self._stem, tensors, meta)

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Load what :meth:`save` wrote, with its values checked (:func:`validate_result`).

        Raises:
            ResultsNotFoundError: a file is missing. IncompatibleResultsError: a bad file, bad
                values, or a file that does not match the sha256 recorded in the JSON."""
        return load_result(cls, path, cls._stem)


class Plotted:
    """Mixin of the results that draw a figure: ``plot(backend=...)`` draws the figure function
    that ``_figure`` names (what it shows: the class
    docstring). A result whose figure takes options of its own (a metric, a layer, a title)
    overrides ``plot`` with them, documents only them, and draws through :meth:`_draw`."""

    _figure: ClassVar[str]
    """The figure function, ``"module.function"`` under ``homoglens`` (the measurement's own
    package, e.g. ``"bias.figure.bias_figure"``), imported when a figure is made; called as
    ``figure(result, *options, backend=backend, **keyword_options)``."""

    @overload
    def plot(self, *, backend: Literal["matplotlib"] = "matplotlib") -> Figure: ...
    @overload
    def plot(self, *, backend: Literal["plotly"]) -> PlotlyFigure: ...
    def plot(self, *, backend: PlotBackend = "matplotlib") -> Figure | PlotlyFigure:
        """Draw this result's figure (what it shows: the class docstring).

        Args:
            backend: ``"matplotlib"`` (the default: a static figure for files) or ``"plotly"``
                (interactive: hover values with units, zoom, legend toggles; needs
                ``pip install "homoglens[plotly]"``).

        Returns:
            A matplotlib ``Figure`` (displays inline in Jupyter), or with ``backend="plotly"`` a
            ``plotly.graph_objects.Figure``.

        Raises:
            InvalidInputError: ``backend`` is neither ``"matplotlib"`` nor ``"plotly"`` (or an
                option of a result's own ``plot`` is not in the result).
            MissingDependencyError: ``backend="plotly"`` without plotly installed.
        """
        return self._draw(backend=backend)

    def _draw(self, *options: Any, backend: PlotBackend, **keyword_options: Any) -> Any:
        """Draw with this result's figure function (:attr:`_figure`), passing ``options`` after
        the result and ``keyword_options`` with the backend.

        Raises:
            InvalidInputError: an unknown ``backend``. MissingDependencyError: plotly missing.
        """
        module, _, name = self._figure.rpartition(".")
        figure = getattr(import_module(f"homoglens.{module}"), name)
        return figure(self, *options, backend=backend, **keyword_options)


class TitledPlotted(Plotted):
    """:class:`Plotted` with a ``title=`` option."""

    @overload
    def plot(
        self, *, title: str | None = None, backend: Literal["matplotlib"] = "matplotlib"
    ) -> Figure: ...
    @overload
    def plot(self, *, title: str | None = None, backend: Literal["plotly"]) -> PlotlyFigure: ...
    def plot(
        self, *, title: str | None = None, backend: PlotBackend = "matplotlib"
    ) -> Figure | PlotlyFigure:
        """Draw this result's figure (what it shows: the class docstring) titled ``title``.

        Args:
            title: Figure title (default: the model and what was measured).
            backend: As in :meth:`Plotted.plot`, which says what is returned and raised.
        """
        return self._draw(title=title, backend=backend)


class LayerPlotted(Plotted):
    """:class:`Plotted` with a residual entry ``layer`` and a ``title=`` option."""

    @overload
    def plot(
        self,
        layer: int = -1,
        *,
        title: str | None = None,
        backend: Literal["matplotlib"] = "matplotlib",
    ) -> Figure: ...
    @overload
    def plot(
        self, layer: int = -1, *, title: str | None = None, backend: Literal["plotly"]
    ) -> PlotlyFigure: ...
    def plot(
        self, layer: int = -1, *, title: str | None = None, backend: PlotBackend = "matplotlib"
    ) -> Figure | PlotlyFigure:
        """Draw this result's figure (what it shows: the class docstring) at residual entry
        ``layer``.

        Args:
            layer: Index into :attr:`layers` (default: the last entry).
            title: Figure title (matplotlib: none by default; plotly: the provenance).
            backend: As in :meth:`Plotted.plot`, which says what is returned and raised.
        """
        return self._draw(layer, title=title, backend=backend)
