"""Matmul FLOPs of the FFN stack per step and per device, forward and backward.

A matmul [B,D]x[D,F] costs 2·B·D·F FLOPs (Scaling Book, "All the Transformer Math You Need";
training page: 6·P·tokens per training step, 2 forward + 4 backward). One block is two matmuls
(D->F, F->D): forward 4·B·D·F. Backward: weight gradients 4·B·D·F, input gradients 4·B·D·F, except
the first block, whose input is data and needs no gradient (it saves 2·B·D·F: the dx = dh·W_in^T
product). Remat recomputes h = x·W_in of the checkpointed blocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from scaling.core.family import ModelFamily
from scaling.core.inputs import positive_ints
from scaling.core.policies import Remat, Step
from scaling.core.schedule import saved_blocks


def block_forward_flops(cfg: ModelFamily, batch_tokens: int) -> float:
    """4·B·D·F: the two matmuls of one block."""
    return 4.0 * batch_tokens * cfg.d_model * cfg.d_ff


def step_flops(
    cfg: ModelFamily,
    batch_tokens: int,
    step: str = "train",
    remat: str = "none",
    first_block_input_grad: bool = False,
) -> dict[str, float]:
    """Global matmul FLOPs of one step, term by term.

    forward           = 4·B·D·F·L                     (= 2·P·B)
    backward_weights  = 4·B·D·F·L                     (dW_in, dW_out)
    backward_inputs   = 4·B·D·F·L − 2·B·D·F           (dx of every block but the first's W_in)
    first_block_input_grad = 2·B·D·F if the program computes it anyway (a scan runs the same body
                        for every block, so the unused dx of block 0 is computed and dropped)
    recompute         = 2·B·D·F × (blocks recomputed under remat: full L, every-second ceil(L/2)):
                        backward needs only h = x·W_in again, not the block output, so of the
                        block's forward only the first matmul is redone (the book's 8·P·B for
                        block remat is the upper bound that recomputes the whole forward)
    total = 6·P·B − 2·B·D·F (+ recompute, + the unused first-block dx when computed).
    ``step="forward"``: the forward term only.
    """
    positive_ints("batch_tokens", batch_tokens)
    if step not in (Step.TRAIN, Step.FORWARD):
        raise ValueError(f"step must be 'train' or 'forward', got {step!r}")
    blk = block_forward_flops(cfg, batch_tokens)
    one_matmul = blk / 2
    terms = {"forward": blk * cfg.blocks}
    if step == Step.TRAIN:
        _, recomputed = saved_blocks(cfg.blocks, remat)
        terms["backward_weights"] = blk * cfg.blocks
        terms["backward_inputs"] = blk * cfg.blocks - one_matmul
        terms["first_block_input_grad"] = one_matmul if first_block_input_grad else 0.0
        terms["recompute"] = one_matmul * recomputed
    terms["total"] = sum(terms.values())
    return terms


def first_block_dx_computed(blocks: int, remat: str = "none") -> bool:
    """Whether the compiled program computes block 0's unused input gradient (dx = dh·W_in^T).

    The stack is a scan (ffn_model.model.stack_forward): one body for every trip, so the body's dx
    is computed for block 0 too and dropped. Under every-second remat the scan runs over pairs.
    A scan of a single trip is inlined by XLA (its while-loop simplifier) and the dead dx removed.
    So: True iff the scan holding block 0 has more than one trip: L > 1, or L//2 > 1 for
    every-second. (Observed in the compiled HLO: tiny preset, L=3, every-second: one pair, no dx.)
    """
    return (blocks // 2 if remat == Remat.EVERY_SECOND else blocks) > 1


def flops_per_device(flops, mesh: Mapping):
    """The work divides evenly over the N devices of the mesh (the product of its axis sizes): FLOPs / N."""
    return flops / math.prod(mesh.values())
