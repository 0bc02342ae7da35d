"""What each runtime launches beyond the model family's kernel list (scaling.step.kernels.runtime_kernels maps the
list to it): a PyTorch runtime's memory-bound kernels one by one and the host time that issues them (below), and the
kernels XLA:GPU runs around the package's own program (the sections at the end: the flash and materialized
attention's scores through HBM, the FP32 weights' casts and gradient writes).

A PyTorch runtime: Megatron-LM (2021-2022) and Megatron-DeepSpeed, which runs Megatron's model code (the runtimes of
scaling.step.runtimes.RUNTIMES, Precision.accumulation). In place of this package's one pointwise kernel per
layer-pass (the fusions XLA makes), the memory-bound kernels eager PyTorch launches one by one, each with its HBM
bytes, and the host time that issues every launch.

Per layer and microbatch, per GPU, with c = 2 (16-bit activations), t tokens of a microbatch on a data shard,
Y = tensor, sp = Y under sequence parallelism (else 1), m the MLP's matrices (GeLU 2, SwiGLU 3), 1-byte dropout
masks (torch.bool):
  A = c·t·D/sp   the residual stream (layernorm, dropout and residual adds act on it)
  P = c·t·D/Y    the attention's context, permuted from [b, heads, s, d] to [s, b, heads·d] for W_o
  F = c·t·d_ff/Y one MLP hidden matrix
  S = c·b·(N/Y)·T²  the attention scores (b sequences), written by baddbmm and read by the p·v bmm (their bytes are
                 the attention matmul's); absent under flash attention, whose kernel keeps them on chip
Forward (Megatron's ParallelTransformerLayer; Narayanan et al. 2021 §4.2 names the fused kernels; Korthikanti et al.
2022 §4 the dropout masks; ../shared/reference/gpu-runtimes.md):
  layernorm ×2          read A, write A                         2A each
  scale_mask_softmax    read S, write S (fused)                 2S
  attention_dropout     read S, write S and its mask            2S + S/c
  context_permute       read P, write P                         2P
  bias_dropout_add ×2   read the output and the residual, write the sum and the mask   3A + A/c each
  bias_gelu             read the m − 1 inputs, write one        m·F
Backward (autograd's kernels for each; the GEMMs' are the matmul kernels'):
  layernorm ×2          read x and the gradient, write dx       3A each
  scale_mask_softmax    read the probabilities and the gradient, write dx   3S
  attention_dropout     read the gradient and the mask, write dx   2S + S/c
  context_permute       2P
  bias_dropout_add ×2   read the gradient and the mask, write dx, read dx again for the bias gradient   3A + A/c each
  residual_grad_add ×2  autograd sums the two gradients of the residual stream: read 2A, write A   3A each
  bias_gelu             read the inputs and the gradient, write the inputs' gradients (2m − 1)·F, and with a bias
                        (GeLU) read the gradient once more for it: + F
Recomputation (remat): each op again as often as the policy recomputes its part of the layer: the score ops with the
attention's units (attention_units/4), the rest with the layer's projections ((qkv + out + mlp_in)/3); remat full under
a PyTorch runtime reruns the whole forward (whole_layer_again).
The loss (Megatron's _VocabParallelCrossEntropy, FP32 over each tensor shard's vocabulary, e = th·V/Y logits of the
device): forward the logits cast to FP32 (read c, write 4), the max (read 4), the max subtracted (read 4, write 4),
exp (read 4, write 4), the sum (read 4), the division (read 4, write 4): (c + 36)·e; backward the softmax's gradient
scaled (read 4, write 4) and cast back (read 4, write c): (12 + c)·e.
The optimizer (Megatron's FP16/BF16 optimizer around apex's fused Adam, per parameter shard): the gradients
unscaled and checked for inf (read 4), their norm (read 4), the FP32 master copied to the 16-bit weights (read 4,
write 2), the main gradients zeroed (write 4): 18 B, beside the Adam update's 28 (adamw_kernel).

Host: eager PyTorch issues each launch from the host, HOST_SECONDS each (Python, the dispatcher and autograd's
recording before the CUDA launch); where a pass's launches take longer to issue than the device takes to run them
(its kernels and its tensor all-reduces), the device waits (pass_table; scaling.step.program.StepModel.t_idle).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scaling.core.kinds import KernelKind, KernelPass
from scaling.core.policies import Step
from scaling.step.kernel import Kernel
from scaling.step.memory import weight_shards
from scaling.step.runtimes import RUNTIMES

# host seconds to issue one eager PyTorch op: pytorch/pytorch#41383 (2020, PyTorch 1.5): 6.8 s for 10^6 calls of
# y = 2*x with autograd recording (5 us without), on a one-element tensor, so without any kernel's own time
HOST_SECONDS = 7e-6
HOST_SOURCE = "pytorch/pytorch#41383: ~7 us per eager op with autograd recording (1e6 calls of 2*x in 6.8 s)"
MASK_BYTES = 1  # a dropout mask element (torch.bool)
OPTIMIZER_PASS_BYTES = 18  # per parameter shard: unscale and inf check 4, norm 4, master to 16-bit 6, zero grads 4
LOSS_FORWARD, LOSS_BACKWARD = 36, 12  # FP32 bytes per logit beside the 16-bit read or write (module docstring)


@dataclass(frozen=True)
class Op:
    """One memory-bound kernel of a layer-pass (module docstring): its name, pass, how often a layer-pass launches it
    (``count``), and its bytes per launch as multiples of the layer's arrays: ``a`` of A, ``a_mask`` mask elements
    per element of A (1 B each, A/c elements), ``p`` of P, ``f`` of F, ``s`` of S, ``s_mask`` masks of S;
    ``scores`` whether it acts on the score tensor (absent under flash attention)."""

    name: str
    pass_: str
    count: int = 1
    a: float = 0.0
    a_mask: float = 0.0
    p: float = 0.0
    f: float = 0.0
    s: float = 0.0
    s_mask: float = 0.0
    scores: bool = False


def layer_ops(m: int) -> tuple[Op, ...]:
    """Megatron's memory-bound kernels of one layer, forward and backward (module docstring), for an MLP of ``m``
    matrices (GeLU with a bias: 2; SwiGLU, no bias: 3)."""
    F, B = KernelPass.FORWARD, KernelPass.BACKWARD
    bias = 1 if m == 2 else 0
    return (Op("layernorm", F, 2, a=2), Op("scale_mask_softmax", F, s=2, scores=True),
            Op("attention_dropout", F, s=2, s_mask=1, scores=True), Op("context_permute", F, p=2, scores=True),
            Op("bias_dropout_add", F, 2, a=3, a_mask=1), Op("bias_gelu", F, f=m),
            Op("layernorm", B, 2, a=3), Op("scale_mask_softmax", B, s=3, scores=True),
            Op("attention_dropout", B, s=2, s_mask=1, scores=True), Op("context_permute", B, p=2, scores=True),
            Op("bias_dropout_add", B, 2, a=3, a_mask=1), Op("residual_grad_add", B, 2, a=3),
            Op("bias_gelu", B, f=2 * m - 1 + bias))


def runs_launches(w) -> bool:
    """Whether the step runs as a PyTorch runtime launches it: Precision.accumulation one of runtimes.RUNTIMES."""
    return w.precision.accumulation in RUNTIMES


def op_bytes(op: Op, c: float, A, P, F, S, flash):
    """Bytes one launch of ``op`` moves, A, P, F, S the arrays of the module docstring in bytes (0 for a score op
    under flash attention)."""
    b = op.a * A + op.a_mask * A / c * MASK_BYTES + op.p * P + op.f * F
    if op.scores:
        b = b + np.where(flash, 0.0, op.s * S + op.s_mask * S / c * MASK_BYTES)
    return b


def layer_kernels(w, calls, recompute: dict, arrays: dict, flash, loss_elements, head_calls) -> list:
    """The memory-bound kernels of the step's layer-passes and loss as the runtime launches them (module docstring):
    one Kernel per op and pass, ``calls`` layer-passes of a microbatch (per step, per device), its bytes per launch
    from ``arrays`` {A, P, F, S} (bytes per microbatch), the recomputed share per op from ``recompute`` {"scores",
    "rest"} (0 to 1 each); the loss's over ``loss_elements`` logits in ``head_calls`` calls. The GEMMs and the
    attention's matmuls stay the family's matmul kernels."""
    c, m = w.precision.compute, w.model.mlp_matrices
    A, P, F, S = (arrays[k] for k in "APFS")
    out = []
    for op in layer_ops(m):
        if op.scores and np.all(flash):
            continue
        per = op_bytes(op, c, A, P, F, S, flash)
        n = calls * op.count
        out.append(Kernel(op.name, op.pass_, KernelKind.POINTWISE, None, n, 0.0, n * per))
        if op.pass_ == KernelPass.FORWARD and w.step == Step.TRAIN:
            share = recompute["scores"] if op.scores else recompute["rest"]
            if np.any(np.asarray(share) > 0):
                out.append(Kernel(op.name, KernelPass.RECOMPUTE, KernelKind.POINTWISE, None, n * share, 0.0,
                                  n * share * per))
    if loss_elements is not None:
        out.append(Kernel("cross_entropy", KernelPass.FORWARD, KernelKind.POINTWISE, None, 6 * head_calls, 0.0,
                          (c + LOSS_FORWARD) * loss_elements))
        if w.step == Step.TRAIN:
            out.append(Kernel("cross_entropy", KernelPass.BACKWARD, KernelKind.POINTWISE, None, 2 * head_calls, 0.0,
                              (c + LOSS_BACKWARD) * loss_elements))
    return out


def optimizer_kernel(w, params, shards):
    """The runtime's optimizer passes beside Adam's update (module docstring): OPTIMIZER_PASS_BYTES per parameter
    of the device's ``shards``-th share, in 4 multi-tensor launches."""
    return Kernel("optimizer_passes", KernelPass.UPDATE, KernelKind.POINTWISE, None, 4, 0.0,
                  OPTIMIZER_PASS_BYTES * params / shards)


