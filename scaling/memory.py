"""Bytes per device, term by term, for the FFN stack on a (data, fsdp, tensor) mesh.

Sharding (the table in mesh/rules.py): weights W_in and W_out (both stored [L,F,D]) are split D over fsdp
and F over tensor, replicated over data; the batch is split over data·fsdp; the block input x[B,D]
is replicated over tensor, the hidden h[B,F] is split F over tensor.

Sources: Scaling Book training page ("FP32 master + FP32 grads + two FP32 moments: 16 bytes/param";
"bf16 params + fp32 Adam moments: 10 bytes/param") and transformers page (activations saved for
backward are the matmul inputs backward needs).
"""

from __future__ import annotations

import math

from scaling.config import DEFAULT_PRECISION, FFNConfig, MeshShape, Precision, check_remat, positive_int


def weight_shards(mesh: MeshShape) -> int:
    """Number of pieces each weight matrix is split into: fsdp · tensor."""
    return mesh.fsdp * mesh.tensor


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


def saved_activation_bytes(
    cfg: FFNConfig, mesh: MeshShape, batch_tokens: int, remat: str = "none", precision: Precision = DEFAULT_PRECISION
) -> float:
    """Activations saved for backward per device, under the remat policy.

    tokens per device b = B/(data·fsdp); a full block keeps x (D, replicated over tensor) and
    h (F/tensor); an input-only block keeps x:  bytes = c·b·[n_full·(D + F/Y) + n_input·D].
    """
    positive_int("batch_tokens", batch_tokens)
    b = batch_tokens / mesh.batch_shards
    n_full, n_input = saved_blocks(cfg.blocks, remat)
    D, F, Y = cfg.d_model, cfg.d_ff, mesh.tensor
    return precision.compute * b * (n_full * (D + F / Y) + n_input * D)


def memory_per_device(
    cfg: FFNConfig,
    mesh: MeshShape,
    batch_tokens: int,
    remat: str = "none",
    precision: Precision = DEFAULT_PRECISION,
    windowed_grad_rs: bool = False,
) -> dict[str, float]:
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
    positive_int("batch_tokens", batch_tokens)
    shards = weight_shards(mesh)
    P = cfg.params
    D, F = cfg.d_model, cfg.d_ff
    terms = {
        "master": precision.master * P / shards,
        "optimizer": precision.adam_moments * precision.adam_moment * P / shards,
        "grads": precision.grad * P / shards,
        "activations": saved_activation_bytes(cfg, mesh, batch_tokens, remat, precision),
        "transient_weights": precision.compute * (1 if windowed_grad_rs else 4) * D * F / mesh.tensor,
        "inputs": (precision.compute + 4) * D * batch_tokens / mesh.batch_shards,
    }
    terms["total"] = sum(terms.values())
    return terms


def forward_memory_per_device(
    cfg: FFNConfig,
    mesh: MeshShape,
    batch_tokens: int,
    precision: Precision = DEFAULT_PRECISION,
) -> dict[str, float]:
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
    positive_int("batch_tokens", batch_tokens)
    D, F, Y, c = cfg.d_model, cfg.d_ff, mesh.tensor, precision.compute
    b = batch_tokens / mesh.batch_shards
    terms = {
        "master": precision.master * cfg.params / weight_shards(mesh),
        "transient_weights": c * D * F / Y,
        "activations": c * b * (F / Y + 2 * D),
        "inputs": (c + 4) * D * b,
    }
    terms["total"] = sum(terms.values())
    return terms


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
