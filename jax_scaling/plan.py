"""``plan``: every mesh of a slice (or chip count) ranked by predicted step time (scaling.plan), printed as a
table or --json; --verify-top K compiles the first K (verify.check.verify_plans, imported when asked: it imports
jax)."""

from __future__ import annotations

import json
import re
import time

from jax_scaling.args import add_model_args, add_xla_flags_arg, flags_of, model_config, needs, say
from scaling import plan as planner
from scaling.mesh_shape import MeshShape
from scaling.policies import ATTENTIONS, CONTEXT_STRATEGIES, OPTIMIZER_SHARDINGS, PIPELINES, REMAT_POLICIES
from scaling.transformer import TransformerConfig
from scaling.flags import check_modelled
from scaling.hardware import DEFAULT_CHIP, chips_in, get_chip, slice_name
from scaling.limits import check_devices, check_size, integer, number
from scaling.reports import named_slice
from scaling.table import table
from scaling.workload import Workload


def add_parser(sub) -> None:
    """plan's subcommand and flags."""
    p = sub.add_parser("plan", help="rank every mesh of a slice by predicted step time")
    p.add_argument("--chip", help=f"chip from the hardware table (default {DEFAULT_CHIP}): v4, v5e, v5p, v6e, TPU7x, "
                   "H100, ...")
    p.add_argument("--chips", type=integer,
                   help="chip count (default 64); more than one slice holds are slices over DCN")
    p.add_argument("--slice", help="a Cloud TPU slice instead of --chip/--chips: v5p-256 (TensorCores: 128 chips), "
                   "v6e-256 (chips), tpu7x-128, v5litepod-16, v4-512")
    add_model_args(p, "xxl")
    add_xla_flags_arg(p)
    p.add_argument("--batch-tokens", type=integer, help=f"global batch in tokens (default 25600 for the FFN stack, "
                   f"{TransformerConfig.plan_batch_tokens:,} for a transformer)")
    p.add_argument("--hbm", type=number, help="memory budget per device in bytes (default: the table's usable HBM)")
    p.add_argument("--remat", choices=REMAT_POLICIES, help="remat policy (default: none for the FFN stack; a "
                   "transformer's plan tries each of its policies)")
    g = p.add_argument_group("what a transformer's plan tries on each mesh (left out: every one)")
    g.add_argument("--schedule", dest="pipeline", choices=PIPELINES, help="pipeline schedule with stages")
    g.add_argument("--attention", choices=ATTENTIONS, help="attention (default flash)")
    g.add_argument("--context-strategy", choices=CONTEXT_STRATEGIES, help="attention over a context axis")
    g.add_argument("--sequence-parallel", choices=("on", "off"), help="sequence parallelism with a tensor axis")
    g.add_argument("--optimizer-sharding", choices=OPTIMIZER_SHARDINGS,
                   help="zero1: ZeRO-1 where the mesh has a data axis (default fsdp)")
    p.add_argument("--form", default="scheduled", choices=["sum", "max", "scheduled"],
                   help="rank by the scheduled form (math + the collectives --xla-flags' schedule leaves exposed + its "
                        "loop copies), the sum form (math + every collective: synchronous) or the max form (every "
                        "collective overlapped) (default %(default)s)")
    p.add_argument("--top", type=integer, default=10, help="rows to show (default %(default)s)")
    p.add_argument("--max-microbatches", type=integer, default=64, metavar="M",
                   help="largest microbatch count to try (gradient accumulation, pipeline; default %(default)s; "
                        "1: no microbatches)")
    p.add_argument("--max-repeats", type=integer, default=4, metavar="R",
                   help="largest repeat count to try with stages, circular and interleaved 1F1B (default "
                        "%(default)s; 1: none)")
    p.add_argument("--verify-top", type=integer, default=0, metavar="K",
                   help="compile the top K plans ahead of time for the real TPU topology, or with XLA's GPU compiler "
                        "for the GPUs (jax's CUDA plugin, which make answer installs), and add their peak and "
                        "whether it fits")
    p.add_argument("--verbose", action="store_true", help="with --verify-top: let libtpu's start-up lines through")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=plan_command)


def plan_target(args):
    """(chip, chips, slice dims or None) from --slice, or --chip and --chips."""
    if args.slice is not None:
        chip, dims = named_slice(args.slice, args.chip, args.chips)
        return chip, chips_in(dims), dims
    return get_chip(args.chip or DEFAULT_CHIP), 64 if args.chips is None else args.chips, None


