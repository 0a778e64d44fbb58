"""Data parallelism: ``torchrun --nproc_per_node 2`` (gloo, CPU) gives the one-process results, with
even and uneven shards, padded sequences of several lengths, on every rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from homoglens import (
    AttentionBiasStudy,
    AttentionReceived,
    HomogenizationProfile,
    LengthStudy,
    MassiveActivations,
    PositionAblationStudy,
    PositionalPatchingResult,
    PositionalSimilarity,
    SinkAttribution,
    SinkScores,
    attention_bias_study,
    attention_received,
    corpus_windows,
    homogenization_profile,
    length_study,
    load_model,
    massive_activations,
    position_ablation_study,
    positional_patching,
    positional_similarity,
    sink_attribution,
    sink_scores,
)
from homoglens.core.distributed import shard_bounds
from homoglens.run.data import TokenBatch
from homoglens.testing import tiny_model_folder

WORKER = r"""
import sys
import torch
import torch.distributed as dist
from homoglens import homogenization_profile, load_model, position_ablation_study, sink_scores
from homoglens import massive_activations, positional_patching, positional_similarity
from homoglens import sink_attribution
from homoglens.core.distributed import world
sys.path[:0] = [sys.argv[4], str(__import__('pathlib').Path(sys.argv[4]).parent)]
from test_distributed import equal_batch, make_batch

dist.init_process_group("gloo")
rank, size = world()
folder, out, n, backend = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
model = load_model(folder, backend=backend, device="cpu")
batch = make_batch(model, n)
seen = []
model.hook_dict["blocks.0.hook_resid_pre"].add_hook(lambda x, hook: seen.append(x.shape[0]))
homogenization_profile(model, batch, batch_size=5, progress=False).save(f"{out}/profile{rank}")
model.reset_hooks()
open(f"{out}/seen{rank}", "w").write(str(sum(seen)))
sink_scores(model, batch, batch_size=5, progress=False).save(f"{out}/sinks{rank}")
position_ablation_study(
    model, batch, modes=["zero", "permute"], batch_size=5, n_boot=50, progress=False
).save(f"{out}/study{rank}")
positional_similarity(
    model, equal_batch(model, n), centre="position", pseudo_values=True, edge_k=4, batch_size=5,
    progress=False,
).save(f"{out}/similarity{rank}")
massive_activations(model, batch, batch_size=5, progress=False).save(f"{out}/massive{rank}")
for method in ("exact", "fast"):
    sink_attribution(
        model, batch, method=method, heads=[(0, 0), (1, 1)], edge_k=2, batch_size=5,
        progress=False,
    ).save(f"{out}/attribution-{method}{rank}")
