"""The SDPA fast path (homoglens.run.fast_attention): on every family of the table the bridge
serves with it, each readout it serves equals the eager pass within 1e-5; it falls back where it
cannot be exact; it leaves nothing switched after a pass, however the pass ends."""

from __future__ import annotations

import dataclasses
import functools
import warnings

import pytest
import torch

import homoglens.run.fast_attention as fa
from helpers import hook_count
from homoglens import (
    UnsupportedArchitectureError,
    homogenization_profile,
    load_model,
    massive_activations,
    position_ablation_hooks,
    positional_patching,
    positional_similarity,
)
from homoglens.run.engine import run_through
from homoglens.testing import TINY_ARCHS, tiny_model_folder

EAGER_FAMILIES = {"gptneo", "bloom", "mpt", "gemma2"}
"""Families whose Hugging Face attention has no exact SDPA route (no SDPA support; soft-capped
logits for Gemma 2)."""

TOKENS = torch.randint(0, 900, (3, 40), generator=torch.Generator().manual_seed(3))
MASK = torch.ones_like(TOKENS)
MASK[1, 30:] = 0  # a shorter window (right-padded)


@functools.cache
def _bridge(arch: str):
    return load_model(tiny_model_folder(arch), backend="bridge")


def _tensors(result) -> dict[str, torch.Tensor]:
    return {
        f.name: getattr(result, f.name)
        for f in dataclasses.fields(result)
        if isinstance(getattr(result, f.name), torch.Tensor)
    }


def _same(fast, eager, tol: float = 1e-5) -> None:
    a, b = _tensors(fast), _tensors(eager)
    assert a.keys() == b.keys() and a
    for name in a:
        x, y = a[name].double(), b[name].double()
        both = torch.isfinite(x) & torch.isfinite(y)
        assert torch.equal(torch.isfinite(x), torch.isfinite(y)), name
        if not bool(both.any()):
            continue
        scale = max(1.0, float(y[both].abs().max()))
        assert float((x - y)[both].abs().max()) <= tol * scale, name


def _both(monkeypatch, fn):
    fast = fn()
    monkeypatch.setattr(fa, "ENABLED", False)
    eager = fn()
    monkeypatch.setattr(fa, "ENABLED", True)
    return fast, eager


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_profile_equals_eager_on_every_family(arch, monkeypatch):
    model = _bridge(arch)
    attached = hook_count(model)  # the bridge's own (OPT keeps 6 on its MLPs)
    status = fa.fast_attention_status(model)
    assert (status == "sdpa") == (arch not in EAGER_FAMILIES), status
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast, eager = _both(
            monkeypatch,
            lambda: homogenization_profile(
                model, TOKENS, attention_mask=MASK, progress=False, effective_rank=True
            ),
        )
    _same(fast, eager)
    assert hook_count(model) == attached


