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

from scaling.config import DEFAULT_PRECISION, FFNConfig, Precision, check_remat, positive_int, positive_ints
from scaling.sharding import shards


def weight_shards(mesh: Mapping):
    """Pieces each weight matrix is split into: the shards of its ``embed`` and ``mlp`` axes (fsdp·tensor)."""
    return shards(mesh, "embed", "mlp")


def tokens_per_device(mesh: Mapping, batch_tokens):
    """b = B / (shards of ``batch``) = B/(data·fsdp): the tokens each device holds."""
    return positive_ints("batch_tokens", batch_tokens) / shards(mesh, "batch")


def saved_blocks(blocks: int, remat: str) -> tuple[int, int]:
    """(blocks that save input and hidden, blocks that save only their input) under a remat policy.

    none: every block keeps x and h. full: every block keeps only x (h is recomputed).
    every-second: blocks are taken in pairs (first checkpointed, second not); an odd last block is
    checkpointed: floor(L/2) full, ceil(L/2) input-only.
    """
    check_remat(remat)
    if remat == "none":
        return blocks, 0
    if remat == "full":
        return 0, blocks
    return blocks // 2, blocks - blocks // 2


def activation_bytes_per_token(cfg: FFNConfig, precision: Precision = DEFAULT_PRECISION) -> int:
    """Unsharded activations saved for backward, no remat: compute_bytes·(D + F)·L per token.

    Each block's backward needs its input x (D) for dW_in and its hidden h (F) for dW_out
    (questions-4d.md (a); Scaling Book transformers page). For the XXL: 2·(16384+53248)·126 = 17,547,264.
    """
    return precision.compute * (cfg.d_model + cfg.d_ff) * cfg.blocks


def saved_activation_bytes(cfg: FFNConfig, mesh: Mapping, batch_tokens, remat: str = "none",
                           precision: Precision = DEFAULT_PRECISION):
    """Activations saved for backward per device, under the remat policy.

    tokens per device b = B/(data·fsdp); a full block keeps x (D, replicated over tensor) and
    h (F/tensor); an input-only block keeps x:  bytes = c·b·[n_full·(D + F/Y) + n_input·D].
    """
    b = tokens_per_device(mesh, batch_tokens)
    n_full, n_input = saved_blocks(cfg.blocks, remat)
    D, F, Y = cfg.d_model, cfg.d_ff, shards(mesh, "mlp")
    return precision.compute * b * (n_full * (D + F / Y) + n_input * D)


def memory_per_device(cfg: FFNConfig, mesh: Mapping, batch_tokens, remat: str = "none",
                      precision: Precision = DEFAULT_PRECISION, windowed_grad_rs: bool = False) -> dict:
    """Training memory per device in bytes, term by term.

    master  = master·P/(X·Y)             fp32 weights, 4 B/param
    optimizer = moments·moment·P/(X·Y)   Adam mu, nu, 8 B/param
    grads   = grad·P/(X·Y)               fp32 gradients, 4 B/param
    activations = saved_activation_bytes (bf16, under the remat policy)
    transient_weights = 2 layers' bf16 weights gathered over fsdp: c·2·(2·D·F/Y)
        (the scan gathers one block's W_in and W_out; XLA prefetches the next block's; the
        backward needs the same). With ``windowed_grad_rs`` (XLA:TPU's windowed-einsum gradient
        reduce-scatter, scaling.program) the backward streams dW in chunks and holds one gathered
        matrix at a time: c·D·F/Y (compiled XXL, fsdp=16, tensor=4, v5p:4x4x4: 67.79 GB peak
        against 67.53 GB with this term, 68.84 GB with the two-layer one)
    inputs  = x and targets of the batch per device, bf16 and fp32: (c + 4)·D·B/(data·fsdp)
    total   = sum of the above.  16·P/N + activations + transients (training page: 16 B/param).
    """
    shards_w = weight_shards(mesh)
    P, D, F = cfg.params, cfg.d_model, cfg.d_ff
    terms = {
        "master": precision.master * P / shards_w,
        "optimizer": precision.adam_moments * precision.adam_moment * P / shards_w,
        "grads": precision.grad * P / shards_w,
        "activations": saved_activation_bytes(cfg, mesh, batch_tokens, remat, precision),
        "transient_weights": precision.compute * (1 if windowed_grad_rs else 4) * D * F / shards(mesh, "mlp"),
        "inputs": (precision.compute + 4) * D * tokens_per_device(mesh, batch_tokens),
    }
    terms["total"] = sum(terms.values())
    return terms


def forward_memory_per_device(cfg: FFNConfig, mesh: Mapping, batch_tokens,
                              precision: Precision = DEFAULT_PRECISION) -> dict:
    """Memory per device of a forward-only step (the loss, no gradients), term by term.

    master      = master·P/(X·Y)                   fp32 weights
    transient_weights = c·D·F/Y                     one gathered bf16 weight matrix at a time
                  (with nothing saved for backward, W_in's gathered copy is dead before W_out's is made)
    activations = c·b·(F/Y + 2·D)                  one block's working set: hidden, its input and
                  output; b = B/(data·fsdp) (the loss's fp32 residual is fused into the reduction)
    inputs      = (c + 4)·D·b                      x bf16 and targets fp32
    Source: this package's reading of the compiled forward step (XXL, fsdp=16, tensor=4 on
    v5p:4x4x4: 14.43 GB compiled against 14.48 GB here).
    """
    D, F, Y, c = cfg.d_model, cfg.d_ff, shards(mesh, "mlp"), precision.compute
    b = tokens_per_device(mesh, batch_tokens)
    terms = {
        "master": precision.master * cfg.params / weight_shards(mesh),
        "transient_weights": c * D * F / Y,
        "activations": c * b * (F / Y + 2 * D),
        "inputs": (c + 4) * D * b,
    }
    terms["total"] = sum(terms.values())
    return terms


def hbm_traffic_bytes(cfg: FFNConfig, mesh: Mapping, batch_tokens, remat: str = "none", step: str = "train",
                      precision: Precision = DEFAULT_PRECISION):
    """HBM bytes one device reads and writes in a step (the memory-bandwidth roofline's numerator).

    train:   AdamW reads master, grad, mu, nu and writes master, mu, nu: 7·4 = 28 B/param/N;
             the gathered bf16 weights are read by the forward, dX and dW matmuls: 3·L·c·2·D·F/Y;
             saved activations are written once and read once: 2·saved_activation_bytes
    forward: the fp32 master read once, 4·P/N; the gathered weights read once, L·c·2·D·F/Y; each
             block's input and hidden written and read once, 2·c·b·(D + F/Y)·L
    (Scaling Book roofline page: T_mem = bytes moved / HBM bandwidth.)
    """
    D, F, L, Y, c = cfg.d_model, cfg.d_ff, cfg.blocks, shards(mesh, "mlp"), precision.compute
    weights = L * c * 2 * D * F / Y
    if step == "forward":
        b = tokens_per_device(mesh, batch_tokens)
        return precision.master * cfg.params / weight_shards(mesh) + weights + 2 * c * b * (D + F / Y) * L
    moments = precision.adam_moments * precision.adam_moment
    optimizer = (precision.master + precision.grad + moments) + (precision.master + moments)  # read 16 + write 12
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
    total = state_bytes(cfg, precision) + activation_fraction * activation_bytes_per_token(cfg, precision) * batch_tokens
    return math.ceil(total / hbm_bytes)
