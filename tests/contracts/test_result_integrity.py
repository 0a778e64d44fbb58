"""Nothing silent, nothing lost (issue 39): merges refuse overlapping data and mismatched
provenance; saves are atomic (a save that fails or is interrupted at any step over an older
result leaves it loadable and unchanged, or refused, never a mix); loads check the values of
every result class, whether or not the sha256 that the JSON records match (a JSON without them
is refused)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import BACKENDS, reseal
from homoglens import (
    AttentionBiasStudy,
    CalibratedReadings,
    CheckpointSweep,
    HomogenizationProfile,
    IncompatibleResultsError,
    LengthStudy,
    MassiveActivations,
    ModelComparison,
    PositionAblationStudy,
    PositionalPatchingResult,
    PositionalSimilarity,
    ResultsNotFoundError,
    SinkScores,
    attention_bias_study,
    calibrated_readings,
    checkpoint_folders,
    compare_models,
    corpus_windows,
    homogenization_profile,
    length_study,
    massive_activations,
    position_ablation_study,
    positional_patching,
    positional_similarity,
    sink_analysis,
    sink_scores,
)
from homoglens.reproductions.perturbation import perturbation_spread
from homoglens.reproductions.perturbation_result import PerturbationSpread
from homoglens.reproductions.rollout import attention_rollout
from homoglens.reproductions.rollout_result import AttentionRollout
from homoglens.reproductions.sink_emergence import sink_emergence_study, weight_decay_runs
from homoglens.reproductions.sink_emergence_result import SinkEmergence
from homoglens.reproductions.valleys import compression_valleys
from homoglens.reproductions.valleys_result import CompressionValleys
from homoglens.results.storage import HASHES
from homoglens.sinks import attention_received, sink_attribution
from homoglens.sinks.attribution_result import SinkAttribution
from homoglens.sinks.result import AttentionReceived, SinkAnalysis

TEXTS = [f"Sentence number {i} is here, and it goes on for a little while." for i in range(4)]
OTHER_TEXTS = ["A short one, then more words.", "Another text that is not the same at all."]
WINDOWS = torch.randint(0, 1000, (6, 20), generator=torch.Generator().manual_seed(0))

CLASSES: dict[str, Any] = {
    "profile": HomogenizationProfile,
    "study": PositionAblationStudy,
    "similarity": PositionalSimilarity,
    "sink_scores": SinkScores,
    "massive": MassiveActivations,
    "analysis": SinkAnalysis,
    "received": AttentionReceived,
    "rollout": AttentionRollout,
    "bias": AttentionBiasStudy,
    "lengths": LengthStudy,
    "patching": PositionalPatchingResult,
    "calibrated": CalibratedReadings,
    "sweep": CheckpointSweep,
    "comparison": ModelComparison,
    "attribution": SinkAttribution,
    "perturbation": PerturbationSpread,
    "valleys": CompressionValleys,
    "emergence": SinkEmergence,
}


def _results(gpt2: Any, llama: Any, texts: list[str], seed: int) -> dict[str, Any]:
    """One small real result of every class."""
    gen = torch.Generator().manual_seed(seed)
    windows = torch.randint(0, 1000, (6, 20), generator=gen)
    return {
        "profile": homogenization_profile(gpt2, texts, effective_rank=True, progress=False),
        "study": position_ablation_study(gpt2, texts, modes=["zero"], n_boot=10, progress=False),
        "similarity": positional_similarity(llama, windows, edge_k=4, progress=False),
        "sink_scores": sink_scores(gpt2, texts, progress=False),
        "massive": massive_activations(gpt2, texts, progress=False),
        "analysis": sink_analysis(gpt2, texts, top_k=2, edge_k=3, progress=False),
        "received": attention_received(gpt2, texts, progress=False),
        "rollout": attention_rollout(gpt2, texts, first_k=2, progress=False),
        "bias": attention_bias_study(
            llama,
            windows,
            kind="first",
            strengths=[-0.5, 0.0, 0.5],
            edge_k=4,
            gradient_windows=2,
            progress=False,
        ),
        "lengths": length_study(
            llama, windows[:5, :16], lengths=(10, 16), lags=(1, 3), edge_k=2, progress=False
        ),
        "patching": positional_patching(
            gpt2, texts, metric=["loss", "mean_pairwise"], layers=[0, 1], progress=False
        ),
        "calibrated": calibrated_readings(
            llama,
            torch.randint(0, 1000, (6, 24), generator=gen),
            offset=8,
            edge_k=2,
            progress=False,
        ),
        "sweep": CheckpointSweep(
            checkpoints=("step0", "step10"),
            steps=torch.tensor([0.0, float("nan")], dtype=torch.float64),
            metrics=("homogenization",),
            values=torch.tensor([[0.1], [0.2 + seed]], dtype=torch.float64),
            layer_metrics=("homogenization",),
            layers=(0, 1),
            layer_values=torch.full((2, 1, 2), 0.1 * seed, dtype=torch.float64),
        ),
        "comparison": compare_models(
            {"m": gpt2},
            corpus_windows(gpt2, n_seq=4 + seed, seq_len=20),
            modes=("none", "zero"),
            edge_k=4,
            n_boot=10,
            progress=False,
        ),
        "attribution": sink_attribution(  # exact, two heads: every optional field filled
            gpt2, texts, heads=[(0, 1), (1, 2)], edge_k=2, progress=False
        ),
        "perturbation": perturbation_spread(llama, windows, position=3, progress=False),
        "valleys": compression_valleys(
            llama, windows, ablation_layer=1, dims=[0, 3], n_boot=100, progress=False
        ),
        "emergence": sink_emergence_study(  # two checkpoints and two weight decays
            [(steps := checkpoint_folders("homoglens/tiny-rotary-bos"))[0], steps[-1]],
            list(weight_decay_runs("homoglens/tiny-rotary-bos"))[::2],
            n_seq=4,
            n_boot=10,
            seed=seed,
            progress=False,
        ),
    }


@pytest.fixture(scope="module")
def models(get_model) -> tuple[Any, Any]:
    return get_model("gpt2", BACKENDS[-1]), get_model("llama", BACKENDS[-1])


@pytest.fixture(scope="module")
def saved(models, tmp_path_factory) -> Path:
    """Every result class saved once (the older results of the save tests)."""
    root = tmp_path_factory.mktemp("results")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, result in _results(models[0], models[1], TEXTS, 0).items():
            result.save(root / name)
    return root


@pytest.fixture(scope="module")
def newer(models) -> dict[str, Any]:
    """A second result of every class, of other data (the newer results of the save tests)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _results(models[0], models[1], OTHER_TEXTS, 1)


