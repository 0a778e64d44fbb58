"""Sink scores (Gu et al. 2024 definitions) and massive activations (Sun et al. 2024)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import (
    BACKENDS,
    SHORT_TEXTS,
    hf_model,
    hf_module,
    hf_resid_and_logits,
    hf_run,
    hook_count,
    reseal,
)
from homoglens import (
    InvalidInputError,
    MassiveActivations,
    corpus_windows,
    load_model,
    massive_activation_means,
    massive_activations,
    sink_scores,
    to_token_batch,
)
from homoglens.sinks import sink_sums
from homoglens.testing import tiny_model_folder

T = 64


def test_all_attention_on_key_zero() -> None:
    pattern = torch.zeros(2, 3, T, T)
    pattern[..., 0] = 1.0
    sums = sink_sums(pattern, torch.tensor([T, T]), key=0)
    assert torch.allclose(sums["mass_sum"] / sums["mass_count"], torch.ones(3, dtype=torch.float64))
    assert torch.allclose(sums["importance_sum"] / 2, torch.ones(3, dtype=torch.float64))
    assert torch.equal(sums["sink_count"], torch.full((3,), 2.0, dtype=torch.float64))  # 100 %


@pytest.mark.parametrize("key, alpha", [(0, 0.074123), (1, 0.059427), (63, 0.015625)])
def test_uniform_causal_attention_matches_gu_et_al(key: int, alpha: float) -> None:
    causal = torch.ones(T, T, dtype=torch.float64).tril()
    pattern = (causal / causal.sum(-1, keepdim=True))[None, None]
    sums = sink_sums(pattern, torch.tensor([T]), key=key, eps=0.3)
    assert sums["importance_sum"].item() == pytest.approx(alpha, abs=1e-6)
    assert sums["sink_count"].item() == 0.0  # Sink 0 %
    harmonic = sum(1 / i for i in range(1, T + 1))
    if key == 0:
        assert sums["importance_sum"].item() == pytest.approx(harmonic / T, abs=1e-12)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_mass_equals_hand_computation_with_padding(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    texts = ["The cat sat on the mat and looked around.", "A dog ran.", "Birds sing in trees"]
    scores = sink_scores(model, texts, batch_size=2, progress=False)
    batch = to_token_batch(model, texts)
    mass = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.float64)
    for i in range(len(texts)):
        n = int(batch.lengths[i])
        _, cache = model.run_with_cache(batch.tokens[i : i + 1, :n])
        for layer in range(model.cfg.n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0].double()  # [head q k]
            mass[layer] += pattern[:, 1:n, 0].mean(-1)
    assert torch.allclose(scores.mass, mass / len(texts), atol=1e-6)
    assert scores.n_sequences == 3 and scores.provenance.bos is not None
    assert hook_count(model) == 0


def test_sink_scores_tables_and_plot(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    scores = sink_scores(model, corpus_windows(model, n_seq=3, seq_len=16), progress=False)
    top = scores.top_heads(3)
    assert list(top.columns) == ["layer", "head", "mass", "importance", "sink_rate"]
    assert top["mass"].is_monotonic_decreasing
    assert len(scores.to_pandas()) == model.cfg.n_layers * model.cfg.n_heads
    assert 0.0 <= scores.sink_rate <= 100.0
    assert math.isnan(scores.mass_by_query[0, 0, 0].item())  # q <= key undefined
    assert len(scores.plot().axes) >= 2
    assert scores.key_holds_bos is True  # GPT-2 prepends a BOS by default
    plain = sink_scores(model, ["The cat sat on the mat."], bos="never", key=1, progress=False)
    assert plain.key_holds_bos is False and plain.provenance.bos is False


def test_sink_bad_input(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    for kwargs, match in (
        ({"key": 200}, "key="),
        ({"key": -1}, "key="),
        ({"eps": 1.5}, "eps="),
        ({"eps": 0}, "eps="),
        ({"key": 5}, "lies outside"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            sink_scores(model, ["one two three"], progress=False, **kwargs)
    assert hook_count(model) == 0


def test_massive_activations_find_a_planted_dimension(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    name = "blocks.0.hook_resid_post"

    def plant(resid, hook):
        resid = resid.clone()
        resid[:, 0, 7] = 1e4  # a massive activation on the first token, dimension 7
        return resid

    model.add_hook(name, plant)
    try:
        found = massive_activations(
            model, corpus_windows(model, n_seq=2, seq_len=10), progress=False
        )
    finally:
        model.reset_hooks()
    assert found.top_dims(1).loc[1, "dims"] == [7]
    assert found.ratio_mean[1, 0] > 1000 and found.ratio_mean[1, 1:].max() < 100
    assert hook_count(model) == 0
    with pytest.raises(InvalidInputError, match="threshold"):
        massive_activations(model, ["one two"], threshold=1)


def _hand_to_others(resid: torch.Tensor) -> torch.Tensor:
    """[batch pos] mean cosine to the other tokens, from the full cosine matrix."""
    u = torch.nn.functional.normalize(resid.double(), dim=-1)
    cos = u @ u.transpose(1, 2)
    t = cos.shape[-1]
    return (cos.sum(-1) - cos.diagonal(dim1=1, dim2=2)) / (t - 1)


def _hand_metrics(to_others: torch.Tensor, k: int) -> torch.Tensor:
    """mean_pairwise, first_excess, last_excess of equal-length sequences (key 0)."""
    first, middle, last = to_others[:, 1 : 1 + k], to_others[:, 1 + k : -k], to_others[:, -k:]
    return torch.stack(
        [to_others.mean(), first.mean() - middle.mean(), last.mean() - middle.mean()]
    )


def _resid_with(model, tokens, layer, hooks) -> torch.Tensor:
    name = f"blocks.{layer - 1}.hook_resid_post"
    with model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(tokens, names_filter=name)
    return cache[name]


def _hf_resid(arch: str, tokens: torch.Tensor, layer: int, edits=()) -> torch.Tensor:
    """Residual entry ``layer`` of the plain Hugging Face model (float32, eager attention) with
    plain torch module hooks (:func:`helpers.hf_run`)."""
    return hf_resid_and_logits(hf_model(arch), arch, tokens, layer, edits)[0]


def _head_slice(model, head: int) -> slice:
    """Head ``head``'s columns of the input of the attention's output projection."""
    d_head = int(model.cfg.d_head)
    return slice(head * d_head, (head + 1) * d_head)


def _hf_without_sink(model, arch: str, tokens: torch.Tensor, layer: int, heads: list[int]):
    """The edit (:func:`helpers.hf_run`) that removes ``heads``' attention to key 0 in block
    ``layer`` of the plain Hugging Face model, each row renormalised, computed in float64 from
    Hugging Face's own attention probabilities (``output_attentions``, eager): the head's output
    becomes z'[q] = (z[q] - A[q, 0] v[0]) / (1 - A[q, 0]), where v[0] = z[0] (query 0 attends
    key 0 alone), written into the input of the block's output projection. ``layer`` must be
    0 (A is read from the normal run; the first block's is the ablated run's too)."""
    assert layer == 0
    hf = hf_model(arch)
    attn = hf_run(hf, tokens, output_attentions=True).attentions[layer].double()
    assert torch.allclose(attn.sum(-1), torch.ones((), dtype=torch.float64), atol=1e-6)

    def remove_sink(z: torch.Tensor) -> torch.Tensor:
        z = z.clone()
        for head in heads:
            cols = _head_slice(model, head)
            zh, to_sink = z[..., cols].double(), attn[:, head, :, 0, None]  # [batch query 1]
            rest = 1.0 - to_sink
            without = (zh - to_sink * zh[:, :1]) / rest.clamp_min(1e-30)
            z[..., cols] = torch.where(rest > 0, without, zh).to(z.dtype)
        return z

    return hf_module(hf, arch, layer, "out_proj"), "input", remove_sink


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_exact_attribution_equals_hugging_face_without_the_sink(arch, backend, get_model) -> None:
    """The ablated run against the plain Hugging Face model without the head's attention to
    the sink (:func:`_hf_without_sink`), the metrics in float64 from its block output."""
    from homoglens import sink_attribution

    model = get_model(arch, backend)
    batch = corpus_windows(model, n_seq=3, seq_len=24)
    layer, head, measured, k = 0, 1, model.cfg.n_layers, 3
    edit = _hf_without_sink(model, arch, batch.tokens, layer, [head])
    base = _hand_to_others(_hf_resid(arch, batch.tokens, measured))
    ablated = _hand_to_others(_hf_resid(arch, batch.tokens, measured, [edit]))
    result = sink_attribution(model, batch, heads=[(layer, head), (1, 0)], edge_k=k, progress=False)
    want = (ablated - base).mean(0)
    assert want.abs().max() > 1e-3  # the ablation matters
    assert torch.allclose(result.base_to_others, base.mean(0), atol=1e-6)
    assert torch.allclose(result.delta_to_others[0], want, atol=1e-6)
    assert torch.allclose(result.base, _hand_metrics(base, k), atol=1e-6)
    assert torch.allclose(
        result.delta[0], _hand_metrics(ablated, k) - _hand_metrics(base, k), atol=1e-6
    )
    assert result.rerun.startswith("from the ablated block") == (backend == "hooked")
    table = result.summary()
    assert list(table["layer"]) == ["0", "1", "sum", "joint"]
    assert table["delta_mean_pairwise"][2] == pytest.approx(float(result.delta[:, 0].sum()))
    assert hook_count(model) == 0


def test_mean_ablation_equals_hugging_face_with_the_mean_head_output(backend, get_model) -> None:
    """Mean ablation against the plain Hugging Face model: head 2's slice of the input of block
    1's output projection, averaged in float64 over every token of a normal run, then written
    at every position of a second run (torch hooks)."""
    from homoglens import sink_attribution

    model = get_model("neox", backend)
    batch = corpus_windows(model, n_seq=3, seq_len=20)
    layer, head, k = 1, 2, 2
    tokens = batch.tokens
    out_proj = hf_module(hf_model("neox"), "neox", layer, "out_proj")
    cols, seen = _head_slice(model, head), {}

    def record(z: torch.Tensor) -> torch.Tensor:
        seen["mean"] = z[..., cols].double().mean((0, 1))
        return z

    def replace(z: torch.Tensor) -> torch.Tensor:
        z = z.clone()
        z[..., cols] = seen["mean"].to(z.dtype)
        return z

    base = _hand_to_others(_hf_resid("neox", tokens, 2, [(out_proj, "input", record)]))
    ablated = _hand_to_others(_hf_resid("neox", tokens, 2, [(out_proj, "input", replace)]))
    result = sink_attribution(
        model, batch, heads=[(layer, head)], ablation="mean", layer=2, edge_k=k, progress=False
    )
    assert (ablated - base).abs().max() > 1e-3
    assert torch.allclose(result.base, _hand_metrics(base, k), atol=1e-6)
    assert torch.allclose(result.delta_to_others[0], (ablated - base).mean(0), atol=1e-6)
    assert torch.allclose(
        result.delta[0], _hand_metrics(ablated, k) - _hand_metrics(base, k), atol=1e-6
    )
    assert result.joint_delta is None  # one head: no joint ablation
    assert hook_count(model) == 0


def test_attribution_bad_input(get_model) -> None:
    from homoglens import sink_attribution

    model = get_model("gpt2", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=2, seq_len=24)
    for kwargs, match in (
        ({"heads": [(5, 0)]}, "must be below 2"),
        ({"heads": [(1, 0)], "layer": 1}, "must be below 1"),  # a head after the measured entry
        ({"heads": [(0, 9)]}, "head index"),
        ({"heads": [(0, 1), (0, 1)]}, "repeats"),
        ({"heads": [3]}, "pairs"),
        ({"heads": "0,1"}, "pairs"),
        ({"method": "slow"}, "method="),
        ({"ablation": "zero"}, "ablation="),
        ({"layer": 9}, "layer="),
        ({"layer": 0}, "layer="),
        ({"key": -1}, "key="),
        ({"key": 30}, "key="),
        ({"edge_k": 20}, "edge_k"),
        ({"top_k": 0}, "top_k"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            sink_attribution(model, batch, progress=False, **kwargs)
    assert hook_count(model) == 0


@pytest.mark.parametrize("ablation", ["sink", "mean"])
def test_fast_attribution_is_the_first_order_of_exact(backend, ablation) -> None:
    """Attribution patching == (exact effect of a tiny partial ablation) / its size, for every
    metric, and ranks heads like the full exact ablation."""
    from homoglens import sink_attribution
    from homoglens.run.hooks import remove_sink_hook

    model = load_model(tiny_model_folder("llama"), backend=backend, dtype=torch.float64)
    batch = corpus_windows(model, n_seq=3, seq_len=20)
    k, last = 3, model.cfg.n_layers
    fast = sink_attribution(
        model, batch, method="fast", ablation=ablation, edge_k=k, progress=False
    )
    n_heads = model.cfg.n_heads
    assert len(fast.heads) == last * n_heads and fast.delta_to_others is None
    base = _hand_metrics(_hand_to_others(_resid_with(model, batch.tokens, last, [])), k)
    assert torch.allclose(fast.base, base, atol=1e-9)
    # Central differences; the bridge's float64 forward carries ~1e-9 noise, so eps = 1e-3.
    eps = 1e-3
    for layer, head in ((0, 1), (1, 2)):
        if ablation == "sink":
            name = f"blocks.{layer}.attn.hook_pattern"
            hooks = [(name, remove_sink_hook([head], 0, scale=s)) for s in (eps, -eps)]
        else:
            name = f"blocks.{layer}.attn.hook_z"
            _, cache = model.run_with_cache(batch.tokens, names_filter=name)
            mean = cache[name][:, :, head].mean((0, 1))

            def nudge(scale, head=head, mean=mean):
                def hook(z, hook):
                    z = z.clone()
                    z[:, :, head] += scale * (mean - z[:, :, head])
                    return z

                return hook

            hooks = [(name, nudge(s)) for s in (eps, -eps)]
        up, down = (
            _hand_metrics(_hand_to_others(_resid_with(model, batch.tokens, last, [h])), k)
            for h in hooks
        )
        slope = (up - down) / (2 * eps)
        got = fast.delta[layer * n_heads + head]
        assert torch.allclose(slope, got, rtol=3e-3, atol=2e-6), (slope - got).tolist()
    heads = [(i, h) for i in range(last) for h in range(n_heads)]
    exact = sink_attribution(
        model, batch, heads=heads, ablation=ablation, edge_k=k, joint=False, progress=False
    )
    assert exact.correlation(fast) > 0.9
    assert all(p.grad is None for p in model.parameters())  # no parameter gradients touched
    assert hook_count(model) == 0 and not torch.is_inference_mode_enabled()


def test_attribution_results_round_trip_and_plot(tmp_path, get_model) -> None:
    from homoglens import (
        IncompatibleResultsError,
        MassiveActivations,
        ResultsNotFoundError,
        SinkAttribution,
        SinkScores,
        attention_view,
        sink_attribution,
    )

    model = get_model("gpt2", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=2, seq_len=24)
    exact = sink_attribution(model, batch, top_k=3, edge_k=3, progress=False)
    fast = sink_attribution(model, batch, method="fast", edge_k=3, progress=False)
    scores = sink_scores(model, batch, progress=False)
    top = scores.top_heads(3)
    assert list(exact.heads) == list(zip(top["layer"], top["head"], strict=True))
    loaded_scores = SinkScores.load(scores.save(tmp_path / "scores"))
    assert torch.equal(loaded_scores.mass, scores.mass) and loaded_scores.key == scores.key
    massive = massive_activations(model, batch, progress=False)
    loaded_massive = MassiveActivations.load(massive.save(tmp_path / "massive"))
    assert loaded_massive.layers == massive.layers
    assert torch.equal(loaded_massive.dim_counts, massive.dim_counts)
    assert len(massive.plot().axes) >= 1
    with pytest.raises(ResultsNotFoundError):
        SinkScores.load(tmp_path / "nothing")
    meta = tmp_path / "scores" / "sink_scores.json"
    meta.write_text(meta.read_text().replace("SinkScores/1", "SinkScores/9"))
    reseal(tmp_path / "scores")  # the format itself, not the sha256, refuses it
    with pytest.raises(IncompatibleResultsError, match="SinkScores/1"):
        SinkScores.load(tmp_path / "scores")
    for result in (exact, fast):
        loaded = SinkAttribution.load(result.save(tmp_path / result.method))
        assert loaded.heads == result.heads and loaded.rerun == result.rerun
        assert torch.equal(loaded.delta, result.delta)
        assert (loaded.joint_delta is None) == (result.joint_delta is None)
        assert len(result.plot().axes) >= 1
        assert len(result.to_pandas()) == len(result.heads)
    one = sink_attribution(
        model, batch, method="fast", edge_k=3, metrics=["first_excess"], progress=False
    )
    assert torch.allclose(one.delta[:, 1], fast.delta[:, 1], atol=1e-9)
    assert one.delta[:, [0, 2]].isnan().all() and "1 backward" in one.rerun
    with pytest.raises(InvalidInputError, match="metrics"):
        sink_attribution(model, batch, method="fast", metrics=["loss"], progress=False)
    grid = fast.grid("first_excess")
    assert tuple(grid.shape) == (model.cfg.n_layers, model.cfg.n_heads)
    assert grid[1, 2].item() == pytest.approx(fast.delta[1 * model.cfg.n_heads + 2, 1].item())
    assert -1 <= exact.correlation(fast) <= 1
    flipped = dataclasses.replace(fast, delta=-fast.delta)
    assert fast.correlation(fast) == pytest.approx(1.0)
    assert fast.correlation(flipped, "last_excess", rank=True) == pytest.approx(-1.0)
    view = str(attention_view(model, "The cat sat on the mat.", [(1, 0), (0, 3)]))
    assert "L1H0" in view and "L0H3" in view
    with pytest.raises(InvalidInputError, match="head index"):
        attention_view(model, "The cat sat.", [(0, 99)])
    assert hook_count(model) == 0


@pytest.mark.parametrize("method", ["exact", "fast"])
def test_attribution_ignores_padding(method, backend, get_model) -> None:
    """Unequal lengths in one padded batch == each sequence in its own batch."""
    from homoglens import sink_attribution

    model = get_model("llama", backend)
    texts = [
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife.",
        "However little known the feelings or views of such a man may be on his first entering "
        "a neighbourhood, this truth is so well fixed.",
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home.",
    ]
    batch = to_token_batch(model, texts)
    assert len(set(batch.lengths.tolist())) == 3
    kwargs = {"method": method, "edge_k": 3, "progress": False}
    if method == "exact":
        kwargs["heads"] = [(0, 1), (1, 3)]
    padded = sink_attribution(model, batch, batch_size=3, **kwargs)
    alone = sink_attribution(model, batch, batch_size=1, **kwargs)
    assert torch.allclose(padded.delta, alone.delta, atol=1e-6)
    assert torch.allclose(padded.base, alone.base, atol=1e-6)
    assert torch.allclose(padded.base_to_others, alone.base_to_others, atol=1e-6, equal_nan=True)
    assert hook_count(model) == 0


def test_joint_removal_of_two_heads_in_one_layer_equals_hugging_face(backend, get_model) -> None:
    from homoglens import sink_attribution

    model = get_model("llama", backend)
    batch = corpus_windows(model, n_seq=3, seq_len=24)
    edit = _hf_without_sink(model, "llama", batch.tokens, 0, [1, 2])
    base = _hand_metrics(_hand_to_others(_hf_resid("llama", batch.tokens, 2)), 3)
    moved = _hand_to_others(_hf_resid("llama", batch.tokens, 2, [edit]))
    result = sink_attribution(model, batch, heads=[(0, 1), (0, 2)], edge_k=3, progress=False)
    assert (_hand_metrics(moved, 3) - base).abs().max() > 1e-3  # the ablation matters
    assert torch.allclose(result.joint_delta, _hand_metrics(moved, 3) - base, atol=1e-6)
    assert hook_count(model) == 0


def test_top_heads_says_when_it_ranks_undefined_heads_last(get_model) -> None:
    import dataclasses

    scores = sink_scores(get_model("gpt2", "bridge"), SHORT_TEXTS, progress=False)
    mass = scores.mass.clone()
    mass[0, 0] = float("nan")  # e.g. no query after the key
    with pytest.warns(UserWarning, match="1 head.*ranked last"):
        top = dataclasses.replace(scores, mass=mass).top_heads(k=mass.numel())
    assert (top["layer"].iloc[-1], top["head"].iloc[-1]) == (0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fast_attribution_in_micro_batches_is_the_same_sum(backend, get_model, monkeypatch):
    """The gradient pass splits a batch whose autograd graph would exceed GRADIENT_BYTES; the
    sums over sequences are the same (a right-padded batch included)."""
    import homoglens.sinks.attribution as attribution
    from homoglens import sink_attribution

    model = get_model("llama", backend)
    texts = [
        SHORT_TEXTS[0],
        "It is a truth universally acknowledged, that a single man in possession",
        "Another one, a bit longer than the shortest of them all.",
        SHORT_TEXTS[0] + " " + SHORT_TEXTS[1],
    ]
    whole = sink_attribution(model, texts, method="fast", edge_k=2, progress=False)
    assert attribution.gradient_micro_batch(model, 24, 4) == 4
    monkeypatch.setattr(attribution, "GRADIENT_BYTES", 1)
    assert attribution.gradient_micro_batch(model, 24, 4) == 1
    split = sink_attribution(model, texts, method="fast", edge_k=2, progress=False)
    torch.testing.assert_close(split.delta, whole.delta, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(split.base, whole.base, rtol=1e-6, atol=1e-9)
    assert hook_count(model) == 0


def _planted(resid, hook):
    """A massive activation planted on the first token, dimension 7 (5000, above Sun et al.'s
    magnitude rule of 100 and far above 1000 x any median of the tiny model)."""
    resid = resid.clone()
    resid[:, 0, 7] = 5000.0
    return resid


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_median_matches_brute_force_per_sequence(backend, get_model, tmp_path) -> None:
    """Sun et al.'s definition (``main_llm.py --exp2``), written independently: per unpadded
    sequence, torch.median and the top 3 of |x| over all tokens and dimensions of each layer
    output; the means over sequences; padding (unequal lengths) never counts."""
    model = get_model("gpt2", backend)
    texts = SHORT_TEXTS + ["Short."]
    model.add_hook("blocks.0.hook_resid_post", _planted)
    try:
        found = massive_activations(model, texts, median="layer", batch_size=2, progress=False)
        batch = to_token_batch(model, texts)
        tops, medians, ratios = [], [], []
        for tokens, mask in zip(batch.tokens, batch.attention_mask, strict=True):
            row = tokens[mask.bool()][None]
            with torch.no_grad():
                _, cache = model.run_with_cache(row)
            feats = [cache["blocks.0.hook_resid_pre"]] + [
                cache[f"blocks.{i}.hook_resid_post"] for i in range(model.cfg.n_layers)
            ]
            a = [f[0].abs().double() for f in feats]
            tops.append(torch.stack([x.flatten().sort(descending=True).values[:3] for x in a]))
            medians.append(torch.stack([torch.median(x) for x in a]))
            ratios.append(torch.stack([x.max(-1).values[:1] / torch.median(x) for x in a]))
    finally:
        model.reset_hooks()
    assert found.median == "layer" and found.threshold == 1000.0 and found.min_magnitude == 100
    assert torch.allclose(found.layer_top, torch.stack(tops).mean(0), rtol=1e-5)
    assert torch.allclose(found.layer_median, torch.stack(medians).mean(0), rtol=1e-5)
    assert torch.allclose(found.ratio_mean[:, :1], torch.stack(ratios).mean(0), rtol=1e-5)
    expected = torch.stack(tops).mean(0)[:, 0] / torch.stack(medians).mean(0)
    assert torch.allclose(found.layer_ratio, expected, rtol=1e-5)
    assert found.layer_top[1, 0] == pytest.approx(5000.0) and found.layer_ratio[1] > 1000
    assert found.top_dims(1).loc[1, "dims"] == [7]  # Sun et al.'s rule: > 100 and > 1000 x
    assert found.dim_counts[1].sum() == len(texts) and found.dim_counts[0].sum() == 0
    loaded = MassiveActivations.load(found.save(tmp_path / "layer"))
    assert loaded.median == "layer" and loaded.min_magnitude == 100.0
    assert torch.equal(loaded.layer_top, found.layer_top)
    assert "median='layer'" in repr(loaded)
    old = tmp_path / "old"  # as saved before layer_top / layer_median existed
    shutil.copytree(tmp_path / "layer", old)
    meta = json.loads((old / "massive.json").read_text())
    for name in ("layer_top", "layer_median", "median", "min_magnitude"):
        meta.pop(name, None)
    (old / "massive.json").write_text(json.dumps(meta))
    tensors = load_file(str(old / "massive.safetensors"))
    kept = {k: v for k, v in tensors.items() if not k.startswith("layer_")}
    save_file(kept, str(old / "massive.safetensors"))
    reseal(old)
    legacy = MassiveActivations.load(old)
    assert legacy.layer_top is None and bool(legacy.layer_ratio.isnan().all())
    assert torch.equal(legacy.ratio_mean, found.ratio_mean)
    per_token = massive_activations(model, texts, progress=False)  # default unchanged
    assert per_token.median == "token" and per_token.threshold == 100.0
    assert hook_count(model) == 0


def test_massive_median_options_are_checked(get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    for kwargs, match in (
        ({"median": "sequence"}, "median="),
        ({"median": None}, "median="),
        ({"min_magnitude": -1.0}, "min_magnitude="),
        ({"median": "layer", "threshold": 0.5}, "threshold="),
    ):
        with pytest.raises(InvalidInputError, match=match):
            massive_activations(model, ["one two"], progress=False, **kwargs)
    assert hook_count(model) == 0


def test_massive_activation_means_match_the_cache(get_model) -> None:
    model = get_model("llama", BACKENDS[-1])
    texts = SHORT_TEXTS + ["Hi"]
    means = massive_activation_means(
        model, texts, layer=2, dims=[5, 1], positions=[4, 0], batch_size=2, progress=False
    )
    batch = to_token_batch(model, texts)
    rows = {0: [], 4: []}
    for tokens, mask in zip(batch.tokens, batch.attention_mask, strict=True):
        row = tokens[mask.bool()][None]
        with torch.no_grad():
            _, cache = model.run_with_cache(row, names_filter="blocks.1.hook_resid_post")
        x = cache["blocks.1.hook_resid_post"][0]
        for p in rows:
            if p < x.shape[0]:
                rows[p].append(x[p, [1, 5]])
    expected = torch.stack([torch.stack(rows[p]).mean(0) for p in (0, 4)])  # sorted order
    assert len(rows[4]) == len(SHORT_TEXTS)  # "Hi" is too short for position 4: not counted
    assert torch.allclose(means, expected, atol=1e-6)
    with pytest.raises(InvalidInputError, match="hold no real token"):
        massive_activation_means(model, ["Hi"], layer=1, dims=[0], positions=[60], progress=False)
    assert hook_count(model) == 0


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_sink_scores_accept_healthy_rows(dtype, eager, monkeypatch) -> None:
    """A healthy half-precision model is not refused: the eager pattern's rows, rounded to
    bfloat16, drift from 1 by up to half its epsilon (2.9e-3 on a tiny NeoX at T = 64), so the
    row-sum check allows the pattern dtype's epsilon; the blocked rows are float32. The scores
    stay close to the float32 model's."""
    import homoglens.run.fast_attention as fa
    from homoglens import load_model
    from homoglens.testing import tiny_model_folder

    monkeypatch.setattr(fa, "ENABLED", not eager)
    tokens = torch.randint(0, 900, (4, 64), generator=torch.Generator().manual_seed(2))
    high = load_model(tiny_model_folder("neox"), backend="bridge")
    low = load_model(tiny_model_folder("neox"), backend="bridge", dtype=dtype)
    want = sink_scores(high, tokens, progress=False)
    got = sink_scores(low, tokens, progress=False)
    assert float((got.mass - want.mass).abs().max()) < 2e-2
