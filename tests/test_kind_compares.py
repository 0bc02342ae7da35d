"""Kinds are values, not strings (issue 50): no module of the package (scaling/ and every layer above it) compares
anything with a string constant that is a kind's name (the value of a member of a StrEnum of scaling/: collected from
the enums themselves, so a new member or a new enum is covered) outside the parsers, where a string first becomes a
kind. ``remat == Remat.FULL``, not ``remat == "full"``; a member is its string, so the values stored and printed stay
strings and compare alike.

Every Compare (==, !=, in, not in, is, is not) of every module is read, module level and inside functions alike,
with each operand a string constant or a tuple, list or set holding one; a ``case "full":`` too. The test that it
can fail runs the same reader on a made-up module.
"""

from __future__ import annotations

import ast
import enum
import importlib
import pkgutil
from pathlib import Path

import pytest

import scaling
from scaling.core.flags import Gathers
from scaling.core.kinds import Collective, Dtype, Form, KernelKind, KernelModel, Platform
from scaling.core.policies import Remat, Step

ROOT = Path(__file__).resolve().parent.parent
# Where a string is first turned into a kind ("path", or "path::function" with its nested functions): why its
# compares may name a kind's string
PARSERS = {
    "scaling/core/policies.py": "the policies' names: choose and check_remat turn a string into a member",
    "scaling/core/kinds.py": "the kinds themselves",
    "scaling/core/inputs.py": "a command's values read and checked, before they are kinds",
    "scaling/core/flags.py::_load": "reads scaling/data/xla_flags.toml: its rs_last_hop = \"exposed\" is the file's",
    "scaling/hardware/kernel_tables.py::parse_kernel_table": "reads a kernel table's TOML, its sections by name",
    "scaling/hardware/kernel_tables.py::_section": "checks a kernel table's section by its name (attention's rows)",
}
# A string that names something other than the kind of the same name: ("path::function", string) -> what it names
NOT_KINDS = {
    ("scaling/step/memory.py::zero1_update", "optimizer"): "a memory term's name (the Adam moments), not a kernel kind",
    ("scaling/step/kernels.py::pointwise_launches", "pointwise"): "a kernel's name (the transformer's pointwise "
                                                                  "passes: scaling.families.transformer)",
    ("scaling/families/ffn.py::overlapped_volumes", "fsdp"): "a mesh axis (a key of the per-axis volumes)",
    ("scaling/families/moe.py::MoEConfig", "fsdp"): "a mesh axis (the planner's axes), not the optimizer's sharding",
    ("scaling/families/transformer.py::_recomputed", "attention"): "a saved tensor's name (POLICY_KEEPS)",
    ("scaling/families/transformer.py::_saved_terms", "attention"): "a saved tensor's name (POLICY_KEEPS)",
    ("scaling/core/schedule.py::runs_attention", "attention"): "a Schedule field's name (a family's schedule_flags)",
    ("jax_scaling/args.py::schedule_of", "attention"): "a schedule flag's name (SCHEDULE_FLAGS)",
    ("jax_scaling/calibrate.py::_jobs", "pointwise"): "a kernel table's section (SECTIONS, --sections)",
    ("jax_scaling/calibrate.py::_jobs", "attention"): "a kernel table's section (SECTIONS, --sections)",
    ("jax_scaling/calibrate.py::_run", "pointwise"): "a kernel table's section (SECTIONS)",
    ("jax_scaling/calibrate.py::_run", "attention"): "a kernel table's section (SECTIONS)",
    ("jax_scaling/model_commands.py::add_commands", "train"): "the train subcommand's name (COMMANDS), not a Step",
    ("jax_scaling/model_commands.py::check_flags", "train"): "the subcommand's name (args.command), not a Step",
    ("jax_scaling/model_commands.py::run_command", "train"): "the subcommand's name, not a Step",
    ("jax_scaling/profile_step.py::main", "step"): "part of an HLO module's name in a trace (jit_step)",
    ("verify/check.py::_collective_rows", "fsdp"): "a mesh axis (a key of the per-axis collective bytes)",
    ("verify/hlo.py::HloProgram._gathered", "all-gather"): "an HLO opcode read from XLA's text",
}
COMPARE_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def kind_names(package=scaling) -> dict[str, list[str]]:
    """{a member's value: ["Enum.MEMBER", ...]} of every StrEnum defined in a module of ``package`` (its
    ``__main__`` aside: an entry point, it runs the command line)."""
    names: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(info.name)
        for kind in vars(module).values():
            if isinstance(kind, type) and issubclass(kind, enum.StrEnum) and kind.__module__ == module.__name__:
                for member in kind:
                    names.setdefault(member.value, []).append(f"{kind.__name__}.{member.name}")
    return names


