"""python -m scaling {answer, plan, predict, validate, check, trace, layers, kernels}: the command layer's
program (jax_scaling.cli) with the closed forms' commands. An entry point, not part of the scaling layer
(tests/test_layers.py)."""

import sys

from jax_scaling.cli import main

sys.exit(main(prog="python -m scaling"))
