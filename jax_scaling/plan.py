"""``plan``: every mesh of a slice (or chip count) ranked by predicted step time (scaling.planner.plan), printed as a
table or --json; --verify-top K compiles the first K (verify.check.verify_plans, imported when asked: it imports
jax)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import time

from jax_scaling.args import (add_config_args, add_serving_args, chip_attention, chip_of, defaults_note, flags_of,
                              model_config, needs, say, serving_fields, check_no_serving_flags)
from jax_scaling.plots import add_plot_arg
from scaling.planner import plan as planner
from scaling.step.kernels import peak_flops
from scaling.core.mesh_shape import MeshShape, parse_mesh_spec
from scaling.core.schedule import Schedule, runs_attention
from scaling.core.flags import check_modelled
from scaling.core.kinds import Form, Platform
from scaling.core.policies import Attention, OptimizerSharding, Pipeline
from scaling.hardware.chips import GPU_NODE, chips_in, slice_name, split_slices
from scaling.core.limits import check_devices, check_size, integer, number
from scaling.reports.predict import batch_of, param_counts, params_text, precision_of, target_of
from scaling.core.sharding import LOGICAL_RULES
from scaling.core.table import PROSE, folds, table
from scaling.core.workload import Workload


def add_parser(sub) -> None:
    """plan's subcommand and flags: the model, hardware, batch and parallelism flags predict takes
    (jax_scaling.args.add_config_args: each given fixes what it names in every plan; left out, plan tries each
    value), and plan's own."""
    p = sub.add_parser("plan", help="rank every mesh of a slice by predicted step time",
                       description="Every mesh of the chips (default 64 v5p) ranked by predicted step time, each with "
                                   "its best schedule. A model, hardware, batch or parallelism flag (predict's, with "
                                   "the same spellings and defaults) fixes what it names in every plan listed; left "
                                   "out, the plan tries each value (a transformer: each remat policy, schedule, "
                                   "context strategy, sequence parallelism on and off; attention flash).")
    add_config_args(p, mesh_required=False, preset="xxl")
    g = p.add_argument_group("plan's own")
    g.add_argument("--hbm", type=number, help="memory budget per device in bytes (default: the table's usable HBM)")
    g.add_argument("--top", type=integer, default=10, help="rows to show (default %(default)s)")
    g.add_argument("--max-microbatches", type=integer, default=64, metavar="M",
                   help="largest microbatch count to try (gradient accumulation, pipeline; default %(default)s; "
                        "1: no microbatches)")
    g.add_argument("--max-repeats", type=integer, default=4, metavar="R",
                   help="largest repeat count to try with stages, circular and interleaved 1F1B (default "
                        "%(default)s; 1: none)")
    g.add_argument("--verify-top", type=integer, default=0, metavar="K",
                   help="compile the top K plans ahead of time for the real TPU topology, or with XLA's GPU compiler "
                        "for the GPUs (jax's CUDA plugin, which make answer installs), and add their peak and "
                        "whether it fits")
    g.add_argument("--verbose", action="store_true", help="with --verify-top: let libtpu's start-up lines through")
    g.add_argument("--json", action="store_true")
    g.add_argument("--step", default="train", choices=["train", "decode"],
                   help="train (the training step's meshes) or decode (serving: meshes and batches ranked by "
                        "throughput under --latency-ms, the frontier printed; the serving flags) (default %(default)s)")
    add_serving_args(p, plan=True)
    add_plot_arg(g, "every plan listed (not only the --top shown) as its predicted step time against its memory per "
                    "device, the HBM budget, the Pareto frontier, the top plans labelled by their mesh")
    p.set_defaults(func=plan_command)


def plan_target(args):
    """(chip, chips, slice dims or None) from --slice (and --slices), or --chip and --chips (default 64), with
    --inter-node-bandwidth: scaling.reports.predict.target_of."""
    chips = 64 if args.chips is None and args.slice is None else args.chips
    chip, dims, slices = target_of(args.chip, chips, args.slice, args.slices, args.inter_node_bandwidth,
                                   args.kernel_table)
    return chip, slices * chips_in(dims), dims if chip.kind != Platform.GPU else None


# the schedule fields plan's candidates all take at Schedule's default: given another value, no plan has it
FIXED_FIELDS = {"fsdp_gather": "microbatch", "warmup_phases": False}


