"""Positional ablations against independent Hugging Face oracles (wpe zeroed, position_ids),
hand-computed attention scores, restriction to positions/layers, hook hygiene, bad inputs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from helpers import BACKENDS, TOKENS, T, hf_written_logits, hook_count, run_ablated, state_hash
from homoglens import (
    InvalidInputError,
    UnsupportedArchitectureError,
    ablated_massive_activations,
    ablated_positions,
    homogenization_profile,
    massive_activation_hooks,
    position_ablation_hooks,
)
from homoglens.run.hooks import PositionPlan


def _scores_and_unrotated(model, layer: int, **ablation) -> tuple[torch.Tensor, torch.Tensor]:
    names = [f"blocks.{layer}.attn.{h}" for h in ("hook_q", "hook_k", "hook_attn_scores")]
    with torch.no_grad(), ablated_positions(model, **ablation):
        _, cache = model.run_with_cache(TOKENS, names_filter=names)
    q, k, scores = (cache[n] for n in names)
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)  # grouped-query attention
    unrotated = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores[..., causal], unrotated[..., causal]


@pytest.mark.parametrize("arch", ["neox", "llama"])
def test_zero_gives_unrotated_scores(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    for layer in range(model.cfg.n_layers):
        scores, unrotated = _scores_and_unrotated(model, layer, how="zero")
        assert torch.allclose(scores, unrotated, atol=1e-5), layer
    base_scores, unrotated = _scores_and_unrotated(model, 0, how="none")
    assert (base_scores - unrotated).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["neox", "llama"])
def test_layers_restricts_rotary_to_named_blocks(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    s0, u0 = _scores_and_unrotated(model, 0, how="zero", layers=[1])
    s1, u1 = _scores_and_unrotated(model, 1, how="zero", layers=[1])
    base0, _ = _scores_and_unrotated(model, 0, how="none")
    assert torch.equal(s0, base0)  # block 0 keeps its rotation
    assert (s0 - u0).abs().max() > 1e-3
    assert torch.allclose(s1, u1, atol=1e-5)  # block 1 lost it


def test_positions_change_only_named_positions(backend, get_model) -> None:
    model = get_model("gpt2", backend)
    name = "blocks.0.hook_resid_pre"
    with torch.no_grad():
        _, base = model.run_with_cache(TOKENS, names_filter=[name])
        with ablated_positions(model, "zero", positions=[0, 1, 10]):
            _, abl = model.run_with_cache(TOKENS, names_filter=[name])
    changed = (abl[name] - base[name]).abs().amax(-1)[0]
    assert torch.nonzero(changed > 1e-6).flatten().tolist() == [0, 1, 10]
    assert torch.equal(abl[name][0, 2:10], base[name][0, 2:10])


def test_identity_changes_nothing(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    base = run_ablated(model)
    assert torch.allclose(run_ablated(model, "permute", perm=list(range(T))), base, atol=1e-7)
    assert torch.allclose(run_ablated(model, "shift", shift=0), base, atol=1e-7)
    assert torch.equal(run_ablated(model, "none"), base)


def test_mean_gives_every_token_the_mean_embedding(backend, get_model) -> None:
    model = get_model("gpt2", backend)
    with torch.no_grad():
        _, base = model.run_with_cache(TOKENS, names_filter=["hook_pos_embed"])
        with ablated_positions(model, "mean"):
            _, abl = model.run_with_cache(TOKENS, names_filter=["hook_pos_embed"])
    want = base["hook_pos_embed"][0].mean(0)
    assert torch.allclose(abl["hook_pos_embed"][0], want.expand(T, -1), atol=1e-6)


def test_seeded_permutation_is_deterministic_and_same_on_backends(get_model) -> None:
    outs = [run_ablated(get_model("llama", be), "permute", seed=3) for be in BACKENDS]
    again = run_ablated(get_model("llama", BACKENDS[0]), "permute", seed=3)
    assert torch.equal(outs[0], again)
    assert all(torch.allclose(o, outs[0], atol=1e-5) for o in outs)
    assert not torch.allclose(
        outs[0], run_ablated(get_model("llama", BACKENDS[0]), "permute", seed=4), atol=1e-4
    )


def test_hooks_removed_after_normal_exit_and_after_exception(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    before = state_hash(model)
    with ablated_positions(model, "zero"):
        assert hook_count(model) > 0
        model(TOKENS)
    assert hook_count(model) == 0
    with pytest.raises(RuntimeError, match="inside"), ablated_positions(model, "permute", seed=1):
        model(TOKENS)
        raise RuntimeError("inside the block")
    assert hook_count(model) == 0
    # an error raised by a hook during the forward pass
    with (
        pytest.raises(InvalidInputError, match="perm has length"),
        ablated_positions(model, "permute", perm=[1, 0, 2]),
    ):
        model(TOKENS)
    assert hook_count(model) == 0
    assert state_hash(model) == before


def test_user_hooks_survive_the_context_manager(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    seen = []
    model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: seen.append(1))
    try:
        with ablated_positions(model, "zero"):
            model(TOKENS)
        model(TOKENS)
        assert len(seen) == 2
    finally:
        model.reset_hooks()
    assert hook_count(model) == 0


def test_profile_under_ablation_runs(get_model) -> None:
    model = get_model("llama", BACKENDS[-1])
    base = homogenization_profile(model, TOKENS, progress=False)
    with ablated_positions(model, "zero"):
        zero = homogenization_profile(model, TOKENS, progress=False)
    assert torch.allclose(zero.to_others[0], base.to_others[0])  # embeddings: rotary is later
    assert not torch.allclose(zero.to_others[1:], base.to_others[1:], atol=1e-6)


BAD = [
    ("perm with repeats", "gpt2", {"how": "permute", "perm": [0, 1, 1]}, "repeated"),
    ("perm not 0..n-1", "gpt2", {"how": "permute", "perm": [1, 2, 3]}, "permutation"),
    ("perm and seed", "gpt2", {"how": "permute", "perm": [0], "seed": 1}, "not both"),
    ("permute without perm", "gpt2", {"how": "permute"}, "needs perm"),
    ("positions outside n_ctx", "gpt2", {"how": "zero", "positions": [0, 128]}, "outside"),
    ("negative position", "llama", {"how": "zero", "positions": [-1]}, "outside"),
    ("repeated positions", "gpt2", {"how": "zero", "positions": [3, 3]}, "repeated"),
    ("shift outside n_ctx", "gpt2", {"how": "shift", "shift": 128}, "must lie in"),
    (
        "shift moves a position out",
        "gpt2",
        {"how": "shift", "shift": 5, "positions": [125]},
        "outside",
    ),
    ("shift missing", "gpt2", {"how": "shift"}, "needs an int shift"),
    ("mean on rotary", "neox", {"how": "mean"}, "rotary"),
    ("layers on learned", "gpt2", {"how": "zero", "layers": [0]}, "positions= instead"),
    ("layer out of range", "llama", {"how": "zero", "layers": [2]}, "are not blocks of this model"),
    ("unknown mode", "gpt2", {"how": "scramble"}, "must be one of"),
    ("seed on zero", "gpt2", {"how": "zero", "seed": 1}, "only apply"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_options_raise_before_anything_is_attached(case, backend, get_model) -> None:
    _, arch, kwargs, match = case
    model = get_model(arch, backend)
    with pytest.raises(InvalidInputError, match=match):
        with ablated_positions(model, **kwargs):
            pass
    assert hook_count(model) == 0


def test_shift_past_context_at_run_time(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="outside the context window"):
        with ablated_positions(model, "shift", shift=120):
            model(TOKENS)
    assert hook_count(model) == 0


def test_unknown_architecture_lists_supported() -> None:
    fake = SimpleNamespace(cfg=SimpleNamespace(original_architecture="BertForMaskedLM"))
    with pytest.raises(UnsupportedArchitectureError, match="gpt2.*llama.*neox"):
        position_ablation_hooks(fake, "zero")


def test_permute_with_positions_stays_a_permutation(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="among themselves"):
        ablated_positions(model, "permute", perm=[1, 0, 2, 3, 4, 5], positions=[0, 2]).__enter__()
    assert hook_count(model) == 0
    plan = PositionPlan("permute", 8, positions=(0, 2), perm=(2, 1, 0, 3))
    assert plan.source(4)[0].tolist() == [2, 1, 0, 3]
    for bad in (
        {"positions": [1]},
        {"positions": (-1,)},
        {"perm": (0, 0, 0)},
        {"perm": (0, 5, 1)},
    ):
        with pytest.raises(InvalidInputError):
            PositionPlan("permute", 8, **bad)
    with pytest.raises(InvalidInputError):
        plan.source(-1)


def test_ablation_hooks_built_in_inference_mode_work_with_gradients(backend, get_model):
    """Cached position plans made under torch.inference_mode must not break a later forward
    pass that tracks gradients (found while writing the patching tests)."""
    from homoglens import position_ablation_hooks

    for arch in ("gpt2", "neox"):
        model = get_model(arch, backend)
        tokens = torch.randint(0, 1000, (2, 9))
        hooks = position_ablation_hooks(model, "permute", seed=11)
        with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
            expected = model(tokens)
        with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
            logits = model(tokens)
            logits.sum().backward()
        assert torch.allclose(logits.detach(), expected, atol=1e-5)
        model.zero_grad(set_to_none=True)


def _hf_set_logits(arch: str, layer: int, positions, dims, values) -> torch.Tensor:
    """Plain Hugging Face logits on TOKENS with ``values`` written into decoder layer ``layer``."""
    return hf_written_logits(arch, TOKENS, layer, positions, dims, values)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_massive_ablation_matches_hf_decoder_layer_hook(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    positions, dims = [0, 3], [2, 9, 17]
    means = torch.tensor([[40.0, -3.5, 0.25], [1.0, 2.0, -7.0]])
    with torch.no_grad():
        base = model(TOKENS)
        with ablated_massive_activations(model, "zero", layer=2, dims=dims, positions=positions):
            zero = model(TOKENS)
        with ablated_massive_activations(
            model, "mean", layer=2, dims=dims, positions=positions, means=means
        ):
            mean = model(TOKENS)
            _, cache = model.run_with_cache(TOKENS, names_filter="blocks.1.hook_resid_post")
        _, plain = model.run_with_cache(TOKENS, names_filter="blocks.1.hook_resid_post")
    assert (zero - base).abs().max() > 1e-3 and (mean - base).abs().max() > 1e-3
    assert torch.allclose(
        zero, _hf_set_logits(arch, 2, positions, dims, [[0.0] * 3] * 2), atol=1e-4
    )
    assert torch.allclose(mean, _hf_set_logits(arch, 2, positions, dims, means.tolist()), atol=1e-4)
    written, before = cache["blocks.1.hook_resid_post"], plain["blocks.1.hook_resid_post"]
    assert torch.equal(written[0][positions][:, dims], means)  # exactly the values given
    untouched = torch.ones_like(written, dtype=torch.bool)
    untouched[:, torch.tensor(positions)[:, None], torch.tensor(dims)] = False
    assert torch.equal(written[untouched], before[untouched])
    assert hook_count(model) == 0


def test_massive_ablation_hooks_sort_and_skip_short_batches(get_model) -> None:
    model = get_model("llama", BACKENDS[-1])
    hooks = massive_activation_hooks(
        model, "mean", layer=2, dims=[9, 2], positions=[40, 1], means=torch.ones(2, 2)
    )
    assert [name for name, _ in hooks] == ["blocks.1.hook_resid_post"]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):  # position 40 lies past this batch
        _, cache = model.run_with_cache(TOKENS, names_filter=hooks[0][0])
    assert torch.equal(cache[hooks[0][0]][0, 1, [2, 9]], torch.ones(2))
