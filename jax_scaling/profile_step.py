"""Where a real device's step time goes, kernel by kernel: ``python -m jax_scaling.profile_step OUT.json bench
ARGS...``
runs the bench command (jax_scaling.cli) inside jax.profiler.trace and sums the device's kernel events (the
trace's /device:GPU:N or /device:TPU:N planes) by the HLO op that launched them (the events' hlo_op and
hlo_module stats; jax.profiler.ProfileData reads the trace). OUT.json: the bench report, the steps the trace
holds (warmup + steps), the device seconds per step summed over every kernel, and per HLO op of the step's
module its seconds per step, launches per step and kernel names, and the same per kernel name (a command
buffer's kernels carry the buffer's name as their op); for docs/findings.md ("One H200, measured")."""

from __future__ import annotations

import collections
import contextlib
import glob
import io
import json
import sys
import tempfile


def main(out: str, argv: list[str]) -> int:
    """Run ``jax-scaling bench`` (argv: ``bench`` and its flags) inside jax.profiler.trace and write OUT.json; a
    refused bench is its own one ``error:`` line and exit 2 (its flags are parsed before jax starts)."""
    from jax_scaling.args import model_config
    from jax_scaling.cli import main as cli
    from jax_scaling.cli import parser
    from jax_scaling.model_commands import check_flags

    argv = argv if "--json" in argv else [*argv, "--json"]  # the report is read back as bench's JSON
    try:  # bench's own checks that need no devices, before jax starts (as jax_scaling.cli.run prints them)
        args = parser().parse_args(argv)  # argparse's refusal: its one line, SystemExit(2)
        check_flags(args, model_config(args))
    except SystemExit as e:
        return e.code
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import jax
    from jax.profiler import ProfileData

    buf, d = io.StringIO(), tempfile.mkdtemp()
    with jax.profiler.trace(d), contextlib.redirect_stdout(buf):
        rc = cli(argv, prog="jax-scaling")
    lines = buf.getvalue().strip().splitlines()
    if rc or not lines:  # bench refused (its one error line is printed): no report to read
        return rc or 2
    rep = json.loads(lines[-1])
    runs = rep["warmup"] + rep["steps"]
    events = []  # (module, op, kernel, seconds) of every device kernel
    planes = set()
    for path in glob.glob(d + "/**/*.xplane.pb", recursive=True):
        for plane in ProfileData.from_file(path).planes:
            if not plane.name.startswith(("/device:GPU", "/device:TPU")):
                continue
            planes.add(plane.name)
            for line in plane.lines:
                for ev in line.events:
                    stats = dict(ev.stats)
                    events.append((str(stats.get("hlo_module", "")), str(stats.get("hlo_op", ev.name)), ev.name,
                                   ev.duration_ns / 1e9))
    modules = collections.Counter(e[0] for e in events)
    step = [m for m in modules if "step" in m]  # the train step's module (jit_step); else every event
    ops = collections.defaultdict(lambda: {"seconds": 0.0, "launches": 0, "kernels": set()})
    total = 0.0
    for module, name, kernel, sec in events:
        if step and module not in step:
            continue
        op = ops[name]
        op["seconds"] += sec / runs
        op["launches"] += 1 / runs
        op["kernels"].add(kernel[:80])
        total += sec / runs
    # inside a command buffer (a CUDA graph) the events carry the buffer's name as hlo_op: by kernel name too
    kernels = collections.defaultdict(lambda: {"seconds": 0.0, "launches": 0})
    others = collections.defaultdict(lambda: {"seconds": 0.0, "launches": 0})  # events of no step module
    for module, name, kernel, sec in events:
        k = kernels[kernel[:120]] if (module in step or not step) else others[f"{module}|{name}|{kernel[:60]}"]
        k["seconds"] += sec / runs
        k["launches"] += 1 / runs
    by_kernel = sorted(({"kernel": k, **v} for k, v in kernels.items()), key=lambda r: -r["seconds"])
    other = sorted(({"event": k, **v} for k, v in others.items()), key=lambda r: -r["seconds"])
    table = sorted(({"op": k, **v, "kernels": sorted(v["kernels"])[:3]} for k, v in ops.items()),
                   key=lambda r: -r["seconds"])
    json.dump({"bench": rep, "runs_traced": runs, "planes": sorted(planes), "modules": dict(modules),
               "kernel_seconds_per_step": total, "ops": table,
               "kernels": by_kernel[:400], "other_events": other[:100]}, open(out, "w"))
    print(f"{rep['step_seconds']:.4f} s a step, {total:.4f} s of kernels, {len(table)} ops; top:")
    for r in table[:25]:
        print(f"  {r['seconds'] * 1e3:9.3f} ms {r['launches']:7.1f}x  {r['op'][:50]:50s} {r['kernels'][0][:40]}")
    for r in by_kernel[:15]:
        print(f"  {r['seconds'] * 1e3:9.3f} ms {r['launches']:7.1f}x  {r['kernel'][:90]}")
    return rc


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "bench" or not sys.argv[1].endswith(".json"):
        print("error: usage: python -m jax_scaling.profile_step OUT.json bench [bench flags]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
