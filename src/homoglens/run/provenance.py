"""The provenance of a measurement and the fingerprints of its data (moved out of
:mod:`homoglens.run.engine`, issue 40): :func:`provenance_of` fills a
:class:`~homoglens.results.Provenance` with the model, the data and the versions, and the
token hashes (:func:`token_sha256`, :func:`token_rows`) let merges see overlapping data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from homoglens.models.architectures import resid_hook_name
from homoglens.models.assets import package_version
from homoglens.results import Provenance
from homoglens.results.provenance import ROW_DIGITS
from homoglens.run.data import TokenBatch

_INFO_FIELDS = {
    "model": "name",
    "family": "family",
    "backend": "backend",
    "weights": "weights",
    "dtype": "dtype",
    "model_source": "source",
    "model_revision": "revision",
    "foreign_hooks": "hooks",
}
"""The fields of a :class:`~homoglens.results.Provenance` that copy a ``model_info``: each
field's attribute there."""


def provenance_of(
    info: Any, batch: TokenBatch, chosen: Sequence[int], exclude_first: bool
) -> Provenance:
    """The :class:`~homoglens.results.Provenance` of a measurement of ``model_info`` ``info``
    on ``batch`` at the residual-axis entries ``chosen``: the model, the data and its
    :func:`token_sha256`, and the homoglens, TransformerLens, torch and transformers versions."""
    return Provenance(
        **{field: getattr(info, name) for field, name in _INFO_FIELDS.items()},
        hook_points=tuple(resid_hook_name(layer) for layer in chosen),
        bos=batch.bos,
        data=batch.description,
        exclude_first=exclude_first,
        homoglens_version=package_version("homoglens"),
        transformer_lens_version=package_version("transformer-lens"),
        torch_version=torch.__version__,
        transformers_version=package_version("transformers"),
        data_sha256=token_sha256(batch),
        data_rows=token_rows(batch),
    )


def token_sha256(batch: TokenBatch) -> str:
    """The content hash of a batch's tokens: sha256 over the rows in order, each row its
    length and then its real token ids (pads left out, so the padding side and pad ids do not
    matter), as little-endian int64. The same tokens streamed from a dataset hash the same
    (``DatasetStream.sha256``), so merges see overlapping data
    whichever way it was given.

    Examples:
        >>> import torch
        >>> from homoglens.run.data import TokenBatch
        >>> ids = torch.tensor([[5, 6, 7]])
        >>> batch = TokenBatch(ids, torch.ones_like(ids), bos=False, description="ids")
        >>> len(token_sha256(batch))
        64
    """
    import hashlib

    digest = hashlib.sha256()
    for row in row_bytes(batch):
        digest.update(row)
    return digest.hexdigest()


def row_bytes(batch: TokenBatch) -> Iterator[bytes]:
    """Each sequence of ``batch`` as the bytes its hashes read: its length, then its real
    token ids (pads left out), as little-endian int64."""
    import numpy as np

    mask = batch.attention_mask.detach().cpu().bool()
    tokens = batch.tokens.detach().cpu().long()
    for row, keep in zip(tokens, mask, strict=True):
        real = row[keep].numpy().astype("<i8")
        yield np.asarray([len(real)], dtype="<i8").tobytes() + real.tobytes()


def row_fingerprint(row: bytes) -> str:
    """The fingerprint of one sequence in ``Provenance.data_rows``: the first 8 bytes of the
    sha256 of its :func:`row_bytes`, as 16 hex digits."""
    import hashlib

    return hashlib.sha256(row).hexdigest()[:ROW_DIGITS]


def token_rows(batch: TokenBatch) -> str:
    """``Provenance.data_rows`` of ``batch``: the fingerprint of each sequence, in order."""
    return "".join(row_fingerprint(row) for row in row_bytes(batch))
