"""The layer contract of the package (../DESIGN.md): imports run downward only, and no module
imports another module's private names. Read from the source with ``ast``, type-only imports
included (a loop under ``TYPE_CHECKING`` is still a loop in the design)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "homoglens"

# Lowest first. A module may import modules of lower layers, and modules of its own package
# (``homoglens.results.*`` among themselves); ``homoglens/__init__.py`` is the public face.
# DESIGN.md's order, with four of its layers split where the code needs an order inside them:
# the statistics check their arguments (validate < stats, distributed), the plotly twin of the
# figure primitives shares the matplotlib side's colour ranges (plotting < plotting_plotly), the
# attention-bias interventions share the index check of the others (interventions <
# bias_interventions), and the ablation study and patching reuse the profile's reducer (profile <
# studies, patching). The rank metrics and the blocked position dot products sit below the
# homogenization sums that use them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "types", "interrupt"),
    ("validate",),
    ("resampling",),
    (
        "stats",
        "distributed",
        "blocked_attention",
        "rank_metrics",
        "position_dots",
        "similarity_options",
        "similarity_passes",
    ),
    (
        "architectures",
        "assets",
        "data",
        "homogenization",
        "sink_math",
        "similarity_math",
        "plotting",
        "claims",
        "controls",
        "training_config",
    ),
    ("plotting_plotly", "model_state", "backend_loaders"),
    ("folder_loading", "hub_loading", "model_objects"),
    ("models", "hooks", "bias_hooks", "results", "training", "fast_attention"),
    ("provenance", "forward", "position_tables"),
    ("engine", "interventions"),
    ("bias_interventions", "losses"),
    ("bias_passes",),
    (
        "profile",
        "similarity",
        "sinks",
        "bias",
        "lengths",
        "patching_passes",
        "rollout",
        "perturbation",
    ),
    ("studies", "patching", "calibration", "comparison_options", "valleys"),
    ("comparison", "sweeps"),
    ("sink_emergence",),
    ("report", "testing"),
    ("cli",),
)
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(("homoglens", *parts))] = path
    return found


MODULES = _modules()


def _top(module: str) -> str:
    """``homoglens.sinks.scores`` -> ``sinks``; ``homoglens`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path, module: str) -> list[tuple[int, str, list[str]]]:
    """``(line, imported module, imported names)`` of every import of a homoglens module."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] == "homoglens":
                out.append((node.lineno, target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "homoglens":
                    out.append((node.lineno, alias.name, []))
    return out


def test_every_module_has_a_layer() -> None:
    missing = sorted({_top(m) for m in MODULES if _top(m) and _top(m) not in LEVEL})
    assert not missing, f"modules with no layer in tests/contracts/test_layers.py: {missing}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_downward(module: str) -> None:
    here = _top(module)
    if not here:
        return  # the public face re-exports everything
    bad = []
    for line, target, _names in _imports(MODULES[module], module):
        # ``from homoglens.results import X`` may name a submodule: judge the target package
        there = _top(target)
        if not there or there == here:
            continue  # its own package
        if LEVEL[there] >= LEVEL[here]:
            bad.append(f"line {line}: {target} ({there}, layer {LEVEL[there]})")
    assert not bad, f"{module} (layer {LEVEL[here]}) imports sideways or upward: {bad}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_across_modules(module: str) -> None:
    bad = []
    for line, target, names in _imports(MODULES[module], module):
        private_module = any(part.startswith("_") for part in target.split(".")[1:])
        private_names = [name for name in names if name.startswith("_")]
        if private_module or private_names:
            bad.append(f"line {line}: {target} {private_names}")
    assert not bad, f"{module} imports private names of other modules: {bad}"
