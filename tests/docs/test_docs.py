"""The docs reference every public name, and every page and notebook the site's nav lists exists
(the site itself is built with ``mkdocs build --strict`` in scripts/test.sh)."""

from __future__ import annotations

import re
from pathlib import Path

import homoglens

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_is_in_the_api_reference() -> None:
    api = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: homoglens\.[\w.]*?(\w+)$", api, re.M))
    for members in re.findall(r"members: \[(.*)\]", api):
        documented |= set(members.replace(" ", "").split(","))
    for name in homoglens.__all__:
        obj = getattr(homoglens, name)
        in_errors = getattr(obj, "__module__", "") == "homoglens.core.errors"
        assert name in documented or in_errors, f"{name} is missing from docs/api.md"
    assert "::: homoglens.core.errors" in api


def test_nav_entries_exist() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    for page in re.findall(r":\s+([\w/.-]+\.(?:md|ipynb))\s*$", config, re.M):
        assert (ROOT / "docs" / page).is_file(), page


def test_docstrings_point_only_to_docs_a_user_has() -> None:
    """SCIENCE.md is a development note users do not get: docstrings (and comments) point to
    the docs pages instead, and every ``docs/<page>.md`` they name exists."""
    import ast

    for path in sorted((ROOT / "src" / "homoglens").rglob("*.py")):
        text = path.read_text()
        assert "SCIENCE" not in text, f"{path.relative_to(ROOT)} points to SCIENCE.md"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node) or ""
                for page in re.findall(r"docs/([\w-]+\.md)", doc):
                    assert (ROOT / "docs" / page).is_file(), f"{path.name}: docs/{page} is missing"
