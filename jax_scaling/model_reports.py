"""The commands that compile or measure, implemented here: ``compile`` and ``bench`` (the report and its
text). check, plan --verify-top, answer --verify-pipeline are verify.check's, trace --verify verify.trace's.
Imported (with verify, and so jax) only when such a command runs (jax_scaling.model_commands.run_command).
"""

from __future__ import annotations

import sys

from ffn_model.compile import abstract_compile
from jax_scaling.args import flags_of, schedule_of
from jax_scaling.processes import check_real_cpu_size, start_processes
from mesh import make_mesh, mesh_shape
from mesh.devices import infer_chip, parse_gpu_spec
from scaling.core.schedule import runs_attention
from scaling.core.mesh_shape import MeshShape
from scaling.core.policies import Attention
from scaling.hardware.chips import get_chip
from scaling.core.table import prose, time_text
from scaling.core.workload import Workload
from verify.bench import bench
from verify.report import optimal_seconds_text
from verify.hlo import read_compiled, refusal_error

COST_KEYS = ("flops", "bytes accessed", "transcendentals", "optimal_seconds")


def compile_report(args, cfg) -> dict:
    """``compile``: compile one step ahead of time and read it (verify.hlo.read_compiled)."""
    mesh = make_mesh(args.mesh, args.devices, args.verbose)
    schedule = schedule_of(args, mesh.devices.flat[0].platform)  # auto: the platform's attention
    w = Workload(cfg, mesh_shape(mesh), args.batch_tokens, args.step, args.remat, schedule, flags=flags_of(args))
    if getattr(args, "attention", None) in (None, Attention.AUTO):  # auto: flash where cuDNN's cannot be traced here
        from verify.check import traceable

        w, note = traceable(w)
        schedule = w.schedule
        if note:
            print(note, file=sys.stderr, flush=True)
    try:
        res = abstract_compile(w, mesh, args.verbose)
    except Exception as e:  # a program larger than the TPU's HBM: one line (verify.hlo.refusal_error)
        raise refusal_error(e) or e
    got = read_compiled(res.compiled, dict(mesh_shape(mesh)))
    check_gpu_fits(args.devices, got.memory.get("peak_bytes"))
    return {"command": "compile", "model": vars(cfg), "model_text": str(cfg),
            "mesh": mesh_shape(mesh).as_dict(), "devices": args.devices,
            "platform": mesh.devices.flat[0].platform, "batch_tokens": args.batch_tokens, "remat": args.remat,
            "step": args.step, "schedule": vars(schedule), "xla_flags": flags_of(args).name,
            "compile_seconds": res.compile_seconds, "memory": got.memory,
            "cost": {k: v for k, v in got.cost.items() if k in COST_KEYS}, "dot_flops": got.dot_flops,
            "collective_bytes": got.collective_bytes["by_axis"]}


def check_gpu_fits(devices, peak) -> None:
    """ValueError where a program compiled for GPUs (gpu:<chip>:<N>) peaks above the chip's usable HBM: XLA:GPU
    compiles it (it only warns that it cannot rematerialize below the limit), a GPU could not run it; XLA:TPU
    refuses such a program itself (verify.hlo.refusal_error)."""
    if not (isinstance(devices, str) and devices.strip().lower().startswith("gpu:")) or peak is None:
        return
    chip = parse_gpu_spec(devices)[0]
    if peak > chip.hbm_budget:
        raise ValueError(f"the program needs {peak / 1e9:.1f} GB per device (XLA:GPU's peak), more than the "
                         f"{chip.hbm_budget / 1e9:.1f} GB usable on one {chip.name}: shard it over more devices "
                         "(fsdp, tensor, stage), remat, or a smaller batch")


