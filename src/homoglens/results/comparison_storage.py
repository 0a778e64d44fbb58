"""How a :class:`~homoglens.ModelComparison` is written and read: ``comparison.safetensors``
(every per-window statistic) + a folder per computed model + ``comparison.json``, and one
model's statistics exported in the format :func:`~homoglens.compare_models` reads for shipped
replicates."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from homoglens.errors import IncompatibleResultsError
from homoglens.results import PositionAblationStudy, prepare_folder, read_saved
from homoglens.results.base import checked_result
from homoglens.results.similarity import PositionalSimilarity
from homoglens.results.sinks import SinkScores
from homoglens.results.storage import folder_path, write_pair
from homoglens.types import POSITION_ABLATIONS

if TYPE_CHECKING:
    from homoglens.results.comparison import ModelComparison

COMPARISON_SCALARS = ("edge_k", "eps", "n_boot", "ci", "seed", "block", "sesoi", "loss_sesoi")
"""The scalar settings of a comparison, saved as they are in ``comparison.json``."""


def model_parts(meta: dict[str, Any]) -> list[str]:
    """The part JSONs a comparison's loader reads: the study, similarity and sink scores of
    each computed model (``model_<i>/``, ``i`` its index among the labels)."""
    labels, computed = meta.get("labels"), meta.get("computed")
    if not isinstance(labels, list) or not isinstance(computed, list):
        return []
    return [
        f"model_{labels.index(label)}/{name}"
        for label in computed
        if label in labels
        for name in ("study/study.json", "similarity/similarity.json", "sinks/sink_scores.json")
    ]


def export_replicate(comparison: ModelComparison, label: str, path: str | Path) -> Path:
    """Write one model's per-window statistics as :meth:`ModelComparison.export_statistics`
    says: ``{name}.safetensors`` + ``{name}.json`` into ``path``, the JSON last.

    Args:
        comparison: The comparison.
        label: A model label.
        path: The folder (created if missing).

    Returns:
        The JSON file's path.

    Raises:
        InvalidInputError: unknown label, or ``path`` is a file or cannot be created.
    """
    comparison._check_label(label)
    folder = prepare_folder(path)
    stem = label.split("/")[-1]
    tensors = {
        f"{mode}/{stat}": values.float().contiguous()
        for mode, stats in comparison.statistics[label].items()
        for stat, values in stats.items()
    }
    meta = {
        "format": "homoglens.ReplicateStatistics/1",
        "label": label,
        "variant": comparison.variants[label],
        "heldout": comparison.heldout.get(label, {}),
        "layers": list(comparison.layers),
        "edge_k": comparison.edge_k,
        "centre": comparison.settings.get("centre"),
        "sp_uncentred": comparison._sp_uncentred,
        "eps": comparison.eps,
        "seed": comparison.seed,
        "n_windows": comparison.n_sequences,
        "data": comparison.settings.get("data", ""),
        "window_index": comparison.settings.get("window_index"),
    }
    out = folder / f"{stem}.json"
    with contextlib.suppress(FileNotFoundError):  # never old JSON beside new tensors
        out.unlink()
    write_pair(folder, stem, tensors, meta)
    return out


def write_comparison(comparison: ModelComparison, folder: Path) -> None:
    """Write a comparison into ``folder``: the study, similarity and sink scores of each
    computed model (``model_<i>/``), then ``comparison.safetensors`` + ``comparison.json``
    (last, with the sha256 of the safetensors and of each part's JSON).

    Args:
        comparison: The comparison.
        folder: An existing folder (the atomic save of :func:`save_folder` prepares it).
    """
    parts = []
    for i, label in enumerate(comparison.labels):
        if label in comparison.computed:
            for name, part in (
                ("study", comparison.studies[label]),
                ("similarity", comparison.similarity[label]),
                ("sinks", comparison.sinks[label]),
            ):
                (folder / f"model_{i}" / name).mkdir(parents=True)
                part._write_into(folder / f"model_{i}" / name)
                stem = "study" if name == "study" else part._stem  # type: ignore[union-attr]
                parts.append(f"model_{i}/{name}/{stem}.json")
    tensors = {
        f"{i}/{mode}/{stat}": values.contiguous()
        for i, label in enumerate(comparison.labels)
        for mode, stats in comparison.statistics[label].items()
        for stat, values in stats.items()
    }
    meta = {
        "format": "homoglens.ModelComparison/2",
        "labels": list(comparison.labels),
        "layers": list(comparison.layers),
        "variants": comparison.variants,
        "computed": list(comparison.computed),
        "heldout": comparison.heldout,
        "no_positions": comparison.no_positions,
        "group_by": comparison.group_by,
        **{k: getattr(comparison, k) for k in COMPARISON_SCALARS},
        "settings": comparison.settings,
    }
    write_pair(folder, "comparison", tensors, meta, parts)


def _saved_order(key: str) -> tuple[int, int, int, str]:
    """Where the tensor ``key`` (``"<label index>/<mode>/<statistic>"``) stands when a loaded
    comparison's statistics are rebuilt: labels in order, modes and statistics in their
    canonical order (:data:`~homoglens.types.POSITION_ABLATIONS`, ``STATISTICS``), unknown
    names last, by name; the same order on every load."""
    from homoglens.results.comparison import STATISTICS

    i, mode, stat = (key.split("/") + ["", "", ""])[:3]
    modes, stats = tuple(POSITION_ABLATIONS), tuple(STATISTICS)
    return (
        int(i) if i.isdigit() else -1,
        modes.index(mode) if mode in modes else len(modes),
        stats.index(stat) if stat in stats else len(stats),
        key,
    )


def load_comparison(cls: type[ModelComparison], path: str | Path) -> ModelComparison:
    """Load what :meth:`ModelComparison.save` wrote, with its values checked.

    Args:
        cls: The class built (:class:`ModelComparison`).
        path: The folder.

    Returns:
        The comparison.

    Raises:
        ResultsNotFoundError: a file is missing.
        IncompatibleResultsError: wrong format, inconsistent content, values out of range, or a
            file that does not match the sha256 recorded in ``comparison.json``.
    """
    folder = folder_path(path, "load")
    meta, tensors = read_saved(folder, "comparison", parts=model_parts)
    if not isinstance(meta, dict) or meta.get("format") != "homoglens.ModelComparison/2":
        raise IncompatibleResultsError(f"{folder} does not hold a ModelComparison/2")
    keys = {"format", "labels", "layers", "variants", "computed", "heldout", "no_positions"}
    keys |= {"group_by", "settings", *COMPARISON_SCALARS}
    if set(meta) != keys:
        raise IncompatibleResultsError(
            f"{folder}/comparison.json has keys {sorted(meta)}, expected {sorted(keys)}"
        )
    labels, computed = meta["labels"], meta["computed"]
    if (
        not isinstance(labels, list)
        or not all(isinstance(v, str) for v in labels)
        or not isinstance(computed, list)
        or not all(isinstance(v, str) and v in labels for v in computed)
    ):
        raise IncompatibleResultsError(
            f"{folder}/comparison.json has labels={labels!r}, computed={computed!r}: "
            "expected strings, the computed ones among the labels; save it again"
        )
    statistics: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for key in sorted(tensors, key=_saved_order):  # safetensors gives no stable order
        values = tensors[key]
        i, mode, stat = (key.split("/") + ["", "", ""])[:3]
        if not i.isdigit() or int(i) >= len(labels) or key.count("/") != 2:
            raise IncompatibleResultsError(
                f"{folder}/comparison.safetensors has a tensor {key!r}, not "
                "'<label index>/<mode>/<statistic>'; save the comparison again"
            )
        statistics.setdefault(labels[int(i)], {}).setdefault(mode, {})[stat] = values
    where = {label: folder / f"model_{labels.index(label)}" for label in computed}
    kwargs = {
        "labels": tuple(labels),
        "statistics": statistics,
        "layers": meta["layers"],
        "variants": meta["variants"],
        "computed": tuple(computed),
        "studies": {k: PositionAblationStudy.load(v / "study") for k, v in where.items()},
        "similarity": {k: PositionalSimilarity.load(v / "similarity") for k, v in where.items()},
        "sinks": {k: SinkScores.load(v / "sinks") for k, v in where.items()},
        "heldout": meta["heldout"],
        "no_positions": meta["no_positions"],
        "group_by": meta["group_by"],
        "settings": meta["settings"],
        **{k: meta[k] for k in COMPARISON_SCALARS},
    }
    if isinstance(kwargs["layers"], list):
        kwargs["layers"] = tuple(kwargs["layers"])
    return checked_result(cls, folder, kwargs, stem="comparison")
