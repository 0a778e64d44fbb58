"""Saved results: exact keys, dtypes, shapes and ranges checked on load; edited, corrupt or
incomplete folders are typed errors; nothing is ever unpickled."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import BACKENDS, MIXED_LENGTHS, THREE_OPENINGS, TWO_OPENINGS, reseal
from homoglens import (
    HomogenizationProfile,
    IncompatibleResultsError,
    InvalidInputError,
    PositionAblationStudy,
    ResultsNotFoundError,
    SinkScores,
    homogenization_profile,
    load_model,
    position_ablation_study,
    positional_patching,
    sink_scores,
)
from homoglens.testing import tiny_model_folder


def _edit_json(folder: Path, stem: str, **changes) -> None:
    """Edit the JSON and record its sha256 again (:func:`helpers.reseal`), so that the check of
    the values themselves is what refuses the edit."""
    path = folder / f"{stem}.json"
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))
    reseal(folder)


def _edit_tensor(
    folder: Path, stem: str, name: str, value: torch.Tensor, *, keep_hash: bool = False
) -> None:
    """Edit one tensor; the sha256 the JSON records is recorded again (:func:`helpers.reseal`),
    so that the check of the values themselves is what refuses the edit."""
    path = folder / f"{stem}.safetensors"
    tensors = load_file(str(path))
    tensors[name] = value
    save_file(tensors, str(path))
    if not keep_hash:
        reseal(folder)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from homoglens import PositionalSimilarity

    model = load_model(tiny_model_folder("gpt2"), backend="bridge")
    texts = [f"Sentence number {i} is here, and it goes on for a little while." for i in range(4)]
    root = tmp_path_factory.mktemp("saved")
    homogenization_profile(model, texts, progress=False).save(root / "profile")
    sink_scores(model, texts, progress=False).save(root / "sinks")
    positional_patching(model, texts, metric="loss", layers=[0, 1], progress=False).save(
        root / "patching"
    )
    PositionalSimilarity.from_activations(torch.randn(6, 20, 8), edge_k=4).save(root / "sim")
    return root


def _copy(saved: Path, name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    shutil.copytree(saved / name, out)
    return out


def test_saving_under_a_file_and_loading_corrupt_results(get_model, tmp_path: Path) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    (tmp_path / "afile").write_text("x")
    prof = homogenization_profile(model, TWO_OPENINGS, progress=False)
    with pytest.raises(InvalidInputError):
        prof.save(tmp_path / "afile" / "sub")
    study = position_ablation_study(model, TWO_OPENINGS, modes=["zero"], n_boot=10, progress=False)
    with pytest.raises(InvalidInputError):
        study.save(tmp_path / "afile")
    folder = study.save(tmp_path / "study")
    meta = json.loads((folder / "study.json").read_text())
    for bad in ([], 5):
        (folder / "study.json").write_text(json.dumps({**meta, "modes": bad}))
        with pytest.raises(IncompatibleResultsError):
            PositionAblationStudy.load(folder)
    folder = prof.save(tmp_path / "p")
    meta = json.loads((folder / "profile.json").read_text())
    for change in ({"n_sequences": 0}, {"provenance": {**meta["provenance"], "hook_points": 5}}):
        (folder / "profile.json").write_text(json.dumps({**meta, **change}))
        with pytest.raises(IncompatibleResultsError):
            HomogenizationProfile.load(folder)


def test_load_errors_are_typed(tmp_path, get_model):
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(ResultsNotFoundError):
        HomogenizationProfile.load(tmp_path / "missing")
    folder = homogenization_profile(model, MIXED_LENGTHS, progress=False).save(tmp_path / "p")
    meta = json.loads((folder / "profile.json").read_text())
    for broken in (
        "not json",
        json.dumps([1, 2]),
        json.dumps({k: v for k, v in meta.items() if k != "layers"}),
        json.dumps({**meta, "provenance": {**meta["provenance"], "extra": 1}}),
        json.dumps({**meta, "layers": [0, 1]}),
    ):
        (folder / "profile.json").write_text(broken)
        with pytest.raises(IncompatibleResultsError):
            HomogenizationProfile.load(folder)
    (folder / "profile.json").write_text(json.dumps(meta))
    (folder / "profile.safetensors").write_bytes(b"garbage")
    with pytest.raises(IncompatibleResultsError):
        HomogenizationProfile.load(folder)
    with pytest.raises(ResultsNotFoundError):
        PositionAblationStudy.load(tmp_path / "nothing")


def test_result_helpers_raise_typed_errors(get_model):
    prof = homogenization_profile(get_model("gpt2", BACKENDS[-1]), MIXED_LENGTHS, progress=False)
    for call in (
        lambda: prof.edge_summary(0),
        lambda: prof.edge_summary(100),
        lambda: prof.edge_summary(2, metric="x"),
        lambda: prof.sel([]),
    ):
        with pytest.raises(InvalidInputError):
            call()
    assert prof.sel(1).layers == (1,)
    with pytest.raises(IncompatibleResultsError, match="HomogenizationProfile"):
        HomogenizationProfile.merge(prof, "x")  # pyright: ignore[reportArgumentType]


def test_results_folders_with_missing_or_extra_keys(tmp_path: Path, get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    prof = homogenization_profile(model, THREE_OPENINGS, progress=False)
    folder = prof.save(tmp_path / "p")
    meta = json.loads((folder / "profile.json").read_text())
    (folder / "profile.json").write_text(json.dumps({**meta, "surprise": 1}))
    with pytest.raises(IncompatibleResultsError):
        HomogenizationProfile.load(folder)
    (folder / "profile.json").write_text(
        json.dumps({k: v for k, v in meta.items() if k != "layers"})
    )
    with pytest.raises(IncompatibleResultsError):
        HomogenizationProfile.load(folder)
    scores = sink_scores(model, THREE_OPENINGS, progress=False).save(tmp_path / "s")
    (scores / "sink_scores.safetensors").unlink()
    with pytest.raises(ResultsNotFoundError):
        SinkScores.load(scores)


def test_nothing_is_ever_unpickled() -> None:
    """Results and checkpoints are safetensors + JSON: no module of homoglens imports pickle or
    calls torch.load (Hugging Face folders with *.bin weights are read by transformers, which
    loads them with weights_only=True)."""
    import re

    import homoglens

    root = Path(homoglens.__file__).parent
    for path in root.glob("*.py"):
        code = path.read_text()
        assert not re.search(r"^\s*(import|from)\s+(c?pickle|dill|joblib)\b", code, re.M), path
        assert "torch.load(" not in code, path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layers": [2, 1, 0]}, "hook_points disagree"),
        ({"layers": [0, 0, 1]}, "repeats"),
        ({"n_sequences": 3.7}, "n_sequences"),
        ({"n_sequences": -4}, "n_sequences"),
        ({"n_tokens": "many"}, "n_tokens"),
    ],
)
def test_edited_profiles_are_refused(saved, tmp_path, change, message) -> None:
    from homoglens import HomogenizationProfile, IncompatibleResultsError

    folder = _copy(saved, "profile", tmp_path)
    _edit_json(folder, "profile", **change)
    with pytest.raises(IncompatibleResultsError, match=message):
        HomogenizationProfile.load(folder)


def test_negative_or_fractional_counts_are_refused(saved, tmp_path) -> None:
    from homoglens import HomogenizationProfile, IncompatibleResultsError

    for bad in (-1.0, 0.5):
        folder = _copy(saved, "profile", tmp_path / str(bad))
        count = load_file(str(folder / "profile.safetensors"))["count"].double()
        count[0] = bad
        _edit_tensor(folder, "profile", "count", count)
        with pytest.raises(IncompatibleResultsError, match="count"):
            HomogenizationProfile.load(folder)


@pytest.mark.parametrize(
    ("name", "stem", "change", "message"),
    [
        ("sinks", "sink_scores", {"key": "x"}, "key"),
        ("sinks", "sink_scores", {"eps": 5}, "eps"),
        ("sinks", "sink_scores", {"n_sequences": 3.7}, "n_sequences"),
        ("patching", "patching", {"direction": "sideways"}, "direction"),
        ("patching", "patching", {"layers": [1, 1]}, "repeats"),
        ("sim", "similarity", {"space": "hidden"}, "space"),
    ],
)
def test_edited_results_are_refused(saved, tmp_path, name, stem, change, message) -> None:
    from homoglens import (
        IncompatibleResultsError,
        PositionalPatchingResult,
        PositionalSimilarity,
        SinkScores,
    )

    cls = {"sinks": SinkScores, "patching": PositionalPatchingResult, "sim": PositionalSimilarity}
    folder = _copy(saved, name, tmp_path)
    _edit_json(folder, stem, **change)
    with pytest.raises(IncompatibleResultsError, match=message):
        cls[name].load(folder)


def test_an_edited_tensor_file_breaks_the_recorded_hash(saved, tmp_path) -> None:
    folder = _copy(saved, "profile", tmp_path)
    count = load_file(str(folder / "profile.safetensors"))["count"]
    _edit_tensor(folder, "profile", "count", count * 2, keep_hash=True)
    with pytest.raises(IncompatibleResultsError, match="saved incompletely or edited; save it"):
        HomogenizationProfile.load(folder)


def test_a_unit_sum_of_the_wrong_width_is_refused(saved, tmp_path) -> None:
    from homoglens import IncompatibleResultsError, PositionalSimilarity

    folder = _copy(saved, "sim", tmp_path)
    units = load_file(str(folder / "similarity.safetensors"))["unit_sum"]
    _edit_tensor(folder, "similarity", "unit_sum", units[:, :-1].contiguous())
    with pytest.raises(IncompatibleResultsError, match="unit_sum"):
        PositionalSimilarity.load(folder)
    for name in ("profile", "sinks", "patching", "sim"):  # untouched files still load
        cls = {
            "profile": "HomogenizationProfile",
            "sinks": "SinkScores",
            "patching": "PositionalPatchingResult",
            "sim": "PositionalSimilarity",
        }[name]
        import homoglens

        getattr(homoglens, cls).load(saved / name)
