"""The flags the commands share, and what they describe: the model (--preset and its dimensions), the schedule
(--microbatches, --schedule, attention), --xla-flags, predict's configuration (hardware, mesh, batch, form);
each read into the library's objects (scaling.reports.predict' builders, where every value is checked)."""

from __future__ import annotations

import argparse

from scaling.step import kernels
from scaling.core.policies import (ACCUMULATION_BYTES, ATTENTIONS, CONTEXT_STRATEGIES, FSDP_GATHERS,
                                   OPTIMIZER_SHARDINGS, PIPELINES, REMAT_POLICIES, Attention)
from scaling.core.kinds import Platform
from scaling.families.presets import FAMILIES, get_preset, model_fields, model_of, presets_of
from scaling.core.schedule import Schedule, runs_attention
from scaling.core.flags import DEFAULT_FLAGS, FLAG_SETS, FlagSet, get_flag_set
from scaling.hardware.chips import DEFAULT_CHIP
from scaling.core.limits import integer, number
from scaling.core.mesh_shape import MESH_AXES
from scaling.reports.predict import schedule_from
from scaling.core.table import prose

# what every --mesh help says of the axes: MESH_AXES, outermost first (an axis left out has size 1)
MESH_HELP = f"axes {', '.join(MESH_AXES)} (outermost first; an axis left out has size 1; expert: MoE models only)"


def say(text: str) -> None:
    """Print a line of prose, wrapped (scaling.core.table.prose)."""
    print(prose(text))


def needs(args, flag: str, other: str) -> None:
    """ValueError where --flag is given without --other, which it only changes (a silent no-op otherwise)."""
    if getattr(args, flag) and not getattr(args, other):
        raise ValueError(f"--{flag.replace('_', '-')} changes what --{other.replace('_', '-')} does; give it with "
                         f"--{other.replace('_', '-')} or leave it out")


def add_xla_flags_arg(p) -> None:
    """--xla-flags: a flag set of scaling/data/xla_flags.toml, or the user's flags (scaling.core.flags)."""
    p.add_argument("--xla-flags", metavar="NAME|='--flag=value ...'",
                   help=f"XLA flags for every compile: a set ({', '.join(FLAG_SETS)}; default {DEFAULT_FLAGS}, what "
                        "MaxText's v5p scripts pass) or your own, written --xla-flags='--xla_name=value ...'")


def flags_of(args) -> FlagSet:
    """The flag set --xla-flags names (checked without jax: ValueError naming an unknown set or a bad flag)."""
    return get_flag_set(getattr(args, "xla_flags", None) or DEFAULT_FLAGS)


