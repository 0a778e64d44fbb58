"""Data for homogenization measurements: corpora, token windows, BOS policy, padding, masks.

Everything a measurement consumes becomes a :class:`TokenBatch`: tokens, an attention mask
(1 = real token, 0 = pad), and whether position 0 of each sequence holds a BOS token. Positions
are later counted from each sequence's first non-pad token, whatever the padding side.
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import torch
from jaxtyping import Int

from homoglens.errors import InvalidInputError, MissingDependencyError, SequenceTooLongError
from homoglens.types import BosPolicy, HookedModel
from homoglens.validate import as_int, check_attention_mask

if TYPE_CHECKING:  # datasets is imported only when a dataset is given
    from datasets import Dataset, IterableDataset

__all__ = [
    "CORPORA",
    "split_austen",
    "TokenBatch",
    "DataInput",
    "load_corpus",
    "corpus_windows",
    "to_token_batch",
    "right_aligned",
]

CORPORA: dict[str, str] = {
    "austen": "Six novels of Jane Austen (Project Gutenberg text via the R package janeaustenr, "
    "MIT packaging, public-domain novels): Emma, Mansfield Park, Northanger Abbey, Persuasion, "
    "Pride and Prejudice, Sense and Sensibility.",
    "austen-train": "The five Austen novels the shipped tiny models were trained on (all but "
    "Sense and Sensibility).",
    "austen-heldout": "Sense and Sensibility, the Austen novel held out from the shipped tiny "
    "models' training.",
}

HELD_OUT = "SENSE AND SENSIBILITY"
"""Title line of the novel held out from training (the last novel of the Austen corpus)."""


@dataclass(frozen=True)
class TokenBatch:
    """Token sequences ready for a forward pass.

    Attributes:
        tokens: ``[batch pos]`` int64 token ids; pad positions hold any valid id.
        attention_mask: ``[batch pos]`` int64, 1 on real tokens, 0 on pads. Real tokens of a
            row form one contiguous block (left or right padding).
        bos: Whether the first real token of every sequence is the tokenizer's BOS token
            (``None`` if some sequences have one and others do not).
        description: Human-readable provenance of the data (corpus, window settings).
    """

    tokens: Int[torch.Tensor, "batch pos"]
    attention_mask: Int[torch.Tensor, "batch pos"]
    bos: bool | None
    description: str

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, torch.Tensor) or not isinstance(
            self.attention_mask, torch.Tensor
        ):
            raise InvalidInputError(
                "TokenBatch needs torch tensors for tokens and attention_mask; use "
                "homoglens.to_token_batch(model, data) to build one"
            )
        if self.tokens.shape != self.attention_mask.shape:
            raise InvalidInputError(
                f"tokens {tuple(self.tokens.shape)} and attention_mask "
                f"{tuple(self.attention_mask.shape)} must have the same [batch pos] shape"
            )

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def lengths(self) -> Int[torch.Tensor, " batch"]:
        """Number of real (non-pad) tokens of each sequence."""
        return self.attention_mask.sum(dim=1)

    @property
    def n_tokens(self) -> int:
        """Total number of real tokens."""
        return int(self.attention_mask.sum())

    def __getitem__(self, index: slice | list[int] | torch.Tensor) -> TokenBatch:
        """Select sequences (a slice or index list) as a new batch."""
        if isinstance(index, int):
            n = len(self)
            if not -n <= index < n:
                raise IndexError(f"sequence {index} out of range for a batch of {n}")
            index = slice(index % n, index % n + 1)
        return TokenBatch(
            self.tokens[index], self.attention_mask[index], self.bos, self.description
        )

    def __repr__(self) -> str:
        return (
            f"TokenBatch(n_seq={len(self)}, max_len={self.tokens.shape[1]}, "
            f"n_tokens={self.n_tokens}, bos={self.bos}, data={self.description!r})"
        )


# --------------------------------------------------------------------------- corpora


DataInput: TypeAlias = Union[  # noqa: UP007 - the datasets classes are only names here
    TokenBatch,
    Int[torch.Tensor, "batch pos"],
    str,
    list[str],
    os.PathLike[str],
    "Dataset",
    "IterableDataset",
]
"""What every measurement takes as ``data``: token ids ``[batch pos]`` (used as given, no BOS
added), a :class:`TokenBatch`, a text, a list of texts, a text-file path, or a Hugging Face
``datasets.Dataset`` / ``IterableDataset`` with a text column (see :func:`to_token_batch`)."""


def split_austen(text: str | None = None) -> tuple[str, str]:
    """Split the Austen corpus into (training text, held-out text): the held-out text is the
    last novel, *Sense and Sensibility*; the training text holds the other five.

    Args:
        text: The raw corpus (default: the vendored ``austen`` text, hard-wrapped lines kept).

    Returns:
        ``(train, heldout)`` raw texts.

    Raises:
        InvalidInputError: the text does not contain the held-out novel's title line.
    """
    if text is None:
        raw = (files("homoglens") / "assets" / "corpora" / "austen.txt.gz").read_bytes()
        text = gzip.decompress(raw).decode("utf-8")
    match = re.search(rf"^{HELD_OUT}\s*$", text, re.M)
    if match is None:
        raise InvalidInputError(f"the corpus has no line {HELD_OUT!r} to split at")
    return text[: match.start()], text[match.start() :]


def load_corpus(name: str = "austen") -> str:
    """Return a vendored corpus as plain text, hard-wrapped lines joined into paragraphs.

    Args:
        name: A key of :data:`CORPORA` (``"austen"``: ~4 MB, six novels).

    Returns:
        The text; paragraphs separated by a blank line.

    Raises:
        InvalidInputError: unknown corpus name (the message lists the known ones).
    """
    if not isinstance(name, str) or name not in CORPORA:
        raise InvalidInputError(f"unknown corpus {name!r}; known corpora: {sorted(CORPORA)}")
    return _load_corpus(name)


@lru_cache(maxsize=4)
def _load_corpus(name: str) -> str:
    if name in ("austen-train", "austen-heldout"):
        text = split_austen()[name == "austen-heldout"]
    else:
        raw = (files("homoglens") / "assets" / "corpora" / f"{name}.txt.gz").read_bytes()
        text = gzip.decompress(raw).decode("utf-8")
    paragraphs = (re.sub(r"\s*\n\s*", " ", p).strip() for p in re.split(r"\n\s*\n", text))
    return "\n\n".join(p for p in paragraphs if p)


def _tokenizer(model: HookedModel) -> Any:
    from homoglens.validate import check_model

    check_model(model)
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise InvalidInputError(
            "the model has no tokenizer, so text cannot be tokenized; pass token ids "
            "(an integer [batch pos] tensor) instead, or attach one with model.set_tokenizer(tok)"
        )
    return tok


def _resolve_bos(model: HookedModel, bos: BosPolicy | bool) -> bool:
    if bos is True or bos is False:
        return bool(bos)
    if bos == "auto":
        return bool(getattr(model.cfg, "default_prepend_bos", True))
    if bos == "always":
        return True
    if bos == "never":
        return False
    raise InvalidInputError(f"bos={bos!r} must be 'auto', 'always', 'never' or a bool")


def _bos_id(model: HookedModel) -> int:
    tok = _tokenizer(model)
    bos_id = tok.bos_token_id
    if bos_id is None:
        raise InvalidInputError(
            "a BOS token was requested but the tokenizer has none; use bos='never'"
        )
    return int(bos_id)


def _encode(model: HookedModel, text: str, where: str = "the text") -> list[int]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate, e.g. from a bad decode upstream
        raise InvalidInputError(
            f"{where} holds {text[err.start : err.end]!r} at character {err.start}, which is not "
            "valid Unicode text (a lone surrogate); fix or drop it, e.g. "
            "text.encode('utf-8', 'replace').decode()"
        ) from None
    return list(_tokenizer(model)(text, add_special_tokens=False)["input_ids"])


def _prefixed(row: list[int], prefix: list[int]) -> list[int]:
    """``prefix + row``, except that a row which already starts with the BOS gets no second one
    (as Hugging Face tokenizers do)."""
    return row if prefix and row[:1] == prefix else prefix + row


def _recorded_bos(model: HookedModel, rows: list[list[int]]) -> bool | None:
    """Whether position 0 of every row holds the BOS id (None: some rows do, some do not),
    read from the tokens themselves, whatever the policy asked for."""
    bos_id = getattr(_tokenizer(model), "bos_token_id", None)
    if bos_id is None:
        return False
    starts = [bool(row) and row[0] == bos_id for row in rows]
    return True if all(starts) else False if not any(starts) else None


def _bos_label(bos: bool | None) -> str:
    return {True: "yes", False: "no", None: "mixed"}[bos]


def _n_ctx(model: HookedModel) -> int:
    return int(model.cfg.n_ctx)


# --------------------------------------------------------------------------- datasets

_DATASET_CLASSES = ("Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict")
_DATASET_ROWS = 64
"""Rows of a Hugging Face dataset read and tokenized at a time."""


def _dataset_kind(data: Any) -> str | None:
    """The class name of a Hugging Face ``datasets`` object (``"Dataset"``,
    ``"IterableDataset"``, or a dict of splits), found by its classes' names and module, so that
    ``datasets`` is never imported for other input; ``None`` for anything else."""
    for cls in type(data).__mro__:
        if cls.__module__.split(".")[0] == "datasets" and cls.__name__ in _DATASET_CLASSES:
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


def _dataset_label(data: Any, kind: str, text_column: str) -> str:
    name = getattr(getattr(data, "info", None), "dataset_name", None)
    split = getattr(data, "split", None)
    where = f"{name}" + (f"[{split}]" if split is not None else "") if name else kind
    return f"dataset {where} column {text_column!r}"


def _dataset_text_batches(data: Any, text_column: Any) -> Iterator[list[str]]:
    """Batches of the texts of ``data[text_column]``, read lazily (an ``IterableDataset`` is
    streamed, never materialised); rows with no text are skipped.

    Raises:
        InvalidInputError: ``text_column`` is not a column (the message lists the columns), or a
            row holds something other than a str.
    """
    if not isinstance(text_column, str):
        raise InvalidInputError(f"text_column={text_column!r} must be a column name (a str)")
    columns = getattr(data, "column_names", None)  # None: an IterableDataset of unknown features

    def missing(found: Any) -> InvalidInputError:
        return InvalidInputError(
            f"the dataset has no column {text_column!r}; its columns are {sorted(found)}; pass "
            "text_column=<the column that holds the text>"
        )

    if columns is not None and text_column not in columns:
        raise missing(columns)
    source = data.select_columns([text_column]) if columns is not None else data
    row = 0
    for part in source.iter(batch_size=_DATASET_ROWS):
        if text_column not in part:
            raise missing(part)
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


def _encode_many(model: HookedModel, texts: list[str], where: str) -> list[list[int]]:
    """Token ids of each text (no special tokens), tokenized in one batched call."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            _encode(model, text, f"{where} (a text of batch row {i})")  # raises the typed error
    return [list(ids) for ids in _tokenizer(model)(texts, add_special_tokens=False)["input_ids"]]


