"""Token batches and the tokenizer primitives every input goes through.

A :class:`TokenBatch` holds tokens, an attention mask (1 = real token, 0 = pad), and whether
position 0 of each sequence holds a BOS token. The functions below tokenize text without special
tokens, apply the BOS policy and pack rows of token ids into a right-padded batch; the input
modules of this package (:mod:`homoglens.run.data.inputs`, :mod:`homoglens.run.data.hf_datasets`)
build on them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import torch
from jaxtyping import Int

from homoglens.core.errors import InvalidInputError, warn_user
from homoglens.core.types import BosPolicy, HookedModel

if TYPE_CHECKING:  # datasets is imported only when a dataset is given
    from datasets import Dataset, IterableDataset

__all__ = ["DataInput", "TokenBatch", "require_min_tokens", "right_aligned"]


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
``datasets.Dataset`` / ``IterableDataset`` with a text column (see
:func:`~homoglens.run.data.to_token_batch`)."""


# --------------------------------------------------------------------------- tokenizer


def tokenizer_of(model: HookedModel) -> Any:
    """The model's tokenizer, after checking the model.

    Raises:
        InvalidInputError: the model has none (the message says to pass token ids instead).
    """
    from homoglens.core.validate import check_model

    check_model(model)
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise InvalidInputError(
            "the model has no tokenizer, so text cannot be tokenized; pass token ids "
            "(an integer [batch pos] tensor) instead, or attach one with model.set_tokenizer(tok)"
        )
    return tok


def tokenizer_bos(model: HookedModel) -> int | None:
    """The BOS id of the model's tokenizer, or None (no tokenizer, or one without a BOS): the
    one place it is looked up."""
    found = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    return None if found is None else int(found)


def resolve_bos(model: HookedModel, bos: BosPolicy | bool) -> bool:
    """Whether a BOS is prepended under the policy ``bos`` (``"auto"``: the model's
    ``cfg.default_prepend_bos``).

    Raises:
        InvalidInputError: an unknown policy.
    """
    if bos is True or bos is False:
        return bool(bos)
    if bos == "auto":
        return bool(getattr(model.cfg, "default_prepend_bos", True))
    if bos == "always":
        return True
    if bos == "never":
        return False
    raise InvalidInputError(f"bos={bos!r} must be 'auto', 'always', 'never' or a bool")


def bos_prefix(model: HookedModel, bos: BosPolicy | bool) -> list[int]:
    """``[BOS id]`` if the policy prepends one, else ``[]``.

    Raises:
        InvalidInputError: a BOS is asked for but the tokenizer has none; an unknown policy.
    """
    if not resolve_bos(model, bos):
        return []
    bos_id = tokenizer_of(model).bos_token_id
    if bos_id is None:
        raise InvalidInputError(
            "a BOS token was requested but the tokenizer has none; use bos='never'"
        )
    return [int(bos_id)]


def encode(model: HookedModel, text: str, where: str = "the text") -> list[int]:
    """Token ids of ``text`` (no special tokens).

    Raises:
        InvalidInputError: the text is not valid Unicode (a lone surrogate); ``where`` names it.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate, e.g. from a bad decode upstream
        raise InvalidInputError(
            f"{where} holds {text[err.start : err.end]!r} at character {err.start}, which is not "
            "valid Unicode text (a lone surrogate); fix or drop it, e.g. "
            "text.encode('utf-8', 'replace').decode()"
        ) from None
    ids = list(tokenizer_of(model)(text, add_special_tokens=False)["input_ids"])
    _warn_inner_special(model, [ids])
    return ids


def _warn_inner_special(model: HookedModel, rows: list[list[int]]) -> None:
    """Warn when a text spells a special token after its first token: it is parsed as the
    token (as ``model.to_tokens`` and Hugging Face tokenizers do), so a literal
    ``<|endoftext|>`` inside a text becomes an EOT/BOS there, an attention sink mid-sequence."""
    special = set(getattr(tokenizer_of(model), "all_special_ids", None) or ())
    found = [i for i, row in enumerate(rows) if any(t in special for t in row[1:])]
    if found:
        warn_user(
            f"homoglens: {len(found)} text(s) (first: {found[0]}) spell a special token such as "
            "<|endoftext|> inside the text; it is tokenized as that token (as model.to_tokens "
            "does), which puts a BOS/EOT, an attention sink, mid-sequence. Remove or split such "
            "spellings from the text if they are not meant as tokens"
        )


def encode_many(model: HookedModel, texts: list[str], where: str) -> list[list[int]]:
    """Token ids of each text (no special tokens), tokenized in one batched call."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            encode(model, text, f"{where} (a text of batch row {i})")  # raises the typed error
    rows = [list(ids) for ids in tokenizer_of(model)(texts, add_special_tokens=False)["input_ids"]]
    _warn_inner_special(model, rows)
    return rows


