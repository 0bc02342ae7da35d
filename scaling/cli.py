"""The closed forms on the command line:
``python -m scaling {answer, plan, predict, validate, check, trace, layers, kernels}``.

``answer``, ``plan``, ``predict``, ``validate``, ``trace``, ``layers`` and ``kernels`` are closed forms only (no
jax; instant). ``check``, ``plan --verify-top``,
``answer --verify-pipeline`` and ``trace --verify`` compile programs, which the closed forms never do:
``add_commands`` takes those implementations from the command layer (jax_scaling.cli), which imports
them from verify when such a command runs.

Bad input prints one line on stderr and exits 2 (no traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time

from scaling import kernels, layer_estimator, seed000, seed002
from scaling import plan as planner
from scaling.answers import QUESTION, answers, render
from scaling.config import (ACCUMULATION_BYTES, ATTENTIONS, BLOCK_KINDS, CONTEXT_STRATEGIES, DEFAULT_PRECISION,
                            FSDP_GATHERS, MLP_KINDS,
                            PIPELINES, Precision,
                            OPTIMIZER_SHARDINGS, PRESETS,
                            REMAT_POLICIES, FFNConfig, MeshShape, Schedule, TransformerConfig, check_divisible,
                            get_preset, parse_mesh_spec, positive_float, positive_int)

from scaling.flags import DEFAULT_FLAGS, FLAG_SETS, FlagSet, check_modelled, get_flag_set
from scaling.hardware import DEFAULT_CHIP, GPU_NODE, chips_in, get_chip, parse_slice, slice_name, split_slices
from scaling.kernels import peak_flops
from scaling.limits import check_devices, check_flag, check_size, integer, number
from scaling.table import prose, table
from scaling.workload import Workload


def say(text: str) -> None:
    """Print a line of prose, wrapped (scaling.table.prose)."""
    print(prose(text))


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: <prog>: <message>`` on stderr, exit 2 (argparse's status), and the
    one rule for every flag's value (scaling.limits.check_flag: counts positive and 32-bit, figures finite and in
    their unit's range, text neither empty nor with a control character), applied to what the user gave."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message}\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        for a in self._actions:
            value = getattr(ns, a.dest, None)
            if a.option_strings and value is not a.default and (why := check_flag(a.dest, value)):
                raise ValueError(f"{self.prog}: {why}")  # run: one error line, exit 2
        return ns, rest


def needs(args, flag: str, other: str) -> None:
    """ValueError where --flag is given without --other, which it only changes (a silent no-op otherwise)."""
    if getattr(args, flag) and not getattr(args, other):
        raise ValueError(f"--{flag.replace('_', '-')} changes what --{other.replace('_', '-')} does; give it with "
                         f"--{other.replace('_', '-')} or leave it out")


def answer_command(args, verify_pipeline, render_pipeline) -> int:
    """Print (a)-(d); with --verify-pipeline, ``verify_pipeline(ans, verbose)`` (verify's)
    compiles (d)'s pipeline program and ``render_pipeline(ans)`` prints it after the answers. Sizes the package
    could not build (check_size) are refused like any bad input."""
    flags = flags_of(args)
    needs(args, "verbose", "verify_pipeline")
    check_size(Workload(FFNConfig(args.d_model, args.d_ff, args.blocks), MeshShape(), args.batch_tokens, flags=flags))
    ans = answers(
        d_model=args.d_model, d_ff=args.d_ff, blocks=args.blocks, fsdp=args.fsdp, tensor=args.tensor, mx=args.mx,
        my=args.my, flops=args.flops, w_ici=args.w_ici, hbm=args.hbm, gpu_hbm=args.gpu_hbm,
        batch_tokens=args.batch_tokens, stages=args.stages,
    )
    if args.verify_pipeline:
        verify_pipeline(ans, args.verbose, flags)
    print(json.dumps(ans, indent=2, default=str) if args.json else prose(render(ans)))
    if args.verify_pipeline and not args.json:
        print()
        print(render_pipeline(ans))
    return 0


def add_xla_flags_arg(p) -> None:
    """--xla-flags: a flag set of scaling/data/xla_flags.toml, or the user's flags (scaling.flags)."""
    p.add_argument("--xla-flags", metavar="NAME|='--flag=value ...'",
                   help=f"XLA flags for every compile: a set ({', '.join(FLAG_SETS)}; default {DEFAULT_FLAGS}, what "
                        "MaxText's v5p scripts pass) or your own, written --xla-flags='--xla_name=value ...'")


def flags_of(args) -> FlagSet:
    """The flag set --xla-flags names (checked without jax: ValueError naming an unknown set or a bad flag)."""
    return get_flag_set(getattr(args, "xla_flags", None) or DEFAULT_FLAGS)


def add_schedule_args(p) -> None:
    """--microbatches, --repeats, --schedule, --fsdp-gather (scaling.config.Schedule), and --xla-flags."""
    add_xla_flags_arg(p)
    g = p.add_argument_group("microbatches and pipeline stages (with a stage axis in --mesh)")
    g.add_argument("--microbatches", type=integer, default=1,
                   help="M microbatches: the pipeline's with a stage axis, else gradient accumulation (default 1)")
    g.add_argument("--repeats", type=integer, default=1,
                   help="R chunks of blocks per stage: the circular pipeline, or with --schedule 1f1b the "
                        "interleaved 1F1B (default 1: GPipe, 1F1B)")
    g.add_argument("--schedule", dest="pipeline", choices=PIPELINES, default="gpipe",
                   help="pipeline schedule: gpipe, circular (needs --repeats > 1; --repeats alone implies it) or "
                        "1f1b (transformer: a forward and a backward every iteration, activations bounded by the "
                        "stages; interleaved with --repeats R; default gpipe)")
    g.add_argument("--warmup-phases", action="store_true",
                   help="1f1b: its warm-up and cool-down iterations in loops of their own, one slot each "
                        "(Megatron's bubble (S-1)/(R*M); XLA:GPU copies the gradient accumulators between the loops)")
    g.add_argument("--fsdp-gather", default="microbatch", choices=FSDP_GATHERS,
                   help="gather FSDP weights once per microbatch or once per step (pipeline; default microbatch)")
    g.add_argument("--optimizer-sharding", choices=OPTIMIZER_SHARDINGS, default="fsdp",
                   help="fsdp (AdamW's state sharded as the weights) or zero1 (the moments and the update also "
                        "sharded over data; the gradients reduce-scattered over data·fsdp; default fsdp)")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron sequence parallelism on the tensor axis: activations split over tensor along the "
                        "tokens between blocks (all-gather + reduce-scatter instead of the all-reduce)")
    # the transformer's flags default to None, so that model_config can refuse them given for an FFN preset;
    # schedule_of fills in Schedule's defaults
    d = Schedule()
    g.add_argument("--attention", choices=ATTENTIONS,
                   help="transformer attention: materialized scores or flash (key blocks, online softmax; "
                        f"default {d.attention})")
    g.add_argument("--attention-block", type=integer, help=f"flash attention's key block (transformer; default "
                   f"{d.attention_block})")
    g.add_argument("--context-strategy", choices=CONTEXT_STRATEGIES,
                   help="transformer attention over a context axis: ulysses (all-to-all) or ring (ppermute; "
                        f"default {d.context})")


