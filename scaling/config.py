"""The workload: FFN stack dimensions, precision policy, remat policy and mesh shape.

Pure Python; the single source of the model presets, the precision policy, the remat policy names and
the mesh axis names that the closed forms (``scaling``), the meshes (``mesh``) and the model
(``ffn_model``) all use.

Notation (Scaling Book, "How to Scale Your Model", jax-ml.github.io/scaling-book/training/):
D = d_model, F = d_ff, L = blocks; a block is two bias-free linear layers D -> F -> D, so the
parameter count is P = 2·D·F·L.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from scaling.limits import ascii_int
from scaling.sharding import LOGICAL_RULES, shards

# The mesh axes, outermost first (MaxText's names). Each is an entry of this one tuple; the sharding
# table (scaling.sharding) says what each one splits.
MESH_AXES = ("data", "stage", "fsdp", "context", "tensor")


class Remat(enum.StrEnum):
    """What a block keeps for its backward (check_remat, saved_blocks; the transformer's by name:
    ffn_model.transformer.POLICY_SAVES, scaling.transformer.saved_per_layer)."""
    NONE = "none"
    EVERY_SECOND = "every-second"
    FULL = "full"
    SELECTIVE = "selective"  # Korthikanti et al. 2022, section 4.3: the attention core recomputed
    MINIMAL = "minimal"  # MaxText: the projections' outputs kept
    SAVE_DOT_EXCEPT_MLPWI = "save_dot_except_mlpwi"
    SAVE_DOT_EXCEPT_MLP = "save_dot_except_mlp"
    SAVE_QKV_PROJ = "save_qkv_proj"


TRANSFORMER_ONLY_REMAT = ("selective", "minimal", "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj")


class Step(enum.StrEnum):
    """The compiled step: train (forward, backward, AdamW update) or forward (the loss only)."""
    TRAIN = "train"
    FORWARD = "forward"


class FsdpGather(enum.StrEnum):
    """When a pipeline stage gathers its weights over fsdp (Schedule.fsdp_gather)."""
    MICROBATCH = "microbatch"
    STEP = "step"


class Pipeline(enum.StrEnum):
    """The pipeline schedule over the stage axis (Schedule.pipeline; ffn_model.pipeline)."""
    GPIPE = "gpipe"  # all forwards, then all backwards (jax's transpose of the forward's scan)
    CIRCULAR = "circular"  # GPipe's loop over R chunks per stage (repeats > 1)
    ONE_F_ONE_B = "1f1b"  # a forward and a backward every iteration: activations bounded by the stages


class OptimizerSharding(enum.StrEnum):
    """Where AdamW's state lives (Schedule.optimizer_sharding)."""
    FSDP = "fsdp"
    ZERO1 = "zero1"


class Attention(enum.StrEnum):
    """The attention computation of the transformer (Schedule.attention)."""
    MATERIALIZED = "materialized"
    FLASH = "flash"


class ContextStrategy(enum.StrEnum):
    """How attention runs with a context axis (Schedule.context)."""
    ULYSSES = "ulysses"
    RING = "ring"


def choose(kind: type[enum.StrEnum], value, what: str) -> enum.StrEnum:
    """``value`` as a member of ``kind``; ValueError naming ``what`` and the valid names otherwise."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {', '.join(kind)}, got {value!r}") from None


OPTIMIZER_SHARDINGS = tuple(str(k) for k in OptimizerSharding)  # plain strings (argparse shows its choices)
REMAT_POLICIES = tuple(str(k) for k in Remat)
STEPS = tuple(str(k) for k in Step)


def positive_int(name: str, value) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def positive_ints(name: str, value):
    """``value`` if it is a positive integer or a numpy array of them (the planner evaluates many batch
    sizes at once), else ValueError naming ``name``."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu" or not (value > 0).all():
            raise ValueError(f"{name} must hold positive integers, got {value!r}")
        return value
    return positive_int(name, value)


def non_negative_int(name: str, value) -> int:
    """Return ``value`` if it is an integer >= 0 (a seed, a count of warm-up steps), else raise
    ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


# Seeds are 32-bit: with jax's default 32-bit types, jax.random.key and flax's nnx.Rngs keep only a seed's
# low 32 bits (so seed 2**32 + 1 would repeat seed 1), and a seed of 2**63 or more overflows.
MAX_SEED = 2**32 - 1


def check_seed(name: str, value) -> int:
    """Return ``value`` if it is an integer in 0..MAX_SEED (2^32 - 1), else raise ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ValueError(f"{name} must be an integer in 0..{MAX_SEED} (a 32-bit seed), got {value!r}")
    return value


