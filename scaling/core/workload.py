"""The workload: one step of one model on one mesh, everything the closed forms, the model builder and the
check need to know about it, validated once where it is built. A new input is one field here.

    model      a ModelFamily: FFNConfig (scaling.families.ffn) | TransformerConfig (scaling.families.transformer)
    mesh       MeshShape: the sizes of data, stage, fsdp, context, tensor
    batch_tokens  B, the global batch in tokens (the planner passes a numpy array of candidates)
    step       Step: train or forward
    remat      Remat: none, every-second, full, a transformer's named policies (the planner passes RematCells, a
               policy a cell, to a transformer's closed forms: scaling.families.transformer.by_policy)
    schedule   Schedule: microbatches, pipeline repeats, sequence parallelism, attention (scaling.core.schedule)
    precision  Precision: bytes per element of each kind of state (questions-4d.md)
    compiler   CompilerFacts: what the compiler does that changes the program's bytes
    flags      FlagSet: the XLA flags the step is compiled with and how its schedule overlaps collectives
               (scaling.core.flags; default libtpu's own, no flags, as jax.jit compiles; the commands' --xla-flags
               default is DEFAULT_FLAGS, what production runs pass)

The chip and the links a mesh axis runs over are where the workload runs, not what it is: they are the
step model's other arguments (scaling.step.program.predict).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from scaling.core.family import ModelFamily, is_family
from scaling.core.inputs import non_negative_int, positive_int, validated_copy
from scaling.core.mesh_shape import MESH_AXES, MeshGrid, MeshShape
from scaling.core.policies import DEFAULT_PRECISION, OptimizerSharding, Precision, Remat, Step, check_remat, choose
from scaling.core.schedule import Schedule
from scaling.core.flags import FlagSet, get_flag_set


@dataclass(frozen=True)
class CompilerFacts:
    """What XLA does with the program that the closed forms model (each read from compiled programs; their
    rules and measurements in docs/findings.md):

    windowed_grad_rs       the fsdp gradient reduce-scatter runs as a windowed einsum ((X+1)/X of V as
                           collective-permutes); None: XLA:TPU's rule decides (scaling.step.program.windowed_einsum_rs)
    merged_grad_allreduce  the weight gradients reduced by one all-reduce over data·fsdp (XLA:TPU for TPU7x)
    circular_relays        re-lays of the FP32 stacks per train step in a circular pipeline (2, or 3 where
                           XLA re-lays them again for the backward)
    min_comm_bytes         the narrowest element on the wire (XLA:CPU runs bf16 collectives in f32: 4)
    joint_head_reduce      a pipeline with data parallelism: the output layer's gradient summed over stage and
                           data in one all-reduce (XLA:TPU), not one over each (XLA:CPU)
    head_reduce_in_loop    1F1B: the output layer's FP32 gradient accumulator reduced over the loop's automatic
                           token axes (an MoE model's expert) every head iteration (XLA:CPU), not once after the loop
                           (XLA:TPU)
    lookup_reduce_in_loop  1F1B: the lookup's FP32 gradient accumulator reduced over the loop's automatic token axes
                           (an MoE model's expert) every iteration (XLA:CPU, XLA:TPU), not once after the loop
                           (XLA:GPU, with the output layer's)
    host_offload           an offloading remat policy's residuals live in pinned host memory (XLA:TPU, XLA:GPU),
                           not in device memory (XLA:CPU, whose host and device memory are one: it ignores the
                           placement, jax 0.10.2)
    gpu_layouts            XLA:GPU's layouts: an all-gather's operand laid out with the gathered dimension major, so
                           the FP32 master, gathered over fsdp on D (its minor dimension), is copied once a step
                           into that layout (scaling.families.moe.fp32_copies; docs/findings.md, "The MoE peak on GPUs")
    """

    windowed_grad_rs: bool | None = None
    merged_grad_allreduce: bool = False
    circular_relays: int = 2
    min_comm_bytes: int = 0
    joint_head_reduce: bool = False
    head_reduce_in_loop: bool = False
    lookup_reduce_in_loop: bool = True
    host_offload: bool = True
    gpu_layouts: bool = False

    def __post_init__(self):
        positive_int("circular_relays", self.circular_relays)
        non_negative_int("min_comm_bytes", self.min_comm_bytes)


@dataclass(frozen=True, eq=False)
class RematCells:
    """Remat policies over the planner's cells (a group's (batch, microbatch, mesh) candidates, each evaluated under
    its own policy: scaling.planner.plan._screen): ``names`` the policies, ``index`` an integer array, each cell's
    position in ``names``. Compared with a policy's name it gives each cell's truth (remat == "full": a bool array); the
    transformer's closed forms take each cell's figure under its policy (scaling.families.transformer.by_policy)."""

    names: tuple
    index: np.ndarray

    @property
    def ndim(self) -> int:
        return np.ndim(self.index)

    def __eq__(self, name) -> np.ndarray:
        return self.index == self.names.index(name) if name in self.names else np.zeros(np.shape(self.index), bool)

    def __ne__(self, name) -> np.ndarray:
        return ~(self == name)

    __hash__ = None

    def __getitem__(self, key) -> RematCells:
        return RematCells(self.names, self.index[key])

    @functools.cached_property
    def used(self) -> tuple[tuple[str, int], ...]:
        """(policy, its position in names) of each policy some cell has."""
        present = np.bincount(np.ravel(self.index), minlength=len(self.names))
        return tuple((n, i) for i, n in enumerate(self.names) if present[i])

    @functools.cached_property
    def place(self) -> np.ndarray:
        """Each cell's policy's position in ``used``."""
        at = np.zeros(len(self.names), int)
        at[[i for _, i in self.used]] = range(len(self.used))
        return at[self.index]


@functools.lru_cache(maxsize=64)
def _check_remats(names: tuple, model) -> None:
    """check_remat of each of ``names`` for ``model`` (RematCells' policies, checked once per set: the planner builds
    thousands of workloads of a few sets)."""
    for r in names:
        check_remat(r, model)


@dataclass(frozen=True)
class Workload:
    """One step of ``model`` on ``mesh`` with a batch of ``batch_tokens`` (module docstring). Built, it has
    passed every rule the model builder enforces: the remat policy exists for the model
    (policies.check_remat), every sharded dimension divides by its shard count (the family's check_divisible, the
    sharding table) and the schedule can run the batch (Schedule.check); a ValueError names the input
    otherwise. An array batch (the planner's candidates) is checked for what does not depend on it."""

    model: ModelFamily
    mesh: MeshShape | MeshGrid  # one mesh, or the planner's many at once (their arrays of sizes)
    batch_tokens: int | np.ndarray
    step: Step = Step.TRAIN
    remat: Remat = Remat.NONE
    schedule: Schedule = Schedule()
    precision: Precision = DEFAULT_PRECISION
    compiler: CompilerFacts = field(default_factory=CompilerFacts)
    flags: FlagSet = field(default_factory=get_flag_set)

    def __post_init__(self):
        if not is_family(self.model):  # a family's config (scaling.core.family)
            raise ValueError(f"model must be an FFNConfig or a TransformerConfig, got {type(self.model).__name__}")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        if self.array_mesh:  # the planner's group of meshes, each checked by it (scaling.planner.plan)
            set_("mesh", MeshGrid({a: self.mesh.get(a, 1) for a in MESH_AXES}))
        elif not isinstance(self.mesh, MeshShape):
            set_("mesh", MeshShape(self.mesh) if isinstance(self.mesh, Mapping) else self.mesh)
        set_("step", choose(Step, self.step, "step"))
        set_("flags", get_flag_set(self.flags))
        if np.ndim(self.remat):  # the planner's cells of a group, each with its own policy (RematCells)
            if not isinstance(self.remat, RematCells):  # an array of names
                names, index = np.unique(np.asarray(self.remat, dtype=str), return_inverse=True)
                set_("remat", RematCells(tuple(names.tolist()), index.reshape(np.shape(self.remat))))
            _check_remats(self.remat.names, self.model)
        else:
            set_("remat", check_remat(self.remat, self.model))
        batch = self.batch_tokens if np.ndim(self.batch_tokens) == 0 and self.scalar_schedule else None
        if batch is not None:
            set_("batch_tokens", positive_int("batch_tokens", batch))
        if not self.array_mesh:
            self.model.check_divisible(self.mesh, batch)
            self.schedule.check(self.model, self.mesh, batch)

    @property
    def array_mesh(self) -> bool:
        """Whether the mesh holds arrays of axis sizes (the planner's group of meshes that agree on which axes are
        > 1, mesh_shape.spans): checked mesh by mesh by the planner, not here."""
        return isinstance(self.mesh, Mapping) and any(np.ndim(v) for v in self.mesh.values())

    @property
    def scalar_schedule(self) -> bool:
        """Whether the schedule holds one microbatch count (not the planner's array of candidates)."""
        return np.ndim(self.schedule.microbatches) == 0

    @property
    def zero1_shards(self) -> int:
        """How many more pieces ZeRO-1 (Schedule.optimizer_sharding) splits the Adam moments and the reduced
        gradients into: data (1 under fsdp, and for a forward step)."""
        zero1 = self.schedule.optimizer_sharding == OptimizerSharding.ZERO1 and self.step == Step.TRAIN
        return self.mesh["data"] if zero1 else 1

    def replace(self, **kw) -> Workload:
        """A copy with the fields in ``kw`` changed, validated again."""
        return dataclasses.replace(self, **kw)

    def with_facts(self, **kw) -> Workload:
        """A copy whose compiler facts have the fields in ``kw`` changed (validated; the rest, validated when this
        workload was built, is not checked again: the planner and StepModel make many such copies)."""
        return validated_copy(self, compiler=dataclasses.replace(self.compiler, **kw))
