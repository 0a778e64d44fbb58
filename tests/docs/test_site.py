"""The docs site shows the tutorials with their outputs: the notebooks the tutorial run executed
(``build/tutorials/``, written by tests/docs/test_tutorials.py) are rendered as they are, and a
tutorial without a fresh executed copy is executed at build time (scripts/docs_hooks.py and the
mkdocs-jupyter options of mkdocs.yml). Checked on a one-page site built with the same hook and
options (seconds); scripts/test.sh checks the real site's tutorial pages after its build."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("mkdocs_jupyter")

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "scripts" / "docs_hooks.py"
PNG = (  # a 1 x 1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def hooks_module() -> Any:
    spec = importlib.util.spec_from_file_location("docs_hooks", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def jupyter_options() -> dict[str, Any]:
    """The mkdocs-jupyter options of the real mkdocs.yml."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "scripts/docs_hooks.py" in config["hooks"]
    plugins = [p for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p]
    return plugins[0]["mkdocs-jupyter"]


def notebook(source: str, outputs: list[Any] | None = None) -> Any:
    cell = nbformat.v4.new_code_cell(source)
    if outputs is not None:
        cell.outputs = outputs
        cell.execution_count = 1
    return nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# A tutorial"), cell],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )


def build(site: Path) -> str:
    """Build the one-page site in ``site`` and return the tutorial page's HTML."""
    config = {
        "site_name": "t",
        "docs_dir": "docs",
        "strict": True,
        "nav": [{"Home": "index.md"}, {"Tutorial": "tutorials/t.ipynb"}],
        "hooks": [str(HOOK)],
        "plugins": [{"mkdocs-jupyter": {**jupyter_options(), "cache": False}}],
    }
    (site / "mkdocs.yml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "-q", "-d", str(site / "site")],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return (site / "site" / "tutorials" / "t" / "index.html").read_text()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "tutorials").mkdir(parents=True)
    (tmp_path / "docs" / "index.md").write_text("# Home\n")
    return tmp_path


def test_an_executed_copy_is_rendered_with_its_figure_and_not_run_again(site: Path) -> None:
    # the stored notebook has no outputs; its executed copy shows a figure and a printed line
    # that executing the source could not produce, so the page proves which one was rendered
    source = "raise RuntimeError('executed at build time')"
    nbformat.write(notebook(source), site / "docs" / "tutorials" / "t.ipynb")
    outputs = [
        nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}),
        nbformat.v4.new_output("stream", name="stdout", text="printed by the tutorial run\n"),
    ]
    (site / "build" / "tutorials").mkdir(parents=True)
    nbformat.write(notebook(source, outputs), site / "build" / "tutorials" / "t.ipynb")
    html = build(site)
    assert "data:image/png;base64," + PNG[:20] in html
    assert "printed by the tutorial run" in html


def test_without_a_fresh_copy_the_tutorial_is_executed_at_build_time(site: Path) -> None:
    stored = notebook("print('run at ' + 'build time')")
    nbformat.write(stored, site / "docs" / "tutorials" / "t.ipynb")
    stale = notebook("print('an older version of the cell')", [])
    (site / "build" / "tutorials").mkdir(parents=True)
    nbformat.write(stale, site / "build" / "tutorials" / "t.ipynb")
    html = build(site)
    assert "run at build time" in html and "older version" not in html


def test_the_hook_takes_only_a_copy_with_the_same_cells(tmp_path: Path) -> None:
    hooks = hooks_module()
    stored, folder = tmp_path / "t.ipynb", tmp_path / "build"
    folder.mkdir()
    nbformat.write(notebook("x = 1"), stored)
    assert hooks.executed_copy(stored, folder) is None
    nbformat.write(notebook("x = 1", []), folder / "t.ipynb")
    assert hooks.executed_copy(stored, folder) == folder / "t.ipynb"
    nbformat.write(notebook("x = 2", []), folder / "t.ipynb")
    assert hooks.executed_copy(stored, folder) is None
    (folder / "t.ipynb").write_text("{not json")
    assert hooks.executed_copy(stored, folder) is None
