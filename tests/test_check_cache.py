"""verify.cache.cached, the folder of results verify.check.check shares between processes ($VERIFY_CHECK_CACHE):
a key seen before is read from the folder, a new one made, nothing cached without the variable, and a file
half-written is never read. No compiles: ``make`` is a counting stand-in."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from verify.cache import CACHE_ENV, cached


class Make:
    """A stand-in for compare(): counts its calls and returns a fresh value each time."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return {"call": self.calls, "rows": [1.0, 2.5]}


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path


def test_the_same_key_reads_the_file_and_does_not_make_again(folder):
    make = Make()
    first = cached("(w, 'cpu:8', None)", make)
    again = cached("(w, 'cpu:8', None)", make)
    assert make.calls == 1 and again == first == {"call": 1, "rows": [1.0, 2.5]}
    name = hashlib.sha256(b"(w, 'cpu:8', None)").hexdigest() + ".pickle"
    assert [p.name for p in folder.iterdir()] == [name]  # written whole and renamed: no .part left


def test_a_different_key_makes_its_own(folder):
    make = Make()
    assert cached("a", make) == {"call": 1, "rows": [1.0, 2.5]}
    assert cached("b", make) == {"call": 2, "rows": [1.0, 2.5]}
    assert cached("a", make)["call"] == 1 and cached("b", make)["call"] == 2
    assert make.calls == 2 and len(list(folder.iterdir())) == 2


@pytest.mark.parametrize("value", [None, ""])
def test_without_the_variable_nothing_is_cached(tmp_path, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(CACHE_ENV, value)
    monkeypatch.chdir(tmp_path)
    make = Make()
    assert [cached("a", make)["call"] for _ in range(3)] == [1, 2, 3]
    assert list(tmp_path.iterdir()) == []


def test_a_half_written_file_is_never_read(folder, monkeypatch):
    """A writer that dies half-way (here: its write stops after half the bytes) leaves no .pickle: a reader makes the
    value again rather than unpickle half of one; a stray .part (another process still writing) is not read."""
    make = Make()
    write_bytes = Path.write_bytes

    def half(path, data):
        write_bytes(path, data[: len(data) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_bytes", half)
    with pytest.raises(OSError, match="disk full"):
        cached("a", make)
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    assert not list(folder.glob("*.pickle"))
    assert cached("a", make) == {"call": 2, "rows": [1.0, 2.5]} and make.calls == 2
    assert cached("a", make)["call"] == 2 and make.calls == 2

    (folder / (hashlib.sha256(b"b").hexdigest() + ".123.part")).write_bytes(b"\x80\x05 half")
    assert cached("b", make)["call"] == 3
