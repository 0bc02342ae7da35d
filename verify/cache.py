"""A folder of results shared between processes, by the call that made them: ``cached(key, make)``.

verify.check.check keeps its reports here so that the processes of one test session (tests/conftest.py makes a
fresh folder per pytest session) and the notebooks it executes reuse the grids a test already compiled rather
than compiling them again. The folder is the one $VERIFY_CHECK_CACHE names; unset (or empty), nothing is cached.
Nothing here imports jax.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

# The environment variable naming the folder (tests/conftest.py sets it per pytest session; make test-all sets one
# for its pass over the suite and its pass over the notebooks).
CACHE_ENV = "VERIFY_CHECK_CACHE"

T = TypeVar("T")


def cached(key: str, make: Callable[[], T]) -> T:
    """``make()``, or the value an identical ``key`` already left in the folder $VERIFY_CHECK_CACHE names.

    The value is pickled to <folder>/<sha256 of key>.pickle. It is written whole to a file of its own
    (<sha256>.<pid>.part), then renamed: os.replace is atomic, so another process reads either no file or the whole
    one, never a half-written one, and a write that fails leaves no .pickle behind. Without the variable every call
    runs ``make``."""
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        return make()
    path = Path(folder) / f"{hashlib.sha256(key.encode()).hexdigest()}.pickle"
    if path.exists():
        return pickle.loads(path.read_bytes())
    value = make()
    part = path.with_suffix(f".{os.getpid()}.part")
    part.write_bytes(pickle.dumps(value))
    part.replace(path)
    return value
