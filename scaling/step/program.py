"""The one step model: everything the closed forms say about one compiled step of the sharded FFN stack,
per device. ``predict`` is the only place that composes FLOPs, memory, collective volumes and times; the
planner, ``check``, ``answer``'s numbers beside it and ``bench`` all call it.

What ``ffn_model`` compiles (sharding table, scaling.core.sharding: W [L,F,D] split D over fsdp and F over
tensor; batch over data·fsdp; block input x[B,D] replicated over tensor; hidden h[B,F] split F over
tensor), block by block:

  forward   all-gather W_in, W_out (bf16) over fsdp      V = 2·(2·D·F/Y)  bytes   [FSDP, forward]
            h = x·W_in^T (local), y = h·W_out: partial sums over tensor ->
            all-reduce y (bf16) over tensor               V = 2·B·D/(d·X)  bytes   [TP]
  backward  all-gather W_in, W_out again over fsdp        V = 2·(2·D·F/Y)          [FSDP, backward]
            dx = dh·W_in: partial sums over tensor ->
            all-reduce dx over tensor                     V = 2·B·D/(d·X)          [TP]
            dW_in, dW_out: partial sums over data·fsdp ->
            reduce-scatter (bf16) over fsdp               V = 2·(2·D·F/Y)          [FSDP grads]
            all-reduce of the fsdp shard over data        V = 2·(2·D·F/(X·Y))      [DP grads]
  loss      all-reduce of the f32 loss over data·fsdp     V = 4                    [loss]
Block 0's input gradient is dead; the program computes it (and its TP all-reduce) only when block 0
sits in a scan of more than one trip (scaling.step.flops.first_block_dx_computed).
XLA:TPU for TPU7x (libtpu 0.0.42.1, collectives on its SparseCores) merges the two gradient
reductions when data and fsdp are both > 1: one all-reduce of the fsdp-unsharded gradient over
data·fsdp                                         V = 2·(2·D·F/Y)          [grads, merged]
instead of the reduce-scatter over fsdp and the all-reduce over data.
When XLA implements the gradient reduce-scatter as a windowed einsum (TPU, large weights: the dW
matmul is split into X chunks that travel a bidirectional ring as collective-permutes, X/2 steps
× 2 directions, then one more hop for the two partial sums to meet), it moves X+1 chunks of V/X:
                                                  V = 2·(2·D·F/Y)·(X+1)/X  [FSDP grads, windowed]
V is the Scaling Book's volume (the full array a collective spans on each device; sharding page); an
all-to-all's is the buffer one device sends (its compiled operand), 1/n of the Book's array over n devices.

Times (sharding page): an all-gather or reduce-scatter of V bytes over a mesh axis takes V/(links·W_ici),
an all-reduce twice that, an all-to-all a quarter of the axis' array: n·V/(4·links·W_ici) for a device's buffer V
over n devices (comm_times); ``links`` counts the physical ICI axes the mesh axis
spans, 1 for a ring that closes (wraparound) and 1/2 for a line (about twice as long). The step time:
sum form max(T_math, T_hbm) + Σ T_axis (the compiled XXL forward step runs its collectives synchronously:
docs/findings.md, question (c)); max form max(T_math, T_axis..., T_hbm) (everything overlapped). Both are
rooflines.
Slices joined by DCN (more chips than one slice holds) carry the outermost factor of one mesh axis
(data, as MaxText's dcn_data_parallelism, or fsdp); a collective over that axis is hierarchical: over
ICI within a slice and, for 1/(size within a slice) of the bytes, over DCN (tpus page: V·(n−1)/n per chip).
On GPUs (issue 38) a collective over the m GPUs of a node runs at the NCCL bus bandwidth its per-call message reaches
(published nccl-tests all-reduce figures on 8 A100s: collectives.nvlink_efficiency; gpu_messages), ring bytes
(n−1)/n of V over the one-way NVLink bandwidth; across nodes over InfiniBand at Calculon's efficiency and latency
(collectives.ib_time): _gpu_comm_times.

The mesh is scalar (one MeshShape) or, the transformer's, the planner's group of meshes (arrays of axis sizes, each
axis > 1 in all of them or in none: mesh_shape.spans); the batch and the layout's links may be numpy arrays, so the
planner evaluates every batch size and every ICI layout of a mesh in one call (StepModel: a form's step alone).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scaling.hardware import collectives
from scaling.step import kernels
from scaling.step import launches
from scaling.step import memory
from scaling.hardware import roofline
from scaling.core.kinds import Collective, Form, Platform
from scaling.core.mesh_shape import spans
from scaling.core.policies import Step
from scaling.core.schedule import runs_flash
from scaling.hardware.chips import Chip
from scaling.core.workload import Workload

KIND_FACTOR = collectives.KIND_FACTOR


def links(layout: Mapping) -> dict:
    """Effective ICI links of each mesh axis from its layout {axis: (lengths, wraps)} (mesh.ici_layout,
    or the planner's enumeration): Σ over the physical axes it spans of 1 (ring with wraparound) or 1/2
    (line). An axis absent from the layout is taken as one ring."""
    return {axis: sum(1.0 if w else 0.5 for n, w in zip(lens, wraps) if n > 1)
            for axis, (lens, wraps) in layout.items()}


# XLA:TPU's windowed-einsum choice for the fsdp gradient reduce-scatter (windowed_einsum_rs): the fsdp sizes it
# takes and its communication multiplier m, read from libtpu 0.0.42.1 programs compiled ahead of time
# (docs/findings.md, closed forms against the compiler).
WINDOWED_RS_PARTITIONS = (8, 32)
WINDOWED_RS_MULTIPLIER = 1.075


def windowed_einsum_rs(w: Workload, chip: Chip | None, axis_links: Mapping | None = None,
                       dcn: Mapping | None = None):
    """Whether XLA:TPU runs the fsdp gradient reduce-scatter as a windowed einsum: the rule of XLA's SPMD
    partitioner (xla/service/spmd/dot_handler.cc, GetWindowedEinsumConfiguration) for the dW matmul, whose
    contracting tokens and output are split over the same X = fsdp partitions (so data = 1): windowed when
    max(T_comp, m·T_comm) + 2·m·T_comm/X < T_comp + T_comm, i.e. with T_comp/T_comm = b·M_X/alpha (b = B/(M·X)
    tokens per device and microbatch, M_X the fsdp links, alpha per device): b·M_X/alpha > m·(1 + 2/X) − 1, for X in
    WINDOWED_RS_PARTITIONS, m = WINDOWED_RS_MULTIPLIER (both measured). False for a train step's absence, a GPU, no
    chip, or an fsdp axis across slices (not measured). Arrays of B and links (and of the slices fsdp spans, ``dcn``:
    the planner's meshes) give an array."""
    X, lo_hi = w.mesh["fsdp"], WINDOWED_RS_PARTITIONS
    inside = (lo_hi[0] <= np.asarray(X)) & (np.asarray(X) <= lo_hi[1])
    across = np.asarray((dcn or {}).get("fsdp", 1)) > 1
    if (chip is None or chip.kind != Platform.TPU or w.step != Step.TRAIN or spans(w.mesh["data"])
            or not inside.any() or across.all()):
        return False
    b = np.asarray(w.batch_tokens) / (np.asarray(w.schedule.microbatches) * X)
    ratio = b * np.asarray((axis_links or {}).get("fsdp", 1.0)) * chip.ici_bidi / chip.device_flops  # b·M_X/alpha
    out = (ratio > WINDOWED_RS_MULTIPLIER * (1 + 2 / X) - 1) & inside & ~across
    return out.item() if out.ndim == 0 else out


def collective_volumes(w: Workload) -> dict[str, dict[str, float]]:
    """Per device, per mesh axis, per collective kind: the summed volume V (bytes) of one step.

    Returns {axis: {kind: bytes}} for the axes of size > 1 (see the module docstring for each term; the
    transformer's: scaling.families.transformer.collective_volumes). The compiler facts (w.compiler):
    ``min_comm_bytes`` widens narrower element types on the wire: XLA's CPU backend runs bf16
    all-gathers and all-reduces in f32 (``min_comm_bytes=4``; seen in every CPU compile with jax
    0.10.2), while TPU moves bf16 as the precision policy says. ``merged_grad_allreduce``: the program
    reduces the weight gradients with one all-reduce over data·fsdp (TPU7x; module docstring).
    ``schedule`` (scaling.step.pipeline): every block-pass (T·Lc per stage, M·L without stages) gathers its
    weights, reduce-scatters and data-reduces its gradient and all-reduces its activations over tensor,
    on B/(M·data·fsdp) tokens per device; with stages, each iteration's activations move one stage on
    (a collective-permute of a microbatch, forward and backward); with ``fsdp_gather="step"`` a stage
    gathers its L/S blocks once (forward; the backward reuses them) but still reduce-scatters each
    block-pass's gradient (accumulating it unreduced would hold the stage's whole gathered gradient);
    a circular schedule re-lays the FP32 stacks over ``stage`` (pipeline.relay_moves rounds of one
    chunk of Lc blocks per stack, each a collective-permute) forward and their gradient back,
    ``circular_relays`` = 2 per stack in a train step, 3 where XLA re-lays the stacks again for the
    backward rather than keep them (read from the program by verify.check). ZeRO-1
    (Schedule.optimizer_sharding): the gradients reduce-scattered over data·fsdp at once (V = n·cg·2·D·F/Y;
    windowed, ·(d·X + 1)/(d·X)), and the updated FP32 weights all-gathered over data (V = 4·P/(X·Y)); no
    reduce-scatter over fsdp and no all-reduce over data.
    """
    return w.model.forms.collective_volumes(w)


def overlapped_volumes(w: Workload, vols: dict | None = None) -> dict[str, dict[str, float]]:
    """The part of collective_volumes(w) that XLA:TPU's schedule runs behind matmuls under the workload's flags
    (w.flags, scaling.core.flags), per axis and kind; the rest is exposed: the model family's (scaling.families.ffn's
    overlapped_volumes; the transformer's: none yet). ``vols``: collective_volumes(w), where the caller has it."""
    return w.model.forms.overlapped_volumes(w, vols)


def loop_copy_bytes(w: Workload) -> float:
    """Bytes a rotated loop of across-blocks gathers (scaling.core.flags) copies into its state per step: the model
    family's (scaling.families.ffn.loop_copy_bytes; the transformer's: 0)."""
    return w.model.forms.loop_copy_bytes(w)


def exposed_volumes(w: Workload, vols: dict | None = None, hidden: dict | None = None) -> dict[str, dict[str, float]]:
    """collective_volumes(w) less overlapped_volumes(w), per axis and kind (the axes with bytes left); ``vols``,
    ``hidden``: those two, where the caller has them."""
    vols = collective_volumes(w) if vols is None else vols
    hidden = overlapped_volumes(w, vols) if hidden is None else hidden
    out = {a: {k: v - hidden.get(a, {}).get(k, 0.0) for k, v in kinds.items()} for a, kinds in vols.items()}
    return {a: k for a, k in out.items() if any((np.asarray(v) > 0).any() for v in k.values())}


def axis_bytes(volumes: dict[str, dict[str, float]]) -> dict[str, float]:
    """Total V per axis: sum over kinds."""
    return {axis: sum(kinds.values()) for axis, kinds in volumes.items()}


def gpu_messages(w: Workload) -> dict:
    """Bytes of one call of each mesh axis's collectives on a GPU (what sets the fraction of the link bandwidth it
    reaches: collectives.nvlink_efficiency): over tensor, context and stage one microbatch's activations per device,
    c·t_m·D (t_m = B/(M·data·fsdp·context) tokens: the tensor-parallel all-reduces, the pipeline's sends); over fsdp
    one layer's weights over tensor, c·P_layer/Y (each layer's gather); over data the whole gradient (one call: the
    runtimes' buckets, 25M-500M elements, are in the large-message regime of the table)."""
    cfg, mesh, c = w.model, w.mesh, w.precision.compute
    M = np.asarray(w.schedule.microbatches)
    t_m = w.batch_tokens / (M * mesh.get("data", 1) * mesh.get("fsdp", 1) * mesh.get("context", 1))
    act = c * t_m * cfg.d_model
    layer = cfg.params_per_block
    return {"tensor": act, "context": act, "stage": act, "fsdp": c * layer / mesh.get("tensor", 1)}


def comm_times(volumes: dict, chip: Chip, axis_links: Mapping | None = None, dcn: Mapping | None = None,
               mesh: Mapping | None = None, messages: Mapping | None = None) -> dict:
    """Seconds per mesh axis: Σ_kind KIND_FACTOR·V / (links·W_ici) over the links of the axis
    (``axis_links``: links(); 1 where absent). A key that joins axes ("data+fsdp") runs over all of
    their links (sharding page: V/(n·W_ici) over n axes).
    An all-to-all's V is the buffer one device sends (the compiled all-to-all's operand); the Scaling Book prices
    an AllToAll of the array it spans over the axis, V_axis = m·V over the axis' m devices on ICI, at
    V_axis/(4·W_ici) on a bidirectional ring (sharding page; KIND_FACTOR 1/4): m·V/(4·links·W_ici), ``mesh``
    required (over several physical axes the links divide it as they do an all-gather's: exact for a 2x2 axis).
    An axis whose outermost factor n spans slices joined by DCN (``dcn`` {axis: n}, size n·m on
    ``mesh``) is hierarchical: the ICI part over the m devices of a slice (none if m = 1) plus, over
    DCN, KIND_FACTOR·(V/m)·(n−1)/n / (DCN bytes/s per device) (tpus page, multi-slice); an all-to-all's DCN part
    (n−1)/n·V / (DCN bytes/s per device), the share of its buffer bound for other slices through its own link (a
    switched network, as scaling.families.moe.all_to_all_seconds' switch). ``dcn``'s n may be an
    array over the planner's meshes (1 where a mesh's outermost factor of the axis spans no slices)."""
    axis_links, dcn = axis_links or {}, dcn or {}
    w, dcn_bw = chip.ici_bidi, chip.dcn_bw / chip.devices_per_chip
    if chip.kind == Platform.GPU and mesh is not None:
        return _gpu_comm_times(volumes, chip, dcn, mesh, messages or {})
    times = {}
    for key, kinds in volumes.items():
        axis = key.split("+")[0]
        lkw = sum(axis_links.get(a, 1.0) for a in key.split("+")) * w
        n = dcn.get(axis, 1) if key == axis else 1
        m = mesh[axis] // n if (np.asarray(n) > 1).any() else None
        ici = (n == 1) | (m > 1) if m is not None else None  # where the axis has an ICI part
        total = 0.0
        for k, v in kinds.items():
            if m is None:
                net = 0.0
            elif k == Collective.ALL_TO_ALL:  # the share of a device's buffer bound for other slices (0 where n = 1)
                net = v * (n - 1) / n / dcn_bw
            else:  # dcn_time's, for an array of slices (0 where n = 1)
                net = KIND_FACTOR[k] * (collectives.dcn_time("all-gather", v / m, n, dcn_bw) if np.ndim(n) == 0
                                        else v / m * (n - 1) / n / dcn_bw)
            if k == Collective.ALL_TO_ALL:  # the Book's V: the array over the axis' devices on ICI, m·V
                v = v * (_devices(mesh, key) if m is None else m)
            total = total + KIND_FACTOR[k] * (v / lkw if m is None else np.where(ici, v / lkw, 0.0)) + net
        times[key] = total
    return times


def _devices(mesh: Mapping | None, key: str):
    """The devices an axis key spans ("data+expert": the product of both sizes), from ``mesh``; ValueError without
    one (an all-to-all's time needs it: comm_times)."""
    if mesh is None:
        raise ValueError(f"the all-to-all over {key} is priced on the array it spans over the axis: give the mesh")
    n = 1
    for a in key.split("+"):
        n = n * mesh.get(a, 1)
    return n


def _gpu_comm_times(volumes: dict, chip: Chip, dcn: Mapping, mesh: Mapping, messages: Mapping) -> dict:
    """comm_times on a GPU: per axis Σ_kind of the NVLink part over the m GPUs of a node
    (collectives.gpu_time: ring bytes (n−1)/n of V at the bus bandwidth the per-call message reaches, nccl-tests
    figures) and, for an axis whose outermost factor n spans nodes (``dcn``), the InfiniBand part
    (collectives.ib_time: V/m over each GPU's NIC at Calculon's efficiency, a latency per call; an all-to-all the
    (n−1)/n of V bound for other nodes through each GPU's NIC, and over NVLink only its node's 1/n); ``messages``
    {axis: bytes per call} (gpu_messages; an axis without one: the whole V in one call)."""
    times = {}
    for key, kinds in volumes.items():
        axes = key.split("+")
        size = 1
        for a in axes:
            size = size * np.asarray(mesh.get(a, 1))
        n = dcn.get(axes[0], 1) if len(axes) == 1 else 1
        m = size // n
        total = 0.0
        for kind, v in kinds.items():
            msg = messages.get(key, v)
            calls = v / np.maximum(msg, 1e-300)
            # an all-to-all's NVLink part is the 1/n of its buffer bound for its own node's GPUs (the rest crosses IB)
            local = v / n if kind == Collective.ALL_TO_ALL else v
            total = total + collectives.gpu_time(kind, local, m, msg, chip) + collectives.ib_time(
                kind, v, n, m, calls, chip.dcn_bw / chip.devices_per_chip)
        times[key] = total
    return times


def axis_networks(chip: Chip, axis_links: Mapping | None = None, dcn: Mapping | None = None,
                  mesh: Mapping | None = None, axes=("fsdp", "tensor"), messages: Mapping | None = None) -> dict:
    """{axis: (ici, net)}: the seconds·W_ici per byte of V that comm_times charges an all-gather over the axis,
    split into its ICI part 1/links (0 where the axis has one device per slice) and, for an axis whose
    outermost factor n spans slices (``dcn``; m = size/n devices per slice), its network part
    W_ici·(n−1)/(n·m·DCN bytes/s per device). The axis's effective links, what the roofline's M takes, are
    1/(ici + net); it runs over the network (TPU: DCN, GPU: IB) where net > ici. ``dcn``'s n may be an array
    over the planner's meshes (1 where a mesh's axis spans no slices: net 0).
    A GPU (with ``mesh``) charges what _gpu_comm_times does: ici = W_ici·(m−1)/m/(W_oneway·nvlink_efficiency of the
    axis's message, ``messages``; the largest where none), net = W_ici·(n−1)/(n·m·IB bytes/s per GPU·IB_EFFICIENCY)."""
    axis_links, dcn, out = axis_links or {}, dcn or {}, {}
    if chip.kind == Platform.GPU and mesh is not None:
        for a in axes:
            size, n = np.asarray(mesh.get(a, 1)), np.asarray(dcn.get(a, 1))
            m = size // n
            eff = collectives.nvlink_efficiency(chip, (messages or {}).get(a, np.inf), m)
            ici = np.where(m > 1, chip.ici_bidi * (m - 1) / np.maximum(m, 1) / (chip.ici_bidi / 2 * eff), 0.0)
            net = np.where(n > 1, chip.ici_bidi * (n - 1) / (np.maximum(n, 1) * m * chip.dcn_bw / chip.devices_per_chip
                                                            * collectives.IB_EFFICIENCY), 0.0)
            out[a] = (ici, net)
        return out
    for a in axes:
        n = dcn.get(a, 1)
        m = mesh[a] // n if (np.asarray(n) > 1).any() else None
        ici = 1 / np.asarray(axis_links.get(a, 1.0)) if m is None else np.where((m == 1) & (n > 1), 0.0, 1 / np.asarray(
            axis_links.get(a, 1.0)))
        net = chip.ici_bidi * (n - 1) / (n * m * chip.dcn_bw / chip.devices_per_chip) if m is not None else 0.0
        out[a] = (ici, net)
    return out


def _select(w, yes, no):
    """np.where(w, yes, no) through predictions and nested dicts (a key on one side only is 0 on the other)."""
    if dataclasses.is_dataclass(yes):
        return type(yes)(**{f.name: _select(w, getattr(yes, f.name), getattr(no, f.name))
                            for f in dataclasses.fields(yes)})
    if yes is None and no is None:
        return None
    if isinstance(yes, dict) or isinstance(no, dict):
        return {k: _select(w, yes.get(k, 0.0), no.get(k, 0.0)) for k in {**no, **yes}}
    return np.where(w, yes, no)


def step_flops_per_device(w: Workload) -> dict:
    """Matmul FLOPs one device executes in a step, term by term (scaling.step.flops.step_flops), plus "model"
    (the matmuls the step needs: 6·P·B − 2·B·D·F for train, 2·P·B forward) per device.

    Without stages the microbatches of gradient accumulation add up to one pass over the batch (the
    dead dx of block 0, where the scan computes it, once per microbatch, the same total):
    step_flops(B)/N. With S stages a device runs its stage's chunk of Lc = L/(S·R) blocks on B/M tokens
    in each of the T = R·M + S − 1 iterations, bubble ones included, every pass's dx computed:
    step_flops(chunk of Lc blocks, B)·(T/M)/(data·fsdp·tensor) (scaling.step.pipeline). The transformer's:
    scaling.families.transformer.step_flops."""
    return w.model.forms.step_flops(w)


@dataclass(frozen=True)
class StepTimes:
    """Seconds per device of one step, by roofline term, and what follows from them (predict's docstring).
    ``step``, ``mfu`` and ``hfu`` are keyed by form: "sum", "max" (roofline.FORMS) and "scheduled";
    ``critical_batch`` by "sum" and "max". ``exposed``: seconds per axis of the exposed collectives; ``copies``:
    seconds of the loop-state copies (both under the workload's flags); ``compute``: the kernels' seconds
    (scaling.step.kernels.compute_seconds), the scheduled form's compute term; ``host_idle``: the seconds the GPU
    waits for a PyTorch runtime's host to issue its launches (StepModel.t_idle)."""

    math: object
    comms: dict
    hbm: object
    step: dict
    bound: object
    mfu: dict
    hfu: dict
    critical_batch: dict
    exposed: dict = dataclasses.field(default_factory=dict)
    copies: object = 0.0
    compute: object = 0.0
    host_idle: object = 0.0  # seconds the GPU waits for a PyTorch runtime's host (scaling.step.launches)
    passes: dict = dataclasses.field(default_factory=dict)  # a GPU's layer passes (StepModel.passes)


@dataclass(frozen=True)
class Prediction:
    """What predict says of one step per device: FLOPs, collective volumes (per axis and kind, and per axis),
    memory terms, HBM traffic, and with a chip the times. Fields may hold numpy arrays (the planner's)."""

    flops: dict
    collectives: dict
    collective_bytes: dict
    memory: dict
    hbm_bytes: object
    times: StepTimes | None = None
    exposed_bytes: dict = dataclasses.field(default_factory=dict)
    loop_copy_bytes: object = 0.0

    def to_json(self) -> dict:
        """The prediction as plain JSON values (arrays as lists)."""
        return _plain(dataclasses.asdict(self))


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return np.asarray(x).tolist() if isinstance(x, (np.ndarray, np.generic)) else x


def predict(w: Workload, chip: Chip | None = None, layout: Mapping | None = None, axis_links: Mapping | None = None,
            dcn: Mapping | None = None, kernel_model: str = "efficiency") -> Prediction:
    """Everything the closed forms say about one compiled step of the workload ``w``, per device:

    flops        matmul FLOPs per device, term by term (step_flops_per_device; the scan computes the first
                 block's unused input gradient, so it is counted here); model = the matmuls the step
                 needs (6·P·B − 2·B·D·F for train), executed = the total
    collectives  V per axis and kind (collective_volumes, with w.compiler's facts; windowed_grad_rs None:
                 XLA:TPU's rule, windowed_einsum_rs, which may differ per batch and layout of the arrays)
    memory       bytes per device, term by term (scaling.step.memory.memory_per_device); hbm_bytes: HBM traffic
                 (memory.hbm_traffic_bytes)
    exposed_bytes  V per axis that the schedule under w.flags leaves exposed (exposed_volumes; a non-TPU chip
                 takes the flags as "default": synchronous); loop_copy_bytes (loop_copy_bytes)
    times        (with ``chip``) T_math = executed FLOPs/C_device; T_axis per mesh axis over its links
                 (``layout`` {axis: (lengths, wraps)} as mesh.ici_layout gives it, or ``axis_links``;
                 ``dcn`` {axis: slices} for an axis whose outermost factor spans slices, the slices an array over
                 the planner's meshes where they differ: comm_times);
                 T_hbm = HBM bytes / HBM bandwidth. step_max = max(all terms) (everything overlapped);
                 step_sum = max(T_math, T_hbm) + Σ T_axis: the collectives run between the matmuls
                 (synchronous: docs/findings.md, question (c)) while a kernel's HBM traffic overlaps its own
                 math (the roofline of one kernel), so step_sum >= step_max always. step_scheduled = max(T_compute,
                 T_hidden) + Σ T_axis of the exposed volumes (exposed_volumes, under w.flags) + 2·loop-state
                 copy bytes / HBM bandwidth (loop_copy_bytes), T_hidden the time of the overlapped volumes (they
                 hide only behind as much math as there is): the form that follows the compiled schedule, with
                 T_compute the step's kernels one after another at the efficiency their shapes get on the chip
                 (scaling.step.kernels: matmuls at eta·q(shape) of the peak of w.precision.dtype, pointwise passes and
                 the optimizer at the HBM bandwidth; ``kernel_model`` "hierarchical": the matmuls' bytes from their
                 tiles through the on-chip memory), in place of the roofline's max(T_math, T_hbm).
                 bound = the largest term, named by the link it runs over (ICI/NVLink, or DCN/IB for an
                 axis across slices or nodes where that part dominates: axis_networks);
                 mfu[form] = model FLOPs / (C·step), hfu[form] = executed (C: the peak of w.precision.dtype);
                 critical_batch[form]: the overall batch above which the passes are compute bound, per
                 microbatch (each gathers the weights again), times data·M: scaling.hardware.roofline.critical_batch
                 (FSDP+TP) with M_X, M_Y the effective links of fsdp and tensor (axis_networks: DCN/IB
                 included) and the FSDP bytes of a train step (2 gathers + a reduce-scatter, (X+1)/X of V
                 windowed, per 3 passes); with data > 1 at least alpha/M_d (data-parallel backward, M_d the
                 data links); NaN where no batch is.
    The ICI times are those of the bytes the precision policy puts on the wire (bf16), also when
    ``min_comm_bytes`` widens the volumes reported for an XLA:CPU program.
    """
    return StepModel(w, chip, layout, axis_links, dcn, kernel_model).prediction()


class StepModel:
    """predict's terms of one workload on one chip, each computed when first asked for and kept (predict's docstring
    says what each is): ``step(form)``, the step seconds of one form, and ``prediction()``, all of predict's answer.
    The planner ranks its candidates by the first and asks the second only of those its plans come from; predict
    asks the second. ``compute``: the kernels' seconds (kernels.compute_term of ``w`` on ``chip``, at the
    precision's dtype and ``kernel_model``), ``memory_total``: memory.memory_per_device(w)["total"], where the caller
    has them."""

    def __init__(self, w: Workload, chip: Chip | None = None, layout: Mapping | None = None,
                 axis_links: Mapping | None = None, dcn: Mapping | None = None, kernel_model: str = "efficiency",
                 compute=None, memory_total=None):
        self.lk = {**(links(layout) if layout else {}), **(axis_links or {})}
        if chip is not None and chip.kind != Platform.TPU:  # the sets hold libtpu's flags: a GPU runs none of them
            w = w.replace(flags=w.flags.on(chip.kind))
        if w.compiler.windowed_grad_rs is None:
            w = w.with_facts(windowed_grad_rs=windowed_einsum_rs(w, chip, self.lk, dcn))
        self.split = None  # (rule, model where windowed, model where not) where the rule differs across the arrays
        if np.ndim(w.compiler.windowed_grad_rs):  # both programs, each where it applies
            rule = np.asarray(w.compiler.windowed_grad_rs)
            if rule.all() or not rule.any():
                w = w.with_facts(windowed_grad_rs=bool(rule.all()))
            else:
                self.split = (rule, *(StepModel(w.with_facts(windowed_grad_rs=v), chip, layout, axis_links, dcn,
                                                kernel_model, compute, memory_total) for v in (True, False)))
        self.w, self.chip, self.dcn, self.kernel_model, self._prediction = w, chip, dcn, kernel_model, None
        self._memory_total = memory_total
        if compute is not None:  # the kernels read neither the flags nor the compiler's facts
            self.t_compute = compute

    def step(self, form: str):
        """The step seconds in ``form`` (sum, max or scheduled), what prediction().times.step[form] holds."""
        if self.split:
            rule, yes, no = self.split
            return np.where(rule, yes.step(form), no.step(form))
        if form == Form.SUM:
            return np.maximum(self.t_math, self.t_hbm) + sum(self.t_axes.values())
        if form == Form.MAX:
            return self.stacked.max(axis=0)
        return np.maximum(self.t_compute, self.t_hidden) + sum(self.t_exposed.values()) + self.t_copies + self.t_idle

    @functools.cached_property
    def flops(self) -> dict:
        return step_flops_per_device(self.w)

    @functools.cached_property
    def volumes(self) -> dict:
        return collective_volumes(self.w)

    @functools.cached_property
    def hidden(self) -> dict:
        return overlapped_volumes(self.w, self.volumes)

    @functools.cached_property
    def on_wire(self) -> Workload:
        """The workload whose volumes are the bytes on the wire (bf16)."""
        w = self.w
        return w.with_facts(min_comm_bytes=0) if w.compiler.min_comm_bytes else w

    @functools.cached_property
    def wire(self) -> dict:
        return collective_volumes(self.on_wire) if self.on_wire is not self.w else self.volumes

    @functools.cached_property
    def wire_hidden(self) -> dict:
        return overlapped_volumes(self.on_wire, self.wire) if self.on_wire is not self.w else self.hidden

    @functools.cached_property
    def memory(self) -> dict:
        return memory.memory_per_device(self.w)

    @functools.cached_property
    def hbm(self):
        return memory.hbm_traffic_bytes(self.w)

    @functools.cached_property
    def peak(self) -> float:
        """C of the matmuls' input type (bf16: the table's C)."""
        return kernels.peak_flops(self.chip, self.w.precision.dtype)

    @functools.cached_property
    def t_math(self):
        return self.flops["total"] / self.peak

    @functools.cached_property
    def t_axes(self) -> dict:
        return comm_times(self.wire, self.chip, self.lk, self.dcn, self.w.mesh, self.messages)

    @functools.cached_property
    def messages(self) -> dict:
        """Bytes per call of each axis's collectives on a GPU (gpu_messages; none on a TPU)."""
        return gpu_messages(self.w) if self.chip is not None and self.chip.kind == Platform.GPU else {}

    @functools.cached_property
    def t_hbm(self):
        return self.hbm / self.chip.device_hbm_bw

    @functools.cached_property
    def stacked(self) -> np.ndarray:
        """[terms, ...]: T_math, T_axis per axis, T_hbm."""
        return np.stack(np.broadcast_arrays(self.t_math, *self.t_axes.values(), self.t_hbm))

    @functools.cached_property
    def t_exposed(self) -> dict:
        return comm_times(exposed_volumes(self.on_wire, self.wire, self.wire_hidden), self.chip, self.lk, self.dcn,
                          self.w.mesh, self.messages)

    @functools.cached_property
    def t_hidden(self):
        return sum(comm_times(self.wire_hidden, self.chip, self.lk, self.dcn, self.w.mesh, self.messages).values())

    @functools.cached_property
    def t_copies(self):
        return 2 * loop_copy_bytes(self.w) / self.chip.device_hbm_bw  # each copy reads and writes its bytes

    @functools.cached_property
    def passes(self) -> dict:
        """A GPU step's layer passes, what each launches and how long its device and host take
        (launches.pass_table: the tensor axis's exposed collectives split over the passes; the host's time only under
        a PyTorch runtime, XLA's program launching from a compiled executable); {} on a TPU."""
        w, chip = self.w, self.chip
        if chip.kind != Platform.GPU:
            return {}
        ks = kernels.step_kernels(w, chip, w.precision.dtype, self.kernel_model)
        calls = axis_bytes(self.wire).get("tensor", 0.0) / np.maximum(self.messages.get("tensor", 1.0), 1e-300)
        host = launches.HOST_SECONDS if launches.runs_launches(w) else 0.0
        return launches.pass_table(ks, runs_flash(w.schedule, w.mesh), calls, self.t_exposed.get("tensor", 0.0), host)

    @functools.cached_property
    def t_idle(self):
        """Seconds the GPU waits for a PyTorch runtime's host to issue the step's launches: Σ over the passes of
        max(0, host − device) (launches.pass_table); 0 for XLA's programs and on a TPU."""
        if self.chip.kind != Platform.GPU or not launches.runs_launches(self.w):
            return 0.0
        return sum((np.maximum(0.0, r["host"] - r["device"]) for r in self.passes.values()), 0.0)

    @functools.cached_property
    def t_compute(self):
        return kernels.compute_term(self.w, self.chip, self.w.precision.dtype, self.kernel_model)

    def memory_total(self):
        """prediction().memory["total"], without the rest of the prediction."""
        if self._memory_total is not None:
            return self._memory_total
        if self.split:
            rule, yes, no = self.split
            return np.where(rule, yes.memory_total(), no.memory_total())
        return self.memory["total"]

    def prediction(self) -> Prediction:
        """predict's answer (its docstring), made once."""
        if self._prediction is None:
            self._prediction = self._predict()
        return self._prediction

    def _predict(self) -> Prediction:
        if self.split:
            rule, yes, no = self.split
            return _select(rule, yes.prediction(), no.prediction())
        w, chip, lk, dcn = self.w, self.chip, self.lk, self.dcn
        mesh, step, schedule, cfg = w.mesh, w.step, w.schedule, w.model
        windowed_grad_rs = w.compiler.windowed_grad_rs
        f, vols = self.flops, self.volumes
        res = Prediction(f, vols, axis_bytes(vols), self.memory, self.hbm, None,
                         axis_bytes(exposed_volumes(w, vols, self.hidden)), loop_copy_bytes(w))
        if chip is None:
            return res
        peak, t_axes, stacked = self.peak, self.t_axes, self.stacked
        # the bound, named by the link it runs over: an axis across slices or nodes by its network where that part
        # dominates (axis_networks)
        nets = axis_networks(chip, lk, dcn, mesh, axes=tuple(t_axes), messages=self.messages)
        over = np.stack(np.broadcast_arrays(False, *(net > ici for ici, net in nets.values()), False, stacked[0]))[:-1]
        largest = stacked.argmax(axis=0)
        names = np.array(["compute", *(f"{chip.link_name} ({a})" for a in t_axes), "HBM",
                          "compute", *(f"{chip.network_name} ({a})" for a in t_axes), "HBM"])
        bound = names[largest + len(stacked) * (np.take_along_axis(over, largest[None], 0)[0] != 0)]
        d = mesh["data"]
        if cfg.has_critical_batch:  # the effective links the critical batch takes (the transformer: none modelled)
            m_x, m_y, m_d = (np.where(mesh[a] > 1, 1 / np.maximum(ici + net, 1e-300), 1.0)
                             for a, (ici, net) in axis_networks(chip, lk, dcn, mesh, ("fsdp", "tensor", "data"),
                                                                self.messages).items())
        per_micro = d * np.asarray(schedule.microbatches)
        X = mesh["fsdp"]  # a train step moves 2 gathers and a reduce-scatter ((X+1)/X of V windowed) per 3 passes' math
        fsdp_bytes = 2 * (2 + (X + 1) / X) / 3 if windowed_grad_rs and step == Step.TRAIN else 2
        steps = {form: self.step(form) for form in ("sum", "max", "scheduled")}
        crits = {}
        for form in roofline.FORMS if cfg.has_critical_batch else ():
            crit = per_micro * roofline.critical_batch_array(cfg.d_ff, X, mesh["tensor"], chip.alpha, m_x, m_y, form,
                                                             fsdp_bytes)
            if d > 1 and step == Step.TRAIN:  # and the data-parallel backward: B/(d·M) > alpha/M_d (training page)
                crit = np.maximum(crit, per_micro * chip.alpha / m_d)
            crits[form] = crit
        crits.update({form: np.nan for form in roofline.FORMS if form not in crits})  # the transformer: none modelled
        times = StepTimes(self.t_math, t_axes, self.t_hbm, steps, bound.item() if bound.ndim == 0 else bound,
                          {k: f["model"] / (peak * t) for k, t in steps.items()},
                          {k: f["total"] / (peak * t) for k, t in steps.items()}, crits, self.t_exposed,
                          self.t_copies, self.t_compute, self.t_idle, self.passes)
        return dataclasses.replace(res, times=times)
