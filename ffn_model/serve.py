"""Serving programs of the transformer: a prefill and a decode step with a KV cache, and greedy generation, on the
training model's weights (ffn_model.transformer.TransformerStack) cast to BF16 (what serving holds: 2 B a parameter)
or quantized to int8 per output channel (quantize: 1 B a parameter and a BF16 scale a channel, _project's (x·q)·s),
sharded as serving shards them: heads, KV heads, d_ff and the vocabulary over ``tensor``, the sequences over ``data``
(replicas), through the same logical-axis table as training (mesh.rules; fsdp, stage and context are 1 here).

The layer is the training layer's arithmetic (ffn_model.transformer: rms_norm, q, k and v, attention_materialized's
softmax, the output projection, the MLP, the logits), each weight its own matmul (_project), so a decode step's logits
are the training forward's at the same position (tests/test_serve.py). The layers run one after another (unrolled),
each with its own weight and cache buffers: a lax.scan over the [L, ...] stacks made XLA:GPU copy each layer's slice
of the stacks before its GEMMs read it, 2.3x (8B) and 2.9x (70B's layers) the step's time on an H200
(docs/serving.md). The cache: per layer k and v [B, T_max, K, H] BF16, logical axes (batch, -, kv_heads, head_dim); a
decode step writes its token's k and v at ``pos`` (a dynamic_update_slice, in place in the donated buffer) and attends
to the keys 0..pos (decode_attention).
Built for global attention of a standard (not latent) transformer, QK-norm applied as training applies it, and for
the MoE transformer (ffn_model.moe's weights, shared experts too; int8 experts scaled per expert and output channel,
the router BF16) in GShard's capacity form, one routing group a sequence's tokens of the step (its P prompt tokens in
the prefill, its one token in a decode step: C = ceil(cf·k·S/E) slots an expert), so the drops do not depend on the
mesh (_moe); the closed forms (scaling.step.serving) cover MLA, local layers, the dropless MoE and expert parallelism,
the programs do not yet (check_servable).

Sources: the KV cache as the Scaling Book's inference chapter describes it; the layer as ffn_model.transformer's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ffn_model import moe
from ffn_model.attention import has_cudnn, probabilities
from ffn_model.sharded import COMPUTE_DTYPE, constrain, traced_platform
from ffn_model.transformer import (ACTIVATIONS, H_AXES, IDS_AXES, KV_AXES, LOGITS_AXES, Q_AXES, X_AXES, attention,
                                   embed, qk_norm_on, rms_norm, _rows)
from mesh.rules import logical_to_spec, mesh_axes
from scaling.core.kinds import Block, Dtype, Family, Mlp, Platform
from scaling.core.schedule import Schedule

CACHE_AXES = ("batch", None, "kv_heads", "head_dim")  # a layer's k and v caches [B, T_max, K, H]
LAYER_WEIGHTS = ("wq", "wk", "wv", "wo", "w_in", "w_gate", "w_out")
ATTENTION = ("wq", "wk", "wv", "wo")  # a layer's attention weights; the rest its MLP (or MoE: router and experts)
# generate's compiles keep every BF16 rounding the program writes: XLA's excess precision (xla_allow_excess_precision,
# on by default) drops a BF16 round trip where its fusions allow, and they differ by mesh: an int8 program's prefill
# logits were 0.031 apart between data=2,tensor=4 and one device (the looked-up rows' q·s, W_v's and W_o's outputs
# kept in FP32 on one and not the other), and an int8 MoE model's greedy tokens 7 of 24; with it off, bit-equal
EXACT_ROUNDING = {"xla_allow_excess_precision": False}
WEIGHT_TYPES = ("bf16", "int8")  # what the programs store the weights in (scaling.step.serving.SERVING_BYTES' names)
# each stored weight's contracted axes (the rest are its output channels, one int8 scale each): W_q, W_k, W_v, the MLP's
# inputs and the vocabulary tables [.., D] contract D; W_o [N, H, D] contracts N·H; W_out [F, D] contracts F (an
# expert's [E, F_e, D] too: E is a batch axis, each expert its own channels); an MoE layer's shared experts as the MLP
CONTRACTED = {"wq": (-1,), "wk": (-1,), "wv": (-1,), "w_in": (-1,), "w_gate": (-1,), "wo": (0, 1), "w_out": (-2,),
              "shared_in": (-1,), "shared_gate": (-1,), "shared_out": (-2,), "embedding": (-1,), "unembedding": (-1,)}


def check_servable(cfg) -> None:
    """ValueError naming what the serving programs do not build: a model without a vocabulary (no tokens to
    generate), multi-head latent attention, local layers, a parallel block; of an MoE model, the dropless form."""
    family = getattr(cfg, "family", None)
    if family not in (Family.TRANSFORMER, Family.MOE):
        raise ValueError(f"the serving programs are built for the transformer and the MoE transformer; the "
                         f"{cfg.noun}'s closed forms only (scaling.step.serving)")
    base = cfg.base if family == Family.MOE else cfg
    m = cfg.moe if family == Family.MOE else None
    for bad, what in ((base.vocab is None, "a vocabulary (--vocab)"), (base.mla, "standard attention, not MLA"),
                      (any(base.layer_windows), "global attention in every layer"),
                      (base.block != Block.SERIAL, "serial blocks"),
                      (m is not None and m.dropless, "an MoE layer with a capacity factor (--capacity-factor: "
                                                     "GShard's dispatch, one group a sequence)")):
        if bad:
            raise ValueError(f"the serving programs need {what}; its closed forms cover the rest "
                             "(scaling.step.serving)")


def quantize(w, name: str) -> dict:
    """Symmetric int8 weight-only quantization per output channel (the W8A16 form of serving runtimes: TensorRT-LLM's
    weight-only int8, AQT's in MaxText/JetStream): s = max|w| over the weight's contracted axes (CONTRACTED) / 127,
    stored BF16, and q = round(w / s) in [-127, 127] (int8), so that q·s is the weight; {"q", "scale"}, the scale's
    shape the weight's output channels (the contracted axes dropped)."""
    amax = jnp.max(jnp.abs(w.astype(jnp.float32)), axis=CONTRACTED[name], keepdims=True)
    scale = jnp.where(amax > 0, amax / 127, 1.0).astype(COMPUTE_DTYPE)
    q = jnp.clip(jnp.round(w.astype(jnp.float32) / scale.astype(jnp.float32)), -127, 127).astype(jnp.int8)
    return {"q": q, "scale": jnp.squeeze(scale, CONTRACTED[name])}


def _project(x, w, spec: str, axes, out_type=COMPUTE_DTYPE):
    """x·W of one stored weight as an einsum ``spec`` whose output ends with the weight's output channels, FP32 sums
    rounded to ``out_type``: a BF16 W as stored; an int8 one (quantize) converted to BF16 as the matmul's operand and
    its per-channel scale applied to the output, (x·q)·s = x·(q·s) (the weight-only int8 matmul's form: the weight
    read as int8, the scale on the small output). One matmul a weight, not training's side-by-side W_q|W_k|W_v and
    W_in|W_gate (ffn_model.transformer.qkv_projection, mlp: one partial sum for the backward's input gradient),
    whose concatenation XLA:GPU wrote out as a copy of the weights every step."""
    return constrain(_dot(x, w, spec).astype(out_type), axes)


def _scaled(y, scale, spec: str):
    """y·s: an einsum ``spec``'s output times its int8 weight's per-channel scale, the scale's axes (the weight's
    letters in the output) put where the output has them (an expert's [E, F_e] scale on [G, E, C, F_e])."""
    ins, out = spec.split("->")
    letters = [c for c in ins.split(",")[1] if c in out]
    s = jnp.transpose(scale, sorted(range(len(letters)), key=lambda i: out.index(letters[i])))
    return y * s.reshape([y.shape[i] if c in letters else 1 for i, c in enumerate(out)])


def _qkv(h, lw):
    return (_project(h, lw["wq"], "btd,nhd->btnh", Q_AXES), _project(h, lw["wk"], "btd,khd->btkh", KV_AXES),
            _project(h, lw["wv"], "btd,khd->btkh", KV_AXES))


def _hidden(h, lw, spec: str, axes, mlp_kind):
    """The MLP's activated hidden act(h·W_in) or SwiGLU's silu(h·W_gate)·(h·W_in), each weight its own matmul
    (_project, einsum ``spec``): the dense layer's and each expert's."""
    u = _project(h, lw["w_in"], spec, axes)
    if mlp_kind != Mlp.SWIGLU:
        return ACTIVATIONS[mlp_kind](u)
    return jax.nn.silu(_project(h, lw["w_gate"], spec, axes)) * u


def _mlp_out(x, lw, mlp_kind):
    """x + the MLP's output (ffn_model.transformer.mlp's arithmetic), its partial sums over tensor made and reduced in
    FP32 (_project_out)."""
    a = _hidden(rms_norm(x), lw, "btd,fd->btf", H_AXES, mlp_kind)
    return x + _project(a, lw["w_out"], "btf,fd->btd", X_AXES, jnp.float32).astype(COMPUTE_DTYPE)


def _moe_out(x, lw, spec, mlp_kind):
    """x + the MoE layer's output on RMSNorm(x) (_moe), rounded to BF16 once."""
    return x + constrain(_moe(rms_norm(x), lw, spec, mlp_kind).astype(COMPUTE_DTYPE), X_AXES)


def _moe(h, lw, spec, mlp_kind):
    """The MoE layer's output [B, T, D] in FP32 (ffn_model.moe's capacity form, the serving layer's matmuls): the
    router in FP32 (moe.route), GShard's dispatch and combine in G = B groups, a sequence's T tokens each (C =
    moe.capacity(spec, T) slots an expert: independent of the mesh, so 8 devices drop what one drops), the experts'
    W_in (W_gate) [E, F_e, D] and the shared experts' (DeepSeekMoE: one MLP of F_e·S_sh every token runs, added) split
    F_e over tensor, their output as _experts_out makes it: one FP32 all-reduce of the tokens' sums."""
    B, T, D = h.shape
    k = spec.top_k
    gates, ids, _ = moe.route(h.reshape(B * T, D), lw["router"], spec)
    dispatch, combine = jax.vmap(functools.partial(moe.dispatch_combine, experts=spec.experts,
                                                   C=moe.capacity(spec, T)))(gates.reshape(B, T, k),
                                                                             ids.reshape(B, T, k))
    # a decode step's groups hold one token: dispatch and combine contract nothing over tokens, written as the
    # elementwise products they are (as einsums, XLA:TPU and XLA:GPU rewrote them so and XLA:CPU kept the combine a dot)
    xd = (dispatch[:, 0, :, :, None].astype(COMPUTE_DTYPE) * h[:, 0, None, None, :] if T == 1 else
          jnp.einsum("gsec,gsd->gecd", dispatch.astype(COMPUTE_DTYPE), h))
    xd = constrain(xd, moe.DISPATCHED_AXES)
    a = _hidden(xd, lw, "gecd,efd->gecf", moe.HIDDEN_AXES, mlp_kind)
    shared = None
    if "shared_in" in lw:
        sh = {"w_in": lw["shared_in"], "w_gate": lw.get("shared_gate")}
        shared = (_hidden(h, sh, "btd,fd->btf", H_AXES, mlp_kind), lw["shared_out"])
    return _experts_out(a, lw["w_out"], combine, shared)


def _experts_out(a, w_out, combine, shared=None):
    """The MoE layer's output [G, S, D] in FP32: each device's partial sums over its share of F_e, a·W_out over the
    E·C slots, combined to the tokens (Σ_ec combine·y; a decode step's as the elementwise product), plus the shared
    experts' a_sh·W_sh over their share of F_s, then one all-reduce over tensor of the tokens' G·S·D FP32 sums (in a
    jax.shard_map: GSPMD reduces a dot's partial sums at the dot, which all-reduced the G·E·C·D slots, E·C/S = cf·k
    times the tokens: 2.5x for a prefill at cf 1.25, top-2, and E times for a decode step). The dense layer's one
    all-reduce of the tokens' sums, what a runtime's fused MoE kernel then reduces (vLLM, TensorRT-LLM)."""
    one = combine.shape[1] == 1
    # XLA:CPU's DotThunk refused a batched BF16 x BF16 = FP32 dot ("Unsupported element type", jax 0.10.2): there the
    # operands are widened, the same products summed in FP32
    widen = traced_platform() == Platform.CPU
    mesh = jax.sharding.get_abstract_mesh()
    reduce = () if mesh.empty else tuple(mesh_axes(("mlp",))[0]) + tuple(mesh_axes(("exp",))[0])  # F_e's, E's split

    def local(a, w_out, combine, *sh):
        y = _dot(a, w_out, "gecf,efd->gecd", widen)
        out = (jnp.sum(combine[:, 0, :, :, None] * y, axis=(1, 2))[:, None] if one else
               jnp.einsum("gsec,gecd->gsd", combine.astype(jnp.float32), y))
        if sh:
            out = out + _dot(*sh, "btf,fd->btd", widen)
        return jax.lax.psum(out, reduce) if reduce else out

    args = (a, w_out, combine, *(shared or ()))
    if mesh.empty:
        return local(*args)
    specs = (logical_to_spec(moe.HIDDEN_AXES), _weight_spec(w_out, "w_out", moe.EXPERT_AXES[1:]),
             logical_to_spec((moe.HIDDEN_AXES[0], None, None, None)), logical_to_spec(H_AXES),
             _weight_spec(shared[1], "shared_out", moe.SHARED_AXES[1:]) if shared else None)
    return jax.shard_map(local, mesh=mesh, in_specs=specs[:len(args)],
                         out_specs=logical_to_spec((moe.HIDDEN_AXES[0], None, None)))(*args)


def _dot(x, w, spec: str, widen: bool = False):
    """x·W as einsum ``spec``, FP32 sums: a BF16 W as stored, or an int8 one converted to BF16 as the matmul's operand
    and its scale on the output (_scaled); ``widen``: both operands FP32."""
    q = w["q"] if isinstance(w, dict) else w
    x, q = (x.astype(jnp.float32), q.astype(jnp.float32)) if widen else (x, q.astype(COMPUTE_DTYPE))
    y = jnp.einsum(spec, x, q, preferred_element_type=jnp.float32)
    return _scaled(y, w["scale"], spec) if isinstance(w, dict) else y


def scale_dims(name: str, dims: tuple) -> tuple:
    """The entries of a weight's ``dims`` (its shape, or its logical axes) that its per-channel int8 scale keeps
    (quantize): all but its CONTRACTED axes."""
    cut = {i % len(dims) for i in CONTRACTED[name]}
    return tuple(d for i, d in enumerate(dims) if i not in cut)


def _weight_spec(w, name: str, axes):
    """The PartitionSpec of a stored weight of logical ``axes``: a BF16 one's, or an int8 one's {"q", "scale"} (the
    scale's axes scale_dims')."""
    if not isinstance(w, dict):
        return logical_to_spec(axes)
    return {"q": logical_to_spec(axes), "scale": logical_to_spec(scale_dims(name, axes))}


def _ffn(x, lw, mlp_kind, spec=None):
    """x + the layer's MLP: the MoE layer's where the layer holds a router (_moe_out), else the dense one's."""
    return _moe_out(x, lw, spec, mlp_kind) if "router" in lw else _mlp_out(x, lw, mlp_kind)


def _project_out(o_BxTxNxH, wo):
    """o·W_o, the partial sums over tensor in FP32, reduced in FP32, then BF16: one device's matmul accumulates in FP32
    and rounds once, so the sharded step rounds the same sum once too (BF16 partial sums added in another order
    flipped near-tied argmaxes: greedy tokens differed from one device's). The all-reduce moves 4 B an element."""
    return _project(o_BxTxNxH, wo, "btnh,nhd->btd", X_AXES, jnp.float32).astype(COMPUTE_DTYPE)


def _logits(x, w: dict):
    """logits = RMSNorm(x)·Uᵀ, BF16 widened to FP32 (ffn_model.transformer.output_logits), V split over tensor."""
    head = w["embedding"] if "unembedding" not in w else w["unembedding"]
    return _project(rms_norm(x), head, "btd,vd->btv", LOGITS_AXES).astype(jnp.float32)


def store(w: dict, weights: str = "bf16") -> dict:
    """Weights in serving's layout ({"layers": [{name: array}] * L, "embedding", "unembedding"}, any float type) stored
    as ``weights``: BF16, or int8 (quantize: {"q", "scale"} each); call it under jit to keep the shardings."""
    if weights not in WEIGHT_TYPES:
        raise ValueError(f"the serving programs store the weights as {' or '.join(WEIGHT_TYPES)}, not {weights}; the "
                         "closed forms take fp8 and int4 too (scaling.step.serving)")
    bf16 = lambda a, n: a.astype(COMPUTE_DTYPE)  # noqa: E731
    # an MoE layer's router stays BF16: it picks the experts (its D·E a layer, not worth quantizing)
    cast = (lambda a, n: bf16(a, n) if n == "router" else quantize(a, n)) if weights == Dtype.INT8 else bf16
    return {"layers": [{n: cast(a, n) for n, a in lw.items()} for lw in w["layers"]],
            **{n: cast(w[n], n) for n in ("embedding", "unembedding") if n in w}}


def serving_weights(params: dict, weights: str = "bf16", moe_spec=None) -> dict:
    """The model's parameters (a TransformerStack's pure dict: [L, ...] stacks, E, U; an MoETransformer's with its
    ``moe_spec``: attention [L, ...], the dense layers' dense_* [L_dense, ...], the MoE layers' router and expert_*
    [L_moe, ...] in layer order, MoESpec.is_moe) as serving holds them: each layer's weights their own arrays (an
    MoE layer's as ffn_model.moe names them: router, w_in, w_gate, w_out [E, F_e, D]), stored as ``weights`` (store:
    BF16, or int8 quantized from the FP32 masters); call it under jit to keep the shardings."""
    if moe_spec is None:
        names = [n for n in LAYER_WEIGHTS if n in params]
        layers = [{n: params[n][i] for n in names} for i in range(params[names[0]].shape[0])]
    else:
        layers, at = [], {True: 0, False: 0}  # the next MoE and dense layer's index in their stacks
        for i in range(params["wo"].shape[0]):
            is_moe = moe_spec.is_moe(i)
            own = ({moe.MOE_NAMES[n]: a for n, a in params.items() if n in moe.MOE_NAMES} if is_moe else
                   {n.replace("dense", "w"): a for n, a in params.items() if n.startswith("dense_")})
            layers.append({**{n: params[n][i] for n in ATTENTION}, **{n: a[at[is_moe]] for n, a in own.items()}})
            at[is_moe] += 1
    return store({"layers": layers, **{n: params[n] for n in ("embedding", "unembedding") if n in params}}, weights)




def _embed(ids_BxT, table):
    """x = E[ids] [B, T, D] BF16 (ffn_model.transformer.embed); a quantized table's int8 rows and their scales looked up
    (each device its V/Y rows, zeros for the others, summed over tensor), not the whole table dequantized."""
    if not isinstance(table, dict):
        return embed(ids_BxT, table, Schedule())[0]
    q, s = table["q"], table["scale"]
    look = lambda q, s, idx: jnp.take(q, idx, axis=0).astype(COMPUTE_DTYPE) * jnp.take(s, idx, axis=0)[..., None]  # noqa: E731
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return look(q, s, ids_BxT)

    def rows(q, s, ids):
        idx, hit = _rows(ids, q.shape[0])
        return jax.lax.psum(jnp.where(hit[..., None], look(q, s, idx), 0).astype(COMPUTE_DTYPE), "tensor")

    P = jax.sharding.PartitionSpec
    x = jax.shard_map(rows, mesh=mesh, in_specs=(P("tensor", None), P("tensor"), logical_to_spec(IDS_AXES)),
                      out_specs=logical_to_spec(X_AXES), axis_names=set(mesh.axis_names),
                      check_vma=False)(q, s, ids_BxT)
    return constrain(x, X_AXES)




def decode_attention(q_Bx1xNxH, k_BxTxKxH, v_BxTxKxH, pos):
    """One query token a sequence against the cache's keys 0..pos: on a GPU cuDNN's fused attention
    (jax.nn.dot_product_attention, implementation "cudnn", the cache's valid length pos + 1 a sequence: the kernel
    the decode section of calibrate measured at 0.83-0.95 of the H200's HBM bandwidth, where XLA's own einsums reached
    0.25); elsewhere (and on a GPU compiled ahead of time where cuDNN is absent) attention_materialized's
    arithmetic with the keys' positions (its probabilities, p·v in FP32), p·v written with the cache v as the dot's
    first operand: with p first, XLA:GPU laid each layer's v cache out [B, K, H, T] for the dot, a transposed copy
    written, updated and transposed back every step (the peak 1.32 of the arguments on gpu:H100:8, 1.05 without)."""
    B, T = k_BxTxKxH.shape[:2]
    if traced_platform() == Platform.GPU and has_cudnn():
        lengths = jnp.full((B,), pos + 1, jnp.int32)
        return jax.nn.dot_product_attention(q_Bx1xNxH, k_BxTxKxH, v_BxTxKxH, key_value_seq_lengths=lengths,
                                            implementation="cudnn").astype(COMPUTE_DTYPE)
    p = probabilities(q_Bx1xNxH, k_BxTxKxH, jnp.reshape(pos, (1,)).astype(jnp.int32), jnp.arange(T, dtype=jnp.int32))
    o = jnp.einsum("bskh,bkgts->btkgh", v_BxTxKxH, p, preferred_element_type=jnp.float32)
    return o.reshape(q_Bx1xNxH.shape).astype(COMPUTE_DTYPE)


def prefill(w: dict, ids_BxP, t_max: int, *, mlp_kind: str, qk_norm: bool = False, schedule: Schedule = Schedule(),
            moe_spec=None):
    """The prompts' forward: (logits of the last prompt token [B, V] FP32, k and v caches [L, B, T_max, K, H] with
    the P prompt positions filled). Causal attention over the prompt (ffn_model.transformer.attention, the
    schedule's kernel; materialized by default); an MoE model's MoE layers (``moe_spec``, its MoESpec) route each
    prompt as one group (_moe_out)."""
    B, P = ids_BxP.shape
    pad = ((0, 0), (0, t_max - P), (0, 0), (0, 0))

    def layer(x, lw):
        q, k, v = _qkv(rms_norm(x), lw)
        with qk_norm_on(qk_norm):
            o = constrain(attention(q, k, v, schedule), Q_AXES)
            if qk_norm:  # the cache holds k as attention took it: normalized
                k = rms_norm(k)
        cache = lambda a: constrain(jnp.pad(a, pad), CACHE_AXES)  # noqa: E731
        return _ffn(x + _project_out(o, lw["wo"]), lw, mlp_kind, moe_spec), (cache(k), cache(v))

    x = _embed(ids_BxP, w["embedding"])
    ck, cv = [], []
    for lw in w["layers"]:
        x, (k, v) = layer(x, lw)
        ck.append(k)
        cv.append(v)
    return _logits(x[:, -1:], w)[:, 0], ck, cv


def decode_step(w: dict, ck, cv, ids_B, pos, *, mlp_kind: str, qk_norm: bool = False, moe_spec=None):
    """One token a sequence at position ``pos`` (a traced int32): (logits [B, V] FP32, the caches with its k and v
    written at pos). Each layer: its k, v written into its caches (in place, the buffers donated), then attention of
    the one query over keys 0..pos (decode_attention); an MoE layer routes each sequence's token as a group of one
    (_moe_out)."""
    x = _embed(ids_B[:, None], w["embedding"])  # [B, 1, D]
    ck, cv = list(ck), list(cv)
    for i, lw in enumerate(w["layers"]):
        q, k, v = _qkv(rms_norm(x), lw)
        if qk_norm:
            q, k = rms_norm(q), rms_norm(k)
        ck[i] = constrain(jax.lax.dynamic_update_slice(ck[i], k.astype(ck[i].dtype), (0, pos, 0, 0)), CACHE_AXES)
        cv[i] = constrain(jax.lax.dynamic_update_slice(cv[i], v.astype(cv[i].dtype), (0, pos, 0, 0)), CACHE_AXES)
        o = constrain(decode_attention(q, ck[i], cv[i], pos), Q_AXES)
        x = _ffn(x + _project_out(o, lw["wo"]), lw, mlp_kind, moe_spec)
    return _logits(x, w)[:, 0], ck, cv


def generate(w: dict, ids_BxP, steps: int, *, mlp_kind: str, qk_norm: bool = False, moe_spec=None):
    """Greedy generation: prefill the prompts, then ``steps`` decode steps, each taking the argmax token; the
    generated ids [B, steps] (int32). Each phase one jitted program (the decode step compiled once, its position
    traced), compiled with EXACT_ROUNDING: the same tokens on any mesh."""
    B, P = ids_BxP.shape
    t_max = P + steps
    kw = dict(mlp_kind=mlp_kind, qk_norm=qk_norm, moe_spec=moe_spec)
    pre = jax.jit(lambda w, ids: prefill(w, ids, t_max, **kw), compiler_options=EXACT_ROUNDING)
    step = jax.jit(lambda w, ck, cv, ids, pos: decode_step(w, ck, cv, ids, pos, **kw), donate_argnums=(1, 2),
                   compiler_options=EXACT_ROUNDING)
    logits, ck, cv = pre(w, ids_BxP)
    out = []
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    for t in range(steps):
        out.append(tok)
        if t + 1 < steps:
            logits, ck, cv = step(w, ck, cv, tok, jnp.int32(P + t))
            tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jnp.stack(out, axis=1)
