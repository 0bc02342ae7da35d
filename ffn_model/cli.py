"""python -m ffn_model {train, compile, bench}

  train    train the FFN stack on the synthetic regression task, printing step, loss and tokens/s
           (--json: one object at the end with the per-step losses). --checkpoint-dir saves the
           sharded state (orbax) every --save-every steps and at the end; --resume restores the newest
           checkpoint onto this run's mesh and continues to --steps steps in all.
  compile  compile the train (or forward) step ahead of time from ShapeDtypeStructs and print the
           per-device memory and cost analysis (--json: one object).
  bench    time the train step (median of --steps steps after --warmup) and print achieved TFLOP/s,
           MFU against the chip's peak bf16 FLOP/s and the closed form's predicted step time.

Several processes (multi-controller JAX): on a TPU slice or a SLURM / Open MPI cluster launch the same
command on every host with --distributed (jax.distributed.initialize() detects the rest); elsewhere
give --coordinator HOST:PORT --num-processes N --process-id I to every process, where --devices cpu:K
means K emulated CPU devices in each process (collectives over gloo). With none of these flags and no
--devices, jax.distributed is initialized when JAX_COORDINATOR_ADDRESS is set (mesh.devices). Every
process waits at most --process-timeout seconds for the others, checks that they were started with the
same flags, and ends with one line when another process stops (end_one_of_several).

``compile`` and ``bench`` read compiled programs, which is verify's work: ``add_commands`` takes their
implementations from the command layer (jax_scaling.cli), which imports them from verify when such a
command runs.

Bad input (a zero, negative or non-numeric number; an unknown preset, remat policy, mesh axis, device
spec or chip; a mesh whose size is not the device count; a dimension not divisible by its shard count;
a missing, damaged, already used or unwritable checkpoint directory) prints one line "error: ..." on
stderr and exits 2, before anything is created or written.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from mesh.devices import PROCESS_TIMEOUT, cpu_device_count, device_count, use_cpu_platform_for
from scaling.cli import add_model_args, add_schedule_args, flags_of, model_config, schedule_of
from scaling.limits import check_size, integer, number
from scaling.config import (REMAT_POLICIES, MeshShape, check_remat, check_seed, non_negative_int, parse_mesh_spec,
                            positive_float, positive_int)
from scaling.hardware import get_chip
from scaling.workload import Workload


COMMANDS = {  # name: (default preset, default batch tokens, help)
    "train": ("small", 512, "train on the synthetic regression task"),
    "compile": ("xxl", 25600, "compile one step ahead of time and print its memory and cost analysis"),
    "bench": ("small", 512, "time the train step: step time, TFLOP/s, MFU and the predicted step time"),
}


def add_commands(sub, implementations: dict) -> None:
    """Add train, compile and bench to an argparse subparsers object. ``implementations`` maps compile and
    bench to (run(args, cfg) -> report, print(report)): verify's, passed in by jax_scaling.cli."""
    impls = {"train": (train_command, None), **implementations}
    for name, (preset, batch, help_) in COMMANDS.items():
        s = sub.add_parser(name, help=help_)
        add_model_args(s, preset)
        s.add_argument("--mesh", default="fsdp=-1",
                       help="mesh axes, e.g. fsdp=16,tensor=4 (default fsdp=-1: every device on fsdp)")
        s.add_argument("--devices", default=None,
                       help="cpu:N (emulated; per process with --coordinator), tpu:<chip>:<shape> or a slice such as "
                            "tpu:v5p-128 (compile only); default: real devices")
        s.add_argument("--batch-tokens", type=integer, default=batch,
                       help=f"global batch B in tokens (default {batch})")
        s.add_argument("--remat", default="none", choices=REMAT_POLICIES, help="remat policy (default none)")
        add_schedule_args(s)
        s.add_argument("--json", action="store_true", help="print one JSON object on stdout (process 0; "
                       "gloo adds its own [Gloo] lines with cpu:N over several processes)")
        s.set_defaults(func=lambda args, impl=impls[name]: run_command(args, impl))
        if name == "compile":
            s.add_argument("--step", default="train", choices=("train", "forward"), help="which step to compile")
            s.add_argument("--verbose", action="store_true", help="let libtpu's start-up lines through to stderr")
            continue
        s.add_argument("--steps", type=integer, default=20 if name == "train" else 10,
                       help="steps in all, resumed ones included (default 20)" if name == "train"
                       else "timed steps (default 10)")
        s.add_argument("--seed", type=integer, default=0, help="seed of the weights and the data (default 0)")
        g = s.add_argument_group("several processes")
        g.add_argument("--distributed", action="store_true",
                       help="call jax.distributed.initialize() (detects TPU slices, SLURM, Open MPI)")
        g.add_argument("--coordinator", help="HOST:PORT of process 0's coordinator")
        g.add_argument("--num-processes", type=integer, help="number of processes")
        g.add_argument("--process-id", type=integer, help="this process: 0 .. num-processes-1")
        g.add_argument("--process-timeout", type=number, default=PROCESS_TIMEOUT,
                       help=f"seconds to wait for every process to connect, and at the end for all to finish "
                            f"(default {PROCESS_TIMEOUT:g})")
        if name == "train":
            s.add_argument("--lr", type=number, default=1e-3, help="AdamW learning rate (default 1e-3)")
            c = s.add_argument_group("checkpoints (orbax)")
            c.add_argument("--checkpoint-dir", help="save the train state here (and at the end)")
            c.add_argument("--save-every", type=integer, help="save after every N steps (default: only at the end)")
            c.add_argument("--resume", action="store_true",
                           help="restore the newest checkpoint in --checkpoint-dir and continue to --steps")
        else:
            s.add_argument("--warmup", type=integer, default=2, help="untimed steps first (default 2)")
            s.add_argument("--chip", help="chip for MFU and the prediction (default: from the devices; "
                                          "h100, h200, b200, v4, v5e, v5p, v6e, tpu7x)")


