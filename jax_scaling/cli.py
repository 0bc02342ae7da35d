"""jax-scaling {answer, plan, predict, validate, check, trace, layers, kernels, train, compile, bench, calibrate}:
every command of the package.

One parser, a module per command or group: closed_forms (answer, validate, trace, layers, kernels), plan,
predict, check, model_commands (train, compile, bench), calibrate, their shared flags in args. The commands that
compile or measure (check, plan --verify-top, answer --verify-pipeline, trace --verify, compile, bench, calibrate)
import verify (and so jax) inside the command, after every flag is checked, so a bad flag fails before jax starts.
``python -m scaling``, ``python -m ffn_model`` and ``python -m verify`` are this program with the commands each
offered before (PROGRAMS).

Bad input prints one line on stderr and exits 2 (no traceback).
"""

from __future__ import annotations

import argparse
import os
import sys

from jax_scaling import calibrate, check, closed_forms, model_commands, plan, predict
from scaling.core.limits import check_flag

DESCRIPTION = __doc__.split("\n\n")[0]
CLOSED_FORMS = ("The closed forms on the command line:\n"
                "``python -m scaling {answer, plan, predict, validate, check, trace, layers, kernels}``.")
# prog: (description, offers the closed forms' commands, offers the model's)
PROGRAMS = {
    "jax-scaling": (DESCRIPTION, True, True),
    "python -m scaling": (CLOSED_FORMS, True, False),
    "python -m ffn_model": ("python -m ffn_model {train, compile, bench}", False, True),
    "python -m verify": (DESCRIPTION, True, True),
}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: <prog>: <message>`` on stderr, exit 2 (argparse's status), and the
    one rule for every flag's value (scaling.core.limits.check_flag: counts positive and 32-bit, figures finite and in
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


def parser(prog: str = "jax-scaling") -> Parser:
    """The argument parser of ``prog`` (PROGRAMS): each command module adds its subcommands, in the order the
    help lists them."""
    description, closed, model = PROGRAMS[prog]
    p = Parser(prog=prog, description=description)
    sub = p.add_subparsers(dest="command", required=True)
    if closed:
        for add in (closed_forms.add_answer_parser, plan.add_parser, predict.add_parser,
                    closed_forms.add_validate_parser, check.add_parser, closed_forms.add_trace_parsers,
                    closed_forms.add_kernels_parser):
            add(sub)
    if model:
        model_commands.add_commands(sub)
        calibrate.add_parser(sub)
    return p


def run(p: argparse.ArgumentParser, argv=None) -> int:
    """Parse ``argv`` and run the command; a ValueError is one ``error:`` line on stderr and exit 2; a reader
    that closes the pipe early (``| head``) ends it quietly with exit 1 (signal module docs, "Note on SIGPIPE")."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = p.parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe raises here, not at exit
        return code
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (| head): the Python docs' recipe, no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def main(argv=None, prog: str = "jax-scaling") -> int:
    """Parse ``argv`` (default sys.argv[1:]) and run the command (run: a bad input is one ``error:`` line on
    stderr and exit 2)."""
    return run(parser(prog), argv)

