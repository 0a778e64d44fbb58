"""What the third bad-input review (issue 9) broke through the public API and CLI, as tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import BACKENDS, hook_count
from homoglens import (
    HomogenizationProfile,
    IncompatibleResultsError,
    InvalidInputError,
    PositionAblationStudy,
    PositionPlan,
    UnknownModelError,
    ablated_positions,
    compare_models,
    corpus_windows,
    cosine_homogenization,
    homogenization_profile,
    load_corpus,
    load_model,
    massive_activations,
    model_info,
    position_ablation_study,
    sink_attribution,
    to_token_batch,
)
from homoglens.cli import main
from homoglens.comparison import ModelComparison
from homoglens.data import TokenBatch
from homoglens.testing import tiny_model_folder

TEXTS = ["It is a truth universally acknowledged, that a single man", "Emma Woodhouse, handsome"]


def test_cli_out_paths_are_checked_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    (tmp_path / "afile").write_text("x")
    for out in ("link", "afile/sub"):
        result = CliRunner().invoke(main, ["compare", "--n-seq", "2", "--out", str(tmp_path / out)])
        assert result.exit_code != 0 and "Error:" in result.output, out
        assert not isinstance(result.exception, OSError)
    result = CliRunner().invoke(main, ["train", "--steps", "1", "--out", str(tmp_path / "afile")])
    assert result.exit_code != 0 and "is a file" in result.output


def test_corrupt_model_folders_raise_typed_errors(tmp_path: Path) -> None:
    source = tiny_model_folder("gpt2")
    for name, change in (
        ("junk", lambda f: (f / "model.safetensors").write_bytes(b"not safetensors")),
        (
            "layers",
            lambda f: (f / "config.json").write_text(
                json.dumps({**json.loads((f / "config.json").read_text()), "n_layer": 3})
            ),
        ),
    ):
        folder = tmp_path / name
        folder.mkdir()
        for item in source.iterdir():
            (folder / item.name).write_bytes(item.read_bytes())
        change(folder)
        with pytest.raises(InvalidInputError):
            load_model(folder, backend=BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="process_weights"):
        load_model(source, process_weights="no")


def test_hub_name_that_does_not_exist_is_unknown() -> None:
    with pytest.raises(UnknownModelError):
        load_model("nobody/does-not-exist-anywhere", backend=BACKENDS[0])


@pytest.mark.parametrize("thing", ["homoglens/tiny-learned", None, torch.nn.Linear(2, 2)])
def test_a_non_model_is_refused_everywhere(thing) -> None:
    for call in (
        lambda: homogenization_profile(thing, "hi there"),
        lambda: model_info(thing),
        lambda: corpus_windows(thing),
        lambda: to_token_batch(thing, "hi there"),
        lambda: ablated_positions(thing, "zero").__enter__(),
        lambda: compare_models({"a": 5 if isinstance(thing, str) or thing is None else thing}),
    ):
        with pytest.raises(InvalidInputError, match="HookedTransformer or TransformerBridge"):
            call()


def test_tensor_and_array_arguments(get_model, tmp_path: Path) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="single integer"):
        homogenization_profile(model, TEXTS, batch_size=torch.tensor(2.0), progress=False)
    with pytest.raises(InvalidInputError):
        corpus_windows(model, n_seq=torch.tensor(2.5))
    prof = homogenization_profile(model, TEXTS, layers=np.array([0, 2]), progress=False)
    assert prof.layers == (0, 2)
    assert homogenization_profile(model, TEXTS, batch_size=np.int64(1), progress=False).layers
    with pytest.raises(InvalidInputError):
        cosine_homogenization(torch.zeros(0, 5, 8))


def test_token_batch_indexing() -> None:
    ones = torch.ones(2, 3, dtype=torch.long)
    batch = TokenBatch(ones, ones.clone(), False, "ones")
    assert len(batch[-1]) == 1 and len(batch[1]) == 1
    with pytest.raises(IndexError):
        batch[5]


def test_saving_under_a_file_and_loading_corrupt_results(get_model, tmp_path: Path) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    (tmp_path / "afile").write_text("x")
    prof = homogenization_profile(model, TEXTS, progress=False)
    with pytest.raises(InvalidInputError):
        prof.save(tmp_path / "afile" / "sub")
    study = position_ablation_study(model, TEXTS, modes=["zero"], n_boot=10, progress=False)
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


def test_compare_models_arguments_and_mixed_lengths(get_model) -> None:
    with pytest.raises(InvalidInputError, match="no_positions"):
        compare_models(["homoglens/tiny-none"], n_seq=2, no_positions=["x"])
    with pytest.raises(InvalidInputError, match="seq_len"):
        compare_models(["homoglens/tiny-none"], n_seq=2, seq_len=0)
    model = load_model("homoglens/tiny-none", backend=BACKENDS[-1])
    windows = corpus_windows(model, "austen-heldout", n_seq=2, seq_len=60, bos="never")
    mask = windows.attention_mask.clone()
    mask[1, 40:] = 0  # the second sequence has 40 tokens
    batch = TokenBatch(windows.tokens, mask, False, "mixed lengths")
    with pytest.raises(InvalidInputError, match="equal length"):  # position pairs need them
        compare_models({"m": model}, batch, edge_k=4, n_boot=10, progress=False)
    result = compare_models({"m": model}, windows, edge_k=4, n_boot=10, progress=False)
    assert isinstance(result, ModelComparison) and result.n_sequences == 2


def test_permute_with_positions_stays_a_permutation(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="among themselves"):
        ablated_positions(model, "permute", perm=[1, 0, 2, 3, 4, 5], positions=[0, 2]).__enter__()
    assert hook_count(model) == 0
    plan = PositionPlan("permute", 8, positions=(0, 2), perm=(2, 1, 0, 3))
    assert plan.source(4)[0].tolist() == [2, 1, 0, 3]
    for bad in (
        {"positions": [1]},
        {"positions": (-1,)},
        {"perm": (0, 0, 0)},
        {"perm": (0, 5, 1)},
    ):
        with pytest.raises(InvalidInputError):
            PositionPlan("permute", 8, **bad)
    with pytest.raises(InvalidInputError):
        plan.source(-1)


def test_non_finite_activations_everywhere(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    handle = model.hook_dict["blocks.0.hook_resid_post"].register_forward_hook(
        lambda module, inputs, output: output * float("inf")
    )
    try:
        from homoglens import NonFiniteActivationError

        for call in (
            lambda: massive_activations(model, TEXTS, progress=False),
            lambda: sink_attribution(model, TEXTS, method="fast", edge_k=2, progress=False),
        ):
            with pytest.raises(NonFiniteActivationError):
                call()
    finally:
        handle.remove()
    assert hook_count(model) == 0


def test_load_corpus_refuses_non_names() -> None:
    with pytest.raises(InvalidInputError, match="unknown corpus"):
        load_corpus(["austen"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_patching_the_measured_entry_restores_it(backend: str, get_model) -> None:
    """Restoring resid_pre of block l, where the metric is read (entry l), restores it fully
    at every l (it read blocks.{l-1}.hook_resid_post before, which the patch never reached)."""
    from homoglens import positional_patching

    model = get_model("gpt2", backend)
    for layer in (0, 1):
        result = positional_patching(
            model,
            TEXTS,
            metric=["mean_pairwise", "loss"],
            metric_layer=layer,
            layers=[layer],
            bins=1,
            progress=False,
        )
        assert result.effect[0].flatten().tolist() == pytest.approx([1.0]), layer
