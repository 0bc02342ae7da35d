"""The closed forms' own commands (no jax unless a --verify flag asks): ``answer`` (questions (a)-(d),
scaling.reports.answers), ``validate`` (the measured runs, scaling.reports.validate), ``trace`` (seed 000,
scaling.seeds.seed000), ``layers`` (seed 001, scaling.seeds.layer_estimator), ``kernels`` (seed 002,
scaling.seeds.seed002; with --mesh a model's report from predict's flags). answer --verify-pipeline and trace --verify
compile programs: verify's, imported inside the command when asked.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from jax_scaling.args import (MODEL_FLAGS, add_kernel_table_arg, add_model_args, add_predict_args, add_xla_flags_arg,
                              defaults_note, flags_of, model_config, needs, say)
from jax_scaling.plots import add_plot_arg
from jax_scaling.predict import report_of
from scaling.core.schedule import runs_attention
from scaling.step import kernels
from scaling.seeds import layer_estimator
from scaling.seeds import seed000
from scaling.seeds import seed002
from scaling.reports.answers import QUESTION, answers
from scaling.families.ffn import FFNConfig
from scaling.core.mesh_shape import MeshShape
from scaling.hardware.chips import get_chip
from scaling.core.kinds import KernelModel, Platform
from scaling.core.limits import check_size, integer, number
from scaling.core.table import prose, table
from scaling.core.workload import Workload


def add_answer_parser(sub) -> None:
    """answer's subcommand and flags: the question's figures (scaling.reports.answers.QUESTION) as defaults."""
    Q = QUESTION
    a = sub.add_parser(
        "answer", help="answers to the 4D-parallelism questions (a)-(d), derived",
        description=f"Answers the 4D-parallelism questions (a)-(d) on the XXL FFN stack (D {Q['d_model']}, F "
                    f"{Q['d_ff']}, {Q['blocks']} blocks of two linear layers, AdamW): (a) the memory of its FP32 "
                    "state and BF16 activations on one device, in H100s; (b) the FSDP count that fits one v5p; (c) the "
                    f"batch per device and overall that is compute bound on v5p with FSDP {Q['fsdp']} x TP "
                    f"{Q['tensor']}; (d) the smallest batch that is never "
                    "communication bound. Each step derived from the closed forms; every figure is a flag. The "
                    "questions, their conventions and the reference seeds: docs/questions.md.")
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
    a.set_defaults(func=answer_command)


def add_validate_parser(sub) -> None:
    """validate's subcommand and flags."""
    s = sub.add_parser("answer-serving", help="the Scaling Book's serving questions on LLaMA 3-70B, derived",
                       description="The Scaling Book's questions of 'Serving LLaMA 3-70B on TPUs' (the KV cache, the "
                                   "memory and smallest slice, the decode step, the critical batches, the prefill), "
                                   "each derived with its numbers beside the Book's figure (scaling.reports.serving).")
    s.add_argument("--preset", default="llama3.1-70b", help="the model (default %(default)s)")
    s.add_argument("--chip", default="v5e", help="the chip (default %(default)s)")
    s.add_argument("--book-inputs", action="store_true",
                   help="the Book's rounded inputs: 70e9 parameters, 16e9 B of HBM at 8.1e11 B/s (else the preset's "
                        "count and the hardware table's figures)")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(func=answer_serving_command)
    v = sub.add_parser("validate", help="every published measured run predicted, against its measured step")
    v.add_argument("--fit", action="store_true",
                   help="fit each TPU's matmul_efficiency on the run its hardware-table row names (fitted_on) and "
                        "print it beside the table's value (GPUs fit nothing on a step: their GEMM coefficients "
                        "come from their kernel tables)")
    v.add_argument("--kernel-model", default="efficiency", choices=kernels.KERNEL_MODELS,
                   help="predict's matmul term (default %(default)s); hierarchical refits each chip's eta under it")
    add_kernel_table_arg(v)
    v.add_argument("--step", default="train", choices=["train", "decode"],
                   help="train (the published training runs) or decode (the decode steps measured on the H200 lent to "
                        "this project, scaling/data/serving_measured.toml) (default %(default)s)")
    v.add_argument("--json", action="store_true", help="one JSON object")
    add_plot_arg(v, "every run's predicted step against its measured step (log axes, TPU and GPU marked) with y = x "
                    "and the ±10%% band")
    v.set_defaults(func=validate_command)