def _processes(args) -> int | None:
    """Validate the multi-process flags; the process count when given explicitly (else None)."""
    positive_float("--process-timeout", args.process_timeout)
    explicit = {"--coordinator": args.coordinator, "--num-processes": args.num_processes,
                "--process-id": args.process_id}
    if all(v is None for v in explicit.values()):
        return None
    missing = [k for k, v in explicit.items() if v is None]
    if missing:
        raise ValueError(f"--coordinator, --num-processes and --process-id go together; missing {', '.join(missing)} "
                         "(on a TPU slice or a SLURM cluster use --distributed alone)")
    host, sep, port = args.coordinator.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--coordinator {args.coordinator!r} must be HOST:PORT with a port in 1..65535")
    n = positive_int("--num-processes", args.num_processes)
    if not 0 <= args.process_id < n:
        raise ValueError(f"--process-id must be in 0..{n - 1} for --num-processes {n}, got {args.process_id}")
    return n


def check_flags(args, cfg) -> None:
    """Every check that needs no devices, so a bad flag fails before jax starts or a file is written."""
    positive_int("--batch-tokens", args.batch_tokens)
    check_remat(args.remat, cfg)
    n_cpu = cpu_device_count(args.devices, "--devices")
    processes = None
    if args.command != "compile":
        positive_int("--steps", args.steps)
        check_seed("--seed", args.seed)
        if args.devices is not None and n_cpu is None:
            raise ValueError(f"{args.command} runs on real devices or cpu:N, not {args.devices!r} "
                             "(a TPU topology is compile-only)")
        processes = _processes(args)
    if args.command == "bench":
        non_negative_int("--warmup", args.warmup)
        if args.chip is not None:
            get_chip(args.chip)
    if args.command == "train":
        positive_float("--lr", args.lr)
        if args.save_every is not None:
            positive_int("--save-every", args.save_every)
        if args.checkpoint_dir is None and (args.save_every is not None or args.resume):
            raise ValueError("--save-every and --resume need --checkpoint-dir")
    schedule = schedule_of(args)
    n_dev = device_count(args.devices) if args.command == "compile" else (
        None if n_cpu is None else n_cpu * (processes or 1))
    step = getattr(args, "step", "train")
    if n_dev is not None:  # the device count is known without starting jax: the workload's rules checked now
        w = Workload(cfg, parse_mesh_spec(args.mesh, n_dev), args.batch_tokens, step, args.remat, schedule,
                     flags=flags_of(args))
    else:  # the mesh once the devices are known (make_mesh); the sizes now
        w = Workload(cfg, MeshShape(), args.batch_tokens, step, args.remat, flags=flags_of(args))
    allocates = args.command != "compile" and n_cpu is not None  # train and bench on emulated CPU devices
    check_size(w, n_cpu if allocates else None)
    if args.command == "train" and args.checkpoint_dir is not None:
        from ffn_model.checkpoint import check_directory

        check_directory(args.checkpoint_dir, args.resume)


def check_workload(args) -> Workload:
    """check's flags as the workload they describe, each checked without starting jax (a ValueError naming the
    flag): the model, the mesh over --devices, the batch, the schedule, sizes jax can count, --chip."""
    cfg = model_config(args)
    shape = parse_mesh_spec(args.mesh, device_count(args.devices))
    w = Workload(cfg, shape, args.batch_tokens, args.step, args.remat, schedule_of(args), flags=flags_of(args))
    check_size(w)
    if args.chip is not None:
        get_chip(args.chip)
    return w


def start_processes(args):
    """Start jax.distributed when asked (before any jax computation), waiting at most --process-timeout
    for the other processes, then check that every process was started with the same flags (but
    --process-id); the device spec for make_mesh."""
    import jax

    from mesh.devices import initialize_distributed, maybe_initialize_distributed

    devices = args.devices
    if args.distributed or args.coordinator is not None:
        n_cpu = cpu_device_count(args.devices, "--devices")
        if n_cpu is not None:  # K emulated CPU devices in each process, collectives over gloo
            jax.config.update("jax_num_cpu_devices", n_cpu)
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        initialize_distributed(args.coordinator, args.num_processes, args.process_id, args.process_timeout,
                               hint=": start every process with the same --coordinator and --num-processes "
                                    "(or raise --process-timeout)")
        devices = None  # the global device list: every process's devices
    elif args.devices is None:
        maybe_initialize_distributed(args.process_timeout)
    check_same_flags(args)
    return devices