# the transformer-only flags of add_schedule_args: argument name -> Schedule field
TRANSFORMER_SCHEDULE = {"attention": "attention", "attention_block": "attention_block", "context_strategy": "context"}


def schedule_of(args) -> Schedule:
    """The Schedule of --microbatches, --repeats, --fsdp-gather, --sequence-parallel and the transformer's
    --attention, --attention-block, --context-strategy (Schedule's defaults where not given; ValueError naming a
    bad value)."""
    given = {f: getattr(args, a) for a, f in TRANSFORMER_SCHEDULE.items() if getattr(args, a, None) is not None}
    return Schedule(args.microbatches, args.repeats, args.fsdp_gather, args.sequence_parallel,
                    optimizer_sharding=args.optimizer_sharding, pipeline=getattr(args, "pipeline", "gpipe"),
                    warmup_phases=getattr(args, "warmup_phases", False), **given)


# --flag: (help, model kinds it applies to)
MODEL_OVERRIDES = {"d_model": "D", "d_ff": "F", "blocks": "L"}
TRANSFORMER_OVERRIDES = {"seq_len": "T, tokens per sequence", "heads": "N, query heads",
                         "kv_heads": "K, key/value heads (grouped-query attention)",
                         "head_dim": "H, the head dimension (default D/N)",
                         "vocab": "V, the vocabulary: token ids in, an embedding, logits and a cross-entropy loss "
                                  "(default none: token vectors in and out)"}


# the transformer's kinds: --flag: (choices, help)
TRANSFORMER_CHOICES = {"mlp": (MLP_KINDS, "the MLP: act(h·W_in)·W_out with relu or gelu, or swiglu (three matrices)"),
                       "block": (BLOCK_KINDS, "serial (attention, then the MLP) or parallel (both on one norm, summed: "
                                              "one tensor-parallel reduction per layer)")}


def add_model_args(p, preset: str) -> None:
    """--preset and the overrides of its dimensions (model_config)."""
    p.add_argument("--preset", default=preset, help=f"model preset (default {preset}; {_presets_of(FFNConfig)}; "
                   f"{_presets_of(TransformerConfig)})")
    for name, what in {**MODEL_OVERRIDES, **TRANSFORMER_OVERRIDES}.items():
        transformer = name in TRANSFORMER_OVERRIDES
        p.add_argument(f"--{name.replace('_', '-')}", type=integer,
                       help=f"override the preset's {what}" + (" (transformer)" if transformer else ""))
    for name, (kinds, what) in TRANSFORMER_CHOICES.items():
        p.add_argument(f"--{name}", choices=kinds, help=f"{what} (transformer)")
    p.add_argument("--tied-embeddings", action="store_true", default=None,
                   help="the output projection is the embedding (transformer with --vocab)")


def _presets_of(kind) -> str:
    """'FFN presets: tiny, ...' or 'transformer presets: ...' (scaling.config.PRESETS)."""
    return (("FFN" if kind is FFNConfig else "transformer") + " presets: "
            + ", ".join(k for k, v in PRESETS.items() if isinstance(v, kind)))


def model_config(args):
    """The preset named by --preset with the overrides of add_model_args (ValueError naming a bad value,
    or a transformer flag given for an FFN preset: a dimension of add_model_args or an attention flag of
    add_schedule_args)."""
    cfg = get_preset(args.preset)
    over = {k: getattr(args, k, None) for k in {**MODEL_OVERRIDES, **TRANSFORMER_OVERRIDES}}
    for k, v in over.items():
        if v is not None:
            positive_int(f"--{k.replace('_', '-')}", v)
    over.update({k: getattr(args, k, None) for k in (*TRANSFORMER_CHOICES, "tied_embeddings")})
    if isinstance(cfg, FFNConfig):
        extra = [k for k in (*TRANSFORMER_OVERRIDES, *TRANSFORMER_SCHEDULE, *TRANSFORMER_CHOICES, "tied_embeddings")
                 if getattr(args, k, None) is not None]
        if extra:
            what = "dimension" if extra[0] in TRANSFORMER_OVERRIDES else "flag"
            raise ValueError(f"--{extra[0].replace('_', '-')} is a transformer {what}; {args.preset!r} is an FFN "
                             "stack (transformer presets: "
                             + ", ".join(k for k, v in PRESETS.items() if isinstance(v, TransformerConfig)) + ")")
        over = {k: over[k] for k in MODEL_OVERRIDES}
    return cfg.replace(**over)


def named_slice(args):
    """(chip, slice dims) of --slice, refused beside --chips or another --chip."""
    if args.chips is not None:
        raise ValueError(f"--slice {args.slice} names the chip count already; leave out --chips")
    chip, dims = parse_slice(args.slice)
    if args.chip is not None and get_chip(args.chip) is not chip:
        raise ValueError(f"--slice {args.slice} is a {chip.name} slice, not {args.chip}")
    return chip, dims


def plan_target(args):
    """(chip, chips, slice dims or None) from --slice, or --chip and --chips."""
    if args.slice is not None:
        chip, dims = named_slice(args)
        return chip, chips_in(dims), dims
    return get_chip(args.chip or DEFAULT_CHIP), 64 if args.chips is None else args.chips, None


# plan's default batch for a transformer: Llama 2's 4M tokens (Touvron et al. 2023, section 2.2)
TRANSFORMER_PLAN_BATCH = 4_194_304


def plan_choices(args, cfg) -> planner.Choices:
    """What plan tries on each mesh (scaling.plan.Choices) from --remat, --schedule, --attention,
    --context-strategy, --sequence-parallel and --optimizer-sharding: a given name fixes it; left out, every one
    (--attention: flash; the FFN stack: remat none). Those flags are the transformer's: ValueError for the FFN
    stack's plan."""
    given = {k: getattr(args, k) for k in ("pipeline", "attention", "context_strategy", "sequence_parallel",
                                           "optimizer_sharding") if getattr(args, k) is not None}
    if isinstance(cfg, FFNConfig):
        if given:
            k = next(iter(given))
            raise ValueError(f"--{'schedule' if k == 'pipeline' else k.replace('_', '-')} is a transformer flag; "
                             f"{args.preset!r} is an FFN stack")
        return planner.Choices.of(cfg, args.remat)
    sp = {"on": True, "off": False}.get(args.sequence_parallel)
    return planner.Choices.of(cfg, args.remat, args.pipeline, args.attention or "flash", args.context_strategy, sp,
                              args.optimizer_sharding)


