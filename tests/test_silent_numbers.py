"""Regressions of a field-bug review: inputs and states that gave silently wrong numbers now
give a typed error or the right number. One test (or a few) per finding; the resid_mid patching
finding has its own file (test_patching_invariants.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import hook_count
from homoglens import (
    IncompleteModelFolderError,
    ModelStateError,
    homogenization_profile,
    load_model,
    model_info,
    positional_patching,
    sink_scores,
)
from homoglens.testing import tiny_model_folder

TEXTS = ["Hello world, this is a short text about nothing at all.", "Another one, a bit longer."]


# 2. incomplete model folders ---------------------------------------------------------------


def _without(folder: Path, tmp_path: Path, drop) -> Path:
    out = tmp_path / "model"
    shutil.copytree(folder, out)
    tensors = load_file(str(out / "model.safetensors"))
    kept = {k: v for k, v in tensors.items() if not drop(k)}
    assert len(kept) < len(tensors)
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize(
    ("arch", "config", "missing"),
    [
        ("gpt2", {}, "transformer.ln_f"),
        ("neox", {}, "final_layer_norm"),
        ("neox", {}, "lm_head"),  # stored as embed_out: Hugging Face's own rename applies
        ("llama", {}, "model.norm"),
    ],
)
def test_folder_without_final_norm_or_unembedding_is_refused(
    arch, config, missing, backend, tmp_path
) -> None:
    stored = "embed_out" if (arch, missing) == ("neox", "lm_head") else missing
    folder = _without(tiny_model_folder(arch, **config), tmp_path, lambda k: stored in k)
    with pytest.raises(IncompleteModelFolderError, match=missing):
        load_model(folder, backend=backend)


def test_untied_folder_without_its_unembedding_is_refused(backend, tmp_path) -> None:
    folder = tmp_path / "untied"
    shutil.copytree(tiny_model_folder("llama"), folder)  # tied: no lm_head.weight stored
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(IncompleteModelFolderError, match="lm_head.weight"):
        load_model(folder, backend=backend)


def test_tied_unembedding_is_not_missing(tmp_path) -> None:
    folder = tiny_model_folder("llama")  # tied: lm_head.weight is not stored
    assert "lm_head.weight" not in load_file(str(folder / "model.safetensors"))
    load_model(folder, backend="bridge")


# 3. a submodule left in training mode ------------------------------------------------------


def test_submodule_in_training_mode_is_refused(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    block = model.blocks[0]
    block.train()
    try:
        assert not model.training
        with pytest.raises(ModelStateError, match="training mode"):
            homogenization_profile(model, TEXTS, progress=False)
        with pytest.raises(ModelStateError, match="blocks.0"):
            sink_scores(model, TEXTS, progress=False)
        assert hook_count(model) == 0
    finally:
        model.eval()
    homogenization_profile(model, TEXTS, progress=False)


def test_inference_mode_weights_are_refused_where_gradients_are_needed() -> None:
    from homoglens import sink_attribution

    model = load_model(tiny_model_folder("gpt2"), backend="bridge")
    with torch.inference_mode():  # new weights are inference tensors
        model.to(torch.float64)
    with pytest.raises(ModelStateError, match="inference_mode"):
        sink_attribution(model, TEXTS, method="fast", edge_k=2, progress=False)
    assert hook_count(model) == 0


# 9. provenance records the dtype at call time ----------------------------------------------


def test_dtype_is_recorded_at_call_time(backend) -> None:
    model = load_model(tiny_model_folder("gpt2"), backend=backend)
    assert model_info(model).dtype == "float32"
    model.to(torch.float64)
    assert model_info(model).dtype == "float64"
    result = positional_patching(model, TEXTS, metric="loss", layers=[0], progress=False)
    assert result.provenance.dtype == "float64"


# 4. an interrupted train_model -------------------------------------------------------------

MICRO = {
    "steps": 4,
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 2,
    "vocab_size": 300,
    "n_ctx": 32,
    "batch_size": 4,
    "warmup": 1,
}


def _torch_globals() -> tuple:
    return (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_rng_state().clone(),
    )


def _interrupt_at_step_1(monkeypatch) -> None:
    calls = {"n": 0}
    clip = torch.nn.utils.clip_grad_norm_

    def clip_then_interrupt(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the optimiser step of step 1
            raise KeyboardInterrupt
        return clip(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_then_interrupt)


@pytest.mark.parametrize("existing", [False, True])
def test_interrupted_training_restores_torch_and_the_folder(existing, tmp_path, monkeypatch):
    from homoglens.training import TrainingConfig, train_model

    out = tmp_path / "model"
    if existing:
        shutil.copytree(tiny_model_folder("gpt2"), out)  # an older model in the way
        before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    torch.set_num_threads(max(1, torch.get_num_threads() - 1) if torch.get_num_threads() > 1 else 1)
    saved = _torch_globals()
    _interrupt_at_step_1(monkeypatch)
    with pytest.raises(KeyboardInterrupt):  # not a file rewritten (no new tokenizer beside
        train_model(TrainingConfig(variant="rotary", **MICRO), out, progress=False)  # old weights)
    now = _torch_globals()
    assert now[:3] == saved[:3]
    assert torch.equal(now[3], saved[3])
    if existing:
        assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    else:
        assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == (["model"] if existing else [])


def test_train_cli_with_invalid_sizes_leaves_no_folder(tmp_path) -> None:
    from click.testing import CliRunner

    from homoglens.cli import main

    out = tmp_path / "models"
    result = CliRunner().invoke(
        main,
        ["train", "--variant", "learned", "--d-model", "30", "--n-heads", "4", "--out", str(out)],
    )
    assert result.exit_code != 0 and "multiple" in result.output
    assert not out.exists()


# 5. NaN never passes silently ----------------------------------------------------------------


def _nan_model(backend, where: str = "attn"):
    """A NaN in one query weight of block 1 (``attn``) or in block 0's MLP (``mlp``, which
    reaches the residual stream and the logits on both backends; HookedTransformer turns a NaN
    attention pattern into zeros, so the attention NaN stays inside the pattern)."""
    model = load_model(tiny_model_folder("gpt2"), backend=backend)
    block = model.blocks[1 if where == "attn" else 0]
    module = block.attn if where == "attn" else block.mlp
    weight = getattr(module, "W_Q" if where == "attn" else "W_in", None)
    with torch.no_grad():
        if weight is None or backend != "hooked":
            weight = next(module.parameters())
        weight[(0,) * weight.ndim] = float("nan")
    return model


@pytest.mark.parametrize("metric", ["loss", "mean_pairwise"])
def test_nan_in_the_model_is_an_error_in_patching(backend, metric) -> None:
    from homoglens import NonFiniteActivationError, corpus_windows

    model = _nan_model(backend, "mlp")
    tokens = corpus_windows(model, n_seq=2, seq_len=24).tokens
    with pytest.raises(NonFiniteActivationError, match="NaN or inf"):
        positional_patching(model, tokens, metric=metric, progress=False)
    assert hook_count(model) == 0


def test_nan_in_the_model_is_an_error_in_sink_scores(backend) -> None:
    from homoglens import NonFiniteActivationError, corpus_windows

    model = _nan_model(backend)
    tokens = corpus_windows(model, n_seq=2, seq_len=24).tokens
    with pytest.raises(NonFiniteActivationError, match="hook_pattern"):
        sink_scores(model, tokens, progress=False)
    assert hook_count(model) == 0


def test_top_heads_says_when_it_ranks_undefined_heads_last(get_model) -> None:
    import dataclasses

    scores = sink_scores(get_model("gpt2", "bridge"), TEXTS, progress=False)
    mass = scores.mass.clone()
    mass[0, 0] = float("nan")  # e.g. no query after the key
    with pytest.warns(UserWarning, match="1 head.*ranked last"):
        top = dataclasses.replace(scores, mass=mass).top_heads(k=mass.numel())
    assert (top["layer"].iloc[-1], top["head"].iloc[-1]) == (0, 0)


# 7. float32 norms of very large and very small vectors -------------------------------------


def test_extreme_magnitudes_give_the_right_cosines() -> None:
    from homoglens import PositionalSimilarity
    from homoglens.homogenization import homogenization_sums

    torch.manual_seed(0)
    x = torch.randn(2, 12, 16)
    pos = torch.arange(12).repeat(2, 1)
    ref = homogenization_sums(x, pos, 12)
    for factor in (1e20, 1e-30):
        got = homogenization_sums(x * factor, pos, 12)
        for name in ("to_others_sum", "mean_pairwise_sum", "relative_residual_sum"):
            torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=0)
        torch.testing.assert_close(got["norm_sum"] / factor, ref["norm_sum"], rtol=1e-5, atol=0)
    same = torch.full((2, 5, 8), 1e-30)
    ones = homogenization_sums(same, torch.arange(5).repeat(2, 1), 5)
    assert float(ones["mean_pairwise_sum"]) == pytest.approx(2.0)
    sim = PositionalSimilarity.from_activations(torch.randn(8, 20, 16) * 1e20, edge_k=4)
    assert bool(torch.isfinite(sim.M).all())
    tiny = PositionalSimilarity.from_activations(torch.full((4, 20, 8), 1e-30), edge_k=4)
    torch.testing.assert_close(tiny.M, torch.ones_like(tiny.M))


# 6. BOS handling and byte-order marks -------------------------------------------------------


def test_a_text_that_starts_with_the_bos_gets_no_second_one(get_model) -> None:
    from homoglens import to_token_batch

    model = get_model("gpt2", "bridge")
    batch = to_token_batch(model, "<|endoftext|>Hello world", bos="always")
    assert batch.tokens.tolist() == [[50256, 15496, 995]] and batch.bos is True
    never = to_token_batch(model, "<|endoftext|>Hello world", bos="never")
    assert never.tokens.tolist() == [[50256, 15496, 995]]
    assert never.bos is True  # position 0 holds the BOS id, whatever the policy asked
    mixed = to_token_batch(model, ["<|endoftext|>Hello world", "Hello"], bos="never")
    assert mixed.bos is None


def test_a_byte_order_mark_is_not_text(get_model, tmp_path) -> None:
    from homoglens import corpus_windows, to_token_batch

    model = get_model("gpt2", "bridge")
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    text = "Hello world. " * 40
    plain.write_text(text, encoding="utf-8")
    marked.write_bytes("\ufeff".encode() + text.encode())
    assert torch.equal(to_token_batch(model, marked).tokens, to_token_batch(model, plain).tokens)
    a = corpus_windows(model, marked, n_seq=2, seq_len=16).tokens
    assert torch.equal(a, corpus_windows(model, plain, n_seq=2, seq_len=16).tokens)


# 8. saved results are checked as they load -------------------------------------------------


def _edit_json(folder: Path, stem: str, **changes) -> None:
    path = folder / f"{stem}.json"
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))


def _edit_tensor(folder: Path, stem: str, name: str, value: torch.Tensor) -> None:
    path = folder / f"{stem}.safetensors"
    tensors = load_file(str(path))
    tensors[name] = value
    save_file(tensors, str(path))


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


# 10. typed errors instead of raw tracebacks --------------------------------------------------


def test_meta_device_tokens_and_masks_are_typed_errors(get_model) -> None:
    from homoglens import InvalidInputError

    model = get_model("gpt2", "bridge")
    meta = torch.ones(2, 8, dtype=torch.long, device="meta")
    with pytest.raises(InvalidInputError, match="meta device"):
        homogenization_profile(model, meta, progress=False)
    with pytest.raises(InvalidInputError, match="meta device"):
        homogenization_profile(
            model, torch.ones(2, 8, dtype=torch.long), attention_mask=meta, progress=False
        )
    assert hook_count(model) == 0


def test_a_lone_surrogate_is_a_typed_error(get_model) -> None:
    from homoglens import InvalidInputError

    with pytest.raises(InvalidInputError, match="surrogate"):
        homogenization_profile(get_model("gpt2", "bridge"), ["fine", "bad \udc80"], progress=False)


def _cli(*args):
    from click.testing import CliRunner

    from homoglens.cli import main

    return CliRunner().invoke(main, list(args))


def test_a_full_disk_is_a_clear_cli_error(tmp_path, monkeypatch) -> None:
    import errno

    import homoglens.report

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r"))

    monkeypatch.setattr(homoglens.report, "write_profile_report", full)
    out = tmp_path / "r"
    args = ["--model", str(tiny_model_folder("gpt2")), "--n-seq", "2", "--seq-len", "16"]
    result = _cli("profile", *args, "--out", str(out), "--no-progress", "--no-ablation")
    assert result.exit_code == 1 and "No space left on device" in result.output
    assert isinstance(result.exception, SystemExit)  # a message, not a traceback
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_world_size_without_rank_is_a_clear_cli_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    args = ["--model", str(tiny_model_folder("gpt2")), "--n-seq", "2", "--seq-len", "16"]
    result = _cli("profile", *args, "--out", str(tmp_path / "r"), "--no-progress")
    assert result.exit_code == 1 and "torchrun" in result.output and "RANK" in result.output
    assert isinstance(result.exception, SystemExit)
