"""A pre-norm causal transformer stack in the FFN stack's style: Flax NNX, parameters stacked over the
layers and scanned, sharded through the logical-axis table, FP32 master weights gathered over fsdp in
BF16 (ffn_model.sharded.gather_bf16), BF16 activations.

One layer, x_BxTxD (batch over data·fsdp, sequence over context; under sequence parallelism the
sequence also over tensor between the matmuls):

  h1 = RMSNorm(x)                     (FP32 statistics, BF16 out; no learned scale: rms_norm)
  q, k, v = h1·W_q, h1·W_k, h1·W_v    [B,T,N,H], [B,T,K,H]: heads over tensor
  o = causal attention(q, k, v)       ffn_model.attention: materialized, flash, splash or cudnn; with a context
                                      axis, Ulysses (all-to-all) or ring (ppermute), in a shard_map
                                      manual over every mesh axis
  x = x + o·W_o                       partial sums over tensor: all-reduce (reduce-scatter under SP)
  h2 = RMSNorm(x)
  x = x + act(h2·W_in)·W_out          ReLU, GELU, or SwiGLU silu(h2·W_gate)·(h2·W_in) (cfg.mlp)
Parallel (cfg.block, GPT-J / PaLM): x = x + o·W_o + act(h1·W_in)·W_out, one norm, the two partial sums added
before one all-reduce (reduce-scatter under SP) over tensor.

Weights are stored with D, the FSDP-sharded dimension, minor ([N,H,D], [K,H,D], [F,D]), like the FFN
stack's (ffn_model.model.FFNStack says why). Remat policies: "none" keeps what the backward's matmuls
and the attention need (SAVED below), "full" only each layer's input (everything recomputed);
scaling.families.transformer counts both.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from ffn_model.attention import (RESIDUAL_NAMES, attention_materialized, cudnn_attention, flash_attention_o,
                                 ring_attention, splash_attention, ulysses_attention)
from ffn_model.pipeline import (circular_layout, live_slots, merge_microbatches, one_f_one_b, pad_stack,
                                pipeline_outputs, real_blocks, split_microbatches, uneven_stages)
from ffn_model.sharded import (COMPUTE_DTYPE, constrain, gather_bf16, grad_axes, init_normal, loop_checkpoint, param,
                               reshard, to_bf16, traced_platform)
from ffn_model.task import mse, teacher_batch, token_mean
from mesh.rules import logical_to_spec
from scaling.core.kinds import Block, Mlp
from scaling.core.policies import Attention, ContextStrategy, Pipeline, Remat
from scaling.core.schedule import Schedule
from scaling.families.transformer import TransformerConfig
from scaling.core.sharding import shards
from scaling.core.workload import Workload

# Logical axes (scaling.core.sharding's table)
X_AXES = ("batch", "seq", "act_embed")  # x [B, T, D] at the matmuls
X_SP_AXES = ("batch", "seq_sp", "act_embed")  # x between the matmuls under sequence parallelism
Q_AXES = ("batch", "seq", "heads", "head_dim")
KV_AXES = ("batch", "seq", "kv_heads", "head_dim")
H_AXES = ("batch", "seq", "mlp")
WQ_AXES = ("layers", "heads", "head_dim", "embed")  # W_q, W_o [L, N, H, D]
WKV_AXES = ("layers", "kv_heads", "head_dim", "embed")  # W_k, W_v [L, K, H, D]
W_MLP_AXES = ("layers", "mlp", "embed")  # W_in, W_gate, W_out [L, F, D]
# multi-head latent attention's (mla_projection): W_dq and W_dkv as one [L, r_q + r_kv + H_r, D], stored split over
# tensor too and gathered whole for its matmul (latent_split); the up-projections W_uq [L, N, H + H_r, r_q] and W_ukv
# [L, N, H + H_v, r_kv], heads over tensor, r (their contracted dimension, as D is the others') over fsdp
W_DOWN_AXES = ("layers", "latent_split", "embed")
W_UP_AXES = ("layers", "heads", "head_dim", "embed")
LATENT_AXES = ("batch", "seq", "latent")  # the latents [B, T, r_q + r_kv + H_r]
LAYER_AXES = {"wq": WQ_AXES, "wk": WKV_AXES, "wv": WKV_AXES, "wo": WQ_AXES, "w_down": W_DOWN_AXES, "w_uq": W_UP_AXES,
              "w_ukv": W_UP_AXES, "w_in": W_MLP_AXES, "w_gate": W_MLP_AXES, "w_out": W_MLP_AXES}  # the stacked layer
# weights'
ATTENTION_WEIGHTS = ("wq", "wk", "wv", "w_down", "w_uq", "w_ukv", "wo")
VOCAB_AXES = ("vocab", "embed")  # the embedding E and the output projection U [V, D]
IDS_AXES = ("batch", "seq")  # token ids and labels [B, T]
LOGITS_AXES = ("batch", "seq", "vocab")  # logits [B, T, V]: vocab-parallel, never gathered

# What remat="none" keeps for the backward (jax.checkpoint save_only_these_names): the norms' outputs
# (the projections' inputs; under SP their token split), q, k, v, the attention's own residuals (the
# probabilities, or a flash attention's output and log-sum-exp), its output (W_o's input), the residual
# stream after attention (the second norm's input) and the MLP's hidden (its matmuls' inputs).
SAVED = ("norm1", "latents", "q", "k", "v", *RESIDUAL_NAMES, "mid", "norm2", "mlp_in", "mlp_gate")
# Under sequence parallelism the norms' outputs are not kept: the backward recomputes them from the token
# split of x and of mid and all-gathers them again (Korthikanti et al. 2022, section 4.2.2). Named, XLA
# kept them whole (its sharding propagation gave the saved stacks the all-gathered layout).
SAVED_SP = tuple(n for n in SAVED if n not in ("norm1", "norm2"))
# The named policies (scaling.core.policies.Remat): what each keeps besides the layer's input. MaxText's (its
# decoders' get_remat_policy): the projections' outputs, q, k, v ("query/key/value_proj"), o·W_o after its
# reduction ("out_proj": attn_proj), the MLP's first matmul(s) ("mlpwi": mlp_in, mlp_gate) and its output
# ("mlpwo": mlp_out); Korthikanti et al. 2022's selective recompute: everything but the attention's
# probabilities (what remat none keeps less the O(T²) scores; the same as none for flash attention).
POLICY_SAVES = {
    "minimal": ("q", "k", "v", "latents", "attn_proj", "mlp_in", "mlp_gate"),
    "save_dot_except_mlpwi": ("q", "k", "v", "latents", "attn_proj", "mlp_out"),
    "save_dot_except_mlp": ("q", "k", "v", "latents", "attn_proj"),
    "save_qkv_proj": ("q", "k", "v", "latents"),
    "save_qkv_context": ("q", "k", "v", "latents", *RESIDUAL_NAMES),
    "qkv_proj_offloaded": (),
    "input_qkv_offloaded": (),
    "full": (),
}
# The offloading policies (MaxText's qkv_proj_offloaded; its v6e Llama 3.1 70B recipe's custom policy, which offloads
# decoder_layer_input too): what jax.checkpoint_policies.save_and_offload_only_these_names moves to pinned host memory
# in the forward and back for the layer's backward ("layer_input": the layer's input x, named where it enters)
POLICY_OFFLOADS = {
    "qkv_proj_offloaded": ("q", "k", "v", "latents"),
    "input_qkv_offloaded": ("layer_input", "q", "k", "v", "latents"),
}


def policy_saves(remat: str, schedule: Schedule) -> tuple[str, ...]:
    """The checkpoint names a remat policy keeps (module docstring; POLICY_SAVES)."""
    if remat in (Remat.NONE, Remat.SELECTIVE):
        saved = SAVED_SP if schedule.sequence_parallel else SAVED
        return tuple(n for n in saved if n != "attn_probs") if remat == Remat.SELECTIVE else saved
    return POLICY_SAVES[remat]


def remat_policy(remat: str, schedule: Schedule):
    """The jax.checkpoint policy of a layer under ``remat``: save_only_these_names(policy_saves), and for the
    offloading policies (POLICY_OFFLOADS) save_and_offload_only_these_names, theirs to pinned host memory."""
    if remat in POLICY_OFFLOADS:
        return jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=policy_saves(remat, schedule), names_which_can_be_offloaded=POLICY_OFFLOADS[remat],
            offload_src="device", offload_dst="pinned_host")
    return jax.checkpoint_policies.save_only_these_names(*policy_saves(remat, schedule))


EPS = 1e-6


def rms_norm(x_BxTxD):
    """x / sqrt(mean(x²) + eps), statistics in FP32, BF16 out (Zhang & Sennrich 2019), without a learned
    scale: a per-channel scale that feeds a linear layer can be folded into that layer's weights, and
    its [D] gradient would need reductions of its own over every axis that splits the tokens."""
    x = x_BxTxD.astype(jnp.float32)
    return (x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + EPS)).astype(COMPUTE_DTYPE)


QK_NORM = contextvars.ContextVar("qk_norm", default=False)  # the traced model's QK-norm (qk_norm_on)


@contextlib.contextmanager
def qk_norm_on(on: bool):
    """While a model's step is traced (its __call__): whether _named normalizes q and k (TransformerConfig.qk_norm).
    The norms run where _named does, under every attention form and context strategy, so the attention kernels need
    no flag of their own."""
    token = QK_NORM.set(bool(on))
    try:
        yield
    finally:
        QK_NORM.reset(token)


def _named(q, k, v):
    """q, k, v as the attention kernel takes them, named for the remat policy (SAVED): after Ulysses'
    all-to-all, the head split over the whole sequence; otherwise the device's sequence chunk. With QK-norm
    (qk_norm_on) q and k then normalized over H (rms_norm), after the names: a policy keeps them unnormalized and the
    backward recomputes the norms (elementwise, no matmul again; scaling.families.transformer.qk_norm_kernels)."""
    q, k, v = checkpoint_name(q, "q"), checkpoint_name(k, "k"), checkpoint_name(v, "v")
    if QK_NORM.get():
        q, k = rms_norm(q), rms_norm(k)
    return q, k, v


def _local_attention(schedule: Schedule, window=None):
    """attend(q, k, v, q_pos, k_pos) -> o for the schedule's attention form, q, k, v named (_named); ``window``:
    sliding-window attention over W keys (None: global)."""
    if schedule.attention == Attention.FLASH:
        kernel = functools.partial(flash_attention_o, block=schedule.attention_block, window=window)
    elif schedule.attention == Attention.SPLASH:
        kernel = functools.partial(splash_attention, window=window, block=schedule.attention_block,
                                   fused_backward=schedule.splash_fused_backward)
    elif schedule.attention == Attention.CUDNN:
        kernel = functools.partial(cudnn_attention, window=window)
    else:
        kernel = functools.partial(attention_materialized, window=window)
    return lambda q, k, v, q_pos, k_pos: kernel(*_named(q, k, v), q_pos, k_pos)


def attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, schedule: Schedule, window=None):
    """Causal attention on the global arrays. Without a context axis: the local form on every device's
    batch and heads (GSPMD). With one: jax.shard_map manual over context and tensor (each device its
    sequence chunk and its heads), Ulysses or ring (ffn_model.attention). ``window``: a local layer's W keys
    (materialized, flash, splash and Ulysses; ring is refused where the Workload is built). Attention "auto" takes
    the traced mesh's platform's kernel (Schedule.on); splash, a Pallas kernel XLA does not partition, runs under a
    shard_map over the mesh's automatic axes (MaxText's form) or inside Ulysses' shard_map."""
    mesh = jax.sharding.get_abstract_mesh()
    schedule = schedule.on(traced_platform(), q_BxTxNxH.shape[1])  # auto: the platform's kernel (Schedule.on)
    local = _local_attention(schedule, window)
    T = q_BxTxNxH.shape[1]
    spec, kv_spec = logical_to_spec(Q_AXES), logical_to_spec(KV_AXES)
    auto = set(mesh.axis_names) - set(mesh.manual_axes)  # inside a pipeline's shard_map, stage is manual already
    if mesh.empty or mesh.shape.get("context", 1) == 1:
        pos = jnp.arange(T, dtype=jnp.int32)
        if schedule.attention != Attention.SPLASH or mesh.empty or not auto:
            return local(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, pos, pos)
        # a Pallas kernel is not partitioned by XLA: splash runs under a shard_map over the mesh's batch and heads
        # axes, each device its sequences and heads whole in T (MaxText's attention_op, tpu_flash_attention)
        return jax.shard_map(lambda q, k, v: local(q, k, v, pos, pos), mesh=mesh, in_specs=(spec, kv_spec, kv_spec),
                             out_specs=spec, axis_names=auto, check_vma=False)(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)
    # fully manual: every device its batch shard, sequence chunk and heads (left automatic, the batch axes
    # made XLA all-gather q, k, v over fsdp around the all-to-all)
    if schedule.context == ContextStrategy.ULYSSES:
        fn = functools.partial(ulysses_attention, axis_name="context", attend=local)
    else:
        ring = functools.partial(ring_attention, axis_name="context", block=schedule.attention_block)
        fn = lambda q, k, v: ring(*_named(q, k, v))  # noqa: E731
    return jax.shard_map(lambda q, k, v: fn(q, k, v), mesh=mesh, in_specs=(spec, kv_spec, kv_spec), out_specs=spec,
                         axis_names=auto, check_vma=False)(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)