def add_trace_parsers(sub) -> None:
    """trace's and layers' subcommands and flags (a seed's report, or a transformer's with model flags)."""
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
    t.set_defaults(func=trace_command)

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


def add_kernels_parser(sub) -> None:
    """kernels' subcommand and flags (seed 002's report; with --mesh and predict's flags, a model's)."""
    k = sub.add_parser("kernels", help="seed 002's DeepFlow kernel report (an LSTM on one projected accelerator), "
                                       "from the closed forms; with predict's flags and --mesh, a model's",
                       description="Without --mesh: seed 002's report, line by line (--text: regenerated). With "
                                   "predict's flags and --mesh: the same report for that model and chip.")
    k.add_argument("--seed", choices=["002"], help="the reference report (the default without --mesh)")
    k.add_argument("--text", action="store_true", help="the whole report regenerated in the seed's layout")
    k.add_argument("--json", action="store_true", help="one JSON object: the rows, Time, the parts, the hardware "
                   "(with --mesh: predict's object with its kernels)")
    k.add_argument("--gemm", metavar="MxNxK", help="one GEMM [M, K]·[K, N]: its predicted seconds and TFLOP/s on "
                   "--chip at --dtype, the terms (tiles, waves, ceiling, fixed time, memory bound) and the kernel "
                   "table's rows nearest it (scaling.reports.gemm); with --chip, --dtype, --kernel-table, --json")
    add_predict_args(k, mesh_required=False, preset=None)  # with --mesh: a model's report instead of the seed's
    add_plot_arg(k, "(with --mesh) every kernel of the step on the chip's roofline (FLOPs per byte against achieved "
                    "FLOP/s, log axes), the ridge point and the chip's kernel-table GEMMs")
    k.set_defaults(func=kernels_command)


def answer_command(args) -> int:
    """Print (a)-(d); with --verify-pipeline, verify.check's ``verify_pipeline(ans, verbose, flags)`` (imported
    here: it imports jax) compiles (d)'s pipeline program and ``render_pipeline(ans)`` prints it after the
    answers. Sizes the package could not build (check_size) are refused like any bad input."""
    flags = flags_of(args)
    needs(args, "verbose", "verify_pipeline")
    check_size(Workload(FFNConfig(args.d_model, args.d_ff, args.blocks), MeshShape(), args.batch_tokens, flags=flags))
    ans = answers(
        d_model=args.d_model, d_ff=args.d_ff, blocks=args.blocks, fsdp=args.fsdp, tensor=args.tensor, mx=args.mx,
        my=args.my, flops=args.flops, w_ici=args.w_ici, hbm=args.hbm, gpu_hbm=args.gpu_hbm,
        batch_tokens=args.batch_tokens, stages=args.stages,
    )
    if args.verify_pipeline:
        from verify.check import verify_pipeline

        verify_pipeline(ans, args.verbose, flags)
    print(json.dumps(ans.to_json(), indent=2, default=str) if args.json else prose(ans.render()))
    if args.verify_pipeline and not args.json:
        from verify.check import render_pipeline

        print()
        print(render_pipeline(ans))
    return 0


def answer_serving_command(args) -> int:
    """The Book's serving derivations (scaling.reports.serving.serving_answers) as text or --json."""
    from scaling.reports.serving import serving_answers

    book = dict(params=70e9, hbm=16e9, hbm_bw=8.1e11) if args.book_inputs else {}
    a = serving_answers(args.preset, args.chip, **book)
    print(json.dumps(a.to_json(), indent=2) if args.json else a.render())
    return 0


