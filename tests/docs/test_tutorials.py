"""The tutorials are notebooks stored without outputs and paired with jupytext percent files that
hold the same cells (the .py files keep diffs readable). Executing them is nbmake's job: CI runs
``pytest --nbmake tutorials`` (scripts/test.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[2] / "tutorials"
NOTEBOOKS = sorted(ROOT.glob("*.ipynb"))


def test_every_tutorial_is_a_paired_notebook() -> None:
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in sorted(ROOT.glob("*.py"))]
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_matches_its_text_file_and_has_no_outputs(path: Path) -> None:
    stored = nbformat.read(path, as_version=4)
    paired = jupytext.read(path.with_suffix(".py"))
    assert [(c.cell_type, c.source) for c in stored.cells] == [
        (c.cell_type, c.source) for c in paired.cells
    ], f"{path.name} is out of sync: run `jupytext --sync {path.with_suffix('.py')}`"
    for cell in stored.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_starts_by_picking_the_model(path: Path) -> None:
    first_code = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "MODEL" in first_code.source and "import" not in first_code.source