def _dataset_batch(
    model: HookedModel, data: Any, kind: str, bos: BosPolicy | bool, text_column: str
) -> TokenBatch:
    """Every non-empty row of a dataset's text column as one sequence, like a list of texts."""
    label = _dataset_label(data, kind, text_column)
    prefix = [_bos_id(model)] if _resolve_bos(model, bos) else []
    rows: list[list[int]] = []
    for texts in _dataset_text_batches(data, text_column):
        for ids in _encode_many(model, texts, label):
            row = _prefixed(ids, prefix)
            if len(row) > _n_ctx(model):
                raise SequenceTooLongError(
                    f"text {len(rows)} of the {label} has {len(row)} tokens (BOS included), more "
                    f"than the model's context window n_ctx={_n_ctx(model)}; cut the dataset "
                    "into windows with corpus_windows(model, dataset, seq_len=...)"
                )
            rows.append(row)
    if not rows:
        raise InvalidInputError(f"the {label} holds no text; give a dataset with some text")
    return _packed(model, rows, f"{label}: {len(rows)} texts")


def _dataset_windows(
    model: HookedModel,
    data: Any,
    kind: str,
    n_seq: int,
    seq_len: int,
    prefix: list[int],
    text_column: str,
) -> TokenBatch:
    """The first ``n_seq`` consecutive windows of a dataset's rows joined by blank lines; reads
    (and tokenizes, a batch of rows at a time) only as many rows as those windows need."""
    label = _dataset_label(data, kind, text_column)
    content = seq_len - len(prefix)
    separator = _encode(model, "\n\n")
    rows: list[list[int]] = []
    buffer: list[int] = []
    joined = False  # whether a row came before (the next one follows a blank line)
    for texts in _dataset_text_batches(data, text_column):
        for ids in _encode_many(model, texts, label):
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
    tokens = torch.tensor(rows, dtype=torch.long)
    recorded = _recorded_bos(model, rows)
    return TokenBatch(
        tokens=tokens,
        attention_mask=torch.ones_like(tokens),
        bos=recorded,
        description=f"{label}: first {n_seq} consecutive windows x {seq_len} tokens, "
        f"bos={_bos_label(recorded)}",
    )


