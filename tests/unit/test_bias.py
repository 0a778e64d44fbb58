"""attention_bias_study: the unbiased strength is the unhooked run bit for bit, the manipulation
checks move as they must, the slope at zero agrees with forward-mode autograd, the result
round-trips, bad input is typed and leaves no hook."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from helpers import BACKENDS, eager_attention, hook_count, state_hash
from homoglens import (
    AttentionBiasStudy,
    InvalidInputError,
    attention_bias_study,
    load_model,
    positional_similarity,
)
from homoglens.run.losses import next_token_loss
from homoglens.similarity.maths import SIMILARITY_STATISTICS
from homoglens.testing import tiny_model_folder

WINDOWS = torch.randint(0, 1000, (6, 20), generator=torch.Generator().manual_seed(0))
COMMON = {"edge_k": 4, "progress": False, "batch_size": 4}


@functools.cache
def _model(arch: str = "llama", backend: str = BACKENDS[-1], f64: bool = False):
    model = load_model(tiny_model_folder(arch), backend=backend, device="cpu")
    return model.to(torch.float64) if f64 else model


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_strength_zero_is_the_unhooked_run_bit_for_bit(arch: str, backend: str) -> None:
    """On the eager pattern (the study's path where the attention function cannot serve the
    model) the baseline leaves the pattern as it is: the unhooked eager run, bit for bit (its
    loss); its readouts, taken without [pos pos] matrices, are positional_similarity's within
    float32 rounding of the Gram products."""
    model = _model(arch, backend)
    with eager_attention():
        study = attention_bias_study(
            model, WINDOWS, kind="first", strengths=[-1.0, 0.0, 1.0], **COMMON
        )
    base = study.strengths.index(0.0)
    with torch.inference_mode():
        logits = model(WINDOWS)
    loss = next_token_loss(logits, WINDOWS, torch.ones_like(WINDOWS)).double()
    assert torch.equal(study.window_loss[base], loss)
    with eager_attention():
        sim = positional_similarity(model, WINDOWS, centre=None, **COMMON)
    for e, stat in enumerate(SIMILARITY_STATISTICS):  # jackknife pseudo-values, both
        got, want = study.window_statistics[base, ..., e], sim.per_window(stat)
        assert torch.allclose(got, want, rtol=0, atol=5e-7), stat
    assert study.window_sp is not None
    for j, stat in enumerate(("sp_first", "sp_last")):
        got, want = study.window_sp[base, ..., j], sim.per_window(stat)
        assert torch.allclose(got, want, rtol=0, atol=5e-7), stat
    assert torch.allclose(study.sp[base], sim.SP, rtol=0, atol=5e-7)
    assert torch.allclose(study.to_first[base], sim.to_first, rtol=0, atol=5e-7)
    assert float(study.kl[base]) == 0.0
    assert hook_count(model) == 0
    # the bias is real: every readout after block 0 moves away from the baseline
    assert torch.equal(study.statistics[0, 0], study.statistics[base, 0])  # the embeddings
    assert (study.statistics[0, 1:] != study.statistics[base, 1:]).all()


@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_the_blocked_study_equals_the_eager_one(arch: str) -> None:
    """The bridge's study runs each block's attention a block of queries at a time inside the
    attention function: every readout equals the eager-pattern study within float32 rounding,
    its baseline is the unhooked model within rounding, and the jobs leave nothing attached."""
    model = _model(arch, "bridge")
    options = {"kind": "recent", "strengths": [-1.0, 0.0, 2.0], "window": 3, "heads": [0, 2]}
    fast = attention_bias_study(model, WINDOWS, **options, **COMMON)
    with eager_attention():
        slow = attention_bias_study(model, WINDOWS, **options, **COMMON)
    for name in ("window_statistics", "window_loss", "window_attention", "sp", "to_first"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4, equal_nan=True), name
    with torch.inference_mode():
        loss = next_token_loss(model(WINDOWS), WINDOWS, torch.ones_like(WINDOWS)).double()
    assert torch.allclose(fast.window_loss[1], loss, atol=1e-5)
    assert hook_count(model) == 0


@pytest.mark.parametrize("kind", ["first", "self", "recent", "alibi", "middle"])
def test_mass_rises_strictly_with_b_and_kl_grows_with_abs_b(kind: str) -> None:
    strengths = [-3.0, -1.0, -0.25, 0.0, 0.25, 1.0, 3.0]
    study = attention_bias_study(
        _model(), WINDOWS, kind=kind, strengths=strengths, first_k=2, window=3, **COMMON
    )
    mass = study.curve("mass", None)["value"].tolist()
    assert all(a < b for a, b in zip(mass, mass[1:], strict=False)), mass
    kl = study.kl.tolist()
    assert kl[3] == 0.0
    assert kl[2] < kl[1] < kl[0] and kl[4] < kl[5] < kl[6], kl
    per_block = study.attention[..., 0]  # every biased block on its own
    assert (per_block[1:] > per_block[:-1]).all()


def test_temperature_flattens_and_sharpens() -> None:
    study = attention_bias_study(
        _model(), WINDOWS, kind="temperature", strengths=[0.25, 0.5, 1.0, 2.0], **COMMON
    )
    entropy = study.curve("entropy", None)["value"].tolist()
    assert all(a > b for a, b in zip(entropy, entropy[1:], strict=False)), entropy
    assert study.kl[2] == 0.0 and (study.kl[[0, 1, 3]] > 0).all()
    assert study.curve("mass", None)["value"].isna().all()  # phi = 0: no biased keys


@pytest.mark.parametrize("kind", ["first", "recent", "alibi", "temperature"])
def test_slope_at_zero_agrees_with_forward_mode_autograd(kind: str) -> None:
    """Central difference at +-1e-3 (float64 model) against the exact first-order derivative."""
    base = 1.0 if kind == "temperature" else 0.0
    study = attention_bias_study(
        _model(f64=True),
        WINDOWS,
        kind=kind,
        strengths=[base - 1e-3, base, base + 1e-3],
        gradient_windows=6,
        **COMMON,
    )
    metrics = ["homogenization", "matched_first", "matched_last", "naive_last", "sp_first"]
    for metric in metrics + ["entropy"] + ([] if kind == "temperature" else ["mass"]):
        layer = None if metric in ("mass", "entropy") else -1
        slope = study.slope_at_zero(metric, layer)
        tolerance = max(5e-3 * abs(slope.gradient), 1e-5)  # O(step^2) and float rounding
        assert abs(slope.central - slope.gradient) < tolerance, (metric, slope)
    loss = study.slope_at_zero("loss")  # the loss is accumulated in float32
    assert abs(loss.central - loss.gradient) < 0.05 * max(abs(loss.gradient), 1e-2), loss


def test_gradient_on_a_subset_and_value_zero_first() -> None:
    model = _model()
    study = attention_bias_study(
        model, WINDOWS, kind="first", strengths=[-0.5, 0.0, 0.5], gradient_windows=4, **COMMON
    )
    assert study.window_gradient_statistics.shape[0] == 4 and study.gradient_windows == 4
    slope = study.slope_at_zero("homogenization")
    assert math.isfinite(slope.gradient) and math.isfinite(slope.gradient_ci_low)
    zeroed = attention_bias_study(
        model, WINDOWS, kind="first", strengths=[0.0, 1.0], value_zero_first=True, **COMMON
    )
    plain = attention_bias_study(model, WINDOWS, kind="first", strengths=[0.0, 1.0], **COMMON)
    # the control changes what the first key writes, not the attention it gets
    assert torch.allclose(zeroed.attention[..., 0], plain.attention[..., 0], atol=0.2)
    assert not torch.allclose(zeroed.statistics, plain.statistics)
    assert torch.equal(zeroed.window_attention[0, :, 0], plain.window_attention[0, :, 0])


def test_heads_and_blocks_bias_only_those() -> None:
    study = attention_bias_study(
        _model(), WINDOWS, kind="first", strengths=[0.0, 2.0], layers=[1], heads=[0, 2], **COMMON
    )
    assert study.blocks == (1,) and study.heads == (0, 2)
    assert study.window_attention.shape[2] == 1
    # block 0 is untouched: the residual entries 0 and 1 do not change
    assert torch.equal(study.window_statistics[0, :, :2], study.window_statistics[1, :, :2])
    assert not torch.equal(study.window_statistics[0, :, 2], study.window_statistics[1, :, 2])


def test_curve_table_save_load_and_plot(tmp_path) -> None:
    study = attention_bias_study(_model(), WINDOWS, kind="first", **COMMON)
    frame = study.curve("homogenization", -1)
    assert list(frame.columns[:7]) == [
        "strength",
        "b",
        "beta",
        "kl",
        "mass_moved",
        "value",
        "delta",
    ]
    base = frame[frame.strength == 0.0].iloc[0]
    assert base.delta == 0.0 and math.isnan(base.ci_low)
    assert (frame.ci_low <= frame.delta).all() or frame.ci_low.isna().any()
    tidy = study.to_pandas()
    assert set(tidy.metric) >= {"homogenization", "mass", "loss", "kl"} - {"kl"}
    assert tidy.kl.notna().all()
    study.save(tmp_path / "b")
    again = AttentionBiasStudy.load(tmp_path / "b")
    assert torch.equal(again.window_statistics, study.window_statistics)
    assert again.strengths == study.strengths and again.kind == "first"
    import matplotlib

    matplotlib.use("Agg")
    assert study.plot().axes
    assert "AttentionBiasStudy('first'" in repr(study)
    with pytest.raises(InvalidInputError, match="symmetric pair"):
        attention_bias_study(
            _model(), WINDOWS, kind="first", strengths=[0.0, 1.0], **COMMON
        ).slope_at_zero("loss")
    with pytest.raises(InvalidInputError, match="metric="):
        study.curve("nonsense")
    with pytest.raises(InvalidInputError, match="layer="):
        study.curve("homogenization", 99)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "edges"}, "kind="),
        ({"kind": "first", "strengths": [0.0, math.nan]}, "finite"),
        ({"kind": "first", "strengths": [0.0, math.inf]}, "finite"),
        ({"kind": "first", "strengths": "big"}, "list of numbers"),
        ({"kind": "first", "strengths": [1.0, 1.0]}, "repeats"),
        ({"kind": "first", "strengths": []}, "empty"),
        ({"kind": "first", "strengths": [0.0, 1 + 2j]}, "finite real"),
        ({"kind": "first", "strengths": [2e4]}, "strength="),
        ({"kind": "temperature", "strengths": [0.0, 1.0]}, "must be > 0"),
        ({"kind": "temperature", "strengths": [-1.0]}, "must be > 0"),
        ({"kind": "first", "layers": [2]}, "layers"),
        ({"kind": "first", "heads": [4]}, "heads"),
        ({"kind": "first", "first_k": 20}, "first_k="),
        ({"kind": "recent", "window": 21}, "window="),
        ({"kind": "first", "first_k": 0}, "first_k"),
        ({"kind": "first", "gradient_windows": 1}, "gradient_windows=1"),
        ({"kind": "first", "edge_k": 10}, "edge_k"),
        ({"kind": "first", "ci": 1.5}, "ci"),
    ],
)
def test_bad_input_is_typed_and_leaves_the_model_as_it_was(kwargs, match) -> None:
    model = _model()
    before = (hook_count(model), state_hash(model))
    with pytest.raises(InvalidInputError, match=match):
        attention_bias_study(model, WINDOWS, **{**COMMON, **kwargs})
    assert (hook_count(model), state_hash(model)) == before


def test_windows_must_be_equal_and_several() -> None:
    model = _model()
    with pytest.raises(InvalidInputError, match="at least 2 windows of equal length"):
        attention_bias_study(model, WINDOWS[:1], kind="first", **COMMON)
    mask = torch.ones_like(WINDOWS)
    mask[0, :3] = 0
    with pytest.raises(InvalidInputError, match="equal length"):
        attention_bias_study(model, WINDOWS, kind="first", attention_mask=mask, **COMMON)
    assert hook_count(model) == 0


def test_an_error_inside_the_pass_leaves_no_hook(monkeypatch) -> None:
    import homoglens.run.losses as losses_mod

    model = _model()

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(losses_mod, "next_token_loss", broken)
    with pytest.raises(RuntimeError, match="boom"):
        attention_bias_study(model, WINDOWS, kind="first", strengths=[0.0, 1.0], **COMMON)
    assert hook_count(model) == 0


def test_strengths_and_lengths_as_arrays() -> None:
    import numpy as np

    from homoglens import length_study

    study = attention_bias_study(
        _model(), WINDOWS, kind="first", strengths=np.linspace(-1, 1, 3), **COMMON
    )
    assert study.strengths == (-1.0, 0.0, 1.0)
    lengths = length_study(_model(), WINDOWS, lengths=np.array([10, 20]), edge_k=2, progress=False)
    assert lengths.lengths == (10, 20)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_loss_head_is_the_loss_of_the_model_logits_bit_for_bit(arch: str, backend: str) -> None:
    from homoglens.run.losses import LossHead

    model = _model(arch, backend)
    mask = torch.ones_like(WINDOWS)
    with torch.inference_mode(), eager_attention():  # as the study's passes run
        want = next_token_loss(model(WINDOWS), WINDOWS, mask)
        head = LossHead(model)
        first = head.loss(WINDOWS, [], mask)  # the checked pass: the model's logits
        assert head.exact is not None
        again = head.loss(WINDOWS, [], mask)  # no logits when the check passed
    assert torch.equal(first, want) and torch.equal(again, want)
    if backend == "bridge":
        assert head.exact  # a plain lm_head: the blocks of rows give the same bits on the CPU
    assert hook_count(model) == 0


def test_loss_head_keeps_the_logits_where_the_unembedding_is_not_all(monkeypatch) -> None:
    # Something after W_U (here a hook on the logits; in Gemma 2 a soft-cap) fails the check:
    # every pass then reads the model's own logits, and the loss is theirs.
    import homoglens.run.engine as engine_mod
    import homoglens.run.losses as losses_mod

    model = _model()
    mask = torch.ones_like(WINDOWS)
    doubled = [("unembed.hook_out", lambda z, hook: z * 2.0)]
    calls = []
    real = engine_mod._run

    def counted(model, asked):
        calls.append(asked.last)
        return real(model, asked)

    monkeypatch.setattr(engine_mod, "_run", counted)
    with torch.inference_mode(), eager_attention():
        want = next_token_loss(2.0 * model(WINDOWS), WINDOWS, mask)
        head = losses_mod.LossHead(model)
        losses = [head.loss(WINDOWS, doubled, mask) for _ in range(2)]
    assert head.exact is False and calls == [None, None]  # both passes to the logits
    assert all(torch.equal(loss, want) for loss in losses)


def test_the_study_reads_logits_once_only(monkeypatch) -> None:
    import homoglens.run.engine as engine_mod

    calls = []
    real = engine_mod._run

    def counted(model, asked):
        calls.append(asked.last)
        return real(model, asked)

    monkeypatch.setattr(engine_mod, "_run", counted)
    attention_bias_study(_model(), WINDOWS, kind="first", strengths=[-1.0, 0.0, 1.0], **COMMON)
    assert calls.count(None) == 1  # the check; 5 more passes (3 strengths x 2 batches) end at W_U
    assert calls.count("unembed.hook_in") == 5


def test_doses_per_unit_of_attention_mass_and_like_for_like_cross_check() -> None:
    """Issue 38, point 5: a nat of b is not a dose (saturated rows move little attention), so
    the slope is also reported per unit of attention mass moved onto the biased keys (the
    central difference of the metric over that of the mass), with a SESOI in those units; the
    gradient is cross-checked against the central difference on its own windows."""
    study = attention_bias_study(
        _model(f64=True),
        WINDOWS,
        kind="first",
        strengths=[-1e-3, 0.0, 1e-3, 2.0],
        gradient_windows=3,
        **COMMON,
    )
    mass = study.slope_at_zero("mass", None)
    assert mass.per_mass == pytest.approx(1.0, rel=1e-9)
    slope = study.slope_at_zero("homogenization", -1)
    assert slope.per_mass == pytest.approx(slope.central / mass.central, rel=1e-9)
    assert slope.per_mass_ci_low < slope.per_mass < slope.per_mass_ci_high
    h = float(study.statistics[1, -1, SIMILARITY_STATISTICS.index("homogenization")])
    assert slope.sesoi == pytest.approx(max(1e-3, 0.1 * abs(h)))
    assert slope.verdict() in ("holds", "fails", "equivalent", "inconclusive")
    # like for like: the gradient's 3 windows against the central difference on those 3
    # (O(step^2) apart), while the central difference over all 6 windows is another estimand
    naive = study.slope_at_zero("naive_last", -1)
    gap = abs(naive.central_gradient_windows - naive.gradient)
    assert gap < max(5e-3 * abs(naive.gradient), 1e-6)
    assert abs(naive.central - naive.gradient) > 10 * gap
    assert math.isnan(slope.central_gradient_windows)  # its C is that of the 3 windows
    curve = study.curve("homogenization", -1)
    row = curve[curve["strength"] == 2.0].iloc[0]
    assert row["per_mass"] == pytest.approx(row["delta"] / row["mass_moved"], rel=1e-9)
    assert row["per_kl"] == pytest.approx(row["delta"] / row["kl"], rel=1e-9)
    assert math.isnan(curve[curve["strength"] == 0.0].iloc[0]["per_mass"])
    temperature = attention_bias_study(
        _model(), WINDOWS, kind="temperature", strengths=[0.5, 1.0, 1.5], **COMMON
    )
    assert math.isnan(temperature.slope_at_zero("homogenization", -1).per_mass)


def test_pseudo_values_kept_or_run_again_and_without_them(monkeypatch) -> None:
    """Issue 38, point 4: the study's per-window values of the statistics that subtract C (and
    of sp_*) are jackknife pseudo-values by default, from the unit vectors kept from the first
    pass or, above the activation budget, from a second forward pass per strength (the same
    numbers); without them C is held fixed (the same corpus values, other per-window values)
    and sp_* has no interval."""
    import homoglens.bias.measure as bias

    model = _model()
    options = {"kind": "first", "strengths": [-1.0, 0.0, 1.0], **COMMON}
    kept = attention_bias_study(model, WINDOWS, **options)
    assert kept.pseudo_values
    monkeypatch.setattr(bias, "ACTIVATION_CACHE_BYTES", 0)
    again = attention_bias_study(model, WINDOWS, **options)
    assert again.window_sp is not None and kept.window_sp is not None
    assert torch.allclose(again.window_statistics, kept.window_statistics, rtol=0, atol=1e-6)
    assert torch.allclose(again.window_sp, kept.window_sp, rtol=0, atol=1e-6)
    held = attention_bias_study(model, WINDOWS, pseudo_values=False, **options)
    assert not held.pseudo_values and held.window_sp is None
    assert torch.allclose(held.statistics, kept.statistics, rtol=0, atol=1e-7)
    e = SIMILARITY_STATISTICS.index("matched_last")
    assert not torch.allclose(held.window_statistics[..., e], kept.window_statistics[..., e])
    sp_kept = kept.curve("sp_first", -1).set_index("strength")
    sp_held = held.curve("sp_first", -1).set_index("strength")
    assert sp_held["delta"].to_numpy() == pytest.approx(sp_kept["delta"].to_numpy(), abs=1e-7)
    assert math.isfinite(sp_kept.loc[1.0, "se"]) and math.isnan(sp_held.loc[1.0, "se"])
    assert hook_count(model) == 0


def test_pseudo_values_of_a_float64_model_are_float64_exact() -> None:
    """The unit vectors kept for the second pass are in the work dtype: in float64 the study's
    pseudo-values are positional_similarity's to float64 rounding."""
    model = _model(f64=True)
    study = attention_bias_study(model, WINDOWS, kind="first", strengths=[0.0], **COMMON)
    sim = positional_similarity(model, WINDOWS, centre=None, **COMMON)
    assert study.window_sp is not None
    for e, stat in enumerate(SIMILARITY_STATISTICS):
        got, want = study.window_statistics[0, ..., e], sim.per_window(stat)
        assert torch.allclose(got, want, rtol=0, atol=1e-12), stat
    for j, stat in enumerate(("sp_first", "sp_last")):
        assert torch.allclose(study.window_sp[0, ..., j], sim.per_window(stat), rtol=0, atol=1e-12)
