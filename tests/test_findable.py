"""Tests findable by module: `pytest tests --of scaling/families/moe.py` (or a dotted name, or a sub-package) runs
the test files that import it (tests/conftest.py's --of, read from the files' imports: nothing kept by hand), and
every module of scaling/ has at least one. The two modules no other test file imported are tested here directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaling.core.inputs import ascii_float, ascii_int, positive_int, positive_ints
from scaling.reports.gemm import parse_gemm
from tests.conftest import _module_name, imports_any

ROOT = Path(__file__).resolve().parent.parent
TESTS = sorted((ROOT / "tests").glob("test_*.py"))


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "scaling").rglob("*.py")
                                        if p.stem not in ("__init__", "__main__")),
                         ids=lambda p: "/".join(p.relative_to(ROOT).parts))
def test_every_scaling_module_has_a_test_file_that_imports_it(path):
    name = _module_name(str(path.relative_to(ROOT)))
    assert any(imports_any(t, [name]) for t in TESTS), f"no test file imports {name} (pytest tests --of {name})"


def test_the_selection_reads_imports(tmp_path):
    """A file that imports a module (at module level, inside a function, or as ``from pkg import module``) is
    selected for it and for its sub-package; one that names it only in a string is not."""
    (tmp_path / "test_a.py").write_text("def f():\n    from scaling.families import moe\n")
    (tmp_path / "test_b.py").write_text("import scaling.step.kernels as k\n")
    (tmp_path / "test_c.py").write_text("X = 'scaling.families.moe'\n")
    assert imports_any(tmp_path / "test_a.py", [_module_name("scaling/families/moe.py")])
    assert imports_any(tmp_path / "test_b.py", ["scaling.step"])
    assert not imports_any(tmp_path / "test_b.py", ["scaling.families"])
    assert not imports_any(tmp_path / "test_c.py", ["scaling.families.moe"])


def test_inputs_read_ascii_numbers_and_refuse_the_rest():
    assert ascii_int(" -12 ") == -12 and ascii_float("2.5e3") == 2500.0
    for bad in ("１２", "1_000", "12.0"):  # full-width digits, an underscore, a float: int() takes the first two
        with pytest.raises(ValueError, match="integer"):
            ascii_int(bad)
    assert positive_int("--steps", 3.0) == 3
    for bad in (0, -1, True, 2.5, "3"):
        with pytest.raises(ValueError, match="--steps must be a positive integer"):
            positive_int("--steps", bad)
    with pytest.raises(ValueError, match="must hold positive integers"):
        positive_ints("batch", __import__("numpy").array([4, 0]))


def test_parse_gemm_reads_m_n_k():
    assert parse_gemm("4096x1024X512") == (4096, 1024, 512)
    for bad in ("4096x1024", "4096x0x512", "axbxc"):
        with pytest.raises(ValueError, match="expected MxNxK"):
            parse_gemm(bad)
