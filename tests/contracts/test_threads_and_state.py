"""Issue 39, findings 1, 5 and 7: one model measured from two threads, a user's own forward
pass in another thread, weights processed after loading, and hooks homoglens did not attach."""

from __future__ import annotations

import threading
import warnings
from typing import Any

import pytest
import torch

from helpers import AUSTEN_TEXTS, BACKENDS
from homoglens import ablated_positions, homogenization_profile, load_model, model_info
from homoglens.testing import tiny_model_folder

TEXTS = AUSTEN_TEXTS * 3


def _fresh(arch: str, backend: str) -> Any:
    return load_model(tiny_model_folder(arch), backend=backend, device="cpu")


def _profile(model: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return homogenization_profile(model, TEXTS, batch_size=2, progress=False)


def _same(a: Any, b: Any) -> None:
    torch.testing.assert_close(a.to_others, b.to_others, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(a.mean_pairwise, b.mean_pairwise, rtol=0, atol=0, equal_nan=True)


def _run_in_threads(target: Any, n: int) -> list[Any]:
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = target(i)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_threads_measuring_one_model_get_the_single_thread_result(backend: str) -> None:
    model = _fresh("llama", backend)
    alone = _profile(model)
    configs = [model.original_model.config] if backend == "bridge" else []
    before = [c._attn_implementation for c in configs]
    results = _run_in_threads(lambda i: [_profile(model) for _ in range(3)], 3)
    for runs in results:
        for got in runs:
            _same(got, alone)
    assert [c._attn_implementation for c in configs] == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_users_own_forward_in_another_thread_is_untouched(backend: str) -> None:
    model = _fresh("llama", backend)
    tokens = torch.tensor([[5, 17, 29, 3, 11, 40, 8]])
    with torch.no_grad():
        expected = model(tokens)
    alone = _profile(model)
    stop = threading.Event()

    def measure(_: int) -> list[Any]:
        try:
            return [_profile(model) for _ in range(4)]
        finally:
            stop.set()

    def forward(_: int) -> list[torch.Tensor]:
        got = []
        while not stop.is_set():
            with torch.no_grad():
                got.append(model(tokens))
        return got

    measured, forwards = _run_in_threads(lambda i: measure(i) if i == 0 else forward(i), 2)
    for got in measured:
        _same(got, alone)
    assert forwards, "the user's thread never ran"
    for logits in forwards:
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_processed_after_loading_are_recorded(backend: str) -> None:
    model = _fresh("gpt2", backend)
    assert model_info(model).weights == "raw"
    if backend == "bridge":
        model.enable_compatibility_mode(disable_warnings=True)
    else:
        model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
        model.eval()  # process_weights_ swaps in new norm modules, in training mode
    with pytest.warns(UserWarning, match="processed"):
        profile = homogenization_profile(model, TEXTS[:2], progress=False)
    assert profile.provenance.weights == "processed"


@pytest.mark.parametrize("backend", BACKENDS)
def test_hooks_homoglens_did_not_attach_are_named_and_recorded(backend: str) -> None:
    model = _fresh("gpt2", backend)
    clean = _profile(model)
    assert clean.provenance.foreign_hooks == ()
    with ablated_positions(model, "zero"):
        with pytest.warns(UserWarning, match="did not attach"):
            ablated = homogenization_profile(model, TEXTS, batch_size=2, progress=False)
    assert ablated.provenance.foreign_hooks, "the intervention's hooks were not recorded"
    assert not torch.equal(ablated.mean_pairwise, clean.mean_pairwise)
    model.add_hook("blocks.0.hook_resid_post", lambda act, hook: act, is_permanent=True)
    try:
        with pytest.warns(UserWarning, match="did not attach"):
            kept = homogenization_profile(model, TEXTS[:2], progress=False)
        assert kept.provenance.foreign_hooks in (
            ("blocks.0.hook_resid_post",),
            ("blocks.0.hook_out",),
        )
    finally:
        model.reset_hooks(including_permanent=True)
    again = _profile(model)
    assert again.provenance.foreign_hooks == ()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_intervention_block_in_another_thread_never_reaches_a_measurement(backend) -> None:
    """Thread A loops over `with ablated_positions(...)` blocks (a measurement inside each);
    thread B's plain profiles used to read through A's hooks (off by 0.024, sometimes with
    no foreign hook recorded): the block holds the model, B waits for it to end."""
    model = _fresh("gpt2", backend)
    clean = _profile(model)
    stop = threading.Event()

    def ablate() -> None:
        while not stop.is_set():
            with ablated_positions(model, "zero"):
                _profile(model)

    other = threading.Thread(target=ablate)
    other.start()
    try:
        runs = [_profile(model) for _ in range(4)]
    finally:
        stop.set()
        other.join()
    for got in runs:
        _same(got, clean)
        assert got.provenance.foreign_hooks == ()
