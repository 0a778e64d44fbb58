"""Result objects: frozen dataclasses of CPU tensors with provenance, tidy export, plots, I/O.

One file per result family, one save/load implementation (:mod:`homoglens.results.base`):
safetensors + JSON with a format tag, exact keys, dtypes, shapes, ranges and cross-field
invariants checked on load; nothing is ever pickled.

A :class:`HomogenizationProfile` keeps the *sufficient statistics* of a corpus (sums and
counts) and derives every reported value from them, so profiles of any split of a corpus
merge by addition (:meth:`HomogenizationProfile.merge`) into exactly the one-pass result.
"""

from homoglens.results.base import SavedResult, load_result, save_result
from homoglens.results.provenance import Provenance
from homoglens.results.storage import prepare_folder, read_saved
from homoglens.results.validation import validate_result

__all__ = [
    "Provenance",
    "SavedResult",
    "load_result",
    "prepare_folder",
    "read_saved",
    "save_result",
    "validate_result",
]
