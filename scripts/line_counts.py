"""Lines of src/homoglens by kind, for a refactor's before and after (issue 52).

    python scripts/line_counts.py [SRC]        # default: src/homoglens

Every non-blank line of every module counts once, as the first kind that holds it:
- docstring: inside a module, class or function docstring;
- check: inside a ``raise`` or ``assert`` statement, the test of an ``if`` whose body raises,
  or a function whose name starts with ``check`` / ``_check`` (argument and value checks);
- comment: a line that is only a comment;
- code: everything else (imports included).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _kinds(text: str) -> dict[int, str]:
    tree = ast.parse(text)
    kind: dict[int, str] = {}

    def mark(node: ast.AST, what: str) -> None:
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):  # type: ignore[attr-defined]
            kind.setdefault(line, what)

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                mark(first, "docstring")
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.lstrip(
            "_"
        ).startswith("check"):
            mark(node, "check")
        elif isinstance(node, (ast.Raise, ast.Assert)):
            mark(node, "check")
        elif isinstance(node, ast.If) and any(isinstance(n, ast.Raise) for n in node.body):
            mark(node.test, "check")
    return kind


def count(src: Path) -> dict[str, int]:
    """``{kind: lines}`` over every ``.py`` file under ``src``, and ``files``."""
    totals = {"code": 0, "check": 0, "docstring": 0, "comment": 0, "files": 0}
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        kinds = _kinds(text)
        totals["files"] += 1
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if number in kinds:
                totals[kinds[number]] += 1
            elif line.strip().startswith("#"):
                totals["comment"] += 1
            else:
                totals["code"] += 1
    return totals


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src/homoglens")
    figures = count(root)
    lines = sum(v for k, v in figures.items() if k != "files")
    print(f"{root}: {figures['files']} modules, {lines} non-blank lines")
    for key in ("code", "check", "docstring", "comment"):
        print(f"  {key:<10} {figures[key]:>6}")