def positive_float(name: str, value) -> float:
    """Return ``value`` as a float if it is a finite positive number, else raise ValueError naming ``name``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not (v > 0 and v != float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


@dataclass(frozen=True)
class FFNConfig:
    """An FFN stack: ``blocks`` blocks of x·W_in (D×F) then ·W_out (F×D), no biases.

    P = 2·D·F·L parameters (questions-4d.md, "The model").
    ``activation`` is None (the question's model: no nonlinearity) or a jax.nn function name.
    """

    # What a command or builder asks of a model family instead of its type (scaling.config.FAMILIES):
    family: ClassVar[str] = "ffn"  # the family's key: which program builds it (ffn_model.families)
    noun: ClassVar[str] = "FFN stack"  # the family in a message
    seq_len: ClassVar[None] = None  # no sequences: a batch is B token vectors, not B/T sequences
    has_attention: ClassVar[bool] = False
    plan_batch_tokens: ClassVar[int] = 25600  # plan's default B

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

    def replace(self, **kw) -> "FFNConfig":
        return dataclasses.replace(self, **{k: v for k, v in kw.items() if v is not None})

    def __str__(self) -> str:
        """A header's words: "FFN stack D=16,384 F=53,248 L=126" (repr() keeps the dataclass form)."""
        return (f"FFN stack D={self.d_model:,} F={self.d_ff:,} L={self.blocks:,}"
                + (f" {self.activation}" if self.activation else ""))


MLP_KINDS = ("relu", "gelu", "swiglu")  # act(h·W_in)·W_out, or SwiGLU (Shazeer 2020)
BLOCK_KINDS = ("serial", "parallel")  # attention then MLP; or both on one norm, summed (GPT-J, PaLM)


@dataclass(frozen=True)
class TransformerConfig:
    """A pre-norm causal transformer stack: ``blocks`` layers of RMSNorm -> multi-head self-attention
    (``heads`` query heads N, ``kv_heads`` key/value heads K for grouped-query attention, head dim H)
    with a residual, then RMSNorm -> MLP (D -> F -> D; ``mlp``: relu, gelu, or swiglu with three
    matrices) with a residual (``block="serial"``), or attention and MLP on one norm's output, summed
    into one residual (``block="parallel"``, GPT-J / PaLM: one tensor-parallel reduction per layer);
    sequences of ``seq_len`` tokens T. Without ``vocab`` there is no embedding or output projection (the
    synthetic task maps token vectors to token vectors like the FFN stack's); with it, token ids in, an
    embedding E [V, D], a final RMSNorm, logits h·Uᵀ (U = E with ``tied_embeddings``) and the softmax
    cross-entropy against the previous token's id (ffn_model.train.make_batch_fn).

    Parameters per layer (Scaling Book transformers page): attention D·H·(2N + 2K) (W_q, W_k, W_v,
    W_o), MLP m·D·F (m = 2, or 3 gated); the RMSNorms carry no learned scale (ffn_model.transformer.rms_norm).
    Embeddings: V·D, or 2·V·D untied.
    """

    family: ClassVar[str] = "transformer"
    noun: ClassVar[str] = "transformer"
    has_attention: ClassVar[bool] = True
    plan_batch_tokens: ClassVar[int] = 4_194_304  # Llama 2's 4M tokens (Touvron et al. 2023, section 2.2)

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

    def __str__(self) -> str:
        """A header's words: "transformer D=4,096 N=32 K=8 H=128 F=14,336 L=32 T=8,192 swiglu V=128,256"."""
        return (f"transformer D={self.d_model:,} N={self.heads} K={self.kv_heads} H={self.head_dim} "
                f"F={self.d_ff:,} L={self.blocks:,} T={self.seq_len:,} {self.mlp}"
                + (" parallel" if self.block == "parallel" else "")
                + (f" V={self.vocab:,}" + (" tied" if self.tied_embeddings else "") if self.vocab else ""))

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

    @property
    def gated(self) -> bool:
        """SwiGLU: silu(h·W_gate)·(h·W_in), three matrices."""
        return self.mlp == "swiglu"

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    @property
    def attention_params_per_block(self) -> int:
        """D·H·(2N + 2K): W_q [N,H,D], W_k and W_v [K,H,D], W_o [N,H,D]."""
        return self.d_model * self.head_dim * (2 * self.heads + 2 * self.kv_heads)

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

    def replace(self, **kw) -> "TransformerConfig":
        kw = {k: v for k, v in kw.items() if v is not None}
        if "d_model" in kw and "head_dim" not in kw and self.head_dim == self.d_model // self.heads:
            kw["head_dim"] = None  # the head dim follows D (and the heads) unless it was set apart from them
        if "heads" in kw and "head_dim" not in kw and self.head_dim == self.d_model // self.heads:
            kw["head_dim"] = None
        if "heads" in kw and "kv_heads" not in kw and self.kv_heads == self.heads:
            kw["kv_heads"] = None
        return dataclasses.replace(self, **kw)


def _maxtext(emb: int, heads: int, mlp: int, layers: int) -> TransformerConfig:
    """MaxText's 2023 decoder: parallel block, ReLU MLP, head_dim 256, tied vocabulary of 32,768, T = 2048."""
    return TransformerConfig(d_model=emb, heads=heads, d_ff=mlp, blocks=layers, seq_len=2048, head_dim=256,
                             mlp="relu", block="parallel", vocab=32768, tied_embeddings=True)


def maxtext_scale(scale: int) -> TransformerConfig:
    """MaxText's global_parameter_scale rule (its 2023 configs, base.yml): on a base of emb 2560, 8 heads, mlp
    8192, 16 layers, with k = log2(scale) and (b, r) = divmod(k, 3), heads and mlp scale by 2^(b + [r > 0]),
    emb by 2^(b + [r > 1]), layers by 2^b (../shared/reference/measured.md, section 1)."""
    k = int(scale).bit_length() - 1
    if scale < 1 or 2**k != scale:
        raise ValueError(f"scale={scale} is not a power of two")
    b, r = divmod(k, 3)
    wide, emb = 2 ** (b + (r > 0)), 2 ** (b + (r > 1))
    return _maxtext(2560 * emb, 8 * wide, 8192 * wide, 16 * 2**b)


PRESETS: dict[str, FFNConfig | TransformerConfig] = {
    # The question's model (questions-4d.md): D=16384, F=53248, L=126 -> P = 219,848,638,464.
    "xxl": FFNConfig(d_model=16384, d_ff=53248, blocks=126),
    # XXL width, two blocks: the GPU benchmark configuration.
    "xxl-2": FFNConfig(d_model=16384, d_ff=53248, blocks=2),
    # Small configurations for emulated-device tests; dims divisible by 8 shards.
    "small": FFNConfig(d_model=256, d_ff=1024, blocks=4),
    "tiny": FFNConfig(d_model=64, d_ff=256, blocks=3),
    # Transformers. seed000: the XXL's dimensions as a transformer (../shared/reference/seeds/000: Ulysses
    # over 16 GPUs at 60,000 tokens); seed001: the layer estimator's model (e = 12288, 96 heads, f = 4e,
    # 96 blocks, 2048 tokens); Llama-3-style 8B and 70B shapes (grouped-query, SwiGLU; Meta's model card).
    "seed000": TransformerConfig(d_model=16384, heads=128, d_ff=53248, blocks=126, seq_len=60000),
    "seed001": TransformerConfig(d_model=12288, heads=96, d_ff=4 * 12288, blocks=96, seq_len=2048),
    "llama-8b": TransformerConfig(d_model=4096, heads=32, kv_heads=8, d_ff=14336, blocks=32, seq_len=8192,
                                  mlp="swiglu"),
    "llama-70b": TransformerConfig(d_model=8192, heads=64, kv_heads=8, d_ff=28672, blocks=80, seq_len=8192,
                                   mlp="swiglu"),
    # for emulated-device tests: heads and kv heads divisible by context·tensor up to 8
    "tiny-tf": TransformerConfig(d_model=64, heads=8, kv_heads=8, d_ff=256, blocks=2, seq_len=64),
    "small-tf": TransformerConfig(d_model=256, heads=8, kv_heads=8, d_ff=1024, blocks=4, seq_len=256),
    # for TPU topologies ahead of time: arrays large enough that HBM, not the compiler's working set, sets the peak
    "medium-tf": TransformerConfig(d_model=2048, heads=16, kv_heads=8, d_ff=8192, blocks=4, seq_len=2048),
    # The measured runs' models (../shared/reference/measured.md), with their vocabularies. MaxText's 2023
    # family (maxtext_scale, by its global_parameter_scale rule; the v4 22B and 52B as its tables list them):
    # parallel blocks, ReLU, head_dim 256, a tied 32,768-token vocabulary, T = 2048.
    **{f"maxtext-{k}b": maxtext_scale(k) for k in (16, 32, 64, 128)},
    "maxtext-22b": _maxtext(6144, 24, 24576, 48),
    "maxtext-52b": _maxtext(12288, 32, 49152, 32),
    # GPT-3 175B (Brown et al. 2020, table 2.1; its 50,257 tokens padded to 50,304 = 128·393, as Megatron pads)
    "gpt3-175b": TransformerConfig(d_model=12288, heads=96, d_ff=49152, blocks=96, seq_len=2048, vocab=50304),
    # Llama 2 (Touvron et al. 2023, table 1 and the released configs) and Llama 3.1 (Meta's model cards):
    # SwiGLU, untied embeddings, grouped-query attention at 70B and above
    "llama2-7b": TransformerConfig(d_model=4096, heads=32, d_ff=11008, blocks=32, seq_len=4096, mlp="swiglu",
                                   vocab=32000),
    "llama2-70b": TransformerConfig(d_model=8192, heads=64, kv_heads=8, d_ff=28672, blocks=80, seq_len=4096,
                                    mlp="swiglu", vocab=32000),
    "llama3.1-8b": TransformerConfig(d_model=4096, heads=32, kv_heads=8, d_ff=14336, blocks=32, seq_len=8192,
                                     mlp="swiglu", vocab=128256),
    "llama3.1-70b": TransformerConfig(d_model=8192, heads=64, kv_heads=8, d_ff=28672, blocks=80, seq_len=8192,
                                      mlp="swiglu", vocab=128256),
    "llama3.1-405b": TransformerConfig(d_model=16384, heads=128, kv_heads=8, d_ff=53248, blocks=126, seq_len=8192,
                                       mlp="swiglu", vocab=128256),
    # BLOOM-176B (BigScience 2022, table 3: 70 layers, 14336 wide, 112 heads, 250,880 tokens, tied)
    "bloom-176b": TransformerConfig(d_model=14336, heads=112, d_ff=57344, blocks=70, seq_len=2048, vocab=250880,
                                    tied_embeddings=True),
}


Model = FFNConfig | TransformerConfig  # the models the package builds, closes forms for and checks
FAMILIES = (FFNConfig, TransformerConfig)  # every model family, in the order commands list them


def get_preset(name: str) -> Model:
    """The preset named ``name``; ValueError listing the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None


# HBM bytes one gradient accumulation moves per parameter (each microbatch's gradient added to the FP32
# accumulator), by the runtime that runs the step (Precision.accumulation; predict --grad-accumulation)
ACCUMULATION_BYTES = {
    # this package's step: the microbatch's FP32 gradient and the accumulator read, the accumulator written,
    # 3·4 B (the compiled adds; one H200's profile in docs/findings.md)
    "package": 12,
    # Megatron-LM (Narayanan et al. 2021): its gradient hook's main_grad.add_(grad), the 16-bit gradient read (2 B),
    # the FP32 main_grad read and written (4 + 4 B)
    "megatron": 10,
    # DeepSpeed's BF16_Optimizer.update_hp_grads after each micro-step's backward (its pipeline engine,
    # runtime/pipe/engine.py _exec_backward_pass): hp_grad.add_(lp.grad.to(fp32)), the cast's temporary read 2 B and
    # written 4 B, then the FP32 add read 4 + 4 B and written 4 B
    "deepspeed-bf16": 18,
}


@dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of state (questions-4d.md: FP32 master weights, gradients and
    Adam moments; BF16 activations and gradient communication)."""

    master: int = 4
    grad: int = 4
    adam_moment: int = 4
    adam_moments: int = 2
    compute: int = 2
    grad_comm: int = 2
    weight_comm: int = 2
    dtype: str = "bf16"  # the matmuls' input type: its peak rate is the hardware table's (scaling.kernels.peak_flops)
    accumulation: str = "package"  # the runtime whose gradient accumulation the step runs (ACCUMULATION_BYTES)

    @property
    def state_bytes_per_param(self) -> int:
        """master + grad + moments·moment = 4 + 4 + 2·4 = 16 bytes/param (training page)."""
        return self.master + self.grad + self.adam_moments * self.adam_moment

    @property
    def adam_update_bytes_per_param(self) -> int:
        """HBM bytes AdamW's update moves per parameter: reads master, gradient, mu, nu and writes master, mu, nu,
        (4 + 4 + 8) + (4 + 8) = 28 B."""
        moments = self.adam_moments * self.adam_moment
        return (self.master + self.grad + moments) + (self.master + moments)

    @property
    def accumulate_bytes_per_param(self) -> int:
        """HBM bytes one gradient accumulation moves per parameter, by runtime (ACCUMULATION_BYTES: this package's
        12 B, Megatron-LM's 10 B, DeepSpeed's BF16 optimizer's 18 B)."""
        return ACCUMULATION_BYTES[self.accumulation]

    @property
    def stored_bytes_per_param(self) -> int:
        """What persists between steps: master + moments = 12 bytes/param (gradients are transient)."""
        return self.master + self.adam_moments * self.adam_moment


DEFAULT_PRECISION = Precision()


def check_remat(remat: str, cfg: "FFNConfig | TransformerConfig | None" = None) -> Remat:
    """Validate a remat policy name: none, every-second (keep every second block's activations,
    recompute the others), full (keep only each block's input); the transformer's named policies
    (TRANSFORMER_ONLY_REMAT: what each keeps, ffn_model.transformer.POLICY_SAVES). every-second is refused
    for a TransformerConfig, the named policies for the FFN stack."""
    if remat not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {remat!r}; valid: {', '.join(REMAT_POLICIES)}")
    if isinstance(cfg, TransformerConfig) and remat == "every-second":
        raise ValueError("remat every-second is for the FFN stack; the transformer's remat is none, full or "
                         + ", ".join(TRANSFORMER_ONLY_REMAT))
    if isinstance(cfg, FFNConfig) and remat in TRANSFORMER_ONLY_REMAT:
        raise ValueError(f"remat {remat} is for the transformer; the FFN stack's remat is none, every-second or full")
    return Remat(remat)


def saved_blocks(blocks: int, remat: str) -> tuple[int, int]:
    """(blocks that save input and hidden, blocks that save only their input) under a remat policy.

    none: every block keeps x and h. full: every block keeps only x (h is recomputed).
    every-second: blocks are taken in pairs (first checkpointed, second not); an odd last block is
    checkpointed: floor(L/2) full, ceil(L/2) input-only.
    """
    check_remat(remat)
    if remat == "none":
        return blocks, 0
    if remat == "full":
        return 0, blocks
    return blocks // 2, blocks - blocks // 2



class MeshShape(Mapping):
    """Sizes of the mesh axes: a read-only mapping over MESH_AXES (outermost first), every axis present;
    an axis not given has size 1 and costs nothing. ``shape["fsdp"]`` or ``shape.fsdp``;
    N = ``shape.devices`` (the product). The closed forms take any mapping of axis sizes, numpy arrays
    included (the planner evaluates many meshes at once); this class is the validated scalar one."""

    __slots__ = ("_sizes",)

    def __init__(self, sizes: Mapping | None = None, /, **kw):
        given = {**(sizes or {}), **kw}
        unknown = [a for a in given if a not in MESH_AXES]
        if unknown:
            raise ValueError(f"unknown mesh axis {unknown[0]!r}; valid axes: {', '.join(MESH_AXES)}")
        object.__setattr__(self, "_sizes", tuple(positive_int(f"mesh axis {a!r}", given.get(a, 1)) for a in MESH_AXES))

    def __getitem__(self, axis: str) -> int:
        try:
            return self._sizes[MESH_AXES.index(axis)]
        except ValueError:
            raise KeyError(axis) from None

    def __getattr__(self, axis: str) -> int:
        if axis in MESH_AXES:
            return self[axis]
        raise AttributeError(axis)

    def __setattr__(self, name, value):
        raise AttributeError("MeshShape is immutable")

    def __iter__(self):
        return iter(MESH_AXES)

    def __len__(self) -> int:
        return len(MESH_AXES)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self) == {a: other.get(a, 1) for a in MESH_AXES} and all(
            a in MESH_AXES for a in other)

    def __hash__(self) -> int:
        return hash(self._sizes)

    def __repr__(self) -> str:
        return f"MeshShape({', '.join(f'{a}={n}' for a, n in self.items())})"

    @property
    def devices(self) -> int:
        """N, the product of the axis sizes."""
        return math.prod(self._sizes)

    def as_dict(self) -> dict[str, int]:
        return dict(self)

    def __str__(self) -> str:
        return ",".join(f"{a}={n}" for a, n in self.items() if n > 1) or "1 device"


