"""Kernel tables: what single kernels measure on one chip (GEMMs by shape and dtype, pointwise kernels by bytes,
attention, collectives by message size), read from TOML. Tables ship as package data, one per chip
(scaling/data/kernels/<chip>.toml, found by chip name: kernel_table), or come from the user (``--kernel-table
FILE``: load_kernel_table); ``jax-scaling calibrate`` writes the same format. The step model takes its GPU GEMM
coefficients from a chip's table (scaling.step.kernels.gemm_coefficients): kernel-level data, not an end-to-end step.

The format (every figure in seconds, bytes, counts):
  chip = "H100"            # the hardware table's name (scaling/data/chips.toml)
  source = "..."           # where the figures come from
  launch_seconds = 4.0e-6  # optional: one tiny kernel's time inside a compiled program
  [gemm.bf16]              # one table per dtype (scaling.step.kernels.DTYPES); optional source = "..." per section
  rows = [[m, n, k, seconds], ...]                     # seconds per call of [m, k]·[k, n]
  [pointwise]
  rows = [[bytes_moved, seconds], ...]                 # bytes read + written by one elementwise kernel
  [attention.<implementation>]
  rows = [[batch, seq, heads, head_dim, causal, fwd_seconds, fwd_bwd_seconds], ...]
  [collectives.<all_gather | reduce_scatter | all_reduce | all_to_all | permute>]
  rows = [[devices, bytes, seconds], ...]
  [decode_attention.<implementation>]
  rows = [[batch, context, q_heads, kv_heads, head_dim, seconds], ...]  # one query token a sequence, bf16 KV cache
Pure Python (tomllib): no jax, no numpy.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

GEMM_DTYPES = ("bf16", "fp32", "tf32", "fp8", "int8")  # scaling.step.kernels.DTYPES (kept here: no numpy import)
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute")
_DIR = "data/kernels"  # the shipped tables (pyproject.toml [tool.setuptools.package-data])
# a section's row: its length, and which of its columns are seconds (> 0) — the others are sizes (> 0 too, but
# attention's causal flag, a boolean)
_ROWS = {"gemm": (4, (3,)), "pointwise": (2, (1,)), "attention": (7, (5, 6)), "collectives": (3, (2,)),
         "decode_attention": (6, (5,))}


@dataclass(frozen=True, eq=False)
class Section:
    """One measured table: its rows (tuples, as the file gives them) and its source (the file's where the section
    names none)."""

    rows: tuple[tuple, ...]
    source: str


@dataclass(frozen=True, eq=False)
class KernelTable:
    """A chip's kernel-level measurements (module docstring): ``gemm`` by dtype, ``pointwise``, ``attention`` by
    implementation, ``collectives`` by kind; ``path`` the file read. Compared by identity (the step model caches
    the coefficients it fits on a table by the table)."""

    chip: str
    source: str
    path: str
    launch_seconds: float | None = None
    gemm: dict = field(default_factory=dict)  # dtype -> Section of (m, n, k, seconds)
    pointwise: Section | None = None
    attention: dict = field(default_factory=dict)  # implementation -> Section
    collectives: dict = field(default_factory=dict)  # kind -> Section
    decode_attention: dict = field(default_factory=dict)  # implementation -> Section

    def to_json(self) -> dict:
        """The table as the file gives it (rows as lists), with its path."""
        def sec(s):
            return {"source": s.source, "rows": [list(r) for r in s.rows]}
        return {"chip": self.chip, "source": self.source, "path": self.path, "launch_seconds": self.launch_seconds,
                "gemm": {d: sec(s) for d, s in self.gemm.items()},
                "pointwise": None if self.pointwise is None else sec(self.pointwise),
                "attention": {a: sec(s) for a, s in self.attention.items()},
                "collectives": {c: sec(s) for c, s in self.collectives.items()},
                "decode_attention": {a: sec(s) for a, s in self.decode_attention.items()}}

    def render(self) -> str:
        """One line per section: its rows and source."""
        lines = [f"kernel table for {self.chip} ({self.path}): {self.source}"]
        for name, s in [*(("gemm." + d, s) for d, s in self.gemm.items()),
                        *([("pointwise", self.pointwise)] if self.pointwise else []),
                        *(("attention." + a, s) for a, s in self.attention.items()),
                        *(("collectives." + c, s) for c, s in self.collectives.items()),
                        *(("decode_attention." + a, s) for a, s in self.decode_attention.items())]:
            lines.append(f"  {name}: {len(s.rows)} rows ({s.source})")
        return "\n".join(lines)


def _bad(path: str, what: str) -> ValueError:
    return ValueError(f"kernel table {path}: {what}")


def _section(path: str, name: str, kind: str, value, default_source: str) -> Section:
    """A section's rows checked: each a list of _ROWS[kind]'s length, numbers (attention's causal a boolean),
    sizes and seconds > 0. ValueError naming the file, the section and the row otherwise."""
    if not isinstance(value, dict) or "rows" not in value:
        raise _bad(path, f"[{name}] needs rows = [[...], ...]")
    unknown = set(value) - {"rows", "source"}
    if unknown:
        raise _bad(path, f"[{name}] has unknown keys {sorted(unknown)} (rows, source)")
    length, seconds = _ROWS[kind]
    rows = value["rows"]
    if not isinstance(rows, list) or not rows:
        raise _bad(path, f"[{name}] rows must be a non-empty list of rows")
    out = []
    for i, row in enumerate(rows):
        where = f"[{name}] row {i + 1} {row!r}"
        if not isinstance(row, list) or len(row) != length:
            raise _bad(path, f"{where}: expected {length} values")
        for j, v in enumerate(row):
            if kind == "attention" and j == 4:
                if not isinstance(v, bool):
                    raise _bad(path, f"{where}: causal (value 5) must be true or false")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v or v == float("inf"):
                what = "seconds" if j in seconds else "sizes"
                raise _bad(path, f"{where}: {what} must be positive finite numbers (value {j + 1}: {v!r})")
        out.append(tuple(row))
    src = value.get("source", default_source)
    if not isinstance(src, str):
        raise _bad(path, f"[{name}] source must be a string")
    return Section(tuple(out), src)


def parse_kernel_table(data: dict, path: str) -> KernelTable:
    """A KernelTable of a TOML document's ``data`` (module docstring's format); ValueError naming ``path`` and what
    is wrong: a missing chip or source, an unknown key, dtype or collective, a bad row."""
    if not isinstance(data.get("chip"), str) or not data["chip"]:
        raise _bad(path, 'missing chip = "<name>" (the hardware table\'s chip)')
    if not isinstance(data.get("source"), str):
        raise _bad(path, 'missing source = "..." (where the figures come from)')
    unknown = set(data) - {"chip", "source", "launch_seconds", "gemm", "pointwise", "attention", "collectives",
                           "decode_attention"}
    if unknown:
        raise _bad(path, f"unknown keys {sorted(unknown)}; valid: chip, source, launch_seconds, gemm, pointwise, "
                         "attention, collectives, decode_attention")
    launch = data.get("launch_seconds")
    if launch is not None and (isinstance(launch, bool) or not isinstance(launch, (int, float)) or not launch > 0):
        raise _bad(path, f"launch_seconds must be a positive number, got {launch!r}")
    src = data["source"]
    gemm = {}
    for dtype, sec in _table(path, "gemm", data.get("gemm", {})).items():
        if dtype not in GEMM_DTYPES:
            raise _bad(path, f"[gemm.{dtype}]: unknown dtype {dtype!r}; valid: {', '.join(GEMM_DTYPES)}")
        gemm[dtype] = _section(path, f"gemm.{dtype}", "gemm", sec, src)
    attention = {a: _section(path, f"attention.{a}", "attention", sec, src)
                 for a, sec in _table(path, "attention", data.get("attention", {})).items()}
    collectives = {}
    for c, sec in _table(path, "collectives", data.get("collectives", {})).items():
        if c not in COLLECTIVES:
            raise _bad(path, f"[collectives.{c}]: unknown collective {c!r}; valid: {', '.join(COLLECTIVES)}")
        collectives[c] = _section(path, f"collectives.{c}", "collectives", sec, src)
    decode = {a: _section(path, f"decode_attention.{a}", "decode_attention", sec, src)
              for a, sec in _table(path, "decode_attention", data.get("decode_attention", {})).items()}
    pointwise = _section(path, "pointwise", "pointwise", data["pointwise"], src) if "pointwise" in data else None
    return KernelTable(data["chip"], src, path, None if launch is None else float(launch), gemm, pointwise,
                       attention, collectives, decode)


def _table(path: str, name: str, value) -> dict:
    if not isinstance(value, dict):
        raise _bad(path, f"[{name}] must be a table of sections ([{name}.<name>])")
    return value


def load_kernel_table(path) -> KernelTable:
    """The kernel table of the TOML file ``path`` (parse_kernel_table); ValueError naming --kernel-table and the file
    where it cannot be read, is not UTF-8 text (a binary file) or not TOML."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"--kernel-table {path}: cannot read it ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--kernel-table {path}: not TOML ({e})") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 text: a binary file (an image, a pickle, a .xlsx)
        raise ValueError(f"--kernel-table {path} is not a TOML text table: byte {e.start} (0x{e.object[e.start]:02x}) "
                         "is not UTF-8 text; give the TOML file calibrate writes") from None
    return parse_kernel_table(data, str(path))