def plan_choices(args, cfg) -> planner.Choices:
    """What plan tries on each mesh (scaling.planner.plan.Choices) from --remat, --schedule, --attention,
    --context-strategy, --sequence-parallel and --optimizer-sharding: a given name fixes it; left out, every one
    (--attention: flash; the FFN stack: remat none; --optimizer-sharding: fsdp, and on GPUs zero1 with stages). A
    choice no plan can take (FIXED_FIELDS, a transformer's attention block) is refused: ValueError saying why."""
    for k, v in FIXED_FIELDS.items():
        if getattr(args, k) not in (None, v):
            raise ValueError(f"--{k.replace('_', '-')} {getattr(args, k)}: plan's schedules all take "
                             f"{k.replace('_', ' ')} {v}, so no plan has it; predict takes it")
    if getattr(args, "stage_blocks", None) is not None:
        raise ValueError("--stage-blocks: plan's stage counts divide the blocks evenly (or take the default uneven "
                         "split), so no plan has a given list; predict takes it")
    block = getattr(args, "attention_block", None)
    if block is not None and block != Schedule().attention_block:
        raise ValueError(f"--attention-block {block}: plan's flash attention takes key blocks of "
                         f"{Schedule().attention_block}, so no plan has it; predict takes it")
    if not cfg.plan.grouped:  # the FFN stack's plan: microbatches and repeats (and GPipe or circular) only
        if args.pipeline == Pipeline.ONE_F_ONE_B and not cfg.runs_1f1b:
            raise ValueError(f"--schedule 1f1b: the {cfg.noun} runs gpipe or circular (1f1b is built for the "
                             "transformer), so no plan has it")
        for k, off in (("sequence_parallel", False), ("optimizer_sharding", "fsdp")):
            if getattr(args, k) not in (None, off):
                raise ValueError(f"--{k.replace('_', '-')} {'on' if getattr(args, k) is True else getattr(args, k)}: "
                                 f"the {cfg.noun}'s plan tries microbatches and repeats only (a transformer's plan "
                                 "tries it; predict takes it), so no plan has it")
        if not runs_attention(cfg):
            return planner.Choices.of(cfg, args.remat)
    # a choice the user made (the refusal lists those)
    args.attention_given = args.attention not in (None, Attention.AUTO)
    args.attention = chip_attention(args)  # the chip's kernel, said (and --attention's filter below matches it)
    if not cfg.plan.grouped:  # a family with attention planned one mesh a group (the MoE transformer's): the chip's
        return planner.Choices.of(cfg, args.remat, attention=args.attention)
    return planner.Choices.of(cfg, args.remat, args.pipeline, args.attention, args.context_strategy,
                              args.sequence_parallel, args.optimizer_sharding, chip=chip_of(args))


def plan_batch(args, cfg) -> tuple[int, int | None]:
    """(B tokens, M or None) of plan's batch flags: --global-batch (sequences) or --batch-tokens (default the
    family's plan_batch_tokens), and --microbatch (with --mesh: M = sequences / (microbatch·data·fsdp)) or
    --microbatches (None: plan tries each)."""
    if args.global_batch is None and args.batch_tokens is None:
        B = cfg.plan.batch_tokens
        if args.microbatch is not None:
            raise ValueError("--microbatch counts sequences of --global-batch; give --global-batch with it")
        return B, args.microbatches
    if args.microbatch is not None and args.mesh is None:
        raise ValueError("--microbatch counts sequences on each data·fsdp shard of --mesh; give --mesh with it, or "
                         "--microbatches")
    shape = parse_mesh_spec(args.mesh) if args.mesh else MeshShape()
    B, M = batch_of(cfg, shape, args.global_batch, args.batch_tokens, args.microbatch, args.microbatches or 1)
    return B, (M if args.microbatch is not None else args.microbatches)


