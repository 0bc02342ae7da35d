"""python -m scaling {answer, plan, check}: the closed forms on the command line.

Bad input prints one line on stderr and exits 2 (no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _answer(args) -> int:
    from scaling.answers import answers, render

    ans = answers(
        d_model=args.d_model, d_ff=args.d_ff, blocks=args.blocks, fsdp=args.fsdp, tensor=args.tensor, mx=args.mx,
        my=args.my, flops=args.flops, w_ici=args.w_ici, hbm=args.hbm, gpu_hbm=args.gpu_hbm,
        batch_tokens=args.batch_tokens, stages=args.stages,
    )
    print(json.dumps(ans, indent=2) if args.json else render(ans))
    return 0


def _plan(args) -> int:
    import time

    from scaling.config import get_preset
    from scaling.hardware import chips_in, get_chip, parse_slice, slice_name
    from scaling.plan import plan

    cfg = get_preset(args.preset).replace(d_model=args.d_model, d_ff=args.d_ff, blocks=args.blocks)
    if args.top <= 0:
        raise ValueError(f"--top must be a positive integer, got {args.top}")
    dims = None
    if args.slice is not None:
        if args.chips is not None:
            raise ValueError(f"--slice {args.slice} names the chip count already; leave out --chips")
        chip, dims = parse_slice(args.slice)
        if args.chip is not None and get_chip(args.chip) is not chip:
            raise ValueError(f"--slice {args.slice} is a {chip.name} slice, not {args.chip}")
        chips = chips_in(dims)
    else:
        chip, chips = get_chip(args.chip or "v5p"), 64 if args.chips is None else args.chips
    t0 = time.perf_counter()
    plans = plan(cfg, chip, chips, args.batch_tokens, hbm=args.hbm, remat=args.remat, form=args.form, dims=dims)
    seconds = time.perf_counter() - t0
    budget = args.hbm if args.hbm is not None else chip.hbm_budget
    name = slice_name(chip, chips)
    where = f"{chips} {chip.name} chips" + (f" ({name})" if name else "")
    if not plans:
        raise ValueError(f"no mesh of {where} fits {cfg} in {budget / 1e9:g} GB per chip (--hbm {budget:.4g} bytes)")
    if args.verify_top:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # ahead-of-time TPU compiles on this machine
        from scaling.check import verify_plans

        verify_plans(plans[: args.verify_top], cfg, chip, chips, args.remat, budget, verbose=args.verbose)
    if args.json:
        print(json.dumps({"plans": plans[: args.top], "count": len(plans), "enumerate_seconds": seconds,
                          "chip": chip.name, "chips": chips, "slice": name, "hbm_budget": budget}, indent=2))
        return 0
    other = "max" if args.form == "sum" else "sum"
    print(f"{len(plans)} meshes of {where} fit {budget / 1e9:g} GB per chip; B = {args.batch_tokens:,} tokens, "
          f"remat {args.remat} ({seconds * 1e3:.1f} ms)")
    print(f"chip figures: {chip.describe()}")
    print(f"Ranked by the {args.form} form" + (" (T_math + the ICI times; the compiled XXL forward step runs its "
          "collectives synchronously: README, finding for (c))" if args.form == "sum" else
          " (every collective overlapped with the math)") + f"; the {other} form beside it.")
    print("These are roofline bounds, not forecasts: step times are lower bounds, MFU and HFU upper bounds "
          "(MFU counts model FLOPs 6PB-2BDF, HFU the remat recompute too).")
    hdr = (f"{'#':>2} {'data':>4} {'fsdp':>5} {'tensor':>6} {'M_X':>3} {'M_Y':>3} {'step s ' + args.form:>10} "
           f"{'step s ' + other:>10} {'MFU ' + args.form:>7} {'MFU ' + other:>7} {'HFU':>5} {'bound':>10} "
           f"{'GB/dev':>7} {'crit B':>8}")
    if args.verify_top:
        hdr += f" {'compiled GB':>11} {'fits':>4}"
    print(hdr)
    for k, r in enumerate(plans[: args.top], 1):
        m = r["mesh"]
        crit = "never" if r["critical_batch"] is None else f"{r['critical_batch']:,.0f}"
        line = (f"{k:>2} {m['data']:>4} {m['fsdp']:>5} {m['tensor']:>6} {r['M_X']:>3} {r['M_Y']:>3} "
                f"{r['step_seconds_' + args.form]:>10.3f} {r['step_seconds_' + other]:>10.3f} "
                f"{r['mfu_' + args.form]:>7.3f} {r['mfu_' + other]:>7.3f} {r['hfu']:>5.2f} {r['bound']:>10} "
                f"{r['memory_bytes'] / 1e9:>7.1f} {crit:>8}")
        if "compiled_peak_bytes" in r:
            peak = r["compiled_peak_bytes"]
            line += f" {peak / 1e9 if peak else float('nan'):>11.1f} {'yes' if r['compiled_fits'] else 'no':>4}"
        print(line)
    return 0


def _check(args) -> int:
    from scaling.check import check, render
    from mesh.devices import device_count
    from scaling.config import check_divisible, get_preset, parse_mesh_spec
    from scaling.hardware import get_chip

    cfg = get_preset(args.preset).replace(d_model=args.d_model, d_ff=args.d_ff, blocks=args.blocks)
    # everything that needs no compiler first: a bad flag fails before anything is printed or compiled
    n = device_count(args.devices)
    check_divisible(cfg, parse_mesh_spec(args.mesh, n), args.batch_tokens)
    if args.chip is not None:
        get_chip(args.chip)
    if str(args.devices).strip().lower().startswith(("cpu:", "tpu:", "v5p")):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # emulated or ahead-of-time devices: probe no accelerator
    print(f"compiling the {args.step} step for {args.devices} ...", file=sys.stderr, flush=True)
    rep = check(cfg, args.devices, args.mesh, args.batch_tokens, args.remat, args.step, args.chip, verbose=args.verbose)
    print(json.dumps(rep, indent=2, default=str) if args.json else render(rep))
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit 2 (argparse's own status for bad usage)
        self.exit(2, f"error: {self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from scaling.answers import QUESTION as Q

    p = _Parser(prog="python -m scaling", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("answer", help="answers to the 4D-parallelism questions (a)-(d), derived")
    a.add_argument("--d-model", type=int, default=Q["d_model"], help="D (default %(default)s)")
    a.add_argument("--d-ff", type=int, default=Q["d_ff"], help="F (default %(default)s)")
    a.add_argument("--blocks", type=int, default=Q["blocks"], help="L (default %(default)s)")
    a.add_argument("--fsdp", type=int, default=Q["fsdp"], help="X, the FSDP size (default %(default)s)")
    a.add_argument("--tensor", type=int, default=Q["tensor"], help="Y, the TP size (default %(default)s)")
    a.add_argument("--mx", type=int, default=Q["mx"], help="M_X, ICI axes the FSDP axis spans (default %(default)s)")
    a.add_argument("--my", type=int, default=Q["my"], help="M_Y, ICI axes the TP axis spans (default %(default)s)")
    a.add_argument("--flops", type=float, default=Q["flops"], help="C, bf16 FLOP/s per chip (default %(default)g)")
    a.add_argument("--w-ici", type=float, default=Q["w_ici"], help="W_ici, bidirectional bytes/s (default %(default)g)")
    a.add_argument("--hbm", type=float, default=Q["hbm"], help="HBM bytes per TPU (default %(default)g)")
    a.add_argument("--gpu-hbm", type=float, default=Q["gpu_hbm"], help="HBM bytes per GPU (default %(default)g)")
    a.add_argument("--batch-tokens", type=int, default=Q["batch_tokens"],
                   help="stated global batch for the activation figures of (a), (b) (default %(default)s)")
    a.add_argument("--stages", type=int, help=f"pipeline stages for (d), a divisor of --fsdp (default {Q['stages']}, "
                   "or the largest divisor of --fsdp below it)")
    a.add_argument("--json", action="store_true", help="one JSON object instead of the text")
    a.set_defaults(func=_answer)

    p_ = sub.add_parser("plan", help="rank every (data, fsdp, tensor) mesh of a slice by predicted step time")
    p_.add_argument("--chip", help="chip from the hardware table (default v5p)")
    p_.add_argument("--chips", type=int, help="chip count (default 64)")
    p_.add_argument("--slice", help="a Cloud TPU slice instead of --chip/--chips, e.g. v5p-256 (TensorCores: 128 chips)")
    p_.add_argument("--preset", default="xxl", help="model preset (default %(default)s)")
    p_.add_argument("--d-model", type=int, help="override the preset's D")
    p_.add_argument("--d-ff", type=int, help="override the preset's F")
    p_.add_argument("--blocks", type=int, help="override the preset's L")
    p_.add_argument("--batch-tokens", type=int, default=25600, help="global batch in tokens (default %(default)s)")
    p_.add_argument("--hbm", type=float, help="HBM budget per chip in bytes (default: the table's usable HBM, 95e9 for v5p)")
    p_.add_argument("--remat", default="none", help="none | every-second | full (default %(default)s)")
    p_.add_argument("--form", default="sum", choices=["sum", "max"],
                    help="rank by the sum form (math + comms, what the compiled program supports) or the max form "
                         "(overlapped comms) (default %(default)s)")
    p_.add_argument("--top", type=int, default=10, help="rows to show (default %(default)s)")
    p_.add_argument("--verify-top", type=int, default=0, metavar="K",
                    help="compile the top K plans ahead of time for the real TPU topology and add their peak")
    p_.add_argument("--verbose", action="store_true", help="with --verify-top: let libtpu's start-up lines through")
    p_.add_argument("--json", action="store_true")
    p_.set_defaults(func=_plan)

    c = sub.add_parser("check", help="closed forms against the compiled program, term by term")
    c.add_argument("--devices", default="cpu:8", help="cpu:N (emulated), tpu:v5p:4x4x4 or v5p-128 (ahead of time)")
    c.add_argument("--mesh", default="data=2,fsdp=2,tensor=2", help="mesh spec (default %(default)s)")
    c.add_argument("--preset", default="small", help="model preset (default %(default)s)")
    c.add_argument("--d-model", type=int, help="override the preset's D")
    c.add_argument("--d-ff", type=int, help="override the preset's F")
    c.add_argument("--blocks", type=int, help="override the preset's L")
    c.add_argument("--batch-tokens", type=int, default=4096, help="global batch in tokens (default %(default)s)")
    c.add_argument("--remat", default="none", help="none | every-second | full (default %(default)s)")
    c.add_argument("--step", default="train", choices=["train", "forward"], help="(default %(default)s)")
    c.add_argument("--chip", help="chip for the time estimates (default v5p)")
    c.add_argument("--json", action="store_true")
    c.add_argument("--verbose", action="store_true", help="let libtpu's start-up lines through to stderr")
    c.set_defaults(func=_check)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
