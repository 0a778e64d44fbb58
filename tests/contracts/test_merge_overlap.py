"""Merges refuse parts that share any sequence, not only identical data (hostile round 2,
finding S5); parts with and without BOS merge as one mixed pass would (finding S6)."""

from __future__ import annotations

import warnings

import pytest

from helpers import BACKENDS
from homoglens import HomogenizationProfile, homogenization_profile, load_model
from homoglens.core.errors import IncompatibleResultsError
from homoglens.testing import tiny_model_folder

TEXTS = ["The cat sat on the mat today.", "A quick brown fox.", "Hello there friend.", "Four five"]


def _profile(model, texts, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return homogenization_profile(model, texts, progress=False, **options)


@pytest.fixture(scope="module")
def model():
    return load_model(tiny_model_folder("gpt2"), backend=BACKENDS[-1])


def test_a_part_holding_some_of_anothers_sequences_is_refused(model) -> None:
    full, some = _profile(model, TEXTS), _profile(model, TEXTS[1:3])
    with pytest.raises(IncompatibleResultsError, match="share 2 sequence"):
        HomogenizationProfile.merge(full, some)
    merged = HomogenizationProfile.merge(_profile(model, TEXTS[:2]), _profile(model, TEXTS[2:]))
    assert merged.provenance.data_rows == full.provenance.data_rows
    assert "data_rows" not in repr(merged.provenance)
    with pytest.raises(IncompatibleResultsError, match="share 1 sequence"):
        HomogenizationProfile.merge(merged, _profile(model, TEXTS[3:]))


def test_the_same_texts_as_a_streamed_dataset_overlap_too(model) -> None:
    datasets = pytest.importorskip("datasets")
    streamed = _profile(model, datasets.Dataset.from_dict({"text": TEXTS[:3]}), n_seq=3)
    with pytest.raises(IncompatibleResultsError, match="share 1 sequence"):
        HomogenizationProfile.merge(streamed, _profile(model, TEXTS[2:]))


def test_parts_with_and_without_bos_merge_as_one_mixed_pass(model) -> None:
    """Not refused: the merge equals one pass over the union (a mixed batch) and records
    ``bos=None``, as that pass does; a warning says so."""
    import torch

    with_bos, without = _profile(model, TEXTS[:2]), _profile(model, TEXTS[2:], bos="never")
    with pytest.warns(UserWarning, match="with and without a BOS"):
        merged = HomogenizationProfile.merge(with_bos, without)
    assert merged.provenance.bos is None and with_bos.provenance.bos is True
    tokens = [
        t.tolist() for t in _ids(model, TEXTS[:2], "always") + _ids(model, TEXTS[2:], "never")
    ]
    width = max(map(len, tokens))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in tokens])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in tokens])
    whole = _profile(model, ids, attention_mask=mask)
    assert whole.provenance.bos is None
    torch.testing.assert_close(merged.to_others, whole.to_others, atol=1e-6, rtol=0, equal_nan=True)


def _ids(model, texts, bos):
    from homoglens import to_token_batch

    batch = to_token_batch(model, texts, bos=bos)
    return [row[mask.bool()] for row, mask in zip(batch.tokens, batch.attention_mask, strict=True)]


def test_fingerprints_survive_save_and_load(model, tmp_path) -> None:
    part = _profile(model, TEXTS[:2])
    part.save(tmp_path / "p")
    loaded = HomogenizationProfile.load(tmp_path / "p")
    assert loaded.provenance.data_rows == part.provenance.data_rows
    assert len(part.provenance.data_rows) == 2 * 16
    with pytest.raises(IncompatibleResultsError, match="overlapping"):
        HomogenizationProfile.merge(loaded, _profile(model, TEXTS[1:]))


def test_a_result_from_a_cache_merged_with_a_measured_one_says_why_not(model) -> None:
    _, cache = model.run_with_cache(model.to_tokens(TEXTS[:2]))
    cached = HomogenizationProfile.from_cache(cache)
    with pytest.raises(IncompatibleResultsError, match="computed from given activations"):
        HomogenizationProfile.merge(cached, _profile(model, TEXTS[2:]))


def test_sel_and_layers_give_the_same_ascending_order(model) -> None:
    import numpy as np

    prof = _profile(model, TEXTS, layers=[2, 0])
    assert prof.layers == (0, 2) and prof.sel([2, 0]).layers == (0, 2)
    assert prof.edge_summary(k=np.int64(1)).shape[0] == 2  # numpy integers are integers