def on_off(text: str) -> bool:
    """--sequence-parallel's value: on (True) or off (False); argparse's error naming the choices otherwise."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from 'on', 'off')")
    return text == "on"


# Every flag of add_schedule_args and add_config_args defaults to None (left out): predict and the commands that
# run one configuration take the default its help names (schedule_of, setup_fields), plan tries every value
# (jax_scaling.plan.plan_choices); a flag given fixes what it names in both.
def add_schedule_args(p) -> None:
    """--microbatches, --repeats, --schedule, --fsdp-gather (scaling.core.schedule.Schedule), and --xla-flags."""
    add_xla_flags_arg(p)
    g = p.add_argument_group("microbatches and pipeline stages (with a stage axis in --mesh); left out, plan tries "
                             "each value")
    g.add_argument("--microbatches", type=integer,
                   help="M microbatches: the pipeline's with a stage axis, else gradient accumulation (default 1)")
    g.add_argument("--repeats", type=integer,
                   help="R chunks of blocks per stage: the circular pipeline, or with --schedule 1f1b the "
                        "interleaved 1F1B (default 1: GPipe, 1F1B)")
    g.add_argument("--schedule", dest="pipeline", choices=PIPELINES,
                   help="pipeline schedule: gpipe, circular (needs --repeats > 1; --repeats alone implies it) or "
                        "1f1b (transformer: a forward and a backward every iteration, activations bounded by the "
                        "stages; interleaved with --repeats R; default gpipe)")
    g.add_argument("--warmup-phases", action="store_true", default=None,
                   help="1f1b: its warm-up and cool-down iterations in loops of their own, one slot each "
                        "(Megatron's bubble (S-1)/(R*M); XLA:GPU copies the gradient accumulators between the loops)")
    g.add_argument("--fsdp-gather", choices=FSDP_GATHERS,
                   help="gather FSDP weights once per microbatch or once per step (pipeline; default microbatch)")
    g.add_argument("--optimizer-sharding", choices=OPTIMIZER_SHARDINGS,
                   help="fsdp (AdamW's state sharded as the weights) or zero1 (the moments and the update also "
                        "sharded over data; the gradients reduce-scattered over data·fsdp; default fsdp)")
    g.add_argument("--stage-blocks", type=block_list, metavar="L0,L1,...",
                   help="the blocks of each pipeline stage, first to last, summing to the blocks (Megatron-LM's "
                        "--decoder-first/last-pipeline-num-layers as a list; default: an even split, or uneven "
                        "DeepSpeed's uniform with the embedding and output counted as a block each); with --repeats "
                        "R, S counts (each split over its R chunks) or S*R, one a chunk in the order the blocks run "
                        "(chunk r*S+s on stage s: Megatron-LM's --pipeline-model-parallel-layout)")
    g.add_argument("--sequence-parallel", type=on_off, nargs="?", const=True, metavar="on|off",
                   help="Megatron sequence parallelism on the tensor axis: activations split over tensor along the "
                        "tokens between blocks (all-gather + reduce-scatter instead of the all-reduce); "
                        "--sequence-parallel alone is on (default off)")
    # the transformer's flags default to None, so that model_config can refuse them given for an FFN preset;
    # schedule_of fills in Schedule's defaults
    d = Schedule()
    g.add_argument("--attention", choices=ATTENTIONS,
                   help="transformer attention: materialized scores, flash (the package's key blocks, online "
                        "softmax), splash (jax's Pallas kernel, TPU), cudnn (cuDNN's fused attention, GPU) or auto "
                        "(default: splash on TPU, cudnn on GPU, flash on CPU; the command says which it took)")
    g.add_argument("--attention-block", type=integer, help=f"flash's and splash's key block (transformer; default "
                   f"{d.attention_block}, splash's as MaxText sets it)")
    g.add_argument("--splash-fused-backward", action="store_true", default=None,
                   help="splash's fused backward kernel (dq, dk, dv in one: MaxText's sa_use_fused_bwd_kernel; "
                        "default: a dq and a dkv kernel)")
    g.add_argument("--context-strategy", choices=CONTEXT_STRATEGIES,
                   help="transformer attention over a context axis: ulysses (all-to-all) or ring (ppermute; "
                        f"default {d.context})")


# the fields of Schedule add_schedule_args sets (scaling.reports.predict.schedule_from's), with their flags' defaults
SCHEDULE_FIELDS = {"repeats": 1, "fsdp_gather": "microbatch", "sequence_parallel": False,
                   "optimizer_sharding": "fsdp", "pipeline": "gpipe", "warmup_phases": False, "stage_blocks": None}


def block_list(text: str) -> tuple[int, ...]:
    """--stage-blocks 3,2 -> (3, 2) (Schedule checks the counts: positive, one per stage or chunk, summing to L)."""
    import argparse
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of block counts (e.g. 3,2)")


def schedule_of(args, platform: str | None = None) -> Schedule:
    """The Schedule of --microbatches, --repeats, --fsdp-gather, --sequence-parallel and the transformer's
    --attention, --attention-block, --context-strategy (Schedule's defaults where not given; ValueError naming a
    bad value): scaling.reports.predict.schedule_from. A transformer's --attention left out is auto, resolved for
    ``platform`` (Schedule.on; None: platform_of the command's --devices); the reports name the kernel taken."""
    attention = {a: getattr(args, a, None) for a in SCHEDULE_FLAGS}
    if "attention" in attention and attention["attention"] is None and runs_attention(model_config(args)):
        attention["attention"] = "auto"
    schedule = schedule_from(given_or(args, "microbatches", 1),
                             **{k: given_or(args, k, v) for k, v in SCHEDULE_FIELDS.items()}, **attention)
    platform = platform or platform_of(getattr(args, "devices", None))
    if schedule.attention == Attention.AUTO and platform is not None:
        schedule = schedule.on(platform, getattr(model_config(args), "seq_len", None))
    return schedule


def platform_of(devices: str | None) -> str | None:
    """The platform a --devices spec names: tpu:... -> tpu, gpu:... -> gpu, cpu:N -> cpu; left out (the machine's
    own devices), jax's default backend once jax has started its backends, else None (not known yet: jax is not
    started for it, so that a bad flag still fails first and a multi-process run initializes itself first; the
    model resolves auto at trace time, ffn_model.transformer.attention)."""
    head = (devices or "").strip().lower().split(":")[0]
    if head in (Platform.TPU, Platform.GPU, Platform.CPU):
        return head
    import sys
    if "jax" not in sys.modules:
        return None
    from jax._src import xla_bridge
    if not xla_bridge.backends_are_initialized():
        return None
    import jax
    return jax.default_backend()


def given_or(args, name: str, default):
    """--name's value, or ``default`` where it is left out (None) or the command has no such flag."""
    value = getattr(args, name, None)
    return default if value is None else value


# every model field a command may set (scaling.families.presets.model_fields): the dimensions', kinds' and switches'
# flags
MODEL_FLAGS = tuple(k for k, (kind, _) in model_fields().items() if kind != "schedule_flags")
SCHEDULE_FLAGS = tuple(k for k, (kind, _) in model_fields().items() if kind == "schedule_flags")


def add_model_args(p, preset: str | None) -> None:
    """--preset and the fields of every family (model_config): a field not every family has says whose; --layers
    is --blocks. Without --preset, the command's default ``preset`` with the flags of its family, or the model of the
    flags alone (preset_of)."""
    p.set_defaults(default_preset=preset)
    p.add_argument("--preset", help="model preset" + (f" (default {preset} where no dimension is given)" if preset
                                                      else "") + "; "
                   + "; ".join(presets_of(family) for family in FAMILIES)
                   + ". Without --preset: flags the default's family has override it; a flag only a transformer has "
                     "(--heads, --seq-len, ...) makes a transformer of the flags alone")
    for name, (kind, fam) in model_fields().items():
        whose = "" if all(name in getattr(f, kind) for f in FAMILIES) else f" ({fam.noun})"
        flag, what = f"--{name.replace('_', '-')}", getattr(fam, kind)[name]
        if kind == "dimensions":
            p.add_argument(flag, *(["--layers"] if name == "blocks" else []), type=integer,
                           help=f"{what}{whose}")
        elif kind == "kinds":
            p.add_argument(flag, choices=what[0], help=f"{what[1]}{whose}")
        elif kind == "switches":
            p.add_argument(flag, action="store_true", default=None, help=what)


def model_config(args):
    """The preset preset_of names with the overrides of add_model_args, or with none the model of those flags alone
    (scaling.families.presets.model_of: ValueError naming a bad value, a dimension the model lacks, or a transformer
    flag given for an FFN preset: a dimension of add_model_args or an attention flag of add_schedule_args)."""
    return model_of(preset_of(args), **{k: getattr(args, k, None) for k in (*MODEL_FLAGS, *SCHEDULE_FLAGS)})


# what a default taken means, where its value alone does not say (defaults_note)
DEFAULT_MEANS = {"kv_heads": "= --heads: full multi-head attention", "head_dim": "= D/N",
                 "vocab": "token vectors in and out", "window": "every layer global", "capacity_factor": "dropless"}


def defaults_note(args) -> str | None:
    """For a model of flags alone (preset_of None): one ``note:`` line naming the defaults it took for the dimensions
    and kinds not given (scaling.families.presets.defaults_taken: the activation, the kv heads, ...), for stderr; None
    for a preset (whose fields are the preset's)."""
    if preset_of(args) is not None:
        return None
    from scaling.families.presets import defaults_taken
    taken = defaults_taken(model_config(args), {k: getattr(args, k, None) for k in MODEL_FLAGS})
    words = [(f"no --{k.replace('_', '-')}" if v is None else f"--{k.replace('_', '-')} {v}")
             + (f" ({DEFAULT_MEANS[k]})" if k in DEFAULT_MEANS else "") for k, v in taken.items()]
    return f"note: a model of flags alone; defaults taken for what was not given: {', '.join(words)}" if words else None


def preset_of(args) -> str | None:
    """--preset; left out, the command's default preset (add_model_args) where no dimension is given or every model
    flag given is one its family has (they override it, as always: --d-model --d-ff --blocks beside predict's
    default FFN stack); else None: the model from the flags alone (scaling.families.presets.model_from_fields, which
    names what is missing), as where a flag only a transformer has is given without --preset."""
    if args.preset is not None:
        return args.preset
    fields = model_fields()
    given = [k for k in fields if getattr(args, k, None) is not None and getattr(args, k, None) is not False]
    default = getattr(args, "default_preset", None)
    if not any(fields[k][0] == "dimensions" for k in given):
        return default
    if default is not None:
        cfg = get_preset(default)
        if all(k in {**cfg.dimensions, **cfg.schedule_flags, **cfg.kinds, **cfg.switches} for k in given):
            return default
    return None


def add_kernel_table_arg(g) -> None:
    """--kernel-table FILE: a GPU's kernel table (scaling.hardware.kernel_tables' format, what calibrate writes) instead
    of the one shipped for its chip."""
    g.add_argument("--kernel-table", metavar="FILE",
                   help="a GPU's kernel-level measurements (TOML: chip, source, [gemm.<dtype>] rows of m, n, k, "
                        "seconds; what calibrate writes) to fit its GEMM ceiling and fixed time on, instead of the "
                        "table shipped for the chip (scaling/data/kernels/)")


# predict's configuration flags, as scaling.reports.predict.predict_setup's fields (its keyword names are the flags'
# dests)
SETUP_FIELDS = ("preset", *MODEL_FLAGS, "chip", "chips", "slice", "slices", "inter_node_bandwidth",
                "mesh", "dcn_mesh", "global_batch", "batch_tokens", "microbatch", "microbatches", "step", "remat",
                *SCHEDULE_FIELDS, *SCHEDULE_FLAGS, "dtype", "grad_accumulation", "xla_flags", "form",
                "kernel_model", "kernel_table")
# what one configuration takes where a flag of add_config_args is left out (plan tries every value instead)
CONFIG_DEFAULTS = {"microbatches": 1, "remat": "none", "dtype": "bf16", "grad_accumulation": "package",
                   **SCHEDULE_FIELDS}


def setup_fields(args) -> dict:
    """predict's flags (add_predict_args) as scaling.reports.predict.predict_setup's keyword fields, and the command: a
    flag left out its CONFIG_DEFAULTS value, the preset preset_of's, a transformer's attention the chip's
    (chip_attention)."""
    out = {**{k: given_or(args, k, CONFIG_DEFAULTS.get(k)) for k in SETUP_FIELDS},
           "command": getattr(args, "command", "predict"), "preset": preset_of(args)}
    out["attention"] = chip_attention(args)
    return out


# --runtime's names and the gradient accumulation (scaling.core.policies.ACCUMULATION_BYTES) each runs: MaxText's step
# is XLA's, as this package's; Megatron-LM's main_grad; Megatron-DeepSpeed's BF16 optimizer (scaling.step.runtimes)
RUNTIME_ACCUMULATION = {"maxtext": "package", "megatron": "megatron", "deepspeed": "deepspeed-bf16",
                        "package": "package"}


class RuntimeAction(argparse.Action):
    """--runtime NAME: stores RUNTIME_ACCUMULATION[NAME] where --grad-accumulation stores its value."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, RUNTIME_ACCUMULATION[values])


def chip_attention(args) -> str | None:
    """A transformer's --attention for predict and plan: given, itself; left out or auto, the kernel the chip's
    production code runs (scaling.core.schedule.attention_for of --chip's or --slice's kind: splash on a TPU, cudnn on a
    GPU; predict's header and plan's options name it), and under a PyTorch runtime (--runtime megatron or deepspeed)
    the materialized one its code runs (baddbmm, the fused scale-mask-softmax, bmm: scaling.step.launches); None for
    a model without attention."""
    if not runs_attention(model_config(args)):
        return getattr(args, "attention", None)
    if getattr(args, "attention", None) not in (None, Attention.AUTO):
        return args.attention
    from scaling.step.runtimes import RUNTIMES
    if getattr(args, "grad_accumulation", None) in RUNTIMES:
        return Attention.MATERIALIZED.value
    from scaling.core.schedule import attention_for
    return attention_for(chip_of(args).kind, getattr(model_config(args), "seq_len", None))


def chip_of(args):
    """The chip --slice or --chip names (default DEFAULT_CHIP): scaling.hardware.chips's; ValueError naming an
    unknown one."""
    from scaling.hardware.chips import get_chip, parse_slice
    return parse_slice(args.slice)[0] if getattr(args, "slice", None) else get_chip(
        getattr(args, "chip", None) or DEFAULT_CHIP)


def add_config_args(r, mesh_required: bool, preset: str | None = "xxl") -> None:
    """The flags that describe a model, its hardware, batch and parallelism: predict's one configuration, plan's
    choices (each fixes what it names in every plan; left out, plan tries each value). One definition for both
    commands: the same spellings and the same defaults (None: left out; CONFIG_DEFAULTS says what predict takes)."""
    add_model_args(r.add_argument_group(
        "model", "--preset with any of its dimensions overridden. Without --preset: --d-model --d-ff --blocks "
                 "(flags of the FFN stack, the default preset's family) override the default, so the three make an "
                 "FFN stack; with --heads --seq-len (or any flag only a transformer has) the flags alone make a "
                 "transformer: --d-model --heads --d-ff --blocks (--layers) --seq-len, the rest optional; a dimension "
                 "it lacks is named"), preset)
    g = r.add_argument_group("hardware")
    g.add_argument("--chip", help=f"chip from the hardware table (default {DEFAULT_CHIP}) with --chips")
    g.add_argument("--chips", type=integer, help="chip count: GPUs in nodes of 8, TPUs in slices of the largest size "
                   "(plan: default 64)")
    g.add_argument("--slice", help="a Cloud TPU slice instead of --chip/--chips: v5p-256, v6e-256, v5litepod-256")
    g.add_argument("--slices", type=integer, help="how many --slice slices, joined by DCN (default 1)")
    g.add_argument("--inter-node-bandwidth", type=number, metavar="BYTES/S",
                   help="a GPU cluster's network, bytes/s per node (default: the chip's IB figure times the node)")
    add_kernel_table_arg(g)
    g = r.add_argument_group("batch")
    g.add_argument("--global-batch", type=integer, help="global batch in sequences (transformer)")
    g.add_argument("--batch-tokens", type=integer, help="global batch in tokens (instead of --global-batch; plan's "
                   "default: the family's, 25,600 for the FFN stack, 4,194,304 for a transformer)")
    g.add_argument("--microbatch", type=integer, help="sequences per microbatch on each data·fsdp shard (sets "
                   "--microbatches = global batch / (microbatch·data·fsdp))")
    g = r.add_argument_group("parallelism (left out, plan tries each value)")
    g.add_argument("--mesh", required=mesh_required, help="the whole mesh, its product every device: data=8,fsdp=8 "
                   f"(plan: only that mesh); {MESH_HELP}")
    g.add_argument("--dcn-mesh", help="which axes cross slices or nodes, e.g. data=4 (default: the outermost axes, "
                   "data first: MaxText's and Megatron's placement)")
    g.add_argument("--remat", choices=REMAT_POLICIES, help="remat policy (default none; plan: the FFN stack none, a "
                   "transformer each of its policies)")
    g.add_argument("--dtype", choices=kernels.DTYPES,
                   help="the matmuls' input type: its peak from the hardware table, its bytes for activations "
                        "(default bf16)")
    g.add_argument("--grad-accumulation", choices=list(ACCUMULATION_BYTES),
                   help="whose gradient accumulation the run's microbatches pay (HBM bytes per parameter each): "
                        "package (this package's step, 12), megatron (Megatron-LM's main_grad, 10), deepspeed-bf16 "
                        "(DeepSpeed's BF16 optimizer, 18); megatron and deepspeed-bf16 also set the memory per "
                        "device to what that runtime keeps (scaling.step.runtimes) (default package)")
    g.add_argument("--runtime", choices=list(RUNTIME_ACCUMULATION), action=RuntimeAction, dest="grad_accumulation",
                   help="the runtime that runs the step: maxtext (XLA: this package's step), megatron (Megatron-LM), "
                        "deepspeed (Megatron-DeepSpeed's BF16 optimizer), package; sets what --grad-accumulation sets "
                        "(maxtext and package: package, megatron: megatron, deepspeed: deepspeed-bf16), the later of "
                        "the two flags wins")
    add_schedule_args(r)
    r.add_argument("--form", default="scheduled", choices=["sum", "max", "scheduled"],
                   help="the step's form: scheduled (math + what --xla-flags' schedule leaves exposed), sum (every "
                        "collective exposed) or max (every term overlapped); plan ranks by it (default %(default)s)")


def add_serving_args(r, plan: bool = False) -> None:
    """The serving flags of --step prefill|decode (scaling.step.serving): the request's lengths, the stored types and
    the matmuls' rate; plan's latency target. --global-batch is the sequences decoded together."""
    g = r.add_argument_group("serving (--step prefill or decode; --global-batch: sequences decoded together)")
    g.add_argument("--prompt", type=integer, help=f"prompt tokens a request (default {SERVING_DEFAULTS['prompt']})")
    g.add_argument("--output", type=integer, help=f"output tokens a request (default {SERVING_DEFAULTS['output']})")
    g.add_argument("--weights", choices=["bf16", "fp8", "int8", "int4"], help="the weights' stored type (default bf16)")
    g.add_argument("--kv-cache", choices=["bf16", "fp8", "int8", "int4"],
                   help="the KV cache's stored type (default bf16)")
    g.add_argument("--compute", choices=["bf16", "int8", "fp8"],
                   help="the matmuls' rate: bf16, or the 8-bit weights computed in their type (default bf16)")
    g.add_argument("--prefill-efficiency", type=number, metavar="ETA",
                   help="the fraction of C a prefill's matmuls reach (default: the chip's fitted matmul efficiency, "
                        "1 on GPUs)")
    if plan:
        g.add_argument("--latency-ms", type=number, help="plan: the most milliseconds per output token (default: "
                                                          "none, the highest throughput)")


SERVING_DEFAULTS = {"prompt": 2048, "output": 512, "weights": "bf16", "kv_cache": "bf16", "compute": "bf16",
                    "prefill_efficiency": None}


def check_no_serving_flags(args) -> None:
    """ValueError where a serving flag is given to a training step (it would change nothing)."""
    for k in (*SERVING_DEFAULTS, "latency_ms"):
        if getattr(args, k, None) is not None:
            raise ValueError(f"--{k.replace('_', '-')} is a serving flag: give it with --step decode (or prefill)")


def serving_fields(args) -> dict:
    """The serving setup's fields (scaling.reports.serving.serving_setup) of a command's flags."""
    return {"preset": preset_of(args), "mesh": getattr(args, "mesh", None), "chip": args.chip, "chips": args.chips,
            "slice": args.slice, "slices": args.slices, "global_batch": args.global_batch,
            **{k: given_or(args, k, v) for k, v in SERVING_DEFAULTS.items()},
            **{k: getattr(args, k, None) for k in MODEL_FLAGS}}


def add_predict_args(r, mesh_required: bool, preset: str | None = "xxl") -> None:
    """The flags that describe one configuration (add_config_args, and --step and --kernel-model: predict's;
    kernels takes them for a model's report, with no preset by default so that a model flag alone is seen)."""
    add_config_args(r, mesh_required, preset)
    r.add_argument("--step", default="train", choices=["train", "forward", "prefill", "decode"],
                   help="train or forward (a training step), or prefill or decode (serving: the serving flags; "
                        "scaling.step.serving) (default %(default)s)")
    add_serving_args(r)
    r.add_argument("--kernel-model", default="efficiency", choices=kernels.KERNEL_MODELS,
                   help="the matmuls' time: efficiency (eta times the tile and wave quantization of their shapes) or "
                        "hierarchical (DeepFlow's: their HBM bytes from tiles through the chip's L2 or VMEM, seed "
                        "002's model) (default %(default)s)")
