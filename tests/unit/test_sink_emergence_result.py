"""sink_emergence_study's argument checks (all refused before any model loads) and the
SinkEmergence result: shapes, save/load, both plot backends, the paired difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from homoglens import InvalidInputError, SinkEmergence, sink_emergence_study
from homoglens.core.errors import IncompatibleResultsError, ModelFolderNotFoundError
from homoglens.reproductions.sink_emergence import weight_decay_runs


def _run(tmp_path: Path, name: str, wd: float) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "training.json").write_text(json.dumps({"config": {"weight_decay": wd, "steps": 8}}))
    return folder


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"eps": 0.0}, "eps"),
        ({"eps": 1.0}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"key": -1}, "key"),
        ({"n_seq": 1}, "n_seq"),
        ({"n_boot": 0}, "n_boot"),
        ({"ci": 1.5}, "ci"),
        ({"batch_size": 0}, "batch_size"),
        ({"progress": "yes"}, "progress"),
    ],
)
def test_bad_options_are_refused(options, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        sink_emergence_study(**options)


def test_bad_folders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not a model folder"):
        sink_emergence_study([tmp_path / "missing"], None)
    with pytest.raises(InvalidInputError, match="non-empty"):
        sink_emergence_study([], None)
    a, b = _run(tmp_path, "a", 0.1), _run(tmp_path, "b", 0.1)
    with pytest.raises(InvalidInputError, match="repeat a weight decay"):
        sink_emergence_study([a], [a, b])
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(InvalidInputError, match="training.json"):
        sink_emergence_study([a], [bare])
    with pytest.raises(ModelFolderNotFoundError, match="weight_decay"):
        weight_decay_runs(tmp_path)


def test_weight_decay_runs_ascend(tmp_path: Path) -> None:
    (tmp_path / "weight_decay").mkdir()
    for wd in (1.0, 0.0, 0.1):
        _run(tmp_path / "weight_decay", f"wd{wd}", wd)
    assert [f.name for f in weight_decay_runs(tmp_path)] == ["wd0.0", "wd0.1", "wd1.0"]
    shipped = weight_decay_runs("homoglens/tiny-rotary-bos")
    assert [f.name for f in shipped] == ["wd0.0", "wd0.1", "wd1.0"]


def _result() -> SinkEmergence:
    g = torch.Generator().manual_seed(0)
    step_alpha = torch.rand(3, 12, 2, 2, generator=g, dtype=torch.float64) * 0.5
    decay_alpha = torch.rand(2, 12, 2, 2, generator=g, dtype=torch.float64) * 0.5
    return SinkEmergence(
        key=0,
        eps=0.3,
        ci=0.95,
        checkpoints=("step0", "step10", "step100"),
        steps=torch.tensor([0.0, 10.0, 100.0], dtype=torch.float64),
        step_alpha=step_alpha,
        step_interval=torch.zeros(3, 2, 2, dtype=torch.float64),
        runs=("wd0", "wd1"),
        weight_decays=torch.tensor([0.0, 1.0], dtype=torch.float64),
        run_steps=torch.tensor([100.0, 100.0], dtype=torch.float64),
        decay_alpha=decay_alpha,
        decay_interval=torch.zeros(2, 2, 2, dtype=torch.float64),
    )


def test_result_values_save_load_and_plot(tmp_path: Path) -> None:
    result = _result()
    rate = (result.step_alpha > 0.3).double().mean((1, 2, 3)) * 100
    assert torch.allclose(result.step_rate, rate)
    assert torch.allclose(result.by_layer().mean(1), result.step_rate)
    assert result.n_windows == 12 and len(result.to_pandas()) == 2 * (3 + 2)
    loaded = SinkEmergence.load(result.save(tmp_path / "saved"))
    assert torch.equal(loaded.step_alpha, result.step_alpha) and loaded.runs == result.runs
    assert len(result.plot().axes) == 4
    pytest.importorskip("plotly")
    assert result.plot(backend="plotly").layout.title.text
    est = result.difference(1.0, 0.0, metric="importance", n_boot=200)
    want = float((result.decay_alpha[1] - result.decay_alpha[0]).mean())
    assert abs(est.value - want) < 1e-12 and est.ci_low < est.value < est.ci_high
    with pytest.raises(InvalidInputError, match="not among the runs"):
        result.difference(2.0, 0.0)
    with pytest.raises(InvalidInputError, match="metric"):
        result.window_values("loss")
    with pytest.raises(InvalidInputError, match="sweep"):
        result.by_layer(sweep="seed")


def test_shapes_and_tampering_are_refused(tmp_path: Path) -> None:
    result = _result()
    with pytest.raises(ValueError, match="shape"):
        SinkEmergence(**{**result.__dict__, "steps": torch.zeros(2, dtype=torch.float64)})
    folder = result.save(tmp_path / "saved")
    meta = json.loads((folder / "sink_emergence.json").read_text())
    meta["eps"] = 1.5
    (folder / "sink_emergence.json").write_text(json.dumps(meta))
    with pytest.raises(IncompatibleResultsError):
        SinkEmergence.load(folder)
