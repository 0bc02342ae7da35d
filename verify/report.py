"""``jax-scaling check``'s result: a ``CheckReport`` of typed rows (closed form, compiled, ratio, note), grouped
as the comparison reads them (config, FLOPs, memory terms, collectives per mesh axis, overlap, times), with
``to_json`` (the --json object and $VERIFY_CHECK_CACHE's), ``from_json`` and ``render`` (the side-by-side table).

verify.check.compare builds it; nothing here compiles or imports jax. A compiled figure is never adjusted: a
row holds what the program says beside what the closed form says, and the ratio of the two.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scaling.step import pipeline
from scaling.hardware.chips import get_chip
from scaling.core.mesh_shape import MeshShape
from scaling.core.policies import Attention, ContextStrategy, Pipeline
from scaling.core.schedule import Schedule
from scaling.core.table import PROSE, abbreviated, prose, table, time_text


def ratio(closed, compiled) -> float | None:
    """compiled / closed; None where either is missing, 1 where both are 0, inf where only the closed form is."""
    if closed is None or compiled is None:
        return None
    if closed == 0:
        return 1.0 if compiled == 0 else math.inf
    return compiled / closed


@dataclass
class Row:
    """One quantity: the closed form's figure, the compiled program's, compiled/closed (ratio) and the note
    naming the term that covers the difference (None where a side is not compared)."""

    closed_form: float | None
    compiled: float | None
    ratio: float | None
    note: str = ""

    @classmethod
    def of(cls, closed, compiled, note: str = "") -> Row:
        """A row with its ratio: compiled / closed (ratio() above)."""
        return cls(closed, compiled, ratio(closed, compiled), note)

    def to_json(self) -> dict:
        """{"closed_form", "compiled", "ratio", "note"}."""
        return {"closed_form": self.closed_form, "compiled": self.compiled, "ratio": self.ratio, "note": self.note}

    @classmethod
    def from_json(cls, d: dict) -> Row:
        """The row to_json wrote."""
        return cls(d["closed_form"], d["compiled"], d["ratio"], d["note"])


def _rows(d: dict) -> dict:
    return {k: v.to_json() for k, v in d.items()}


def _rows_of(d: dict) -> dict:
    return {k: Row.from_json(v) for k, v in d.items()}


@dataclass
class CheckConfig:
    """What was compiled and how: the model (its fields and its text), devices, mesh, batch, remat, step,
    schedule, the chip timing it, the compile time, the ICI layout of each mesh axis, the compiler facts read
    from the program (scaling.core.workload.CompilerFacts), the XLA flag set and the platform."""

    model: dict
    model_text: str
    devices: str
    mesh: dict
    batch_tokens: int
    remat: str
    step: str
    schedule: dict
    chip: str
    compile_seconds: float
    ici_layout: dict
    windowed_grad_rs: bool
    windowed_grad_rs_rule: bool
    merged_grad_allreduce: bool
    circular_relays: int
    joint_head_reduce: bool
    xla_flags: str
    xla_flags_gathers: str
    platform: str

    def to_json(self) -> dict:
        """The fields in order (the model and schedule as their field dicts)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class Flops:
    """Matmul FLOPs: dot/convolution FLOPs times loop trips (matmul) and XLA's cost_analysis (cost_analysis)."""

    matmul: Row
    cost_analysis: Row


@dataclass
class Memory:
    """Bytes per device: arguments and peak compared; temp, outputs and aliases shown (compiled only)."""

    arguments: Row
    peak: Row
    temp: Row
    outputs: Row
    aliases: Row
    # pinned host memory the program uses (an offloading remat policy's residuals; compiled only), shown where > 0
    host: Row = dataclasses.field(default_factory=lambda: Row(None, None, None, ""))