def validate_command(args) -> int:
    """Every measured run predicted (scaling.reports.validate): per row measured and predicted seconds and the error;
    per group the median and largest |error|; per comparison Spearman's rank correlation."""
    from scaling.hardware.chips import CHIPS
    from scaling.reports.validate import fit_efficiency, refitted, validate

    if args.step == "decode":
        if args.fit or args.kernel_table is not None or args.plot is not None:
            raise ValueError("--step decode validates the serving closed form as it stands: no --fit, --kernel-table "
                             "or --plot")
        from scaling.reports.serving import validate_serving
        v = validate_serving()
        print(json.dumps(v.to_json(), indent=2) if args.json else v.render())
        return 0

    if args.fit and args.kernel_table is not None:
        raise ValueError("--fit fits the TPUs' matmul_efficiency on their named runs; --kernel-table prices GPU GEMMs "
                         "(give one)")
    if args.fit and args.json:
        raise ValueError("--fit prints the fitted efficiencies as a table; --json is the validation's (give one)")
    if args.fit and args.plot is not None:
        raise ValueError("--fit prints the fitted efficiencies as a table; --plot draws the validation's runs "
                         "(give one)")
    if args.fit:
        rows = []
        for name, chip in CHIPS.items():
            if chip.fitted_on and (chip.onchip or args.kernel_model == KernelModel.EFFICIENCY):
                fit = fit_efficiency(name, kernel_model=args.kernel_model)
                rows.append((name, chip.fitted_on, f"{fit:.3f}", f"{chip.matmul_efficiency:.3f}",
                             ", ".join(c.name for c in CHIPS.values() if c.efficiency_as == name)))
        print("\n".join(table(["chip", "fitted on", "fitted eta", "table's eta", "borrowed by"], rows, right=(2, 3))))
        return 0
    if args.kernel_model == KernelModel.EFFICIENCY:
        v = validate(kernel_table=args.kernel_table)
    else:  # each fitted chip's eta refitted under that model on its own named run; rows it cannot predict left out
        if args.kernel_table is not None:
            raise ValueError("--kernel-table is the efficiency model's (GEMM coefficients); --kernel-model "
                             "hierarchical refits each chip's eta on its named run")
        r = refitted(args.kernel_model)
        v = r["validation"]
        say(f"kernel model {args.kernel_model!r}, eta refitted on each chip's named run: "
              + ", ".join(f"{c} {e:.3f}" for c, e in r["eta"].items()) + "; rows on chips without an on-chip "
              "memory size left out")
    if args.plot is not None:  # drawn from the object --json prints
        from jax_scaling.plots import draw_validate, save

        save(draw_validate(v), args.plot)
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
    say("the predicted-fastest row of each comparison, measured against the measured-fastest: "
        + ", ".join(f"{c} {100 * f:+.1f}%" for c, f in v["fastest"].items()))
    say("error = predicted/measured - 1; runs, their sources and what each assumes: scaling/data/measured.toml")
    return 0


def user_model(args, extra: tuple[str, ...], default_preset: str, command: str):
    """The transformer a seed command's flags describe (--preset or its dimensions, and the command's ``extra``
    flags), or None where none is given (the seed's own report). ValueError for --seed with a model, or an FFN
    preset."""
    given = [f for f in ("preset", *extra, *MODEL_FLAGS)
             if getattr(args, f, None) not in (None, False)]
    if not given:
        return None
    if args.seed is not None:
        raise ValueError(f"--seed is the reference's {command}; a model's takes --preset and its dimensions")
    args.preset = args.preset or default_preset
    cfg = model_config(args)
    if not runs_attention(cfg):
        raise ValueError(f"--preset {args.preset}: {command} takes a transformer (an FFN preset given)")
    return cfg


def verify_trace(verbose: bool, flags=None, cfg=None, context: int | None = None):
    """trace --verify: seed 000's Ulysses layer compiled (verify.trace) under the XLA flags ``flags``, as a table;
    with a model ``cfg``, its one layer over ``context`` v5p chips (verify.trace.compile_model_layer: a dict)."""
    from verify.trace import compile_model_layer, compile_seed000_layer, render_compiled

    if cfg is not None:
        return compile_model_layer(cfg, context, verbose, flags)
    return render_compiled(compile_seed000_layer(verbose, flags))