def fixed_by(args, cfg, chips: int, slices: int, M: int | None) -> dict:
    """{flag text: test(plan)} for each choice given that a plan row carries: what every row listed must have
    (--mesh, --dcn-mesh, --microbatches, --repeats, --schedule: with stages, --context-strategy: with a context
    axis, --sequence-parallel, --optimizer-sharding, --remat, --attention)."""
    tests = {}
    if args.mesh is not None:
        shape = parse_mesh_spec(args.mesh)
        want = {a: shape[a] for a in planner.plan_axes(cfg)}
        if math.prod(shape.values()) != chips or any(n > 1 and a not in want for a, n in shape.items()):
            raise ValueError(f"--mesh {args.mesh}: plan's meshes are over {', '.join(planner.plan_axes(cfg))} with "
                             f"the product {chips} (its chips)")
        tests[f"--mesh {args.mesh}"] = lambda p: p.mesh == want
    if args.dcn_mesh is not None:
        dcn = {a: n for a, n in parse_mesh_spec(args.dcn_mesh).items() if n > 1}
        places = planner.dcn_placements(chip_of(args), slices, planner.plan_axes(cfg))
        if dcn not in [planner.dcn_of(*place, slices) for place in places]:
            staged = len(places) > len(planner.DCN_AXES)  # a GPU's stage axis across nodes too
            raise ValueError(f"--dcn-mesh {args.dcn_mesh}: plan spans its {slices} slices with the outermost factor "
                             f"of one axis, {' or '.join(planner.DCN_AXES)}"
                             + (", or stage, or stage=b with one of them the other slices/b" if staged else "")
                             + ": give " + " or ".join(f"{a}={slices}" for a in planner.DCN_AXES)
                             + (f" or stage={slices} or e.g. data={slices // 2},stage=2" if staged else ""))
        tests[f"--dcn-mesh {args.dcn_mesh}"] = lambda p: p.dcn_mesh == dcn
    if M is not None:
        tests[f"--microbatches {M}"] = lambda p: p.microbatches == M
    if args.repeats is not None:
        tests[f"--repeats {args.repeats}"] = lambda p: p.repeats == args.repeats
    if args.pipeline is not None:
        tests[f"--schedule {args.pipeline}"] = lambda p: p.mesh["stage"] > 1 and p.pipeline == args.pipeline
    if args.context_strategy is not None:
        tests[f"--context-strategy {args.context_strategy}"] = (
            lambda p: p.mesh["context"] > 1 and p.options["context"] == args.context_strategy)
    if args.sequence_parallel is not None:
        tests[f"--sequence-parallel {'on' if args.sequence_parallel else 'off'}"] = (
            lambda p: p.sequence_parallel == args.sequence_parallel)
    if args.optimizer_sharding is not None:
        tests[f"--optimizer-sharding {args.optimizer_sharding}"] = (
            lambda p: p.options.get("optimizer_sharding", "fsdp") == args.optimizer_sharding)
    if args.remat is not None:
        tests[f"--remat {args.remat}"] = lambda p: p.remat == args.remat
    if args.attention is not None and getattr(args, "attention_given", True):
        tests[f"--attention {args.attention}"] = lambda p: p.options.get("attention") == args.attention
    return tests


def keep_fixed(plans: list, tests: dict) -> list:
    """The plans that have every choice of ``tests`` (fixed_by's), each mesh's best (the first: plans are ranked)
    once per batch, mesh and DCN axis."""
    seen, out = set(), []
    for p in plans:
        key = (p.batch_tokens, tuple(p.mesh.values()), p.dcn_axis, p.dcn_stage)
        if key not in seen and all(t(p) for t in tests.values()):
            seen.add(key)
            out.append(p)
    return out


def serving_plan_command(args) -> int:
    """plan --step decode: every mesh and batch of the chips (scaling.reports.serving.serving_plan), the frontier and
    the best under --latency-ms, as text or --json; --plot FILE draws the frontier (jax_scaling.plots)."""
    from scaling.reports.serving import serving_plan, serving_setup

    t0 = time.perf_counter()
    fields = serving_fields(args)
    if args.mesh is not None:
        raise ValueError("plan --step decode tries every mesh of the chips; give the chips (--slice, or --chip and "
                         "--chips), not --mesh")
    from scaling.reports.predict import target_of
    hw, dims, n = target_of(args.chip, args.chips, args.slice, args.slices)
    fields["mesh"] = f"tensor={math.prod(dims) * n * hw.devices_per_chip}"
    fields["global_batch"] = 1
    latency = None if args.latency_ms is None else number(args.latency_ms) / 1e3
    plan = serving_plan(serving_setup(**fields), latency)
    print(json.dumps(plan.to_json(), indent=2) if args.json else plan.render())
    if args.plot is not None:
        from jax_scaling.plots import draw_serving_plan, save
        save(draw_serving_plan(plan), args.plot)
    print(f"({time.perf_counter() - t0:.2f} s)", file=sys.stderr)
    return 0


