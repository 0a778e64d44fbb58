"""Unit tests of homoglens.run.engine: the one streaming driver, its model-state checks, reducers
and the pass that ends after the last hook point read."""

from __future__ import annotations

import pytest
import torch

from helpers import SHORT_TEXTS, hook_count, reseal
from homoglens import (
    ModelStateError,
    homogenization_profile,
    load_model,
    sink_scores,
)
from homoglens.testing import tiny_model_folder


def test_submodule_in_training_mode_is_refused(arch, backend, get_model) -> None:
    model = get_model(arch, backend)
    block = model.blocks[0]
    block.train()
    try:
        assert not model.training
        with pytest.raises(ModelStateError, match="training mode"):
            homogenization_profile(model, SHORT_TEXTS, progress=False)
        with pytest.raises(ModelStateError, match="blocks.0"):
            sink_scores(model, SHORT_TEXTS, progress=False)
        assert hook_count(model) == 0
    finally:
        model.eval()
    homogenization_profile(model, SHORT_TEXTS, progress=False)


def test_inference_mode_weights_are_refused_where_gradients_are_needed() -> None:
    from homoglens import sink_attribution

    model = load_model(tiny_model_folder("gpt2"), backend="bridge")
    with torch.inference_mode():  # new weights are inference tensors
        model.to(torch.float64)
    with pytest.raises(ModelStateError, match="inference_mode"):
        sink_attribution(model, SHORT_TEXTS, method="fast", edge_k=2, progress=False)
    assert hook_count(model) == 0


def _counter(calls: dict[str, int], name: str):
    def count(activation: torch.Tensor, hook) -> None:
        calls[name] = calls.get(name, 0) + 1

    return count


def test_run_through_ends_after_every_read_point_has_fired(backend, get_model) -> None:
    """Two read points in two blocks: both fire once, nothing after the later one runs (no
    next block, no final norm), and no hook is left; on the bridge the names given are
    aliases of canonical hook names, which must not stop the pass from ending."""
    from homoglens.run.engine import run_through

    model = get_model("gpt2", backend)
    tokens = model.to_tokens(SHORT_TEXTS[0])
    calls: dict[str, int] = {}
    read = ["blocks.0.hook_resid_post", "blocks.0.attn.hook_pattern"]
    later = ["blocks.1.hook_resid_pre", "ln_final.hook_normalized"]
    hooks = [(name, _counter(calls, name)) for name in [*read, *later]]
    run_through(model, tokens, read, hooks)
    assert calls == {name: 1 for name in read}
    assert hook_count(model) == 0


def test_stream_sums_do_not_depend_on_the_batching(get_model) -> None:
    """A Sums reducer fed through the engine: the same totals for any batch size, pads never
    counted, every sequence seen once."""
    from homoglens import to_token_batch
    from homoglens.run.engine import Sums, stream

    model = get_model("llama", "bridge")
    batch = to_token_batch(model, [*SHORT_TEXTS, "A third and last text, of its own length."])
    totals = []
    for batch_size in (1, 2, 3):
        red = Sums(sums={"norm": torch.zeros((), dtype=torch.float64)})

        def hook(resid: torch.Tensor, hook, red=red) -> None:
            mask = red.batch["mask"].to(torch.float64)
            red.sums["norm"] += (resid.double().norm(dim=-1) * mask).sum()

        red.add_hooks([("blocks.0.hook_resid_post", hook)])
        stream(model, batch, [red], batch_size=batch_size, desc="test", progress=False)
        totals.append(float(red.sums["norm"]))
    assert totals[0] == pytest.approx(totals[1], rel=1e-9)
    assert totals[0] == pytest.approx(totals[2], rel=1e-9)
    assert hook_count(model) == 0


def test_stream_without_anything_to_read_is_refused(get_model) -> None:
    from homoglens import to_token_batch
    from homoglens.run.engine import Sums, stream

    model = get_model("gpt2", "bridge")
    with pytest.raises(ValueError, match="no reducer reads"):
        stream(
            model, to_token_batch(model, SHORT_TEXTS), [Sums()], batch_size=2, desc="x",
            progress=False,
        )  # fmt: skip


def test_an_error_inside_a_reducer_leaves_no_hook(get_model) -> None:
    from homoglens import to_token_batch
    from homoglens.run.engine import Sums, stream

    model = get_model("gpt2", "bridge")

    def boom(resid: torch.Tensor, hook) -> None:
        raise RuntimeError("boom")

    red = Sums([("blocks.1.hook_resid_post", boom)])
    with pytest.raises(RuntimeError, match="boom"):
        stream(
            model, to_token_batch(model, SHORT_TEXTS), [red], batch_size=1, desc="x",
            progress=False, extra_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x)],
        )  # fmt: skip
    assert hook_count(model) == 0


