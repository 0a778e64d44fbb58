"""Attention-bias interventions against Hugging Face eager attention given the same bias as a
4D float additive mask (causal -inf plus b * phi), on the tiny model of every family."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import BACKENDS, TOKENS, hook_count
from homoglens import (
    InvalidInputError,
    attention_bias_hooks,
    biased_attention,
    load_model,
)
from homoglens.bias.hooks import AttentionBiasPlan, attention_bias_phi, bias_pattern
from homoglens.models.architectures import ARCHITECTURES
from homoglens.testing import TINY_ARCHS, tiny_model_folder

SHORT = TOKENS[:, :8]  # within every tiny sliding window (8): the window mask never binds
N = SHORT.shape[1]
KINDS = {"first": 2.0, "self": 1.5, "recent": 1.0, "alibi": 0.5, "middle": -1.5}


@functools.cache
def _hf(arch: str):
    return AutoModelForCausalLM.from_pretrained(
        str(tiny_model_folder(arch)), attn_implementation="eager"
    ).eval()


@functools.cache
def _model(arch: str, backend: str):
    return load_model(tiny_model_folder(arch), backend=backend, device="cpu")


def _hf_with_mask(arch: str, bias: torch.Tensor | None) -> torch.Tensor:
    causal = torch.full((N, N), float("-inf")).triu(1)
    mask = causal if bias is None else causal + bias.float()
    with torch.no_grad():
        return _hf(arch)(SHORT, attention_mask=mask[None, None]).logits


READ_ONLY = {"gptneo", "opt", "gptj"}  # TL 4.3's bridge fires their hook_pattern, never uses it


def _cases():
    out = []
    for arch in TINY_ARCHS:
        spec = ARCHITECTURES[arch]
        mark = ()
        if spec.positional == "alibi" or arch == "opt":
            mark = pytest.mark.skip(
                reason=f"{arch}: Hugging Face derives its ALiBi bias or positions from a 2D mask"
            )
        out.append(pytest.param(arch, marks=mark, id=arch))
    return out


@pytest.mark.parametrize("arch", sorted(READ_ONLY))
def test_a_pattern_the_bridge_only_reads_is_refused(arch: str) -> None:
    from homoglens import UnsupportedArchitectureError, sink_attribution

    model = _model(arch, "bridge")
    before = hook_count(model)
    with pytest.raises(UnsupportedArchitectureError, match=f"{arch} model only reads"):
        with biased_attention(model, kind="first", strength=1.0):
            pass
    text = "It is a truth universally acknowledged, that a single man in possession"
    with pytest.raises(UnsupportedArchitectureError, match="only reads"):
        sink_attribution(model, text, heads=[(0, 0)], edge_k=2, progress=False)
    assert hook_count(model) == before


@pytest.mark.parametrize("arch", _cases())
def test_bias_equals_hugging_face_with_a_4d_float_mask(arch: str) -> None:
    # first pin how the installed transformers reads a float 4D mask: as an additive bias
    with torch.no_grad():
        plain = _hf(arch)(SHORT).logits
    assert torch.allclose(_hf_with_mask(arch, None), plain, atol=1e-5)
    backend = "hooked" if arch in READ_ONLY else BACKENDS[-1]
    if backend not in BACKENDS:
        pytest.skip(f"{arch}: the bridge only reads hook_pattern; HookedTransformer needs TL 3.9")
    model = _model(arch, backend)
    before = hook_count(model)
    with torch.no_grad():
        unhooked = model(SHORT)
        for kind, b in KINDS.items():
            phi = attention_bias_phi(kind, N, N, first_k=2, window=3)
            with biased_attention(model, kind=kind, strength=b, first_k=2, window=3):
                got = model(SHORT)
            want = _hf_with_mask(arch, b * phi)
            assert (want - plain).abs().max() > 1e-4, kind  # the bias matters
            assert torch.allclose(got, want, atol=1e-5), (kind, (got - want).abs().max())
            with biased_attention(model, kind=kind, strength=0.0):
                assert torch.equal(model(SHORT), unhooked)  # strength 0: bit for bit
    assert hook_count(model) == before


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_bias_on_each_backend(arch: str, backend: str) -> None:
    model = _model(arch, backend)
    phi = attention_bias_phi("first", N, N)
    with torch.no_grad(), biased_attention(model, kind="first", strength=2.0):
        got = model(SHORT)
    assert torch.allclose(got, _hf_with_mask(arch, 2.0 * phi), atol=1e-5)
    with torch.no_grad():
        plain = _hf(arch)(SHORT).logits
        unhooked = model(SHORT)
        with biased_attention(model, kind="temperature", strength=1.0):
            one = model(SHORT)
        with biased_attention(model, kind="temperature", strength=0.5):
            half = model(SHORT)
    # temperature 1 is the unhooked model: TransformerLens' and Hugging Face's logits
    assert torch.allclose(one, unhooked, atol=1e-6, rtol=0)
    assert torch.allclose(one, plain, atol=1e-5, rtol=0)
    # beta = 0.5: softmax(0.5 * scores), i.e. Hugging Face with its queries halved
    want = _hf_scaled_queries(arch, 0.5)
    assert (want - plain).abs().max() > 1e-4  # the temperature matters
    assert torch.allclose(half, want, atol=1e-5, rtol=0), (half - want).abs().max()
    assert hook_count(model) == 0


def _hf_scaled_queries(arch: str, beta: float) -> torch.Tensor:
    """Logits of a copy of the Hugging Face model whose query projections (weights and bias)
    are multiplied by ``beta`` in every block: its attention scores are beta times the
    original ones (rotary position embeddings are linear in the query), so its attention is
    softmax(beta * scores), what the "temperature" bias of strength beta computes."""
    import copy

    hf = copy.deepcopy(_hf(arch))
    with torch.no_grad():
        if arch == "gpt2":  # c_attn: Conv1D [d_model, 3 d_model], the queries first
            for block in hf.transformer.h:
                d = block.attn.c_attn.weight.shape[0]
                block.attn.c_attn.weight[:, :d] *= beta
                block.attn.c_attn.bias[:d] *= beta
        elif arch == "neox":  # query_key_value: per head [q, k, v], each d_head rows
            for block in hf.gpt_neox.layers:
                qkv, n_heads = block.attention.query_key_value, hf.config.num_attention_heads
                qkv.weight.view(n_heads, 3, -1, qkv.weight.shape[1])[:, 0] *= beta
                qkv.bias.view(n_heads, 3, -1)[:, 0] *= beta
        else:  # llama: q_proj
            for block in hf.model.layers:
                block.self_attn.q_proj.weight *= beta
        return hf(SHORT).logits


def test_mass_rises_with_b_and_kl_grows_from_zero() -> None:
    model = _model("llama", BACKENDS[-1])
    name = "blocks.1.attn.hook_pattern"
    with torch.no_grad():
        _, cache = model.run_with_cache(SHORT, names_filter=name)
    base = cache[name].double()
    masses, kls = [], []
    for b in (-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 4.0):
        hooks = attention_bias_hooks(model, "first", b, layers=[1], heads=[0, 2])
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            _, biased = model.run_with_cache(SHORT, names_filter=name)
        pattern = biased[name].double()[:, [0, 2], 1:]  # rows with more than one key
        old = base[:, [0, 2], 1:]
        masses.append(float(pattern[..., 0].mean()))
        inside = pattern > 0
        kl = torch.where(inside, pattern * (pattern.log() - old.log()), torch.zeros(()))
        kls.append(float(kl.sum(-1).mean()))
        untouched = biased[name][:, [1, 3]]
        assert torch.equal(untouched, cache[name][:, [1, 3]])  # other heads keep theirs
        assert torch.allclose(biased[name].sum(-1), torch.ones(()), atol=1e-6)
    assert all(a < b for a, b in zip(masses, masses[1:], strict=False)), masses
    assert kls[2] == 0.0 and all(k > 0 for i, k in enumerate(kls) if i != 2)
    assert kls[1] < kls[0] and kls[3] < kls[4] < kls[5] < kls[6]


def test_temperature_matches_scaled_scores() -> None:
    """beta on the pattern equals softmax(beta * scores): read the scores the model computed."""
    model = _model("gpt2", BACKENDS[-1])
    names = ["blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern"]
    with torch.no_grad(), biased_attention(model, kind="temperature", strength=0.3):
        _, cache = model.run_with_cache(SHORT, names_filter=names)
    want = torch.softmax(0.3 * cache[names[0]].double(), dim=-1)
    assert torch.allclose(cache[names[1]].double(), want, atol=1e-6)


def test_phi_definitions() -> None:
    first = attention_bias_phi("first", 5, 5, first_k=2)
    assert first[4].tolist() == [1, 1, 0, 0, 0] and first[0].tolist() == [1, 0, 0, 0, 0]
    assert attention_bias_phi("self", 3, 3).tolist() == torch.eye(3).tolist()
    assert attention_bias_phi("recent", 5, 5, window=2)[4].tolist() == [0, 0, 0, 1, 1]
    assert attention_bias_phi("alibi", 4, 4)[3].tolist() == [-3, -2, -1, 0]
    assert attention_bias_phi("middle", 9, 9)[8].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert not attention_bias_phi("temperature", 3, 3).any()


def test_bad_input_is_typed_and_attaches_nothing() -> None:
    model = _model("gpt2", BACKENDS[-1])
    for kwargs, match in (
        ({"kind": "edges", "strength": 1.0}, "kind="),
        ({"kind": "first", "strength": math.nan}, "strength="),
        ({"kind": "first", "strength": math.inf}, "strength="),
        ({"kind": "first", "strength": "big"}, "strength="),
        ({"kind": "temperature", "strength": 0.0}, "must be > 0"),
        ({"kind": "temperature", "strength": -1.0}, "must be > 0"),
        ({"kind": "first", "strength": 1.0, "layers": [2]}, "layers"),
        ({"kind": "first", "strength": 1.0, "heads": [4]}, "heads"),
        ({"kind": "first", "strength": 1.0, "heads": [0, 0]}, "repeated"),
        ({"kind": "first", "strength": 1.0, "first_k": 0}, "first_k"),
        ({"kind": "recent", "strength": 1.0, "window": 0}, "window"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            with biased_attention(model, **kwargs):
                pass
    assert hook_count(model) == 0
    with pytest.raises(RuntimeError, match="inside"):
        with biased_attention(model, kind="first", strength=1.0):
            raise RuntimeError("inside")
    assert hook_count(model) == 0


def test_array_indices_huge_and_complex_strengths() -> None:
    import numpy as np

    model = _model("llama", BACKENDS[-1])
    for heads in (np.array([0, 2]), torch.tensor([0, 2]), [np.int64(0), 2]):
        assert len(attention_bias_hooks(model, "first", 1.0, heads=heads, layers=np.int64(1))) == 1
    for bad in (torch.tensor([[0]]), np.array([[0, 1]])):
        with pytest.raises(InvalidInputError, match="heads"):
            attention_bias_hooks(model, "first", 1.0, heads=bad)
    for strength in (1e308, -1e5, np.complex128(1 + 2j), torch.tensor(1 + 0j)):
        with pytest.raises(InvalidInputError, match="strength"):
            attention_bias_hooks(model, "alibi", strength)
    with pytest.raises(InvalidInputError, match="strength"):
        attention_bias_hooks(model, "temperature", 1e5)
    from homoglens import ablated_positions

    with torch.no_grad(), ablated_positions(model, "zero", layers=np.array([0])):
        model(SHORT)
    assert hook_count(model) == 0


@pytest.mark.parametrize("kind", ["first", "self", "recent", "alibi", "middle"])
@pytest.mark.parametrize("n", [7, 200])
def test_bias_pattern_equals_float64_log_space(kind: str, n: int) -> None:
    """The closed form (row blocks of the lower triangle for n >= 128) against
    log_softmax(log A + b phi) and its checks in float64, on peaked causal patterns; b = -20 on
    "first" is where the mass on the other keys was once taken as 1 - m (an error of 4e-4)."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, n, n, generator=gen, dtype=torch.float64) * 4
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    pattern = torch.softmax(scores, -1)
    for b in (-20.0, -1.0, 0.0, 2.0):
        for first_k in (1, 3):
            plan = AttentionBiasPlan(kind, b, 1.0, first_k, 4, (0,), None)
            biased, checks = bias_pattern(pattern.float(), plan, checks=True)
            phi = attention_bias_phi(kind, n, n, first_k=first_k, window=4)
            log_ref = torch.log_softmax(torch.log(pattern) + b * phi, -1)
            ref = log_ref.exp()
            mass = (ref * phi).sum(-1)
            scale = phi.abs().amax().clamp_min(1.0)
            entropy = -torch.special.xlogy(ref, ref).sum(-1)
            kl = (torch.special.xlogy(ref, ref) - torch.special.xlogy(ref, pattern)).sum(-1)
            torch.testing.assert_close(biased.double(), ref, atol=2e-6, rtol=0)
            assert checks is not None
            torch.testing.assert_close(checks[..., 0] / scale, mass / scale, atol=2e-6, rtol=0)
            torch.testing.assert_close(checks[..., 1], entropy, atol=2e-5, rtol=0)
            torch.testing.assert_close(checks[..., 2], kl.clamp_min(0), atol=2e-5, rtol=0)