def launches(k, flash) -> object:
    """Kernels the host issues for a Kernel of the step (module docstring): its calls; a materialized attention's
    forward two a call (baddbmm, bmm) and its backward four, a flash attention's one each."""
    if k.kind == KernelKind.ATTENTION:
        return k.calls * np.where(flash, 1, 4 if k.pass_ == KernelPass.BACKWARD else 2)
    return k.calls


PASSES = (KernelPass.FORWARD, KernelPass.RECOMPUTE, KernelPass.BACKWARD)  # the passes a host issues layer by layer


def pass_table(kernels: list, flash, collective_calls=0.0, collective_seconds=0.0, host: float = HOST_SECONDS) -> dict:
    """Per pass (forward, recompute, backward): {"kinds": {kernel kind: seconds}, "collectives": seconds, "launches":
    the kernels the host issues (launches) and the collective calls, "host": host·launches, "device": Σ kinds +
    collectives}. The step's ``collective_calls`` and ``collective_seconds`` (the tensor axis's, exposed) split over
    the passes as the layer's forward does (each pass reduces what it computes): by the passes' matmul FLOPs
    relative to a forward's, 1 forward, 1 backward (its two gradients reduce one array each), the recompute's
    share; ``flash`` whether the attention is one fused kernel; ``host`` 0 for a program launched from a compiled
    executable (XLA)."""
    fwd = sum((k.flops for k in kernels if k.pass_ == KernelPass.FORWARD and k.kind == KernelKind.MATMUL), 0.0)
    rec = sum((k.flops for k in kernels if k.pass_ == KernelPass.RECOMPUTE and k.kind == KernelKind.MATMUL), 0.0)
    weight = {KernelPass.FORWARD: 1.0, KernelPass.BACKWARD: 1.0,
              KernelPass.RECOMPUTE: np.where(np.asarray(fwd) > 0, rec / np.maximum(fwd, 1e-300), 0.0)}
    total = sum(weight.values())
    out = {}
    for p in PASSES:
        ks = [k for k in kernels if k.pass_ == p]
        share = weight[p] / total
        kinds = {}
        for k in ks:
            kinds[str(k.kind)] = kinds.get(str(k.kind), 0.0) + k.seconds
        n = sum((launches(k, flash) for k in ks), 0.0) + share * collective_calls
        comm = share * collective_seconds
        out[str(p)] = {"kinds": kinds, "collectives": comm, "launches": n, "host": host * n,
                       "device": sum(kinds.values(), 0.0) + comm}
    return out


