"""Hugging Face ``datasets`` as data: the rows of a text column, read a batch at a time.

Every non-empty row of ``text_column`` is one text, exactly as a ``list[str]`` of them would be
(:func:`dataset_batch`), or the rows are joined by blank lines and cut into windows
(:func:`dataset_windows`, for ``corpus_windows``). :class:`DatasetStream` yields the rows as
token batches lazily, so a measurement that accumulates sums (``homogenization_profile``) reads
a dataset of any length with flat memory. ``datasets`` is imported only when a dataset is given.
An ``IterableDataset`` may never end, so reading it whole needs a bound (``n_seq``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from homoglens.core.errors import InvalidInputError, MissingDependencyError, SequenceTooLongError
from homoglens.core.types import BosPolicy, HookedModel
from homoglens.core.validate import as_int
from homoglens.run.data.batch import (
    TokenBatch,
    bos_label,
    bos_prefix,
    encode,
    encode_many,
    full_windows,
    n_ctx,
    packed,
    prefixed,
)

__all__ = ["DatasetStream", "dataset_kind"]

DATASET_CLASSES = ("Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict")
DATASET_ROWS = 64
"""Rows of a Hugging Face dataset read and tokenized at a time (fewer when ``n_seq`` is
smaller)."""


def dataset_kind(data: Any) -> str | None:
    """The class name of a Hugging Face ``datasets`` object (``"Dataset"`` or
    ``"IterableDataset"``), found by its classes' names and module, so that ``datasets`` is
    never imported for other input; ``None`` for anything else.

    Raises:
        InvalidInputError: a dict of splits (``DatasetDict``): the message says to pick one.
        MissingDependencyError: it looks like a dataset but ``datasets`` cannot be imported.
    """
    for cls in type(data).__mro__:
        if cls.__module__.split(".")[0] == "datasets" and cls.__name__ in DATASET_CLASSES:
            return _checked_kind(data, cls.__name__)
    return None


def _checked_kind(data: Any, name: str) -> str:
    try:
        import datasets
    except ImportError:
        raise MissingDependencyError(
            f"data looks like a Hugging Face datasets.{name}, but the datasets package cannot be "
            "imported; install it with pip install datasets"
        ) from None
    if name.endswith("Dict"):
        splits = ", ".join(repr(k) for k in list(data)[:8])
        raise InvalidInputError(
            f"data is a datasets.{name} (a dict of splits: {splits}); pick one split, e.g. "
            "data['train'], or load_dataset(..., split='train')"
        )
    if not isinstance(data, (datasets.Dataset, datasets.IterableDataset)):
        raise InvalidInputError(f"data of type {type(data).__name__} is not a datasets.{name}")
    return name


def checked_bound(kind: str, n_seq: Any) -> int | None:
    """``n_seq`` checked (``None``: no bound), refused as missing for an ``IterableDataset``.

    Raises:
        InvalidInputError: ``n_seq`` is not an integer >= 1, or is missing for an
            ``IterableDataset`` (which may never end: the message names the fixes).
    """
    if n_seq is not None:
        return as_int("n_seq", n_seq, low=1)
    if kind == "IterableDataset":
        raise InvalidInputError(
            "data is a datasets.IterableDataset, which may never end, and no bound was given: "
            "pass n_seq=<how many texts to read> (homogenization_profile streams them with "
            "flat memory; to_token_batch(model, data, n_seq=...) makes a TokenBatch every "
            "measurement takes), or cut it into windows with corpus_windows(model, data, "
            "n_seq=..., seq_len=...)"
        )
    return None


def dataset_label(data: Any, kind: str, text_column: str) -> str:
    """``dataset <name>[<split>] column '<text_column>'`` (the class name if it has no name)."""
    name = getattr(getattr(data, "info", None), "dataset_name", None)
    split = getattr(data, "split", None)
    where = f"{name}" + (f"[{split}]" if split is not None else "") if name else kind
    return f"dataset {where} column {text_column!r}"


def check_text_column(data: Any, text_column: Any) -> None:
    """Refuse a ``text_column`` that is not a str, or not among the dataset's known columns.

    Raises:
        InvalidInputError: the message lists the columns.
    """
    if not isinstance(text_column, str):
        raise InvalidInputError(f"text_column={text_column!r} must be a column name (a str)")
    columns = getattr(data, "column_names", None)  # None: an IterableDataset of unknown features
    if columns is not None and text_column not in columns:
        raise _missing(text_column, columns)


def _missing(text_column: str, found: Any) -> InvalidInputError:
    return InvalidInputError(
        f"the dataset has no column {text_column!r}; its columns are {sorted(found)}; pass "
        "text_column=<the column that holds the text>"
    )


def text_batches(data: Any, text_column: Any, *, rows: int = DATASET_ROWS) -> Iterator[list[str]]:
    """Batches of the texts of ``data[text_column]``, read ``rows`` rows at a time, lazily (an
    ``IterableDataset`` is streamed, never materialised); rows with no text are skipped.

    Raises:
        InvalidInputError: ``text_column`` is not a column (the message lists the columns), or a
            row holds something other than a str.
    """
    check_text_column(data, text_column)
    columns = getattr(data, "column_names", None)
    source = data.select_columns([text_column]) if columns is not None else data
    row = 0
    for part in source.iter(batch_size=rows):
        if text_column not in part:
            raise _missing(text_column, part)
        texts = []
        for text in part[text_column]:
            if not isinstance(text, str):
                raise InvalidInputError(
                    f"row {row} of column {text_column!r} is a {type(text).__name__}, not a str; "
                    "pass text_column=<the column that holds the text>"
                )
            if text.strip():
                texts.append(text)
            row += 1
        if texts:
            yield texts


def dataset_rows(
    model: HookedModel,
    data: Any,
    label: str,
    prefix: list[int],
    text_column: str,
    n_seq: int | None,
) -> Iterator[list[int]]:
    """The token ids of each non-empty row (``prefix`` prepended), at most ``n_seq`` of them;
    reads a batch of rows at a time (no more than ``n_seq`` when it is smaller) and stops once
    ``n_seq`` texts were found.

    Raises:
        SequenceTooLongError: a row longer than the model's context window.
    """
    read = DATASET_ROWS if n_seq is None else min(DATASET_ROWS, n_seq)
    found = 0
    for texts in text_batches(data, text_column, rows=read):
        for ids in encode_many(model, texts, label):
            row = prefixed(ids, prefix)
            if len(row) > n_ctx(model):
                raise SequenceTooLongError(
                    f"text {found} of the {label} has {len(row)} tokens (BOS included), more "
                    f"than the model's context window n_ctx={n_ctx(model)}; cut the dataset "
                    "into windows with corpus_windows(model, dataset, seq_len=...)"
                )
            yield row
            found += 1
            if found == n_seq:
                return


def dataset_batch(
    model: HookedModel,
    data: Any,
    kind: str,
    bos: BosPolicy | bool,
    text_column: str,
    n_seq: int | None = None,
) -> TokenBatch:
    """Every non-empty row of a dataset's text column (the first ``n_seq``) as one sequence,
    like a list of texts.

    Raises:
        InvalidInputError: no text, or no bound for an ``IterableDataset``.
    """
    n_seq = checked_bound(kind, n_seq)
    label = dataset_label(data, kind, text_column)
    rows = list(dataset_rows(model, data, label, bos_prefix(model, bos), text_column, n_seq))
    if not rows:
        raise InvalidInputError(f"the {label} holds no text; give a dataset with some text")
    first = "" if n_seq is None else f"first {n_seq} rows: "
    return packed(model, rows, f"{label}: {first}{len(rows)} texts")


class DatasetStream:
    """The non-empty rows of a dataset's text column as token batches, read lazily.

    Iterating yields :class:`TokenBatch` parts of ``rows`` sequences (the last may be shorter),
    each right-padded to its own longest row, in the order of the dataset: the same sequences
    :func:`dataset_batch` packs into one batch. A batch of dataset rows is read and tokenized at
    a time, only as far as the parts asked for need, and nothing is kept once a part is handed
    on, so memory does not grow with the dataset's length. Iterate once.

    While it runs it records what a measurement's provenance needs: ``n_read`` (texts so far),
    ``bos`` (whether every text starts with the BOS token), ``description`` and ``sha256``.

    Args:
        model: Supplies the tokenizer, ``cfg.n_ctx`` and the BOS default.
        data: A ``datasets.Dataset`` or ``IterableDataset``.
        rows: Sequences per part.
        n_seq: Read at most this many texts (required for an ``IterableDataset``).
        bos: ``"auto"``, ``"always"`` or ``"never"``.
        text_column: The column that holds the text.

    Raises:
        InvalidInputError: not a dataset, a missing column, no bound for an ``IterableDataset``;
            while iterating: a row that is not a str, a dataset with no text.
        SequenceTooLongError: while iterating, a row longer than ``cfg.n_ctx``.
    """

    def __init__(
        self,
        model: HookedModel,
        data: Any,
        *,
        rows: int,
        n_seq: int | None,
        bos: BosPolicy | bool,
        text_column: str,
    ) -> None:
        kind = dataset_kind(data)
        if kind is None:
            raise InvalidInputError(f"data of type {type(data).__name__} is not a dataset")
        self.model, self.data, self.text_column = model, data, text_column
        self.rows = as_int("rows", rows, low=1)
        self.n_seq = checked_bound(kind, n_seq)
        check_text_column(data, text_column)
        self.prefix = bos_prefix(model, bos)
        self.label = dataset_label(data, kind, text_column)
        self.n_read = 0
        self._starts: set[bool | None] = set()
        self._digest = hashlib.sha256()
        self._rows: list[str] = []  # each row's fingerprint (Provenance.data_rows)

    def __iter__(self) -> Iterator[TokenBatch]:
        part: list[list[int]] = []
        source = dataset_rows(
            self.model, self.data, self.label, self.prefix, self.text_column, self.n_seq
        )
        for row in source:
            part.append(row)
            if len(part) == self.rows:
                yield self._batch(part)
                part = []
        if part:
            yield self._batch(part)
        if self.n_read == 0:
            raise InvalidInputError(
                f"the {self.label} holds no text; give a dataset with some text"
            )

    def _batch(self, part: list[list[int]]) -> TokenBatch:
        for row in part:
            data = np.asarray([len(row), *row], dtype="<i8").tobytes()
            self._digest.update(data)
            self._rows.append(hashlib.sha256(data).hexdigest()[:16])
        start = self.n_read
        self.n_read += len(part)
        batch = packed(self.model, part, f"{self.label}: texts {start}-{self.n_read - 1}")
        self._starts.add(batch.bos)
        return batch

    @property
    def bos(self) -> bool | None:
        """Whether every text read starts with the BOS token (``None``: some do, some not)."""
        if not self._starts:
            return False
        return next(iter(self._starts)) if len(self._starts) == 1 else None

    @property
    def description(self) -> str:
        """The data as a result's provenance names it: the dataset, column and texts read."""
        first = "" if self.n_seq is None else f"first {self.n_seq} rows: "
        return f"{self.label}: {first}{self.n_read} texts, streamed, bos={bos_label(self.bos)}"

    @property
    def sha256(self) -> str:
        """The content hash of the texts' tokens read so far: sha256 of each row's length then
        its token ids, row by row, as little-endian int64 (computed as the rows pass; the same
        hash as :func:`homoglens.run.provenance.token_sha256` of the same rows held as one
        batch)."""
        return self._digest.hexdigest()

    @property
    def row_fingerprints(self) -> str:
        """The fingerprint of each text read so far (``Provenance.data_rows``), in order."""
        return "".join(self._rows)


