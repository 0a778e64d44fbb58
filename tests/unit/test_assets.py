"""Unit tests of homoglens.models.assets: the cache folder, atomic folders, package versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from homoglens.models.assets import atomic_folder, cache_dir, package_version


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOMOGLENS_CACHE", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()
    monkeypatch.delenv("HOMOGLENS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "homoglens"


def test_atomic_folder_appears_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "made"
    with pytest.raises(RuntimeError), atomic_folder(target) as tmp:
        (tmp / "half").write_text("x")
        raise RuntimeError("interrupted")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_folder(target) as tmp:
        (tmp / "whole").write_text("x")
    assert (target / "whole").read_text() == "x"


def test_package_version_of_a_missing_package() -> None:
    assert package_version("torch")[0].isdigit()
    assert package_version("no-such-package-homoglens") == "not installed"


# --------------------------------------------------------------------------- staged_output


OLD = {"report.html": "old report", "profile/profile.json": "old profile"}
NEW = {"report.html": "new report", "figures/curves.png": "new figure", "summary.csv": "new"}


def _tree(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _old_output(tmp_path: Path) -> Path:
    out = tmp_path / "report"
    for name, text in OLD.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return out


def _write_new(tmp: Path) -> None:
    for name, text in NEW.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)


# (what raises, which call, before or after it acts)
SWAP_STEPS = [
    ("rename", 1, "before"),  # old -> backup
    ("rename", 1, "after"),
    ("rename", 2, "before"),  # new -> out
    ("rename", 2, "after"),
    ("rmtree", 1, "partway"),  # deleting the replaced output
]


@pytest.mark.parametrize("what, call, when", SWAP_STEPS)
def test_an_interrupted_overwrite_never_loses_the_old_output_nor_half_places_the_new(
    tmp_path: Path, monkeypatch, what: str, call: int, when: str
) -> None:
    import shutil

    from homoglens.models.assets import staged_output

    out = _old_output(tmp_path)
    calls = {"rename": 0, "rmtree": 0}
    real_rename, real_rmtree = Path.rename, shutil.rmtree

    def rename(self: Path, target):
        calls["rename"] += 1
        if what == "rename" and calls["rename"] == call:
            if when == "after":
                real_rename(self, target)
            raise KeyboardInterrupt
        return real_rename(self, target)

    def rmtree(path, *args, **kwargs):
        if ".partial-" not in Path(path).name:  # not the staging folder: the old output
            calls["rmtree"] += 1
            if what == "rmtree" and calls["rmtree"] == call:
                (Path(path) / "report.html").unlink()  # a part deleted, then Ctrl-C
                raise KeyboardInterrupt
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(Path, "rename", rename)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with pytest.raises(KeyboardInterrupt), staged_output(out) as tmp:
        _write_new(tmp)
    monkeypatch.undo()
    assert _tree(out) in (OLD, NEW)  # one whole output, never a mix, never none
    if (what, call) == ("rename", 1) or (what, call, when) == ("rename", 2, "before"):
        assert _tree(out) == OLD  # interrupted before the new one was in place: old restored
    else:
        assert _tree(out) == NEW  # the new one was in place: the overwrite completed
    assert [p.name for p in tmp_path.iterdir()] == ["report"]  # no backup, no partial left


def test_an_overwrite_whose_old_output_cannot_be_moved_back_names_the_backup(
    tmp_path: Path, monkeypatch
) -> None:
    import errno

    from homoglens.models.assets import staged_output

    out = _old_output(tmp_path)
    calls = []
    real_rename = Path.rename

    def rename(self: Path, target):
        calls.append(target)
        if len(calls) >= 2:  # new -> out fails, and so does backup -> out
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError) as info, staged_output(out) as tmp:
        _write_new(tmp)
    monkeypatch.undo()
    backup = Path(calls[0])
    assert backup.parent == tmp_path and "backup" in backup.name
    assert str(backup) in str(info.value) and "mv" in str(info.value)
    assert info.value.filename == str(backup)
    assert _tree(backup) == OLD  # the old output is whole, under the named backup
    assert sorted(p.name for p in tmp_path.iterdir()) == [backup.name]  # no half new output


def test_a_real_ctrl_c_during_the_swap_waits_for_its_end(tmp_path: Path, monkeypatch) -> None:
    import os
    import signal

    from homoglens.models.assets import staged_output

    out = _old_output(tmp_path)
    real_rename = Path.rename

    def rename(self: Path, target):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C between the two renames
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt), staged_output(out) as tmp:
        _write_new(tmp)
    monkeypatch.undo()
    assert _tree(out) == NEW and [p.name for p in tmp_path.iterdir()] == ["report"]


def test_staged_and_atomic_folders_are_flushed_to_disk_before_the_rename(
    tmp_path: Path, monkeypatch
) -> None:
    import os

    from homoglens.models.assets import staged_output

    synced: list[int] = []
    at_rename: list[int] = []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    def rename(self: Path, target):
        at_rename.append(len(synced))
        return real_rename(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    with staged_output(_old_output(tmp_path)) as tmp:
        _write_new(tmp)
    assert at_rename and at_rename[0] >= len(NEW)  # every new file synced before the swap
    synced.clear()
    at_rename.clear()
    with atomic_folder(tmp_path / "cache") as tmp:
        _write_new(tmp)
    assert at_rename and at_rename[0] >= len(NEW)