def plan_command(args) -> int:
    """Rank the plans and print them; with --verify-top K, verify.check.verify_plans (imported here: it imports jax)
    adds the compiled peak of the first K. Each choice given fixes what it names in every plan listed (fixed_by):
    where no plan that fits has them, ValueError saying which."""
    if args.step == "decode":
        return serving_plan_command(args)
    check_no_serving_flags(args)
    flags = check_modelled(flags_of(args), "plan")  # an unknown set or flag: refused before anything is enumerated
    needs(args, "verbose", "verify_top")
    if args.verify_top < 0:
        raise ValueError(f"--verify-top must be 0 (compile none) or a positive count of plans, got {args.verify_top}")
    cfg = model_config(args)
    choices = plan_choices(args, cfg)
    args.batch_tokens, M = plan_batch(args, cfg)
    if args.top <= 0:
        raise ValueError(f"--top must be a positive integer, got {args.top}")
    chip, chips, dims = plan_target(args)
    check_devices("--chips", chips)
    precision = precision_of(args.dtype or "bf16", args.grad_accumulation or "package")
    check_size(Workload(cfg, MeshShape(), args.batch_tokens, flags=flags, precision=precision))  # any mesh's arrays
    peak_flops(chip, precision.dtype)  # ValueError where the table has no rate for it
    if args.verify_top and precision != precision_of("bf16"):
        raise ValueError("--verify-top compiles the package's bf16 program with its own gradient accumulation; give "
                         "--dtype bf16 --grad-accumulation package with it, or leave --verify-top out")
    t0 = time.perf_counter()
    for flag in ("max_microbatches", "max_repeats"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be a positive integer, got {getattr(args, flag)}")
    slices = chips // math.prod(dims) if dims else -(-chips // GPU_NODE) if chip.kind == Platform.GPU else None
    if slices is None:
        slices = split_slices(chip, chips)[0]
    tests = fixed_by(args, cfg, chips * chip.devices_per_chip, slices, M)
    max_m = max(args.max_microbatches, M or 1)
    max_r = max(args.max_repeats, args.repeats or 1)
    plans = planner.plan(cfg, chip, chips, args.batch_tokens, hbm=args.hbm, form=args.form, dims=dims,
                         max_microbatches=max_m, max_repeats=max_r, flags=flags, choices=choices,
                         per_mesh=M is None and args.repeats is None, precision=precision)
    fitting = plans
    plans = keep_fixed(plans, tests)
    seconds = time.perf_counter() - t0
    budget = args.hbm if args.hbm is not None else chip.hbm_budget
    name = slice_name(chip, chips)
    where = f"{chips} {chip.name} chips" + (f" ({name})" if name else "")
    if not fitting:
        raise no_plan(args, cfg, chip, chips, budget, where, flags, choices, precision, dims)
    if not plans:
        raise not_fixed(args, cfg, M, tests, fitting, where, budget)
    if note := defaults_note(args):  # a model of flags alone: the defaults it took, on stderr
        print(note, file=sys.stderr, flush=True)
    if args.verify_top:
        from verify.check import verify_plans

        plans[: args.verify_top] = verify_plans(plans[: args.verify_top], cfg, chip, chips, budget, args.verbose,
                                                flags)
    rows = [p.to_json() for p in plans] if args.plot is not None else [p.to_json() for p in plans[: args.top]]
    result = {"plans": rows[: args.top], "count": len(plans), "enumerate_seconds": seconds, "chip": chip.name,
              "chips": chips, "slice": name, "hbm_budget": budget, "dtype": precision.dtype,
              "grad_accumulation": precision.accumulation, "model_text": str(cfg), **param_counts(cfg)}
    if args.plot is not None:  # every plan listed, from the same to_json rows --json prints the first --top of
        from jax_scaling.plots import draw_plan, save

        save(draw_plan(result, rows, min(args.top, 5)), args.plot)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print_header(args, cfg, plans, (chip, chips, budget, where), flags, choices, seconds)
    if tests:
        say(f"Every plan listed has {' '.join(tests)} (as given).")
    print_plans(args, cfg, plans, " ".join(tests))
    return 0


def not_fixed(args, cfg, M: int | None, tests: dict, fitting: list, where: str, budget: float) -> ValueError:
    """Why no plan has the choices given (fixed_by's ``tests``): the first one no plan that fits has, and on the best
    plan that fits (on the --mesh given, where one fits) what Schedule.check says of the choices asked there."""
    lacking = [flag for flag, t in tests.items() if not any(t(p) for p in fitting)]
    mesh_test = next((t for flag, t in tests.items() if flag.startswith("--mesh ")), None)
    needs_axis = [(args.pipeline, "stage", "--schedule names a pipeline schedule: plans with stages"),
                  (args.context_strategy, "context", "--context-strategy names the attention over a context axis"),
                  (args.optimizer_sharding == OptimizerSharding.ZERO1 or None, "data",
                   "the planner tries zero1 with a data axis (with fsdp alone the optimizer state is sharded over fsdp "
                   "already)"),
                  (args.sequence_parallel or None, "tensor", "sequence_parallel splits the activations over the tensor "
                   "axis")]
    on_mesh = [p for p in fitting if mesh_test is None or mesh_test(p)]
    # the best that fits with the axes the choices need, else the best that fits
    best = next((p for p in on_mesh if all(g is None or p.mesh[a] > 1 for g, a, _ in needs_axis)),
                on_mesh[0] if on_mesh else None)
    head = (f"no plan of {where} that fits {budget / 1e9:.4g} GB per device has {' '.join(tests)} ("
            + (f"none of the {len(fitting)} that fit has {lacking[0]})" if lacking else
               f"of the {len(fitting)} that fit, none has them together)"))
    if best is None:  # no plan fits on the --mesh given: the axis a choice needs, where it lacks one
        shape = parse_mesh_spec(args.mesh) if args.mesh else None
        why = next((f"{said}; the mesh has no {axis} axis" for given, axis, said in needs_axis
                    if shape is not None and given is not None and shape[axis] == 1), None)
        return ValueError(f"{head}; on {args.mesh}: {why}" if why else head)
    asked = {f: v for f, v in (("sequence_parallel", args.sequence_parallel),
                               ("optimizer_sharding", args.optimizer_sharding), ("context", args.context_strategy),
                               ("pipeline", args.pipeline), ("repeats", args.repeats), ("microbatches", M))
             if v is not None}
    mesh = best.mesh
    why = next((f"{said}; the mesh has no {axis} axis" for given, axis, said in needs_axis
                if given is not None and mesh[axis] == 1), None)
    try:
        if why is not None:
            raise ValueError(why)
        dataclasses.replace(planner.workload_of(best, cfg).schedule, **asked).check(
            cfg, MeshShape(best.mesh), best.batch_tokens)
        why = "it runs there but does not fit, or is not among the schedules the planner tries"
    except ValueError as e:
        why = str(e)
    return ValueError(f"{head}; on {best.mesh_text()} (the best that fits{' there' if mesh_test else ''}): {why}")


# the plan command's inputs, each one of the reasons it may name
def no_plan(args, cfg, chip, chips, budget, where, flags, choices, precision, dims=None) -> ValueError:
    """Why no plan fits: the nearest miss and what it needs (scaling.planner.plan.nearest_miss), or where no mesh runs
    the model at all with the batch but some would with another, the batch (wrong_batch), or else the rules that refuse
    them (unsplittable), or a batch that splits no way."""
    near = planner.nearest_batches(cfg, chip, chips, args.batch_tokens, dims, args.max_microbatches, args.max_repeats,
                                   choices)
    # the batches some mesh runs whatever the memory, nearest first: without the batch itself no mesh runs it, and
    # nearest_miss (a plan over every mesh) would find none
    miss = None if args.batch_tokens not in near else planner.nearest_miss(
        cfg, chip, chips, args.batch_tokens, form=args.form, max_microbatches=args.max_microbatches,
        max_repeats=args.max_repeats, flags=flags, choices=choices, precision=precision, dims=dims)
    why = "" if miss is None else (
        f"; nearest miss: {miss.mesh_text()}{miss.schedule_text()} "
        f"needs {miss.memory_bytes / 1e9:.1f} GB per device ("
        + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in miss.memory_terms.items() if k != "total" and v >= 5e7)
        + " GB): " + f"{(miss.memory_bytes - budget) / 1e9:.1f} GB over")
    B, most = args.batch_tokens, chips * args.max_microbatches
    if miss is None and (batch := wrong_batch(args, cfg, (chip, chips, dims, budget), near, flags, choices,
                                              precision)):
        return ValueError(f"no mesh of {where} can run {cfg} with B = {B:,} tokens, whatever the memory: {batch}")
    if miss is None:  # no mesh runs it at all, whatever the memory: say which rules fail
        return ValueError(f"no mesh of {where} can run {cfg} with B = {B:,} tokens, whatever the memory: "
                          + unsplittable(cfg, chips * chip.devices_per_chip, B, planner.plan_axes(cfg), flags))
    if all(B % k for k in range(2, min(B, most) + 1)):  # the batch splits no way: say so first
        why = (f"; B = {B:,} tokens divides by no microbatches·data·fsdp from 2 to {most:,} (train and check "
               "need B divisible by it), so only data = fsdp = 1 with M = 1 can run it" + why)
    return ValueError(f"no mesh of {where} fits {cfg} in {budget / 1e9:.4g} GB per device "
                     f"(--hbm {budget:.4g} bytes){why}")


