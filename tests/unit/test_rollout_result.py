"""Unit tests of ``AttentionRollout``: fields checked, save/load, tables, both figure backends."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from homoglens import AttentionRollout, attention_rollout
from homoglens.core.errors import IncompatibleResultsError
from homoglens.results.validation import FieldError


@pytest.fixture(scope="module")
def rollout(get_model) -> AttentionRollout:
    tokens = torch.randint(0, 1000, (6, 10), generator=torch.Generator().manual_seed(1))
    return attention_rollout(get_model("gpt2", "bridge"), tokens, first_k=2, progress=False)


def test_round_trip_tables_and_repr(rollout, tmp_path) -> None:
    loaded = AttentionRollout.load(rollout.save(tmp_path / "r"))
    for name in ("received", "window_first_k", "null_received", "null_first_k"):
        assert torch.equal(getattr(loaded, name), getattr(rollout, name))
    assert (loaded.blocks, loaded.first_k, loaded.residual) == ((0, 1), 2, True)
    frame = rollout.to_pandas()
    assert list(frame.columns) == ["block", "depth", "key_pos", "received", "null"]
    assert len(frame) == 2 * 10
    table = rollout.first_k_table(n_boot=50)
    assert table["depth"].tolist() == [1, 2]
    assert bool((table["ci_low"] <= table["first_k_mass"]).all())
    assert "first 2 keys" in repr(rollout)


def test_both_backends_draw(rollout) -> None:
    pytest.importorskip("plotly")
    fig = rollout.plot()
    assert len(fig.axes) == 2
    assert len(rollout.plot(backend="plotly").data) > 0


def test_bad_fields_are_refused(rollout, tmp_path) -> None:
    fields = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout)}
    with pytest.raises(FieldError, match="window_first_k"):
        AttentionRollout(**{**fields, "window_first_k": rollout.window_first_k[:2]})
    with pytest.raises(FieldError, match="first_k"):
        AttentionRollout(**{**fields, "first_k": 11})
    with pytest.raises(FieldError, match="blocks"):
        AttentionRollout(**{**fields, "blocks": (1, 0)})
    bad = AttentionRollout(**{**fields, "null_first_k": rollout.null_first_k + 2.0})
    with pytest.raises(IncompatibleResultsError, match="null_first_k"):
        AttentionRollout.load(bad.save(tmp_path / "bad"))
