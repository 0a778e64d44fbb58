"""Activation patching between the normal and the position-ablated run, against the plain
Hugging Face model of the same weights (patched with torch module hooks) and hand-computed
metrics."""

from __future__ import annotations

import functools

import pytest
import torch

from helpers import (
    BACKENDS,
    TWO_OPENINGS,
    hf_model,
    hf_module,
    hf_resid_and_logits,
    hook_count,
)
from homoglens import (
    InvalidInputError,
    PositionalPatchingResult,
    corpus_windows,
    load_model,
    position_ablation_hooks,
    positional_patching,
    to_token_batch,
)
from homoglens.testing import tiny_model_folder


def _hand_mean_pairwise(resid: torch.Tensor) -> float:
    u = torch.nn.functional.normalize(resid.double(), dim=-1)
    cos = u @ u.transpose(1, 2)
    t = cos.shape[-1]
    return float(((cos.sum((1, 2)) - t) / (t * (t - 1))).mean())


def _hand_loss(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].double().transpose(1, 2), tokens[:, 1:], reduction="none"
    )
    return float(nll.detach().mean(1).mean())


def _hand_run(model, tokens, hooks, measured: int) -> tuple[float, float]:
    name = f"blocks.{measured - 1}.hook_resid_post"
    with model.hooks(fwd_hooks=hooks):
        logits, cache = model.run_with_cache(tokens, names_filter=name)
    return _hand_mean_pairwise(cache[name]), _hand_loss(logits, tokens)


@functools.cache
def _model64(arch: str, backend: str):
    return load_model(tiny_model_folder(arch), backend=backend, device="cpu", dtype=torch.float64)


