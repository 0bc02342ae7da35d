"""python -m scaling.layer_estimator [--cells] (and python -m jax_scaling.layer_estimator): seed 001's tables,
or the per-cell comparison (scaling.layer_estimator); ``jax-scaling layers`` is the command with a model's."""

from __future__ import annotations

import argparse
import sys

from scaling import layer_estimator


def main(argv: list[str] | None = None) -> int:
    """python -m scaling.layer_estimator [--cells]: the seed-001 tables (or the per-cell comparison)."""
    ap = argparse.ArgumentParser(prog="python -m scaling.layer_estimator",
                                 description=layer_estimator.__doc__.split("\n")[0])
    ap.add_argument("--cells", action="store_true", help="print 'ours | seed's | match' per printed cell")
    args = ap.parse_args(argv)
    print(layer_estimator.compare_text() if args.cells else layer_estimator.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
