"""Hook hygiene: every public entry point that attaches hooks leaves no hook (nor any other
state a pass switches) behind, after a normal return and after a fault or an interrupt raised
inside its forward passes; passes that need no logits end before the final norm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import THREE_OPENINGS, hook_count, public_measurements, state_hash
from homoglens import (
    ablated_massive_activations,
    ablated_positions,
    attention_bias_hooks,
    attention_rollout,
    attention_view,
    calibrated_readings,
    compare_models,
    compression_valleys,
    homogenization_profile,
    massive_ablation_study,
    massive_activation_hooks,
    massive_activation_means,
    massive_activations,
    perturbation_spread,
    position_ablation_hooks,
    position_ablation_study,
    positional_patching,
    positional_similarity,
    sink_analysis,
    sink_attribution,
    sink_scores,
    to_token_batch,
)

HOOKING: dict[str, Callable[[Any], Any]] = {
    "homogenization_profile": lambda m: homogenization_profile(m, THREE_OPENINGS, progress=False),
    "position_ablation_study": lambda m: position_ablation_study(m, THREE_OPENINGS, progress=False),
    "sink_scores": lambda m: sink_scores(m, THREE_OPENINGS, progress=False),
    "attention_rollout": lambda m: attention_rollout(m, THREE_OPENINGS, progress=False),
    "perturbation_spread": lambda m: perturbation_spread(
        m, THREE_OPENINGS, position=1, progress=False
    ),
    "massive_activations": lambda m: massive_activations(m, THREE_OPENINGS, progress=False),
    "sink_attribution exact": lambda m: sink_attribution(m, THREE_OPENINGS, top_k=1, edge_k=2),
    "sink_attribution fast": lambda m: sink_attribution(m, THREE_OPENINGS, method="fast", edge_k=2),
    "sink_attribution mean": lambda m: sink_attribution(
        m, THREE_OPENINGS, ablation="mean", top_k=1, edge_k=2
    ),
    "sink_analysis": lambda m: sink_analysis(m, THREE_OPENINGS, top_k=1, edge_k=2, progress=False),
    "positional_patching": lambda m: positional_patching(m, THREE_OPENINGS, bins=2, progress=False),
    "positional_patching head": lambda m: positional_patching(
        m, THREE_OPENINGS, component="head", progress=False
    ),
    "ablated_positions": lambda m: _ablated_forward(m),
    "ablated_massive_activations": lambda m: _massive_forward(m),
    "massive_activation_means": lambda m: massive_activation_means(
        m, THREE_OPENINGS, layer=2, dims=[3], progress=False
    ),
    "attention_view": lambda m: attention_view(m, "Hello there, world", [(1, 0)]),
    "compare_models": lambda m: compare_models({"m": m}, n_seq=2, seq_len=24, edge_k=2),
    "compression_valleys": lambda m: compression_valleys(
        m, THREE_OPENINGS, ablation_layer=1, dims=[0, 3], n_boot=10, progress=False
    ),
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


def _ablated_forward(model: Any) -> None:
    with ablated_positions(model, "permute", seed=0):
        model(torch.tensor([[464, 3290, 3332, 319, 262, 2603]]))


def _massive_forward(model: Any) -> None:
    with ablated_massive_activations(model, "zero", layer=1, dims=[3, 7], positions=[0, 2]):
        model(torch.tensor([[464, 3290, 3332, 319, 262, 2603]]))


def test_massive_ablation_leaves_no_hook_after_an_error_in_its_body(backend, get_model) -> None:
    model = get_model("gpt2", backend)
    before = state_hash(model)
    means = torch.ones(1, 2)
    with pytest.raises(KeyError, match="raised in the body"):
        with ablated_massive_activations(model, "mean", layer=2, dims=[1, 5], means=means):
            assert hook_count(model) >= 1  # the bridge lists an aliased hook point twice
            raise KeyError("raised in the body")
    assert hook_count(model) == 0 and state_hash(model) == before
    with pytest.raises(ValueError, match="after the block"):
        with ablated_massive_activations(model, "zero", layer=1, dims=5):
            model(torch.tensor([[1, 2, 3]]))
        assert hook_count(model) == 0
        raise ValueError("after the block")


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
        "attention_rollout",
        "massive_activations",
        "massive_activation_means",
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


# ------------------------------------------------- every public entry point, both ways out

WINDOWS = torch.randint(0, 900, (2, 24), generator=torch.Generator().manual_seed(5))


def _calibrated_against_itself(m: Any) -> Any:
    """The reference model read under a positional ablation (its hooks on the reference)."""
    return calibrated_readings(
        m, WINDOWS, reference=m, reference_positions="zero", edge_k=2, progress=False
    )


def _hooks_only(make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A hook builder: it returns ``(name, fn)`` pairs and attaches nothing; the pass the user
    runs with them (``model.hooks``) is TransformerLens' own."""

    def run(m: Any) -> Any:
        attached = hook_count(m)
        hooks = make(m)
        assert hooks and hook_count(m) == attached
        with torch.inference_mode(), m.hooks(fwd_hooks=hooks):
            return m(WINDOWS[:1])

    return run