def corpus_windows(
    model: HookedModel,
    corpus: str | os.PathLike[str] | Dataset | IterableDataset = "austen",
    *,
    n_seq: int = 64,
    seq_len: int = 256,
    bos: BosPolicy | bool = "auto",
    text_column: str = "text",
) -> TokenBatch:
    """Cut a corpus into ``n_seq`` fixed-length token windows spread evenly over the text.

    The text is divided into ``n_seq`` equal stretches; each window starts at the first
    paragraph boundary of its stretch and holds ``seq_len`` tokens, a BOS (when used) counting
    inside ``seq_len``. Windows never overlap; the result has no padding.

    A Hugging Face ``datasets.Dataset`` or ``IterableDataset`` is read as a text whose
    paragraphs are the rows of ``text_column`` (empty rows skipped), streamed: its rows are
    tokenized a batch at a time and cut into consecutive windows (a window may span rows), and
    reading stops once ``n_seq`` windows exist, so memory stays flat however large (or endless)
    the dataset is. Shuffle it first (``dataset.shuffle(seed=0)``) to sample across it.

    Args:
        model: Supplies the tokenizer, ``cfg.n_ctx`` and the default BOS policy.
        corpus: A name in :data:`CORPORA`, the path of a UTF-8 text file, or a Hugging Face
            ``Dataset`` / ``IterableDataset`` with a text column.
        n_seq: Number of windows (sequences), >= 1.
        seq_len: Tokens per window, BOS included; 2 <= seq_len <= ``cfg.n_ctx``.
        bos: ``"auto"`` (the model's ``cfg.default_prepend_bos``), ``"always"``, ``"never"``.
        text_column: The dataset column that holds the text (datasets only).

    Returns:
        A :class:`TokenBatch` of shape ``[n_seq seq_len]``.

    Raises:
        InvalidInputError: bad ``n_seq``/``seq_len``, unknown corpus, empty file, a corpus too
            small for ``n_seq`` windows, a dataset without ``text_column`` (the message lists its
            columns) or a dict of splits.
        SequenceTooLongError: ``seq_len`` exceeds ``cfg.n_ctx``.
        MissingDependencyError: a dataset is given but ``datasets`` cannot be imported.

    Examples:
        >>> from datasets import Dataset
        >>> from homoglens import corpus_windows, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> rows = Dataset.from_dict({"text": ["The cat sat on the mat."] * 20})
        >>> tuple(corpus_windows(model, rows, n_seq=3, seq_len=16).tokens.shape)
        (3, 16)
    """
    from homoglens.validate import check_model

    check_model(model)
    n_seq = as_int("n_seq", n_seq, low=1)
    seq_len = as_int("seq_len", seq_len, low=2)
    if seq_len > _n_ctx(model):
        raise SequenceTooLongError(
            f"seq_len={seq_len} exceeds the model's context window n_ctx={_n_ctx(model)}; "
            f"use seq_len <= {_n_ctx(model)}"
        )
    kind = _dataset_kind(corpus)
    if kind is not None:
        use_bos = _resolve_bos(model, bos)
        prefix = [_bos_id(model)] if use_bos else []
        return _dataset_windows(model, corpus, kind, n_seq, seq_len, prefix, text_column)
    if isinstance(corpus, os.PathLike) or (
        isinstance(corpus, str) and corpus not in CORPORA and Path(corpus).is_file()
    ):
        path = Path(corpus)
        if not path.is_file():
            raise InvalidInputError(f"text file {str(path)!r} does not exist")
        text = _read_text(path)
        label = f"text file {path.name}"
    else:
        text = load_corpus(str(corpus))
        label = f"corpus {corpus}"
    if not text.strip():
        raise InvalidInputError(f"{label} is empty; give a file with some text")
    use_bos = _resolve_bos(model, bos)
    prefix = [_bos_id(model)] if use_bos else []
    content = seq_len - len(prefix)
    stretch = len(text) // n_seq
    rows: list[list[int]] = []
    for i in range(n_seq):
        start = i * stretch
        if i > 0:
            boundary = text.find("\n\n", start, start + stretch)
            start = boundary + 2 if boundary >= 0 else start
        # ~4 characters per token in English: take generously, never past this stretch.
        end = min((i + 1) * stretch if i < n_seq - 1 else len(text), start + 8 * content + 64)
        ids = _encode(model, text[start:end], f"{label} (window {i})")
        if prefix and ids[:1] == prefix:  # the stretch starts with the BOS itself
            ids = ids[1:]
        if len(ids) < content:
            raise InvalidInputError(
                f"{label} is too small for n_seq={n_seq} windows of seq_len={seq_len} tokens "
                f"(window {i} found only {len(ids)} tokens); lower n_seq or seq_len"
            )
        rows.append(prefix + ids[:content])
    tokens = torch.tensor(rows, dtype=torch.long)
    recorded = _recorded_bos(model, rows)
    return TokenBatch(
        tokens=tokens,
        attention_mask=torch.ones_like(tokens),
        bos=recorded,
        description=f"{label}: {n_seq} windows x {seq_len} tokens, evenly spaced, "
        f"bos={_bos_label(recorded)}",
    )


