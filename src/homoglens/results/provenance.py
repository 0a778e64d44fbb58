"""Where a result came from (:class:`Provenance`), and the checks that decide which results a
``merge()`` may add up: the same model, weights, dtype and measurement, disjoint data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from homoglens.core.errors import IncompatibleResultsError


@dataclass(frozen=True)
class Provenance:
    """Where a result came from.

    Attributes:
        model: Model name or path.
        family: Architecture family (``gpt2``, ``neox``, ``llama``, ...; the Hugging Face
            architecture name for a family outside the table) or ``"none"``.
        backend: ``"hooked"``, ``"bridge"`` or ``"none"`` (computed from given activations).
        weights: ``"raw"``, ``"processed"`` (TransformerLens weight processing) or ``"unknown"``.
        dtype: Model dtype (statistics are always accumulated in float64).
        model_source: Extra model provenance (e.g. the embedded GGUF and its quantisation).
        hook_points: TransformerLens hook name of each entry of the layer axis.
        bos: Whether position 0 of every sequence held a BOS token (``None``: mixed).
        data: Description of the data.
        exclude_first: Whether position 0 was left out of every statistic.
        homoglens_version: Package version that computed the result.
        transformer_lens_version: TransformerLens version used (``""`` if none).
        torch_version: torch version used (``""`` if not recorded: results saved before it was).
        transformers_version: Hugging Face transformers version used (``""`` if not recorded).
        model_revision: The model's version: for a Hub name, the ``revision`` or training
            checkpoint asked for (``"revision step1000"``, ``"checkpoint_value 1000"``) and the
            commit of the cached snapshot when known (``"main @ 0123abcd..."``); ``""`` when not
            known (local folders: see ``model_source``).
        data_sha256: Content hash of the data measured: sha256 of the row lengths then the real
            token ids (pads left out), row by row, as little-endian int64 (``""`` if not
            recorded; merged parts join their hashes with ``" + "``).
        foreign_hooks: Hook points (or modules) that held hooks homoglens did not attach when
            the measurement began: they ran in every pass (an intervention's ``with`` block, a
            forgotten permanent hook); ``()`` for a clean model.
        data_rows: A fingerprint of each sequence measured (the first 8 bytes of the sha256
            of its length and real token ids, 16 hex digits each, concatenated; ``""`` if not
            recorded): ``merge`` refuses parts that share any sequence. Left out of ``repr``.
    """

    model: str = "none"
    family: str = "none"
    backend: str = "none"
    weights: str = "unknown"
    dtype: str = ""
    model_source: str = ""
    hook_points: tuple[str, ...] = ()
    bos: bool | None = None
    data: str = ""
    exclude_first: bool = False
    homoglens_version: str = ""
    transformer_lens_version: str = ""
    torch_version: str = ""
    transformers_version: str = ""
    model_revision: str = ""
    data_sha256: str = ""
    foreign_hooks: tuple[str, ...] = ()
    data_rows: str = field(default="", repr=False)


ROW_DIGITS = 16
"""Hex digits of one sequence's fingerprint in :attr:`Provenance.data_rows`."""


def merge_parts(parts: Sequence[Any], cls: type) -> Any:
    """Check the argument of a ``merge()``: a non-empty sequence of ``cls`` results; return
    the first (the merge then checks its own fields, then :func:`check_mergeable`).

    Raises:
        IncompatibleResultsError: no parts, or a part of another type.
    """
    if not parts:
        raise IncompatibleResultsError("merge() needs at least one result")
    wrong = [type(p).__name__ for p in parts if not isinstance(p, cls)]
    if wrong:
        raise IncompatibleResultsError(f"merge() takes {cls.__name__} objects, got {wrong}")
    return parts[0]


MERGE_PROVENANCE = (
    "model",
    "family",
    "backend",
    "weights",
    "dtype",
    "model_revision",
    "hook_points",
    "exclude_first",
    "foreign_hooks",
)
"""Provenance fields that every part of a ``merge()`` must share (the merged result carries the
first part's: parts of another model, checkpoint, dtype or weights would be mislabelled, and a
part measured inside an intervention, ``foreign_hooks``, mixed with clean ones would read as
clean)."""


def check_mergeable(parts: Sequence[Any], what: str) -> None:
    """Refuse parts that cannot be added up into one result: a different
    :data:`MERGE_PROVENANCE` field, or overlapping data: the same result object twice, the
    same ``provenance.data_sha256`` (split on ``" + "`` for merged parts; an empty hash is not
    recorded, and overlaps nothing), or any sequence in common (``provenance.data_rows``).

    Raises:
        IncompatibleResultsError: naming the field and both values, or the parts that overlap.
    """
    first = parts[0].provenance
    for i, part in enumerate(parts[1:], 1):
        for name in MERGE_PROVENANCE:
            a, b = getattr(first, name), getattr(part.provenance, name)
            given_parts = [
                k for k, p in ((0, first), (i, part.provenance)) if p.data.startswith("given ")
            ]
            if a != b and given_parts:
                given = given_parts[0]
                raise IncompatibleResultsError(
                    f"cannot merge {what} results: part {given} was computed from given "
                    "activations (from_cache / from_activations), which record no model "
                    f"(provenance.{name}: {a!r} vs {b!r}); merge it only with results computed "
                    "the same way, or measure every part with the model"
                )
            if a != b:
                raise IncompatibleResultsError(
                    f"cannot merge {what} results with different provenance.{name}: {a!r} "
                    f"(part 0) vs {b!r} (part {i}); merge only results of the same model, "
                    "checkpoint, weights and dtype measured the same way (the same hooks "
                    "attached), and compare the others side by side"
                )
    if len({part.provenance.bos for part in parts}) > 1:
        import warnings

        warnings.warn(
            f"homoglens: merging {what} parts with and without a BOS at position 0 (provenance."
            f"bos {[part.provenance.bos for part in parts]}): each position then averages BOS "
            "and text tokens alike, as one pass over the mixed data would; the result records "
            "bos=None. Merge parts measured with one bos= policy to keep position 0 one thing",
            UserWarning,
            stacklevel=3,
        )
    for i, part in enumerate(parts):
        for j in range(i):
            if parts[j] is part:
                raise IncompatibleResultsError(
                    f"cannot merge {what} results of overlapping data: parts {j} and {i} are the "
                    "same result; merging would count its sequences twice. Merge results of "
                    "disjoint data only"
                )
    seen: dict[str, int] = {}
    for i, part in enumerate(parts):
        for digest in str(part.provenance.data_sha256).split(" + "):
            digest = digest.strip()
            if not digest:
                continue  # not recorded
            if digest in seen:
                raise IncompatibleResultsError(
                    f"cannot merge {what} results of overlapping data: parts {seen[digest]} and "
                    f"{i} both hold data {digest[:24]}... (provenance.data_sha256); merging "
                    "would count those sequences twice (and pair tokens with their own copies in "
                    "the cross-sequence baseline). Merge results of disjoint data only"
                )
            seen[digest] = i
    owner: dict[str, int] = {}
    for i, part in enumerate(parts):
        rows = str(getattr(part.provenance, "data_rows", ""))
        mine = {rows[k : k + ROW_DIGITS] for k in range(0, len(rows), ROW_DIGITS)}
        shared = [row for row in mine if row in owner]
        if shared:
            raise IncompatibleResultsError(
                f"cannot merge {what} results of overlapping data: parts {owner[shared[0]]} and "
                f"{i} share {len(shared)} sequence(s) (provenance.data_rows); merging would "
                "count them twice. Merge results of disjoint data only"
            )
        owner.update(dict.fromkeys(mine, i))
