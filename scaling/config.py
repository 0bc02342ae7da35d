"""Re-exports every public name this module held before the split (the lead rewrites the imports after the
merge): input rules (scaling.inputs), policies and precision (scaling.policies), the mesh shape
(scaling.mesh_shape), the schedule (scaling.schedule), the model families (scaling.family, scaling.ffn,
scaling.transformer) and the presets (scaling.presets). No module inside scaling/ imports this one."""

# ruff: noqa: F401

from scaling.mesh_shape import MESH_AXES, MeshShape, parse_mesh_spec, spans
from scaling.policies import (
    ACCUMULATION_BYTES,
    ATTENTIONS,
    Attention,
    CONTEXT_STRATEGIES,
    ContextStrategy,
    DEFAULT_PRECISION,
    FSDP_GATHERS,
    FsdpGather,
    OPTIMIZER_SHARDINGS,
    OptimizerSharding,
    PIPELINES,
    Pipeline,
    Precision,
    REMAT_POLICIES,
    Remat,
    STEPS,
    Step,
    TRANSFORMER_ONLY_REMAT,
    check_remat,
    choose,
)
from scaling.inputs import MAX_SEED, check_seed, non_negative_int, positive_float, positive_int, positive_ints
from scaling.ffn import FFNConfig
from scaling.transformer import BLOCK_KINDS, MLP_KINDS, TransformerConfig
from scaling.presets import FAMILIES, PRESETS, Model, get_preset, maxtext_scale
from scaling.family import check_divisible, divisions
from scaling.schedule import Schedule, saved_blocks
