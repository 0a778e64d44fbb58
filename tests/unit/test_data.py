"""Data preparation: corpus windows, BOS policy, text and token input, and every bad input."""

from __future__ import annotations

import warnings

import pytest
import torch
from click.testing import CliRunner

from helpers import BACKENDS, hook_count
from homoglens import (
    HomogenizationProfile,
    InvalidInputError,
    SequenceTooLongError,
    corpus_windows,
    homogenization_profile,
    load_corpus,
    position_ablation_study,
    to_token_batch,
)
from homoglens.cli import main
from homoglens.run.data import TokenBatch, right_aligned
from homoglens.testing import tiny_model_folder


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


def test_token_batch_indexing() -> None:
    ones = torch.ones(2, 3, dtype=torch.long)
    batch = TokenBatch(ones, ones.clone(), False, "ones")
    assert len(batch[-1]) == 1 and len(batch[1]) == 1
    with pytest.raises(IndexError):
        batch[5]


def test_load_corpus_refuses_non_names() -> None:
    with pytest.raises(InvalidInputError, match="unknown corpus"):
        load_corpus(["austen"])


def test_left_padding_with_an_invalid_pad_id(get_model):
    tokens = torch.tensor([[-1, -1, 15496, 995, 11], [50256, 15496, 995, 11, 23748]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1] * 5])
    for backend in BACKENDS:
        model = get_model("gpt2", backend)
        prof = homogenization_profile(model, tokens, attention_mask=mask, progress=False)
        alone = HomogenizationProfile.merge(
            homogenization_profile(model, tokens[:1, 2:], progress=False),
            homogenization_profile(model, tokens[1:], progress=False),
        )
        assert torch.allclose(prof.to_others, alone.to_others, atol=1e-5, equal_nan=True)
        assert torch.allclose(prof.baseline, alone.baseline, atol=1e-5)
        study = position_ablation_study(
            model, tokens, attention_mask=mask, modes=["zero"], n_boot=10, progress=False
        )
        assert study.loss.isfinite().all()


def test_non_utf8_text_is_a_clear_error(tmp_path, get_model):
    path = tmp_path / "b.bin"
    path.write_bytes(bytes(range(128, 256)) * 4)
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        homogenization_profile(model, path, progress=False)
    result = CliRunner().invoke(
        main,
        [
            "profile",
            "--model",
            str(tiny_model_folder("gpt2")),
            "--text",
            str(path),
            "--seq-len",
            "16",
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 1 and "not UTF-8" in result.output


def test_a_text_that_starts_with_the_bos_gets_no_second_one(get_model) -> None:
    from homoglens import to_token_batch

    model = get_model("gpt2", "bridge")
    batch = to_token_batch(model, "<|endoftext|>Hello world", bos="always")
    assert batch.tokens.tolist() == [[50256, 15496, 995]] and batch.bos is True
    never = to_token_batch(model, "<|endoftext|>Hello world", bos="never")
    assert never.tokens.tolist() == [[50256, 15496, 995]]
    assert never.bos is True  # position 0 holds the BOS id, whatever the policy asked
    mixed = to_token_batch(model, ["<|endoftext|>Hello world", "Hello"], bos="never")
    assert mixed.bos is None


def test_a_byte_order_mark_is_not_text(get_model, tmp_path) -> None:
    from homoglens import corpus_windows, to_token_batch

    model = get_model("gpt2", "bridge")
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    text = "Hello world. " * 40
    plain.write_text(text, encoding="utf-8")
    marked.write_bytes("\ufeff".encode() + text.encode())
    assert torch.equal(to_token_batch(model, marked).tokens, to_token_batch(model, plain).tokens)
    a = corpus_windows(model, marked, n_seq=2, seq_len=16).tokens
    assert torch.equal(a, corpus_windows(model, plain, n_seq=2, seq_len=16).tokens)


def test_a_lone_surrogate_is_a_typed_error(get_model) -> None:
    from homoglens import InvalidInputError

    with pytest.raises(InvalidInputError, match="surrogate"):
        homogenization_profile(get_model("gpt2", "bridge"), ["fine", "bad \udc80"], progress=False)


def test_a_special_token_spelled_inside_a_text_is_said(get_model) -> None:
    """A literal "<|endoftext|>" inside a text is parsed as the token (as model.to_tokens
    does): an attention sink mid-sequence, which used to happen without a word."""
    from homoglens import to_token_batch

    model = get_model("gpt2", BACKENDS[-1])
    with pytest.warns(UserWarning, match="spell a special token"):
        batch = to_token_batch(model, ["Hello world", "foo <|endoftext|> bar"], bos="never")
    assert 50256 in batch.tokens[1].tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a leading one is the BOS: nothing to say
        to_token_batch(model, "<|endoftext|>Hello world", bos="always")


def test_a_bos_policy_with_token_ids_is_said_to_do_nothing(get_model) -> None:
    from homoglens import to_token_batch

    model = get_model("gpt2", BACKENDS[-1])
    ids = torch.tensor([[1, 2, 3, 4], [4, 5, 6, 7]])
    with pytest.warns(UserWarning, match="no effect on token ids"):
        batch = to_token_batch(model, ids, bos="always")
    assert torch.equal(batch.tokens, ids)


def test_a_folder_given_as_a_text_file_is_said_to_be_a_folder(get_model, tmp_path) -> None:
    from pathlib import Path

    from homoglens import InvalidInputError, to_token_batch

    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="is a folder"):
        to_token_batch(model, Path(tmp_path))


def test_a_device_given_as_a_text_file_is_not_said_to_be_missing(get_model) -> None:
    from pathlib import Path

    from homoglens import InvalidInputError, to_token_batch

    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="not a regular file"):
        to_token_batch(model, Path("/dev/null"))
