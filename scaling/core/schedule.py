"""How one step runs its batch (Schedule: microbatches, pipeline repeats and schedule, fsdp gathers, sequence
parallelism, attention, the optimizer's sharding) and the rules every model family shares for it; a family's
own rules are its check_schedule and check_batch_split (scaling.core.family). saved_blocks: what a remat policy
keeps of a stack of blocks. Pure Python and numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scaling.core.inputs import positive_int, positive_ints, validated_copy
from scaling.core.mesh_shape import spans
from scaling.core.policies import (Attention, ContextStrategy, FsdpGather, OptimizerSharding, Pipeline, Remat,
                                   check_remat, choose)


# The attention kernel each platform's production code runs (Schedule.attention "auto"): MaxText's splash on TPUs
# (layers/attention_op.py, attention=flash on TPU is splash), cuDNN's fused attention on GPUs (MaxText's
# cudnn_flash_te / jax.nn.dot_product_attention(implementation="cudnn")), the package's own flash elsewhere
AUTO_ATTENTION = {"tpu": "splash", "gpu": "cudnn", "cuda": "cudnn", "rocm": "flash", "cpu": "flash"}
# The kernels that run attention by key blocks with an online softmax, saving o and the FP32 logsumexp and recomputing
# the scores in the backward (FlashAttention-2's form): the package's flash, and the libraries' splash and cuDNN
BLOCKWISE = ("flash", "splash", "cudnn")
# Splash's blocks as MaxText sets them (ffn_model.attention.SPLASH_BLOCK: every block 512, capped at T)
SPLASH_BLOCK = 512


def attention_for(platform: str, seq_len: int | None = None) -> str:
    """The attention "auto" takes on ``platform`` (AUTO_ATTENTION; a platform not listed: flash, the portable one);
    splash only where it tiles ``seq_len`` (blocks of min(512, T), a multiple of 128 lanes: MaxText's block sizes;
    flash otherwise, as the portable kernel)."""
    kernel = AUTO_ATTENTION.get(str(platform).lower(), "flash")
    if kernel == Attention.SPLASH and seq_len is not None:
        b = min(SPLASH_BLOCK, seq_len)
        if seq_len % b or b % 128:
            return "flash"
    return kernel


def key_block(schedule: "Schedule", keys) -> float:
    """The key block b of a blockwise kernel over ``keys`` keys: cuDNN's 128 (its FlashAttention-2 tile), flash's and
    splash's attention_block (splash's default SPLASH_BLOCK, MaxText's; its sa_block_* where a recipe sets them),
    capped at the keys; the keys (one block) otherwise."""
    block = 128 if schedule.attention == Attention.CUDNN else schedule.attention_block
    return np.minimum(block, keys)


def runs_flash(schedule: "Schedule", mesh: Mapping):
    """Whether the program's attention is flash-like (ffn_model.transformer.attention): --attention flash, splash or
    cudnn (BLOCKWISE), or ring over a context axis (flash per chunk); without a context axis the strategy is unused.
    Element-wise on numpy arrays of schedules and meshes (the planner's)."""
    attention = schedule.attention
    blockwise = attention in BLOCKWISE if isinstance(attention, str) else np.isin(np.asarray(attention), BLOCKWISE)
    if blockwise is True or (isinstance(schedule.context, str) and schedule.context != ContextStrategy.RING):
        return blockwise  # one attention for every candidate (the planner's common case): no array work
    return blockwise | (spans(mesh.get("context", 1)) & np.asarray(schedule.context == ContextStrategy.RING))


def saved_blocks(blocks: int, remat: str) -> tuple[int, int]:
    """(blocks that save input and hidden, blocks that save only their input) under a remat policy.

    none: every block keeps x and h. full: every block keeps only x (h is recomputed).
    every-second: blocks are taken in pairs (first checkpointed, second not); an odd last block is
    checkpointed: floor(L/2) full, ceil(L/2) input-only.
    """
    check_remat(remat)
    if remat == Remat.NONE:
        return blocks, 0
    if remat == Remat.FULL:
        return 0, blocks
    return blocks // 2, blocks - blocks // 2


@dataclass(frozen=True)
class Schedule:
    """How one train step runs its batch (Scaling Book applied-training page; MaxText's pipeline):

    microbatches M  the batch in M microbatches of B/M tokens. Without a stage axis: gradient
                    accumulation (M forward/backward passes, one optimizer update, one microbatch's
                    activations live at a time). With stage > 1: the pipeline's microbatches.
    repeats R       circular (interleaved) pipeline: each stage holds R non-adjacent chunks of
                    L/(S·R) blocks (stage s holds chunks s, S+s, 2S+s, ...; uneven: blocks_per_chunk); R = 1 is
                    GPipe.
    fsdp_gather     "microbatch": every block gathers its weights over fsdp each time it runs (per
                    microbatch, per pipeline iteration); "step": a stage gathers all its weights once
                    per step and keeps them for every microbatch (pipeline only).
    sequence_parallel  Megatron sequence parallelism (Korthikanti et al. 2022) on the tensor axis:
                    between blocks the activations are split over tensor along the tokens; an
                    all-gather before the first matmul and a reduce-scatter after the last replace the
                    tensor all-reduce, and the saved block inputs shrink by Y.
    attention       (transformer) "materialized": the T×S scores and probabilities as arrays;
                    "flash": key blocks of ``attention_block`` in a scan with an online softmax, memory
                    O(T·block) (ffn_model.attention); "splash": jax's Pallas splash kernel (TPU, MaxText's; blocks
                    of ``attention_block``, MaxText's 512 by default, the causal blocks above the diagonal skipped;
                    ``splash_fused_backward``: one backward kernel for dq, dk and dv, MaxText's
                    sa_use_fused_bwd_kernel, instead of a dq and a dkv kernel); "cudnn": cuDNN's fused attention (GPU);
                    "auto": the platform's (attention_for), resolved by Schedule.on where the platform is known.
    context         (transformer, with a context axis) "ulysses": all-to-all from sequence-split to
                    head-split and back around the attention; "ring": K/V chunks passed round the
                    context axis with ppermute, future chunks skipped.
    pipeline        (with a stage axis) "gpipe", "circular" (repeats > 1; set by repeats > 1 alone) or "1f1b":
                    a forward and a backward slot in every iteration, each stage's activations bounded by the
                    microbatches in flight (at most 2·R·S − 1 stage inputs), not by M (transformer only);
                    with repeats R > 1 the interleaved 1F1B (Megatron's virtual stages: R chunks per stage).
    warmup_phases   (1F1B) the first and last R·S − 1 iterations in loops of their own with one slot each (no
                    backward item is ready before, no forward item is left after): Megatron's bubble
                    (S − 1)/(R·M) instead of the one loop's lock-step (R·S + S − 2)/(R·M); XLA:GPU copies the
                    gradient accumulators from one loop to the next (docs/findings.md).
    optimizer_sharding  "fsdp": the FP32 weights, gradients and Adam moments sharded over fsdp·tensor,
                    replicated over data; "zero1" (ZeRO stage 1, Rajbhandari et al. 2020; Megatron-LM's
                    distributed optimizer): each device's gradients, moments and update as one flat buffer
                    padded to a multiple of 128·data and split evenly over data; the BF16 gradients
                    reduce-scattered over data, AdamW on the slice, the updated FP32 weights all-gathered over
                    data (the weights, this package's FP32 masters, stay replicated over data: the forward
                    reads them). Any data size, any schedule (ffn_model.zero1).
    stage_blocks    (with a stage axis) the blocks of each stage, first to last, summing to L (Megatron-LM's
                    --decoder-first/last-pipeline-num-layers, DeepSpeed's partition_method as a list); with repeats
                    R > 1 either that (each stage's L_s split over its R chunks: blocks_per_chunk) or S·R counts, one
                    a chunk in the order the blocks run (chunk c = r·S + s on stage s: Megatron-LM's
                    --pipeline-model-parallel-layout); None: the default rule (default_stage_blocks over the S
                    stages, or over the S·R chunks). Uneven stages or chunks run as a padded stack of S·R·Cmax slots
                    (Cmax the largest chunk's blocks; R = 1: the largest stage's; ffn_model.pipeline.padded_slots).
    """

    microbatches: int = 1
    repeats: int = 1
    fsdp_gather: FsdpGather = FsdpGather.MICROBATCH
    sequence_parallel: bool = False
    attention: Attention = Attention.MATERIALIZED
    context: ContextStrategy = ContextStrategy.ULYSSES
    attention_block: int = 512
    optimizer_sharding: OptimizerSharding = OptimizerSharding.FSDP
    pipeline: Pipeline = Pipeline.GPIPE
    warmup_phases: bool = False
    stage_blocks: tuple[int, ...] | None = None
    splash_fused_backward: bool = False

    def __post_init__(self):
        positive_ints("microbatches", self.microbatches)  # the planner passes a numpy array of candidates
        positive_int("repeats", self.repeats)
        for name, kind, what in (("fsdp_gather", FsdpGather, "fsdp_gather"), ("attention", Attention, "attention"),
                                 ("context", ContextStrategy, "context strategy"),
                                 ("optimizer_sharding", OptimizerSharding, "optimizer sharding"),
                                 ("pipeline", Pipeline, "pipeline schedule")):
            object.__setattr__(self, name, choose(kind, getattr(self, name), what))
        if self.repeats > 1 and self.pipeline == Pipeline.GPIPE:  # GPipe's loop over more than one chunk per stage
            object.__setattr__(self, "pipeline", Pipeline.CIRCULAR)
        if self.pipeline == Pipeline.CIRCULAR and self.repeats == 1:
            raise ValueError("a circular pipeline needs repeats > 1 (chunks per stage); repeats=1 is gpipe")
        if not isinstance(self.warmup_phases, bool):
            raise ValueError(f"warmup_phases must be True or False, got {self.warmup_phases!r}")
        if self.warmup_phases and self.pipeline != Pipeline.ONE_F_ONE_B:
            raise ValueError("warmup_phases is the 1f1b schedule's (its forward-only warm-up and backward-only "
                             "cool-down)")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        positive_int("attention_block", self.attention_block)
        if not isinstance(self.splash_fused_backward, bool):
            raise ValueError(f"splash_fused_backward must be True or False, got {self.splash_fused_backward!r}")
        if self.splash_fused_backward and self.attention not in (Attention.SPLASH, Attention.AUTO):
            raise ValueError(f"splash_fused_backward is splash's (one backward kernel for dq, dk, dv), not attention "
                             f"{self.attention}'s")
        if self.stage_blocks is not None:
            blocks = tuple(self.stage_blocks)
            if not blocks or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in blocks):
                raise ValueError(f"stage_blocks={','.join(map(str, blocks))} must list a positive block count for "
                                 "every stage (e.g. 3,2)")
            object.__setattr__(self, "stage_blocks", tuple(int(b) for b in blocks))

    def with_microbatches(self, microbatches) -> "Schedule":
        """This schedule with ``microbatches`` (an int, or the planner's array of candidates) in place of its own:
        the count validated, the rest (validated when this schedule was built) not again; the planner makes
        thousands of such copies a plan."""
        return validated_copy(self, microbatches=positive_ints("microbatches", microbatches))

    def on(self, platform: str, seq_len: int | None = None) -> "Schedule":
        """This schedule with attention "auto" replaced by ``platform``'s kernel for ``seq_len`` (attention_for); else
        itself."""
        if self.attention != Attention.AUTO:
            return self
        return dataclasses.replace(self, attention=attention_for(platform, seq_len))

    def check(self, cfg, mesh: Mapping, batch_tokens: int | None = None) -> "Schedule":
        """ValueError naming the input when the schedule cannot run ``cfg`` on ``mesh``: stage_blocks one count a
        stage (or with repeats R > 1 a chunk) summing to L, every stage (and chunk) at least one block, a circular
        pipeline needs at least as many microbatches as stages, B must split into M microbatches over data·fsdp;
        ``cfg``'s family adds its own (cfg.check_schedule before these, cfg.check_batch_split after them;
        scaling.core.family)."""
        S, M, R, L = mesh.get("stage", 1), self.microbatches, self.repeats, cfg.pipeline_blocks
        cfg.check_schedule(self, mesh, batch_tokens)  # the family's own rules, before the shared ones
        if self.stage_blocks is not None:
            given = ",".join(map(str, self.stage_blocks))
            chunked = R > 1 and S > 1  # a count a stage, or one a chunk
            if len(self.stage_blocks) not in ((S, S * R) if chunked else (S,)):
                raise ValueError(f"stage_blocks={given} lists {len(self.stage_blocks)} stages; the mesh has stage={S}"
                                 + (f" (with repeats={R}: {S} stages or {S * R} chunks)" if chunked else ""))
            if sum(self.stage_blocks) != L:
                raise ValueError(f"stage_blocks={given} sums to {sum(self.stage_blocks)}, not blocks={L}")
            if R > 1 and len(self.stage_blocks) == S and min(self.stage_blocks) < R:
                raise ValueError(f"stage_blocks={given}: with repeats={R} every stage needs at least {R} blocks (one "
                                 "a chunk)")
        elif R > 1 and S > 1 and L < S * R:
            raise ValueError(f"blocks={L} cannot fill the {S * R} chunks of stage={S}, repeats={R} (every chunk needs "
                             f"at least one block); use repeats <= {max(L // S, 1)}")
        elif L < S:
            raise ValueError(f"blocks={L} cannot fill stage={S} (every stage needs at least one block); use "
                             f"stage <= {L}")
        if self.pipeline == Pipeline.ONE_F_ONE_B and S == 1:
            raise ValueError("the 1f1b schedule needs a stage axis (stage > 1 in the mesh)")
        if self.pipeline == Pipeline.ONE_F_ONE_B and not cfg.runs_1f1b:
            raise ValueError(f"the 1f1b schedule is built for the transformer; the {cfg.noun} runs gpipe or circular")
        if R > 1 and S == 1:
            raise ValueError(f"repeats={R} needs a stage axis (circular pipeline); without one use repeats=1")
        if R > 1 and (np.asarray(M) < S).any():
            raise ValueError(f"a circular pipeline (repeats={R}) needs microbatches >= stages: {M} < {S}")
        if self.fsdp_gather == FsdpGather.STEP and S == 1:
            raise ValueError("fsdp_gather='step' (weights gathered once per step) is for pipelined stages: "
                             "without a stage axis every microbatch gathers them")
        if self.sequence_parallel and mesh.get("tensor", 1) == 1:
            raise ValueError("sequence_parallel splits the activations over the tensor axis; the mesh has none "
                             "(give tensor > 1 in the mesh, or leave sequence parallelism off)")
        cfg.check_batch_split(self, mesh, batch_tokens)  # the family's split of the batch, after them
        return self

    def blocks_per_stage(self, blocks: int, stages: int, cfg=None) -> tuple[int, ...]:
        """The blocks of each stage: stage_blocks if given per stage, else default_stage_blocks(L, S, ends), ends = 1
        where ``cfg`` has an embedding and an output layer (a vocabulary), else 0; with repeats R > 1 the sums of
        its chunks' (blocks_per_chunk: stage s holds chunks s, S + s, ...); (L,) without stages."""
        if stages == 1:
            return (blocks,)
        if self.repeats > 1:
            chunks = self.blocks_per_chunk(blocks, stages, cfg)
            return tuple(sum(chunks[s::stages]) for s in range(stages))
        if self.stage_blocks is not None:
            return self.stage_blocks
        return default_stage_blocks(blocks, stages, pipeline_ends(cfg))

    def blocks_per_chunk(self, blocks: int, stages: int, cfg=None) -> tuple[int, ...]:
        """The blocks of each of the S·R chunks in the order the blocks run, chunk c = r·S + s on stage s (its r-th):
        stage_blocks if it lists S·R; if it lists S, stage s's L_s split over its R chunks as DeepSpeed's uniform
        (floor(L_s/R) each, the first L_s mod R one more; Megatron-LM asks R to divide L_s); else
        default_stage_blocks(L, S·R, ends) (Megatron-LM's --account-for-embedding/loss-in-pipeline-split with virtual
        stages, Megatron-Bridge's option for large vocabularies: L + 2 items over the S·R chunks, the first chunk and
        the last one fewer; Llama 3.1 405B's 126 layers on PP 8, VP 8, NVIDIA's dgxc-benchmarking recipe: 1, 2 (x62),
        1). R = 1: blocks_per_stage; (L,) without stages."""
        S, R = stages, self.repeats
        if S == 1 or R == 1:
            return self.blocks_per_stage(blocks, stages, cfg)
        given = self.stage_blocks
        if given is not None and len(given) == S * R:
            return given
        if given is not None:
            return tuple(given[s] // R + (r < given[s] % R) for r in range(R) for s in range(S))
        return default_stage_blocks(blocks, S * R, pipeline_ends(cfg))


def runs_attention(cfg) -> bool:
    """Whether ``cfg``'s step runs attention: its family takes the Schedule's attention field (ModelFamily's
    schedule_flags, its command-line vocabulary), not its type."""
    return "attention" in cfg.schedule_flags


def pipeline_ends(cfg) -> int:
    """1 where ``cfg`` has an embedding and an output layer (a vocabulary), each counted as a block on the first and
    the last stage (Megatron-LM's --account-for-embedding/loss-in-pipeline-split), else 0 (an FFN stack, no
    vocabulary, or no model given)."""
    return 1 if cfg is not None and cfg.vocab else 0


def default_stage_blocks(blocks: int, stages: int, ends: int = 0) -> tuple[int, ...]:
    """The default split of L blocks over S stages: DeepSpeed's partition_method "uniform"
    (deepspeed/runtime/utils.py partition_uniform: L + 2·ends items in S parts of floor((L + 2e)/S), the first
    (L + 2e) mod S parts one more) with the embedding and the output layer counted as one block each on the
    first and last stage when ``ends`` = 1 (Megatron-LM's --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split; BLOOM-176B: 70 + 2 = 72 = 12·6, so 5, 6, ..., 6, 5; Llama 3 405B's
    126 layers on 16 stages: one fewer on the first and the last, Dubey et al. 2024, section 3.3.2). Where that
    leaves a stage without a block, the L blocks alone (ends = 0). L divisible by S: L/S each (no padding)."""
    if blocks % stages == 0:
        return (blocks // stages,) * stages
    n = blocks + 2 * ends
    parts = [n // stages + (1 if s < n % stages else 0) for s in range(stages)]
    parts[0] -= ends
    parts[-1] -= ends
    if min(parts) < 1 and ends:
        return default_stage_blocks(blocks, stages, 0)
    return tuple(parts)
