"""Tests run on 8 emulated CPU devices; TPU-topology tests compile ahead of time with libtpu.

Two tiers, chosen by markers that say what a test does (pyproject.toml lists them): `make test` runs every test
that compiles nothing, and of those that compile (tpu, compiles, numerics, grid, processes) the ones marked quick,
the smallest compiled comparison of each closed-form term (tests/test_tiers.py holds that every term has one);
`make test-all` runs everything."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# AOT compiles for TPU topologies load libtpu in this process and in notebook kernels it starts
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# verify.check keeps its reports here for this session, one folder for all of pytest-xdist's workers (their run's
# PYTEST_XDIST_TESTRUNUID), or the one the caller gives: make test-all gives one to its pass over the suite and to its
# pass over the notebooks after it, which read the grids' reports instead of compiling them a second time
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


def _has_libtpu() -> bool:
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    config.stash[ALL_ITEMS] = list(items)  # before -m and -k deselect: tests/test_tiers.py reads the tiers off them
    if _has_libtpu():
        return
    skip = pytest.mark.skip(reason="libtpu not installed (pip install -e '.[tpu]')")
    for item in items:
        if "tpu" in item.keywords:
            item.add_marker(skip)