def plan_command(args, verify) -> int:
    """Rank the plans and print them; ``verify(plans, cfg, chip, chips, budget, verbose, flags)`` (verify's, with
    --verify-top) adds the compiled peak of the first K."""
    flags = check_modelled(flags_of(args), "plan")  # an unknown set or flag: refused before anything is enumerated
    needs(args, "verbose", "verify_top")
    if args.verify_top < 0:
        raise ValueError(f"--verify-top must be 0 (compile none) or a positive count of plans, got {args.verify_top}")
    cfg = model_config(args)
    choices = plan_choices(args, cfg)
    transformer = isinstance(cfg, TransformerConfig)
    if args.batch_tokens is None:
        args.batch_tokens = TRANSFORMER_PLAN_BATCH if transformer else 25600
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
        miss = planner.nearest_miss(cfg, chip, chips, args.batch_tokens, form=args.form,
                                    max_microbatches=args.max_microbatches, max_repeats=args.max_repeats,
                                    flags=flags, choices=choices)
        why = "" if miss is None else (
            f"; nearest miss: {_mesh_text(miss['mesh'])}{_schedule_text(miss)} "
            f"needs {miss['memory_bytes'] / 1e9:.1f} GB per device ("
            + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in miss["memory_terms"].items() if k != "total" and v >= 5e7)
            + " GB): " + f"{(miss['memory_bytes'] - budget) / 1e9:.1f} GB over")
        B, most = args.batch_tokens, chips * args.max_microbatches
        if miss is None:  # no mesh runs it at all, whatever the memory: say which rules fail
            raise ValueError(f"no mesh of {where} can run {cfg} with B = {B:,} tokens, whatever the memory: "
                             + unsplittable(cfg, chips * chip.devices_per_chip, B, planner.plan_axes(cfg), flags))
        if all(B % k for k in range(2, min(B, most) + 1)):  # the batch splits no way: say so first
            why = (f"; B = {B:,} tokens divides by no microbatches·data·fsdp from 2 to {most:,} (train and check "
                   "need B divisible by it), so only data = fsdp = 1 with M = 1 can run it" + why)
        raise ValueError(f"no mesh of {where} fits {cfg} in {budget / 1e9:.4g} GB per device "
                         f"(--hbm {budget:.4g} bytes){why}")
    if args.verify_top:
        verify(plans[: args.verify_top], cfg, chip, chips, budget, args.verbose, flags)
    if args.json:
        print(json.dumps({"plans": plans[: args.top], "count": len(plans), "enumerate_seconds": seconds,
                          "chip": chip.name, "chips": chips, "slice": name, "hbm_budget": budget}, indent=2))
        return 0
    other = "max" if args.form == "sum" else "sum"
    slices = plans[0]["slices"]
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
             f" crit B: the global batch above which the {crit_form(args.form)} form is compute bound (never: no "
             "batch makes it so on that mesh; the scheduled form's exposed collectives follow the flags' schedule, "
             "so it has no threshold of its own)."))
    best = {}
    for k, r in enumerate(plans, 1):
        best.setdefault(r["mesh"]["stage"] > 1, (k, r))
    shown = list(enumerate(plans[: args.top], 1)) + [best[s] for s in (False, True) if s in best]
    short = {"scheduled": "sched"}.get(args.form, args.form)
    header = ["#", *planner.plan_axes(cfg), *(["dcn"] if slices > 1 else []), "M", "R",
              *(["sched", "remat", "SP", "ctx", "opt"] if transformer else []), "bubble", "bubble s", "M_X",
              "M_Y", f"{short} s", f"{other} s", f"MFU {short}", f"MFU {other}", "HFU", "bound", "GB/dev",
              *([] if transformer else [f"crit B {crit_form(args.form)}"]),
              *(["compiled GB", "fits"] if args.verify_top else [])]
    lines = table(header, [_plan_cells(r, k, slices, args.form, bool(args.verify_top)) for k, r in shown],
                  right=range(len(header)))
    print("\n".join(lines[: min(args.top, len(plans)) + 1]))
    rest = iter(lines[min(args.top, len(plans)) + 1:])
    for staged, label in ((False, "without stages"), (True, "with stages")):
        if staged in best:
            r = best[staged][1]
            print(f"Best {label}" + (f": bubble {r['bubble']:.1%} of the ideal step, "
                                     f"{r['bubble_seconds']:.3f} s" if staged else "") + " (# is the rank)")
            print(next(rest))
        else:
            print(f"No plan {label} fits")
    return 0


def crit_form(form: str) -> str:
    """The form whose critical batch plan shows: the ranking form's, or under the scheduled form (which has none of
    its own: its exposed collectives depend on the flags' schedule, not on a batch threshold) the sum form's."""
    return "sum" if form == "scheduled" else form


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


def _plan_cells(r: dict, k: int, slices: int, form: str, compiled: bool) -> list[str]:
    """The cells of one plan's row (plan_command's header); the other form's step time and MFU beside the
    ranking form's."""
    c = r.get(f"critical_batch_{crit_form(form)}", r["critical_batch"])
    crit = "never" if c is None else "any" if c == 0 else f"{c:,.0f}"
    step = {"sum": r["step_seconds_sum"], "max": r["step_seconds_max"], "scheduled": r["step_seconds_scheduled"]}
    mfu = {"sum": r["mfu_sum"], "max": r["mfu_max"], "scheduled": r["mfu"]}
    other = "max" if form == "sum" else "sum"
    transformer = "attention" in r  # the transformer's plan (scaling.plan.plan)
    mesh = r["mesh"]
    chosen = [r["pipeline"] if mesh["stage"] > 1 else "-", r["remat"], "on" if r["sequence_parallel"] else "-",
              r["context_strategy"] if mesh["context"] > 1 else "-",
              "zero1" if r["optimizer_sharding"] == "zero1" else "-"] if transformer else []
    cells = [k, *mesh.values(), *([r["dcn_axis"]] if slices > 1 else []), r["microbatches"], r["repeats"], *chosen,
             f"{r['bubble']:.3f}", f"{r['bubble_seconds']:.3f}", r["M_X"], r["M_Y"], f"{step[form]:.3f}",
             f"{step[other]:.3f}", f"{mfu[form]:.3f}", f"{mfu[other]:.3f}", f"{r['hfu']:.2f}", r["bound"],
             f"{r['memory_bytes'] / 1e9:.1f}", *([] if transformer else [crit])]
    if compiled:
        peak, fits = r.get("compiled_peak_bytes"), r.get("compiled_fits")
        cells += (["", ""] if "compiled_on" not in r else
                  [f"{peak / 1e9 if peak else float('nan'):.1f}", "yes" if fits else "no"])
    return cells


def _schedule_text(r: dict) -> str:
    return ((f" with M={r['microbatches']}" if r["microbatches"] > 1 else "")
            + (f", R={r['repeats']}" if r["repeats"] > 1 else "")
            + (f", {r['pipeline']}" if r["mesh"]["stage"] > 1 and "attention" in r else "")
            + (f", remat {r['remat']}" if "attention" in r else ""))


def _mesh_text(mesh: dict) -> str:
    return ",".join(f"{a}={n}" for a, n in mesh.items() if n > 1) or "1 device"


def predict_target(args):
    """(chip, slice dims, slices) from --slice and --slices, or --chip and --chips (GPUs: nodes of GPU_NODE; TPUs:
    hardware.split_slices), the GPU's share of --inter-node-bandwidth (bytes/s per node) as its dcn_bw."""
    if args.slice is not None:
        chip, dims = named_slice(args)
        slices = positive_int("--slices", 1 if args.slices is None else args.slices)
    else:
        if args.slices is not None:
            raise ValueError("--slices counts slices of --slice; with --chip give --chips")
        if args.chips is None:
            raise ValueError("give the hardware: --chip and --chips, or --slice (and --slices)")
        chip, chips = get_chip(args.chip or DEFAULT_CHIP), check_devices("--chips", args.chips)
        if chip.kind == "gpu":
            node = min(chips, GPU_NODE)
            if chips % node:
                raise ValueError(f"{chips} GPUs are not whole nodes of {GPU_NODE}")
            slices, dims = chips // node, (node,)
        else:
            slices, dims = split_slices(chip, chips)
    if args.inter_node_bandwidth is not None:
        if chip.kind != "gpu":
            raise ValueError("--inter-node-bandwidth is a GPU cluster's (bytes/s per node); a TPU slice's DCN is the "
                             "hardware table's")
        bw = positive_float("--inter-node-bandwidth", args.inter_node_bandwidth)
        chip = dataclasses.replace(chip, dcn_bw=bw / dims[0])
    return chip, dims, slices


