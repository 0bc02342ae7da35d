"""Every test that compiles for a TPU topology carries the `tpu` marker, so that without libtpu it is skipped
(tests/conftest.py) instead of failing (issue 23, item 13: test_seed000.py's trace --verify test had none).

A static scan of tests/test_*.py (Python's ast; nothing is imported or run). A test needs libtpu when its body, a
module-level helper it calls or a fixture it takes (followed through the module's functions):
- calls a function that only compiles for a TPU topology: verify.trace's compile_model_layer and
  compile_seed000_layer, jax's topologies.get_topology_desc(platform="tpu"); or
- names a TPU topology as devices: a string "tpu:<chip>:<shape>" or "tpu:<slice>" (mesh.make_mesh, verify.check,
  the commands' --devices), in its body or in its parametrize cases.
It is marked when the function (or its class, or its module's pytestmark) carries pytest.mark.tpu; a parametrize
case is marked when it is a pytest.param(..., marks=pytest.mark.tpu). A test that names a topology only to see it
refused before anything compiles is listed in NO_COMPILE with the reason.
"""

from __future__ import annotations

import ast
import pathlib
import re

TESTS = pathlib.Path(__file__).parent

TPU_COMPILERS = {"compile_model_layer", "compile_seed000_layer"}
TPU_DEVICES = re.compile(r"(^|\s)tpu:[A-Za-z0-9]")  # "tpu:v5p:2x2x1", "tpu:v5p-16", "... --devices tpu:..."

# tests that name a TPU topology without compiling it: file::test -> why libtpu is not needed
NO_COMPILE = {
    "test_mesh.py::test_bad_specs": "the devices string is refused (bad slice) before any topology is built",
    "test_mesh.py::test_tpu_topology_without_libtpu": "libtpu hidden by monkeypatch: the error it gives is the test",
    "test_check.py::test_negative_xla_optimal_seconds_is_not_shown_as_a_time": "renders a report dict, compiles none",
    "test_tiers.py::test_terms_are_read_off_the_workload": "reads the terms a row on a topology compares, compiles "
                                                          "none",
    "test_input_rules.py::test_refused_with_one_line": "the topology 2x2x２ is refused as it is parsed, before libtpu "
                                                       "is asked for (mesh.devices.device_count)",
}


def _is_tpu_mark(node: ast.AST) -> bool:
    """pytest.mark.tpu (or mark.tpu)."""
    return isinstance(node, ast.Attribute) and node.attr == "tpu" and (
        isinstance(node.value, ast.Attribute) and node.value.attr == "mark")


def _param_is_marked(call: ast.Call) -> bool:
    return any(k.arg == "marks" and any(_is_tpu_mark(m) for m in ast.walk(k.value)) for k in call.keywords)


def _strings(node: ast.AST, into_calls: bool = True) -> list[str]:
    """The string constants under a node (f-strings' literal parts too); without into_calls, not those of the calls
    inside it (each call is looked at on its own)."""
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
        elif isinstance(n, ast.JoinedStr):  # f"tpu:{name}": each replacement field read as "x"
            out.append("".join(v.value if isinstance(v, ast.Constant) else "x" for v in n.values))
        if into_calls or n is node or not isinstance(n, ast.Call):
            todo += list(ast.iter_child_nodes(n))
    return out


STR_METHODS = {"startswith", "endswith", "split", "replace", "find", "index", "count", "strip"}


def _names_topology(node: ast.AST) -> bool:
    """A TPU topology string passed to a call (make_mesh(spec, "tpu:v5p:2x2x1"), main(["check", "--devices",
    "tpu:..."]), check(w, "tpu:...")): not one compared against or searched for (d.startswith("tpu:v5p"), a set of
    expected grid devices)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Attribute) and n.func.attr in STR_METHODS):
            args = [*n.args, *(k.value for k in n.keywords)]
            if any(TPU_DEVICES.search(s) for a in args for s in _strings(a, into_calls=False)):
                return True
    return False


def _case_names_topology(case: ast.AST) -> bool:
    """A parametrize case (a tuple of arguments, or pytest.param(...)) holding a TPU topology string."""
    return any(TPU_DEVICES.search(s) for s in _strings(case))


def _calls(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name == "get_topology_desc" and any(
                    k.arg == "platform" and isinstance(k.value, ast.Constant) and k.value.value == "tpu"
                    for k in n.keywords):
                out.add("get_topology_desc")
            elif name:
                out.add(name)
    return out


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    """The function's statements without its docstring (prose may name a topology)."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


