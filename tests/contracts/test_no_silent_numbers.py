"""Edges where a number used to come back without a word (hostile round 4, issue 39): missing
windows, p-values outside [0, 1], zero vectors, ablations that change nothing, a bootstrap block
too long for the windows. Each is now said (a warning) or refused (a typed error)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from helpers import BACKENDS
from homoglens import (
    InvalidInputError,
    ablated_positions,
    attention_bias_study,
    cosine_homogenization,
    position_ablation_study,
    similarity_from_activations,
)
from homoglens.core.stats import auto_block, estimate, holm, verdict


def _values(n: int = 40, seed: int = 0) -> torch.Tensor:
    return 0.1 + 0.01 * torch.randn(1, n, generator=torch.Generator().manual_seed(seed))


def test_a_nan_window_is_left_out_said_and_not_counted() -> None:
    values = _values()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        whole = estimate([values], block=1, n_boot=200)
    gapped = values.clone()
    gapped[0, 5] = math.nan
    with pytest.warns(UserWarning, match="1 of the 40 windows have no value"):
        est = estimate([gapped], block=1, n_boot=200)
    assert whole.n_windows == 40 and est.n_windows == 39
    kept = torch.cat([values[:, :5], values[:, 6:]], 1)
    assert est.value == pytest.approx(float(kept.double().mean()), abs=1e-12)


def test_a_window_missing_in_one_group_leaves_the_difference() -> None:
    a, b = _values(seed=1), _values(seed=2)
    a[0, 3] = math.nan
    with pytest.warns(UserWarning, match="1 of the 40 windows"):
        est = estimate([a, b], weights=[1, -1], block=1, n_boot=200)
    keep = torch.ones(40, dtype=torch.bool)
    keep[3] = False
    expected = float((a[0, keep] - b[0, keep]).double().mean())
    assert est.value == pytest.approx(expected, abs=1e-12) and est.n_windows == 39


def test_too_few_real_windows_give_nan() -> None:
    values = torch.full((1, 10), math.nan)
    values[0, :3] = torch.tensor([0.1, 0.2, 0.3])
    with pytest.warns(UserWarning):
        est = estimate([values])
    assert est.n_windows == 3 and math.isnan(est.se) and math.isnan(est.p)
    with pytest.raises(InvalidInputError, match="no value"):
        estimate([torch.full((1, 10), math.nan)])  # a seed without any value


def test_several_seeds_share_the_windows_left_out() -> None:
    """Round 5, S1: a window NaN in one seed is left out of every seed (they are paired)."""
    y = 0.2 + 0.1 * torch.randn(
        3, 40, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    gapped = y.clone()
    gapped[0, 5] = math.nan
    with pytest.warns(UserWarning, match="1 of the 40 windows"):
        est = estimate([gapped], block=1, n_boot=200)
    kept = torch.cat([y[:, :5], y[:, 6:]], 1)
    assert est.n_windows == 39 and est.value == pytest.approx(float(kept.mean()), abs=1e-12)
    lost = y.clone()
    lost[1] = math.nan
    with pytest.raises(InvalidInputError, match="seed 1 of group 0 has no value"):
        estimate([lost], resample_seeds=True)


@pytest.mark.parametrize(
    "groups",
    [np.zeros((1, 8)) + 0.1, torch.zeros(1, 8), "abc", {0: torch.zeros(1, 8)}, [[[0.1, 0.2]]]],
)
def test_groups_of_the_wrong_kind_are_typed(groups: object) -> None:
    if isinstance(groups, np.ndarray):  # a numpy array inside the list is taken
        with pytest.warns(UserWarning):
            estimate([groups])
        return
    with pytest.raises(InvalidInputError, match="group"):
        estimate(groups)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "windows",
    [
        torch.full((10, 40), 100),
        torch.zeros(10, 40),
        torch.zeros(40, dtype=torch.long),
        torch.zeros(0, 40, dtype=torch.long),
        torch.full((10, 40), -1),
        torch.zeros(10, 20, dtype=torch.long),
    ],
)
def test_bad_resample_tables_are_typed(windows: torch.Tensor) -> None:
    with pytest.raises(InvalidInputError, match="windows"):
        estimate([_values()], windows=windows)
    from homoglens.core.stats import resampled_means

    with pytest.raises(InvalidInputError, match="windows"):
        resampled_means(_values(), windows)


def test_resamples_without_spread_are_named_as_such() -> None:
    with pytest.warns(UserWarning, match="resamples show no spread"):
        est = estimate([_values()], windows=torch.zeros(200, 40, dtype=torch.long))
    assert math.isnan(est.se)


@pytest.mark.parametrize("scale", [1e300, 1e200])
def test_huge_values_are_typed_or_rescaled(scale: float) -> None:
    with pytest.raises(InvalidInputError, match="rescale"):
        estimate([_values().double() * scale])
    big = torch.randn(100, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert auto_block(big * scale) == auto_block(big)


@pytest.mark.parametrize("weights", [["abc"], [None], [1j], 1, ["1"], [math.nan], [math.inf]])
def test_bad_weights_are_typed(weights: object) -> None:
    with pytest.raises(InvalidInputError, match="weight"):
        estimate([_values()], weights=weights)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["0.1", None, torch.tensor([0.1, -0.1]), np.array([0.1, 0.2])])
def test_verdict_of_a_non_number_is_typed(value: object) -> None:
    with pytest.raises(InvalidInputError, match="value"):
        verdict(value, 0.01, 0.5, predicted=1)  # type: ignore[arg-type]


def test_verdict_with_a_nan_p_value_decides_nothing() -> None:
    """Round 5, S2."""
    assert verdict(0.001, math.nan, 0.001, predicted=1) == "inconclusive"
    assert verdict(0.1, 0.001, math.nan, predicted=1) == "inconclusive"
    with pytest.raises(InvalidInputError, match="infinite"):
        verdict(math.inf, 0.01, 0.9, predicted=1)


@pytest.mark.parametrize("p", [["0.1"], [True, False]])
def test_holm_refuses_what_is_not_a_p_value(p: list[object]) -> None:
    with pytest.raises(InvalidInputError, match="real number"):
        holm(p)  # type: ignore[arg-type]


def test_default_sesoi_inputs() -> None:
    from homoglens.core.stats import default_sesoi

    with pytest.raises(InvalidInputError, match="real number"):
        default_sesoi("0.1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="infinite"):
        default_sesoi(math.inf)
    assert default_sesoi(-0.05) == default_sesoi(0.05)


def test_one_window_is_said_and_too_many_resamples_refused() -> None:
    with pytest.warns(UserWarning, match="1 windows are too few"):
        estimate([torch.tensor([[0.3]])])
    with pytest.raises(InvalidInputError, match="GiB"):
        estimate([_values()], n_boot=10**12)
    with pytest.warns(UserWarning, match="bootstrap resamples give a noisy"):
        estimate([_values()], n_boot=2)


def test_infinite_values_are_refused() -> None:
    values = _values()
    values[0, 2] = math.inf
    with pytest.raises(InvalidInputError, match="inf"):
        estimate([values])
    with pytest.raises(InvalidInputError, match="inf"):
        auto_block(values)


@pytest.mark.parametrize("values", [torch.zeros(0), torch.full((12,), math.nan)])
def test_auto_block_refuses_no_values(values: torch.Tensor) -> None:
    with pytest.raises(InvalidInputError, match="none that is not NaN"):
        auto_block(values)


@pytest.mark.parametrize("p", [[0.01, 2.0], [-0.1, 0.2], [1.0000001]])
def test_holm_refuses_p_outside_the_unit_interval(p: list[float]) -> None:
    with pytest.raises(InvalidInputError, match=r"outside \[0, 1\]"):
        holm(p)


def test_holm_keeps_nan_as_no_test() -> None:
    adjusted = holm([0.01, math.nan, 0.02])
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.03)


def test_verdict_of_no_estimate_is_inconclusive() -> None:
    assert verdict(math.nan, 0.001, 0.5, predicted=1) == "inconclusive"
    assert verdict(math.nan, math.nan, math.nan, predicted=-1) == "inconclusive"
    assert verdict(0.2, 0.001, 0.9, predicted=-1) == "fails"  # a real result stays


@pytest.mark.parametrize(("p", "p_tost"), [(2.0, 0.5), (0.01, -1.0)])
def test_verdict_refuses_p_outside_the_unit_interval(p: float, p_tost: float) -> None:
    with pytest.raises(InvalidInputError, match="p-value in"):
        verdict(0.2, p, p_tost, predicted=1)


@pytest.mark.parametrize("alpha", [0.0, 1.5, math.nan])
def test_verdict_refuses_a_bad_alpha(alpha: float) -> None:
    with pytest.raises(InvalidInputError, match="alpha"):
        verdict(0.2, 0.01, 0.5, predicted=1, alpha=alpha)


def test_zero_vectors_are_said() -> None:
    with pytest.warns(UserWarning, match="exactly zero"):
        prof = cosine_homogenization(torch.zeros(2, 6, 8))
    assert float(prof.mean_pairwise.flatten()[0]) == 0.0  # the documented convention, now said
    resid = torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(0))
    resid[0, 2] = 0.0
    with pytest.warns(UserWarning, match="1 counted vectors are exactly zero"):
        cosine_homogenization(resid)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0]])  # masked out: nothing to say
    clean = torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(1))
    clean[0, 3:] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cosine_homogenization(clean, mask)


def test_an_ablation_beyond_the_sequence_is_said(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.randint(0, 1000, (2, 32), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=r"lie beyond these 32-token sequences"):
        with ablated_positions(model, "zero", positions=[100]):
            model(tokens)
    with warnings.catch_warnings():  # a position inside the sequence: nothing to say
        warnings.simplefilter("error")
        with ablated_positions(model, "zero", positions=[5, 100]):
            model(tokens)


def test_study_positions_given_as_an_array(get_model) -> None:
    """CI's failure at stop 46: a numpy array of positions in the study's beyond-check."""
    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.randint(0, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    study = position_ablation_study(
        model, tokens, modes=["zero"], positions=np.array([0, 1]), n_boot=10, progress=False
    )
    assert study.settings["positions"] == [0, 1]
    with pytest.raises(InvalidInputError, match="beyond every window"):
        position_ablation_study(
            model, tokens, modes=["zero"], positions=np.array([40]), progress=False
        )


def test_bias_study_says_a_lowered_block_once_and_records_it(get_model) -> None:
    model = get_model("llama", BACKENDS[-1])
    windows = torch.randint(0, 1000, (8, 12), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = attention_bias_study(
            model, windows, kind="first", strengths=[0.0, 1.0], block=100, edge_k=2, progress=False
        )
        study.to_pandas()
    said = [w for w in caught if "block=100" in str(w.message)]
    assert len(said) == 1 and "block=2" in str(said[0].message)
    assert study.block == 2


def test_negative_drop_dims_names_the_sign() -> None:
    resid = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(InvalidInputError, match="negative"):
        similarity_from_activations(resid, drop_dims=-1)


def _cached_profile(scale: float = 1.0):
    from homoglens import HomogenizationProfile

    x = torch.randn(4, 12, 8, generator=torch.Generator().manual_seed(0)) * scale
    return HomogenizationProfile.from_cache(
        {
            "blocks.0.hook_resid_pre": x,
            "blocks.0.hook_resid_post": x * 2 + 0.3,
            "blocks.1.hook_resid_post": x.roll(1, -1),
        }
    )


@pytest.mark.parametrize("layers", [[1, 1], True, "1", []])
def test_sel_refuses_what_load_would_refuse(layers: object, tmp_path) -> None:
    """Round 5, L1: sel([1, 1]) / sel(True) made a result that saved over a good one and then
    did not load."""
    profile = _cached_profile()
    sim = similarity_from_activations(torch.randn(2, 4, 12, 8), edge_k=2)
    for result in (profile, sim):
        with pytest.raises(InvalidInputError):
            result.sel(layers)  # type: ignore[arg-type]


def test_sel_takes_numpy_and_torch_integers() -> None:
    profile = _cached_profile()
    assert profile.sel(np.int64(1)).layers == (1,)
    assert profile.sel(torch.tensor(2)).layers == (2,)
    assert profile.sel(np.array([2, 0])).layers == (0, 2)


def test_save_through_a_link_keeps_the_link(tmp_path) -> None:
    """Round 5, L2: a save into a symlinked folder replaced the link by a new folder."""
    import os

    from homoglens import HomogenizationProfile

    old, new = _cached_profile(), _cached_profile(2.0)
    old.save(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    new.save(tmp_path / "link")
    assert os.path.islink(tmp_path / "link")
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]
    loaded = HomogenizationProfile.load(tmp_path / "real")
    assert torch.equal(loaded.norm_sum, new.norm_sum)


def test_load_of_no_path_is_typed() -> None:
    from homoglens import HomogenizationProfile, PositionAblationStudy

    for cls in (HomogenizationProfile, PositionAblationStudy):
        with pytest.raises(InvalidInputError, match="load\\(\\) needs a folder path"):
            cls.load(None)  # type: ignore[arg-type]


def test_massive_positions_beyond_the_sequence_are_said(get_model) -> None:
    from homoglens import ablated_massive_activations

    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="lie beyond these 16-token sequences"):
        with ablated_massive_activations(model, "zero", layer=1, dims=[3], positions=[50]):
            model(tokens)


def test_merge_that_drops_the_rank_metrics_says_so() -> None:
    from homoglens import HomogenizationProfile

    x = torch.randn(4, 12, 8, generator=torch.Generator().manual_seed(0))
    with_rank = cosine_homogenization(x[:2], effective_rank=True)
    without = cosine_homogenization(x[2:])
    with pytest.warns(UserWarning, match="rank metrics"):
        merged = HomogenizationProfile.merge(with_rank, without)
    assert merged.effective_rank_sum is None


def test_cosine_homogenization_says_duplicated_sequences() -> None:
    x = torch.randn(1, 12, 8, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="exact copies"):
        cosine_homogenization(torch.cat([x, x]))


def test_merge_refuses_a_part_measured_inside_an_intervention(get_model) -> None:
    """Round 6, S1: a part measured inside ablated_positions merged with a clean one read as
    clean (the merged provenance had no foreign hooks)."""
    from homoglens import HomogenizationProfile, IncompatibleResultsError, homogenization_profile

    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.randint(0, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    clean = homogenization_profile(model, tokens[:2], progress=False)
    with pytest.warns(UserWarning, match="did not attach"):
        with ablated_positions(model, "zero"):
            ablated = homogenization_profile(model, tokens[2:], progress=False)
    with pytest.raises(IncompatibleResultsError, match="foreign_hooks"):
        HomogenizationProfile.merge(clean, ablated)


@pytest.mark.parametrize("path", ["/", "/proc/homoglens-x", "a" * 300])
def test_save_where_it_cannot_write_is_typed(path: str, tmp_path, monkeypatch) -> None:
    """Round 6, R1/R2: pathlib's ValueError and bare OSErrors."""
    from homoglens import HomoglensError, ResultWriteError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(HomoglensError, match="cannot save into") as caught:
        _cached_profile().save(path)
    if path != "/":  # a failed write: an OSError with its errno, and a homoglens error
        assert isinstance(caught.value, ResultWriteError) and caught.value.errno