def wrong_batch(args, cfg, target: tuple, near: list[int], flags, choices, precision) -> str | None:
    """Where no mesh runs ``cfg`` with the batch but some would with another: the batch as the cause, and the nearest
    batches below and above that some mesh runs (scaling.planner.plan.nearest_batches: B a multiple of
    microbatches·data·fsdp·unit, the 16 nearest) where plans fit the budget (scaling.planner.plan.plan, the nearest on
    each side first, then a few at once), each as the flag that gives it with how many plans fit there and the best
    one's step; where none of those fits, the nearest that run. None where no batch would do (the model's rules refuse
    every mesh). ``target``: (chip, chips, slice dims or None, HBM budget per device); ``near``: nearest_batches'."""
    chip, chips, dims, budget = target
    B, unit = args.batch_tokens, cfg.seq_len or 1
    if not near:
        return None
    fit = {}  # batch -> its plans that fit, best first
    sides = ([b for b in near if b < B], [b for b in near if b > B])  # each nearest first
    for lo, hi in ((0, 1), (1, 4), (4, None)):  # both sides planned at once, a few batches each, until one fits
        chunk = [b for side in sides if not any(b in fit for b in side) for b in side[lo:hi]]
        if chunk:
            for p in planner.plan(cfg, chip, chips, chunk, hbm=budget, form=args.form, dims=dims,
                                  max_microbatches=args.max_microbatches, max_repeats=args.max_repeats,
                                  flags=flags, choices=choices, precision=precision):
                fit.setdefault(p.batch_tokens, []).append(p)
    pool = [b for b in near if b in fit] or near
    picked = [b for b in (max((b for b in pool if b < B), default=None), min((b for b in pool if b > B), default=None))
              if b is not None]

    def at(b: int) -> str:
        flag = f"--global-batch {b // unit:,} ({b:,} tokens" if cfg.seq_len else f"--batch-tokens {b:,} ("
        n = len(fit.get(b, []))
        return (f"{flag}{': ' if cfg.seq_len else ''}{n} mesh{'es' if n != 1 else ''} fit {budget / 1e9:.4g} GB per "
                f"device, the best {fit[b][0].step_seconds[args.form]:.3g} s a step)" if n else
                f"{flag}{': ' if cfg.seq_len else ''}none fits {budget / 1e9:.4g} GB per device)")

    what = f"{B // unit:,} sequences" if cfg.seq_len else f"{B:,} tokens"
    parts = "·".join(("microbatches", *LOGICAL_RULES[cfg.batch_axis]))
    return (f"the batch is the cause: {what} is not divisible by the {parts} of any mesh that runs the model"
            + (" (each part whole sequences)" if cfg.seq_len else "") + f"; the nearest batch"
            f"{'es' if len(picked) > 1 else ''} that some mesh runs" + (" and fits" if pool is not near else "")
            + ": " + " and ".join(map(at, picked)))


