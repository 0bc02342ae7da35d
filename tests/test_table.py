"""The one table formatter of the text output (scaling.core.table)."""


def test_one_table_formatter_aligns_and_takes_cells_literally():
    """scaling.core.table.table: columns as wide as their widest cell, two spaces apart, right-aligned where asked;
    brackets are text, not markup (seed 001's cells read 'ours [seed's]a')."""
    from scaling.core.table import table

    lines = table(["layer", "fwd", "note"], [["fc1", "1.5", "[b]a"], ["attend", "100000", "x"]], right=(1,))
    assert lines == ["layer      fwd  note",
                     "fc1        1.5  [b]a",
                     "attend  100000  x"]
