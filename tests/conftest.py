"""Shared fixtures: tiny offline models on every available backend, loaded once per session."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # `from helpers import ...` in every folder

from helpers import ARCHS, BACKENDS  # noqa: E402
from homoglens import load_model  # noqa: E402
from homoglens.testing import tiny_model_folder  # noqa: E402
from lines import runs_on_both_lines  # noqa: E402


def pytest_report_header(config: Any) -> str:
    from importlib.metadata import version

    return (
        f"transformer-lens {version('transformer-lens')}, backends under test: {BACKENDS}, "
        f"torch {torch.__version__}"
    )


ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--what-differs",
        action="store_true",
        help="run only what differs between the TransformerLens lines (tests/lines.py): the "
        "second line of scripts/test.sh",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--what-differs``, deselect what runs the same on both lines (tests/lines.py)."""
    if not config.getoption("--what-differs"):
        return
    keep, drop = [], []
    for item in items:
        path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec is not None else {}
        test = getattr(item, "dtest", None)  # a doctest item
        source = "".join(e.source for e in test.examples) if test is not None else None
        reasons = tuple(str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
        (keep if runs_on_both_lines(path, params, source, reasons) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_MODELS: dict[tuple[str, str], Any] = {}


@pytest.fixture(scope="session")
def get_model() -> Callable[[str, str], Any]:
    """Return a cached loader: get_model(arch, backend) -> tiny model (raw weights)."""

    def get(arch: str, backend: str) -> Any:
        key = (arch, backend)
        if key not in _MODELS:
            _MODELS[key] = load_model(tiny_model_folder(arch), backend=backend, device="cpu")
        return _MODELS[key]

    return get


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param
