"""Reliability across the public API: a bad-input matrix (typed error, message names the fix, no
hook left, weights unchanged), a fault raised inside the forward pass of every function that
attaches hooks, and determinism of seeded results on every backend."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from conftest import BACKENDS, hook_count, state_hash
from homoglens import (
    HomogenizationProfile,
    IncompatibleResultsError,
    InvalidInputError,
    ModelFolderNotFoundError,
    NonFiniteActivationError,
    ResultsNotFoundError,
    SequenceTooLongError,
    SinkScores,
    UnknownModelError,
    UnsupportedArchitectureError,
    ablated_positions,
    attention_view,
    compare_models,
    homogenization_profile,
    load_model,
    massive_activations,
    position_ablation_hooks,
    position_ablation_study,
    positional_patching,
    positional_similarity,
    sink_analysis,
    sink_attribution,
    sink_scores,
)
from homoglens.cli import main

TEXTS = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home",
    "The family of Dashwood had long been settled in Sussex.",
]

Case = tuple[str, str, Callable[[Any], Any], type[Exception], str]

# (id, architecture, call, error, part of the message). Every call must fail before or during
# the forward pass without leaving a hook or changing a weight.
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
        lambda m: position_ablation_study(m, TEXTS, modes=["shift"], shift=500),
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
        lambda m: position_ablation_study(m, TEXTS, modes=["scramble"]),
        InvalidInputError,
        "modes",
    ),
    (
        "layer out of range",
        "gpt2",
        lambda m: homogenization_profile(m, TEXTS, layers=[0, 7]),
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
        lambda m: sink_attribution(m, TEXTS, heads=[(0, 9)], edge_k=2),
        InvalidInputError,
        "head",
    ),
    (
        "unknown attribution method",
        "gpt2",
        lambda m: sink_attribution(m, TEXTS, method="guess", edge_k=2),
        InvalidInputError,
        "method",
    ),
    (
        "sink key past the sequences",
        "gpt2",
        lambda m: sink_scores(m, TEXTS, key=100),
        InvalidInputError,
        "key",
    ),
    (
        "sink eps outside (0, 1)",
        "gpt2",
        lambda m: sink_scores(m, TEXTS, eps=1.5),
        InvalidInputError,
        "eps",
    ),
    (
        "resid_mid on parallel GPT-NeoX",
        "neox",
        lambda m: positional_patching(m, TEXTS, component="resid_mid", bins=2),
        InvalidInputError,
        "resid_mid",
    ),
    (
        "unknown patching metric",
        "gpt2",
        lambda m: positional_patching(m, TEXTS, metric="accuracy", bins=2),
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
        lambda m: massive_activations(m, TEXTS, threshold=-1),
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


def test_results_folders_with_missing_or_extra_keys(tmp_path: Path, get_model) -> None:
    model = get_model("gpt2", BACKENDS[-1])
    prof = homogenization_profile(model, TEXTS, progress=False)
    folder = prof.save(tmp_path / "p")
    meta = json.loads((folder / "profile.json").read_text())
    (folder / "profile.json").write_text(json.dumps({**meta, "surprise": 1}))
    with pytest.raises(IncompatibleResultsError):
        HomogenizationProfile.load(folder)
    (folder / "profile.json").write_text(
        json.dumps({k: v for k, v in meta.items() if k != "layers"})
    )
    with pytest.raises(IncompatibleResultsError):
        HomogenizationProfile.load(folder)
    scores = sink_scores(model, TEXTS, progress=False).save(tmp_path / "s")
    (scores / "sink_scores.safetensors").unlink()
    with pytest.raises(ResultsNotFoundError):
        SinkScores.load(scores)


def test_cli_refuses_a_non_empty_output_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["compare", "--n-seq", "2", "--out", str(out)])
    assert result.exit_code != 0 and "--overwrite" in result.output
    assert (out / "keep.txt").read_text() == "mine"


def test_non_finite_activations_are_detected_not_averaged(get_model) -> None:
    model = get_model("llama", BACKENDS[-1])
    handle = model.hook_dict["blocks.1.hook_resid_post"].register_forward_hook(
        lambda module, inputs, output: output * float("nan")
    )
    try:
        with pytest.raises(NonFiniteActivationError, match="blocks.1.hook_resid_post"):
            position_ablation_study(model, TEXTS, progress=False)
    finally:
        handle.remove()
    assert hook_count(model) == 0


# ------------------------------------------------------------------ faults inside the forward
HOOKING: dict[str, Callable[[Any], Any]] = {
    "homogenization_profile": lambda m: homogenization_profile(m, TEXTS, progress=False),
    "position_ablation_study": lambda m: position_ablation_study(m, TEXTS, progress=False),
    "sink_scores": lambda m: sink_scores(m, TEXTS, progress=False),
    "massive_activations": lambda m: massive_activations(m, TEXTS, progress=False),
    "sink_attribution exact": lambda m: sink_attribution(m, TEXTS, top_k=1, edge_k=2),
    "sink_attribution fast": lambda m: sink_attribution(m, TEXTS, method="fast", edge_k=2),
    "sink_attribution mean": lambda m: sink_attribution(
        m, TEXTS, ablation="mean", top_k=1, edge_k=2
    ),
    "sink_analysis": lambda m: sink_analysis(m, TEXTS, top_k=1, edge_k=2, progress=False),
    "positional_patching": lambda m: positional_patching(m, TEXTS, bins=2, progress=False),
    "positional_patching head": lambda m: positional_patching(
        m, TEXTS, component="head", progress=False
    ),
    "ablated_positions": lambda m: _ablated_forward(m),
    "attention_view": lambda m: attention_view(m, "Hello there, world", [(1, 0)]),
    "compare_models": lambda m: compare_models({"m": m}, n_seq=2, seq_len=24, edge_k=2),
    "positional_similarity": lambda m: positional_similarity(
        m, torch.randint(0, 1000, (3, 12)), edge_k=2, progress=False
    ),
    "positional_similarity centred, pseudo": lambda m: positional_similarity(
        m,
        torch.randint(0, 1000, (3, 12)),
        edge_k=2,
        centre="global",
        pseudo_values=True,
        progress=False,
    ),
}


def _forward_with(model: Any, how: str, **options: Any) -> None:
    with ablated_positions(model, how, **options):
        model(torch.tensor([[464, 3290, 3332, 319, 262]]))


def _ablated_forward(model: Any) -> None:
    with ablated_positions(model, "permute", seed=0):
        model(torch.tensor([[464, 3290, 3332, 319, 262, 2603]]))


@pytest.mark.parametrize("name", list(HOOKING))
def test_fault_inside_the_forward_pass_leaves_no_hook(name: str, backend: str, get_model) -> None:
    model = get_model("gpt2", backend)
    before = state_hash(model)
    grad = torch.is_grad_enabled()

    def bomb(module: Any, inputs: Any, output: Any) -> None:
        raise RuntimeError("fault injected into blocks.1 (its input)")

    handle = model.hook_dict["blocks.1.hook_resid_pre"].register_forward_hook(bomb)
    try:
        with pytest.raises(RuntimeError, match="fault injected"):
            HOOKING[name](model)
    finally:
        handle.remove()
    assert hook_count(model) == 0, name
    assert state_hash(model) == before
    assert torch.is_grad_enabled() == grad and not torch.is_inference_mode_enabled()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(
    "name",
    [
        "homogenization_profile",
        "sink_scores",
        "massive_activations",
        "sink_attribution exact",
        "sink_attribution fast",
        "sink_attribution mean",
        "positional_similarity",
        "positional_similarity centred, pseudo",
    ],
)
def test_measurements_that_need_no_logits_run_no_final_norm(
    name: str, backend: str, get_model
) -> None:
    """Each forward pass ends at the last hook point it reads (no final norm, no unembedding)."""
    model = get_model("gpt2", backend)
    calls = []
    model.add_hook("ln_final.hook_normalized", lambda x, hook: calls.append(1))
    try:
        HOOKING[name](model)
        assert calls == [], name
        with torch.inference_mode():
            model(torch.tensor([[1, 2, 3]]))
        assert calls == [1]  # the counting hook itself works
    finally:
        model.reset_hooks()


# ------------------------------------------------------------------ determinism
def test_same_seed_same_results_on_every_backend(get_model) -> None:
    results = []
    for backend in BACKENDS:
        model = get_model("neox", backend)
        plan_a = position_ablation_hooks(model, "permute", seed=7)
        plan_b = position_ablation_hooks(model, "permute", seed=7)
        assert [n for n, _ in plan_a] == [n for n, _ in plan_b]
        a = position_ablation_study(model, TEXTS, modes=["permute"], seed=7, progress=False)
        b = position_ablation_study(model, TEXTS, modes=["permute"], seed=7, progress=False)
        assert torch.equal(a.loss, b.loss) and torch.equal(a.mean_pairwise, b.mean_pairwise)
        results.append(a)
    for other in results[1:]:
        assert torch.allclose(other.loss, results[0].loss, atol=1e-4)
        assert torch.allclose(other.mean_pairwise, results[0].mean_pairwise, atol=1e-4)


def test_nothing_is_ever_unpickled() -> None:
    """Results and checkpoints are safetensors + JSON: no module of homoglens imports pickle or
    calls torch.load (Hugging Face folders with *.bin weights are read by transformers, which
    loads them with weights_only=True)."""
    import re

    import homoglens

    root = Path(homoglens.__file__).parent
    for path in root.glob("*.py"):
        code = path.read_text()
        assert not re.search(r"^\s*(import|from)\s+(c?pickle|dill|joblib)\b", code, re.M), path
        assert "torch.load(" not in code, path
