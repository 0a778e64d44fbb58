"""Regression tests for what a fresh tester broke through the public API and CLI."""

from __future__ import annotations

import json
import os
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
    ModelFolderNotFoundError,
    PositionAblationStudy,
    PositionPlan,
    ResultsNotFoundError,
    ablated_positions,
    cosine_homogenization,
    homogenization_profile,
    load_model,
    position_ablation_study,
    resid_hook_name,
)
from homoglens.cli import main
from homoglens.testing import tiny_model_folder

TEXTS = [
    "Hi there friend",
    "A dog ran far away from the house today and then it came back again.",
    "The cat sat.",
]


def test_overwrite_never_deletes_before_success_nor_protected_folders(tmp_path, monkeypatch):
    keep = tmp_path / "work"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    monkeypatch.chdir(keep)
    for out in (".", "..", str(keep)):
        result = CliRunner().invoke(
            main, ["profile", "--model", "/nope", "--out", out, "--overwrite", "--no-progress"]
        )
        assert result.exit_code == 1 and "never replaces" in result.output
    assert (keep / "notes.txt").read_text() == "precious"
    old = keep / "r1"
    old.mkdir()
    (old / "report.html").write_text("previous report")
    result = CliRunner().invoke(
        main, ["profile", "--model", "/nope", "--out", "r1", "--overwrite", "--no-progress"]
    )
    assert result.exit_code == 1
    assert (old / "report.html").read_text() == "previous report"  # failed run: untouched
    assert sorted(p.name for p in keep.iterdir()) == ["notes.txt", "r1"]  # no leftovers


def test_report_files_are_readable_by_group_and_others(tmp_path):
    out = tmp_path / "rep"
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "--model",
            str(tiny_model_folder("gpt2")),
            "--n-seq",
            "2",
            "--seq-len",
            "12",
            "--no-ablation",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    umask = os.umask(0)
    os.umask(umask)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~umask
    assert ((out / "profile" / "profile.safetensors").stat().st_mode & 0o777) == 0o666 & ~umask