def prefixed(row: list[int], prefix: list[int]) -> list[int]:
    """``prefix + row``, except that a row which already starts with the BOS gets no second one
    (as Hugging Face tokenizers do)."""
    return row if prefix and row[:1] == prefix else prefix + row


def recorded_bos(model: HookedModel, rows: list[list[int]]) -> bool | None:
    """Whether position 0 of every row holds the BOS id (None: some rows do, some do not),
    read from the tokens themselves, whatever the policy asked for."""
    tokenizer_of(model)  # text rows: the model has a tokenizer
    bos_id = tokenizer_bos(model)
    if bos_id is None:
        return False
    starts = [bool(row) and row[0] == bos_id for row in rows]
    return True if all(starts) else False if not any(starts) else None


def bos_label(bos: bool | None) -> str:
    """``"yes"``, ``"no"`` or ``"mixed"``: the BOS record as data descriptions spell it."""
    return {True: "yes", False: "no", None: "mixed"}[bos]


def n_ctx(model: HookedModel) -> int:
    """The model's context window, ``cfg.n_ctx``."""
    return int(model.cfg.n_ctx)


def packed(model: HookedModel, rows: list[list[int]], label: str) -> TokenBatch:
    """Right-padded ``[batch pos]`` tokens and mask of ``rows``, with their BOS record."""
    longest = max(len(row) for row in rows)
    tokens = torch.zeros(len(rows), longest, dtype=torch.long, device="cpu")
    mask = torch.zeros_like(tokens)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long, device="cpu")
        mask[i, : len(row)] = 1
    recorded = recorded_bos(model, rows)
    return TokenBatch(tokens, mask, recorded, f"{label}, bos={bos_label(recorded)}")


def full_windows(model: HookedModel, rows: list[list[int]], label: str) -> TokenBatch:
    """``[batch pos]`` tokens of ``rows`` (all of one length, every token real: the mask is all
    ones), with their BOS record; the description is ``label`` and the BOS record."""
    tokens = torch.tensor(rows, dtype=torch.long, device="cpu")
    recorded = recorded_bos(model, rows)
    return TokenBatch(
        tokens=tokens,
        attention_mask=torch.ones_like(tokens),
        bos=recorded,
        description=f"{label}, bos={bos_label(recorded)}",
    )


# --------------------------------------------------------------------------- batches


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


def require_min_tokens(batch: TokenBatch, exclude_first: bool, *, offset: int = 0) -> None:
    """Refuse sequences too short to compare tokens with each other: fewer than 2 tokens (3
    when position 0 is excluded).

    Args:
        batch: The sequences.
        exclude_first: Whether position 0 is left out of every statistic.
        offset: The index of the batch's first sequence in the whole data (for the message,
            when the batch is one part of a stream).

    Raises:
        InvalidInputError: names the short sequences (their indices in the whole data).
    """
    need = 3 if exclude_first else 2
    short = (torch.nonzero(batch.lengths < need).flatten() + offset).tolist()
    if short:
        raise InvalidInputError(
            f"sequences {short[:10]} have fewer than {need} tokens; homogenization compares "
            f"tokens with each other, so each sequence needs at least {need}"
            + (" (position 0 is excluded)" if exclude_first else "")
        )
