"""The tutorials are notebooks stored without outputs and paired with jupytext percent files that
hold the same cells (the .py files keep diffs readable).

What a notebook user sees: a cell that ends with ``.plot(...)`` shows the figure (an ``image/png``
output) in a fresh kernel with no ``%matplotlib`` magic. Checked by executing notebooks with
nbclient: a tiny one here, the README quickstart on SmolLM2, and every tutorial, which runs only
when ``HOMOGLENS_RUN_TUTORIALS=1`` (scripts/test.sh sets it in its tutorial step, once, on the
default TransformerLens line, in place of a plain ``pytest --nbmake`` run that only checked that
cells run). That run writes each executed notebook to ``build/tutorials/`` (git-ignored), which
the docs site renders with its outputs (scripts/docs_hooks.py, tests/docs/test_site.py), so the
tutorials are executed once."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[2] / "tutorials"
NOTEBOOKS = sorted(ROOT.glob("*.ipynb"))
README = ROOT.parent / "README.md"
EXECUTED = ROOT.parent / "build" / "tutorials"
"""Where the tutorial run writes the executed notebooks; the docs site renders them
(scripts/docs_hooks.py)."""
PLOT_CALL = re.compile(r"\.plot\(")


def execute(cells: list[str], cwd: Path, *, timeout: int = 600) -> Any:
    """Run code cells in a fresh kernel (the python3 kernel of this interpreter), as Jupyter does:
    no ``%matplotlib`` magic, nothing imported beforehand. Returns the executed notebook."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    return run(nb, cwd, timeout=timeout)


def run(nb: Any, cwd: Path, *, timeout: int = 600) -> Any:
    from nbclient import NotebookClient

    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()
    return nb


def images(cell: Any) -> int:
    """The number of PNG images a code cell displayed."""
    return sum("image/png" in out.get("data", {}) for out in cell.outputs)


def assert_plot_cells_show_figures(nb: Any, name: str) -> int:
    """Every code cell whose source calls ``.plot(`` displayed exactly one figure (PNG) per
    call; returns the number of such cells."""
    plot_cells = [c for c in nb.cells if c.cell_type == "code" and PLOT_CALL.search(c.source)]
    for cell in plot_cells:
        assert images(cell) == len(PLOT_CALL.findall(cell.source)), (
            f"{name}: this cell shows {images(cell)} figures, outputs "
            f"{[o.get('data', {}).keys() or o.get('text') for o in cell.outputs]}:\n{cell.source}"
        )
    return len(plot_cells)


SHOWN_ON_PURPOSE = re.compile(
    r"[^\n]*DeprecationWarning: HookedTransformer is deprecated[^\n]*\n[^\n]*(\n|$)"
)
"""TransformerLens 3.9's notice that HookedTransformer goes in 4.0 (its default backend there),
which homoglens shows on purpose while a model loads (``assets.deprecations_shown``): the one
stderr text a notebook may print, on that line only."""


def red_text(nb: Any) -> list[str]:
    """What a notebook printed in red: stderr streams (warnings such as ``TqdmWarning: IProgress
    not found``) and errors, less :data:`SHOWN_ON_PURPOSE`."""
    found = [
        out.get("text", "") if out.output_type == "stream" else out.get("ename", "")
        for c in nb.cells
        if c.cell_type == "code"
        for out in c.outputs
        if (out.output_type == "stream" and out.get("name") == "stderr")
        or out.output_type == "error"
    ]
    return [t for t in (SHOWN_ON_PURPOSE.sub("", text) for text in found) if t.strip()]


def readme_quickstart() -> list[str]:
    """The code blocks of the README's "Jupyter quickstart" section, one cell each, less the GPU
    block (it loads a Hub model onto ``device="cuda"``; tests/cuda runs the same calls offline on
    the tiny families)."""
    section = README.read_text().split("## Jupyter quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return [b for b in blocks if 'device="cuda"' not in b]


TINY_PLOT = """\
import torch
from homoglens import PositionalSimilarity
sim = PositionalSimilarity.from_activations(torch.randn(2, 6, 20, 8), edge_k=2)
sim.plot(layers=1)
"""


def test_plot_displays_inline_in_a_fresh_kernel(tmp_path: Path) -> None:
    nb = execute([TINY_PLOT, "import sys; print(sys.executable)"], tmp_path, timeout=120)
    assert assert_plot_cells_show_figures(nb, "tiny notebook") == 1
    assert "image/png" in nb.cells[0].outputs[-1]["data"]


def test_plot_shows_once_after_pyplot_is_imported(tmp_path: Path) -> None:
    # pyplot under the inline backend registers its own Figure formatter: still one image, and
    # the figure (made without pyplot) is not shown again when the cell ends.
    nb = execute(["import matplotlib.pyplot as plt\n" + TINY_PLOT], tmp_path, timeout=120)
    assert assert_plot_cells_show_figures(nb, "pyplot notebook") == 1


@pytest.mark.smollm2
def test_readme_quickstart_shows_its_figure(tmp_path: Path) -> None:
    cells = readme_quickstart()
    assert cells and any(PLOT_CALL.search(c) for c in cells)
    nb = execute(cells, tmp_path)
    assert assert_plot_cells_show_figures(nb, "README quickstart") >= 1
    assert not red_text(nb), red_text(nb)


@pytest.mark.skipif(
    os.environ.get("HOMOGLENS_RUN_TUTORIALS") != "1",
    reason="executes every tutorial (minutes): HOMOGLENS_RUN_TUTORIALS=1, as scripts/test.sh does",
)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_tutorial_runs_and_shows_its_figures(path: Path, tmp_path: Path) -> None:
    copy = EXECUTED / path.name
    copy.unlink(missing_ok=True)  # a failed run leaves no stale copy for the docs site
    nb = run(nbformat.read(path, as_version=4), tmp_path)
    write_executed(nb, copy)
    assert assert_plot_cells_show_figures(nb, path.name) >= 1
    assert not red_text(nb), f"{path.name} printed in red: {red_text(nb)}"


def write_executed(nb: Any, path: Path) -> None:
    """Write an executed notebook for the docs site (atomically: a half-written copy is never
    rendered)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    nbformat.write(nb, part)
    part.replace(path)


def test_every_tutorial_is_a_paired_notebook() -> None:
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in sorted(ROOT.glob("*.py"))]
    assert [p.stem[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(1, 12)]


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