# --------------------------------------------------------------------------- generic input


def _text_batch(
    model: HookedModel, texts: list[str], bos: BosPolicy | bool, label: str
) -> TokenBatch:
    use_bos = _resolve_bos(model, bos)
    prefix = [_bos_id(model)] if use_bos else []
    rows = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"text {i} is a {type(text).__name__}, not a str")
        if not text.strip():
            raise InvalidInputError(f"text {i} is empty; every text needs at least one token")
        rows.append(_prefixed(_encode(model, text, f"text {i}"), prefix))
    longest = max(len(r) for r in rows)
    if longest > _n_ctx(model):
        worst = max(range(len(rows)), key=lambda i: len(rows[i]))
        raise SequenceTooLongError(
            f"text {worst} has {longest} tokens (BOS included), more than the model's context "
            f"window n_ctx={_n_ctx(model)}; shorten it or cut it with corpus_windows()"
        )
    return _packed(model, rows, label)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # a byte-order mark is not text
    except UnicodeDecodeError as err:
        raise InvalidInputError(
            f"{str(path)!r} is not UTF-8 text ({err.reason} at byte {err.start}); convert it, "
            "e.g. with iconv -t UTF-8"
        ) from None
    except OSError as err:
        raise InvalidInputError(f"cannot read {str(path)!r}: {err}") from None