positional_patching(
    model, batch, metric=["mean_pairwise", "loss"], layers=[0, 1], bins=2, batch_size=5,
    cell_batch=2, progress=False,
).save(f"{out}/patching{rank}")
from homoglens import attention_bias_study, attention_received, length_study
attention_received(model, batch, batch_size=5, progress=False).save(f"{out}/received{rank}")
length_study(
    model, equal_batch(model, n), lengths=[12, 20], lags=[1], edge_k=2, batch_size=5,
    progress=False,
).save(f"{out}/lengths{rank}")
attention_bias_study(
    model, equal_batch(model, n), kind="first", strengths=[-0.5, 0.0, 0.5], layers=[1],
    edge_k=2, gradient_windows=6, batch_size=5, progress=False,
).save(f"{out}/bias{rank}")
dist.destroy_process_group()
"""


def make_batch(model, n: int) -> TokenBatch:
    """``n`` Austen windows of 24 tokens, cut to lengths 9..24 and left-padded."""
    windows = corpus_windows(model, n_seq=n, seq_len=24)
    lengths = 9 + (torch.arange(n) * 7) % 16
    tokens = torch.zeros_like(windows.tokens)
    mask = torch.zeros_like(windows.tokens)
    for i, t in enumerate(lengths.tolist()):
        tokens[i, 24 - t :] = windows.tokens[i, :t]
        mask[i, 24 - t :] = 1
    return TokenBatch(tokens, mask, windows.bos, "left-padded Austen windows")


def equal_batch(model, n: int) -> TokenBatch:
    """``n`` Austen windows of 20 tokens, left-padded by 0..4 pads (equal real lengths)."""
    windows = corpus_windows(model, n_seq=n, seq_len=20)
    tokens = torch.zeros(n, 24, dtype=torch.long)
    mask = torch.zeros(n, 24, dtype=torch.long)
    for i in range(n):
        pad = i % 5
        tokens[i, pad : pad + 20] = windows.tokens[i]
        mask[i, pad : pad + 20] = 1
    return TokenBatch(tokens, mask, windows.bos, "equal-length Austen windows")


def test_shard_bounds_cover_everything_once() -> None:
    for n in (0, 1, 5, 63, 64):
        for size in (1, 2, 3, 8):
            bounds = shard_bounds(n, size)
            assert len(bounds) == size and bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
            sizes = [stop - start for start, stop in bounds]
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("n", [64, 63])
def test_torchrun_two_processes_equal_one(n: int, backend: str, tmp_path: Path) -> None:
    folder = tiny_model_folder("gpt2")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + [str(worker), str(folder), str(tmp_path), str(n), str(Path(__file__).parent), backend],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model = load_model(folder, backend=backend, device="cpu")
    batch = make_batch(model, n)
    one = homogenization_profile(model, batch, batch_size=5, progress=False)
    sinks = sink_scores(model, batch, batch_size=5, progress=False)
    study = position_ablation_study(
        model, batch, modes=["zero", "permute"], batch_size=5, n_boot=50, progress=False
    )
    sim = positional_similarity(
        model, equal_batch(model, n), centre="position", pseudo_values=True, edge_k=4,
        batch_size=5, progress=False,
    )  # fmt: skip
    massive = massive_activations(model, batch, batch_size=5, progress=False)
    attributions = {
        method: sink_attribution(
            model,
            batch,
            method=method,
            heads=[(0, 0), (1, 1)],
            edge_k=2,
            batch_size=5,
            progress=False,
        )
        for method in ("exact", "fast")
    }
    patch = positional_patching(
        model,
        batch,
        metric=["mean_pairwise", "loss"],
        layers=[0, 1],
        bins=2,
        batch_size=5,
        cell_batch=2,
        progress=False,
    )
    received = attention_received(model, batch, batch_size=5, progress=False)
    lengths = length_study(
        model, equal_batch(model, n), lengths=[12, 20], lags=[1], edge_k=2, batch_size=5,
        progress=False,
    )  # fmt: skip
    bias = attention_bias_study(
        model, equal_batch(model, n), kind="first", strengths=[-0.5, 0.0, 0.5], layers=[1],
        edge_k=2, gradient_windows=6, batch_size=5, progress=False,
    )  # fmt: skip
    for rank in (0, 1):  # the merges the engine runs for these (issue 40)
        got_received = AttentionReceived.load(tmp_path / f"received{rank}")
        assert torch.equal(got_received.n_pairs, received.n_pairs)  # was added twice
        for name in ("received", "shift", "slope", "correlation"):
            a, b = getattr(got_received, name), getattr(received, name)
            assert torch.allclose(a, b, atol=1e-6, equal_nan=True), name
        got_lengths = LengthStudy.load(tmp_path / f"lengths{rank}")
        for name in ("statistics", "window_statistics", "lag_similarity", "first_key_mass"):
            a, b = getattr(got_lengths, name), getattr(lengths, name)
            assert torch.allclose(a, b, atol=1e-6, equal_nan=True), name
        got_bias = AttentionBiasStudy.load(tmp_path / f"bias{rank}")
        for name in ("statistics", "window_statistics", "window_attention", "window_loss",
                     "gradient_statistics", "window_gradient_statistics"):  # fmt: skip
            a, b = getattr(got_bias, name), getattr(bias, name)
            assert torch.allclose(a, b, atol=1e-5, equal_nan=True), name
    seen = [int((tmp_path / f"seen{rank}").read_text()) for rank in (0, 1)]
    assert seen == [stop - start for start, stop in shard_bounds(n, 2)]  # each rank its shard
    for rank in (0, 1):
        prof = HomogenizationProfile.load(tmp_path / f"profile{rank}")
        assert prof.n_sequences == n and prof.n_tokens == one.n_tokens
        for name in ("to_others", "to_prefix", "norm"):
            a, b = getattr(prof, name), getattr(one, name)
            assert torch.allclose(a, b, atol=1e-6, equal_nan=True), name
        for name in ("mean_pairwise", "baseline", "relative_residual"):
            assert torch.allclose(getattr(prof, name), getattr(one, name), atol=1e-6), name
        assert torch.equal(prof.count, one.count)
        got = SinkScores.load(tmp_path / f"sinks{rank}")
        assert got.n_sequences == n
        for name in ("mass", "importance", "sink_rate_by_head"):
            assert torch.allclose(getattr(got, name), getattr(sinks, name), atol=1e-6), name
        assert torch.allclose(got.mass_by_query, sinks.mass_by_query, atol=1e-6, equal_nan=True)
        st = PositionAblationStudy.load(tmp_path / f"study{rank}")
        assert torch.allclose(st.loss, study.loss, atol=1e-6)
        assert torch.allclose(st.mean_pairwise, study.mean_pairwise, atol=1e-6)
        assert torch.allclose(st.to_others, study.to_others, atol=1e-6, equal_nan=True)
        got_massive = MassiveActivations.load(tmp_path / f"massive{rank}")
        assert got_massive.n_sequences == n
        for name in ("ratio_mean", "ratio_max", "top_value", "dim_counts"):
            a, b = getattr(got_massive, name), getattr(massive, name)
            assert torch.allclose(a, b, atol=1e-6, equal_nan=True), name
        for method, want in attributions.items():
            got = SinkAttribution.load(tmp_path / f"attribution-{method}{rank}")
            assert torch.allclose(got.base, want.base, atol=1e-6), method
            assert torch.allclose(got.delta, want.delta, atol=1e-6, equal_nan=True), method
        got_patch = PositionalPatchingResult.load(tmp_path / f"patching{rank}")
        for name in ("patched", "normal", "ablated"):
            a, b = getattr(got_patch, name), getattr(patch, name)
            assert torch.allclose(a, b, atol=1e-6), name
        assert got_patch.forward_equivalents == pytest.approx(patch.forward_equivalents)
        got_sim = PositionalSimilarity.load(tmp_path / f"similarity{rank}")
        assert got_sim.n_sequences == n
        for name in ("M", "C", "SP", "window_within", "window_cross", "window_same_position"):
            assert torch.allclose(getattr(got_sim, name), getattr(sim, name), atol=1e-6), name


def test_multi_device_options_are_checked_and_passed_through(monkeypatch) -> None:
    from homoglens import InvalidInputError
    from homoglens.models.loading import _check_placement

    with pytest.raises(InvalidInputError, match="CUDA devices"):
        load_model(tiny_model_folder("gpt2"), backend="bridge", n_devices=2 + 64)
    with pytest.raises(InvalidInputError, match="TransformerBridge option"):
        _check_placement("hooked", "auto", 1)
    with pytest.raises(InvalidInputError, match="device_map"):
        _check_placement("bridge", 3, 1)
    assert _check_placement("bridge", "auto", 1) == {"device_map": "auto"}
    seen = {}
    from transformer_lens.model_bridge import TransformerBridge

    real = TransformerBridge.boot_transformers

    def spy(source, **kwargs):
        seen.update(kwargs)
        kwargs.pop("device_map", None)
        return real(source, **kwargs)

    monkeypatch.setattr(TransformerBridge, "boot_transformers", staticmethod(spy))
    model = load_model(tiny_model_folder("gpt2"), backend="bridge", device_map={"": "cpu"})
    assert seen["device_map"] == {"": "cpu"} and model.cfg.n_layers == 2


MISMATCH = r"""
import sys
import torch.distributed as dist
from homoglens import DistributedError, homogenization_profile, load_model
dist.init_process_group("gloo")
model = load_model(sys.argv[1], backend="bridge", device="cpu")
texts = ["one two three four", "five six seven eight"][: 1 + dist.get_rank()]
try:
    homogenization_profile(model, texts, progress=False)
except DistributedError as err:
    print("DistributedError:", err)
"""


def test_ranks_with_different_data_are_refused(tmp_path: Path) -> None:
    worker = tmp_path / "mismatch.py"
    worker.write_text(MISMATCH)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + [str(worker), str(tiny_model_folder("gpt2"))],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout.count("the ranks were given different data") == 2, (
        done.stdout + done.stderr[-2000:]
    )