_SHIPPED: dict[str, KernelTable | None] = {}


def kernel_table(chip_name: str) -> KernelTable | None:
    """The shipped table scaling/data/kernels/<chip_name>.toml, or None where none ships (read once)."""
    if chip_name not in _SHIPPED:
        f = resources.files("scaling").joinpath(_DIR, f"{chip_name}.toml")
        if not f.is_file():
            _SHIPPED[chip_name] = None
        else:
            with f.open("rb") as fh:
                t = parse_kernel_table(tomllib.load(fh), f"scaling/{_DIR}/{chip_name}.toml")
            if t.chip != chip_name:
                raise _bad(t.path, f"chip = {t.chip!r}, but the file is {chip_name}'s")
            _SHIPPED[chip_name] = t
    return _SHIPPED[chip_name]


_DECODE: dict[str, KernelTable | None] = {}


def decode_table(chip_name: str) -> KernelTable | None:
    """The shipped decode table scaling/data/kernels/decode/<chip_name>.toml (calibrate's decode section: weight-
    streaming GEMMs and decode attention), or None where none ships (read once)."""
    if chip_name not in _DECODE:
        f = resources.files("scaling").joinpath(_DIR, "decode", f"{chip_name}.toml")
        if not f.is_file():
            _DECODE[chip_name] = None
        else:
            with f.open("rb") as fh:
                _DECODE[chip_name] = parse_kernel_table(tomllib.load(fh), f"scaling/{_DIR}/decode/{chip_name}.toml")
    return _DECODE[chip_name]


