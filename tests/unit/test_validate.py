"""Unit tests of homoglens.core.validate: the argument checks every public function shares."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from homoglens import InvalidInputError
from homoglens.core.validate import (
    as_bool,
    as_float,
    as_int,
    check_attention_mask,
    check_heads,
    check_layers,
)


def test_layers_accept_ints_of_every_kind_and_sort_them() -> None:
    assert check_layers(None, 2) == (0, 1, 2)
    assert check_layers([2, np.int64(0)], 2) == (0, 2)
    assert check_layers(torch.tensor([1]), 2) == (1,)
    assert check_layers(1, 2) == (1,)


@pytest.mark.parametrize(
    ("layers", "match"),
    [([], "empty"), ([3], "out of range"), ([1, 1], "repeats"), ([0.5], "ints"), ("0", "ints")],
)
def test_bad_layers_say_what_is_wrong(layers, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        check_layers(layers, 2)


def test_scalars_refuse_lookalikes() -> None:
    assert as_int("n", np.int32(3), low=1) == 3
    for bad in (True, 2.0, "3"):
        with pytest.raises(InvalidInputError):
            as_int("n", bad)
    with pytest.raises(InvalidInputError, match=r"\[1, inf\]"):
        as_int("n", 0, low=1)
    assert as_bool("flag", np.bool_(True)) is True
    with pytest.raises(InvalidInputError):
        as_bool("flag", "yes")
    with pytest.raises(InvalidInputError):
        as_float("eps", float("nan"), low=0.0, high=1.0)


def test_attention_masks_must_be_contiguous_zeros_and_ones() -> None:
    tokens = torch.zeros(2, 4, dtype=torch.long)
    assert check_attention_mask(tokens, None).sum() == 8
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    assert torch.equal(check_attention_mask(tokens, left), left)
    for bad, match in (
        (torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]), "pads between"),
        (torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]), "all padding"),
        (torch.tensor([[2, 1, 1, 1], [1, 1, 1, 1]]), "only 0 and 1"),
        (torch.ones(3, 4), "shape"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            check_attention_mask(tokens, bad)


def test_heads_are_pairs_below_the_layer_bound() -> None:
    assert check_heads([(0, 1), [1, 0]], 2, 2) == [(0, 1), (1, 0)]
    for bad in ([(2, 0)], [(0, 2)], [(0, 0), (0, 0)], [], "0,1"):
        with pytest.raises(InvalidInputError):
            check_heads(bad, 2, 2)
