"""homogenization_profile on real forward passes: independent HF oracle, both backends,
padding, merging, layer selection, hook hygiene, result objects."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import AUSTEN_TEXTS as TEXTS
from helpers import BACKENDS, hook_count, reseal, state_hash
from helpers import cosine_oracle as oracle
from homoglens import (
    HomogenizationProfile,
    IncompatibleResultsError,
    InvalidInputError,
    NonFiniteActivationError,
    corpus_windows,
    cosine_homogenization,
    homogenization_profile,
    to_token_batch,
)
from homoglens.testing import tiny_model_folder


@pytest.mark.skipif(len(BACKENDS) < 2, reason="HookedTransformer needs TransformerLens < 4")
@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_hooked_and_bridge_agree(arch: str, get_model) -> None:
    profs = [
        homogenization_profile(get_model(arch, be), TEXTS, progress=False, effective_rank=True)
        for be in BACKENDS
    ]
    a, b = profs
    for name in (
        "to_others",
        "to_prefix",
        "to_mean",
        "mean_pairwise",
        "baseline",
        "relative_residual",
        "effective_rank",
    ):
        assert torch.allclose(getattr(a, name), getattr(b, name), atol=1e-5, equal_nan=True), name
    assert torch.allclose(a.norm, b.norm, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_padding_left_right_equals_each_text_alone(arch: str, backend: str, get_model) -> None:
    model = get_model(arch, backend)
    alone = HomogenizationProfile.merge(
        *[homogenization_profile(model, text, progress=False) for text in TEXTS]
    )
    right = to_token_batch(model, TEXTS)
    assert (right.attention_mask == 0).any(), "the texts must have unequal lengths"
    width = right.tokens.shape[1]
    left_tokens = torch.full_like(right.tokens, 0)
    left_mask = torch.zeros_like(right.attention_mask)
    for i, n in enumerate(right.lengths.tolist()):
        left_tokens[i, width - n :] = right.tokens[i, :n]
        left_mask[i, width - n :] = 1
    for tokens, mask in ((right.tokens, right.attention_mask), (left_tokens, left_mask)):
        prof = homogenization_profile(
            model, tokens, attention_mask=mask, batch_size=3, progress=False
        )
        for name in (
            "to_others",
            "to_prefix",
            "to_mean",
            "norm",
            "mean_pairwise",
            "baseline",
            "relative_residual",
        ):
            assert torch.allclose(
                getattr(prof, name), getattr(alone, name), atol=1e-5, equal_nan=True
            ), name
        assert torch.equal(prof.count, alone.count)


def test_merge_of_uneven_splits_equals_one_pass(backend: str, get_model) -> None:
    model = get_model("gpt2", backend)
    windows = corpus_windows(model, n_seq=64, seq_len=24)
    whole = homogenization_profile(
        model, windows, batch_size=16, progress=False, effective_rank=True
    )
    cuts = [0, 5, 22, 23, 64]
    parts = [
        homogenization_profile(
            model, windows[a:b], batch_size=7, progress=False, effective_rank=True
        )
        for a, b in zip(cuts, cuts[1:], strict=False)
    ]
    merged = HomogenizationProfile.merge(*parts)
    assert merged.n_sequences == 64 and merged.n_tokens == 64 * 24
    for name in (
        "to_others",
        "to_prefix",
        "to_mean",
        "norm",
        "mean_pairwise",
        "baseline",
        "adjusted",
        "relative_residual",
        "effective_rank",
    ):
        assert torch.allclose(
            getattr(merged, name), getattr(whole, name), atol=1e-6, equal_nan=True
        ), name


def test_batch_size_does_not_change_result(get_model) -> None:
    model = get_model("neox", BACKENDS[0])
    a = homogenization_profile(model, TEXTS, batch_size=1, progress=False)
    b = homogenization_profile(model, TEXTS, batch_size=4, progress=False)
    assert torch.allclose(a.to_others, b.to_others, atol=1e-6, equal_nan=True)


def test_layers_selects_entries(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    full = homogenization_profile(model, TEXTS, progress=False)
    some = homogenization_profile(model, TEXTS, layers=[2, 0], progress=False)
    assert some.layers == (0, 2)
    assert some.provenance.hook_points == ("blocks.0.hook_resid_pre", "blocks.1.hook_resid_post")
    assert torch.allclose(some.to_others, full.to_others[[0, 2]], atol=1e-10)
    assert torch.allclose(full.sel([0, 2]).to_others, some.to_others, atol=1e-10)
    with pytest.raises(InvalidInputError, match="out of range"):
        homogenization_profile(model, TEXTS, layers=[3], progress=False)
    with pytest.raises(InvalidInputError, match="repeats"):
        homogenization_profile(model, TEXTS, layers=[1, 1], progress=False)


def test_forward_ends_at_the_deepest_measured_entry(backend: str, get_model) -> None:
    """No block past the deepest measured entry, no final norm and no unembedding run, and the
    model is left as it was (same logits, no hook, no stop flag)."""
    model = get_model("gpt2", backend)
    tokens = to_token_batch(model, TEXTS).tokens
    with torch.inference_mode():
        logits = model(tokens)
    calls: dict[str, int] = {}
    names = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "ln_final.hook_normalized"]

    def counter(name: str):  # the bridge names its hooks by their canonical (alias) names
        def count(resid: torch.Tensor, hook) -> None:
            calls[name] = calls.get(name, 0) + 1

        return count

    for name in names:
        model.add_hook(name, counter(name))
    try:
        homogenization_profile(model, TEXTS, batch_size=4, progress=False)
        assert calls == {"blocks.0.hook_resid_post": 1, "blocks.1.hook_resid_post": 1}
        calls.clear()
        homogenization_profile(model, TEXTS, layers=[0, 1], batch_size=4, progress=False)
        assert calls == {"blocks.0.hook_resid_post": 1}
        calls.clear()
        with torch.inference_mode():
            again = model(tokens)
        assert calls == dict.fromkeys(names, 1)
    finally:
        model.reset_hooks()
    assert torch.equal(again, logits)
    assert hook_count(model) == 0


def test_exclude_first_and_bos_provenance(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    prof = homogenization_profile(model, TEXTS, exclude_first=True, progress=False)
    assert prof.provenance.exclude_first and prof.provenance.bos is True
    assert torch.isnan(prof.to_others[:, 0]).all() and prof.count[0] == 0
    no_bos = homogenization_profile(model, TEXTS, bos="never", progress=False)
    assert no_bos.provenance.bos is False
    assert no_bos.n_tokens == prof.n_tokens  # BOS dropped == first token excluded, in count


def test_provenance_records_model_and_weights(get_model) -> None:
    model = get_model("llama", BACKENDS[0])
    prof = homogenization_profile(model, TEXTS, progress=False)
    p = prof.provenance
    assert (p.family, p.backend, p.weights) == ("llama", BACKENDS[0], "raw")
    assert p.transformer_lens_version and p.homoglens_version
    assert prof.n_sequences == 4 and prof.n_tokens == int(to_token_batch(model, TEXTS).n_tokens)


def test_error_inside_forward_leaves_no_hook_and_same_weights(
    arch: str, backend: str, get_model, monkeypatch
) -> None:
    model = get_model(arch, backend)
    before = state_hash(model)
    assert hook_count(model) == 0

    def boom(*args, **kwargs):
        raise RuntimeError("fault inside the forward pass")

    monkeypatch.setattr("homoglens.profile.measure.entry_terms", boom)
    with pytest.raises(RuntimeError, match="fault inside"):
        homogenization_profile(model, TEXTS, progress=False)
    assert hook_count(model) == 0
    assert state_hash(model) == before
    assert not torch.is_inference_mode_enabled()  # the streaming loop restored grad mode


def test_an_error_leaves_inference_mode_off_while_its_traceback_lives(get_model, monkeypatch):
    """The batches' generator runs under torch.inference_mode; an error inside a pass must
    not leave it suspended (and inference mode on) for as long as the error's traceback,
    which pytest and notebooks keep, refers to the loop's frame."""
    model = get_model("gpt2", BACKENDS[-1])

    def boom(*args, **kwargs):
        raise RuntimeError("fault inside the forward pass")

    monkeypatch.setattr("homoglens.profile.measure.entry_terms", boom)
    with pytest.raises(RuntimeError, match="fault inside") as info:
        homogenization_profile(model, TEXTS, progress=False)
    assert info.value.__traceback__ is not None  # the frames are still referenced
    assert not torch.is_inference_mode_enabled()
    assert hook_count(model) == 0


