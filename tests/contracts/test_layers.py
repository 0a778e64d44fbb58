"""The layer contract of the package (../DESIGN.md): imports run downward only, and no module
imports another module's private names. Read from the source with ``ast``, type-only imports
included (a loop under ``TYPE_CHECKING`` is still a loop in the design)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "homoglens"

# Lowest first: the floors of DESIGN.md, one package each, and the measurement packages on one
# floor above them. A module may import modules of lower floors and of its own package; a
# measurement package may build on another (the ablation study and patching reuse the profile's
# reducer, the comparison composes several, the compression valleys the sinks), as long as the
# graph of measurement packages has no cycle (``test_measurements_form_no_cycle``).
# ``homoglens/__init__.py`` is the public face.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("models",),
    ("results",),
    ("run",),
    MEASUREMENTS := (
        "profile",
        "similarity",
        "sinks",
        "ablation",
        "patching",
        "bias",
        "lengths",
        "comparison",
        "training",
        "reproductions",
    ),
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
        if there in MEASUREMENTS and here in MEASUREMENTS:
            continue  # one floor: the package graph is checked for cycles below
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


def _module_of(target: str, names: list[str]) -> list[str]:
    """The modules an import statement loads: ``from homoglens.sinks import result`` loads
    ``homoglens.sinks.result`` (a submodule), ``from homoglens.sinks import sink_scores`` the
    package's ``__init__``."""
    found = [f"{target}.{name}" for name in names if f"{target}.{name}" in MODULES]
    return found or ([target] if target in MODULES else [])


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def test_no_module_imports_itself_back() -> None:
    """No import cycle between modules, type-only imports included: a cycle under
    ``TYPE_CHECKING`` is still two modules that cannot be read one before the other. A
    package's ``__init__`` that re-exports its modules is left out (importing a package's
    public face from inside it is refused by ``test_imports_run_downward``'s own-package rule
    only where it loops)."""
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        for _line, target, names in _imports(path, module):
            for loaded in _module_of(target, names):
                if loaded != module and MODULES[loaded].name != "__init__.py":
                    edges.setdefault(module, set()).add(loaded)
    assert not _cycles(edges), f"import cycles between modules: {_cycles(edges)}"


def test_measurements_form_no_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        here = _top(module)
        if here not in MEASUREMENTS:
            continue
        for _line, target, _names in _imports(path, module):
            there = _top(target)
            if there in MEASUREMENTS and there != here:
                edges.setdefault(here, set()).add(there)
    assert not _cycles(edges), f"measurement packages import each other in a loop: {_cycles(edges)}"
