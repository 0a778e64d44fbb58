"""Data for homogenization measurements: corpora, token windows, BOS policy, padding, masks.

Everything a measurement consumes becomes a :class:`TokenBatch`: tokens, an attention mask
(1 = real token, 0 = pad), and whether position 0 of each sequence holds a BOS token. Positions
are later counted from each sequence's first non-pad token, whatever the padding side.

The package: :mod:`~homoglens.run.data.batch` (the batch, the tokenizer primitives and the BOS
policy), :mod:`~homoglens.run.data.hf_datasets` (Hugging Face datasets, read a batch of rows at a
time; :class:`DatasetStream` streams one), :mod:`~homoglens.run.data.inputs` (corpora, windows and
:func:`to_token_batch`, which turns every input into a batch).
"""

from homoglens.run.data.batch import DataInput, TokenBatch, require_min_tokens, right_aligned
from homoglens.run.data.hf_datasets import DatasetStream, dataset_kind
from homoglens.run.data.inputs import (
    CORPORA,
    HELD_OUT,
    corpus_windows,
    load_corpus,
    split_austen,
    to_token_batch,
)

__all__ = [
    "CORPORA",
    "HELD_OUT",
    "DataInput",
    "DatasetStream",
    "TokenBatch",
    "corpus_windows",
    "dataset_kind",
    "load_corpus",
    "require_min_tokens",
    "right_aligned",
    "split_austen",
    "to_token_batch",
]
