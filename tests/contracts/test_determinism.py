"""Determinism: the same seed gives the same results on every backend."""

from __future__ import annotations

import torch

from helpers import BACKENDS, THREE_OPENINGS
from homoglens import (
    position_ablation_hooks,
    position_ablation_study,
)


def test_same_seed_same_results_on_every_backend(get_model) -> None:
    results = []
    for backend in BACKENDS:
        model = get_model("neox", backend)
        plan_a = position_ablation_hooks(model, "permute", seed=7)
        plan_b = position_ablation_hooks(model, "permute", seed=7)
        assert [n for n, _ in plan_a] == [n for n, _ in plan_b]
        a = position_ablation_study(
            model, THREE_OPENINGS, modes=["permute"], seed=7, progress=False
        )
        b = position_ablation_study(
            model, THREE_OPENINGS, modes=["permute"], seed=7, progress=False
        )
        assert torch.equal(a.loss, b.loss) and torch.equal(a.mean_pairwise, b.mean_pairwise)
        results.append(a)
    for other in results[1:]:
        assert torch.allclose(other.loss, results[0].loss, atol=1e-4)
        assert torch.allclose(other.mean_pairwise, results[0].mean_pairwise, atol=1e-4)
