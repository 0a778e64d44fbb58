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
        in_errors = getattr(obj, "__module__", "") == "homoglens.errors"
        assert name in documented or in_errors, f"{name} is missing from docs/api.md"
    assert "::: homoglens.errors" in api


def test_nav_entries_exist() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    for page in re.findall(r":\s+([\w/.-]+\.(?:md|ipynb))\s*$", config, re.M):
        assert (ROOT / "docs" / page).is_file(), page
