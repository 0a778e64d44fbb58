"""Unit tests of homoglens.assets: the cache folder, atomic folders, package versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from homoglens.assets import atomic_folder, cache_dir, package_version


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
