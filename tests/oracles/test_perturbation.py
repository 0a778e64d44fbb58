"""Oracle: the one-token perturbation spread (Barbero et al. 2025, arXiv 2504.02732) against two
plain Hugging Face forward passes (``output_hidden_states``, float64) on a tiny model; the
nulls (nothing before the perturbed token changes; a perturbation of zero size changes nothing)
and an invariant (batching and padding change nothing)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from homoglens import load_model, perturbation_spread, to_token_batch
from homoglens.core.errors import InvalidInputError
from homoglens.testing import tiny_model_folder

N, T, POSITION, TOKEN = 5, 14, 3, 7


@pytest.fixture(scope="module")
def model():
    return load_model(tiny_model_folder("llama"), backend="bridge", dtype=torch.float64)


@pytest.fixture(scope="module")
def tokens(model):
    bos = model.tokenizer.bos_token_id
    out = torch.randint(10, 1000, (N, T), generator=torch.Generator().manual_seed(0))
    assert bos is None or not bool((out[:, 0] == bos).any())  # position counts from token 0
    return out


def _relative_changes(tokens: torch.Tensor) -> torch.Tensor:
    """``[window entry pos]`` ||h' - h|| / ||h|| of HF's hidden states (the last entry, which
    HF returns after the final norm, left out)."""
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_folder("llama"))).double().eval()
    changed = tokens.clone()
    changed[:, POSITION] = TOKEN
    with torch.no_grad():
        h = torch.stack(hf(tokens, output_hidden_states=True).hidden_states[:-1], 1)
        h2 = torch.stack(hf(changed, output_hidden_states=True).hidden_states[:-1], 1)
    return (h2 - h).norm(dim=-1) / h.norm(dim=-1)


def test_the_change_per_layer_and_position_is_hugging_faces(model, tokens) -> None:
    want = _relative_changes(tokens)  # [window entry pos]
    n_entries = want.shape[1]
    got = perturbation_spread(
        model, tokens, position=POSITION, token=TOKEN, layers=list(range(n_entries)),
        progress=False,
    )  # fmt: skip
    after = want[:, :, POSITION:]
    assert got.change.shape == (n_entries, T - POSITION)
    assert torch.allclose(got.change, after.mean(0), atol=1e-6, rtol=0)
    assert torch.allclose(got.window_spread, after[:, :, 1:].mean(-1), atol=1e-6, rtol=0)
    reach = (after[:, :, 1:] > got.threshold).double().mean(-1)
    assert torch.allclose(got.window_reach, reach, atol=1e-12)
    assert float(got.spread[1:].min()) > 1e-3  # the test can fail: the change is there


def test_nothing_before_the_token_changes_and_zero_noise_changes_nothing(model, tokens) -> None:
    replaced = perturbation_spread(model, tokens, position=POSITION, progress=False)
    assert float(replaced.before_max.max()) == 0.0  # causal: earlier positions never see it
    assert float(replaced.change[0, 1:].abs().max()) == 0.0  # embeddings: the token alone
    null = perturbation_spread(model, tokens, position=POSITION, how="noise", scale=0.0,
                               progress=False)  # fmt: skip
    assert float(null.change.abs().max()) == 0.0 and float(null.spread.abs().max()) == 0.0
    noised = perturbation_spread(model, tokens, position=POSITION, how="noise", scale=0.5,
                                 progress=False)  # fmt: skip
    assert float(noised.change[0, 0]) == pytest.approx(0.5, rel=1e-9)  # the noise's own size


def test_batching_and_padding_change_nothing(model, tokens) -> None:
    ragged = torch.cat([tokens, torch.zeros(N, 3, dtype=torch.long)], 1)
    mask = torch.ones_like(ragged)
    mask[:, T:] = 0
    mask[0, T:] = 1  # one longer window, the others right-padded
    ragged[0, T:] = torch.tensor([11, 12, 13])
    batch = to_token_batch(model, ragged, attention_mask=mask)
    one = perturbation_spread(model, batch, position=POSITION, batch_size=1, progress=False)
    all_ = perturbation_spread(model, batch, position=POSITION, batch_size=N, progress=False)
    assert torch.allclose(one.change, all_.change, atol=1e-9, equal_nan=True)
    assert torch.allclose(one.window_spread, all_.window_spread, atol=1e-9)
    assert one.change.shape[1] == T + 3 - POSITION  # the longest window's later positions


def test_bos_on_and_off_perturb_the_same_token(model, tokens) -> None:
    on = perturbation_spread(model, tokens, position=POSITION, token=TOKEN, bos=True,
                             progress=False)  # fmt: skip
    off = perturbation_spread(model, tokens, position=POSITION, token=TOKEN, bos=False,
                              progress=False)  # fmt: skip
    assert on.provenance.bos is True and off.provenance.bos is False
    assert on.change.shape == off.change.shape  # the same later positions
    table = on.difference(off)
    diff = (on.window_spread - off.window_spread).mean(0)
    assert torch.allclose(torch.tensor(table["value"].to_numpy()), diff, atol=1e-12)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"position": T - 1}, "length is 14"),
        ({"position": -1}, "position"),
        ({"how": "swap"}, "how="),
        ({"how": "noise", "scale": -1.0}, "scale"),
        ({"threshold": 0.0}, "threshold"),
        ({"token": 10**9}, "token"),
        ({"layers": [99]}, "layers"),
        ({"bos": "sometimes"}, "bos"),
    ],
)
def test_bad_inputs_are_named(model, tokens, options, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        perturbation_spread(model, tokens, progress=False, **options)


def test_a_paired_difference_needs_the_same_design(model, tokens) -> None:
    a = perturbation_spread(model, tokens, position=2, progress=False)
    b = perturbation_spread(model, tokens, position=3, progress=False)
    with pytest.raises(InvalidInputError, match="same windows"):
        a.difference(b)
