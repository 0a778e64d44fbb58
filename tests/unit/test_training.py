"""Controlled retraining: a micro configuration trains deterministically, and its folders load
on every backend and match Hugging Face (CI never trains the real models)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from helpers import BACKENDS
from homoglens import (
    InvalidInputError,
    load_model,
)
from homoglens.cli import main
from homoglens.testing import tiny_model_folder
from homoglens.training.train import TrainingConfig, split_austen, train_model, unigram_entropy

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


def test_split_holds_out_sense_and_sensibility() -> None:
    train, held = split_austen()
    assert held.startswith("SENSE AND SENSIBILITY") and "SENSE AND SENSIBILITY" not in train
    assert "PRIDE AND PREJUDICE" in train and 600_000 < len(held) < 700_000


def test_unigram_entropy_of_a_uniform_stream() -> None:
    tokens = torch.arange(8).repeat(5)
    assert unigram_entropy(tokens, 8) == pytest.approx(torch.log(torch.tensor(8.0)).item())


@pytest.mark.slow
def test_micro_training_is_deterministic_and_loads(tmp_path) -> None:
    first = train_model(
        TrainingConfig(variant="learned", **MICRO), tmp_path / "a", progress=False, log_every=2
    )
    again = train_model(
        TrainingConfig(variant="learned", **MICRO), tmp_path / "b", progress=False, log_every=2
    )
    assert (
        first["loss_curve"] == again["loss_curve"]
        and first["heldout_loss"] == again["heldout_loss"]
    )
    assert (
        json.loads((tmp_path / "a" / "training.json").read_text())["config"]["variant"] == "learned"
    )
    none = train_model(TrainingConfig(variant="none", **MICRO), tmp_path / "n", progress=False)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "n"))
    assert hf.transformer.wpe.weight.abs().max() == 0  # no positions, still a GPT-2 folder
    assert none["config"]["variant"] == "none"
    for backend in BACKENDS:
        model = load_model(tmp_path / "a", backend=backend)
        tokens = model.to_tokens("It is a truth universally acknowledged.")
        ref = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a"))
        with torch.no_grad():
            assert (ref(tokens).logits - model(tokens)).abs().max() < 1e-4


def test_training_config_and_cli_reject_bad_input(tmp_path) -> None:
    with pytest.raises(InvalidInputError, match="variant"):
        TrainingConfig(variant="alibi")
    with pytest.raises(InvalidInputError, match="multiple"):
        TrainingConfig(d_model=30, n_heads=4)
    result = CliRunner().invoke(main, ["train", "--variant", "alibi", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "alibi" in result.output


@pytest.mark.slow
def test_bos_training_starts_every_window_with_the_special_token(tmp_path, monkeypatch) -> None:
    """TrainingConfig(bos=True): every training batch starts with <|endoftext|> and holds
    n_ctx tokens; the held-out loss is measured on BOS windows; the folder is named -bos."""
    config = TrainingConfig(variant="rotary", bos=True, seed=3, **MICRO)
    assert config.name == "tiny-rotary-bos-s3"
    assert TrainingConfig(variant="none").name == "tiny-none"
    seen: list[torch.Tensor] = []
    from transformers import GPTNeoXForCausalLM

    original = GPTNeoXForCausalLM.forward

    def spy(self, input_ids=None, *args, **kwargs):
        seen.append(input_ids.detach().clone())
        return original(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(GPTNeoXForCausalLM, "forward", spy)
    record = train_model(config, tmp_path / config.name, progress=False)
    monkeypatch.undo()
    special = load_model(tmp_path / config.name, backend="bridge").tokenizer.convert_tokens_to_ids(
        "<|endoftext|>"
    )
    train_batches = seen[: MICRO["steps"]]
    assert all(b.shape == (MICRO["batch_size"], MICRO["n_ctx"]) for b in train_batches)
    assert all(bool((b[:, 0] == special).all()) for b in train_batches)
    assert all(bool((b[:, 0] == special).all()) for b in seen[MICRO["steps"] :])  # held-out
    assert record["config"]["bos"] is True and record["config"]["seed"] == 3
    from homoglens.training.train import heldout_windows

    tok = load_model(tmp_path / config.name, backend="bridge").tokenizer
    windows = heldout_windows(tok, n_seq=3, seq_len=16, bos=True)
    assert windows.bos is True and tuple(windows.tokens.shape) == (3, 16)
    assert bool((windows.tokens[:, 0] == special).all())
    plain = heldout_windows(tok, seq_len=15)
    assert bool((windows.tokens[0, 1:] == plain.tokens[0]).all())  # same text, BOS in front


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
    from homoglens.training.train import TrainingConfig, train_model

    out = tmp_path / "model"
    if existing:
        shutil.copytree(tiny_model_folder("gpt2"), out)  # an older model in the way
        before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    torch.set_num_threads(max(1, torch.get_num_threads() - 1) if torch.get_num_threads() > 1 else 1)
    saved = _torch_globals()
    _interrupt_at_step_1(monkeypatch)
    with pytest.raises(KeyboardInterrupt):  # not a file rewritten (no new tokenizer beside
        config = TrainingConfig(variant="rotary", **MICRO)  # old weights)
        train_model(config, out, overwrite=existing, progress=False)
    now = _torch_globals()
    assert now[:3] == saved[:3]
    assert torch.equal(now[3], saved[3])
    if existing:
        assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    else:
        assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == (["model"] if existing else [])


@pytest.mark.slow
def test_checkpoints_do_not_change_the_run_and_load(tmp_path) -> None:
    """save_every / save_steps keep step<N>/ folders (step 0 = the initialisation; the last
    step is the run folder itself); the final weights are those of a run without checkpoints
    bit for bit."""
    from safetensors.torch import load_file

    from homoglens.models.assets import checkpoint_folders

    config = TrainingConfig(variant="rotary", bos=True, **MICRO)
    plain = train_model(config, tmp_path / "plain", progress=False)
    kept = train_model(config, tmp_path / "kept", progress=False, save_every=2, save_steps=(1,))
    assert plain["loss_curve"] == kept["loss_curve"]
    folders = checkpoint_folders(tmp_path / "kept")
    assert [f.name for f in folders] == ["step0", "step1", "step2", "kept"]  # step 4: the run
    final = load_file(str(tmp_path / "plain" / "model.safetensors"))
    weights = load_file(str(tmp_path / "kept" / "model.safetensors"))
    assert all(torch.equal(final[k], weights[k]) for k in final)
    initial = load_file(str(folders[0] / "model.safetensors"))
    assert any(not torch.equal(final[k], initial[k]) for k in final)
    assert json.loads((folders[1] / "checkpoint.json").read_text())["step"] == 1
    load_model(folders[0], backend=BACKENDS[-1])  # a loadable folder of its own
    with pytest.raises(InvalidInputError, match="save_steps"):
        train_model(config, tmp_path / "bad", progress=False, save_steps=(5,))
    assert not (tmp_path / "bad").exists()
