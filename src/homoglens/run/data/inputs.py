"""Every input a measurement takes, made into a :class:`~homoglens.run.data.TokenBatch`: the
vendored corpora, corpus windows, texts, text files, token ids and Hugging Face datasets."""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import replace
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int

from homoglens.core.errors import InvalidInputError, SequenceTooLongError, warn_user
from homoglens.core.types import BosPolicy, HookedModel
from homoglens.core.validate import as_int, check_attention_mask
from homoglens.run.data.batch import (
    DataInput,
    TokenBatch,
    bos_prefix,
    encode,
    full_windows,
    n_ctx,
    packed,
    prefixed,
    resolve_bos,
    tokenizer_bos,
)
from homoglens.run.data.hf_datasets import dataset_batch, dataset_kind, dataset_windows

if TYPE_CHECKING:  # datasets is imported only when a dataset is given
    from datasets import Dataset, IterableDataset

__all__ = [
    "CORPORA",
    "HELD_OUT",
    "corpus_windows",
    "load_corpus",
    "split_austen",
    "to_token_batch",
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


# --------------------------------------------------------------------------- corpora


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
    from homoglens.core.validate import check_model

    check_model(model)
    n_seq = as_int("n_seq", n_seq, low=1)
    seq_len = as_int("seq_len", seq_len, low=2)
    if seq_len > n_ctx(model):
        raise SequenceTooLongError(
            f"seq_len={seq_len} exceeds the model's context window n_ctx={n_ctx(model)}; "
            f"use seq_len <= {n_ctx(model)}"
        )
    kind = dataset_kind(corpus)
    if kind is not None:
        prefix = bos_prefix(model, bos)
        return dataset_windows(model, corpus, kind, n_seq, seq_len, prefix, text_column)
    if isinstance(corpus, os.PathLike) or (
        isinstance(corpus, str) and corpus not in CORPORA and Path(corpus).is_file()
    ):
        path = Path(corpus)
        _check_text_file(path)
        text = _read_text(path)
        label = f"text file {path.name}"
    else:
        text = load_corpus(str(corpus))
        label = f"corpus {corpus}"
    if not text.strip():
        raise InvalidInputError(f"{label} is empty; give a file with some text")
    prefix = bos_prefix(model, bos)
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
        ids = encode(model, text[start:end], f"{label} (window {i})")
        if prefix and ids[:1] == prefix:  # the stretch starts with the BOS itself
            ids = ids[1:]
        if len(ids) < content:
            raise InvalidInputError(
                f"{label} is too small for n_seq={n_seq} windows of seq_len={seq_len} tokens "
                f"(window {i} found only {len(ids)} tokens); lower n_seq or seq_len"
            )
        rows.append(prefix + ids[:content])
    return full_windows(model, rows, f"{label}: {n_seq} windows x {seq_len} tokens, evenly spaced")


# --------------------------------------------------------------------------- generic input


def _text_batch(
    model: HookedModel, texts: list[str], bos: BosPolicy | bool, label: str
) -> TokenBatch:
    prefix = bos_prefix(model, bos)
    rows = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"text {i} is a {type(text).__name__}, not a str")
        if not text.strip():
            raise InvalidInputError(f"text {i} is empty; every text needs at least one token")
        rows.append(prefixed(encode(model, text, f"text {i}"), prefix))
    longest = max(len(r) for r in rows)
    if longest > n_ctx(model):
        worst = max(range(len(rows)), key=lambda i: len(rows[i]))
        raise SequenceTooLongError(
            f"text {worst} has {longest} tokens (BOS included), more than the model's context "
            f"window n_ctx={n_ctx(model)}; shorten it or cut it with corpus_windows()"
        )
    return packed(model, rows, label)


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


def _check_text_file(path: Path) -> None:
    """Refuse a path that is no text file, saying what it is instead."""
    if path.is_dir():
        raise InvalidInputError(
            f"text file {str(path)!r} is a folder; give the path of a UTF-8 text file in it"
        )
    if path.exists() and not path.is_file():
        raise InvalidInputError(
            f"text file {str(path)!r} is not a regular file (a device, pipe or socket); give "
            "the path of a UTF-8 text file"
        )
    if not path.is_file():
        raise InvalidInputError(f"text file {str(path)!r} does not exist")