def _digest(value: Any) -> str:
    """A fingerprint of everything a loaded result holds."""
    h = hashlib.sha256()

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            h.update(str((v.dtype, tuple(v.shape))).encode())
            h.update(v.detach().contiguous().view(torch.uint8).numpy().tobytes())
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            for f in dataclasses.fields(v):
                h.update(f.name.encode())
                walk(getattr(v, f.name))
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                h.update(str(k).encode())
                walk(v[k])
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)
        else:
            h.update(repr(v).encode())

    walk(value)
    return h.hexdigest()


# --------------------------------------------------------------------------- merges (finding 6)


@pytest.fixture(scope="module")
def profiles(models) -> tuple[HomogenizationProfile, HomogenizationProfile]:
    gpt2 = models[0]
    return (
        homogenization_profile(gpt2, TEXTS[:2], progress=False),
        homogenization_profile(gpt2, TEXTS[2:], progress=False),
    )


def test_merging_the_same_data_twice_is_refused(profiles) -> None:
    a, b = profiles
    for parts in ((a, a), (a, b, a), (HomogenizationProfile.merge(a, b), b)):
        with pytest.raises(IncompatibleResultsError, match="overlapping data"):
            HomogenizationProfile.merge(*parts)
    # a copy of the same profile (same hash, another object) is refused too
    copy = dataclasses.replace(a)
    with pytest.raises(IncompatibleResultsError, match="overlapping data"):
        HomogenizationProfile.merge(a, copy)
    merged = HomogenizationProfile.merge(a, b)  # disjoint data still merge
    hashes = (a.provenance.data_sha256, b.provenance.data_sha256)
    assert merged.provenance.data_sha256 == " + ".join(hashes)
    assert merged.n_sequences == 4


