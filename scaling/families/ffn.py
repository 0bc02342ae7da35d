"""The FFN stack as a model family (scaling.core.family.ModelFamily): its config (FFNConfig) and its closed forms,
those the step model (scaling.step.program.predict), the memory terms and the kernels take from it.

Notation (Scaling Book, "How to Scale Your Model", jax-ml.github.io/scaling-book/training/):
D = d_model, F = d_ff, L = blocks; a block is two bias-free linear layers D -> F -> D, so the
parameter count is P = 2·D·F·L (questions-4d.md, "The model"). Sharding (scaling.core.sharding): W_in and W_out
[L,F,D] split D over fsdp and F over tensor; the batch over data·fsdp; x[B,D] replicated over tensor, h[B,F]
split F over tensor. Collectives: scaling.step.program's module docstring; memory: train_memory_per_device.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scaling.hardware import collectives
from scaling.step import flops
from scaling.step import memory
from scaling.step import pipeline
from scaling.core.family import FamilyDefaults, PlanPolicy
from scaling.core.flags import Gathers
from scaling.core.inputs import positive_int
from scaling.core.kinds import Collective, Family, Platform
from scaling.step.kernels import Kernel, accumulate_kernel, adamw_kernel, matmul_kernel
from scaling.core.mesh_shape import MESH_AXES
from scaling.core.policies import TRANSFORMER_ONLY_REMAT, FsdpGather, OptimizerSharding, Remat, Step
from scaling.core.schedule import Schedule
from scaling.core.sharding import shards
from scaling.core.workload import Workload


@dataclass(frozen=True)
class FFNConfig(FamilyDefaults):
    """An FFN stack: ``blocks`` blocks of x·W_in (D×F) then ·W_out (F×D), no biases.

    P = 2·D·F·L parameters (questions-4d.md, "The model").
    ``activation`` is None (the question's model: no nonlinearity) or a jax.nn function name.
    """

    # What a command or builder asks of a model family instead of its type (scaling.families.presets.FAMILIES):
    family: ClassVar[str] = Family.FFN  # the family's key: which program builds it (ffn_model.families)
    forms: ClassVar = sys.modules[__name__]  # its closed forms: this module's functions (scaling.core.family.FORMS)
    noun: ClassVar[str] = "FFN stack"  # the family in a message
    seq_len: ClassVar[None] = None  # no sequences: a batch is B token vectors, not B/T sequences
    vocab: ClassVar[None] = None  # no vocabulary (no embedding or output layer on the pipeline's end stages)
    block: ClassVar[str] = "serial"  # a block is one MLP: its pointwise passes are a serial block's
    layer_windows: ClassVar[tuple] = ()  # no attention, so no local layers
    batch_axis: ClassVar[str] = "batch"
    # what the shared rules, the step model and the planner ask of a family (scaling.core.family.ModelFamily)
    runs_1f1b: ClassVar[bool] = False  # GPipe and circular only (ffn_model.pipeline)
    has_critical_batch: ClassVar[bool] = True  # predict's critical_batch (roofline.critical_batch_array)
    plan: ClassVar[PlanPolicy] = PlanPolicy(
        batch_tokens=25600,
        axes=tuple(a for a in MESH_AXES if a not in ("context", "expert")),  # no sequence to split, no experts
        remats=("none",),  # the plan's default remat (Choices.of)
        grouped=False,  # one mesh a group, microbatches and repeats only
        remat_keeps=None,  # no nested policies: the planner sizes every remat it is given
        schedule_options=())  # no attention, context or optimizer choice
    # what a command may set (scaling.families.presets.model_of; the flags of jax_scaling.args.add_model_args)
    dimensions: ClassVar[dict[str, str]] = {"d_model": "D", "d_ff": "F", "blocks": "L"}
    kinds: ClassVar[dict[str, tuple[tuple[str, ...], str]]] = {}
    switches: ClassVar[dict[str, str]] = {}
    schedule_flags: ClassVar[dict[str, str]] = {}

    d_model: int
    d_ff: int
    blocks: int
    activation: str | None = None

    def __post_init__(self):
        for name in ("d_model", "d_ff", "blocks"):
            positive_int(name, getattr(self, name))

    @property
    def params(self) -> int:
        """P = 2·D·F·L."""
        return 2 * self.d_model * self.d_ff * self.blocks

    @property
    def params_per_block(self) -> int:
        """2·D·F."""
        return 2 * self.d_model * self.d_ff

    @property
    def active_params(self) -> int:
        """P: every parameter runs for every token."""
        return self.params

    @property
    def norm_params(self) -> int:
        """0: the FFN stack has no norms."""
        return 0

    def replace(self, **kw) -> "FFNConfig":
        return dataclasses.replace(self, **{k: v for k, v in kw.items() if v is not None})

    def __str__(self) -> str:
        """A header's words: "FFN stack D=16,384 F=53,248 L=126" (repr() keeps the dataclass form)."""
        return (f"FFN stack D={self.d_model:,} F={self.d_ff:,} L={self.blocks:,}"
                + (f" {self.activation}" if self.activation else ""))

    def check_remat(self, remat: str) -> None:
        """The transformer's named policies (TRANSFORMER_ONLY_REMAT) are refused: none, every-second or full."""
        if remat in TRANSFORMER_ONLY_REMAT:
            raise ValueError(f"remat {remat} is for the transformer; the FFN stack's remat is none, every-second or "
                             "full")

    def check_schedule(self, schedule: Schedule, mesh: Mapping, batch_tokens: int | None = None) -> None:
        """Before the shared rules (Schedule.check): sequence parallelism with pipeline stages is the transformer's
        (the FFN stack's pipeline carries its activations whole over tensor)."""
        if schedule.sequence_parallel and mesh.get("stage", 1) > 1:
            raise ValueError("sequence_parallel with pipeline stages is built for the transformer; the FFN stack runs "
                             "one or the other (leave sequence parallelism off, or stage=1)")

    def check_batch_split(self, schedule: Schedule, mesh: Mapping, batch_tokens: int | None = None) -> None:
        """B divisible by microbatches·data·fsdp (·tensor with sequence parallelism: batch_sp)."""
        if batch_tokens is not None:
            n = schedule.microbatches * shards(mesh, "batch_sp" if schedule.sequence_parallel else "batch")
            if positive_int("batch_tokens", batch_tokens) % n:
                raise ValueError(f"batch_tokens={batch_tokens} is not divisible by microbatches·data·fsdp"
                                 + ("·tensor" if schedule.sequence_parallel else "") + f" = {n}")

    def check_axes(self, mesh: Mapping) -> None:
        """No context axis (no sequence to split), no expert axis (no experts)."""
        if mesh.get("context", 1) > 1:
            raise ValueError(f"context={mesh['context']}: the FFN stack has no sequence axis to split over context "
                             "(use data or fsdp for its tokens)")
        if mesh.get("expert", 1) > 1:
            raise ValueError(f"expert={mesh['expert']}: the FFN stack has no experts (an MoE model splits its experts "
                             "over expert)")

    def batch_division(self, batch_tokens: int) -> tuple[str, int, str]:
        """B over the shards of ``batch`` (no sequences)."""
        return ("batch_tokens", batch_tokens, "batch")

    def divisions(self) -> list[tuple[str, int, str]]:
        """(name, dimension, logical axis) the sharding table splits: D (embed), F (mlp)."""
        return [("d_model", self.d_model, "embed"), ("d_ff", self.d_ff, "mlp")]


def memory_per_device(w: Workload) -> dict:
    """Bytes per device, term by term: the train step's (train_memory_per_device) or the forward step's
    (forward_memory_per_device)."""
    return (train_memory_per_device if w.step == Step.TRAIN else forward_memory_per_device)(w)


def train_memory_per_device(w: Workload) -> dict:
    """Training memory per device of the FFN stack in bytes, term by term.

    master  = master·P/(X·Y)             fp32 weights, 4 B/param
    optimizer = moments·moment·P/(X·Y)   Adam mu, nu, 8 B/param
    grads   = grad·P/(X·Y)               fp32 gradients, 4 B/param
    activations = saved_activation_bytes (bf16, under the remat policy)
    transient_weights = 2 layers' bf16 weights gathered over fsdp: c·2·(2·D·F/Y)
        (the scan gathers one block's W_in and W_out; XLA prefetches the next block's; the
        backward needs the same). With ``windowed_grad_rs`` (XLA:TPU's windowed-einsum gradient
        reduce-scatter, scaling.step.program) the backward streams dW in chunks and holds one gathered
        matrix at a time: c·D·F/Y
    inputs  = x and targets of the batch per device, bf16 and fp32: (c + 4)·D·B/(data·fsdp)
    With microbatches (``schedule``, scaling.step.pipeline): the activations of the microbatches in flight
    (one for gradient accumulation; all T = R·M + S − 1 iterations of a pipeline) at B/(M·data·fsdp)
    tokens each; gradient accumulation adds an FP32 accumulator (accumulated = grad·P/N); a pipeline
    adds stage 0's buffer of every microbatch's input and output, c·D·B/(data·fsdp) (buffer); its
    backward loop holds the current iteration's stage gradient beside the accumulated one
    (grad_iteration = grad·P/N: the inner scan's stacked per-block gradients) and one iteration's
    residuals as the inner scan stacks them before they join the loop's stack (staging = Lc blocks'
    saved bytes of one microbatch); a circular
    schedule also holds the FP32 stacks re-laid as chunks, recomputed for the backward loop and held
    through it (relaid = master·P/N); with fsdp_gather="step" the stage's L/S blocks gathered (FP32
    holding BF16, what the forward and backward reuse): master·2·D·F·(L/S)/Y in place of the
    per-block transients. Where a chunk's blocks run as one scan trip (Lc = 1, or one pair under
    every-second remat) XLA drops the one-trip loop: no stacked per-iteration gradient (a circular
    schedule still holds the chunk's,
    grad·P/(N·R), to update its slot of the accumulator), and only that trip's blocks gathered
    (c·2·Lc·D·F/Y: nothing to prefetch). Each term is an allocation of XLA's memory-usage report
    (docs/findings.md, memory).
    total   = sum of the above.  16·P/N + activations + transients (training page: 16 B/param).
    """
    cfg, mesh, batch_tokens, remat, precision, schedule = (w.model, w.mesh, w.batch_tokens, w.remat, w.precision,
                                                           w.schedule)
    windowed_grad_rs = w.compiler.windowed_grad_rs
    shards_w = memory.weight_shards(mesh)
    S, M, Y = mesh.get("stage", 1), schedule.microbatches, shards(mesh, "mlp")
    P, D, F = cfg.params * pipeline.padding(cfg, schedule, S), cfg.d_model, cfg.d_ff  # uneven stages: S·Lmax slots
    b = memory.tokens_per_device(mesh, batch_tokens)
    c = precision.compute
    once = schedule.fsdp_gather == FsdpGather.STEP
    terms = {
        "master": precision.master * P / shards_w,
        # ZeRO-1: the moments the device's slice of its padded flat buffer (scaling.step.memory.zero1_padded); the FP32
        # gradients each data shard's partial sums, whole (ZeRO stage 1)
        "optimizer": precision.adam_moments * precision.adam_moment * memory.zero1_slice(w, P / shards_w),
        "grads": precision.grad * P / shards_w,
        "activations": pipeline.microbatches_in_flight(schedule, S) * pipeline.saved_per_token(
            cfg, mesh, remat, schedule, c) * b / M,
        "transient_weights": (precision.master * 2 * D * F * pipeline.chunk_blocks(cfg, schedule, S) / Y if once
                              else c * (1 if windowed_grad_rs else 4) * D * F / Y),
        "inputs": (c + 4) * D * b,
    }
    if prefetched := prefetched_weights(w):
        terms["prefetched"] = prefetched
    if S == 1 and (np.asarray(M) > 1).any():
        terms["accumulated"] = precision.grad * P / shards_w * (np.asarray(M) > 1)
    if S > 1:
        R, Lc = schedule.repeats, pipeline.chunk_blocks(cfg, schedule, S)
        one_trip = Lc == 1 or (remat == Remat.EVERY_SECOND and Lc == 2)  # a chunk's blocks are one scan trip
        terms["buffer"] = c * D * b
        if not once and one_trip:
            terms["transient_weights"] = c * 2 * Lc * D * F / Y  # the trip's blocks; no next block to prefetch
        if not one_trip:
            terms["grad_iteration"] = precision.grad * P / shards_w
        elif R > 1:
            terms["grad_iteration"] = precision.grad * P / shards_w / R  # the chunk's, updated into its slot
        terms["staging"] = pipeline.saved_per_token(cfg, mesh, remat, schedule, c) * b / M
        if R > 1:
            terms["relaid"] = precision.master * P / shards_w
    if np.any(zero1 := memory.zero1_update(w, terms, P / shards_w)):  # ZeRO-1's update phase, where it is the higher
        terms["zero1_update"] = zero1
    terms["total"] = sum(terms.values())
    return terms


def forward_memory_per_device(w: Workload) -> dict:
    """Memory per device of the FFN stack's forward-only step (the loss, no gradients), term by term.

    master      = master·P/(X·Y)                   fp32 weights
    transient_weights = c·D·F/Y                     one gathered bf16 weight matrix at a time
                  (with nothing saved for backward, W_in's gathered copy is dead before W_out's is made)
    activations = c·b·(F/Y + 2·D)                  one block's working set: hidden, its input and
                  output; b = B/(data·fsdp) (the loss's fp32 residual is fused into the reduction)
    inputs      = (c + 4)·D·b                      x bf16 and targets fp32
    With microbatches the working set is one microbatch's (B/(M·data·fsdp) tokens); a pipeline adds
    stage 0's buffer of the batch, and with fsdp_gather="step" the stage's weights gathered, held as BF16
    (nothing accumulates a gradient in them): c·2·D·F·(L/S)/Y in place of the one matrix.
    Source: this package's reading of the compiled forward step (docs/findings.md, memory).
    """
    cfg, mesh, batch_tokens, precision, schedule = w.model, w.mesh, w.batch_tokens, w.precision, w.schedule
    D, F, Y, c = cfg.d_model, cfg.d_ff, shards(mesh, "mlp"), precision.compute
    b = memory.tokens_per_device(mesh, batch_tokens)
    S, M = mesh.get("stage", 1), schedule.microbatches
    terms = {
        "master": precision.master * cfg.params * pipeline.padding(cfg, schedule, S) / memory.weight_shards(mesh),
        "transient_weights": (c * 2 * D * F * pipeline.chunk_blocks(cfg, schedule, S) / Y
                              if schedule.fsdp_gather == FsdpGather.STEP else c * D * F / Y),
        "activations": c * b / M * (F / Y + 2 * D),
        "inputs": (c + 4) * D * b,
    }
    if S > 1:
        terms["buffer"] = c * D * b
    if prefetched := prefetched_weights(w):
        terms["prefetched"] = prefetched
    terms["total"] = sum(terms.values())
    return terms


def prefetched_weights(w: Workload) -> float:
    """Bytes of the gathered bf16 weight matrices (c·D·F/Y each) that XLA:TPU's schedule holds beyond the ones
    in use, because their all-gathers run ahead asynchronously (w.flags.gathers, scaling.core.flags): one matrix
    within a block (the forward's W_out during h = x·W_in; the train step's next gather in its backward), two
    across blocks in the forward (block i+1's W_in and W_out during block i). 0 with synchronous gathers, no
    fsdp axis, stages or weights gathered once per step; remat none only (other policies: not yet modelled).
    Read from libtpu 0.0.42.1 programs
    (docs/findings.md, "Compiler flags")."""
    mesh, flags = w.mesh, w.flags
    if (flags.gathers == Gathers.EXPOSED or mesh["fsdp"] == 1 or mesh["stage"] > 1
            or w.schedule.fsdp_gather == FsdpGather.STEP or w.remat != Remat.NONE):  # others: not yet modelled
        return 0.0
    matrices = 2 if flags.gathers == Gathers.ACROSS_BLOCKS and w.step == Step.FORWARD else 1
    return matrices * w.precision.compute * w.model.d_model * w.model.d_ff / shards(mesh, "mlp")


def hbm_traffic_bytes(w: Workload):
    """HBM bytes one device reads and writes in a step (the memory-bandwidth roofline's numerator) of the FFN
    stack:

    train:   AdamW reads master, grad, mu, nu and writes master, mu, nu: 7·4 = 28 B/param/N;
             the gathered bf16 weights are read by the forward, dX and dW matmuls: 3·L·c·2·D·F/Y;
             saved activations are written once and read once: 2·saved_activation_bytes
    forward: the fp32 master read once, 4·P/N; the gathered weights read once, L·c·2·D·F/Y; each
             block's input and hidden written and read once, 2·c·b·(D + F/Y)·L
    (Scaling Book roofline page: T_mem = bytes moved / HBM bandwidth.)
    """
    cfg, mesh, batch_tokens, remat, step, precision = w.model, w.mesh, w.batch_tokens, w.remat, w.step, w.precision
    D, F, L, Y, c = cfg.d_model, cfg.d_ff, cfg.blocks, shards(mesh, "mlp"), precision.compute
    weights = L * c * 2 * D * F / Y
    if step == Step.FORWARD:
        b = memory.tokens_per_device(mesh, batch_tokens)
        return precision.master * cfg.params / memory.weight_shards(mesh) + weights + 2 * c * b * (D + F / Y) * L
    optimizer = precision.adam_update_bytes_per_param  # read 16 + write 12
    return (optimizer * cfg.params / memory.weight_shards(mesh) + 3 * weights
            + 2 * memory.saved_activation_bytes(cfg, mesh, batch_tokens, remat, precision))


def collective_volumes(w: Workload) -> dict[str, dict[str, float]]:
    """The FFN stack's V per device, per mesh axis, per collective kind of one step (scaling.step.program's module
    docstring, term by term; scaling.step.program.collective_volumes says what each compiler fact and schedule adds)."""
    cfg, mesh, step, precision, remat, schedule = w.model, w.mesh, w.step, w.precision, w.remat, w.schedule
    windowed_grad_rs, min_comm_bytes = w.compiler.windowed_grad_rs, w.compiler.min_comm_bytes
    D, F, L = cfg.d_model, cfg.d_ff, cfg.blocks
    X, Y, d, S = mesh["fsdp"], mesh["tensor"], mesh["data"], mesh["stage"]
    M = schedule.microbatches
    c, cw, cg = (max(b, min_comm_bytes) for b in (precision.compute, precision.weight_comm, precision.grad_comm))
    b_loc = memory.tokens_per_device(mesh, w.batch_tokens) / M  # tokens per device in one microbatch
    passes = 2 if step == Step.TRAIN else 1  # weight gathers / activation all-reduces: forward (+ backward)
    n = pipeline.block_passes(cfg, schedule, S)  # block-passes per device (M·L without stages)
    T, Ls = pipeline.iterations(schedule, S), pipeline.largest_stage(cfg, schedule, S)
    once = schedule.fsdp_gather == FsdpGather.STEP
    n_fwd = Ls if once else n  # forward gathers: one per block-pass (ffn_model.pipeline keeps XLA from hoisting them)
    n_bwd = 0 if once else n  # gathered once: the backward reuses the gathered stage
    matrix = 2 * D * F / Y  # W_in and W_out of one block, per device after the fsdp gather
    out: dict[str, dict[str, float]] = {}
    merged = w.compiler.merged_grad_allreduce and step == Step.TRAIN and d > 1 and X > 1
    zero1 = step == Step.TRAIN and schedule.optimizer_sharding == OptimizerSharding.ZERO1 and d > 1
    merged = merged and not zero1
    if X > 1:
        out["fsdp"] = {"all-gather": (n_fwd + (n_bwd if step == Step.TRAIN else 0)) * cw * matrix}
        if step == Step.TRAIN and windowed_grad_rs:
            out["fsdp"]["collective-permute"] = n * cg * matrix * (X + 1) / X
        elif step == Step.TRAIN and not merged:
            out["fsdp"]["reduce-scatter"] = n * cg * matrix
    if Y > 1:
        # backward skips block 0's dx all-reduce where the program drops that dead dx (flops.first_block_dx_computed;
        # a pipeline computes every pass's dx: stage 0's input buffer also holds the last stage's outputs)
        dead = step == Step.TRAIN and S == 1 and not flops.first_block_dx_computed(L, remat)
        if schedule.sequence_parallel:
            # Megatron SP: forward all-gathers x over tensor and reduce-scatters y; backward all-gathers x again
            # (recomputed: only the token split is saved) and dy, and reduce-scatters dx. Each moves the group's
            # full activation, V = c·b·D (sharding page: V of an all-gather is the gathered array).
            gathers = 3 * n if step == Step.TRAIN else n
            out["tensor"] = {"all-gather": gathers * c * b_loc * D,
                             "reduce-scatter": (passes * n - M * dead) * c * b_loc * D}
        else:
            out["tensor"] = {"all-reduce": (passes * n - M * dead) * c * b_loc * D}
    if zero1:  # each data shard's partial gradients, the device's flat buffer reduce-scattered over data, the
        # updated FP32 weights all-gathered (ffn_model.zero1): N_pad = the stage's P/(S·X·Y) padded (uneven: S·Lmax)
        held = cfg.params * pipeline.padding(cfg, schedule, S) / (S * X * Y)
        out.update(collectives.zero1_volumes(memory.zero1_padded(held, d), cg, precision.master))
    elif merged:
        out["data+fsdp"] = {"all-reduce": n * cg * matrix}
    elif d > 1 and step == Step.TRAIN:
        out["data"] = {"all-reduce": n * cg * matrix / X}
    if S > 1:
        # each iteration's output moves one stage on (backward: back)
        out["stage"] = {"collective-permute": passes * T * c * b_loc * D,
                        "all-reduce": 4.0}  # the loss: the stages' masked sum
        if schedule.repeats > 1:  # circular: the FP32 stacks re-laid so stage s holds chunks s, S+s, ...,
            # in rounds of one chunk (pipeline.relay_rounds): forward, the gradient back, and again for the
            # backward where XLA re-lays them rather than keep them (``circular_relays``)
            relays = w.compiler.circular_relays if step == Step.TRAIN else 1
            chunk = precision.master * pipeline.chunk_blocks(cfg, schedule, S) * matrix / X
            out["stage"]["collective-permute"] += relays * pipeline.relay_moves(S, schedule.repeats) * chunk
    loss_axes = ("data", "fsdp", "tensor") if schedule.sequence_parallel else ("data", "fsdp")
    if zero1:  # each data shard's loss (ffn_model.zero1.data_partials), their mean over data once
        loss_axes = loss_axes[1:]
        out["data"]["all-reduce"] = 4.0
    if any(mesh[a] > 1 for a in loss_axes):  # the loss: mean over the batch (each microbatch's with accumulation)
        key = "+".join(a for a in loss_axes if mesh[a] > 1)
        out.setdefault(key, {})
        out[key]["all-reduce"] = out[key].get("all-reduce", 0.0) + 4 * (M if S == 1 else 1)
    return out


# XLA:TPU rotates a scanned loop of FFN blocks (gathers across blocks, scaling.core.flags) only when it runs at least
# this many trips; a loop of fewer is unrolled (libtpu 0.0.42.1: 2 trips unrolled, 3 rotated; docs/findings.md).
ROTATED_MIN_TRIPS = 3


def forward_trips(w: Workload) -> int:
    """Trips of the forward scan over the FFN blocks: L, or L//2 pairs under every-second remat (its odd last
    block, L%2, runs after the loop)."""
    L = w.model.blocks
    return L // 2 if w.remat == Remat.EVERY_SECOND else L


def exposed_gathers(w: Workload) -> tuple[int, int]:
    """(forward, backward) weight all-gathers per microbatch that XLA:TPU's schedule under w.flags.gathers
    (scaling.core.flags) leaves exposed, of the FFN stack's 2·L each way; P = forward_trips(w), rotated = P >= 3
    (ROTATED_MIN_TRIPS). Read from libtpu 0.0.42.1 programs
    (docs/findings.md, "Compiler flags"):
      exposed        2·L, 2·L
      within-block   forward: the first gather of each trip (P + L%2; full remat: 2·L); backward: 0
      across-blocks  rotated: the first trip's gathers, peeled out of the loop (2; every-second: the first
                     pair's 4, + L%2); full remat: also one per block of the backward's recompute (L). Not
                     rotated (unrolled): only the first gather (1; every-second 1 + L%2; full: 1, L)."""
    L, P, remat, g = w.model.blocks, forward_trips(w), w.remat, w.flags.gathers
    if g == Gathers.EXPOSED:
        return 2 * L, 2 * L
    if g == Gathers.WITHIN_BLOCK:
        return (2 * L if remat == Remat.FULL else P + (L % 2 if remat == Remat.EVERY_SECOND else 0)), 0
    rotated = P >= ROTATED_MIN_TRIPS
    if remat == Remat.EVERY_SECOND:
        return (4 if rotated else 1) + L % 2, 0
    return (2 if rotated else 1), (L if remat == Remat.FULL else 0)


def overlapped_volumes(w: Workload, vols: dict | None = None) -> dict[str, dict[str, float]]:
    """The part of collective_volumes(w) that XLA:TPU's schedule runs behind matmuls under the workload's flags
    (w.flags, scaling.core.flags), per axis and kind; the rest is exposed. The FFN stack without stages, per
    microbatch, with m = cw·D·F/Y one gathered matrix and (f, b) = exposed_gathers(w):
      gathers   (2·L − f)·m forward, (2·L − b)·m backward (train)
      windowed gradient reduce-scatter: all of it, but where the flags leave the last hop of one ring exposed
                        (rs_last_hop_exposed): one chunk cg·m/X per forward scan trip (under full remat the
                        recomputed forward's matmuls hide it too)
    Tensor, data and stage collectives stay synchronous under every set. Stages: only the windowed
    reduce-scatter counts as hidden (not yet modelled; the check shows the residual). ``vols``:
    collective_volumes(w), where the caller has it."""
    vols = collective_volumes(w) if vols is None else vols
    if "fsdp" not in vols:
        return {}
    cfg, mesh, schedule, precision = w.model, w.mesh, w.schedule, w.precision
    X, Y, M, L = mesh["fsdp"], mesh["tensor"], schedule.microbatches, cfg.blocks
    cw, cg = (max(b, w.compiler.min_comm_bytes) for b in (precision.weight_comm, precision.grad_comm))
    m_w, m_g = cw * cfg.d_model * cfg.d_ff / Y, cg * cfg.d_model * cfg.d_ff / Y
    trips = forward_trips(w) + (L % 2 if w.remat == Remat.EVERY_SECOND else 0)  # the odd last block's pass too
    fsdp, out = vols["fsdp"], {}
    if Collective.COLLECTIVE_PERMUTE in fsdp:
        last_hop = w.flags.rs_last_hop_exposed and w.remat != Remat.FULL
        out["collective-permute"] = fsdp["collective-permute"] - (M * trips * m_g / X if last_hop else 0.0)
    if mesh["stage"] == 1 and schedule.fsdp_gather == FsdpGather.MICROBATCH and w.flags.gathers != Gathers.EXPOSED:
        fwd, bwd = exposed_gathers(w)
        out["all-gather"] = M * ((2 * L - fwd) + (2 * L - bwd if w.step == Step.TRAIN else 0)) * m_w
    return {"fsdp": out} if out else {}


def loop_copy_bytes(w: Workload) -> float:
    """Bytes the loops copy per step: the rotated forward loop's gathered weights (rotated_copy_bytes) plus gradient
    accumulation's copies of the zero-initialized gradient stacks (accumulation_copy_bytes)."""
    return rotated_copy_bytes(w) + accumulation_copy_bytes(w)


def rotated_copy_bytes(w: Workload) -> float:
    """Bytes the rotated forward loop of across-blocks gathers (scaling.core.flags) copies into its state per step, on
    the FFN stack without stages: the two gathered matrices of every trip but the first, M·2·(P − 1)·cw·D·F/Y
    (P = forward_trips(w); every-second: two per pair); 0 where the loop is not rotated (P < ROTATED_MIN_TRIPS)
    and for other flag sets. Read from libtpu 0.0.42.1 programs."""
    P = forward_trips(w)
    if (w.flags.gathers != Gathers.ACROSS_BLOCKS or w.mesh["fsdp"] == 1
            or w.mesh["stage"] > 1 or w.schedule.fsdp_gather == FsdpGather.STEP or P < ROTATED_MIN_TRIPS):
        return 0.0
    return (w.schedule.microbatches * 2 * (P - 1) * w.precision.weight_comm
            * w.model.d_model * w.model.d_ff / w.mesh["tensor"])


def accumulation_copy_bytes(w: Workload) -> float:
    """Gradient accumulation's copies of the zero-initialized FP32 gradient stacks, per step: each microbatch's
    backward scan writes its stacked weight gradients into fresh zero buffers, which XLA's CSE merges where stacks
    share a shape, copying the one buffer for every further stack (verify.hlo.HloProgram.stack_copies, kind
    "zeros"). W_in and W_out are both [L, F, D]: one copy of a stack per microbatch,
    M·(k − 1)·g·L·D·F/(X·Y) with k = 2 stacks, g = 4 B (Precision.grad); 0 without accumulation (M = 1, a train
    step only, no stage axis). Read from XLA:GPU (gpu:H100:1) and XLA:CPU programs, jax 0.10.2:
    docs/findings.md, "The layer loop's copies on XLA:GPU (issue 39)"."""
    cfg, mesh = w.model, w.mesh
    stack = w.precision.grad * cfg.blocks * cfg.d_model * cfg.d_ff / (mesh["fsdp"] * mesh["tensor"])
    return accumulation_copies(w, (2 - 1) * stack)


def pair_slice_copy_bytes(w: Workload) -> float:
    """XLA:GPU's copies of each every-second pair-pass's FP32 weights out of the stacks, per step: the pair scan
    keeps jax.checkpoint's optimization barrier (ffn_model.model: without it XLA:TPU's 'overlap' schedule exposes
    more), so XLA:GPU copies W_in and W_out of the pair [1, 2, F, D] out of their stacks every backward pair-pass
    (verify.hlo.HloProgram.stack_copies, kind "slice"): all the FP32 weights once a microbatch, M·g·2·2P·D·F/(X·Y)
    (P = L // 2 pairs, g = 4 B), where the pair scan runs at least 2 trips (one is inlined); 0 otherwise and off
    XLA:GPU (not in loop_copy_bytes, which the TPU check reads). Read from gpu:H100:1, jax 0.10.2: docs/findings.md,
    "The layer loop's copies on XLA:GPU (issue 39)"."""
    cfg, mesh, pairs = w.model, w.mesh, w.model.blocks // 2
    if w.remat != Remat.EVERY_SECOND or pairs < 2:
        return 0.0
    return accumulation_copies(w, w.precision.grad * 2 * 2 * pairs * cfg.d_model * cfg.d_ff
                               / (mesh["fsdp"] * mesh["tensor"]), every_m=True)


def block_slice_copy_bytes(w: Workload) -> float:
    """XLA:GPU's copies of each backward block-pass's FP32 weights out of the stacks, per step, outside every-second
    remat (pair_slice_copy_bytes): the FFN's block scan keeps jax.checkpoint's optimization barrier (ffn_model.model:
    without it XLA:TPU's 'overlap' schedule of the XXL leaves 0.21 of the closed form's exposed fsdp bytes exposed),
    so XLA:GPU copies W_in and W_out of each block [1, F, D] out of their stacks every backward block-pass
    (verify.hlo.HloProgram.stack_copies, kind "slice"): M·g·2·L·D·F/(X·Y) (g = 4 B), where the scan runs at least 2
    trips; 0 otherwise and off XLA:GPU (not in loop_copy_bytes, which the TPU check reads). Read from gpu:H100:1."""
    cfg, mesh = w.model, w.mesh
    if w.remat == Remat.EVERY_SECOND or cfg.blocks < 2 or w.step != Step.TRAIN:
        return 0.0
    return accumulation_copies(w, w.precision.grad * 2 * cfg.blocks * cfg.d_model * cfg.d_ff
                               / (mesh["fsdp"] * mesh["tensor"]), every_m=True)


def accumulation_copies(w: Workload, per_microbatch, every_m: bool = False) -> float:
    """M·``per_microbatch`` bytes where this package's train step (Precision.accumulation "package"; a PyTorch
    runtime's accumulation copies nothing of the kind) accumulates gradients over M > 1 microbatches without a stage
    axis (scaling.core.schedule.Schedule: the train step's scan over microbatches; ``every_m``: at M = 1 too), else 0; M
    may be the planner's array."""
    M, mesh = w.schedule.microbatches, w.mesh
    if w.step != Step.TRAIN or w.precision.accumulation != "package" or np.all(np.asarray(mesh["stage"]) > 1):
        return 0.0
    out = np.where(((np.asarray(M) > 1) | every_m) & (np.asarray(mesh["stage"]) == 1), np.asarray(M) * per_microbatch,
                   0.0)
    return float(out) if np.ndim(out) == 0 else out


def step_flops(w: Workload) -> dict:
    """The FFN stack's matmul FLOPs per device, term by term, and "model" (scaling.step.program.step_flops_per_device
    says how: flops.step_flops(B)/N without stages, the chunk's on B/M tokens T times with them)."""
    cfg, mesh, batch_tokens, step, remat, schedule = w.model, w.mesh, w.batch_tokens, w.step, w.remat, w.schedule
    S = mesh["stage"]
    plain = flops.step_flops(cfg, batch_tokens, step, remat,
                             first_block_input_grad=flops.first_block_dx_computed(cfg.blocks, remat))
    model = flops.flops_per_device(plain["total"] - plain.get("recompute", 0.0)
                                   - plain.get("first_block_input_grad", 0.0), mesh)
    if S == 1:
        f = {k: flops.flops_per_device(v, mesh) for k, v in plain.items()}
    else:
        chunk = cfg.replace(blocks=pipeline.chunk_blocks(cfg, schedule, S))
        per = pipeline.iterations(schedule, S) / schedule.microbatches / (mesh["data"] * mesh["fsdp"] * mesh["tensor"])
        f = {k: v * per
             for k, v in flops.step_flops(chunk, batch_tokens, step, remat, first_block_input_grad=True).items()}
    f["model"] = model
    return f


def step_kernels(w: Workload) -> list[Kernel]:
    """The FFN stack's kernels: per block-pass h = relu(x·W_inᵀ) [b, D]·[D, F/Y] and y = h·W_out [b, F/Y]·[F/Y, D]
    on b = B/(M·data·fsdp) tokens; backward dX and dW of each; the program's FLOP terms (scaling.step.flops.step_flops,
    step_flops) spread over those shapes; relu's pass c·F/Y a token (forward,
    recompute), twice backward; AdamW."""
    cfg, mesh, c = w.model, w.mesh, w.precision.compute
    D, F, Y, M = cfg.d_model, cfg.d_ff, mesh["tensor"], w.schedule.microbatches
    b = memory.tokens_per_device(mesh, w.batch_tokens) / M
    f = step_flops(w)  # the FLOPs the program runs (one definition)
    one = 2 * b * D * F / Y  # one matmul of one block-pass
    n = pipeline.block_passes(cfg, w.schedule, mesh["stage"])  # block-passes per device
    ks = []

    def pair(pass_, total, shapes):
        calls = total / one
        for name, (mm, nn, kk) in shapes:
            ks.append(matmul_kernel(name, pass_, mm, nn, kk, calls / len(shapes), c, flops_=total / len(shapes)))

    pair("forward", f["forward"], (("w_in", (b, F / Y, D)), ("w_out", (b, D, F / Y))))
    if w.step == Step.TRAIN:
        pair("backward", f["backward_weights"], (("w_in.dw", (D, F / Y, b)), ("w_out.dw", (F / Y, D, b))))
        dx = f["backward_inputs"] + f.get("first_block_input_grad", 0.0)
        pair("backward", dx, (("w_in.dx", (b, D, F / Y)), ("w_out.dx", (b, F / Y, D))))
        if (np.asarray(f.get("recompute", 0.0)) > 0).any():
            pair("recompute", f["recompute"], (("w_in", (b, F / Y, D)),))
    act = 2 * c * b * F / Y  # relu: read h, write relu(h)
    ks.append(Kernel("relu", "forward", "pointwise", None, n, 0.0, n * act))
    copies = block_slice_copy_bytes(w) + pair_slice_copy_bytes(w)  # XLA:GPU's, each read and written
    if np.any(np.asarray(copies) > 0):
        ks.append(Kernel("slice_copies", "backward", "pointwise", None, 2 * n, 0.0, 2 * copies, only=Platform.GPU))
    if w.step == Step.TRAIN:
        ks.append(Kernel("relu", "backward", "pointwise", None, n, 0.0, 2 * n * act))
        rec = np.asarray(f.get("recompute", 0.0)) / one
        ks.append(Kernel("relu", "recompute", "pointwise", None, rec, 0.0, rec * act))
        ks += [adamw_kernel(w, cfg.params), accumulate_kernel(w, cfg.params)]
    return ks
