"""Closed forms against the compiled program, term by term: ``jax-scaling check``, plan verification
(plan --verify-top, answer --verify-pipeline); the grids the tests and notebooks compile are verify.grids'.

The closed-form side is ``scaling.step.program.predict``; the compiled side compiles the same step with
``ffn_model.compile.abstract_compile`` for the chosen devices (emulated CPU, or any TPU topology
libtpu compiles for, ahead of time) and reads it back with ``verify.hlo.read_compiled``.

A compiled figure is never adjusted: where the two differ, the note says which modelled term covers
the difference or what the program does that the closed form does not.
"""

from __future__ import annotations

import dataclasses
import sys

from ffn_model.attention import has_cudnn
from ffn_model.compile import abstract_compile
from mesh import ici_layout, make_mesh, mesh_shape
from mesh.devices import chip_of_devices, has_cuda_plugin, use_cpu_platform_for
from scaling.step import program
from scaling.planner import plan as planner
from scaling.reports.answers import Answers, model_name
from scaling.families.ffn import FFNConfig
from scaling.core.mesh_shape import MESH_AXES, MeshShape, parse_mesh_spec
from scaling.core.schedule import Schedule, runs_attention
from scaling.hardware.chips import CHIPS, DEFAULT_CHIP, Chip, get_chip, slice_topology
from scaling.step.kernels import kernel_census
from scaling.step.pipeline import relay_moves
from scaling.core.kinds import Collective, Platform
from scaling.core.policies import Attention, Remat, Step
from scaling.core.table import table
from scaling.core.workload import Workload
from verify.cache import cached
from verify.grids import GRIDS
from verify.hlo import read_compiled
from verify.report import (CheckConfig, CheckReport, Collectives, Flops, Memory, Overlap, Row, Times, fmt)


def default_chip(devices) -> Chip:
    """The chip whose figures time a check: the devices' own chip (a TPU topology's, gpu:<chip>:<N>'s GPU), else
    (CPU devices) DEFAULT_CHIP: mesh.devices.chip_of_devices."""
    return chip_of_devices(devices)


def grid_workload(cfg, mesh: str, batch_tokens: int, remat: str = "none", step: str = "train",
                  schedule: Schedule = Schedule()) -> Workload:
    """A row of verify.grids' grids, (cfg, mesh spec, batch, remat, step[, schedule]), as the Workload it is."""
    return Workload(cfg, parse_mesh_spec(mesh), batch_tokens, step, remat, schedule)


def check(w: Workload, devices: str, chip: str | None = None, verbose: bool = False) -> CheckReport:
    """compare() (below), or the report an identical call already left in $VERIFY_CHECK_CACHE (verify.cache.cached,
    keyed by the call: the workload, the devices and the chip)."""
    return cached(repr((w, devices, chip)), lambda: compare(w, devices, chip, verbose))