def test_duplicated_data_is_what_moves_adjusted(models, profiles) -> None:
    """Why ``merge(p, p)`` moved ``adjusted`` (most visibly at the last layer): the merged sums
    are exactly those of the duplicated corpus, whose baseline pairs every token with its own
    copy (cosine 1) as a cross-sequence pair. The arithmetic is right; the input was not, so
    merge refuses it."""
    a, _ = profiles
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicated windows: warned about, measured all the same
        twice = homogenization_profile(models[0], TEXTS[:2] * 2, progress=False)
    unrecorded = dataclasses.replace(a.provenance, data_sha256="", data_rows="")
    loose = dataclasses.replace(a, provenance=unrecorded)
    other = dataclasses.replace(loose)  # not recorded: allowed (another object)
    merged = HomogenizationProfile.merge(loose, other)
    assert torch.allclose(merged.adjusted, twice.adjusted, atol=1e-6, rtol=0)
    assert float((merged.adjusted - a.adjusted).abs().min()) > 1e-5  # every layer moves


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtype", "bfloat16"),
        ("weights", "processed"),
        ("model_revision", "revision step1000"),
        ("model", "another-model"),
        ("backend", "hooked" if BACKENDS[-1] == "bridge" else "bridge"),
        ("hook_points", ("a", "b", "c")),
    ],
)
def test_merging_mismatched_provenance_is_refused(profiles, field: str, value: Any) -> None:
    a, b = profiles
    other = dataclasses.replace(b, provenance=dataclasses.replace(b.provenance, **{field: value}))
    with pytest.raises(IncompatibleResultsError, match=f"provenance.{field}") as err:
        HomogenizationProfile.merge(a, other)
    assert repr(getattr(a.provenance, field)) in str(err.value) and repr(value) in str(err.value)


def test_similarity_merges_are_checked_the_same_way() -> None:
    x = torch.randn(8, 12, 6, generator=torch.Generator().manual_seed(3))
    a = PositionalSimilarity.from_activations(x[:4], edge_k=2, pseudo_values=False)
    b = PositionalSimilarity.from_activations(x[4:], edge_k=2, pseudo_values=False)
    assert PositionalSimilarity.merge(a, b).n_sequences == 8  # hashes not recorded: allowed
    with pytest.raises(IncompatibleResultsError, match="overlapping data"):
        PositionalSimilarity.merge(a, a)
    hashed = [
        dataclasses.replace(p, provenance=dataclasses.replace(p.provenance, data_sha256=h))
        for p, h in ((a, "aa"), (b, "aa"))
    ]
    with pytest.raises(IncompatibleResultsError, match="overlapping data"):
        PositionalSimilarity.merge(*hashed)
    f16 = dataclasses.replace(b, provenance=dataclasses.replace(b.provenance, dtype="float16"))
    with pytest.raises(IncompatibleResultsError, match="provenance.dtype"):
        PositionalSimilarity.merge(a, f16)


# ------------------------------------------------------------------ atomic saves (finding 9)


class _Failing:
    """Make the ``at``-th call of the file-system steps of a save raise ``error``."""

    STEPS = ("replace", "rename", "fsync", "mkdir", "unlink", "rmdir")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int, error: BaseException) -> None:
        self.calls, self.at, self.error = 0, at, error
        for name in self.STEPS:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.at:
                raise self.error
            return fn(*args, **kwargs)

        return step