def _file_batch(
    model: HookedModel, path: Path, bos: BosPolicy | bool, n_seq: int | None = None
) -> TokenBatch:
    _check_text_file(path)
    text = _read_text(path)
    if not text.strip():
        raise InvalidInputError(f"text file {str(path)!r} is empty")
    prefix = bos_prefix(model, bos)
    ids = encode(model, text, f"text file {path.name}")
    if prefix and ids[:1] == prefix:  # the file starts with the BOS itself
        ids = ids[1:]
    width = min(n_ctx(model), 256) - len(prefix)
    chunks = [ids[i : i + width] for i in range(0, len(ids), width)]
    if len(chunks) > 1 and len(chunks[-1]) < width:
        chunks.pop()  # equal-length windows; the tail shorter than a window is dropped
    chunks = chunks[:n_seq]
    label = f"text file {path.name}: {len(chunks)} consecutive windows"
    return packed(model, [prefix + chunk for chunk in chunks], label)


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
    if longest > n_ctx(model):
        raise SequenceTooLongError(
            f"a sequence has {longest} real tokens, more than the model's context window "
            f"n_ctx={n_ctx(model)}; cut it to at most {n_ctx(model)} tokens"
        )
    first = tokens.gather(1, mask.argmax(1, keepdim=True)).flatten()
    bos_id = tokenizer_bos(model)
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
    n_seq: int | None = None,
) -> TokenBatch:
    """Turn any supported input into a validated :class:`TokenBatch`.

    * ``TokenBatch``: used as is.
    * ``Int[Tensor, "batch pos"]`` token ids: used exactly as given (no BOS added), with an
      optional ``attention_mask`` (left or right padding); ``bos`` is recorded by looking at the
      first real token.
    * ``str`` / ``list[str]``: tokenized with the model's tokenizer without special tokens
      (a special token spelled in a text, such as ``<|endoftext|>``, is parsed as the token,
      as ``model.to_tokens`` does, with a warning when it is not the first token); a BOS is
      prepended per ``bos``; right-padded with a mask.
    * a path (``pathlib.Path``): a UTF-8 text file, cut into consecutive windows of
      ``min(n_ctx, 256)`` tokens.
    * a Hugging Face ``datasets.Dataset`` / ``IterableDataset``: every non-empty row of
      ``text_column`` is one text, exactly as a ``list[str]`` of them (read a batch of rows at
      a time and tokenized in batches). An ``IterableDataset`` may never end, so it needs
      ``n_seq`` (reading stops after that many texts); ``homogenization_profile`` streams one
      with flat memory instead of holding its tokens. To cut a dataset into ``n_seq`` windows
      of ``seq_len`` tokens, reading only what they need, use :func:`corpus_windows`.

    Args:
        model: Supplies the tokenizer, ``cfg.n_ctx``, ``cfg.d_vocab`` and the BOS default.
        data: The input, see above.
        attention_mask: ``[batch pos]`` 0/1 mask for token input only.
        bos: ``"auto"`` (``model.cfg.default_prepend_bos``), ``"always"`` or ``"never"``; for
            text input only.
        text_column: The dataset column that holds the text (datasets only).
        n_seq: Keep only the first ``n_seq`` sequences (texts, rows, token rows or text-file
            windows); a dataset is read only that far. Required for an ``IterableDataset``.

    Returns:
        The validated batch (tokens and mask on the CPU).

    Raises:
        InvalidInputError: empty input, empty string, float tokens, ids outside the vocabulary,
            a mask of the wrong shape or with gaps, all-padding rows, a mask given with text, a
            dataset without ``text_column`` (the message lists its columns), a dict of splits,
            an ``IterableDataset`` without ``n_seq``, or ``n_seq`` below 1.
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
    from homoglens.core.validate import check_model

    check_model(model)
    resolve_bos(model, bos)  # a bad policy is an error whatever the input
    bound = None if n_seq is None else as_int("n_seq", n_seq, low=1)
    if isinstance(data, TokenBatch):
        if attention_mask is not None:
            raise InvalidInputError("a TokenBatch already carries its attention_mask")
        given = data if bound is None or len(data) <= bound else data[:bound]
        checked = _tensor_batch(model, given.tokens, given.attention_mask)
        first = "" if given is data else f", first {bound}"
        return replace(checked, bos=data.bos, description=data.description + first)
    if isinstance(data, torch.Tensor):
        if bos != "auto":  # asked for, and it cannot happen: said
            warn_user(
                f"homoglens: bos={bos!r} has no effect on token ids, which are used exactly as "
                "given (no BOS added or removed); prepend the BOS id yourself, or pass text"
            )
        if bound is not None and data.ndim == 2:
            data = data[:bound]
            attention_mask = attention_mask if attention_mask is None else attention_mask[:bound]
        return _tensor_batch(model, data, attention_mask)
    if attention_mask is not None:
        raise InvalidInputError(
            "attention_mask is only for token input; text is padded and masked by homoglens"
        )
    if isinstance(data, str):
        return _text_batch(model, [data], bos, "1 text")
    if isinstance(data, os.PathLike):
        return _file_batch(model, Path(data), bos, bound)
    kind = dataset_kind(data)
    if kind is not None:
        return dataset_batch(model, data, kind, bos, text_column, bound)
    if isinstance(data, (list, tuple)):
        if len(data) == 0:
            raise InvalidInputError("the list of texts is empty; give at least one text")
        texts = list(data)[:bound]
        return _text_batch(model, texts, bos, f"{len(texts)} texts")
    raise InvalidInputError(
        f"data of type {type(data).__name__} is not supported; give a str, a list of str, a text "
        "file path, an integer [batch pos] tensor of token ids, a TokenBatch, or a Hugging Face "
        "datasets.Dataset / IterableDataset with a text column"
    )
