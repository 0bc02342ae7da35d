"""python -m ffn_model {train, compile, bench}: the command layer's program (jax_scaling.cli) with the
commands it offered before the console script. An entry point, not part of the ffn_model layer
(tests/test_layers.py)."""

import sys

from jax_scaling.cli import main

sys.exit(main(prog="python -m ffn_model"))