def print_header(args, cfg, plans, target, flags, choices, seconds: float) -> None:
    """plan's prose above the table: what was tried, the chip figures, the ranking form, the columns. ``target``:
    (chip, chips, HBM budget per device, where in words)."""
    chip, chips, budget, where = target
    transformer = runs_attention(cfg)
    other = "max" if args.form == Form.SUM else "sum"
    slices = plans[0].slices
    options, axes = cfg.plan.schedule_options, planner.plan_axes(cfg)  # what the family's plan chooses
    tried = (f"remat {', '.join(choices.remats)}" if not transformer else ", ".join(
        (["schedule"] if "stage" in axes else []) + [f"remat ({', '.join(choices.remats)})",
                                                    f"attention ({', '.join(choices.attentions)})"]
        + (["context strategy"] if "context" in options and "context" in axes else [])
        + (["sequence parallelism", "optimizer sharding (" + (choices.optimizer_sharding[0]
                                                              if len(choices.optimizer_sharding) == 1 else
                                                              "fsdp, zero1 with stages and a data axis") + ")"]
           if "optimizer_sharding" in options else [])))
    say(f"{len(plans)} meshes of {where} fit {budget / 1e9:.4g} GB per device, each with its best microbatch count "
          f"(of 1 to {args.max_microbatches}), repeats and {tried}; B = {args.batch_tokens:,} tokens "
          f"({seconds * 1e3:.1f} ms)"
          + (f"; {slices} {f'nodes of {chips // slices} GPUs on NVLink' if chip.kind == Platform.GPU else 'slices'} "
             f"joined by {chip.network_name} "
             f"({chip.dcn_bw:.3g} B/s per chip; column dcn: the mesh axes whose outermost factors span them)"
             if slices > 1 else ""))
    say(f"chip figures: {chip.describe()}")
    say(f"model: {cfg}; {params_text(cfg)}")
    for line in cfg.program_notes(chip):
        say(f"note: {line}")
    say(f"Ranked by the {args.form} form" + (" (max(T_math, T_HBM) + the collective times; the compiled XXL forward "
          "step runs its collectives synchronously under libtpu's default flags: docs/findings.md, question (c))"
          if args.form == Form.SUM else " (every collective overlapped with the math)" if args.form == Form.MAX else
          f" (the kernels at the efficiency their shapes get on the chip, scaling.step.kernels, + the collectives the "
          f"schedule of {flags.describe()} leaves exposed + its loop copies)")
          + f"; the {other} form beside it.")
    say(("The scheduled form is the step model's forecast (a TPU's matmul efficiency fitted on a measured run, a "
           "GPU's GEMM ceiling and fixed time on its kernel table: jax-scaling validate, kernels --gemm); the sum and "
           "max forms are " if args.form == Form.SCHEDULED or other == Form.SCHEDULED else
           "These are ") + "roofline bounds: their step times are lower bounds, MFU and HFU upper bounds "
          + ("(MFU counts the model's matmul FLOPs, attention's causal half, HFU the remat recompute and the "
             "pipeline's too)." if transformer else "(MFU counts model FLOPs 6PB-2BDF, HFU the remat recompute too)."))
    say("M: microbatches (gradient accumulation without stages; GPipe/circular with them), R: circular repeats, "
          "bubble: (S-1)/(R*M) of the ideal step, paid as executed FLOPs (the scan computes in bubble iterations); "
          "bubble s: T_math of the bubble iterations."
          + (" sched: the pipeline schedule (gpipe, circular, 1f1b; 1F1B's bubble 2(S-1)/M, interleaved "
             "(R*S+S-2)/(R*M)); SP: sequence parallelism; ctx: the context strategy (with a context axis); "
             f"no critical batch is modelled for the {cfg.noun}." if transformer else
             f" crit B: the global batch above which the {planner.crit_form(args.form)} form is compute bound "
             "(never: no batch makes it so on that mesh; the scheduled form's exposed collectives follow the flags' "
             "schedule, so it has no threshold of its own)."))


