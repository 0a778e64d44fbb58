"""Every tutorial runs top to bottom (execution only, no output comparison)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.py"))


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_runs(path: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(path), run_name="__main__")