@pytest.mark.parametrize("arch", [a for a in TINY_ARCHS if a not in EAGER_FAMILIES])
def test_similarity_massive_and_patching_equal_eager(arch, monkeypatch):
    """Every family the fast path serves: the similarity matrices, massive activations and
    residual-stream patching effects (where the family has a position ablation to patch)."""
    model = _bridge(arch)
    attached = hook_count(model)
    runs = [
        lambda: positional_similarity(model, TOKENS[:, :32], edge_k=4, progress=False),
        lambda: massive_activations(model, TOKENS, attention_mask=MASK, progress=False),
    ]
    try:
        position_ablation_hooks(model, "zero")
    except UnsupportedArchitectureError:
        pass  # no positional signal to ablate (NoPE), so nothing to patch
    else:
        runs.append(lambda: positional_patching(model, TOKENS[:2, :24], bins=4, progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for run in runs:
            fast, eager = _both(monkeypatch, run)
            _same(fast, eager)
    assert hook_count(model) == attached


def _pattern_fires(model) -> bool:
    fired = []

    def read(pattern, hook):
        fired.append(hook.name)

    run_through(model, TOKENS[:1], "blocks.0.hook_resid_post", [])
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", read)]):
        run_through(model, TOKENS[:1], "blocks.0.hook_resid_post", [])
    return bool(fired)


def _seen_during_pass(model, probe, extra=()):
    """What ``probe()`` returns while a pass (with the ``extra`` hooks attached) is at
    blocks.0.hook_resid_post."""
    seen = []
    run_through(
        model,
        TOKENS[:1],
        "blocks.0.hook_resid_post",
        [*extra, ("blocks.0.hook_resid_post", lambda x, hook: seen.append(probe()))],
    )
    return seen[0]


def test_a_pass_that_hooks_attention_internals_stays_eager():
    model = _bridge("llama")

    def implementation():
        return model.original_model.config._attn_implementation

    assert _seen_during_pass(model, implementation) == "sdpa"
    pattern = []
    read = [("blocks.0.attn.hook_pattern", lambda p, hook: pattern.append(p.shape))]
    assert _seen_during_pass(model, implementation, read) == "eager" and pattern
    assert _pattern_fires(model)  # a persistent user hook on the pattern: eager, and it fires
    assert model.original_model.config._attn_implementation == "eager"
    assert "forward" not in model.blocks[0].attn.__dict__


def test_user_hooks_outside_attention_still_fire_on_the_fast_path():
    model = _bridge("neox")
    got = []
    with model.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", lambda x, hook: got.append(x.shape))]):
        homogenization_profile(model, TOKENS, progress=False)
    assert got and hook_count(model) == 0


def test_an_error_inside_the_pass_restores_everything():
    model = _bridge("gpt2")

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_through(
            model, TOKENS[:1], "blocks.1.hook_resid_post", [("blocks.0.hook_resid_post", boom)]
        )
    assert model.original_model.config._attn_implementation == "eager"
    assert all("forward" not in block.attn.__dict__ for block in model.blocks)
    assert all("forward" not in block.ln1.__dict__ for block in model.blocks)
    assert hook_count(model) == 0


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_norms_run_their_hugging_face_module_unless_hooked_inside(arch):
    """On the fast path an unhooked LayerNorm / RMSNorm bridge runs only its Hugging Face
    module (the bridge's forward computes the statistics twice); a hook on its hook_scale or
    hook_normalized keeps the whole pass on the bridge's own path, and that hook fires."""
    model = _bridge(arch)

    def lean():
        return "forward" in model.blocks[0].ln1.__dict__

    assert _seen_during_pass(model, lean) and not lean()
    scales = []
    read = [("blocks.0.ln1.hook_scale", lambda x, hook: scales.append(x.shape))]
    assert not _seen_during_pass(model, lean, read) and scales


def test_processed_weights_keep_the_bridges_norms():
    """After enable_compatibility_mode() the bridge's norms carry folded weights their Hugging
    Face modules lack: the fast path leaves them alone, and the profile equals eager."""
    model = load_model(tiny_model_folder("gpt2"), backend="bridge")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.enable_compatibility_mode(disable_warnings=True)
    assert not _seen_during_pass(model, lambda: "forward" in model.blocks[0].ln1.__dict__)
    mp = pytest.MonkeyPatch()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fast, eager = _both(
                mp,
                lambda: homogenization_profile(model, TOKENS, attention_mask=MASK, progress=False),
            )
    finally:
        mp.undo()
    _same(fast, eager)


def test_fallback_notice_once_and_switch_off(monkeypatch):
    model = load_model(tiny_model_folder("gemma2"), backend="bridge")
    with pytest.warns(UserWarning, match="eager attention"):
        homogenization_profile(model, TOKENS, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        homogenization_profile(model, TOKENS, progress=False)  # said once per model
    monkeypatch.setattr(fa, "ENABLED", False)
    assert fa.fast_attention_status(_bridge("llama")).startswith("eager: turned off")
