"""The policies a step runs under, each a closed set of names: remat, the step, the pipeline schedule, fsdp
gathers, the optimizer's sharding, attention and context strategies (StrEnums, and their names as plain tuples
for argparse), and the precision policy (bytes per element of each kind of state). Pure Python.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Remat(enum.StrEnum):
    """What a block keeps for its backward (check_remat, saved_blocks; the transformer's by name:
    ffn_model.transformer.POLICY_SAVES, scaling.families.transformer.saved_per_layer)."""
    NONE = "none"
    EVERY_SECOND = "every-second"
    FULL = "full"
    SELECTIVE = "selective"  # Korthikanti et al. 2022, section 4.3: the attention core recomputed
    MINIMAL = "minimal"  # MaxText: the projections' outputs kept
    SAVE_DOT_EXCEPT_MLPWI = "save_dot_except_mlpwi"
    SAVE_DOT_EXCEPT_MLP = "save_dot_except_mlp"
    SAVE_QKV_PROJ = "save_qkv_proj"
    # MaxText's custom policy of its TPU7x Llama 3.1 recipes (q, k, v projections and "context", the attention's
    # output with the kernel's residuals, kept on the device): the attention not recomputed
    SAVE_QKV_CONTEXT = "save_qkv_context"
    # MaxText's offloading policies: what they keep lives in pinned host memory, not HBM
    # (scaling.families.transformer.OFFLOADED)
    QKV_PROJ_OFFLOADED = "qkv_proj_offloaded"  # MaxText's qkv_proj_offloaded: q, k, v
    INPUT_QKV_OFFLOADED = "input_qkv_offloaded"  # MaxText's custom policy of its v6e Llama 3.1 70B recipe: + the input


TRANSFORMER_ONLY_REMAT = ("selective", "minimal", "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj",
                          "save_qkv_context",
                          "qkv_proj_offloaded", "input_qkv_offloaded")


class Step(enum.StrEnum):
    """The compiled step: train (forward, backward, AdamW update) or forward (the loss only)."""
    TRAIN = "train"
    FORWARD = "forward"


class FsdpGather(enum.StrEnum):
    """When a pipeline stage gathers its weights over fsdp (Schedule.fsdp_gather)."""
    MICROBATCH = "microbatch"
    STEP = "step"


class Pipeline(enum.StrEnum):
    """The pipeline schedule over the stage axis (Schedule.pipeline; ffn_model.pipeline)."""
    GPIPE = "gpipe"  # all forwards, then all backwards (jax's transpose of the forward's scan)
    CIRCULAR = "circular"  # GPipe's loop over R chunks per stage (repeats > 1)
    ONE_F_ONE_B = "1f1b"  # a forward and a backward every iteration: activations bounded by the stages


class OptimizerSharding(enum.StrEnum):
    """Where AdamW's state lives (Schedule.optimizer_sharding)."""
    FSDP = "fsdp"
    ZERO1 = "zero1"


class Attention(enum.StrEnum):
    """The attention computation of the transformer (Schedule.attention)."""
    MATERIALIZED = "materialized"
    FLASH = "flash"
    SPLASH = "splash"  # jax's Pallas splash attention kernel (TPU; MaxText's)
    CUDNN = "cudnn"  # cuDNN's fused attention through jax.nn.dot_product_attention (GPU)
    AUTO = "auto"  # the platform's production kernel: splash on TPU, cudnn on GPU, flash on CPU (scaling.core.schedule)


class ContextStrategy(enum.StrEnum):
    """How attention runs with a context axis (Schedule.context)."""
    ULYSSES = "ulysses"
    RING = "ring"