def compare(w: Workload, devices: str, chip: str | None = None, verbose: bool = False) -> CheckReport:
    """Compile the workload's step for ``devices`` and compare it with the closed forms (scaling.step.program.predict)
    term by term: a verify.report.CheckReport of rows (closed form, compiled, ratio, note) for the FLOPs, memory,
    collective bytes per mesh axis and exposed bytes, with the closed form's times. The compiler facts of ``w``
    are replaced by those read from the program."""
    cfg, batch_tokens, remat, step, schedule = w.model, w.batch_tokens, w.remat, w.step, w.schedule
    mesh = make_mesh(w.mesh, devices, verbose)
    shape = mesh_shape(mesh)
    chip_ = get_chip(chip) if chip else default_chip(devices)
    layout = ici_layout(mesh, chip_)
    platform = mesh.devices.flat[0].platform
    widen = 4 if platform == Platform.CPU else 0  # XLA:CPU runs bf16 collectives in f32 (program.collective_volumes)
    w = w.replace(flags=w.flags.on(platform))  # XLA:CPU gets none of libtpu's flags: synchronous collectives
    res = abstract_compile(w, mesh)
    got = read_compiled(res.compiled, dict(shape))
    windowed, rule, merged, relays, joint = _program_facts(w.with_facts(min_comm_bytes=widen), got, chip_, layout,
                                                           platform)
    w = w.with_facts(min_comm_bytes=widen, windowed_grad_rs=windowed, merged_grad_allreduce=merged,
                     circular_relays=relays, joint_head_reduce=joint)
    w = w.with_facts(host_offload=platform != Platform.CPU,  # XLA:CPU keeps offloaded residuals in device memory
                     head_reduce_in_loop=platform == Platform.CPU,  # XLA:CPU reduces 1F1B's head accumulator per use
                     lookup_reduce_in_loop=platform != Platform.GPU,  # XLA:GPU its lookup's once, after the loop
                     gpu_layouts=platform == Platform.GPU)  # XLA:GPU's gathered-dimension-major layouts
    pred = program.predict(w, chip_, layout)

    config = CheckConfig(model=vars(cfg), model_text=str(cfg), devices=devices, mesh=shape.as_dict(),
                         batch_tokens=batch_tokens, remat=remat, step=step, schedule=vars(schedule), chip=chip_.name,
                         compile_seconds=res.compile_seconds, ici_layout=layout, windowed_grad_rs=windowed,
                         windowed_grad_rs_rule=rule, merged_grad_allreduce=merged, circular_relays=relays,
                         joint_head_reduce=joint, xla_flags=w.flags.name, xla_flags_gathers=str(w.flags.gathers),
                         platform=platform)
    f = pred.flops
    hidden = float(f.get("kernels", 0.0)) + cfg.custom_call_flops(f, platform)  # FLOPs no dot shows
    matmul = Row.of(f["total"] - hidden, got.dot_flops,
                    ("dot/convolution FLOPs × loop trip counts; closed form includes the first block's unused "
                     "input gradient where the program computes it (a scan runs one body for every block; one "
                     "block, or a peeled first trip, drops it)" if step == Step.TRAIN else
                     "dot/convolution FLOPs × loop trip counts")
                    + (f"; closed form less the {hidden:.4e} FLOPs inside custom-call kernels (the attention's, "
                       "the grouped matmul's: no dots to count)" if hidden else ""))
    if (why := cfg.uncompared_flops(platform)) is not None:  # shown, not compared (a kernel lowered otherwise)
        matmul = Row(matmul.closed_form, matmul.compiled, None, why)
    flops = Flops(
        matmul=matmul,
        cost_analysis=Row.of(f["total"], got.cost.get("flops"),
                             "XLA's cost_analysis counts a while-loop body once, not per trip"),
    )
    m, gm = pred.memory, got.memory
    args_cf = m["master"] + m.get("optimizer", 0.0) + m["inputs"] + (4 if step == Step.TRAIN else 0)
    peak = Row.of(m["total"], gm["peak_bytes"], _peak_note(cfg, step, windowed, remat)
                  + ("; + the gathered matrices the flags' schedule prefetches" if m.get("prefetched") else ""))
    if platform == Platform.CPU:  # shown, not compared
        peak = Row(peak.closed_form, peak.compiled, None,
                   "not compared: XLA:CPU's peak_memory_in_bytes is about the arguments alone "
                   "(XXL on cpu:64: 41.38 GB peak beside 44.40 GB of temp)")
    memory = Memory(
        arguments=Row.of(args_cf, gm["argument_bytes"],
                         "fp32 master (+ Adam mu, nu and the int32 step count) + the batch (bf16 x, fp32 y; "
                         "int32 ids, labels)"),
        peak=peak,
        temp=Row.of(None, gm["temp_bytes"]),
        outputs=Row.of(None, gm["output_bytes"]),
        aliases=Row.of(None, gm["alias_bytes"]),
        host=Row.of(None, gm.get("host_temp_bytes"), "pinned host memory: an offloading remat policy's residuals"),
    )
    collectives, overlap = _collective_rows(pred, got, windowed, rule, widen, platform)
    t = pred.times
    times = Times(math=t.math, comms=t.comms, step_sum=t.step["sum"], step_max=t.step["max"],
                  step_scheduled=t.step["scheduled"], exposed=t.exposed, copies=t.copies, bound=t.bound,
                  xla_optimal_seconds=got.cost.get("optimal_seconds"))
    return CheckReport(config, flops, memory, collectives, overlap, times, got.kernels,
                       kernel_census(w.replace(flags=w.flags.on(platform)), chip_))


