"""jax-scaling calibrate: time the kernels a step is made of on this machine's accelerator and write them as a kernel
table (TOML, the format scaling.hardware.kernel_tables reads; ``--kernel-table FILE`` on predict, plan, validate and
kernels).

What is measured and how: verify.calibrate. The jobs run in order of use (the launch time, bf16 squares,
pointwise, attention, the other dtypes' squares, the transformer-shape grid, collectives, decode), the table is
rewritten after every section, so a run cut short by ``--budget`` (seconds) keeps what it measured and says what it
skipped.
Without an accelerator: one line, exit 2 (``--allow-cpu`` measures the CPU, for tests of the command itself).
"""

from __future__ import annotations

import datetime
import os
import time

from scaling.hardware.kernel_tables import table_text
from scaling.core.kinds import Dtype, Platform
from scaling.core.limits import number

SECTIONS = ("launch", "gemm", "pointwise", "attention", "collectives", "decode")


def add_parser(sub) -> None:
    """calibrate's subcommand and flags."""
    c = sub.add_parser("calibrate", help="time GEMMs, pointwise kernels, attention and collectives on this "
                                         "machine's accelerator and write a kernel table (TOML)",
                       description=__doc__.split("\n\n")[0])
    c.add_argument("--out", required=True, help="the kernel table to write (TOML)")
    c.add_argument("--chip", default=None, help="the hardware-table chip the table is for (default: the device's)")
    c.add_argument("--budget", type=number, default=600.0, help="seconds to spend at most (default 600)")
    c.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    c.add_argument("--dtypes", default="bf16,tf32,fp32,fp8,int8", help="GEMM dtypes (default all five)")
    c.add_argument("--quick", action="store_true", help="a small grid (a minute): squares and a few shapes")
    c.add_argument("--allow-cpu", action="store_true", help="measure even on the CPU (tests of the command)")
    c.set_defaults(func=calibrate_command)


def _jobs(grid, sections, dtypes):
    """(section, key, params) in order of use (module docstring)."""
    jobs = []
    if "launch" in sections and grid.launch:
        jobs.append(("launch", None, None))
    squares = [s for s in grid.gemm.get("bf16", []) if s[0] == s[1] == s[2]]
    if "gemm" in sections and Dtype.BF16 in dtypes:
        jobs += [("gemm", "bf16", s) for s in squares]
    if "pointwise" in sections:
        jobs += [("pointwise", None, n) for n in grid.pointwise]
    if "attention" in sections:
        jobs += [("attention", None, a) for a in grid.attention]
    if "gemm" in sections:
        for d in dtypes:
            if d != Dtype.BF16:
                jobs += [("gemm", d, s) for s in grid.gemm.get(d, []) if s[0] == s[1] == s[2]]
        for d in dtypes:
            jobs += [("gemm", d, s) for s in grid.gemm.get(d, []) if not s[0] == s[1] == s[2]]
    if "collectives" in sections:
        from verify.calibrate import COLLECTIVES
        jobs += [("collectives", kind, b) for kind in COLLECTIVES for b in grid.collectives]
    if "decode" in sections:
        jobs += [("gemm", "bf16", s) for s in grid.decode_gemm]
        jobs += [("decode", impl, a) for a in grid.decode_attention for impl in _decode_impls()]
    return jobs


def _decode_impls() -> tuple[str, ...]:
    """The decode attention implementations timed: "xla", and "cudnn" where jax runs on an NVIDIA GPU."""
    import jax

    return ("xla", "cudnn") if jax.default_backend() == Platform.GPU else ("xla",)


