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
    between), each with the first ``keep`` columns and as many of the next ones as fit."""
    lines = table(header, rows, right)
    if max(map(len, lines), default=0) <= width:
        return lines
    cols = [[str(h), *(str(r[i]) for r in rows)] for i, h in enumerate(header)]
    widths = [max(map(len, c)) + 2 for c in cols]
    out, i = [], keep
    while i < len(header):
        j, used = i, sum(widths[:keep])
        while j < len(header) and (j == i or used + widths[j] <= width):
            used += widths[j]
            j += 1
        idx = [*range(keep), *range(i, j)]
        out += ([""] if out else []) + table([header[k] for k in idx], [[r[k] for k in idx] for r in rows],
                                             [n for n, k in enumerate(idx) if k in right])
        i = j
    return out


def prose(text: str, width: int = PROSE) -> str:
    """``text`` with each line longer than ``width`` wrapped at spaces, its continuation lines indented two
    spaces past the line's own indent."""
    import textwrap

    out = []
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip(" "))
        out += (textwrap.wrap(line, width, subsequent_indent=" " * (indent + 2), break_on_hyphens=False,
                              break_long_words=False) or [""]) if len(line) > width else [line]
    return "\n".join(out)


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
