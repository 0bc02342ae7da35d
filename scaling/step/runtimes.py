"""The memory per device of a transformer step as a PyTorch runtime keeps it (Megatron-LM, Megatron-DeepSpeed):
what their code allocates, in place of what this package's program keeps
(scaling.families.transformer.memory_per_device). Chosen by Precision.accumulation, the runtime that runs the step
(predict --grad-accumulation; "package" is this package's own program, whose compiled peak scaling.families.transformer
models and verify.check proves).

Per device, P = the stage's parameters over tensor (the first stage's: its layers and the word embedding, which
BLOOM's and Megatron's first and last stages both hold), z = the data shards of the optimizer state (ZeRO-1 /
the distributed optimizer; 1 without), t = a microbatch's tokens per data shard, c = 2 (16-bit activations):

  weights    16-bit parameters, replicated over data: 2·P
  grads      Megatron-LM 2021: the FP32 main_grad buffer its gradient hook accumulates into, 4·P; DeepSpeed ZeRO-1:
             the 16-bit gradients, 2·P
  fp32_state the FP32 master weights and Adam's two moments (12·P), and under ZeRO-1 the FP32 gradient partition
             (16·P/z: "ZeRO shards all fp32 optim+grad+params over all gpus", BLOOM's topology search, seed 003)
  zero_buckets DeepSpeed ZeRO's communication buckets: overlap_comm uses 4.5x the allgather and reduce bucket sizes,
             5e8 elements of 2 B each by default: 5e8·2·2·4.5 = 9 GB (DeepSpeed's ZeRO configuration notes); 0 for
             Megatron-LM
  activations activation checkpointing of every layer (Megatron's --checkpoint-activations, DeepSpeed's
             activation_checkpoint_interval 1): each layer's input c·t·D (/Y under sequence parallelism) for every
             microbatch in flight on the first stage (stage_inflight), and each in-flight microbatch's stage
             output (DeepSpeed's and Megatron's pipeline buffers), c·t·D
  recomputed_layer the layer whose backward runs: its recomputed forward's residuals (saved_per_layer "none")
  attention_working_set, loss_phase, inputs: as this package's (scaling.families.transformer.memory_per_device; without
             stages the working set of one microbatch, the package's over M)
"""

from __future__ import annotations

from scaling.core.policies import Pipeline
from scaling.core.workload import Workload

# the runtimes whose memory this module models (Precision.accumulation); "package" is not one of them
RUNTIMES = ("megatron", "deepspeed-bf16")
# bytes per parameter each runtime keeps: 16-bit weights, its gradients (replicated), FP32 state over z shards;
# reserved: ZeRO's buckets (DeepSpeed's ZeRO notes: overlap_comm, 4.5 x 2 buckets of 5e8 2-byte elements)
RUNTIME_STATE = {
    "megatron": {"weights": 2, "grads": 4, "fp32_state": 12, "reserved": 0.0},
    "deepspeed-bf16": {"weights": 2, "grads": 2, "fp32_state": 16, "reserved": 5e8 * 2 * 2 * 4.5},
}


def stage_inflight(w: Workload) -> tuple[float, float]:
    """(microbatch-chunks the first stage holds at its peak, layers per chunk): without stages (1, L); 1F1B
    (PipeDream-Flush, Narayanan et al. 2021 section 2.2; DeepSpeed's TrainSchedule: num_pipe_buffers = S − stage)
    (S, L/S); interleaved 1F1B with R chunks (Megatron-LM's schedules.py: rank 0 runs (S − 1)·2 + (R − 1)·S warm-up
    chunk forwards and one more before its first backward) ((S − 1)·2 + (R − 1)·S + 1, L/(S·R)); GPipe and circular
    every microbatch's (M·R, L/(S·R))."""
    S, schedule, L = w.mesh.get("stage", 1), w.schedule, w.model.blocks
    if S == 1:
        return 1, L
    R, M = schedule.repeats, schedule.microbatches
    if schedule.pipeline == Pipeline.ONE_F_ONE_B:
        return (S if R == 1 else (S - 1) * 2 + (R - 1) * S + 1), L / (S * R)
    return M * R, L / (S * R)


def runtime_memory(w: Workload, package: dict, layer_residuals: float) -> dict:
    """The runtime's memory terms per device (module docstring), bytes; ``package`` is
    scaling.families.transformer.memory_per_device's terms for the same workload (its attention working set, batch and
    loss phase are kept), ``layer_residuals`` one layer's residuals without remat on a microbatch (its saved_per_layer
    "none"), what the layer whose backward runs recomputes."""
    cfg, mesh, schedule, precision = w.model, w.mesh, w.schedule, w.precision
    state = RUNTIME_STATE[precision.accumulation]
    S, Y = mesh.get("stage", 1), mesh.get("tensor", 1)
    z = w.zero1_shards
    P = (cfg.params - cfg.embedding_params) / (S * Y) + cfg.embedding_params / Y
    tokens = w.batch_tokens / schedule.microbatches  # a microbatch's, over every data shard
    t = tokens / (mesh.get("data", 1) * mesh.get("fsdp", 1))
    c, D = precision.compute, cfg.d_model
    x = c * t * D / (Y if schedule.sequence_parallel else 1)
    chunks, layers = stage_inflight(w)
    terms = {"weights": state["weights"] * P, "grads": state["grads"] * P,
             "fp32_state": state["fp32_state"] * P / z, "zero_buckets": state["reserved"],
             "inputs": package.get("inputs", 0.0),
             "activations": chunks * (layers + (1 if S > 1 else 0)) * x,
             "recomputed_layer": layer_residuals,
             # the package's is the whole shard's without stages (no gradient accumulation there): a microbatch's
             "attention_working_set": package.get("attention_working_set", 0.0) / (schedule.microbatches if S == 1
                                                                                   else 1),
             "loss_phase": package.get("loss_phase", 0.0)}
    terms["total"] = sum(terms.values())
    return terms