QUICK = {"progress": False, "n_boot": 10}
EVERY: dict[str, Callable[[Any], Any]] = {
    **public_measurements(WINDOWS),
    # the table's slowest entries, with fewer modes and bootstrap samples (the hooks are the same)
    "position_ablation_study": lambda m: position_ablation_study(
        m, WINDOWS, modes=["none", "permute"], **QUICK
    ),
    "massive_ablation_study": lambda m: massive_ablation_study(
        m, WINDOWS, layer=1, dims=[0, 1], positions=[0], **QUICK
    ),
    "compare_models": lambda m: compare_models(
        {"m": m}, to_token_batch(m, WINDOWS), modes=("none", "zero"), edge_k=2, **QUICK
    ),
    "sink_analysis": lambda m: sink_analysis(
        m, WINDOWS, top_k=1, edge_k=2, attribution_n_seq=2, progress=False
    ),
    "calibrated_readings": lambda m: calibrated_readings(
        m, WINDOWS, offset=8, edge_k=2, progress=False
    ),
    "calibrated_readings reference model": _calibrated_against_itself,
    "position_ablation_hooks": _hooks_only(lambda m: position_ablation_hooks(m, "zero")),
    "attention_bias_hooks": _hooks_only(lambda m: attention_bias_hooks(m, "first", 1.0)),
    "massive_activation_hooks": _hooks_only(
        lambda m: massive_activation_hooks(m, "zero", layer=1, dims=[0])
    ),
}
"""Every public entry point that takes a model and runs it: the device-discipline table
(:func:`helpers.public_measurements`, on ``[2 24]`` windows; its slowest entries cheaper) and
what it lacks."""

NOT_RUN: dict[str, str] = {
    "over_checkpoints": "takes checkpoint folders and loads (then drops) its own models",
    "random_reference": "loads a new model; never runs the one it is given",
    "corpus_windows": "reads the tokenizer only",
    "to_token_batch": "reads the tokenizer only",
    "model_info": "reads the config and weights' dtype only",
    "fast_attention_status": "reads the config only",
    "architecture_of": "reads the config only",
}
"""Public functions that take a model (or models) but attach no hook to it, and why."""


def test_the_table_holds_every_public_entry_point_that_takes_a_model() -> None:
    import inspect

    import homoglens

    takes_a_model = {
        name
        for name in homoglens.__all__
        if inspect.isfunction(obj := getattr(homoglens, name))
        and {"model", "models"} & set(inspect.signature(obj).parameters)
    }
    covered = {key.split(" ")[0] for key in EVERY}
    assert takes_a_model - set(NOT_RUN) <= covered, takes_a_model - set(NOT_RUN) - covered
    assert set(NOT_RUN) <= takes_a_model  # no stale exclusion
    assert not set(NOT_RUN) & covered


