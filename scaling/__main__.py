"""python -m scaling {answer, plan, check}: the closed forms on the command line.

Bad input prints one line on stderr and exits 2 (no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys


def _answer(args) -> int:
    from scaling.answers import answers, render

    ans = answers(
        d_model=args.d_model, d_ff=args.d_ff, blocks=args.blocks, fsdp=args.fsdp, tensor=args.tensor, mx=args.mx,
        my=args.my, flops=args.flops, w_ici=args.w_ici, hbm=args.hbm, gpu_hbm=args.gpu_hbm,
        batch_tokens=args.batch_tokens, stages=args.stages,
    )
    print(json.dumps(ans, indent=2) if args.json else render(ans))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from scaling.answers import QUESTION as Q

    p = argparse.ArgumentParser(prog="python -m scaling", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("answer", help="answers to the 4D-parallelism questions (a)-(d), derived")
    a.add_argument("--d-model", type=int, default=Q["d_model"], help="D (default %(default)s)")
    a.add_argument("--d-ff", type=int, default=Q["d_ff"], help="F (default %(default)s)")
    a.add_argument("--blocks", type=int, default=Q["blocks"], help="L (default %(default)s)")
    a.add_argument("--fsdp", type=int, default=Q["fsdp"], help="X, the FSDP size (default %(default)s)")
    a.add_argument("--tensor", type=int, default=Q["tensor"], help="Y, the TP size (default %(default)s)")
    a.add_argument("--mx", type=int, default=Q["mx"], help="M_X, ICI axes the FSDP axis spans (default %(default)s)")
    a.add_argument("--my", type=int, default=Q["my"], help="M_Y, ICI axes the TP axis spans (default %(default)s)")
    a.add_argument("--flops", type=float, default=Q["flops"], help="C, bf16 FLOP/s per chip (default %(default)g)")
    a.add_argument("--w-ici", type=float, default=Q["w_ici"], help="W_ici, bidirectional bytes/s (default %(default)g)")
    a.add_argument("--hbm", type=float, default=Q["hbm"], help="HBM bytes per TPU (default %(default)g)")
    a.add_argument("--gpu-hbm", type=float, default=Q["gpu_hbm"], help="HBM bytes per GPU (default %(default)g)")
    a.add_argument("--batch-tokens", type=int, default=Q["batch_tokens"],
                   help="stated global batch for the activation figures of (a), (b) (default %(default)s)")
    a.add_argument("--stages", type=int, default=Q["stages"], help="pipeline stages for (d) (default %(default)s)")
    a.add_argument("--json", action="store_true", help="one JSON object instead of the text")
    a.set_defaults(func=_answer)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
