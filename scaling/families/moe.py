"""Mixture of experts (MoE): the MLP of some layers replaced by E experts of which a router picks k per token
(Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2022; Mixtral, Jiang et al. 2024), over
an ``expert`` mesh axis that splits the experts, the tokens dispatched to their experts' devices and combined back
by all-to-all (GShard section 3.2; MaxText's and Megatron-LM's expert parallelism). Pure Python.

MoESpec holds what an MoE model adds to a transformer's dimensions: E experts of d_ff F_e each, top-k routing
(softmax or sigmoid gates, an auxiliary load-balancing loss), a capacity factor (GShard/Switch: each expert takes at
most C = ceil(cf·k·T/E) of a group's T tokens, the rest dropped) or dropless routing (every routed token computed),
optional shared experts that every token runs, and which layers are MoE (every ``moe_every``-th, after
``first_dense`` dense ones). MoEConfig is a transformer (scaling.families.transformer.TransformerConfig: attention, the
dense layers' MLP, the vocabulary) with an MoESpec; MOE_PRESETS holds published ones.

Notation (scaling.families.transformer's, plus): E experts, k routed per token, F_e an expert's d_ff, S_sh shared
experts, m MLP matrices (3 for swiglu), cf the capacity factor; the mesh's ``expert`` axis Ex (mesh.get("expert", 1)),
which splits the experts and, outside the experts, the tokens as data does (MaxText's expert axis in the activations'
batch; GShard section 3.2: each device routes its own groups of tokens). Per device t = B/(d·X·C·Ex) tokens; a
group is one sequence of T tokens (MaxText's capacity per sequence: t/T groups a device); s = slots per token: k
dropless, cf·k with a capacity factor (every expert takes C = ceil(cf·k·T/E) slots of each group, padding
included: E·C slots a group); c = 2 bytes (BF16).

Closed forms, per MoE layer, per device:
  FLOPs     forward 2·D·E (router) + 2·m·D·F_e·(s + S_sh) per token (moe_flops_per_token)
  all-to-all  dispatch and combine forward, their gradients backward (4 per training step); one moves V = c·slots·D
            from each device, (Ex − 1)/Ex·V of it to other devices (all_to_all_bytes, all_to_all_seconds)
  memory    the [E/Ex, C·Ex, D] buffers in and out of the experts (dispatch_buffer_bytes); the experts' weights
            (expert_weight_bytes_per_device)
  load      the busiest expert sets the time: min(imbalance, cf) with capacity, the imbalance dropless
            (load_imbalance_time_factor)
  bound     compute-bound iff m·F_e > f·c·C/W (f = (Ex − 1)/Ex through a switch, Ex/4 on a ring): t cancels
            (expert_critical_batch)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scaling.families import transformer as tf
from scaling.core.family import FamilyDefaults, PlanPolicy
from scaling.core.kinds import Collective, Family, KernelKind, Platform
from scaling.core.inputs import positive_float, positive_int
from scaling.core.policies import ContextStrategy, OptimizerSharding, Pipeline, Remat, Step
from scaling.step.kernels import Kernel, accumulate_kernel, adamw_kernel, matmul_kernel, pass_kernels
from scaling.step import pipeline
from scaling.step.memory import weight_shards
from scaling.core.mesh_shape import MESH_AXES, spans
from scaling.core.schedule import Schedule
from scaling.core.sharding import shards
from scaling.families.transformer import TransformerConfig
from scaling.core.workload import Workload

# The remat policies the MoE family's closed forms count: none, full, and the transformer's named and offloading
# policies that keep nothing of the MLP (POLICY_KEEPS without "mlp_in"; MaxText's custom policies of its Mixtral
# recipes): their attention as the transformer's (q, k, v, the attention's output, o·W_o kept or offloaded), the MoE
# MLP (router, dispatch, experts, combine) recomputed whole as under full (moe_recomputed)
MOE_REMATS = ("none", "full", "save_qkv_proj", "save_qkv_context", "save_dot_except_mlp", "qkv_proj_offloaded",
              "input_qkv_offloaded")
# the planner's, each tried on every mesh (not nested: scaling.core.family.PlanPolicy.remat_keeps None); the offloading
# ones not searched (the host's transfers are not in the step's time)
MOE_PLAN_REMATS = ("none", "save_dot_except_mlp", "save_qkv_context", "save_qkv_proj", "full")
CAPACITY_FACTORS = ("dropless", "1", "1.25", "1.5", "2")  # --capacity-factor's examples (it takes any number > 0)
ROUTERS = ("softmax", "sigmoid")  # the gates: softmax over E then top-k (Mixtral renormalises over the k), or sigmoid


@dataclass(frozen=True)
class MoESpec:
    """E = ``experts`` routed experts, each an MLP of the model's kind with d_ff ``expert_d_ff`` (F_e); a router
    [D, E] picks ``top_k`` (k) per token; ``shared_experts`` MLPs of F_e every token runs (DeepSeekMoE); the
    ``capacity_factor`` cf (None: dropless) and ``drop_tokens`` (tokens past capacity dropped; without it a factor
    below 1 is refused); the ``router`` gates; ``aux_loss_weight`` of the load-balancing loss (Switch eq. 4);
    layer l is MoE iff l >= first_dense and (l - first_dense) % moe_every == moe_every - 1."""

    experts: int
    top_k: int
    expert_d_ff: int
    shared_experts: int = 0
    capacity_factor: float | None = None
    drop_tokens: bool = True
    router: str = "softmax"
    aux_loss_weight: float = 0.01
    moe_every: int = 1
    first_dense: int = 0

    def __post_init__(self):
        for name in ("experts", "top_k", "expert_d_ff", "moe_every"):
            positive_int(name, getattr(self, name))
        if self.shared_experts < 0 or self.first_dense < 0:
            raise ValueError("shared_experts and first_dense must be >= 0")
        if self.top_k > self.experts:
            raise ValueError(f"top-k {self.top_k} is more than the {self.experts} experts")
        if self.router not in ROUTERS:
            raise ValueError(f"router {self.router!r}: one of {', '.join(ROUTERS)}")
        cf = self.capacity_factor
        if cf is not None and not cf > 0:
            raise ValueError(f"capacity factor {cf} must be > 0 (or none: dropless)")
        if cf is not None and cf < 1 and not self.drop_tokens:
            raise ValueError(f"capacity factor {cf:g} below 1 must drop tokens, and dropping is off (--keep-tokens, "
                             "drop_tokens=False): let them drop, or take a factor >= 1 or dropless")

    def is_moe(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) is an MoE layer."""
        return layer >= self.first_dense and (layer - self.first_dense) % self.moe_every == self.moe_every - 1

    def moe_layers(self, blocks: int) -> int:
        """How many of ``blocks`` layers are MoE."""
        return sum(self.is_moe(i) for i in range(blocks))

    def check_mesh(self, mesh: Mapping) -> None:
        """The experts split evenly over the expert axis (a ValueError naming both)."""
        x = mesh.get("expert", 1)
        if self.experts % x:
            raise ValueError(f"{self.experts} experts do not divide over expert={x}")

    @property
    def dropless(self) -> bool:
        """No capacity factor: every routed token computed (Megablocks, Gale et al. 2023)."""
        return self.capacity_factor is None

    @property
    def slots_per_token(self) -> float:
        """s: the expert slots each token fills or pads, k dropless, cf·k with capacity (GShard section 3.2: E·C
        slots for a group of T tokens, C = cf·k·T/E before the ceiling)."""
        return self.top_k if self.dropless else self.capacity_factor * self.top_k