def _state(model: Any) -> dict[str, Any]:
    """Everything a pass may switch and must put back: hooks on any module (TransformerLens hook
    points and the Hugging Face modules under a bridge), forwards replaced on an instance (the
    SDPA fast path), attention implementations, the model's lock, gradient flags and grads,
    train/eval mode, autograd's mode, and the weights."""
    import homoglens.run.fast_attention as fa
    from homoglens.models.loading import model_lock

    modules = list(model.modules())
    configs = [getattr(m, "config", None) for m in modules]
    lock = model_lock(model)
    return {
        "hook points": hook_count(model),
        "module hooks": sum(
            len(m._forward_hooks)
            + len(m._forward_pre_hooks)
            + len(m._backward_hooks)
            + len(getattr(m, "_backward_pre_hooks", {}))
            for m in modules
        ),
        "replaced forwards": [i for i, m in enumerate(modules) if "forward" in m.__dict__],
        "fast-path owners": len(fa._OWNER),
        "attention": [getattr(c, "_attn_implementation", None) for c in configs if c is not None],
        "lock": (lock.depth, lock.owner),
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad is None for p in model.parameters()],
        "training": [m.training for m in modules],
        "autograd": (torch.is_grad_enabled(), torch.is_inference_mode_enabled()),
        "weights": state_hash(model),
    }


class _Fault:
    """A torch forward hook on ``blocks.0.hook_resid_pre`` and ``blocks.1.hook_resid_pre`` (a
    pass that starts at block 1 fires the second only) that counts its calls and raises
    ``error`` at call ``at`` (``None``: never): a fault inside a forward pass."""

    NAMES = ("blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre")

    def __init__(self, model: Any, error: BaseException | None = None, at: int = 0) -> None:
        self.calls, self.error, self.at = 0, error, at
        self.handles = [model.hook_dict[n].register_forward_hook(self) for n in self.NAMES]

    def __call__(self, module: Any, inputs: Any, output: Any) -> None:
        self.calls += 1
        if self.error is not None and self.calls == self.at:
            raise self.error

    def __enter__(self) -> _Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("name", list(EVERY))
def test_no_hook_stays_after_a_return_or_an_interrupt(name: str, backend: str, get_model) -> None:
    """Normal return, then a KeyboardInterrupt (not an Exception: an ``except Exception``
    cleanup misses it) raised from inside the passes, half way through the measurement's
    passes: everything :func:`_state` reads is as before, both times."""
    import warnings

    model = get_model("gpt2", backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.inference_mode():
            model(WINDOWS[:1])  # the bridge's first pass installs its own capture hooks
        before = _state(model)
        try:
            with _Fault(model) as counter:
                EVERY[name](model)
            returned = _state(model)
            assert counter.calls >= 1, f"{name} never ran a block"
            at = counter.calls // 2 + 1
            with _Fault(model, KeyboardInterrupt(f"interrupted {name}"), at=at):
                with pytest.raises(KeyboardInterrupt, match="interrupted"):
                    EVERY[name](model)
            interrupted = _state(model)
        finally:
            model.reset_hooks()  # what a failure left must not fail the next test
    for state in (returned, interrupted):
        assert state == before, {k: (before[k], state[k]) for k in before if before[k] != state[k]}


@pytest.mark.parametrize("error", [RuntimeError("metric failed"), KeyboardInterrupt("metric")])
def test_a_metric_that_raises_leaves_no_hook(error: BaseException, backend: str, get_model) -> None:
    """A user's patching metric that raises (between passes, with the cells' hooks built)."""
    model = get_model("gpt2", backend)
    before = _state(model)

    def metric(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> float:
        raise error

    try:
        with pytest.raises(type(error), match="metric"):
            positional_patching(model, WINDOWS, metric=[metric], bins=2, progress=False)
        after = _state(model)
    finally:
        model.reset_hooks()
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