def _load_or_refuse(cls: Any, folder: Path) -> str | None:
    try:
        return _digest(cls.load(folder))
    except (IncompatibleResultsError, ResultsNotFoundError):
        return None


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("user_files", [False, True], ids=["own-folder", "shared-folder"])
@pytest.mark.parametrize(
    "name", ["profile", "similarity", "study", "analysis", "calibrated", "comparison"]
)
def test_a_save_interrupted_at_any_step_never_mixes(
    saved, newer, tmp_path, monkeypatch, name, user_files, error
) -> None:
    cls, new = CLASSES[name], newer[name]
    old = _digest(cls.load(saved / name))
    fresh = _digest(new)
    assert old != fresh
    steps, folder = 0, tmp_path
    for at in range(1, 200):
        folder = tmp_path / str(at) / name
        shutil.copytree(saved / name, folder)
        if user_files:
            (folder / "notes.txt").write_text("mine")
            (folder / "plots").mkdir()
        with monkeypatch.context() as patch:
            failing = _Failing(patch, at, error)
            try:
                new.save(folder)
            except (OSError, KeyboardInterrupt):
                pass
            finished = failing.calls < at
        got = _load_or_refuse(cls, folder)
        assert got in (old, fresh, None), f"step {at}: a mix of the old and the new result loaded"
        if user_files:
            assert (folder / "notes.txt").read_text() == "mine" and (folder / "plots").is_dir()
        if finished:
            assert got == fresh
            steps = at - 1
            break
        if got is None:  # refused: the folder holds no silent half result, and saving again
            new.save(folder)  # puts the new one in place
            assert _digest(cls.load(folder)) == fresh
    assert steps >= 5, f"the save took only {steps} file-system steps"
    assert os.listdir(folder.parent) == [name]  # a save that finished leaves nothing beside


def test_new_tensors_beside_an_older_json_are_refused(saved, newer, tmp_path) -> None:
    """What a save that stopped between the tensors and the JSON left before: new tensors, old
    metadata (which loaded with mean_pairwise doubled). The JSON's sha256 refuses it."""
    old = tmp_path / "old"
    shutil.copytree(saved / "profile", old)
    new = newer["profile"].save(tmp_path / "new")
    shutil.copy(new / "profile.safetensors", old / "profile.safetensors")
    with pytest.raises(IncompatibleResultsError, match="saved incompletely or edited; save it"):
        HomogenizationProfile.load(old)
    # a JSON without its sha256 (there is no older format) is refused too
    meta = json.loads((saved / "profile" / "profile.json").read_text())
    del meta[HASHES]
    unhashed = tmp_path / "unhashed"
    shutil.copytree(saved / "profile", unhashed)
    (unhashed / "profile.json").write_text(json.dumps(meta))
    with pytest.raises(IncompatibleResultsError, match="saved incompletely or edited; save it"):
        HomogenizationProfile.load(unhashed)


