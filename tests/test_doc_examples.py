"""What a new user reads runs as written (issue 49, items 1, 3, 4).

- Every `jax-scaling ...` line of a fenced ```bash or ``` block in README.md and docs/cli.md (a `$ jax-scaling`
  excerpt's command too; `.venv/bin/jax-scaling` is the same program; a trailing backslash continues a line, `#`
  starts a comment) runs in this process through jax_scaling.cli.main and exits 0, or 2 where the docs show it
  refused (an excerpt whose output starts `error:`), and no example prints "DOES NOT FIT". `[--flag value]`
  marks an optional part: the line runs without it. Lines of one block that share a `--checkpoint-dir` are one
  case, run in order in a fresh directory. The examples that cannot run here are SKIP, each with its reason. An
  example that compiles (check, train, compile, bench, plan --verify-top, trace --verify, answer
  --verify-pipeline) is marked `compiles`, and `tpu` where it compiles for a TPU topology.
- The compiled figures the docs quote that went stale (docs/cli.md: the 70B's top plans compiled for v5p-1024 and
  512 H100s, every compiled cell of the stages table) are what the compiler gives now (FIGURES).
- The README says how to reach `jax-scaling` after `make answer`; every relative link of README.md and docs/*.md
  resolves to a file of the repository (and its #anchor to a heading there); no doc cites a file a clone does not
  have; the question and the seeds are stated (docs/questions.md, linked from the README and `answer --help`).
- `python -m jax_scaling.profile_step` and `notebooks/execute.py` refuse with one line, no traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from mesh.devices import has_cuda_plugin
from scaling.hardware.chips import get_chip
from tests.helpers import cpu_bound, run_cli as run

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/cli.md")
PROGRAM = re.compile(r"^(?:\$ )?(?:[A-Z_]+=\S* )*(?:\.venv/bin/)?jax-scaling(?:\s|$)")
COMPILING_COMMANDS = {"check", "train", "compile", "bench", "calibrate"}

# examples that do not run as written here: the command (as normalized: no prompt, path or comment) -> why
SKIP = {
    "jax-scaling check --xla-flags default ...": "a placeholder: the line above's check under another flag set",
    "jax-scaling check --xla-flags=--xla_enable_async_all_gather=true --xla_tpu_enable_async_collective_fusion=true "
    "...": "a placeholder: the line above's check under your own flags",
    "JAX_PLATFORMS=cpu jax-scaling train --preset tiny --batch-tokens 64 --steps 5 --devices cpu:4 "
    "--mesh fsdp=4,tensor=2 --coordinator localhost:$PORT --num-processes 2 --process-id $i &":
        "two processes of a shell loop: tests/test_multiprocess.py runs them",
    "jax-scaling bench --preset xxl-2 --mesh fsdp=1 --batch-tokens 4096 --steps 10 --json":
        "needs one GPU (the chip is the device's; xxl-2's step needs about 66 GB per device)",
}


def examples(doc: str) -> list[dict]:
    """The jax-scaling command lines of ``doc``'s ```bash and ``` blocks: [{'where', 'command' (normalized),
    'expect' (exit code)}], in order."""
    lines, out, i, block = (ROOT / doc).read_text().splitlines(), [], 0, None
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            block = None if block is not None else (i if line.strip() in ("```", "```bash") else -1)
            i += 1
            continue
        if block is None or block < 0:
            i += 1
            continue
        start, text = i + 1, line.strip()
        while text.endswith("\\"):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        i += 1
        if not PROGRAM.match(text):
            continue
        expect = 0
        if text.startswith("$ "):  # an excerpt: its output follows; shown refused when it starts with error:
            expect = 2 if i < len(lines) and lines[i].startswith("error:") else 0
            text = text[2:]
        text = re.sub(r"\s\[[^\]]*\]", "", text)  # [--optional parts]
        command = " ".join(shlex.split(text.replace(".venv/bin/jax-scaling", "jax-scaling"), comments=True))
        out.append({"where": f"{doc}:{start}", "block": block, "command": command, "expect": expect})
    return out


def _marks(argv: list[str]) -> list:
    """compiles (and tpu, or the CUDA plugin's skip) for an example that compiles."""
    def value(flag, default=None):
        return argv[argv.index(flag) + 1] if flag in argv else default

    cmd = argv[0]
    compiles = (cmd in COMPILING_COMMANDS or "--verify" in argv or "--verify-pipeline" in argv
                or value("--verify-top", "0") != "0")
    if not compiles:
        return []
    if cmd in COMPILING_COMMANDS:
        platform = (value("--devices") or "cpu").split(":")[0]
    elif cmd == "plan":
        platform = "tpu" if value("--slice") or get_chip(value("--chip", "v5p")).kind == "tpu" else "gpu"
    else:  # trace --verify, answer --verify-pipeline: v5p chips
        platform = "tpu"
    extra = {"tpu": [pytest.mark.tpu], "cpu": [],
             "gpu": [pytest.mark.skipif(not has_cuda_plugin(), reason="needs jax's CUDA plugin (cuda-aot)")]}
    return [pytest.mark.compiles, *extra[platform]]


def _cases():
    """One case per distinct example (the first place it appears); a block's lines that share a --checkpoint-dir
    one case, in order."""
    cases, seen = [], {}
    for doc in DOCS:
        for e in examples(doc):
            if e["command"] in SKIP:
                continue
            assert "..." not in e["command"], f"{e['where']}: a placeholder not in SKIP: {e['command']}"
            argv = shlex.split(e["command"])[1:]
            ckpt = argv[argv.index("--checkpoint-dir") + 1] if "--checkpoint-dir" in argv else None
            key = (doc, e["block"], ckpt) if ckpt else e["command"]
            if key in seen:
                if ckpt:
                    seen[key]["runs"].append((argv, e["expect"]))
                continue
            seen[key] = {"where": e["where"], "ckpt": ckpt, "runs": [(argv, e["expect"])]}
            cases.append(seen[key])
    return [pytest.param(c, id=c["where"], marks=_marks(c["runs"][0][0])) for c in cases]


CASES = _cases()




def test_the_examples_are_found():
    """Both files' examples are read (a change of the fences or the prompt shows here), each SKIP entry is still an
    example of the docs, and the closed-form examples are most of the cases (the README's 13 commands at least)."""
    found = {e["command"] for doc in DOCS for e in examples(doc)}
    assert set(SKIP) <= found, set(SKIP) - found
    readme = examples("README.md")
    assert len(readme) >= 13 and readme[0]["command"] == "jax-scaling answer", readme[:2]
    assert len(CASES) >= 35, len(CASES)


@pytest.mark.parametrize("case", CASES)
def test_documented_example_runs(case, tmp_path):
    """Each example exits as the docs show (0; 2 for a refusal the docs print) and none prints DOES NOT FIT."""
    for argv, expect in case["runs"]:
        if case["ckpt"]:
            argv = [str(tmp_path / "ckpt") if a == case["ckpt"] else a for a in argv]
        code, out, err, _ = run(argv)
        assert code == expect, (case["where"], argv, code, out[-2000:], err[-2000:])
        assert "DOES NOT FIT" not in out, (case["where"], out[:400])


def test_the_skip_list_is_short_and_says_why():
    assert all(reason.strip() for reason in SKIP.values())
    assert len(SKIP) <= 4  # kept short: a new placeholder goes into the docs as a runnable line instead


# The compiled figures the docs quote: (doc, the quote as a regex whose groups are the figure(s), the command that
# compiles it (run in this process with --json), the figures from its JSON, marks). A figure's digits are the
# quote's (GB: bytes / 1e9).
def _gb(x: float, like: str) -> str:
    return f"{x / 1e9:.{len(like.split('.')[1])}f}"


def _plan_top(r: dict) -> list[float]:
    return [r["plans"][0]["compiled_peak_bytes"]]


def _peak(r: dict) -> list[float]:
    return [r["memory"]["peak"]["compiled"]]


# docs/cli.md's table of the 16-layer transformer's peaks on stages: per schedule (the cells before its compiled
# column, the flags), the compiled peak and its ratio to the closed form at M = 8 (each cell a 2-4 minute compile on 2
# cores: the M = 4 and 16 cells, compiled with the same command on 2026-11-29, are not compiled again by the suite)
STAGES = ("check --devices tpu:v5p:2x2x2 --mesh stage=4,tensor=2 --preset medium-tf --kv-heads 16 --blocks 16 "
          "--vocab 32768 --attention flash --microbatches {m} --batch-tokens {b} {schedule} --json")
SCHEDULES = {"gpipe": (0, "--schedule gpipe"), "1f1b": (3, "--schedule 1f1b"),
             "1f1b-R2": (6, "--schedule 1f1b --repeats 2")}
FIGURES = [
    pytest.param("docs/cli.md", r"the top plan compiled for the slice's topology peaks at\s+(\d+\.\d+) GB",
                 "plan --preset llama3.1-70b --slice v5p-1024 --verify-top 1 --top 1 --json", _plan_top,
                 marks=[pytest.mark.compiles, pytest.mark.tpu], id="v5p-1024-70b-top-plan"),
    pytest.param("docs/cli.md", r"the 512-H100 top plan compiles to a (\d+\.\d+) GB peak",
                 "plan --preset llama3.1-70b --chip H100 --chips 512 --verify-top 1 --top 1 --json", _plan_top,
                 marks=[pytest.mark.compiles,
                        pytest.mark.skipif(not has_cuda_plugin(), reason="needs jax's CUDA plugin (cuda-aot)")],
                 id="512-H100-70b-top-plan"),
    *(pytest.param("docs/cli.md", rf"^\| {m} = \d*S +\|(?:[^|]*\|){{{skip}}} (\d+\.\d+) \|[^|]*\| (\d\.\d+) \|",
                   STAGES.format(m=m, b=m * 16384, schedule=flags), _peak,
                   marks=[pytest.mark.compiles, pytest.mark.tpu], id=f"stages-table-{name}-M{m}")
      for name, (skip, flags) in SCHEDULES.items() for m in (8,)),
]


@pytest.mark.parametrize("doc, quote, command, figures", FIGURES)
def test_compiled_figure_is_what_the_compiler_gives(doc, quote, command, figures):
    """The quoted figure is the compiled one to its printed digits (and a quoted ratio the report's)."""
    m = re.search(quote, (ROOT / doc).read_text(), re.MULTILINE)
    assert m, f"{doc} no longer quotes {quote!r}: update FIGURES with the docs"
    code, out, err, _ = run(command.split())
    assert code == 0, err[-2000:]
    r = json.loads(out)
    got = [_gb(x, m.group(1)) for x in figures(r)]
    if m.lastindex == 2:  # a ratio column beside it: compiled over closed form
        got.append(f"{r['memory']['peak']['ratio']:.{len(m.group(2).split('.')[1])}f}")
    assert list(m.groups()) == got, (command, m.groups(), got)


def test_readme_says_how_to_reach_the_command():
    """The README opens with `make answer` and `make test` (Makefile targets), and before its first example says
    how to run `jax-scaling` after them: activate the venv, or its path (a fresh shell has no jax-scaling on PATH;
    issue 49, item 1)."""
    text = (ROOT / "README.md").read_text()
    first = text.split("```")[1].strip().splitlines()
    assert [line.split("#")[0].strip() for line in first[:2]] == ["make answer", "make test"], first
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert {"answer", "test"} <= set(targets)
    head = text[:text.index("## Examples")]
    assert ". .venv/bin/activate" in head and ".venv/bin/jax-scaling" in head, head


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, the characters that are not letters, marks, digits,
    underscores, spaces or hyphens dropped, spaces as hyphens (github-slugger)."""
    keep = "".join(c for c in heading.strip().lower()
                   if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return keep.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {_slug(re.sub(r"[`*]", "", h)) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def _docs():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_resolves_in_the_repository():
    """Each [text](target) of README.md and docs/*.md that is not a URL names a file or folder inside this repository
    (not ../shared, not an absolute path), and its #anchor a heading of that file."""
    bad = []
    for doc in _docs():
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not (file.exists() and file.is_relative_to(ROOT)):  # a file, or a folder (GitHub lists it)
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such file in the repository)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_the_docs_cite_no_file_a_clone_lacks():
    """No file outside the repository is named (the reference material under ../shared, a machine's paths)."""
    bad = [f"{d.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for d in _docs()
           for n, line in enumerate(d.read_text().splitlines(), 1)
           if re.search(r"(?<![\w.])shared/reference|\.\./shared|/work/|/root/", line)]
    assert not bad, "\n".join(bad)


def test_the_question_and_the_seeds_are_stated():
    """docs/questions.md states questions (a)-(d) and each reference seed (000-003, the files the package ships or
    transcribes), and the README and `answer --help` point to it."""
    text = (ROOT / "docs/questions.md").read_text()
    for q in "abcd":
        assert f"**({q})**" in text, q
    seeds = {p.name for p in (ROOT / "scaling/data/seeds").glob("*.txt")} | {"003_bloom_topology_search.txt"}
    assert len(seeds) == 4 and all(f"`{name}`" in text for name in seeds), seeds
    assert "(docs/questions.md)" in (ROOT / "README.md").read_text()
    code, out, err, _ = run(["answer", "--help"])
    assert code == 0 and "docs/questions.md" in " ".join(out.split()), out


def _one_line(code: int, out: str, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), (code, out, err)
    return lines[0]


@pytest.mark.parametrize("bench, match", [
    (["--steps", "0"], "--steps"),  # refused by the flags' rule, as argparse reads them
    (["--preset", "nope", "--mesh", "data=1"], "unknown preset 'nope'"),  # refused by bench's own checks
])
def test_profile_step_refuses_a_bad_bench_with_one_line(bench, match, tmp_path):
    """A bench that bench refuses is its one error line and exit 2, nothing written, before jax.profiler starts (it
    was an IndexError traceback: the report read from an empty stdout)."""
    from jax_scaling.profile_step import main as profile

    out_json, out, err = tmp_path / "out.json", io.StringIO(), io.StringIO()
    t = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = profile(str(out_json), ["bench", *bench])
    assert match in _one_line(code, out.getvalue(), err.getvalue())
    assert not out_json.exists() and time.process_time() - t < cpu_bound(2)


def test_profile_step_without_arguments_is_its_usage():
    r = subprocess.run([sys.executable, "-m", "jax_scaling.profile_step"], capture_output=True, text=True, cwd=ROOT)
    assert "usage: python -m jax_scaling.profile_step" in _one_line(r.returncode, r.stdout, r.stderr)


def test_the_notebook_runner_without_the_dev_extra_says_what_to_install():
    """`make answer` installs no jupytext: notebooks/execute.py says so in one line (make test, or the notebooks
    extra) and exits 2 instead of an ImportError traceback."""
    hide = ("import runpy, sys; sys.modules['jupytext'] = None; sys.argv = ['notebooks/execute.py', "
            "'notebooks/pipeline.py']; runpy.run_path('notebooks/execute.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    line = _one_line(r.returncode, r.stdout, r.stderr)
    assert "jupytext" in line and "make test" in line, line