def test_bias_pattern_reads_a_non_causal_pattern_whole() -> None:
    """A pattern whose first query attends later keys is not causal: every key is biased, and
    a reused output buffer is left alone (it only ever holds causal patterns)."""
    n = 160
    pattern = torch.softmax(torch.randn(1, 2, n, n, generator=torch.Generator().manual_seed(1)), -1)
    plan = AttentionBiasPlan("first", 1.5, 1.0, 1, 4, (0,), None)
    out = torch.zeros_like(pattern)
    biased, _ = bias_pattern(pattern, plan, out=out)
    w = torch.full((n,), math.exp(-1.5))
    w[0] = 1.0
    ref = pattern * w / (pattern * w).sum(-1, keepdim=True)
    torch.testing.assert_close(biased, ref, atol=1e-6, rtol=0)
    assert not out.any()


@pytest.mark.parametrize("arch", _cases())
def test_the_study_equals_hugging_face_with_a_4d_float_mask(arch: str, monkeypatch) -> None:
    """attention_bias_study biases each block a few query rows at a time inside the attention
    function (homoglens.run.blocked_attention): its per-window loss at each strength equals Hugging
    Face eager attention given the same bias as a 4D float mask, within 1e-4, with the queries
    split into blocks of 3 rows (the rows' offsets into phi exercised)."""
    import homoglens.run.blocked_attention as blocked
    from homoglens import attention_bias_study, fast_attention_status
    from homoglens.run.losses import next_token_loss

    if arch in READ_ONLY and fast_attention_status(_model(arch, "bridge")) != "sdpa":
        pytest.skip(f"{arch}: no attention function to serve; the bridge only reads the pattern")
    model = _model(arch, "bridge")
    row = 2 * model.cfg.n_heads * N * 4  # bytes of one query row of scores, batch 2
    monkeypatch.setitem(blocked.BLOCK_BYTES, "cpu", 3 * row)
    windows = torch.cat([SHORT, TOKENS[:, -N:]])  # two windows of N tokens
    for kind, b in KINDS.items():
        study = attention_bias_study(
            model,
            windows,
            kind=kind,
            strengths=[0.0, b],
            first_k=2,
            window=3,
            edge_k=2,
            batch_size=2,
            progress=False,
        )
        phi = attention_bias_phi(kind, N, N, first_k=2, window=3)
        causal = torch.full((N, N), float("-inf")).triu(1)
        with torch.no_grad():
            logits = _hf(arch)(windows, attention_mask=(causal + b * phi).float()[None, None])
        want = next_token_loss(logits.logits, windows, torch.ones_like(windows)).double()
        got = study.window_loss[study.strengths.index(b)]
        assert torch.allclose(got, want, atol=1e-4), (kind, (got - want).abs().max())
    assert hook_count(model) == 0
