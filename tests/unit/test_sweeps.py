"""over_checkpoints: the same windows through each checkpoint, one model at a time; each row
equals measuring that checkpoint on its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import BACKENDS
from homoglens import (
    InvalidInputError,
    homogenization_profile,
    load_model,
    over_checkpoints,
    sink_scores,
)
from homoglens.testing import tiny_model_folder
from homoglens.training.sweep_result import CheckpointSweep

TEXTS = ["The cat sat on the mat and looked at the door for a while."] * 3


def _run(tmp_path: Path) -> Path:
    """A run folder like ``homoglens train --save-steps 0,10`` writes, from a tiny model whose
    weights are scaled differently at each step."""
    source = tiny_model_folder("neox")
    run = tmp_path / "run"
    for step, scale in ((None, 1.0), (0, 0.5), (10, 0.8)):
        folder = run if step is None else run / "checkpoints" / f"step{step}"
        shutil.copytree(source, folder)
        weights = load_file(str(folder / "model.safetensors"))
        save_file({k: v * scale for k, v in weights.items()}, str(folder / "model.safetensors"))
        if step is not None:
            (folder / "checkpoint.json").write_text(json.dumps({"step": step}))
    (run / "training.json").write_text(json.dumps({"config": {"steps": 20}}))
    return run


def test_each_row_is_that_checkpoint_measured_alone(tmp_path) -> None:
    run = _run(tmp_path)
    backend = BACKENDS[-1]
    sweep = over_checkpoints(
        ["homogenization", "sinks"], run, TEXTS, backend=backend, progress=False
    )
    assert sweep.checkpoints == ("step0", "step10", "final")
    assert sweep.steps.tolist() == [0.0, 10.0, 20.0]
    assert sweep.metrics == (
        "homogenization",
        "homogenization_adjusted",
        "sink_rate",
        "sink_mass",
    )
    assert sweep.layer_metrics == ("homogenization", "homogenization_adjusted")
    steps = [run / "checkpoints" / "step0", run / "checkpoints" / "step10", run]
    for c, folder in enumerate(steps):
        model = load_model(folder, backend=backend)
        profile = homogenization_profile(model, TEXTS, progress=False)
        scores = sink_scores(model, TEXTS, progress=False)
        torch.testing.assert_close(sweep.layer_values[c, 1], profile.adjusted, rtol=0, atol=1e-12)
        assert sweep.metric("homogenization")[c] == pytest.approx(float(profile.mean_pairwise[-1]))
        assert sweep.metric("sink_rate")[c] == pytest.approx(scores.sink_rate)
    assert len(set(sweep.metric("homogenization").tolist())) == 3  # the checkpoints differ
    frame = sweep.to_pandas()
    assert list(frame.columns) == ["checkpoint", "step", "metric", "layer", "value"]
    assert len(frame) == 3 * (4 + 2 * len(sweep.layers))
    again = CheckpointSweep.load(sweep.save(tmp_path / "saved"))
    assert again.checkpoints == sweep.checkpoints and torch.equal(again.values, sweep.values)
    fig = sweep.plot()
    assert len(fig.axes) >= 5
    assert "3 checkpoints" in repr(sweep)


def test_a_measure_function_and_a_list_of_folders(tmp_path) -> None:
    run = _run(tmp_path)
    folders = [run / "checkpoints" / "step10", run]

    def measure(model, batch):
        return {"n_layers": float(model.cfg.n_layers), "ones": torch.ones(model.cfg.n_layers + 1)}

    sweep = over_checkpoints(measure, folders, TEXTS, backend=BACKENDS[-1], progress=False)
    assert sweep.checkpoints == ("step10", "final")
    assert sweep.values[:, 0].tolist() == [2.0, 2.0] or sweep.values[:, 0].min() > 0
    assert sweep.layer_metrics == ("ones",) and bool((sweep.layer_values == 1).all())


@pytest.mark.parametrize(
    ("measure", "checkpoints", "kwargs", "match"),
    [
        ("entropy", None, {}, "measure="),
        ("loss", [], {}, "empty"),
        ("loss", "not/a/folder", {}, "neither a run folder"),
        ("loss", None, {"model": "gpt2"}, "model= takes a list"),
        ("loss", [1.5], {"model": "gpt2"}, "revision"),
        (lambda m, b: {"bad": "x"}, None, {}, "return floats"),
        (lambda m, b: {"short": torch.ones(2)}, None, {}, "n_layers \\+ 1"),
    ],
)
def test_bad_input_is_typed(tmp_path, measure, checkpoints, kwargs, match) -> None:
    run = _run(tmp_path)
    target = run if checkpoints is None else checkpoints
    with pytest.raises(InvalidInputError, match=match):
        over_checkpoints(measure, target, TEXTS, backend=BACKENDS[-1], progress=False, **kwargs)


def test_the_sweep_command_writes_the_table_figure_and_result(tmp_path) -> None:
    from click.testing import CliRunner

    from homoglens.cli import main

    run = _run(tmp_path)
    out = tmp_path / "out"
    args = ["sweep", "--checkpoints", str(run), "--measure", "loss,sinks", "--n-seq", "2"]
    args += ["--seq-len", "16", "--backend", BACKENDS[-1], "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert {"sweep.csv", "sweep.png", "checkpoint_sweep.json"} <= {p.name for p in out.iterdir()}
    sweep = CheckpointSweep.load(out)
    assert sweep.checkpoints == ("step0", "step10", "final") and sweep.metrics[0] == "loss"
    bad = CliRunner().invoke(main, ["sweep", "--checkpoints", str(run), "--measure", "nope",
                                    "--out", str(tmp_path / "bad"), "--no-progress"])  # fmt: skip
    assert bad.exit_code != 0 and "--measure nope unknown" in bad.output  # before the load
