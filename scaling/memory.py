"""Bytes per device, term by term, for the FFN stack on a mesh.

Sharding (the table in scaling.sharding): weights W_in and W_out (both stored [L,F,D]) are split D over
the ``embed`` axes (fsdp) and F over the ``mlp`` axes (tensor), replicated elsewhere; the batch is split
over the ``batch`` axes (data·fsdp); the block input x[B,D] is replicated over tensor, the hidden h[B,F]
is split F over tensor. Every function takes a mapping of mesh-axis sizes (a MeshShape, or numpy
arrays of sizes) and a batch that may be a numpy array, so the planner can evaluate many at once.

Sources: Scaling Book training page ("FP32 master + FP32 grads + two FP32 moments: 16 bytes/param";
"bf16 params + fp32 Adam moments: 10 bytes/param") and transformers page (activations saved for
backward are the matmul inputs backward needs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from scaling import pipeline, transformer
from scaling.config import (DEFAULT_PRECISION, FFNConfig, Precision, TransformerConfig, positive_int, positive_ints,
                            saved_blocks)
from scaling.sharding import shards
from scaling.workload import Workload


def weight_shards(mesh: Mapping):
    """Pieces each weight stack is split into: the shards of its ``layers``, ``embed`` and ``mlp`` axes
    (stage·fsdp·tensor)."""
    return shards(mesh, "layers", "embed", "mlp")


def tokens_per_device(mesh: Mapping, batch_tokens):
    """b = B / (shards of ``batch``) = B/(data·fsdp): the tokens each device holds."""
    return positive_ints("batch_tokens", batch_tokens) / shards(mesh, "batch")


def activation_bytes_per_token(cfg: FFNConfig, precision: Precision = DEFAULT_PRECISION) -> int:
    """Unsharded activations saved for backward, no remat: compute_bytes·(D + F)·L per token.

    Each block's backward needs its input x (D) for dW_in and its hidden h (F) for dW_out
    (questions-4d.md (a); Scaling Book transformers page). For the XXL: 2·(16384+53248)·126 = 17,547,264.
    """
    return precision.compute * (cfg.d_model + cfg.d_ff) * cfg.blocks


def saved_activation_bytes(cfg: FFNConfig, mesh: Mapping, batch_tokens, remat: str = "none",
                           precision: Precision = DEFAULT_PRECISION, sequence_parallel: bool = False):
    """Activations saved for backward per device, under the remat policy.

    tokens per device b = B/(data·fsdp); a full block keeps x (D, replicated over tensor) and
    h (F/tensor); an input-only block keeps x:  bytes = c·b·[n_full·(D + F/Y) + n_input·D].
    With sequence parallelism x is kept split over tensor along the tokens, D -> D/Y (Korthikanti et
    al. 2022, table 2: the activations outside the tensor-parallel region divided by t).
    """
    b = tokens_per_device(mesh, batch_tokens)
    n_full, n_input = saved_blocks(cfg.blocks, remat)
    D, F, Y = cfg.d_model, cfg.d_ff, shards(mesh, "mlp")
    x = D / Y if sequence_parallel else D
    return precision.compute * b * (n_full * (x + F / Y) + n_input * x)


def memory_per_device(w: Workload) -> dict:
    """Bytes per device of the workload's step, term by term, "total" their sum: the FFN stack's train step
    (train_memory_per_device) or forward step (forward_memory_per_device), the transformer's
    (scaling.transformer.memory_per_device)."""
    if isinstance(w.model, TransformerConfig):
        return transformer.memory_per_device(w)
    return (train_memory_per_device if w.step == "train" else forward_memory_per_device)(w)


def train_memory_per_device(w: Workload) -> dict:
    """Training memory per device of the FFN stack in bytes, term by term.

    master  = master·P/(X·Y)             fp32 weights, 4 B/param
    optimizer = moments·moment·P/(X·Y)   Adam mu, nu, 8 B/param
    grads   = grad·P/(X·Y)               fp32 gradients, 4 B/param
    activations = saved_activation_bytes (bf16, under the remat policy)
    transient_weights = 2 layers' bf16 weights gathered over fsdp: c·2·(2·D·F/Y)
        (the scan gathers one block's W_in and W_out; XLA prefetches the next block's; the
        backward needs the same). With ``windowed_grad_rs`` (XLA:TPU's windowed-einsum gradient
        reduce-scatter, scaling.program) the backward streams dW in chunks and holds one gathered
        matrix at a time: c·D·F/Y
    inputs  = x and targets of the batch per device, bf16 and fp32: (c + 4)·D·B/(data·fsdp)
    With microbatches (``schedule``, scaling.pipeline): the activations of the microbatches in flight
    (one for gradient accumulation; all T = R·M + S − 1 iterations of a pipeline) at B/(M·data·fsdp)
    tokens each; gradient accumulation adds an FP32 accumulator (accumulated = grad·P/N); a pipeline
    adds stage 0's buffer of every microbatch's input and output, c·D·B/(data·fsdp) (buffer); its
    backward loop holds the current iteration's stage gradient beside the accumulated one
    (grad_iteration = grad·P/N: the inner scan's stacked per-block gradients) and one iteration's
    residuals as the inner scan stacks them before they join the loop's stack (staging = Lc blocks'
    saved bytes of one microbatch); a circular
    schedule also holds the FP32 stacks re-laid as chunks, recomputed for the backward loop and held
    through it (relaid = master·P/N); with fsdp_gather="step" the stage's L/S blocks gathered (FP32
    holding BF16, what the forward and backward reuse): master·2·D·F·(L/S)/Y in place of the
    per-block transients. Where a chunk's blocks run as one scan trip (Lc = 1, or one pair under
    every-second remat) XLA drops the one-trip loop: no stacked per-iteration gradient (a circular
    schedule still holds the chunk's,
    grad·P/(N·R), to update its slot of the accumulator), and only that trip's blocks gathered
    (c·2·Lc·D·F/Y: nothing to prefetch). Each term is an allocation of XLA's memory-usage report
    (docs/findings.md, memory).
    total   = sum of the above.  16·P/N + activations + transients (training page: 16 B/param).
    """
    cfg, mesh, batch_tokens, remat, precision, schedule = (w.model, w.mesh, w.batch_tokens, w.remat, w.precision,
                                                           w.schedule)
    windowed_grad_rs = w.compiler.windowed_grad_rs
    shards_w = weight_shards(mesh)
    P, D, F = cfg.params, cfg.d_model, cfg.d_ff
    S, M, Y = mesh.get("stage", 1), schedule.microbatches, shards(mesh, "mlp")
    b = tokens_per_device(mesh, batch_tokens)
    c = precision.compute
    once = schedule.fsdp_gather == "step"
    terms = {
        "master": precision.master * P / shards_w,
        # ZeRO-1: the moments and the reduced FP32 gradients split over data too
        "optimizer": precision.adam_moments * precision.adam_moment * P / shards_w / w.zero1_shards,
        "grads": precision.grad * P / shards_w / w.zero1_shards,
        "activations": pipeline.microbatches_in_flight(schedule, S) * pipeline.saved_per_token(
            cfg, mesh, remat, schedule, c) * b / M,
        "transient_weights": (precision.master * 2 * D * F * (cfg.blocks // S) / Y if once
                              else c * (1 if windowed_grad_rs else 4) * D * F / Y),
        "inputs": (c + 4) * D * b,
    }
    if prefetched := prefetched_weights(w):
        terms["prefetched"] = prefetched
    if S == 1 and np.any(np.asarray(M) > 1):
        terms["accumulated"] = precision.grad * P / shards_w * (np.asarray(M) > 1)
    if S > 1:
        R, Lc = schedule.repeats, pipeline.chunk_blocks(cfg, schedule, S)
        one_trip = Lc == 1 or (remat == "every-second" and Lc == 2)  # a chunk's blocks are one scan trip
        terms["buffer"] = c * D * b
        if not once and one_trip:
            terms["transient_weights"] = c * 2 * Lc * D * F / Y  # the trip's blocks; no next block to prefetch
        if not one_trip:
            terms["grad_iteration"] = precision.grad * P / shards_w
        elif R > 1:
            terms["grad_iteration"] = precision.grad * P / shards_w / R  # the chunk's, updated into its slot
        terms["staging"] = pipeline.saved_per_token(cfg, mesh, remat, schedule, c) * b / M
        if R > 1:
            terms["relaid"] = precision.master * P / shards_w
    terms["total"] = sum(terms.values())
    return terms


def forward_memory_per_device(w: Workload) -> dict:
    """Memory per device of the FFN stack's forward-only step (the loss, no gradients), term by term.

    master      = master·P/(X·Y)                   fp32 weights
    transient_weights = c·D·F/Y                     one gathered bf16 weight matrix at a time
                  (with nothing saved for backward, W_in's gathered copy is dead before W_out's is made)
    activations = c·b·(F/Y + 2·D)                  one block's working set: hidden, its input and
                  output; b = B/(data·fsdp) (the loss's fp32 residual is fused into the reduction)
    inputs      = (c + 4)·D·b                      x bf16 and targets fp32
    With microbatches the working set is one microbatch's (B/(M·data·fsdp) tokens); a pipeline adds
    stage 0's buffer of the batch, and with fsdp_gather="step" the stage's weights gathered, held as BF16
    (nothing accumulates a gradient in them): c·2·D·F·(L/S)/Y in place of the one matrix.
    Source: this package's reading of the compiled forward step (docs/findings.md, memory).
    """
    cfg, mesh, batch_tokens, precision, schedule = w.model, w.mesh, w.batch_tokens, w.precision, w.schedule
    D, F, Y, c = cfg.d_model, cfg.d_ff, shards(mesh, "mlp"), precision.compute
    b = tokens_per_device(mesh, batch_tokens)
    S, M = mesh.get("stage", 1), schedule.microbatches
    terms = {
        "master": precision.master * cfg.params / weight_shards(mesh),
        "transient_weights": (c * 2 * D * F * (cfg.blocks // S) / Y if schedule.fsdp_gather == "step"
                              else c * D * F / Y),
        "activations": c * b / M * (F / Y + 2 * D),
        "inputs": (c + 4) * D * b,
    }
    if S > 1:
        terms["buffer"] = c * D * b
    if prefetched := prefetched_weights(w):
        terms["prefetched"] = prefetched
    terms["total"] = sum(terms.values())
    return terms


def prefetched_weights(w: Workload) -> float:
    """Bytes of the gathered bf16 weight matrices (c·D·F/Y each) that XLA:TPU's schedule holds beyond the ones
    in use, because their all-gathers run ahead asynchronously (w.flags.gathers, scaling.flags): one matrix
    within a block (the forward's W_out during h = x·W_in; the train step's next gather in its backward), two
    across blocks in the forward (block i+1's W_in and W_out during block i). 0 with synchronous gathers, no
    fsdp axis, stages or weights gathered once per step; remat none only (other policies: not yet modelled).
    Read from libtpu 0.0.42.1 programs
    (docs/findings.md, "Compiler flags")."""
    mesh, flags = w.mesh, w.flags
    if (flags.gathers == "exposed" or mesh["fsdp"] == 1 or mesh["stage"] > 1 or w.schedule.fsdp_gather == "step"
            or isinstance(w.model, TransformerConfig) or w.remat != "none"):  # others: not yet modelled
        return 0.0
    matrices = 2 if flags.gathers == "across-blocks" and w.step == "forward" else 1
    return matrices * w.precision.compute * w.model.d_model * w.model.d_ff / shards(mesh, "mlp")


def hbm_traffic_bytes(w: Workload):
    """HBM bytes one device reads and writes in a step (the memory-bandwidth roofline's numerator); the
    transformer's: scaling.transformer.hbm_traffic_bytes. The FFN stack's:

    train:   AdamW reads master, grad, mu, nu and writes master, mu, nu: 7·4 = 28 B/param/N;
             the gathered bf16 weights are read by the forward, dX and dW matmuls: 3·L·c·2·D·F/Y;
             saved activations are written once and read once: 2·saved_activation_bytes
    forward: the fp32 master read once, 4·P/N; the gathered weights read once, L·c·2·D·F/Y; each
             block's input and hidden written and read once, 2·c·b·(D + F/Y)·L
    (Scaling Book roofline page: T_mem = bytes moved / HBM bandwidth.)
    """
    if isinstance(w.model, TransformerConfig):
        return transformer.hbm_traffic_bytes(w)
    cfg, mesh, batch_tokens, remat, step, precision = w.model, w.mesh, w.batch_tokens, w.remat, w.step, w.precision
    D, F, L, Y, c = cfg.d_model, cfg.d_ff, cfg.blocks, shards(mesh, "mlp"), precision.compute
    weights = L * c * 2 * D * F / Y
    if step == "forward":
        b = tokens_per_device(mesh, batch_tokens)
        return precision.master * cfg.params / weight_shards(mesh) + weights + 2 * c * b * (D + F / Y) * L
    optimizer = precision.adam_update_bytes_per_param  # read 16 + write 12
    return (optimizer * cfg.params / weight_shards(mesh) + 3 * weights
            + 2 * saved_activation_bytes(cfg, mesh, batch_tokens, remat, precision))


def param_memory(params: int, precision: Precision = DEFAULT_PRECISION) -> dict[str, int]:
    """Unsharded bytes of each kind of per-parameter state for ``params`` parameters:
    bf16 weights c·P, master weights, gradients, Adam moments 2·4·P (training page: LLaMA-70B has
    140 GB of bf16 params and 560 GB of fp32 Adam moments)."""
    positive_int("params", params)
    return {
        "weights_compute": precision.compute * params,
        "master": precision.master * params,
        "grads": precision.grad * params,
        "optimizer": precision.adam_moments * precision.adam_moment * params,
    }


def state_bytes(cfg: FFNConfig, precision: Precision = DEFAULT_PRECISION) -> int:
    """Unsharded FP32 master + grads + Adam moments: 16·P bytes (training page)."""
    m = param_memory(cfg.params, precision)
    return m["master"] + m["grads"] + m["optimizer"]


def min_shards_for_state(cfg: FFNConfig, hbm_bytes: float, precision: Precision = DEFAULT_PRECISION) -> int:
    """Smallest N with 16·P/N <= HBM: ceil(16·P / HBM) (questions-4d.md (b), no activations)."""
    return math.ceil(state_bytes(cfg, precision) / hbm_bytes)


def min_shards_with_activations(
    cfg: FFNConfig,
    hbm_bytes: float,
    batch_tokens: int,
    activation_fraction: float = 0.5,
    precision: Precision = DEFAULT_PRECISION,
) -> int:
    """Smallest N with (16·P + f·A·B)/N <= HBM, A = activation_bytes_per_token, f the fraction of
    activations kept (1/2: "every second layer", questions-4d.md (b)); everything sharded over N."""
    total = (state_bytes(cfg, precision)
             + activation_fraction * activation_bytes_per_token(cfg, precision) * batch_tokens)
    return math.ceil(total / hbm_bytes)