@dataclass(frozen=True)
class MoEConfig(FamilyDefaults):
    """A transformer (``base``: attention, the dense layers' MLP of d_ff F, the vocabulary, T) whose MoE layers
    (``moe.is_moe``) replace the MLP by a router [D, E], E experts and S_sh shared experts, each an MLP of the
    base's kind (m matrices) with d_ff F_e (Mixtral, Jiang et al. 2024 section 2.1; DeepSeekMoE for the shared).

    Parameters: params = L·D·H·(2N + 2K) + L_dense·m·D·F + L_moe·(D·E + (E + S_sh)·m·D·F_e) + the embeddings;
    active per token: the same with k + S_sh experts in place of E + S_sh (the router counted: every token runs it).
    """

    forms: ClassVar = sys.modules[__name__]  # its closed forms: this module's functions (scaling.core.family.FORMS)
    family: ClassVar[str] = Family.MOE
    noun: ClassVar[str] = "MoE transformer"
    batch_axis: ClassVar[str] = "moe_batch"  # its tokens split over expert too, outside the experts
    runs_1f1b: ClassVar[bool] = True
    has_critical_batch: ClassVar[bool] = False
    plan: ClassVar[PlanPolicy] = PlanPolicy(
        batch_tokens=4_194_304,  # 4M tokens, as the transformer's (OLMoE trains at 4M: table 1)
        axes=tuple(a for a in MESH_AXES if a in ("data", "stage", "fsdp", "expert", "tensor")),
        remats=MOE_PLAN_REMATS,
        grouped=False,  # one mesh a group, microbatches only, as the FFN stack
        remat_keeps=None,
        schedule_options=("attention",))  # the Schedule's default (auto), not chosen
    dimensions: ClassVar[dict[str, str]] = {
        **{k: v for k, v in TransformerConfig.dimensions.items() if k not in ("window", "global_every")},
        "d_ff": "F, the dense layers' MLP (an MoE model's layers that are not MoE)",
        "experts": "E, routed experts per MoE layer", "top_k": "k, experts per token",
        "expert_d_ff": "F_e, an expert's d_ff", "shared_experts": "S_sh, experts every token runs (DeepSeekMoE)",
        "moe_every": "every n-th layer MoE (default 1: all)", "first_dense": "dense layers before the first MoE one"}
    kinds: ClassVar[dict[str, tuple[tuple[str, ...], str]]] = {
        "mlp": TransformerConfig.kinds["mlp"],
        "capacity_factor": (None, f"the experts' capacity factor cf, a number > 0 ({', '.join(CAPACITY_FACTORS[1:])}: "
                                  "each expert takes ceil(cf·k·t/E) of a "
                                              "device's t tokens), or dropless"),
        "aux_loss_weight": (None, "the load-balancing loss' weight, a number >= 0 (Switch eq. 4; default 0.01); "
                                  "pipeline stages are built without the loss: 0")}
    switches: ClassVar[dict[str, str]] = {
        "tied_embeddings": TransformerConfig.switches["tied_embeddings"],
        "qk_norm": TransformerConfig.switches["qk_norm"],
        "keep_tokens": "tokens past an expert's capacity are not dropped (MoESpec.drop_tokens off): a capacity factor "
                       "below 1, which must drop some, is refused"}
    schedule_flags: ClassVar[dict[str, str]] = {"attention": "attention", "attention_block": "attention_block",
                                                "splash_fused_backward": "splash_fused_backward",
                                                "context_strategy": "context"}
    # the dimensions a model from flags alone needs (scaling.families.presets._required; the dataclass fields are base,
    # moe)
    required: ClassVar[tuple[str, ...]] = ("d_model", "heads", "d_ff", "blocks", "seq_len", "experts", "top_k",
                                           "expert_d_ff")

    base: TransformerConfig
    moe: MoESpec

    @classmethod
    def from_fields(cls, **kw) -> "MoEConfig":
        """The MoE model of flat fields (scaling.families.presets.model_from_fields): the base's and the MoESpec's."""
        spec = {f.name for f in dataclasses.fields(MoESpec)}
        kw = _keep_tokens(kw)
        moe = {k: _spec_value(k, v) for k, v in kw.items() if k in spec}
        return cls(TransformerConfig(**{k: v for k, v in kw.items() if k not in spec}), MoESpec(**moe))

    def replace(self, **kw) -> "MoEConfig":
        """A copy with the given fields (None: unchanged) set on the base or the MoESpec (capacity_factor: a
        number, its string, or "dropless")."""
        kw = _keep_tokens({k: v for k, v in kw.items() if v is not None})
        spec = {f.name for f in dataclasses.fields(MoESpec)}
        moe = {k: _spec_value(k, v) for k, v in kw.items() if k in spec}
        base = {k: v for k, v in kw.items() if k not in spec}
        return MoEConfig(self.base.replace(**base) if base else self.base,
                         dataclasses.replace(self.moe, **moe) if moe else self.moe)

    def __post_init__(self):
        if getattr(self.base, "family", None) != TransformerConfig.family:  # no isinstance on a model config
            raise ValueError(f"base must be a TransformerConfig, got {type(self.base).__name__}")
        if not isinstance(self.moe, MoESpec):
            raise ValueError(f"moe must be an MoESpec, got {type(self.moe).__name__}")
        if not self.moe_layers:
            raise ValueError(f"no MoE layer in {self.blocks} blocks (first_dense={self.moe.first_dense}, "
                             f"moe_every={self.moe.moe_every}): a dense model is a TransformerConfig")

    def __str__(self) -> str:
        """One line: "moe D=4,096 N=32 K=8 H=128 F=14,336 L=32 T=4,096 swiglu V=32,000 E=8 k=2 F_e=14,336 dropless"."""
        m = self.moe
        base = str(self.base).removeprefix("transformer ")
        return (f"moe {base} E={m.experts} k={m.top_k} F_e={m.expert_d_ff:,}"
                + (f" shared={m.shared_experts}" if m.shared_experts else "")
                + (" dropless" if m.dropless else f" cf={m.capacity_factor:g}" + ("" if m.drop_tokens else " no-drop"))
                + (f" every={m.moe_every}" if m.moe_every > 1 else "")
                + (f" first_dense={m.first_dense}" if m.first_dense else ""))

    @property
    def d_model(self) -> int:
        """D (the base's)."""
        return self.base.d_model

    @property
    def d_ff(self) -> int:
        """F of the dense layers' MLP (the base's)."""
        return self.base.d_ff

    @property
    def blocks(self) -> int:
        """L, dense and MoE layers together (the base's)."""
        return self.base.blocks

    @property
    def seq_len(self) -> int:
        """T (the base's)."""
        return self.base.seq_len

    @property
    def mlp_matrices(self) -> int:
        """m: 3 for swiglu, else 2 (the experts are MLPs of the base's kind)."""
        return self.base.mlp_matrices

    @property
    def moe_layers(self) -> int:
        """L_moe: the MoE layers of the L blocks (MoESpec.is_moe)."""
        return self.moe.moe_layers(self.blocks)

    @property
    def dense_layers(self) -> int:
        """L_dense = L − L_moe: the layers with the base's MLP of d_ff F."""
        return self.blocks - self.moe_layers

    @property
    def expert_params(self) -> int:
        """m·D·F_e: one expert's MLP."""
        return self.mlp_matrices * self.d_model * self.moe.expert_d_ff

    @property
    def router_params(self) -> int:
        """D·E: one MoE layer's router (no bias)."""
        return self.d_model * self.moe.experts

    @property
    def moe_params_per_layer(self) -> int:
        """D·E + (E + S_sh)·m·D·F_e: an MoE layer's MLP part (its attention is the base's)."""
        return self.router_params + (self.moe.experts + self.moe.shared_experts) * self.expert_params

    @property
    def params(self) -> int:
        """L·D·H·(2N + 2K) + L_dense·m·D·F + L_moe·(D·E + (E + S_sh)·m·D·F_e) + embeddings (V·D tied, 2·V·D)."""
        b = self.base
        dense_mlp = b.mlp_matrices * b.d_model * b.d_ff
        return (self.blocks * b.attention_params_per_block + self.dense_layers * dense_mlp
                + self.moe_layers * self.moe_params_per_layer + b.embedding_params)

    @property
    def active_params(self) -> int:
        """Per token: L·D·H·(2N + 2K) + L_dense·m·D·F + L_moe·(D·E + (k + S_sh)·m·D·F_e) + embeddings (the
        convention of Mixtral's 12.9B and OLMoE's 1.3B active: embeddings and output matrix counted)."""
        b = self.base
        dense_mlp = b.mlp_matrices * b.d_model * b.d_ff
        routed = self.router_params + (self.moe.top_k + self.moe.shared_experts) * self.expert_params
        return (self.blocks * b.attention_params_per_block + self.dense_layers * dense_mlp
                + self.moe_layers * routed + b.embedding_params)

    def kv_cache_elements(self, context):
        """The base's KV cache (attention is the base's in every layer)."""
        return self.base.kv_cache_elements(context)

    def scale_channels(self, tensor: int) -> float:
        """The base's scale_channels with each MoE layer's MLP replaced: the E routed experts' (m − 1) input matrices
        of F_e channels split over tensor and their output's D whole, each expert its own; the S_sh shared experts'
        one MLP of F_e·S_sh (ffn_model.moe's shared_*); the router not quantized."""
        m, D, Fe, shared = self.mlp_matrices, self.d_model, self.moe.expert_d_ff, self.moe.shared_experts
        mlp = lambda F: (m - 1) * F / tensor + D  # noqa: E731  one MLP's channels: its inputs' F, its output's D
        experts = self.moe.experts * mlp(Fe) + (mlp(Fe * shared) if shared else 0)
        return self.base.scale_channels(tensor) + self.moe_layers * (experts - mlp(self.base.d_ff))

    def experts_touched(self, tokens):
        """The routed experts a step of t tokens runs in one MoE layer, each token choosing k of E uniformly:
        E·(1 − (1 − k/E)^t) in expectation (balanced routing, the load-balancing loss' aim; Switch sec. 2.2)."""
        E, k = self.moe.experts, self.moe.top_k
        return E * (1 - (1 - k / E) ** tokens)

    def decode_read_params(self, tokens):
        """The base's weights less its MLPs, the dense layers' MLPs, and per MoE layer the router, the shared
        experts and the routed experts the step's t tokens touch (experts_touched): what a decode step streams."""
        b = self.base
        untouched = (self.moe.experts - self.experts_touched(tokens)) * self.expert_params * self.moe_layers
        return self.params - untouched - (b.vocab * b.d_model if b.embedding_matrices == 2 else 0)

    def decode_flops(self, tokens, context):
        """2·t·(active parameters less an untied lookup) + the base's attention over the cached keys: each token
        runs its k routed experts and the shared ones (base.decode_flops' attention term)."""
        b = self.base
        active = self.active_params - (b.vocab * b.d_model if b.embedding_matrices == 2 else 0)
        attention = b.decode_flops(tokens, context) - 2 * tokens * b.decode_read_params(tokens)
        return 2 * tokens * active + attention

    @property
    def norm_params(self) -> int:
        """The base's RMSNorm scales, which a published count includes and this package's model leaves out:
        2·L·D + D (Mixtral 8x7B: 266,240; TransformerConfig.norm_params)."""
        return self.base.norm_params

    def check_mesh(self, mesh: Mapping) -> None:
        """The experts divide over the expert axis (MoESpec.check_mesh)."""
        self.moe.check_mesh(mesh)

    # the base's attention and vocabulary, read by the shared code (schedules, kernels, reports)
    heads = property(lambda self: self.base.heads, doc="N (the base's)")
    kv_heads = property(lambda self: self.base.kv_heads, doc="K (the base's)")
    head_dim = property(lambda self: self.base.head_dim, doc="H (the base's)")
    vocab = property(lambda self: self.base.vocab, doc="V (the base's), or None")
    tied_embeddings = property(lambda self: self.base.tied_embeddings, doc="E = U (the base's)")
    embedding_matrices = property(lambda self: self.base.embedding_matrices, doc="0, 1 tied or 2 untied")
    embedding_params = property(lambda self: self.base.embedding_params, doc="the base's V·D per matrix")
    layer_windows = property(lambda self: self.base.layer_windows, doc="the base's windows (all global)")
    qk_norm = property(lambda self: self.base.qk_norm, doc="q and k normalized over H (the base's)")
    block: ClassVar[str] = "serial"  # attention then the MoE layer, each with its residual (ffn_model.moe)

    @property
    def pipeline_blocks(self) -> int:
        """L − L_first: the dense layers first run before the pipeline, outside it (ffn_model.moe.outer_layers, as
        MaxText runs DeepSeek's); the MoE layers after them are split into the stages."""
        return self.blocks - self.moe.first_dense

    @property
    def expert_layer_params(self) -> int:
        """L_moe·E·m·D·F_e: the routed experts' parameters (split over expert), all layers."""
        return self.moe_layers * self.moe.experts * self.expert_params

    @property
    def params_per_block(self) -> float:
        """(P − embeddings)/L: a block's parameters on average (scaling.step.program.gpu_messages' fsdp message)."""
        return (self.params - self.embedding_params) / self.blocks

    def custom_call_flops(self, flops: dict, platform: str) -> float:
        """Of step_flops' total, the matmul FLOPs a ``platform`` runs inside custom calls beyond the attention's
        (its "kernels"): dropless on a TPU, the routed experts' ("grouped": megablox's gmm and tgmm, Pallas kernels);
        else 0."""
        return float(flops.get("grouped", 0.0)) if platform == Platform.TPU else 0.0

    def uncompared_flops(self, platform: str) -> str | None:
        """Dropless: why the program's matmul FLOPs are not the closed form's. The closed form counts a ragged kernel
        that computes the routed rows only (2·D·F_e a row and matrix: step_flops); XLA (jax 0.10.2) lowers
        jax.lax.ragged_dot to a dense matmul of every row against every local expert, on CPU and GPU alike (5.87 and
        5.86 times the closed form on moe-tiny, data=2,expert=4, remat full; docs/findings.md). None with a capacity
        factor (einsums over the slots: compared), and on a TPU (megablox's grouped matmul: custom_call_flops)."""
        if not self.moe.dropless or platform == Platform.TPU:
            return None
        return (f"not comparable: XLA:{platform.upper()} lowers the dropless experts' ragged_dot densely (every row "
                "against every local expert); give --capacity-factor to compare")

    def check_remat(self, remat: str) -> None:
        """MOE_REMATS: none, full and the named policies that keep nothing of the MLP; the others (selective,
        minimal, save_dot_except_mlpwi: the MLP's hidden or output kept) and every-second are not built for it."""
        if remat not in MOE_REMATS:
            raise ValueError(f"remat {remat} is not built for the MoE transformer; its remat is one of "
                             + ", ".join(MOE_REMATS))

    def check_schedule(self, schedule: Schedule, mesh: Mapping, batch_tokens: int | None = None) -> None:
        """Before the shared rules (Schedule.check): stages with every layer MoE after the dense ones first
        (ffn_model.moe.pipeline_loss_fn: those run outside the pipeline; not one of them with a vocabulary) and no
        context axis beside them; context parallelism as Ulysses only, no sequence parallelism or ZeRO-1 (not built);
        the base's rules on the folded mesh (tensor, context and stage: the heads over context·tensor, T over context,
        the microbatches over the stages, what runs without stages); B whole sequences, their number divisible by
        microbatches·data·fsdp·expert."""
        S = mesh.get("stage", 1)
        if S > 1 and self.moe.moe_every != 1:
            raise ValueError(f"stage={S}: pipeline stages are built for an MoE transformer whose every layer after the "
                             f"dense ones first is MoE, not moe_every={self.moe.moe_every}")
        if S > 1 and self.moe.first_dense == 1 and self.vocab:  # its closed form: _outer's layer 0 takes no dx
            raise ValueError(f"stage={S} with one dense layer first and a vocabulary is not built (its input "
                             "gradient's closed form): first_dense=0 or at least 2")
        if S > 1 and spans(mesh.get("context", 1)):
            raise ValueError(f"stage={S} with context={mesh['context']}: the MoE transformer's pipeline is built "
                             "without a context axis")
        if spans(mesh.get("context", 1)) and schedule.context != ContextStrategy.ULYSSES:
            raise ValueError(f"context={mesh['context']} with context_strategy {schedule.context}: the MoE "
                             "transformer's context parallelism is Ulysses' (--context-strategy ulysses)")
        if schedule.sequence_parallel:
            raise ValueError("sequence_parallel is not built for the MoE transformer (leave it off)")
        if schedule.optimizer_sharding == OptimizerSharding.ZERO1:
            raise ValueError("optimizer_sharding zero1 is not built for the MoE transformer (use fsdp)")
        self.base.check_schedule(schedule, {a: mesh.get(a, 1) for a in ("tensor", "context", "stage")})
        if batch_tokens is not None:
            seqs = positive_int("batch_tokens", batch_tokens) // self.seq_len
            n = schedule.microbatches * shards(mesh, "moe_batch")
            if batch_tokens % self.seq_len or seqs % n:
                raise ValueError(f"batch_tokens={batch_tokens} must be whole sequences of seq_len={self.seq_len}, "
                                 f"their number divisible by microbatches·data·fsdp·expert = {n}")

    extents = TransformerConfig.extents  # the base's arrays: attention, the vocabulary's logits

    def divisions(self) -> list[tuple[str, int, str]]:
        """(name, dimension, logical axis): D (embed), F and F_e (mlp), E (exp: over expert), V (vocab) if any."""
        out = [("d_model", self.d_model, "embed"), ("d_ff", self.d_ff, "mlp"),
               ("expert_d_ff", self.moe.expert_d_ff, "mlp"), ("experts", self.moe.experts, "exp")]
        if self.vocab is not None:
            out.append(("vocab", self.vocab, "vocab"))
        return out

    def mesh_fits(self, mesh: Mapping):
        """The planner's screen of meshes: heads and kv heads by tensor."""
        return (self.heads % mesh["tensor"] == 0) & (self.kv_heads % mesh["tensor"] == 0)

    def plan_batch_runs(self, mesh: Mapping, B, M):
        """check_schedule's batch rule on arrays: whole sequences, their count divisible by M·data·fsdp·expert."""
        return (B % self.seq_len == 0) & ((B // self.seq_len) % (M * mesh["data"] * mesh["fsdp"] * mesh["expert"]) == 0)


def _spec_value(k: str, v):
    """An MoESpec field from a command's value: the capacity factor (_capacity), the aux loss' weight a number >= 0
    (ValueError naming the value otherwise), the others as they are."""
    if k == "capacity_factor":
        return _capacity(v)
    if k == "aux_loss_weight":
        try:
            weight = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"aux loss weight {v!r}: a number >= 0") from None
        if not weight >= 0:
            raise ValueError(f"aux loss weight {v!r}: a number >= 0")
        return weight
    return v


def _capacity(v):
    """A capacity factor from a command's string: "dropless" (or None) -> None, else the number (ValueError naming
    the value otherwise)."""
    if v is None or v == "dropless":
        return None
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"capacity factor {v!r}: a number > 0, or dropless") from None


