"""The contract of which tests run on which TransformerLens line (tests/lines.py): every test
module has taken a side, with a reason, and every module it names exists."""

from __future__ import annotations

from pathlib import Path

from lines import BOTH_LINES, DEFAULT_LINE_ONLY, runs_on_both_lines

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))


def test_every_test_module_takes_a_side() -> None:
    unplaced = [
        m
        for m in MODULES
        if m not in BOTH_LINES and not any(m.startswith(p) for p in DEFAULT_LINE_ONLY)
    ]
    assert not unplaced, (
        f"name these in tests/lines.py (BOTH_LINES or DEFAULT_LINE_ONLY): {unplaced}"
    )


def test_every_named_module_exists_and_has_its_reason() -> None:
    for name, reason in {**BOTH_LINES, **DEFAULT_LINE_ONLY}.items():
        assert (ROOT / name).exists(), name
        assert len(reason) > 10, name
    assert not set(BOTH_LINES) & set(DEFAULT_LINE_ONLY)


def test_the_selection_rule() -> None:
    assert runs_on_both_lines("tests/unit/test_models.py", {}, None)
    assert runs_on_both_lines("tests/unit/test_profile.py", {"backend": "hooked"}, None)
    assert not runs_on_both_lines("tests/unit/test_profile.py", {"backend": "bridge"}, None)
    assert runs_on_both_lines("src/homoglens/profile.py", {}, ">>> m = load_model(folder)\n")
    assert not runs_on_both_lines("src/homoglens/stats.py", {}, ">>> holm([0.01, 0.2])\n")
    needs = ("HookedTransformer needs TransformerLens < 4",)
    assert runs_on_both_lines("tests/unit/test_profile.py", {}, None, needs)
    assert not runs_on_both_lines("tests/unit/test_profile.py", {}, None, ("no CUDA device",))