def parse_mesh_spec(spec: str, devices: int | None = None) -> MeshShape:
    """Parse ``"fsdp=16,tensor=4"`` into a MeshShape. Axes not named have size 1.

    If ``devices`` is given the product of the axis sizes must equal it. A single axis may be
    given as ``-1`` to take the remaining devices.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mesh spec must look like 'fsdp=4,tensor=2', got {spec!r}")
    sizes: dict[str, int] = {}
    for part in spec.split(","):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"mesh spec item {part!r} must be axis=size (axes: {', '.join(MESH_AXES)})")
        if key not in MESH_AXES:
            raise ValueError(f"unknown mesh axis {key!r} in {spec!r}; valid axes: {', '.join(MESH_AXES)}")
        if key in sizes:
            raise ValueError(f"mesh axis {key!r} given twice in {spec!r}")
        try:
            n = ascii_int(val)
        except ValueError:
            raise ValueError(f"mesh axis {key!r} size must be an integer, got {val!r}") from None
        if n == -1:
            if devices is None or -1 in sizes.values():
                raise ValueError(f"mesh axis {key!r} = -1 needs a device count and only one -1 axis")
        elif n <= 0:
            raise ValueError(f"mesh axis {key!r} size must be positive, got {n}")
        sizes[key] = n
    if -1 in sizes.values():
        rest = 1
        for n in sizes.values():
            rest *= n if n > 0 else 1
        if devices % rest:
            raise ValueError(f"mesh {spec!r}: {devices} devices are not divisible by {rest}")
        sizes = {k: (devices // rest if v == -1 else v) for k, v in sizes.items()}
    shape = MeshShape(**sizes)
    if devices is not None and shape.devices != devices:
        raise ValueError(
            f"mesh {spec!r} has {shape.devices} devices (product of axis sizes) but {devices} devices are given"
        )
    return shape


FSDP_GATHERS = tuple(str(k) for k in FsdpGather)
PIPELINES = tuple(str(k) for k in Pipeline)
ATTENTIONS = tuple(str(k) for k in Attention)
CONTEXT_STRATEGIES = tuple(str(k) for k in ContextStrategy)


@dataclass(frozen=True)
class Schedule:
    """How one train step runs its batch (Scaling Book applied-training page; MaxText's pipeline):

    microbatches M  the batch in M microbatches of B/M tokens. Without a stage axis: gradient
                    accumulation (M forward/backward passes, one optimizer update, one microbatch's
                    activations live at a time). With stage > 1: the pipeline's microbatches.
    repeats R       circular (interleaved) pipeline: each stage holds R non-adjacent chunks of
                    L/(S·R) blocks (stage s holds chunks s, S+s, 2S+s, ...); R = 1 is GPipe.
    fsdp_gather     "microbatch": every block gathers its weights over fsdp each time it runs (per
                    microbatch, per pipeline iteration); "step": a stage gathers all its weights once
                    per step and keeps them for every microbatch (pipeline only).
    sequence_parallel  Megatron sequence parallelism (Korthikanti et al. 2022) on the tensor axis:
                    between blocks the activations are split over tensor along the tokens; an
                    all-gather before the first matmul and a reduce-scatter after the last replace the
                    tensor all-reduce, and the saved block inputs shrink by Y.
    attention       (transformer) "materialized": the T×S scores and probabilities as arrays;
                    "flash": key blocks of ``attention_block`` in a scan with an online softmax, memory
                    O(T·block) (ffn_model.attention).
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
                    replicated over data; "zero1" (ZeRO stage 1, Rajbhandari et al. 2020): the gradients
                    reduce-scattered over data·fsdp, the moments and the update sharded over data too, the
                    updated FP32 weights all-gathered over data (the weights, this package's FP32 masters,
                    stay replicated over data: the forward reads them).
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

    def __post_init__(self):
        positive_ints("microbatches", self.microbatches)  # the planner passes a numpy array of candidates
        positive_int("repeats", self.repeats)
        for name, kind, what in (("fsdp_gather", FsdpGather, "fsdp_gather"), ("attention", Attention, "attention"),
                                 ("context", ContextStrategy, "context strategy"),
                                 ("optimizer_sharding", OptimizerSharding, "optimizer sharding"),
                                 ("pipeline", Pipeline, "pipeline schedule")):
            object.__setattr__(self, name, choose(kind, getattr(self, name), what))
        if self.repeats > 1 and self.pipeline == "gpipe":  # GPipe's loop over more than one chunk per stage
            object.__setattr__(self, "pipeline", Pipeline.CIRCULAR)
        if self.pipeline == "circular" and self.repeats == 1:
            raise ValueError("a circular pipeline needs repeats > 1 (chunks per stage); repeats=1 is gpipe")
        if not isinstance(self.warmup_phases, bool):
            raise ValueError(f"warmup_phases must be True or False, got {self.warmup_phases!r}")
        if self.warmup_phases and self.pipeline != "1f1b":
            raise ValueError("warmup_phases is the 1f1b schedule's (its forward-only warm-up and backward-only "
                             "cool-down)")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        positive_int("attention_block", self.attention_block)

    def check(self, cfg: Model, mesh: Mapping, batch_tokens: int | None = None) -> "Schedule":
        """ValueError naming the input when the schedule cannot run ``cfg`` on ``mesh``: the stages must
        split the blocks evenly, the repeats the blocks of a stage, a circular pipeline needs at least
        as many microbatches as stages, B must split into M microbatches over data·fsdp."""
        S, M, R, L = mesh.get("stage", 1), self.microbatches, self.repeats, cfg.blocks
        if self.optimizer_sharding == "zero1":
            if S > 1 and self.pipeline != "1f1b":
                raise ValueError("optimizer_sharding zero1 with pipeline stages is built for the 1f1b schedule (its "
                                 "loop reduces the gradients over data once): use --schedule 1f1b, or fsdp")
            n = shards(mesh, "embed_zero1")
            if cfg.d_model % n:
                raise ValueError(f"d_model={cfg.d_model} is not divisible by data·fsdp = {n} (zero1 shards the "
                                 "optimizer state's D over both)")
        if isinstance(cfg, TransformerConfig):
            _check_transformer(cfg, mesh, self)
            if self.pipeline == "1f1b" and R > 1 and np.any(np.asarray(M) < S):
                raise ValueError(f"interleaved 1f1b needs microbatches >= stages: {M} < {S}")
            if S > 1 and (self.pipeline != "1f1b" or R > 1) and np.any(np.asarray(M) % S):
                raise ValueError(f"microbatches={M} must be a multiple of stage={S} for the transformer's "
                                 + ("interleaved 1f1b (groups of S microbatches)" if self.pipeline == "1f1b" else
                                    f"{self.pipeline} (each stage runs the output layer on M/S of them)"))
            if S > 1 and self.fsdp_gather == "step":
                raise ValueError("fsdp_gather='step' is built for the FFN stack's pipeline, not the transformer's")
            if batch_tokens is not None:
                seqs = positive_int("batch_tokens", batch_tokens) // cfg.seq_len
                n = M * shards(mesh, "batch")
                if batch_tokens % cfg.seq_len or seqs % n:
                    raise ValueError(f"batch_tokens={batch_tokens} must be whole sequences of seq_len={cfg.seq_len}, "
                                     f"their number divisible by microbatches·data·fsdp = {n}")
        if L % S:
            divisors = ", ".join(str(k) for k in range(1, L + 1) if L % k == 0)
            raise ValueError(f"blocks={L} cannot be split evenly over stage={S}; use a stage count that divides "
                             f"{L} ({divisors})")
        if self.pipeline == "1f1b" and S == 1:
            raise ValueError("the 1f1b schedule needs a stage axis (stage > 1 in the mesh)")
        if self.pipeline == "1f1b" and not isinstance(cfg, TransformerConfig):
            raise ValueError("the 1f1b schedule is built for the transformer; the FFN stack runs gpipe or circular")
        if R > 1 and S == 1:
            raise ValueError(f"repeats={R} needs a stage axis (circular pipeline); without one use repeats=1")
        if (L // S) % R:
            raise ValueError(f"repeats={R} must divide the {L // S} blocks of each of the {S} stages")
        if R > 1 and np.any(np.asarray(M) < S):
            raise ValueError(f"a circular pipeline (repeats={R}) needs microbatches >= stages: {M} < {S}")
        if self.fsdp_gather == "step" and S == 1:
            raise ValueError("fsdp_gather='step' (weights gathered once per step) is for pipelined stages: "
                             "without a stage axis every microbatch gathers them")
        if self.sequence_parallel and S > 1:
            raise ValueError("sequence_parallel with pipeline stages is not supported: use one or the other")
        if self.sequence_parallel and mesh.get("tensor", 1) == 1:
            raise ValueError("sequence_parallel splits the activations over the tensor axis; the mesh has none "
                             "(give tensor > 1 in the mesh, or leave sequence parallelism off)")
        if batch_tokens is not None and not isinstance(cfg, TransformerConfig):
            n = M * shards(mesh, "batch_sp" if self.sequence_parallel else "batch")
            if positive_int("batch_tokens", batch_tokens) % n:
                raise ValueError(f"batch_tokens={batch_tokens} is not divisible by microbatches·data·fsdp"
                                 + ("·tensor" if self.sequence_parallel else "") + f" = {n}")
        return self


def _check_transformer(cfg: TransformerConfig, mesh: Mapping, schedule: "Schedule") -> None:
    """What the transformer's shardings and attention strategies need (ValueError naming the input): the
    heads and kv heads divide by tensor (and by context·tensor for Ulysses, which splits the heads over
    context), T by context (by context·tensor with sequence parallelism), and a flash attention's key
    blocks divide the keys each device attends to (T, or T/C for ring)."""
    C, Y = mesh.get("context", 1), mesh.get("tensor", 1)
    heads_split = C * Y if C > 1 and schedule.context == "ulysses" else Y
    for name, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads)):
        if n % heads_split:
            what = "context·tensor (Ulysses splits the heads over context)" if heads_split != Y else "tensor"
            raise ValueError(f"{name}={n} is not divisible by {what} = {heads_split}")
    t_split = C * Y if schedule.sequence_parallel else C
    if cfg.seq_len % t_split:
        by = "context·tensor" if schedule.sequence_parallel else "context"
        raise ValueError(f"seq_len={cfg.seq_len} is not divisible by {by} = {t_split}")
    keys = cfg.seq_len // C if C > 1 and schedule.context == "ring" else cfg.seq_len
    if schedule.attention == "flash" and keys > schedule.attention_block and keys % schedule.attention_block:
        raise ValueError(f"attention_block={schedule.attention_block} does not divide the {keys} keys each device "
                         "attends to at a time")


