"""Bad input across the public API: a typed error whose message names the fix, raised before any
forward pass, with no hook left and the weights unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from helpers import BACKENDS, MIXED_LENGTHS, THREE_OPENINGS, TWO_OPENINGS, hook_count, state_hash
from homoglens import (
    InvalidInputError,
    ModelFolderNotFoundError,
    PositionAblationStudy,
    SequenceTooLongError,
    UnknownModelError,
    UnsupportedArchitectureError,
    ablated_massive_activations,
    ablated_positions,
    attention_view,
    compare_models,
    corpus_windows,
    cosine_homogenization,
    homogenization_profile,
    load_model,
    massive_activation_hooks,
    massive_activation_means,
    massive_activations,
    model_info,
    position_ablation_hooks,
    position_ablation_study,
    positional_patching,
    sink_attribution,
    sink_scores,
    to_token_batch,
)

Case = tuple[str, str, Callable[[Any], Any], type[Exception], str]

BAD_INPUTS: list[Case] = [
    ("empty list", "gpt2", lambda m: homogenization_profile(m, []), InvalidInputError, "empty"),
    ("blank string", "gpt2", lambda m: homogenization_profile(m, "  "), InvalidInputError, "empty"),
    (
        "all-padding row",
        "gpt2",
        lambda m: homogenization_profile(
            m, torch.ones(2, 4, dtype=torch.long), attention_mask=torch.tensor([[1] * 4, [0] * 4])
        ),
        InvalidInputError,
        "all padding",
    ),
    (
        "sequence longer than n_ctx",
        "gpt2",
        lambda m: homogenization_profile(m, torch.ones(1, 200, dtype=torch.long)),
        SequenceTooLongError,
        "n_ctx",
    ),
    (
        "float tokens",
        "gpt2",
        lambda m: sink_scores(m, torch.ones(1, 5)),
        InvalidInputError,
        "integer",
    ),
    (
        "mask shape mismatch",
        "gpt2",
        lambda m: sink_scores(
            m, torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4)
        ),
        InvalidInputError,
        "shape",
    ),
    (
        "permutation with a repeat",
        "gpt2",
        lambda m: position_ablation_hooks(m, "permute", perm=[0, 0, 1]),
        InvalidInputError,
        "perm",
    ),
    (
        "permutation of the wrong size for the sequence",
        "neox",
        lambda m: _forward_with(m, "permute", perm=[1, 0]),
        InvalidInputError,
        "perm has length 2",
    ),
    (
        "shift past n_ctx",
        "gpt2",
        lambda m: position_ablation_study(m, THREE_OPENINGS, modes=["shift"], shift=500),
        InvalidInputError,
        "shift",
    ),
    (
        "position out of range",
        "gpt2",
        lambda m: position_ablation_hooks(m, "zero", positions=[0, 999]),
        InvalidInputError,
        "positions",
    ),
    (
        "mean on a rotary model",
        "llama",
        lambda m: position_ablation_hooks(m, "mean"),
        InvalidInputError,
        "mean",
    ),
    (
        "unknown ablation",
        "gpt2",
        lambda m: position_ablation_study(m, THREE_OPENINGS, modes=["scramble"]),
        InvalidInputError,
        "modes",
    ),
    (
        "layer out of range",
        "gpt2",
        lambda m: homogenization_profile(m, THREE_OPENINGS, layers=[0, 7]),
        InvalidInputError,
        "layers",
    ),
    (
        "rotary block out of range",
        "llama",
        lambda m: position_ablation_hooks(m, "zero", layers=[5]),
        InvalidInputError,
        "layers",
    ),
    (
        "head out of range",
        "gpt2",
        lambda m: sink_attribution(m, THREE_OPENINGS, heads=[(0, 9)], edge_k=2),
        InvalidInputError,
        "head",
    ),
    (
        "unknown attribution method",
        "gpt2",
        lambda m: sink_attribution(m, THREE_OPENINGS, method="guess", edge_k=2),
        InvalidInputError,
        "method",
    ),
    (
        "sink key past the sequences",
        "gpt2",
        lambda m: sink_scores(m, THREE_OPENINGS, key=100),
        InvalidInputError,
        "key",
    ),
    (
        "sink eps outside (0, 1)",
        "gpt2",
        lambda m: sink_scores(m, THREE_OPENINGS, eps=1.5),
        InvalidInputError,
        "eps",
    ),
    (
        "resid_mid on parallel GPT-NeoX",
        "neox",
        lambda m: positional_patching(m, THREE_OPENINGS, component="resid_mid", bins=2),
        InvalidInputError,
        "resid_mid",
    ),
    (
        "unknown patching metric",
        "gpt2",
        lambda m: positional_patching(m, THREE_OPENINGS, metric="accuracy", bins=2),
        InvalidInputError,
        "metric",
    ),
    (
        "attention view of a missing head",
        "gpt2",
        lambda m: attention_view(m, "Hello there", [(3, 0)]),
        InvalidInputError,
        "head",
    ),
    (
        "massive-activation threshold not positive",
        "gpt2",
        lambda m: massive_activations(m, THREE_OPENINGS, threshold=-1),
        InvalidInputError,
        "threshold",
    ),
    (
        "models with different tokenizers",
        "gpt2",
        lambda m: compare_models({"a": m, "b": "homoglens/tiny-none"}, n_seq=2),
        InvalidInputError,
        "tokenizer",
    ),
]


def _forward_with(model: Any, how: str, **options: Any) -> None:
    with ablated_positions(model, how, **options):
        model(torch.tensor([[464, 3290, 3332, 319, 262]]))


@pytest.mark.parametrize("thing", ["homoglens/tiny-learned", None, torch.nn.Linear(2, 2)])
def test_a_non_model_is_refused_everywhere(thing) -> None:
    for call in (
        lambda: homogenization_profile(thing, "hi there"),
        lambda: model_info(thing),
        lambda: corpus_windows(thing),
        lambda: to_token_batch(thing, "hi there"),
        lambda: ablated_positions(thing, "zero").__enter__(),
        lambda: compare_models({"a": 5 if isinstance(thing, str) or thing is None else thing}),
    ):
        with pytest.raises(InvalidInputError, match="HookedTransformer or TransformerBridge"):
            call()


def test_tensor_and_array_arguments(get_model, tmp_path: Path) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="single integer"):
        homogenization_profile(model, TWO_OPENINGS, batch_size=torch.tensor(2.0), progress=False)
    with pytest.raises(InvalidInputError):
        corpus_windows(model, n_seq=torch.tensor(2.5))
    prof = homogenization_profile(model, TWO_OPENINGS, layers=np.array([0, 2]), progress=False)
    assert prof.layers == (0, 2)
    assert homogenization_profile(
        model, TWO_OPENINGS, batch_size=np.int64(1), progress=False
    ).layers
    with pytest.raises(InvalidInputError):
        cosine_homogenization(torch.zeros(0, 5, 8))


def test_options_validated_before_any_forward(get_model):
    model = get_model("gpt2", BACKENDS[-1])
    for kwargs, match in (
        ({"seed": "a"}, "seed"),
        ({"seed": 2**70}, "seed"),
        ({"shift": "x"}, "shift"),
        ({"ci": "0.9"}, "ci"),
        ({"ci": None}, "ci"),
        ({"exclude_first": "no"}, "exclude_first"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            position_ablation_study(model, MIXED_LENGTHS, modes=["zero"], progress=False, **kwargs)
    with pytest.raises(InvalidInputError, match="non-negative shift"):
        with ablated_positions(model, "shift", shift=-1):
            pass
    with pytest.raises(InvalidInputError, match="seed"):
        with ablated_positions(model, "permute", seed=2**70):
            pass
    with pytest.raises(InvalidInputError, match="exclude_first"):
        homogenization_profile(model, MIXED_LENGTHS, exclude_first="no", progress=False)
    with pytest.raises(InvalidInputError, match="bos="):
        homogenization_profile(model, torch.tensor([[1, 2, 3]]), bos="junk", progress=False)
    for progress in ("no", 0, None):  # not silently read as truthy or falsy
        with pytest.raises(InvalidInputError, match="progress"):
            homogenization_profile(model, MIXED_LENGTHS, progress=progress)
        with pytest.raises(InvalidInputError, match="progress"):
            position_ablation_study(model, MIXED_LENGTHS, modes=["zero"], progress=progress)
    assert hook_count(model) == 0


def test_numpy_integers_accepted_and_json_safe(tmp_path, get_model):
    model = get_model("llama", BACKENDS[-1])
    study = position_ablation_study(
        model,
        MIXED_LENGTHS,
        modes=["permute"],
        seed=np.int64(1),
        positions=np.array([0, 1, 2]),
        n_boot=np.int64(10),
        progress=False,
    )
    loaded = PositionAblationStudy.load(study.save(tmp_path / "s"))
    assert loaded.settings["positions"] == [0, 1, 2]
    with ablated_positions(model, "zero", layers=np.int64(1), positions=np.arange(3)):
        model(torch.tensor([[1, 2, 3, 4]]))
    prof = homogenization_profile(model, MIXED_LENGTHS, layers=np.int64(1), progress=False)
    assert prof.layers == (1,)
    with pytest.raises(InvalidInputError, match="are not blocks of this model"):
        with ablated_positions(model, "zero", layers=[2]):
            pass


def test_breaker_findings_sinks_and_patching(get_model, tmp_path):
    """Findings of a bad-input review of sink_attribution / positional_patching (round 2)."""
    from homoglens import (
        HomoglensError,
        attention_view,
        corpus_windows,
        positional_patching,
        sink_attribution,
        sink_scores,
    )

    model = get_model("gpt2", BACKENDS[-1])
    batch = corpus_windows(model, n_seq=3, seq_len=24)
    # An intermediate metric_layer: default layers stop before it; later blocks are refused.
    mid = positional_patching(model, batch, metric_layer=1, progress=False)
    assert mid.layers == (0,) and not mid.patched.isnan().any()
    with pytest.raises(InvalidInputError, match="cannot change"):
        positional_patching(model, batch, metric_layer=1, layers=[1], component="mlp_out")
    both = positional_patching(
        model,
        batch,
        metric_layer=1,
        layers=[1],
        bins=1,
        metric=["mean_pairwise", "loss"],
        progress=False,
    )  # resid_pre of block 1 at every position is entry 1 itself: restoring it restores it
    assert both.patched[0, 0].sub(both.normal[0]).abs().max() < 1e-6
    # A one-token sequence has no next-token loss.
    one = torch.tensor([[5, 0, 0], [5, 6, 7]])
    with pytest.raises(InvalidInputError, match="single token"):
        positional_patching(
            model,
            one,
            attention_mask=torch.tensor([[1, 0, 0], [1, 1, 1]]),
            metric="loss",
            progress=False,
        )
    # No query after the key: mass is undefined (NaN), not 0.
    short = sink_scores(model, torch.tensor([[5, 6, 7], [8, 9, 10]]), key=2, progress=False)
    assert short.mass.isnan().all()
    # Typed errors and accepted numpy/tensor scalars.
    assert len(positional_patching(model, batch, bins=np.int64(2), progress=False).cells) == 2
    assert positional_patching(model, batch, layers=np.int64(0), progress=False).layers == (0,)
    for kwargs in ({"bins": 2.0}, {"bins": True}, {"layers": "0"}):
        with pytest.raises(InvalidInputError):
            positional_patching(model, batch, progress=False, **kwargs)
    with pytest.raises(InvalidInputError, match="metrics"):
        sink_attribution(model, batch, method="fast", metrics=None, progress=False)
    scores = sink_scores(model, batch, key=np.int64(1), eps=np.float32(0.3), progress=False)
    assert scores.key == 1
    with pytest.raises(InvalidInputError):
        scores.top_heads(0)
    with pytest.raises(InvalidInputError, match="by="):
        scores.top_heads(by="x")
    attr = sink_attribution(model, batch, heads=[(0, 1)], edge_k=3, joint=np.False_, progress=False)
    with pytest.raises(InvalidInputError):
        attr.correlation(None)
    top = scores.top_heads(2)
    assert "L" in str(attention_view(model, "The cat sat.", top))  # a top_heads() frame works
    with pytest.raises(InvalidInputError, match="training mode"):
        model.train()
        try:
            sink_scores(model, batch, progress=False)
        finally:
            model.eval()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(HomoglensError):
        attr.save(tmp_path / "afile" / "sub")

    def first(logits, tokens, mask):
        return np.float32(logits[:, -1, 0].mean().item())

    def edits(logits, tokens, mask):
        logits.zero_()
        return 0.0

    ok = positional_patching(
        model, batch, metric=[edits, first, "loss"], layers=[0], progress=False
    )
    assert ok.normal[2] > 1  # the in-place edit of one metric does not reach the loss
    with pytest.raises(InvalidInputError, match="its own name"):
        positional_patching(model, batch, metric=[lambda a, b, c: 0.0, lambda a, b, c: 1.0])
    with pytest.raises(InvalidInputError, match="must accept"):
        positional_patching(model, batch, metric=[lambda logits: 0.0], layers=[0], progress=False)
    assert hook_count(model) == 0


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_matrix(case: Case, backend: str, get_model) -> None:
    _, arch, call, error, match = case
    model = get_model(arch, backend)
    before = state_hash(model)
    with pytest.raises(error, match=match):
        with torch.no_grad():
            call(model)
    assert hook_count(model) == 0
    assert state_hash(model) == before
    assert not torch.is_inference_mode_enabled()


def test_bad_models_and_folders(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match="unknown model"):
        load_model("no-such-model-anywhere")
    with pytest.raises(ModelFolderNotFoundError, match="does not exist"):
        load_model(tmp_path / "missing")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(UnsupportedArchitectureError, match="BertModel"):
        load_model(tmp_path / "cfg")


def test_meta_device_tokens_and_masks_are_typed_errors(get_model) -> None:
    from homoglens import InvalidInputError

    model = get_model("gpt2", "bridge")
    meta = torch.ones(2, 8, dtype=torch.long, device="meta")
    with pytest.raises(InvalidInputError, match="meta device"):
        homogenization_profile(model, meta, progress=False)
    with pytest.raises(InvalidInputError, match="meta device"):
        homogenization_profile(
            model, torch.ones(2, 8, dtype=torch.long), attention_mask=meta, progress=False
        )
    assert hook_count(model) == 0


MASSIVE_BAD: list[tuple[dict[str, Any], str]] = [
    ({"how": "set_zero"}, "how="),
    ({"layer": 0}, "layer=0"),
    ({"layer": 3}, "layer=3"),
    ({"layer": 1.5}, "layer="),
    ({"dims": []}, "dims is empty"),
    ({"dims": [1, 1]}, "repeated"),
    ({"dims": [64]}, "outside the residual dimensions"),
    ({"dims": [-1]}, "outside the residual dimensions"),
    ({"dims": [0.5]}, "dims="),
    ({"dims": "7"}, "dims="),
    ({"positions": [128]}, "outside the model's positions"),
    ({"positions": torch.tensor([0.0])}, "integer"),
    ({"how": "mean"}, "needs means"),
    ({"how": "mean", "means": torch.ones(2, 1)}, "shape"),
    ({"how": "mean", "means": torch.ones(1, 1, dtype=torch.long)}, "float tensor"),
    ({"how": "mean", "means": torch.full((1, 1), float("nan"))}, "NaN"),
    ({"how": "zero", "means": torch.ones(1, 1)}, "only used with how='mean'"),
]


@pytest.mark.parametrize("bad, match", MASSIVE_BAD, ids=[m for _, m in MASSIVE_BAD])
def test_massive_ablation_bad_inputs(bad, match, backend, get_model) -> None:
    """Typed errors naming the fix, before anything is attached (hooks and context manager)."""
    model = get_model("gpt2", backend)
    options: dict[str, Any] = {"how": "zero", "layer": 1, "dims": [7], **bad}
    how = options.pop("how")
    with pytest.raises(InvalidInputError, match=match):
        massive_activation_hooks(model, how, **options)
    with pytest.raises(InvalidInputError, match=match):
        with ablated_massive_activations(model, how, **options):
            pass  # pragma: no cover - never entered
    if set(bad) <= {"layer", "dims", "positions"}:  # the sites: checked the same way
        with pytest.raises(InvalidInputError, match=match):
            massive_activation_means(model, THREE_OPENINGS, **options, progress=False)
    assert hook_count(model) == 0


def test_blocks_out_of_range_name_the_blocks_and_a_meta_model_is_refused() -> None:
    """Issue 39: attention_received(layers=[2]) on a 2-block model said "1 blocks"; a model on
    the meta device gave a raw "Tensor.item() cannot be called on meta tensors"."""
    from homoglens import ModelStateError, attention_received, homogenization_profile, load_model
    from homoglens.testing import tiny_model_folder

    model = load_model(tiny_model_folder("gpt2"), backend="bridge")
    with pytest.raises(InvalidInputError, match=r"numbered 0\.\.1 here \(2 blocks\)"):
        attention_received(model, TWO_OPENINGS, layers=[2], progress=False)
    model.to("meta")
    with pytest.raises(ModelStateError, match="'meta' device"):
        homogenization_profile(model, TWO_OPENINGS, progress=False)