def _program_facts(w: Workload, got, chip_: Chip, layout: dict, platform: str) -> tuple:
    """(windowed, rule, merged, relays, joint): the compiler facts read from the compiled program ``got``
    (verify.hlo.CompiledProgram) that the closed forms take (scaling.core.workload.CompilerFacts), and XLA's rule for
    the first (program.windowed_einsum_rs). A compiled figure is never adjusted: these say which program XLA
    built."""
    step, schedule = w.step, w.schedule
    # Which implementation of the gradient reduce-scatter XLA chose is a fact of the program: a
    # windowed einsum is a while loop XLA names windowed_dot_general_body_rs. The closed form models both; the
    # planner predicts it by XLA's rule (program.windowed_einsum_rs), held here against the program.
    windowed = step == Step.TRAIN and bool(got.windowed_rs_loops)
    rule = platform != Platform.CPU and program.windowed_einsum_rs(w, chip_, program.links(layout))
    # Likewise whether it reduces the weight gradients with one all-reduce over data·fsdp (TPU7x): an
    # all-reduce over both axes that carries more than the 4-byte loss.
    reduced_over = lambda axes: step == Step.TRAIN and any(  # noqa: E731 (an all-reduce over these, past the loss)
        c.kind == Collective.ALL_REDUCE and set(c.axes) == axes and c.volume > 4 for c in got.collectives)
    merged = reduced_over({"data", "fsdp"})
    # And, for a circular pipeline, whether it keeps the re-laid stacks for the backward (2 re-lays per
    # stack: forward, the gradient back) or re-lays them again: the collective-permutes over stage that run
    # once per step (the pipeline's own run every iteration), over the rounds of one re-lay of both stacks.
    relays = 2
    if schedule.repeats > 1 and step == Step.TRAIN:
        once = sum(c.count for c in got.collectives if c.kind == Collective.COLLECTIVE_PERMUTE and c.axes == ("stage",)
                   and c.count == 1)
        relays = round(once / (2 * relay_moves(w.mesh["stage"], schedule.repeats)))
    # And whether the pipeline's output-layer gradient is summed over stage and data (an MoE model's data and
    # expert) in one all-reduce (XLA:TPU): all-reduces over both, past the loss, beyond what the closed form without
    # the fact names there (an MoE model's dense layers first reduce their own gradients over data, stage and expert:
    # ffn_model.moe.outer_layers).
    named = w.model.forms.collective_volumes(w.with_facts(joint_head_reduce=False))  # (w's min_comm_bytes: compare's)
    joint = False
    for axes in ({"data", "stage"}, {"data", "stage", "expert"}):
        over = sum(c.volume * c.count for c in got.collectives if c.kind == Collective.ALL_REDUCE
                   and set(c.axes) == axes and c.volume > 4)
        known = named.get("+".join(a for a in MESH_AXES if a in axes), {}).get("all-reduce", 0.0)
        joint |= step == Step.TRAIN and over > 1.001 * known + 4
    return windowed, rule, merged, relays, joint


