"""Model objects in (issue 41, item 1): a ``transformers`` causal LM and an nnsight
``LanguageModel`` run the public measurements, wrapped without copying weights; the numbers
equal those of the same weights loaded from the folder; the user's object is left unchanged;
anything else gets a typed error naming what is accepted."""

from __future__ import annotations

import dataclasses
import gc
import warnings
import weakref
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from homoglens import (
    homogenization_profile,
    load_model,
    model_info,
    positional_similarity,
    sink_scores,
)
from homoglens.core.errors import InvalidInputError, UnsupportedArchitectureError
from homoglens.models.objects import ACCEPTED_MODELS, as_hooked
from homoglens.testing import tiny_model_folder

TEXTS = [
    "The cat sat on the mat and looked at the dog for a long while.",
    "A quick brown fox jumps over the lazy dog near the river bank.",
]


@pytest.fixture(scope="module")
def folder() -> Path:
    return Path(tiny_model_folder("llama"))


@pytest.fixture(scope="module")
def reference(folder: Path) -> Any:
    return load_model(folder, backend="bridge", device="cpu")


def _hf(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder))


def _snapshot(model: torch.nn.Module) -> dict[str, Any]:
    """Everything the issue says must stay as the user left it."""
    return {
        "attn": model.config._attn_implementation,  # pyright: ignore[reportAttributeAccessIssue]
        "modules": [(n, type(m), m.training) for n, m in model.named_modules()],
        "hooks": [
            (n, tuple(m._forward_hooks), tuple(m._forward_pre_hooks))
            for n, m in model.named_modules()
        ],
        "params": {
            n: (p.detach().clone(), p.device, p.requires_grad, id(p))
            for n, p in model.named_parameters()
        },  # fmt: skip
        "forward": model.__dict__.get("forward"),
    }


def _same_snapshot(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["attn"] == b["attn"]
    assert a["modules"] == b["modules"]
    assert a["hooks"] == b["hooks"]
    assert a["forward"] is b["forward"]
    assert a["params"].keys() == b["params"].keys()
    for name, (value, device, grad, ident) in a["params"].items():
        value2, device2, grad2, ident2 = b["params"][name]
        assert torch.equal(value, value2), name
        assert (device, grad, ident) == (device2, grad2, ident2), name


def _assert_results_equal(a: Any, b: Any, atol: float = 1e-6) -> None:
    compared = 0
    for f in dataclasses.fields(a):
        if f.name == "provenance":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor), f.name
            assert x.shape == y.shape, f.name
            if x.dtype.is_floating_point:
                assert torch.allclose(x, y, atol=atol, rtol=0, equal_nan=True), f.name
            else:
                assert torch.equal(x, y), f.name
            compared += 1
        elif isinstance(x, float | int | str | tuple) or x is None:
            assert x == y or (x != x and y != y), f.name  # NaN == NaN
    assert compared > 0


def test_transformers_object_equals_folder(folder: Path, reference: Any) -> None:
    hf = _hf(folder)
    hf.train()  # the user's training mode must survive
    next(hf.parameters()).requires_grad_(False)  # and a frozen parameter stay frozen
    hook = hf.model.layers[0].register_forward_hook(lambda *args: None)
    pre = hf.model.norm.register_forward_pre_hook(lambda *args: None)
    before = _snapshot(hf)

    tokens = torch.randint(
        1, int(hf.config.vocab_size), (4, 24), generator=torch.Generator().manual_seed(0)
    )
    for measure, data in (
        (homogenization_profile, TEXTS),
        (positional_similarity, tokens),
        (sink_scores, tokens),
    ):
        got = measure(hf, data, progress=False)
        want = measure(reference, data, progress=False)
        _assert_results_equal(got, want)
        assert got.provenance.model_source == "transformers object LlamaForCausalLM"

    _same_snapshot(before, _snapshot(hf))
    assert hf.training and hf.config._attn_implementation == before["attn"]
    hook.remove()
    pre.remove()


