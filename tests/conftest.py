"""Shared fixtures: tiny offline models on every available backend, loaded once per session."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from homoglens import load_model
from homoglens.models import has_hooked_transformer
from homoglens.testing import tiny_model_folder

BACKENDS = ["hooked", "bridge"] if has_hooked_transformer() else ["bridge"]
ARCHS = ["gpt2", "neox", "llama"]

warnings.filterwarnings("ignore", category=DeprecationWarning)


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


def hook_count(model: Any) -> int:
    """Number of forward/backward hook functions attached to any hook point of the model."""
    total = 0
    for hp in model.hook_dict.values():
        total += len(hp._forward_hooks) + len(hp._forward_pre_hooks) + len(hp._backward_hooks)
    return total


def state_hash(model: Any) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()