def _collective_rows(pred, got, windowed: bool, rule: bool, widen: int,
                     platform: str) -> tuple[Collectives, Overlap]:
    """compare's "collectives" (the closed form's bytes per mesh axis beside the compiled program's) and
    "overlap" (what no matmul runs beside, per axis) sections, from predict's ``pred`` and the program ``got``."""
    cb = got.collective_bytes
    cf_axes = pred.collective_bytes
    by_axis = {}
    for axis in sorted(set(cf_axes) | set(cb["by_axis"])):
        by_axis[axis] = Row.of(cf_axes.get(axis, 0.0), cb["by_axis"].get(axis, 0.0),
                               ("gradient reduce-scatter as a windowed einsum: X+1 chunks of V/X as "
                                "collective-permutes" if axis == "fsdp" and windowed else "")
                               + (f"; MISMATCH: XLA's rule (scaling.step.program.windowed_einsum_rs) "
                                  f"predicts windowed={rule}, the program windowed={windowed}"
                                  if axis == "fsdp" and rule != windowed else ""))
    collectives = Collectives(
        total_bytes=Row.of(sum(cf_axes.values()), cb["total"],
                           "Scaling Book volume V: the full array each collective spans"
                           + ("; XLA:CPU widens bf16 collectives to f32, modelled as 4 B/element" if widen else "")),
        by_axis=by_axis,
        by_kind=cb["by_kind"],
        closed_form_by_kind=pred.collectives,
        asynchronous=got.async_count,
        count=len(got.collectives),
    )
    ov = got.overlap
    overlap = Overlap(
        exposed={a: Row.of(pred.exposed_bytes.get(a, 0.0), ov["exposed"].get(a, 0.0),
                           "collectives no matmul runs beside in the schedule (verify.hlo, HloProgram.overlaps)")
                 for a in sorted(set(pred.exposed_bytes) | set(ov["exposed"]) | set(ov["overlapped"]))},
        overlapped=ov["overlapped"],
        overlapped_share={a: ov["overlapped"].get(a, 0.0) / v for a, v in cb["by_axis"].items() if v},
        loop_copies=Row.of(pred.loop_copy_bytes, got.loop_copy_bytes,
                           "gathered matrices copied into the rotated loop's state (across-blocks gathers)"),
    )
    if platform != Platform.TPU:
        overlap.note = (f"XLA:{platform.upper()} is given none of libtpu's flags and runs every collective "
                        "synchronously: exposed = all, under every flag set")
    return collectives, overlap


def _peak_note(cfg, step: str, windowed: bool, remat: str = "none") -> str:
    """What the closed-form peak adds up (scaling.step.memory / scaling.families.transformer memory_per_device): layers
    with attention (runs_attention(cfg)) or the FFN stack's blocks."""
    if runs_attention(cfg):
        return ("16 B/param/N + L layers' saved activations + the batch + "
                + ("one layer's gathered bf16 weights + its recomputed residuals" if remat == Remat.FULL else
                   "two layers' gathered bf16 weights + one layer's fp32 weight gradients"
                   + ("" if remat == Remat.NONE else " + one layer's recomputed residuals"))
                + " + the attention working set (scores of one layer or key block)"
                if step == Step.TRAIN else "master weights + one layer's gathered bf16 weights "
                "+ the attention working set + the batch")
    if step == Step.TRAIN:
        return ("16 B/param/N + saved activations + the batch + gathered bf16 weights: "
                + ("one matrix (windowed-einsum backward)" if windowed else "two blocks' W_in, W_out"))
    return "master weights + one gathered bf16 weight matrix + one block's activations + the batch"