def choose(kind: type[enum.StrEnum], value, what: str) -> enum.StrEnum:
    """``value`` as a member of ``kind``; ValueError naming ``what`` and the valid names otherwise."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {', '.join(kind)}, got {value!r}") from None


OPTIMIZER_SHARDINGS = tuple(str(k) for k in OptimizerSharding)  # plain strings (argparse shows its choices)
REMAT_POLICIES = tuple(str(k) for k in Remat)
STEPS = tuple(str(k) for k in Step)
FSDP_GATHERS = tuple(str(k) for k in FsdpGather)
PIPELINES = tuple(str(k) for k in Pipeline)
ATTENTIONS = tuple(str(k) for k in Attention)
CONTEXT_STRATEGIES = tuple(str(k) for k in ContextStrategy)


# HBM bytes one gradient accumulation moves per parameter (each microbatch's gradient added to the FP32
# accumulator), by the runtime that runs the step (Precision.accumulation; predict --grad-accumulation)
ACCUMULATION_BYTES = {
    # this package's step: the microbatch's FP32 gradient and the accumulator read, the accumulator written,
    # 3·4 B (the compiled adds; one H200's profile in docs/findings.md)
    "package": 12,
    # Megatron-LM (Narayanan et al. 2021): its gradient hook's main_grad.add_(grad), the 16-bit gradient read (2 B),
    # the FP32 main_grad read and written (4 + 4 B)
    "megatron": 10,
    # DeepSpeed's BF16_Optimizer.update_hp_grads after each micro-step's backward (its pipeline engine,
    # runtime/pipe/engine.py _exec_backward_pass): hp_grad.add_(lp.grad.to(fp32)), the cast's temporary read 2 B and
    # written 4 B, then the FP32 add read 4 + 4 B and written 4 B
    "deepspeed-bf16": 18,
}


@dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of state (questions-4d.md: FP32 master weights, gradients and
    Adam moments; BF16 activations and gradient communication)."""

    master: int = 4
    grad: int = 4
    adam_moment: int = 4
    adam_moments: int = 2
    compute: int = 2
    grad_comm: int = 2
    weight_comm: int = 2
    # the matmuls' input type: its peak rate is the hardware table's (scaling.step.kernels.peak_flops)
    dtype: str = "bf16"
    accumulation: str = "package"  # the runtime whose gradient accumulation the step runs (ACCUMULATION_BYTES)

    @property
    def state_bytes_per_param(self) -> int:
        """master + grad + moments·moment = 4 + 4 + 2·4 = 16 bytes/param (training page)."""
        return self.master + self.grad + self.adam_moments * self.adam_moment

    @property
    def adam_update_bytes_per_param(self) -> int:
        """HBM bytes AdamW's update moves per parameter: reads master, gradient, mu, nu and writes master, mu, nu,
        (4 + 4 + 8) + (4 + 8) = 28 B."""
        moments = self.adam_moments * self.adam_moment
        return (self.master + self.grad + moments) + (self.master + moments)

    @property
    def accumulate_bytes_per_param(self) -> int:
        """HBM bytes one gradient accumulation moves per parameter, by runtime (ACCUMULATION_BYTES: this package's
        12 B, Megatron-LM's 10 B, DeepSpeed's BF16 optimizer's 18 B)."""
        return ACCUMULATION_BYTES[self.accumulation]

    @property
    def stored_bytes_per_param(self) -> int:
        """What persists between steps: master + moments = 12 bytes/param (gradients are transient)."""
        return self.master + self.adam_moments * self.adam_moment


DEFAULT_PRECISION = Precision()


def check_remat(remat: str, cfg=None) -> Remat:
    """Validate a remat policy name: none, every-second (keep every second block's activations,
    recompute the others), full (keep only each block's input); the transformer's named policies
    (TRANSFORMER_ONLY_REMAT: what each keeps, ffn_model.transformer.POLICY_SAVES). With a model ``cfg``, its
    family's rule too (cfg.check_remat): every-second is refused for a transformer, the named policies for the
    FFN stack."""
    if remat not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {remat!r}; valid: {', '.join(REMAT_POLICIES)}")
    if cfg is not None:
        cfg.check_remat(remat)
    return Remat(remat)
