"""``predict``: one configuration's step time, term by term (the planner's step model): its flags built into a
workload and a target (scaling.reports.predict.predict_setup), predicted (predict_report), printed as the report's text
or --json object; --plot FILE draws it (jax_scaling.plots)."""

from __future__ import annotations

import dataclasses
import json
import sys

from jax_scaling.args import add_predict_args, defaults_note, setup_fields
from jax_scaling.plots import add_plot_arg
from scaling.reports.predict import PredictReport, predict_report, predict_setup


def add_parser(sub) -> None:
    """predict's subcommand and flags."""
    r = sub.add_parser("predict", help="one configuration's step time, term by term (the planner's step model)")
    add_predict_args(r, mesh_required=True)
    r.add_argument("--kernels", action="store_true",
                   help="the step's kernels one by one: FLOPs, HBM bytes, intensity against the ridge point, "
                        "efficiency, seconds, bound (scaling.step.kernels)")
    r.add_argument("--json", action="store_true", help="one JSON object")
    add_plot_arg(r, "the step's time as a stacked bar by term (compute by kernel class, the pipeline bubble, each "
                    "axis's exposed collectives, loop copies) beside the memory per device by term and the chip's "
                    "usable HBM; --json then carries the kernels the bar sums")
    r.set_defaults(func=predict_command)


def report_of(args, with_kernels: bool) -> PredictReport:
    """The PredictReport of predict's flags (scaling.reports.predict: every value checked where the workload is
    built)."""
    return predict_report(predict_setup(**setup_fields(args)), with_kernels)


def predict_command(args) -> int:
    """One configuration's predicted step (PredictReport), term by term, or with --json one object; with --plot FILE
    the report (with its kernels: the bar's compute classes, which --json then carries) drawn into FILE
    (jax_scaling.plots.draw_predict; the text lists the kernels only with --kernels). A model of flags alone: the
    defaults it took, one note line on stderr (args.defaults_note)."""
    if args.step in ("prefill", "decode"):
        return serving_command(args)
    from jax_scaling.args import check_no_serving_flags
    check_no_serving_flags(args)
    report = report_of(args, args.kernels or args.plot is not None)
    if note := defaults_note(args):
        print(note, file=sys.stderr)
    text = report if args.kernels else dataclasses.replace(report, kernels=None)
    print(json.dumps(report.to_json(), indent=2) if args.json else text.render())
    if args.plot is not None:
        from jax_scaling.plots import draw_predict, save

        save(draw_predict(report), args.plot)
    return 0


def serving_command(args) -> int:
    """predict --step prefill|decode: the serving report (scaling.reports.serving) as text or --json."""
    from jax_scaling.args import serving_fields
    from scaling.reports.serving import serving_setup
    from scaling.step.serving import serving_report

    if args.plot is not None or args.kernels:
        raise ValueError("--plot and --kernels are a training step's; a serving step prints its terms (use plan "
                         "--step decode --plot for the latency-throughput frontier)")
    report = serving_report(serving_setup(**serving_fields(args)))
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return 0
