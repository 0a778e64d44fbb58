"""When attention sinks emerge (Gu et al. 2024, arXiv 2410.10781): Gu et al.'s sink rate over
the training checkpoints of one run and against the weight decay of otherwise identical runs,
each with a block-bootstrap interval over windows (:func:`sink_emergence_study`).

It composes :func:`homoglens.over_checkpoints` (each checkpoint or run loaded alone, the same
token ids through each) with the per-window sink importances of :func:`homoglens.sink_scores`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float

from homoglens.core.errors import InvalidInputError, ModelFolderNotFoundError
from homoglens.core.stats import estimate
from homoglens.core.types import Backend, BosPolicy, HookedModel
from homoglens.core.validate import as_bool, as_float, as_int
from homoglens.models.assets import SHIPPED_MODELS, checkpoint_folders, shipped_model_folder
from homoglens.reproductions.sink_emergence_result import METRICS, SinkEmergence
from homoglens.run.data import DataInput, TokenBatch
from homoglens.sinks.scores import sink_pass
from homoglens.training.sweep_result import CheckpointSweep
from homoglens.training.sweeps import over_checkpoints

__all__ = ["WEIGHT_DECAY_FOLDER", "sink_emergence_study", "weight_decay_runs"]

WEIGHT_DECAY_FOLDER = "weight_decay"
"""The sub-folder of a run folder that holds its weight-decay runs, ``wd<value>/`` each (the
shipped ``homoglens/tiny-rotary-bos`` ships ``wd0.0``, ``wd0.1`` and ``wd1.0``: 800 steps each,
otherwise its recipe)."""

PathLikes = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def weight_decay_runs(folder: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The weight-decay runs of a run folder (or a shipped model name): every
    ``weight_decay/wd<value>/`` model folder, by ascending weight decay (read from each
    folder's ``training.json``).

    Args:
        folder: A run folder, or a name in :data:`homoglens.models.assets.SHIPPED_MODELS`
            (``"homoglens/tiny-rotary-bos"`` ships three).

    Returns:
        Loadable model folders.

    Raises:
        ModelFolderNotFoundError: no ``weight_decay/wd*/`` model folder there.
        InvalidInputError: a folder without a readable ``training.json``.
    """
    name = os.fspath(folder)
    path = shipped_model_folder(name) if name in SHIPPED_MODELS else Path(name).expanduser()
    found = [
        sub for sub in (path / WEIGHT_DECAY_FOLDER).glob("wd*") if (sub / "config.json").is_file()
    ]
    if not found:
        raise ModelFolderNotFoundError(
            f"{path} holds no {WEIGHT_DECAY_FOLDER}/wd<value>/ model folders; train them with "
            "homoglens.training.train.train_model(TrainingConfig(..., weight_decay=...), out) and "
            "pass the folders as runs="
        )
    return tuple(sorted(found, key=lambda sub: _recorded(sub)[0]))


