"""Measurements over training checkpoints: the same windows through each checkpoint of one
model, loaded one at a time (:func:`over_checkpoints`)."""

from __future__ import annotations

import gc
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch

from homoglens.core.errors import InvalidInputError
from homoglens.core.types import Backend, BosPolicy, HookedModel
from homoglens.core.validate import as_bool, as_int
from homoglens.models.assets import SHIPPED_MODELS, checkpoint_folders
from homoglens.models.loading import load_model, model_info
from homoglens.profile.measure import homogenization_profile
from homoglens.results.provenance import Provenance
from homoglens.run.data import DataInput, to_token_batch
from homoglens.run.engine import stream
from homoglens.run.losses import MeanLoss
from homoglens.run.provenance import provenance_of
from homoglens.sinks import sink_scores
from homoglens.training.sweep_result import CheckpointSweep

__all__ = ["SWEEP_MEASURES", "over_checkpoints"]

SweepMeasure = Callable[[HookedModel, Any], Mapping[str, "float | torch.Tensor"]]
"""A measurement of one checkpoint: ``(model, TokenBatch) -> {name: value}``, a float (or a
0-d tensor) for a scalar metric, a ``[n_layers + 1]`` tensor for one per residual entry."""

SWEEP_MEASURES: tuple[str, ...] = ("homogenization", "sinks", "loss")
"""Built-in measurements of :func:`over_checkpoints`:

* ``"homogenization"``: :func:`~homoglens.homogenization_profile`'s mean pairwise cosine
  (``homogenization``) and its anisotropy-adjusted value (``homogenization_adjusted``) at the
  last residual entry (scalars) and at every entry (per-entry metrics);
* ``"sinks"``: :func:`~homoglens.sink_scores` on key 0: ``sink_rate`` (Gu et al.'s Sink_1^0.3,
  percent of (sequence, layer, head) with importance > 0.3) and ``sink_mass`` (mean attention on
  key 0 over heads, layers and later queries, in [0, 1]);
* ``"loss"``: mean next-token cross-entropy (nats per token).
"""


def _homogenization(model: HookedModel, batch: Any, batch_size: int) -> dict[str, Any]:
    profile = homogenization_profile(model, batch, batch_size=batch_size, progress=False)
    raw, adjusted = profile.mean_pairwise, profile.adjusted
    return {
        "homogenization": float(raw[-1]),
        "homogenization_adjusted": float(adjusted[-1]),
        "homogenization@": raw,
        "homogenization_adjusted@": adjusted,
    }


def _sinks(model: HookedModel, batch: Any, batch_size: int) -> dict[str, Any]:
    scores = sink_scores(model, batch, batch_size=batch_size, progress=False)
    return {"sink_rate": scores.sink_rate, "sink_mass": float(scores.mass.nanmean())}


def _loss(model: HookedModel, batch: Any, batch_size: int) -> dict[str, Any]:
    reducer = MeanLoss()
    stream(model, batch, [reducer], batch_size=batch_size, desc="loss", progress=False)
    return {"loss": reducer.value}


_BUILT_IN = {"homogenization": _homogenization, "sinks": _sinks, "loss": _loss}


def _step_of(label: str, folder: Path | None) -> float:
    """The training step of a checkpoint: its ``checkpoint.json`` / ``training.json`` when it
    is a folder written by :mod:`homoglens.training.train`, else the digits of ``step<N>`` in its
    name (Pythia's revisions), else NaN."""
    import json

    if folder is not None:
        for name, key in (("checkpoint.json", "step"), ("training.json", "config")):
            path = folder / name
            if path.is_file():
                try:
                    record = json.loads(path.read_text())
                    value = record[key] if key == "step" else record["config"]["steps"]
                    return float(value)
                except (ValueError, KeyError, TypeError):
                    break
    found = re.search(r"step[-_]?(\d+)", label)
    return float(found.group(1)) if found else math.nan


