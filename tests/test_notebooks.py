"""Every notebook under notebooks/ runs top to bottom (nbclient, kernel python3), in a copy, within
3 minutes, with no error output. The committed notebooks keep their outputs for reading on a code
host; this test re-executes them so a change that breaks one fails here. Each X.ipynb is generated from its
paired X.py (jupytext "percent" format, notebooks/jupytext.toml); a cheap test holds their cells equal."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
LIMIT_S = 180


def cells(nb):
    """(type, source) of each markdown and code cell, sources without trailing blank lines."""
    return [(c.cell_type, c.source.rstrip("\n")) for c in nb.cells if c.cell_type in ("markdown", "code")]


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"4d_parallelism.ipynb", "closed_form_vs_compiled.ipynb", "plan_v5p.ipynb"} <= names


def test_pairing_declared():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((NOTEBOOKS[0].parent / "jupytext.toml").read_text())
    assert set(config["formats"].split(",")) == {"ipynb", "py:percent"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_matches_paired_py(path):
    """X.ipynb's cells are X.py's, in order: regenerate with notebooks/execute.py after editing X.py."""
    jupytext = pytest.importorskip("jupytext")
    py = path.with_suffix(".py")
    assert py.exists(), f"{path.name} has no paired {py.name}"
    assert "# %%" in py.read_text(), f"{py.name} is not in jupytext percent format"
    ipynb, paired = cells(jupytext.read(path)), cells(jupytext.read(py))
    assert [t for t, _ in ipynb] == [t for t, _ in paired], f"{path.name}: cell types differ from {py.name}"
    for i, ((kind, a), (_, b)) in enumerate(zip(ipynb, paired)):
        assert a == b, f"{path.name} cell {i} ({kind}) differs from {py.name}; run notebooks/execute.py {py.name}"


@pytest.mark.processes
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    """Each notebook runs without an error output and draws a plot. Their ahead-of-time compiles stop after
    NOTEBOOK_COMPILE_BUDGET_S seconds (the kernel inherits the variable): what they compile is held to its
    bands by tests/test_check.py; here the cells run, the committed outputs keep every compiled point."""
    monkeypatch.setenv("NOTEBOOK_COMPILE_BUDGET_S", "5")
    nb = nbformat.read(path, as_version=4)
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "committed without outputs"
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=LIMIT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    elapsed = time.perf_counter() - t0
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert elapsed < LIMIT_S, f"{path.name} took {elapsed:.0f} s"
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert images >= 1, "no plot"
