"""Hugging Face ``datasets`` as data: rows of a text column equal the same texts as a list;
``corpus_windows`` streams a dataset, reading only the rows its windows need."""

from __future__ import annotations

import pytest
import torch

datasets = pytest.importorskip("datasets")

from helpers import BACKENDS, SHORT_TEXTS, hook_count  # noqa: E402
from homoglens import (  # noqa: E402
    InvalidInputError,
    SequenceTooLongError,
    corpus_windows,
    homogenization_profile,
    massive_activations,
    positional_similarity,
    to_token_batch,
)


def _counting_stream(limit: int) -> tuple[object, list[int]]:
    """An endless generator-backed IterableDataset that counts the rows read and raises once
    more than ``limit`` are asked for: reading past what is needed fails the test."""
    read = [0]

    def rows():
        i = 0
        while True:
            read[0] += 1
            if read[0] > limit:
                raise AssertionError(f"read more than {limit} rows of an endless dataset")
            yield {"id": i, "body": f"Row {i}: the quick brown fox jumps over the lazy dog."}
            i += 1

    return datasets.IterableDataset.from_generator(rows), read


@pytest.mark.parametrize("backend", BACKENDS)
def test_dataset_profile_equals_the_list_of_its_texts(backend, get_model) -> None:
    model = get_model("gpt2", backend)
    texts = [*SHORT_TEXTS, "It was a dark and stormy night."]
    rows = datasets.Dataset.from_dict({"text": texts, "label": list(range(len(texts)))})
    batch = to_token_batch(model, rows)
    listed = to_token_batch(model, texts)
    assert torch.equal(batch.tokens, listed.tokens)
    assert torch.equal(batch.attention_mask, listed.attention_mask) and batch.bos == listed.bos
    assert "column 'text'" in batch.description
    a = homogenization_profile(model, rows, batch_size=2, progress=False)
    b = homogenization_profile(model, texts, batch_size=2, progress=False)
    for name in ("to_others", "to_prefix", "to_mean", "norm", "mean_pairwise", "baseline"):
        torch.testing.assert_close(
            getattr(a, name), getattr(b, name), atol=1e-6, rtol=0, equal_nan=True
        )
    assert a.n_tokens == b.n_tokens and a.n_sequences == len(texts)
    assert hook_count(model) == 0


def test_iterable_dataset_and_text_column(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    texts = [*SHORT_TEXTS, "", "   "]  # rows without text are skipped
    stream = datasets.Dataset.from_dict({"body": texts}).to_iterable_dataset()
    batch = to_token_batch(model, stream, text_column="body")
    assert torch.equal(batch.tokens, to_token_batch(model, SHORT_TEXTS).tokens)
    acts = massive_activations(model, stream, text_column="body", progress=False)
    assert acts.n_sequences == len(SHORT_TEXTS)


def test_windows_from_a_dataset_read_only_what_they_need(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    stream, read = _counting_stream(limit=200)
    windows = corpus_windows(model, stream, n_seq=4, seq_len=32, text_column="body")
    assert tuple(windows.tokens.shape) == (4, 32) and windows.attention_mask.all()
    assert windows.bos is True and bool((windows.tokens[:, 0] == 50256).all())
    # ~14 tokens a row: 4 windows of 31 need ~10 rows; at most one batch of 64 rows is read
    assert read[0] <= 64 + 1, read[0]
    again = corpus_windows(model, _counting_stream(200)[0], n_seq=4, seq_len=32, text_column="body")
    assert torch.equal(again.tokens, windows.tokens)  # deterministic
    # the windows are the rows' tokens, joined by a blank line, cut in order
    one = to_token_batch(model, "Row 0: the quick brown fox jumps over the lazy dog.", bos="never")
    assert windows.tokens[0, 1 : 1 + one.tokens.shape[1]].tolist() == one.tokens[0].tolist()
    sim = positional_similarity(model, windows, edge_k=4, progress=False)
    assert tuple(sim.M.shape) == (3, 31, 31)  # exclude_first="auto": the BOS is left out


def test_dataset_windows_equal_for_map_style_and_streamed(get_model) -> None:
    model = get_model("neox", BACKENDS[-1])
    texts = [f"Paragraph {i} tells of the quick brown fox." for i in range(40)]
    whole = corpus_windows(model, datasets.Dataset.from_dict({"text": texts}), n_seq=5, seq_len=16)
    streamed = corpus_windows(
        model,
        datasets.Dataset.from_dict({"text": texts}).to_iterable_dataset(),
        n_seq=5,
        seq_len=16,
    )
    assert torch.equal(whole.tokens, streamed.tokens) and whole.bos is False


def test_dataset_bad_input(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    rows = datasets.Dataset.from_dict({"body": ["one two three"], "n": [1]})
    with pytest.raises(InvalidInputError, match=r"no column 'text'.*\['body', 'n'\]"):
        to_token_batch(model, rows)
    with pytest.raises(InvalidInputError, match="no column 'text'"):
        corpus_windows(model, rows.to_iterable_dataset(), n_seq=1, seq_len=4)
    with pytest.raises(InvalidInputError, match="not a str"):
        to_token_batch(model, rows, text_column="n")
    with pytest.raises(InvalidInputError, match="must be a column name"):
        to_token_batch(model, rows, text_column=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="pick one split"):
        to_token_batch(model, datasets.DatasetDict({"train": rows}))
    with pytest.raises(InvalidInputError, match="holds no text"):
        to_token_batch(model, datasets.Dataset.from_dict({"text": ["", " "]}))
    with pytest.raises(InvalidInputError, match="too small for n_seq=50"):
        corpus_windows(model, rows, n_seq=50, seq_len=8, text_column="body")
    with pytest.raises(SequenceTooLongError, match="corpus_windows"):
        to_token_batch(model, datasets.Dataset.from_dict({"text": ["word " * 2000]}))
    with pytest.raises(InvalidInputError, match="attention_mask is only for token input"):
        to_token_batch(model, rows, attention_mask=torch.ones(1, 3), text_column="body")
