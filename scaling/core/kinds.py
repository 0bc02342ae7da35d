"""The kinds that are not policies, each a closed set of names (StrEnums: a member is its string, so a value stored
or printed as the string and one stored as the member compare, hash and serialize alike): the platform, the model
family, a transformer's MLP and block, the step-time forms, the matmul model, a kernel's kind and pass, a matmul's
input type and a collective. The policies a step runs under are scaling.core.policies'; XLA's schedule of the
fsdp gathers is scaling.core.flags.Gathers. Pure Python.
"""

from __future__ import annotations

import enum


class Platform(enum.StrEnum):
    """Where a step compiles and runs: jax's platform, a chip's kind (scaling/data/chips.toml ``kind``)."""
    CPU = "cpu"
    TPU = "tpu"
    GPU = "gpu"


class Family(enum.StrEnum):
    """A model family's key (ModelFamily.family: which program builds it, ffn_model.families)."""
    FFN = "ffn"
    TRANSFORMER = "transformer"
    MOE = "moe"


class Mlp(enum.StrEnum):
    """A transformer's MLP: act(h·W_in)·W_out with relu or gelu, or SwiGLU's three matrices (Shazeer 2020)."""
    RELU = "relu"
    GELU = "gelu"
    SWIGLU = "swiglu"


class Block(enum.StrEnum):
    """A transformer block: attention then MLP, each with a residual (serial), or both on one norm's output summed
    into one residual (parallel: GPT-J, PaLM)."""
    SERIAL = "serial"
    PARALLEL = "parallel"


class Form(enum.StrEnum):
    """How a step's time adds its terms (scaling.hardware.roofline.FORMS and the planner's PLAN_FORMS): compute plus
    every collective (sum), the largest term (max), or the terms as the flags' schedule overlaps them (scheduled)."""
    SUM = "sum"
    MAX = "max"
    SCHEDULED = "scheduled"


class KernelModel(enum.StrEnum):
    """The matmul term of the step model (scaling.step.kernels.KERNEL_MODELS): eta·q(shape) of the peak
    (efficiency), or DeepFlow's tiles through the memory hierarchy (hierarchical)."""
    EFFICIENCY = "efficiency"
    HIERARCHICAL = "hierarchical"


class KernelKind(enum.StrEnum):
    """What a step's kernel is (scaling.step.kernels.Kernel.kind)."""
    MATMUL = "matmul"
    ATTENTION = "attention"
    POINTWISE = "pointwise"
    OPTIMIZER = "optimizer"


class KernelPass(enum.StrEnum):
    """The pass a step's kernel runs in (scaling.step.kernels.Kernel.pass_)."""
    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    UPDATE = "update"


class Dtype(enum.StrEnum):
    """A matmul's input type (scaling.step.kernels.DTYPE_BYTES; the hardware table's bf16_flops and dtype_flops)."""
    BF16 = "bf16"
    FP32 = "fp32"
    TF32 = "tf32"
    FP8 = "fp8"
    INT8 = "int8"


class Collective(enum.StrEnum):
    """A collective as XLA's programs name it (scaling.hardware.collectives.KIND_FACTOR: the step model's volumes
    by kind)."""
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_REDUCE = "all-reduce"
    ALL_TO_ALL = "all-to-all"
    COLLECTIVE_PERMUTE = "collective-permute"
