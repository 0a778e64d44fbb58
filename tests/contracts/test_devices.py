"""Device discipline, checked on the CPU: every public measurement runs with every tensor
homoglens makes itself on a named device (the model's, or the CPU for results). Inside
:func:`helpers.factories_on_meta` a tensor factory called from homoglens without ``device=``
makes a ``meta`` tensor, which fails as soon as it meets the CPU model's activations or is read
as a result: the error a CUDA model gives (``Expected all tensors to be on the same device``),
without a GPU. tests/cuda/ runs the same measurements on a GPU when one is present."""

from __future__ import annotations

import pytest
import torch

from helpers import factories_on_meta, public_measurements

TOKENS = torch.randint(0, 900, (4, 24), generator=torch.Generator().manual_seed(5))
MEASUREMENTS = public_measurements(TOKENS)


def test_the_guard_catches_a_tensor_made_without_a_device() -> None:
    from homoglens.profile.homogenization import counted_tokens

    pos = torch.arange(6)[None].repeat(2, 1)
    with factories_on_meta():
        made_here = torch.zeros(3)  # the test's own code: untouched
        assert made_here.device.type == "cpu"
        counted = counted_tokens(pos, torch.float32, torch.device("cpu"))  # names its device
        assert counted.weight.device.type == "cpu"


@pytest.mark.parametrize("name", list(MEASUREMENTS))
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_every_measurement_names_its_devices(name: str, arch: str, get_model) -> None:
    model = get_model(arch, "bridge")
    with factories_on_meta():
        MEASUREMENTS[name](model)