def _plan(
    checkpoints: Any, model_name: str | None
) -> list[tuple[str, dict[str, Any], Path | None]]:
    """``(label, load_model keyword arguments, folder or None)`` per checkpoint."""
    if isinstance(checkpoints, (str, os.PathLike)):
        name = os.fspath(checkpoints)
        if model_name is not None:
            raise InvalidInputError(
                "model= takes a list of revisions or checkpoint indices as checkpoints; got a "
                f"single {name!r}"
            )
        if name not in SHIPPED_MODELS and not Path(name).expanduser().is_dir():
            raise InvalidInputError(
                f"checkpoints={name!r} is neither a run folder with checkpoints/ nor a shipped "
                f"model; pass a list of folders, or model='<hub name>' with a list of revisions"
            )
        checkpoints = checkpoint_folders(name)
    if not isinstance(checkpoints, Sequence) or isinstance(checkpoints, (str, bytes)):
        checkpoints = list(checkpoints) if hasattr(checkpoints, "__iter__") else [checkpoints]
    if len(checkpoints) == 0:
        raise InvalidInputError("checkpoints is empty; give at least one")
    plan: list[tuple[str, dict[str, Any], Path | None]] = []
    for item in checkpoints:
        if model_name is not None:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                raise InvalidInputError(
                    f"with model={model_name!r}, each checkpoint is a revision (str) or a "
                    f"TransformerLens checkpoint index (int); got {item!r}"
                )
            if isinstance(item, int):
                plan.append(
                    (f"index={item}", {"name_or_path": model_name, "checkpoint_index": item}, None)
                )
            else:
                plan.append((item, {"name_or_path": model_name, "revision": item}, None))
            continue
        if not isinstance(item, (str, os.PathLike)):
            raise InvalidInputError(
                f"checkpoint {item!r} is not a folder; pass folders, or model='<hub name>' with "
                "revisions or checkpoint indices"
            )
        folder = Path(os.fspath(item)).expanduser()
        if folder.parent.name == "checkpoints":  # a run's checkpoints/step<N>
            label = folder.name
        elif (folder / "checkpoints").is_dir():  # the run's final model
            label = "final"
        else:
            label = os.fspath(item)
        plan.append((label, {"name_or_path": os.fspath(folder)}, folder))
    labels = [label for label, _, _ in plan]
    if len(set(labels)) != len(labels):
        raise InvalidInputError(f"checkpoints repeat: {labels}")
    return plan


def over_checkpoints(
    measure: str | Sequence[str] | SweepMeasure,
    checkpoints: str | os.PathLike[str] | Sequence[str | os.PathLike[str] | int],
    data: DataInput,
    *,
    model: str | None = None,
    backend: Backend = "auto",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    batch_size: int = 8,
    bos: BosPolicy | bool = "auto",
    progress: bool = True,
) -> CheckpointSweep:
    """Measure the same windows at each training checkpoint of one model.

    Checkpoints are loaded one at a time (each is released before the next loads, so memory is
    that of one model); the data is tokenized once, by the first checkpoint's tokenizer, and
    every checkpoint reads the same token ids.

    Args:
        measure: A built-in measurement or several (:data:`SWEEP_MEASURES`: ``"homogenization"``,
            ``"sinks"``, ``"loss"``), or a function ``(model, TokenBatch) -> {name: value}``
            returning floats (scalar metrics) and ``[n_layers + 1]`` tensors (one value per
            residual entry).
        checkpoints: A run folder written by ``homoglens train --save-every`` (its
            ``checkpoints/step<N>/`` then the final model), a shipped model that ships
            checkpoints (``"homoglens/tiny-rotary-bos"``), a list of local model folders, or,
            with ``model=``, a list of Hub revisions (``"step1000"``: Pythia) or TransformerLens
            checkpoint indices (ints).
        data: As for :func:`~homoglens.homogenization_profile` (texts, a text file, token ids,
            a :class:`~homoglens.TokenBatch`), tokenized once.
        model: A Hub name (``"EleutherAI/pythia-70m"``) whose checkpoints are revisions or
            indices.
        backend: As for :func:`~homoglens.load_model`.
        device: As for :func:`~homoglens.load_model`.
        dtype: As for :func:`~homoglens.load_model`.
        batch_size: Windows per forward pass.
        bos: BOS policy for text data.
        progress: A progress bar over the checkpoints.

    Returns:
        A :class:`~homoglens.training.sweep_result.CheckpointSweep`: one row per checkpoint, in the
        order given (``to_pandas()`` is tidy; ``plot()`` draws each scalar metric against the
        training step and the first per-entry metric as a heatmap).

    Raises:
        InvalidInputError: an unknown measure, empty or repeated checkpoints, a folder given
            with ``model=``, a measure function returning something else than floats and
            ``[n_layers + 1]`` tensors.
        UnknownModelError, ModelFolderNotFoundError: a checkpoint cannot be found.

    References:
        Gu et al. 2024, arXiv 2410.10781 (sinks emerge after effective training);
        Biderman et al. 2023, arXiv 2304.01373 (Pythia checkpoints).

    Examples:
        >>> from homoglens import over_checkpoints
        >>> from homoglens.testing import tiny_model_folder
        >>> folders = [tiny_model_folder("gpt2", seed=s) for s in (0, 1)]  # two "checkpoints"
        >>> sweep = over_checkpoints(["sinks", "loss"], folders, ["The cat sat on the mat."] * 2,
        ...                          backend="bridge", progress=False)
        >>> sweep.metrics, tuple(sweep.values.shape)
        (('sink_rate', 'sink_mass', 'loss'), (2, 3))
    """
    measures = _measures(measure)
    batch_size = as_int("batch_size", batch_size, low=1)
    progress = as_bool("progress", progress)
    plan = _plan(checkpoints, model)
    from tqdm.auto import tqdm

    tokens: Any = None
    scalars: dict[str, list[float]] = {}
    per_entry: dict[str, list[torch.Tensor]] = {}
    provenance: Provenance | None = None
    n_entries = -1
    for c, (label, kwargs, _folder) in enumerate(
        tqdm(plan, desc="checkpoints", disable=not progress)
    ):
        loaded = load_model(**kwargs, backend=backend, device=device, dtype=dtype)
        try:
            if tokens is None:
                tokens = to_token_batch(loaded, data, bos=bos)
                n_entries = int(loaded.cfg.n_layers) + 1
            elif int(loaded.cfg.n_layers) + 1 != n_entries:
                raise InvalidInputError(
                    f"checkpoint {label!r} has {int(loaded.cfg.n_layers)} blocks, the first had "
                    f"{n_entries - 1}: a sweep follows one model through training"
                )
            found: dict[str, Any] = {}
            for fn in measures:
                found.update(fn(loaded, tokens, batch_size))
            if provenance is None:
                provenance = provenance_of(model_info(loaded), tokens, range(n_entries), False)
        finally:
            del loaded
            gc.collect()
        for name, value in found.items():
            _store(name, value, c, label, n_entries, scalars, per_entry)
    assert provenance is not None
    run_name = _run_name(checkpoints, model, provenance.model)
    return _sweep(plan, scalars, per_entry, n_entries, provenance, run_name)


