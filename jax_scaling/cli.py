"""jax-scaling {answer, plan, predict, validate, check, trace, layers, kernels, train, compile, bench}: every
command of the package.

The closed forms' commands (scaling.cli.add_commands) and the model's (ffn_model.cli.add_commands), in one
process: the implementations of those that compile or measure (check, plan --verify-top,
answer --verify-pipeline, trace --verify, compile, bench) are verify's, imported only when such a command
runs, so a bad flag fails before jax starts. ``python -m scaling``, ``python -m ffn_model`` and
``python -m verify`` are this program with the commands each offered before (PROGRAMS).
"""

from __future__ import annotations

import importlib

from ffn_model import cli as model_cli
from scaling import cli as closed_form_cli

DESCRIPTION = __doc__.split("\n\n")[0]
# prog: (description, offers the closed forms' commands, offers the model's)
PROGRAMS = {
    "jax-scaling": (DESCRIPTION, True, True),
    "python -m scaling": (closed_form_cli.__doc__.split("\n\n")[0], True, False),
    "python -m ffn_model": (model_cli.__doc__.split("\n\n")[0], False, True),
    "python -m verify": (DESCRIPTION, True, True),
}


def lazy(module: str, name: str):
    """``module.name``, imported when called (verify's modules import jax)."""
    return lambda *args, **kwargs: getattr(importlib.import_module(module), name)(*args, **kwargs)


def verify_trace(verbose: bool, flags=None, cfg=None, context: int | None = None):
    """trace --verify: seed 000's Ulysses layer compiled (verify.trace) under the XLA flags ``flags``, as a table;
    with a model ``cfg``, its one layer over ``context`` v5p chips (verify.trace.compile_model_layer: a dict)."""
    from verify.trace import compile_model_layer, compile_seed000_layer, render_compiled

    if cfg is not None:
        return compile_model_layer(cfg, context, verbose, flags)
    return render_compiled(compile_seed000_layer(verbose, flags))


def parser(prog: str = "jax-scaling") -> closed_form_cli.Parser:
    """The argument parser of ``prog`` (PROGRAMS), its commands from scaling.cli and ffn_model.cli."""
    description, closed_forms, model = PROGRAMS[prog]
    p = closed_form_cli.Parser(prog=prog, description=description)
    sub = p.add_subparsers(dest="command", required=True)
    if closed_forms:
        check = lazy("verify.check", "check_command")
        closed_form_cli.add_commands(
            sub, verify_trace=verify_trace, check_command=lambda args: check(args, model_cli.check_workload(args)),
            **{f: lazy("verify.check", f) for f in ("verify_plans", "verify_pipeline", "render_pipeline")})
    if model:
        model_cli.add_commands(sub, {c: (lazy("verify.cli", f"{c}_report"), lazy("verify.cli", f"print_{c}"))
                                     for c in ("compile", "bench")})
    return p


def main(argv=None, prog: str = "jax-scaling") -> int:
    """Parse ``argv`` (default sys.argv[1:]) and run the command (scaling.cli.run: a bad input is one
    ``error:`` line on stderr and exit 2)."""
    return closed_form_cli.run(parser(prog), argv)