def _strings(node: ast.AST) -> list[str]:
    """The string constants an operand is or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


class _Reader(ast.NodeVisitor):
    """Every compare of a module with a string constant, as (line, enclosing function's dotted name, string, code)."""

    def __init__(self):
        self.where: list[str] = []
        self.found: list[tuple[int, str, str, str]] = []

    def _scope(self, node):
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Compare(self, node: ast.Compare):
        if any(isinstance(op, COMPARE_OPS) for op in node.ops):
            for operand in (node.left, *node.comparators):
                self.found += [(node.lineno, ".".join(self.where), s, ast.unparse(node)) for s in _strings(operand)]
        self.generic_visit(node)

    def visit_MatchValue(self, node: ast.MatchValue):
        where = ".".join(self.where)
        self.found += [(node.lineno, where, s, f"case {ast.unparse(node)}") for s in _strings(node.value)]
        self.generic_visit(node)


def _exempt(table, rel: str, function: str, *key) -> bool:
    """Whether ``table`` (PARSERS or NOT_KINDS) lets the module ``rel``'s ``function`` compare (with ``key``)."""
    names = [".".join(function.split(".")[:i]) for i in range(1, function.count(".") + 2)] if function else []
    return any((k if not key else (k, *key)) in table for k in [rel, *(f"{rel}::{n}" for n in names)])


def string_compares(path: Path, rel: str, kinds: dict[str, list[str]]) -> list[str]:
    """"line: code" of every compare of the module at ``path`` (named ``rel``) with a kind's string, but in PARSERS
    and NOT_KINDS; each says which member to compare with."""
    reader = _Reader()
    reader.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return [f"{rel}:{line}: {code}  ({s!r}: compare with {' or '.join(kinds[s])})"
            for line, function, s, code in reader.found
            if s in kinds and not _exempt(PARSERS, rel, function) and not _exempt(NOT_KINDS, rel, function, s)]


KINDS = kind_names()
# every package's modules: the kinds are scaling's, and every layer above compares them
PACKAGES = ("scaling", "mesh", "ffn_model", "verify", "jax_scaling")
MODULES = sorted(p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("rel", MODULES)
def test_no_string_compare_on_a_kind(rel):
    found = string_compares(ROOT / rel, rel, KINDS)
    assert not found, "kinds compared as strings (compare with the enum's member):\n" + "\n".join(found)


def test_the_kinds_are_the_enums_members():
    """Every member of the enums, the policies', the flags' and the kinds', is a kind's name (read off the enums)."""
    for kind in (Remat, Step, Gathers, Platform, Form, KernelModel, KernelKind, Dtype, Collective):
        assert {m.value for m in kind} <= set(KINDS), kind
    assert "Remat.FULL" in KINDS["full"] and "Platform.TPU" in KINDS["tpu"]


def test_exemptions_name_existing_functions():
    """PARSERS and NOT_KINDS name modules and functions that exist (a renamed one leaves no stale exemption)."""
    for key in [*PARSERS, *(k for k, _ in NOT_KINDS)]:
        rel, _, function = key.partition("::")
        assert (ROOT / rel).is_file(), key
        if function:
            defs = {n.name for n in ast.walk(ast.parse((ROOT / rel).read_text(encoding="utf-8")))
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            assert function.split(".")[0] in defs, key


def test_a_string_compare_on_a_kind_is_caught(tmp_path):
    """A made-up module: a remat policy, a platform tuple and a match case compared as strings are reported, in a
    function and at module level; a compare with a string that is no kind's, or with the member, is not."""
    bad = tmp_path / "bad.py"
    bad.write_text("from scaling.core.policies import Remat\n"
                   "def f(remat, platform, x):\n"
                   "    if remat == \"full\":\n"
                   "        return 1\n"
                   "    if remat == Remat.NONE or x == \"hello\":\n"
                   "        return 2\n"
                   "    match x:\n"
                   "        case \"splash\":\n"
                   "            return 3\n"
                   "    return 4\n"
                   "ON = platform in (\"tpu\", \"gpu\") if (platform := 'x') else 0\n")
    found = string_compares(bad, "scaling/bad.py", KINDS)
    assert [f.split(":")[1] for f in found] == ["3", "8", "11", "11"], found
    assert "compare with Remat.FULL" in found[0] and "Attention.SPLASH" in found[1]
