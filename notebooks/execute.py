"""Generate notebooks from their paired .py files and execute them in place, outputs included:
``.venv/bin/python notebooks/execute.py notebooks/X.py ...`` (or ``notebooks/X.ipynb``: the same, from X.py).

X.py (jupytext "percent" format, pairing declared in notebooks/jupytext.toml) is the source of truth; its cells
replace X.ipynb's, which then runs top to bottom in a fresh kernel ("python3") with notebooks/ as its working
directory, as tests/test_notebooks.py runs them; the committed X.ipynb keeps its outputs for reading on a code host.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

try:
    import ipykernel  # noqa: F401  (the notebooks' kernel, "python3")
    import jupytext
    import nbformat
    from nbclient import NotebookClient
except ImportError as e:  # `make answer` installs the package alone; the notebooks' packages are the dev extra's
    print(f"error: notebooks/execute.py needs {e.name}, which `make answer` does not install: `make test` installs "
          "the notebooks' packages (the dev extra), or .venv/bin/pip install -e '.[notebooks]'", file=sys.stderr)
    sys.exit(2)

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def generate(py: Path) -> nbformat.NotebookNode:
    """The notebook of X.py: its cells (jupytext), the python3 kernel, no outputs."""
    nb = jupytext.read(py)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = KERNELSPEC
    nb.metadata.setdefault("language_info", {"name": "python"})
    return nb


def execute(path: Path, timeout: int = 600) -> float:
    """Regenerate path.with_suffix('.ipynb') from path.with_suffix('.py'), execute it, write it; seconds taken."""
    nb = generate(path.with_suffix(".py"))
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path.with_suffix(".ipynb"))
    return time.perf_counter() - t0


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: executed in {execute(Path(arg).resolve()):.1f} s", flush=True)
