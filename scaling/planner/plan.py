"""Mesh planner: every factorisation of a chip count into the mesh axes (plan_axes: data, stage, fsdp, tensor for
the FFN stack, and context for a transformer), every way of laying those axes onto the slice's physical ICI axes,
every schedule the model can run on the mesh (schedules: microbatches and circular repeats; a transformer's
pipeline schedule, remat policy, attention, context strategy and sequence parallelism too), ranked by the one step
model (scaling.step.program.predict) under an HBM budget.

A layout splits each physical dimension d_i of the slice into one factor per mesh axis. A mesh axis spans
the physical axes where its factor is > 1 (their count is its M: M_X for fsdp, M_Y for tensor); on each
it is a ring with wraparound when it owns the whole dimension and the chip's wraparound rule holds
(scaling.hardware.chips.Chip.has_wraparound), else a line (program.links: 1 link or 1/2). More chips than one
slice holds are equal slices joined by DCN (hardware.split_slices), and the outermost factor of the
data axis (MaxText's dcn_data_parallelism) or of the fsdp axis spans them (both are enumerated).
GPUs: a node of up to 8 GPUs on an NVLink switch (every mesh axis gets the GPU's NVLink bandwidth),
nodes joined like slices over the scale-out network (InfiniBand, IB: the table's dcn_bw).

For each schedule of a mesh, the step model (program.StepModel, what ``predict`` is made of) runs once on numpy
arrays of the batch sizes, microbatch counts and the mesh's layouts' links (a transformer's: of a group of meshes
too, those of one stage count with the same axes > 1, each with its own DCN axis, _groups; and each (batch, microbatch
count, mesh) cell under the remat policy that keeps the most and fits, a policy a cell: _screen, which sizes every
policy of a schedule at once on the groups of one stage count and context axis together); each
(mesh, batch) keeps its fastest layout. The candidates are ranked by their step in the plan's form alone; the rest
of ``predict``'s answer is made for the plans kept only. The plans the planner ranks are therefore exactly what
``predict`` says of them (tests/test_plan.py, tests/test_plan_transformer.py hold the two equal), and what
``python -m scaling check`` compares with the compiler. Ranked by the sum form unless
told otherwise (the compiled forward step runs its collectives synchronously: docs/findings.md, "Finding for
question (c)"); plans over the HBM budget (the table's usable HBM per device unless ``hbm``) are dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scaling.step import kernels
from scaling.step import memory
from scaling.step import pipeline
from scaling.step import program
from scaling.hardware import roofline
from scaling.core.family import ModelFamily
from scaling.core.inputs import positive_float, positive_int
from scaling.core.mesh_shape import MESH_AXES, MeshShape
from scaling.core.kinds import Form, Platform
from scaling.core.policies import CONTEXT_STRATEGIES, PIPELINES, OptimizerSharding, Pipeline, check_remat
from scaling.core.policies import DEFAULT_PRECISION
from scaling.core.schedule import Schedule, default_stage_blocks, pipeline_ends, runs_attention
from scaling.core.sharding import shards
from scaling.hardware.chips import GPU_NODE, Chip, split_slices
from scaling.core.workload import RematCells, Workload

PLAN_KEYS = {"context": "context_strategy"}  # a plan's JSON key for a Schedule field (cfg.plan.schedule_options)
DCN_AXES = ("data", "fsdp")  # the axes whose outermost factor may span slices joined by DCN


def _splits(d: int, k: int):
    """Every ordered k-tuple of positive integers whose product is d."""
    if k == 1:
        yield (d,)
        return
    for a in range(1, d + 1):
        if d % a == 0:
            for rest in _splits(d // a, k - 1):
                yield (a, *rest)


def _row_ids(rows: np.ndarray) -> np.ndarray:
    """One int64 per row of a 2-D array of integers, equal for equal rows and ordered as the rows are
    lexicographically: np.unique(rows, axis=0)'s order, without its sort of whole rows (10^5 rows: about 20
    times faster). The columns as digits of a mixed radix, renumbered densely where the next would overflow."""
    ids, bound = np.zeros(len(rows), np.int64), 1
    for col in rows.T:
        col = col - col.min() if len(col) else col
        radix = int(col.max()) + 1 if len(col) else 1
        if bound * radix >= 2**62:
            _, ids = np.unique(ids, return_inverse=True)
            bound = int(ids.max()) + 1
        ids, bound = ids * radix + col, bound * radix
    return ids


def plan_axes(cfg) -> tuple[str, ...]:
    """The mesh axes the planner factorises the chips into, the family's (cfg.plan.axes): data, stage, fsdp, tensor
    for the FFN stack (no sequence for a context axis to split), every mesh axis (context too) for a transformer."""
    return cfg.plan.axes


def layouts(dims: tuple[int, ...], chip: Chip, axes: tuple[str, ...], keep=None) -> dict[tuple, list[dict]]:
    """Every distinct way of laying ``axes`` onto a slice of shape ``dims``: {mesh sizes: [layout, ...]}
    where a layout is {axis: (lengths, wraps)} over the physical axes it spans (the form mesh.ici_layout
    reads back from a compiled mesh's devices). Layouts that give every mesh axis the same links
    (program.links) over the same number of physical axes are the same to the step model; one of each
    is kept. GPUs (no torus): one layout, each axis one ring. A chip of several devices (TPU7x: 2) adds
    its cores as one more physical axis, a ring of one link (the cores' die-to-die link, taken as no
    faster than an ICI link). ``keep``: of an array [meshes, axes] of mesh sizes, which to lay out (a bool
    array; the planner's: the sizes the model divides by)."""
    return {sizes: list(lays) for sizes, lays in _layouts(dims, chip, axes, keep).items()}


def _layouts(dims: tuple[int, ...], chip: Chip, axes: tuple[str, ...], keep=None) -> dict[tuple, "_LaidOut"]:
    """layouts' {mesh sizes: layouts}, each mesh's a sequence that makes a layout when asked for (_LaidOut: the
    planner takes the few its plans have) with every layout's links: program.links of each axis, 1 where the axis
    spans no physical axis (the planner's links of an axis absent from a layout), made with the layouts (sums of 1
    and 1/2 over the physical axes, exact in any order)."""
    out: dict[tuple, _LaidOut] = {}
    keep = keep or (lambda kinds: np.ones(len(kinds), bool))
    if chip.torus == 0:
        every = list(_splits(math.prod(dims), len(axes)))
        for sizes, ok in zip(every, keep(np.array(every))):
            if ok:
                out[sizes] = _LaidOut(np.ones((1, len(axes))),
                                      made=[{a: ([n], [True]) for a, n in zip(axes, sizes) if n > 1}])
        return out
    phys = (*dims, chip.devices_per_chip) if chip.devices_per_chip > 1 else tuple(dims)
    wraps = lambda n, i: chip.has_wraparound(n, phys[i], dims) if i < len(dims) else True  # noqa: E731
    # Per physical axis, every split of its length over the mesh axes, as arrays [splits, axes] of factors
    # and link contributions (1 for a ring with wraparound, 1/2 for a line, 0 where the factor is 1); the
    # cartesian product over the physical axes as flat arrays (numpy: 10^5 combinations for 8x20x28).
    splits = [np.array(list(_splits(d, len(axes)))) for d in phys]
    sizes, link, span = np.ones((1, len(axes)), int), np.zeros((1, len(axes))), np.zeros((1, len(axes)), int)
    index = np.zeros((1, 0), int)
    for i, sp in enumerate(splits):
        contrib = np.array([[0.0 if n == 1 else (1.0 if wraps(n, i) else 0.5) for n in row] for row in sp])
        sizes = (sizes[:, None, :] * sp[None, :, :]).reshape(-1, len(axes))
        link = (link[:, None, :] + contrib[None, :, :]).reshape(-1, len(axes))
        span = (span[:, None, :] + (sp > 1)[None, :, :]).reshape(-1, len(axes))
        index = np.concatenate([np.repeat(index, len(sp), axis=0),
                                np.tile(np.arange(len(sp)), len(index))[:, None]], axis=1)
    _, first, which = np.unique(_row_ids(sizes), return_index=True, return_inverse=True)
    wanted = keep(sizes[first])[which]  # the distinct sizes in lexicographic order, as np.unique(axis=0) gives them
    sizes, link, span, index = sizes[wanted], link[wanted], span[wanted], index[wanted]
    _, first = np.unique(_row_ids(np.concatenate([sizes, np.rint(link * 2).astype(int), span], axis=1)),
                         return_index=True)
    # per physical axis and split, each mesh axis's (length, wraps) where its factor is > 1
    cells = [[[(n, wraps(n, i)) if n > 1 else None for n in row] for row in sp.tolist()] for i, sp in enumerate(splits)]
    kept = sorted(first.tolist())
    rows: dict[tuple, list] = {}
    effective = np.where(span > 0, link, 1.0)[kept]
    for size_row, index_row, row in zip(sizes[kept].tolist(), index[kept].tolist(), effective):
        picked, lk = rows.setdefault(tuple(size_row), ([], []))
        picked.append(index_row)
        lk.append(row)
    return {sizes: _LaidOut(np.array(lk), axes, cells, picked) for sizes, (picked, lk) in rows.items()}


class _LaidOut(Sequence):
    """A mesh's layouts (_layouts), each {axis: (lengths, wraps)} made when asked for, and ``links`` [layouts, axes]
    (program.links of each axis, 1 where it spans no physical axis). ``picked``: each layout's splits of the physical
    axes (an index a physical axis into ``cells``: each split's (length, wraps) of every mesh axis, None where the
    factor is 1); or ``made``, the layouts themselves."""

    def __init__(self, links: np.ndarray, axes: tuple = (), cells: list = (), picked: list = (), made=None):
        self.links, self.axes, self.cells, self.picked, self.made = links, axes, cells, picked, made

    def __len__(self) -> int:
        return len(self.picked if self.made is None else self.made)

    def __getitem__(self, j) -> dict:
        if isinstance(j, slice):
            return [self[i] for i in range(len(self))[j]]
        if self.made is not None:
            return self.made[j]
        lay, picked = {}, [self.cells[i][k] for i, k in enumerate(self.picked[j])]
        for a, axis in enumerate(self.axes):
            spans = [c[a] for c in picked if c[a] is not None]
            if spans:
                lay[axis] = ([n for n, _ in spans], [w for _, w in spans])
        return lay


def repeats_for(cfg: ModelFamily, stages: int, max_repeats: int) -> list[int]:
    """The circular repeats R a mesh with ``stages`` can run: 1 (GPipe), and with stages the powers of two up to
    ``max_repeats`` whose chunks (the default rule's, Schedule.blocks_per_chunk) pad the stacks to no more slots
    than GPipe's stages: S·R·Cmax <= S·Lmax (pipeline.largest_stage), every chunk a block at least. Even stages: the
    R that divide L/S; Llama 3 405B's 126 layers on 16 stages (7, 8, ..., 8, 7): R = 2 (chunks 3, 4, ..., 4, 3) and
    4 (1, 2, ..., 2, 1), each 8 slots a stage as GPipe's."""
    if stages == 1:
        return [1]
    return [r for r in (1, 2, 4, 8, 16)
            if r <= max_repeats and _pads_as_gpipe(cfg.blocks, pipeline_ends(cfg), stages, r)]


@functools.cache
def _pads_as_gpipe(blocks: int, ends: int, stages: int, repeats: int) -> bool:
    """Whether ``repeats`` chunks a stage of the default split (Schedule.blocks_per_chunk: default_stage_blocks over
    the S·R chunks) hold the stages in no more slots than one chunk does, R·Cmax <= Lmax (repeats_for)."""
    if blocks < stages * repeats:
        return False
    return repeats * max(default_stage_blocks(blocks, stages * repeats, ends)) <= max(
        default_stage_blocks(blocks, stages, ends))


def microbatches_for(stages: int, repeats: int, max_microbatches: int) -> list[int]:
    """Microbatch counts to try: without stages 1, 2, 4, ... (gradient accumulation); with stages
    S, 2S, 4S, ... (fewer than S leaves a stage idle in every iteration), up to ``max_microbatches``."""
    first = stages if stages > 1 else 1
    return [first * 2**k for k in range(12) if first * 2**k <= max(max_microbatches, first)]


def runs(cfg: ModelFamily, mesh: MeshShape, schedule: Schedule, batch_tokens: int | None = None) -> bool:
    """Whether train, check and compile accept ``cfg`` on ``mesh`` with ``schedule`` (and ``batch_tokens``): the
    same two checks they make (the family's check_divisible, Schedule.check: D by fsdp, F by tensor, the blocks
    by the stages, B by microbatches·data·fsdp, ...)."""
    try:
        cfg.check_divisible(mesh, batch_tokens)
        schedule.check(cfg, mesh, batch_tokens)
    except ValueError:
        return False
    return True


PLAN_FORMS = (*roofline.FORMS, "scheduled")  # scheduled: predict's form under the flags' schedule


def crit_form(form: str) -> str:
    """The form whose critical batch plan shows: the ranking form's, or under the scheduled form (which has none of
    its own: its exposed collectives depend on the flags' schedule, not on a batch threshold) the sum form's."""
    return "sum" if form == Form.SCHEDULED else form


@dataclass(frozen=True)
class Compiled:
    """A plan's train step compiled ahead of time (verify.check.verify_plans): the compiler's peak bytes per device
    (None where it reports none), whether it fits the budget (peak <= hbm), its argument bytes (the state and the
    batch), the devices compiled for, on a TPU the physical axes make_mesh gave each mesh axis (mesh.ici_layout;
    None on a GPU), and the seconds the compile took."""

    peak_bytes: float | None
    fits: bool
    state_bytes: float
    on: str
    ici_layout: dict | None
    seconds: float

    def to_json(self) -> dict:
        """The plan's JSON keys of the compile: compiled_peak_bytes, _fits, _state_bytes, _on, (_ici_layout,)
        compile_seconds."""
        return {"compiled_peak_bytes": self.peak_bytes, "compiled_fits": self.fits,
                "compiled_state_bytes": self.state_bytes, "compiled_on": self.on,
                **({} if self.ici_layout is None else {"compiled_ici_layout": self.ici_layout}),
                "compile_seconds": self.seconds}


# a plan's figures kept per form, and the forms to_json writes as key suffixes (step_seconds_sum, ...)
PER_FORM = {"step_seconds": PLAN_FORMS, "mfu": roofline.FORMS, "hfu": (), "critical_batch": roofline.FORMS}


@dataclass(frozen=True)
class Plan:
    """One ranked plan (plan's docstring): its batch B, mesh (plan_axes), microbatches M, repeats R, pipeline schedule,
    remat, sequence parallelism and ``options``, the family's other Schedule fields (cfg.plan.schedule_options: a
    transformer's attention, context, optimizer_sharding; none for the FFN stack); the bubble (Megatron's
    (S−1)/(R·M), 1F1B's 2(S−1)/M) and its seconds; slices, the DCN axis, the layout ({axis: {"lens", "wrap"}}),
    M_X/M_Y (physical axes fsdp and tensor span); the ranking ``form`` and, by form (sum, max, scheduled),
    predict's step seconds, MFU, HFU and critical batch (None: no batch is compute bound); the bound, times by term,
    memory per device, the budget, B/devices; ``dcn_stage``: the slices the stage axis spans beside the DCN axis
    (dcn_placements' b; 1: none). ``memory_terms``: nearest_miss's; ``compiled``: verify_plans'."""

    batch_tokens: int
    mesh: dict
    microbatches: int
    repeats: int
    pipeline: str
    remat: str
    sequence_parallel: bool
    options: dict
    bubble: float
    bubble_seconds: float
    slices: int
    dcn_axis: str | None
    layout: dict
    M_X: int
    M_Y: int
    form: str
    step_seconds: dict
    mfu: dict
    hfu: dict
    bound: str
    times: dict
    memory_bytes: float
    hbm_budget: float
    per_device_batch: float
    critical_batch: dict
    dcn_stage: int = 1
    memory_terms: dict | None = None
    compiled: Compiled | None = None

    def to_json(self) -> dict:
        """plan --json's dict of the plan: its fields in order (dataclasses.asdict), ``options`` as keys of their own
        (PLAN_KEYS: context -> context_strategy), each per-form figure as the ranking form's value then one key per
        form (step_seconds, step_seconds_sum, _max, _scheduled; mfu, mfu_sum, _max; hfu; critical_batch, _sum,
        _max), memory_terms and the compiled keys (Compiled.to_json) where set."""
        out = {}
        for k, v in dataclasses.asdict(self).items():
            if k == "options":
                out.update({PLAN_KEYS.get(f, f): s for f, s in v.items()})
            elif k in PER_FORM:
                out[k] = v[self.form]
                out.update({f"{k}_{f}": v[f] for f in PER_FORM[k]})
            elif k == "compiled":
                out.update({} if self.compiled is None else self.compiled.to_json())
            elif v is not None or k != "memory_terms":
                out[k] = v
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> Plan:
        """The Plan of one row of plan --json (to_json's inverse for what it writes: the per-form figures of the
        forms it names, hfu the ranking form's; compiled keys and memory_terms not read back)."""
        form, fields = d["form"], {f.name for f in dataclasses.fields(cls)} - {"compiled", "memory_terms"}
        per = {k: {**{f: d[f"{k}_{f}"] for f in PER_FORM[k]}, form: d[k]} for k in PER_FORM}
        known = fields | {f"{k}_{f}" for k in PER_FORM for f in PER_FORM[k]}
        names = {v: k for k, v in PLAN_KEYS.items()}  # the rest are options, but the compiled keys (compile...)
        return cls(**{k: d[k] for k in fields - set(PER_FORM) - {"options"} if k in d}, **per,
                   options={names.get(k, k): v for k, v in d.items() if k not in known and not k.startswith("compile")})

    def cells(self, rank: int, slices: int, compiled: bool) -> list:
        """The cells of the plan's row in plan's table (jax_scaling.plan.print_plans' header): rank, mesh, DCN axis
        (with ``slices`` > 1), M, R, a transformer's choices, bubble, M_X, M_Y, step and MFU in the ranking form and
        the other (max beside sum, else sum), HFU, bound, GB per device, the FFN stack's critical batch
        (crit_form's), and with ``compiled`` the compiled peak and whether it fits."""
        c = self.critical_batch[crit_form(self.form)]
        crit = "never" if c is None else "any" if c == 0 else f"{c:,.0f}"
        form, other = self.form, "max" if self.form == Form.SUM else "sum"
        transformer, mesh, o = bool(self.options), self.mesh, self.options
        chosen = [self.pipeline if mesh.get("stage", 1) > 1 else "-", self.remat,
                  "on" if self.sequence_parallel else "-", o["context"] if mesh.get("context", 1) > 1 else "-",
                  "zero1" if o.get("optimizer_sharding") == OptimizerSharding.ZERO1 else "-"] if transformer else []
        cells = [rank, *mesh.values(), *(["+".join(self.dcn_mesh)] if slices > 1 else []), self.microbatches,
                 self.repeats, *chosen, f"{self.bubble:.3f}", f"{self.bubble_seconds:.3f}", self.M_X, self.M_Y,
                 f"{self.step_seconds[form]:.3f}", f"{self.step_seconds[other]:.3f}", f"{self.mfu[form]:.3f}",
                 f"{self.mfu[other]:.3f}", f"{self.hfu[form]:.2f}", self.bound, f"{self.memory_bytes / 1e9:.1f}",
                 *([] if transformer else [crit])]
        if compiled:
            got = self.compiled
            cells += (["", ""] if got is None else
                      [f"{got.peak_bytes / 1e9 if got.peak_bytes else float('nan'):.1f}", "yes" if got.fits else "no"])
        return cells

    def with_compiled(self, compiled: Compiled) -> Plan:
        """The same plan with its compiled figures (verify.check.verify_plans)."""
        return dataclasses.replace(self, compiled=compiled)

    @property
    def dcn_mesh(self) -> dict[str, int]:
        """{axis: the slices its outermost factor spans} (dcn_of; predict's --dcn-mesh); {} on one slice."""
        return dcn_of(self.dcn_axis, self.dcn_stage, self.slices)

    def mesh_text(self) -> str:
        """The mesh as data=2,fsdp=4 (its axes > 1), or 1 device."""
        return ",".join(f"{a}={n}" for a, n in self.mesh.items() if n > 1) or "1 device"

    def schedule_text(self) -> str:
        """The schedule beside the mesh in words: M and R where > 1, a transformer's pipeline (stages) and remat."""
        return ((f" with M={self.microbatches}" if self.microbatches > 1 else "")
                + (f", R={self.repeats}" if self.repeats > 1 else "")
                + (f", {self.pipeline}" if self.mesh["stage"] > 1 and self.options else "")
                + (f", remat {self.remat}" if self.options else ""))


# the attentions a plan tries where none is given (the package's own two; the commands give the chip's kernel:
# jax_scaling.args.chip_attention)
PLAN_ATTENTIONS = ("materialized", "flash")


@dataclass(frozen=True)
class Choices:
    """What the planner tries on each mesh besides its microbatches and repeats (``schedules``), each a tuple of
    names: the remat policies (the FFN stack's plan takes one; a transformer's default is every policy it has),
    and for a transformer the pipeline schedules (with stages), attentions, context strategies (with a context
    axis), sequence parallelism (with a tensor axis and no stages) and the optimizer's sharding (ZeRO-1 with a
    data axis: _optimizer_sharding). A choice a mesh cannot run (Schedule.check) is skipped on that mesh."""

    remats: tuple = ("none",)
    pipelines: tuple = PIPELINES
    attentions: tuple = PLAN_ATTENTIONS
    contexts: tuple = CONTEXT_STRATEGIES
    sequence_parallel: tuple = (False, True)
    optimizer_sharding: tuple = ("fsdp",)

    @classmethod
    def of(cls, cfg, remat=None, pipeline=None, attention=None, context=None, sequence_parallel=None,
           optimizer_sharding=None, chip: Chip | None = None) -> "Choices":
        """The choices for ``cfg``: each argument one name (or bool) to fix it, None to try every one (remat None:
        the family's plan_remats: "none" for the FFN stack, every policy but every-second for a transformer;
        optimizer_sharding None: fsdp, and on a GPU ``chip`` zero1 with stages too, _optimizer_sharding).
        ValueError naming a bad name."""
        remats = (remat,) if remat is not None else cfg.plan.remats
        for r in remats:
            check_remat(r, cfg)
        one = lambda v, every: every if v is None else (v,)  # noqa: E731
        return cls(remats, one(pipeline, PIPELINES), one(attention, PLAN_ATTENTIONS),
                   one(context, CONTEXT_STRATEGIES),
                   one(sequence_parallel, (False, True)),
                   one(optimizer_sharding,
                       ("fsdp", "zero1") if chip is not None and chip.kind == Platform.GPU else ("fsdp",)))


def _optimizer_sharding(asked: tuple, mesh) -> list:
    """The optimizer shardings tried on ``mesh``: fsdp where asked, and zero1 where asked on a mesh with a data axis
    (without one the state is sharded over fsdp already) and stages, or on any such mesh where zero1 alone is asked.
    Without stages the transformer's plan runs one microbatch, FSDP gathering the weights once a step, and ZeRO-1
    over data (the weights replicated over it) holds more. With stages FSDP gathers a stage's weights every
    microbatch, ZeRO-1 once a step: Megatron-LM's distributed optimizer beside its pipeline (Llama 3 405B: TP 8,
    PP 16, DP 128, the optimizer state sharded over data, Dubey et al. 2024, section 3.3.2), which Choices.of asks for
    on GPUs. (On TPUs, as MaxText runs them, the state is sharded with the weights: fsdp; trying zero1 on every staged
    mesh with a data axis too cost the 70B plan of 8,960 v5p chips 75% more time, docs/findings.md.) A mesh without
    the data axis zero1 alone needs runs fsdp (which the plan command's --optimizer-sharding then filters out)."""
    zero1 = (OptimizerSharding.ZERO1,)
    ok = [v for v in asked if v == OptimizerSharding.FSDP or mesh["data"] > 1 and (asked == zero1 or mesh["stage"] > 1)]
    return ok or ["fsdp"]


def _sequence_parallel(asked: tuple, mesh) -> list:
    """The sequence-parallel choices tried on ``mesh``: those asked for that it can run (SP needs a tensor axis: a
    mesh without one runs no plan where only SP was asked, never one without it); with stages and a tensor axis,
    when both are asked (the default), SP only: Megatron-LM's layout with tensor and pipeline parallelism (Korthikanti
    et al. 2022; its tensor-parallel overlap requires it), which keeps the planner's work at one choice per staged
    mesh (both doubled the pod plan's evaluations, tests/test_plan_transformer.py)."""
    ok = [v for v in asked if mesh["tensor"] > 1 or not v]
    return [True] if mesh["stage"] > 1 and len(ok) > 1 else ok


def schedules(cfg, mesh: MeshShape, choices: Choices, max_microbatches: int, max_repeats: int,
              made: dict | None = None) -> list[tuple]:
    """(Schedule with an array of microbatch counts, remat) pairs the planner evaluates on ``mesh``, those
    Schedule.check accepts. FFN stack: R in repeats_for, M in microbatches_for. Transformer: without stages
    M = 1 (its gradient accumulation is not in the closed forms) with each attention, context strategy (with a
    context axis), sequence parallelism (with a tensor axis), optimizer sharding and remat; with S stages
    GPipe, circular (R > 1 of repeats_for) and 1F1B (R of repeats_for: R > 1 interleaved), M = S, 2S, ...
    (microbatches_for). ``made``: a transformer's schedules already made (the planner's, for other meshes), by their
    fields; the same Schedule is returned for the same fields."""
    S = mesh["stage"]
    pipes = [("gpipe", 1)] if S == 1 else [
        (pipe, R) for pipe in (choices.pipelines if cfg.runs_1f1b else
                               [p for p in choices.pipelines if p != Pipeline.ONE_F_ONE_B])
        for R in ([r for r in repeats_for(cfg, S, max_repeats) if r > 1] if pipe == Pipeline.CIRCULAR else
                  repeats_for(cfg, S, max_repeats) if pipe == Pipeline.ONE_F_ONE_B else [1])]
    if not cfg.plan.grouped:  # with attention (the MoE transformer) each of the choices' attentions
        kw = [{"attention": a} for a in choices.attentions] if runs_attention(cfg) else [{}]
        out = [(Schedule(np.array(microbatches_for(S, R, max_microbatches)), R, pipeline=pipe, **k), r)
               for pipe, R in pipes for k in kw for r in choices.remats]
        return [(s, r) for s, r in out if runs(cfg, mesh, s)]
    try:  # the mesh's own divisibility, once
        cfg.check_divisible(mesh)
    except ValueError:
        return []
    out, made = [], {} if made is None else made
    for (pipe, R), att, ctx, sp, opt in itertools.product(
            pipes, choices.attentions, choices.contexts if mesh["context"] > 1 else choices.contexts[:1],
            _sequence_parallel(choices.sequence_parallel, mesh),
            _optimizer_sharding(choices.optimizer_sharding, mesh)):
        ms = tuple(microbatches_for(S, R, max_microbatches) if S > 1 else [1])
        sched = made.get((ms, R, sp, att, ctx, opt, pipe))
        if sched is None:
            sched = made[ms, R, sp, att, ctx, opt, pipe] = Schedule(
                np.array(ms), R, sequence_parallel=sp, attention=att, context=ctx, optimizer_sharding=opt,
                pipeline=pipe)
        try:  # the remat policy changes nothing Schedule.check looks at
            sched.check(cfg, mesh)
        except ValueError:
            continue
        out += [(sched, remat) for remat in choices.remats]
    return out


def stage_counts_fit(cfg, stages):
    """Whether the planner tries ``stages`` pipeline stages S (an int or an array of them): S divides L (even
    stages), or, for a model with an embedding and an output layer (a vocabulary), S <= L divides L + 2, the stages
    even with each counted as a block of the first and the last stage (scaling.core.schedule.default_stage_blocks;
    Megatron-LM's --account-for-embedding-in-pipeline-split and -loss-; Llama 3 405B's 126 layers on 16 stages of
    7, 8, ..., 8, 7: Dubey et al. 2024, section 3.3.2). Other splits leave a stage idle for a block or more of
    every iteration (predict takes them with --stage-blocks)."""
    S, L = np.asarray(stages), cfg.blocks
    even = L % S == 0
    if pipeline_ends(cfg):
        even = even | (((L + 2) % S == 0) & (S <= L))
    return even


def dcn_placements(chip: Chip, n_slices: int, axes: tuple[str, ...]) -> list[tuple[str | None, int]]:
    """The ways the planner lays a mesh's outermost factors over ``n_slices`` slices (TPU) or nodes (GPU), each
    (DCN axis, b): the DCN axis (data or fsdp: DCN_AXES) spans them (b = 1), or on GPUs, with a stage axis to plan,
    the stage axis spans b of them and the DCN axis the other n/b (1 < b < n), or the stage axis all of them
    ("stage", 1), every stage then on nodes of its own (Megatron-LM's layout: tensor within a node, pipeline and
    data across nodes, Narayanan et al. 2021, section 3; Llama 3 405B on 16,384 H100s as TP 8, PP 16, DP 128:
    Dubey et al. 2024, table 4). A GPU node (GPU_NODE devices) holds no pipeline of a large model; a TPU slice's
    stages stay within it. dcn_of gives each its {axis: slices}; one slice: [(None, 1)]."""
    if n_slices == 1:
        return [(None, 1)]
    out = [(a, 1) for a in DCN_AXES]
    if chip.kind == Platform.GPU and "stage" in axes:
        out += [("stage", 1)] + [(a, b) for b in range(2, n_slices) if n_slices % b == 0 for a in DCN_AXES]
    return out


def dcn_of(dcn_axis: str | None, dcn_stage: int, n_slices: int) -> dict[str, int]:
    """{axis: the slices its outermost factor spans} of a placement (dcn_placements): the DCN axis n/b of the
    ``n_slices``, the stage axis b = ``dcn_stage`` where > 1; {} with one slice or no DCN axis."""
    if dcn_axis is None or n_slices == 1:
        return {}
    return {dcn_axis: n_slices // dcn_stage, **({"stage": dcn_stage} if dcn_stage > 1 else {})}


def _mesh_keep(cfg, axes, n_slices, placements) -> "callable":
    """keep(sizes) for layouts, on an array [meshes, axes] of sizes within one slice (times the slices each axis spans
    in a placement of dcn_placements): whether the model's dimensions divide on the mesh for some placement, whatever
    the schedule (cfg.divisions: D, F, V by their shards; the blocks by the stages, stage_counts_fit; a transformer's
    heads by tensor and its sequence by context). Necessary, not sufficient: schedules checks each mesh that passes in
    full."""
    def keep(kinds):
        ok = np.zeros(len(kinds), bool)
        for place in placements:
            over = dcn_of(*place, n_slices)
            mesh = {a: kinds[:, i] * over.get(a, 1) for i, a in enumerate(axes)}
            fits = stage_counts_fit(cfg, mesh.get("stage", 1))
            if "stage" in over:  # the stages all across slices: none within one
                fits &= kinds[:, axes.index("stage")] == 1
            for _, dim, logical in cfg.divisions():
                fits &= dim % shards(mesh, logical) == 0
            fits &= cfg.mesh_fits(mesh)  # a transformer's heads by tensor and its sequence by context
            ok |= fits
        return ok
    return keep


def workload_of(p: Plan, cfg, flags=None) -> Workload:
    """The Workload of one plan (plan's): its mesh, batch, remat and schedule (M, R, SP, pipeline, p.options)."""
    return Workload(cfg, MeshShape(p.mesh), p.batch_tokens, remat=p.remat, flags=flags,
                    schedule=Schedule(p.microbatches, p.repeats, sequence_parallel=p.sequence_parallel,
                                      pipeline=p.pipeline, **p.options))


def _groups(cfg, chip: Chip, dims, n_slices: int, choices: Choices, max_microbatches: int, max_repeats: int):
    """The meshes to evaluate, in groups that predict takes at once: [([MeshShape], [placement], [layouts: _LaidOut],
    {schedule key: (Schedule, {remat: [mesh index]})})], a placement (DCN axis, b) of dcn_placements. A transformer's
    meshes are grouped by stage count and which axes are > 1 (mesh_shape.spans: every branch of its closed forms then
    agrees within the group), each with its own placement (predict's ``dcn`` takes an array of slices per mesh: the
    closed forms do not read it, the network terms take it mesh by mesh); the FFN stack's one mesh a group."""
    axes, grouped = plan_axes(cfg), cfg.plan.grouped
    placements = dcn_placements(chip, n_slices, axes)
    groups: dict[tuple, tuple] = {}
    # A transformer's schedules on a mesh depend on the mesh through what Schedule.check reads of it (the stage,
    # context and tensor sizes; ZeRO-1's data axis and D over data·fsdp) once the mesh divides the model: found once
    # per such kind of mesh, each with its key (the schedule without its microbatch counts)
    kinds, made, keys = {}, {}, {}

    def keyed(runs):
        """(key, schedule, its remats) of schedules' (schedule, remat) pairs, in their order."""
        out = {}
        for s, r in runs:  # schedules pairs each with every remat
            if keys.get(id(s), (None,))[0] is not s:
                keys[id(s)] = (s, s.with_microbatches(1))
            out.setdefault(id(s), (keys[id(s)][1], s, []))[2].append(r)
        return list(out.values())

    for (sizes, lays), place in itertools.product(
            _layouts(dims, chip, axes, _mesh_keep(cfg, axes, n_slices, placements)).items(), placements):
        given, over = dict(zip(axes, sizes)), dcn_of(*place, n_slices)
        if "stage" in over and given["stage"] > 1:  # the stages all across slices (dcn_placements)
            continue
        for a, n in over.items():
            given[a] *= n
        mesh = MeshShape(given)
        if grouped:
            try:
                cfg.check_divisible(mesh)
            except ValueError:
                continue
            kind = (mesh["stage"], mesh["context"], mesh["tensor"], mesh["data"] > 1,
                    cfg.d_model % (mesh["data"] * mesh["fsdp"]) == 0)
            if kind not in kinds:
                kinds[kind] = keyed(schedules(cfg, mesh, choices, max_microbatches, max_repeats, made))
            runs_here = kinds[kind]
        else:
            kind, runs_here = None, keyed(schedules(cfg, mesh, choices, max_microbatches, max_repeats))
        if not runs_here:
            continue
        key = (mesh["stage"], tuple(mesh[a] > 1 for a in axes)) if grouped else (place, sizes)
        meshes, dcns, lay_lists, by_choice, members = groups.setdefault(key, ([], [], [], {}, {}))
        if kind not in members:  # the member lists a mesh of this kind joins: (schedule key, remat) of each run,
            # one list a key for all its policies (schedules pairs each schedule with every policy of the choices)
            members[kind] = []
            for k, sched, remats in runs_here:
                by_remat = by_choice.setdefault(k, (sched, {}))[1]
                joined = next(iter(by_remat.values())) if by_remat else []
                for remat in remats:
                    by_remat.setdefault(remat, joined)
                members[kind].append(joined)
        for joined in members[kind]:
            joined.append(len(meshes))
        meshes.append(mesh)
        dcns.append(place)
        lay_lists.append(lays)
    return [g[:4] for g in groups.values()]


# one pass over the groups: bounds, workloads and fits of every candidate, shared arrays between them
def _screen(cfg, chip: Chip, groups: list, batches: np.ndarray, hbm: float, form: str, per_mesh: bool, flags,
            precision=DEFAULT_PRECISION) -> list:
    """Per group (_groups'), its candidates: [(a lower bound of the step [B, M, G] (its compute term for a
    transformer's scheduled form, else _math_bound), workload (a function that makes it), fits
    mask [B, M, G], schedule, remat (a transformer's: its cells' policies, RematCells), compute term or None, memory
    [B, M, G, 1] or None)], each schedule with the remat policies that fit its meshes under ``hbm``, in the group's
    order of schedules and policies. A transformer's cells (batch, M, mesh) each take the first policy that fits
    (below), sized all at once (RematCells: every policy of a schedule in one workload), one candidate a schedule;
    where every policy that fits is a plan (1F1B with chunks of one layer), its cells are (policy, M) (the
    schedule's microbatch counts repeated a policy each). A transformer's groups of one stage count
    and context axis are sized together, each policy's memory, FLOPs (_math_bound) and, for the scheduled form,
    kernels (kernels.compute_term) evaluated on all their meshes at once: those closed forms branch on no other axis
    being > 1 (mesh_shape.spans), so each mesh's figures are the same as on its own group's (the planner's tests hold
    the plans to predict's)."""
    grouped = cfg.plan.grouped
    out = [[] for _ in groups]
    together: dict = {}
    for gi, (meshes, *_) in enumerate(groups):
        key = (meshes[0]["stage"], meshes[0]["context"] > 1) if grouped else gi
        together.setdefault(key, []).append(gi)
    for members in together.values():
        meshes = [m for gi in members for m in groups[gi][0]]
        at, start = {}, 0  # each group's meshes' slice of them
        for gi in members:
            at[gi], start = slice(start, start + len(groups[gi][0])), start + len(groups[gi][0])
        G, mesh = len(meshes), _mesh_arrays(meshes)
        own = {gi: _mesh_arrays(groups[gi][0]) for gi in members} if len(members) > 1 else {}
        runs_of: dict = {}  # schedule key -> (Schedule, {remat: [each group's mesh indices]}, [(group, its schedule's
        # index)]); a group's indices shifted to the joined meshes once (a list serves all of a key's policies)
        shifted = {}
        for gi in members:
            for ki, (key, (sched, by_remat)) in enumerate(groups[gi][3].items()):
                joined = runs_of.setdefault(key, (sched, {}, []))
                for rem, idx in by_remat.items():
                    if id(idx) not in shifted:
                        shifted[id(idx)] = np.add(idx, at[gi].start) if at[gi].start else idx
                    joined[1].setdefault(rem, []).append(idx)
                joined[2].append((gi, ki))
        for sched, by_remat, owners in runs_of.values():
            ms = sched.microbatches
            shape = (len(batches), len(ms), G)
            arrays = sched.with_microbatches(ms[None, :, None, None])
            batch_ok = (np.broadcast_to(cfg.plan_batch_runs(mesh, batches[:, None, None, None],
                                                            ms[None, :, None, None]), shape + (1,))[..., 0]
                        if grouped else True)
            # The first policy that fits: the transformer's policies keep nested sets (POLICY_KEEPS:
            # none ⊇ selective ⊇ minimal ⊇ save_dot_* ⊇ save_qkv_proj ⊇ full), so along that order the memory
            # falls and the recompute (FLOPs and the collectives it repeats) grows: the first that fits is the fastest
            # that fits (tests/test_plan_transformer.py holds it against every policy), and a policy is neither sized
            # nor predicted where one that keeps more fits. Not assumed for 1F1B with chunks of one layer (its second
            # forward, which XLA cut more of the less a policy kept, is gone; the order there is not re-checked).
            S = int(np.asarray(mesh["stage"]).flat[0])
            keeps = cfg.plan.remat_keeps
            first_fit = per_mesh and keeps is not None and not (sched.pipeline == Pipeline.ONE_F_ONE_B and
                                                                pipeline.chunk_blocks(cfg, sched, S) == 1)
            order = sorted(by_remat, key=lambda r: -len(keeps[r])) if first_fit else list(by_remat)
            member = np.zeros((len(order), G), bool)  # the meshes each policy is tried on
            for ci, rem in enumerate(order):
                idxs = [shifted[id(idx)] for idx in by_remat[rem]]
                member[ci, idxs[0] if len(idxs) == 1 else np.concatenate(idxs)] = True
            # candidates: (policy index, policies, fits [B, M, G], how often the microbatch counts repeat)
            if grouped and len(order) > 1:  # every policy at once along the microbatch axis (policy-major), each cell
                # its policy's figures (RematCells, scaling.families.transformer.by_policy)
                each = RematCells(tuple(order), np.repeat(np.arange(len(order)), len(ms))[None, :, None, None])
                every = sched.with_microbatches(np.tile(ms, len(order))[None, :, None, None])
                w = Workload(cfg, mesh, batches[:, None, None, None], remat=each, schedule=every, flags=flags,
                             precision=precision)
                total = memory.memory_per_device(w)["total"]
                total = np.broadcast_to(total, (len(batches), len(order) * len(ms), G, 1)).reshape(
                    len(batches), len(order), len(ms), G)
                fits = member[None, :, None, :] & batch_ok[:, None] & (total <= hbm)  # [B, policies, M, G]
                # with each its cells' memory (the transformer's reads none of the compiler's facts: the model's)
                if first_fit:  # each cell (batch, M, mesh) its first policy that fits: the candidate
                    first = fits.argmax(axis=1)
                    tried = [(0, RematCells(tuple(order), first[..., None]), fits.any(axis=1), 1, None,
                              np.take_along_axis(total, first[:, None], axis=1)[:, 0])]
                elif per_mesh:  # every policy that fits a plan of the one candidate, its cells (policy, M)
                    flat = (len(batches), len(order) * len(ms), G)
                    tried = [(0, each, fits.reshape(flat), len(order), None, total.reshape(flat))]
                else:  # every policy that fits a candidate of its own
                    tried = [(ci, rem, fits[:, ci], 1, None, total[:, ci]) for ci, rem in enumerate(order)]
            else:
                taken, tried = np.zeros(shape, bool), []
                for ci, rem in enumerate(order):
                    open_ = member[ci][None, None, :] & batch_ok & ~taken
                    if not open_.any():
                        continue
                    w = Workload(cfg, mesh, batches[:, None, None, None], remat=rem, schedule=arrays, flags=flags,
                                 precision=precision)
                    ok = (np.broadcast_to(memory.memory_per_device(w)["total"], shape + (1,))[..., 0] <= hbm) & open_
                    if first_fit:
                        taken |= ok
                    tried.append((ci, rem, ok, 1, w, None))
            for ci, rem, ok, tiles, w, mem in tried:
                if not ok.any():
                    continue
                on = every if tiles > 1 else arrays
                w = w or Workload(cfg, mesh, batches[:, None, None, None], remat=rem, schedule=on, flags=flags,
                                  precision=precision)
                cut = ok.shape + (1,)
                compute = (np.broadcast_to(kernels.compute_term(w, chip, w.precision.dtype), cut)
                           if grouped and form == Form.SCHEDULED else None)
                # the scheduled step is at least its compute term (max(compute, hidden) + exposed + copies)
                bound = (None if not per_mesh else compute[..., 0] if compute is not None else
                         np.broadcast_to(_math_bound(w, chip, form), cut)[..., 0])
                for gi, ki in owners:
                    part = ok[:, :, at[gi]].copy()
                    if part.any():
                        # the group's own workload (and its cells' policies), made if it is predicted
                        own_rem = rem if np.ndim(rem) == 0 or rem.index.shape[2] == 1 else rem[:, :, at[gi]]
                        gw = functools.partial(Workload, cfg, own[gi], batches[:, None, None, None], remat=own_rem,
                                               schedule=on, flags=flags,
                                               precision=precision) if len(members) > 1 else lambda w=w: w
                        own_sched = groups[gi][3][list(groups[gi][3])[ki]][0]
                        if tiles > 1:
                            own_sched = own_sched.with_microbatches(np.tile(own_sched.microbatches, tiles))
                        out[gi].append(((ki, ci), None if bound is None else bound[:, :, at[gi]], gw, part,
                                        own_sched, own_rem, None if compute is None else compute[:, :, at[gi]],
                                        None if mem is None else mem[:, :, at[gi], None]))
    # each group's in its order of schedules, then of policies
    return [[c[1:] for c in sorted(cands, key=lambda c: c[0])] for cands in out]


def _mesh_arrays(meshes: list) -> Mapping:
    """A group's meshes as one mapping for the closed forms: each axis an int where they agree, else an array
    [1, 1, meshes, 1] (the batch, microbatch, mesh and layout dimensions); one mesh, itself."""
    if len(meshes) == 1:
        return meshes[0]
    sizes = {a: [m[a] for m in meshes] for a in meshes[0]}
    return {a: v[0] if len(set(v)) == 1 else np.array(v)[None, None, :, None] for a, v in sizes.items()}


def _math_bound(w: Workload, chip: Chip, form: str):
    """A lower bound of the step in ``form``: the executed FLOPs at the peak, T_math (every roofline form); the
    scheduled form's compute term runs no kernel faster than the chip's large-GEMM efficiency eta (a TPU's
    matmul_efficiency, a GPU's ceiling: scaling.step.kernels.large_gemm_efficiency) and no flash attention on fewer than
    half its FLOPs (its causal blocks: scaling.step.kernels), so (total − attention/2)/(C·eta)."""
    f = program.step_flops_per_device(w)
    if form != Form.SCHEDULED:
        return f["total"] / chip.device_flops
    eta = kernels.large_gemm_efficiency(chip, w.precision.dtype)
    return (f["total"] - f.get("attention", 0.0) / 2) / (chip.device_flops * eta)


# the planner's public call: each argument one input of the plan command (its docstring)
def plan(cfg, chip: Chip, chips: int, batch_tokens, hbm: float | None = None, remat: str | None = None,
         form: str = "sum", dims: tuple[int, ...] | None = None, max_microbatches: int = 64,
         max_repeats: int = 4, per_mesh: bool = True, flags=None, choices: Choices | None = None,
         precision=DEFAULT_PRECISION) -> list[Plan]:
    """Ranked plans (best first) for one or more batch sizes; see the module docstring.

    ``batch_tokens`` is an int or a list of ints; each Plan carries its batch, mesh (plan_axes), microbatches
    M and repeats R (scaling.core.schedule.Schedule: gradient accumulation without stages, GPipe, circular or 1F1B with
    them; schedules), remat, pipeline, sequence_parallel (and in ``options`` a transformer's attention, context,
    optimizer_sharding), the bubble (Megatron's overhead (S−1)/(R·M), 1F1B's 2(S−1)/M, paid in the step time as
    executed FLOPs; bubble_seconds: the math time of the bubble iterations), layout, M_X/M_Y (physical axes
    spanned), slices, predict's times, and by form its step, MFU/HFU and critical batch, bound, memory. ``dims``: the
    slice's shape (default: hardware.split_slices). ``remat``: one policy, or None (Choices.of: "none" for the
    FFN stack, every policy for a transformer); ``choices`` (Choices) replaces it. Plans that train and check
    refuse (``runs``: D by fsdp, F by tensor, B by M·data·fsdp, ...) or whose memory exceeds ``hbm`` are
    dropped. ``per_mesh``: keep each mesh's best schedule only (the fastest that fits, then the least memory,
    then the fewest microbatches); False keeps every (mesh, schedule, remat). ``flags``: the XLA flag set the
    programs are compiled with (scaling.core.flags), whose schedule the "scheduled" form follows (the plan command's
    default form). ``precision``: every workload's (the matmuls' dtype, the gradient accumulation; plan's --dtype,
    --grad-accumulation). A transformer's meshes are evaluated a group at a time (_groups, _screen); predict on one of
    them gives what the plan says (tests/test_plan.py)."""
    positive_int("chips", chips)
    choices = choices or Choices.of(cfg, remat, chip=chip)
    # the enumeration makes many short-lived objects and no reference cycles: the cyclic garbage collector's
    # passes over them are wasted (about 6% of the 8,960-chip plan's time)
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _plan(cfg, chip, chips, batch_tokens, hbm, remat, form, dims, max_microbatches, max_repeats, per_mesh,
                     flags, choices, precision)
    finally:
        if enabled:
            gc.enable()


def _slices(chip: Chip, chips: int, dims: tuple[int, ...] | None) -> tuple[int, tuple[int, ...]]:
    """(slices, a slice's shape) of ``chips``: GPUs in equal nodes of at most GPU_NODE, TPUs in slices of ``dims`` or
    by hardware.split_slices. ValueError where they do not split so."""
    if chip.kind == Platform.GPU:
        n_slices = math.ceil(chips / GPU_NODE)
        if chips % n_slices:
            raise ValueError(f"{chips} GPUs do not split into equal nodes of at most {GPU_NODE}")
        return n_slices, (chips // n_slices,)
    if dims is None:
        return split_slices(chip, chips)
    n_slices = chips // math.prod(dims)
    if n_slices * math.prod(dims) != chips:
        raise ValueError(f"topology {dims} has {math.prod(dims)} chips, which do not divide {chips}")
    return n_slices, tuple(dims)


# plan's arguments, which it passes on, and how many batches to list
def nearest_batches(cfg, chip: Chip, chips: int, batch_tokens: int, dims: tuple[int, ...] | None = None,
                    max_microbatches: int = 64, max_repeats: int = 4, choices: Choices | None = None,
                    count: int = 16) -> list[int]:
    """The ``count`` batches in tokens nearest ``batch_tokens`` (nearest first) that some mesh the planner tries runs,
    whatever the memory; [] where none does. A mesh and schedule that run the model but for the batch (_groups:
    every rule but the batch's) take every multiple of their batch quantum q = u·M·(the shards of cfg.batch_axis:
    data·fsdp, ·expert for an MoE model), u = T tokens (whole sequences) or 1 for a model without sequences, M each
    microbatch count tried (Schedule.check, cfg.check_batch_split): the candidates are floor(B/q)·q and
    ceil(B/q)·q of each q."""
    choices = choices or Choices.of(cfg, chip=chip)
    n_slices, dims = _slices(chip, chips, dims)
    unit, quanta = cfg.seq_len or 1, set()
    for meshes, _, _, by_choice in _groups(cfg, chip, dims, n_slices, choices, max_microbatches, max_repeats):
        for sched, by_remat in by_choice.values():
            for g in {g for idx in by_remat.values() for g in idx}:
                quanta.update(unit * int(m) * shards(meshes[g], cfg.batch_axis)
                              for m in np.atleast_1d(sched.microbatches).tolist())
    near = {b for q in quanta for b in (batch_tokens // q * q, -(-batch_tokens // q) * q) if b > 0}
    return sorted(near, key=lambda b: (abs(b - batch_tokens), b))[:count]


# plan's body: its arguments passed through (plan holds the garbage collector off around it); one pass of enumerate,
# screen, evaluate and keep, whose state (found, kept, evaluated) the steps share
def _plan(cfg, chip, chips, batch_tokens, hbm, remat, form, dims, max_microbatches, max_repeats, per_mesh, flags,
          choices, precision) -> list[Plan]:
    if form not in PLAN_FORMS:
        raise ValueError(f"form must be one of {PLAN_FORMS}, got {form!r}")
    hbm = positive_float("hbm", chip.hbm_budget if hbm is None else hbm)
    batches = np.array([batch_tokens] if isinstance(batch_tokens, int) else list(batch_tokens))
    for b in batches.tolist():
        positive_int("batch_tokens", b)
    devices = chips * chip.devices_per_chip
    n_slices, dims = _slices(chip, chips, dims)
    axes, grouped = plan_axes(cfg), cfg.plan.grouped
    # (B, mesh, DCN axis), or a serial number without per_mesh -> [step, plan, sort key (None until _rank)]
    found: dict = {}
    groups = _groups(cfg, chip, dims, n_slices, choices, max_microbatches, max_repeats)
    for (meshes, dcns, lay_lists, by_choice), candidates in zip(groups, _screen(
            cfg, chip, groups, batches, hbm, form, per_mesh, flags, precision)):
        G, nl = len(meshes), max(len(x) for x in lay_lists)
        mesh_keys = [tuple(m[a] for a in axes) for m in meshes]
        best_step = np.full((len(batches), G), np.inf)  # the fastest step found so far per batch and mesh
        # the slices each axis spans (dcn_of): one placement for the group, or per mesh an array (1: not that axis)
        overs = [dcn_of(*d, n_slices) for d in dcns]
        dcn = (overs[0] or None) if len(set(dcns)) == 1 else {
            a: np.array([o.get(a, 1) for o in overs])[None, None, :, None] for o in overs for a in o}
        # [1, 1, G, layouts] (program.links of each layout: _layouts); a mesh with fewer layouts than the group's
        # most is padded with ones of no links (infinite collective times: never its best)
        padded = np.full((G, nl, len(axes)), 1e-200)
        for g, lays in enumerate(lay_lists):
            padded[g, :len(lays)] = lays.links
        axis_links = {a: padded[None, None, :, :, i] for i, a in enumerate(axes)}
        # per mesh: the candidates in the order of their math time (a lower bound of every form), none predicted
        # where that bound is slower than the best step already found for every batch and mesh it covers
        if per_mesh:
            candidates.sort(key=lambda c: float(np.min(np.where(c[2], c[0], np.inf))))
        evaluated = []  # per candidate predicted: (model, shape, schedule, remat, best layout, its step [B, M, G])
        entries = {}

        def entry(c, i, k, g) -> list:
            """[step, what builds the Plan, sort key] of candidate c's (batch, M, mesh) index (i, k, g)."""
            if (c, i, k, g) not in entries:
                model, shape, sched, rem, best, fastest = evaluated[c]
                j = best[i, k, g]
                rem = rem if np.ndim(rem) == 0 else rem.names[_at(rem.index, (i, k, g, 0))]  # the cell's (_screen)
                entries[c, i, k, g] = [float(fastest[i, k, g]), (int(batches[i]), model, shape, (i, k, g, j), sched,
                                                                 rem, meshes[g], lay_lists[g][j], dcns[g]), None]
            return entries[c, i, k, g]

        # per mesh: the best plan so far of each (batch, mesh): its step, candidate and M index (-1: none)
        kept = (np.full((len(batches), G), np.inf), np.full((len(batches), G), -1), np.zeros((len(batches), G), int))
        for bound, w, ok, sched, rem, compute, mem in candidates:
            if per_mesh and not (ok & (bound <= best_step[:, None, :])).any():
                continue
            ms = sched.microbatches
            shape = (len(batches), len(ms), G, nl)
            model = program.StepModel(w(), chip, axis_links=axis_links, dcn=dcn, compute=compute, memory_total=mem)
            step = np.broadcast_to(model.step(form), shape)
            best = step.argmin(axis=3)  # each (batch, M, mesh)'s fastest layout
            fastest = step.min(axis=3)  # its step (the value at best)
            if not grouped:  # a batch train refuses
                for i, k, g in zip(*np.nonzero(ok)):
                    ok[i, k, g] = runs(cfg, meshes[g], sched.with_microbatches(int(ms[k])),
                                       int(batches[i]))
            steps = np.where(ok, fastest, np.inf)
            best_step = np.minimum(best_step, steps.min(axis=1))
            evaluated.append((model, shape, sched, rem, best, fastest))
            if per_mesh:
                _keep_best(steps, len(evaluated) - 1, kept, entry)
            else:  # every (batch, M, mesh) a plan
                for i, k, g in zip(*np.nonzero(ok)):
                    found[len(found)] = entry(len(evaluated) - 1, i, k, g)
        _, kc, kk = kept
        for i, g in zip(*np.nonzero(kc >= 0)):
            found[(int(batches[i]), mesh_keys[g], dcns[g])] = entry(kc[i, g], i, kk[i, g], g)
    setting = _Setting(cfg, chip, axes, n_slices, devices, hbm, form)
    rows = [f[1] for f in sorted(found.values(), key=_rank)]
    of_model: dict = {}  # each prediction's plans: their figures gathered at once (_figures)
    for n, row in enumerate(rows):
        of_model.setdefault(id(row[1]), (row[1], []))[1].append(n)
    figures = [None] * len(rows)
    for model, ns in of_model.values():
        for n, fig in zip(ns, _figures(model.prediction(), [rows[n][3] for n in ns])):
            figures[n] = fig
    return [_make_plan(setting, B, fig, rest) for (B, model, *rest), fig in zip(rows, figures)]


def _rank(f: list) -> tuple:
    """A plan's sort key, (B, its step rounded to 1e-12 s, its memory, M): the fastest, then the least memory, then
    the fewest microbatches. Made once, kept in f[2] (its memory is its prediction's)."""
    if f[2] is None:
        B, model, shape, (i, k, g, _), sched = f[1][:5]
        mem = float(_at(model.memory_total(), (i, k, g, 0)))
        f[2] = (B, round(f[0], 12), mem, int(np.asarray(sched.microbatches)[k]))
    return f[2]


def _keep_best(steps: np.ndarray, c: int, kept: tuple, entry) -> None:
    """Keep in ``kept`` (arrays [B, G] of the step, candidate and M index of each (batch, mesh)'s best plan so far,
    candidate -1 for none) the least _rank of the plan kept and candidate c's: ``steps`` [B, M, G] its step times
    (inf where it has no plan), ``entry(c, i, k, g)`` a plan entry (_plan's). On a tie the plan kept stays, and of
    the candidate's the first (fewer microbatches): the order the planner meets them in. A step more than ``near``
    from another ranks as the two steps do (rounding to 1e-12 s moves each less than near/2), so only plans closer
    than that to the candidate's fastest are ranked in full (by their memory: their prediction's)."""
    kstep, kc, kk = kept
    fastest, k_best = steps.min(axis=1), steps.argmin(axis=1)  # [B, G]
    finite = np.isfinite(fastest)
    near = 4e-12 + 16 * np.spacing(np.where(finite, fastest, 0.0))
    close = steps <= (fastest + near)[:, None, :]  # [B, M, G]
    contest = finite & (fastest <= kstep + near)  # not slower than the plan kept (inf: none kept)
    clear = contest & (close.sum(axis=1) == 1) & (fastest < kstep - near)
    kstep[clear], kc[clear], kk[clear] = fastest[clear], c, k_best[clear]
    for i, g in zip(*np.nonzero(contest & ~clear)):  # within near of each other: in full
        have = entry(kc[i, g], i, kk[i, g], g) if kc[i, g] >= 0 else None
        for k in np.nonzero(close[i, :, g])[0]:
            f = entry(c, i, k, g)
            if have is None or _rank(f) < _rank(have):
                have, kstep[i, g], kc[i, g], kk[i, g] = f, f[0], c, k


def _at(x, at: tuple):
    """x broadcast to the shape ``at`` indexes, at ``at`` (x of as many dimensions or fewer: numpy's alignment)."""
    a = np.asarray(x)
    return a[tuple(0 if n == 1 else i for n, i in zip(a.shape, at[len(at) - a.ndim:]))]


def _figures(p, ats: list) -> list[dict]:
    """What _make_plan takes of the prediction ``p`` (its times' terms, step, MFU, HFU and critical batch by form,
    bound, memory) at each index of ``ats`` ((batch, M, mesh, layout) of p's arrays), each figure gathered for all
    of them at once (as _at picks one)."""
    t = p.times
    named = {"math": t.math, "compute": t.compute, "hbm": t.hbm, "memory": p.memory["total"], "bound": t.bound,
             **{("comms", a): v for a, v in t.comms.items()},
             **{(name, f): per[f] for name, per in (("step", t.step), ("mfu", t.mfu), ("hfu", t.hfu))
                for f in PLAN_FORMS},
             **{("crit", f): t.critical_batch.get(f, np.nan) for f in PLAN_FORMS}}
    if len(ats) == 1:  # one plan of this prediction: _at's picks
        return [{key: _at(x, ats[0]).item() for key, x in named.items()}]
    cols = [np.array(c) for c in zip(*ats)]
    values = {}
    for key, x in named.items():
        a = np.asarray(x)
        values[key] = a[tuple(np.zeros(len(ats), int) if n == 1 else c
                              for n, c in zip(a.shape, cols[len(cols) - a.ndim:]))].tolist() if a.ndim else \
            [a.item()] * len(ats)
    return [{key: v[n] for key, v in values.items()} for n in range(len(ats))]


@dataclass(frozen=True)
class _Setting:
    """What every plan of one plan() call shares: the model, chip, mesh axes, slices, devices, HBM budget, form."""

    cfg: ModelFamily
    chip: Chip
    axes: tuple
    n_slices: int
    devices: int
    hbm: float
    form: str


def _make_plan(setting: _Setting, B, fig: dict, found: tuple) -> Plan:
    """One Plan (plan's docstring) from the figures ``fig`` of its group's prediction at index ``at`` (_figures; of
    ``found``, its entry: shape, at, schedule, remat, mesh, layout, placement: (DCN axis, b) of dcn_placements)."""
    cfg, axes, n_slices, devices, hbm, form = (setting.cfg, setting.axes, setting.n_slices, setting.devices,
                                               setting.hbm, setting.form)
    shape, at, sched, rem, mesh, lay, (dcn_axis, dcn_stage) = found
    k = at[1]
    pick = lambda key: float(fig[key])  # noqa: E731
    crit = lambda f: None if math.isnan(c := pick(("crit", f))) else c  # noqa: E731
    M = int(np.broadcast_to(sched.microbatches, shape[1])[k])
    one = sched.with_microbatches(M)
    S = mesh["stage"]
    bub = pipeline.bubble(one, S) if S > 1 else {"overhead": 0.0, "idle_share": 0.0}
    return Plan(
        batch_tokens=B, mesh={a: mesh[a] for a in axes}, microbatches=M, repeats=sched.repeats,
        pipeline=str(sched.pipeline), remat=str(rem), sequence_parallel=sched.sequence_parallel,
        options={f: str(getattr(sched, f)) for f in cfg.plan.schedule_options},
        bubble=bub["overhead"], bubble_seconds=pick("math") * bub["idle_share"], slices=n_slices, dcn_axis=dcn_axis,
        layout={a: {"lens": v[0], "wrap": v[1]} for a, v in lay.items()},
        M_X=len(lay.get("fsdp", ([], []))[0]), M_Y=len(lay.get("tensor", ([], []))[0]), form=form,
        step_seconds={f: pick(("step", f)) for f in PLAN_FORMS}, mfu={f: pick(("mfu", f)) for f in PLAN_FORMS},
        hfu={f: pick(("hfu", f)) for f in PLAN_FORMS}, bound=str(fig["bound"]),
        times={"compute": pick("compute"), "math": pick("math"),
               **{a: pick(key) for key in fig if key[0] == "comms" for a in key[1:]}, "hbm": pick("hbm")},
        memory_bytes=pick("memory"), hbm_budget=hbm, per_device_batch=B / devices,
        critical_batch={f: crit(f) for f in PLAN_FORMS}, dcn_stage=dcn_stage)


# plan's arguments, which it passes on
def nearest_miss(cfg, chip: Chip, chips: int, batch_tokens: int, remat: str | None = None, form: str = "sum",
                 flags=None, choices: Choices | None = None, **limits) -> Plan | None:
    """The plan with the least memory per device whatever the budget (what comes closest when nothing
    fits), with its memory terms (Plan.memory_terms: program.predict's); None when no mesh divides the model at
    all. ``limits``: plan's max_microbatches and max_repeats."""
    plans = plan(cfg, chip, chips, batch_tokens, hbm=1e30, remat=remat, form=form, per_mesh=False, flags=flags,
                 choices=choices, **limits)
    if not plans:
        return None
    best = min(plans, key=lambda r: r.memory_bytes)
    terms = program.predict(
        workload_of(best, cfg, flags), chip, {a: (v["lens"], v["wrap"]) for a, v in best.layout.items()},
        dcn=best.dcn_mesh or None).memory
    return dataclasses.replace(best, memory_terms={k: float(v) for k, v in terms.items()})


def dcn_placement(mesh: Mapping, slices: int, given: Mapping | None = None) -> dict[str, int]:
    """{axis: n}: the mesh axes whose outermost factor n spans the ``slices`` slices (TPU, over DCN) or nodes (GPU,
    over InfiniBand): ``given`` ({axis: n}, --dcn-mesh), else MaxText's and Megatron's placement, data outermost
    and tensor innermost: the slices fill the axes in MESH_AXES order (data, stage, fsdp, context, expert, tensor),
    each taking the largest factor of its size that divides the slices left. ValueError where that leaves slices
    over."""
    if given is not None:
        dcn = {a: n for a, n in given.items() if n > 1}
        for a, n in dcn.items():
            if mesh[a] % n:
                raise ValueError(f"the DCN mesh's {a}={n} does not divide the mesh's {a}={mesh[a]}")
        if math.prod(dcn.values()) != slices:
            raise ValueError(f"the DCN mesh spans {math.prod(dcn.values())} slices or nodes, not {slices}")
        return dcn
    dcn, left = {}, slices
    for a in MESH_AXES:
        k = math.gcd(left, mesh[a])
        if k > 1:
            dcn[a], left = k, left // k
    if left > 1:
        raise ValueError(f"the mesh's axes cannot be laid over {slices} slices or nodes: their factors leave {left} "
                         "of them unplaced")
    return dcn


def check_mesh_devices(mesh: MeshShape, chip: Chip, dims: tuple[int, ...], slices: int,
                       spec: str | None = None) -> None:
    """ValueError (naming --mesh ``spec``) where the mesh's devices, the product of its axes, are not the hardware's:
    prod(dims)·slices chips of chip.devices_per_chip devices each (TPU7x: 2)."""
    chips = math.prod(dims) * slices
    devices = chips * chip.devices_per_chip
    if mesh.devices != devices:
        per = f", {chip.devices_per_chip} devices each" if chip.devices_per_chip > 1 else ""
        raise ValueError(f"--mesh {spec or mesh}: the mesh has {mesh.devices} devices; the hardware has {devices} "
                         f"({chips} {chip.name} chips{per})")


def predict_placed(w: Workload, chip: Chip, dims: tuple[int, ...], slices: int, dcn_mesh: Mapping | None = None,
                   form: str = "scheduled", kernel_model: str = "efficiency") -> tuple:
    """(prediction, dcn, layout) of one workload on ``slices`` slices of shape ``dims`` (a GPU node: (GPUs,)): the
    mesh laid over the slices (dcn_placement) and each slice's part of it over the ICI in the layout whose step is
    the fastest in ``form`` (layouts; the planner's choice), predicted by program.predict, the planner's
    function. ValueError where the mesh is not the hardware's devices or does not lay out."""
    check_mesh_devices(w.mesh, chip, dims, slices)
    dcn = dcn_placement(w.mesh, slices, dcn_mesh) if slices > 1 else {}
    within = {a: w.mesh[a] // dcn.get(a, 1) for a in MESH_AXES}
    # the axes of more than one device only: an axis of 1 spans no link, and leaving it out keeps the same layouts in
    # the same order (its factor 1 in every split) without multiplying the splits enumerated (expert, context, ...)
    axes = tuple(a for a, n in within.items() if n > 1) or MESH_AXES[-1:]
    ici = tuple(within[a] for a in axes)
    lays = layouts(dims, chip, axes, keep=lambda kinds: np.all(kinds == np.array(ici), axis=1))
    if ici not in lays:
        raise ValueError(f"the mesh's part within a slice ({', '.join(f'{a}={n}' for a, n in zip(axes, ici))}) "
                         f"cannot be laid out on {'x'.join(map(str, dims))} {chip.name}")
    best = None
    for lay in lays[ici]:
        p = program.predict(w, chip, lay, dcn=dcn or None, kernel_model=kernel_model)
        if best is None or p.times.step[form] < best[0].times.step[form]:
            best = (p, dcn, lay)
    return best
