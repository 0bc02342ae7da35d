"""What a model family is to the rest of the package: the protocol every family's config implements
(scaling.families.ffn.FFNConfig, scaling.families.transformer.TransformerConfig), so that the shared rules
(Schedule.check, check_remat, cfg.check_divisible), the step model (scaling.step.program), the memory terms, the kernels
and the planner ask the model, never its type. A new family is one module that implements it, plus its presets
(scaling.families.presets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from scaling.core.inputs import positive_int
from scaling.core.sharding import LOGICAL_RULES, shards


@runtime_checkable
class ModelFamily(Protocol):
    """One model family's config and closed forms. Dimensions: D = d_model, F = d_ff, L = blocks, P = params."""

    family: ClassVar[str]  # the registry key of its program builder (ffn_model.families)
    noun: ClassVar[str]  # the family in a message: "FFN stack", "transformer"
    batch_axis: ClassVar[str]  # the table's logical axis its tokens take (scaling.core.sharding: "batch", "moe_batch")
    runs_1f1b: ClassVar[bool]  # whether its pipeline runs the 1f1b schedule (Schedule.check)
    has_critical_batch: ClassVar[bool]  # whether predict's critical_batch is modelled (else NaN)
    plan: ClassVar[PlanPolicy]  # what the planner tries for it
    # what a command may set (scaling.families.presets.model_of): {field: what} of its integer dimensions; {field:
    # (choices, what)} of its kinds; {field: what} of its on/off choices; {field: Schedule's field} of the schedule's
    # fields only it has (a field no family of a preset has is refused for it)
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

    # of step_flops' total, the matmul FLOPs a platform runs inside custom calls beyond the attention's ("kernels")
    def custom_call_flops(self, flops: dict, platform: str) -> float: ...

    # its rules (a ValueError naming the input)
    def check_remat(self, remat: str) -> None: ...

    def check_schedule(self, schedule, mesh: Mapping, batch_tokens: int | None = None) -> None: ...

    def check_batch_split(self, schedule, mesh: Mapping, batch_tokens: int | None = None) -> None: ...

    def divisions(self) -> list[tuple[str, int, str]]: ...

    def check_divisible(self, mesh: Mapping, batch_tokens: int | None = None) -> None: ...

    def mesh_fits(self, mesh: Mapping): ...

    def plan_batch_runs(self, mesh: Mapping, B, M): ...

    # its closed forms of one step (w: scaling.core.workload.Workload), per device: the module that holds them, each
    # a function of w (FORMS names them; scaling.step.memory and scaling.step.program call them)
    forms: ClassVar[Any]


# the functions a family's ``forms`` module defines, each of a Workload w (overlapped_volumes also of vols, the
# collective volumes where the caller has them): bytes per device term by term, HBM traffic, collective volumes per
# axis and kind, the part of them the schedule hides, loop-state copy bytes, matmul FLOPs term by term, the kernels
FORMS = ("memory_per_device", "hbm_traffic_bytes", "collective_volumes", "overlapped_volumes", "loop_copy_bytes",
         "step_flops", "step_kernels")