def spans(size) -> bool:
    """Whether a mesh axis of ``size`` devices splits anything (size > 1): an int, or the planner's array of one
    axis's sizes over a group of meshes, all > 1 or all 1 (scaling.plan groups them so; ValueError otherwise)."""
    if isinstance(size, int):
        return size > 1
    more = np.asarray(size) > 1
    if more.all() != more.any():
        raise ValueError("a group of meshes mixes sizes of 1 and > 1 on one axis")
    return bool(more.all())


def divisions(cfg: Model) -> list[tuple[str, int, str]]:
    """(name, dimension, logical axis) of every model dimension the sharding table splits: D (embed), F (mlp), a
    transformer's vocabulary V (vocab); check_divisible's rule, also the planner's."""
    out = [("d_model", cfg.d_model, "embed"), ("d_ff", cfg.d_ff, "mlp")]
    if isinstance(cfg, TransformerConfig) and cfg.vocab is not None:
        out.append(("vocab", cfg.vocab, "vocab"))
    return out


def check_divisible(cfg: Model, mesh: Mapping, batch_tokens: int | None = None) -> None:
    """Every sharded dimension must divide by its shard count, through the sharding table
    (scaling.sharding): D by the shards of ``embed``, F by those of ``mlp``, B by those of ``batch``
    (a transformer's batch in whole sequences: B/T sequences by the shards of ``batch``)."""
    if isinstance(cfg, TransformerConfig):
        checks = divisions(cfg)
        if batch_tokens is not None:
            positive_int("batch_tokens", batch_tokens)
            if batch_tokens % cfg.seq_len:
                raise ValueError(f"batch_tokens={batch_tokens} is not whole sequences of seq_len={cfg.seq_len}")
            checks.append(("sequences (batch_tokens/seq_len)", batch_tokens // cfg.seq_len, "batch"))
        for name, dim, logical in checks:
            if dim % shards(mesh, logical):
                raise ValueError(f"{name}={dim} is not divisible by the {'·'.join(LOGICAL_RULES[logical])} shard "
                                 f"count {shards(mesh, logical)}")
        return
    if mesh.get("context", 1) > 1:
        raise ValueError(f"context={mesh['context']}: the FFN stack has no sequence axis to split over context "
                         "(use data or fsdp for its tokens)")
    checks = divisions(cfg)
    if batch_tokens is not None:
        positive_int("batch_tokens", batch_tokens)
        checks.append(("batch_tokens", batch_tokens, "batch"))
    for name, dim, logical in checks:
        n = shards(mesh, logical)
        if dim % n:
            axes = "·".join(LOGICAL_RULES[logical])
            raise ValueError(f"{name}={dim} is not divisible by the {axes} shard count {n}")