def _gather(w, axes):
    return gather_bf16(w, axes[1:])


def qkv_projection(h_BxTxD, wq_NxHxD, wk_KxHxD, wv_KxHxD):
    """q, k, v = h·W_q, h·W_k, h·W_v (FP32 master shards in) as ONE matmul against the three weights laid
    side by side per tensor shard, [Y, N/Y + 2K/Y, H, D]: a local concatenation of the masters (the
    heads' split over tensor and D's over fsdp kept), gathered over fsdp as one BF16 array. So the
    backward's input gradient dq·W_q + dk·W_k + dv·W_v is one partial sum over tensor (one all-reduce;
    three matmuls made XLA all-reduce three [B,T,D] partials), and the weights' gradient one array
    reduced like the MLP's (concatenated after the gather, XLA reduced its gradient over context before
    fsdp, at the full size)."""
    mesh = jax.sharding.get_abstract_mesh()
    Y = 1 if mesh.empty else mesh.shape["tensor"]
    (N, H, D), K = wq_NxHxD.shape, wk_KxHxD.shape[0]
    axes = ("tensor_split", None, "head_dim", "embed")
    # reshard, not constrain: the transpose of a sharding constraint would hold the gradient to the weight's
    # layout (under ZeRO-1 its gradient is split over data too: ffn_model.sharded.grad_axes)
    split = lambda w: reshard(w.reshape(Y, w.shape[0] // Y, H, D), axes, grad_axes(axes))  # noqa: E731
    w = jnp.concatenate([split(wq_NxHxD), split(wk_KxHxD), split(wv_KxHxD)], axis=1)  # [Y, (N+2K)/Y, H, D]
    qkv = jnp.einsum("btd,yjhd->btyjh", h_BxTxD, gather_bf16(reshard(w, axes, grad_axes(axes)), axes))
    n, kk = N // Y, K // Y
    B, T = h_BxTxD.shape[:2]
    q = constrain(qkv[:, :, :, :n].reshape(B, T, N, H), Q_AXES)
    k = constrain(qkv[:, :, :, n:n + kk].reshape(B, T, K, H), KV_AXES)
    v = constrain(qkv[:, :, :, n + kk:].reshape(B, T, K, H), KV_AXES)
    return q, k, v


ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}
SHARD_ROWS = ("tensor_split", None, "embed")  # [Y, rows of one tensor shard, D]


def _tensor_size() -> int:
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else mesh.shape["tensor"]


def _side_by_side(ws):
    """FP32 master shards [R, ..., D] (R over tensor) laid side by side per tensor shard, [Y, Σ rows, D]
    (a local concatenation), gathered over fsdp as one BF16 array; and each weight's row count."""
    Y = _tensor_size()
    back = grad_axes(SHARD_ROWS)  # the gradients' layout (ZeRO-1: over data too), as in qkv_projection
    parts = [reshard(w.reshape(Y, -1, w.shape[-1]), SHARD_ROWS, back) for w in ws]
    w = jnp.concatenate(parts, axis=1)
    return gather_bf16(reshard(w, SHARD_ROWS, back), SHARD_ROWS), [p.shape[1] for p in parts]


def fused_in(h_BxTxD, ws):
    """[h·W_i] for the weights ``ws`` as ONE matmul against them laid side by side (_side_by_side): each
    output [B, T, R_i·...] keeps the tensor split, and the backward's input gradient Σ dy_i·W_i is one
    partial sum over tensor (one reduction)."""
    w, rows = _side_by_side(ws)
    y = jnp.einsum("btd,yjd->btyj", h_BxTxD, w)
    B, T = h_BxTxD.shape[:2]
    ends = [sum(rows[:i]) for i in range(len(rows) + 1)]
    return [y[..., a:b].reshape(B, T, -1) for a, b in zip(ends, ends[1:])]


def fused_out(xs, ws):
    """Σ x_i·W_i as ONE matmul (x_i [B, T, R_i·...] split over tensor, W_i [R_i, ..., D]): one partial sum
    over tensor, so one reduction (two matmuls left XLA:CPU all-reducing each partial; XLA:TPU adds them
    first)."""
    w, _ = _side_by_side(ws)
    B, T, Y = *xs[0].shape[:2], w.shape[0]
    x = jnp.concatenate([x.reshape(B, T, Y, -1) for x in xs], axis=-1)
    return jnp.einsum("btyj,yjd->btd", constrain(x, ("batch", "seq", "tensor_split", None)), w)


def parallel_branches(h_BxTxD, w: dict, schedule: Schedule, kind: str, window=None):
    """o·W_o + MLP(h) of a parallel block from one norm's output h (PaLM, Chowdhery et al. 2022, section 2:
    the input projections fused, the output projections fused): q, k, v and the MLP's input(s) as one
    matmul (fused_in), the attention, then o and act(u) against W_o and W_out as one (fused_out)."""
    B, T = h_BxTxD.shape[:2]
    N, H = w["wq"].shape[:2]
    K = w["wk"].shape[0]
    ws = [w["wq"], w["wk"], w["wv"], w["w_in"]] + ([w["w_gate"]] if kind == Mlp.SWIGLU else [])
    q, k, v, u, *g = fused_in(h_BxTxD, ws)
    q = constrain(q.reshape(B, T, N, H), Q_AXES)
    k, v = (constrain(a.reshape(B, T, K, H), KV_AXES) for a in (k, v))
    o = checkpoint_name(constrain(attention(q, k, v, schedule, window), Q_AXES), "attn_out")
    u = checkpoint_name(constrain(u, H_AXES), "mlp_in")
    if kind == Mlp.SWIGLU:
        a = jax.nn.silu(checkpoint_name(constrain(g[0], H_AXES), "mlp_gate")) * u
    else:
        a = ACTIVATIONS[kind](u)
    return fused_out([o.reshape(B, T, N * H), a], [w["wo"], w["w_out"]])


def mlp(h_BxTxD, w: dict, kind: str, out_type=None):
    """act(h·W_in)·W_out (relu, gelu), or SwiGLU silu(h·W_gate)·(h·W_in)·W_out with W_in and W_gate as one
    [2, F, D] matmul (one partial sum, and all-reduce, for the input gradient); the output is a partial sum
    over tensor, in ``out_type`` (None: the inputs' BF16; the serving programs take FP32, ffn_model.serve)."""
    if kind == Mlp.SWIGLU:
        w_in_gate = jnp.stack([_gather(w["w_in"], W_MLP_AXES), _gather(w["w_gate"], W_MLP_AXES)])
        ug = jnp.einsum("btd,gfd->gbtf", h_BxTxD, w_in_gate)
        u = checkpoint_name(constrain(ug[0], H_AXES), "mlp_in")
        g = checkpoint_name(constrain(ug[1], H_AXES), "mlp_gate")
        a = jax.nn.silu(g) * u
    else:
        u = checkpoint_name(constrain(h_BxTxD @ _gather(w["w_in"], W_MLP_AXES).T, H_AXES), "mlp_in")
        a = ACTIVATIONS[kind](u)
    return jnp.matmul(a, _gather(w["w_out"], W_MLP_AXES), preferred_element_type=out_type)


def layer(x_BxTxD, w: dict, schedule: Schedule, mlp_kind: str = "gelu", block: str = "serial", select=None,
          window=None):
    """One pre-norm layer (module docstring) on one layer's weights ``w`` (FP32 shards): serial, or parallel
    (attention and MLP on the same norm's output, their partial sums added before one reduction over tensor).
    ``select``: applied to each weight first (a pipeline's chunk choice: ffn_model.pipeline.pipeline_outputs).
    ``window``: a local layer's sliding window W (None: global attention)."""
    if select is not None:
        w = {k: select(v) for k, v in w.items()}
    sp = schedule.sequence_parallel
    between = X_SP_AXES if sp else X_AXES

    def to_matmul(h, name):  # the norm's output, as the matmuls take it (all-gathered over tensor under SP)
        h = checkpoint_name(constrain(h, between), name)
        return reshard(h, X_AXES, X_SP_AXES) if sp else h

    def from_matmul(y):  # partial sums over tensor: all-reduced, or reduce-scattered to the token split
        return reshard(y, X_SP_AXES, X_AXES) if sp else constrain(y, X_AXES)

    x = checkpoint_name(constrain(x_BxTxD, between), "layer_input")
    h = to_matmul(rms_norm(x), "norm1")
    if block == Block.PARALLEL:
        return x + from_matmul(parallel_branches(h, w, schedule, mlp_kind, window))
    x = attention_sublayer(x, h, w, schedule, window, from_matmul)
    return x + checkpoint_name(from_matmul(mlp(to_matmul(rms_norm(x), "norm2"), w, mlp_kind)), "mlp_out")


def mla_projection(h_BxTxD, w: dict):
    """q, k, v of multi-head latent attention (DeepSeek-V2, DeepSeek-AI 2024, section 2.1, eqs. 9-19, as trained: the
    up-projections not absorbed; no rotary embedding, as the package's attention has none): the latents c = h·W_d
    [B, T, r_q + r_kv + H_r] as ONE matmul (W_dq and W_dkv stacked, whole over tensor), named "latents" (kept before
    their norms, which the backward recomputes: no matmul again); q = RMSNorm(c_q)·W_uq (or h·W_q without a q rank),
    [k_nope, v] = RMSNorm(c_kv)·W_ukv, heads over tensor; k = [k_nope, k_rope], the one k_rope [H_r] broadcast to
    every head. The backward's latent gradient is one partial sum over tensor (one all-reduce of c·t·(r_q + r_kv +
    H_r)), and W_q's input gradient another (c·t·D)."""
    N, Hkv = w["w_ukv"].shape[:2]
    Hv = w["wo"].shape[1]
    H = Hkv - Hv
    c = jnp.einsum("btd,rd->btr", h_BxTxD, _gather(w["w_down"], W_DOWN_AXES))
    c = checkpoint_name(constrain(c, LATENT_AXES), "latents")
    r_kv = w["w_ukv"].shape[-1]
    r_q = w["w_uq"].shape[-1] if "w_uq" in w else 0
    Hr = c.shape[-1] - r_q - r_kv
    if r_q:
        q = jnp.einsum("btr,nhr->btnh", rms_norm(c[..., :r_q]), _gather(w["w_uq"], W_UP_AXES))
    else:
        q = jnp.einsum("btd,nhd->btnh", h_BxTxD, _gather(w["wq"], WQ_AXES))
    kv = jnp.einsum("btr,nhr->btnh", rms_norm(c[..., r_q:r_q + r_kv]), _gather(w["w_ukv"], W_UP_AXES))
    kv = constrain(kv, Q_AXES)
    B, T = h_BxTxD.shape[:2]
    k_rope = jnp.broadcast_to(c[:, :, None, r_q + r_kv:], (B, T, N, Hr))
    k = constrain(jnp.concatenate([kv[..., :H], constrain(k_rope, Q_AXES)], axis=-1), Q_AXES)
    return constrain(q, Q_AXES), k, constrain(kv[..., H:], Q_AXES)


def attention_sublayer(x_BxTxD, h_BxTxD, w: dict, schedule: Schedule, window=None, from_matmul=None):
    """x + attention(h)·W_o, named "mid": q, k, v of the norm's output h (qkv_projection, or mla_projection for
    multi-head latent attention), the causal attention, the output projection's partial sums over tensor reduced by
    ``from_matmul`` (default: all-reduced to X_AXES)."""
    from_matmul = from_matmul or (lambda y: constrain(y, X_AXES))
    if "w_ukv" in w:
        q, k, v = mla_projection(h_BxTxD, w)
    else:
        q, k, v = qkv_projection(h_BxTxD, w["wq"], w["wk"], w["wv"])
    o = checkpoint_name(constrain(attention(q, k, v, schedule, window), Q_AXES), "attn_out")
    attn = jnp.einsum("btnh,nhd->btd", o, _gather(w["wo"], WQ_AXES))
    return checkpoint_name(x_BxTxD + checkpoint_name(from_matmul(attn), "attn_proj"), "mid")


GLOBAL_WINDOW = 2 ** 30  # a global layer among local ones: a window no sequence reaches


@jax.custom_vjp
def backward_fence(x_BxTxD, w: dict):
    """Identity on a layer's input and weights; in the backward, their cotangents leave through one
    optimization barrier, so that the layer below's backward (which takes dx) starts only once this layer's weight
    gradients are made. For the layers unrolled in one scan iteration (stack_forward's groups): without it XLA:TPU
    deferred an upper layer's weight-gradient matmuls past the lower layer's backward, holding the activation
    cotangents they read (three c·t·D arrays, 0.40 GB on v5p: docs/findings.md, "Local and global layers' peak"); a
    scan of one layer an iteration has that order from its loop boundary."""
    return x_BxTxD, w


def _fence_fwd(x_BxTxD, w):
    return (x_BxTxD, w), None


def _fence_bwd(_, cts):
    return jax.lax.optimization_barrier(cts)


backward_fence.defvjp(_fence_fwd, _fence_bwd)


# the layer's weights and the schedule, remat and kinds each family's stack passes; one scan
def stack_forward(x_BxTxD, weights: dict, schedule: Schedule, remat: str = "none", mlp_kind: str = "gelu",
                  block: str = "serial", select=None, live=None, windows: tuple | None = None):
    """The L layers as one lax.scan over the stacked weights (a dict of [L, ...] arrays), each layer under
    jax.checkpoint with the remat policy (validated where the Workload is built: scaling.core.policies.check_remat):
    "none" saves SAVED, "full" nothing but the layer's input, the named policies what policy_saves says.

    ``live``: a stage of uneven stages, its real slots (ffn_model.pipeline.padded_slots): slot j's layer runs and its
    output is kept where j < live, else the carry passes unchanged (a masked update x = where(j < live, layer(x), x):
    the padding slot's FLOPs are executed, as every stage runs Lmax slots in lock-step anyway, and its weights get an
    exactly zero gradient, the transpose of the select).

    ``windows``: each layer's sliding window (TransformerConfig.layer_windows; None: global). Every layer alike: the
    one scan, its window static. Local and global layers mixed, g = the period (global_every): one scan over the
    L // g groups, each its g - 1 local layers then the global one unrolled (the window static in each, so that
    flash runs the local layers' band only), then a scan over the L mod g local layers left. Both scans run over
    layer indices and each layer is checkpointed on the whole FP32 stacks, its own layer indexed inside: a layer's
    weights sliced outside the checkpoint are an input the scan cannot forward, so it stacked them as a residual (a
    copy of the masters), and the stacks' first q·g layers sliced for the group scan (L mod g > 0) were a copy too
    (docs/findings.md, "Local and global layers' peak"). Each layer of a group but the first takes its input through
    backward_fence (its weight gradients made before the layer below's backward). The offloading policies
    (POLICY_OFFLOADS) move theirs to pinned host memory and back."""
    policy = remat_policy(remat, schedule)

    def body(window, trips):  # prevent_cse off inside a scan of more than one trip (why: loop_checkpoint)
        return loop_checkpoint(functools.partial(layer, schedule=schedule, mlp_kind=mlp_kind, block=block,
                                                 select=select, window=window), policy, trips)

    def run(x, ws, window):
        trips = next(iter(ws.values())).shape[0]
        return jax.lax.scan(lambda c, w: (body(window, trips)(c, w), None), x, ws)[0]

    x = constrain(x_BxTxD, X_SP_AXES if schedule.sequence_parallel else X_AXES)
    windows = tuple(windows or (None,))
    if live is not None:  # uneven stages (a window with stages is refused: TransformerConfig.check_schedule)
        n = next(iter(weights.values())).shape[0]
        x, _ = jax.lax.scan(lambda c, wj: (jnp.where(wj[1] < live, body(windows[0], n)(c, wj[0]), c), None), x,
                            (weights, jnp.arange(n)))
        return x  # under sequence parallelism still split over tensor: the loss reduces it where it lies
    if len(set(windows)) == 1:
        return run(x, weights, windows[0])  # under sequence parallelism still split over tensor (the loss reduces it)
    W, L = next(w for w in windows if w is not None), len(windows)
    g = windows.index(None) + 1  # the first global layer closes the first group
    q, r = divmod(L, g)

    def at(i, window, trips):  # layer first + i, checkpointed on the whole stacks (the layer's slice taken inside)
        def fn(x, ws, first):
            w = {n: jax.lax.dynamic_index_in_dim(a, first + i, keepdims=False) for n, a in ws.items()}
            return layer(*(backward_fence(x, w) if i else (x, w)), schedule, mlp_kind, block, select, window)
        return loop_checkpoint(fn, policy, trips)

    def group(x, first):  # the global layer's window longer than any sequence: its masks tied to q (attention._tied)
        for i in range(g):  # unrolled: an inner scan's residual stacks were copied into the outer one's (v5p: 1.3x)
            x = at(i, W if i < g - 1 else GLOBAL_WINDOW, q)(x, weights, first)
        return x, None

    if q:
        x = jax.lax.scan(group, x, jnp.arange(q) * g)[0]
    if r:  # the L mod g local layers left
        x = jax.lax.scan(lambda c, first: (at(0, W, r)(c, weights, first), None), x, q * g + jnp.arange(r))[0]
    return x


def _token_axes(spec) -> tuple[str, ...]:
    """The mesh axes a PartitionSpec's entries name (the axes that split the tokens, for ids' specs)."""
    return tuple(a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry))


