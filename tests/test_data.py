"""Data preparation: corpus windows, BOS policy, text and token input, and every bad input."""

from __future__ import annotations

import pytest
import torch

from conftest import BACKENDS, hook_count
from homoglens import (
    InvalidInputError,
    SequenceTooLongError,
    corpus_windows,
    homogenization_profile,
    load_corpus,
    to_token_batch,
)
from homoglens.data import right_aligned


def test_corpus_is_vendored_and_clean() -> None:
    text = load_corpus("austen")
    assert len(text) > 3_000_000
    assert text.startswith("EMMA")
    assert "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy" in text
    with pytest.raises(InvalidInputError, match="known corpora"):
        load_corpus("dickens")


@pytest.mark.parametrize("bos", ["always", "never"])
def test_corpus_windows_shape_and_bos(bos: str, get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=5, seq_len=40, bos=bos)
    assert tuple(batch.tokens.shape) == (5, 40) and batch.attention_mask.all()
    assert batch.bos is (bos == "always")
    first = batch.tokens[:, 0]
    assert bool((first == 50256).all()) is (bos == "always")
    assert len({tuple(row.tolist()) for row in batch.tokens}) == 5  # distinct windows


def test_auto_bos_follows_model_default(get_model) -> None:
    gpt2 = get_model("gpt2", BACKENDS[-1])
    neox = get_model("neox", BACKENDS[-1])
    assert to_token_batch(gpt2, "Hello world").tokens.tolist() == [[50256, 15496, 995]]
    assert to_token_batch(neox, "Hello world").tokens.tolist() == [[15496, 995]]


def test_token_input_used_exactly_as_given(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.tensor([[15496, 995, 383, 2068]])
    batch = to_token_batch(model, tokens)
    assert torch.equal(batch.tokens, tokens) and batch.bos is False
    assert to_token_batch(model, torch.tensor([[50256, 15496, 995]])).bos is True


def test_text_file_input(tmp_path, get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    path = tmp_path / "text.txt"
    path.write_text(load_corpus()[:20000], encoding="utf-8")
    batch = to_token_batch(model, path)
    assert batch.tokens.shape[1] == 128 and batch.attention_mask.all()  # n_ctx of tiny model
    windows = corpus_windows(model, path, n_seq=3, seq_len=16)
    assert tuple(windows.tokens.shape) == (3, 16)


def test_right_aligned_moves_left_pads() -> None:
    tokens = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 0]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]])
    out, out_mask = right_aligned(tokens, mask)
    assert out_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert out[0, :2].tolist() == [5, 6] and out[1].tolist() == [7, 8, 9]


BAD_INPUTS = [
    ("empty list", lambda m: ([],), {}, InvalidInputError, "empty"),
    ("empty string", lambda m: ("",), {}, InvalidInputError, "empty"),
    ("blank string in list", lambda m: (["fine text", "   "],), {}, InvalidInputError, "text 1"),
    ("too long", lambda m: ("word " * 400,), {}, SequenceTooLongError, "n_ctx=128"),
    (
        "too long tokens",
        lambda m: (torch.ones(1, 129, dtype=torch.long),),
        {},
        SequenceTooLongError,
        "n_ctx=128",
    ),
    (
        "mask wrong shape",
        lambda m: (torch.ones(2, 5, dtype=torch.long),),
        {"attention_mask": torch.ones(2, 4)},
        InvalidInputError,
        "shape",
    ),
    (
        "mask not 0/1",
        lambda m: (torch.ones(1, 5, dtype=torch.long),),
        {"attention_mask": torch.full((1, 5), 2)},
        InvalidInputError,
        "0 and 1",
    ),
    (
        "mask with a gap",
        lambda m: (torch.ones(1, 5, dtype=torch.long),),
        {"attention_mask": torch.tensor([[1, 0, 1, 1, 1]])},
        InvalidInputError,
        "one block",
    ),
    (
        "all padding row",
        lambda m: (torch.ones(2, 5, dtype=torch.long),),
        {"attention_mask": torch.tensor([[1] * 5, [0] * 5])},
        InvalidInputError,
        "all padding",
    ),
    ("float tokens", lambda m: (torch.ones(1, 5),), {}, InvalidInputError, "integer tensor"),
    (
        "token id out of vocab",
        lambda m: (torch.tensor([[1, 2, 99999]]),),
        {},
        InvalidInputError,
        "token ids must lie",
    ),
    (
        "3-d tokens",
        lambda m: (torch.ones(1, 2, 3, dtype=torch.long),),
        {},
        InvalidInputError,
        "batch pos",
    ),
    ("one token", lambda m: (torch.tensor([[5]]),), {}, InvalidInputError, "at least 2"),
    ("unsupported type", lambda m: (3.14,), {}, InvalidInputError, "not supported"),
    (
        "mask with text",
        lambda m: ("hello there",),
        {"attention_mask": torch.ones(1, 2)},
        InvalidInputError,
        "only for token input",
    ),
    ("bad bos", lambda m: ("hello there",), {"bos": "sometimes"}, InvalidInputError, "bos="),
    (
        "bad batch size",
        lambda m: ("hello there",),
        {"batch_size": 0},
        InvalidInputError,
        "batch_size",
    ),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_clear_error_and_leaves_no_hook(case, backend, get_model) -> None:
    _, args, kwargs, error, match = case
    model = get_model("gpt2", backend)
    with pytest.raises(error, match=match):
        homogenization_profile(model, *args(model), progress=False, **kwargs)
    assert hook_count(model) == 0


def test_corpus_windows_bad_arguments(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(SequenceTooLongError):
        corpus_windows(model, n_seq=2, seq_len=129)
    with pytest.raises(InvalidInputError, match="n_seq"):
        corpus_windows(model, n_seq=0)
    with pytest.raises(InvalidInputError, match="too small"):
        corpus_windows(model, load_corpus()[:0] or "austen", n_seq=50_000, seq_len=100)
