"""The structure's rules (../shared/DESIGN.md), read from the source: no import cycle between two modules, no
argparse below the command layer, no ``isinstance`` on a model config outside the family modules.

Every import statement is read (module level and inside functions alike: an import hidden in a function to get
around a cycle is still an edge of the graph). Each rule has a test that it can fail, on a made-up package.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from ffn_model.families import PROGRAMS
from scaling.families.presets import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scaling", "mesh", "ffn_model", "verify", "jax_scaling")
# the modules that own what differs between model families, derived: the closed forms' (where each family's config
# class is defined) and the programs' (ffn_model.families.PROGRAMS)
FAMILY_MODULES = {str(Path(m.__file__).resolve().relative_to(ROOT))
                  for m in [sys.modules[f.__module__] for f in FAMILIES] + list(PROGRAMS.values())}
CONFIG_NAMES = {f.__name__ for f in FAMILIES} | {"Model", "FAMILIES"}


def _modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """{dotted name: path} of every module of ``packages`` under ``root``; a package's __init__ is the package."""
    out = {}
    for pkg in packages:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = p.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if p.stem == "__init__" else parts)] = p
    return out


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """{module: the modules it imports}, ``from pkg import name`` counted as importing ``pkg.name`` where that is a
    module, else ``pkg``; relative imports resolved against the module's package."""
    mods = _modules(root, packages)
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.stem == "__init__" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[m] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = (pkg + (f".{node.module}" if node.module else "")) if node.level else node.module or ""
                for a in node.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    if target in mods and target != m:
                        graph[m].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan 1972): each holds a cycle."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                on.discard(w)
                comp.append(w)
            on.discard(v)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_modules():
    found = cycles(import_graph(ROOT))
    assert not found, f"import cycles: {found}"


def test_a_cycle_through_a_function_level_import_is_caught(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import g\n")
    (tmp_path / "pkg" / "b.py").write_text("def g():\n    from pkg import a\n    return a\n")
    (tmp_path / "pkg" / "c.py").write_text("from . import a\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b"]]


def argparse_users(root: Path, packages=PACKAGES[:-1]) -> list[str]:
    """The modules of ``packages`` (all but the command layer) that import argparse."""
    return [m for m, p in _modules(root, packages).items()
            for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
            and "argparse" in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module])]


def test_no_argparse_below_the_command_layer():
    assert argparse_users(ROOT) == []


def test_argparse_below_the_command_layer_is_caught(tmp_path):
    (tmp_path / "scaling").mkdir()
    (tmp_path / "scaling" / "x.py").write_text("def f():\n    import argparse\n    return argparse\n")
    assert argparse_users(tmp_path, ("scaling",)) == ["scaling.x"]


def config_type_tests(path: Path) -> list[int]:
    """Lines of ``isinstance(x, C)``, ``issubclass(x, C)`` and ``type(x) is C`` (``is not``, ``==``) on a model
    config class C (a name or attribute in CONFIG_NAMES, alone or in a tuple)."""
    def names(node):
        nodes = node.elts if isinstance(node, ast.Tuple) else [node]
        return {n.id if isinstance(n, ast.Name) else n.attr for n in nodes if isinstance(n, (ast.Name, ast.Attribute))}

    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance",
                                                                                              "issubclass")
                and len(node.args) == 2 and names(node.args[1]) & CONFIG_NAMES):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
              and isinstance(node.left.func, ast.Name) and node.left.func.id == "type"
              and any(names(c) & CONFIG_NAMES for c in node.comparators)):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", [p for p in _modules(ROOT).values()
                                  if f"{p.parent.name}/{p.name}" not in FAMILY_MODULES],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_isinstance_on_a_model_config_outside_the_family_modules(path):
    lines = config_type_tests(path)
    assert not lines, f"{path.parent.name}/{path.name} tests a model config's type at lines {lines}: ask the family"


def test_a_type_test_on_a_model_config_is_caught(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("def f(cfg, w):\n    a = isinstance(cfg, (int, TransformerConfig))\n"
                 "    b = isinstance(w.model, config.FFNConfig)\n    c = type(cfg) is FFNConfig\n"
                 "    return isinstance(cfg, dict), a, b, c\n")
    assert config_type_tests(p) == [2, 3, 4]


def test_a_new_family_brings_its_own_fields(monkeypatch):
    """model_of asks the families which fields exist and whose they are: a made-up third family's dimension is
    refused for an FFN preset in the family's own words, and set on its own preset, with no edit elsewhere."""
    from scaling.families import presets
    from scaling.families.ffn import FFNConfig

    @dataclasses.dataclass(frozen=True)
    class ToyConfig(FFNConfig):
        family: ClassVar[str] = "toy"
        noun: ClassVar[str] = "toy stack"
        dimensions: ClassVar[dict[str, str]] = {**FFNConfig.dimensions, "toys": "E"}
        toys: int = 1

    monkeypatch.setattr(presets, "FAMILIES", (*presets.FAMILIES, ToyConfig))
    monkeypatch.setitem(presets.PRESETS, "toy-1", ToyConfig(8, 32, 2))
    with pytest.raises(ValueError, match=r"^--toys is a toy stack dimension; 'tiny' is an FFN stack "
                                         r"\(toy presets: toy-1\)$"):
        presets.model_of("tiny", toys=4)
    assert presets.model_of("toy-1", toys=4, d_ff=64) == ToyConfig(8, 64, 2, toys=4)
    assert presets.model_fields()["toys"] == ("dimensions", ToyConfig)
