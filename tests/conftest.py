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


def pytest_report_header(config: Any) -> str:
    from importlib.metadata import version

    return (
        f"transformer-lens {version('transformer-lens')}, backends under test: {BACKENDS}, "
        f"torch {torch.__version__}"
    )


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