def _sweep(
    plan: list[tuple[str, dict[str, Any], Path | None]],
    scalars: dict[str, list[float]],
    per_entry: dict[str, list[torch.Tensor]],
    n_entries: int,
    provenance: Provenance,
    run_name: str,
) -> CheckpointSweep:
    """The :class:`~homoglens.training.sweep_result.CheckpointSweep` of :func:`over_checkpoints`,
    built from what its checkpoints returned (``scalars`` and the per-entry ``per_entry``, one value
    per checkpoint of ``plan`` each), the first checkpoint's ``provenance`` (renamed
    ``run_name``, the checkpoints' labels as its source), and ``n_entries`` residual entries.

    Raises:
        InvalidInputError: the measure returned a metric for some checkpoints only.
    """
    labels = tuple(label for label, _, _ in plan)
    for name, got in (*scalars.items(), *per_entry.items()):
        if len(got) != len(plan):
            raise InvalidInputError(f"the measure returned {name!r} for some checkpoints only")
    values = torch.tensor(
        [scalars[n] for n in scalars], dtype=torch.float64, device="cpu"
    ).T.reshape(len(plan), len(scalars))
    layer_values = (
        torch.stack([torch.stack(per_entry[n]) for n in per_entry], 1)
        if per_entry
        else torch.zeros(len(plan), 0, n_entries, dtype=torch.float64, device="cpu")
    )
    return CheckpointSweep(
        checkpoints=labels,
        steps=torch.tensor(
            [_step_of(lab, f) for lab, _, f in plan], dtype=torch.float64, device="cpu"
        ),
        metrics=tuple(scalars),
        values=values,
        layer_metrics=tuple(name.rstrip("@") for name in per_entry),
        layers=tuple(range(n_entries)),
        layer_values=layer_values,
        provenance=replace(
            provenance,
            model=run_name,
            hook_points=(),
            model_source="checkpoints: " + ", ".join(labels),
        ),
    )


def _run_name(checkpoints: Any, model: str | None, first: str) -> str:
    """What the sweep follows: the Hub model, the run folder or shipped name, else the first
    checkpoint's name."""
    if model is not None:
        return model
    if isinstance(checkpoints, (str, os.PathLike)):
        return os.fspath(checkpoints)
    return first


def _measures(measure: Any) -> list[Callable[[HookedModel, Any, int], Mapping[str, Any]]]:
    if callable(measure):
        user = cast(SweepMeasure, measure)

        def call(model: HookedModel, batch: Any, _size: int) -> Mapping[str, Any]:
            return user(model, batch)

        return [call]
    names = [measure] if isinstance(measure, str) else list(measure) if measure else []
    unknown = [n for n in names if n not in _BUILT_IN]
    if not names or unknown:
        raise InvalidInputError(
            f"measure={measure!r}: give one or more of {list(SWEEP_MEASURES)}, or a function "
            "(model, TokenBatch) -> {name: value}"
        )
    return [_BUILT_IN[n] for n in dict.fromkeys(names)]


def _store(
    name: str,
    value: Any,
    c: int,
    label: str,
    n_entries: int,
    scalars: dict[str, list[float]],
    per_entry: dict[str, list[torch.Tensor]],
) -> None:
    """File one returned value as a scalar or a per-entry metric (``name@`` internally)."""
    if isinstance(value, torch.Tensor) and value.ndim == 1:
        if value.numel() != n_entries:
            raise InvalidInputError(
                f"the measure returned {name!r} with {value.numel()} values at checkpoint "
                f"{label!r}; per-entry metrics need n_layers + 1 = {n_entries}"
            )
        key = name if name.endswith("@") else f"{name}@"
        per_entry.setdefault(key, []).append(value.detach().double().cpu())
        return
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(
            f"the measure returned {name!r} = {type(value).__name__} at checkpoint {label!r}; "
            "return floats or [n_layers + 1] tensors"
        )
    scalars.setdefault(name, []).append(float(value))