def trace_command(args) -> int:
    """Seed 000's trace from the closed forms (scaling.seeds.seed000); with --verify, verify_trace (verify's) compiles
    its Ulysses layer and the table follows. With a model (--preset or its flags), --context,
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
                            gpu=chip.kind == Platform.GPU)
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
    """Seed 001's per-layer tables (scaling.seeds.layer_estimator), or its cell-by-cell comparison; with --preset (or
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
    """Seed 002's DeepFlow report from the closed forms (scaling.seeds.seed002): every numeric line beside the package's
    figure; --text the whole report regenerated in the seed's layout; --json the rows and the report's figures.
    With --mesh, the same report for any model and chip from the step model's kernels
    (scaling.reports.predict.PredictReport.kernel_report)."""
    if args.gemm is not None:
        return gemm_command(args)
    given = [f for f in ("preset", "chip", "chips", "slice", "global_batch", "batch_tokens", "microbatch",
                         *MODEL_FLAGS)
             if getattr(args, f, None) is not None]
    if args.mesh is None and given:
        raise ValueError(f"a model's kernel report needs --mesh (given: --{given[0].replace('_', '-')}); without "
                         "model flags kernels prints seed 002's")
    if args.text and args.json:
        raise ValueError("--text and --json are two forms of the report; give one")
    if args.plot is not None and args.mesh is None:
        raise ValueError("--plot draws a model's kernels on its chip's roofline: give predict's flags with --mesh "
                         "(seed 002's report has no plot)")
    args.default_preset = "xxl"  # predict's default where no dimension is given (jax_scaling.args.preset_of)
    if args.mesh is not None:
        if args.seed is not None or args.text:
            raise ValueError("--seed and --text are the seed's report; a model's report takes --mesh and no --seed")
        report = report_of(args, with_kernels=True)
        if note := defaults_note(args):  # a model of flags alone: the defaults it took, on stderr
            print(note, file=sys.stderr)
        print(json.dumps(report.to_json(), indent=2) if args.json else report.kernel_report(),
              end="\n" if args.json else "")
        if args.plot is not None:
            from jax_scaling.plots import draw_kernels, save

            save(draw_kernels(report), args.plot)
        return 0
    if args.json:
        r = seed002.report()
        print(json.dumps({"rows": seed002.rows(r), "time": r["time"], "params": r["params"],
                          "parts": r["parts"], "hardware": r["hw"]}))
    else:
        print(seed002.text() if args.text else seed002.render() + "\n", end="")
    return 0


def gemm_command(args) -> int:
    """kernels --gemm MxNxK --chip C [--dtype D] [--kernel-table FILE] [--json]: one GEMM's predicted time and what
    it is made of (scaling.reports.gemm.gemm_report). Every other kernels flag is refused (one line, exit 2)."""
    from scaling.reports.gemm import gemm_report, parse_gemm
    from scaling.step.kernels import DTYPE_BYTES
    from scaling.core.limits import check_gemm
    from scaling.reports.predict import with_kernel_table

    allowed = {"gemm", "chip", "dtype", "kernel_table", "json", "command", "func", "default_preset", "kernel_model",
               "form", "step"}
    extra = [k for k, v in vars(args).items() if k not in allowed and v not in (None, False)]
    if extra:
        raise ValueError(f"--gemm takes --chip, --dtype, --kernel-table and --json; "
                         f"--{extra[0].replace('_', '-')} is a model's kernel report's")
    m, n, k = parse_gemm(args.gemm)
    if args.chip is None:
        raise ValueError("--gemm needs --chip (a chip of the hardware table, e.g. A100-80GB)")
    chip = get_chip(args.chip)
    if args.kernel_table is not None:
        chip = with_kernel_table(chip, args.kernel_table)
    check_gemm(m, n, k, DTYPE_BYTES[args.dtype or "bf16"], chip.hbm_budget, f"{chip.name} device")  # usable HBM
    r = gemm_report(chip, m, n, k, args.dtype or "bf16")
    print(json.dumps(r.to_json(), indent=2) if args.json else r.render())
    return 0