def test_saving_over_a_folder_with_other_files_keeps_them(saved, newer, tmp_path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    newer["study"].save(folder)
    PositionAblationStudy.load(folder)
    newer["profile"].save(folder)  # another result into the same folder: both there
    assert (folder / "notes.txt").read_text() == "keep me"
    PositionAblationStudy.load(folder)
    HomogenizationProfile.load(folder)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------ values on load


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _set_json(**changes: Any) -> Callable[[Path, str], None]:
    def edit(folder: Path, stem: str) -> None:
        path = folder / f"{stem}.json"
        path.write_text(json.dumps({**_json(path), **changes}))

    return edit


def _set_tensor(name: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    def edit(folder: Path, stem: str) -> None:
        path = folder / f"{stem}.safetensors"
        tensors = load_file(str(path))
        tensors[name] = change(tensors[name].clone()).contiguous()
        save_file(tensors, str(path))

    return edit


def _at(index: tuple[int, ...], value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(t: torch.Tensor) -> torch.Tensor:
        t[index] = value
        return t

    return change


def _times(factor: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t * factor


def _json_edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Path, str], None]:
    def edit(folder: Path, stem: str) -> None:
        path = folder / f"{stem}.json"
        meta = _json(path)
        change(meta)
        path.write_text(json.dumps(meta))

    return edit


def _rename_mode(folder: Path, stem: str) -> None:
    meta = _json(folder / "study.json")
    meta["modes"] = ["none", "bogus"]
    (folder / "study.json").write_text(json.dumps(meta))
    (folder / "profile_zero").rename(folder / "profile_bogus")


def _duplicate_mode(folder: Path, stem: str) -> None:
    meta = _json(folder / "study.json")
    meta["modes"] = ["none", "none"]
    (folder / "study.json").write_text(json.dumps(meta))


def _swap_attribution_parts(folder: Path, stem: str) -> None:
    shutil.rmtree(folder / "exact")
    shutil.copytree(folder / "fast", folder / "exact")


def _stat_key(old: str, new: str) -> Callable[[Path, str], None]:
    def edit(folder: Path, stem: str) -> None:
        path = folder / "comparison.safetensors"
        tensors = load_file(str(path))
        tensors[new] = tensors.pop(old)
        save_file(tensors, str(path))

    return edit


def _cases(
    name: str, stem: str, part: str, items: list[tuple[str, Callable[[Path, str], None]]]
) -> list[tuple[str, str, str, str, Callable[[Path, str], None]]]:
    return [(name, part, stem, what, how) for what, how in items]


NAN, INF = float("nan"), float("inf")

T, J = _set_tensor, _set_json

# (class, part folder, stem, what is tampered, how)
TAMPERS: list[tuple[str, str, str, str, Callable[[Path, str], None]]] = [
    *_cases("profile", "profile", "", [
        ("NaN sum", T("to_others_sum", _at((0, 0), NAN))),
        ("inf sum", T("unit_sum_sq", _at((0,), INF))),
        ("mean pairwise 4.6", T("mean_pairwise_sum", _times(40))),
        ("counts doubled", T("count", _times(2))),
        ("n_sequences doubled", J(n_sequences=8)),
        ("n_tokens_sq edited", J(n_tokens_sq=1157)),
        ("negative norm", T("norm_sum", _at((0, 0), -1.0))),
        ("relative residual > 1", T("relative_residual_sum", _times(10))),
        ("prefix count edited", T("prefix_count", _at((0,), 4))),
        ("has_effective_rank 'yes'", J(has_effective_rank="yes")),
    ]),
    *_cases("study", "study", "", [
        ("negative loss", T("loss", _at((0, 0), -1.0))),
        ("mean pairwise 4.6", T("mean_pairwise", _at((0, 0, 0), 4.6))),
        ("inf to_others", T("to_others", _at((0, 0, 0, 3), INF))),
        ("relabelled mode", _rename_mode),
        ("duplicated mode", _duplicate_mode),
        ("ci '0.95'", J(ci="0.95")),
        ("n_boot 0", J(n_boot=0)),
        ("NaN icl", T("icl", _at((0, 0), INF))),
    ]),
    *_cases("study", "profile", "profile_zero", [
        ("profile of another run", T("mean_pairwise_sum", _times(0.5))),
    ]),
    *_cases("similarity", "similarity", "", [
        ("within_sum doubled", T("within_sum", _times(2))),
        ("NaN window_within", T("window_within", _at((0, 0, 0), NAN))),
        ("unit_sum x10", T("unit_sum", _times(10))),
        ("first_position -1", J(first_position=-1)),
        ("edge_k 0", J(edge_k=0)),
        ("same position x100", T("window_same_position", _times(100))),
        ("massive_threshold 0.5", J(massive_threshold=0.5)),
    ]),
    *_cases("sink_scores", "sink_scores", "", [
        ("sink mass > 1", T("mass", _at((0, 0), 1.5))),
        ("key -1", J(key=-1)),
        ("key 1", J(key=1)),
        ("rate not a share", T("sink_rate_by_head", _at((0, 0), 0.37))),
        ("inf by query", T("mass_by_query", _at((0, 0, 5), INF))),
        ("n_sequences 0", J(n_sequences=0)),
    ]),
    *_cases("massive", "massive", "", [
        ("negative ratio", T("ratio_mean", _at((0, 0), -1.0))),
        ("max below mean", T("ratio_max", _times(0.5))),
        ("dim counts too many", T("dim_counts", _at((0, 0), 1e6))),
        ("NaN median", T("layer_median", _at((0,), NAN))),
        ("threshold 0.5", J(threshold=0.5)),
    ]),
    *_cases("analysis", "sink_scores", "scores", [
        ("part: sink mass 2", T("mass", _times(20))),
    ]),
    *_cases("analysis", "attribution", "fast", [
        ("part: method relabelled", J(method="exact")),
    ]),
    *_cases("analysis", "", "", [
        ("parts swapped", _swap_attribution_parts),
    ]),
    *_cases("received", "received", "", [
        ("received > 1", T("received", _at((0, 0), 1.7))),
        ("correlation 1.5", T("correlation", _at((0,), 1.5))),
        ("pairs doubled", T("n_pairs", _at((0,), 1088.0))),
        ("blocks repeated", J(blocks=[0, 0])),
        ("shift NaN where counted", T("shift", _at((0, 0), NAN))),
    ]),
    *_cases("rollout", "rollout", "", [
        ("first-k mass 1.5", T("window_first_k", _at((0, 0), 1.5))),
        ("received NaN at key 0", T("received", _at((0, 0), NAN))),
        ("null mass -0.1", T("null_first_k", _at((0,), -0.1))),
        ("first_k 0", J(first_k=0)),
        ("residual 'yes'", J(residual="yes")),
        ("blocks repeated", J(blocks=[0, 0])),
    ]),
    *_cases("bias", "attention_bias", "", [
        ("negative loss", T("window_loss", _at((0, 0), -1.0))),
        ("SP 1.5", T("sp", _at((0, 0, 0), 1.5))),
        ("mass 1.5", T("window_attention", _at((0, 0, 0, 0), 1.5))),
        ("ci '0.95'", J(ci="0.95")),
        ("block -1", J(blocks=[-1, 1])),
        ("NaN statistics", T("statistics", _at((0, 0, 0), NAN))),
        ("KL at the baseline", T("window_attention", _at((1, 0, 0, 2), 0.5))),
    ]),
    *_cases("lengths", "lengths", "", [
        ("key-0 mass 1.5", T("first_key_mass", _at((0, 3), 1.5))),
        ("NaN entropy", T("attention_entropy", _at((0, 3), NAN))),
        ("lag 0", J(lags=[0, 3])),
        ("inf statistics", T("statistics", _at((0, 0, 0), INF))),
        ("to_first 2", T("to_first", _at((0, 3), 2.0))),
    ]),
    *_cases("patching", "patching", "", [
        ("negative loss", T("normal", _at((0,), -1.0))),
        ("NaN patched", T("patched", _at((0, 0, 0), NAN))),
        ("cell backwards", _json_edit(lambda m: m["cells"].__setitem__(0, [3, 1]))),
        ("negative compute", J(forward_equivalents=-5.0)),
        ("metrics repeated", J(metrics=["loss", "loss"])),
        ("n_sequences 0", J(n_sequences=0)),
    ]),
    *_cases("calibrated", "calibrated", "", [
        ("offset '8'", J(offset="8")),
        ("unknown reference kind", J(reference_kind="other")),
        ("offset 3", J(offset=3)),
    ]),
    *_cases("calibrated", "similarity", "model", [
        ("part: within_sum doubled", T("within_sum", _times(2))),
    ]),
    *_cases("sweep", "checkpoint_sweep", "", [
        ("negative step", T("steps", _at((0,), -1.0))),
        ("inf value", T("values", _at((0, 0), INF))),
        ("metrics repeated", J(layer_metrics=["h", "h"])),
        ("fractional step", T("steps", _at((0,), 0.5))),
    ]),
    *_cases("attribution", "attribution", "", [
        ("delta 5", T("delta", _at((0, 0), 5.0))),
        ("inf base", T("base", _at((0,), INF))),
        ("method relabelled", J(method="other")),
        ("edge_k 0", J(edge_k=0)),
    ]),
    *_cases("comparison", "comparison", "", [
        ("negative loss", T("0/none/loss", _at((0,), -1.0))),
        ("sink rate 150 %", T("0/none/sink_rate", _at((0,), 150.0))),
        ("labels repeated", J(labels=["m", "m"])),
        ("eps 0", J(eps=0.0)),
        ("unknown mode", _stat_key("0/zero/loss", "0/bogus/loss")),
        ("n_boot '10'", J(n_boot="10")),
        ("statistics of another run", T("0/none/loss", _times(0.5))),
    ]),
    *_cases("perturbation", "perturbation", "", [
        ("negative change", T("change", _at((1, 1), -0.5))),
        ("reach 1.5", T("window_reach", _at((0, 1), 1.5))),
        ("spread not the window mean", T("spread", _at((1,), 9.0))),
        ("inf before", T("before_max", _at((0,), INF))),
        ("how relabelled", J(how="swap")),
        ("threshold 0", J(threshold=0.0)),
    ]),
    *_cases("valleys", "valleys", "", [
        ("entropy 1.5", T("entropy", _at((0, 1), 1.5))),
        ("NaN entropy", T("entropy", _at((0, 1), NAN))),
        ("negative norm", T("first_norm", _at((0, 0), -1.0))),
        ("sink rate 1.5", T("sink_rate", _at((0, 0), 1.5))),
        ("eps 0", J(eps=0.0)),
        ("valley not the lowest", J(valley_layer=0)),
        ("headline of another run", T("headline", _at((1, 0), 0.5))),
        ("ablated part missing", J(ablation_layer=-1)),
    ]),
    *_cases("emergence", "sink_emergence", "", [
        ("alpha 1.5", T("step_alpha", _at((0, 0, 0, 0), 1.5))),
        ("NaN alpha", T("decay_alpha", _at((0, 0, 0, 0), NAN))),
        ("steps out of order", T("steps", _at((0,), 5000.0))),
        ("negative weight decay", T("weight_decays", _at((0,), -0.1))),
        ("inf interval", T("step_interval", _at((0, 0, 0), INF))),
        ("eps 0", J(eps=0.0)),
    ]),
]  # fmt: skip


@pytest.mark.parametrize("hashes", ["hash-kept", "hash-resealed"])
@pytest.mark.parametrize(
    ("name", "part", "stem", "what", "tamper"),
    [pytest.param(*case, id=f"{case[0]}-{case[3]}") for case in TAMPERS],
)
def test_a_tampered_value_is_refused(saved, tmp_path, name, part, stem, what, tamper, hashes):
    folder = tmp_path / name
    shutil.copytree(saved / name, folder)
    CLASSES[name].load(folder)  # the untouched result loads
    tamper(folder / part if part else folder, stem)
    if hashes == "hash-resealed":  # value validation must hold on its own
        reseal(folder)
    with pytest.raises(IncompatibleResultsError) as err:
        CLASSES[name].load(folder)
    message = str(err.value)
    assert str(folder) in message and "again" in message, message


def test_the_tamper_table_covers_every_result_class() -> None:
    assert {case[0] for case in TAMPERS} == set(CLASSES)
    assert len(TAMPERS) >= 72


def test_legitimate_nan_still_loads(saved, tmp_path) -> None:
    """NaN where a class documents it: sink mass by query before the key, to_others where a
    sequence has no position, an unknown checkpoint step, the last key's received attention."""
    for name, field, stem in (
        ("sink_scores", "mass_by_query", "sink_scores"),
        ("received", "received", "received"),
        ("sweep", "steps", "checkpoint_sweep"),
    ):
        tensors = load_file(str(saved / name / f"{stem}.safetensors"))
        assert bool(torch.isnan(tensors[field]).any()), (name, field)
        CLASSES[name].load(saved / name)


def test_a_folder_of_the_users_named_like_a_part_is_kept(saved, newer, tmp_path) -> None:
    """A save swaps the whole folder only when it holds nothing but a saved result: a folder of
    the user's whose name a part could have (``model_7``, without a homoglens JSON) stays."""
    folder = tmp_path / "comparison"
    shutil.copytree(saved / "comparison", folder)
    (folder / "model_7").mkdir()
    (folder / "model_7" / "weights.bin").write_bytes(b"mine")
    newer["comparison"].save(folder)
    assert (folder / "model_7" / "weights.bin").read_bytes() == b"mine"
    assert _digest(ModelComparison.load(folder)) == _digest(newer["comparison"])


# ------------------------------------------------------------------ round trips


def _differences(a: Any, b: Any, path: str = "result") -> list[str]:
    """Where ``b`` differs from ``a``: tensors by dtype, shape and value (NaN equal to NaN, bit
    for bit otherwise), dataclasses field by field, dicts key by key, sequences item by item
    (tuples stay tuples), anything else by type and ``==`` (a ``str`` subclass as ``str``:
    ``torch.__version__`` is a ``TorchVersion`` in memory, plain text once saved)."""
    if isinstance(a, str) and isinstance(b, str):
        return [] if str(a) == str(b) else [f"{path}: {a!r} != {b!r}"]
    if type(a) is not type(b):
        return [f"{path}: {type(a).__name__} != {type(b).__name__}"]
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"]
        same = torch.equal(a, b) or bool(
            ((a == b) | (torch.isnan(a) & torch.isnan(b))).all() if a.is_floating_point() else False
        )
        return [] if same else [f"{path}: values differ"]
    if dataclasses.is_dataclass(a):
        found = []
        for f in dataclasses.fields(a):
            found += _differences(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
        return found
    if isinstance(a, dict):  # keys in any order (a comparison's statistics load sorted)
        if set(a) != set(b):
            return [f"{path}: keys {sorted(a, key=str)} != {sorted(b, key=str)}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}[{k!r}]")]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and a != a and b != b:  # NaN
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.parametrize("name", list(CLASSES))
def test_a_saved_result_loads_equal_in_every_field(newer, tmp_path, name: str) -> None:
    result = newer[name]
    assert isinstance(result, CLASSES[name])
    loaded = CLASSES[name].load(result.save(tmp_path / name))
    assert _differences(result, loaded) == []


def test_the_round_trip_comparison_sees_a_difference() -> None:
    nan = torch.tensor([1.0, NAN])
    assert _differences(nan, nan.clone()) == []
    assert _differences(nan, torch.tensor([2.0, NAN])) == ["result: values differ"]
    assert _differences(nan, nan.double()) and _differences(nan, nan[:1])
    assert _differences((1, 2), [1, 2]) and _differences({"a": 1}, {"b": 1})
    sweep = CheckpointSweep(
        checkpoints=("a",),
        steps=torch.tensor([NAN], dtype=torch.float64),
        metrics=("h",),
        values=torch.zeros(1, 1, dtype=torch.float64),
        layer_metrics=(),
        layers=(),
        layer_values=torch.zeros(1, 0, 0, dtype=torch.float64),
    )
    other = dataclasses.replace(sweep, checkpoints=("b",))
    assert _differences(sweep, other) == ["result.checkpoints[0]: 'a' != 'b'"]


def test_every_result_class_is_in_the_table() -> None:
    """Every class with save and load that homoglens exports, and every SavedResult subclass,
    has a round trip and tampers above."""
    import inspect

    import homoglens
    from homoglens.results.base import SavedResult

    def subclasses(cls: type) -> set[type]:
        return {c for s in cls.__subclasses__() for c in (s, *subclasses(s))}

    exported = {
        obj
        for obj in vars(homoglens).values()
        if inspect.isclass(obj) and hasattr(obj, "save") and hasattr(obj, "load")
    }
    missing = (exported | subclasses(SavedResult)) - set(CLASSES.values())
    assert not missing, sorted(c.__name__ for c in missing)
