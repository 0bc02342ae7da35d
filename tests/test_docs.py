"""The figures the docs quote are what the commands print now (issue 23, item 2: docs/cli.md quoted a step time,
an MFU and memory figures the commands had stopped printing).

README.md and docs/cli.md put each quoted output next to the command that prints it, in one of two forms:
- an excerpt: a fenced block whose first line is `$ jax-scaling ...` (a trailing backslash continues it), the
  command's output below it; "..." leaves part of a line out. Each piece of each line between the "..." must be
  in one line of what the command prints (runs of spaces count as one, so a long line may be wrapped at a space);
- a paragraph between `<!-- figures: jax-scaling ... -->` (one line per command whose output it quotes) and
  `<!-- /figures -->`: every number in its prose (not in `code` spans, link targets or comments; not one glued to
  a word, like v5p or 4x4x4 or v5p-64) must be a number the commands print, as printed. With
  `<!-- figures-columns: NAME, ... -->` the rows of a Markdown table in it are checked in those columns only (the
  other columns are compiled figures, labelled so in the text).
Only the closed-form commands are run (in this process, jax_scaling.cli.main): answer, plan, predict, validate,
trace, layers, kernels, never with a flag that compiles. Figures that only a compile or a measured run prints
(check, compile, train, bench, --verify-top, trace --verify) are quoted in the docs with what produced them and
the versions (README.md's "Tested versions"), and are not re-checked here.
"""

from __future__ import annotations

import contextlib
import functools
import io
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/cli.md")
FAST = {"answer", "plan", "predict", "validate", "trace", "layers", "kernels"}
COMPILING = {"--verify", "--verify-pipeline"}  # and --verify-top other than 0

NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
DOC_NUM = re.compile(rf"(?<![\w.^/:=+-])(?:{NUM})(?![\w^]|\.\d)")
MARKER = re.compile(r"^<!-- figures: (.+?) -->$")
COLUMNS = re.compile(r"^<!-- figures-columns: (.+?) -->$")
END = "<!-- /figures -->"