def predict_batch(args, cfg, mesh) -> tuple[int, int]:
    """(B tokens, M microbatches) from --global-batch (sequences; a transformer's) or --batch-tokens, and
    --microbatch (sequences per microbatch on each data·fsdp shard: M = global batch / (microbatch·data·fsdp)) or
    --microbatches."""
    if (args.global_batch is None) == (args.batch_tokens is None):
        raise ValueError("give the batch: --global-batch (sequences) or --batch-tokens")
    if args.global_batch is not None:
        if not isinstance(cfg, TransformerConfig):
            raise ValueError("--global-batch counts sequences (a transformer's); give the FFN stack --batch-tokens")
        B = positive_int("--global-batch", args.global_batch) * cfg.seq_len
    else:
        B = positive_int("--batch-tokens", args.batch_tokens)
    M = args.microbatches
    if args.microbatch is not None:
        if M != 1:
            raise ValueError("give --microbatch (sequences per microbatch) or --microbatches (their count), not both")
        if not isinstance(cfg, TransformerConfig):
            raise ValueError("--microbatch counts sequences (a transformer's); give the FFN stack --microbatches")
        replicas = mesh["data"] * mesh["fsdp"]
        seqs = B // cfg.seq_len
        per = positive_int("--microbatch", args.microbatch) * replicas
        if seqs % per:
            raise ValueError(f"--global-batch {seqs} is not a whole number of microbatches of {args.microbatch} "
                             f"sequences on each of data·fsdp = {replicas} shards")
        M = seqs // per
    return B, M


def predict_command(args) -> int:
    """One configuration's predicted step (predict_result), term by term, or with --json one object."""
    out, p = predict_result(args)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print_prediction(out, p)
    if args.kernels:
        print_kernels(out, get_chip(out["chip"]))
    return 0


def predict_result(args) -> tuple[dict, object]:
    """(the JSON object predict prints, the Prediction) of predict's flags: scaling.plan.predict_placed, whose
    program.predict is the planner's function."""
    flags = check_modelled(flags_of(args), getattr(args, "command", "predict"))
    cfg = model_config(args)
    chip, dims, slices = predict_target(args)
    mesh = parse_mesh_spec(args.mesh)
    B, M = predict_batch(args, cfg, mesh)
    args.microbatches = M
    schedule = schedule_of(args)
    w = Workload(cfg, mesh, B, args.step, args.remat, schedule,
                 precision=precision_of(args.dtype, args.grad_accumulation), flags=flags)
    check_divisible(cfg, mesh, B)
    check_size(w)
    peak_flops(chip, args.dtype)  # ValueError where the table has no rate for it
    given = {a: n for a, n in parse_mesh_spec(args.dcn_mesh).items()} if args.dcn_mesh else None
    p, dcn, lay = planner.predict_placed(w, chip, dims, slices, given, args.form, args.kernel_model)
    t, form = p.times, args.form
    step = float(t.step[form])
    devices = mesh.devices
    terms = {"compute": float(t.compute), "math": float(t.math), "hbm": float(t.hbm),
             **{f"comms.{a}": float(v) for a, v in t.comms.items()},
             **{f"exposed.{a}": float(v) for a, v in t.exposed.items()}, "loop_copies": float(t.copies)}
    out = {"step_seconds": step, "form": form, "mfu": float(t.mfu[form]), "hfu": float(t.hfu[form]),
           "tokens_per_second_per_device": B / step / devices, "memory_per_device_bytes": float(p.memory["total"]),
           "hbm_budget_bytes": chip.hbm_budget, "fits": bool(p.memory["total"] <= chip.hbm_budget),
           "bound": str(t.bound), "terms": terms, "step_seconds_by_form": {k: float(v) for k, v in t.step.items()},
           "memory_terms": {k: float(v) for k, v in p.memory.items()}, "flops": {k: float(v) for k, v in
                                                                                p.flops.items()},
           "chip": chip.name, "devices": devices, "slices": slices, "slice_shape": list(dims), "mesh": dict(mesh),
           "dcn": dcn, "layout": {a: {"lens": v[0], "wrap": v[1]} for a, v in lay.items()},
           "batch_tokens": B, "microbatches": M, "model": dataclasses.asdict(cfg), "remat": args.remat,
           "schedule": {k: str(v) if not isinstance(v, (int, bool)) else v
                        for k, v in dataclasses.asdict(schedule).items()}, "xla_flags": flags.name,
           "step": args.step, "model_text": str(cfg), "xla_flags_text": flags.describe(), "dtype": args.dtype,
           "kernel_model": args.kernel_model}
    if not out["fits"]:
        need, have = out["memory_per_device_bytes"], chip.hbm_budget
        out["fit_note"] = (f"the step needs {need / 1e9:.2f} GB per device, {(need - have) / 1e9:.2f} GB over the "
                           f"{have / 1e9:.4g} GB usable on a {chip.name}: the step time is of a run that cannot start")
    if getattr(args, "kernels", False):
        ks = kernels.step_kernels(w, chip, args.dtype, args.kernel_model)
        out["kernels"] = [{"name": k.name, "pass": k.pass_, "kind": k.kind, "shape": None if k.shape is None else
                           [float(v) for v in k.shape], "calls": float(k.calls), "flops": float(k.flops),
                           "bytes": float(k.bytes), "executed": float(k.executed), "efficiency": float(k.efficiency),
                           "seconds": float(k.seconds), "bound": str(k.bound)} for k in ks]
    return out, p


DTYPE_BYTES = {"bf16": 2, "fp32": 4, "tf32": 4, "int8": 1, "fp8": 1}  # an element of each matmul input type


def precision_of(dtype: str, accumulation: str = "package") -> Precision:
    """The precision policy with ``dtype`` matmuls: activations and weights on the wire in its bytes
    (DTYPE_BYTES; tf32 is stored as fp32), FP32 master weights, gradients and moments as always; the gradient
    accumulation of the runtime ``accumulation`` (scaling.config.ACCUMULATION_BYTES)."""
    b = DTYPE_BYTES[dtype]
    return dataclasses.replace(DEFAULT_PRECISION, compute=b, weight_comm=b, dtype=dtype, accumulation=accumulation)


