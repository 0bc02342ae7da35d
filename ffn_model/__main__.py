"""python -m ffn_model {train, compile}

  train    train the FFN stack on the synthetic regression task, printing step, loss and tokens/s
           (--json: one object at the end with the per-step losses). On real devices (GPU, or a TPU
           slice with the command launched on every host) the same command runs unchanged.
  compile  compile the train (or forward) step ahead of time from ShapeDtypeStructs and print the
           per-device memory and cost analysis (--json: one object).

Bad input (an unknown preset, mesh axis or device spec; a mesh whose size is not the device count;
a dimension not divisible by its shard count) prints one line "error: ..." on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from scaling.config import REMAT_POLICIES, get_preset, positive_float, positive_int


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit 2 (argparse's own status for bad usage)
        self.exit(2, f"error: {self.prog}: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ffn_model", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, preset, batch, help_ in [
        ("train", "small", 512, "train on the synthetic regression task"),
        ("compile", "xxl", 25600, "compile one step ahead of time and print its memory and cost analysis"),
    ]:
        s = sub.add_parser(name, help=help_)
        s.add_argument("--preset", default=preset, help=f"model preset (default {preset})")
        s.add_argument("--d-model", type=int, help="override D")
        s.add_argument("--d-ff", type=int, help="override F")
        s.add_argument("--blocks", type=int, help="override L")
        s.add_argument("--mesh", default="fsdp=-1",
                       help="mesh axes, e.g. fsdp=16,tensor=4 (default fsdp=-1: every device on fsdp)")
        s.add_argument("--devices", default=None,
                       help="cpu:N (emulated), tpu:v5p:4x4x4 or tpu:v5p-128 (compile only); default: real devices")
        s.add_argument("--batch-tokens", type=int, default=batch, help=f"global batch B in tokens (default {batch})")
        s.add_argument("--remat", default="none", choices=REMAT_POLICIES, help="remat policy (default none)")
        s.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        if name == "train":
            s.add_argument("--steps", type=int, default=20)
            s.add_argument("--lr", type=float, default=1e-3)
            s.add_argument("--seed", type=int, default=0)
        else:
            s.add_argument("--step", default="train", choices=("train", "forward"), help="which step to compile")
    return p


def _config(args):
    cfg = get_preset(args.preset)
    for name in ("d_model", "d_ff", "blocks"):
        if getattr(args, name) is not None:
            positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    return cfg.replace(d_model=args.d_model, d_ff=args.d_ff, blocks=args.blocks)


def _train(args, cfg) -> dict:
    import jax

    from ffn_model.train import train
    from mesh import make_mesh, maybe_initialize_distributed, mesh_shape

    positive_int("--steps", args.steps)
    positive_float("--lr", args.lr)
    if args.devices is None:
        maybe_initialize_distributed()
    elif not args.devices.strip().lower().startswith("cpu:"):
        raise ValueError(f"train runs on real devices or cpu:N, not {args.devices!r} (a TPU topology is compile-only)")
    mesh = make_mesh(args.mesh, args.devices)
    main = jax.process_index() == 0
    out = sys.stderr if args.json else sys.stdout

    def log(step, loss, tps):
        if main:
            print(f"step {step:5d}  loss {loss:.6f}  tokens/s {tps:,.0f}", file=out, flush=True)

    rates = []
    losses = train(cfg, mesh, args.batch_tokens, args.steps, lr=args.lr, seed=args.seed, remat=args.remat,
                   log=lambda s, l, t: (rates.append(t), log(s, l, t)))
    return {"command": "train", "model": vars(cfg), "mesh": mesh_shape(mesh).as_dict(), "devices": args.devices,
            "batch_tokens": args.batch_tokens, "steps": args.steps, "lr": args.lr, "seed": args.seed,
            "remat": args.remat, "losses": losses,
            "tokens_per_s": statistics.median(rates[1:]) if len(rates) > 1 else rates[0]}


def _compile(args, cfg) -> dict:
    from ffn_model.compile import abstract_compile
    from mesh import make_mesh, mesh_shape

    mesh = make_mesh(args.mesh, args.devices)
    res = abstract_compile(cfg, mesh, args.batch_tokens, remat=args.remat, step=args.step)
    keep = ("flops", "bytes accessed", "transcendentals", "optimal_seconds")
    return {"command": "compile", "model": vars(cfg), "mesh": mesh_shape(mesh).as_dict(), "devices": args.devices,
            "platform": mesh.devices.flat[0].platform, "batch_tokens": args.batch_tokens, "remat": args.remat,
            "step": args.step, "compile_seconds": res.compile_seconds, "memory": res.memory,
            "cost": {k: v for k, v in res.cost.items() if k in keep}}


def _print_compile(rep: dict) -> None:
    print(f"{rep['step']} step of {rep['model']} on {rep['devices'] or rep['platform']} mesh {rep['mesh']}, "
          f"B={rep['batch_tokens']:,} tokens, remat {rep['remat']}: compiled in {rep['compile_seconds']:.1f} s")
    for k, v in rep["memory"].items():
        print(f"  memory.{k:<15} {'-' if v is None else f'{v:,.0f} B ({v / 1e9:.3f} GB)'}  per device")
    for k, v in rep["cost"].items():
        print(f"  cost.{k:<17} {v:.6g}")


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    dev = (args.devices or "").strip().lower()
    if dev.startswith(("cpu:", "tpu:", "v5p")):
        # Emulated or ahead-of-time devices: keep jax from probing for real accelerators.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        cfg = _config(args)
        positive_int("--batch-tokens", args.batch_tokens)
        rep = _train(args, cfg) if args.command == "train" else _compile(args, cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        import jax

        if jax.process_index() == 0:
            print(json.dumps(rep))
    elif args.command == "compile":
        _print_compile(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
