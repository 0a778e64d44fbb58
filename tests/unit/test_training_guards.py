"""Training refuses what it cannot do well before spending time on it, and never saves a
diverged model: every TrainingConfig field is checked at construction, an out folder the run
could not write is refused before training, and a NaN/inf loss or weight stops the run with a
typed error that leaves the output folder as it was (issue 39)."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from homoglens.core.errors import InvalidInputError, TrainingDivergedError
from homoglens.testing import tiny_model_folder
from homoglens.training import train as training
from homoglens.training.train import TrainingConfig, train_model

MICRO: dict[str, Any] = {
    "steps": 4,
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 2,
    "vocab_size": 300,
    "n_ctx": 32,
    "batch_size": 4,
    "warmup": 1,
}


def _permissions_bind() -> bool:
    """Whether a read-only folder refuses this process a new entry (not for root with its
    usual capabilities)."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        locked = Path(scratch) / "locked"
        locked.mkdir(mode=stat.S_IRUSR | stat.S_IXUSR)
        try:
            (locked / "probe").mkdir()
        except PermissionError:
            return True
        finally:
            locked.chmod(stat.S_IRWXU)
        return False


needs_permissions = pytest.mark.skipif(
    not _permissions_bind(), reason="file permissions do not bind this process (root)"
)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("lr", math.nan, "finite number > 0"),
        ("lr", math.inf, "finite number > 0"),
        ("lr", -1e-3, "finite number > 0"),
        ("lr", 0.0, "finite number > 0"),
        ("lr", "3e-3", "finite number > 0"),
        ("lr", True, "finite number > 0"),
        ("lr", 10**400, "finite number > 0"),
        ("lr", torch.tensor([1e-3, 2e-3]), "finite number > 0"),
        ("weight_decay", -1, "finite number >= 0"),
        ("weight_decay", math.nan, "finite number >= 0"),
        ("weight_decay", "0.1", "finite number >= 0"),
        ("n_layers", 0, "integer >= 1"),
        ("n_layers", 2.5, "integer >= 1"),
        ("d_model", "128", "integer >= 1"),
        ("n_heads", -4, "integer >= 1"),
        ("n_ctx", 1, "integer in [2, 4096]"),
        ("n_ctx", 4097, "integer in [2, 4096]"),
        ("n_ctx", 100_000, "integer in [2, 4096]"),  # attention grows with n_ctx^2: minutes/step
        ("vocab_size", 4096.0, "integer in [260, 65536]"),
        ("vocab_size", 259, "integer in [260, 65536]"),
        ("vocab_size", 65_537, "integer in [260, 65536]"),
        ("vocab_size", 10**9, "integer in [260, 65536]"),  # the BPE trainer aborted the process
        ("steps", 0, "integer >= 1"),
        ("steps", math.nan, "integer >= 1"),
        ("batch_size", True, "integer >= 1"),
        ("warmup", -1, "integer >= 0"),
        ("seed", -1, "integer in [0, 18446744073709551615]"),
        ("seed", 2**64, "integer in [0, 18446744073709551615]"),
        ("threads", 0, "integer >= 1"),
        ("bos", "yes", "True or False"),
        ("bos", 1, "True or False"),
        ("variant", 3, "one of"),
    ],
)
def test_every_config_field_is_checked_at_construction(field, value, allowed) -> None:
    """The error names the field, the value given and what is allowed."""
    with pytest.raises(InvalidInputError) as err:
        TrainingConfig(**{field: value})
    message = str(err.value)
    assert f"{field}=" in message and allowed in message
    assert repr(value) in message


def test_vocab_size_and_n_ctx_are_bounded_with_the_reason() -> None:
    """vocab_size=10**9 made the tokenizer trainer abort the interpreter (a 70 GB allocation)
    and n_ctx=100000 ran for minutes per step: both are refused at construction, saying the
    bound and why; the bounds themselves, the defaults and the test sizes stay valid."""
    with pytest.raises(InvalidInputError) as err:
        TrainingConfig(vocab_size=10**9)
    assert "65536" in str(err.value) and "27,000 distinct tokens" in str(err.value)
    with pytest.raises(InvalidInputError) as err:
        TrainingConfig(n_ctx=100_000)
    assert "4096" in str(err.value) and "n_ctx squared" in str(err.value)
    assert training.MAX_VOCAB_SIZE == 65_536 and training.MAX_N_CTX == 4096
    edge = TrainingConfig(vocab_size=training.MAX_VOCAB_SIZE, n_ctx=training.MAX_N_CTX)
    assert (edge.vocab_size, edge.n_ctx) == (65_536, 4096)
    TrainingConfig()
    TrainingConfig(**MICRO)