@pytest.mark.parametrize("component", ["resid_pre", "attn_out", "head"])
def test_cells_equal_hugging_face_with_the_activation_patched(arch, backend, component) -> None:
    """Each cell against the plain Hugging Face model of the same weights: the ablated run is
    Hugging Face given the permuted ``position_ids``; the patch copies the normal run's input
    of block 1 (resid_pre), its attention module's output (attn_out) or head 2's slice of the
    input of its output projection (head), captured and written with plain torch module hooks;
    the metrics are computed from Hugging Face's own block output and logits. Both models run
    in float64: the tiny rotary models' positions move their metrics by 1e-5 only, which
    float32 rounding (1e-6) would blur."""
    model = _model64(arch, backend)
    tokens = corpus_windows(model, n_seq=3, seq_len=16).tokens
    result = positional_patching(
        model,
        tokens,
        how="permute",
        component=component,
        metric=["mean_pairwise", "loss"],
        bins=[(0, 3), (3, 10), (10, 16)],
        layers=[0, 1],
        batch_size=2,
        cell_batch=2,
        seed=3,
        progress=False,
    )
    # how="permute", seed=3: position i gets the signal of position perm[i] (PositionPlan)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(perm, torch.arange(16))
    ablated_ids = perm[None].expand(len(tokens), -1)
    hf = hf_model(arch, torch.float64)
    part = {"resid_pre": "block", "attn_out": "attn", "head": "out_proj"}[component]
    module = hf_module(hf, arch, 1, part)
    where = "output" if component == "attn_out" else "input"
    clean = {}

    def record(x: torch.Tensor) -> torch.Tensor:
        clean["x"] = x.clone()
        return x

    cell, d_head = 2, int(model.cfg.d_head)  # positions 10..15, or head 2

    def patch(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        if component == "head":
            heads = slice(cell * d_head, (cell + 1) * d_head)
            x[..., heads] = clean["x"][..., heads]
        else:
            x[:, 10:16] = clean["x"][:, 10:16]
        return x

    def metrics(edits=(), **kwargs) -> torch.Tensor:
        measured = int(model.cfg.n_layers)  # metric_layer's default: the last block's output
        resid, logits = hf_resid_and_logits(hf, arch, tokens, measured, edits, **kwargs)
        return torch.tensor(
            [_hand_mean_pairwise(resid), _hand_loss(logits, tokens)], dtype=torch.float64
        )

    normal = metrics([(module, where, record)])
    ablated = metrics(position_ids=ablated_ids)
    want = metrics([(module, where, patch)], position_ids=ablated_ids)
    # mean_pairwise to 5e-8 (the rotary models differ from Hugging Face by up to 1e-8 in
    # float64); the loss to 2e-6 (homoglens takes the logsumexp in float32)
    tol = torch.tensor([5e-8, 2e-6], dtype=torch.float64)
    assert ((normal - ablated).abs() > 10 * tol).any()  # the ablation matters
    assert ((want - ablated).abs() > 10 * tol).any()  # and so does the patch
    for got, oracle in ((result.normal, normal), (result.ablated, ablated)):
        assert ((got - oracle).abs() <= tol).all(), (got - oracle).abs()
    got = result.patched[:, 1, cell]
    assert ((got - want).abs() <= tol).all(), (got - want).abs()
    assert hook_count(model) == 0


def test_self_patch_changes_nothing_and_layer0_restores_learned_positions(
    backend, get_model
) -> None:
    model = get_model("gpt2", backend)
    batch = corpus_windows(model, n_seq=3, seq_len=20)
    metrics = ["mean_pairwise", "first_excess", "last_excess", "loss"]
    for component in ("resid_pre", "resid_mid", "mlp_out", "head"):
        for direction in ("restore", "break"):
            same = positional_patching(
                model,
                batch,
                how="none",
                component=component,
                direction=direction,
                metric=metrics,
                bins=4,
                edge_k=3,
                progress=False,
            )
            gap = (same.patched - same.receiving[:, None, None]).abs().max()
            assert gap < 1e-6, (component, direction)
            assert same.effect.isnan().all()  # source == receiving: undefined
    full = positional_patching(
        model,
        batch,
        how="zero",
        layers=[0],
        bins=[(0, 20)],
        metric=metrics,
        edge_k=3,
        progress=False,
    )
    assert torch.allclose(full.effect[:, 0, 0], torch.ones(4, dtype=torch.float64), atol=1e-6)
    assert (full.normal - full.ablated).abs().min() > 1e-4  # the ablation matters
    broken = positional_patching(
        model, batch, how="zero", direction="break", layers=[0], bins=[(0, 20)], progress=False
    )
    assert broken.effect[0, 0, 0].item() == pytest.approx(1.0, abs=1e-6)
    assert hook_count(model) == 0


def test_custom_metric_and_padding(backend, get_model) -> None:
    model = get_model("llama", backend)
    texts = [
        "It is a truth universally acknowledged, that a single man in possession",
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy",
        "The family of Dashwood had long been settled in Sussex.",
    ]
    batch = to_token_batch(model, texts)
    assert len(set(batch.lengths.tolist())) > 1

    def last_logsumexp(logits, tokens, mask):
        last = mask.sum(1) - 1
        return logits[torch.arange(len(last)), last].logsumexp(-1).mean()

    kwargs = {
        "how": "zero",
        "bins": 3,
        "metric": [last_logsumexp, "mean_pairwise"],
        "edge_k": 2,
        "progress": False,
    }
    together = positional_patching(model, batch, batch_size=3, **kwargs)
    alone = positional_patching(model, batch, batch_size=1, **kwargs)
    assert together.metrics == ("last_logsumexp", "mean_pairwise")
    assert torch.allclose(together.patched, alone.patched, atol=1e-5)
    hand = []
    for i, n in enumerate(batch.lengths.tolist()):
        logits = model(batch.tokens[i : i + 1, :n])
        hand.append(float(logits[0, -1].detach().logsumexp(-1)))
    assert together.normal[0].item() == pytest.approx(sum(hand) / 3, abs=1e-5)
    assert hook_count(model) == 0


def test_patching_bad_input(get_model) -> None:
    model = get_model("neox", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=2, seq_len=20)

    def not_scalar(logits, tokens, mask):
        return logits.mean(-1)

    for kwargs, match in (
        ({"component": "mlp_in"}, "component="),
        ({"component": "resid_mid"}, "resid_mid"),
        ({"metric": "accuracy"}, "metric"),
        ({"metric": [not_scalar]}, "scalar"),
        ({"metric": []}, "empty"),
        ({"direction": "both"}, "direction="),
        ({"how": "shuffle"}, "how="),
        ({"layers": [7]}, "layer"),
        ({"bins": [(5, 3)]}, "bin stop"),
        ({"bins": 0}, "bins"),
        ({"metric_layer": 9}, "metric_layer"),
        ({"edge_k": 10, "metric": "first_excess"}, "edge_k"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            positional_patching(model, batch, progress=False, **kwargs)
        assert hook_count(model) == 0, kwargs


def test_result_round_trip_and_plot(tmp_path, get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=2, seq_len=16)
    result = positional_patching(
        model, batch, component="head", metric=["loss", "last_excess"], edge_k=2, progress=False
    )
    assert result.cell_axis == "head_index" and len(result.cells) == model.cfg.n_heads
    loaded = PositionalPatchingResult.load(result.save(tmp_path / "p"))
    assert loaded.cells == result.cells and loaded.metrics == result.metrics
    assert torch.equal(loaded.patched, result.patched)
    table = result.to_pandas()
    assert len(table) == 2 * model.cfg.n_layers * model.cfg.n_heads
    assert {"metric", "layer", "head_index", "patched", "effect"} <= set(table.columns)
    assert len(result.plot("last_excess").axes) == 2
    with pytest.raises(InvalidInputError, match="metric="):
        result.plot("mean_pairwise")
    assert result.forward_equivalents > 2


def test_positions_component_restores_one_block_of_rotation(backend, get_model) -> None:
    model = get_model("llama", backend)
    tokens = corpus_windows(model, n_seq=3, seq_len=16).tokens
    measured = model.cfg.n_layers
    restore = positional_patching(
        model, tokens, component="positions", metric=["mean_pairwise", "loss"], progress=False
    )
    broken = positional_patching(
        model,
        tokens,
        component="positions",
        direction="break",
        metric=["mean_pairwise", "loss"],
        progress=False,
    )
    assert restore.layers == (0, 1) and restore.cells == ((0, 16),)
    for layer in (0, 1):
        other = 1 - layer
        want = _hand_run(
            model, tokens, position_ablation_hooks(model, "zero", layers=[other]), measured
        )
        assert torch.allclose(
            restore.patched[:, layer, 0], torch.tensor(want, dtype=torch.float64), atol=1e-5
        )
        want = _hand_run(
            model, tokens, position_ablation_hooks(model, "zero", layers=[layer]), measured
        )
        assert torch.allclose(
            broken.patched[:, layer, 0], torch.tensor(want, dtype=torch.float64), atol=1e-5
        )
    gpt2 = get_model("gpt2", backend)
    learned = positional_patching(gpt2, tokens, component="positions", progress=False)
    assert learned.layers == (0,) and learned.effect[0, 0, 0].item() == pytest.approx(1.0)
    with pytest.raises(InvalidInputError, match="only block 0"):
        positional_patching(gpt2, tokens, component="positions", layers=[1], progress=False)
    assert hook_count(model) == 0 and hook_count(gpt2) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_patching_the_measured_entry_restores_it(backend: str, get_model) -> None:
    """Restoring resid_pre of block l, where the metric is read (entry l), restores it fully
    at every l (it read blocks.{l-1}.hook_resid_post before, which the patch never reached)."""
    from homoglens import positional_patching

    model = get_model("gpt2", backend)
    for layer in (0, 1):
        result = positional_patching(
            model,
            TWO_OPENINGS,
            metric=["mean_pairwise", "loss"],
            metric_layer=layer,
            layers=[layer],
            bins=1,
            progress=False,
        )
        assert result.effect[0].flatten().tolist() == pytest.approx([1.0]), layer