def print_plans(args, cfg, plans, asked: str = "") -> None:
    """plan's table: the top --top plans, then the best without and with stages (# is the rank); ``asked``: the
    choices given (fixed_by's), which a missing kind of plan is said to lack."""
    transformer, slices = runs_attention(cfg), plans[0].slices
    other = "max" if args.form == Form.SUM else "sum"
    best = {}
    for k, r in enumerate(plans, 1):
        best.setdefault(r.mesh.get("stage", 1) > 1, (k, r))
    shown = list(enumerate(plans[: args.top], 1)) + [best[s] for s in (False, True) if s in best]
    short = {"scheduled": "sched"}.get(args.form, args.form)
    header = ["#", *planner.plan_axes(cfg), *(["dcn"] if slices > 1 else []), "M", "R",
              *(["sched", "remat", "SP", "ctx", "opt"] if transformer else []), "bubble", "bubble s", "M_X",
              "M_Y", f"{short} s", f"{other} s", f"MFU {short}", f"MFU {other}", "HFU", "bound", "GB/dev",
              *([] if transformer else [f"crit B {planner.crit_form(args.form)}"]),
              *(["compiled GB", "fits"] if args.verify_top else [])]
    top = min(args.top, len(plans))
    cells = [r.cells(k, slices, bool(args.verify_top)) for k, r in shown]
    blocks = [table(header, cells, right=range(len(header)))]
    if max(map(len, blocks[0])) > PROSE:  # within a terminal: the plan (mesh, choices) with the figures it is
        # ranked by (step, memory, critical batch), then its other figures, each row keyed by its rank #
        cut = header.index("bubble")
        ranked = [i for i, h in enumerate(header) if i < cut or h in (f"{short} s", "GB/dev") or h.startswith("crit")]
        first = ranked if max(map(len, table([header[i] for i in ranked], [[c[i] for i in ranked] for c in cells]))
                              ) <= PROSE else list(range(cut))  # the figures with the rest where they do not fit
        rest = [0, *(i for i in range(cut, len(header)) if i not in first)]
        blocks = [b for idx in (first, rest) for b in folds([header[i] for i in idx], [[c[i] for i in idx]
                                                                                       for c in cells],
                                                            range(len(idx)), width=PROSE)]
    for n, lines in enumerate(blocks):
        print(("\n" if n else "") + "\n".join(lines[: top + 1]))
        rest = iter(lines[top + 1:])
        for staged, label in ((False, "without stages"), (True, "with stages")):
            if staged in best:
                r = best[staged][1]
                print(f"Best {label}" + (f": bubble {r.bubble:.1%} of the ideal step, "
                                         f"{r.bubble_seconds:.3f} s" if staged else "") + " (# is the rank)")
                print(next(rest))
            elif staged and "stage" not in planner.plan_axes(cfg):
                print(f"No plan {label}: pipeline stages are not built for the {cfg.noun}")
            else:
                print(f"No plan {label} fits" + (f" with {asked}" if asked else ""))


