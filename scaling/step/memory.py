"""Bytes per device, term by term, for the FFN stack on a mesh.

Sharding (the table in scaling.core.sharding): weights W_in and W_out (both stored [L,F,D]) are split D over
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


from scaling.core.family import ModelFamily
from scaling.core.inputs import positive_int, positive_ints
from scaling.core.policies import DEFAULT_PRECISION, Precision
from scaling.core.schedule import saved_blocks
from scaling.core.sharding import shards
from scaling.core.workload import Workload


def weight_shards(mesh: Mapping):
    """Pieces each weight stack is split into: the shards of its ``layers``, ``embed`` and ``mlp`` axes
    (stage·fsdp·tensor)."""
    return shards(mesh, "layers", "embed", "mlp")


def tokens_per_device(mesh: Mapping, batch_tokens):
    """b = B / (shards of ``batch``) = B/(data·fsdp): the tokens each device holds."""
    return positive_ints("batch_tokens", batch_tokens) / shards(mesh, "batch")


def activation_bytes_per_token(cfg: ModelFamily, precision: Precision = DEFAULT_PRECISION) -> int:
    """Unsharded activations saved for backward, no remat: compute_bytes·(D + F)·L per token.

    Each block's backward needs its input x (D) for dW_in and its hidden h (F) for dW_out
    (questions-4d.md (a); Scaling Book transformers page). For the XXL: 2·(16384+53248)·126 = 17,547,264.
    """
    return precision.compute * (cfg.d_model + cfg.d_ff) * cfg.blocks


def saved_activation_bytes(cfg: ModelFamily, mesh: Mapping, batch_tokens, remat: str = "none",
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
    (scaling.families.ffn.train_memory_per_device) or forward step (scaling.families.ffn.forward_memory_per_device), the
    transformer's (scaling.families.transformer.memory_per_device): the model family's (cfg.forms)."""
    return w.model.forms.memory_per_device(w)


def hbm_traffic_bytes(w: Workload):
    """HBM bytes one device reads and writes in a step (the memory-bandwidth roofline's numerator): the model
    family's (cfg.forms: scaling.families.ffn.hbm_traffic_bytes,
    scaling.families.transformer.hbm_traffic_bytes)."""
    return w.model.forms.hbm_traffic_bytes(w)


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


def state_bytes(cfg: ModelFamily, precision: Precision = DEFAULT_PRECISION) -> int:
    """Unsharded FP32 master + grads + Adam moments: 16·P bytes (training page)."""
    m = param_memory(cfg.params, precision)
    return m["master"] + m["grads"] + m["optimizer"]


def min_shards_for_state(cfg: ModelFamily, hbm_bytes: float, precision: Precision = DEFAULT_PRECISION) -> int:
    """Smallest N with 16·P/N <= HBM: ceil(16·P / HBM) (questions-4d.md (b), no activations)."""
    return math.ceil(state_bytes(cfg, precision) / hbm_bytes)


def min_shards_with_activations(
    cfg: ModelFamily,
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


ZERO1_ROW = 128  # elements: a row of the flat buffer, the TPU's 128 lanes (Megatron-LM aligns its buckets to 128 too)


def zero1_padded(n, data, row: int = ZERO1_ROW):
    """N_pad = ⌈N / (128·data)⌉·128·data: a device's flat ZeRO-1 buffer of N elements padded at its end so that it
    splits evenly over the ``data`` ranks, each rank's slice whole rows of 128 (ffn_model.zero1). Megatron-LM's
    distributed optimizer pads each bucket to a multiple of lcm(data, 128) (megatron/core/distributed/
    param_and_grad_buffer.py, _pad_end_of_bucket_if_needed, without pad_buckets_for_high_nccl_busbw; DeepSpeed's
    ZeRO-1/2 pads its flat group to a multiple of 2·data); that is this rule for odd data. For even data this
    pads up to 128·data − 1 elements where Megatron pads less: XLA:TPU turned the reduce-scatter of slices that were
    not whole 128-lane rows into an all-reduce and a slice (v5p, docs/findings.md). Megatron-LM's 64-element
    alignment of each parameter's start (_pad_start_of_param_if_needed) is not followed: the parameters lie end
    to end. Integers in, an int out; numpy arrays (the planner's) elementwise."""
    import numpy as np

    q = np.asarray(data, dtype=np.int64) * row
    out = np.ceil(np.asarray(n) / q) * q
    return int(out) if np.ndim(out) == 0 else out


def zero1_slice(w: Workload, n):
    """Elements of a device's ``n``-element optimizer state (Adam's moments, the update) it keeps: n, or under
    ZeRO-1 (w.zero1_shards = data > 1) its slice of the padded flat buffer, zero1_padded(n, data)/data
    (ffn_model.zero1)."""
    import numpy as np

    d = w.zero1_shards
    return np.where(np.asarray(d) > 1, zero1_padded(n, d) / d, n) if np.ndim(d) else (
        zero1_padded(n, d) / d if d > 1 else n)


def zero1_update(w: Workload, terms: dict, n) -> float:
    """The update phase's bytes above the step's other peak under ZeRO-1 (ffn_model.zero1.flat_update), for a device
    holding ``n`` parameter elements: besides the masters, the moments, the FP32 gradients and the batch (``terms``'
    master, optimizer, grads, inputs), XLA holds the weights' flat FP32 copy (the slice is read from it) and the
    all-gathered FP32 weights, 2·master·N_pad; what the backward held beside them (every other term) is free then:
    max(0, 2·master·N_pad − Σ other terms). 0 without ZeRO-1. Measured: v5p, FFN D=4095, F=16380, L=4, data=2,
    tensor=4 (verify.grids.ZERO1_GRID), the memory-usage report's f32[134152448] twice."""
    import numpy as np

    d = w.zero1_shards
    if not (np.asarray(d) > 1).any():
        return 0.0
    flat = 2 * w.precision.master * zero1_padded(n, d)
    others = sum(v for k, v in terms.items() if k not in ("master", "optimizer", "grads", "inputs"))
    return np.where(np.asarray(d) > 1, np.maximum(0.0, flat - others), 0.0)
