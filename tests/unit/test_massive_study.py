"""Massive-activation sites and the set_mean / set_zero study (Sun et al. 2024, arXiv
2402.17762) against independent oracles: a float64 brute force of the site rule over
``run_with_cache``, plain Hugging Face forwards with a torch hook on the decoder layer for the
loss, the null where the mean equals every value (nothing changes), and hook hygiene."""

from __future__ import annotations

import pytest
import torch

from helpers import BACKENDS, hf_written_logits, hook_count
from homoglens import (
    InvalidInputError,
    corpus_windows,
    find_massive_sites,
    homogenization_profile,
    massive_ablation_study,
)


def _plant(values: dict[tuple[int, int], float]):
    """A hook that writes ``values[(position, dim)]`` into every sequence."""

    def hook(resid, hook):
        resid = resid.clone()
        for (p, d), v in values.items():
            resid[:, p, d] = v
        return resid

    return hook


def _brute_force_sites(model, tokens, threshold=1000.0, floor=100.0):
    """Sun et al.'s rule, written out per layer, window, position and dimension in float64."""
    names = [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    for layer, name in enumerate(names, start=1):
        x = cache[name].double().abs()
        passing = torch.stack(
            [x[b] > max(threshold * float(x[b].median()), floor) for b in range(len(x))]
        )
        every = passing.all(0)  # [pos d]
        positions = [p for p in range(every.shape[0]) if bool(every[p].any())]
        if positions:
            dims = sorted(
                {d for p in positions for d in torch.nonzero(every[p]).flatten().tolist()}
            )
            return layer, tuple(dims), tuple(positions)
    return None


@pytest.mark.parametrize("backend", BACKENDS)
def test_sites_match_a_brute_force_and_find_nothing_in_a_plain_model(backend, get_model) -> None:
    model = get_model("gpt2", backend)
    windows = corpus_windows(model, n_seq=3, seq_len=12)
    assert find_massive_sites(model, windows, progress=False) is None  # the null
    assert _brute_force_sites(model, windows.tokens) is None
    model.add_hook("blocks.1.hook_resid_post", _plant({(0, 7): 5e3, (0, 11): -3e3, (4, 2): 50.0}))
    try:
        found = find_massive_sites(model, windows, progress=False)
        expected = _brute_force_sites(model, windows.tokens)
    finally:
        model.reset_hooks()
    assert found == expected == (2, (7, 11), (0,))  # 50 fails the magnitude rule
    assert hook_count(model) == 0


def _hf_losses(arch: str, tokens: torch.Tensor, layer: int, positions, dims, values):
    """Per-sequence mean next-token loss of the plain Hugging Face model with ``values`` written
    into decoder layer ``layer`` (``None``: unhooked)."""
    logits = hf_written_logits(arch, tokens, layer, positions, dims, values).double()
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none"
    )
    return nll.mean(1)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_study_losses_match_hugging_face_and_none_is_the_plain_profile(arch, get_model) -> None:
    model = get_model(arch, BACKENDS[-1])
    windows = corpus_windows(model, n_seq=4, seq_len=16)
    reference = windows
    dims, positions = [2, 9], [0, 3]
    study = massive_ablation_study(
        model, windows, layer=2, dims=dims, positions=positions, progress=False, n_boot=50
    )
    assert study.modes == ("none", "mean", "zero")
    assert study.settings["layer"] == 2 and study.settings["dims"] == dims
    plain = homogenization_profile(model, windows, progress=False)
    assert torch.allclose(study.profiles["none"].mean_pairwise, plain.mean_pairwise, atol=1e-6)
    tokens = windows.tokens
    assert torch.allclose(
        study.loss[0].double(), _hf_losses(arch, tokens, 2, positions, dims, None), atol=1e-4
    )
    zero = _hf_losses(arch, tokens, 2, positions, dims, [[0.0, 0.0], [0.0, 0.0]])
    assert torch.allclose(study.loss[2].double(), zero, atol=1e-4)
    # the means are those of the reference (here the data): recompute them from a cache
    with torch.no_grad():
        _, cache = model.run_with_cache(reference.tokens, names_filter="blocks.1.hook_resid_post")
    means = cache["blocks.1.hook_resid_post"][:, positions][:, :, dims].double().mean(0)
    mean = _hf_losses(arch, tokens, 2, positions, dims, means.tolist())
    assert torch.allclose(study.loss[1].double(), mean, atol=1e-4)
    assert hook_count(model) == 0


def test_mean_of_a_constant_site_changes_nothing(get_model) -> None:
    """Position 0 holds the same BOS in every window: its causal activation is the same in each,
    so its mean is itself, and set_mean must leave loss and homogenization exactly as they were
    (the null); set_zero must not."""
    model = get_model("llama", BACKENDS[-1])
    windows = corpus_windows(model, n_seq=4, seq_len=16, bos="always")
    study = massive_ablation_study(
        model, windows, layer=1, dims=[0, 5], positions=0, progress=False, n_boot=50
    )
    assert torch.allclose(study.loss[1], study.loss[0], atol=1e-5)
    assert torch.allclose(study.mean_pairwise[1], study.mean_pairwise[0], atol=1e-6)
    assert (study.loss[2] - study.loss[0]).abs().max() > 1e-4


def test_bad_input_is_refused_before_any_hook(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    windows = corpus_windows(model, n_seq=2, seq_len=12)
    with pytest.raises(InvalidInputError, match="give both"):
        massive_ablation_study(model, windows, layer=1, progress=False)
    with pytest.raises(InvalidInputError, match="no massive activations"):
        massive_ablation_study(model, windows, progress=False)
    with pytest.raises(InvalidInputError, match="layer"):
        massive_ablation_study(model, windows, layer=99, dims=[0], progress=False)
    with pytest.raises(InvalidInputError, match="threshold"):
        find_massive_sites(model, windows, threshold=0.5, progress=False)
    assert hook_count(model) == 0


def test_sites_no_window_reaches_and_padded_references_are_handled(get_model) -> None:
    model = get_model("llama", BACKENDS[-1])
    short = ["Hi there you", "Rain fell on us"]
    with pytest.raises(InvalidInputError, match="beyond every window"):
        massive_ablation_study(model, short, layer=1, dims=[3], positions=[40], progress=False)
    tokens = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    study = massive_ablation_study(
        model, tokens, attention_mask=mask, reference=tokens, reference_attention_mask=mask,
        layer=1, dims=[3], positions=[3], progress=False, n_boot=20,
    )  # fmt: skip
    # the mean at position 3 is that of the one window that has a real token there: set_mean
    # writes that window's own value back, so its loss is unchanged
    assert study.loss[1, 0] == pytest.approx(float(study.loss[0, 0]), abs=1e-6)
    find_massive_sites(model, short, min_magnitude=0, progress=False)  # 0: no magnitude rule
    assert study.plot().get_suptitle().find("massive-activation ablations") >= 0
    assert hook_count(model) == 0
