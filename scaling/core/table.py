"""The one table formatter of the package's text output: aligned plain-text columns, rendered by rich
(rich.table.Table without borders, colour or markup; imported when a table is drawn, so importing the closed
forms stays instant)."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = (),
          gap: int = 2) -> list[str]:
    """The lines of a table: ``header`` then ``rows``, cells as str(cell) taken literally (no markup), columns
    as wide as their widest cell, ``gap`` spaces apart, left aligned but the column indices in ``right``."""
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(box=None, pad_edge=False, padding=(0, gap, 0, 0), show_header=True, header_style=None)
    justify = ["right" if i in right else "left" for i in range(len(header))]
    for name, j in zip(header, justify):
        t.add_column(Text(str(name), justify=j), justify=j, no_wrap=True)
    for row in rows:
        t.add_row(*(Text(str(c), justify=j) for c, j in zip(row, justify)))
    widths = [max(cell_len(str(c)) for c in col) for col in zip(header, *rows)]
    console = Console(width=sum(widths) + gap * len(widths) + 1, color_system=None, highlight=False, emoji=False)
    with console.capture() as cap:
        console.print(t, crop=False, soft_wrap=False)
    return [line.rstrip() for line in cap.get().splitlines()]


WIDTH = 160  # the widest line a command prints: a table folds above it (fold), prose wraps at PROSE


PROSE = 120


def fold(header: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = (), keep: int = 1,
         width: int = WIDTH) -> list[str]:
    """``table``, or where it would be wider than ``width``, several tables one under another (a blank line
    between), each with the first ``keep`` columns and as many of the next ones as fit (folds)."""
    out = []
    for block in folds(header, rows, right, keep, width):
        out += ([""] if out else []) + block
    return out


def folds(header: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = (), keep: int = 1,
          width: int = WIDTH) -> list[list[str]]:
    """The lines of ``table``, as one block where they fit in ``width`` columns, else as several tables (blocks),
    each with the first ``keep`` columns and as many of the next ones as fit; each block's lines are its header
    and one line per row, in the order of ``rows``."""
    lines = table(header, rows, right)
    if max(map(len, lines), default=0) <= width:
        return [lines]
    cols = [[str(h), *(str(r[i]) for r in rows)] for i, h in enumerate(header)]
    widths = [max(map(len, c)) + 2 for c in cols]
    out, i = [], keep
    while i < len(header):
        j, used = i, sum(widths[:keep])
        while j < len(header) and (j == i or used + widths[j] <= width):
            used += widths[j]
            j += 1
        idx = [*range(keep), *range(i, j)]
        out.append(table([header[k] for k in idx], [[r[k] for k in idx] for r in rows],
                         [n for n, k in enumerate(idx) if k in right]))
        i = j
    return out


def prose(text: str, width: int = PROSE) -> str:
    """``text`` with each line longer than ``width`` wrapped at spaces, its continuation lines indented two
    spaces past the line's own indent; a time stays with its unit (never "3.697" at a line's end, "us" on the
    next)."""
    import re
    import textwrap

    out = []
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip(" "))
        glued = re.sub(r"(\d) (s|ms|us|ns)\b", "\\1\0\\2", line)  # NUL: not a space textwrap breaks at
        out += ([w.replace("\0", " ") for w in textwrap.wrap(
            glued, width, subsequent_indent=" " * (indent + 2), break_on_hyphens=False, break_long_words=False)]
                or [""]) if len(line) > width else [line]
    return "\n".join(out)


def abbreviated(rows: Sequence[Sequence[object]], col: int, width: int) -> tuple[list[list[object]], list[str]]:
    """``rows`` with each text of column ``col`` longer than ``width`` cut at a space to its first words, "..." and
    a reference "[k]" (within ``width``; rows with the same text share k), and the notes "[k] whole text", wrapped
    (prose): a table of long notes stays within a terminal and each note is read whole below it."""
    refs: dict[str, int] = {}
    out = []
    for r in rows:
        r = list(r)
        text = str(r[col])
        if len(text) > width:
            ref = f"[{refs.setdefault(text, len(refs) + 1)}]"
            head = text[: max(width - len(ref) - 5, 1)]
            r[col] = f"{head.rsplit(' ', 1)[0] if ' ' in head else head} ... {ref}"
        out.append(r)
    return out, [prose(f"[{k}] {text}") for text, k in refs.items()]


UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))  # a time's units, largest first


def time_unit(seconds: float) -> tuple[str, float]:
    """(name, seconds per unit) of the largest of UNITS (s, ms, us, ns) in which |seconds| is at least 1; ns below
    1 ns, s for 0 (and for what is not finite)."""
    x = abs(seconds)
    if x == 0 or x != x or x == float("inf"):
        return UNITS[0]
    return next(((u, f) for u, f in UNITS if x >= f), UNITS[-1])


def in_unit(seconds: float, unit: tuple[str, float]) -> str:
    """``seconds`` as a number of ``unit`` (time_unit's pair), without the unit's name: 4 significant digits, no
    exponent (a figure under 1e-4 of the unit as "<0.0001", 0 as "0")."""
    x = seconds / unit[1]
    if x == 0 or abs(x) >= 1e-4:
        text = f"{x:.4g}"
        return text if "e" not in text else f"{x:.0f}"
    return "<0.0001" if x > 0 else ">-0.0001"


def time_text(seconds: float) -> str:
    """A time a person reads: 4 significant digits in its own unit (time_unit: 2.216 s, 212.5 us, 4.766 ns), under
    1 ns two significant digits of ns (0.27 ns), under 0.01 ns "<0.01 ns", 0 as "0 s"."""
    unit = time_unit(seconds)
    if unit[0] == "ns" and 0 < abs(seconds) < 1e-9:
        return f"{seconds * 1e9:.2g} ns" if abs(seconds) >= 1e-11 else "<0.01 ns"
    return f"{in_unit(seconds, unit)} {unit[0]}"


def footnoted(rows: Sequence[Sequence[object]], col: int) -> tuple[list[list[object]], list[str]]:
    """``rows`` with the text of column ``col`` replaced by a reference "[k]" (rows with the same text share k),
    and the footnotes "[k] text", wrapped (prose): a table of long notes stays as narrow as its figures."""
    refs: dict[str, int] = {}
    out = []
    for r in rows:
        r = list(r)
        if r[col]:
            r[col] = f"[{refs.setdefault(str(r[col]), len(refs) + 1)}]"
        out.append(r)
    return out, [prose(f"[{k}] {text}") for text, k in refs.items()]