def _rows(ids_BxT, rows: int):
    """Inside a shard_map manual over tensor: the ids relative to the device's V/Y rows, and which fall in them."""
    local = ids_BxT - jax.lax.axis_index("tensor") * rows
    return jnp.clip(local, 0, rows - 1), (local >= 0) & (local < rows)


def _look_up_rows(e_RxD, ids):
    """Inside a shard_map manual over tensor: the device's rows of E looked up (zeros for the other ids), summed
    over tensor."""
    idx, hit = _rows(ids, e_RxD.shape[0])
    return jax.lax.psum(jnp.where(hit[..., None], jnp.take(e_RxD, idx, axis=0), 0).astype(e_RxD.dtype), "tensor")


def _look_up_rows_sp(e_RxD, ids):
    """_look_up_rows with the sum reduce-scattered over tensor along the tokens (dimension 1, T): each device its
    T/Y of the device's tokens, as the token split of sequence parallelism lays them (seq_sp: context, then
    tensor)."""
    idx, hit = _rows(ids, e_RxD.shape[0])
    x = jnp.where(hit[..., None], jnp.take(e_RxD, idx, axis=0), 0).astype(e_RxD.dtype)
    return jax.lax.psum_scatter(x, "tensor", scatter_dimension=1, tiled=True)


