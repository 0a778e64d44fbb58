"""What the commands refuse before any work: an --out that is, holds or is inside one of their
inputs, option values the windows cannot honour (never clamped without a word), and what a
failed write says (errno, not always "free some space")."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from homoglens.cli import main
from homoglens.testing import tiny_model_folder

FAST = ["--n-seq", "2", "--seq-len", "12", "--no-progress"]
PROFILE_FAST = [
    "--no-ablation",
    "--no-sinks",
    "--no-patching",
    "--no-similarity",
    "--no-bias",
    "--no-massive",
    "--no-effective-rank",
]


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def my_model(tmp_path: Path) -> Path:
    """A private copy of a tiny model (the shared cache must never be at risk)."""
    folder = tmp_path / "work" / "my-model"
    shutil.copytree(tiny_model_folder("gpt2"), folder)
    return folder


# the command's own arguments, given the model folder (--model for the data commands)
COMMANDS = {
    "profile": lambda m: ["profile", "--model", m, *FAST, *PROFILE_FAST],
    "ablate": lambda m: ["ablate", "--model", m, "--modes", "zero", *FAST],
    "sinks": lambda m: ["sinks", "--model", m, *FAST],
    "patch": lambda m: ["patch", "--model", m, "--patch-n-seq", "2", *FAST],
    "bias": lambda m: ["bias", "--model", m, "--strengths", "0,1", *FAST],
    "length": lambda m: ["length", "--model", m, "--lengths", "8,12", "--n-seq", "2"],
    "compare": lambda m: ["compare", "--models", m, "--n-seq", "2", "--no-progress"],
    "sweep": lambda m: ["sweep", "--checkpoints", m, "--n-seq", "2", "--no-progress"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_out_on_the_model_folder_is_refused_and_deletes_nothing(my_model, command) -> None:
    before = _files(my_model)
    result = _cli(*COMMANDS[command](str(my_model)), "--out", str(my_model), "--overwrite")
    assert result.exit_code == 1, result.output
    assert "is the model folder" in result.output and "Traceback" not in result.output
    assert _files(my_model) == before  # the weights are still there, untouched


@pytest.mark.parametrize("command", list(COMMANDS))
def test_out_on_the_model_folder_says_so_first_without_overwrite(my_model, command) -> None:
    """The input check comes before the non-empty check: the first answer is the real one
    (it used to suggest --overwrite, which was then refused as the model folder)."""
    before = _files(my_model)
    result = _cli(*COMMANDS[command](str(my_model)), "--out", str(my_model))
    assert result.exit_code == 1, result.output
    assert "is the model folder" in result.output and "outside every input" in result.output
    assert "not empty" not in result.output and "pass --overwrite" not in result.output
    assert _files(my_model) == before


def test_sweep_names_a_bogus_measure_before_the_windows(tmp_path) -> None:
    """An unknown --measure is said first, not a --seq-len problem found on loading."""
    model = str(tiny_model_folder("gpt2"))
    out = tmp_path / "r"
    args = ["sweep", "--checkpoints", model, "--measure", "loss,bogus", "--seq-len", "100000"]
    result = _cli(*args, "--out", str(out))
    assert result.exit_code == 2, result.output
    assert "--measure bogus unknown" in result.output, result.output
    assert "homogenization,sinks,loss" in result.output and "seq" not in result.output
    assert not out.exists()


def test_train_bounds_its_sizes_and_passes_overwrite_through(tmp_path, monkeypatch) -> None:
    """--n-ctx and --vocab-size stop at TrainingConfig's bounds (100000 ran for minutes, 10**9
    aborted the process); --overwrite reaches train_model, which refuses an older run without
    it on its own."""
    import homoglens.training.train as training

    calls: list[bool] = []

    def fake_train(config, out, *, overwrite=False, **_):  # never a real run, whatever is let in
        calls.append(overwrite)
        return {"heldout_loss": 1.0, "heldout_unigram_entropy": 2.0, "wall_seconds": 0.0}

    monkeypatch.setattr(training, "train_model", fake_train)
    base = ["train", "--variant", "learned", "--steps", "1", "--out", str(tmp_path / "runs")]
    cases = [("--n-ctx", "100000", "4096"), ("--vocab-size", "1000000000", "65536")]
    for option, value, bound in cases:
        result = _cli(*base, option, value)
        assert result.exit_code == 2 and bound in result.output, result.output
        assert option in result.output and "Traceback" not in result.output
    assert not calls
    assert (training.MAX_N_CTX, training.MAX_VOCAB_SIZE) == (4096, 65536)  # the CLI's bounds
    assert _cli(*base).exit_code == 0
    (tmp_path / "runs" / "tiny-learned").mkdir(parents=True)  # an older run (the CLI asks)
    assert _cli(*base, "--overwrite").exit_code == 0
    assert calls == [False, True]


def test_out_that_holds_or_is_inside_an_input_is_refused(my_model, tmp_path, monkeypatch) -> None:
    model = str(my_model)
    work = my_model.parent
    (work / "notes.txt").write_text("mine")
    corpus = tmp_path / "texts"
    corpus.mkdir()
    text = corpus / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 100)
    (tmp_path / "alias").symlink_to(my_model)  # the same folder under another name
    monkeypatch.chdir(tmp_path)
    cases = [
        (["--model", model, "--out", str(work)], "holds the model folder"),
        (["--model", model, "--out", str(my_model / "report")], "is inside the model folder"),
        (["--model", str(tmp_path / "alias"), "--out", model], "is the model folder"),
        (["--model", "alias", "--out", "work/my-model"], "is the model folder"),
        (["--model", model, "--text", str(text), "--out", str(corpus)], "holds the text file"),
        (["--model", model, "--corpus", "texts/t.txt", "--out", "texts"], "holds the corpus"),
    ]
    for args, message in cases:
        result = _cli("profile", *args, "--overwrite", *FAST, *PROFILE_FAST)
        assert result.exit_code == 1 and message in result.output, (args, result.output)
        assert "--out" in result.output and "outside every input" in result.output
    assert (work / "notes.txt").read_text() == "mine" and text.is_file()
    assert (my_model / "config.json").is_file() and not (my_model / "report").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias", "texts", "work"]


# (command, arguments, words of the refusal): values the windows cannot honour
REFUSED = [
    (["profile", "--edge-k", "100", "--seq-len", "16"], "--edge-k 100 cannot be honoured"),
    (["profile", "--edge-k", "8", "--seq-len", "16"], "between 1 and 7"),
    (["profile", "--patch-n-seq", "10", "--n-seq", "4"], "--patch-n-seq 10"),
    (["profile", "--patch-bins", "40", "--seq-len", "16"], "--patch-bins 40"),
    (["profile", "--bias-n-seq", "9", "--n-seq", "4"], "--bias-n-seq 9"),
    (["profile", "--massive-n-seq", "9", "--n-seq", "6"], "between 1 and 4"),
    (["profile", "--sink-n-seq", "9", "--n-seq", "4"], "--sink-n-seq 9"),
    (["sinks", "--edge-k", "9", "--seq-len", "16"], "between 1 and 7"),
    (["sinks", "--sink-top-k", "999", "--seq-len", "16"], "attention heads"),
    (["patch", "--patch-bins", "99", "--seq-len", "16"], "--patch-bins 99"),
    (["patch", "--metrics", "first_excess", "--edge-k", "9", "--seq-len", "16"], "--edge-k 9"),
    (["bias", "--edge-k", "7", "--seq-len", "16"], "BOS left out"),  # 15 counted: at most 6
    (["bias", "--gradient-windows", "9", "--n-seq", "4"], "--gradient-windows 9"),
    (["length", "--lengths", "8,12", "--seq-len", "16"], "--seq-len 16 differs"),
]


@pytest.mark.parametrize("args, message", REFUSED)
def test_values_that_cannot_be_honoured_are_refused_not_clamped(tmp_path, args, message) -> None:
    out = tmp_path / "r"
    model = str(tiny_model_folder("gpt2"))
    result = _cli(*args, "--model", model, "--out", str(out), "--no-progress")
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_defaults_that_do_not_fit_the_windows_are_said_on_stderr(tmp_path) -> None:
    out = tmp_path / "r"
    args = ["--model", str(tiny_model_folder("gpt2")), "--n-seq", "3", "--seq-len", "12"]
    result = _cli("sinks", *args, "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    assert "uses --edge-k 5, not its default 8" in result.output
    assert "uses --sink-n-seq 3, not its default 16" in result.output


def test_an_out_that_cannot_be_created_says_why_before_any_work(tmp_path, monkeypatch) -> None:
    import homoglens.models.loading

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(homoglens.models.loading, "load_model", never)
    model = str(tiny_model_folder("gpt2"))
    result = _cli("profile", "--model", model, *FAST, "--out", "/proc/homoglens-x/report")
    assert result.exit_code == 1 and "free some space" not in result.output
    assert "ENOENT" in result.output and "/proc" in result.output
    assert "choose an --out in an ordinary folder" in result.output


@pytest.mark.parametrize(
    "code, cause, fix",
    [
        (errno.EACCES, "permission denied", "folder you can write to"),
        (errno.EROFS, "read-only", "writable disk"),
        (errno.ENOSPC, "no space is left", "free some space"),
    ],
)
def test_a_failed_write_says_what_failed(tmp_path, monkeypatch, code, cause, fix) -> None:
    import os

    import homoglens.report

    def fail(profile, out, **kwargs):
        raise OSError(code, os.strerror(code), str(Path(out) / "report.html"))

    monkeypatch.setattr(homoglens.report, "write_profile_report", fail)
    out = tmp_path / "r"
    model = str(tiny_model_folder("gpt2"))
    result = _cli("profile", "--model", model, *FAST, *PROFILE_FAST, "--out", str(out))
    assert result.exit_code == 1 and "could not write the output" in result.output
    assert cause in result.output and fix in result.output and os.strerror(code) in result.output
    if code != errno.ENOSPC:
        assert "free some space" not in result.output
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


def test_a_failed_read_of_an_input_is_not_called_a_failed_write(tmp_path, monkeypatch) -> None:
    import homoglens.models.loading

    weights = "/models/x/model.safetensors"

    def unreadable(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", weights)

    monkeypatch.setattr(homoglens.models.loading, "load_model", unreadable)
    model = str(tiny_model_folder("gpt2"))
    result = _cli("profile", "--model", model, *FAST, "--out", str(tmp_path / "r"))
    assert result.exit_code == 1 and "could not read or write" in result.output
    assert weights in result.output and "could not write the output" not in result.output


def test_an_interrupted_or_failed_overwrite_keeps_the_previous_report(tmp_path, monkeypatch):
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.html").write_text("previous report")
    model = str(tiny_model_folder("gpt2"))
    args = ["profile", "--model", model, *FAST, *PROFILE_FAST, "--out", str(out), "--overwrite"]
    calls: list[Path] = []
    real_rename = Path.rename

    def ctrl_c_before_the_new_one_is_in_place(self: Path, target):
        calls.append(Path(target))
        if len(calls) == 2:  # old -> backup done, new -> out not yet
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", ctrl_c_before_the_new_one_is_in_place)
    result = _cli(*args)
    assert result.exit_code != 0 and (out / "report.html").read_text() == "previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["r"]

    calls.clear()

    def disk_gone_after_the_old_one_moved(self: Path, target):
        calls.append(Path(target))
        if len(calls) >= 2:
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", disk_gone_after_the_old_one_moved)
    result = _cli(*args)
    monkeypatch.undo()
    backup = calls[0]
    assert result.exit_code == 1 and "could not replace the output" in result.output
    assert str(backup) in result.output and "mv" in result.output
    assert (backup / "report.html").read_text() == "previous report"  # whole, and named


def test_train_refuses_to_replace_an_older_run_without_overwrite(tmp_path, monkeypatch) -> None:
    """`homoglens train --out runs` writes runs/tiny-<variant>; an older run of that name is
    replaced only with --overwrite (it used to vanish without a word)."""
    import homoglens.training.train as training

    older = tmp_path / "runs" / "tiny-learned"
    older.mkdir(parents=True)
    (older / "config.json").write_text("{}")
    (older / "training.json").write_text('{"mine": true}')
    calls: list[Path] = []

    def fake_train(config, out, **_):
        calls.append(Path(out))
        return {"heldout_loss": 1.0, "heldout_unigram_entropy": 2.0, "wall_seconds": 0.0}

    monkeypatch.setattr(training, "train_model", fake_train)
    args = ["train", "--variant", "learned", "--steps", "1", "--out", str(tmp_path / "runs")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--overwrite" in result.output, result.output
    assert "tiny-learned" in result.output and not calls
    assert (older / "training.json").read_text() == '{"mine": true}'
    result = CliRunner().invoke(main, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert calls == [older]
