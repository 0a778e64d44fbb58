"""Hugging Face ``datasets`` as data: rows of a text column equal the same texts as a list;
``corpus_windows`` streams a dataset, reading only the rows its windows need; given directly to
``homogenization_profile``, a dataset is streamed a batch of rows at a time (an endless
``IterableDataset`` with a bound, ``n_seq``; flat memory on a long one)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")

from helpers import BACKENDS, SHORT_TEXTS, hook_count  # noqa: E402
from homoglens import (  # noqa: E402
    HomogenizationProfile,
    InvalidInputError,
    SequenceTooLongError,
    corpus_windows,
    homogenization_profile,
    load_model,
    massive_activations,
    positional_similarity,
    to_token_batch,
)
from homoglens.testing import tiny_model_folder  # noqa: E402

PROFILE_FIELDS = ("to_others", "to_prefix", "to_mean", "norm", "mean_pairwise", "baseline")
WORDS = "the quick brown fox jumps over a lazy dog while seven old men sing of the sea".split()


def varied_text(i: int) -> str:
    """Text ``i`` of a corpus whose rows have 6 to 49 words (lengths vary, so parts pad)."""
    n = 6 + (i * 7) % 44
    return " ".join(WORDS[(i + 3 * k) % len(WORDS)] for k in range(n)) + f" ({i})."


def generated_stream(n: int, read: list[int]) -> object:
    """A generator-backed IterableDataset of the ``n`` texts ``varied_text(0..n-1)`` (never
    held as a list), counting the rows read in ``read[0]``."""

    def rows():
        for i in range(n):
            read[0] += 1
            yield {"body": varied_text(i)}

    return datasets.IterableDataset.from_generator(rows)


def assert_same_profile(a: HomogenizationProfile, b: HomogenizationProfile) -> None:
    for name in PROFILE_FIELDS:
        torch.testing.assert_close(
            getattr(a, name), getattr(b, name), atol=1e-6, rtol=0, equal_nan=True
        )
    assert (a.n_sequences, a.n_tokens) == (b.n_sequences, b.n_tokens)
    assert torch.equal(a.count, b.count)


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
    batch = to_token_batch(model, stream, text_column="body", n_seq=100)  # at most 100
    assert torch.equal(batch.tokens, to_token_batch(model, SHORT_TEXTS).tokens)
    acts = massive_activations(model, batch, progress=False)
    assert acts.n_sequences == len(SHORT_TEXTS)
    first = to_token_batch(model, stream, text_column="body", n_seq=1)
    assert torch.equal(first.tokens, to_token_batch(model, SHORT_TEXTS[:1]).tokens)
    assert "first 1 rows: 1 texts" in first.description


def test_an_iterable_dataset_needs_a_bound(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    stream, read = _counting_stream(limit=0)  # reading a single row fails the test
    calls = {
        "to_token_batch": lambda: to_token_batch(model, stream, text_column="body"),
        "homogenization_profile": lambda: homogenization_profile(
            model, stream, text_column="body", progress=False
        ),
        "massive_activations": lambda: massive_activations(
            model, stream, text_column="body", progress=False
        ),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidInputError, match=r"may never end.*n_seq=.*corpus_windows"):
            call()
        assert read[0] == 0, name  # refused before reading
    with pytest.raises(InvalidInputError, match="n_seq=0 must lie in"):
        homogenization_profile(model, stream, n_seq=0, text_column="body", progress=False)
    with pytest.raises(InvalidInputError, match="no column 'text'"):
        homogenization_profile(model, datasets.Dataset.from_dict({"body": ["a b c"]}))
    with pytest.raises(InvalidInputError, match="attention_mask is only for token input"):
        homogenization_profile(
            model, stream, n_seq=2, attention_mask=torch.ones(1, 3), text_column="body"
        )
    assert read[0] == 0


def test_n_seq_keeps_the_first_sequences_of_any_input(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    texts = [*SHORT_TEXTS, "It was a dark and stormy night."]
    two = to_token_batch(model, texts[:2])
    assert torch.equal(to_token_batch(model, texts, n_seq=2).tokens, two.tokens)
    whole = to_token_batch(model, texts)
    cut = to_token_batch(model, whole, n_seq=2)
    assert len(cut) == 2 and cut.description.endswith("first 2")
    given = to_token_batch(model, whole.tokens, attention_mask=whole.attention_mask, n_seq=1)
    assert torch.equal(given.tokens, whole.tokens[:1])
    rows = datasets.Dataset.from_dict({"text": texts})
    assert torch.equal(to_token_batch(model, rows, n_seq=2).tokens, two.tokens)
    a = homogenization_profile(model, rows, n_seq=2, progress=False)
    assert_same_profile(a, homogenization_profile(model, texts[:2], progress=False))
    b = homogenization_profile(model, texts, n_seq=2, progress=False)
    assert_same_profile(b, homogenization_profile(model, texts[:2], progress=False))


def test_an_endless_dataset_is_profiled_directly_reading_only_what_it_needs(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    stream, read = _counting_stream(limit=10_000)
    prof = homogenization_profile(
        model, stream, n_seq=20, batch_size=4, text_column="body", progress=False
    )
    assert prof.n_sequences == 20 and read[0] <= 20 + 1, read[0]  # rows are read 20 at a time
    texts = [f"Row {i}: the quick brown fox jumps over the lazy dog." for i in range(20)]
    listed = homogenization_profile(model, texts, batch_size=4, progress=False)
    assert_same_profile(prof, listed)
    assert "20 texts, streamed, bos=yes" in prof.provenance.data and prof.provenance.bos is True
    # The same tokens hash the same streamed or held: a merge of the two is refused.
    assert prof.provenance.data_sha256 == listed.provenance.data_sha256
    again = homogenization_profile(
        model, _counting_stream(10_000)[0], n_seq=20, batch_size=4, text_column="body"
    )
    assert again.provenance.data_sha256 == prof.provenance.data_sha256
    assert hook_count(model) == 0


def _peak_bytes(run) -> int:
    """Peak Python memory (tracemalloc) while ``run()`` runs."""
    gc.collect()
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_a_long_dataset_streams_with_flat_memory_and_equals_its_texts_as_a_list(
    get_model,
) -> None:
    """The streamed profile of a generator-backed IterableDataset equals the profile of the
    same texts as a list (1e-6), and its peak Python memory hardly moves when the dataset is 4x
    longer, where holding the rows' token ids (``to_token_batch``) grows with them."""
    model = get_model("gpt2", BACKENDS[-1])
    # 128 and 512 rows. The streamed peak saturates (the data path's and the libraries' caches
    # warm up over the first parts: 145, 226, 253, 274 KB at 32, 128, 256, 512 rows) while
    # holding the token ids grows by about 1.8 KB a row.
    n = 128

    def streamed(rows: int) -> HomogenizationProfile:
        read = [0]
        prof = homogenization_profile(
            model, generated_stream(rows, read), n_seq=10**6, batch_size=16,
            text_column="body", progress=False,
        )  # fmt: skip
        assert read[0] == rows == prof.n_sequences
        return prof

    def held(rows: int) -> None:
        to_token_batch(model, generated_stream(rows, [0]), n_seq=10**6, text_column="body")

    streamed(n // 4)  # warm up (lazy imports, caches)
    peaks = {rows: _peak_bytes(lambda rows=rows: streamed(rows)) for rows in (n, 4 * n)}
    held_peaks = {rows: _peak_bytes(lambda rows=rows: held(rows)) for rows in (n, 4 * n)}
    grew, held_grew = peaks[4 * n] - peaks[n], held_peaks[4 * n] - held_peaks[n]
    assert held_grew > 100_000, held_peaks  # the check can see rows being held
    assert grew < 0.25 * held_grew and peaks[4 * n] < 1.3 * peaks[n], (peaks, held_peaks)
    texts = [varied_text(i) for i in range(4 * n)]
    listed = homogenization_profile(model, texts, batch_size=16, progress=False)
    assert_same_profile(streamed(4 * n), listed)


DISTRIBUTED_WORKER = r"""
import sys
import datasets
import torch.distributed as dist
from homoglens import homogenization_profile, load_model
from homoglens.core.distributed import world

dist.init_process_group("gloo")
folder, out, texts = sys.argv[1], sys.argv[2], sys.argv[3].split("|")
model = load_model(folder, backend="bridge", device="cpu")
stream = datasets.Dataset.from_dict({"text": texts}).to_iterable_dataset()
prof = homogenization_profile(model, stream, n_seq=1000, batch_size=2, progress=False)
if world()[0] == 0:
    prof.save(out)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_streamed_dataset_under_torchrun_equals_one_process(tmp_path: Path) -> None:
    # 13 texts in parts of 2 ranks x 2: the last part (1 text) leaves rank 1 an empty shard
    texts = [varied_text(i) for i in range(13)]
    worker = tmp_path / "worker.py"
    worker.write_text(DISTRIBUTED_WORKER)
    folder = tiny_model_folder("gpt2")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + [str(worker), str(folder), str(tmp_path / "profile"), "|".join(texts)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model = load_model(folder, backend="bridge", device="cpu")
    one = homogenization_profile(model, texts, batch_size=2, progress=False)
    assert_same_profile(HomogenizationProfile.load(tmp_path / "profile"), one)


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