def _scatter_rows(ids, dx, rows: int):
    """Inside a shard_map manual over tensor: the tokens' gradients summed into the device's ``rows`` rows (FP32),
    rounded to BF16."""
    idx, hit = _rows(ids, rows)
    g = jnp.zeros((rows, dx.shape[-1]), jnp.float32).at[idx].add(jnp.where(hit[..., None], dx, 0))
    return g.astype(COMPUTE_DTYPE)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _lookup(e_VxD, ids_BxT, vocab: int, tied: bool):
    """(E[ids], the gathered E if ``tied`` else None): the FP32 shard of E (VOCAB_AXES) cast to BF16 and
    gathered over fsdp, each device's V/Y rows looked up (zeros for the ids outside them) and summed over
    tensor, in a shard_map manual over every axis. Tied, the output layer uses the same gathered E."""
    return _lookup_fwd(e_VxD, ids_BxT, vocab, tied)[0]


def _lookup_fwd(e_VxD, ids_BxT, vocab: int, tied: bool):
    P, mesh = jax.sharding.PartitionSpec, jax.sharding.get_abstract_mesh()
    e = constrain(to_bf16(e_VxD), ("vocab", None))
    x = jax.shard_map(_look_up_rows, mesh=mesh, in_specs=(P("tensor", None), logical_to_spec(IDS_AXES)),
                      out_specs=logical_to_spec(X_AXES), axis_names=set(mesh.axis_names), check_vma=False)(e, ids_BxT)
    return (x, e if tied else None), ids_BxT