def verify_plans(plans: list[planner.Plan], cfg, chip: Chip, chips: int, hbm: float | None = None,
                 verbose: bool = False, flags=None) -> list[planner.Plan]:
    """Compile each plan's train step (scaling.planner.plan.workload_of: its mesh, batch, remat and schedule) ahead of
    time and return the plans with their ``compiled`` (scaling.planner.plan.Compiled: the peak, whether it fits (peak <=
    hbm, the chip's usable HBM by default), the argument bytes, the devices and, on a TPU, the physical axes make_mesh
    gave each mesh axis); compiled under the XLA flags ``flags`` (scaling.core.flags). A TPU plan compiles for the
    chip's real topology of ``chips`` chips (hardware.slice_topology; one slice). A GPU plan compiles with XLA's GPU
    compiler for ``chips`` GPUs in nodes of GPU_NODE (gpu:<chip>:<N>, mesh.devices: the CUDA plugin's topology
    description, no GPU present). ValueError without the CUDA plugin or a compiler description of the GPU (XLA:CPU's
    peak is not a GPU's: docs/findings.md). This must be the process's first use of jax."""
    if chip.kind == Platform.TPU:
        if any(p.slices > 1 for p in plans):
            raise ValueError(f"--verify-top compiles one slice; {chips} {chip.name} chips are {plans[0].slices} "
                             "slices")
        devices = f"tpu:{chip.name}:{'x'.join(str(d) for d in slice_topology(chip, chips))}"
    elif not chip.gpu_target:
        raise ValueError(f"--verify-top compiles for GPUs with XLA's GPU compiler, and the hardware table has no "
                         f"compiler description of the {chip.name} (gpu_target); GPUs with one: "
                         + ", ".join(c.name for c in CHIPS.values() if c.gpu_target))
    elif not has_cuda_plugin():
        raise ValueError(f"--verify-top compiles for {chip.name} GPUs with XLA's GPU compiler, which needs jax's CUDA "
                         "plugin: `make answer` installs it (in .venv/cuda-aot), or pip install -e '.[cuda-aot]'")
    else:
        devices = f"gpu:{chip.name}:{chips}"
    hbm = hbm or chip.hbm_budget
    use_cpu_platform_for(devices)
    out = []
    for p in plans:
        print(f"compiling plan {_mesh_spec(p.mesh)} on {devices} ahead of time ...", file=sys.stderr, flush=True)
        mesh = make_mesh(MeshShape(p.mesh), devices, verbose)
        w, note = traceable(planner.workload_of(p, cfg, flags))
        if note:
            print(note, file=sys.stderr, flush=True)
        res = abstract_compile(w, mesh)
        memory = read_compiled(res.compiled, p.mesh).memory
        peak = memory["peak_bytes"]
        out.append(p.with_compiled(planner.Compiled(peak, peak is not None and peak <= hbm, memory["argument_bytes"],
                                                    devices,
                                                    ici_layout(mesh, chip) if chip.kind == Platform.TPU else None,
                                                    res.compile_seconds)))
    return out


def traceable(w: Workload) -> tuple[Workload, str | None]:
    """(``w``, None), or where its attention is cuDNN's and cuDNN cannot be traced here (ffn_model.attention.has_cudnn:
    no CUDA GPU among jax's devices; cuDNN's fused attention is traced with the CUDA libraries, also for a GPU
    compiled ahead of time) ``w`` with flash attention and the line saying so. Flash keeps what cuDNN's kernel keeps
    (o and the logsumexp, FlashAttention-2's form: scaling.core.schedule.BLOCKWISE), so the peak's closed form is the
    same. Call it with jax's platform chosen (mesh.devices.use_cpu_platform_for)."""
    if w.schedule.attention != Attention.CUDNN or has_cudnn():
        return w, None
    return (w.replace(schedule=dataclasses.replace(w.schedule, attention="flash")),
            "note: attention flash, not cudnn: cuDNN's fused attention is traced only with a CUDA GPU present")


def _mesh_spec(mesh: dict) -> str:
    return ",".join(f"{a}={n}" for a, n in mesh.items() if n > 1) or "1 device"


def verify_pipeline(ans: Answers, verbose: bool = False, flags=None) -> Answers:
    """(d)'s pipeline program (scaling.reports.answers.pipeline_program) compiled ahead of time for v5p (the
    question's chip) with the weights gathered once per microbatch and once per step: for each, the
    check report (collective bytes per axis and peak memory, closed form beside compiled). Added to
    ``ans.d.pipeline_program.gathers[gather].check``, in place."""
    pp = ans.d.pipeline_program
    i = ans.inputs
    cfg = FFNConfig(i.d_model, i.d_ff, i.blocks)
    topo = "x".join(str(n) for n in slice_topology(CHIPS[DEFAULT_CHIP], pp.chips))
    pp.devices = f"tpu:{DEFAULT_CHIP}:{topo}"
    for gather, g in pp.gathers.items():
        if g.error is not None:
            continue
        print(f"compiling the forward step for {pp.devices}, {pp.mesh}, weights gathered once per {gather} ...",
              file=sys.stderr, flush=True)
        w = Workload(cfg, parse_mesh_spec(pp.mesh), pp.batch_tokens, "forward",
                     schedule=Schedule(pp.microbatches, 1, gather), flags=flags)
        g.check = check(w, pp.devices, verbose=verbose)
    return ans


