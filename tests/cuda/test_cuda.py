"""The ``cuda`` suite: every public measurement on a GPU, in bfloat16 and float16 (skipped
without one). Each runs with the model on CUDA, returns its result on the CPU, and gives finite
numbers where the float32 model does; the profile and the sink scores stay within the half-
precision tolerances of the float32 model on the same device (tests/oracles/
test_half_precision.py). CPU-only CI keeps the device discipline through
tests/contracts/test_devices.py."""

from __future__ import annotations

import dataclasses
import functools
import warnings

import pytest
import torch

from helpers import public_measurements
from homoglens import fast_attention_status, homogenization_profile, load_model, sink_scores
from homoglens.testing import tiny_model_folder

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

TOKENS = torch.randint(0, 900, (4, 24), generator=torch.Generator().manual_seed(5))
MEASUREMENTS = public_measurements(TOKENS)
DTYPES = [torch.bfloat16, torch.float16]


@functools.cache
def _model(arch: str, dtype: torch.dtype):
    return load_model(tiny_model_folder(arch), backend="bridge", device="cuda", dtype=dtype)


def _tensors(result) -> list[torch.Tensor]:
    if dataclasses.is_dataclass(result):
        values = [getattr(result, f.name) for f in dataclasses.fields(result)]
        return [v for v in values if isinstance(v, torch.Tensor)]
    return []


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(MEASUREMENTS))
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_every_measurement_runs_on_cuda(arch: str, name: str, dtype: torch.dtype) -> None:
    model = _model(arch, dtype)
    assert next(model.parameters()).device.type == "cuda"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = MEASUREMENTS[name](model)
    for tensor in _tensors(result):
        assert tensor.device.type == "cpu", name  # results come back on the CPU


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_half_precision_on_cuda_runs_sdpa_near_float32(dtype: torch.dtype) -> None:
    folder = tiny_model_folder("llama")
    high = load_model(folder, backend="bridge", device="cuda", dtype=torch.float32)
    low = _model("llama", dtype)
    assert fast_attention_status(low) == "sdpa"
    truth = homogenization_profile(high, TOKENS, progress=False)
    got = homogenization_profile(low, TOKENS, progress=False)
    tol = 5e-2 if dtype == torch.bfloat16 else 6e-3
    assert float((got.to_others - truth.to_others).abs().max()) <= tol
    assert float((got.mean_pairwise - truth.mean_pairwise).abs().max()) <= tol / 20
    sinks_low, sinks_high = (
        sink_scores(low, TOKENS, progress=False),
        sink_scores(high, TOKENS, progress=False),
    )
    assert float((sinks_low.mass - sinks_high.mass).abs().max()) <= tol