def _lookup_bwd(vocab: int, tied: bool, ids_BxT, cotangents):
    """Each device scatters its tokens' gradients into its own V/Y rows (FP32 sums), rounds them to BF16,
    reduce-scatters them over fsdp (D) and all-reduces them over the other axes that split the tokens (data,
    context), then FP32: E's gradient in its shard's layout (written out: left to XLA's SPMD partitioner, the
    scatter's partial sums were all-reduced over data·fsdp whole before the slice to the fsdp shard). Tied,
    the output layer's gradient of the gathered E is reduce-scattered (as gather_bf16's) and added."""
    dx_BxTxD, de_VxD = cotangents
    mesh = jax.sharding.get_abstract_mesh()
    ids_spec = logical_to_spec(IDS_AXES)
    out_axes = grad_axes(VOCAB_AXES)  # D over fsdp, or data·fsdp under ZeRO-1
    scatter = tuple(a for a in ("data", "fsdp") if a in _token_axes(logical_to_spec(out_axes)))
    others = tuple(a for a in _token_axes(ids_spec) if a not in scatter)
    rows = vocab // mesh.shape["tensor"]

    def local(ids, dx):
        g = _scatter_rows(ids, dx, rows)
        if scatter:
            g = jax.lax.psum_scatter(g, scatter, scatter_dimension=1, tiled=True)
        return jax.lax.psum(g, others) if others else g

    g = jax.shard_map(local, mesh=mesh, in_specs=(ids_spec, logical_to_spec(X_AXES)),
                      out_specs=logical_to_spec(out_axes), axis_names=set(mesh.axis_names),
                      check_vma=False)(ids_BxT, constrain(dx_BxTxD, X_AXES)).astype(jnp.float32)
    if tied:
        g = g + constrain(de_VxD, out_axes).astype(jnp.float32)
    return g, None


