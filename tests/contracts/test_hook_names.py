"""One place builds hook names (issue 40): every TransformerLens hook name homoglens attaches
to or reads comes from ``homoglens.models.architectures`` (the family table's position hooks,
``resid_hook_name``, ``component_hook_name`` over ``BLOCK_POINTS``, ``pattern_hook_name``,
``z_hook_name``). Read from the source with ``ast``: no other module holds a string that is a
hook name or a block-relative hook point (docstrings and messages may mention them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "homoglens"
HOOK_NAME = re.compile(
    r"^(blocks\.(\d+|\{\w*\})\.)?((attn|mlp|ln\d|ln_final|embed|unembed|pos_embed)\.)?hook_[a-z_]+$"
)
NOT_HOOKS = {"hook_points", "hook_dict"}  # a provenance field and the model's attribute


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are not docstrings, with their lines (f-string parts included)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_no_hook_name_outside_the_architecture_table() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "architectures.py":
            continue
        for line, text in _strings(ast.parse(path.read_text())):
            if HOOK_NAME.match(text) and text not in NOT_HOOKS:
                found.append(f"{path.relative_to(SRC)}:{line}: {text!r}")
    assert not found, "hook names built outside homoglens.models.architectures:\n" + "\n".join(
        found
    )


def test_the_pattern_sees_what_it_must() -> None:
    for name in ("hook_pos_embed", "blocks.3.hook_resid_pre", "attn.hook_pattern", "hook_z",
                 "blocks.{i}.attn.hook_cos", "blocks.{l}.ln2.hook_in", "unembed.hook_in",
                 "ln_final.hook_normalized", "embed.hook_out"):  # fmt: skip
        assert HOOK_NAME.match(name), name
    for text in ("hook_points", "see hook_pattern", "blocks.{l}.hook_resid_pre)"):
        assert text in NOT_HOOKS or not HOOK_NAME.match(text), text