@dataclass
class Collectives:
    """Collective bytes (Scaling Book volume V): the total and per mesh axis (rows), the compiled bytes per HLO
    kind, the closed form's per kind, how many collectives the program has and how many are asynchronous."""

    total_bytes: Row
    by_axis: dict[str, Row]
    by_kind: dict
    closed_form_by_kind: dict
    asynchronous: int
    count: int

    def to_json(self) -> dict:
        """Today's keys: total_bytes, by_axis, by_kind, closed_form_by_kind, async, count."""
        return {"total_bytes": self.total_bytes.to_json(), "by_axis": _rows(self.by_axis), "by_kind": self.by_kind,
                "closed_form_by_kind": self.closed_form_by_kind, "async": self.asynchronous, "count": self.count}

    @classmethod
    def from_json(cls, d: dict) -> Collectives:
        """The collectives to_json wrote."""
        return cls(Row.from_json(d["total_bytes"]), _rows_of(d["by_axis"]), d["by_kind"], d["closed_form_by_kind"],
                   d["async"], d["count"])


@dataclass
class Overlap:
    """Per mesh axis, the bytes no matmul runs beside (exposed rows), the compiled bytes overlapped and their
    share, the gathered matrices copied into a rotated loop's state (loop_copies), and a note (XLA:CPU)."""

    exposed: dict[str, Row]
    overlapped: dict
    overlapped_share: dict
    loop_copies: Row
    note: str | None = None

    def to_json(self) -> dict:
        """exposed, overlapped, overlapped_share, loop_copies, and note where there is one."""
        out = {"exposed": _rows(self.exposed), "overlapped": self.overlapped,
               "overlapped_share": self.overlapped_share, "loop_copies": self.loop_copies.to_json()}
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_json(cls, d: dict) -> Overlap:
        """The overlap to_json wrote."""
        return cls(_rows_of(d["exposed"]), d["overlapped"], d["overlapped_share"], Row.from_json(d["loop_copies"]),
                   d.get("note"))


@dataclass
class Times:
    """The closed form's times on the chip (scaling.step.program.predict's StepTimes): T_math, T_comms per axis, the
    step as sum, max and scheduled, the exposed comms, the loop copies, the bound; and XLA:TPU's own
    cost_analysis optimal_seconds (None on CPU; not a step time)."""

    math: float
    comms: dict
    step_sum: float
    step_max: float
    step_scheduled: float
    exposed: dict
    copies: float
    bound: str
    xla_optimal_seconds: float | None