def unsplittable(cfg, devices: int, batch_tokens: int, axes: tuple[str, ...], flags) -> str:
    """Why no mesh of ``devices`` over ``axes`` can run ``cfg`` with ``batch_tokens`` (each mesh built as a
    Workload, whose rules are the sharding table's and the schedule's): the rules that refuse them, most
    frequent first, each with how many meshes it refuses and one example."""
    first: dict[str, tuple[int, str, str]] = {}
    count = 0
    for sizes in planner._splits(devices, len(axes)):  # the planner's own enumeration
        if count == 5000:  # enough to name the rules (each Workload is built and checked)
            break
        mesh = MeshShape(dict(zip(axes, sizes)))
        count += 1
        try:
            Workload(cfg, mesh, batch_tokens, flags=flags)
        except ValueError as e:
            rule = re.sub(r"\d[\d,]*", "N", str(e))
            n, ex_mesh, ex = first.get(rule, (0, str(mesh), str(e)))
            first[rule] = (n + 1, ex_mesh, ex)
    worst = sorted(first.values(), key=lambda v: -v[0])[:3]
    return (f"each of the {'first ' if count == 5000 else ''}{count:,} ways to split {devices:,} devices over "
            f"{', '.join(axes)} breaks a rule: "
            + "; ".join(f"{n:,} meshes as {m}: {e}" for n, m, e in worst)
            + " (use a chip count whose factors the model's dimensions and the batch divide)")