def _keep_tokens(kw: dict) -> dict:
    """The switch keep_tokens (a command's --keep-tokens) as MoESpec's drop_tokens = not keep_tokens."""
    kw = dict(kw)
    if kw.pop("keep_tokens", None):
        kw["drop_tokens"] = False
    return kw


def _spec(cfg) -> MoESpec:
    """An MoEConfig's MoESpec, or the MoESpec given."""
    spec = getattr(cfg, "moe", cfg)
    if not isinstance(spec, MoESpec):
        raise ValueError(f"expected an MoEConfig or MoESpec, got {type(cfg).__name__}")
    return spec


def tokens_per_device(cfg: MoEConfig, mesh: Mapping, batch_tokens):
    """t = B/(d·X·C·Ex): a device's tokens, the expert axis splitting them as data does outside the experts
    (MaxText's activation batch over data, fsdp and expert; GShard section 3.2); replicated
    over tensor (and over stage: each stage's layers see every token)."""
    d, X, C, Ex = (mesh.get(a, 1) for a in ("data", "fsdp", "context", "expert"))
    return batch_tokens / (d * X * C * Ex)


def group_tokens(cfg: MoEConfig, mesh: Mapping | None = None):
    """S = T/C: the tokens of one routing group, a sequence, or under context parallelism the C-th of it each device
    holds (ffn_model.moe.moe_layer's default groups: one per sequence chunk)."""
    return cfg.seq_len / (mesh or {}).get("context", 1)


def expert_capacity(cfg: MoEConfig, mesh: Mapping | None = None):
    """C = ceil(cf·k·S/E): the slots each expert takes from one group of S tokens (group_tokens: a sequence of T, or
    its T/C chunk on a device of a context axis) (GShard section 3.2, Switch eq. 3: expert capacity = tokens per
    group / experts · capacity factor, with k routes per token; MaxText's groups are the sequences: a device's t
    tokens are t/S groups, and its dispatch einsums cost 2·S·D·E·C a group, linear in t, where one group of all t
    would cost t²); None dropless."""
    m = cfg.moe
    if m.dropless:
        return None
    return np.ceil(m.capacity_factor * m.top_k * group_tokens(cfg, mesh) / m.experts)


def moe_flops_per_token(cfg: MoEConfig) -> float:
    """Forward matmul FLOPs per token of one MoE layer: router 2·D·E, the s routed slots 2·m·D·F_e each, the S_sh
    shared experts 2·m·D·F_e each:  2·D·E + 2·m·D·F_e·(s + S_sh),  s = k dropless, cf·k with a capacity factor
    (GShard's einsum form computes every slot, the padding included; cf·k per token before C's ceiling). The
    backward is twice this (Kaplan et al. 2020, 6N per token for training). Sources: Shazeer et al. 2017 (router
    h·W_g), GShard section 3.2 (dispatch/combine einsums over [E, C] slots), Mixtral section 2.1 (top-2 of 8)."""
    m = cfg.moe
    D, Fe, mm = cfg.d_model, m.expert_d_ff, cfg.mlp_matrices
    return 2 * D * m.experts + 2 * mm * D * Fe * (m.slots_per_token + m.shared_experts)


def all_to_all_bytes(cfg: MoEConfig, mesh: Mapping, batch_tokens, c: int = 2) -> dict:
    """The all-to-alls of one MoE layer per device (GShard section 3.2: dispatch to the experts' devices, combine
    back; MaxText/Megatron-LM expert parallelism), over the expert axis n = Ex.

    slots     the rows a device sends: t·k dropless (each token to its k experts), (t/T)·E·C with capacity
              (C = ceil(cf·k·t/E) per expert from the device's group, padding included)
    V         c·slots·D: the buffer one all-to-all moves from a device (dispatch, or combine: the same rows back).
              This is the convention used here: V per device, D whole (the activations are replicated over tensor)
    V_axis    n·V: the array the all-to-all spans over the expert axis, the Scaling Book's V (sharding page:
              an AllToAll of V on a bidirectional ring takes V/(4·W_ici))
    wire      (n − 1)/n·V: the bytes a device sends to other devices in one all-to-all (its 1/n stays local);
              0 for n = 1 (no collective: every expert local)
    forward_*  two all-to-alls (dispatch, combine); train_*: four (the backward moves the gradients of both the
              same way). Remat that recomputes the layer would add the forward's again: not counted.
    Per MoE layer; multiply by L_moe (cfg.moe_layers) for the step."""
    m = cfg.moe
    n = mesh.get("expert", 1)
    t = tokens_per_device(cfg, mesh, batch_tokens)
    slots = t * m.top_k if m.dropless else t / group_tokens(cfg, mesh) * m.experts * expert_capacity(cfg, mesh)
    V = c * slots * cfg.d_model
    wire = (n - 1) / n * V
    return {"slots": slots, "V": V, "V_axis": n * V, "wire": wire, "forward_volume": 2 * V,
            "forward_wire": 2 * wire, "train_volume": 4 * V, "train_wire": 4 * wire}


A2A_TOPOLOGIES = ("switch", "ring")


def all_to_all_seconds(V: float, n: int, bandwidth: float, topology: str = "switch"):
    """Time of one all-to-all of V bytes per device over n devices (bandwidth-bound, no latency floor):
      switch  (n − 1)/n·V/W, W the bytes/s a device sends at (one way): every device sends its (n − 1)/n·V at
              once through a full-bisection switch (Scaling Book, GPU page: NVLink within a node, W one way per GPU)
      ring    n·V/(4·W_ici), W_ici bidirectional per link: the Scaling Book's AllToAll of the axis' array V_axis =
              n·V on a bidirectional ring, V_axis/(4·W_ici) (sharding page) =
              scaling.hardware.collectives.collective_time("all-to-all", n·V, [n], W_ici) without its latency floor
    0 for n = 1."""
    if topology not in A2A_TOPOLOGIES:
        raise ValueError(f"topology {topology!r}: one of {', '.join(A2A_TOPOLOGIES)}")
    W = positive_float("bandwidth", bandwidth)
    if n <= 1:
        return 0.0
    return (n - 1) / n * V / W if topology == "switch" else n * V / (4 * W)


