"""The transformer stack as a model family (scaling.core.family.ModelFamily): its config (TransformerConfig, with
MLP_KINDS and BLOCK_KINDS), its rules, and its closed forms as ffn_model.transformer compiles it: matmul FLOPs,
collective volumes per mesh axis, memory per device, the step's kernels, term by term.

Notation (Scaling Book transformers page): B tokens (B/T sequences of T), D, F, L, N query heads, K kv
heads, H head dim, m MLP matrices (2; 3 gated); mesh X = fsdp, Y = tensor, C = context, d = data.
Per device: s = B/(T·d·X) sequences, t = s·T/C tokens. c = 2 bytes (BF16 activations and weights on
the wire), 4 bytes FP32.

One layer, per device (module docstring of ffn_model.transformer):
  matmuls   qkv 2·t·D·H·(N+2K)/Y, out 2·t·N·H·D/Y, mlp 2·t·D·F·m/Y      (forward; backward 2x)
  attention 4·s·T²·N·H/(Y·C) forward: q·kᵀ and p·v over every key, the causal half masked, not
            skipped (Ulysses: N/(Y·C) heads over the whole sequence; ring: C chunks of T/C keys, the
            future ones inside a cond that a static count of the program takes, while at run time
            device i computes i+1 of them); backward 8 units (materialized: dv, dp, dq, dk from the
            saved probabilities) or 10 (flash: the scores recomputed). Splash and cuDNN visit only the
            causal block pairs, nb·(nb + 1)/2 of nb² (attention_shares), splash's backward 14 units (its dq
            and dkv kernels each recompute s and dp); their FLOPs run inside custom calls (step_flops "kernels")
  local     a window W (cfg.window, every layer or all but each global_every-th): materialized masks it and
            runs every pair; flash runs c + 1 key blocks per query block, c = ceil((W − 1)/b): the units
            scaled by attention_shares (model FLOPs: T·W − W·(W − 1)/2 pairs for T²/2)
  qk-norm   (cfg.qk_norm) an RMSNorm over H on each head's q and k after they are saved: no FLOPs of a matmul, its
            passes pointwise (qk_norm_kernels), recomputed in every train step's backward
  MLA       (cfg.kv_lora_rank; DeepSeek-V2 section 2.1) qkv 2·t·(D·R + (r_q·N·qk + r_kv·N·(H + H_v))/Y) with R = r_q
            + r_kv + H_r (W_q 2·t·D·N·qk/Y without a q rank), its W_d gradient 2·t·D·R/Y (made on its tensor split);
            the attention's units over qk = H + H_r (q·kᵀ, dq, dk) and H_v (p·v, dp, dv); tensor: the latents'
            gradient all-reduced, c·t·R, in place of the attention input gradient's c·t·D, and W_d gathered whole,
            c·D·R a pass; saved: the latents c·t·R beside q, k, v
  remat full recomputes the forward but W_out's matmul (its output is not needed for the backward);
            parallel blocks not W_o's either (the layer's sum feeds nothing the backward needs); a flash
            attention whose keys fit one block shares the recomputed q·kᵀ with the backward's (one_key_block)
  layer 0   without a vocabulary its input gradient is dead; XLA drops it (the q, k, v input gradient's
            matmul, its tensor reduction, the backward's gathers of W_qkv) where L = 1 or an offloading
            policy makes XLA:TPU peel the layer loops (first_layer_dx_dead)
Collectives per layer (V, the Scaling Book's volume: the full array a collective spans per device):
  fsdp      all-gather of the layer's BF16 weights W = c·(D·H·(2N+2K) + m·D·F)/Y, forward and again
            in the backward; the gradients reduce-scattered, V = W
  tensor    2 all-reduces forward (after W_o, after W_out) and 2 backward (the inputs' gradients of
            the fused q/k/v and the MLP), V = c·t·D each; remat full one more (the recomputed W_o
            output, which the second norm needs). Sequence parallel (Korthikanti et al. 2022):
            forward 2 all-gathers + 2 reduce-scatters, backward 4 all-gathers (the norms' outputs
            again, the outputs' gradients) + 2 reduce-scatters (+1 under remat full), V = c·t·D each.
            Parallel blocks: half of each (one reduction of the summed partials forward, one of the
            norm's input gradient backward), nothing again under remat full
  context   Ulysses: all-to-all of q, k, v and o forward and of their gradients backward,
            V = c·t·H·(2N+2K)/Y per direction (Jacobs et al. 2023; the buffers a device sends, timed as the
            Scaling Book's AllToAll of C·V: scaling.step.program.comm_times); ring: ffn_model.attention's
            collective-permutes of K/V chunks (and their gradients); a policy that recomputes the attention
            runs its forward's permutes once more, and Ulysses' all-to-alls of what it does not keep (full:
            q, k, v and o; minimal and the save_dot policies: o)
  context   also the fsdp-sharded gradients all-reduced, W/X (the tokens are split over context)
  data      the fsdp-sharded gradients all-reduced, W/X
  loss      one FP32 all-reduce over every axis that splits the tokens (data, fsdp, context; tensor
            under sequence parallelism without a vocabulary: the logits' tokens are whole over tensor)
With a vocabulary V (k = 1 tied or 2 untied [V, D] matrices, V over tensor, D over fsdp; Shoeybi et al.
2019, section 3):
  matmuls   logits 2·t·D·V/Y forward, 4·t·D·V/Y backward (dh and dU); the lookup is a gather, no matmul
  fsdp      each matrix gathered once per step (c·V·D/Y, kept for the backward), its gradient
            reduce-scattered (V = c·V·D/Y; 1F1B: each accumulated in its loop, reduced every iteration it is
            made); tied, E is gathered once and its two gradients (the lookup's
            scatter, the output's matmul) reduce-scattered apart: 2 matrices' worth, as untied
  tensor    the lookup's partial sums all-reduced, c·t·D (1F1B: every stage, every forward slot, on a microbatch:
            (T/M)·c·t·D); the output's input gradient, c·t·D (train);
            the loss's max (on the BF16 logits: c·t) and its sum of exponentials and label logit
            (one FP32 all-reduce, 8·t). Sequence parallel: the lookup reduce-scattered and its gradient
            all-gathered, the final norm's output all-gathered and its gradient reduce-scattered, c·t·D each
  data      the gradients all-reduced, 2·c·V·D/(X·Y) (tied or not; 1F1B k·c·V·D/(X·Y), its accumulators);
            context the same
"""

from __future__ import annotations

import dataclasses
import sys
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scaling.hardware import collectives
from scaling.families import ffn
from scaling.step import flops
from scaling.step import memory
from scaling.step import pipeline
from scaling.step import launches
from scaling.step import runtimes
from scaling.core.family import FamilyDefaults, PlanPolicy
from scaling.core.inputs import positive_int
from scaling.step.kernels import (Kernel, accumulate_kernel, adamw_kernel, matmul_kernel, pass_kernels,
                                    shape_costs)
from scaling.core.mesh_shape import MESH_AXES, spans
from scaling.core.kinds import Block, Family, KernelKind, KernelPass, Mlp, Platform
from scaling.core.policies import (DEFAULT_PRECISION, REMAT_POLICIES, TRANSFORMER_ONLY_REMAT, Attention,
                                   ContextStrategy, FsdpGather, OptimizerSharding, Pipeline, Precision, Remat,
                                   Step)
from scaling.core.schedule import Schedule, key_block, runs_flash
from scaling.core.sharding import shards
from scaling.core.workload import Workload

MLP_KINDS = ("relu", "gelu", "swiglu")  # act(h·W_in)·W_out, or SwiGLU (Shazeer 2020)
BLOCK_KINDS = ("serial", "parallel")  # attention then MLP; or both on one norm, summed (GPT-J, PaLM)


# What each named remat policy keeps (ffn_model.transformer.POLICY_SAVES), as the closed forms count it:
# q, k, v; the attention's residuals (probabilities, or flash's o and log-sum-exp); o·W_o after its reduction
# (or mid); the norms' outputs; the MLP hidden.
POLICY_KEEPS = {
    "none": {"qkv", "attention", "out", "norms", "mlp_in"},
    "selective": {"qkv", "out", "norms", "mlp_in"},
    "minimal": {"qkv", "out", "mlp_in"},
    "save_dot_except_mlpwi": {"qkv", "out"},
    "save_dot_except_mlp": {"qkv", "out"},
    "save_qkv_proj": {"qkv"},
    "save_qkv_context": {"qkv", "attention"},
    "qkv_proj_offloaded": {"qkv"},
    "input_qkv_offloaded": {"qkv"},
    "full": set(),
}
# What the offloading policies keep in pinned host memory (jax.checkpoint_policies.save_and_offload_only_these_names,
# offload_dst "pinned_host"; ffn_model.transformer.POLICY_OFFLOADS): kept as POLICY_KEEPS says (the same recompute),
# but not in HBM where the compiler places them on the host (CompilerFacts.host_offload); "x" the layer's input
OFFLOADED = {"qkv_proj_offloaded": {"qkv"}, "input_qkv_offloaded": {"x", "qkv"}}


