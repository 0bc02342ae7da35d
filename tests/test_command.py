"""The command layer (jax_scaling.cli): one console script, jax-scaling, with every command; the python -m
spellings of before are the same program. Commands run in one process: a bad flag fails before jax is
imported, and nothing starts the package's own programs as child processes."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scaling", "mesh", "ffn_model", "verify", "jax_scaling")
SCRIPT = str(Path(sys.executable).with_name("jax-scaling"))  # the console script pip installs beside python
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
SPELLINGS = {"jax-scaling": [SCRIPT], **{f"python -m {m}": [sys.executable, "-m", m]
                                          for m in ("scaling", "ffn_model", "verify")}}


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=timeout)


def test_console_script_is_the_command_layer():
    (ep,) = importlib.metadata.entry_points(group="console_scripts", name="jax-scaling")
    assert ep.value == "jax_scaling.cli:main"
    assert Path(SCRIPT).exists(), "pip install -e . (the jax-scaling script is missing)"


@pytest.mark.parametrize("prog, argv, match", [
    ("jax-scaling", "check --remat sometimes", "argument --remat: invalid choice: 'sometimes'"),
    ("jax-scaling", "compile --preset tiny --batch-tokens 0", "--batch-tokens must be a positive integer, got 0"),
    ("python -m scaling", "check --bogus", "python -m scaling: unrecognized arguments: --bogus"),
    ("python -m scaling", "train", "python -m scaling: argument command: invalid choice: 'train'"),
    ("python -m ffn_model", "bench --devices cpu:8 --steps 0", "--steps must be a positive integer, got 0"),
    ("python -m verify", "plan --verify-top -1", "--verify-top must be 0 (compile none) or a positive count"),
    # check's values: the workload is built and refused before verify (and jax) is imported
    ("jax-scaling", "check --batch-tokens 0", "--batch-tokens must be a positive integer, got 0"),
    ("jax-scaling", "check --devices cpu:8 --mesh fsdp=8 --batch-tokens 100", "batch_tokens=100 is not divisible"),
    # a flag set that does not exist, a flag not written --name=value (scaling.core.flags)
    ("jax-scaling", "check --xla-flags fastest", "unknown XLA flag set 'fastest'"),
    ("python -m scaling", "plan --xla-flags=--xla_x=1 --xla-flags=-=2", "XLA flag '-=2' is not of the form"),
])
def test_bad_flag_fails_in_under_a_second_without_jax(prog, argv, match):
    """Exit 2, one line on stderr, nothing on stdout, under 1 s of CPU for the whole process (start-up included;
    its CPU seconds, not the wall clock, which other jobs on the machine stretch: importing jax alone takes more);
    and the same call in one process leaves jax unimported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = _run([*SPELLINGS[prog], *argv.split()], timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: ") and match in r.stderr, r.stderr
    assert seconds < 1.0, f"{seconds:.2f} s"
    code = ("import sys; from jax_scaling.cli import main; "
            f"rc = main({argv.split()!r}, prog={prog!r}); "
            "sys.exit('jax imported' if 'jax' in sys.modules else rc)")
    r = _run([sys.executable, "-c", code], timeout=60)
    assert r.returncode == 2, r.stderr


STARTERS = ("subprocess.", "os.system", "os.popen", "os.exec", "os.spawn", "os.posix_spawn", "multiprocessing.")


def child_processes(source: str) -> list[tuple[int, str]]:
    """(line, call) of every call that starts one of PACKAGES as a program: a call into subprocess, os.system,
    os.popen, os.exec*, os.spawn* or multiprocessing whose string arguments say ``-m <package>``."""
    tree = ast.parse(source)
    alias = {a.asname or a.name: f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             for a in n.names}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        name = alias.get(name.split(".")[0], name.split(".")[0]) + name[len(name.split(".")[0]):]
        if not name.startswith(STARTERS):
            continue
        words = " ".join(s.value for s in ast.walk(node) if isinstance(s, ast.Constant) and isinstance(s.value, str))
        if re.search(rf"(^|\s)-m\s+({'|'.join(PACKAGES)})\b", words):
            found.append((node.lineno, name))
    return found


MODULES = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).glob("*.py"))]


@pytest.mark.parametrize("path", MODULES, ids=[f"{p.parent.name}/{p.name}" for p in MODULES])
def test_no_layer_starts_the_package_as_a_child_process(path):
    assert not child_processes(path.read_text()), f"{path.parent.name}/{path.name} starts a child process"


def test_a_child_process_hand_off_is_caught():
    """The rule can fail: the hand-off scaling.cli had (handover), and its other spellings, are found;
    a program that is not the package's is not."""
    planted = '''
import os, subprocess, sys
from subprocess import Popen as P

def handover(argv):
    return subprocess.call([sys.executable, "-m", "verify", *argv])

def other(argv):
    os.system("python -m ffn_model compile")
    P([sys.executable, "-m", "scaling", "answer"])
    subprocess.run(["nvidia-smi"])
'''
    assert child_processes(planted) == [(6, "subprocess.call"), (9, "os.system"), (10, "subprocess.Popen")]


def test_json_is_byte_identical_through_every_spelling():
    """answer --json and a small plan --json: the console script prints what python -m scaling prints
    (plan's enumerate_seconds, a timing, blanked)."""
    for argv in (["answer", "--json"], ["plan", "--chips", "8", "--preset", "tiny", "--batch-tokens", "512", "--json"]):
        outs = []
        for cmd in (SPELLINGS["jax-scaling"], SPELLINGS["python -m scaling"]):
            r = _run([*cmd, *argv], timeout=60)
            assert r.returncode == 0, r.stderr
            outs.append(re.sub(r'"enumerate_seconds": [0-9.e-]+', '"enumerate_seconds": 0', r.stdout))
        assert outs[0] == outs[1], argv
        assert json.loads(outs[0])


@pytest.mark.compiles
def test_check_runs_in_this_process():
    """check through the command layer on 8 CPU devices, with subprocess.Popen and os.system patched to fail
    when they start one of PACKAGES. The matmul FLOPs per device are the hand figure 6·B·(2·D·F·L)/8
    = 6·64·(2·64·256·3)/8 = 4,718,592 for the tiny model (D=64, F=256, L=3), B = 64 tokens."""
    code = f"""
import os, subprocess, sys
PACKAGES = {PACKAGES!r}
def ours(args):
    args = args if isinstance(args, str) else " ".join(map(str, args))
    return any(f"-m {{p}}" in args for p in PACKAGES)
popen = subprocess.Popen.__init__
def refuse(self, args, *a, **k):
    if ours(args):
        raise SystemExit("child process: " + str(args))
    return popen(self, args, *a, **k)
subprocess.Popen.__init__ = refuse
system = os.system
os.system = lambda c: sys.exit("child process: " + c) if ours(c) else system(c)
from jax_scaling.cli import main
sys.exit(main("check --devices cpu:8 --mesh fsdp=4,tensor=2 --preset tiny --batch-tokens 64 --json".split()))
"""
    r = _run([sys.executable, "-c", code], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["flops"]["matmul"]["compiled"] == 6 * 64 * (2 * 64 * 256 * 3) / 8