def plan_choices(args, cfg) -> planner.Choices:
    """What plan tries on each mesh (scaling.plan.Choices) from --remat, --schedule, --attention,
    --context-strategy, --sequence-parallel and --optimizer-sharding: a given name fixes it; left out, every one
    (--attention: flash; the FFN stack: remat none). Those flags are the transformer's: ValueError for the FFN
    stack's plan."""
    given = {k: getattr(args, k) for k in ("pipeline", "attention", "context_strategy", "sequence_parallel",
                                           "optimizer_sharding") if getattr(args, k) is not None}
    if not cfg.has_attention:
        if given:
            k = next(iter(given))
            raise ValueError(f"--{'schedule' if k == 'pipeline' else k.replace('_', '-')} is a transformer flag; "
                             f"{args.preset!r} is an {cfg.noun}")
        return planner.Choices.of(cfg, args.remat)
    sp = {"on": True, "off": False}.get(args.sequence_parallel)
    return planner.Choices.of(cfg, args.remat, args.pipeline, args.attention or "flash", args.context_strategy, sp,
                              args.optimizer_sharding)


def plan_command(args) -> int:
    """Rank the plans and print them; with --verify-top K, verify.check.verify_plans (imported here: it imports jax)
    adds the compiled peak of the first K."""
    flags = check_modelled(flags_of(args), "plan")  # an unknown set or flag: refused before anything is enumerated
    needs(args, "verbose", "verify_top")
    if args.verify_top < 0:
        raise ValueError(f"--verify-top must be 0 (compile none) or a positive count of plans, got {args.verify_top}")
    cfg = model_config(args)
    choices = plan_choices(args, cfg)
    if args.batch_tokens is None:
        args.batch_tokens = cfg.plan_batch_tokens
    if args.top <= 0:
        raise ValueError(f"--top must be a positive integer, got {args.top}")
    chip, chips, dims = plan_target(args)
    check_devices("--chips", chips)
    check_size(Workload(cfg, MeshShape(), args.batch_tokens, flags=flags))  # the global arrays: any mesh's
    t0 = time.perf_counter()
    for flag in ("max_microbatches", "max_repeats"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be a positive integer, got {getattr(args, flag)}")
    plans = planner.plan(cfg, chip, chips, args.batch_tokens, hbm=args.hbm, form=args.form, dims=dims,
                         max_microbatches=args.max_microbatches, max_repeats=args.max_repeats, flags=flags,
                         choices=choices)
    seconds = time.perf_counter() - t0
    budget = args.hbm if args.hbm is not None else chip.hbm_budget
    name = slice_name(chip, chips)
    where = f"{chips} {chip.name} chips" + (f" ({name})" if name else "")
    if not plans:
        raise no_plan(args, cfg, chip, chips, budget, where, flags, choices)
    if args.verify_top:
        from verify.check import verify_plans

        plans[: args.verify_top] = verify_plans(plans[: args.verify_top], cfg, chip, chips, budget, args.verbose,
                                                flags)
    if args.json:
        print(json.dumps({"plans": [p.to_json() for p in plans[: args.top]], "count": len(plans),
                          "enumerate_seconds": seconds, "chip": chip.name, "chips": chips, "slice": name,
                          "hbm_budget": budget}, indent=2))
        return 0
    print_header(args, cfg, plans, (chip, chips, budget, where), flags, choices, seconds)
    print_plans(args, cfg, plans)
    return 0


def no_plan(args, cfg, chip, chips, budget, where, flags, choices) -> ValueError:
    """Why no plan fits: the nearest miss and what it needs (scaling.plan.nearest_miss), or where no mesh runs the
    model at all the rules that refuse them (unsplittable), or a batch that splits no way."""
    miss = planner.nearest_miss(cfg, chip, chips, args.batch_tokens, form=args.form,
                                max_microbatches=args.max_microbatches, max_repeats=args.max_repeats,
                                flags=flags, choices=choices)
    why = "" if miss is None else (
        f"; nearest miss: {miss.mesh_text()}{miss.schedule_text()} "
        f"needs {miss.memory_bytes / 1e9:.1f} GB per device ("
        + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in miss.memory_terms.items() if k != "total" and v >= 5e7)
        + " GB): " + f"{(miss.memory_bytes - budget) / 1e9:.1f} GB over")
    B, most = args.batch_tokens, chips * args.max_microbatches
    if miss is None:  # no mesh runs it at all, whatever the memory: say which rules fail
        return ValueError(f"no mesh of {where} can run {cfg} with B = {B:,} tokens, whatever the memory: "
                          + unsplittable(cfg, chips * chip.devices_per_chip, B, planner.plan_axes(cfg), flags))
    if all(B % k for k in range(2, min(B, most) + 1)):  # the batch splits no way: say so first
        why = (f"; B = {B:,} tokens divides by no microbatches·data·fsdp from 2 to {most:,} (train and check "
               "need B divisible by it), so only data = fsdp = 1 with M = 1 can run it" + why)
    return ValueError(f"no mesh of {where} fits {cfg} in {budget / 1e9:.4g} GB per device "
                     f"(--hbm {budget:.4g} bytes){why}")