class FamilyDefaults:
    """What a family has unless it says otherwise (its config class derives from this): its program runs on every
    chip (no notes), its matmul FLOPs compare on every platform, no planner screen beyond the divisions and the
    stages, no batch rule after the shared ones."""

    def program_notes(self, chip) -> list[str]:
        """No note: the program runs on every chip the hardware table has."""
        return []

    @property
    def pipeline_blocks(self) -> int:
        """The blocks a pipeline over ``stage`` splits into its stages: every block (L)."""
        return self.blocks

    def uncompared_flops(self, platform: str) -> str | None:
        """None: the matmuls compile as the dots the closed form counts."""
        return None

    def custom_call_flops(self, flops: dict, platform: str) -> float:
        """0: no matmul FLOPs in custom calls beyond the attention's (step_flops' "kernels")."""
        return 0.0

    def mesh_fits(self, mesh: Mapping):
        """The planner's screen of meshes (arrays of sizes) beyond divisions and stages: none, True."""
        return True

    def plan_batch_runs(self, mesh: Mapping, B, M):
        """The planner's batch rule on arrays beyond Schedule.check's: none, True."""
        return True

    def check_batch_split(self, schedule, mesh: Mapping, batch_tokens: int | None = None) -> None:
        """Nothing after the shared rules (Schedule.check): the batch's split is check_schedule's."""

    def check_axes(self, mesh: Mapping) -> None:
        """The mesh axes the family does not build (ValueError naming the axis): none refused."""

    # serving (scaling.step.serving): what a prefill or decode step holds, reads and computes; a family without
    # sequences (the FFN stack) has none
    def kv_cache_elements(self, context):
        """KV-cache elements one sequence of ``context`` tokens holds, all layers: ValueError (no sequences)."""
        raise ValueError(f"the {self.noun} has no sequences, so no KV cache: serving (prefill, decode) is the "
                         "transformer's and the MoE transformer's")

    def decode_read_params(self, tokens):
        """Parameters a decode step of ``tokens`` tokens reads from HBM: ValueError (no sequences)."""
        return self.kv_cache_elements(1)

    def decode_flops(self, tokens, context):
        """Matmul FLOPs of a decode step of ``tokens`` tokens at ``context``: ValueError (no sequences)."""
        return self.kv_cache_elements(1)

    def extents(self, batch_tokens) -> dict[str, float]:
        """{array: elements} of the step's largest global arrays (scaling.core.limits.check_size): the activations
        B·max(D, F) and a weight stack L·D·F."""
        B, D, F, L = batch_tokens, self.d_model, self.d_ff, self.blocks
        return {"activations B·max(D, F)": B * max(D, F), "weights L·D·F": L * D * F}

    def batch_division(self, batch_tokens: int) -> tuple[str, int, str]:
        """(name, count, logical axis) of the batch's split: whole sequences of seq_len (ValueError otherwise), their
        count over the family's batch_axis (scaling.core.sharding)."""
        if batch_tokens % self.seq_len:
            raise ValueError(f"batch_tokens={batch_tokens} is not whole sequences of seq_len={self.seq_len}")
        return ("sequences (batch_tokens/seq_len)", batch_tokens // self.seq_len, self.batch_axis)

    def check_divisible(self, mesh: Mapping, batch_tokens: int | None = None) -> None:
        """check_axes, then each of divisions() and the batch's (batch_division) divisible by its logical axis' shard
        count (scaling.core.sharding); ValueError naming the dimension and the axes otherwise."""
        self.check_axes(mesh)
        checks = self.divisions()
        if batch_tokens is not None:
            checks.append(self.batch_division(positive_int("batch_tokens", batch_tokens)))
        for name, dim, logical in checks:
            if dim % shards(mesh, logical):
                raise ValueError(f"{name}={dim} is not divisible by the {'·'.join(LOGICAL_RULES[logical])} shard "
                                 f"count {shards(mesh, logical)}")


@dataclass(frozen=True, eq=False)
class PlanPolicy:
    """What the planner (scaling.planner.plan) tries for a family: its default batch in tokens, the mesh axes it
    factorises the chips into, the remat policies it tries by default, its strategy (``grouped``: meshes in groups
    with every schedule choice; else one mesh a group, microbatches and repeats only), what each remat policy keeps
    (nested: the first that fits is the fastest; None: every policy sized), and the Schedule fields a plan chooses
    beyond M, R, the pipeline and SP."""
    batch_tokens: int
    axes: tuple[str, ...]
    remats: tuple[str, ...]
    grouped: bool
    remat_keeps: Mapping | None
    schedule_options: tuple[str, ...]


_FAMILY_TYPES: set[type] = set()  # the types is_family has found to implement ModelFamily


def is_family(model) -> bool:
    """Whether ``model`` implements ModelFamily (its runtime check, made once per type: the planner builds a
    Workload per candidate, and the protocol's check reads each of its members)."""
    if type(model) not in _FAMILY_TYPES:
        if not isinstance(model, ModelFamily):
            return False
        _FAMILY_TYPES.add(type(model))
    return True