# ---- XLA:GPU: what the package's own flash attention (ffn_model.attention.flash_attention) runs as ----
# XLA:GPU does not fuse a dot with the softmax around it: each key block's scores go through HBM. Per key-block step
# of a call, E = batch·Tq·b score elements (batch the sequences × heads, Tq the queries, b the key block), read from
# the compiled program (gpu:H100, jax 0.10.2: docs/findings.md, "What XLA:GPU runs around the package's program"):
#   forward   the q·kᵀ dot writes the FP32 scores (4E); one fusion masks them and takes the row max, reading the
#             scores, the block's mask (1 B an element) and a loop-invariant FP32 array of −inf that XLA hoists out
#             of the scan (4E + 1E + 4E) and writing the masked scores (4E); one fusion exponentiates, writes p in
#             BF16 and sums its rows (4E + 2E); the p·v dot reads p (2E); the FP32 accumulator is read twice and
#             written once (3·4 B a query, head and feature), the key and value blocks sliced (2·c a key)
#   backward  the recomputed scores (4E) and dp = do·vᵀ (4E) written in FP32 by their dots; one fusion reads both
#             and writes ds and p in BF16 (4E + 4E + 2E + 2E); the dq, dk and dv dots read ds twice and p once (6E)
# Every key block runs, masked (the scan has no causal skip): the FLOPs' full count.
FLASH_GEMM_BYTES = {"forward": 6.0, "backward": 14.0}  # bytes per score element the dots write or read
FLASH_FUSION_BYTES = {"forward": 19.0, "backward": 12.0}  # bytes per score element of the fusions around them
FLASH_FUSIONS = {"forward": 3, "backward": 2}  # fusions per key-block step (the last, forward: the accumulator)


