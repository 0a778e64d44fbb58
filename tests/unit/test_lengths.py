"""length_study: every shorter length read as a prefix of one pass equals a separate pass at
that length (float32, 1e-5), on both backends and every family of the table; bad input typed."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from helpers import BACKENDS, hook_count
from homoglens import (
    InvalidInputError,
    LengthStudy,
    SequenceTooLongError,
    length_study,
    load_model,
    positional_similarity,
)
from homoglens.similarity.maths import SIMILARITY_STATISTICS
from homoglens.testing import TINY_ARCHS, tiny_model_folder

LENGTHS = (12, 20, 32)
WINDOWS = torch.randint(0, 1000, (5, 32), generator=torch.Generator().manual_seed(1))
COMMON = {"edge_k": 2, "lags": (1, 3), "progress": False, "batch_size": 5}


@functools.cache
def _model(arch: str, backend: str):
    return load_model(tiny_model_folder(arch), backend=backend, device="cpu")


def _cases():
    return [
        pytest.param(a, b, id=f"{a}-{b}")
        for a in TINY_ARCHS
        for b in BACKENDS
        if b == "bridge" or a in ("gpt2", "neox", "llama")
    ]


@pytest.mark.parametrize(("arch", "backend"), _cases())
def test_a_separate_pass_at_each_length_equals_the_prefix(arch: str, backend: str) -> None:
    model = _model(arch, backend)
    before = hook_count(model)
    long = length_study(model, WINDOWS, lengths=LENGTHS, **COMMON)
    for t, length in enumerate(LENGTHS):
        alone = length_study(model, WINDOWS[:, :length], lengths=(length,), **COMMON)
        assert torch.allclose(long.statistics[t], alone.statistics[0], atol=1e-5), length
        assert torch.allclose(long.window_statistics[t], alone.window_statistics[0], atol=1e-5), (
            length
        )
        for name in ("to_first", "sp", "attention_entropy", "first_key_mass"):
            a, b = getattr(long, name)[..., :length], getattr(alone, name)
            assert torch.allclose(a, b, atol=1e-5, equal_nan=True), (name, length)
        a, b = long.lag_similarity[..., :length], alone.lag_similarity
        assert torch.allclose(a, b, atol=1e-5, equal_nan=True), length
    assert hook_count(model) == before


def test_the_longest_length_is_positional_similarity() -> None:
    model = _model("llama", BACKENDS[-1])
    study = length_study(model, WINDOWS, lengths=LENGTHS, **COMMON)
    # The study reads attention too: on the CPU its blocks' output comes from the rows it read
    # (eager arithmetic), the similarity's from SDPA: equal within float32 rounding.
    sim = positional_similarity(model, WINDOWS, edge_k=2, progress=False)
    assert torch.allclose(study.sp[:, sim.first_position :], sim.SP, atol=1e-6)
    assert torch.allclose(study.statistics[-1, :, 4], sim.homogenization, atol=1e-6)
    lag = torch.diagonal(sim.M, offset=-3, dim1=1, dim2=2)
    assert torch.allclose(study.lag_similarity[:, 1, 3:], lag, atol=1e-6)
    assert math.isnan(float(study.lag_similarity[0, 1, 2]))
    # attention: key-0 mass of query 0 is 1, the normalised entropy lies in [0, 1]
    assert torch.allclose(study.first_key_mass[:, 0], torch.ones(()).double())
    ent = study.attention_entropy[:, 1:]
    assert bool((ent >= -1e-9).all() and (ent <= 1 + 1e-6).all())


def test_pseudo_values_are_positional_similarity_s_kept_or_run_again(monkeypatch) -> None:
    """Issue 38, point 4: per length, the per-window values of the statistics that subtract C
    are positional_similarity's jackknife pseudo-values on the prefixes, from the kept unit
    vectors or from a second forward pass; without them C is held fixed."""
    import homoglens.lengths.measure as lengths

    model = _model("llama", BACKENDS[-1])
    study = length_study(model, WINDOWS, lengths=LENGTHS, **COMMON)
    assert study.pseudo_values
    for t, length in enumerate(LENGTHS):
        sim = positional_similarity(
            model, WINDOWS[:, :length], edge_k=2, centre=None, progress=False
        )
        for e, stat in enumerate(SIMILARITY_STATISTICS):
            got, want = study.window_statistics[t, ..., e], sim.per_window(stat)
            assert torch.allclose(got, want, rtol=0, atol=1e-6), (length, stat)
    monkeypatch.setattr(lengths, "ACTIVATION_CACHE_BYTES", 0)
    again = length_study(model, WINDOWS, lengths=LENGTHS, **COMMON)
    assert torch.allclose(again.window_statistics, study.window_statistics, rtol=0, atol=1e-6)
    held = length_study(model, WINDOWS, lengths=LENGTHS, pseudo_values=False, **COMMON)
    assert not held.pseudo_values
    assert torch.allclose(held.statistics, study.statistics, rtol=0, atol=1e-7)
    e = SIMILARITY_STATISTICS.index("homogenization")
    assert not torch.allclose(held.window_statistics[..., e], study.window_statistics[..., e])
    assert hook_count(model) == 0


def test_tables_save_load_plot(tmp_path) -> None:
    study = length_study(_model("gpt2", BACKENDS[-1]), WINDOWS, lengths=LENGTHS, **COMMON)
    frame = study.by_length("matched_last")
    assert list(frame.length) == list(LENGTHS) and frame.ci_low.notna().all()
    assert set(study.curve("lag").lag) == {1, 3}
    assert len(study.curve("first_key_mass", 0)) == 32
    assert len(study.to_pandas()) == len(LENGTHS) * 3 * 5
    study.save(tmp_path / "l")
    again = LengthStudy.load(tmp_path / "l")
    assert torch.equal(again.statistics, study.statistics) and again.lengths == LENGTHS
    import matplotlib

    matplotlib.use("Agg")
    assert study.plot().axes
    with pytest.raises(InvalidInputError, match="metric="):
        study.curve("nonsense")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lengths": (20, 12)}, InvalidInputError, "ascending"),
        ({"lengths": (12, 12)}, InvalidInputError, "ascending"),
        ({"lengths": ()}, InvalidInputError, "empty"),
        ({"lengths": "12"}, InvalidInputError, "list of integers"),
        ({"lengths": (12, 40)}, InvalidInputError, "fewer than the longest"),
        ({"lengths": (12, 4096)}, SequenceTooLongError, "n_ctx"),
        ({"lengths": (4, 12)}, InvalidInputError, "too short"),
        ({"lags": (0,)}, InvalidInputError, "lags"),
        ({"lags": (40,)}, InvalidInputError, "lags"),
    ],
)
def test_bad_input_is_typed(kwargs, error, match) -> None:
    model = _model("llama", BACKENDS[-1])
    with pytest.raises(error, match=match):
        length_study(model, WINDOWS, **{**COMMON, "lengths": LENGTHS, **kwargs})
    assert hook_count(model) == 0


def test_a_length_dependent_rope_is_refused(monkeypatch) -> None:
    from homoglens import UnsupportedArchitectureError

    model = _model("llama", "bridge")
    config = model.original_model.config
    monkeypatch.setattr(
        config, "rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, raising=False
    )
    with pytest.raises(UnsupportedArchitectureError, match="sequence length"):
        length_study(model, WINDOWS, lengths=LENGTHS, **COMMON)