def test_a_pass_plan_is_run_by_the_engine_pass_by_pass(get_model) -> None:
    """Issue 40: a measurement's passes are a generator of ``Pass`` es the engine runs; a pass
    to the logits sends them back (the same as ``run_logits``), one with ``last`` sends
    ``None``; the thread state a plan enters around its ``yield`` holds while its pass runs."""
    from homoglens import to_token_batch
    from homoglens.run.engine import Pass, run_logits, stream

    model = get_model("gpt2", "bridge")
    batch = to_token_batch(model, SHORT_TEXTS)
    seen: list[object] = []
    inference: list[bool] = []

    def note(resid: torch.Tensor, hook) -> None:
        inference.append(torch.is_inference_mode_enabled())

    def plan(tokens: torch.Tensor, mask: torch.Tensor):
        logits = yield Pass(tokens, attention_mask=mask)
        seen.append(torch.equal(logits, run_logits(model, tokens, [], attention_mask=mask)))
        hooks = [("blocks.0.hook_resid_post", note)]
        with torch.inference_mode(False), torch.no_grad():
            read = yield Pass(tokens, hooks, "blocks.0.hook_resid_post", attention_mask=mask)
        seen.append(read)
        return "done"

    stream(model, batch, [], batch_size=1, desc="x", progress=False, passes=plan)
    assert seen == [True, None] * len(batch)
    assert inference == [False] * len(batch)
    assert hook_count(model) == 0


def test_a_failed_pass_closes_its_plan(get_model) -> None:
    """An error in a pass closes the plan at its ``yield`` (its contexts exit) and leaves no
    hook on the model."""
    from homoglens import to_token_batch
    from homoglens.run.engine import Pass, stream

    model = get_model("gpt2", "bridge")
    closed: list[bool] = []

    def boom(resid: torch.Tensor, hook) -> None:
        raise RuntimeError("boom")

    def plan(tokens: torch.Tensor, mask: torch.Tensor):
        try:
            yield Pass(tokens, [("blocks.0.hook_resid_post", boom)], "blocks.1.hook_resid_post")
        finally:
            closed.append(True)

    with pytest.raises(RuntimeError, match="boom"):
        stream(
            model, to_token_batch(model, SHORT_TEXTS), [], batch_size=2, desc="x",
            progress=False, passes=plan,
        )  # fmt: skip
    assert closed == [True]
    assert hook_count(model) == 0


def test_provenance_records_versions_revision_and_the_data_hash(get_model, tmp_path) -> None:
    import json
    from importlib.metadata import version

    from homoglens import HomogenizationProfile, corpus_windows, homogenization_profile
    from homoglens.run.engine import token_sha256

    model = get_model("gpt2", "bridge")
    batch = corpus_windows(model, n_seq=2, seq_len=12)
    prov = homogenization_profile(model, batch, progress=False).provenance
    assert prov.torch_version == torch.__version__
    assert prov.transformers_version == version("transformers")
    assert prov.transformer_lens_version == version("transformer-lens")
    assert prov.model_revision == ""  # a local folder: no Hub revision
    assert prov.data_sha256 == token_sha256(batch) and len(prov.data_sha256) == 64
    # save/load round-trips the new fields; a result saved before them loads with defaults
    profile = homogenization_profile(model, batch, progress=False)
    assert HomogenizationProfile.load(profile.save(tmp_path / "new")).provenance == prov
    folder = profile.save(tmp_path / "old")
    meta = json.loads((folder / "profile.json").read_text())
    for key in ("torch_version", "transformers_version", "model_revision", "data_sha256"):
        del meta["provenance"][key]
    (folder / "profile.json").write_text(json.dumps(meta))
    reseal(folder)  # as a save without those fields would have recorded it
    old = HomogenizationProfile.load(folder).provenance
    assert (old.torch_version, old.data_sha256, old.model_revision) == ("", "", "")


def test_the_data_hash_reads_real_tokens_only() -> None:
    from homoglens.run.data import TokenBatch
    from homoglens.run.engine import token_sha256

    right = TokenBatch(
        torch.tensor([[5, 6, 7], [8, 9, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]), False, "r"
    )
    left = TokenBatch(
        torch.tensor([[5, 6, 7], [3, 8, 9]]), torch.tensor([[1, 1, 1], [0, 1, 1]]), False, "l"
    )
    assert token_sha256(right) == token_sha256(left)  # padding side and pad ids do not count
    moved = TokenBatch(  # same ids, other row boundaries
        torch.tensor([[5, 6, 0], [7, 8, 9]]), torch.tensor([[1, 1, 0], [1, 1, 1]]), False, "m"
    )
    assert token_sha256(moved) != token_sha256(right)


def test_a_hub_revision_names_the_cached_commit(tmp_path, monkeypatch) -> None:
    from huggingface_hub import constants

    from homoglens.models.hub import _hub_revision

    commit = "ab" * 20
    snapshot = tmp_path / "models--gpt2" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--gpt2" / "refs").mkdir()
    (tmp_path / "models--gpt2" / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert _hub_revision("gpt2", {}, "") == f"main @ {commit}"
    assert _hub_revision("nobody/nothing", {"revision": "step1"}, "revision step1") == (
        "revision step1"
    )
