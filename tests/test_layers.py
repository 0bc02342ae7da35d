"""The layers of the code (../shared/DESIGN.md): imports point down only.

  jax_scaling (top) the command layer: the jax-scaling console script, every command a subcommand
  verify            the comparison: reads compiled programs, check, plan verification
  ffn_model         the model, train step, abstract compile, checkpoints, bench timing
  mesh              devices, meshes, ICI layout, the sharding table in jax's form
  scaling  (bottom) closed forms: pure Python + numpy, never jax

Every import statement of every module is read (module level and inside functions alike, so an
import hidden in a function to get around a cycle fails here too). One exception: a lower package's
``__main__.py`` (``python -m scaling``, ``ffn_model``, ``verify``) may import the command layer and nothing
else above it. A ``python -m`` entry point is not part of its package's layer: nothing imports it, and it
runs the command layer's program (jax_scaling.cli.main) with that package's commands.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"scaling": 0, "mesh": 1, "ffn_model": 2, "verify": 3, "jax_scaling": 4}
ENTRY_POINT = ("__main__.py", "jax_scaling")  # the exception: a python -m entry point runs the command layer
# third-party packages the bottom layer may import (everything else there is the standard library): numpy, and
# rich inside scaling.table's function (the one table formatter), never at import
SCALING_THIRD_PARTY = {"numpy", "rich"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


MODULES = [(pkg, p) for pkg in LAYERS for p in sorted((ROOT / pkg).glob("*.py"))]


def _upward(pkg: str, path: Path) -> list[tuple[int, str]]:
    """(line, package) of every import of ``path`` (in ``pkg``) from a layer above, but the ENTRY_POINT exception."""
    return [(line, name) for line, name in _imports(path)
            if name in LAYERS and LAYERS[name] > LAYERS[pkg] and (path.name, name) != ENTRY_POINT]


@pytest.mark.parametrize("pkg, path", MODULES, ids=[f"{p.parent.name}/{p.name}" for _, p in MODULES])
def test_imports_point_down(pkg, path):
    up = _upward(pkg, path)
    assert not up, f"{pkg}/{path.name} imports a package above it: {up}"


@pytest.mark.parametrize("path", sorted((ROOT / "scaling").glob("*.py")), ids=lambda p: p.name)
def test_scaling_imports_only_the_standard_library_and_numpy(path):
    bad = [(line, name) for line, name in _imports(path)
           if name not in sys.stdlib_module_names and name not in SCALING_THIRD_PARTY and name != "scaling"
           and (path.name, name) != ENTRY_POINT]
    assert not bad, f"scaling/{path.name} imports {bad}"


def test_importing_scaling_imports_neither_jax_nor_the_model_or_mesh():
    mods = [f"scaling.{p.stem}" for p in sorted((ROOT / "scaling").glob("*.py")) if p.stem != "__main__"]
    code = (f"import sys; import {', '.join(mods)}; "
            "bad = [m for m in ('jax', 'flax', 'optax', 'rich', 'mesh', 'ffn_model', 'verify', 'jax_scaling') "
            "if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_a_package_that_imports_upward_is_caught(tmp_path):
    """The rule itself can fail: a module of the bottom layer importing the model is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ffn_model.train import train\n    return train\n")
    assert [(line, name) for line, name in _imports(bad)
            if LAYERS.get(name, -1) > LAYERS["scaling"]] == [(2, "ffn_model")]


def test_only_an_entry_point_may_import_the_command_layer(tmp_path):
    """The exception is exactly ENTRY_POINT: a lower package's module other than __main__.py importing the
    command layer, and a __main__.py importing verify, are both reported."""
    (tmp_path / "cli.py").write_text("from jax_scaling.cli import main\n")
    (tmp_path / "__main__.py").write_text("from jax_scaling.cli import main\nfrom verify.cli import compile_report\n")
    assert _upward("scaling", tmp_path / "cli.py") == [(1, "jax_scaling")]
    assert _upward("scaling", tmp_path / "__main__.py") == [(2, "verify")]
