"""python -m verify {answer, plan, predict, validate, check, trace, layers, kernels, train, compile, bench}:
the command layer's program (jax_scaling.cli) with every command. An entry point, not part of the verify layer
(tests/test_layers.py)."""

import sys

from jax_scaling.cli import main

sys.exit(main(prog="python -m verify"))