def xla_gpu_flash(ks: list, block, c: float) -> list:
    """The step's kernels with the package's flash attention as XLA:GPU runs it (the table above): each attention
    kernel of shape (Tq, Tq, H, batch) runs every key block (executed 1), its dots move the scores' bytes beside q, k,
    v and o, and a pointwise kernel ``flash_scores`` of the same pass carries the fusions' bytes, FLASH_FUSIONS
    launches a key-block step of the Tq/``block`` a call (``c`` bytes of a BF16 element)."""
    out = []
    for k in ks:
        if k.kind != KernelKind.ATTENTION:
            out.append(k)
            continue
        tq, _, head_dim, batch = k.shape
        side = KernelPass.BACKWARD if k.pass_ == KernelPass.BACKWARD else KernelPass.FORWARD
        e = batch * tq * tq * k.calls  # score elements of the pass's calls, every key block
        nb = np.maximum(tq / block, 1.0)  # key-block steps a call
        steps = k.calls * nb
        rows = batch * tq * head_dim * k.calls  # query-head-feature elements of the calls (one key-block step's)
        extra = 3 * 4 * rows * nb + 2 * c * rows if side == KernelPass.FORWARD else 2 * c * rows
        out.append(Kernel(k.name, k.pass_, k.kind, k.shape, k.calls, k.flops, k.bytes + FLASH_GEMM_BYTES[side] * e,
                          1.0))
        out.append(Kernel("flash_scores", k.pass_, KernelKind.POINTWISE, None, steps * FLASH_FUSIONS[side], 0.0,
                          FLASH_FUSION_BYTES[side] * e + extra))
    return out


# ---- XLA:GPU: the package's FP32 master weights, layer by layer ----
# The package's program keeps each weight stack [L, ...] in FP32 and scans over the layers (ffn_model); XLA:GPU runs
# the casts and slices around each layer's matmuls as kernels of their own (XLA:TPU fuses them into the matmuls).
# Bytes per weight element of the device's shard, read from the compiled programs (gpu:H100, jax 0.10.2:
# docs/findings.md, "What XLA:GPU runs around the package's program"):
#   forward   the layer's FP32 slice cast to BF16: read 4, write 2
#   backward  the FP32 slice cast again (6) and the layer's BF16 weight gradient written into the FP32 gradient stack
#             (read 2, write 4); where the scan keeps jax.checkpoint's barrier (the FFN stack) the slice is first
#             copied out of the stack, the family's term (scaling.families.ffn.block_slice_copy_bytes)
#   step      the FP32 gradient stacks zero-initialized once a microbatch (write 4)
WEIGHT_BYTES = {"forward": 6.0, "backward": 12.0, "zeros": 4.0}