_lookup.defvjp(_lookup_fwd, _lookup_bwd)


def embed(ids_BxT, e_VxD, schedule: Schedule, tied: bool = False):
    """(x, the gathered E if ``tied``): x = E[ids] (BF16), E's rows split over tensor (vocab), gathered over
    fsdp in BF16: each device looks up the ids in its V/Y rows (zeros for the others) and the [B,T,D]
    partial sums are all-reduced over tensor (Shoeybi et al. 2019, section 3: the parallel input
    embedding); the backward scatters each row's gradient into the device's own rows (_lookup_bwd). Under
    sequence parallelism the sum is split to the token split (the backward all-gathers its gradient)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        e = gather_bf16(e_VxD, VOCAB_AXES)
        x, e = jnp.take(e, ids_BxT, axis=0), e if tied else None
    else:
        x, e = _lookup(e_VxD, ids_BxT, e_VxD.shape[0], tied)
    return constrain(x, X_SP_AXES if schedule.sequence_parallel else X_AXES), e


def _loop_manual(f, in_specs, out_specs):
    """``f`` in a shard_map manual over the axes the surrounding loop is not (one_f_one_b is manual over stage and
    data): a collective inside a shard_map manual over tensor alone crashed XLA:CPU's all-reduce promotion."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False,
                         axis_names=set(mesh.axis_names) - set(mesh.manual_axes))


def loop_lookup(ids_bxT, e_VxD, sp: bool = False):
    """E[ids] inside 1F1B's loop (ffn_model.pipeline.one_f_one_b, manual over stage and data): ``e_VxD`` the
    gathered BF16 E (V over tensor), each device's V/Y rows looked up and the partial sums all-reduced over
    tensor; the parallel input embedding of ``embed``, one microbatch at a time on stage 0 (Megatron-LM's first
    stage). ``sp`` (sequence parallelism): the partial sums reduce-scattered over tensor along the tokens instead
    (X_SP_AXES, the layout the layers take; Korthikanti et al. 2022, section 4.2.2)."""
    P = jax.sharding.PartitionSpec
    look = _look_up_rows_sp if sp else _look_up_rows
    return _loop_manual(look, (P("tensor", None), logical_to_spec(IDS_AXES)),
                        logical_to_spec(X_SP_AXES if sp else X_AXES))(e_VxD, ids_bxT)


def loop_lookup_grad(ids_bxT, dx_bxTxD, vocab: int):
    """loop_lookup's gradient w.r.t. the gathered E, in the accumulator's layout (one_f_one_b: E's shard, V over
    tensor and D over fsdp): each device scatters its tokens' gradients into its own V/Y rows (FP32 sums, rounded
    to BF16), reduce-scatters them over fsdp (D) and all-reduces them over context, in BF16 (the precision policy's
    gradient communication), as _lookup_bwd does outside the loop. The partial sums were once returned stacked over
    the token axes and summed outside the shard_map with jnp.sum, which widens BF16 to FP32 for its computation: XLA
    reduced [V/Y, D] over fsdp in FP32 every iteration (on v5p T·4·V·D/Y bytes, twice the BF16 T·c·V·D/Y; XLA:CPU
    widens BF16 collectives anyway, so its grid could not tell). A BF16 reduce there instead crashed XLA:CPU's
    all-reduce promotion (its reduction's root a copy: "Invalid binary instruction opcode copy")."""
    mesh = jax.sharding.get_abstract_mesh()
    rows = vocab // mesh.shape["tensor"]
    out_spec = logical_to_spec(grad_axes(VOCAB_AXES))  # (the axes the loop is manual over left out)
    token_axes = tuple(a for a in _token_axes(logical_to_spec(IDS_AXES)) if a != "tensor")
    scatter = tuple(a for a in token_axes if a in _token_axes(out_spec))
    others = tuple(a for a in token_axes if a not in scatter)

    def local(ids, dx):
        g = _scatter_rows(ids, dx, rows)
        if scatter:
            g = jax.lax.psum_scatter(g, scatter, scatter_dimension=1, tiled=True)
        return jax.lax.psum(g, others) if others else g

    return _loop_manual(local, (logical_to_spec(IDS_AXES), logical_to_spec(X_AXES)), out_spec)(
        ids_bxT, constrain(dx_bxTxD, X_AXES))


def output_logits(x_BxTxD, u_VxD, schedule: Schedule):
    """logits = RMSNorm(x)·Uᵀ, a BF16 matmul whose output is then widened to FP32 (as MaxText's default,
    so that the backward's matmuls take a BF16 gradient and the input gradient's all-reduce and U's
    reduce-scatter move BF16; an FP32 matmul output made both FP32), [B, T, V] with V split over tensor:
    each device its vocabulary shard; under sequence parallelism the stack's output is all-gathered
    over tensor first. ``u_VxD``: U's FP32 shard, or (tied) the BF16 E the lookup gathered, whose gradient
    is reduce-scattered to E's shard as soon as it is made (held gathered until the lookup's backward, it
    stayed alive through the layers' backward: the peak 1.13 of the closed form)."""
    h = rms_norm(x_BxTxD)
    h = reshard(h, X_AXES, X_SP_AXES) if schedule.sequence_parallel else constrain(h, X_AXES)
    if u_VxD.dtype == COMPUTE_DTYPE:  # tied: its gradient reduce-scattered here, not held through the layers' backward
        u = reshard(u_VxD, ("vocab", None), grad_axes(VOCAB_AXES))
    else:
        u = gather_bf16(u_VxD, VOCAB_AXES)
    z = jnp.einsum("btd,vd->btv", h, u)
    return constrain(z, LOGITS_AXES).astype(jnp.float32)


def token_cross_entropy(logits_BxTxV, labels_BxT):
    """Per token log Σ_v exp z_v − z_label, FP32, on vocab-split logits without gathering them: the max,
    the sum of exponentials and the label's logit are each a [B,T] partial over the device's vocabulary
    shard reduced over tensor (Shoeybi et al. 2019, section 3: the parallel cross-entropy). The label's
    logit is picked by comparing a vocabulary iota with the label (no gather across shards)."""
    z = logits_BxTxV
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    lse = jnp.log(jnp.sum(jnp.exp(z - m), axis=-1)) + m[..., 0]
    iota = jax.lax.broadcasted_iota(jnp.int32, z.shape, 2)
    target = jnp.sum(jnp.where(iota == labels_BxT[..., None], z, 0.0), axis=-1)
    return lse - target


