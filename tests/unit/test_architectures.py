"""Unit tests of homoglens.models.architectures: the family table and the hook names it builds."""

from __future__ import annotations

import numpy as np
import pytest

from homoglens import (
    InvalidInputError,
    resid_hook_name,
)


def test_resid_hook_name_validates():
    assert resid_hook_name(np.int64(2)) == "blocks.1.hook_resid_post"
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidInputError):
            resid_hook_name(bad)
