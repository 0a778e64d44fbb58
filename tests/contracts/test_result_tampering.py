"""A saved result's JSON is covered too (hostile round 2, findings S2, S3, S4, R1): a JSON
without its sha256, with an empty one or one that leaves out a file the loader reads is refused
(homoglens 0.1.0 has no older format); the JSON records the digest of its own content, so an
edited label is refused; provenance labels outside their domain, NaN where a class never writes
it and ``save("")`` / ``save(None)`` are refused with typed errors."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_result_integrity import CLASSES, TEXTS, _results

from helpers import BACKENDS, reseal
from homoglens import IncompatibleResultsError, InvalidInputError
from homoglens.results.storage import HASHES, write_json

INCOMPLETE = "saved incompletely or edited; save it again"

MANIFESTS = {  # the JSON each class' loader reads first (the one that records the others)
    "profile": "profile.json",
    "study": "study.json",
    "similarity": "similarity.json",
    "sink_scores": "sink_scores.json",
    "massive": "massive.json",
    "analysis": "analysis.json",
    "received": "received.json",
    "rollout": "rollout.json",
    "bias": "attention_bias.json",
    "lengths": "lengths.json",
    "patching": "patching.json",
    "calibrated": "calibrated.json",
    "sweep": "checkpoint_sweep.json",
    "comparison": "comparison.json",
    "attribution": "attribution.json",
    "perturbation": "perturbation.json",
    "valleys": "valleys.json",
    "emergence": "sink_emergence.json",
}


@pytest.fixture(scope="module")
def saved(get_model, tmp_path_factory) -> Path:
    """Every result class saved once."""
    root = tmp_path_factory.mktemp("tampering")
    gpt2, llama = get_model("gpt2", BACKENDS[-1]), get_model("llama", BACKENDS[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, result in _results(gpt2, llama, TEXTS, 0).items():
            result.save(root / name)
    return root


def _copy(saved: Path, name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(saved / name, folder)
    CLASSES[name].load(folder)  # the untouched copy loads
    return folder


def _refused(name: str, folder: Path, match: str) -> None:
    with pytest.raises(IncompatibleResultsError, match=match) as err:
        CLASSES[name].load(folder)
    assert str(folder) in str(err.value), err.value


def test_every_class_has_a_manifest() -> None:
    assert set(MANIFESTS) == set(CLASSES)


# ------------------------------------------------------------------ S3: the sha256 block


@pytest.mark.parametrize("block", ["missing", "empty", "null"])
@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_a_json_without_its_sha256_is_refused(saved, tmp_path, name: str, block: str) -> None:
    folder = _copy(saved, name, tmp_path)
    path = folder / MANIFESTS[name]
    meta = json.loads(path.read_text())
    if block == "missing":
        del meta[HASHES]
    else:
        meta[HASHES] = {} if block == "empty" else None
    path.write_text(json.dumps(meta))
    _refused(name, folder, f"records no sha256 of its files.*{INCOMPLETE}")


def test_a_part_without_its_sha256_is_refused(saved, tmp_path) -> None:
    """The parts of a composite result are checked the same way (their JSON re-recorded in the
    composite's, so that the part's own missing block is what refuses it)."""
    for name, part in (
        ("study", "profile_zero/profile.json"),
        ("analysis", "scores/sink_scores.json"),
        ("calibrated", "model/similarity.json"),
        ("comparison", "model_0/sinks/sink_scores.json"),
    ):
        folder = _copy(saved, name, tmp_path / "parts")
        meta = json.loads((folder / part).read_text())
        del meta[HASHES]
        (folder / part).write_text(json.dumps(meta))
        reseal(folder)  # the composite records the edited part: its own check must refuse it
        _refused(name, folder, f"records no sha256 of its files.*{INCOMPLETE}")
        shutil.rmtree(folder)


def _leave_out(path: Path, entry: str) -> None:
    """Rewrite the JSON ``path`` without ``entry`` in its sha256 (a consistent JSON otherwise:
    its own digest recorded again)."""
    meta = json.loads(path.read_text())
    write_json(path, {**meta, HASHES: {k: v for k, v in meta[HASHES].items() if k != entry}})


def _entries(saved: Path, name: str) -> list[str]:
    hashes = json.loads((saved / name / MANIFESTS[name]).read_text())[HASHES]
    return sorted(k for k in hashes if k != MANIFESTS[name])


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_a_sha256_that_leaves_out_a_file_read_is_refused(saved, tmp_path, name: str) -> None:
    entries = _entries(saved, name)
    assert entries, f"{name}: its JSON records no other file"
    for entry in entries:
        folder = _copy(saved, name, tmp_path / entry.replace("/", "_"))
        _leave_out(folder / MANIFESTS[name], entry)
        _refused(name, folder, f"records no sha256 of \\[{entry!r}\\].*{INCOMPLETE}")


def test_the_shipped_replicate_statistics_still_load() -> None:
    from homoglens.comparison.measure import _REPLICATES
    from homoglens.results import read_saved

    for path in sorted(_REPLICATES.glob("*.json")):
        meta, tensors = read_saved(_REPLICATES, path.stem)
        assert meta["format"] == "homoglens.ReplicateStatistics/1" and tensors


# ------------------------------------------------------------------ S2: the JSON's own labels


PROFILE_LABELS: list[tuple[str, Any]] = [
    ("bos", "banana"),
    ("weights", "bogus"),
    ("exclude_first", True),
    ("data_sha256", "x"),
    ("hook_points", ["a", "b", "c"]),
    ("model", "gpt2-xl"),
    ("dtype", "float99"),
]


@pytest.mark.parametrize(("field", "value"), PROFILE_LABELS, ids=[f for f, _ in PROFILE_LABELS])
def test_an_edited_label_is_refused(saved, tmp_path, field: str, value: Any) -> None:
    folder = _copy(saved, "profile", tmp_path)
    path = folder / "profile.json"
    meta = json.loads(path.read_text())
    assert meta["provenance"][field] != value
    meta["provenance"][field] = value
    path.write_text(json.dumps(meta, indent=2))
    _refused("profile", folder, f"does not match the digest of its content.*{INCOMPLETE}")


def test_every_class_refuses_an_edited_label(saved, tmp_path) -> None:
    for name, manifest in MANIFESTS.items():
        folder = _copy(saved, name, tmp_path / "labels")
        meta = json.loads((folder / manifest).read_text())
        meta["format"] = meta["format"] + " "  # any change of the JSON's content
        (folder / manifest).write_text(json.dumps(meta))
        _refused(name, folder, "does not match the digest of its content")
        shutil.rmtree(folder)


def test_the_digest_is_of_the_content_not_the_layout(saved, tmp_path) -> None:
    """Keys reordered and the indentation changed: the same content, still loads."""
    folder = _copy(saved, "profile", tmp_path)
    meta = json.loads((folder / "profile.json").read_text())
    (folder / "profile.json").write_text(json.dumps(dict(reversed(list(meta.items())))))
    CLASSES["profile"].load(folder)


RESEALED_LABELS: list[tuple[str, Any, str]] = [
    ("bos", "banana", "provenance.bos"),
    ("weights", "bogus", "provenance.weights"),
    ("backend", "mine", "provenance.backend"),
    ("data_sha256", "x", "provenance.data_sha256"),
    ("data_sha256", "a" * 64 + " + y", "provenance.data_sha256"),
    ("dtype", "float99", "provenance.dtype"),
    ("exclude_first", True, "exclude_first"),
]


@pytest.mark.parametrize(
    ("field", "value", "match"), RESEALED_LABELS, ids=[f"{f}={v!r}" for f, v, _ in RESEALED_LABELS]
)
def test_a_label_out_of_its_domain_is_refused_on_its_own(
    saved, tmp_path, field: str, value: Any, match: str
) -> None:
    """With the sha256 recorded again (a forged JSON): the domain of each label, and
    ``exclude_first`` against the counts, refuse it all the same."""
    folder = _copy(saved, "profile", tmp_path)
    path = folder / "profile.json"
    meta = json.loads(path.read_text())
    meta["provenance"][field] = value
    path.write_text(json.dumps(meta))
    reseal(folder)
    _refused("profile", folder, match)


def test_merged_and_unrecorded_data_hashes_still_load(saved, tmp_path) -> None:
    folder = _copy(saved, "profile", tmp_path)
    for value in ("", "a" * 64 + " + " + "b" * 64, " + " + "c" * 64):
        meta = json.loads((folder / "profile.json").read_text())
        meta["provenance"]["data_sha256"] = value
        (folder / "profile.json").write_text(json.dumps(meta))
        reseal(folder)
        assert CLASSES["profile"].load(folder).provenance.data_sha256 == value


def test_similarity_exclude_first_must_fit_its_first_position(saved, tmp_path) -> None:
    folder = _copy(saved, "similarity", tmp_path)
    meta = json.loads((folder / "similarity.json").read_text())
    assert meta["first_position"] == 0 and meta["provenance"]["exclude_first"] is False
    meta["provenance"]["exclude_first"] = True
    (folder / "similarity.json").write_text(json.dumps(meta))
    reseal(folder)
    _refused("similarity", folder, "exclude_first")


# ------------------------------------------------------------------ S4: NaN where never written


def _nan_at(stem: str, key: str, index: tuple[int, ...]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / f"{stem}.safetensors"
        tensors = load_file(str(path))
        value = tensors[key].clone()
        assert bool(torch.isfinite(value[index]).all()), (key, index)
        value[index] = float("nan")
        tensors[key] = value.contiguous()
        save_file(tensors, str(path))

    return edit


NAN_CASES: list[tuple[str, str, Callable[[Path], None], str]] = [
    ("sink_scores", "importance everywhere", _nan_at("sink_scores", "importance", (...,)),
     "importance holds NaN"),
    ("sink_scores", "importance of one head", _nan_at("sink_scores", "importance", (0, 0)),
     "importance holds NaN"),
    ("sink_scores", "mass of one head", _nan_at("sink_scores", "mass", (0, 1)), "mass must be NaN"),
    ("sink_scores", "mass by query of one head", _nan_at("sink_scores", "mass_by_query", (1, 1, 5)),
     "mass_by_query is NaN for some heads"),
    ("attribution", "delta_to_others", _nan_at("attribution", "delta_to_others", (0, 0)),
     "delta_to_others is NaN"),
    ("attribution", "joint_delta_to_others", _nan_at("attribution", "joint_delta_to_others", (1,)),
     "joint_delta_to_others is NaN"),
    ("attribution", "base_to_others", _nan_at("attribution", "base_to_others", (0,)),
     "base_to_others is NaN"),
    ("attribution", "joint_delta", _nan_at("attribution", "joint_delta", (0,)),
     "joint_delta is NaN"),
    ("study", "icl of one mode", _nan_at("study", "icl", (1, 0)), "icl is NaN"),
    ("study", "induction loss of one repeat", _nan_at("study", "induction_loss", (0, 0)),
     "induction_loss is NaN"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "what", "edit", "match"), NAN_CASES, ids=[f"{c[0]}-{c[1]}" for c in NAN_CASES]
)
def test_nan_where_the_class_never_writes_it_is_refused(
    saved, tmp_path, name: str, what: str, edit: Callable[[Path], None], match: str
) -> None:
    folder = _copy(saved, name, tmp_path)
    edit(folder)
    reseal(folder)  # the value checks refuse it on their own
    _refused(name, folder, match)


def test_nan_where_the_class_writes_it_still_loads(get_model, tmp_path) -> None:
    """Sink mass with no query after the key (NaN for every head) loads."""
    from homoglens import SinkScores, sink_scores

    model = get_model("gpt2", BACKENDS[-1])
    scores = sink_scores(model, torch.randint(0, 100, (3, 4)), key=3, progress=False)
    assert bool(torch.isnan(scores.mass).all())
    SinkScores.load(scores.save(tmp_path / "late"))


# ------------------------------------------------------------------ R1: save("") and save(None)


@pytest.mark.parametrize("path", ["", None, 5], ids=["empty", "None", "int"])
def test_save_needs_a_folder_path(get_model, path: Any) -> None:
    gpt2, llama = get_model("gpt2", BACKENDS[-1]), get_model("llama", BACKENDS[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = _results(gpt2, llama, TEXTS[:2], 0)
    for name, result in results.items():
        with pytest.raises(InvalidInputError, match="save\\(\\) needs a folder path") as err:
            result.save(path)
        assert repr(path) in str(err.value), name
    comparison = results["comparison"]
    with pytest.raises(InvalidInputError, match="needs a folder path"):
        comparison.export_statistics(comparison.labels[0], path)
