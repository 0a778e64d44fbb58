"""End-to-end invariant of activation patching: restoring (or breaking) a residual-stream site
at every position gives effect 1 wherever the metric is read after that site and nothing
downstream of it differs between the two runs.

A test against a hand-written hook on the same hook point cannot tell whether the hook point
is the right one (on the bridge ``hook_resid_mid`` is the input hook of ln2, and a write there
changes only what the MLP reads). This invariant can: it only holds when the patch replaces the
stream itself.

Covered: ``resid_pre`` of block l read at entry l (the patched vector itself, every family);
``resid_mid`` of block l read at entry l + 1 and by the loss of the last block (the MLP, the
final norm and the unembedding carry no position, so nothing after the site differs; every
family with a resid_mid); for learned-absolute models, whose positions enter only at the
embeddings, every site of every block, read at the last entry and by the loss. Exempt:
``attn_out``, ``mlp_out`` and ``head`` write one branch while the receiving run's own stream
flows past them, so the metric after them differs from the source run even when the whole
branch is restored; rotary models' resid_* sites read after a later attention layer (the
later blocks still rotate differently).
"""

from __future__ import annotations

import pytest
import torch

from helpers import hook_count
from homoglens import corpus_windows, positional_patching

DIRECTIONS = ["restore", "break"]


def _effect(model, tokens, component, layer, metric_layer, direction, metric) -> torch.Tensor:
    """Effect of the patch, checked to be 1: |patched - source| within 1e-5 of the gap (and of
    float32 noise, ~1e-7 relative, where the ablation barely moves a random model's metric)."""
    result = _patch(model, tokens, component, layer, metric_layer, direction, metric)
    gap = (result.source - result.receiving).abs()
    error = (result.patched[:, 0, 0] - result.source).abs()
    assert bool((error <= 1e-5 * gap + 1e-6 * result.source.abs() + 1e-9).all()), (
        f"{component} block {layer}: patched {result.patched[:, 0, 0].tolist()}, source "
        f"{result.source.tolist()}, receiving {result.receiving.tolist()}"
    )
    return result.effect[:, 0, 0]


def _patch(model, tokens, component, layer, metric_layer, direction, metric):
    return positional_patching(
        model,
        tokens,
        how="zero",
        component=component,
        metric=metric,
        direction=direction,
        layers=[layer],
        bins=[(0, tokens.shape[1])],
        metric_layer=metric_layer,
        progress=False,
    )


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_resid_mid_restores_the_stream(arch, backend, direction, get_model) -> None:
    model = get_model(arch, backend)
    if arch == "neox":
        pytest.skip("GPT-NeoX runs attention and MLP in parallel: no resid_mid")
    tokens = corpus_windows(model, n_seq=3, seq_len=16).tokens
    n = int(model.cfg.n_layers)
    for layer in range(n):
        metrics = ["mean_pairwise", "loss"] if layer == n - 1 else ["mean_pairwise"]
        _effect(model, tokens, "resid_mid", layer, layer + 1, direction, metrics)
    assert hook_count(model) == 0


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_resid_pre_restores_the_entry_it_writes(arch, backend, direction, get_model) -> None:
    model = get_model(arch, backend)
    tokens = corpus_windows(model, n_seq=3, seq_len=16).tokens
    for layer in range(1, int(model.cfg.n_layers)):
        _effect(model, tokens, "resid_pre", layer, layer, direction, "mean_pairwise")


@pytest.mark.parametrize("component", ["resid_pre", "resid_mid"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_learned_positions_every_block_restores_everything(
    backend, component, direction, get_model
) -> None:
    model = get_model("gpt2", backend)  # positions enter at the embeddings only
    tokens = corpus_windows(model, n_seq=3, seq_len=16).tokens
    n = int(model.cfg.n_layers)
    for layer in range(n):
        effect = _effect(model, tokens, component, layer, n, direction, ["mean_pairwise", "loss"])
        torch.testing.assert_close(effect, torch.ones_like(effect), atol=1e-4, rtol=0)


def test_mlp_out_alone_is_not_the_stream(backend, get_model) -> None:
    """The bug this file guards: resid_mid equal to the mlp_out effect (the MLP input only)."""
    model = get_model("llama", backend)
    tokens = corpus_windows(model, n_seq=3, seq_len=16).tokens
    n = int(model.cfg.n_layers)
    mid = _effect(model, tokens, "resid_mid", n - 1, n, "restore", "mean_pairwise")
    mlp = _patch(model, tokens, "mlp_out", n - 1, n, "restore", "mean_pairwise").effect[:, 0, 0]
    assert abs(float(mid[0]) - 1) < 1e-3
    assert abs(float(mlp[0]) - 1) > 1e-2