def dispatch_buffer_bytes(cfg: MoEConfig, mesh: Mapping, batch_tokens, c: int = 2, imbalance: float = 1.0) -> dict:
    """The expert layer's buffers on a device after the dispatch all-to-all: its E/Ex experts' rows [E/Ex, C·Ex, D]
    in, and the same out before the combine (GShard section 3.2; MaxText's moe.py dispatch): each
    c·(E/Ex)·(g·C·Ex)·D = c·g·E·C·D bytes with capacity (g = t/T groups). Dropless the rows are ragged: k·t
    balanced, times the
    ``imbalance`` (max/mean load of a device's experts, given by the user, default 1.0; a static buffer must take
    its implementation's worst case instead). Returns rows (per buffer), shape, each (bytes of one buffer), bytes
    (in + out). Not counted: the experts' hidden [rows, F_e/Y]·(m − 1) and the device's own [E, C, D] before the
    all-to-all."""
    m = cfg.moe
    m.check_mesh(mesh)
    n = mesh.get("expert", 1)
    if m.dropless:
        if not imbalance >= 1:
            raise ValueError(f"imbalance {imbalance} is max/mean expert load: >= 1")
        rows = np.ceil(imbalance * m.top_k * tokens_per_device(cfg, mesh, batch_tokens))
        shape = (m.experts // n, None, cfg.d_model)
    else:
        C, groups = expert_capacity(cfg, mesh), tokens_per_device(cfg, mesh, batch_tokens) / group_tokens(cfg, mesh)
        rows = groups * m.experts * C
        shape = (m.experts // n, groups * C * n, cfg.d_model)
    each = c * rows * cfg.d_model
    return {"rows": rows, "shape": shape, "each": each, "bytes": 2 * each}


def expert_weight_bytes_per_device(cfg: MoEConfig, mesh: Mapping, bytes_per_param: float = 2,
                                   split: bool = True) -> float:
    """The experts' weights a device holds, every MoE layer: L_moe·(E/Ex + S_sh)·m·D·F_e·p / (X·Y if ``split``):
    E/Ex routed experts (the expert axis splits them, MoESpec.check_mesh), the S_sh shared experts on every
    expert-axis device, each split as the transformer's MLP is (F_e over tensor, D over fsdp: scaling.core.sharding's
    mlp and embed rules; Megatron-LM's expert tensor parallelism). The routers' D·E are not counted (replicated,
    L_moe·D·E·p more). No stage axis: with one, a stage holds its layers' share."""
    m = cfg.moe
    m.check_mesh(mesh)
    n = mesh.get("expert", 1)
    div = mesh.get("fsdp", 1) * mesh.get("tensor", 1) if split else 1
    return cfg.moe_layers * (m.experts / n + m.shared_experts) * cfg.expert_params * bytes_per_param / div


def load_imbalance_time_factor(cfg, imbalance: float = 1.0, padded: bool = False) -> float:
    """The MoE experts' compute time relative to perfectly balanced dropless routing (k·t/E tokens per expert):
    the busiest expert sets the layer's time (the combine waits for it). ``imbalance`` = max/mean expert load is
    a parameter the user gives (default 1.0: balanced; Switch's auxiliary loss, eq. 4, pushes it toward 1), not a
    fitted number. Dropless: the factor is the imbalance, uncapped. With a capacity factor an expert takes at most
    C = cf·k·t/E, so max/mean <= cf: min(imbalance, cf) (a ragged kernel that computes only the filled slots);
    ``padded``: cf whatever the routing (GShard's einsum computes every slot, the count moe_flops_per_token
    takes). Multiply the balanced k-slot expert FLOPs by it, not moe_flops_per_token's cf·k count again."""
    m = _spec(cfg)
    imbalance = positive_float("imbalance", imbalance)
    if imbalance < 1:
        raise ValueError(f"imbalance {imbalance} is max/mean expert load: >= 1")
    if m.dropless:
        return imbalance
    return m.capacity_factor if padded else min(imbalance, m.capacity_factor)


@dataclass(frozen=True)
class ExpertBound:
    """expert_critical_batch's answer: per token of one MoE layer, forward, per device: compute seconds and
    all-to-all seconds (both proportional to t: the ratio does not depend on the batch), the F_e above which the
    layer is compute-bound, and whether this config's F_e is."""

    compute_s_per_token: float
    all_to_all_s_per_token: float
    critical_expert_d_ff: float
    compute_bound: bool


def expert_critical_batch(cfg: MoEConfig, peak_flops: float, bandwidth: float, mesh: Mapping | None = None,
                          topology: str = "switch", c: int = 2) -> ExpertBound:
    """When one MoE layer's expert compute hides its all-to-alls, derived as the Scaling Book derives the others
    (training page: T_math against T_comms per layer). Per device, forward, with s slots per token (k, or cf·k),
    n = Ex, Y = tensor (F_e split over it, the tokens and the all-to-all's D whole on each tensor device):
      T_math  = t·(2·D·E + 2·m·D·F_e·(s + S_sh)/Y) / C          (moe_flops_per_token; router not split)
      T_comms = 2·f·c·s·t·D / W                                (dispatch + combine, all_to_all_seconds per slot)
      f = (n − 1)/n through a switch (W one way per device), n/4 on a bidirectional ring (W = W_ici)
    t cancels: like the Scaling Book's tensor-parallel condition this is a condition on the model and the chip's
    alpha = C/W, not on the batch. Compute-bound iff T_math > T_comms:
      F_e > F_e* = Y·(f·c·s·alpha − E) / (m·(s + S_sh))
    Without router, shared experts or tensor: m·F_e > f·c·alpha, e.g. switch, n large: m·F_e > c·C/W.
    ``peak_flops`` C (FLOP/s per device) and ``bandwidth`` W (bytes/s) are plain numbers; expert_bound_on_chip
    takes them from scaling.hardware.chips. Mixtral's F_e = 14,336 against OLMoE's 1,024 is the contrast."""
    m = cfg.moe
    mesh = mesh or {}
    C = positive_float("peak_flops", peak_flops)
    W = positive_float("bandwidth", bandwidth)
    n, Y = mesh.get("expert", 1), mesh.get("tensor", 1)
    s, S, D, mm, E = m.slots_per_token, m.shared_experts, cfg.d_model, cfg.mlp_matrices, m.experts
    compute = (2 * D * E + 2 * mm * D * m.expert_d_ff * (s + S) / Y) / C
    comm = 2 * all_to_all_seconds(c * s * D, n, W, topology)
    f = 0.0 if n <= 1 else (n - 1) / n if topology == "switch" else n / 4
    critical = Y * (f * c * s * (C / W) - E) / (mm * (s + S))
    return ExpertBound(compute, comm, max(critical, 0.0), compute > comm)


def expert_bound_on_chip(cfg: MoEConfig, chip: str, mesh: Mapping | None = None, c: int = 2) -> ExpertBound:
    """expert_critical_batch with a chip of scaling.hardware.chips: C = chip.device_flops (bf16 per device); a GPU's
    all-to-all through its NVLink switch at chip.ici_oneway (the Scaling Book's GPU page, NVLink one way per GPU),
    a TPU's on a ring of its ICI at chip.ici_bidi (W_ici, sharding page)."""
    from scaling.hardware.chips import get_chip

    ch = get_chip(chip)
    if ch.kind == Platform.GPU:
        return expert_critical_batch(cfg, ch.device_flops, ch.ici_oneway, mesh, "switch", c)
    return expert_critical_batch(cfg, ch.device_flops, ch.ici_bidi, mesh, "ring", c)


# ---- the MoE family's closed forms of one step, per device (MoEConfig's ModelFamily methods) ----
# Mesh data d, fsdp X, expert Ex, tensor Y (no stage, no context). The tokens split over d·X·Ex: t = B/(d·X·Ex) per
# device. Outside the experts the expert axis is a data axis: attention, the router, the dense layers' MLP and the
# shared experts see the device's t tokens with weights replicated over expert (split over fsdp and tensor as the
# transformer's); the routed experts are split E/Ex per device, each as the transformer's MLP (F_e over tensor, D
# over fsdp). Those parts are the transformer's on the folded mesh (data·expert, fsdp, tensor): _folded.

def _folded(w: Workload, batch_tokens=None) -> Workload:
    """The base transformer's Workload on the folded mesh {data: d·Ex, fsdp: X, context: C, tensor: Y} (the expert
    axis as data), one microbatch: exactly the attention's (Ulysses' all-to-alls over context among them), the
    vocabulary's and the tensor axis' terms of the MoE step (their tokens t = B/(d·X·C·Ex), their weights replicated
    over expert). With S stages, stage: S and the schedule as it is: the pipeline's passes (bubble included), its
    stage terms and the ends (lookup, output layer) are the base's (scaling.families.transformer.passes)."""
    mesh, S = w.mesh, w.mesh.get("stage", 1)
    folded = {"data": mesh["data"] * mesh["expert"], "fsdp": mesh["fsdp"], "context": mesh.get("context", 1),
              "tensor": mesh["tensor"]}
    staged = S > 1 and batch_tokens is None  # a microbatch's tokens given: one pass of the layers (no pipeline)
    if staged:  # with stages the pipeline's too: the schedule's microbatches, passes and stage terms are the base's
        folded["stage"] = S
    schedule = w.schedule if staged else dataclasses.replace(w.schedule, microbatches=1, repeats=1,
                                                             pipeline=Pipeline.GPIPE, warmup_phases=False,
                                                             stage_blocks=None)
    return Workload(w.model.base, folded, w.batch_tokens if batch_tokens is None else batch_tokens, step=w.step,
                    remat=w.remat, schedule=schedule, precision=w.precision, compiler=w.compiler, flags=w.flags)


# With stages, the dense layers first (DeepSeek's three) run before the pipeline, outside it (ffn_model.moe.
# outer_layers), on the whole batch with the stage axis a data axis for them: the step's terms are the pipeline's,
# the MoE model of its L − L_first MoE layers (_pipelined), plus those of the base transformer's L_first layers on
# the mesh {data: d·Ex·S, fsdp: X, tensor: Y} (_outer), plus the stage axis' gather of their output.

def has_outer_layers(w: Workload) -> bool:
    """Whether the step runs layers outside its pipeline: stages, and dense layers first (MoEConfig.pipeline_blocks)."""
    return w.mesh.get("stage", 1) > 1 and w.model.moe.first_dense > 0


def _pipelined(w: Workload) -> Workload:
    """The Workload of the pipeline's part: the MoE model of the L − L_first MoE layers (first_dense 0)."""
    cfg = w.model
    return dataclasses.replace(w, model=cfg.replace(blocks=cfg.pipeline_blocks, first_dense=0))


def _outer(w: Workload) -> Workload:
    """The Workload of the dense layers first: the base transformer of L_first layers, no vocabulary (its input the
    lookup's output, its output the pipeline's input), on {data: d·Ex·S, fsdp: X, tensor: Y}, the whole batch at once
    (no microbatches: the program runs them before the pipeline's)."""
    mesh, cfg = w.mesh, w.model
    folded = {"data": mesh["data"] * mesh["expert"] * mesh["stage"], "fsdp": mesh["fsdp"], "tensor": mesh["tensor"]}
    schedule = dataclasses.replace(w.schedule, microbatches=1, repeats=1, pipeline=Pipeline.GPIPE,
                                   warmup_phases=False, stage_blocks=None)
    base = dataclasses.replace(cfg.base, blocks=cfg.moe.first_dense, vocab=None, tied_embeddings=False)
    return Workload(base, folded, w.batch_tokens, step=w.step,
                    remat=w.remat, schedule=schedule, precision=w.precision, compiler=w.compiler, flags=w.flags)


def _outer_axes(w: Workload, key: str) -> str:
    """An outer-layers volume's axis key (_outer's mesh) as the step's: its data the spanned ones of data, stage and
    expert, in the mesh's order."""
    folded = [a for a in ("data", "stage", "expert") if spans(w.mesh.get(a, 1))]
    axes = {b for a in key.split("+") for b in (folded if a == "data" else [a])}
    return "+".join(a for a in MESH_AXES if a in axes)


def _outer_volumes(w: Workload) -> dict[str, dict[str, float]]:
    """The outer layers' collectives (scaling.families.transformer.collective_volumes of _outer, less its loss'
    4-byte mean, which the step's own loss is), their axes named as the step's (_outer_axes), and the stage axis'
    all-gather of their output, c·t·D (t = B/(d·X·Ex): a data shard's tokens, the pipeline's input on every stage),
    and in a train step the reduce-scatter of its gradient, the same."""
    out = _added({}, tf.collective_volumes(_outer(w)), lambda key: _outer_axes(w, key))
    loss = _outer_axes(w, "+".join(a for a in ("data", "fsdp", "tensor") if spans(_outer(w).mesh.get(a, 1))))
    if loss and Collective.ALL_REDUCE in out.get(loss, {}):
        out[loss][Collective.ALL_REDUCE] -= 4.0
    c = max(w.precision.compute, w.compiler.min_comm_bytes)
    t = tokens_per_device(w.model, w.mesh, w.batch_tokens)
    gathered = out.setdefault("stage", {})
    gathered["all-gather"] = gathered.get("all-gather", 0.0) + c * t * w.model.d_model
    if w.step == Step.TRAIN:
        gathered["reduce-scatter"] = gathered.get("reduce-scatter", 0.0) + c * t * w.model.d_model
    return {k: {kind: v for kind, v in kinds.items() if v} for k, kinds in out.items() if any(kinds.values())}


def _added(out: dict, part: dict, axes=lambda key: key) -> dict:
    """``out`` with the volumes ``part`` ({axis: {kind: V}}) added, each under the key ``axes`` names for its own."""
    for key, kinds in part.items():
        for kind, v in kinds.items():
            tgt = out.setdefault(axes(key), {})
            tgt[kind] = tgt.get(kind, 0.0) + v
    return out


def _lookup_before_loop(w: Workload) -> dict[str, dict[str, float]]:
    """What 1F1B's volumes (a vocabulary, a train step) change where the lookup runs before the outer layers, outside
    the loop (ffn_model.transformer.transformer_pipeline_loss with ``pre``), against the pipeline's own (_pipelined:
    the lookup on stage 0 in every forward slot), m1 = c·V·D/(X·Y) one matrix's gradient on the device: the lookup
    once (its partial sums over tensor, c·t·D, once, not T/M times; E's gradient reduce-scattered over fsdp once, not
    T times), no accumulator of E in the loop (expert: −T·m1; untied, data and stage: −m1 each, or −m1 from their
    joint reduction; tied, the one matrix's accumulator stays for the output layer), E's gradient reduced once over
    the token axes as without stages (data and expert: out of 1F1B's data-after-the-loop), and the pipeline input's
    gradient summed over stage, c·t·D (t = B/(d·X·Ex): stage 0's, for the outer layers' backward). Read from the
    compiled programs (cpu:8; v5p with a data axis: the joint reduction)."""
    cfg, mesh = w.model, w.mesh
    if not (w.step == Step.TRAIN and cfg.vocab and w.schedule.pipeline == Pipeline.ONE_F_ONE_B):
        return {}
    p = tf.passes(_folded(_pipelined(w)))
    d, X, Ex, Y = (mesh[a] for a in ("data", "fsdp", "expert", "tensor"))
    c = max(w.precision.compute, w.compiler.min_comm_bytes)
    t, D, V = tokens_per_device(cfg, mesh, w.batch_tokens), cfg.d_model, cfg.vocab
    m1 = c * V * D / (X * Y)
    # the lookup's accumulator, out of the pipeline's reductions over data and stage (or, where XLA sums the
    # matrices' accumulators over both in one, out of that: joint_head_reduce)
    joint = w.compiler.joint_head_reduce and spans(d)
    lookup = (cfg.embedding_matrices - 1) * m1  # untied: E's own accumulator (tied: the one matrix's stays, U's)
    out: dict[str, dict[str, float]] = {"stage": {"all-reduce": c * t * D - (0 if joint else lookup)}}
    if joint:
        out["data+stage"] = {"all-reduce": -lookup}
    if spans(X):
        out["fsdp"] = {"reduce-scatter": -(p["lookup_iterations"] - 1) * m1 * X}
    if spans(Y):
        out["tensor"] = {"all-reduce": -(p["lookup"] - 1) * c * t * D}
    if spans(Ex):  # the pipeline's own lookup accumulator, as often as it reduces it
        out["expert"] = {"all-reduce": -(p["lookup_iterations"] if w.compiler.lookup_reduce_in_loop else 1) * m1}
    if spans(d) and not joint:
        out["data"] = {"all-reduce": -lookup}
    tokens = "+".join(a for a in ("data", "expert") if spans(mesh[a]))
    if tokens:
        out.setdefault(tokens, {})
        out[tokens]["all-reduce"] = out[tokens].get("all-reduce", 0.0) + m1
    return out


def moe_recomputed(w: Workload) -> bool:
    """Whether a train step's backward recomputes the MoE layers' MLP (router, dispatch, experts, combine): under
    every policy but none (MOE_REMATS: none keeps it whole, the others nothing of it)."""
    return w.step == Step.TRAIN and w.remat != Remat.NONE


def _shapes(w: Workload) -> dict:
    """The step's sizes per device: t tokens, M microbatches, slots (the expert rows a device computes in the step:
    M·all_to_all_bytes' slots of a microbatch, t·k dropless, (t/T)·E·C with capacity), and parameters: "ne" the
    non-expert layer parameters (L·D·H·(2N+2K) + L_dense·m·D·F + L_moe·S_sh·m·D·F_e, replicated over expert), "ex"
    the device's routed experts L_moe·(E/Ex)·m·D·F_e, "emb" the embeddings, "router" the routers L_moe·D·E (FP32,
    replicated on every device: ffn_model.moe.ROUTER_AXES); "shard" the parameters a device holds,
    (ne + ex + emb)/(X·Y) + router; "layer" the larger of one MoE and one dense layer's gathered parameters over
    tensor (D·H·(2N+2K) + (E/Ex + S_sh)·m·D·F_e, D·H·(2N+2K) + m·D·F)/Y. With S stages the parameters are a stage's
    (its share of the padded stacks: scaling.step.pipeline.padding/S), "passes" the base's (scaling.families.
    transformer.passes) and "Nt" the MoE layer-passes over t tokens, L_moe without stages, (L/S)·T/(R·M) with
    (every layer MoE: the bubble's iterations included)."""
    cfg, mesh = w.model, w.mesh
    m, M, S = cfg.moe, w.schedule.microbatches, mesh.get("stage", 1)
    d, X, Ex, Y = (mesh[a] for a in ("data", "fsdp", "expert", "tensor"))
    t = tokens_per_device(cfg, mesh, w.batch_tokens)
    slots = M * all_to_all_bytes(cfg, mesh, w.batch_tokens / M)["slots"]
    A, D = cfg.base.attention_params_per_block, cfg.d_model
    dense = cfg.mlp_matrices * D * cfg.d_ff
    # with stages a stage's share of the stacks, its padded slots (every layer MoE: MoEConfig.check_schedule)
    held = 1.0 if S == 1 else pipeline.padding(cfg, w.schedule, S) / S
    ne = held * (cfg.blocks * A + cfg.dense_layers * dense + cfg.moe_layers * m.shared_experts * cfg.expert_params)
    router = held * cfg.moe_layers * cfg.router_params
    ex = held * (cfg.moe_layers * m.experts // Ex * cfg.expert_params)
    emb = cfg.embedding_params
    moe_layer = A + (m.experts // Ex + m.shared_experts) * cfg.expert_params
    layer = max(moe_layer, A + dense if cfg.dense_layers else 0) / Y
    p = tf.passes(_folded(w))  # with stages: the layer-passes over t tokens and the weight passes, bubble included
    return {"t": t, "M": M, "slots": slots, "ne": ne, "ex": ex, "emb": emb, "router": router,
            "shard": (ne + ex + emb) / (X * Y) + router,
            "layer": layer, "X": X, "Y": Y, "Ex": Ex, "d": d, "S": S, "passes": p,
            "Nt": cfg.moe_layers * p["layers"] / cfg.blocks}


def step_flops(w: Workload) -> dict:
    """Matmul FLOPs per device of one step, term by term: the base transformer's on the folded mesh
    (scaling.families.transformer.step_flops: attention, the vocabulary's logits, and an MLP of d_ff F in every layer),
    less that MLP in the L_moe MoE layers (mlp = 2·m·t·D·F/Y forward, 2x backward, (m−1)/m recomputed under remat full
    and the named policies, which keep no MLP hidden),
    plus per MoE layer forward
        router 2·t·D·E (replicated over tensor), experts 2·m·D·F_e·slots/Y, shared 2·m·D·F_e·S_sh·t/Y
    (slots: t·k dropless, (t/T)·E·C with capacity: GShard section 3.2's einsum computes every slot); backward 2x;
    remat full (and a named policy: moe_recomputed) recomputes the router, the shared experts' m − 1 input
    matrices (as the transformer's W_out, the output
    matrix's recomputation is dead) and all m of the routed experts' (their output is the combine's input, which its
    gradient takes); with S stages per MoE layer-pass (_shapes' Nt, the base's passes: bubble iterations
    included) in place of L_moe. With a capacity factor, GShard's dispatch and combine einsums (algorithm 2:
    [S, E, C] against [S, D] and [E, C, D]) are matmuls too, 2·T·D·E·C each a group of S = T tokens (2·T·D·slots in
    all), whole on every tensor device: 2 forward, 3 backward (the dispatched x's gradient; the combine's y and
    gates), the dispatch again under remat full. model: the step's matmuls with k slots a token (no padding, no
    dispatch) and the causal half of attention, x3 for train (Kaplan et al. 2020's 6N per token)."""
    if has_outer_layers(w):  # the pipeline's and the dense layers' first outside it
        pipe, outer = step_flops(_pipelined(w)), tf.step_flops(_outer(w))
        return {k: v + outer.get(k, 0.0) for k, v in pipe.items()}
    cfg, m = w.model, w.model.moe
    base = tf.step_flops(_folded(w))
    sh = _shapes(w)
    t, Y, D, mm, Fe, Lm = sh["t"], sh["Y"], cfg.d_model, cfg.mlp_matrices, m.expert_d_ff, sh["Nt"]
    train, again = w.step == Step.TRAIN, moe_recomputed(w)
    mlp = 2 * mm * t * D * cfg.d_ff / Y
    router, shared = 2 * t * D * m.experts, 2 * mm * D * Fe * m.shared_experts * t / Y
    experts = 2 * mm * D * Fe * sh["slots"] / Y
    layer = router + experts + shared
    dispatch = 0.0 if m.dropless else 2 * group_tokens(cfg, w.mesh) * D * sh["slots"]  # one dispatch or combine
    out = {"forward": base["forward"] + Lm * (layer - mlp + 2 * dispatch)}
    if train:
        out["backward"] = base["backward"] + Lm * (2 * (layer - mlp) + 3 * dispatch)
        out["recompute"] = base["recompute"] + again * Lm * (router + experts + (shared - mlp) * (mm - 1) / mm
                                                             + dispatch)
    out["total"] = sum(out.values())
    active = router + 2 * mm * D * Fe * (m.top_k + m.shared_experts) * t / Y
    out["model"] = base["model"] + cfg.moe_layers / sh["S"] * (active - mlp) * (3 if train else 1)
    out["attention"], out["kernels"] = base["attention"], base["kernels"]
    # dropless: the routed experts' matmuls, forward, backward and recomputed (a TPU runs them in megablox's grouped
    # matmul, custom calls: MoEConfig.custom_call_flops)
    out["grouped"] = Lm * experts * (1 + (2 + again) * train) if m.dropless else 0.0
    return out


# one function, term by term as its docstring lists them (each axis' collectives beside its rule)
def collective_volumes(w: Workload) -> dict[str, dict[str, float]]:
    """{axis: {kind: V bytes}} per device for one step (V as scaling.families.transformer.collective_volumes': an
    all-gather's or reduce-scatter's the whole gathered array, an all-reduce's the array reduced, an all-to-all's the
    buffer a device sends, all_to_all_bytes' V, the compiled all-to-all's operand; timed as the Scaling Book's
    AllToAll of Ex·V: scaling.step.program.comm_times), c = max(BF16, w.compiler.min_comm_bytes):
      fsdp    all-gather of the layers' weights, W = c·(ne + ex)/Y (_shapes: the device's E/Ex experts), forward
              and again backward (less layer 0's W_qkv where its input gradient is dead:
              scaling.families.transformer.first_layer_dead_gather), and of the embeddings once, k·c·V·D/Y; the
              gradients reduce-scattered, W and
              the embeddings' 2·c·V·D/Y; every microbatch (M·)
      tensor  the base transformer's on the folded mesh: 2 all-reduces of c·t·D a layer forward (attention out,
              MLP out), 2 backward (their input gradients), +1 under remat full; the vocabulary's. In an MoE layer
              the experts' partial sums are reduced on their slots' rows before the combine, c·slots·D (not t·D:
              ffn_model.moe.capacity_moe), forward, backward (the dispatched input's gradient) and again under
              remat full (the combine's gradient takes the experts' output; the base's MLP output is not made
              again); dropless on every pair of the expert axis' tokens, c·Ex·t·k·D, the backward's m − 1 times
              (W_in's and W_gate's ragged matmuls apart); the shared experts' on c·t·D as the MLP's
      expert  with a capacity factor the all-to-alls: 4·V per MoE layer a train step, 2 forward (dispatch,
              combine; all_to_all_bytes on a microbatch, M of them), +2 under remat full (the recomputed experts'
              input and output: the combine's gradient takes its input). Dropless, the program's all-gather
              dispatcher (ffn_model.moe.dropless_moe; an all-to-all of ragged sizes is not built): per MoE layer
              and microbatch, with G = Ex·t·D and g = Ex·t·k (the expert axis' tokens and routed pairs),
                all-gather      c·G (the tokens) + 4·G (the output's gradient, FP32) + 4·4·g (gates FP32 and ids
                                int32, forward and again backward) + c·G again under remat full
                reduce-scatter  4·G (the outputs, FP32) + 4·G (the tokens' gradient, FP32) + 4·g (the gates')
              forward only: all-gather c·G + 2·4·g, reduce-scatter 4·G
      data, context, expert  the gradients all-reduced over the axes that replicate them, on their fsdp shard
              (_gradient_reductions: which reductions XLA builds): the non-expert ones (c·ne/Y + 2·c·V·D/Y)/X over
              data, context and expert (expert and context are data axes for them), the routed experts' c·ex/(Y·X)
              over data and context
      context Ulysses' all-to-alls of q, k, v and o (the base's on the folded mesh)
      loss    one FP32 all-reduce over the axes that split the tokens (data, fsdp, context, expert), 4 bytes; per MoE
              layer and microbatch the router's statistics for the load-balancing loss, f_e and P_e (Switch eq. 4:
              means over every token), 2·E FP32 values forward, f_e again under remat full; and the routers' FP32
              gradients (replicated weights), 4·L_moe·D·E a train step
    "Under remat full" above: under every policy that recomputes the MoE MLP (moe_recomputed); the attention's terms
    are the base's under the policy. Not modelled: windowed reduce-scatters, XLA's merged reductions. With dense
    layers first outside the pipeline, the pipeline's and theirs (_outer_volumes)."""
    if has_outer_layers(w):
        out = _added(_added(collective_volumes(_pipelined(w)), _outer_volumes(w)), _lookup_before_loop(w))
        return {k: kinds for k, kinds in out.items() if any(np.any(v) for v in kinds.values())}
    cfg = w.model
    sh = _shapes(w)
    X, Y, Ex, d, M = sh["X"], sh["Y"], sh["Ex"], sh["d"], sh["M"]
    c = max(w.precision.compute, w.compiler.min_comm_bytes)
    train, again = w.step == Step.TRAIN, moe_recomputed(w)
    V, D = cfg.vocab or 0, cfg.d_model
    W_ne, W_ex = c * sh["ne"] / Y, c * sh["ex"] / Y
    E, dE = cfg.embedding_matrices * c * V * D / Y, 2 * c * V * D / Y * (V > 0)
    out: dict[str, dict[str, float]] = {}
    if sh["S"] > 1:
        return _staged_volumes(w, sh, c)
    if spans(X):
        out["fsdp"] = {"all-gather": M * ((W_ne + W_ex) * (2 if train else 1) + E)
                       - tf.first_layer_dead_gather(_folded(w))}  # layer 0's dead input gradient's W_qkv
        if train:
            out["fsdp"]["reduce-scatter"] = M * (W_ne + W_ex + dE)
    if spans(Y):
        out["tensor"] = tf.collective_volumes(_folded(w))["tensor"]
        mlp = 0 if cfg.moe.shared_experts else sh["t"]  # the base's MLP rows, in place of which the experts' are
        # reduced: the slots (capacity), or dropless every pair of the expert axis' tokens, its input gradient from
        # W_in and W_gate apart (m - 1 reductions: two ragged matmuls)
        rows, back = (Ex * sh["t"] * cfg.moe.top_k, cfg.mlp_matrices - 1) if cfg.moe.dropless else (sh["slots"], 1)
        out["tensor"]["all-reduce"] = out["tensor"]["all-reduce"] + cfg.moe_layers * c * D * (
            rows * (1 + train * back + again) - mlp * (1 + train))
    if spans(Ex) and cfg.moe.dropless:
        G, g = Ex * sh["t"] / M * D, Ex * sh["t"] / M * cfg.moe.top_k
        per = M * cfg.moe_layers
        out["expert"] = {"all-gather": per * (c * G + 8 * g + (4 * G + 8 * g + again * c * G if train else 0)),
                         "reduce-scatter": per * (4 * G + (4 * G + 4 * g if train else 0))}
    elif spans(Ex):
        V1 = all_to_all_bytes(cfg, w.mesh, w.batch_tokens / M, c)["V"]
        out["expert"] = {"all-to-all": M * cfg.moe_layers * V1 * ((4 if train else 2) + 2 * again)}
    C = w.mesh.get("context", 1)
    if spans(C):  # Ulysses' all-to-alls, the base's on the folded mesh
        out["context"] = {"all-to-all": tf.collective_volumes(_folded(w))["context"]["all-to-all"]}
    if train:
        for axes, volume in _gradient_reductions(d, X, C, Ex, W_ne + dE / 2, W_ex, dE / 2):
            key = "+".join(axes)
            out.setdefault(key, {})
            out[key]["all-reduce"] = out[key].get("all-reduce", 0.0) + volume / X
    loss = [a for a in ("data", "fsdp", "context", "expert") if spans(w.mesh.get(a, 1))]
    if loss:
        key = "+".join(loss)
        out.setdefault(key, {})
        out[key]["all-reduce"] = (out[key].get("all-reduce", 0.0) + 4.0 + train * 4 * sh["router"]
                                  + M * cfg.moe_layers * 4 * cfg.moe.experts * (2 + again))
    return out


# one function, term by term as its docstring lists them (the base's keys remapped, then each axis' MoE terms)
def _staged_volumes(w: Workload, sh: dict, c: float) -> dict[str, dict[str, float]]:
    """collective_volumes with S stages (every layer MoE): the base's on the folded mesh with stages (the pipeline's
    passes: scaling.families.transformer.collective_volumes; the stage axis' permutes, the ends' terms, Ulysses'), its
    dense MLP replaced by the MoE layer's, per layer-pass (Nt, bubble iterations included) and per weight pass
    (Lw = T·L/(S·R), a chunk's layers every iteration):
      fsdp    the layer's weights gathered and reduce-scattered per weight pass, c·W_l/Y in place of the base's
              c·(A + m·D·F)/Y, W_l = A + (E/Ex + S_sh)·m·D·F_e (the router is not gathered: FP32, replicated)
      tensor  the base's less its MLP's reductions, plus the experts' on their rows (as without stages), per layer-pass
      expert  the dispatcher's all-to-alls or all-gathers and reduce-scatters, per layer-pass
      stage   the base's; the circular re-lay moves the MoE layers' FP32 shards (master·W_l/(X·Y) a layer, the router
              whole) in place of the base's
      data, expert  the gradients' reductions as the base's over the folded data axis (d·Ex), the routed experts' over
              data alone: 1F1B once after its loop, GPipe and circular every weight pass (Lw/Ls of the stage's
              layers); the routers' FP32 gradients among the non-expert ones (4·D·E a layer)
    The load-balancing loss's statistics are not reduced: the pipeline is built without it (ffn_model.moe.
    pipeline_loss_fn)."""
    cfg, m = w.model, w.model.moe
    p, Y, X, Ex, M, D, d = sh["passes"], sh["Y"], sh["X"], sh["Ex"], sh["M"], cfg.d_model, sh["d"]
    train, again = w.step == Step.TRAIN, moe_recomputed(w)
    Lw, Nt = p["weight_passes"], sh["Nt"]
    A = cfg.base.attention_params_per_block
    base_layer = c * (A + cfg.mlp_matrices * D * cfg.d_ff) / Y  # the base's layer over fsdp
    moe_mlp = (m.experts // Ex + m.shared_experts) * cfg.expert_params  # a layer's MLP weights on the device
    delta = c * (moe_mlp - cfg.mlp_matrices * D * cfg.d_ff) / Y  # per layer, over fsdp
    # the base's keys name the folded data axis, data·expert: on the MoE mesh data and expert where they span (1F1B:
    # data alone, its loop being manual over data, expert automatic inside it)
    one_f = bool(p["again"])
    real = lambda key: "+".join(a for a in MESH_AXES if (a in key.split("+") and a != "data") or (  # noqa: E731
        "data" in key.split("+") and a in ("data", "expert")
        and spans({"data": d, "expert": 1 if one_f else Ex}[a])))
    base = tf.collective_volumes(_folded(w))
    fold = {"data": d * Ex, "fsdp": X, "context": w.mesh.get("context", 1)}
    loss_key = "+".join(a for a in fold if spans(fold[a]))  # the base's loss, 4 B per head iteration (1F1B) or per
    loss = 4.0 * (p["head_iterations"] if one_f else M / sh["S"])  # GPipe's M/S microbatches at once
    if loss_key:
        base[loss_key]["all-reduce"] -= loss
    # the layers' gradients over the folded data axis (1F1B once after its loop: a stage's Ls layers; GPipe and
    # circular every weight pass), rebuilt below with the MoE layer's
    Ls = p["chunk"] * w.schedule.repeats
    if train and spans(d * Ex):
        base["data"]["all-reduce"] -= (Ls if one_f else Lw) * base_layer / X
    out: dict[str, dict[str, float]] = {}

    def add(axes, kind, v):
        if axes and np.any(v):
            out.setdefault(axes, {})
            out[axes][kind] = out[axes].get(kind, 0.0) + v

    for key, kinds in base.items():
        for kind, v in kinds.items():
            add(real(key), kind, v)
    tokens = lambda *axes: "+".join(a for a in axes if spans(w.mesh.get(a, 1)))  # noqa: E731
    if one_f:  # the loss: over the loop's automatic token axes every head iteration, over data once after it
        add(tokens("fsdp", "context", "expert"), "all-reduce", loss)
        add(tokens("data"), "all-reduce", 4.0)
    else:
        add(real(loss_key), "all-reduce", loss)
    V = cfg.vocab or 0
    if train and V and one_f and spans(Ex):  # the matrices' FP32 accumulators over expert (automatic in the loop),
        # as each iteration adds to them: the lookup's every iteration, the output layer's every head iteration
        # (tied: the one matrix's, both), or where the compiler sums it after the loop once (head_reduce_in_loop,
        # lookup_reduce_in_loop)
        head = p["head_iterations"] if w.compiler.head_reduce_in_loop else 1
        lookup = p["lookup_iterations"] if w.compiler.lookup_reduce_in_loop else 1
        add("expert", "all-reduce", c * V * D / (X * Y) * (lookup + head))
    if train and V and not one_f and spans(X) and spans(Ex) and not spans(d):  # GPipe, circular: the output
        # matrix's gradient reduced over stage and expert in one (its base terms: c·V·D/(X·Y) over each)
        merged = c * V * D / (X * Y)
        out["stage"]["all-reduce"] -= merged
        out["expert"]["all-reduce"] -= merged
        add("stage+expert", "all-reduce", merged)
    if train:
        ne_l, ex_l = c * (A + m.shared_experts * cfg.expert_params) / Y, c * m.experts // Ex * cfg.expert_params / Y
        router_l = 4 * D * m.experts  # FP32, replicated over every token axis
        if one_f:  # inside the loop every weight pass: the non-expert gradients over expert (automatic), the routers'
            # over fsdp and expert; after it once over data (manual): every weight of the stage
            add(tokens("expert"), "all-reduce", Lw * ne_l / X)
            add(tokens("fsdp", "expert"), "all-reduce", Lw * router_l)
            add(tokens("data"), "all-reduce", Ls * ((ne_l + ex_l) / X + router_l))
        else:  # every weight pass, as the base's (_gradient_reductions' groups); the routers' over every token axis
            for axes, volume in _gradient_reductions(d, X, 1, Ex, Lw * ne_l, Lw * ex_l):
                add("+".join(axes), "all-reduce", volume / X)
            add(tokens("data", "fsdp", "expert"), "all-reduce", Lw * router_l)
    R = w.schedule.repeats
    if R > 1:  # the circular re-lay moves a chunk's FP32 shards of MoE layers (the router whole), not the base's
        moe_dev = (A + moe_mlp) / (X * Y) + D * m.experts
        add("stage", "collective-permute", (2 if train else 1) * pipeline.relay_moves(sh["S"], R) * p["chunk"]
            * w.precision.master * (moe_dev - cfg.base.params_per_block / (X * Y)))
    if spans(X):
        out["fsdp"]["all-gather"] += Lw * delta * (2 if train else 1)
        if train:
            kind = "collective-permute" if w.compiler.windowed_grad_rs else "reduce-scatter"
            out["fsdp"][kind] += Lw * delta * ((X + 1) / X if w.compiler.windowed_grad_rs else 1)
    if spans(Y):
        mlp = 0 if m.shared_experts else sh["t"]
        rows, back = (Ex * sh["t"] * m.top_k, cfg.mlp_matrices - 1) if m.dropless else (sh["slots"], 1)
        out["tensor"]["all-reduce"] += Nt * c * D * (rows * (1 + train * back + again) - mlp * (1 + train))
    if spans(Ex) and m.dropless:
        G, g = Ex * sh["t"] / M * D, Ex * sh["t"] / M * m.top_k
        per = M * Nt
        out.setdefault("expert", {}).update(
            {"all-gather": per * (c * G + 8 * g + (4 * G + 8 * g + again * c * G if train else 0)),
             "reduce-scatter": per * (4 * G + (4 * G + 4 * g if train else 0))})
    elif spans(Ex):
        V1 = all_to_all_bytes(cfg, w.mesh, w.batch_tokens / M, c)["V"]
        out.setdefault("expert", {})["all-to-all"] = M * Nt * V1 * ((4 if train else 2) + 2 * again)
    return {k: v for k, v in out.items() if any(np.any(x) for x in v.values())}


def _gradient_reductions(d, X, C, Ex, non_expert: float, experts: float, embeddings: float = 0.0) -> list:
    """[(axes, bytes)] of the gradients' all-reduces over the axes that replicate them (before /X), as XLA builds
    them (read from the compiled programs, jax 0.10.2, cpu:8, seven meshes): the routed experts' over data and
    context in one; the others (attention, dense and shared MLPs, embeddings: replicated over expert too) behind an
    fsdp reduce-scatter in one over data, context and expert (fsdp=2,context=2,expert=2; data=2,fsdp=2,context=2),
    without one over context apart from the batch's axes data and expert (data=2,context=2,expert=2: context, then
    data+expert; context=2,expert=2,tensor=2 and context=4,expert=2: context, then expert; data=2,context=4: context,
    then data); of the vocabulary's two gradients (c·V·D/Y each: the lookup's and the output matmul's,
    ``embeddings`` the second) the first as the layers', the second in one over data, context and expert everywhere
    (as the transformer's output matrix over context and data: scaling.families.transformer.collective_volumes;
    context=2,expert=2,tensor=2 and data=2,context=2,expert=2 with a vocabulary)."""
    span = lambda *axes: tuple(a for a, n in zip(("data", "context", "expert"), (d, C, Ex)) if a in axes  # noqa
                               and spans(n))
    out = []
    if np.any(experts) and span("data", "context"):
        out.append((span("data", "context"), experts))
    groups = [span("data", "context", "expert")] if spans(X) else [span("context"), span("data", "expert")]
    out += [(g, non_expert) for g in groups if g]
    if np.any(embeddings) and span("data", "context", "expert"):
        out.append((span("data", "context", "expert"), embeddings))
    return out


def _saved(w: Workload, remat: str, batch_tokens) -> tuple:
    """(dense, moe): bytes one dense and one MoE layer keep for the backward on ``batch_tokens`` (a microbatch):
    the base's saved_per_layer on the folded mesh (scaling.families.transformer: remat full x alone, a named policy
    what it keeps of the attention; an MoE layer the same: nothing of its MLP); an MoE layer under remat none has,
    for the MLP hidden c·t·F·(m−1)/Y, the dispatch buffers in and out (dispatch_buffer_bytes), the
    experts' hidden c·rows·F_e·(m−1)/Y, the shared experts' c·t·S_sh·F_e·(m−1)/Y and the router's FP32
    logits 4·t·E (ffn_model.moe.route keeps them, not the probabilities). Dropless the program's buffers hold every
    pair of the expert axis' tokens, Ex·t·k rows (its all-gather dispatcher), not dispatch_buffer_bytes' t·k."""
    cfg, m, mesh = w.model, w.model.moe, w.mesh
    fold = _folded(w, batch_tokens)
    kept = tf.saved_per_layer(cfg.base, fold.mesh, batch_tokens, remat, w.schedule, w.precision)
    dense = sum(kept.values())
    if remat != Remat.NONE:
        return dense, dense
    c, Y, mm, Fe = w.precision.compute, mesh["tensor"], cfg.mlp_matrices, m.expert_d_ff
    t = tokens_per_device(cfg, mesh, batch_tokens)
    buf = dispatch_buffer_bytes(cfg, mesh, batch_tokens, c)
    if m.dropless:  # the program's all-gather dispatcher (ffn_model.moe._dropless_local): every pair of the expert
        # axis' Ex·t tokens sorted into one buffer, the device's experts' rows at its front, the others' rows held
        rows = mesh["expert"] * t * m.top_k
        buf = {"rows": rows, "bytes": 2 * c * rows * cfg.d_model}
    moe = (dense - kept["mlp"] + buf["bytes"] + c * buf["rows"] * Fe * (mm - 1) / Y
           + c * t * m.shared_experts * Fe * (mm - 1) / Y + 4 * t * m.experts)
    return dense, moe


def fp32_copies(w: Workload) -> dict:
    """FP32 copies of the parameters a train step holds on XLA:GPU beside the master (w.compiler.gpu_layouts),
    bytes per device, read from the compiled step's buffer assignment (docs/findings.md, "The MoE peak on GPUs"):
      relaid_master  fsdp > 1: XLA:GPU lays an all-gather's operand out with the gathered dimension major, and every
                     weight but the router is gathered over fsdp on D, its minor dimension: the FP32 shard of
                     every layer (and of the embeddings) copied once, before the loops, D major, held through the
                     step: p.master·(shard − router) (_shapes)
      accumulators   M > 1 (ffn_model.pipeline.accumulate): the FP32 sums of the microbatches' gradients beside the
                     layers' scan's own stacked FP32 gradient (closed form's "grads"), p.grad·(ne + ex)/(X·Y) +
                     router where L ≥ 2 (one layer: the scan is inlined and its gradient added in place), and the
                     embeddings' p.grad·emb/(X·Y), which without accumulation are made after the layers
    Seen on XLA:CPU too (the accumulators; its peak is not compared); XLA:TPU not checked: not applied there."""
    cfg, p = w.model, w.precision
    sh = _shapes(w)
    X, Y = sh["X"], sh["Y"]
    if w.step != Step.TRAIN or not w.compiler.gpu_layouts:
        return {}
    out = {}
    if spans(X):
        out["relaid_master"] = p.master * (sh["shard"] - sh["router"])
    if sh["M"] > 1:
        out["accumulators"] = p.grad * (sh["emb"] / (X * Y) + (cfg.blocks >= 2) * ((sh["ne"] + sh["ex"]) / (X * Y)
                                                                                  + sh["router"]))
    return out


def overlapped_volumes(w: Workload, vols: dict | None = None) -> dict:
    """None modelled as hidden: {} (as the transformer's)."""
    return {}


def loop_copy_bytes(w: Workload) -> float:
    """Not modelled for the MoE family: 0."""
    return 0.0


def memory_per_device(w: Workload) -> dict:
    """Bytes per device, term by term (as scaling.families.transformer.memory_per_device without stages): the FP32
    master, Adam's moments and the layers' FP32 gradients for the device's parameters (_shapes: the non-expert over X·Y,
    the routed experts over Ex·X·Y); the batch of a microbatch (int32 ids and labels 8·t/M, or x and y (c + 4)·t·D/M);
    the transient gathered weights, two layers' (the larger of an MoE and a dense layer, c·layer) in a train step,
    one under remat full and the named policies (moe_recomputed: the MoE MLP recomputed whole, the layer's bulk) or
    forward (none forward without fsdp); the attention's working set (the base's on the
    folded mesh); one layer's FP32 weight gradients (train, remat none); the saved activations of a microbatch,
    L_dense·dense + L_moe·moe (_saved), less an offloading policy's in host memory (the base's offloaded_per_layer a
    layer, where CompilerFacts.host_offload); under full and the named policies the recomputed MoE layer's residuals
    (remat none's) less what the policy keeps, and the backward's gradients of its experts' hidden,
    c·rows·F_e·(m − 1)/Y (rows: the dropless program's Ex·t·k, or the capacity form's slots; compiled on v5p: docs/
    findings.md, "Dropless on TPUs"); with a
    vocabulary the loss's phase where above a layer's (c·(t·D + t·V/Y + V·D/Y), t of a microbatch); on XLA:GPU the
    FP32 copies of fp32_copies."""
    if has_outer_layers(w):
        return _outer_memory(w)
    cfg, p = w.model, w.precision
    sh = _shapes(w)
    Y, M = sh["Y"], sh["M"]
    if sh["S"] > 1:
        return _staged_memory(w, sh)
    # the MoE MLP recomputed (full and the named policies alike: the backward's iteration gathers the layer for its
    # MoE MLP's recomputation and makes the experts' gradients as under full; compiled on v5p)
    train, again = w.step == Step.TRAIN, moe_recomputed(w)
    Bm = w.batch_tokens / M
    tm = tokens_per_device(cfg, w.mesh, Bm)
    c, D, V = p.compute, cfg.d_model, cfg.vocab or 0
    terms = _state_terms(w, sh)
    Wl = c * sh["layer"]
    terms["inputs"] = 8 * tm if V else (c + 4) * tm * D
    fold = _folded(w, Bm)
    terms["attention_working_set"] = tf.memory_per_device(fold)["attention_working_set"]
    if train and not again:
        terms["layer_grads"] = p.grad * Wl / c
    if train:
        dense, moe = _saved(w, w.remat, Bm)
        # an offloading policy's residuals in pinned host memory (the base's offloaded_per_layer, every layer alike)
        off = (tf.offloaded_per_layer(cfg.base, fold.mesh, Bm, w.remat, w.schedule, p)
               if w.compiler.host_offload else 0.0)
        terms["activations"] = cfg.dense_layers * dense + cfg.moe_layers * moe - cfg.blocks * off
    if again:
        terms.update(_recomputed_terms(w, Bm, moe))
    if train and V:
        layer = sum(terms.get(k, 0.0) for k in ("transient_weights", "attention_working_set", "layer_grads",
                                                 "recomputed_layer"))
        terms["loss_phase"] = np.maximum(0.0, c * (tm * D + tm * V / Y + V * D / Y) - layer)
    terms.update(fp32_copies(w))  # XLA:GPU's (CompilerFacts.gpu_layouts)
    terms["total"] = sum(terms.values())
    return terms


def _outer_memory(w: Workload) -> dict:
    """memory_per_device with dense layers first outside the pipeline: the pipeline's terms (_pipelined), plus the
    outer layers' FP32 state and gradients and their saved activations on the whole batch (the base transformer's
    of _outer: held through the pipeline), and of the transients (gathered weights, working sets) the larger of the
    two phases'. The pipeline's buffers hold the outer layers' output, its input (the base's embedded batch); with a
    vocabulary 1F1B's lookup runs before the loop (_lookup_before_loop): the output layer's FP32 accumulator alone,
    4·V·D/(X·Y), and the input with its gradient, 2·c·t·D (t = B/(d·X·Ex)), in place of the base's lookup in the loop
    (compiled on v5p: docs/findings.md)."""
    cfg, mesh = w.model, w.mesh
    pipe = memory_per_device(_pipelined(w))
    outer = tf.memory_per_device(_outer(w))
    terms = {k: v for k, v in pipe.items() if k != "total"}
    for k in ("master", "optimizer", "grads", "activations"):
        terms[k] = terms.get(k, 0.0) + outer.get(k, 0.0)
    for k in ("transient_weights", "attention_working_set", "layer_grads", "recomputed_layer"):
        if k in outer:
            terms[k] = np.maximum(terms.get(k, 0.0), outer[k])
    if w.step == Step.TRAIN and cfg.vocab and w.schedule.pipeline == Pipeline.ONE_F_ONE_B:
        t = tokens_per_device(cfg, mesh, w.batch_tokens)
        terms["pipeline_buffers"] = (4 * cfg.vocab * cfg.d_model / (mesh["fsdp"] * mesh["tensor"])
                                     + 2 * w.precision.compute * t * cfg.d_model)
    terms["total"] = sum(terms.values())
    return terms


def _state_terms(w: Workload, sh: dict) -> dict:
    """memory_per_device's terms of the device's parameters (_shapes: a stage's share with stages): the FP32 master,
    Adam's moments and the layers' FP32 gradients (train), and the transient gathered layer, two in a train step, one
    where the MoE MLP is recomputed (moe_recomputed) or forward (none forward without fsdp)."""
    p, train, again = w.precision, w.step == Step.TRAIN, moe_recomputed(w)
    terms = {"master": p.master * sh["shard"]}
    if train:
        terms["optimizer"] = p.adam_moments * p.adam_moment * sh["shard"]
        terms["grads"] = p.grad * ((sh["ne"] + sh["ex"]) / (sh["X"] * sh["Y"]) + sh["router"])
    gathered = (1 if again else 2) if train else 1 if spans(sh["X"]) else 0
    terms["transient_weights"] = gathered * p.compute * sh["layer"]
    return terms


def _recomputed_terms(w: Workload, Bm, moe: float) -> dict:
    """Under a policy that recomputes the MoE MLP (moe_recomputed), the recomputed layer's residuals (remat none's
    less ``moe``, what the policy keeps of a layer: _saved) and its experts' hidden gradients c·rows·F_e·(m − 1)/Y
    (rows: the dropless dispatcher's Ex·t·k, or the capacity form's slots), on a microbatch of Bm tokens; {} else."""
    if not moe_recomputed(w):
        return {}
    cfg = w.model
    tm = tokens_per_device(cfg, w.mesh, Bm)
    rows = (w.mesh["expert"] * tm * cfg.moe.top_k if cfg.moe.dropless  # the dispatcher's buffer, or the slots
            else all_to_all_bytes(cfg, w.mesh, Bm)["slots"])
    return {"recomputed_layer": _saved(w, "none", Bm)[1] - moe,
            "expert_hidden_grads": w.precision.compute * rows * cfg.moe.expert_d_ff * (cfg.mlp_matrices - 1)
            / w.mesh["tensor"]}


def _staged_memory(w: Workload, sh: dict) -> dict:
    """memory_per_device with S stages (every layer MoE): the base's terms on the folded mesh with stages for the
    batch, the attention's working set, the pipeline's buffers and the loss's phase (scaling.families.transformer.
    memory_per_device), and the MoE layers' own, a stage's share (_shapes): the FP32 state and gradients of its
    layers, the transient gathered layer (two, one where the MoE MLP is recomputed), the chunk's FP32 gradients under
    every policy (sharded over fsdp as the loop's accumulators: compiled on v5p), the saved
    activations of a microbatch's MoE layer (_saved) per layer-pass (GPipe and circular: every
    iteration's, p["layers"]·M) or per kept chunk (1F1B: the ring's in-flight chunks and one more,
    scaling.step.pipeline.microbatches_in_flight), the re-laid FP32 copy (R > 1), and the recomputed layer's
    residuals and its experts' hidden gradients as without stages."""
    p, X, M, pp = w.precision, sh["X"], sh["M"], sh["passes"]
    Bm = w.batch_tokens / M
    base = tf.memory_per_device(_folded(w))
    terms = _state_terms(w, sh)
    terms["inputs"] = base["inputs"]
    terms["attention_working_set"] = base["attention_working_set"]
    _, moe = _saved(w, w.remat, Bm)
    if w.step == Step.TRAIN:
        # the chunk's FP32 weight gradients, made at once (1F1B: jax.vjp of the chunk; GPipe and circular: the
        # transposed scan's stacked gradient of an iteration), held sharded over fsdp as the accumulators they join,
        # under every policy (compiled on v5p)
        terms["layer_grads"] = pp["chunk"] * p.grad * sh["layer"] / X
        if pp["again"]:
            in_flight = pipeline.microbatches_in_flight(w.schedule, sh["S"], w.remat)
            terms["activations"] = (in_flight + 1) * pp["chunk"] * moe
        else:
            terms["activations"] = pp["layers"] * M * moe
    if w.schedule.repeats > 1:
        terms["relaid"] = p.master * ((sh["ne"] + sh["ex"]) / (X * sh["Y"]) + sh["router"])
    terms["pipeline_buffers"] = base["pipeline_buffers"]
    terms.update(_recomputed_terms(w, Bm, moe))
    if "loss_phase" in base:
        terms["loss_phase"] = base["loss_phase"]
    terms["total"] = sum(terms.values())
    return terms


def hbm_traffic_bytes(w: Workload):
    """HBM bytes per device per step, as scaling.families.transformer.hbm_traffic_bytes counts them: AdamW's 28 B per
    parameter shard (Precision.adam_update_bytes_per_param), the gathered weights read by the forward, dX and dW
    matmuls, 3·M·c·(ne + ex)/Y (with stages a stage's layers, read every weight pass: 3·T/R·c·(ne + ex)/Y), and
    every microbatch's saved activations (remat none's; with stages every layer-pass's) written and read once;
    forward: the master weights once, the gathered weights once, the activations written and read. With dense layers
    first outside the pipeline, the pipeline's and theirs (the base transformer's of _outer)."""
    if has_outer_layers(w):  # the pipeline's and the dense layers' first outside it (_outer)
        return hbm_traffic_bytes(_pipelined(w)) + tf.hbm_traffic_bytes(_outer(w))
    cfg, p = w.model, w.precision
    sh = _shapes(w)
    M, Y = sh["M"], sh["Y"]
    W = p.compute * (sh["ne"] + sh["ex"]) / Y
    dense, moe = _saved(w, "none", w.batch_tokens / M)
    saved = M * (cfg.dense_layers * dense + sh["Nt"] * moe)  # with stages every layer-pass's (bubble included)
    uses = M if sh["S"] == 1 else sh["passes"]["weight_passes"] / (sh["passes"]["chunk"] * w.schedule.repeats)
    if w.step == Step.FORWARD:
        return p.master * sh["shard"] + W * (1 if sh["S"] == 1 else uses) + 2 * saved
    return p.adam_update_bytes_per_param * sh["shard"] + 3 * uses * W + 2 * saved


def permute_kernels(w: Workload, sh: dict | None = None) -> list[Kernel]:
    """A dropless MoE layer's memory-bound passes over its routed rows (ffn_model.moe._dropless_local; MaxText's
    sparse matmul sorts and permutes the same way), per MoE layer and device, with G = Ex·t tokens and R = Ex·t·k
    routed rows (the expert axis' tokens, all-gathered) of D: forward the gather of the rows in expert order (read
    and write c·R·D) and the combine, the outputs gathered back in pair order and summed over k with their gates
    (read c·R·D, write the FP32 sums 4·G·D): 3·c·R·D + 4·G·D; backward twice that (each op's transpose: the
    scatter-adds of the rows' gradients, the gates' gradients); a recomputed layer once more
    (scaling.step.kernels.pass_kernels). None with a capacity factor (GShard's dispatch and combine are matmuls:
    step_flops)."""
    cfg, m = w.model, w.model.moe
    if not m.dropless:
        return []
    sh = sh or _shapes(w)
    G = sh["Ex"] * sh["t"]
    fwd = 3 * w.precision.compute * G * m.top_k * cfg.d_model + 4 * G * cfg.d_model
    return pass_kernels("permute", w, sh["Nt"], sh["Nt"] * fwd, moe_recomputed(w))


def step_kernels(w: Workload) -> list[Kernel]:
    """The step's kernels: the base transformer's on the folded mesh (scaling.families.transformer.step_kernels:
    attention, q/k/v and out matmuls, pointwise passes) with its MLP matmuls kept for the L_dense dense layers only
    (calls scaled by L_dense/L), the optimizer's and accumulation's on the device's parameter shard, and per MoE layer:
    the router [t, D]·[D, E]; the experts as E/Ex matmuls each of r = slots·Ex/E rows (the grouped GEMM of the
    device's experts), [r, D]·[D, F_e/Y] (m − 1 of them) and [r, F_e/Y]·[F_e/Y, D]; the shared experts
    [t, D]·[D, S_sh·F_e/Y] (m − 1) and back; with a capacity factor GShard's dispatch [E·C, T]·[T, D] and combine
    [T, E·C]·[E·C, D] for each of the t/T groups; backward each one's dX and dW (the dispatch: its input's gradient
    only; the combine: y's and the gates'); remat full (and a named policy) the router's, the routed experts' (all
    m: step_flops), the
    shared experts' input matrices' and the dispatch again. Dropless, the routed rows' permutations (permute_kernels).
    With S stages each MoE kernel on a microbatch's rows (t/M), per layer-pass of a microbatch (bubble included).
    Approximate: the other pointwise passes are the base's (an MLP of F a layer). With dense layers first outside the
    pipeline, the pipeline's and theirs (the base transformer's of _outer)."""
    if has_outer_layers(w):
        return step_kernels(_pipelined(w)) + tf.step_kernels(_outer(w))
    cfg, m = w.model, w.model.moe
    sh = _shapes(w)
    c, D, mm, Fe, Y, Lm, L = w.precision.compute, cfg.d_model, cfg.mlp_matrices, m.expert_d_ff, sh["Y"], \
        sh["Nt"], cfg.blocks  # Lm: the MoE layer-passes (with stages, bubble iterations included)
    mb = sh["M"] if sh["S"] > 1 else 1  # with stages a kernel runs on a microbatch's rows, M times as often
    t, local, Lm = sh["t"] / mb, m.experts // sh["Ex"], Lm * mb
    train, again = w.step == Step.TRAIN, moe_recomputed(w)
    ks = []
    for k in tf.step_kernels(_folded(w)):
        if k.kind == KernelKind.OPTIMIZER or k.name == "accumulate":
            continue
        if k.name.split(".")[0] in ("mlp_in", "mlp_out"):
            if cfg.dense_layers:
                ks.append(dataclasses.replace(k, calls=k.calls * cfg.dense_layers / L,
                                              flops=None if k.flops is None else k.flops * cfg.dense_layers / L,
                                              bytes=None if k.bytes is None else k.bytes * cfg.dense_layers / L))
            continue
        ks.append(k)
    r = sh["slots"] * sh["Ex"] / (m.experts * mb)  # rows of one local expert
    fwd = [matmul_kernel("router", "forward", t, m.experts, D, Lm, c),
           matmul_kernel("expert_in", "forward", r, Fe / Y, D, Lm * local * (mm - 1), c),
           matmul_kernel("expert_out", "forward", r, D, Fe / Y, Lm * local, c)]
    if m.shared_experts:
        fwd += [matmul_kernel("shared_in", "forward", t, m.shared_experts * Fe / Y, D, Lm * (mm - 1), c),
                matmul_kernel("shared_out", "forward", t, D, m.shared_experts * Fe / Y, Lm, c)]
    ks += fwd
    T = group_tokens(cfg, w.mesh)
    groups = t / T  # the device's groups (sequences, or their chunks under context), each of E·C slots
    EC = None if m.dropless else m.experts * expert_capacity(cfg, w.mesh)
    dispatch = [] if m.dropless else [matmul_kernel("dispatch", "forward", EC, D, T, Lm * groups, c),
                                      matmul_kernel("combine", "forward", T, D, EC, Lm * groups, c)]
    ks += dispatch
    ks += permute_kernels(w, sh)
    if train:
        for k in fwd:
            a, b, kk, _ = k.shape
            ks += [matmul_kernel(k.name + ".dx", "backward", a, kk, b, k.calls, c),
                   matmul_kernel(k.name + ".dw", "backward", kk, b, a, k.calls, c)]
        if dispatch:  # the dispatched x's gradient; the combine's y and gates
            ks += [matmul_kernel("dispatch.dx", "backward", T, D, EC, Lm * groups, c),
                   matmul_kernel("combine.dy", "backward", EC, D, T, Lm * groups, c),
                   matmul_kernel("combine.dgates", "backward", T, EC, D, Lm * groups, c)]
        if again:
            ks += [dataclasses.replace(k, pass_="recompute") for k in fwd + dispatch[:1] if k.name != "shared_out"]
        params = sh["shard"] * weight_shards(w.mesh)  # adamw_kernel and accumulate_kernel divide by X·Y (the router
        # counted X·Y times: it is whole on every device); adamw_kernel by S too (a stage's share: sh["shard"])
        ks += [adamw_kernel(w, params * sh["S"]), accumulate_kernel(w, params)]
    return ks


def _qwen3_moe(d_model: int, heads: int, blocks: int, expert_d_ff: int) -> MoEConfig:
    """A Qwen3 MoE model (MOE_PRESETS' comment): 4 kv heads of 128, 128 experts of ``expert_d_ff``, top-8, every layer
    MoE, vocabulary 151,936 untied, SwiGLU, QK-norm, T = 4,096."""
    return MoEConfig(TransformerConfig(d_model=d_model, heads=heads, kv_heads=4, head_dim=128, d_ff=expert_d_ff,
                                       blocks=blocks, seq_len=4096, mlp="swiglu", vocab=151936, qk_norm=True),
                     MoESpec(experts=128, top_k=8, expert_d_ff=expert_d_ff))


# Published MoE models. The base's d_ff is the dense layers' (none here: every layer MoE, so F = F_e, unused).
MOE_PRESETS: dict[str, MoEConfig] = {
    # Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", table 1; HF mistralai/Mixtral-8x7B-v0.1 config.json):
    # dim 4096, 32 layers, head_dim 128, 32 heads, 8 kv heads, hidden_dim 14336, vocab 32000 (untied), 8 experts,
    # top-2, SwiGLU experts, softmax router renormalised over the 2, dropless (Megablocks). Published 46.7B total,
    # 12.9B active (Mistral AI, "Mixtral of experts", Dec 2023). T = 4,096 is a training length chosen here: the
    # paper's context_len is 32,768 (replace(seq_len=32768) for it).
    "mixtral-8x7b": MoEConfig(
        TransformerConfig(d_model=4096, heads=32, kv_heads=8, head_dim=128, d_ff=14336, blocks=32, seq_len=4096,
                          mlp="swiglu", vocab=32000),
        MoESpec(experts=8, top_k=2, expert_d_ff=14336)),
    # Mixtral 8x22B (Mistral AI, "Cheaper, Better, Faster, Stronger", Apr 2024: 141B total, 39B active; HF
    # mistralai/Mixtral-8x22B-v0.1 config.json: hidden 6144, 56 layers, 48 heads of 128, 8 kv heads, intermediate
    # 16384, 8 experts, top-2, vocab 32768 untied, SwiGLU). T = 4,096 as MaxText's v6e recipe trains it.
    "mixtral-8x22b": MoEConfig(
        TransformerConfig(d_model=6144, heads=48, kv_heads=8, head_dim=128, d_ff=16384, blocks=56, seq_len=4096,
                          mlp="swiglu", vocab=32768),
        MoESpec(experts=8, top_k=2, expert_d_ff=16384)),
    # Qwen3 MoE (Qwen Team 2025, "Qwen3 Technical Report", arXiv:2505.09388, table 2: 235B total and 22B activated,
    # 30B (30.5B on the model card) and 3B (3.3B); HF Qwen/Qwen3-235B-A22B and Qwen3-30B-A3B config.json): 94 (48)
    # layers, hidden 4096 (2048), 64 (32) heads of 128, 4 kv heads, 128 experts of moe_intermediate 1536 (768),
    # top-8, no shared expert, every layer MoE, vocab 151,936 untied, SwiGLU, softmax router renormalised over the
    # 8, dropless, QK-norm (an RMSNorm on each head's q and k; its scales not counted, as the other norms'). T = 4,096
    # as MaxText's TPU7x recipe trains it.
    "qwen3-235b-a22b": _qwen3_moe(d_model=4096, heads=64, blocks=94, expert_d_ff=1536),
    "qwen3-30b-a3b": _qwen3_moe(d_model=2048, heads=32, blocks=48, expert_d_ff=768),
    # OLMoE-1B-7B (Muennighoff et al. 2024, "OLMoE", table 1; HF allenai/OLMoE-1B-7B-0924 config.json): d_model
    # 2048, 16 layers, 16 heads (no GQA), head_dim 128, 64 experts of d_ff 1024, top-8, SwiGLU, vocab 50304 untied,
    # sequence length 4096, dropless, softmax router (not renormalised), load-balancing loss 0.01, QK-norm (HF
    # transformers' OlmoeAttention q_norm, k_norm: over all heads' q and k at once, here per head, the same bytes; the
    # scales not counted). Published 6.9B total, 1.3B active (the paper).
    "olmoe-1b-7b": MoEConfig(
        TransformerConfig(d_model=2048, heads=16, kv_heads=16, head_dim=128, d_ff=1024, blocks=16, seq_len=4096,
                          mlp="swiglu", vocab=50304, qk_norm=True),
        MoESpec(experts=64, top_k=8, expert_d_ff=1024)),
    # DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437, section 4.2: 671B total, 37B
    # activated; HF deepseek-ai/DeepSeek-V3 config.json): hidden 7168, 61 layers, the first 3 dense (intermediate
    # 18432), then 256 routed experts of moe_intermediate 2048, top-8, and 1 shared expert, sigmoid gates (the
    # auxiliary-loss-free bias only picks: no FLOPs; the node-limited routing, 4 of 8 groups, not modelled), MLA with
    # 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk nope 128 + rope 64, v 128, vocab 129,280 untied, SwiGLU. The
    # multi-token-prediction module (14B more, 685B) is not counted, as the 671B does not count it. T = 4,096 as its
    # pre-training's.
    "deepseek-v3": MoEConfig(
        TransformerConfig(d_model=7168, heads=128, head_dim=128, d_ff=18432, blocks=61, seq_len=4096, mlp="swiglu",
                          vocab=129280, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128),
        MoESpec(experts=256, top_k=8, expert_d_ff=2048, shared_experts=1, first_dense=3, router="sigmoid")),
    # DeepSeek-V2-Lite (DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434, appendix B: 15.7B total, 2.4B activated;
    # HF deepseek-ai/DeepSeek-V2-Lite config.json): hidden 2048, 27 layers, the first dense (intermediate 10944), then
    # 64 routed experts of 1408, top-6, and 2 shared, softmax gates, MLA with 16 heads, no q compression (q = h·W_q),
    # kv_lora_rank 512, qk nope 128 + rope 64, v 128, vocab 102,400 untied, SwiGLU.
    "deepseek-v2-lite": MoEConfig(
        TransformerConfig(d_model=2048, heads=16, head_dim=128, d_ff=10944, blocks=27, seq_len=4096, mlp="swiglu",
                          vocab=102400, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128),
        MoESpec(experts=64, top_k=6, expert_d_ff=1408, shared_experts=2, first_dense=1)),
    # A tiny one for tests: D=64, 4 heads of 16, 4 layers, 8 experts of 128, top-2, no vocabulary, T=32.
    "moe-tiny": MoEConfig(
        TransformerConfig(d_model=64, heads=4, kv_heads=4, head_dim=16, d_ff=128, blocks=4, seq_len=32, mlp="swiglu"),
        MoESpec(experts=8, top_k=2, expert_d_ff=128)),
}