def kernel_report(out: dict) -> str:
    """A model's kernel report in seed 002's order (predict --kernels' kernels): per kernel its FLOPs, HBM bytes,
    intensity against the inflection point C/W_hbm and time; the passes' sums (seed 002's Cf, Cb, R); the memory
    per device; the parallelism; the step time and what it is made of (the scheduled form)."""
    chip = get_chip(out["chip"])
    ridge = peak_flops(chip, out["dtype"]) / chip.device_hbm_bw
    lines = [prose(f"DOES NOT FIT: {out['fit_note']}")] if not out["fits"] else []
    lines += [f"{out['model_text']} on {out['devices']} {chip.name} devices, B = {out['batch_tokens']:,} tokens, "
             f"M = {out['microbatches']}, kernel model {out['kernel_model']}", ""]
    passes = {}
    for k in out["kernels"]:
        inten = k["flops"] / k["bytes"] if k["bytes"] else float("inf")
        shape = "" if k["shape"] is None else " [" + "x".join(f"{v:.0f}" for v in k["shape"][:3]) + "]"
        lines += [f"inflection_point: {ridge:.2f}", f"comp_int: {inten:.2f}",
                  f"{k['name']} ({k['pass']}){shape} flop: {k['flops']:,.0f}, mem: {k['bytes']:,.0f}, calls: "
                  f"{k['calls']:,.6g}", f"{k['name']} ({k['pass']}) time: {k['seconds']:.6g} ({k['bound']})", ""]
        passes[k["pass"]] = passes.get(k["pass"], 0.0) + k["seconds"]
    t = out["terms"]
    lines.append(", ".join(f"{p}: {v:.6g}" for p, v in passes.items()) + f"; compute {t['compute']:.6g} s")
    lines += ["", "Memory per device", *(f"{k}: {v / 1e9:.2f} GB" for k, v in out["memory_terms"].items()
                                         if k != "total"),
              f"Total: {out['memory_per_device_bytes'] / 1e9:.2f} GB of {out['hbm_budget_bytes'] / 1e9:.1f} GB", "",
              "Parallelism: " + ", ".join(f"{a}: {n}" for a, n in out["mesh"].items()), "",
              "exposed: " + ", ".join(f"{k[8:]} {v:.6g} s" for k, v in t.items() if k.startswith("exposed."))
              + f"; loop copies {t['loop_copies']:.6g} s",
              f"Time: {out['step_seconds']:.8f} ({out['form']} form; MFU {out['mfu']:.3f})"]
    return "\n".join(lines) + "\n"


def print_kernels(out: dict, chip) -> None:
    """predict --kernels: one line per kernel (its FLOPs, HBM bytes, intensity against the chip's ridge point C/W_hbm,
    the efficiency its shape gets, seconds, bound) and the sums per pass, as seed 002's report lays them out."""
    ridge = peak_flops(chip, out["dtype"]) / chip.device_hbm_bw
    rows = []
    for k in out["kernels"]:
        shape = "" if k["shape"] is None else "x".join(f"{v:.0f}" for v in k["shape"][:3]) + (
            f" (x{k['shape'][3]:.0f})" if k["shape"][3] != 1 else "")
        inten = k["flops"] / k["bytes"] if k["bytes"] else float("inf")
        rows.append((k["name"], k["pass"], shape, f"{k['calls']:.4g}", f"{k['flops'] / 1e12:.4g}",
                     f"{k['bytes'] / 1e9:.4g}", f"{inten:.4g}", f"{k['efficiency']:.3f}" if k["shape"] else "",
                     f"{k['seconds'] * 1e3:.4g}", k["bound"]))
    how = ("efficiency = eta·q(shape)" if out["kernel_model"] == "efficiency" else
           f"hierarchical: matmul bytes from tiles through {chip.onchip / 2**20:.0f} MiB on chip, efficiency = eta")
    say(f"kernels per device (ridge point C/W_hbm = {ridge:.0f} FLOPs/byte; {how}, eta = "
          f"{chip.matmul_efficiency} on {chip.name}; flash attention's time counts its causal blocks)")
    print("\n".join(table(["kernel", "pass", "m x n x k", "calls", "TFLOPs", "GB", "FLOPs/B", "eff", "ms", "bound"],
                          rows, right=range(3, 9))))
    by = {}
    for k in out["kernels"]:
        by[k["pass"]] = by.get(k["pass"], 0.0) + k["seconds"]
    say("per pass: " + ", ".join(f"{k} {v:.4g} s" for k, v in by.items())
          + f"; compute term {sum(by.values()):.4g} s")


def print_prediction(out: dict, p) -> None:
    """predict's text: the configuration, the terms, the step, tokens/s, MFU and memory per device."""
    t, form, step, slices, dims = p.times, out["form"], out["step_seconds"], out["slices"], out["slice_shape"]
    chip, dcn, devices = get_chip(out["chip"]), out["dcn"], out["devices"]
    if not out["fits"]:
        say(f"DOES NOT FIT: {out['fit_note']}")
    B, M = out["batch_tokens"], out["microbatches"]
    where = (f"{slices} slices of {'x'.join(map(str, dims))}" if chip.kind == "tpu" and slices > 1 else
             f"{slices} nodes of {dims[0]}" if chip.kind == "gpu" and slices > 1 else "x".join(map(str, dims)))
    net = (f"; over {chip.network_name}: " + ", ".join(f"{a} x{n}" for a, n in dcn.items())) if dcn else ""
    say(f"{out['model_text']}")
    say(f"on {devices} {chip.name} devices ({where}{net}), mesh {_mesh_text(out['mesh'])}, "
        f"B = {B:,} tokens, M = {M}, remat {out['remat']}, {out['step']} step, {out['xla_flags_text']}")
    rows = [("compute", "the kernels at their shapes' efficiency (--kernels)", t.compute),
            ("math", "executed FLOPs / C (roofline)", t.math), ("hbm", "HBM bytes / bandwidth (roofline)", t.hbm)]
    rows += [(f"{a}", f"collectives over {a} (all)", v) for a, v in t.comms.items()]
    rows += [(f"{a} exposed", "what the schedule leaves exposed", v) for a, v in t.exposed.items()]
    rows += [("loop copies", "2 x loop-state copy bytes / HBM bandwidth", t.copies)]
    print("\n".join(table(["term", "what", "seconds"], [(n, w_, f"{float(v):.4g}") for n, w_, v in rows])))
    say(f"step: {step:.4g} s ({form}; " + ", ".join(f"{k} {float(v):.4g}" for k, v in t.step.items() if k != form)
          + f"), bound: {t.bound}")
    say(f"tokens/s per device: {B / step / devices:,.1f}; MFU {float(t.mfu[form]):.3f} (model FLOPs: the matmuls "
          f"the step needs, attention's causal half), HFU {float(t.hfu[form]):.3f}")
    over = p.memory["total"] - out["hbm_budget_bytes"]
    say(f"memory per device: {p.memory['total'] / 1e9:.2f} GB of {out['hbm_budget_bytes'] / 1e9:.4g} GB ("
          + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in p.memory.items() if k != "total" and v >= 1e7) + ")"
          + (f": does not fit, {over / 1e9:.2f} GB over" if over > 0 else ""))


