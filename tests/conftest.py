"""Tests run on 8 emulated CPU devices; TPU-topology tests compile ahead of time with libtpu.

Two tiers, chosen by markers that say what a test does (pyproject.toml lists them): `make test` runs every test
that compiles nothing, and of those that compile (tpu, compiles, numerics, grid, processes) the ones marked quick,
the smallest compiled comparison of each closed-form term (tests/test_tiers.py holds that every term has one);
`make test-all` runs everything."""

import ast
import os
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# AOT compiles for TPU topologies load libtpu in this process and in notebook kernels it starts
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# verify.check keeps its reports here (verify.cache) for this session, one folder for all of pytest-xdist's workers
# (their run's PYTEST_XDIST_TESTRUNUID), or the one the caller gives: make test-all gives one to its pass over the suite
# and to its pass over the notebooks after it, which read the grids' reports instead of compiling them a second time
if "VERIFY_CHECK_CACHE" not in os.environ:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    folder = (os.path.join(tempfile.gettempdir(), f"verify-check-{run}") if run
              else tempfile.mkdtemp(prefix="verify-check-"))
    os.makedirs(folder, exist_ok=True)
    os.environ["VERIFY_CHECK_CACHE"] = folder
# the numerics tests' one-device references (tests/helpers.py one_device), made once a run for every worker
os.environ.setdefault("TESTS_REFERENCE_CACHE", os.path.join(os.environ["VERIFY_CHECK_CACHE"], "one-device"))
# XLA:CPU's LLVM code generation at -O0 (the programs the tests run on emulated CPU devices are small: their compile,
# not their run, is what takes the time): a quarter off each CPU compile (a 1F1B numerics test: 32.5 s -> 24.6 s);
# it acts after XLA's HLO passes, so the programs tests/test_check.py reads (FLOPs, collectives, buffers) are the
# same, and libtpu's compiles are untouched (figures compared with and without: docs/findings.md, "Test suite")
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


ALL_ITEMS = pytest.StashKey[list]()

# The guard of make test's time: a test marked none of the markers that say it compiles, whose XLA compiles took more
# than UNMARKED_COMPILE_SECONDS (jax's own compile-time events), is named at the end of the run: mark it (compiles,
# numerics, grid, processes; quick where it is the smallest comparison of a term) or make it compile less.
COMPILING = ("tpu", "compiles", "numerics", "grid", "processes")
UNMARKED_COMPILE_SECONDS = 3.0
_compile_seconds = [0.0]
_unmarked: list[tuple[str, float]] = []


def _on_duration(event: str, duration: float, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compile_seconds[0] += duration


jax.monitoring.register_event_duration_secs_listener(_on_duration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    before = _compile_seconds[0]
    yield
    spent = _compile_seconds[0] - before
    if spent > UNMARKED_COMPILE_SECONDS and not any(item.get_closest_marker(m) for m in COMPILING):
        _unmarked.append((item.nodeid, spent))


def pytest_runtest_logreport(report):
    """Under pytest-xdist the guard's findings travel from the workers in the reports' sections."""
    for name, text in report.sections:
        if name == "unmarked compiles" and report.when == "call":
            _unmarked.append((report.nodeid, float(text)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        for node, spent in _unmarked:
            if node == item.nodeid:
                outcome.get_result().sections.append(("unmarked compiles", f"{spent:.1f}"))


def pytest_terminal_summary(terminalreporter):
    found = dict(_unmarked)
    if found:
        terminalreporter.write_sep("-", f"tests marked none of {', '.join(COMPILING)} that compiled over "
                                        f"{UNMARKED_COMPILE_SECONDS:g} s (XLA's compile time)")
        for node, spent in sorted(found.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{spent:6.1f} s  {node}")


def _has_libtpu() -> bool:
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_addoption(parser):
    parser.addoption("--of", action="append", default=[], metavar="MODULE",
                     help="only the test files that import MODULE (a dotted name or a path: scaling.families.moe, "
                          "scaling/families/moe.py, scaling.families for the sub-package); repeatable")


def _module_name(text: str) -> str:
    """scaling/families/moe.py or scaling.families.moe -> scaling.families.moe."""
    return text.removesuffix(".py").replace("/", ".").removesuffix(".__init__").strip(".")


def imported_modules(path: Path) -> set[str]:
    """The dotted names a file imports (``from a.b import c``: a.b and a.b.c; function-level imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def imports_any(path: Path, targets: list[str]) -> bool:
    """Whether the test file ``path`` imports one of ``targets`` (modules or packages, dotted)."""
    return any(n == t or n.startswith(t + ".") for n in imported_modules(path) for t in targets)


def pytest_ignore_collect(collection_path, config):
    targets = [_module_name(t) for t in config.getoption("of")]
    if targets and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return not imports_any(collection_path, targets) or None
    return None


def _cost_rank(item) -> int:
    """0 for a test that compiles for a TPU topology (the suite's longest: up to 4 minutes on 2 cores), 1 for one that
    compiles otherwise, 2 for the rest."""
    if item.get_closest_marker("tpu"):
        return 0
    return 1 if any(item.get_closest_marker(m) for m in COMPILING) else 2


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    config.stash[ALL_ITEMS] = list(items)  # before -m and -k deselect: tests/test_tiers.py reads the tiers off them
    # the longest first (stable within a rank): pytest-xdist hands tests out in this order, so the two workers end
    # on short tests together rather than one on a 5-minute compile while the other waits
    items.sort(key=_cost_rank)
    if _has_libtpu():
        return
    skip = pytest.mark.skip(reason="libtpu not installed (pip install -e '.[tpu]')")
    for item in items:
        if "tpu" in item.keywords:
            item.add_marker(skip)