def _file_batch(model: HookedModel, path: Path, bos: BosPolicy | bool) -> TokenBatch:
    if not path.is_file():
        raise InvalidInputError(f"text file {str(path)!r} does not exist")
    text = _read_text(path)
    if not text.strip():
        raise InvalidInputError(f"text file {str(path)!r} is empty")
    use_bos = _resolve_bos(model, bos)
    prefix = [_bos_id(model)] if use_bos else []
    ids = _encode(model, text, f"text file {path.name}")
    if prefix and ids[:1] == prefix:  # the file starts with the BOS itself
        ids = ids[1:]
    width = min(_n_ctx(model), 256) - len(prefix)
    chunks = [ids[i : i + width] for i in range(0, len(ids), width)]
    if len(chunks) > 1 and len(chunks[-1]) < width:
        chunks.pop()  # equal-length windows; the tail shorter than a window is dropped
    return _text_batch_from_ids(
        model, chunks, prefix, f"text file {path.name}: {len(chunks)} consecutive windows"
    )


def _text_batch_from_ids(
    model: HookedModel, chunks: list[list[int]], prefix: list[int], label: str
) -> TokenBatch:
    return _packed(model, [prefix + chunk for chunk in chunks], label)


def _packed(model: HookedModel, rows: list[list[int]], label: str) -> TokenBatch:
    """Right-padded ``[batch pos]`` tokens and mask of ``rows``, with their BOS record."""
    longest = max(len(row) for row in rows)
    tokens = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    recorded = _recorded_bos(model, rows)
    return TokenBatch(tokens, mask, recorded, f"{label}, bos={_bos_label(recorded)}")


