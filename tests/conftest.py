"""Tests run on 8 emulated CPU devices; TPU-topology tests compile ahead of time with libtpu."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# AOT compiles for TPU topologies load libtpu in this process and in notebook kernels it starts
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# verify.check keeps its reports here for this session; the notebooks (executed by tests/test_notebooks.py,
# after tests/test_check.py) reuse the grids compiled there instead of compiling them a second time
os.environ.setdefault("VERIFY_CHECK_CACHE", tempfile.mkdtemp(prefix="verify-check-"))

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


def _has_libtpu() -> bool:
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    if _has_libtpu():
        return
    skip = pytest.mark.skip(reason="libtpu not installed (pip install -e '.[tpu]')")
    for item in items:
        if "tpu" in item.keywords:
            item.add_marker(skip)