@dataclass
class CheckReport:
    """The closed forms beside the compiled program, term by term (verify.check.compare)."""

    config: CheckConfig
    flops: Flops
    memory: Memory
    collectives: Collectives
    overlap: Overlap
    times: Times
    kernels: dict = dataclasses.field(default_factory=dict)  # the compiled program's, by kind (HloProgram.kernels)
    # the step model's, by the same kinds (scaling.step.kernels.kernel_census)
    kernels_described: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        """{"config", "flops", "memory", "collectives", "overlap", "times", "kernels"}: each row {closed_form,
        compiled, ratio, note}, kernels {kind: {count, bytes}}; check --json prints it."""
        return {"config": self.config.to_json(),
                "flops": {k: getattr(self.flops, k).to_json() for k in _names(Flops)},
                "memory": {k: getattr(self.memory, k).to_json() for k in _names(Memory)},
                "collectives": self.collectives.to_json(), "overlap": self.overlap.to_json(),
                "times": dataclasses.asdict(self.times), "kernels": self.kernels,
                "kernels_described": self.kernels_described}

    @classmethod
    def from_json(cls, d: dict) -> CheckReport:
        """The report to_json wrote."""
        return cls(CheckConfig(**d["config"]), Flops(**_rows_of(d["flops"])), Memory(**_rows_of(d["memory"])),
                   Collectives.from_json(d["collectives"]), Overlap.from_json(d["overlap"]), Times(**d["times"]),
                   d.get("kernels", {}), d.get("kernels_described", {}))

    def render(self) -> str:
        """The side-by-side table (quantity, closed form, compiled, ratio, note: a long note's first words and a
        reference [k] to it, printed whole below the table: scaling.core.table.abbreviated) and the collectives, overlap
        and times; prose wrapped at 120 columns (scaling.core.table.prose), times in units a person reads
        (time_text)."""
        cfg, t = self.config, self.times
        lines = [prose(f"{cfg.step} step, {cfg.model_text}, mesh {MeshShape(cfg.mesh)}, B={cfg.batch_tokens:,} "
                       f"tokens, remat {cfg.remat}, devices {cfg.devices} (compiled in {cfg.compile_seconds:.1f} s)"),
                 *(prose(f"  {part}") for part in _schedule_text(cfg).split("; ") if part),  # one line each
                 prose(f"chip figures for the times: {get_chip(cfg.chip).describe()}"),
                 f"XLA flags {cfg.xla_flags!r} (FSDP gathers {cfg.xla_flags_gathers} on {cfg.platform})"]
        rows = [(f"{a}.{b}", getattr(getattr(self, a), b)) for a, b in ROW_ORDER]
        rows += [(f"collectives.by_axis.{k}", v) for k, v in self.collectives.by_axis.items()]
        rows += [(f"exposed.{k}", v) for k, v in self.overlap.exposed.items()]
        rows.append(("loop_copies", self.overlap.loop_copies))
        rows += [(f"memory.{k}", getattr(self.memory, k)) for k in ("temp", "outputs", "aliases")]
        rows += [("memory.host", self.memory.host)] if self.memory.host.compiled else []
        cells = [(name, fmt(r.closed_form), fmt(r.compiled), "-" if r.ratio is None else f"{r.ratio:.4f}", r.note)
                 for name, r in rows]
        figures = max(map(len, table(("quantity", "closed form", "compiled", "ratio"), [c[:4] for c in cells])))
        cells, notes = abbreviated(cells, 4, max(PROSE - figures - 2, 30))  # long notes: their start, whole below
        lines += table(("quantity", "closed form", "compiled", "ratio", "note"), cells, right=(1, 2, 3))
        lines += ["notes:", *notes] if notes else []
        c = self.collectives
        lines.append(prose(f"collectives: {c.count} in the program, {c.asynchronous} asynchronous (start/done); by "
                           "kind: " + ", ".join(f"{k} {v:.4g}" for k, v in c.by_kind.items())))
        if self.kernels:
            lines.append(prose("kernels a run launches per device (compiled, by kind: count, bytes read and written): "
                               + ", ".join(f"{k} {v['count']:,.0f} ({v['bytes'] / 1e9:.4g} GB)"
                                           for k, v in self.kernels.items() if v["count"])))
        if self.kernels_described:
            d, got = self.kernels_described, self.kernels
            lines.append(prose("the step model's kernels beside them (scaling.step.kernels.kernel_census; compiled "
                               "/ model): " + ", ".join(
                                   f"{k} {v['count']:,.0f} ({v['bytes'] / 1e9:.4g} GB; "
                                   + (f"{got[k]['count'] / v['count']:.2f} / {got[k]['bytes'] / v['bytes']:.2f}"
                                      if v["count"] and k in got else "-") + ")"
                                   for k, v in d.items() if v["count"] or got.get(k, {}).get("count"))))
        share = self.overlap.overlapped_share
        lines.append(prose("overlapped by the schedule (compiled): " + (
            ", ".join(f"{a} {100 * v:.1f}% of its bytes" for a, v in share.items()) or "nothing")
                           + (f" ({self.overlap.note})" if self.overlap.note is not None else "")))
        lines.append(prose(f"times (chip {cfg.chip}, closed form): T_math {time_text(t.math)}; T_comms "
                           + ", ".join(f"{k} {time_text(v)}" for k, v in t.comms.items())
                           + f"; step sum {time_text(t.step_sum)}, max {time_text(t.step_max)}, scheduled "
                           f"{time_text(t.step_scheduled)} (exposed comms "
                           + (", ".join(f"{k} {time_text(v)}" for k, v in t.exposed.items()) or "none")
                           + f", loop copies {time_text(t.copies)}); bound: {t.bound}"))
        if cfg.devices.startswith("cpu"):
            lines.append(prose("  (peak memory is not compared on CPU devices: XLA:CPU's peak_memory_in_bytes is about "
                               "the arguments alone; compile for a TPU topology, --devices tpu:v5p:2x2x2, for the "
                               "peak)"))
            lines += [f"  (the ICI times are of the bytes a {cfg.chip} moves, bf16 as the precision policy says,",
                      "  not of XLA:CPU's f32-widened bytes above)"]
        if t.xla_optimal_seconds is not None:
            lines += ["XLA:TPU's cost-model estimate (cost_analysis optimal_seconds): "
                      f"{optimal_seconds_text(t.xla_optimal_seconds)}.",
                      "  Not a step time: like cost_analysis FLOPs it counts each while-loop body once (a scan over L "
                      "blocks as one block)"]
        return "\n".join(lines)


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