def test_save_into_the_working_directory_keeps_it(tmp_path, monkeypatch) -> None:
    import os

    from homoglens import HomogenizationProfile

    (tmp_path / "mine.txt").write_text("keep")
    monkeypatch.chdir(tmp_path)
    _cached_profile().save(".")
    assert os.getcwd() == str(tmp_path) and (tmp_path / "mine.txt").read_text() == "keep"
    assert HomogenizationProfile.load(".").n_sequences == 4


def test_round_7_edges() -> None:
    """Round 7: holm of a 0-d array typed; one window of given activations said."""
    with pytest.raises(InvalidInputError, match="sequence of p-values"):
        holm(np.array(0.2))  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="one window"):
        similarity_from_activations(torch.randn(1, 10, 8), edge_k=2)


def test_a_shift_of_zero_is_said(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    tokens = torch.randint(0, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="shift=0 moves no position"):
        position_ablation_study(model, tokens, modes=["shift"], shift=0, n_boot=200, progress=False)


def test_calibrated_readings_of_one_window_names_the_fix(get_model) -> None:
    """Round 7, U2: one window was refused in terms of seeds and groups."""
    from homoglens import calibrated_readings

    model = get_model("gpt2", BACKENDS[-1])
    one = torch.randint(0, 1000, (1, 40), generator=torch.Generator().manual_seed(0))
    with pytest.raises(InvalidInputError, match="at least 2 windows"):
        calibrated_readings(model, one, edge_k=2, progress=False)