def _needs_libtpu(fn: ast.FunctionDef, helpers: dict[str, ast.FunctionDef], seen: set[str] | None = None) -> str:
    """Why the function's body (its helpers and fixtures followed) needs libtpu, or ''."""
    seen = set() if seen is None else seen
    body = ast.Module(body=_body(fn), type_ignores=[])
    calls = _calls(body)
    hit = calls & (TPU_COMPILERS | {"get_topology_desc"})
    if hit:
        return f"calls {sorted(hit)[0]}"
    if _names_topology(body):
        return "names a TPU topology as devices"
    for name in sorted((calls | {a.arg for a in fn.args.args}) & set(helpers)):
        if name not in seen:
            seen.add(name)
            why = _needs_libtpu(helpers[name], helpers, seen)
            if why:
                return f"{name} {why}"
    return ""


def _param_cases(fn: ast.FunctionDef) -> list[ast.AST]:
    """The parametrize cases of a test: each element of each @pytest.mark.parametrize(names, cases) list."""
    out = []
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "parametrize" \
                and len(d.args) >= 2 and isinstance(d.args[1], (ast.List, ast.Tuple)):
            out += d.args[1].elts
    return out


def unmarked_tpu_tests(source: str, filename: str, exempt=NO_COMPILE) -> dict[str, str]:
    """file::test -> why it needs libtpu, for each test of the source that needs libtpu without the tpu marker."""
    tree = ast.parse(source)
    module_marked = any(
        isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
        and any(_is_tpu_mark(m) for m in ast.walk(s.value)) for s in tree.body)
    helpers = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef) and not s.name.startswith("test_")}
    tests = [(s, False) for s in tree.body if isinstance(s, ast.FunctionDef)]
    for cls in (s for s in tree.body if isinstance(s, ast.ClassDef)):
        marked = any(_is_tpu_mark(d) for d in cls.decorator_list)
        tests += [(s, marked) for s in cls.body if isinstance(s, ast.FunctionDef)]
    out = {}
    for fn, class_marked in tests:
        if not fn.name.startswith("test_"):
            continue
        key = f"{filename}::{fn.name}"
        if module_marked or class_marked or any(_is_tpu_mark(d) for d in fn.decorator_list) or key in exempt:
            continue
        why = _needs_libtpu(fn, helpers)
        if not why:
            for case in _param_cases(fn):
                marked = isinstance(case, ast.Call) and _param_is_marked(case)
                if not marked and _case_names_topology(case):
                    why = f"a parametrize case names a TPU topology ({ast.unparse(case)[:80]})"
                    break
        if why:
            out[key] = why
    return out


def test_the_scan_finds_an_unmarked_tpu_test():
    """The scan itself, on small sources: a test calling compile_model_layer without the marker is found, with it
    (or its module's pytestmark) it is not; a helper or a fixture that compiles is followed; a topology named in a
    parametrize case needs the case's marks; a docstring naming one does not count."""
    src = '''
import pytest
from verify.trace import compile_model_layer

def _compile():
    return make_mesh("fsdp=4", "tpu:v5p:2x2x1")

def test_a():
    """on tpu:v5p-16"""
    compile_model_layer(cfg, 8)

@pytest.mark.tpu
def test_b():
    compile_model_layer(cfg, 8)

def test_c():
    _compile()

def test_d(_compile):
    pass

def test_e():
    """compiles nothing: tpu:v5p:2x2x1 in prose only"""

@pytest.mark.parametrize("devices", [pytest.param("tpu:v5p:2x2x1", marks=pytest.mark.tpu), "cpu:8"])
def test_f(devices):
    pass

@pytest.mark.parametrize("devices", ["tpu:v5p:2x2x1", "cpu:8"])
def test_g(devices):
    pass
'''
    found = unmarked_tpu_tests(src, "x.py")
    assert set(found) == {"x.py::test_a", "x.py::test_c", "x.py::test_d", "x.py::test_g"}, found
    assert unmarked_tpu_tests("import pytest\npytestmark = pytest.mark.tpu\n" + src, "x.py") == {}


def test_every_tpu_test_is_marked():
    """No test in tests/ compiles for a TPU topology without the tpu marker (the list names each and why)."""
    found = {}
    for path in sorted(TESTS.glob("test_*.py")):
        found.update(unmarked_tpu_tests(path.read_text(), path.name))
    assert found == {}, "tests that need libtpu without @pytest.mark.tpu: " + "; ".join(
        f"{k}: {v}" for k, v in found.items())


def test_no_compile_entries_are_needed():
    """Each NO_COMPILE entry names an unmarked test the scan would flag without it (a renamed, marked or changed test
    does not keep an exemption)."""
    flagged = {}
    for path in sorted(TESTS.glob("test_*.py")):
        flagged.update(unmarked_tpu_tests(path.read_text(), path.name, exempt=()))
    assert set(NO_COMPILE) <= set(flagged), set(NO_COMPILE) - set(flagged)