ROW_ORDER = [("flops", "matmul"), ("flops", "cost_analysis"), ("memory", "arguments"), ("memory", "peak"),
             ("collectives", "total_bytes")]


def fmt(x) -> str:
    """A figure of a report's table: 4 significant digits, exponent form from 1e4, "-" for None."""
    if x is None:
        return "-"
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.4e}"


def _schedule_text(cfg: CheckConfig) -> str:
    """The schedule part of the report's first line (empty for one pass without stages)."""
    sch, S = Schedule(**cfg.schedule), cfg.mesh["stage"]
    seq = "; sequence parallel over tensor" if sch.sequence_parallel else ""
    if "heads" in cfg.model:  # a transformer
        ring = cfg.mesh.get("context", 1) > 1 and sch.context == ContextStrategy.RING
        form = "flash" if ring else sch.attention
        seq += (f"; attention {form}" + (f" (key blocks of {sch.attention_block})" if form == Attention.FLASH else "")
                + (f", context {sch.context}" + (" (flash per chunk)" if ring else "")
                   if cfg.mesh.get("context", 1) > 1 else ""))
    if S == 1:
        return seq + (f"; {sch.microbatches} microbatches (gradient accumulation)" if sch.microbatches > 1 else "")
    bub = pipeline.bubble(sch, S)
    return (f"; pipeline of {S} stages, {sch.microbatches} microbatches, "
            + ({"gpipe": "GPipe", "1f1b": "1F1B"}.get(sch.pipeline, f"circular with {sch.repeats} repeats")
               if sch.pipeline != Pipeline.ONE_F_ONE_B or sch.repeats == 1
               else f"interleaved 1F1B with {sch.repeats} repeats")
            + f", weights gathered once per {sch.fsdp_gather}; bubble {bub['overhead']:.3f} of the ideal step, "
            f"{bub['idle_share']:.3f} of this one (" + (("2(S-1)/M, 2(S-1)/(M+2(S-1))" if sch.repeats == 1 else
                                                       "(R*S+S-2)/(R*M), (R*S+S-2)/(R*(M+S)+S-2)")
                                                      if sch.pipeline == Pipeline.ONE_F_ONE_B
                                                      else "(S-1)/(R*M), (S-1)/(R*M+S-1)")
            + ")")


def optimal_seconds_text(seconds: float) -> str:
    """XLA:TPU's cost_analysis ``optimal_seconds`` for a person: "12.3 s", "41.2 us" (scaling.core.table.time_text), or
    for a negative figure (v6e and TPU7x report some) "n/a (XLA reports -13.99, not meaningful)"; the JSON reports
    keep the raw figure."""
    return time_text(seconds) if seconds >= 0 else f"n/a (XLA reports {seconds:.4g}, not meaningful)"
