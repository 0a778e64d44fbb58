"""Typed errors raised by homoglens.

Every error subclasses :class:`HomoglensError` and the built-in exception that fits, so
``except ValueError`` keeps working for callers that do not know homoglens. Each message names
what was wrong and how to fix it.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

__all__ = [
    "DistributedError",
    "HomoglensError",
    "IncompatibleResultsError",
    "IncompleteModelFolderError",
    "InvalidInputError",
    "MissingDependencyError",
    "ModelFolderNotFoundError",
    "ModelStateError",
    "NonFiniteActivationError",
    "ResultWriteError",
    "ResultsNotFoundError",
    "SequenceTooLongError",
    "TrainingDivergedError",
    "UnknownModelError",
    "UnsupportedArchitectureError",
    "warn_user",
]


class HomoglensError(Exception):
    """Base class of every error homoglens raises on purpose."""


class InvalidInputError(HomoglensError, ValueError):
    """Input data (text, tokens, masks, options) is malformed: empty, wrong dtype or shape."""


class SequenceTooLongError(InvalidInputError):
    """A sequence has more tokens than the model's context window (``cfg.n_ctx``)."""


class UnknownModelError(HomoglensError, ValueError):
    """A model name is neither an embedded model, a local folder, nor a TransformerLens name."""


class ModelFolderNotFoundError(HomoglensError, FileNotFoundError):
    """A path given as a model does not exist or holds no Hugging Face ``config.json``."""


class IncompleteModelFolderError(InvalidInputError):
    """A model folder lacks tensors its architecture needs (a block, the final norm, the
    unembedding when it is not tied); Hugging Face would initialise them at random."""


class ModelStateError(InvalidInputError):
    """The model is not in a state a measurement can trust (a submodule in training mode)."""


class UnsupportedArchitectureError(HomoglensError, ValueError):
    """Not a decoder-only causal LM; or a feature that must know where position enters (a
    positional ablation) asked of a family outside homoglens' architecture table; or a backend
    that cannot load the family."""


class MissingDependencyError(HomoglensError, ImportError):
    """An optional package is needed for this call; the message gives the install command."""


class IncompatibleResultsError(HomoglensError, ValueError):
    """Result objects cannot be merged or loaded (different layers, model or settings)."""


class NonFiniteActivationError(HomoglensError, ArithmeticError):
    """The residual stream held NaN or inf at counted positions; nothing was averaged in."""


class TrainingDivergedError(NonFiniteActivationError):
    """Training stopped: a training loss, the weights or the held-out loss became NaN or inf
    (the learning rate is too high, or the warm-up too short); nothing was saved."""


class ResultsNotFoundError(HomoglensError, FileNotFoundError):
    """A results folder, or a file a saved result needs, does not exist."""


class ResultWriteError(HomoglensError, OSError):
    """A result could not be written (a full disk, no permission, a path too long): ``errno``
    is the failed write's; an older result in the folder is left as it was."""


class DistributedError(HomoglensError, RuntimeError):
    """A ``torch.distributed`` collective failed or the ranks disagree (another rank stopped with
    its own error, or the ranks were given different data)."""


_PACKAGE = str(Path(__file__).resolve().parents[1])


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn at the first frame outside homoglens: the user's line that called into it, however
    many homoglens frames lie between (a fixed ``stacklevel`` points into homoglens when a
    shared check is reached through a helper).

    Args:
        message: The warning's text.
        category: The warning class (``UserWarning`` by default).
    """
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
