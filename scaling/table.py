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