def _recorded(folder: Path) -> tuple[float, float]:
    """``(weight decay, optimiser steps)`` of a run's weights, from its ``training.json`` (a
    final model) or ``checkpoint.json`` (a checkpoint)."""
    try:
        if (folder / "checkpoint.json").is_file():
            record = json.loads((folder / "checkpoint.json").read_text())
            return float(record["config"]["weight_decay"]), float(record["step"])
        config = json.loads((folder / "training.json").read_text())["config"]
        return float(config["weight_decay"]), float(config["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        raise InvalidInputError(
            f"{folder} has no readable training.json (or checkpoint.json) with "
            "config.weight_decay: a weight-decay run must be a folder written by "
            "homoglens.training.train.train_model"
        ) from None


def _folders(value: Any, what: str) -> list[Path]:
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise InvalidInputError(f"{what}={value!r} must be a folder or a non-empty list of them")
    out = []
    for item in value:
        if not isinstance(item, (str, os.PathLike)) or not Path(item).expanduser().is_dir():
            raise InvalidInputError(f"{what}: {item!r} is not a model folder")
        out.append(Path(item).expanduser())
    return out


def _heldout(first: Path, n_seq: int) -> TokenBatch:
    """``n_seq`` held-out windows of the run's ``n_ctx``, starting with BOS when it trained so."""
    from transformers import AutoTokenizer

    from homoglens.training.train import heldout_windows

    record = next(
        (json.loads((d / n).read_text()) for d in (first, first.parent.parent)
         for n in ("checkpoint.json", "training.json") if (d / n).is_file()),
        None,
    )  # fmt: skip
    if record is None:
        raise InvalidInputError(
            f"{first} records no training settings (checkpoint.json / training.json): pass data="
        )
    config = record["config"]
    tokenizer = AutoTokenizer.from_pretrained(str(first))
    return heldout_windows(
        tokenizer, n_seq=n_seq, seq_len=int(config["n_ctx"]), bos=bool(config["bos"])
    )


class _Alphas:
    """The sweep measure: Gu et al.'s importance alpha ``[window layer head]`` of each model,
    kept beside the sink rate that over_checkpoints stores."""

    def __init__(self, key: int, eps: float, batch_size: int) -> None:
        self.key, self.eps, self.batch_size = key, eps, batch_size
        self.alphas: list[torch.Tensor] = []

    def __call__(self, model: HookedModel, batch: Any) -> dict[str, float]:
        scores, alpha = sink_pass(
            model, batch, self.key, self.eps, self.batch_size, None, "auto", False
        )
        self.alphas.append(alpha.double().cpu())
        return {"sink_rate": scores.sink_rate}


def _intervals(
    result: SinkEmergence, sweep: str, n_boot: int, seed: int
) -> Float[torch.Tensor, "model metric 2"]:
    """Block-bootstrap interval of each model's mean window value of each metric (the windows
    are consecutive stretches of one novel: correlated, hence blocks)."""
    rows = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*no spread.*")
        for metric in METRICS:
            ends = []
            for row in result.window_values(metric, sweep=sweep):
                est = estimate([row[None].double()], n_boot=n_boot, ci=result.ci, seed=seed)
                ends.append((est.ci_low, est.ci_high))
            rows.append(torch.tensor(ends, dtype=torch.float64, device="cpu").reshape(-1, 2))
    return torch.stack(rows, 1)


def _sweep(
    folders: list[Path], data: Any, rates: _Alphas, options: dict[str, Any]
) -> CheckpointSweep:
    return over_checkpoints(rates, [os.fspath(f) for f in folders], data, **options)


def sink_emergence_study(
    checkpoints: PathLikes = "homoglens/tiny-rotary-bos",
    runs: PathLikes | None = "homoglens/tiny-rotary-bos",
    data: DataInput | None = None,
    *,
    n_seq: int = 64,
    key: int = 0,
    eps: float = 0.3,
    backend: Backend = "auto",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    batch_size: int = 8,
    bos: BosPolicy | bool = "auto",
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    progress: bool = True,
) -> SinkEmergence:
    """Gu et al.'s sink rate over the training steps of one run and against weight decay.

    The sink rate Sink_{key+1}^eps is the percent of (window, layer, head) whose importance
    alpha (the mean attention of queries ``key..T-1`` on ``key``) exceeds ``eps``
    (:func:`homoglens.sink_scores`' ``sink_rate``). Each checkpoint and run reads the same token
    ids, loaded one at a time (:func:`homoglens.over_checkpoints`). Intervals: block bootstrap
    over windows (:func:`homoglens.core.stats.estimate`), the unit of replication within one
    training run; one training seed per run gives no between-seed interval.

    Args:
        checkpoints: A run folder with ``checkpoints/step<N>/`` or a shipped model that ships
            them (default ``"homoglens/tiny-rotary-bos"``: steps 0 to 3000), or a list of
            checkpoint folders in training order.
        runs: Runs that differ only in weight decay: a run folder or shipped model holding
            ``weight_decay/wd<value>/`` (:func:`weight_decay_runs`; the default ships 0.0, 0.1
            and 1.0 at 800 steps), or a list of folders written by
            :func:`homoglens.training.train.train_model`; ``None``: no weight-decay sweep.
        data: As for :func:`homoglens.sink_scores`; ``None`` (the default): ``n_seq`` windows
            of the held-out novel, as long as the first checkpoint's training windows and
            starting with BOS when it trained so (:func:`homoglens.training.train.heldout_windows`).
        n_seq: Held-out windows when ``data`` is ``None``, >= 2.
        key: The sink key (0-indexed), >= 0.
        eps: The importance threshold, in (0, 1) (Gu et al.: 0.3).
        backend: As for :func:`homoglens.load_model`.
        device: As for :func:`homoglens.load_model`.
        dtype: As for :func:`homoglens.load_model`.
        batch_size: Windows per forward pass.
        bos: BOS policy for text data.
        n_boot: Bootstrap resamples, >= 1.
        ci: Coverage of the intervals, in (0, 1).
        seed: Seed of the resamples.
        progress: A progress bar over the models.

    Returns:
        A :class:`~homoglens.reproductions.sink_emergence_result.SinkEmergence` (rates in percent,
        by step and by weight decay, all layers with intervals and per block; ``plot()`` redraws Gu
        et al.'s figures; ``difference(high, low)`` the paired difference of two runs).

    Raises:
        InvalidInputError: ``eps`` outside (0, 1), a negative ``key``, bad ``n_seq``,
            ``n_boot``, ``ci`` or ``batch_size``, a run without ``training.json``, runs that
            repeat a weight decay, runs of another depth than the checkpoints.
        ModelFolderNotFoundError, UnknownModelError: a folder or shipped model not found.

    References:
        Gu et al. 2024, "When Attention Sink Emerges in Language Models: An Empirical View",
        arXiv 2410.10781.

    Examples:
        >>> from homoglens import sink_emergence_study
        >>> result = sink_emergence_study(n_seq=8, progress=False)  # doctest: +SKIP
        >>> result.step_rate[0] < result.step_rate[-1]  # doctest: +SKIP
        tensor(True)
    """
    eps = as_float("eps", eps, low=0.0, high=1.0)
    key = as_int("key", key, low=0)
    n_seq = as_int("n_seq", n_seq, low=2)
    n_boot = as_int("n_boot", n_boot, low=1)
    ci = as_float("ci", ci, low=0.0, high=1.0)
    batch_size = as_int("batch_size", batch_size, low=1)
    seed = as_int("seed", seed, low=0)
    progress = as_bool("progress", progress)
    steps_of = checkpoints
    if isinstance(checkpoints, (str, os.PathLike)):
        steps_of = checkpoint_folders(checkpoints)
    step_folders = _folders(steps_of, "checkpoints")
    run_folders: list[Path] = []
    if runs is not None:
        given = runs
        if isinstance(runs, (str, os.PathLike)) and not (Path(runs) / "config.json").is_file():
            given = weight_decay_runs(runs)
        run_folders = _folders(given, "runs")
    recorded = [_recorded(f) for f in run_folders]
    decays = [wd for wd, _ in recorded]
    if len(set(decays)) != len(decays):
        raise InvalidInputError(f"runs repeat a weight decay: {decays}; give one run each")
    order = sorted(range(len(run_folders)), key=lambda i: decays[i])
    run_folders, recorded = [run_folders[i] for i in order], [recorded[i] for i in order]
    if data is None:
        data = _heldout(step_folders[0], n_seq)
    options = {"backend": backend, "device": device, "dtype": dtype, "bos": bos,
               "progress": progress}  # fmt: skip
    by_step = _Alphas(key, eps, batch_size)
    sweep = _sweep(step_folders, data, by_step, options)
    by_decay = _Alphas(key, eps, batch_size)
    # one sweep per run: runs are separate models, whose folder names may repeat (step<N>)
    decay_sweeps = [_sweep([folder], data, by_decay, options) for folder in run_folders]
    decay_sweep = decay_sweeps[0] if decay_sweeps else None
    name = os.fspath(checkpoints) if isinstance(checkpoints, (str, os.PathLike)) else None
    result = _result(sweep, decay_sweep, by_step, by_decay, run_folders, recorded,
                     key, eps, ci, name)  # fmt: skip
    return replace(
        result,
        step_interval=_intervals(result, "step", n_boot, seed),
        decay_interval=_intervals(result, "weight_decay", n_boot, seed),
    )


def _result(
    sweep: CheckpointSweep,
    decay_sweep: CheckpointSweep | None,
    by_step: _Alphas,
    by_decay: _Alphas,
    run_folders: list[Path],
    recorded: list[tuple[float, float]],
    key: int,
    eps: float,
    ci: float,
    name: str | None,
) -> SinkEmergence:
    """The :class:`SinkEmergence` of the two sweeps, intervals still NaN."""
    f64 = {"dtype": torch.float64, "device": "cpu"}
    step_alpha = torch.stack(by_step.alphas)
    inner = tuple(step_alpha.shape[1:])
    decay_alpha = torch.stack(by_decay.alphas) if by_decay.alphas else torch.zeros(0, *inner, **f64)
    if tuple(decay_alpha.shape[1:]) != inner:
        raise InvalidInputError(
            f"the weight-decay runs give [window layer head] = {tuple(decay_alpha.shape[1:])}, "
            f"the checkpoints {inner}: compare runs of one recipe on the same windows"
        )
    source = sweep.provenance.model_source
    if decay_sweep is not None:
        source += "; weight-decay runs: " + ", ".join(f.name for f in run_folders)
    n_c, n_r = len(sweep.checkpoints), len(run_folders)
    return SinkEmergence(
        key=key,
        eps=eps,
        ci=ci,
        checkpoints=sweep.checkpoints,
        steps=sweep.steps,
        step_alpha=step_alpha,
        step_interval=torch.full((n_c, len(METRICS), 2), float("nan"), **f64),
        runs=tuple(f"wd{wd:g}" for wd, _ in recorded),
        weight_decays=torch.tensor([wd for wd, _ in recorded], **f64).reshape(-1),
        run_steps=torch.tensor([s for _, s in recorded], **f64).reshape(-1),
        decay_alpha=decay_alpha,
        decay_interval=torch.full((n_r, len(METRICS), 2), float("nan"), **f64),
        provenance=replace(
            sweep.provenance, model=name or sweep.provenance.model, model_source=source
        ),
    )