def xla_gpu_weights(w, ks: list) -> list:
    """The step's kernels with XLA:GPU's passes over the package's FP32 weights (the table above): for each forward
    matmul of a layer weight (batch 1; not the output layer, whose weight is no stack: its forward cast only), its
    weight's n·k elements a call over the fsdp shards, WEIGHT_BYTES["forward"] a call in a ``weight_cast`` kernel of
    the forward and WEIGHT_BYTES["backward"] in a ``weight_grad`` kernel of the backward (train); and the gradient
    stacks' zeros, 4 B per parameter of the device, once a microbatch (``grad_zeros``, update)."""
    X = w.mesh.get("fsdp", 1)
    train = w.step == Step.TRAIN
    fwd_elems, bwd_elems, calls = 0.0, 0.0, 0.0
    for k in ks:
        if k.kind == KernelKind.MATMUL and k.pass_ == KernelPass.FORWARD and k.shape is not None and k.shape[3] == 1:
            _, n, kk, _ = k.shape
            elems = n * kk * k.calls / X
            fwd_elems = fwd_elems + elems
            calls = calls + k.calls
            if not k.name.startswith("logits"):
                bwd_elems = bwd_elems + elems
    out = list(ks)
    out.append(Kernel("weight_cast", KernelPass.FORWARD, KernelKind.POINTWISE, None, calls, 0.0,
                      WEIGHT_BYTES["forward"] * fwd_elems))
    if train:
        out.append(Kernel("weight_grad", KernelPass.BACKWARD, KernelKind.POINTWISE, None, 2 * calls, 0.0,
                          WEIGHT_BYTES["backward"] * bwd_elems))
        M = w.schedule.microbatches
        out.append(Kernel("grad_zeros", KernelPass.UPDATE, KernelKind.POINTWISE, None, M, 0.0,
                          M * WEIGHT_BYTES["zeros"] * w.model.params / weight_shards(w.mesh)))
    return out


# The package's materialized attention under XLA:GPU (the same programs): its scores are FP32 where the dots write
# them. Per score element E of a call: forward, the q·kᵀ dot reads the mask (1 B) and the hoisted −inf array (4) and
# writes the FP32 scores (4), the p·v dot reads p (2): 11E for the dots; the row max and sum each read the scores (4
# + 4), one fusion writes p in BF16 (4 + 2): 14E for the fusions. Backward, the saved p relaid twice (2 + 2 + 2), dp
# in FP32 (4) read with p for the row terms (4 + 2), ds written (4 + 2 + 2): 20E for the fusions; dp's dot (4) and
# the three dots reading ds and p (2 + 2 + 2): 10E. The family's kernels count c bytes an element for the dots' scores
# (2E forward, 4E backward) and the softmax's read and write (4E, 8E): what XLA:GPU moves beyond them is added.
MATERIALIZED_GEMM_BYTES = {"forward": 11.0 - 2.0, "backward": 10.0 - 4.0}
MATERIALIZED_FUSION_BYTES = {"forward": 14.0 - 4.0, "backward": 20.0 - 8.0}


def xla_gpu_materialized(ks: list) -> list:
    """The step's kernels with the package's materialized attention as XLA:GPU runs it (the table above): each
    attention kernel of shape (T, T, H, batch) moves MATERIALIZED_GEMM_BYTES more per score element of its calls in
    its dots, and a pointwise kernel ``softmax_fp32`` of the same pass MATERIALIZED_FUSION_BYTES more in the
    fusions (2 launches a call)."""
    out = []
    for k in ks:
        out.append(k)
        if k.kind != KernelKind.ATTENTION:
            continue
        tq, _, _, batch = k.shape
        side = KernelPass.BACKWARD if k.pass_ == KernelPass.BACKWARD else KernelPass.FORWARD
        e = batch * tq * tq * k.calls
        more = MATERIALIZED_GEMM_BYTES[side] * e
        out[-1] = Kernel(k.name, k.pass_, k.kind, k.shape, k.calls, k.flops, k.bytes + more, k.executed)
        out.append(Kernel("softmax_fp32", k.pass_, KernelKind.POINTWISE, None, 2 * k.calls, 0.0,
                          MATERIALIZED_FUSION_BYTES[side] * e))
    return out