def attention_shapes(cfg: TransformerConfig) -> dict:
    """{name: (shape [L, ...], fan-in)} of a transformer's attention weights (ATTENTION_WEIGHTS; their axes
    LAYER_AXES): W_q, W_k, W_v [L, N or K, H, D] and W_o [L, N, H, D]; multi-head latent attention W_d [L, r_q + r_kv +
    H_r, D], W_uq [L, N, H + H_r, r_q] (or W_q [L, N, H + H_r, D] without a q rank), W_ukv [L, N, H + H_v, r_kv],
    W_o [L, N, H_v, D]."""
    D, N, K, H, L = cfg.d_model, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.blocks
    if not cfg.mla:
        return {"wq": ((L, N, H, D), D), "wk": ((L, K, H, D), D), "wv": ((L, K, H, D), D),
                "wo": ((L, N, H, D), N * H)}
    rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
    out = {"w_down": ((L, cfg.latent_width, D), D)}
    out |= {"w_uq": ((L, N, cfg.qk_dim, rq), rq)} if rq else {"wq": ((L, N, cfg.qk_dim, D), D)}
    return out | {"w_ukv": ((L, N, H + cfg.v_dim, rkv), rkv), "wo": ((L, N, cfg.v_dim, D), cfg.o_width)}


def layer_names(cfg: TransformerConfig) -> list[str]:
    """The stacked layer weights' names (LAYER_AXES): the attention's (attention_shapes), W_gate only for a gated
    MLP."""
    return [n for n in LAYER_AXES if n in attention_shapes(cfg) or n in ("w_in", "w_out") or (n == "w_gate"
                                                                                                and cfg.gated)]


class TransformerStack(nnx.Module):
    """``cfg.blocks`` scanned pre-norm layers (module docstring); parameters [L, ...] FP32 carrying their
    logical axes."""

    def __init__(self, w: Workload, *, rngs: nnx.Rngs):
        """The stack of ``w`` (TransformerConfig; its remat policy and schedule), validated where ``w`` was built."""
        cfg: TransformerConfig = w.model
        schedule = w.schedule
        D, F, L = cfg.d_model, cfg.d_ff, cfg.blocks
        self.remat, self.schedule, self.gated = w.remat, schedule, cfg.gated
        self.mlp_kind, self.block, self.qk_norm = cfg.mlp, cfg.block, cfg.qk_norm
        self.windows = cfg.layer_windows  # each layer's sliding window (None: global)
        self.output_axes = X_SP_AXES if schedule.sequence_parallel else X_AXES  # where the stack's output lies
        # uneven stages: the stacks padded to S·Lmax slots, zeros in the padding (ffn_model.pipeline.pad_stack); the
        # real blocks drawn as without stages
        self.stage_blocks = counts = uneven_stages(w)
        pad = (lambda a: a) if counts is None else (lambda a: pad_stack(a, counts))  # noqa: E731
        self.names = layer_names(cfg)
        for n, (shape, fan_in) in attention_shapes(cfg).items():
            setattr(self, n, param(pad(init_normal(rngs.params(), shape, fan_in)), LAYER_AXES[n]))
        self.w_in = param(pad(init_normal(rngs.params(), (L, F, D), D)), W_MLP_AXES)
        if cfg.gated:
            self.w_gate = param(pad(init_normal(rngs.params(), (L, F, D), D)), W_MLP_AXES)
        self.w_out = param(pad(init_normal(rngs.params(), (L, F, D), F)), W_MLP_AXES)
        self.vocab, self.tied = cfg.vocab, cfg.tied_embeddings
        if cfg.vocab is not None:  # E, U ~ N(0, 1/D): unit-scale logits (the first norm rescales E's rows)
            self.embedding = param(init_normal(rngs.params(), (cfg.vocab, D), D), VOCAB_AXES)
            if not cfg.tied_embeddings:
                self.unembedding = param(init_normal(rngs.params(), (cfg.vocab, D), D), VOCAB_AXES)
            self.output_axes = LOGITS_AXES

    def __call__(self, x):
        """x: token vectors [B, T, D] -> the stack's output; with a vocabulary, token ids [B, T] -> logits
        [B, T, V] (FP32, vocab over tensor). Traced under qk_norm_on(the model's QK-norm)."""
        with qk_norm_on(self.qk_norm):
            return self._forward(x)

    def _forward(self, x):
        weights = {n: getattr(self, n)[...] for n in self.names}
        if self.stage_blocks is not None:  # a padded stack run whole: its real blocks
            weights = {n: real_blocks(v, self.stage_blocks) for n, v in weights.items()}
        if self.vocab is None:
            return stack_forward(x.astype(COMPUTE_DTYPE), weights, self.schedule, self.remat, self.mlp_kind,
                                 self.block, windows=self.windows)
        x, e = embed(x, self.embedding[...], self.schedule, self.tied)
        y = stack_forward(x, weights, self.schedule, self.remat, self.mlp_kind, self.block, windows=self.windows)
        return output_logits(y, e if self.tied else self.unembedding[...], self.schedule)


def cross_entropy(logits_BxTxV, labels_BxT):
    """Mean softmax cross-entropy in FP32 over the tokens of vocab-parallel logits
    (token_cross_entropy per token, then ffn_model.task.token_mean)."""
    return token_mean(jnp.sum, (token_cross_entropy(logits_BxTxV, labels_BxT),), IDS_AXES)


def transformer_pipeline_loss(params, batch, *, w: Workload, mesh, axes: dict | None = None, chunk=None, pre=None):
    """_pipeline_loss traced under qk_norm_on(the model's QK-norm): the pipeline runs its layers without the model's
    __call__, which sets it elsewhere."""
    with qk_norm_on(w.model.qk_norm):
        return _pipeline_loss(params, batch, w=w, mesh=mesh, axes=axes, chunk=chunk, pre=pre)