def test_wrapper_shares_weights_is_cached_and_weak(folder: Path) -> None:
    hf = _hf(folder)
    bridge = load_model(hf)
    assert as_hooked(hf) is bridge  # cached: wrapping again is a look-up
    assert load_model(hf) is bridge
    ours = {p.data_ptr() for p in hf.parameters()}
    assert ours <= {p.data_ptr() for p in bridge.parameters()}  # every weight shared, not copied
    # TransformerLens 3.9's bridge adds a zero unembedding bias (to its twin, not to ours)
    extra = [p for p in bridge.parameters() if p.data_ptr() not in ours]
    assert all(int(p.count_nonzero()) == 0 for p in extra)
    assert not hasattr(hf.lm_head, "bias") or hf.lm_head.bias is None
    info = model_info(bridge)
    assert info.source == "transformers object LlamaForCausalLM"
    assert info.backend == "bridge" and info.weights == "raw" and info.dtype == "float32"
    # a TransformerLens model passes through
    assert as_hooked(bridge) is bridge
    # the object changed (new dtype): wrapped anew
    hf.double()
    again = as_hooked(hf)
    assert again is not bridge and next(again.parameters()).dtype == torch.float64
    alive = weakref.ref(hf)
    del hf, bridge, again, info
    gc.collect()
    assert alive() is None  # the cache holds the object weakly


def test_tokenizer_passed_or_refused(
    folder: Path, reference: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from transformers import AutoTokenizer

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the temporary copy goes

    hf = _hf(folder)
    hf.name_or_path = "not-a-folder"
    hf.config._name_or_path = "not-a-folder"
    with pytest.raises(InvalidInputError, match="tokenizer="):
        as_hooked(hf)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.name_or_path = ""  # an in-memory tokenizer: saved for the bridge, not changed
    state = dict(tokenizer.init_kwargs), tokenizer.padding_side
    got = homogenization_profile(as_hooked(hf, tokenizer), TEXTS, progress=False)
    _assert_results_equal(got, homogenization_profile(reference, TEXTS, progress=False))
    assert (dict(tokenizer.init_kwargs), tokenizer.padding_side) == state
    assert not list(tmp_path.glob("homoglens-tokenizer-*"))  # the temporary copy is removed
    with pytest.raises(InvalidInputError, match="model object"):
        load_model(folder, tokenizer=tokenizer)


def test_options_that_would_change_the_object_are_refused(folder: Path) -> None:
    hf = _hf(folder)
    before = _snapshot(hf)
    with pytest.raises(InvalidInputError, match="process_weights"):
        load_model(hf, process_weights=True)
    with pytest.raises(InvalidInputError, match="dtype"):
        load_model(hf, dtype=torch.float64)
    with pytest.raises(InvalidInputError, match="copy"):
        load_model(hf, backend="hooked")
    with pytest.raises(InvalidInputError, match="device_map"):
        load_model(hf, device_map="auto")
    load_model(hf, dtype=torch.float32, device="cpu")  # its own: fine
    _same_snapshot(before, _snapshot(hf))


def test_unsupported_objects_get_typed_errors() -> None:
    from transformers import BertConfig, BertModel, T5Config, T5ForConditionalGeneration

    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64, vocab_size=50))  # fmt: skip
    t5 = T5ForConditionalGeneration(T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2,
                                             d_kv=16, vocab_size=50))  # fmt: skip
    for model in (cast(Any, bert), cast(Any, t5)):
        with pytest.raises(UnsupportedArchitectureError, match="decoder-only"):
            homogenization_profile(model, TEXTS, progress=False)
        with pytest.raises(UnsupportedArchitectureError, match="AutoModelForCausalLM"):
            load_model(model)
    with pytest.raises(InvalidInputError, match="PreTrainedModel") as err:
        sink_scores(cast(Any, torch.nn.Linear(2, 2)), TEXTS, progress=False)
    assert ACCEPTED_MODELS in str(err.value)
    with pytest.raises(InvalidInputError, match="PreTrainedModel"):
        load_model(torch.nn.Linear(2, 2))
    with pytest.raises(InvalidInputError, match="nnsight"):
        homogenization_profile("not-a-model", TEXTS, progress=False)  # pyright: ignore[reportArgumentType]
    with pytest.raises(InvalidInputError, match="model object"):
        load_model(42)


