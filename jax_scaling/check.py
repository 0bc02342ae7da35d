"""``check``: the closed forms beside the compiled program, term by term (verify.check.check). Every flag is
read into the workload and checked here (check_workload) before verify, and with it jax, is imported."""

from __future__ import annotations

import json
import sys

from jax_scaling.args import (MESH_HELP, SERVING_DEFAULTS, add_model_args, add_schedule_args, add_serving_args,
                              check_no_serving_flags, defaults_note, flags_of, given_or, model_config, schedule_of)
from mesh.devices import chip_of_devices, device_count, use_cpu_platform_for
from scaling.core.kinds import Dtype
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.core.policies import REMAT_POLICIES, Attention
from scaling.hardware.chips import DEFAULT_CHIP, Chip, get_chip
from scaling.core.limits import check_size, integer
from scaling.core.workload import Workload


def add_parser(sub) -> None:
    """check's subcommand and flags."""
    c = sub.add_parser("check", help="closed forms against the compiled program, term by term")
    c.add_argument("--devices", default="cpu:8",
                   help="cpu:N (emulated), tpu:<chip>:<shape> (tpu:v5p:4x4x4, tpu:v6e:4x4, tpu:TPU7x:2x2x1), a "
                        "slice (tpu:v5p-128) or gpu:<chip>:<N> (gpu:H100:8), compiled ahead of time")
    c.add_argument("--mesh", default="data=2,fsdp=2,tensor=2", help=f"mesh spec (default %(default)s); {MESH_HELP}")
    add_model_args(c, "small")
    c.add_argument("--batch-tokens", type=integer, default=4096, help="global batch in tokens (default %(default)s)")
    c.add_argument("--remat", default="none", choices=REMAT_POLICIES, help="remat policy (default %(default)s)")
    c.add_argument("--step", default="train", choices=["train", "forward", "prefill", "decode"],
                   help="train, forward, or the serving program's prefill (--global-batch prompts of --prompt tokens) "
                        "or decode step (--global-batch sequences, a cache of --prompt + --output tokens): "
                        "verify.serve_check (default %(default)s)")
    c.add_argument("--global-batch", type=integer, help="--step decode: sequences decoded together (default 8)")
    add_serving_args(c)
    add_schedule_args(c)
    c.add_argument("--chip", help="chip for the time estimates, of the devices' kind (default: the TPU topology's or "
                   f"the GPUs', else {DEFAULT_CHIP})")
    c.add_argument("--json", action="store_true")
    c.add_argument("--verbose", action="store_true", help="let libtpu's start-up lines through to stderr")
    c.set_defaults(func=check_command)


def check_workload(args) -> Workload:
    """check's flags as the workload they describe, each checked without starting jax (a ValueError naming the
    flag): the model, the mesh over --devices, the batch, the schedule, sizes jax can count, --chip."""
    cfg = model_config(args)
    shape = parse_mesh_spec(args.mesh, device_count(args.devices))
    w = Workload(cfg, shape, args.batch_tokens, args.step, args.remat, schedule_of(args), flags=flags_of(args))
    check_size(w)
    timing_chip(args)
    return w


def timing_chip(args) -> Chip:
    """The chip whose figures time the check: --chip, or the devices' own (mesh.devices.chip_of_devices: a TPU
    topology's, gpu:<chip>:<N>'s; DEFAULT_CHIP for cpu:N). ValueError naming --chip where it is unknown, or a TPU
    timing a program compiled for GPUs (or a GPU one for TPUs): the program is the devices' kind's."""
    own = chip_of_devices(args.devices)
    if args.chip is None:
        return own
    chip = get_chip(args.chip)
    if not args.devices.strip().lower().startswith("cpu:") and chip.kind != own.kind:
        raise ValueError(f"--chip {args.chip} is a {chip.kind.upper()}; --devices {args.devices} compiles for "
                         f"{own.kind.upper()}s: give a {own.kind.upper()} chip ({own.name}) or leave --chip out")
    return chip


def check_serving_command(args) -> int:
    """check --step decode|prefill: the serving program's decode step or prefill compiled for --devices on --mesh,
    beside the closed forms (verify.serve_check.check_serving), as its table or --json."""
    from ffn_model.serve import WEIGHT_TYPES, check_servable

    cfg = model_config(args)
    weights = given_or(args, "weights", "bf16")
    check_servable(cfg)
    if weights not in WEIGHT_TYPES or given_or(args, "kv_cache", "bf16") != Dtype.BF16:
        raise ValueError(f"--weights {weights} --kv-cache {given_or(args, 'kv_cache', 'bf16')}: the serving program "
                         f"stores the weights as {' or '.join(WEIGHT_TYPES)} and the caches as bf16 (the closed forms, "
                         "predict and plan, take every type)")
    shape = parse_mesh_spec(args.mesh, device_count(args.devices))
    bad = [a for a, n in shape.items() if n > 1 and a not in ("data", "tensor")]
    if bad:
        raise ValueError(f"--mesh {args.mesh}: the serving program shards over data and tensor, not {', '.join(bad)}")
    batch = given_or(args, "global_batch", 8)
    if batch % shape.get("data", 1):
        raise ValueError(f"--global-batch {batch} is not divisible by data={shape.get('data', 1)}")
    t_max = given_or(args, "prompt", SERVING_DEFAULTS["prompt"])
    if args.step == "decode":
        t_max += given_or(args, "output", SERVING_DEFAULTS["output"])
    use_cpu_platform_for(args.devices)
    from verify.serve_check import check_serving

    print(f"compiling the {args.step} step for {args.devices} ...", file=sys.stderr, flush=True)
    rep = check_serving(cfg, args.devices, args.mesh, batch, t_max, args.step, weights)
    print(json.dumps(rep.to_json(), indent=2) if args.json else rep.render())
    return 0


def check_command(args) -> int:
    """``check`` on the command line: the workload of its flags (check_workload: every one checked before jax
    starts), compiled and read by verify.check.check, printed as its table (CheckReport.render) or --json
    (CheckReport.to_json)."""
    if args.step in ("prefill", "decode"):
        return check_serving_command(args)
    check_no_serving_flags(args)
    if args.global_batch is not None:
        raise ValueError("--global-batch is --step decode's (sequences); a training step takes --batch-tokens")
    w = check_workload(args)
    if note := defaults_note(args):  # a model of flags alone: the defaults it took, on stderr
        print(note, file=sys.stderr, flush=True)
    from verify.check import check, traceable
    from verify.hlo import refusal_error

    use_cpu_platform_for(args.devices)
    if args.attention in (None, Attention.AUTO):  # auto: the platform's kernel where it can be traced here, else flash
        w, note = traceable(w)
        if note:
            print(note, file=sys.stderr, flush=True)
    print(f"compiling the {args.step} step for {args.devices} ...", file=sys.stderr, flush=True)
    try:
        rep = check(w, args.devices, args.chip, verbose=args.verbose)
    except Exception as e:  # a program larger than the TPU's HBM: one line (verify.hlo.refusal_error)
        raise refusal_error(e) or e
    print(json.dumps(rep.to_json(), indent=2, default=str) if args.json else rep.render())
    return 0
