"""Which tests run on which TransformerLens line, and why (the contract of issue 50).

The default line (TransformerLens 4.3, ``TransformerBridge`` only) runs every test and doctest.
The other line (TransformerLens 3.9, ``HookedTransformer`` and its own bridge) runs what differs
between the two lines, selected by ``pytest --what-differs`` (``scripts/test.sh`` passes it
there; ``tests/conftest.py`` deselects the rest, and pytest reports them as deselected):

1. every test of the modules in :data:`BOTH_LINES` (below, each with its reason);
2. every test parameterized with the ``"hooked"`` backend, wherever it lives: the
   ``HookedTransformer`` backend exists only on 3.9, so these tests are its only coverage;
3. every doctest whose example loads or builds a model (:data:`MODEL_DOCTEST`): they run the
   backend the line loads by default (``HookedTransformer`` on 3.9);
4. every test skipped where ``HookedTransformer`` is missing (its ``skipif`` reason matches
   :data:`NEEDS_HOOKED`): the default line skips it, so this line is its only run.

Everything else runs the same homoglens code on the same backend object on both lines (the
bridge, the pure maths, results, saves, the CLI, the report, the docs), so its check lives on
the default line. ``tests/contracts/test_lines.py`` refuses a test module named in neither
:data:`BOTH_LINES` nor :data:`DEFAULT_LINE_ONLY`, so a new module takes a side on purpose.
"""

from __future__ import annotations

import re

BOTH_LINES: dict[str, str] = {
    "tests/oracles/test_families.py": "every family against plain Hugging Face: the numbers of "
    "each backend and each line's weight conversion",
    "tests/oracles/test_hugging_face.py": "oracle against plain Hugging Face forward passes",
    "tests/oracles/test_gptj_positions.py": "GPT-J's rotary positions on each line's bridge",
    "tests/oracles/test_fast_attention.py": "the SDPA fast path replaces modules inside each "
    "line's bridge, whose components differ",
    "tests/oracles/test_from_cache.py": "TransformerLens' ActivationCache of each line",
    "tests/unit/test_hooks.py": "hook points and their names on each line",
    "tests/contracts/test_hook_hygiene.py": "no hook stays attached, on each line's hook points",
    "tests/contracts/test_transformerlens_traps.py": "the traps of each TransformerLens line",
    "tests/unit/test_interventions.py": "positional ablations hook each line's embeddings and "
    "rotary components",
    "tests/unit/test_architectures.py": "the family table reads each line's configs",
    "tests/unit/test_models.py": "loading: backends, folders, dtypes, the Hub path of each line",
    "tests/unit/test_user_models.py": "loading a user's folder on each line",
    "tests/unit/test_hub_versions.py": "the Hub revision path of each line",
    "tests/unit/test_model_objects.py": "transformers / nnsight objects wrapped through each "
    "line's bridge",
    "tests/real_models/test_shipped_models.py": "the shipped controlled models loaded on each line",
}
"""Test modules that run on both lines, with the reason: what differs between the lines."""

DEFAULT_LINE_ONLY: dict[str, str] = {
    "tests/cli/": "the CLI and the report: the same code over the default backend",
    "tests/contracts/test_bad_inputs.py": "argument checks run before any model code (its "
    "hooked-backend cases run on both lines)",
    "tests/contracts/test_determinism.py": "seeded maths, the same on both lines",
    "tests/contracts/test_devices.py": "device-less tensor factories in homoglens' own code",
    "tests/contracts/test_entrance.py": "a static read of the source and the entrance on one model",
    "tests/contracts/test_hook_names.py": "a static read of the source",
    "tests/contracts/test_layer_axis.py": "the layer axis of results (hooked cases on both)",
    "tests/contracts/test_layers.py": "a static read of the imports",
    "tests/contracts/test_lines.py": "this contract, a static read of tests/",
    "tests/contracts/test_memory.py": "streaming memory of the engine, line-independent",
    "tests/contracts/test_merge_overlap.py": "the merge of results, no model",
    "tests/contracts/test_no_silent_numbers.py": "homoglens' own refusals and annotations",
    "tests/contracts/test_non_finite.py": "the finiteness guard (hooked cases on both)",
    "tests/contracts/test_patching_invariants.py": "patching invariants (hooked cases on both)",
    "tests/contracts/test_properties.py": "property tests of the maths (hooked cases on both)",
    "tests/contracts/test_result_integrity.py": "result files and their checks, no model",
    "tests/contracts/test_result_tampering.py": "result files and their checks, no model",
    "tests/contracts/test_saved_results.py": "save / load, no model difference",
    "tests/contracts/test_threads_and_state.py": "the model lock (hooked cases on both)",
    "tests/cuda/": "needs a CUDA GPU; skipped on CI's machine on either line",
    "tests/docs/": "the docs, the tutorials and the README quickstart run on the default line",
    "tests/oracles/test_attention_bias.py": "the attention-bias maths (hooked cases on both)",
    "tests/oracles/test_bias_toy.py": "a toy model of the bias study (hooked cases on both)",
    "tests/oracles/test_half_precision.py": "half precision runs homoglens' own dtype handling "
    "and the bridge's SDPA; each line's weight conversion is test_families' oracle",
    "tests/oracles/test_half_precision_patching.py": "patching in half precision on the bridge",
    "tests/oracles/test_massive_layers.py": "Sun et al.'s figure on the bridge",
    "tests/oracles/test_perturbation.py": "Barbero et al.'s spread on the bridge",
    "tests/oracles/test_rollout.py": "Wu et al.'s rollout (hooked cases on both)",
    "tests/oracles/test_sink_emergence.py": "Gu et al.'s sink rate on shipped checkpoints",
    "tests/oracles/test_valleys.py": "Queipo-de-Llano et al.'s valleys (hooked cases on both)",
    "tests/real_models/test_massive_smollm2.py": "SmolLM2's massive activations on the bridge",
    "tests/real_models/test_smollm2.py": "SmolLM2 readings (hooked cases on both)",
    "tests/unit/": "measurements, statistics and results over the bridge (every hooked case "
    "on both lines); the loading and hook modules are in BOTH_LINES",
}
"""Prefixes of test modules that run on the default line only, with the reason. A module in
:data:`BOTH_LINES` wins over a folder prefix here."""

MODEL_DOCTEST = re.compile(r"load_model\(|tiny_model_folder\(|shipped_model_folder\(")
"""A doctest whose source matches loads or builds a model: it runs on both lines."""


NEEDS_HOOKED = re.compile(r"HookedTransformer|TransformerLens < 4|TL < 4|TL 3\.9|TransformerLens 3")
"""A ``skipif`` reason that says the test needs ``HookedTransformer``: it runs on both lines
(the default line skips it)."""


def runs_on_both_lines(
    path: str,
    params: dict[str, object],
    doctest_source: str | None,
    skip_reasons: tuple[str, ...] = (),
) -> bool:
    """Whether a test (its path relative to the repository root, its parameters, for a doctest
    its examples' source, and the reasons of its ``skipif`` marks) runs on the other
    TransformerLens line too."""
    if path in BOTH_LINES or any(NEEDS_HOOKED.search(r) for r in skip_reasons):
        return True
    if any(isinstance(value, str) and value == "hooked" for value in params.values()):
        return True
    return doctest_source is not None and MODEL_DOCTEST.search(doctest_source) is not None