def test_config_cross_checks_and_plain_values() -> None:
    with pytest.raises(InvalidInputError, match="d_model=30 must be a multiple of n_heads=4"):
        TrainingConfig(d_model=30, n_heads=4)
    with pytest.raises(InvalidInputError, match="rotary.*even"):  # head width 3
        TrainingConfig(variant="rotary", d_model=6, n_heads=2)
    TrainingConfig(variant="learned", d_model=6, n_heads=2)  # odd heads are fine without RoPE
    # numpy / torch scalars are stored as the Python values training.json can hold
    scalars: dict[str, Any] = {
        "steps": np.int64(10),
        "lr": np.float32(0.5),
        "weight_decay": 0,
        "seed": torch.tensor(3),
        "bos": np.bool_(True),
    }
    config = TrainingConfig(**scalars)
    values = asdict(config)
    assert json.loads(json.dumps(values)) == values
    assert type(config.steps) is int and type(config.seed) is int and config.bos is True
    assert type(config.lr) is float and type(config.weight_decay) is float
    assert asdict(TrainingConfig()) == {  # the defaults are untouched
        "variant": "learned",
        "n_layers": 4,
        "d_model": 128,
        "n_heads": 4,
        "n_ctx": 128,
        "vocab_size": 4096,
        "steps": 3000,
        "batch_size": 16,
        "lr": 3e-3,
        "warmup": 100,
        "weight_decay": 0.1,
        "seed": 0,
        "threads": 2,
        "bos": False,
    }


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def _older_run(out: Path) -> dict[str, tuple[bytes, int]]:
    shutil.copytree(tiny_model_folder("gpt2"), out)
    shutil.copytree(tiny_model_folder("gpt2"), out / "checkpoints" / "step0")
    return _snapshot(out)


@pytest.mark.parametrize("existing", [False, True])
def test_a_diverging_lr_stops_with_a_typed_error_and_saves_nothing(existing, tmp_path) -> None:
    """lr=1e6 makes the loss NaN within two steps: the run names the step and the loss and
    suggests a lower lr; no NaN model or checkpoint is saved, an older run stays as it was."""
    out = tmp_path / "model"
    before = _older_run(out) if existing else None
    config = TrainingConfig(variant="learned", **{**MICRO, "lr": 1e6})
    with pytest.raises(TrainingDivergedError) as err:
        train_model(config, out, overwrite=existing, progress=False, save_steps=(1,))
    message = str(err.value)
    assert "training loss of step 2 is nan" in message or "step 2 is inf" in message
    assert "lr=1e+06" in message and "Lower the learning rate (e.g. lr=100000)" in message
    if existing:
        assert _snapshot(out) == before
    else:
        assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == (["model"] if existing else [])


def _nan_gradients_at(call: int, monkeypatch) -> None:
    """Make the weights NaN through the optimiser step of step ``call`` (1-based), whose loss is
    still finite: only the weight checks can catch it."""
    calls = {"n": 0}
    clip = torch.nn.utils.clip_grad_norm_

    def clip_then_poison(parameters, *args, **kwargs):
        parameters = list(parameters)
        norm = clip(parameters, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == call:
            for p in parameters:
                if p.grad is not None:
                    p.grad.fill_(math.nan)
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_then_poison)


@pytest.mark.parametrize(
    ("call", "save_steps", "where"),
    [(4, (), r"the final weights \(step 4\)"), (2, (2,), "the weights after step 2")],
)
def test_nan_weights_are_never_saved_as_a_model_or_checkpoint(
    call, save_steps, where, tmp_path, monkeypatch
) -> None:
    out = tmp_path / "model"
    before = _older_run(out)
    _nan_gradients_at(call, monkeypatch)
    config = TrainingConfig(variant="rotary", **MICRO)
    with pytest.raises(TrainingDivergedError, match=f"{where} hold NaN or inf.*Lower"):
        train_model(config, out, overwrite=True, progress=False, save_steps=save_steps)
    assert _snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.fixture