def validate_command(args) -> int:
    """Every measured run predicted (scaling.validate): per row measured and predicted seconds and the error; per
    group the median and largest |error|; per comparison Spearman's rank correlation."""
    from scaling.hardware import CHIPS
    from scaling.validate import fit_efficiency, refitted, validate

    if args.fit and args.json:
        raise ValueError("--fit prints the fitted efficiencies as a table; --json is the validation's (give one)")
    if args.fit:
        rows = []
        for name, chip in CHIPS.items():
            if chip.fitted_on and (chip.onchip or args.kernel_model == "efficiency"):
                fit = fit_efficiency(name, kernel_model=args.kernel_model)
                rows.append((name, chip.fitted_on, f"{fit:.3f}", f"{chip.matmul_efficiency:.3f}",
                             ", ".join(c.name for c in CHIPS.values() if c.efficiency_as == name)))
        print("\n".join(table(["chip", "fitted on", "fitted eta", "table's eta", "borrowed by"], rows, right=(2, 3))))
        return 0
    if args.kernel_model == "efficiency":
        v = validate()
    else:  # each fitted chip's eta refitted under that model on its own named run; rows it cannot predict left out
        r = refitted(args.kernel_model)
        v = r["validation"]
        say(f"kernel model {args.kernel_model!r}, eta refitted on each chip's named run: "
              + ", ".join(f"{c} {e:.3f}" for c, e in r["eta"].items()) + "; rows on chips without an on-chip "
              "memory size left out")
    if args.json:
        print(json.dumps(v, indent=2))
        return 0
    print("\n".join(table(["run", "table", "measured s", "predicted s", "error", "MFU", "fits", "bound", "fitted"],
                          [(r["id"], r["table"], f"{r['measured_seconds']:.3f}", f"{r['predicted_seconds']:.3f}",
                            f"{r['error']:+.1%}", f"{r['mfu']:.3f}", "yes" if r["fits"] else "no", r["bound"],
                            f"eta {r['fitted']}" if r["fitted"] else "") for r in v["rows"]], right=(2, 3, 4, 5))))
    for g, s in v["groups"].items():
        say(f"{g}: {s['n']} runs, median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}; the "
              f"{s['held_out']} held out (no coefficient fitted on them): median {s['held_out_median_abs_error']:.1%}, "
              f"max {s['held_out_max_abs_error']:.1%}")
    if v["memory"]:
        m = v["memory"]
        say(f"memory per device against the {m['n']} measured peaks: median |error| {m['median_abs_error']:.1%}, "
              f"max {m['max_abs_error']:.1%}")
    say("Spearman (predicted against measured step, rows of one comparison): "
          + ", ".join(f"{c} {r:.2f}" for c, r in v["comparisons"].items()))
    say("error = predicted/measured - 1; runs, their sources and what each assumes: scaling/data/measured.toml")
    return 0


def user_model(args, extra: tuple[str, ...], default_preset: str, command: str):
    """The transformer a seed command's flags describe (--preset or its dimensions, and the command's ``extra``
    flags), or None where none is given (the seed's own report). ValueError for --seed with a model, or an FFN
    preset."""
    given = [f for f in ("preset", *extra, *MODEL_OVERRIDES, *TRANSFORMER_OVERRIDES, *TRANSFORMER_CHOICES)
             if getattr(args, f, None) not in (None, False)]
    if not given:
        return None
    if args.seed is not None:
        raise ValueError(f"--seed is the reference's {command}; a model's takes --preset and its dimensions")
    args.preset = args.preset or default_preset
    cfg = model_config(args)
    if not isinstance(cfg, TransformerConfig):
        raise ValueError(f"--preset {args.preset}: {command} takes a transformer (an FFN preset given)")
    return cfg


def trace_command(args, verify_trace) -> int:
    """Seed 000's trace from the closed forms (scaling.seed000); with --verify, ``verify_trace(verbose)``
    (verify's) compiles its Ulysses layer and the table follows. With a model (--preset or its flags), --context,
    --data, --tensor and --chip: the same trace for that transformer (seed000.model_trace), --verify compiling its
    one layer over --context v5p chips; --json one object."""
    flags = flags_of(args)  # refused before anything is printed
    needs(args, "verbose", "verify")
    cfg = user_model(args, ("context", "data", "tensor", "chip"), "seed000", "trace")
    if cfg is None:
        if args.json:
            raise ValueError("--json is a model's trace's (give --preset ...); seed 000's is its table")
        print(seed000.render())
        if args.verify:
            print()
            print(verify_trace(args.verbose, flags))
        return 0
    check_size(Workload(cfg, MeshShape(), cfg.seq_len))  # one sequence, as the seed's trace
    chip = get_chip(args.chip or "H100")
    context = args.context or 1
    t = seed000.model_trace(cfg, context, args.data or 1, args.tensor or context // (args.data or 1),
                            gpu=chip.kind == "gpu")
    t["chip"] = chip.name
    if args.verify:
        t["verify"] = verify_trace(args.verbose, flags, cfg, context)
    if args.json:
        print(json.dumps(t))
        return 0
    print(seed000.render_model(t))
    if args.verify:
        v = t["verify"]
        say(f"compiled for {v['devices']} ({v['mesh']}, one layer, forward, flash): peak {v['compiled'] / 1e9:.2f} "
              f"GB against the closed form's {v['closed_form'] / 1e9:.2f} GB, ratio {v['ratio']:.4f}")
    return 0


def layers_command(args) -> int:
    """Seed 001's per-layer tables (scaling.layer_estimator), or its cell-by-cell comparison; with --preset (or
    any model flag), --tp, --sequence-parallel, --batch and --chip, the same tables for that transformer."""
    if args.cells and args.preset is not None:
        raise ValueError("--cells is seed 001's; a model's tables take --preset, --tp, --chip")
    if args.cells and args.json:
        raise ValueError("--cells and --json are two forms of the comparison; give one (--json: the seed's tables)")
    cfg = user_model(args, ("tp", "chip", "batch", "vector_tflops", "sequence_parallel"), "llama2-7b", "layers")
    if cfg is None:
        if args.json:
            print(json.dumps(layer_estimator.seed001_tables()))
        else:
            print(layer_estimator.compare_text() if args.cells else layer_estimator.render(tuple(args.table)))
        return 0
    if args.cells:
        raise ValueError("--cells is seed 001's; a model's tables take --preset, --tp, --chip")
    check_size(Workload(cfg, MeshShape(), (args.batch or 1) * cfg.seq_len))
    chip = get_chip(args.chip or "A100-80GB")
    tp = args.tp or 1
    t = layer_estimator.model_tables(cfg, args.batch or 1, tp, args.sequence_parallel,
                                     layer_estimator.system_of(chip, args.vector_tflops))
    if args.json:
        print(json.dumps({"model": dataclasses.asdict(cfg), "chip": chip.name, "tp": tp, "batch": args.batch or 1,
                          "sequence_parallel": args.sequence_parallel, **t}))
        return 0
    sysd = layer_estimator.system_of(chip, args.vector_tflops)
    header = (f"{cfg} on {chip.name}: b = {args.batch or 1} sequences, tp = {tp}, sequence parallelism "
              f"{'on' if args.sequence_parallel else 'off'}, depth = {cfg.blocks}; 16-bit elements, FLOPs in TFLOP, "
              "memory in GB, times in ms\nsystem: " + ", ".join(f"{k}={v:g}" for k, v in sysd.items()))
    print(layer_estimator.render_model(t, prose(header), tuple(args.table)))
    return 0


