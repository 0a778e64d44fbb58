"""Every family of the architecture table, on each backend that loads it: the profile against
a float64 Hugging Face oracle, positional ablations against Hugging Face ``position_ids``, the
patching invariant, and a family outside the table."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import (
    AUSTEN_TEXTS,
    BACKENDS,
    PERM,
    TOKENS,
    T,
    cosine_oracle,
    hook_count,
    outside_the_table,
)
from homoglens import (
    HomogenizationProfile,
    UnsupportedArchitectureError,
    ablated_positions,
    architecture_of,
    homogenization_profile,
    load_model,
    positional_patching,
    to_token_batch,
)
from homoglens.models.architectures import ARCHITECTURES
from homoglens.testing import TINY_ARCHS, tiny_model_folder

ONES = torch.ones_like(TOKENS)


@functools.cache
def _hf(arch: str, dtype: torch.dtype = torch.float32):
    folder = str(tiny_model_folder(arch))
    return AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=dtype
    ).eval()


@functools.cache
def _load(arch: str, backend: str):
    try:
        return load_model(tiny_model_folder(arch), backend=backend, device="cpu")
    except UnsupportedArchitectureError as err:
        return err


def _model(arch: str, backend: str):
    """The tiny model of a family; a skip, with TransformerLens' reason, where the backend
    does not load the family (HookedTransformer 3.9 lacks some)."""
    model = _load(arch, backend)
    if isinstance(model, UnsupportedArchitectureError):
        pytest.skip(f"{arch} on {backend}: {model}")
    return model


@functools.cache
def _own_hooks(arch: str, backend: str) -> int:
    """Hooks TransformerLens itself attaches when it boots the model (OPT's bridge: 6)."""
    return hook_count(_model(arch, backend))


def _family(arch: str):
    return next(s for s in ARCHITECTURES.values() if s.family == arch)


def _params():
    return [pytest.param(a, b, id=f"{a}-{b}") for a in TINY_ARCHS for b in BACKENDS]


def _hf_logits(arch: str, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return _hf(arch)(TOKENS, attention_mask=ONES, **kwargs).logits


def _oracle(arch: str, positions: torch.Tensor) -> torch.Tensor:
    """Hugging Face logits with every token at ``positions``: ``position_ids`` for learned and
    rotary families; for ALiBi, the model's own bias builder asked for the bias of those
    positions (slope_h * position of the key, the form BLOOM and MPT add)."""
    spec = _family(arch)
    if spec.positional != "alibi":
        return _hf_logits(arch, position_ids=positions[None])
    hf = _hf(arch)
    owner = functools.reduce(getattr, spec.hf_position_module.split(".")[:-1], hf)
    name = spec.hf_position_module.split(".")[-1]
    build = getattr(owner, name)
    if arch == "bloom":
        slopes = build(torch.ones(1, 2), hf.config.n_head, torch.float32).reshape(-1, 2)[:, 1]

        def biased(mask, n_heads, dtype):
            return (slopes[:, None] * positions[None].float()).reshape(n_heads, 1, T).to(dtype)
    else:
        full = build(hf.config.n_heads, 2, hf.config.attn_config.alibi_bias_max)
        slopes = full[:, 0, 1] - full[:, 0, 0]

        def biased(n_heads, length, bias_max=8, device=None):
            return (slopes[:, None] * positions[None].float())[:, None, :]

    setattr(owner, name, biased)
    try:
        return _hf_logits(arch)
    finally:
        delattr(owner, name)  # the class's method again


def _run(model, how=None, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        if how is None:
            return model(TOKENS)
        with ablated_positions(model, how, **kwargs):
            return model(TOKENS)


def test_the_table_and_the_tiny_families_agree() -> None:
    assert set(TINY_ARCHS) == set(ARCHITECTURES), "every row needs a tiny model"
    assert len(ARCHITECTURES) == 20


@pytest.mark.parametrize(("arch", "backend"), _params())
def test_profile_equals_float64_hidden_states(arch: str, backend: str) -> None:
    model = _model(arch, backend)
    assert architecture_of(model).family == arch
    batch = to_token_batch(model, AUSTEN_TEXTS)
    prof = homogenization_profile(model, AUSTEN_TEXTS, progress=False)
    with torch.no_grad():
        hidden = _hf(arch, torch.float64)(
            batch.tokens, attention_mask=batch.attention_mask, output_hidden_states=True
        ).hidden_states
    n_layers = int(model.cfg.n_layers)
    for layer in range(n_layers):  # entry n_layers of HF carries the final norm
        to_others, pairwise = cosine_oracle(hidden[layer], batch.attention_mask)
        got = prof.to_others[layer]
        assert torch.allclose(got.double(), to_others[: got.shape[0]], atol=1e-4), layer
        assert abs(float(prof.mean_pairwise[layer]) - float(pairwise)) < 1e-4, layer
    alone = HomogenizationProfile.merge(
        *[homogenization_profile(model, text, progress=False) for text in AUSTEN_TEXTS]
    )
    for name in ("to_others", "mean_pairwise", "norm"):
        a, b = getattr(prof, name), getattr(alone, name)
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5, equal_nan=True), name


@pytest.mark.parametrize(("arch", "backend"), _params())
def test_ablations_equal_hugging_face_position_ids(arch: str, backend: str) -> None:
    model = _model(arch, backend)
    _own_hooks(arch, backend)
    spec = architecture_of(model)
    if backend == "bridge" and not spec.bridge_position_hooks:
        with pytest.raises(UnsupportedArchitectureError, match=spec.family):
            _run(model, "zero")
        assert hook_count(model) == _own_hooks(arch, backend)
        pytest.skip(f"{arch}: the bridge exposes no positional hook ({spec.caveats})")
    base = _run(model)
    assert torch.allclose(base, _hf_logits(arch), atol=1e-4)
    zero = _run(model, "zero")
    assert (zero - base).abs().max() > 1e-3, "the ablation must matter"
    if spec.positional == "learned_absolute":
        hf = _hf(arch)
        table = functools.reduce(getattr, spec.hf_position_module.split("."), hf).weight
        kept = table.data.clone()
        table.data.zero_()
        try:
            want = _hf_logits(arch)
        finally:
            table.data.copy_(kept)
    else:
        want = _oracle(arch, torch.zeros(T, dtype=torch.long))
    assert torch.allclose(zero, want, atol=1e-4)
    permuted = _run(model, "permute", perm=PERM)
    assert torch.allclose(permuted, _oracle(arch, PERM), atol=1e-4)
    shifted = _run(model, "shift", shift=5)
    assert torch.allclose(shifted, _oracle(arch, torch.arange(T) + 5), atol=1e-4)
    assert torch.allclose(_run(model, "permute", perm=torch.arange(T)), base, atol=1e-6)
    assert torch.allclose(_run(model, "shift", shift=0), base, atol=1e-6)
    if spec.positional != "learned_absolute":  # attention depends only on i - j
        assert torch.allclose(shifted, base, atol=1e-4)
    assert hook_count(model) == _own_hooks(arch, backend)


@pytest.mark.parametrize(("arch", "backend"), _params())
def test_restoring_the_residual_stream_restores_the_metric(arch: str, backend: str) -> None:
    model = _model(arch, backend)
    _own_hooks(arch, backend)
    spec = architecture_of(model)
    if backend == "bridge" and not spec.bridge_position_hooks:
        pytest.skip(f"{arch}: no positional ablation on the bridge")
    n_layers = int(model.cfg.n_layers)
    first = 0 if spec.positional == "learned_absolute" else 1  # entry 0 holds no rotation
    sites = ["resid_pre"] + (["resid_mid"] if spec.has_resid_mid else [])
    for site in sites:
        for layer in range(n_layers):
            if site == "resid_pre" and layer < first:
                continue
            result = positional_patching(
                model,
                AUSTEN_TEXTS[:2],
                component=site,
                metric="mean_pairwise",
                metric_layer=layer if site == "resid_pre" else layer + 1,
                layers=[layer],
                bins=1,
                progress=False,
            )
            effect = result.effect[0].flatten().tolist()
            # effect = (patched - ablated) / (normal - ablated): float32 noise over a small gap
            assert effect == pytest.approx([1.0], abs=1e-3), (site, layer)
    assert hook_count(model) == _own_hooks(arch, backend)


@pytest.mark.parametrize(("arch", "backend"), _params())
def test_zero_scores_are_unrotated_q_dot_k(arch: str, backend: str) -> None:
    """Under "zero" every token is rotated as position 0 (no rotation): the scores of block 0
    are the plain q.k times the model's scale, q and k read before the rotation."""
    model = _model(arch, backend)
    spec = architecture_of(model)
    if spec.positional != "rotary" or (backend == "bridge" and not spec.bridge_position_hooks):
        pytest.skip(f"{arch}: no rotary ablation here")
    if backend == "bridge" and spec.bridge_prerotates:  # hook_q/k carry the ablation itself
        pytest.skip(f"{arch}: checked from the pattern in tests/oracles/test_gptj_positions.py")
    names = [n for n in model.hook_dict if n.startswith("blocks.0.attn.")]
    with torch.no_grad(), ablated_positions(model, "zero"):
        _, cache = model.run_with_cache(TOKENS, names_filter=names)
    n_heads = int(model.cfg.n_heads)

    def read(part: str) -> torch.Tensor:  # the input of the rotation (after any q/k norm)
        found = [
            cache[f"blocks.0.attn.{name}"]
            for name in (f"hook_{part}_normed", f"{part}_norm.hook_out")
            if f"blocks.0.attn.{name}" in cache.keys()
        ]
        normed = f"blocks.0.attn.{part}_norm.hook_normalized"
        if found:
            x = found[0]
        elif normed in cache.keys():  # HookedTransformer: RMSNorm's hook is before its weight
            x = cache[normed] * getattr(model.blocks[0].attn, f"{part}_norm").w
        else:
            x = cache[f"blocks.0.attn.hook_{part}"]
        if x.ndim == 2:  # [batch*pos*heads d_head]
            x = x.reshape(1, T, -1, x.shape[-1])
        if x.ndim == 3:  # [batch pos heads*d_head]
            x = x.view(x.shape[0], T, -1, int(model.cfg.d_head))
        return x.transpose(1, 2) if x.shape[1] != T else x  # -> [batch pos head d_head]

    q, k = read("q"), read("k")
    k = k.repeat_interleave(n_heads // k.shape[2], dim=2)  # grouped-query heads
    raw = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double())
    scores = cache["blocks.0.attn.hook_attn_scores"].double()
    valid = torch.tril(torch.ones(T, T, dtype=torch.bool)) & (scores > -1e30)  # mask, window
    scale = scores[..., 0, 0] / raw[..., 0, 0]  # position 0 is unrotated in every run
    assert torch.allclose(scale, torch.full_like(scale, float(scale.flatten()[0])), rtol=1e-4)
    want = raw * scale[..., None, None]
    assert torch.allclose(scores[valid], want[valid], atol=1e-4)
    with torch.no_grad():
        _, normal = model.run_with_cache(TOKENS, names_filter=names)
    moved = (normal["blocks.0.attn.hook_attn_scores"].double() - scores)[valid]
    assert moved.abs().max() > 1e-4, "the rotation must matter"


def test_a_family_outside_the_table_is_measured_but_not_ablated(tmp_path_factory) -> None:
    from homoglens import (
        massive_activations,
        model_info,
        sink_scores,
    )

    folder = outside_the_table(tmp_path_factory.mktemp("granite"))
    model = load_model(folder, backend="bridge", device="cpu")
    assert model_info(model).family == "GraniteForCausalLM"
    prof = homogenization_profile(model, AUSTEN_TEXTS, progress=False)
    assert prof.provenance.family == "GraniteForCausalLM"
    assert torch.isfinite(prof.mean_pairwise).all()
    assert torch.isfinite(sink_scores(model, AUSTEN_TEXTS, progress=False).mass).all()
    assert massive_activations(model, AUSTEN_TEXTS, progress=False) is not None
    residual = positional_patching(
        model, AUSTEN_TEXTS[:2], how="none", bins=1, layers=[1], progress=False
    )
    assert residual.patched.isfinite().all()
    for call in (
        lambda: ablated_positions(model, "zero").__enter__(),
        lambda: positional_patching(model, AUSTEN_TEXTS[:2], how="zero", progress=False),
    ):
        with pytest.raises(UnsupportedArchitectureError, match="GraniteForCausalLM.*gpt2"):
            call()
    assert hook_count(model) == 0


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_combinations_that_make_no_sense_name_the_family(arch: str) -> None:
    from homoglens import InvalidInputError, position_ablation_hooks

    model = _model(arch, BACKENDS[-1])
    spec = architecture_of(model)
    if spec.positional == "learned_absolute":
        with pytest.raises(InvalidInputError, match=f"learned-absolute model \\({arch}\\)"):
            position_ablation_hooks(model, "zero", layers=[0])
    else:
        kind = "rotary" if spec.positional == "rotary" else "ALiBi"
        with pytest.raises(InvalidInputError, match=f"{arch} models use .*{kind}"):
            position_ablation_hooks(model, "mean")
    assert hook_count(model) == _own_hooks(arch, BACKENDS[-1])