def _on_meta(name: str, tensor: Any) -> None:
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
        raise InvalidInputError(
            f"{name} is on the meta device, which holds shapes but no values; create it on "
            "the CPU or the model's device"
        )


def _tensor_batch(model: HookedModel, tokens: torch.Tensor, attention_mask: Any) -> TokenBatch:
    _on_meta("tokens", tokens)
    _on_meta("attention_mask", attention_mask)
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise InvalidInputError(
            f"tokens must be an integer tensor of token ids, got dtype {tokens.dtype}; "
            "if they are ids stored as floats, convert with tokens.long()"
        )
    if tokens.ndim == 1:
        tokens = tokens.unsqueeze(0)
    if tokens.ndim != 2:
        raise InvalidInputError(f"tokens must be [batch pos], got shape {tuple(tokens.shape)}")
    if tokens.numel() == 0:
        raise InvalidInputError(f"tokens are empty (shape {tuple(tokens.shape)})")
    tokens = tokens.to(torch.long).cpu()
    mask = check_attention_mask(tokens, attention_mask)
    d_vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
    real = tokens[mask.bool()]
    if (real < 0).any() or (d_vocab and (real >= d_vocab).any()):
        raise InvalidInputError(
            f"token ids must lie in [0, {d_vocab}); got min {int(real.min())}, "
            f"max {int(real.max())}"
        )
    longest = int(mask.sum(1).max())
    if longest > _n_ctx(model):
        raise SequenceTooLongError(
            f"a sequence has {longest} real tokens, more than the model's context window "
            f"n_ctx={_n_ctx(model)}; cut it to at most {_n_ctx(model)} tokens"
        )
    first = tokens.gather(1, mask.argmax(1, keepdim=True)).flatten()
    bos_id = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    has_bos = (first == bos_id) if bos_id is not None else torch.zeros_like(first, dtype=torch.bool)
    bos: bool | None = bool(has_bos.all()) if has_bos.all() or not has_bos.any() else None
    return TokenBatch(
        tokens.clone(), mask, bos, f"token tensor {tuple(tokens.shape)} used as given"
    )