def calibrate_command(args) -> int:
    """Run the grid's jobs (module docstring) with a progress bar and write the table."""
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        raise ValueError(f"--sections {args.sections!r}: comma-separated, of {', '.join(SECTIONS)}")
    from verify.calibrate import GEMM_DTYPES
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or any(d not in GEMM_DTYPES for d in dtypes):
        raise ValueError(f"--dtypes {args.dtypes!r}: comma-separated, of {', '.join(GEMM_DTYPES)}")
    from pathlib import Path

    out = Path(args.out)
    if not out.parent.is_dir():
        raise ValueError(f"--out {args.out}: its folder does not exist")

    if args.allow_cpu:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no probing for accelerators (libtpu's start-up)
    elif not has_accelerator():
        raise ValueError("calibrate times an accelerator's kernels and this machine has none (no NVIDIA driver, "
                         "no TPU device); --allow-cpu measures the CPU anyway")
    import jax

    from scaling.hardware.chips import chip_of_device_kind, get_chip
    from verify import calibrate as cal

    if jax.default_backend() == Platform.CPU and not args.allow_cpu:
        raise ValueError("calibrate times an accelerator's kernels and jax found none (its backend is cpu); "
                         "--allow-cpu measures the CPU anyway")
    desc = cal.device_description()
    chip = get_chip(args.chip) if args.chip else chip_of_device_kind(desc["device_kind"])
    chip_name = chip.name if chip else desc["device_kind"]
    grid = _quick_grid() if args.quick else cal.default_grid()
    if jax.device_count() < 2:
        sections = [s for s in sections if s != "collectives"]
    jobs = _jobs(grid, sections, dtypes)
    date = datetime.date.today().isoformat()
    source = (f"jax-scaling calibrate on {desc['device_kind']} ({desc['devices']} device(s), "
              f"driver {desc.get('driver', 'unknown')}, {desc.get('platform_version', desc['platform'])}), "
              f"jax {desc['jax']}, {date}")
    rows: dict = {}
    skipped: list[str] = []
    start = time.perf_counter()
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("calibrate", total=len(jobs))
        last = None
        for section, key, p in jobs:
            if last is not None and section != last:
                out.write_text(table_text(chip_name, source, rows, skipped))
            last = section
            label = f"{section} {key or ''} {p if p is not None else ''}".strip()
            bar.update(task, description=label[:60])
            if time.perf_counter() - start > args.budget:
                skipped.append(label)
                bar.advance(task)
                continue
            try:
                _run(cal, rows, section, key, p)
            except Exception as e:  # noqa: BLE001 - a kernel the device cannot run is reported, not fatal
                skipped.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            bar.advance(task)
    out.write_text(table_text(chip_name, source, rows, skipped))
    print(render_summary(rows, chip, skipped, out, time.perf_counter() - start))
    return 0


def has_accelerator() -> bool:
    """Whether the machine shows an accelerator to jax without starting it: an NVIDIA driver
    (/proc/driver/nvidia/version) or a TPU's device files (/dev/accel*, /dev/vfio/*: how libtpu finds its chips)."""
    import glob

    tpu = glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*")
    return os.path.exists("/proc/driver/nvidia/version") or bool(tpu)


def _run(cal, rows, section, key, p) -> None:
    """Measure one job into ``rows``."""
    if section == "launch":
        rows["launch"] = cal.launch_seconds()
    elif section == "gemm":
        rows.setdefault("gemm", {}).setdefault(key, []).append([*p, cal.gemm_seconds(key, *p)])
    elif section == "pointwise":
        rows.setdefault("pointwise", []).append([4 * p, cal.pointwise_seconds(p)])
    elif section == "attention":
        fwd, both, impl = cal.attention_seconds(*p)
        rows.setdefault("attention", {}).setdefault(impl, []).append([*p[:4], bool(p[4]), fwd, both])
    elif section == "decode":
        rows.setdefault("decode_attention", {}).setdefault(key, []).append([*p, cal.decode_attention_seconds(*p, key)])
    elif section == "collectives":
        import jax
        rows.setdefault("collectives", {}).setdefault(key, []).append(
            [jax.device_count(), p, cal.collective_seconds(key, p)])


def _quick_grid():
    from verify.calibrate import Grid

    sq = [(s, s, s) for s in (512, 1024, 2048, 4096)]
    return Grid(gemm={"bf16": sq + [(4096, 8192, 2048)], "tf32": sq[:2], "fp32": sq[:2], "fp8": sq[:2],
                      "int8": sq[:2]},
                pointwise=[2**e for e in range(12, 25, 4)],
                attention=[(4, 1024, 8, 64, True)], collectives=[2**16, 2**20],
                decode_gemm=[(1, 4096, 4096), (32, 14336, 4096)], decode_attention=[(8, 4096, 32, 8, 128)])


def render_summary(rows, chip, skipped, out, seconds) -> str:
    """A few lines: per dtype the best and the 4096³ TFLOP/s against the chip's peak, the pointwise bandwidth at
    the largest size, where the table went."""
    from scaling.step.kernels import peak_flops

    lines = [f"calibrate: {seconds:.0f} s; table written to {out}"]
    if "launch" in rows:
        lines.append(f"  launch (one tiny GEMM in a chain): {rows['launch'] * 1e6:.1f} us")
    for d, rs in rows.get("gemm", {}).items():
        best = max(rs, key=lambda r: 2 * r[0] * r[1] * r[2] / r[3])
        tf = 2 * best[0] * best[1] * best[2] / best[3] / 1e12
        peak = ""
        if chip is not None:
            try:
                peak = f" = {tf * 1e12 / peak_flops(chip, d):.3f} of the {d} peak"
            except ValueError:
                pass
        lines.append(f"  gemm {d}: {len(rs)} shapes; best {tf:.1f} TFLOP/s at {best[0]}x{best[1]}x{best[2]}{peak}")
    if rows.get("pointwise"):
        b, s = rows["pointwise"][-1]
        lines.append(f"  pointwise: {b / s / 1e9:.0f} GB/s at {b / 1e6:.0f} MB moved")
    for impl, rs in rows.get("attention", {}).items():
        lines.append(f"  attention ({impl}): {len(rs)} cases")
    for kind, rs in rows.get("collectives", {}).items():
        lines.append(f"  {kind}: {len(rs)} sizes")
    for impl, rs in rows.get("decode_attention", {}).items():
        b, t, _, kv, h, s = max(rs, key=lambda r: r[0] * r[1] * r[3] * r[4] / r[5])
        lines.append(f"  decode attention ({impl}): {len(rs)} cases; best {4 * b * t * kv * h / s / 1e9:.0f} GB/s "
                     f"(batch {b}, context {t})")
    if skipped:
        lines.append(f"  not measured: {len(skipped)} (listed in the table)")
    return "\n".join(lines)