def print_header(args, cfg, plans, target, flags, choices, seconds: float) -> None:
    """plan's prose above the table: what was tried, the chip figures, the ranking form, the columns. ``target``:
    (chip, chips, HBM budget per device, where in words)."""
    chip, chips, budget, where = target
    transformer = cfg.has_attention
    other = "max" if args.form == "sum" else "sum"
    slices = plans[0].slices
    tried = (f"remat {', '.join(choices.remats)}" if not transformer else
             f"schedule, remat ({', '.join(choices.remats)}), attention ({', '.join(choices.attentions)}), context "
             f"strategy, sequence parallelism and optimizer sharding ({', '.join(choices.optimizer_sharding)})")
    say(f"{len(plans)} meshes of {where} fit {budget / 1e9:.4g} GB per device, each with its best microbatch count "
          f"(of 1 to {args.max_microbatches}), repeats and {tried}; B = {args.batch_tokens:,} tokens "
          f"({seconds * 1e3:.1f} ms)"
          + (f"; {slices} {f'nodes of {chips // slices} GPUs on NVLink' if chip.kind == 'gpu' else 'slices'} "
             f"joined by {chip.network_name} "
             f"({chip.dcn_bw:.3g} B/s per chip; column dcn: the mesh axis whose outermost factor spans them)"
             if slices > 1 else ""))
    say(f"chip figures: {chip.describe()}")
    say(f"Ranked by the {args.form} form" + (" (max(T_math, T_HBM) + the collective times; the compiled XXL forward "
          "step runs its collectives synchronously under libtpu's default flags: docs/findings.md, question (c))"
          if args.form == "sum" else " (every collective overlapped with the math)" if args.form == "max" else
          f" (the kernels at the efficiency their shapes get on the chip, scaling.kernels, + the collectives the "
          f"schedule of {flags.describe()} leaves exposed + its loop copies)")
          + f"; the {other} form beside it.")
    say(("The scheduled form is the step model's forecast (matmul efficiency fitted on measured runs: jax-scaling "
           "validate); the sum and max forms are " if args.form == "scheduled" or other == "scheduled" else
           "These are ") + "roofline bounds: their step times are lower bounds, MFU and HFU upper bounds "
          + ("(MFU counts the model's matmul FLOPs, attention's causal half, HFU the remat recompute and the "
             "pipeline's too)." if transformer else "(MFU counts model FLOPs 6PB-2BDF, HFU the remat recompute too)."))
    say("M: microbatches (gradient accumulation without stages; GPipe/circular with them), R: circular repeats, "
          "bubble: (S-1)/(R*M) of the ideal step, paid as executed FLOPs (the scan computes in bubble iterations); "
          "bubble s: T_math of the bubble iterations."
          + (" sched: the pipeline schedule (gpipe, circular, 1f1b; 1F1B's bubble 2(S-1)/M, interleaved "
             "(R*S+S-2)/(R*M)); SP: sequence parallelism; ctx: the context strategy (with a context axis); "
             "no critical batch is modelled for the transformer." if transformer else
             f" crit B: the global batch above which the {planner.crit_form(args.form)} form is compute bound "
             "(never: no batch makes it so on that mesh; the scheduled form's exposed collectives follow the flags' "
             "schedule, so it has no threshold of its own)."))


def print_plans(args, cfg, plans) -> None:
    """plan's table: the top --top plans, then the best without and with stages (# is the rank)."""
    transformer, slices = cfg.has_attention, plans[0].slices
    other = "max" if args.form == "sum" else "sum"
    best = {}
    for k, r in enumerate(plans, 1):
        best.setdefault(r.mesh["stage"] > 1, (k, r))
    shown = list(enumerate(plans[: args.top], 1)) + [best[s] for s in (False, True) if s in best]
    short = {"scheduled": "sched"}.get(args.form, args.form)
    header = ["#", *planner.plan_axes(cfg), *(["dcn"] if slices > 1 else []), "M", "R",
              *(["sched", "remat", "SP", "ctx", "opt"] if transformer else []), "bubble", "bubble s", "M_X",
              "M_Y", f"{short} s", f"{other} s", f"MFU {short}", f"MFU {other}", "HFU", "bound", "GB/dev",
              *([] if transformer else [f"crit B {planner.crit_form(args.form)}"]),
              *(["compiled GB", "fits"] if args.verify_top else [])]
    lines = table(header, [r.cells(k, slices, bool(args.verify_top)) for k, r in shown],
                  right=range(len(header)))
    print("\n".join(lines[: min(args.top, len(plans)) + 1]))
    rest = iter(lines[min(args.top, len(plans)) + 1:])
    for staged, label in ((False, "without stages"), (True, "with stages")):
        if staged in best:
            r = best[staged][1]
            print(f"Best {label}" + (f": bubble {r.bubble:.1%} of the ideal step, "
                                     f"{r.bubble_seconds:.3f} s" if staged else "") + " (# is the rank)")
            print(next(rest))
        else:
            print(f"No plan {label} fits")


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