def render_pipeline(ans: Answers) -> str:
    """verify_pipeline's table: per gather mode, the collective bytes per axis and the peak, closed form
    beside compiled."""
    pp, d = ans.d.pipeline_program, ans.d
    lines = [f"(d) pipeline, compiled: {d.pipeline_stages_why}.",
             f"Forward step of {model_name(ans.inputs)} on {pp.devices} as {pp.mesh}, M = {pp.microbatches} "
             f"microbatches, B = {pp.batch_tokens:,} tokens; per device:"]
    cells = []
    for gather, g in pp.gathers.items():
        if g.check is None:
            cells.append((gather, g.error or "not compiled", "", "", ""))
            continue
        rep = g.check
        rows = [(f"collectives.{a} bytes", r) for a, r in rep.collectives.by_axis.items()]
        rows.append(("memory.peak bytes", rep.memory.peak))
        cells += [(gather, name, fmt(r.closed_form), fmt(r.compiled), "-" if r.ratio is None else f"{r.ratio:.4f}")
                  for name, r in rows]
    lines += ["  " + line for line in table(("weights gathered once per", "quantity", "closed form", "compiled",
                                             "ratio"), cells, right=(2, 3, 4))]
    per_mb, per_step = (pp.gathers[g].check for g in ("microbatch", "step"))
    if per_mb and per_step:
        a, b = (r.collectives.by_axis["fsdp"].compiled for r in (per_mb, per_step))
        T = pp.microbatches + ans.inputs.stages - 1
        lines.append(f"Gathered once per step, the program moves {b / 1e9:.3g} GB over fsdp, 1/{a / b:.3g} of the "
                     f"{a / 1e9:.3g} GB it moves gathering per microbatch (T = M + S - 1 = {T} pipeline iterations, "
                     "each gathering every block of its stage): the program does gather each weight once per step. "
                     f"The price is memory: {per_step.memory.peak.compiled / 1e9:.3g} GB peak against "
                     f"{per_mb.memory.peak.compiled / 1e9:.3g} GB (the stage's "
                     f"{ans.inputs.blocks // ans.inputs.stages} blocks held gathered).")
    return "\n".join(lines)


def flag_grid(grids=("TPU_GRID", "TPU_MID_GRID"), sets=("default", "maxtext", "overlap")) -> list[dict]:
    """Each row of the named grids (verify.grids.GRIDS; ValueError for a name it lacks) compiled under each XLA flag
    set (compare with ``w.replace(flags=...)``): {"devices", "row", "flags", "exposed": {axis: Row}, "loop_copies":
    Row, "peak": Row}, its lines on stderr while it runs (docs/findings.md, "Compiler flags", is this over TPU_GRID
    and TPU_MID_GRID)."""
    unknown = [name for name in grids if name not in GRIDS]
    if unknown:
        raise ValueError(f"no grid {', '.join(unknown)} in verify.grids; its grids: {', '.join(GRIDS)}")
    out = []
    for name in grids:
        for row in GRIDS[name]:
            devices, rest = (row[0], row[1:]) if isinstance(row[0], str) else ("cpu:8", row)
            for flags in sets:
                rep = compare(grid_workload(*rest).replace(flags=flags), devices)
                r = {"devices": devices, "row": f"{rest[0].d_model}x{rest[0].d_ff}x{rest[0].blocks} "
                     + " ".join(map(str, rest[1:])), "flags": flags, "exposed": rep.overlap.exposed,
                     "loop_copies": rep.overlap.loop_copies, "peak": rep.memory.peak}
                out.append(r)
                print(f"{devices:14} {r['row'][:60]:60} {flags:8} exposed "
                      + " ".join(f"{a} {fmt(e.ratio)}" for a, e in r["exposed"].items())
                      + f"; copies {fmt(r['loop_copies'].closed_form)} / {fmt(r['loop_copies'].compiled)}"
                      + f"; peak {fmt(r['peak'].ratio)}", file=sys.stderr, flush=True)
    return out