def print_compile(rep: dict) -> None:
    print(prose(f"{rep['step']} step of {rep.get('model_text', rep['model'])} on {rep['devices'] or rep['platform']} "
                f"mesh {MeshShape(rep['mesh'])}, B={rep['batch_tokens']:,} tokens, remat {rep['remat']}, "
                + (f"attention {rep['schedule']['attention']}, " if rep.get("model", {}).get("heads") else "")
                + f"XLA flags {rep.get('xla_flags', 'default')!r}: compiled in {rep['compile_seconds']:.1f} s"))
    for k, v in rep["memory"].items():
        print(f"  memory.{k:<21} {'-' if v is None else f'{v:,.0f} B ({v / 1e9:.3f} GB)'}  per device")
    print(f"  dot FLOPs x loop trips  {rep['dot_flops']:.6g} per device")
    for axis, v in rep["collective_bytes"].items():
        print(f"  collectives.{axis:<14} {v:.6g} B per device")
    for k, v in rep["cost"].items():
        text = optimal_seconds_text(v) if k == "optimal_seconds" else f"{v:.6g}"
        print(f"  cost.{k:<21} {text}"
              + ("  (XLA's cost_analysis: a while-loop body counted once)" if k == "flops" else ""))


def bench_report(args, cfg) -> dict:
    """``bench``: time the train step on this process's devices (or cpu:N) and report it."""
    mesh = make_mesh(args.mesh, start_processes(args), args.verbose)  # libtpu's start-up lines off stderr
    w = Workload(cfg, mesh_shape(mesh), args.batch_tokens, remat=args.remat,
                 schedule=schedule_of(args, mesh.devices.flat[0].platform),
                 flags=flags_of(args))
    check_real_cpu_size(args, w, mesh)
    dev = mesh.devices.flat[0]
    chip = get_chip(args.chip) if args.chip is not None else infer_chip(dev)
    rep = bench(w, mesh, args.steps, args.warmup, chip, args.seed)
    return {"command": "bench", "model": vars(cfg), "model_text": str(cfg),
            "mesh": mesh_shape(mesh).as_dict(), "devices": args.devices,
            "platform": dev.platform, "device_kind": dev.device_kind, "batch_tokens": args.batch_tokens,
            "attention": str(w.schedule.attention) if runs_attention(cfg) else None,
            "remat": args.remat, "steps": args.steps, "warmup": args.warmup, **rep}


def render_bench(rep: dict) -> str:
    """bench's text: the configuration, the chip figures, the step time (median), FLOPs, TFLOP/s, MFU and HFU, and
    the closed form's predicted step (max .. sum form, its terms); times in units a person reads
    (scaling.core.table.time_text), prose wrapped at 120 columns (scaling.core.table.prose)."""
    pct = lambda x: "n/a" if x is None else f"{100 * x:.3g}%"  # noqa: E731
    lines = [f"train step of {rep['model_text']} on {rep['device_kind']} mesh {MeshShape(rep['mesh'])}, "
             f"B={rep['batch_tokens']:,} tokens, remat {rep['remat']}, "
             + (f"attention {rep['attention']}, " if rep.get("attention") else "") + f"chip {rep['chip'] or 'n/a'}"]
    if rep["chip"]:
        lines.append(f"  chip figures: {get_chip(rep['chip']).describe()}")
    lines += [f"  step time   {time_text(rep['step_seconds'])}  (median of {rep['steps']} after {rep['warmup']} "
              "warmup)",
              f"  FLOPs/step  {rep['flops']['executed']:.4g} executed (the compiled program's), "
              f"{rep['flops']['model']:.4g} model",
              f"  TFLOP/s     {rep['tflops_per_s']:.4g} ({rep['tflops_per_s_per_device']:.4g} per device)",
              f"  MFU         {pct(rep['mfu'])}  (HFU {pct(rep['hfu'])})"]
    p = rep["predicted"]
    if p is None:
        lines.append("  predicted   n/a (no chip: pass --chip)")
    else:
        comms = ", ".join(f"{a} {time_text(t)}" for a, t in p["comms"].items()) or "none"
        lines.append(f"  predicted   {time_text(p['step_max'])} (max form) .. {time_text(p['step_sum'])} (sum form): "
                     f"math {time_text(p['math'])}, comms {comms}, HBM {time_text(p['hbm'])}; {p['bound']} bound")
    return "\n".join(map(prose, lines))


def print_bench(rep: dict) -> None:
    print(render_bench(rep))
