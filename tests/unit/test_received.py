"""attention_received against a brute-force float64 computation from run_with_cache, padding
that never counts, and a toy where every token attends key 0 and moves toward it."""

from __future__ import annotations

import functools

import pytest
import torch

from helpers import BACKENDS, hook_count
from homoglens import AttentionReceived, InvalidInputError, attention_received, load_model
from homoglens.models.architectures import resid_hook_name
from homoglens.testing import tiny_model_folder

TOKENS = torch.randint(0, 1000, (4, 14), generator=torch.Generator().manual_seed(2))


@functools.cache
def _model(arch: str, backend: str):
    return load_model(tiny_model_folder(arch), backend=backend, device="cpu")


def _brute(model, tokens: torch.Tensor, block: int):
    names = [
        resid_hook_name(block),
        resid_hook_name(block + 1),
        f"blocks.{block}.attn.hook_pattern",
    ]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    x0, x1 = cache[names[0]].double(), cache[names[1]].double()
    a = cache[names[2]].double().mean(1)
    n, t, _ = x0.shape
    a_list, s_list = [], []
    received = torch.zeros(t, dtype=torch.float64)
    count = torch.zeros(t, dtype=torch.float64)
    for s in range(n):
        for q in range(t):
            for k in range(q):
                cos = torch.nn.functional.cosine_similarity
                shift = cos(x1[s, q], x0[s, k], dim=0) - cos(x0[s, q], x0[s, k], dim=0)
                a_list.append(float(a[s, q, k]))
                s_list.append(float(shift))
                received[k] += a[s, q, k]
                count[k] += 1
    a_t, s_t = torch.tensor(a_list, dtype=torch.float64), torch.tensor(s_list, dtype=torch.float64)
    slope = float(((a_t - a_t.mean()) * (s_t - s_t.mean())).mean() / a_t.var(unbiased=False))
    return received[:-1] / count[:-1], slope


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_received_and_slope_equal_brute_force(arch: str, backend: str) -> None:
    model = _model(arch, backend)
    got = attention_received(model, TOKENS, progress=False, batch_size=3)
    for bi, block in enumerate(got.blocks):
        received, slope = _brute(model, TOKENS, block)
        assert torch.allclose(got.received[bi, :-1], received, atol=1e-6)
        assert abs(float(got.slope[bi]) - slope) < 1e-5 * max(1.0, abs(slope))
    assert torch.isnan(got.received[:, -1]).all()  # the last key has no later query
    assert hook_count(model) == 0


def test_padding_never_counts_and_round_trip(tmp_path) -> None:
    model = _model("llama", BACKENDS[-1])
    short = TOKENS[:, :9]
    mask = torch.ones_like(TOKENS)
    mask[:, 9:] = 0
    padded = attention_received(model, TOKENS, attention_mask=mask, progress=False)
    plain = attention_received(model, short, progress=False)
    assert torch.allclose(padded.received[:, :9], plain.received, atol=1e-6, equal_nan=True)
    assert torch.allclose(padded.slope, plain.slope, atol=1e-6)
    padded.save(tmp_path / "r")
    again = AttentionReceived.load(tmp_path / "r")
    assert torch.allclose(again.shift, padded.shift, equal_nan=True)
    assert len(padded.to_pandas()) == 2 * 9  # the batch is cut to its longest real sequence
    import matplotlib

    matplotlib.use("Agg")
    assert padded.plot().axes
    with pytest.raises(InvalidInputError, match="layers"):
        attention_received(model, short, layers=[5], progress=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_null_blocks_that_write_nothing_show_no_shift(backend, tmp_path) -> None:
    """The null model: attention and MLP outputs zeroed (o_proj, down_proj), so no block moves
    any token. The attention is still there (received mass as usual), the shift is exactly 0
    and so is the slope: mass without shift reads as no attractor."""
    import shutil

    from transformers import AutoModelForCausalLM

    folder = tmp_path / "null-llama"
    shutil.copytree(tiny_model_folder("llama"), folder)
    hf = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    hf.save_pretrained(folder)
    model = load_model(folder, backend=backend, device="cpu")
    got = attention_received(model, TOKENS, progress=False)
    assert float(got.received[:, 0].min()) > 0.0  # attention is paid as usual
    assert float(got.shift[:, :-1].abs().max()) < 1e-6  # the last key has no later query
    assert float(got.weighted_shift[:, :-1].abs().max()) < 1e-6
    assert float(got.slope.abs().max()) < 1e-6