def test_nnsight_language_model(folder: Path, reference: Any) -> None:
    pytest.importorskip("nnsight")
    from nnsight import LanguageModel
    from transformers import AutoTokenizer

    hf = _hf(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nnsight 0.8 deprecates LanguageModel's name
        lm = LanguageModel(hf, tokenizer=AutoTokenizer.from_pretrained(str(folder)))
    before = _snapshot(hf)
    got = homogenization_profile(lm, TEXTS, progress=False)
    _assert_results_equal(got, homogenization_profile(reference, TEXTS, progress=False))
    assert got.provenance.model_source == "nnsight LanguageModel (LlamaForCausalLM)"
    _assert_results_equal(
        sink_scores(lm, TEXTS, progress=False), sink_scores(reference, TEXTS, progress=False)
    )
    assert load_model(lm) is as_hooked(lm)
    _same_snapshot(before, _snapshot(hf))
    # nnsight still traces its own model afterwards
    with lm.trace("The cat sat"):
        hidden = lm.model.layers[0].output.save()
    assert hidden is not None


WINDOWS = torch.randint(0, 900, (2, 24), generator=torch.Generator().manual_seed(5))


def _same_result(a: Any, b: Any, name: str) -> int:
    """Compare every tensor of two results (or two outputs) at 1e-6; the number compared."""
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-6, rtol=0, equal_nan=True)
        return 1
    if not dataclasses.is_dataclass(a):
        return 0
    n = 0
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(
                x.double(), y.double(), atol=1e-6, rtol=0, equal_nan=True, msg=f"{name}.{f.name}"
            )
            n += 1
        elif dataclasses.is_dataclass(x):
            n += _same_result(x, y, f"{name}.{f.name}")
        elif isinstance(x, dict):
            for k in x:
                n += _same_result(x[k], y[k], f"{name}.{f.name}[{k}]")
    return n


def _every_measurement() -> dict[str, Any]:
    from helpers import public_measurements

    return public_measurements(WINDOWS)


CONTEXTS = ("ablated_positions", "biased_attention", "ablated_massive_activations")
"""Context managers change a TransformerLens model's own passes; the user's object is left
unchanged, so they refuse it (its own forward would silently not see the change)."""


@pytest.mark.parametrize("kind", ["transformers", "nnsight"])
@pytest.mark.parametrize("name", [n for n in _every_measurement() if n not in CONTEXTS])
def test_every_public_measurement_takes_the_object(
    name: str, kind: str, folder: Path, reference: Any
) -> None:
    """The acceptance line: a ``transformers`` object and an nnsight ``LanguageModel`` run every
    public measurement, equal to the folder path at 1e-6, and the object is unchanged
    afterwards."""
    import homoglens as hg

    run = _every_measurement()[name]
    if name == "compare_models":  # the windows tokenized once, by the reference's tokenizer
        batch = hg.to_token_batch(reference, WINDOWS)
        run = lambda m: hg.compare_models(  # noqa: E731
            {"m": m}, batch, edge_k=2, n_boot=50, progress=False
        )
    hf = _hf(folder)
    given: Any = hf
    if kind == "nnsight":
        pytest.importorskip("nnsight")
        from nnsight import LanguageModel
        from transformers import AutoTokenizer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nnsight 0.8 deprecates LanguageModel's name
            given = LanguageModel(hf, tokenizer=AutoTokenizer.from_pretrained(str(folder)))
    before = _snapshot(hf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        got = run(given)
        torch.manual_seed(0)
        want = run(reference)
    _same_result(got, want, name)
    _same_snapshot(before, _snapshot(hf))


@pytest.mark.parametrize("name", CONTEXTS)
def test_context_managers_refuse_a_model_object(name: str, folder: Path) -> None:
    hf = _hf(folder)
    before = _snapshot(hf)
    with pytest.raises(InvalidInputError, match="load_model"):
        _every_measurement()[name](hf)
    _same_snapshot(before, _snapshot(hf))