def kernels_command(args) -> int:
    """Seed 002's DeepFlow report from the closed forms (scaling.seed002): every numeric line beside the package's
    figure; --text the whole report regenerated in the seed's layout; --json the rows and the report's figures.
    With --mesh, the same report for any model and chip from the step model's kernels (kernel_report)."""
    given = [f for f in ("preset", "chip", "chips", "slice", "global_batch", "batch_tokens", "microbatch",
                         *MODEL_OVERRIDES, *TRANSFORMER_OVERRIDES, *TRANSFORMER_CHOICES)
             if getattr(args, f, None) is not None]
    if args.mesh is None and given:
        raise ValueError(f"a model's kernel report needs --mesh (given: --{given[0].replace('_', '-')}); without "
                         "model flags kernels prints seed 002's")
    if args.text and args.json:
        raise ValueError("--text and --json are two forms of the report; give one")
    args.preset = args.preset or "xxl"  # predict's default
    if args.mesh is not None:
        if args.seed is not None or args.text:
            raise ValueError("--seed and --text are the seed's report; a model's report takes --mesh and no --seed")
        args.kernels = True
        out, _ = predict_result(args)
        print(json.dumps(out, indent=2) if args.json else kernel_report(out), end="\n" if args.json else "")
        return 0
    if args.json:
        r = seed002.report()
        print(json.dumps({"rows": seed002.rows(r), "time": r["time"], "params": r["params"],
                          "parts": r["parts"], "hardware": r["hw"]}))
    else:
        print(seed002.text() if args.text else seed002.render() + "\n", end="")
    return 0


def add_predict_parser(sub) -> None:
    """predict's subcommand and flags (add_commands; scaling.validate parses its rows with it)."""
    r = sub.add_parser("predict", help="one configuration's step time, term by term (the planner's step model)")
    add_predict_args(r, mesh_required=True)
    r.add_argument("--kernels", action="store_true",
                   help="the step's kernels one by one: FLOPs, HBM bytes, intensity against the ridge point, "
                        "efficiency, seconds, bound (scaling.kernels)")
    r.add_argument("--json", action="store_true", help="one JSON object")
    r.set_defaults(func=predict_command)


def add_predict_args(r, mesh_required: bool, preset: str | None = "xxl") -> None:
    """The flags that describe one configuration (predict's; kernels takes them for a model's report, with no
    preset by default so that a model flag alone is seen)."""
    add_model_args(r, preset)
    g = r.add_argument_group("hardware")
    g.add_argument("--chip", help=f"chip from the hardware table (default {DEFAULT_CHIP}) with --chips")
    g.add_argument("--chips", type=integer, help="chip count: GPUs in nodes of 8, TPUs in slices of the largest size")
    g.add_argument("--slice", help="a Cloud TPU slice instead of --chip/--chips: v5p-256, v6e-256, v5litepod-256")
    g.add_argument("--slices", type=integer, help="how many --slice slices, joined by DCN (default 1)")
    g.add_argument("--inter-node-bandwidth", type=number, metavar="BYTES/S",
                   help="a GPU cluster's network, bytes/s per node (default: the chip's IB figure times the node)")
    r.add_argument("--mesh", required=mesh_required, help="the whole mesh, its product every device: data=8,fsdp=8")
    r.add_argument("--dcn-mesh", help="which axes cross slices or nodes, e.g. data=4 (default: the outermost axes, "
                   "data first: MaxText's and Megatron's placement)")
    r.add_argument("--global-batch", type=integer, help="global batch in sequences (transformer)")
    r.add_argument("--batch-tokens", type=integer, help="global batch in tokens (instead of --global-batch)")
    r.add_argument("--microbatch", type=integer, help="sequences per microbatch on each data·fsdp shard (sets "
                   "--microbatches = global batch / (microbatch·data·fsdp))")
    r.add_argument("--remat", default="none", choices=REMAT_POLICIES, help="remat policy (default %(default)s)")
    r.add_argument("--step", default="train", choices=["train", "forward"], help="(default %(default)s)")
    add_schedule_args(r)
    r.add_argument("--form", default="scheduled", choices=["sum", "max", "scheduled"],
                   help="the step's form: scheduled (math + what --xla-flags' schedule leaves exposed), sum (every "
                        "collective exposed) or max (every term overlapped) (default %(default)s)")
    r.add_argument("--dtype", default="bf16", choices=kernels.DTYPES,
                   help="the matmuls' input type: its peak from the hardware table, its bytes for activations "
                        "(default %(default)s)")
    r.add_argument("--kernel-model", default="efficiency", choices=kernels.KERNEL_MODELS,
                   help="the matmuls' time: efficiency (eta times the tile and wave quantization of their shapes) or "
                        "hierarchical (DeepFlow's: their HBM bytes from tiles through the chip's L2 or VMEM, seed "
                        "002's model) (default %(default)s)")
    r.add_argument("--grad-accumulation", default="package", choices=list(ACCUMULATION_BYTES),
                   help="whose gradient accumulation the run's microbatches pay (HBM bytes per parameter each): "
                        "package (this package's step, 12), megatron (Megatron-LM's main_grad, 10), deepspeed-bf16 "
                        "(DeepSpeed's BF16 optimizer, 18) (default %(default)s)")


