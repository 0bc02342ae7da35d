"""python -m scaling {answer, plan, check, trace, layers}: the command layer's program (jax_scaling.cli) with the
commands it offered before the console script. An entry point, not part of the scaling layer (tests/test_layers.py)."""

import sys

from jax_scaling.cli import main

sys.exit(main(prog="python -m scaling"))
