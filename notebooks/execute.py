"""Execute notebooks in place, outputs included: ``.venv/bin/python notebooks/execute.py notebooks/X.ipynb ...``.

Each runs top to bottom in a fresh kernel ("python3") with notebooks/ as its working directory, as
tests/test_notebooks.py runs them; the committed copy keeps its outputs for reading on a code host.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - t0


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: executed in {execute(Path(arg).resolve()):.1f} s", flush=True)
