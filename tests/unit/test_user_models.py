"""Models the user loaded or booted themselves: accepted everywhere; processed weights are
recognised from the model, recorded, and warned about once."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers import AUSTEN_TEXTS, BACKENDS
from homoglens import homogenization_profile, model_info, sink_scores
from homoglens.testing import tiny_model_folder


def _booted(process: bool):
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(tiny_model_folder("llama")), device="cpu")
    if process:
        bridge.enable_compatibility_mode()
    return bridge.eval()


def test_a_booted_bridge_is_measured_and_its_processing_recorded() -> None:
    raw = _booted(process=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # raw weights: no warning
        assert model_info(raw).weights == "raw"
    prof = homogenization_profile(raw, AUSTEN_TEXTS, progress=False)
    assert prof.provenance.family == "llama" and prof.provenance.weights == "raw"
    processed = _booted(process=True)
    with pytest.warns(UserWarning, match="processed by TransformerLens"):
        assert model_info(processed).weights == "processed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        prof = homogenization_profile(processed, AUSTEN_TEXTS, progress=False)
        sink_scores(processed, AUSTEN_TEXTS, progress=False)
    assert prof.provenance.weights == "processed"


@pytest.mark.skipif("hooked" not in BACKENDS, reason="HookedTransformer needs TransformerLens < 4")
def test_a_users_hooked_transformer_is_read_from_its_weights() -> None:
    from homoglens.models.backends import load_folder_hooked as _load_folder_hooked

    folder = tiny_model_folder("gpt2")
    args = (folder, folder, "GPT2LMHeadModel", "cpu", torch.float32)
    processed = _load_folder_hooked(*args, process_weights=True)  # as from_pretrained does
    raw = _load_folder_hooked(*args, process_weights=False)
    with pytest.warns(UserWarning, match="folded LayerNorm"):
        assert model_info(processed).weights == "processed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model_info(raw).weights == "raw"
        assert model_info(processed).weights == "processed"