# one function: the inputs, the head, GPipe's loss and 1F1B's custom_vjp share its closures
def _pipeline_loss(params, batch, *, w: Workload, mesh, axes: dict | None, chunk, pre):
    """The transformer's loss with its layers run as a pipeline over ``stage`` (ffn_model.pipeline): the
    embedding looked up for the whole batch before it (replicated over stage: a gather and one reduction
    over tensor, no matmul), then the M microbatches. GPipe and circular: through pipeline_outputs, whose
    outputs come back split over the stages (M/S microbatches each), and the output layer and loss (or the
    MSE) of each microbatch on the stage that holds it (jax.vmap over microbatches, spmd_axis_name="stage"):
    every stage runs the output layer on 1/S of the tokens. 1F1B: the loss and every gradient from
    ffn_model.pipeline.one_f_one_b's loop (a jax.custom_vjp whose forward runs it; a forward-only step runs
    GPipe), the output layer on the last stage inside the loop and, with a vocabulary, the lookup on stage 0
    (the token ids go in; E and U gathered once in BF16, their gradients accumulated in the loop). The mean over
    microbatches is the mean over every token. ``axes`` ({name: logical axes} of the stacked layers) and ``chunk``
    (x, weights, select) -> y: another family's layers (ffn_model.moe.pipeline_loss_fn); default the transformer's
    (stack_forward), its tokens over the family's batch axis (ModelFamily.batch_axis). ``pre`` (params, x) -> x:
    layers run before the pipeline, outside it, on the stack's input (ffn_model.moe.outer_layers); 1F1B then takes
    their output as its input (no lookup in the loop), the head's matrices in the loop as without them."""
    cfg, schedule, remat, batch_shards = w.model, w.schedule, w.remat, shards(w.mesh, w.model.batch_axis)
    M, R = schedule.microbatches, schedule.repeats
    axes = axes or {n: LAYER_AXES[n] for n in layer_names(cfg)}
    vocab, tied, sp = cfg.vocab is not None, cfg.tied_embeddings, schedule.sequence_parallel
    x_axes = X_SP_AXES if sp else X_AXES  # a microbatch between stages: under SP the token split (1/Y sent)

    def inputs(params):  # the stack's input [B, T, D] and the head's parameters: U, or tied the gathered E
        if not vocab:
            x, hp = batch["x"].astype(COMPUTE_DTYPE), {}
        else:
            x, e = embed(batch["x"], params["embedding"], schedule, tied)
            hp = {"u": e if tied else params["unembedding"]}
        return (x if pre is None else pre(params, x)), hp

    counts = uneven_stages(w)

    def layers(x, ws, select):  # uneven stages or chunks: the chunk's padding slots masked (stack_forward's ``live``)
        live = None if counts is None else live_slots(counts, R, select)
        return stack_forward(x, ws, schedule, remat, cfg.mlp, cfg.block, select, live)

    chunk = chunk or layers

    def head(y, labels, hp):
        if not vocab:
            return mse(y, labels, x_axes)
        return cross_entropy(output_logits(y, hp["u"], schedule), labels)

    labels = split_microbatches(batch["y"], M, batch_shards)

    def gpipe(params):
        x, hp = inputs(params)
        weights = circular_layout({n: params[n] for n in axes}, axes, mesh, R)
        ys = pipeline_outputs(split_microbatches(x, M, batch_shards), weights, mesh, chunk, x_axes, repeats=R,
                              to_stages=True)
        return jnp.mean(jax.vmap(lambda y, lab: head(y, lab, hp), spmd_axis_name="stage")(ys, labels))

    if schedule.pipeline != Pipeline.ONE_F_ONE_B:
        return gpipe(params)

    def matrices(params):  # the head's parameters and the lookup's E, gathered once in BF16 (tied: one matrix)
        e = gather_bf16(params["embedding"], VOCAB_AXES)
        return {"u": e} if tied else {"e": e, "u": gather_bf16(params["unembedding"], VOCAB_AXES)}

    def fwd(params):
        # the stacks as the schedule runs them (R > 1: re-laid so stage s holds chunks s, S + s, ...; the
        # gradients re-laid back by the transpose)
        weights, relay_vjp = jax.vjp(lambda ws: circular_layout(ws, axes, mesh, R), {n: params[n] for n in axes})
        run = functools.partial(one_f_one_b, weights=weights, mesh=mesh, chunk=chunk, head=head, x_axes=x_axes,
                                repeats=R, phases=schedule.warmup_phases, ids_axes=IDS_AXES)
        if vocab and pre is None:  # token ids in: stage 0 looks each microbatch up in the loop, E's gradient there
            hp, hp_vjp = jax.vjp(matrices, params)
            key = "u" if tied else "e"
            lookup = (lambda ids, h: loop_lookup(ids, h[key], sp),
                      lambda ids, dx: {key: loop_lookup_grad(ids, dx, cfg.vocab)})
            # the matrices' gradients, reduced to their shards each iteration
            loss, dw, dhp, _ = run(split_microbatches(batch["x"], M, batch_shards), labels, head_params=hp,
                                   head_grad_axes={n: grad_axes(VOCAB_AXES) for n in hp}, lookup=lookup)
            d_inputs = hp_vjp(dhp)[0]
        else:  # the stack's input made before the loop (the lookup and ``pre``); the head's matrix in the loop
            x, inputs_vjp = jax.vjp(lambda p: inputs(p)[0], params)
            hp, hp_vjp = jax.vjp(lambda p: {"u": matrices(p)["u"]}, params) if vocab else ({}, None)
            loss, dw, dhp, dx = run(split_microbatches(x, M, batch_shards), labels, head_params=hp,
                                    head_grad_axes={n: grad_axes(VOCAB_AXES) for n in hp})
            d_inputs = inputs_vjp(merge_microbatches(dx, batch_shards))[0]
            if vocab:
                d_inputs = jax.tree.map(jnp.add, d_inputs, hp_vjp(dhp)[0])
        grads = jax.tree.map(jnp.add, d_inputs, {**jax.tree.map(jnp.zeros_like, params), **relay_vjp(dw)[0]})
        return loss, grads

    loss_1f1b = jax.custom_vjp(gpipe)
    loss_1f1b.defvjp(fwd, lambda grads, ct: (jax.tree.map(lambda g: ct * g, grads),))
    return loss_1f1b(params)

# The family's program (ffn_model.families): what the train step asks of a model family, the same functions in
# ffn_model.model.


def build(w: Workload, seed: int = 0) -> TransformerStack:
    """The transformer stack of ``w`` (TransformerStack), its parameters drawn from ``seed`` (init_normal:
    N(0, 1/fan_in))."""
    return TransformerStack(w, rngs=nnx.Rngs(seed))


def input_layout(cfg: TransformerConfig, batch_tokens: int):
    """(shape, logical axes) of a batch's x and y: B/T sequences of T = seq_len token vectors [B/T, T, D] over
    (batch, seq, act_embed); with a vocabulary, token ids [B/T, T] over (batch, seq)."""
    if cfg.vocab is not None:
        return (batch_tokens // cfg.seq_len, cfg.seq_len), IDS_AXES
    return (batch_tokens // cfg.seq_len, cfg.seq_len, cfg.d_model), X_AXES


def batch_dtypes(cfg: TransformerConfig):
    """(x, y) element types of a batch: BF16 inputs and FP32 targets; int32 token ids and labels with a vocabulary."""
    return (jnp.int32, jnp.int32) if cfg.vocab is not None else (COMPUTE_DTYPE, jnp.float32)


def synthetic_batch(cfg: TransformerConfig, shape: tuple, seed: int = 0):
    """step -> batch of ``shape``, not jitted: the teacher regression (ffn_model.task.teacher_batch); with a
    vocabulary, ids uniform over it from (seed, step), the label of position t the id at t − 1 (at 0, its own)."""
    if cfg.vocab is None:
        return teacher_batch(shape, cfg.d_model, seed)

    def tokens(step):
        key = jax.random.fold_in(jax.random.split(jax.random.key(seed))[1], step)
        ids = jax.random.randint(key, shape, 0, cfg.vocab, jnp.int32)
        return {"x": ids, "y": jnp.concatenate([ids[:, :1], ids[:, :-1]], axis=1)}

    return tokens


def loss(model: TransformerStack, batch):
    """The stack's loss on one batch: the MSE of its output (ffn_model.task.mse), or with a vocabulary the
    cross-entropy of its logits (cross_entropy)."""
    out = model(batch["x"])
    if model.vocab is not None:
        return cross_entropy(out, batch["y"])
    return mse(out, batch["y"], model.output_axes)


def pipeline_loss_fn(w: Workload, mesh, for_grad: bool = True):
    """(params, batch) -> loss with the layers run as a pipeline over ``stage`` (transformer_pipeline_loss; a
    forward-only step, ``for_grad=False``, runs GPipe's forward, as every schedule's)."""
    return functools.partial(transformer_pipeline_loss, w=w, mesh=mesh)
