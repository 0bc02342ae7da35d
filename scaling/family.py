"""What a model family is to the rest of the package: the protocol every family's config implements
(scaling.ffn.FFNConfig, scaling.transformer.TransformerConfig), so that the shared rules (Schedule.check,
check_remat, cfg.check_divisible), the step model (scaling.program), the memory terms, the kernels and the planner
ask the model, never its type. A new family is one module that implements it, plus its presets
(scaling.presets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable


@runtime_checkable
class ModelFamily(Protocol):
    """One model family's config and closed forms. Dimensions: D = d_model, F = d_ff, L = blocks, P = params."""

    family: ClassVar[str]  # the registry key of its program builder (ffn_model.families)
    noun: ClassVar[str]  # the family in a message: "FFN stack", "transformer"
    has_attention: ClassVar[bool]
    plan_batch_tokens: ClassVar[int]  # plan's default B
    batch_axis: ClassVar[str]  # the table's logical axis its tokens take (scaling.sharding: "batch", "moe_batch")
    runs_1f1b: ClassVar[bool]  # whether its pipeline runs the 1f1b schedule (Schedule.check)
    has_critical_batch: ClassVar[bool]  # whether predict's critical_batch is modelled (else NaN)
    plan_axes: ClassVar[tuple[str, ...]]  # the mesh axes the planner factorises the chips into
    plan_remats: ClassVar[tuple[str, ...]]  # the remat policies a plan tries by default
    grouped_plan: ClassVar[bool]  # the planner's strategy: meshes in groups with every schedule choice, or one a group
    remat_keeps: ClassVar[Mapping | None]  # what each remat policy keeps, nested (the planner's first fit), or None
    schedule_options: ClassVar[tuple[str, ...]]  # the Schedule fields a plan chooses beyond M, R, pipeline, SP
    # what a command may set (scaling.presets.model_of): {field: what} of its integer dimensions; {field: (choices,
    # what)} of its kinds; {field: what} of its on/off choices; {field: Schedule's field} of the schedule's fields
    # only it has (a field no family of a preset has is refused for it)
    dimensions: ClassVar[dict[str, str]]
    kinds: ClassVar[dict[str, tuple[tuple[str, ...], str]]]
    switches: ClassVar[dict[str, str]]
    schedule_flags: ClassVar[dict[str, str]]

    d_model: int
    d_ff: int
    blocks: int
    seq_len: Any  # T, or None (the FFN stack: no sequences)

    @property
    def params(self) -> int: ...

    @property
    def active_params(self) -> int: ...  # per token (an MoE model's routed experts: k of E)

    @property
    def norm_params(self) -> int: ...  # the norm scales a published count holds and the program omits

    def replace(self, **kw) -> ModelFamily: ...

    # what a command says of running its program on a chip (a line each: what the program cannot run there)
    def program_notes(self, chip) -> list[str]: ...

    # why the program's matmul FLOPs on a platform ("cpu", "gpu", "tpu") are not the closed form's to compare (a kernel
    # the compiler lowers to other matmuls: check shows them, ratio none), or None where they are
    def uncompared_flops(self, platform: str) -> str | None: ...

    # its rules (a ValueError naming the input)
    def check_remat(self, remat: str) -> None: ...

    def check_schedule(self, schedule, mesh: Mapping, batch_tokens: int | None = None) -> None: ...

    def check_batch_split(self, schedule, mesh: Mapping, batch_tokens: int | None = None) -> None: ...

    def divisions(self) -> list[tuple[str, int, str]]: ...

    def check_divisible(self, mesh: Mapping, batch_tokens: int | None = None) -> None: ...

    def mesh_fits(self, mesh: Mapping): ...

    def plan_batch_runs(self, mesh: Mapping, B, M): ...

    # its closed forms of one step (w: scaling.workload.Workload), per device
    def memory_terms(self, w) -> dict: ...

    def hbm_traffic(self, w): ...

    def collective_volumes(self, w) -> dict: ...

    def overlapped_volumes(self, w, vols: dict | None = None) -> dict: ...

    def loop_copy_bytes(self, w) -> float: ...

    def step_flops(self, w) -> dict: ...

    def step_kernels(self, w) -> list: ...


_FAMILY_TYPES: set[type] = set()  # the types is_family has found to implement ModelFamily


def is_family(model) -> bool:
    """Whether ``model`` implements ModelFamily (its runtime check, made once per type: the planner builds a
    Workload per candidate, and the protocol's check reads each of its members)."""
    if type(model) not in _FAMILY_TYPES:
        if not isinstance(model, ModelFamily):
            return False
        _FAMILY_TYPES.add(type(model))
    return True
