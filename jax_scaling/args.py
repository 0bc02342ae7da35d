"""The flags the commands share, and what they describe: the model (--preset and its dimensions), the schedule
(--microbatches, --schedule, attention), --xla-flags, predict's configuration (hardware, mesh, batch, form);
each read into the library's objects (scaling.reports' builders, where every value is checked)."""

from __future__ import annotations

from scaling import kernels
from scaling.policies import (ACCUMULATION_BYTES, ATTENTIONS, CONTEXT_STRATEGIES, FSDP_GATHERS, OPTIMIZER_SHARDINGS,
                              PIPELINES, REMAT_POLICIES)
from scaling.presets import FAMILIES, model_fields, model_of, presets_of
from scaling.schedule import Schedule
from scaling.flags import DEFAULT_FLAGS, FLAG_SETS, FlagSet, get_flag_set
from scaling.hardware import DEFAULT_CHIP
from scaling.limits import integer, number
from scaling.reports import schedule_from
from scaling.table import prose


def say(text: str) -> None:
    """Print a line of prose, wrapped (scaling.table.prose)."""
    print(prose(text))


def needs(args, flag: str, other: str) -> None:
    """ValueError where --flag is given without --other, which it only changes (a silent no-op otherwise)."""
    if getattr(args, flag) and not getattr(args, other):
        raise ValueError(f"--{flag.replace('_', '-')} changes what --{other.replace('_', '-')} does; give it with "
                         f"--{other.replace('_', '-')} or leave it out")


def add_xla_flags_arg(p) -> None:
    """--xla-flags: a flag set of scaling/data/xla_flags.toml, or the user's flags (scaling.flags)."""
    p.add_argument("--xla-flags", metavar="NAME|='--flag=value ...'",
                   help=f"XLA flags for every compile: a set ({', '.join(FLAG_SETS)}; default {DEFAULT_FLAGS}, what "
                        "MaxText's v5p scripts pass) or your own, written --xla-flags='--xla_name=value ...'")


def flags_of(args) -> FlagSet:
    """The flag set --xla-flags names (checked without jax: ValueError naming an unknown set or a bad flag)."""
    return get_flag_set(getattr(args, "xla_flags", None) or DEFAULT_FLAGS)


def add_schedule_args(p) -> None:
    """--microbatches, --repeats, --schedule, --fsdp-gather (scaling.schedule.Schedule), and --xla-flags."""
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


# the fields of Schedule add_schedule_args sets (scaling.reports.schedule_from's), with their flags' defaults
SCHEDULE_FIELDS = {"repeats": 1, "fsdp_gather": "microbatch", "sequence_parallel": False,
                   "optimizer_sharding": "fsdp", "pipeline": "gpipe", "warmup_phases": False}


def schedule_of(args) -> Schedule:
    """The Schedule of --microbatches, --repeats, --fsdp-gather, --sequence-parallel and the transformer's
    --attention, --attention-block, --context-strategy (Schedule's defaults where not given; ValueError naming a
    bad value): scaling.reports.schedule_from."""
    return schedule_from(args.microbatches, **{k: getattr(args, k, v) for k, v in SCHEDULE_FIELDS.items()},
                         **{a: getattr(args, a, None) for a in SCHEDULE_FLAGS})


# every model field a command may set (scaling.presets.model_fields): the dimensions', kinds' and switches' flags
MODEL_FLAGS = tuple(k for k, (kind, _) in model_fields().items() if kind != "schedule_flags")
SCHEDULE_FLAGS = tuple(k for k, (kind, _) in model_fields().items() if kind == "schedule_flags")


def add_model_args(p, preset: str) -> None:
    """--preset and the fields of every family (model_config): a field not every family has says whose."""
    p.add_argument("--preset", default=preset, help=f"model preset (default {preset}; "
                   + "; ".join(presets_of(family) for family in FAMILIES) + ")")
    for name, (kind, fam) in model_fields().items():
        whose = "" if all(name in getattr(f, kind) for f in FAMILIES) else f" ({fam.noun})"
        flag, what = f"--{name.replace('_', '-')}", getattr(fam, kind)[name]
        if kind == "dimensions":
            p.add_argument(flag, type=integer, help=f"override the preset's {what}{whose}")
        elif kind == "kinds":
            p.add_argument(flag, choices=what[0], help=f"{what[1]}{whose}")
        elif kind == "switches":
            p.add_argument(flag, action="store_true", default=None, help=what)


def model_config(args):
    """The preset named by --preset with the overrides of add_model_args (scaling.reports.model_of: ValueError
    naming a bad value, or a transformer flag given for an FFN preset: a dimension of add_model_args or an
    attention flag of add_schedule_args)."""
    return model_of(args.preset, **{k: getattr(args, k, None) for k in (*MODEL_FLAGS, *SCHEDULE_FLAGS)})


# predict's configuration flags, as scaling.reports.predict_setup's fields (its keyword names are the flags' dests)
SETUP_FIELDS = ("preset", *MODEL_FLAGS, "chip", "chips", "slice", "slices", "inter_node_bandwidth",
                "mesh", "dcn_mesh", "global_batch", "batch_tokens", "microbatch", "microbatches", "step", "remat",
                *SCHEDULE_FIELDS, *SCHEDULE_FLAGS, "dtype", "grad_accumulation", "xla_flags", "form",
                "kernel_model")


def setup_fields(args) -> dict:
    """predict's flags (add_predict_args) as scaling.reports.predict_setup's keyword fields, and the command."""
    return {**{k: getattr(args, k) for k in SETUP_FIELDS}, "command": getattr(args, "command", "predict")}


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
                        "(DeepSpeed's BF16 optimizer, 18); megatron and deepspeed-bf16 also set the memory per "
                        "device to what that runtime keeps (scaling.runtimes) (default %(default)s)")
