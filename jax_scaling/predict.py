"""``predict``: one configuration's step time, term by term (the planner's step model): its flags built into a
workload and a target (scaling.reports.predict_setup), predicted (predict_report), printed as the report's text
or --json object."""

from __future__ import annotations

import json

from jax_scaling.args import add_predict_args, setup_fields
from scaling.reports import PredictReport, predict_report, predict_setup


def add_parser(sub) -> None:
    """predict's subcommand and flags."""
    r = sub.add_parser("predict", help="one configuration's step time, term by term (the planner's step model)")
    add_predict_args(r, mesh_required=True)
    r.add_argument("--kernels", action="store_true",
                   help="the step's kernels one by one: FLOPs, HBM bytes, intensity against the ridge point, "
                        "efficiency, seconds, bound (scaling.kernels)")
    r.add_argument("--json", action="store_true", help="one JSON object")
    r.set_defaults(func=predict_command)


def report_of(args, with_kernels: bool) -> PredictReport:
    """The PredictReport of predict's flags (scaling.reports: every value checked where the workload is built)."""
    return predict_report(predict_setup(**setup_fields(args)), with_kernels)


def predict_command(args) -> int:
    """One configuration's predicted step (PredictReport), term by term, or with --json one object."""
    report = report_of(args, args.kernels)
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return 0