def no_training(monkeypatch) -> None:
    """Fail the test if training starts (the corpus is the first thing it prepares)."""

    def boom(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(training, "_prepared_corpus", boom)


@needs_permissions
def test_an_unwritable_folder_is_refused_before_training(tmp_path, no_training) -> None:
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(InvalidInputError) as err:
            train_model(TrainingConfig(**MICRO), parent / "model" / "deep", progress=False)
        message = str(err.value)
        assert str(parent) in message and "not writable" in message and "chmod u+w" in message
    finally:
        parent.chmod(stat.S_IRWXU)
    assert list(parent.iterdir()) == []


@needs_permissions
def test_an_older_run_that_cannot_be_deleted_is_refused_before_training(
    tmp_path, no_training
) -> None:
    """Replacing it would stop half way through (the new run lost, the old one half deleted)."""
    out = tmp_path / "model"
    before = _older_run(out)
    locked = out / "checkpoints" / "step0"
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(InvalidInputError, match="step0.*not writable.*chmod -R u\\+w"):
            train_model(TrainingConfig(**MICRO), out, overwrite=True, progress=False)
    finally:
        locked.chmod(stat.S_IRWXU)
    assert _snapshot(out) == before


def test_a_file_or_link_in_the_way_is_refused_before_training(tmp_path, no_training) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    with pytest.raises(InvalidInputError, match="notes.txt.*is a file"):
        train_model(TrainingConfig(**MICRO), afile, progress=False)
    with pytest.raises(InvalidInputError, match="notes.txt.*is a file, not a folder"):
        train_model(TrainingConfig(**MICRO), afile / "model", progress=False)
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(InvalidInputError, match="symbolic link"):
        train_model(TrainingConfig(**MICRO), link, progress=False)
    assert afile.read_text() == "mine" and link.is_symlink() and list(target.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "link", "notes.txt"]


def test_bad_arguments_are_refused_before_training(tmp_path, no_training) -> None:
    with pytest.raises(InvalidInputError, match="log_every=0"):
        train_model(TrainingConfig(**MICRO), tmp_path / "m", log_every=0, progress=False)
    with pytest.raises(InvalidInputError, match="must be a TrainingConfig"):
        train_model(asdict(TrainingConfig(**MICRO)), tmp_path / "m", progress=False)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="folder path"):
        train_model(TrainingConfig(**MICRO), None, progress=False)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_context_longer_than_the_text_is_refused_before_any_step(tmp_path, monkeypatch) -> None:
    """No n_ctx TrainingConfig allows outruns the Austen text; a shorter corpus (simulated)
    is still refused before any step."""
    with pytest.raises(InvalidInputError, match="n_ctx=3000000 must be an integer in"):
        TrainingConfig(**{**MICRO, "n_ctx": 3_000_000})
    short = torch.arange(40)
    monkeypatch.setattr(training, "_prepared_corpus", lambda vocab_size: (None, short, short))
    config = TrainingConfig(**{**MICRO, "n_ctx": 64})
    with pytest.raises(InvalidInputError, match="n_ctx=64 leaves no window.*lower n_ctx"):
        train_model(config, tmp_path / "m", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_folder_is_refused_before_training_simulated(
    tmp_path, no_training, monkeypatch
) -> None:
    """The same refusal where permissions do not bind (root, CI): the folder refuses a new
    entry as a read-only one would."""
    import tempfile

    parent = tmp_path / "locked"
    parent.mkdir()
    mkdtemp = tempfile.mkdtemp

    def refuse(*args, dir=None, **kwargs):  # noqa: A002 (tempfile's own name)
        if dir is not None and Path(dir) == parent:
            raise PermissionError(13, "Permission denied", str(dir))
        return mkdtemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(InvalidInputError, match="locked.*not writable.*Permission denied"):
        train_model(TrainingConfig(**MICRO), parent / "model", progress=False)
    assert list(parent.iterdir()) == []


def test_an_older_run_that_cannot_be_deleted_is_refused_simulated(
    tmp_path, no_training, monkeypatch
) -> None:
    out = tmp_path / "model"
    before = _older_run(out)
    locked = out / "checkpoints" / "step0"
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != locked and access(p, mode))
    with pytest.raises(InvalidInputError, match="step0.*not writable.*chmod -R u\\+w"):
        train_model(TrainingConfig(**MICRO), out, overwrite=True, progress=False)
    assert _snapshot(out) == before


def test_a_folder_of_other_files_is_never_replaced(tmp_path, no_training) -> None:
    """The run replaces ``out`` as a whole: a non-empty folder that is no model folder (a
    user's documents) is refused before training; an empty one or an older run is fine."""
    out = tmp_path / "documents"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(InvalidInputError, match="documents.*holds files but no model") as err:
            train_model(TrainingConfig(**MICRO), out, overwrite=overwrite, progress=False)
        assert "older run" not in str(err.value)  # it used to invite one
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AssertionError, match="training started"):
        train_model(TrainingConfig(**MICRO), empty, progress=False)
    _older_run(tmp_path / "older")
    with pytest.raises(AssertionError, match="training started"):
        train_model(TrainingConfig(**MICRO), tmp_path / "older", overwrite=True, progress=False)


@pytest.mark.parametrize("marker", ["config.json", "training.json"])
def test_an_older_run_is_replaced_only_with_overwrite(marker, tmp_path, no_training) -> None:
    """train_model used to replace an older run in ``out`` without a word (the CLI refused it
    without --overwrite): now it is refused before any training unless overwrite=True, and
    the message names the folder and both ways out."""
    out = tmp_path / "runs" / "tiny-learned"
    before = _older_run(out)
    if marker == "training.json":  # either file marks a run
        (out / "config.json").unlink()
        (out / "training.json").write_text('{"mine": true}')
        before = _snapshot(out)
    for given in ({}, {"overwrite": False}):
        with pytest.raises(InvalidInputError) as err:
            train_model(TrainingConfig(**MICRO), out, progress=False, **given)
        message = str(err.value)
        assert str(out) in message and "older run" in message and marker in message
        assert "overwrite=True" in message and "another folder" in message
    assert _snapshot(out) == before
    with pytest.raises(InvalidInputError, match="overwrite='yes' must be"):
        train_model(TrainingConfig(**MICRO), out, overwrite="yes", progress=False)  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="training started"):
        train_model(TrainingConfig(**MICRO), out, overwrite=True, progress=False)
    assert _snapshot(out) == before
