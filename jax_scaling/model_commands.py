"""python -m ffn_model {train, compile, bench}

  train    train the FFN stack on the synthetic regression task, printing step, loss and tokens/s
           (--json: one object at the end with the per-step losses). --checkpoint-dir saves the
           sharded state (orbax) every --save-every steps and at the end; --resume restores the newest
           checkpoint onto this run's mesh and continues to --steps steps in all (--resume-step N: step N).
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

``compile`` and ``bench`` read compiled programs, which is verify's work: their reports are
jax_scaling.model_reports', imported by run_command once every flag is checked (it imports jax).

Bad input (a zero, negative or non-numeric number; an unknown preset, remat policy, mesh axis, device
spec or chip; a mesh whose size is not the device count; a dimension not divisible by its shard count;
a missing, damaged, already used or unwritable checkpoint directory) prints one line "error: ..." on
stderr and exits 2, before anything is created or written.
"""

from __future__ import annotations

import json
import statistics
import sys

from jax_scaling.args import (MESH_HELP, add_model_args, add_schedule_args, defaults_note, flags_of, model_config,
                              schedule_of)
from jax_scaling.processes import check_real_cpu_size, end_one_of_several, start_processes
from mesh.devices import PROCESS_TIMEOUT, cpu_device_count, device_count, use_cpu_platform_for
from scaling.core.schedule import runs_attention
from scaling.core.limits import check_host_memory, check_size, integer, number
from scaling.step.program import predict
from scaling.core.inputs import check_seed, non_negative_int, positive_float, positive_int
from scaling.core.mesh_shape import MeshShape, parse_mesh_spec
from scaling.core.policies import REMAT_POLICIES, check_remat
from scaling.hardware.chips import get_chip
from scaling.core.workload import Workload


COMMANDS = {  # name: (default preset, default batch tokens, help)
    "train": ("small", 512, "train on the synthetic regression task"),
    "compile": ("xxl", 25600, "compile one step ahead of time and print its memory and cost analysis"),
    "bench": ("small", 512, "time the train step: step time, TFLOP/s, MFU and the predicted step time"),
}


def add_commands(sub) -> None:
    """Add train, compile and bench to an argparse subparsers object (each run by run_command)."""
    for name, (preset, batch, help_) in COMMANDS.items():
        s = sub.add_parser(name, help=help_)
        add_model_args(s, preset)
        s.add_argument("--mesh", default="fsdp=-1",
                       help=f"mesh axes, e.g. fsdp=16,tensor=4 (default fsdp=-1: every device on fsdp); {MESH_HELP}")
        s.add_argument("--devices", default=None,
                       help="cpu:N (emulated; per process with --coordinator), tpu:<chip>:<shape> or a slice such as "
                            "tpu:v5p-128 (compile only); default: real devices")
        s.add_argument("--batch-tokens", type=integer, default=batch,
                       help=f"global batch B in tokens (default {batch})")
        s.add_argument("--remat", default="none", choices=REMAT_POLICIES, help="remat policy (default none)")
        add_schedule_args(s)
        s.add_argument("--json", action="store_true", help="print one JSON object on stdout (process 0; "
                       "gloo adds its own [Gloo] lines with cpu:N over several processes)")
        s.set_defaults(func=lambda args, command=name: run_command(args, command))
        s.add_argument("--verbose", action="store_true", help="let libtpu's start-up lines through to stderr")
        if name == "compile":
            s.add_argument("--step", default="train", choices=("train", "forward"), help="which step to compile")
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
            c.add_argument("--resume-step", type=integer, metavar="N",
                           help="resume from the complete step N instead of the newest (after a damaged newest "
                                "one; the checkpoints after N are removed)")
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
        if args.resume_step is not None:
            positive_int("--resume-step", args.resume_step)
            if args.checkpoint_dir is None:
                raise ValueError("--resume-step needs --checkpoint-dir")
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
    check_size(w)
    if allocates:
        check_host_memory(w.step, predict(w).memory["total"], n_cpu)
    if args.command == "train" and args.checkpoint_dir is not None:
        from ffn_model.checkpoint import check_directory

        check_directory(args.checkpoint_dir, args.resume or args.resume_step is not None)
        if args.resume_step is not None:  # a complete step there, before jax starts
            from ffn_model.checkpoint import check_resume_step

            check_resume_step(args.checkpoint_dir, args.resume_step)


def train_command(args, cfg) -> dict:
    import jax

    from ffn_model.train import train
    from mesh import make_mesh, mesh_shape

    mesh = make_mesh(args.mesh, start_processes(args), args.verbose)  # libtpu's start-up lines off stderr
    w = Workload(cfg, mesh_shape(mesh), args.batch_tokens, remat=args.remat,
                 schedule=schedule_of(args, mesh.devices.flat[0].platform), flags=flags_of(args))
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

    if runs_attention(cfg):
        say(f"attention {w.schedule.attention}")  # auto: the platform's kernel (scaling.core.schedule.attention_for)
    losses = train(w, mesh, args.steps, lr=args.lr, seed=args.seed, log=log, checkpoint_dir=args.checkpoint_dir,
                   save_every=args.save_every, resume=args.resume, say=say, resume_step=args.resume_step)
    return {"command": "train", "model": vars(cfg), "mesh": mesh_shape(mesh).as_dict(), "devices": args.devices,
            "processes": jax.process_count(), "batch_tokens": args.batch_tokens, "steps": args.steps,
            "start_step": args.steps - len(losses), "lr": args.lr, "seed": args.seed, "remat": args.remat,
            "schedule": vars(w.schedule),
            "checkpoint_dir": args.checkpoint_dir, "losses": losses,
            "tokens_per_s": statistics.median(rates[1:] or rates) if rates else None}


def run_command(args, command: str) -> int:
    """Check every flag that needs no devices, run ``command`` (train: train_command; compile, bench:
    jax_scaling.model_reports' report and its text, imported now) and print its report (process 0): one JSON object
    with --json, else the command's own text."""
    use_cpu_platform_for(args.devices)
    cfg = model_config(args)
    check_flags(args, cfg)
    if note := defaults_note(args):  # a model of flags alone: the defaults it took, on stderr
        print(note, file=sys.stderr, flush=True)
    if command == "train":
        run_, print_ = train_command, None
    else:
        from jax_scaling import model_reports

        run_, print_ = {"compile": (model_reports.compile_report, model_reports.print_compile),
                        "bench": (model_reports.bench_report, model_reports.print_bench)}[command]
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