def to_token_batch(
    model: HookedModel,
    data: DataInput,
    *,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    bos: BosPolicy | bool = "auto",
    text_column: str = "text",
) -> TokenBatch:
    """Turn any supported input into a validated :class:`TokenBatch`.

    * ``TokenBatch``: used as is.
    * ``Int[Tensor, "batch pos"]`` token ids: used exactly as given (no BOS added), with an
      optional ``attention_mask`` (left or right padding); ``bos`` is recorded by looking at the
      first real token.
    * ``str`` / ``list[str]``: tokenized with the model's tokenizer without special tokens; a
      BOS is prepended per ``bos``; right-padded with a mask.
    * a path (``pathlib.Path``): a UTF-8 text file, cut into consecutive windows of
      ``min(n_ctx, 256)`` tokens.
    * a Hugging Face ``datasets.Dataset`` / ``IterableDataset``: every non-empty row of
      ``text_column`` is one text, exactly as a ``list[str]`` of them (read a batch of rows at
      a time and tokenized in batches; an ``IterableDataset`` is read to its end, so give a
      finite one, e.g. ``dataset.take(1000)``). To cut a dataset into ``n_seq`` windows of
      ``seq_len`` tokens, reading only what they need, use :func:`corpus_windows`.

    Args:
        model: Supplies the tokenizer, ``cfg.n_ctx``, ``cfg.d_vocab`` and the BOS default.
        data: The input, see above.
        attention_mask: ``[batch pos]`` 0/1 mask for token input only.
        bos: ``"auto"`` (``model.cfg.default_prepend_bos``), ``"always"`` or ``"never"``; for
            text input only.
        text_column: The dataset column that holds the text (datasets only).

    Returns:
        The validated batch (tokens and mask on the CPU).

    Raises:
        InvalidInputError: empty input, empty string, float tokens, ids outside the vocabulary,
            a mask of the wrong shape or with gaps, all-padding rows, a mask given with text, a
            dataset without ``text_column`` (the message lists its columns) or a dict of splits.
        SequenceTooLongError: a sequence longer than ``cfg.n_ctx``.
        MissingDependencyError: a dataset is given but ``datasets`` cannot be imported.

    Examples:
        >>> from datasets import Dataset
        >>> from homoglens import load_model, to_token_batch
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> rows = Dataset.from_dict({"body": ["The cat sat.", "A dog ran far away."]})
        >>> tuple(to_token_batch(model, rows, text_column="body").tokens.shape)
        (2, 7)
    """
    from homoglens.validate import check_model

    check_model(model)
    if isinstance(data, TokenBatch):
        _resolve_bos(model, bos)  # a bad policy is an error whatever the input
        if attention_mask is not None:
            raise InvalidInputError("a TokenBatch already carries its attention_mask")
        checked = _tensor_batch(model, data.tokens, data.attention_mask)
        return replace(checked, bos=data.bos, description=data.description)
    _resolve_bos(model, bos)  # validate the policy whatever the input
    if isinstance(data, torch.Tensor):
        return _tensor_batch(model, data, attention_mask)
    if attention_mask is not None:
        raise InvalidInputError(
            "attention_mask is only for token input; text is padded and masked by homoglens"
        )
    if isinstance(data, str):
        return _text_batch(model, [data], bos, "1 text")
    if isinstance(data, os.PathLike):
        return _file_batch(model, Path(data), bos)
    kind = _dataset_kind(data)
    if kind is not None:
        return _dataset_batch(model, data, kind, bos, text_column)
    if isinstance(data, (list, tuple)):
        if len(data) == 0:
            raise InvalidInputError("the list of texts is empty; give at least one text")
        return _text_batch(model, list(data), bos, f"{len(data)} texts")
    raise InvalidInputError(
        f"data of type {type(data).__name__} is not supported; give a str, a list of str, a text "
        "file path, an integer [batch pos] tensor of token ids, a TokenBatch, or a Hugging Face "
        "datasets.Dataset / IterableDataset with a text column"
    )


def right_aligned(
    tokens: Int[torch.Tensor, "batch pos"], attention_mask: Int[torch.Tensor, "batch pos"]
) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
    """Move every sequence's real tokens to the start of its row (right padding), trimmed.

    With right padding a causal model's real tokens never see a pad, so the activations at
    real positions do not depend on how a backend treats masks or position ids for left pads.

    Args:
        tokens: ``[batch pos]`` ids with a contiguous block of real tokens per row.
        attention_mask: ``[batch pos]`` 0/1.

    Returns:
        ``(tokens, attention_mask)`` of shape ``[batch max_len]``, real tokens first.
    """
    lengths = attention_mask.sum(1)
    starts = attention_mask.argmax(1)
    width = int(lengths.max())
    pos = torch.arange(width, device=tokens.device)
    index = (starts[:, None] + pos).clamp(max=tokens.shape[1] - 1)
    mask = (pos < lengths[:, None]).to(attention_mask.dtype)
    first_real = tokens.gather(1, starts[:, None])  # a valid id for the pads
    out = torch.where(mask.bool(), tokens.gather(1, index), first_real)
    return out, mask


def require_min_tokens(batch: TokenBatch, exclude_first: bool) -> None:
    need = 3 if exclude_first else 2
    short = torch.nonzero(batch.lengths < need).flatten().tolist()
    if short:
        raise InvalidInputError(
            f"sequences {short[:10]} have fewer than {need} tokens; homogenization compares "
            f"tokens with each other, so each sequence needs at least {need}"
            + (" (position 0 is excluded)" if exclude_first else "")
        )
