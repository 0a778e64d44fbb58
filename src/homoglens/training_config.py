"""The configuration of a controlled retraining run (moved out of :mod:`homoglens.training`,
issue 40): :class:`TrainingConfig`, every field checked at construction, and the bounds it
checks against (:data:`POSITIONAL_VARIANTS`, :data:`MAX_N_CTX`, :data:`MAX_VOCAB_SIZE`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from homoglens.errors import InvalidInputError
from homoglens.validate import as_bool, as_float, as_int

PositionalVariant = Literal["learned", "rotary", "none"]
POSITIONAL_VARIANTS: tuple[str, ...] = ("learned", "rotary", "none")


_POSITIVE_FIELDS = (
    "n_layers",
    "d_model",
    "n_heads",
    "vocab_size",
    "steps",
    "batch_size",
    "threads",
)
_MAX_SEED = 2**64 - 1  # the largest seed torch.manual_seed takes
MAX_VOCAB_SIZE = 65_536
"""The largest ``TrainingConfig.vocab_size``: the byte-level BPE trainer allocates for the size
asked up front (10**9 aborts the process), while the Austen training split yields only about
27,000 distinct tokens (every pre-token merged whole), so a larger value trains the same
tokenizer."""
MAX_N_CTX = 4096
"""The largest ``TrainingConfig.n_ctx``: these are tiny controlled models trained on CPU, and
attention costs grow with n_ctx squared (a 100,000-token window runs for minutes per step)."""
_MAX_INTS = {"seed": _MAX_SEED, "vocab_size": MAX_VOCAB_SIZE, "n_ctx": MAX_N_CTX}


def _config_int(name: str, value: Any, low: int, high: int | None) -> int:
    """``value`` as a Python int in [low, high]; the error names the field and its range."""
    try:
        return as_int(name, value, low=low, high=high)
    except InvalidInputError:
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidInputError(
            f"TrainingConfig: {name}={value!r} must be an integer {allowed}{_WHY.get(name, '')}"
        ) from None


_WHY = {
    "vocab_size": (
        ": the Austen training split yields about 27,000 distinct tokens, and the tokenizer "
        "trainer allocates memory for the size asked"
    ),
    "n_ctx": (": these are tiny models trained on CPU, and attention grows with n_ctx squared"),
}


def _config_real(name: str, value: Any, *, strict: bool) -> float:
    """``value`` as a finite Python float, > 0 (``strict``) or >= 0; the error names the field,
    its value and the allowed range."""
    allowed = f"a finite number {'>' if strict else '>='} 0"
    try:
        number = as_float(name, value, low=-math.inf, high=math.inf)
    except (InvalidInputError, TypeError, ValueError, RuntimeError, OverflowError):
        number = math.nan
    if not math.isfinite(number) or number < 0 or (strict and number == 0):
        raise InvalidInputError(f"TrainingConfig: {name}={value!r} must be {allowed}")
    return number


@dataclass(frozen=True)
class TrainingConfig:
    """Everything that defines one training run (saved as ``training.json`` beside the model).

    Attributes:
        variant: ``"learned"``, ``"rotary"`` or ``"none"``.
        n_layers, d_model, n_heads: Model size (d_mlp = 4 d_model), integers >= 1; ``d_model``
            a multiple of ``n_heads`` (an even multiple for ``rotary``).
        n_ctx: Context length and training window length (tokens), in [2, 4096]
            (``MAX_N_CTX``: tiny models trained on CPU; attention grows with n_ctx squared).
        vocab_size: BPE vocabulary size (trained on the training split), in [260, 65536]
            (``MAX_VOCAB_SIZE``; the Austen training split yields about 27,000 distinct
            tokens, so a larger value trains the same tokenizer).
        steps: Optimiser steps, >= 1.
        batch_size: Windows per step, >= 1.
        lr: Peak learning rate (AdamW, linear warm-up then cosine decay to 10 %), finite, > 0.
        warmup: Warm-up steps, >= 0.
        weight_decay: AdamW weight decay (matrices only), finite, >= 0.
        seed: Seed of initialisation and data order, in [0, 2**64 - 1].
        threads: torch threads (results depend slightly on it), >= 1.
        bos: Start every training window with the same special token (``<|endoftext|>``, the
            tokenizer's BOS), followed by ``n_ctx - 1`` text tokens; attention sinks form
            around a fixed first token (Gu et al. 2024, arXiv 2410.10781; Barbero et al. 2025,
            arXiv 2504.02732). The held-out loss is then measured on windows that start with
            it too.

    Every field is checked at construction (and stored as a plain Python value).

    Raises:
        InvalidInputError: a field of the wrong type, NaN or inf, or outside its range; the
            message names the field, its value and what is allowed.
    """

    variant: str = "learned"
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_ctx: int = 128
    vocab_size: int = 4096
    steps: int = 3000
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 2
    bos: bool = False

    def __post_init__(self) -> None:
        """Check every field (type, finite, range) and store it as a plain Python value.

        Raises:
            InvalidInputError: a field of the wrong type, non-finite or out of its range (the
                message names the field, its value and what is allowed).
        """
        if not isinstance(self.variant, str) or self.variant not in POSITIONAL_VARIANTS:
            raise InvalidInputError(
                f"TrainingConfig: variant={self.variant!r} must be one of {POSITIONAL_VARIANTS}"
            )
        ints = {name: 1 for name in _POSITIVE_FIELDS} | {"n_ctx": 2, "warmup": 0, "seed": 0}
        ints["vocab_size"] = 260  # 256 bytes + specials
        for name, low in ints.items():
            high = _MAX_INTS.get(name)
            object.__setattr__(self, name, _config_int(name, getattr(self, name), low, high))
        object.__setattr__(self, "lr", _config_real("lr", self.lr, strict=True))
        object.__setattr__(
            self, "weight_decay", _config_real("weight_decay", self.weight_decay, strict=False)
        )
        try:
            object.__setattr__(self, "bos", as_bool("bos", self.bos))
        except InvalidInputError:
            raise InvalidInputError(
                f"TrainingConfig: bos={self.bos!r} must be True or False"
            ) from None
        if self.d_model % self.n_heads:
            raise InvalidInputError(
                f"TrainingConfig: d_model={self.d_model} must be a multiple of "
                f"n_heads={self.n_heads}; change one of them"
            )
        if self.variant == "rotary" and (self.d_model // self.n_heads) % 2:
            raise InvalidInputError(
                f"TrainingConfig: variant='rotary' rotates pairs of channels, so the head "
                f"width d_model / n_heads = {self.d_model}/{self.n_heads} must be even; change "
                "d_model or n_heads"
            )

    @property
    def name(self) -> str:
        """Folder name of the run: ``tiny-<variant>[-bos][-s<seed>]`` (seed 0 has no suffix)."""
        return (
            f"tiny-{self.variant}"
            + ("-bos" if self.bos else "")
            + (f"-s{self.seed}" if self.seed else "")
        )