def test_non_finite_activations_are_reported(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    handle = model.hook_dict["blocks.0.hook_resid_post"].register_forward_hook(
        lambda module, inputs, output: output * math.inf
    )
    try:
        with pytest.raises(NonFiniteActivationError, match="blocks.0.hook_resid_post"):
            homogenization_profile(model, TEXTS, progress=False)
    finally:
        handle.remove()
    assert hook_count(model) == 0


def test_save_load_round_trip_and_exports(tmp_path, get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    prof = homogenization_profile(model, TEXTS, effective_rank=True, progress=False)
    loaded = HomogenizationProfile.load(prof.save(tmp_path / "p"))
    assert loaded.provenance == prof.provenance
    for name in ("to_others", "baseline", "effective_rank", "count"):
        assert torch.equal(
            getattr(loaded, name),
            getattr(prof, name),
        ) or torch.allclose(getattr(loaded, name), getattr(prof, name), equal_nan=True)
    frame = prof.to_pandas()
    cell = frame[(frame.metric == "to_others") & (frame.layer == 1) & (frame.pos == 3)]
    assert cell.value.item() == pytest.approx(prof.to_others[1, 3].item())
    per_layer = frame[frame.metric == "baseline"]
    assert per_layer.pos.isna().all() and len(per_layer) == 3
    edge = prof.edge_summary(k=3)
    assert list(edge.columns) == [
        "layer",
        "first",
        "middle",
        "last",
        "first_minus_middle",
        "last_minus_middle",
    ]
    fig = prof.plot()
    assert len(fig.axes) >= 2
    assert "HomogenizationProfile(" in repr(prof)


def test_load_rejects_tampered_folder(tmp_path, get_model) -> None:
    from safetensors.torch import load_file, save_file

    model = get_model("gpt2", BACKENDS[-1])
    folder = homogenization_profile(model, TEXTS, progress=False).save(tmp_path / "p")
    tensors = load_file(str(folder / "profile.safetensors"))
    tensors.pop("count")
    tensors["surprise"] = torch.zeros(1)
    save_file(tensors, str(folder / "profile.safetensors"))
    with pytest.raises(IncompatibleResultsError, match="saved incompletely or edited"):
        HomogenizationProfile.load(folder)
    reseal(folder)  # the sha256 recorded again: the fields themselves are checked
    with pytest.raises(IncompatibleResultsError, match="missing: \\['count'\\]"):
        HomogenizationProfile.load(folder)


def test_merge_rejects_different_layers(get_model) -> None:

    model = get_model("gpt2", BACKENDS[-1])
    a = homogenization_profile(model, TEXTS[:2], layers=[0, 1], progress=False)
    b = homogenization_profile(model, TEXTS[2:], layers=[1, 2], progress=False)
    with pytest.raises(IncompatibleResultsError, match="layers"):
        HomogenizationProfile.merge(a, b)


def test_cosine_homogenization_validates_masks():
    resid = torch.randn(2, 5, 8)
    for mask, match in (
        (torch.tensor([[1, 1, 2, 1, 1], [1] * 5]), "0 and 1"),
        (torch.tensor([[1, 1, 0.5, 1, 1], [1.0] * 5]), "0 and 1"),
        (torch.tensor([[1, 0, 1, 1, 1], [1] * 5]), "one block"),
        ([[1] * 5] * 2, "torch.Tensor"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            cosine_homogenization(resid, mask)


@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_matches_hf_hidden_states(arch: str, backend: str, get_model) -> None:
    model = get_model(arch, backend)
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_folder(arch))).eval()
    batch = to_token_batch(model, TEXTS)
    with torch.no_grad():
        hidden = hf(
            batch.tokens, attention_mask=batch.attention_mask, output_hidden_states=True
        ).hidden_states
    prof = homogenization_profile(model, batch, progress=False)
    assert prof.layers == tuple(range(model.cfg.n_layers + 1))
    for layer in range(model.cfg.n_layers):  # the last HF hidden state has the final norm
        want_others, want_pairwise = oracle(hidden[layer], batch.attention_mask)
        assert torch.allclose(prof.to_others[layer], want_others, atol=1e-4), layer
        assert prof.mean_pairwise[layer].item() == pytest.approx(want_pairwise.item(), abs=1e-4)


@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
@pytest.mark.parametrize("group_entries", [1, 2, 3])
def test_the_gpu_read_in_groups_equals_the_cpu_read(arch, group_entries, monkeypatch) -> None:
    """On a GPU a profile reads its entries without host synchronisation, several entries at
    once (homoglens.profile.homogenization.prepare_entry / prepared_terms, profile.GROUP_BYTES): the
    same profile as the CPU's read, with padding, a subset of layers and several batches."""
    import homoglens.profile.homogenization as hom
    import homoglens.profile.measure as prof
    from homoglens import load_model

    model = load_model(tiny_model_folder(arch), backend="bridge")
    tokens = torch.randint(0, 900, (5, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens)
    mask[1, 18:] = 0
    options = {"attention_mask": mask, "batch_size": 2, "progress": False}
    want = homogenization_profile(model, tokens, **options)
    want_some = homogenization_profile(model, tokens, layers=[0, 2], exclude_first=True, **options)
    monkeypatch.setattr(hom, "UNSYNCED_ON_CPU", True)
    monkeypatch.setattr(prof, "GROUP_BYTES", group_entries * 2 * 24 * model.cfg.d_model * 4)
    got = homogenization_profile(model, tokens, **options)
    got_some = homogenization_profile(model, tokens, layers=[0, 2], exclude_first=True, **options)
    for a, b in ((want, got), (want_some, got_some)):
        for name in ("to_others", "to_prefix", "to_mean", "norm", "mean_pairwise", "baseline"):
            x, y = getattr(a, name), getattr(b, name)
            assert torch.allclose(x, y, rtol=1e-6, atol=1e-7, equal_nan=True), name
        assert torch.equal(a.count, b.count) and a.n_tokens == b.n_tokens
