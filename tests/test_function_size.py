"""Functions over MAX_LINES lines or MAX_PARAMS parameters say why, in one line beside them: a comment on the line
above the ``def`` (above its decorators). Every package module is read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scaling", "mesh", "ffn_model", "verify", "jax_scaling")
MAX_LINES, MAX_PARAMS = 80, 8


def oversized(path: Path) -> list[tuple[int, str, int, int]]:
    """(line, name, lines, parameters) of each function of ``path`` over either bound with no comment (its reason) on
    the line above it (self and cls not counted; *args and **kwargs count one each)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
        n = len(params) + bool(a.vararg) + bool(a.kwarg) - bool(params and params[0].arg in ("self", "cls"))
        length = node.end_lineno - node.lineno + 1
        top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        said = top >= 2 and lines[top - 2].strip().startswith("#") and len(lines[top - 2].strip()) > 12
        if (length > MAX_LINES or n > MAX_PARAMS) and not said:
            out.append((node.lineno, node.name, length, n))
    return out


MODULES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: "/".join(p.relative_to(ROOT).parts))
def test_long_functions_say_why(path):
    found = oversized(path)
    assert not found, f"{path.relative_to(ROOT)}: (line, name, lines, parameters) over {MAX_LINES} lines or " \
                      f"{MAX_PARAMS} parameters without a comment line above that says why: {found}"


def test_a_long_function_without_a_reason_is_caught(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    p = tmp_path / "m.py"
    p.write_text(f"def long():\n{body}\n\n\n# size: the nine inputs of one formula\n"
                 "def wide(a, b, c, d, e, f, g, h, i):\n    return a\n\n\n"
                 "class C:\n    def method(self, a, b, c, d, e, f, g, h):\n        return a\n")
    assert oversized(p) == [(1, "long", 86, 0)]