@dataclass(frozen=True)
class TransformerConfig(FamilyDefaults):
    """A pre-norm causal transformer stack: ``blocks`` layers of RMSNorm -> multi-head self-attention
    (``heads`` query heads N, ``kv_heads`` key/value heads K for grouped-query attention, head dim H)
    with a residual, then RMSNorm -> MLP (D -> F -> D; ``mlp``: relu, gelu, or swiglu with three
    matrices) with a residual (``block="serial"``), or attention and MLP on one norm's output, summed
    into one residual (``block="parallel"``, GPT-J / PaLM: one tensor-parallel reduction per layer);
    sequences of ``seq_len`` tokens T. Without ``vocab`` there is no embedding or output projection (the
    synthetic task maps token vectors to token vectors like the FFN stack's); with it, token ids in, an
    embedding E [V, D], a final RMSNorm, logits h·Uᵀ (U = E with ``tied_embeddings``) and the softmax
    cross-entropy against the previous token's id (ffn_model.transformer.synthetic_batch).

    Parameters per layer (Scaling Book transformers page): attention D·H·(2N + 2K) (W_q, W_k, W_v,
    W_o), MLP m·D·F (m = 2, or 3 gated); the RMSNorms carry no learned scale (ffn_model.transformer.rms_norm).
    Embeddings: V·D, or 2·V·D untied.
    """

    family: ClassVar[str] = Family.TRANSFORMER
    forms: ClassVar = sys.modules[__name__]  # its closed forms: this module's functions (scaling.core.family.FORMS)
    noun: ClassVar[str] = "transformer"
    batch_axis: ClassVar[str] = "batch"
    runs_1f1b: ClassVar[bool] = True
    has_critical_batch: ClassVar[bool] = False  # predict's critical_batch: none modelled (NaN)
    plan: ClassVar[PlanPolicy] = PlanPolicy(
        batch_tokens=4_194_304,  # Llama 2's 4M tokens (Touvron et al. 2023, section 2.2)
        axes=tuple(a for a in MESH_AXES if a != "expert"),  # context too; no experts
        remats=tuple(r for r in REMAT_POLICIES if r != Remat.EVERY_SECOND
                     and r not in OFFLOADED  # the host's transfers: not modelled
                     and r != Remat.SAVE_QKV_CONTEXT),  # not nested with minimal's (remat_keeps' order)
        grouped=True,  # meshes in groups, every schedule choice (scaling.planner.plan._groups)
        remat_keeps=POLICY_KEEPS,  # nested: the planner's first policy that fits is the fastest
        schedule_options=("attention", "context", "optimizer_sharding"))
    dimensions: ClassVar[dict[str, str]] = {
        "d_model": "D", "d_ff": "F", "blocks": "L", "seq_len": "T, tokens per sequence", "heads": "N, query heads",
        "kv_heads": "K, key/value heads (grouped-query attention)", "head_dim": "H, the head dimension (default D/N)",
        "vocab": "V, the vocabulary: token ids in, an embedding, logits and a cross-entropy loss (default none: "
                 "token vectors in and out)",
        "window": "W, tokens a local (sliding-window) layer's query sees, itself included (default none: every layer "
                  "global)",
        "global_every": "every n-th layer global, the others local (with --window; default none: all local)",
        "kv_lora_rank": "r_kv, multi-head latent attention's key/value rank (DeepSeek-V2 MLA; H is then the heads' "
                        "non-rope q/k dim; default none: standard attention)",
        "q_lora_rank": "r_q, MLA's query rank (default none: q = h·W_q)",
        "qk_rope_head_dim": "H_r, MLA's decoupled rope dims of q and the shared key (default 0)",
        "v_head_dim": "H_v, MLA's value head dim (default H)"}
    kinds: ClassVar[dict[str, tuple[tuple[str, ...], str]]] = {
        "mlp": (MLP_KINDS, "the MLP: act(h·W_in)·W_out with relu or gelu, or swiglu (three matrices)"),
        "block": (BLOCK_KINDS, "serial (attention, then the MLP) or parallel (both on one norm, summed: one "
                               "tensor-parallel reduction per layer)")}
    switches: ClassVar[dict[str, str]] = {"tied_embeddings": "the output projection is the embedding (transformer "
                                                             "with --vocab)",
                                          "qk_norm": "an RMSNorm on each head's q and k before the attention "
                                                     "(QK-norm: Qwen3, OLMoE, Gemma 3)"}
    # {field: Schedule's field}: the schedule's attention fields, set only for a model with attention
    schedule_flags: ClassVar[dict[str, str]] = {"attention": "attention", "attention_block": "attention_block",
                                                "context_strategy": "context",
                                                "splash_fused_backward": "splash_fused_backward"}

    d_model: int
    heads: int
    d_ff: int
    blocks: int
    seq_len: int
    kv_heads: int | None = None
    head_dim: int | None = None
    mlp: str = "gelu"
    block: str = "serial"
    vocab: int | None = None
    tied_embeddings: bool = False
    window: int | None = None  # sliding-window (local) attention over W keys; None: global (local_attention.md)
    global_every: int | None = None  # layer l global iff (l + 1) % global_every == 0 (Gemma 2: 2, Gemma 3: 6)
    qk_norm: bool = False  # an RMSNorm over H on each head's q and k (Dehghani et al. 2023; Qwen3, OLMoE, Gemma 3)
    # multi-head latent attention (MLA; DeepSeek-V2, DeepSeek-AI 2024, section 2.1): kv_lora_rank r_kv set makes it
    kv_lora_rank: int | None = None  # r_kv: h·W_dkv [D, r_kv + H_r] down, RMSNorm, then W_ukv [r_kv, N·(H + H_v)] up
    q_lora_rank: int | None = None  # r_q: q = RMSNorm(h·W_dq)·W_uq (V3); None: q = h·W_q (V2-Lite)
    qk_rope_head_dim: int | None = None  # H_r: q's and the one shared key's decoupled part (MLA; default 0)
    v_head_dim: int | None = None  # H_v: v's and o's head dim (MLA; default H)

    def __str__(self) -> str:
        """A header's words: "transformer D=4,096 N=32 K=8 H=128 F=14,336 L=32 T=8,192 swiglu V=128,256"."""
        return (f"transformer D={self.d_model:,} N={self.heads} K={self.kv_heads} H={self.head_dim} "
                f"F={self.d_ff:,} L={self.blocks:,} T={self.seq_len:,} {self.mlp}"
                + (" parallel" if self.block == Block.PARALLEL else "")
                + (f" V={self.vocab:,}" + (" tied" if self.tied_embeddings else "") if self.vocab else "")
                + (f" W={self.window:,}" + (f"/{self.global_every}" if self.global_every else "")
                   if self.window else "") + (" qk-norm" if self.qk_norm else "")
                + (f" MLA r_kv={self.kv_lora_rank}" + (f" r_q={self.q_lora_rank}" if self.q_lora_rank else "")
                   + f" H_r={self.rope_dim} H_v={self.v_dim}" if self.mla else ""))

    def __post_init__(self):
        for name in ("d_model", "heads", "d_ff", "blocks", "seq_len"):
            positive_int(name, getattr(self, name))
        for name, kinds in (("mlp", MLP_KINDS), ("block", BLOCK_KINDS)):
            if getattr(self, name) not in kinds:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {', '.join(kinds)}")
        if self.vocab is not None:
            positive_int("vocab", self.vocab)
        elif self.tied_embeddings:
            raise ValueError("tied_embeddings needs a vocabulary (--vocab N)")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim is None:
            if self.d_model % self.heads:
                D, small = self.d_model, [k for k in range(1, math.isqrt(self.d_model) + 1) if self.d_model % k == 0]
                valid = sorted({*small, *(D // k for k in small)})
                raise ValueError(f"d_model={D} is not divisible by heads={self.heads}: use heads dividing {D} ("
                                 + ", ".join(map(str, valid)) + "), or give head_dim (--head-dim) to set H apart "
                                 "from D/N")
            object.__setattr__(self, "head_dim", self.d_model // self.heads)
        positive_int("kv_heads", self.kv_heads)
        positive_int("head_dim", self.head_dim)
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads} "
                             "(grouped-query attention)")
        if self.window is not None:
            positive_int("window", self.window)
        for name in ("kv_lora_rank", "q_lora_rank", "v_head_dim"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        if self.qk_rope_head_dim is not None and self.qk_rope_head_dim < 0:
            raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be >= 0")
        mla_only = [n for n in ("q_lora_rank", "qk_rope_head_dim", "v_head_dim") if getattr(self, n) is not None]
        if not self.mla and mla_only:
            raise ValueError(f"{mla_only[0]} is multi-head latent attention's: give kv_lora_rank (--kv-lora-rank) too")
        if self.mla and self.kv_heads != self.heads:
            raise ValueError(f"multi-head latent attention makes a key and value per query head: kv_heads="
                             f"{self.kv_heads} must equal heads={self.heads}")
        if self.global_every is not None:
            positive_int("global_every", self.global_every)
            if self.window is None:
                raise ValueError("global_every needs a window (--window W) for the other layers")

    @functools.cached_property
    def layer_windows(self) -> tuple:
        """Each layer's window W_l (None: global): layer l (from 0) global iff (l + 1) % global_every == 0, so that
        the stack starts with a local layer (Gemma 2's 1:1, Beyer et al. 2024 sec. 2; Gemma 3's 5:1); every layer
        local without global_every (Mistral 7B, Jiang et al. 2023 sec. 2); a window >= T is global. Made once (the
        planner reads it thousands of times a plan)."""
        W = self.window if self.window is not None and self.window < self.seq_len else None
        g = self.global_every
        return tuple(None if W is None or (g and (i + 1) % g == 0) else W for i in range(self.blocks))

    @property
    def gated(self) -> bool:
        """SwiGLU: silu(h·W_gate)·(h·W_in), three matrices."""
        return self.mlp == Mlp.SWIGLU

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    # The attention's widths and weights, standard and multi-head latent (MLA: DeepSeek-V2, DeepSeek-AI 2024, section
    # 2.1, eqs. 9-19; the training form, the up-projections not absorbed): per token c = h·W_d [r_q + r_kv + H_r]
    # (W_dq and W_dkv as one matrix, whole over tensor), q = RMSNorm(c_q)·W_uq (or h·W_q), [k_nope, v] =
    # RMSNorm(c_kv)·W_ukv, k = [k_nope, k_rope] with the one k_rope [H_r] shared by every head; o [N·H_v]·W_o.
    @property
    def mla(self) -> bool:
        """Multi-head latent attention (kv_lora_rank set)."""
        return self.kv_lora_rank is not None

    @property
    def rope_dim(self) -> int:
        """H_r, MLA's decoupled rope dims (0: none)."""
        return self.qk_rope_head_dim or 0

    @property
    def qk_dim(self) -> int:
        """A head's q and k dims: H + H_r (H standard)."""
        return self.head_dim + self.rope_dim

    @property
    def v_dim(self) -> int:
        """A head's v and o dims: H_v (H standard)."""
        return self.v_head_dim or self.head_dim

    @property
    def attn_dim(self) -> float:
        """(qk + v)/2: the head dim of the attention's FLOPs, 2·T·S·qk (q·kᵀ) + 2·T·S·v (p·v) = 4·T·S·attn_dim a head
        (H standard)."""
        return (self.qk_dim + self.v_dim) / 2

    @property
    def qkv_width(self) -> int:
        """q, k and v a token, over every head: N·qk + K·qk + K·v (H·(N + 2K) standard; MLA K = N)."""
        return (self.heads + self.kv_heads) * self.qk_dim + self.kv_heads * self.v_dim

    @property
    def o_width(self) -> int:
        """The attention's output a token, W_o's input: N·v."""
        return self.heads * self.v_dim

    @property
    def latent_width(self) -> int:
        """MLA's latents a token, whole over tensor: r_q + r_kv + H_r (0 standard)."""
        return (self.q_lora_rank or 0) + self.kv_lora_rank + self.rope_dim if self.mla else 0

    @property
    def h_split_width(self) -> int:
        """The outputs of the projections that read the norm's output h split over tensor (their input gradient a
        partial sum over tensor): q, k, v standard (qkv_width), MLA's W_q without a q rank (N·qk), else 0."""
        if not self.mla:
            return self.qkv_width
        return 0 if self.q_lora_rank else self.heads * self.qk_dim

    @property
    def qkv_params_split(self) -> int:
        """The q, k, v projections' parameters split over tensor: D·H·(N + 2K) standard; MLA D·h_split_width + r_q·N·qk
        (W_uq) + r_kv·N·(H + H_v) (W_ukv)."""
        up = ((self.q_lora_rank or 0) * self.heads * self.qk_dim
              + (self.kv_lora_rank or 0) * self.heads * (self.head_dim + self.v_dim)) if self.mla else 0
        return self.d_model * self.h_split_width + up

    @property
    def qkv_params_whole(self) -> int:
        """The projections whole over tensor: MLA's down-projections D·(r_q + r_kv + H_r) (0 standard)."""
        return self.d_model * self.latent_width

    @property
    def attention_params_per_block(self) -> int:
        """D·H·(2N + 2K) standard (W_q [N,H,D], W_k and W_v [K,H,D], W_o [N,H,D]); MLA qkv_params_split +
        qkv_params_whole + N·H_v·D (W_o)."""
        return self.qkv_params_split + self.qkv_params_whole + self.o_width * self.d_model

    def attention_params_per_shard(self, Y) -> float:
        """A layer's attention parameters on one of Y tensor devices once gathered for its matmuls: the split ones
        /Y, MLA's down-projection whole (stored split over tensor too, gathered over fsdp and tensor)."""
        return self.qkv_params_whole + (self.qkv_params_split + self.o_width * self.d_model) / Y

    def qkv_flops_per_token(self, Y) -> float:
        """The q, k, v projections' forward FLOPs a token on one of Y tensor devices: 2·(qkv_params_whole +
        qkv_params_split/Y) (standard 2·D·H·(N + 2K)/Y)."""
        return 2 * (self.qkv_params_whole + self.qkv_params_split / Y)

    @property
    def params_per_block(self) -> int:
        """D·H·(2N + 2K) + m·D·F."""
        return self.attention_params_per_block + self.mlp_matrices * self.d_model * self.d_ff

    @property
    def embedding_matrices(self) -> int:
        """How many [V, D] matrices the model holds: 0 without a vocabulary, 1 tied (E = U), 2 untied."""
        return 0 if self.vocab is None else 1 if self.tied_embeddings else 2

    @property
    def embedding_params(self) -> int:
        """V·D per embedding matrix (embedding_matrices of them)."""
        return self.embedding_matrices * (self.vocab or 0) * self.d_model

    @property
    def params(self) -> int:
        """P = L·(D·H·(2N + 2K) + m·D·F) + the embeddings' V·D (tied) or 2·V·D."""
        return self.blocks * self.params_per_block + self.embedding_params

    @property
    def active_params(self) -> int:
        """P: a dense model runs every parameter for every token."""
        return self.params

    # serving: the KV cache, the weights a decode step reads and its FLOPs (scaling.step.serving)
    @property
    def kv_width(self) -> int:
        """Elements one token's KV cache holds in one layer: K·(qk + v), 2·K·H standard (Scaling Book, inference
        page: KV cache size = 2·bytes·H·K·L·T); MLA's latent r_kv + H_r (DeepSeek-V2 sec. 2.1.3: the cache of the
        absorbed form, c_kv and the shared k_rope)."""
        return self.kv_lora_rank + self.rope_dim if self.mla else self.kv_heads * (self.qk_dim + self.v_dim)

    @property
    def layer_matrices(self) -> tuple[tuple[int, int, bool], ...]:
        """One layer's weight GEMMs, each (k, n, split): the contracted and the output dimension of its [k, n] weight
        and whether tensor parallelism splits n (column-parallel; else k, row-parallel: W_o and the MLP's output,
        Megatron's layer): W_q (D, N·qk), W_k (D, K·qk), W_v (D, K·v), W_o (N·v, D), the MLP's m − 1 inputs (D, F) and
        its output (F, D); MLA's W_d (D, r_q + r_kv + H_r) whole over tensor, W_uq (r_q, N·qk) or W_q (D, N·qk),
        W_ukv (r_kv, N·(H + H_v)), W_o (scaling.step.serving prices a step's GEMMs one by one)."""
        D, N, K, F = self.d_model, self.heads, self.kv_heads, self.d_ff
        mlp = ((D, F, True),) * (self.mlp_matrices - 1) + ((F, D, False),)
        if not self.mla:
            return ((D, N * self.qk_dim, True), (D, K * self.qk_dim, True), (D, K * self.v_dim, True),
                    (self.o_width, D, False), *mlp)
        q = (self.q_lora_rank, N * self.qk_dim, True) if self.q_lora_rank else (D, N * self.qk_dim, True)
        return ((D, self.latent_width, None), q, (self.kv_lora_rank, N * (self.head_dim + self.v_dim), True),
                (self.o_width, D, False), *mlp)

    def scale_channels(self, tensor: int) -> float:
        """The output channels of every quantized weight one device holds, one scale each (per-channel weight-only
        quantization, ffn_model.serve.quantize): each layer's matrices' n (layer_matrices), split over tensor where
        tensor parallelism splits n, whole where it splits k; the vocabulary tables' V rows over tensor."""
        per_layer = sum(n / (tensor if split else 1) for _, n, split in self.layer_matrices)
        return self.blocks * per_layer + self.embedding_matrices * (self.vocab or 0) / tensor

    def cached_keys(self, context) -> list:
        """Each layer's cached keys a sequence of ``context`` tokens holds: context, or a local layer's window W
        when shorter (it keeps the last W keys; the layout of layer_windows, here for any context)."""
        g, W = self.global_every, self.window
        return [context if W is None or (g and (i + 1) % g == 0) else min(context, W) for i in range(self.blocks)]

    def kv_cache_elements(self, context):
        """Σ_l kv_width·min(context, W_l): one sequence's KV cache (2·K·H·L·T standard, Scaling Book inference page)."""
        return self.kv_width * sum(self.cached_keys(context))

    def decode_read_params(self, tokens):
        """The weights a decode step of any ``tokens`` streams from HBM: P less the lookup table when untied (the
        step reads t of its V rows; tied, the one matrix is the output layer, read whole)."""
        return self.params - (self.vocab * self.d_model if self.embedding_matrices == 2 else 0)

    def decode_flops(self, tokens, context):
        """Matmul FLOPs of a decode step, t = ``tokens`` new tokens (one a sequence) each at ``context`` cached keys:
        2·t·decode_read_params (every weight once a token; the output layer's 2·t·V·D in it) + the attention,
        t·Σ_l 4·N·attn_dim·ctx_l (q·kᵀ and p·v over the cached keys, Scaling Book inference page); MLA in the
        absorbed form, t·Σ_l 2·N·(2·r_kv + H_r)·ctx_l (scores over the latent and rope dims, the output over the
        latent: DeepSeek-V2 sec. 2.1.3)."""
        N = self.heads
        per_key = 2 * N * (2 * self.kv_lora_rank + self.rope_dim) if self.mla else 4 * N * self.attn_dim
        return 2 * tokens * self.decode_read_params(tokens) + tokens * per_key * sum(self.cached_keys(context))

    @property
    def norm_params(self) -> int:
        """The RMSNorm scales a published count includes and this package's model leaves out (its norms carry none):
        D a norm, two a layer (serial) or one (parallel), and the final norm's with a vocabulary: 2·L·D + D (Llama
        3.1 405B: P = 405,849,243,648 + 4,145,152 = 405,853,388,800, Meta's 405.9B; Llama-2-7B's checkpoint
        6,738,415,616, tests/test_closed_forms.py); MLA's latent norms L·(r_q + r_kv) too."""
        return ((2 if self.block == Block.SERIAL else 1) * self.blocks * self.d_model
                + (self.d_model if self.vocab else 0)
                + self.blocks * ((self.q_lora_rank or 0) + (self.kv_lora_rank or 0)))

    def replace(self, **kw) -> "TransformerConfig":
        kw = {k: v for k, v in kw.items() if v is not None}
        if "d_model" in kw and "head_dim" not in kw and self.head_dim == self.d_model // self.heads:
            kw["head_dim"] = None  # the head dim follows D (and the heads) unless it was set apart from them
        if "heads" in kw and "head_dim" not in kw and self.head_dim == self.d_model // self.heads:
            kw["head_dim"] = None
        if "heads" in kw and "kv_heads" not in kw and self.kv_heads == self.heads:
            kw["kv_heads"] = None
        return dataclasses.replace(self, **kw)

    def check_remat(self, remat: str) -> None:
        """every-second is the FFN stack's: none, full or a named policy (TRANSFORMER_ONLY_REMAT)."""
        if remat == Remat.EVERY_SECOND:
            raise ValueError("remat every-second is for the FFN stack; the transformer's remat is none, full or "
                             + ", ".join(TRANSFORMER_ONLY_REMAT))

    def check_schedule(self, schedule: Schedule, mesh: Mapping, batch_tokens: int | None = None) -> None:
        """Before the shared rules (Schedule.check): _check_transformer; interleaved 1F1B needs M >= S; with stages
        M a multiple of S (but 1F1B with R = 1); fsdp_gather "step" is the FFN stack's; B whole sequences, their
        number divisible by microbatches·data·fsdp."""
        S, M, R = mesh.get("stage", 1), schedule.microbatches, schedule.repeats
        _check_transformer(self, mesh, schedule)
        if schedule.pipeline == Pipeline.ONE_F_ONE_B and R > 1 and (np.asarray(M) < S).any():
            raise ValueError(f"interleaved 1f1b needs microbatches >= stages: {M} < {S}")
        if S > 1 and (schedule.pipeline != Pipeline.ONE_F_ONE_B or R > 1) and (np.asarray(M) % S).any():
            raise ValueError(f"microbatches={M} must be a multiple of stage={S} for the transformer's "
                             + ("interleaved 1f1b (groups of S microbatches)"
                                if schedule.pipeline == Pipeline.ONE_F_ONE_B else
                                f"{schedule.pipeline} (each stage runs the output layer on M/S of them)"))
        if S > 1 and schedule.fsdp_gather == FsdpGather.STEP:
            raise ValueError("fsdp_gather='step' is built for the FFN stack's pipeline, not the transformer's")
        if batch_tokens is not None:
            seqs = positive_int("batch_tokens", batch_tokens) // self.seq_len
            n = M * shards(mesh, "batch")
            if batch_tokens % self.seq_len or seqs % n:
                raise ValueError(f"batch_tokens={batch_tokens} must be whole sequences of seq_len={self.seq_len}, "
                                 f"their number divisible by microbatches·data·fsdp = {n}")

    def extents(self, batch_tokens) -> dict[str, float]:
        """{array: elements} of the step's largest global arrays (scaling.core.limits.check_size): the activations
        B·max(D, F, N·H), a weight stack L·D·max(F, N·H), one layer's attention scores B·N·T (or flash attention's key
        blocks stacked for the backward) and the logits B·V."""
        B, D, F, L, NH = batch_tokens, self.d_model, self.d_ff, self.blocks, self.heads * self.head_dim
        return {"activations B·max(D, F)": B * max(D, F, NH), "weights L·D·F": L * D * max(F, NH),
                "attention scores B·N·T": B * self.heads * self.seq_len, "logits B·V": B * (self.vocab or 0)}

    def check_axes(self, mesh: Mapping) -> None:
        """No expert axis (no experts)."""
        if mesh.get("expert", 1) > 1:
            raise ValueError(f"expert={mesh['expert']}: the transformer has no experts (an MoE model splits its "
                             "experts over expert)")

    def divisions(self) -> list[tuple[str, int, str]]:
        """(name, dimension, logical axis) the sharding table splits: D (embed), F (mlp), V (vocab) if any."""
        out = [("d_model", self.d_model, "embed"), ("d_ff", self.d_ff, "mlp")]
        if self.vocab is not None:
            out.append(("vocab", self.vocab, "vocab"))
        return out

    def mesh_fits(self, mesh: Mapping):
        """The planner's screen of meshes (arrays of sizes): heads and kv heads by tensor, T by context."""
        fits = ((self.heads % mesh["tensor"] == 0) & (self.kv_heads % mesh["tensor"] == 0)
                & (self.seq_len % mesh["context"] == 0))
        if self.mla:  # without context or stages (_check_transformer)
            fits = fits & (mesh["context"] == 1) & (mesh.get("stage", 1) == 1)
        return fits

    def plan_batch_runs(self, mesh: Mapping, B, M):
        """check_schedule's batch rule on arrays (B, M, the planner's meshes broadcast): whole sequences, their
        count divisible by M·data·fsdp."""
        seqs = B // self.seq_len
        return (B % self.seq_len == 0) & (seqs % (M * mesh["data"] * mesh["fsdp"]) == 0)


def _check_transformer(cfg: TransformerConfig, mesh: Mapping, schedule: Schedule) -> None:
    """What the transformer's shardings and attention strategies need (ValueError naming the input): the
    heads and kv heads divide by tensor (and by context·tensor for Ulysses, which splits the heads over
    context), T by context (by context·tensor with sequence parallelism), and a flash attention's key
    blocks divide the keys each device attends to (T, or T/C for ring)."""
    C, Y = mesh.get("context", 1), mesh.get("tensor", 1)
    heads_split = C * Y if C > 1 and schedule.context == ContextStrategy.ULYSSES else Y
    for name, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads)):
        if n % heads_split:
            what = "context·tensor (Ulysses splits the heads over context)" if heads_split != Y else "tensor"
            raise ValueError(f"{name}={n} is not divisible by {what} = {heads_split}")
    t_split = C * Y if schedule.sequence_parallel else C
    if cfg.seq_len % t_split:
        by = "context·tensor" if schedule.sequence_parallel else "context"
        raise ValueError(f"seq_len={cfg.seq_len} is not divisible by {by} = {t_split}")
    keys = cfg.seq_len // C if C > 1 and schedule.context == ContextStrategy.RING else cfg.seq_len
    if schedule.attention == Attention.FLASH and keys > schedule.attention_block and keys % schedule.attention_block:
        raise ValueError(f"attention_block={schedule.attention_block} does not divide the {keys} keys each device "
                         "attends to at a time")
    if schedule.attention == Attention.SPLASH:
        b = min(schedule.attention_block, cfg.seq_len)
        if cfg.seq_len % b or b % 128:
            raise ValueError(f"attention splash needs seq_len={cfg.seq_len} in blocks of min(attention_block="
                             f"{schedule.attention_block}, T) that are a multiple of 128 (the kernel's lanes)")
    if any(cfg.layer_windows) and spans(C) and schedule.context == ContextStrategy.RING:
        raise ValueError("window (local attention) runs with context ulysses, not ring")
    if any(cfg.layer_windows) and mesh.get("stage", 1) > 1:
        raise ValueError(f"window (local attention) runs without pipeline stages, not stage={mesh['stage']}")
    if cfg.mla:  # multi-head latent attention: built and checked for what DeepSeek's runs use
        for bad, what in ((spans(C), f"context={C}"),
                          (cfg.block == Block.PARALLEL, "a parallel block"),
                          (schedule.sequence_parallel, "sequence parallelism"), (any(cfg.layer_windows), "a window"),
                          (cfg.qk_norm, "qk_norm")):
            if bad:
                raise ValueError(f"multi-head latent attention (kv_lora_rank) is built without {what}: its closed "
                                 "forms and program cover serial layers of global attention on data, fsdp, tensor "
                                 "and expert")
    if (schedule.attention in (Attention.SPLASH, Attention.CUDNN) and spans(C)
            and schedule.context == ContextStrategy.RING):
        raise ValueError(f"attention {schedule.attention} runs with context ulysses, not ring: the ring's merge needs "
                         "each chunk's logsumexp under differentiation, which the kernel does not return (splash: "
                         "save_residuals raises under autodiff); use --context-strategy ulysses or --attention flash")


def _dims(cfg: TransformerConfig, mesh: Mapping, batch_tokens):
    """(s sequences per device, t tokens per device, X, Y, C, d)."""
    X, Y, C, d = (mesh.get(a, 1) for a in ("fsdp", "tensor", "context", "data"))
    s = batch_tokens / (cfg.seq_len * d * X)
    return s, s * cfg.seq_len / C, X, Y, C, d


def passes(w: Workload) -> dict:
    """What one device runs per step, in passes over its t tokens (module docstring, "Pipeline stages"):
    "layers": layer-passes, L without a stage axis; with S stages (L/S)·T/(R·M), T the chunk-slots a stage runs
    (scaling.step.pipeline.slots: the schedule's iterations, bubble ones included; 1F1B with warm-up phases R·M + S − 1
    of each slot); "weight_passes": how often a layer's weights are used, L, or T·L/(S·R) (each slot's chunk, on a
    microbatch); "head": the output layer's and loss's share of t, 1 without stages, 1/S for GPipe and circular
    (each stage its M/S microbatches), H/M for 1F1B (every stage, in each of its H iterations with both slots:
    pipeline.head_iterations); "head_iterations": how often the output layer's weight gradient is made and
    accumulated (H for 1F1B, else 1); "again": 1 for 1F1B (its loop, whose forward slot keeps the chunk's
    residuals: the backward slot runs no forward of its own, ffn_model.pipeline.one_f_one_b), else 0; "iterations" T (0
    without stages); "chunk": a stage's layers per chunk, L/(S·R) (L without stages); "lookup": the embedding lookup's
    share of t, 1, or T/M for 1F1B (every stage looks a microbatch up in each forward slot); "lookup_iterations": how
    often its gradient is made and accumulated (T for 1F1B, else 1). A forward-only step runs GPipe."""
    cfg, schedule, S = w.model, w.schedule, w.mesh.get("stage", 1)
    if S == 1:
        return {"layers": cfg.blocks, "weight_passes": cfg.blocks, "head": 1.0, "head_iterations": 1, "again": 0,
                "iterations": 0, "chunk": cfg.blocks, "lookup": 1.0, "lookup_iterations": 1}
    one_f = schedule.pipeline == Pipeline.ONE_F_ONE_B and w.step == Step.TRAIN
    if schedule.pipeline == Pipeline.ONE_F_ONE_B and not one_f:
        schedule = dataclasses.replace(schedule, pipeline="gpipe")
    T, M, R = pipeline.slots(schedule, S), schedule.microbatches, schedule.repeats
    Ls = pipeline.largest_stage(cfg, schedule, S)  # a stage's layers: L/S, or uneven the largest stage's (padding)
    Lc = Ls // R  # a chunk's layers
    if one_f:
        H = pipeline.head_iterations(schedule, S)
        return {"layers": Ls * T / (R * M), "weight_passes": T * Lc, "head": H / M, "head_iterations": H,
                "again": 1, "iterations": T, "chunk": Lc, "lookup": T / M, "lookup_iterations": T}
    return {"layers": Ls * T / (R * M), "weight_passes": T * Lc, "head": 1 / S, "head_iterations": 1,
            "again": 0, "iterations": T, "chunk": Lc, "lookup": 1.0, "lookup_iterations": 1}


def first_layer_dx_dead(w: Workload):
    """1 where the program drops layer 0's input gradient, else 0: without a vocabulary the layers' input is the
    batch, which takes no gradient, and XLA removes the dead dx where layer 0's backward does not share the loop body
    of the other layers: L = 1 (a one-trip scan, inlined: scaling.step.flops.first_block_dx_computed) or an offloading
    remat policy's residuals in host memory (CompilerFacts.host_offload: XLA:TPU peels one trip of the forward and
    the backward loops over layers, libtpu 0.0.42.1). Dropped with it: the q, k, v input gradient's matmul (a
    parallel block's fused q, k, v and MLP-input one), its reduction over tensor, and the backward's gathers of those
    matrices where the backward does not recompute with them (recomputed: qkv 0). Read from the compiled programs:
    docs/findings.md, "Residuals of issue 49, item 14". Train steps without stages (a pipeline's stage 0 computes
    every pass's dx); an array of policies (the planner's cells): 0 or 1 each."""
    cfg = w.model
    if w.step != Step.TRAIN or cfg.vocab or spans(w.mesh.get("stage", 1)):
        return 0
    return by_policy(w.remat, lambda r: int(not flops.first_block_dx_computed(cfg.blocks, r)
                                             or (w.compiler.host_offload and r in OFFLOADED)))


def first_layer_dead_gather(w: Workload):
    """Bytes of the fsdp all-gathers the program drops with layer 0's dead input gradient (first_layer_dx_dead):
    the backward's gathers of the matrices that read the layer's norm, W_qkv (a parallel block's fused MLP-input
    matrices too), c·D·(H·(N + 2K) + (m − 1)·F for a parallel block)/Y; MLA's down-projection W_d and W_q without a
    q rank, c·D·(r_q + r_kv + H_r + N·qk)/Y (W_d's gather over tensor: mla_dead_tensor_gather); where the backward
    does not recompute with them (recomputed: qkv 0)."""
    cfg, c = w.model, max(w.precision.compute, w.compiler.min_comm_bytes)
    D, Y = cfg.d_model, w.mesh.get("tensor", 1)
    in_w = c * D * (cfg.h_split_width + cfg.latent_width
                    + (cfg.mlp_matrices - 1) * cfg.d_ff * (cfg.block == Block.PARALLEL)) / Y
    return _dead_gathers(w) * in_w


def mla_dead_tensor_gather(w: Workload):
    """Bytes of MLA's down-projection W_d gathered over tensor for layer 0's dead input gradient (first_layer_dx_dead):
    c·D·(r_q + r_kv + H_r), where the backward does not recompute with it (0 for standard attention)."""
    return _dead_gathers(w) * max(w.precision.compute, w.compiler.min_comm_bytes) * w.model.qkv_params_whole


def _dead_gathers(w: Workload):
    """1 where the backward's gathers of layer 0's norm-reading matrices are dead (first_layer_dx_dead, and no
    recompute with them: recomputed qkv 0), else 0."""
    return first_layer_dx_dead(w) * (1 - recomputed(w.model, w.remat, w.schedule, w.mesh)["qkv"])


def overlapped_volumes(w: Workload, vols: dict | None = None) -> dict:
    """None modelled as hidden: {} (scaling.step.program.overlapped_volumes)."""
    return {}


def accumulation_copy_bytes(w: Workload) -> float:
    """Gradient accumulation's copies of the zero-initialized FP32 gradient stacks per step (scaling.families.ffn's
    accumulation_copy_bytes says why: XLA's CSE merges the stacks of one shape into one zero buffer and copies it
    for each further stack): per microbatch, for each group of k stacks of one shape, k − 1 copies of g·L·(one
    layer's matrix)/(X·Y) bytes (g = Precision.grad). The groups: the MLP's m matrices [F, D] (k = m: swiglu 3,
    gelu/relu 2); W_q, W_k, W_v, W_o [N·H, D] one group of 4 where K = N, else {W_q, W_o} and {W_k, W_v}. Read from
    the llama2-7b shapes on gpu:H100:1 (M = 4: 2 copies of f32[4,11008,4096] and 3 of f32[4,32,128,4096] a
    microbatch), jax 0.10.2: docs/findings.md, "The layer loop's copies on XLA:GPU (issue 39)"."""
    cfg, mesh = w.model, w.mesh
    D, F, N, K, H, m = cfg.d_model, cfg.d_ff, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.mlp_matrices
    # MLA's matrices are of distinct shapes (W_dq, W_uq, W_dkv, W_ukv, W_o): no copy among them
    attention = 0 if cfg.mla else 3 * N * H * D if K == N else N * H * D + K * H * D
    per = w.precision.grad * cfg.blocks * ((m - 1) * F * D + attention) / (mesh["fsdp"] * mesh["tensor"])
    return ffn.accumulation_copies(w, per)


# the loop state's copies per step (the forms' name: scaling.core.family.FORMS, scaling.step.program.loop_copy_bytes):
# gradient accumulation's copies of the zero-initialized gradient stacks
loop_copy_bytes = accumulation_copy_bytes


def layer_weight_bytes(cfg: TransformerConfig, mesh: Mapping, precision: Precision = DEFAULT_PRECISION) -> float:
    """W = c·(D·H·(2N+2K) + m·D·F)/Y: one layer's matrices per device after the fsdp all-gather (BF16); MLA's
    down-projection whole over tensor (TransformerConfig.attention_params_per_shard)."""
    Y = mesh.get("tensor", 1)
    return precision.compute * (cfg.attention_params_per_shard(Y) + cfg.mlp_matrices * cfg.d_model * cfg.d_ff / Y)



def splash_backward_layer(cfg: TransformerConfig, mesh: Mapping, batch_tokens, schedule: Schedule = Schedule(),
                          precision: Precision = DEFAULT_PRECISION) -> dict:
    """Bytes per device a layer's backward holds beside the saved activations and the FP32 gradient accumulators
    when the attention is splash (train, no stages, any remat policy but full), term by term. It takes the place of
    memory_per_device's two gathered layers, one layer's FP32 gradient and the scores' working set, none of which
    the compiled programs hold at the backward's peak: splash keeps its score blocks in VMEM (no HBM buffer), XLA
    gathers each matrix for its one matmul and frees it, and makes each weight gradient in BF16, whole over fsdp,
    reduce-scattering it before it joins the accumulators. What is live at the peak:
    dx, the gradient carried between layers, c·t·D; two more residual-stream arrays, c·t·D each (the residual's
    gradient after the MLP, the attention's input gradient or its all-to-all); d_hidden, the MLP hidden's gradient
    the deferred weight-gradient matmuls read, c·t·F·(m−1)/Y; one matrix's BF16 gradient, c·D·max(F, N·H)/Y
    (c·t·D is /Y under sequence parallelism, the token split: not compiled). Read from XLA's buffer live ranges at
    the peak of three v5p:2x2x2 programs (fsdp=4,context=2 Ulysses and fsdp=2,tensor=4 under none, fsdp=4,tensor=2
    under save_dot_except_mlpwi): docs/findings.md, "Splash peaks"."""
    s, t, X, Y, C, d = _dims(cfg, mesh, batch_tokens)
    D, F, N, m, c = cfg.d_model, cfg.d_ff, cfg.heads, cfg.mlp_matrices, precision.compute
    xs = c * t * D / (Y if schedule.sequence_parallel else 1)
    return {"dx": xs, "residual_grads": 2 * xs, "d_hidden": c * t * F * (m - 1) / Y,
            "weight_grad": c * D * max(F, N * cfg.qk_dim, cfg.o_width) / Y}


def group_held_grads(cfg: TransformerConfig, mesh: Mapping, precision: Precision = DEFAULT_PRECISION) -> float:
    """Bytes per device a stack of local and global layers holds of its group's weight gradients: (g − 1)·4·(D·H·(2N
    + 2K) + m·D·F)/(X·Y), the FP32 gradient shards of the g − 1 upper layers of a group (g = global_every; the
    program's one scan iteration runs a group's g layers, ffn_model.transformer.stack_forward), made in turn by the
    backward and written to the gradient stack together when the iteration ends; 0 for a stack of one kind. The
    compiler showed it: v5p:2x2x2, the 4096-wide transformer with W = 1024 and g = 2 on fsdp=2, tensor=4, the global
    layer's six FP32 shards (88 MB) live beside the local layer's backward at the peak (docs/findings.md, "Local and
    global layers' peak")."""
    windows = cfg.layer_windows
    if len(set(windows)) < 2:
        return 0.0
    g = windows.index(None) + 1  # the first global layer closes the first group
    return (g - 1) * precision.grad * cfg.params_per_block / (mesh.get("fsdp", 1) * mesh.get("tensor", 1))


def skips_causal(schedule: Schedule, mesh: Mapping) -> bool:
    """Whether the kernel skips the key blocks above the diagonal (runs nb·(nb + 1)/2 of nb² block pairs, nb = T/b)
    in the program, not only in its time: splash (its mask's block map) and cuDNN; not over a ring's chunks
    (refused)."""
    return schedule.attention in (Attention.SPLASH, Attention.CUDNN) and not (spans(mesh.get("context", 1))
                                                               and schedule.context == ContextStrategy.RING)


def attention_units(schedule: Schedule, pass_: str, mesh: Mapping) -> int:
    """Matmuls of s·T²·N·H/(Y·C) FLOPs each attention runs (ffn_model.attention's docstrings): forward
    4 (q·kᵀ, p·v: 2 each); backward 8 from the saved probabilities, 10 with the scores recomputed
    (runs_flash), 14 under splash's separate dq and dkv kernels (10: splash_fused_backward)."""
    if pass_ == KernelPass.FORWARD:
        return 4
    # splash's separate dq and dkv kernels (MaxText's default, sa_use_fused_bwd_kernel false) each recompute s and
    # dp: dq kernel s, dp, dq (6), dkv kernel s, dp, dv, dk (8); its fused backward kernel (splash_fused_backward)
    # s, dp once, then dv, dk, dq (10), as flash's
    if schedule.attention == Attention.SPLASH and not schedule.splash_fused_backward:
        return 14
    return 10 if runs_flash(schedule, mesh) else 8


def recomputed(cfg: TransformerConfig, remat: str, schedule: Schedule, mesh: Mapping) -> dict:
    """What a layer's backward recomputes under ``remat`` (read from the compiled programs' FLOPs, module
    docstring): {"qkv": 0|1 (the projections), "attention_units": 0, 2 or 4 (q·kᵀ only where the
    attention's output is kept: selective; the whole forward, 4, where it is not), "out": 0|1 (W_o's matmul:
    serial blocks that keep neither o·W_o nor mid need it for the second norm's input), "mlp_in": 0|1
    (h·W_in, and W_gate), "shared_scores": 0|2 (of the attention_units, the backward's own q·kᵀ: one_key_block)}.
    Selective under flash attention keeps what none keeps (no O(T²) residual). A parallel block recomputes q, k, v
    with its MLP input (one fused matmul). An array of policies (the planner's cells): each cell's counts,
    by_policy."""
    flash, one = runs_flash(schedule, mesh), one_key_block(cfg, schedule, mesh)

    def shared(counts: dict) -> dict:
        return {**counts, "shared_scores": 2 * one if counts["attention_units"] == 4 else 0}
    if np.ndim(flash) == 0:  # one attention kernel for every mesh: each policy's counts made once
        return by_policy(remat, lambda r: shared(dict(_recomputed_once(cfg.block, str(r), bool(flash)))))
    return by_policy(remat, lambda r: shared(dict(_recomputed(cfg.block, r, flash))))


def one_key_block(cfg: TransformerConfig, schedule: Schedule, mesh: Mapping):
    """1 where the program's attention is the package's flash (ffn_model.attention.flash_attention: not ring over a
    context axis, not the libraries' custom-call kernels) and its keys, T (the whole sequence, Ulysses' too), fit one
    key block (attention_block >= T), else 0. There the forward's and the backward's scans over key blocks are
    one-trip loops, which XLA removes; a backward that recomputes the attention's forward (recomputed:
    attention_units 4) then computes q·kᵀ for the forward's p·v and again for FlashAttention-2's p = exp(q·kᵀ −
    lse) from the same q and k in one computation, and XLA's CSE keeps one: 2 units fewer than 4 + 10 (read from
    the compiled programs, XLA:CPU, jax 0.10.2: docs/findings.md, "Residuals of issue 49, item 14"). Element-wise
    on the planner's arrays of schedules and meshes."""
    attention = schedule.attention
    flash = attention == Attention.FLASH if isinstance(attention, str) else np.asarray(attention) == Attention.FLASH
    ring = spans(mesh.get("context", 1)) & np.asarray(schedule.context == ContextStrategy.RING)
    one = flash & ~ring & (np.asarray(schedule.attention_block) >= cfg.seq_len)
    return int(one) if np.ndim(one) == 0 else one.astype(int)


def _recomputed(block: str, remat: str, flash) -> tuple:
    """recomputed's counts as (name, count) pairs, for one block kind, remat policy and attention (runs_flash)."""
    keeps = POLICY_KEEPS[remat]
    attention = 0 if "attention" in keeps or (remat == Remat.SELECTIVE and flash) else 2 if "out" in keeps and \
        remat == Remat.SELECTIVE else 4
    # a parallel block's q, k, v and MLP input come out of one matmul (ffn_model.transformer.fused_in): recomputing
    # either recomputes both
    fused = block == Block.PARALLEL and not {"qkv", "mlp_in"} <= keeps
    return (("qkv", int("qkv" not in keeps or fused)), ("attention_units", attention),
            ("out", int(block == Block.SERIAL and "out" not in keeps)), ("mlp_in", int("mlp_in" not in keeps)))


_recomputed_once = functools.lru_cache(maxsize=256)(_recomputed)


def runtime_recomputed(w: Workload) -> dict:
    """recomputed() of the workload, as its runtime recomputes: under a PyTorch runtime (runtimes.RUNTIMES) selective
    recomputation reruns the whole core attention, q·kᵀ, the softmax, its dropout and p·v (Megatron-LM's
    checkpointed CoreAttention, Korthikanti et al. 2022 §5): 4 attention units where XLA's program recomputes the 2
    of q·kᵀ."""
    r = recomputed(w.model, w.remat, w.schedule, w.mesh)
    if w.precision.accumulation not in runtimes.RUNTIMES or not np.any(np.asarray(w.remat) == Remat.SELECTIVE):
        return r
    core = np.where(np.asarray(w.remat) == Remat.SELECTIVE, np.where(r["attention_units"] > 0, 4, 0),
                    r["attention_units"])
    return {**r, "attention_units": core if np.ndim(core) else int(core)}


def whole_layer_again(remat: str, precision: Precision) -> int:
    """1 where the backward reruns the whole layer's forward, W_out's matmul too: remat full under a PyTorch runtime
    (runtimes.RUNTIMES), whose torch.utils.checkpoint calls the layer's forward function again and keeps what it
    returns (PyTorch docs, torch.utils.checkpoint; Megatron-LM's full recomputation counts 4 forward passes:
    Narayanan et al. 2021, eq. 3); 0 elsewhere (XLA drops W_out's dead recomputed matmul: recomputed()). An array
    of policies (the planner's cells): 0 or 1 each."""
    if precision.accumulation not in runtimes.RUNTIMES:
        return 0
    return int(remat == Remat.FULL) if np.ndim(remat) == 0 else (remat == Remat.FULL).astype(int)


def by_policy(remat, f):
    """f(remat) for one remat policy; for the planner's policies over cells (RematCells: a group's (batch, microbatch,
    mesh) cells, each with the policy it is evaluated under) each cell's f of its own policy: f evaluated once per
    policy the cells have and taken cell by cell (a table of numbers looked up, arrays by np.choose), so that every
    cell's figure is its policy's exactly. f returns a figure (a number or an array) or a dict of them with the same
    keys for every policy."""
    if np.ndim(remat) == 0:
        return f(remat)
    used = remat.used  # RematCells (scaling.core.workload)
    values = [f(n) for n, _ in used]
    if len(used) == 1:
        return values[0]
    at = remat.place  # each cell's policy's place in values
    if not isinstance(values[0], dict):
        return np.asarray(values)[at] if all(np.ndim(v) == 0 for v in values) else np.choose(at, values)
    keys = list(values[0])
    if all(np.ndim(v[k]) == 0 for v in values for k in keys):  # numbers a policy: one table, looked up by the cells
        table = np.array([[v[k] for k in keys] for v in values])[at]
        return {k: table[..., i] for i, k in enumerate(keys)}
    return {k: np.choose(at, [v[k] for v in values]) for k in keys}


def attention_shares(cfg: TransformerConfig, schedule: Schedule, mesh: Mapping) -> tuple[float, float, float]:
    """(executed, model, timed): the layers' mean attention, as a share of a global layer's. Executed, the score
    pairs the program computes: a global layer, and a local one that runs every key block (materialized, or a
    flash band as wide as the keys), T·T; a flash local layer the c + 1 key blocks of b = min(block, T) keys
    each query block's band needs, c = ceil((W − 1)/b): T·(c + 1)·b (ffn_model.attention._band_fwd). Model, the
    pairs a layer keeps: causal T²/2 (the Scaling Book's halving), a window W < T: T·W − W·(W − 1)/2
    (Σ_t min(t + 1, W)). Timed, what a kernel that skips the causal half's blocks runs: a global flash layer
    (nb + 1)/(2·nb) of T·T (nb = T/b), a band all of its (c + 1) blocks. Splash and cuDNN (skips_causal) skip the
    blocks in the program itself: executed = timed = the block pairs with a visible key over nb², (nb + 1)/(2·nb)
    causal, (nb·(c' + 1) − c'·(c' + 1)/2)/nb² with a window (c' = min(c, nb − 1): no padding blocks; splash's
    mask_info block map, b = key_block). Without windows or such a kernel (1, 1, None): the kernels' own causal
    share. Numpy arrays of schedules (the planner's) evaluate element-wise."""
    T = cfg.seq_len
    windows = cfg.layer_windows
    skips = np.asarray(skips_causal(schedule, mesh))
    if not any(windows) and not skips:
        return 1.0, 1.0, None
    flash = np.asarray(runs_flash(schedule, mesh))
    b = np.where(flash, key_block(schedule, T), T)
    nb = T // b
    causal = (nb + 1) / (2 * nb)
    executed = model = timed = 0.0
    for W in windows:
        if W is None:
            executed = executed + np.where(skips, causal, 1.0)
            model, timed = model + 1.0, timed + np.where(flash, causal, 1.0)
            continue
        c = -(-(W - 1) // b)
        banded = flash & (c + 1 < nb)
        # splash / cuDNN: the (query block i, key block j) pairs with a visible key, i - c <= j <= i
        cc = np.minimum(c, nb - 1)
        visited = (nb * (cc + 1) - cc * (cc + 1) / 2) / nb ** 2
        executed = executed + np.where(skips, visited, np.where(banded, (c + 1) * b / T, 1.0))
        model += (T * W - W * (W - 1) / 2) / (T * T / 2)
        timed = timed + np.where(skips, visited, np.where(banded, (c + 1) * b / T, np.where(flash, causal, 1.0)))
    L = len(windows)
    return executed / L, model / L, timed / L


def qk_skew(cfg: TransformerConfig, s, Y, C, executed):
    """MLA's attention FLOPs beyond the units at the mean head dim (qk + v)/2 (TransformerConfig.attn_dim): a matmul
    over qk = H + H_r (s, dq, dk) is 2 units + skew, one over v (p·v, dp, dv) 2 units − skew, skew = s·T²·N·(qk −
    v)/(Y·C) (scaled by the executed share of the pairs); 0 for standard attention. A backward of more than 8 units
    recomputes s (flash; splash's two kernels s twice, dp twice: one more qk than v): + skew; shared scores
    (one_key_block) save one s: − skew per 2 units shared."""
    return s * cfg.seq_len ** 2 * cfg.heads * (cfg.qk_dim - cfg.v_dim) / (Y * C) * executed


def step_flops(w: Workload) -> dict:
    """Matmul FLOPs per device of one step, term by term (module docstring):
    forward = L·(qkv + attention 4 units + out + mlp) + logits; backward = L·(2·(qkv + out + mlp) + attention
    8 or 10 units) + 2·logits; recompute = L·(what the remat policy recomputes, recomputed(): full
    qkv + attention 4 units + out + mlp·(m−1)/m, and mlp/m more under a PyTorch runtime: whole_layer_again);
    model = the matmuls the step needs with the causal half of attention: 6·P_matmul·B-style terms with
    attention counted at T²/2 (Scaling Book transformers page), per device; attention = the part of the total
    that is q·kᵀ and p·v."""
    cfg, mesh, batch_tokens, step, remat, schedule = w.model, w.mesh, w.batch_tokens, w.step, w.remat, w.schedule
    s, t, X, Y, C, d = _dims(cfg, mesh, batch_tokens)
    D, F, N, T, m = cfg.d_model, cfg.d_ff, cfg.heads, cfg.seq_len, cfg.mlp_matrices
    p, S = passes(w), mesh.get("stage", 1)
    L = p["layers"]  # layer-passes over t tokens: the blocks, or a pipeline's executed chunk-iterations
    # MLA: the down-projection whole over tensor (TransformerConfig.qkv_flops_per_token), o of N·H_v
    qkv, out, mlp = t * cfg.qkv_flops_per_token(Y), 2 * t * cfg.o_width * D / Y, 2 * t * D * F * m / Y
    executed, kept, _ = attention_shares(cfg, schedule, mesh)  # local layers' windows (1, 1 without)
    unit = s * T * T * N * cfg.attn_dim / (Y * C) * executed  # MLA: q·kᵀ over H + H_r, p·v over H_v
    skew = qk_skew(cfg, s, Y, C, executed)  # MLA's qk matmuls beyond the mean head dim
    back_skew = skew * (attention_units(schedule, "backward", mesh) > 8)
    logits = 2 * t * D * (cfg.vocab or 0) / Y
    layer_forward = qkv + out + mlp + attention_units(schedule, "forward", mesh) * unit
    terms = {"forward": L * layer_forward + p["head"] * logits}
    model_attn = attention_units(schedule, "forward", mesh) * unit / executed * kept / 2  # the causal half
    model = (cfg.blocks * (qkv + out + mlp + model_attn) + logits) / S
    if step == Step.TRAIN:
        # less layer 0's dead input gradient where XLA drops it (first_layer_dx_dead)
        # (the projections that read the layer's norm: q, k, v; MLA's down-projection and W_q)
        h_proj = 2 * t * D * (cfg.h_split_width / Y + cfg.latent_width)
        dx0 = first_layer_dx_dead(w) * (h_proj + (mlp * (m - 1) / m if cfg.block == Block.PARALLEL else 0.0))
        # MLA's W_d gradient made on its tensor split (its stored layout): 2·t·D·(r_q + r_kv + H_r)/Y, not whole
        dw_d = 2 * t * cfg.qkv_params_whole * (1 - 1 / Y)
        terms["backward"] = (L * (2 * (qkv + out + mlp) - dw_d + attention_units(schedule, "backward", mesh) * unit
                                  + back_skew) + 2 * p["head"] * logits - dx0)
        r = runtime_recomputed(w)
        terms["recompute"] = L * (r["qkv"] * qkv + r["out"] * out + r["mlp_in"] * mlp * (m - 1) / m
                                  + whole_layer_again(remat, w.precision) * mlp / m
                                  + (r["attention_units"] - r["shared_scores"]) * unit - r["shared_scores"] / 2 * skew)
        model *= 3
    terms["total"] = sum(terms.values())
    terms["model"] = model
    units = attention_units(schedule, "forward", mesh) + (
        attention_units(schedule, "backward", mesh) + r["attention_units"] - r["shared_scores"] if step == Step.TRAIN
        else 0)
    skews = (back_skew - r["shared_scores"] / 2 * skew) if step == Step.TRAIN else 0.0
    terms["attention"] = L * (unit * units + skews)  # of the total: the q·kᵀ and p·v matmuls (an upper bound under
    # 1F1B)
    # of the total, what runs inside custom-call kernels (splash's Pallas kernels, cuDNN's), not as the program's dots
    terms["kernels"] = terms["attention"] if schedule.attention in (Attention.SPLASH, Attention.CUDNN) else 0.0
    return terms


# one function, term by term as the module docstring lists them (each axis's terms read together)
def collective_volumes(w: Workload) -> dict[str, dict[str, float]]:
    """{axis: {kind: V bytes}} per device for one step (module docstring). w.compiler: ``min_comm_bytes`` widens
    narrower element types (XLA:CPU runs BF16 collectives in FP32); ``windowed_grad_rs``: XLA:TPU runs the
    gradients' reduce-scatter as a windowed einsum, X+1 chunks of V/X as collective-permutes
    (scaling.step.program's module docstring), V·(X+1)/X."""
    cfg, mesh, batch_tokens, step, precision, schedule, remat = (w.model, w.mesh, w.batch_tokens, w.step, w.precision,
                                                                w.schedule, w.remat)
    min_comm_bytes, windowed_grad_rs = w.compiler.min_comm_bytes, w.compiler.windowed_grad_rs
    s, t, X, Y, C, d = _dims(cfg, mesh, batch_tokens)
    D, H, N, K, S = cfg.d_model, cfg.head_dim, cfg.heads, cfg.kv_heads, mesh.get("stage", 1)
    p = passes(w)
    L, Ls = p["layers"], cfg.blocks / S * pipeline.padding(cfg, schedule, S)  # layer-passes; the layers a device
    # holds (uneven stages: Lmax, the padded stack's slots)
    c = max(precision.compute, min_comm_bytes)
    train = step == Step.TRAIN
    W = c * cfg.params_per_block / Y  # a layer's weights over fsdp (MLA's W_d stored split over tensor too)
    rc = recomputed(cfg, remat, schedule, mesh) if train else {"qkv": 0, "attention_units": 0, "out": 0}
    out: dict[str, dict[str, float]] = {}
    V = cfg.vocab or 0
    E = cfg.embedding_matrices * c * V * D / Y  # the [V, D] matrices gathered (BF16)
    # their gradients reduced (over fsdp, context): the lookup's and the output layer's, tied or not, as often as made
    dE = (p["lookup_iterations"] + p["head_iterations"]) * c * V * D / Y
    zero1 = train and schedule.optimizer_sharding == OptimizerSharding.ZERO1 and spans(d)
    Lw = p["weight_passes"]
    if spans(X):  # a layer's weights gathered for each pass over it: forward and backward (1F1B: its two slots)
        out["fsdp"] = {"all-gather": Lw * (W * (2 if train else 1)) + E
                       - first_layer_dead_gather(w)}
        if train and windowed_grad_rs:
            out["fsdp"]["collective-permute"] = Lw * W * (X + 1) / X
        elif train:
            out["fsdp"]["reduce-scatter"] = Lw * W
        if train and V:
            out["fsdp"]["reduce-scatter"] = out["fsdp"].get("reduce-scatter", 0.0) + dE
    if spans(Y):
        act = c * t * D
        serial = cfg.block == Block.SERIAL
        r = 2 if serial else 1  # reductions over tensor per layer and pass
        # mid = x + o·W_o again: reduced again; a PyTorch runtime's full recompute reruns the MLP's too
        redo = np.maximum(rc["out"], r * whole_layer_again(remat, precision)) if train else 0
        vocab = 0 if cfg.vocab is None else 1  # the lookup, and the output layer's input (and its gradient)
        ends = vocab * act * (p["lookup"] + (p["head"] if train else 0))
        # MLA: the attention's input gradient reduced as the latents' gradients (its up-projections' partial sums),
        # c·t·(r_q + r_kv + H_r), and W_q's input gradient without a q rank, c·t·D, in place of c·t·D
        mla = (c * t * (cfg.latent_width + D * (cfg.h_split_width > 0)) - act) * train if cfg.mla else 0.0
        # layer 0's dead input gradient's reduction (MLA: the latents' gradients are alive, for W_d's)
        dx0 = first_layer_dx_dead(w) * (act if cfg.h_split_width else 0.0)
        if schedule.sequence_parallel:
            # the ends: the lookup's reduce-scatter (its gradient's all-gather), the final norm's all-gather (its
            # gradient's reduce-scatter); a forward step runs the two forwards only
            ends_ag = vocab * act * ((p["lookup"] if train else 0) + p["head"])
            ends_rs = vocab * act * (p["lookup"] + (p["head"] if train else 0))
            out["tensor"] = {"all-gather": L * act * (r * (3 if train else 1)) + ends_ag,
                             "reduce-scatter": L * act * (r * (2 if train else 1) + redo) + ends_rs - dx0}
        else:
            out["tensor"] = {"all-reduce": L * (act * (r * (2 if train else 1) + redo) + mla) + ends - dx0}
        if cfg.mla:  # MLA's down-projection, stored split over tensor, gathered whole for each pass over its layer
            out["tensor"]["all-gather"] = (out["tensor"].get("all-gather", 0.0)
                                           + Lw * c * cfg.qkv_params_whole * (2 if train else 1)
                                           - mla_dead_tensor_gather(w))
        if vocab:  # the loss over the vocabulary shards: the max (BF16 logits), Σ exp and the label's logit (FP32)
            out["tensor"]["all-reduce"] = out["tensor"].get("all-reduce", 0.0) + (c + 8) * t * p["head"]
    if spans(C):  # a recomputed attention forward runs its all-to-alls (of what it does not keep) or K/V permutes again
        again = rc["attention_units"] == 4
        again = int(again) if np.ndim(again) == 0 else again.astype(int)  # an array of policies: one a cell
        if schedule.context == ContextStrategy.ULYSSES:  # q, k, v again where not kept; o where the attention is
            # recomputed
            again_heads = rc["qkv"] * (N + 2 * K) + again * N
            out["context"] = {"all-to-all": L * c * t * H * ((2 * N + 2 * K) * (2 if train else 1) + again_heads) / Y}
        else:
            chunk = t * H * K / Y
            out["context"] = {"collective-permute": L * (ring_permute_bytes(C, chunk, train, c) + again
                                                         * ring_permute_bytes(C, chunk, False, c))}
        if train:  # the gradients over context, on the fsdp shard
            out["context"]["all-reduce"] = (Lw * W + dE) / X
    if S > 1:
        out["stage"] = stage_volumes(w, c)
    if zero1:  # each data shard's partial gradients, the device's flat buffer (a stage's layers and the embeddings,
        # as memory_per_device's master) reduce-scattered over data, the updated FP32 weights all-gathered
        layers = (cfg.params - cfg.embedding_params) / S * pipeline.padding(cfg, schedule, S)  # uneven: Lmax slots
        held = (layers + cfg.embedding_params) / (X * Y)
        out.update(collectives.zero1_volumes(memory.zero1_padded(held, d), max(precision.grad_comm, min_comm_bytes),
                                             precision.master))
    elif spans(d) and train and p["again"]:  # 1F1B: each data shard's partial gradients accumulated through the
        # loop, reduced once after it (ffn_model.pipeline.one_f_one_b): the stage's layers, and the matrices'
        # accumulators (the lookup's and the output layer's; tied one)
        out["data"] = {"all-reduce": (Ls * W + E) / X}
    elif spans(d) and train:
        out["data"] = {"all-reduce": (Lw * W + dE) / X}
    if S > 1 and spans(C) and train and cfg.vocab and not p["again"] and not zero1:
        # GPipe, circular: XLA reduces the output matrix's gradient over context together with data (or, without
        # a data axis, with stage), in one all-reduce
        merged, partner = c * cfg.vocab * D / (X * Y), "data" if spans(d) else "stage"
        out[partner]["all-reduce"] -= merged
        out["context"]["all-reduce"] -= merged
        out[f"{partner}+context"] = {"all-reduce": merged}
    if (S > 1 and spans(d) and train and cfg.vocab and not p["again"] and w.compiler.joint_head_reduce and not zero1
            and not spans(C)):  # GPipe, circular: the output matrix's gradient (c·V·D/(X·Y) over data and over
        # stage above) summed over both in one all-reduce (XLA:TPU: tiny-tf on stage=2,data=4 and stage=2,data=2,fsdp=2)
        joint = c * cfg.vocab * D / (X * Y)
        out["data"]["all-reduce"] -= joint
        out["stage"]["all-reduce"] -= joint
        out["data+stage"] = {"all-reduce": joint}
    if S > 1 and spans(d) and train and cfg.vocab and p["again"] and w.compiler.joint_head_reduce and not zero1:
        # 1F1B: the matrices' accumulated gradients summed over stage and data in one all-reduce each (XLA:TPU), out
        # of the data reduction
        joint = cfg.embedding_matrices * c * cfg.vocab * D / (X * Y)
        out["data"]["all-reduce"] -= joint
        out["stage"]["all-reduce"] -= joint
        out["data+stage"] = {"all-reduce": joint}
    loss_axes = [a for a in ("data", "fsdp", "context", "tensor") if spans(mesh.get(a, 1))  # tensor: the SP output
                 and (a != "tensor" or (schedule.sequence_parallel and cfg.vocab is None))
                 and (a != "data" or not zero1)]
    if zero1:  # each data shard's loss (ffn_model.zero1.data_partials), their mean over data once
        out["data"]["all-reduce"] = 4.0
    if loss_axes:  # the loss: one mean over the tokens, split over these axes together (per microbatch a stage
        key = "+".join(loss_axes)  # holds with stages, GPipe's M/S at once; 1F1B's every iteration)
        out.setdefault(key, {})
        count = 1 if S == 1 else p["head_iterations"] if p["again"] else schedule.microbatches / S
        out[key]["all-reduce"] = out[key].get("all-reduce", 0.0) + 4 * count
    return out


def stage_volumes(w: Workload, c: float) -> dict[str, float]:
    """{kind: V bytes} over ``stage`` per device (ffn_model.pipeline, ffn_model.transformer.transformer_pipeline_loss;
    c the bytes a BF16 element moves as): every iteration a microbatch's activations, c·(t/M)·D, to the next
    stage, and in the backward their gradient back: T·c·(t/M)·D per direction (1F1B with warm-up phases: its
    slots, less the permute nothing reads of a phase of one iteration, which XLA unrolls and drops). GPipe and
    circular: the outputs sent from stage 0 to the stages that run their output layer, S − 1 permutes of c·(t/S)·D
    (and back in the backward); circular, the weights' re-lay (relay_moves rounds of one FP32 chunk of L/(S·R) layers,
    in the forward and again for the gradient). All-reduced over stage (train): GPipe and circular, the input's gradient
    (stage 0's, c·t·D, to the embedding's backward, which every stage runs) and the output matrix's gradient
    (c·V·D/(X·Y)); 1F1B, the k matrices' FP32 accumulators (the lookup's on stage 0, the output layer's on the last;
    tied one), summed in BF16, k·c·V·D/(X·Y); and the loss (4 bytes). Under sequence parallelism every activation,
    gradient and input gradient above is the token split: D -> D/Y (Korthikanti et al. 2022, section 4.2.3: the
    pipeline message scattered over tensor and gathered on arrival, here by the next layer's own all-gather)."""
    cfg, mesh, schedule, train = w.model, w.mesh, w.schedule, w.step == Step.TRAIN
    s, t, X, Y, C, d = _dims(cfg, mesh, w.batch_tokens)
    S, M, p = mesh["stage"], schedule.microbatches, passes(w)
    # sequence parallelism: every activation (and gradient) a stage sends, and the input's gradient, is the token
    # split, D/Y per token (Megatron's scatter/gather of the pipeline message: each tensor rank sends 1/Y of it)
    D = cfg.d_model / (Y if schedule.sequence_parallel else 1)
    directions = 2 if train else 1
    permute = directions * p["iterations"] * c * t / M * D
    if p["again"] and train and schedule.warmup_phases:  # XLA unrolls a phase of one iteration and drops its permute
        # that nothing reads: the cool-down's last input gradient (R·S − 1 = 1), the steady phase's last output
        # (H = 1)
        permute -= ((schedule.repeats * S - 1 == 1) + (p["head_iterations"] == 1)) * c * t / M * D
    if not p["again"]:  # GPipe, circular: the outputs to the stages
        permute += directions * (S - 1) * c * t / S * D
    if schedule.repeats > 1:
        # one chunk's slots: L/(S·R) layers, uneven chunks the largest's Cmax (pipeline.chunk_blocks)
        chunk = w.precision.master * cfg.params_per_block * pipeline.chunk_blocks(cfg, schedule, S) / (X * Y)
        permute += directions * pipeline.relay_moves(S, schedule.repeats) * chunk
    out = {"collective-permute": permute, "all-reduce": 4.0}
    if train and cfg.vocab and p["again"]:  # 1F1B: the matrices' FP32 accumulators (the lookup's on stage 0, the
        # output layer's on the last; tied one), summed in BF16
        out["all-reduce"] += cfg.embedding_matrices * c * cfg.vocab * cfg.d_model / (X * Y)
    elif train and cfg.vocab:
        out["all-reduce"] += c * t * D + c * cfg.vocab * cfg.d_model / (X * Y)
    return out


def ring_permute_bytes(C: int, chunk: int, train: bool, c: int = 2) -> float:
    """Bytes one device sends per layer in ring attention (ffn_model.attention.ring_attention), ``chunk``
    the elements of one K or V chunk (s·(T/C)·(K/Y)·H): forward C − 1 permutes each of K and V (BF16);
    backward C − 1 permutes of the stacked (K, V) (BF16), C − 1 of the stacked gradients (dK, dV) in FP32
    (no rounding while they accumulate) and their last hop home in BF16 (the gradient's dtype; XLA:TPU
    sinks that rounding before the permute itself): c·2(C−1)·chunk + (c·2(C−1) + 4·2(C−1) + c·2)·chunk.
    ``c`` is the bytes of a BF16 element as the backend moves it (4 on XLA:CPU, which widens BF16)."""
    if not spans(C):
        return 0.0
    forward = c * 2 * (C - 1) * chunk
    return forward + ((c * 2 * (C - 1) + 4 * 2 * (C - 1) + c * 2) * chunk if train else 0.0)


def saved_per_layer(cfg: TransformerConfig, mesh: Mapping, batch_tokens, remat: str = "none",
                    schedule: Schedule = Schedule(), precision: Precision = DEFAULT_PRECISION) -> dict:
    """Bytes per device one layer keeps for the backward (ffn_model.transformer.SAVED), term by term:
    remat none: x, norm1, norm2, mid (c·t·D each; /Y under sequence parallelism: the token split;
    a parallel block has one norm and no mid),
    q, k, v (c·t·H·(N+2K)/Y), the attention's residuals (materialized: the BF16 probabilities
    2·s·T²·N/(Y·C); flash and ring: o c·t·N·H/Y and the FP32 log-sum-exp 4·t·N/Y), its output for W_o
    (c·t·N·H/Y; the same array as a local flash's or ring's o), the MLP hidden c·t·F·(m−1)/Y;
    remat full: x only (Korthikanti et al. 2022, eq. 1-2, without dropout, with RMSNorm); selective: none's
    but the probabilities; MaxText's named policies (POLICY_KEEPS): x, and of q, k, v, o·W_o after its
    reduction (c·t·D, /Y under SP) and the MLP hidden those they keep. An array of policies (RematCells): each
    cell's terms under its policy, 0 for a term its policy has not (SAVED_TERMS, in an order that keeps each policy's
    own: the terms' sum is each cell's policy's exactly)."""
    one = _saved_terms(cfg, mesh, batch_tokens, schedule, precision)
    if np.ndim(remat) == 0:
        return one(remat)
    return by_policy(remat, lambda r: (lambda kept: {k: kept.get(k, 0.0) for k in SAVED_TERMS})(one(r)))


SAVED_TERMS = ("x", "norms", "mid", "qkv", "attention", "attn_out", "attn_proj", "mlp")  # saved_per_layer's, in order


def _saved_terms(cfg: TransformerConfig, mesh: Mapping, batch_tokens, schedule: Schedule, precision: Precision):
    """saved_per_layer's terms as a function of the remat policy, what every policy shares made once (the planner
    sizes every policy of a schedule together)."""
    s, t, X, Y, C, d = _dims(cfg, mesh, batch_tokens)
    D, F, N, T, m = cfg.d_model, cfg.d_ff, cfg.heads, cfg.seq_len, cfg.mlp_matrices
    c = precision.compute
    xs = c * t * D / (Y if schedule.sequence_parallel else 1)
    serial = cfg.block == Block.SERIAL  # parallel: one norm, no mid
    # MLA: q, k (its shared rope part broadcast to every head), v, and the latents before their norms, whole over
    # tensor (kept with q, k, v: the up-projections' inputs, their norms recomputed)
    qkv, mlp = c * t * (cfg.qkv_width / Y + cfg.latent_width), c * t * F * (m - 1) / Y
    o_w = cfg.o_width  # o, W_o's input: N·H_v
    flash = runs_flash(schedule, mesh)
    # the norms' outputs: not kept under sequence parallelism (recomputed and all-gathered again)
    kept = {"x": xs, "norms": 0.0 if schedule.sequence_parallel else (2 if serial else 1) * xs,
            "mid": xs if serial else 0.0, "qkv": qkv}
    if flash:
        # o as the attention's residual and again as W_o's input (named attn_out after its sharding constraint):
        # two arrays, but for ring attention, whose o is W_o's input as it is
        separate_o = not (spans(C) and schedule.context == ContextStrategy.RING)
        attention, attn_out = c * t * o_w / Y + 4 * t * N / Y, c * t * o_w / Y if separate_o else 0.0
    else:  # selective: the probabilities recomputed
        attention, attn_out = 2 * s * T * T * N / (Y * C), c * t * o_w / Y

    def terms(remat: str) -> dict:
        keeps = POLICY_KEEPS[remat]
        if remat != Remat.NONE and remat != Remat.SELECTIVE:  # the named policies: x and what they keep
            return {"x": xs, "qkv": qkv if "qkv" in keeps else 0.0,
                    "attention": attention if "attention" in keeps else 0.0,
                    "attn_proj": xs if "out" in keeps and serial else 0.0, "mlp": mlp if "mlp_in" in keeps else 0.0}
        return {**kept, "attention": attention if flash or remat == Remat.NONE else 0.0, "attn_out": attn_out,
                "mlp": mlp}
    return terms


def offloaded_per_layer(cfg: TransformerConfig, mesh: Mapping, batch_tokens, remat: str = "none",
                        schedule: Schedule = Schedule(), precision: Precision = DEFAULT_PRECISION) -> float:
    """Bytes per device of one layer's saved residuals an offloading policy (OFFLOADED) places in pinned host memory:
    of saved_per_layer's terms, q, k, v (c·t·H·(N+2K)/Y) and, for input_qkv_offloaded, the layer's input x (c·t·D,
    /Y under SP); 0 for the other policies. MaxText's qkv_proj_offloaded and its v6e Llama 3.1 70B recipe's custom
    policy (decoder_layer_input and the q/k/v projections offloaded), with jax's save_and_offload_only_these_names.
    An array of policies (the planner's cells): by_policy."""
    if np.ndim(remat):
        if not set(remat.names) & set(OFFLOADED):
            return 0.0
        return by_policy(remat, lambda r: offloaded_per_layer(cfg, mesh, batch_tokens, r, schedule, precision))
    where = OFFLOADED.get(remat, set())
    if not where:
        return 0.0
    kept = saved_per_layer(cfg, mesh, batch_tokens, remat, schedule, precision)
    return float(sum(v for k, v in kept.items() if k in where))


def host_memory_per_device(w: Workload) -> float:
    """Bytes per device in pinned host memory (an offloading policy's, OFFLOADED; 0 where the compiler keeps them in
    device memory, CompilerFacts.host_offload): the layer-passes' offloaded residuals, p["layers"]·offloaded_per_layer
    (memory_per_device leaves them out of the device's peak)."""
    if w.step != Step.TRAIN or not w.compiler.host_offload or w.remat not in OFFLOADED:
        return 0.0
    S = w.mesh.get("stage", 1)
    M = w.schedule.microbatches if S > 1 else 1
    tokens = w.batch_tokens / w.schedule.microbatches if S > 1 else w.batch_tokens
    p = passes(w)
    per = offloaded_per_layer(w.model, w.mesh, tokens, w.remat, w.schedule, w.precision)
    return float((p["chunk"] if p["again"] else p["layers"] * M) * per)


def _pick(cond, a, b):
    """np.where(cond, a, b), a float where cond is one value (the planner's arrays stay arrays)."""
    r = np.where(cond, a, b)
    return float(r) if np.ndim(r) == 0 else r


# one function, term by term as its docstring lists them (terms["total"] their sum)
def memory_per_device(w: Workload) -> dict:
    """Bytes per device, term by term: the FP32 state (16 B per parameter, the matrices sharded over
    fsdp·tensor), L layers' saved activations (saved_per_layer), the
    batch (x BF16 and y FP32, 6·t·D), two layers' gathered BF16 weights (layer_weight_bytes: the scan
    prefetches the next layer's), one layer's weight gradients in FP32 before their reduce-scatter, under
    full remat instead one layer's gathered weights and no FP32 layer gradient (the backward's iteration
    gathers its own layer for the recomputation, and makes each weight's gradient in BF16 after the matmuls
    that need that weight, reduce-scattering it as made) and the residuals the backward's layer recomputes
    (saved_per_layer "none" less its x), and
    the attention's working set in one layer: materialized, the backward's FP32 dp and BF16 ds and p
    (8 B per score; XLA fuses the rest), the forward's FP32 scores (4 B per score: the probabilities
    are fused into the p·v matmul); flash, the same per key block; splash, none (VMEM), and in training without
    stages under any policy but full splash_backward_layer in place of the gathered weights and the FP32 layer
    gradient. With a vocabulary: int32 ids and
    labels as the batch, and the loss's phase, c·(t·D + t·V/Y + V·D/Y) (the final norm's output, the
    BF16 logits, the gathered U), where it exceeds a layer's transients. With repeats R > 1 on stages, the
    re-laid FP32 copy of the stage's layers (master·P_layers/(S·X·Y)). Under full remat with ring attention
    the forward's phase, where it exceeds the backward's (ring_forward_phase). A forward step holds the master
    weights, one layer's gathered weights (none without fsdp: the casts fuse into the matmuls) and
    working set. Pipeline stages under sequence parallelism: the stage inputs 1F1B keeps, the pipeline's buffers and
    the input's gradient are the token split, c·t·D/Y each. An offloading policy (OFFLOADED) where the compiler
    places its residuals in pinned host memory (CompilerFacts.host_offload): those residuals left out of the saved
    activations (host_memory_per_device; compiled on v5p, the peak drops by all the offloaded bytes: the reloaded
    layer is not at the peak). Local and global layers mixed: the group's g − 1 upper layers' FP32 gradient shards
    (group_held_grads). A PyTorch runtime (Precision.accumulation: scaling.step.runtimes) its own terms. (Each term
    is an allocation of XLA's memory-usage report:
    docs/findings.md, memory.) An array of remat policies (the planner's cells, each its own): each cell's terms as
    under its policy alone, a term its policy has not 0 (by_policy)."""
    cfg, mesh, batch_tokens, remat, schedule, precision, step = (w.model, w.mesh, w.batch_tokens, w.remat,
                                                                w.schedule, w.precision, w.step)
    S = mesh.get("stage", 1)
    p = passes(w)
    if S > 1:  # a pipeline's layers run on microbatches (module docstring, "Pipeline stages")
        batch_tokens = batch_tokens / schedule.microbatches
    s, t, X, Y, C, d = _dims(cfg, mesh, batch_tokens)  # s, t: a microbatch's with stages
    D, N, T = cfg.d_model, cfg.heads, cfg.seq_len
    L = cfg.blocks
    train = step == Step.TRAIN
    full = train and remat == Remat.FULL  # an array of policies: an array
    cells = np.ndim(full) > 0
    layer_params = (cfg.params - cfg.embedding_params) * pipeline.padding(cfg, schedule, S)  # uneven: S·Lmax slots
    shard = layer_params / (S * X * Y) + cfg.embedding_params / (X * Y)  # parameters per device
    flash = runs_flash(schedule, mesh)
    keys = key_block(schedule, T // C if schedule.context == ContextStrategy.RING else T) if flash else T
    score_bytes = (8 if train else 4) * s * T * keys * N / (Y * C)
    splash = np.asarray(schedule.attention) == Attention.SPLASH  # its score blocks in VMEM: no HBM working set
    score_bytes = _pick(splash, 0.0, score_bytes)
    V = cfg.vocab or 0
    terms = {"master": precision.master * shard}
    if train:
        # ZeRO-1: the moments the device's slice of its padded flat buffer (scaling.step.memory.zero1_padded)
        terms["optimizer"] = precision.adam_moments * precision.adam_moment * memory.zero1_slice(w, shard)
        # the layers' FP32 gradients (ZeRO-1: each data shard's partial sums, whole); the embeddings' are made after
        # the layers' backward and consumed by the update (XLA schedules dU's matmul after the scan): at neither peak
        # below
        terms["grads"] = precision.grad * layer_params / (S * X * Y)
    M = schedule.microbatches if S > 1 else 1
    terms.update({"inputs": M * (8 * t if V else (precision.compute + 4) * t * D),  # int32 ids and labels, or x, y
             # forward without fsdp: nothing gathered, XLA fuses each FP32 -> BF16 cast into its matmul (the
             # seed-000 layer's memory-usage report on v5p: no bf16 weight buffer)
             "transient_weights": ((np.where(full, 1, 2) if cells else 1 if full else 2) if train
                                   else 1 if spans(X) else 0) * layer_weight_bytes(cfg, mesh, precision),
             "attention_working_set": score_bytes})
    if train and (cells or not full):  # one layer's FP32 weight gradients as the matmuls make them, before the BF16
        # reduce-scatter (1F1B: the chunk's, all its layers': jax.vjp returns them at once, before they join the
        # accumulators)
        grads = ((L / S * pipeline.padding(cfg, schedule, S) if p["again"] else 1) * precision.grad
                 * layer_weight_bytes(cfg, mesh, precision) / precision.compute)
        terms["layer_grads"] = np.where(full, 0.0, grads) if cells else grads
    if train and S == 1 and np.any(kept := splash & ~np.asarray(full, bool)):  # splash's backward holds neither
        # gathered layer nor FP32 layer gradient at its peak, but its own arrays (splash_backward_layer)
        back = sum(splash_backward_layer(cfg, mesh, batch_tokens, schedule, precision).values())
        terms["transient_weights"] = _pick(kept, 0.0, terms["transient_weights"])
        terms["layer_grads"] = _pick(kept, 0.0, terms["layer_grads"])
        terms["splash_backward"] = _pick(kept, back, 0.0)
    if train and np.any(held := group_held_grads(cfg, mesh, precision)):  # local and global layers: the group's
        # upper layers' FP32 gradient shards, held until its scan iteration ends (an array over the planner's meshes)
        terms["group_grads"] = held
    saved_terms = _saved_terms(cfg, mesh, batch_tokens, schedule, precision)  # saved_per_layer's
    saved = by_policy(remat, lambda r: sum(saved_terms(r).values()))
    # an offloading policy's residuals in pinned host memory (host_memory_per_device), out of the saved activations
    off = offloaded_per_layer(cfg, mesh, batch_tokens, remat, schedule, precision) if w.compiler.host_offload else 0
    c = precision.compute
    x_between = c * t * D / (Y if schedule.sequence_parallel else 1)  # a microbatch between layers (SP: token split)
    if train and p["again"]:  # 1F1B: the chunk residuals of every slot of the ring (what the policy keeps; under
        # full each layer's input: scaling.step.pipeline.microbatches_in_flight) and one chunk's more beside it, a
        # slot's copy (the compiler's peak on v5p, PIPE_TF on stage=4, tensor=2, M = 8: 22.90 GB, 2.45 GB over the
        # ring's 7 chunks alone, one chunk's residuals 2.28 GB)
        in_flight = pipeline.microbatches_in_flight(schedule, S, remat)
        terms["activations"] = (in_flight + 1) * p["chunk"] * (saved - off)
    elif train:  # every layer-pass's residuals (GPipe and circular: every iteration's, bubble ones included)
        terms["activations"] = p["layers"] * M * (saved - off)
    if S > 1 and schedule.repeats > 1:  # circular and interleaved 1F1B: the stage's FP32 layers re-laid so that stage
        # s holds chunks s, S + s, ... (ffn_model.pipeline.relay), a copy beside the masters (the FFN stack's too)
        terms["relaid"] = precision.master * layer_params / (S * X * Y)
    k = cfg.embedding_matrices
    if S > 1 and p["again"] and V:  # 1F1B with a vocabulary: the ids go in, stage 0 looks each microbatch up in the
        # loop: the matrices' FP32 gradient accumulators, and the gathered E beside U (untied)
        terms["pipeline_buffers"] = 4 * k * V * D / (X * Y) + (k - 1) * c * V * D / Y
    elif S > 1:  # the embedded batch given to every stage, and the microbatch buffer (GPipe) or the input's
        # gradient (1F1B)
        terms["pipeline_buffers"] = 2 * M * x_between
    if train and np.any(remat != Remat.NONE):  # the layer whose backward runs holds its recomputed forward's residuals
        terms["recomputed_layer"] = sum(saved_terms("none").values()) - saved
        if cells:
            terms["recomputed_layer"] = np.where(remat != Remat.NONE, terms["recomputed_layer"], 0.0)
    if train and V:  # the loss's phase: the norm's output, the BF16 logits and the gathered U, beside the saved
        # activations; the peak is the larger of it and a layer's phase (the transients above)
        layer = sum(terms.get(k, 0.0) for k in ("transient_weights", "attention_working_set", "layer_grads",
                                                 "recomputed_layer", "splash_backward", "group_grads"))
        th = t * M * p["head"] if not p["again"] else t  # the head's tokens at once (1F1B: a microbatch's)
        loss = precision.compute * (th * D + th * V / Y + V * D / Y)
        # 1F1B: the head's forward and backward run in the iteration of a chunk's backward, beside it
        # GPipe and circular: the head runs between the pipeline's forward and backward, beside every residual
        terms["loss_phase"] = loss if S > 1 else np.maximum(0.0, loss - layer)
    if np.any(full) and S == 1 and spans(C) and schedule.context == ContextStrategy.RING:  # the forward's phase,
        # where it is the higher
        forward = (terms["master"] + terms["optimizer"] + terms["inputs"] + terms["activations"]
                   + ring_forward_phase(cfg, mesh, batch_tokens, schedule, precision))
        terms["ring_forward_phase"] = np.maximum(0.0, forward - sum(terms.values()))
        if cells:
            terms["ring_forward_phase"] = np.where(full, terms["ring_forward_phase"], 0.0)
    if train and precision.accumulation in runtimes.RUNTIMES:  # a PyTorch runtime keeps what its code keeps
        tokens = w.batch_tokens / schedule.microbatches  # a microbatch's: the runtimes accumulate over them
        none = saved_per_layer(cfg, mesh, tokens, "none", schedule, precision)
        return runtimes.runtime_memory(w, terms, sum(none.values()))
    if train and np.any(zero1 := memory.zero1_update(w, terms, shard)):  # ZeRO-1's update phase, where the higher
        terms["zero1_update"] = zero1
    terms["total"] = sum(terms.values())
    return terms


def ring_forward_phase(cfg: TransformerConfig, mesh: Mapping, batch_tokens, schedule: Schedule = Schedule(),
                       precision: Precision = DEFAULT_PRECISION) -> float:
    """Bytes per device the forward of a full-remat train step holds with ring attention (ffn_model.attention's
    ring_attention over a context axis of C devices), beside the state (master, moments), the batch and the L saved
    layer inputs; memory_per_device's peak is the larger of that phase and the backward's. Per device: s sequences,
    chunks of Tc = T/C tokens (t = s·Tc), N/Y query and K/Y kv heads, key blocks of b = min(attention_block, Tc):

    held    = C·s·(N/Y)·Tc·(4·b + Tc + 4·H)
    working = 4·s·(N/Y)·Tc·b + 8·t·(N/Y)·H + c·t·(D + (N + 4·K)·H/Y)
              + [C > 2, Tc > b]·s·(N/Y)·Tc·(4·b + Tc)

    held: the ring's forward is the fwd rule of a custom_vjp, linearized inside the layer's jax.checkpoint; jax's
    partial evaluation of the layer scan moves what depends on neither the layer's input nor its weights out of
    the loop (loop-invariant residuals: what the ring derives from axis_index and the step alone), and that of the
    ring's own scan comes out stacked over its steps. For each of the C steps (the scan's C − 1 as [C − 1, ...]
    arrays, and the last) it holds the −inf operand of the scores' causal `where` broadcast to one key block's FP32
    scores (4·s·(N/Y)·Tc·b), the visibility mask broadcast to the whole chunk's scores (PRED, 1 byte each:
    s·(N/Y)·Tc², the nb = Tc/b key blocks' masks) and the FP32 zeros the flash forward starts its o from
    (4·t·(N/Y)·H); a few [s, N/Y, Tc] FP32 statistics per step are left out (0.2% of it at the
    configuration below). XLA computes them once, before the layers' forward loop, and holds them through it; the
    backward's loop recomputes each layer without them (in the program compiled for v6e:4x4 below their live
    ranges end with the forward loop). Not a fixed share of the step: with C, s and the heads it grows as C times
    a chunk's scores.
    working, at the forward's peak (a ring step's flash forward on one key block): the key block's FP32 scores,
    4·s·(N/Y)·Tc·b; two FP32 o's, the flash step's accumulator and the ring's running merge, 8·t·(N/Y)·H; the
    attention's inputs, the layer input x, q, k and v, and the K/V pair in flight to the next device,
    c·t·(D + (N + 4·K)·H/Y); and where both the ring's scan and the flash forward's scan over key blocks are loops
    of more than one trip (C > 2 and nb > 1), that step's −inf scores and masks dynamic-sliced out of the held
    stacks into copies the key-block loop takes, s·(N/Y)·Tc·(4·b + Tc). Where either runs one trip XLA drops that
    loop and reads the stacks in place: at C = 2 the [1, ...] stacks' one step, at nb = 1 the step's slice fused
    into the score computation. No gradient exists yet, and the backward's gathered weights and recomputed
    residuals are not made.

    Source: XLA's buffer assignment and live ranges of the compiled program (jax 0.10.2, libtpu 0.0.42.1): the
    4096-wide transformer (32 heads, 8 kv heads, F = 16384, 4 layers, T = 4096, 16 sequences) at fsdp=4,
    context=4 on v6e:4x4, flash key blocks of 512: C = 4, s = 4, Tc = 1024 gives held 1.88 GB
    (f32[3,4,8,4,1024,512], pred[3,2,4,8,4,1024,512], f32[3,4,1024,8,4,128] and the last step's three) and
    working 0.91 GB; the forward's peak 5.13 GB against 4.26 GB for the backward's; at fsdp=8, context=2 (s = 4,
    Tc = 2048) held 2.42 GB and working 1.01 GB, no slice copies; medium-tf at fsdp=4, context=4 on v5p:2x2x4
    (s = 32, Tc = b = 512) held 3.22 GB and working 1.07 GB, no slice copies (docs/findings.md, "Full remat's
    peak"). Other remat policies and pipeline stages: not examined."""
    s, t, X, Y, C, d = _dims(cfg, mesh, batch_tokens)
    D, N, K, H, T = cfg.d_model, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.seq_len
    Tc = T // C
    b = np.minimum(schedule.attention_block, Tc)
    heads = N / Y
    held = C * s * heads * Tc * (4 * b + Tc + 4 * H)
    # the step's copies out of the ring scan's stacks, into the key-block loop (both loops of more than one trip)
    sliced = ((np.asarray(C) > 2) & (Tc > b)) * s * heads * Tc * (4 * b + Tc)
    working = 4 * s * heads * Tc * b + 8 * t * heads * H + precision.compute * t * (D + (N + 4 * K) * H / Y) + sliced
    return held + working


def hbm_traffic_bytes(w: Workload) -> float:
    """HBM bytes per device per step, as scaling.step.memory.hbm_traffic_bytes counts the FFN stack's: AdamW
    reads 16 and writes 12 B per parameter shard; the gathered weights read by the forward, dX and dW
    matmuls, 3·L·W; the saved activations written and read once (forward: the master weights once,
    the gathered weights once, each layer's activations written and read once)."""
    cfg, mesh, batch_tokens, step = w.model, w.mesh, w.batch_tokens, w.step
    schedule, precision = w.schedule, w.precision
    _, _, X, Y, _, _ = _dims(cfg, mesh, batch_tokens)
    W = cfg.blocks * layer_weight_bytes(cfg, mesh, precision)
    saved = cfg.blocks * sum(saved_per_layer(cfg, mesh, batch_tokens, "none", schedule, precision).values())
    if step == Step.FORWARD:
        return precision.master * cfg.params / (X * Y) + W + 2 * saved
    optimizer = precision.adam_update_bytes_per_param
    return optimizer * cfg.params / (X * Y) + 3 * W + 2 * saved


def runtime_layer_kernels(w: Workload, calls, arrays: dict, flash, loss_elements, head_calls) -> list[Kernel]:
    """A PyTorch runtime's memory-bound kernels of the step (scaling.step.launches.layer_kernels: ``arrays`` its A, P,
    F and S of a microbatch, ``calls`` the layer-passes), what its recomputation reruns of them (runtime_recomputed:
    the score ops with the attention's units, the rest with the projections, all of it under full recompute), and
    its optimizer's passes (AdamW's update, the accumulation, launches.optimizer_kernel)."""
    cfg, mesh, remat, precision = w.model, w.mesh, w.remat, w.precision
    train = w.step == Step.TRAIN
    r = runtime_recomputed(w) if train else None
    redo = {"scores": r["attention_units"] / 4, "rest": np.maximum(
        whole_layer_again(remat, precision), (r["qkv"] + r["out"] + r["mlp_in"]) / 3)} if train else None
    ks = launches.layer_kernels(w, calls, redo, arrays, flash, loss_elements, head_calls)
    if train:
        shards = memory.weight_shards(mesh) * w.zero1_shards / mesh.get("stage", 1)
        ks += [adamw_kernel(w, cfg.params), accumulate_kernel(w, cfg.params),
               launches.optimizer_kernel(w, cfg.params, shards)]
    return ks


def xla_gpu_layer_copies(w: Workload, calls, tm, train: bool) -> list[Kernel]:
    """The copies XLA:GPU makes around each layer of the package's scanned program, each a pointwise kernel of its own
    (Kernel.only "gpu": XLA:TPU fuses them into the matmuls and writes), per layer-pass of a microbatch (tm tokens a
    device; read from the compiled programs, gpu:H100, jax 0.10.2: docs/findings.md, "What XLA:GPU runs around the
    package's program"):
      residuals  the forward writes each residual it keeps for the backward (saved_per_layer) into the scan's stacks,
                 which XLA first fills with zeros: written, read, written (3 × the saved bytes)
      layouts    q, k, v and the attention's output transposed to and from the attention's [b, heads, T, H] layout,
                 c·t·H·(2N + 2K)/Y, and the fused MLP input's output [t, (m − 1)·F/Y] to its matrices', c·t·F·(m−1)/Y,
                 each read and written, forward and backward."""
    cfg, mesh, c = w.model, w.mesh, w.precision.compute
    Y = mesh.get("tensor", 1)
    M = w.schedule.microbatches
    saved = sum(saved_per_layer(cfg, mesh, w.batch_tokens / M, w.remat, w.schedule, w.precision).values())
    layouts = 2 * c * tm * (cfg.qkv_width + cfg.o_width + cfg.d_ff * (cfg.mlp_matrices - 1)) / Y
    n = calls
    out = [Kernel("residual_saves", KernelPass.FORWARD, KernelKind.POINTWISE, None, n, 0.0, 3 * n * saved,
                  only=Platform.GPU),
           Kernel("layouts", KernelPass.FORWARD, KernelKind.POINTWISE, None, 2 * n, 0.0, n * layouts,
                  only=Platform.GPU)]
    if train:
        out.append(Kernel("layouts", KernelPass.BACKWARD, KernelKind.POINTWISE, None, 2 * n, 0.0, n * layouts,
                          only=Platform.GPU))
    return out


# one list, kernel by kernel in the step's order (compute_term sums them in it)
def qk_norm_kernels(w: Workload, calls, forward_bytes) -> list[Kernel]:
    """QK-norm's passes (the program's ffn_model.transformer._named: the norm of the saved q and k, so that the
    backward recomputes it from them, no matmul again): forward the two norms (q's and k's) of each of ``calls``
    layer-passes, reading and writing c·t·H·(N + K)/Y; in a train step the backward twice that and the recomputed
    forward once (every policy: the normalized q and k are not saved) (scaling.step.kernels.pass_kernels)."""
    return pass_kernels("qk_norm", w, 2 * calls, forward_bytes, recomputed=True)


def latent_norm_kernels(w: Workload, calls, tm) -> list[Kernel]:
    """MLA's latent norms (ffn_model.transformer.mla_projection): RMSNorm of c_q [r_q] (with a q rank) and of c_kv
    [r_kv] a layer-pass of tm tokens, reading and writing c·tm·(r_q + r_kv); a train step's backward twice that, and
    the recomputed forward once where the policy recomputes the up-projections' inputs (every policy but none: the
    latents are kept before their norms) (scaling.step.kernels.pass_kernels)."""
    cfg = w.model
    n = 2 if cfg.q_lora_rank else 1
    fwd = 2 * w.precision.compute * tm * calls * ((cfg.q_lora_rank or 0) + cfg.kv_lora_rank)
    return pass_kernels("latent_norm", w, n * calls, fwd, recomputed=bool(np.any(w.remat != Remat.NONE)))


# one function, the kernels pass by pass in the order the step runs them (each pass's terms beside its rule)
def step_kernels(w: Workload) -> list[Kernel]:
    """The transformer's kernels (module docstring), from the closed forms' counts (passes,
    recomputed, attention_units)."""
    cfg, mesh, step, remat, schedule, precision = w.model, w.mesh, w.step, w.remat, w.schedule, w.precision
    s, t, X, Y, C, d = _dims(cfg, mesh, w.batch_tokens)
    D, F, N, K, H, T, m = cfg.d_model, cfg.d_ff, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.seq_len, cfg.mlp_matrices
    V, c = cfg.vocab or 0, precision.compute
    p = passes(w)
    M = schedule.microbatches
    tm = t / M  # tokens of one call (a microbatch's, per device)
    calls = p["layers"] * M  # layer-passes of tm tokens
    ring = spans(C) and schedule.context == ContextStrategy.RING
    Tq = T / C if ring else T
    heads = N / Y / (1 if ring else C)  # heads a device runs attention for
    seqs = s / M  # sequences of one call
    executed, _, timed = attention_shares(cfg, schedule, mesh)  # local layers' windows (1, 1 without)
    unit = s * T * T * N * cfg.attn_dim / (Y * C) * executed  # one attention unit over the step's t tokens (step_flops)
    skew = qk_skew(cfg, s, Y, C, executed)  # MLA's qk matmuls beyond the mean head dim (step_flops)
    flash = runs_flash(schedule, mesh)
    nb = np.maximum(T / (C if ring else 1) / key_block(schedule, T), 1.0)
    # the causal blocks a flash kernel runs: its time, not the program's FLOPs (Kernel.flops stays the count)
    skip = ((nb + 1) / (2 * nb) if flash else 1.0) if timed is None else timed / executed
    qkv_n, out_k, ff = H * (N + 2 * K) / Y, cfg.o_width / Y, F / Y
    bs = C if ring else 1  # ring: C chunk pairs of (T/C)² per call
    train = step == Step.TRAIN

    def layer(pass_, share, what=("qkv", "out", "mlp_in", "mlp_out"), units=4, where=None, skewed=0.0):
        """One kind of pass over the layers: ``share`` of the layer-passes; forward shapes. ``where`` (an array of
        policies, the planner's cells): {matmul: 1 in the cells that run it, else 0}, its calls (FLOPs, bytes) 0
        elsewhere; ``units`` an array then, the attention's calls 0 where it is 0. ``skewed``: MLA's attention FLOPs
        beyond ``units`` at the mean head dim (qk_skew), a layer-pass."""
        n_calls = calls * share
        runs = (lambda name: n_calls) if where is None else (lambda name: n_calls * where[name])  # noqa: E731
        ks = []
        if "qkv" in what and cfg.mla:  # the down-projection (whole over tensor), q's (or W_q) and k, v's up-projections
            rq, qk = cfg.q_lora_rank, N * cfg.qk_dim / Y
            ks += [matmul_kernel("qkv.down", pass_, tm, cfg.latent_width, D, runs("qkv"), c),
                   matmul_kernel("qkv.q", pass_, tm, qk, rq or D, runs("qkv"), c),
                   matmul_kernel("qkv.kv", pass_, tm, N * (H + cfg.v_dim) / Y, cfg.kv_lora_rank, runs("qkv"), c)]
        elif "qkv" in what:
            ks.append(matmul_kernel("qkv", pass_, tm, qkv_n, D, runs("qkv"), c))
        if np.ndim(units) or units:
            n_att = n_calls * (units > 0) if np.ndim(units) else n_calls
            # flash: the scores stay on chip, only q, k, v and o move (k, v of the kv heads)
            moved = c * n_att * seqs * bs * Tq * heads * (cfg.qkv_width + cfg.o_width) / N if flash else None
            ks.append(matmul_kernel("attention", pass_, Tq, Tq, cfg.attn_dim, n_att, c, batch=seqs * heads * bs,
                                    kind="attention", flops_=(units * unit + skewed) * p["layers"] * share,
                                    bytes_=moved,
                                    executed=skip))
        if "out" in what:
            ks.append(matmul_kernel("out", pass_, tm, D, out_k, runs("out"), c))
        if "mlp_in" in what:
            ks.append(matmul_kernel("mlp_in", pass_, tm, ff, D, runs("mlp_in") * (m - 1), c))
        if "mlp_out" in what:
            ks.append(matmul_kernel("mlp_out", pass_, tm, D, ff, runs("mlp_out"), c))
        return ks

    def transposed(k: Kernel) -> list[Kernel]:
        """The backward of a forward matmul [m,k]·[k,n]: dX [m,n]·[n,k] and dW [k,m]·[m,n]."""
        mm, nn, kk, b = k.shape
        # attention: 8 or 10 units backward (scaling.families.transformer.attention_units), shapes of the forward
        if k.kind == KernelKind.ATTENTION:  # (MLA: the recomputed s of a backward of more than 8 units, qk_skew)
            units = attention_units(schedule, "backward", mesh)
            moved = shape_costs(*k.shape, k.calls, c)[1] if k.bytes is None else k.bytes
            flops = k.flops * (units + (units > 8) * skew / unit) / 4
            return [Kernel(k.name, "backward", k.kind, k.shape, k.calls, flops, moved * 2, k.executed)]
        # MLA's W_d gradient made on its tensor split (its stored layout: step_flops)
        dw_rows = nn / Y if k.name == "qkv.down" else nn
        return [matmul_kernel(k.name + ".dx", "backward", mm, kk, nn, k.calls, c),
                matmul_kernel(k.name + ".dw", "backward", kk, dw_rows, mm, k.calls, c)]

    forward = layer("forward", 1.0)
    ks = list(forward)
    th = t * p["head"]
    staged = not np.all(np.asarray(mesh.get("stage", 1)) == 1)  # one stage count per planner group
    head_calls = p["head_iterations"] if p["again"] else (1 if staged else M)
    logits = matmul_kernel("logits", "forward", th / head_calls, V / Y, D, head_calls, c) if V else None
    if logits is not None:
        ks.append(logits)
    if train:
        # layer 0's input gradient, one call of each a microbatch, where XLA drops it (first_layer_dx_dead): the q, k,
        # v one, and a parallel block's fused MLP-input one (m - 1 matrices)
        dead = first_layer_dx_dead(w)
        dead_calls = {"qkv.dx": 1, "mlp_in.dx": (m - 1) * (cfg.block == Block.PARALLEL),  # MLA: the matrices that
                      "qkv.down.dx": 1, "qkv.q.dx": int(not cfg.q_lora_rank)}  # read the norm: W_d, and W_q
        for k in forward + ([logits] if logits is not None else []):
            ks += [dataclasses.replace(b, calls=b.calls - dead * M * dead_calls[b.name]) if dead_calls.get(b.name)
                   else b for b in transposed(k)]
        r = runtime_recomputed(w)
        if np.ndim(remat):  # the planner's cells, each its own policy: every matmul some policy recomputes, with its
            # calls in the cells whose policy does (each cell's kernels those of its policy, in the same order)
            again = {"mlp_out": whole_layer_again(remat, precision)}
            ks += layer("recompute", 1.0, ("qkv", "out"), units=r["attention_units"] - r["shared_scores"], where=r,
                        skewed=-r["shared_scores"] / 2 * skew)
            ks += layer("recompute", 1.0, ("mlp_in",), units=0, where=r)
            ks += layer("recompute", 1.0, ("mlp_out",), units=0, where=again) if np.any(again["mlp_out"]) else []
        else:
            ks += layer("recompute", 1.0, tuple(n for n in ("qkv", "out") if r[n]),
                        units=r["attention_units"] - r["shared_scores"], skewed=-r["shared_scores"] / 2 * skew)
            if r["mlp_in"]:
                ks += layer("recompute", 1.0, ("mlp_in",), units=0)
            if whole_layer_again(remat, precision):
                ks += layer("recompute", 1.0, ("mlp_out",), units=0)
    # pointwise passes (module docstring), per layer-pass of t tokens (sequence parallel: the D-wide ones on t/Y)
    sp = Y if schedule.sequence_parallel else 1
    norms, adds = (1, 1) if cfg.block == Block.PARALLEL else (2, 2)
    per_token = (norms * 2 + adds * 3) * c * D / sp + c * m * ff
    scores = 0 if flash else 2 * c * unit / cfg.attn_dim  # the softmax reads and writes the s·N·T²/(Y·C) scores
    fwd_bytes = p["layers"] * (per_token * t + scores)
    head_bytes = 2 * c * th * V / Y
    if cfg.qk_norm:  # QK-norm (module docstring): q's and k's norms, two launches a layer-pass
        ks += qk_norm_kernels(w, calls, p["layers"] * 2 * c * t * H * (N + K) / Y)
    if cfg.mla:  # MLA's latent norms (c_q's and c_kv's), whole over tensor, recomputed with the up-projections
        ks += latent_norm_kernels(w, calls, tm)
    if launches.runs_launches(w):  # a PyTorch runtime's kernels one by one (scaling.step.launches)
        arrays = {"A": c * tm * D / sp, "P": c * tm * D / Y, "F": c * tm * ff, "S": c * seqs * heads * bs * Tq * Tq}
        return ks + runtime_layer_kernels(w, calls, arrays, flash, th * V / Y if V else None, head_calls)
    ks += xla_gpu_layer_copies(w, calls, tm, train)  # XLA:GPU's copies around the layer (kernels of their own)
    ks.append(Kernel("pointwise", "forward", "pointwise", None, calls, 0.0, fwd_bytes + head_bytes))
    if train:
        ks.append(Kernel("pointwise", "backward", "pointwise", None, calls, 0.0, 2 * (fwd_bytes + head_bytes)))
        share = (r["qkv"] + r["out"] + r["mlp_in"] + r["attention_units"] / 4) / 4
        ks.append(Kernel("pointwise", "recompute", "pointwise", None, calls, 0.0, share * fwd_bytes))
        ks += [adamw_kernel(w, cfg.params), accumulate_kernel(w, cfg.params)]
    return ks