def check_same_flags(args) -> None:
    """ValueError naming the first flag another process was started with a different value of (only
    --process-id may differ): processes that disagree on the model, the seed or the mesh would train
    a run that is neither. Compared through jax.distributed's key-value store; nothing in one process."""
    import jax

    from mesh.devices import disagreements

    flags = json.loads(json.dumps({k: v for k, v in vars(args).items() if k not in ("process_id", "func")},
                                  default=str))
    for j, theirs in disagreements("ffn_model/flags", flags, args.process_timeout).items():
        name = next(k for k in sorted(flags.keys() | theirs.keys()) if flags.get(k) != theirs.get(k))
        flag = "--" + name.replace("_", "-")
        raise ValueError(f"process {j} was started with {flag} {theirs.get(name)!r}, this process "
                         f"({jax.process_index()}) with {flags.get(name)!r}: start every process with the same flags "
                         "(only --process-id differs)")


def train_command(args, cfg) -> dict:
    import jax

    from ffn_model.train import train
    from mesh import make_mesh, mesh_shape

    mesh = make_mesh(args.mesh, start_processes(args))
    w = Workload(cfg, mesh_shape(mesh), args.batch_tokens, remat=args.remat, schedule=schedule_of(args),
                 flags=flags_of(args))
    check_real_cpu_size(args, w, mesh)
    main = jax.process_index() == 0
    out = sys.stderr if args.json else sys.stdout
    rates = []

    def log(step, loss, tps):
        rates.append(tps)
        if main:
            print(f"step {step:5d}  loss {loss:.6f}  tokens/s {tps:,.0f}", file=out, flush=True)

    def say(line):
        if main:
            print(line, file=sys.stderr if args.json or line.startswith("warning:") else sys.stdout, flush=True)

    losses = train(w, mesh, args.steps, lr=args.lr, seed=args.seed, log=log, checkpoint_dir=args.checkpoint_dir,
                   save_every=args.save_every, resume=args.resume, say=say)
    return {"command": "train", "model": vars(cfg), "mesh": mesh_shape(mesh).as_dict(), "devices": args.devices,
            "processes": jax.process_count(), "batch_tokens": args.batch_tokens, "steps": args.steps,
            "start_step": args.steps - len(losses), "lr": args.lr, "seed": args.seed, "remat": args.remat,
            "schedule": vars(schedule_of(args)),
            "checkpoint_dir": args.checkpoint_dir, "losses": losses,
            "tokens_per_s": statistics.median(rates[1:] or rates) if rates else None}


def check_real_cpu_size(args, w: Workload, mesh) -> None:
    """check_size against this host's memory for a run on the real devices (no --devices) when they are CPUs,
    which check_flags could not know before jax started: the closed form per device times the local devices."""
    local = [d for d in mesh.devices.flat if d.process_index == mesh.devices.flat[0].process_index]
    if args.devices is None and local[0].platform == "cpu":
        check_size(w, len(local))


def run_command(args, impl) -> int:
    """Check every flag that needs no devices, run ``impl`` = (run, print) and print its report (process 0):
    one JSON object with --json, else the command's own text."""
    use_cpu_platform_for(args.devices)
    cfg = model_config(args)
    check_flags(args, cfg)
    run_, print_ = impl
    try:
        rep = run_(args, cfg)
    except Exception as e:
        end_one_of_several(e)
        raise
    import jax

    if jax.process_index() != 0:
        return 0
    if args.json:
        print(json.dumps(rep))
    elif print_ is not None:
        print_(rep)
    return 0


COORDINATOR_GRACE = 1.0  # seconds process 0 waits before it ends on an error (end_one_of_several)


def end_one_of_several(e: Exception) -> None:
    """In a program of several processes (jax.distributed), end this one now, with one line on stderr, on a
    ValueError ("error: ...", exit 2) or a runtime error of jax (a collective that failed because another
    process stopped: "error: process i: ...", exit 1): exiting normally, jax's shutdown would wait up to
    --process-timeout for the others at a barrier, then abort with a C++ stack. Returns otherwise."""
    import os

    import jax

    if not jax.distributed.is_initialized():
        return
    if isinstance(e, ValueError):
        line, code = str(e), 2
    elif isinstance(e, jax.errors.JaxRuntimeError):
        line, code = (f"process {jax.process_index()}: {str(e).strip().splitlines()[0][:300]} "
                      "(another process has probably stopped)"), 1
    else:
        return
    sys.stdout.flush()
    print(f"error: {line}", file=sys.stderr, flush=True)
    if jax.process_index() == 0 and jax.process_count() > 1:
        # process 0 holds the coordination service: the others' jax aborts (a C++ stack) when it disappears
        # before they have ended, so it ends last
        time.sleep(COORDINATOR_GRACE)
    os._exit(code)
