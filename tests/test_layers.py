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
# rich inside scaling.core.table's function (the one table formatter), never at import
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


MODULES = [(pkg, p) for pkg in LAYERS for p in sorted((ROOT / pkg).rglob("*.py"))]
# scaling/'s sub-packages, bottom first: a module imports its own sub-package and those below it, never one above
SCALING_ORDER = ("core", "hardware", "step", "families", "planner", "reports", "seeds")
SCALING_MODULES = sorted(p for p in (ROOT / "scaling").rglob("*.py") if p.parent != ROOT / "scaling")


def _upward(pkg: str, path: Path) -> list[tuple[int, str]]:
    """(line, package) of every import of ``path`` (in ``pkg``) from a layer above, but the ENTRY_POINT exception."""
    return [(line, name) for line, name in _imports(path)
            if name in LAYERS and LAYERS[name] > LAYERS[pkg] and (path.name, name) != ENTRY_POINT]


@pytest.mark.parametrize("pkg, path", MODULES, ids=[f"{p.parent.name}/{p.name}" for _, p in MODULES])
def test_imports_point_down(pkg, path):
    up = _upward(pkg, path)
    assert not up, f"{pkg}/{path.name} imports a package above it: {up}"


@pytest.mark.parametrize("path", sorted((ROOT / "scaling").rglob("*.py")), ids=lambda p: p.name)
def test_scaling_imports_only_the_standard_library_and_numpy(path):
    bad = [(line, name) for line, name in _imports(path)
           if name not in sys.stdlib_module_names and name not in SCALING_THIRD_PARTY and name != "scaling"
           and (path.name, name) != ENTRY_POINT]
    assert not bad, f"scaling/{path.name} imports {bad}"


def test_importing_scaling_imports_neither_jax_nor_the_model_or_mesh():
    mods = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in sorted((ROOT / "scaling").rglob("*.py"))
            if p.stem not in ("__main__", "__init__")]
    code = (f"import sys; import {', '.join(mods)}; "
            "bad = [m for m in ('jax', 'flax', 'optax', 'rich', 'mesh', 'ffn_model', 'verify', 'jax_scaling') "
            "if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _scaling_imports(path: Path) -> list[tuple[int, str]]:
    """(line, sub-package of scaling) of every import of scaling's sub-packages in the file, function-level too:
    ``from scaling.step import kernels``, ``import scaling.step.kernels``, ``from scaling import step``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names
                    if a.name.startswith("scaling.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "scaling":
                out += ([(node.lineno, parts[1])] if len(parts) > 1 else [(node.lineno, a.name) for a in node.names])
    return out


def _scaling_upward(path: Path, sub: str | None = None) -> list[tuple[int, str]]:
    """(line, sub-package) of every import of ``path`` (in scaling's ``sub``, by default the one it lies in) from a
    sub-package above ``sub``."""
    rank = SCALING_ORDER.index(sub or path.relative_to(ROOT / "scaling").parts[0])
    return [(line, sub) for line, sub in _scaling_imports(path)
            if sub in SCALING_ORDER and SCALING_ORDER.index(sub) > rank]


def test_every_scaling_module_is_in_an_ordered_sub_package():
    subs = {p.relative_to(ROOT / "scaling").parts[0] for p in SCALING_MODULES}
    assert subs == set(SCALING_ORDER), subs ^ set(SCALING_ORDER)
    assert {p.name for p in (ROOT / "scaling").glob("*.py")} == {"__init__.py", "__main__.py"}


@pytest.mark.parametrize("path", SCALING_MODULES, ids=lambda p: "/".join(p.parts[-2:]))
def test_scaling_sub_packages_import_down(path):
    up = _scaling_upward(path)
    assert not up, f"{path.relative_to(ROOT)} imports a sub-package of scaling above it: {up}"


def test_an_upward_import_inside_scaling_is_caught(tmp_path):
    """The order can fail: a made-up module of core importing the step model inside a function, and one of the step
    importing the planner at module level, are both reported; the step importing core is not."""
    core, step = tmp_path / "core.py", tmp_path / "step.py"
    core.write_text("def f(w):\n    from scaling.step.program import predict\n    return predict(w)\n")
    step.write_text("from scaling import planner\nimport scaling.core.inputs\n")
    assert _scaling_upward(core, "core") == [(2, "step")]
    assert _scaling_upward(step, "step") == [(1, "planner")]


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