def figure_regions(text: str) -> list[dict]:
    """The paragraphs between `<!-- figures: CMD -->` lines and `<!-- /figures -->`: [{'line', 'commands',
    'columns', 'text'}]."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if not MARKER.match(lines[i].strip()):
            i += 1
            continue
        start, commands, columns = i + 1, [], None
        while i < len(lines) and (MARKER.match(lines[i].strip()) or COLUMNS.match(lines[i].strip())):
            m = MARKER.match(lines[i].strip())
            if m:
                commands.append(m.group(1))
            else:
                columns = [c.strip() for c in COLUMNS.match(lines[i].strip()).group(1).split(",")]
            i += 1
        body = []
        while i < len(lines) and lines[i].strip() != END:
            if MARKER.match(lines[i].strip()):
                raise ValueError(f"line {start}: a figures marker inside another's paragraph (close it first)")
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"line {start}: <!-- figures: ... --> without {END}")
        out.append({"line": start, "commands": commands, "columns": columns, "text": "\n".join(body)})
        i += 1
    return out


def excerpts(text: str) -> list[dict]:
    """The fenced blocks that start with `$ jax-scaling ...`: [{'line', 'command', 'output': [lines]}]."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("```") and i + 1 < len(lines) and lines[i + 1].startswith("$ jax-scaling"):
            start, i = i + 2, i + 1
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            i += 1
            body = []
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append({"line": start, "command": " ".join(command.split()), "output": body})
        i += 1
    return out


def prose_numbers(text: str) -> list[str]:
    """The numbers a paragraph quotes: not those in `code`, in link targets or comments, glued to a word, or names
    (seed 001, issue 23)."""
    text = re.sub(r"<!--.*?-->", " ", text)
    text = re.sub(r"\b(seed|issue|item)s? \d+", " ", text)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "] ", text)
    return DOC_NUM.findall(text)


def missing_figures(region: dict, outputs: list[str]) -> list[str]:
    """The numbers of a figures paragraph that none of the commands' outputs prints."""
    printed = {n for out in outputs for n in re.findall(NUM, out)}
    text = region["text"]
    if region["columns"]:
        kept, header = [], None
        for line in text.splitlines():
            if not line.lstrip().startswith("|"):
                kept.append(line)
                header = None
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
                missing = set(region["columns"]) - set(header)
                if missing:
                    raise ValueError(f"figures-columns {sorted(missing)} not in the table's header {header}")
            elif not set("".join(cells)) <= set("-: "):
                kept += [c for h, c in zip(header, cells) if h in region["columns"]]
        text = "\n".join(kept)
    return [n for n in prose_numbers(text) if n not in printed]


def missing_pieces(excerpt: list[str], output: str) -> list[str]:
    """The pieces (between "...") of an excerpt's lines that no line of the output holds."""
    printed = [" ".join(line.split()) for line in output.splitlines()]
    out = []
    for line in excerpt:
        for piece in line.split("..."):
            piece = " ".join(piece.split())
            if piece and not any(piece in p for p in printed):
                out.append(piece)
    return out


@functools.lru_cache(maxsize=None)
def run(command: str) -> str:
    """What `jax-scaling ...` prints (stdout and stderr) when run in this process; only the closed-form commands."""
    from jax_scaling.cli import main

    argv = shlex.split(command)
    assert argv[0] == "jax-scaling" and argv[1] in FAST, f"not a closed-form command: {command}"
    compiles = COMPILING & set(argv) or (
        "--verify-top" in argv and argv[argv.index("--verify-top") + 1] != "0")
    assert not compiles, f"the docs test runs no compile: {command}"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv[1:])
        except SystemExit:
            pass
    return out.getvalue() + err.getvalue()


def _cases():
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for r in figure_regions(text):
            yield pytest.param(r, id=f"{doc}:{r['line']}")
        for e in excerpts(text):
            yield pytest.param(e, id=f"{doc}:{e['line']}")


CASES = list(_cases())


def test_the_docs_quote_their_figures_next_to_the_commands():
    """Both files quote figures this way: README.md 4 paragraphs, docs/cli.md 4 excerpts and 4 paragraphs (what
    they quote now: a marker removed shows here)."""
    counts = {}
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        counts[doc] = (len(figure_regions(text)), len(excerpts(text)))
    assert counts["README.md"][0] >= 4 and counts["docs/cli.md"][0] >= 4 and counts["docs/cli.md"][1] >= 4, counts


@pytest.mark.parametrize("case", CASES)
def test_quoted_figures_are_what_the_command_prints(case):
    if "command" in case:
        missing = missing_pieces(case["output"], run(case["command"]))
        assert not missing, f"`{case['command']}` prints none of: {missing}"
    else:
        missing = missing_figures(case, [run(c) for c in case["commands"]])
        assert not missing, f"{case['commands']} print none of {missing} (quoted: {case['text'][:300]!r})"


def test_the_checks_themselves():
    """On hand-made text: a stale figure is found, a figure glued to a word or in `code` is not a figure, a table is
    checked in its named columns only, an excerpt's pieces between "..." are found in a line of the output,
    whatever its spacing; a compile is refused."""
    output = "step: 13.75 s (scheduled; sum 11.25, max 10.09), bound: compute\n 1     8   1.779   74.3\n"
    region = {"columns": None, "text": "first at 1.459 s on v5p-64 (`--chips 64`), sum 11.25, 4x4x4, 74.3 GB, seed 001"}
    assert missing_figures(region, [output]) == ["1.459"]
    table = "| M | compiled | closed form |\n|---|---|---|\n| 4 | 22.70 | 11.25 |\n| 8 | 32.11 | 10.09 |\n"
    assert missing_figures({"columns": ["closed form"], "text": table}, [output]) == []
    assert missing_figures({"columns": None, "text": table}, [output]) == ["4", "22.70", "32.11"]
    assert missing_pieces(["step: 13.75 s (scheduled; sum 11.25, ...), bound: compute", "1 8 1.779 ... 74.3"],
                          output) == []
    assert missing_pieces(["step: 11.25 s (scheduled; ..."], output) == ["step: 11.25 s (scheduled;"]
    doc = "a\n<!-- figures: jax-scaling plan -->\n<!-- figures: jax-scaling validate -->\nx 1.5\n<!-- /figures -->\n"
    assert figure_regions(doc) == [{"line": 2, "commands": ["jax-scaling plan", "jax-scaling validate"],
                                    "columns": None, "text": "x 1.5"}]
    assert excerpts("```\n$ jax-scaling plan \\\n    --chips 8\nout ... put\n```\n") == [
        {"line": 2, "command": "jax-scaling plan --chips 8", "output": ["out ... put"]}]
    with pytest.raises(AssertionError, match="runs no compile"):
        run("jax-scaling plan --verify-top 1")
    with pytest.raises(AssertionError, match="not a closed-form command"):
        run("jax-scaling check --devices cpu:8")