def table_text(chip: str, source: str, rows: dict, skipped: list[str]) -> str:
    """A kernel table's TOML text, the format parse_kernel_table reads (what ``jax-scaling calibrate`` writes):
    ``rows`` {"launch": s, "gemm": {dtype: [[m, n, k, s]]}, "pointwise": [[bytes, s]], "attention": {impl: [[batch,
    seq, heads, head_dim, causal, fwd s, fwd+bwd s]]}, "collectives": {kind: [[devices, bytes, s]]}}; ``skipped``
    the jobs not measured, as a comment."""
    lines = [f'chip = "{chip}"', f'source = "{source}"']
    if "launch" in rows:
        lines.append(f"launch_seconds = {rows['launch']:.4e}")
    if skipped:
        lines.append(f"# not measured (budget or failure): {'; '.join(skipped)[:2000]}")

    def section(name, rs, note):
        if not rs:
            return
        lines.extend(["", f"[{name}]", f"# {note}", "rows = ["])
        lines.extend("  [" + ", ".join(_value(v) for v in r) + "],"
                     for r in rs)
        lines.append("]")

    for d, rs in rows.get("gemm", {}).items():
        section(f"gemm.{d}", rs, "m, n, k, seconds per call")
    if rows.get("pointwise"):
        section("pointwise", rows["pointwise"], "bytes read + written, seconds")
    for impl, rs in rows.get("attention", {}).items():
        section(f"attention.{impl}", rs, "batch, seq, heads, head_dim, causal, fwd_seconds, fwd_bwd_seconds")
    for kind, rs in rows.get("collectives", {}).items():
        section(f"collectives.{kind}", rs, "devices, bytes per device, seconds")
    for impl, rs in rows.get("decode_attention", {}).items():
        section(f"decode_attention.{impl}", rs, "batch, context, q_heads, kv_heads, head_dim, seconds")
    return "\n".join(lines) + "\n"


def _value(v) -> str:
    """One TOML value of a row: true/false, an integer, or a float in 5 significant digits."""
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:.4e}" if isinstance(v, float) else str(int(v))