def test_short_windows_with_exclude_first_still_write_a_report(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "--model",
            str(tiny_model_folder("gpt2")),
            "--n-seq",
            "2",
            "--seq-len",
            "3",
            "--exclude-first",
            "--no-ablation",
            "--out",
            str(tmp_path / "r"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Too few counted positions" in (tmp_path / "r" / "report.html").read_text()
    assert "no sinks section" in result.output


@pytest.mark.parametrize("mode", ["permute", "mean"])
def test_study_independent_of_batch_size_with_mixed_lengths(mode, get_model):
    model = get_model("gpt2", BACKENDS[-1])
    runs = [
        position_ablation_study(model, TEXTS, modes=[mode], batch_size=b, n_boot=20, progress=False)
        for b in (1, 3)
    ]
    assert torch.allclose(runs[0].mean_pairwise, runs[1].mean_pairwise, atol=1e-5)
    assert torch.allclose(runs[0].loss, runs[1].loss, atol=1e-5)
    # per-sequence results stay in input order: sequence 1 is the longest
    assert runs[0].to_others[0, 1].isfinite().sum() > runs[0].to_others[0, 0].isfinite().sum()


def test_cosine_homogenization_validates_masks():
    resid = torch.randn(2, 5, 8)
    for mask, match in (
        (torch.tensor([[1, 1, 2, 1, 1], [1] * 5]), "0 and 1"),
        (torch.tensor([[1, 1, 0.5, 1, 1], [1.0] * 5]), "0 and 1"),
        (torch.tensor([[1, 0, 1, 1, 1], [1] * 5]), "one block"),
        ([[1] * 5] * 2, "torch.Tensor"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            cosine_homogenization(resid, mask)


def test_left_padding_with_an_invalid_pad_id(get_model):
    tokens = torch.tensor([[-1, -1, 15496, 995, 11], [50256, 15496, 995, 11, 23748]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1] * 5])
    for backend in BACKENDS:
        model = get_model("gpt2", backend)
        prof = homogenization_profile(model, tokens, attention_mask=mask, progress=False)
        alone = HomogenizationProfile.merge(
            homogenization_profile(model, tokens[:1, 2:], progress=False),
            homogenization_profile(model, tokens[1:], progress=False),
        )
        assert torch.allclose(prof.to_others, alone.to_others, atol=1e-5, equal_nan=True)
        assert torch.allclose(prof.baseline, alone.baseline, atol=1e-5)
        study = position_ablation_study(
            model, tokens, attention_mask=mask, modes=["zero"], n_boot=10, progress=False
        )
        assert study.loss.isfinite().all()


def test_non_utf8_text_is_a_clear_error(tmp_path, get_model):
    path = tmp_path / "b.bin"
    path.write_bytes(bytes(range(128, 256)) * 4)
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        homogenization_profile(model, path, progress=False)
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "--model",
            str(tiny_model_folder("gpt2")),
            "--text",
            str(path),
            "--seq-len",
            "16",
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 1 and "not UTF-8" in result.output


def test_options_validated_before_any_forward(get_model):
    model = get_model("gpt2", BACKENDS[-1])
    for kwargs, match in (
        ({"seed": "a"}, "seed"),
        ({"seed": 2**70}, "seed"),
        ({"shift": "x"}, "shift"),
        ({"ci": "0.9"}, "ci"),
        ({"ci": None}, "ci"),
        ({"exclude_first": "no"}, "exclude_first"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            position_ablation_study(model, TEXTS, modes=["zero"], progress=False, **kwargs)
    with pytest.raises(InvalidInputError, match="non-negative shift"):
        with ablated_positions(model, "shift", shift=-1):
            pass
    with pytest.raises(InvalidInputError, match="seed"):
        with ablated_positions(model, "permute", seed=2**70):
            pass
    with pytest.raises(InvalidInputError, match="exclude_first"):
        homogenization_profile(model, TEXTS, exclude_first="no", progress=False)
    with pytest.raises(InvalidInputError, match="bos="):
        homogenization_profile(model, torch.tensor([[1, 2, 3]]), bos="junk", progress=False)
    assert hook_count(model) == 0


def test_numpy_integers_accepted_and_json_safe(tmp_path, get_model):
    model = get_model("llama", BACKENDS[-1])
    study = position_ablation_study(
        model,
        TEXTS,
        modes=["permute"],
        seed=np.int64(1),
        positions=np.array([0, 1, 2]),
        n_boot=np.int64(10),
        progress=False,
    )
    loaded = PositionAblationStudy.load(study.save(tmp_path / "s"))
    assert loaded.settings["positions"] == [0, 1, 2]
    with ablated_positions(model, "zero", layers=np.int64(1), positions=np.arange(3)):
        model(torch.tensor([[1, 2, 3, 4]]))
    prof = homogenization_profile(model, TEXTS, layers=np.int64(1), progress=False)
    assert prof.layers == (1,)
    with pytest.raises(InvalidInputError, match="block indices"):
        with ablated_positions(model, "zero", layers=[2]):
            pass


def test_position_plan_source_returns_copies(get_model):
    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.tensor([[50256, 15496, 995, 383, 2068, 7586]])
    base = model(tokens)
    src, _ = PositionPlan("shift", 128, shift=0).source(6)
    src[0] = 5
    with ablated_positions(model, "shift", shift=0):
        assert torch.equal(model(tokens), base)


def test_resid_hook_name_validates():
    assert resid_hook_name(np.int64(2)) == "blocks.1.hook_resid_post"
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidInputError):
            resid_hook_name(bad)


def test_load_errors_are_typed(tmp_path, get_model):
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(ResultsNotFoundError):
        HomogenizationProfile.load(tmp_path / "missing")
    folder = homogenization_profile(model, TEXTS, progress=False).save(tmp_path / "p")
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
    prof = homogenization_profile(get_model("gpt2", BACKENDS[-1]), TEXTS, progress=False)
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
        HomogenizationProfile.merge(prof, "x")


def test_load_model_raw_errors_become_typed(tmp_path: Path):
    for bad in (None, 123):
        with pytest.raises(InvalidInputError, match="model name or a folder"):
            load_model(bad)  # type: ignore[arg-type]
    folder = tmp_path / "cfg_only"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_model_folder("gpt2") / "config.json").read_text())
    with pytest.raises(ModelFolderNotFoundError, match="no weights"):
        load_model(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        load_model(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(InvalidInputError, match="architectures"):
        load_model(folder)
    with pytest.raises(InvalidInputError, match="device"):
        load_model(tiny_model_folder("gpt2"), device="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInputError, match="no CUDA"):
            load_model(tiny_model_folder("gpt2"), device="cuda")
    (tmp_path / "mdl").mkdir()
    with pytest.raises(ModelFolderNotFoundError):
        os.chdir(tmp_path)
        load_model("mdl/nothere")


def test_ablation_hooks_built_in_inference_mode_work_with_gradients(backend, get_model):
    """Cached position plans made under torch.inference_mode must not break a later forward
    pass that tracks gradients (found while writing the patching tests)."""
    from homoglens import position_ablation_hooks

    for arch in ("gpt2", "neox"):
        model = get_model(arch, backend)
        tokens = torch.randint(0, 1000, (2, 9))
        hooks = position_ablation_hooks(model, "permute", seed=11)
        with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
            expected = model(tokens)
        with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
            logits = model(tokens)
            logits.sum().backward()
        assert torch.allclose(logits.detach(), expected, atol=1e-5)
        model.zero_grad(set_to_none=True)


def test_breaker_findings_sinks_and_patching(get_model, tmp_path):
    """Findings of a bad-input review of sink_attribution / positional_patching (round 2)."""
    from homoglens import (
        HomoglensError,
        attention_view,
        corpus_windows,
        positional_patching,
        sink_attribution,
        sink_scores,
    )

    model = get_model("gpt2", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=3, seq_len=24)
    # An intermediate metric_layer: default layers stop before it; later blocks are refused.
    mid = positional_patching(model, batch, metric_layer=1, progress=False)
    assert mid.layers == (0,) and not mid.patched.isnan().any()
    with pytest.raises(InvalidInputError, match="cannot change"):
        positional_patching(model, batch, metric_layer=1, layers=[1], component="mlp_out")
    both = positional_patching(
        model,
        batch,
        metric_layer=1,
        layers=[1],
        bins=1,
        metric=["mean_pairwise", "loss"],
        progress=False,
    )  # resid_pre of block 1 at every position is entry 1 itself: restoring it restores it
    assert both.patched[0, 0].sub(both.normal[0]).abs().max() < 1e-6
    # A one-token sequence has no next-token loss.
    one = torch.tensor([[5, 0, 0], [5, 6, 7]])
    with pytest.raises(InvalidInputError, match="single token"):
        positional_patching(
            model,
            one,
            attention_mask=torch.tensor([[1, 0, 0], [1, 1, 1]]),
            metric="loss",
            progress=False,
        )
    # No query after the key: mass is undefined (NaN), not 0.
    short = sink_scores(model, torch.tensor([[5, 6, 7], [8, 9, 10]]), key=2, progress=False)
    assert short.mass.isnan().all()
    # Typed errors and accepted numpy/tensor scalars.
    assert len(positional_patching(model, batch, bins=np.int64(2), progress=False).cells) == 2
    assert positional_patching(model, batch, layers=np.int64(0), progress=False).layers == (0,)
    for kwargs in ({"bins": 2.0}, {"bins": True}, {"layers": "0"}):
        with pytest.raises(InvalidInputError):
            positional_patching(model, batch, progress=False, **kwargs)
    with pytest.raises(InvalidInputError, match="metrics"):
        sink_attribution(model, batch, method="fast", metrics=None, progress=False)
    scores = sink_scores(model, batch, key=np.int64(1), eps=np.float32(0.3), progress=False)
    assert scores.key == 1
    with pytest.raises(InvalidInputError):
        scores.top_heads(0)
    with pytest.raises(InvalidInputError, match="by="):
        scores.top_heads(by="x")
    attr = sink_attribution(model, batch, heads=[(0, 1)], edge_k=3, joint=np.False_, progress=False)
    with pytest.raises(InvalidInputError):
        attr.correlation(None)
    top = scores.top_heads(2)
    assert "L" in str(attention_view(model, "The cat sat.", top))  # a top_heads() frame works
    with pytest.raises(InvalidInputError, match="training mode"):
        model.train()
        try:
            sink_scores(model, batch, progress=False)
        finally:
            model.eval()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(HomoglensError):
        attr.save(tmp_path / "afile" / "sub")

    def first(logits, tokens, mask):
        return np.float32(logits[:, -1, 0].mean().item())

    def edits(logits, tokens, mask):
        logits.zero_()
        return 0.0

    ok = positional_patching(
        model, batch, metric=[edits, first, "loss"], layers=[0], progress=False
    )
    assert ok.normal[2] > 1  # the in-place edit of one metric does not reach the loss
    with pytest.raises(InvalidInputError, match="its own name"):
        positional_patching(model, batch, metric=[lambda a, b, c: 0.0, lambda a, b, c: 1.0])
    with pytest.raises(InvalidInputError, match="must accept"):
        positional_patching(model, batch, metric=[lambda logits: 0.0], layers=[0], progress=False)
    assert hook_count(model) == 0
