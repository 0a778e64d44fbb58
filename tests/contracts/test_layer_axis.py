"""One layer base everywhere (issue 40; docs/index.md, "The layer axis"): layer l names residual
entry l, or block l, the block that reads entry l. A number therefore means one place in the
model whatever the function, and the other reading (block n_layers, entry 0 as a block's output)
is a typed error that explains the axis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from homoglens import (
    InvalidInputError,
    attention_bias_hooks,
    attention_received,
    massive_activation_hooks,
    position_ablation_hooks,
    positional_patching,
    resid_hook_name,
)
from homoglens.run.interventions import residual_write_hooks

TOKENS = torch.randint(0, 1000, (2, 10), generator=torch.Generator().manual_seed(0))

BLOCKS: dict[str, Callable[[Any, int], Any]] = {
    "attention_bias_hooks": lambda m, b: attention_bias_hooks(m, "first", 1.0, layers=[b]),
    "position_ablation_hooks": lambda m, b: position_ablation_hooks(m, "zero", layers=[b]),
    "residual_write_hooks": lambda m, b: residual_write_hooks(m, "resid_pre", b, lambda x, h: x),
    "attention_received": lambda m, b: attention_received(m, TOKENS, layers=[b], progress=False),
    "positional_patching": lambda m, b: positional_patching(
        m, TOKENS, layers=[b], bins=2, progress=False
    ),
}
"""Functions whose layer argument names a block (0..n_layers - 1)."""


@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_n_layers_is_refused_in_terms_of_the_axis(name: str, get_model) -> None:
    model = get_model("llama", "bridge")
    n = int(model.cfg.n_layers)
    BLOCKS[name](model, n - 1)  # the last block is a block
    with pytest.raises(InvalidInputError, match=f"reads residual entry l.*entry {n} is the output"):
        BLOCKS[name](model, n)


def test_a_blocks_output_is_an_entry_one_to_n_layers(get_model) -> None:
    model = get_model("llama", "bridge")
    n = int(model.cfg.n_layers)
    for bad, why in ((0, "entry 0 is the embeddings"), (n + 1, f"has {n} blocks")):
        with pytest.raises(InvalidInputError, match=why):
            massive_activation_hooks(model, "zero", layer=bad, dims=[0])


def test_one_number_names_one_place(backend: str, get_model) -> None:
    """Entry l written by massive_activation_hooks is the stream block l reads: the hook point of
    entry l on the residual axis, which is block l's ``hook_resid_pre`` (l < n_layers)."""
    model = get_model("llama", backend)
    n = int(model.cfg.n_layers)
    for layer in range(1, n + 1):
        (name,) = [h for h, _ in massive_activation_hooks(model, "zero", layer=layer, dims=[0])]
        assert name == resid_hook_name(layer)
    for block in range(n):
        names = [h for h, _ in attention_bias_hooks(model, "first", 1.0, layers=[block])]
        assert names and all(h.startswith(f"blocks.{block}.") for h in names)
        written = residual_write_hooks(model, "resid_pre", block, lambda x, h: x)
        assert written[0][0] == f"blocks.{block}.hook_resid_pre"