def add_commands(sub, *, check_command, verify_plans, verify_pipeline, render_pipeline, verify_trace) -> None:
    """Add answer, plan, check, trace and layers to an argparse subparsers object. ``check_command``,
    ``verify_plans``, ``verify_pipeline``/``render_pipeline`` and ``verify_trace`` implement check,
    plan --verify-top, answer --verify-pipeline and trace --verify (verify's, passed in by jax_scaling.cli)."""
    Q = QUESTION
    a = sub.add_parser("answer", help="answers to the 4D-parallelism questions (a)-(d), derived")
    a.add_argument("--d-model", type=integer, default=Q["d_model"], help="D (default %(default)s)")
    a.add_argument("--d-ff", type=integer, default=Q["d_ff"], help="F (default %(default)s)")
    a.add_argument("--blocks", type=integer, default=Q["blocks"], help="L (default %(default)s)")
    a.add_argument("--fsdp", type=integer, default=Q["fsdp"], help="X, the FSDP size (default %(default)s)")
    a.add_argument("--tensor", type=integer, default=Q["tensor"], help="Y, the TP size (default %(default)s)")
    a.add_argument("--mx", type=integer, default=Q["mx"],
                   help="M_X, ICI axes the FSDP axis spans (default %(default)s)")
    a.add_argument("--my", type=integer, default=Q["my"], help="M_Y, ICI axes the TP axis spans (default %(default)s)")
    a.add_argument("--flops", type=number, default=Q["flops"], help="C, bf16 FLOP/s per chip (default %(default)g)")
    a.add_argument("--w-ici", type=number, default=Q["w_ici"],
                   help="W_ici, bidirectional bytes/s (default %(default)g)")
    a.add_argument("--hbm", type=number, default=Q["hbm"], help="HBM bytes per TPU (default %(default)g)")
    a.add_argument("--gpu-hbm", type=number, default=Q["gpu_hbm"], help="HBM bytes per GPU (default %(default)g)")
    a.add_argument("--batch-tokens", type=integer, default=Q["batch_tokens"],
                   help="stated global batch for the activation figures of (a), (b) (default %(default)s)")
    a.add_argument("--stages", type=integer,
                   help="pipeline stages for (d), a divisor of --fsdp and --blocks (default: the "
                   f"largest such count up to {Q['stages']}: 2 for the XXL's 126 blocks)")
    a.add_argument("--verify-pipeline", action="store_true",
                   help="compile (d)'s pipeline program for v5p ahead of time (weights gathered once per microbatch "
                        "and once per step) and show its collective bytes and peak beside the closed forms")
    a.add_argument("--verbose", action="store_true", help="with --verify-pipeline: let libtpu's start-up lines through")
    add_xla_flags_arg(a)
    a.add_argument("--json", action="store_true", help="one JSON object instead of the text")
    a.set_defaults(func=lambda args: answer_command(args, verify_pipeline, render_pipeline))

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
                   f"{TRANSFORMER_PLAN_BATCH:,} for a transformer)")
    p.add_argument("--hbm", type=number, help="memory budget per device in bytes (default: the table's usable HBM)")
    p.add_argument("--remat", choices=REMAT_POLICIES, help="remat policy (default: none for the FFN stack; a "
                   "transformer's plan tries each of its policies)")
    g = p.add_argument_group("what a transformer's plan tries on each mesh (left out: every one)")
    g.add_argument("--schedule", dest="pipeline", choices=PIPELINES, help="pipeline schedule with stages")
    g.add_argument("--attention", choices=ATTENTIONS, help="attention (default flash)")
    g.add_argument("--context-strategy", choices=CONTEXT_STRATEGIES, help="attention over a context axis")
    g.add_argument("--sequence-parallel", choices=("on", "off"), help="sequence parallelism with a tensor axis")
    g.add_argument("--optimizer-sharding", choices=OPTIMIZER_SHARDINGS,
                   help="zero1: ZeRO-1 where the mesh has a data axis and no stages (default fsdp)")
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
    p.set_defaults(func=lambda args: plan_command(args, verify_plans))

    add_predict_parser(sub)
    v = sub.add_parser("validate", help="every published measured run predicted, against its measured step")
    v.add_argument("--fit", action="store_true",
                   help="fit each chip's matmul_efficiency on the run its hardware-table row names (fitted_on) and "
                        "print it beside the table's value")
    v.add_argument("--kernel-model", default="efficiency", choices=kernels.KERNEL_MODELS,
                   help="predict's matmul term (default %(default)s); hierarchical refits each chip's eta under it")
    v.add_argument("--json", action="store_true", help="one JSON object")
    v.set_defaults(func=validate_command)

    c = sub.add_parser("check", help="closed forms against the compiled program, term by term")
    c.add_argument("--devices", default="cpu:8",
                   help="cpu:N (emulated), tpu:<chip>:<shape> (tpu:v5p:4x4x4, tpu:v6e:4x4, tpu:TPU7x:2x2x1) or a "
                        "slice (tpu:v5p-128), compiled ahead of time")
    c.add_argument("--mesh", default="data=2,fsdp=2,tensor=2", help="mesh spec (default %(default)s)")
    add_model_args(c, "small")
    c.add_argument("--batch-tokens", type=integer, default=4096, help="global batch in tokens (default %(default)s)")
    c.add_argument("--remat", default="none", choices=REMAT_POLICIES, help="remat policy (default %(default)s)")
    c.add_argument("--step", default="train", choices=["train", "forward"], help="(default %(default)s)")
    add_schedule_args(c)
    c.add_argument("--chip", help=f"chip for the time estimates (default: the TPU topology's, else {DEFAULT_CHIP})")
    c.add_argument("--json", action="store_true")
    c.add_argument("--verbose", action="store_true", help="let libtpu's start-up lines through to stderr")
    c.set_defaults(func=check_command)

    t = sub.add_parser("trace", help="seed 000's Ulysses + 2D-TP memory and FLOP trace, from the closed forms")
    t.add_argument("--seed", choices=["000"], help="the reference trace (the default without model flags)")
    t.add_argument("--verify", action="store_true",
                   help="also compile its Ulysses layer ahead of time for 16 v5p chips (context=16, 60,000 tokens; "
                        "materialized and flash attention) and show the compiled peak beside the trace's 61.02 GB")
    t.add_argument("--verbose", action="store_true", help="with --verify: let libtpu's start-up lines through")
    add_xla_flags_arg(t)
    g = t.add_argument_group("a transformer's trace instead of the seed's")
    add_model_args(g, None)
    g.add_argument("--context", type=integer, help="the GPUs of the Ulysses all-to-all (default 1)")
    g.add_argument("--data", type=integer, help="the FFN's data-parallel split of those GPUs (default 1)")
    g.add_argument("--tensor", type=integer, help="the FFN's tensor-parallel split (default context/data)")
    g.add_argument("--chip", help="a GPU: PyTorch's allocator model for the memory lines (default H100); a TPU: the "
                   "tensors' bytes")
    t.add_argument("--json", action="store_true", help="a model's trace as one JSON object")
    t.set_defaults(func=lambda args: trace_command(args, verify_trace))

    y = sub.add_parser("layers", help="seed 001's per-layer estimates (MLP and self-attention, TP 4, A100 figures)")
    y.add_argument("--seed", choices=["001"], help="the reference estimator (the default without model flags)")
    y.add_argument("--table", nargs="+", default=["mlp", "sa"], choices=["mlp", "sa"],
                   help="which tables (default both)")
    y.add_argument("--cells", action="store_true", help="every printed cell: ours, the seed's, whether they match")
    g = y.add_argument_group("a transformer's tables instead of the seed's")
    add_model_args(g, None)
    g.add_argument("--tp", type=integer, help="tensor-parallel GPUs (default 1)")
    g.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism on the tp GPUs")
    g.add_argument("--batch", type=integer, help="sequences (default 1)")
    g.add_argument("--chip", help="chip from the hardware table: its FLOP rate, HBM and link bandwidth (default "
                   "A100-80GB)")
    g.add_argument("--vector-tflops", type=number, help="the chip's rate off the tensor cores, TFLOP/s (default the "
                   "hardware table's vector_flops, where it has one)")
    y.add_argument("--json", action="store_true", help="one JSON object: the tables, totals and comm fractions")
    y.set_defaults(func=layers_command)

    k = sub.add_parser("kernels", help="seed 002's DeepFlow kernel report (an LSTM on one projected accelerator), "
                                       "from the closed forms; with predict's flags and --mesh, a model's",
                       description="Without --mesh: seed 002's report, line by line (--text: regenerated). With "
                                   "predict's flags and --mesh: the same report for that model and chip.")
    k.add_argument("--seed", choices=["002"], help="the reference report (the default without --mesh)")
    k.add_argument("--text", action="store_true", help="the whole report regenerated in the seed's layout")
    k.add_argument("--json", action="store_true", help="one JSON object: the rows, Time, the parts, the hardware "
                   "(with --mesh: predict's object with its kernels)")
    add_predict_args(k, mesh_required=False, preset=None)  # with --mesh: a model's report instead of the seed's
    k.set_defaults(func=kernels_command)


def run(parser: argparse.ArgumentParser, argv=None) -> int:
    """Parse ``argv`` and run the command; a ValueError is one ``error:`` line on stderr and exit 2; a reader
    that closes the pipe early (``| head``) ends it quietly with exit 1 (signal module docs, "Note on SIGPIPE")."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe raises here, not at exit
        return code
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (| head): the Python docs' recipe, no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