def dataset_windows(
    model: HookedModel,
    data: Any,
    kind: str,
    n_seq: int,
    seq_len: int,
    prefix: list[int],
    text_column: str,
) -> TokenBatch:
    """The first ``n_seq`` consecutive windows of a dataset's rows joined by blank lines; reads
    (and tokenizes, a batch of rows at a time) only as many rows as those windows need.

    Raises:
        InvalidInputError: the dataset is too small for ``n_seq`` windows.
    """
    label = dataset_label(data, kind, text_column)
    content = seq_len - len(prefix)
    separator = encode(model, "\n\n")
    rows: list[list[int]] = []
    buffer: list[int] = []
    joined = False  # whether a row came before (the next one follows a blank line)
    for texts in text_batches(data, text_column):
        for ids in encode_many(model, texts, label):
            buffer.extend([*separator, *ids] if joined else ids)
            joined = True
            while len(buffer) >= content and len(rows) < n_seq:
                rows.append(prefix + buffer[:content])
                del buffer[:content]
        if len(rows) == n_seq:
            break
    if len(rows) < n_seq:
        raise InvalidInputError(
            f"the {label} is too small for n_seq={n_seq} windows of seq_len={seq_len} tokens "
            f"(it holds {len(rows)}); lower n_seq or seq_len"
        )
    return full_windows(
        model, rows, f"{label}: first {n_seq} consecutive windows x {seq_len} tokens"
    )
