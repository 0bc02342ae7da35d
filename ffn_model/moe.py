"""Mixture-of-experts layers in Flax NNX over an ``expert`` mesh axis (issue 40): a router picks k of E experts per
token (scaling.families.moe.MoESpec), the tokens go to their experts and come back weighted by their gates.

Routing (``route``): softmax gates then top-k renormalised over the k (Mixtral, Jiang et al. 2024, section 2.1), or
sigmoid scores, top-k of them normalised (DeepSeek-V3, Liu et al. 2024, eq. 13-15 without the bias); the load-balancing
loss E·Σ_e f_e·P_e (Switch Transformer, Fedus et al. 2022, eq. 4) times ``aux_loss_weight``.

Two forms of the expert computation:
  capacity  (MoESpec.capacity_factor cf set) GShard's dispatch and combine (Lepikhin et al. 2020, algorithms 1-2):
            the tokens in G groups of S, each expert takes at most C = ceil(cf·k·S/E) of a group's (token, expert)
            pairs, every token's first choice before any second choice; a dispatch mask and combine weights
            [G, S, E, C]; x [G, E, C, D] = einsum(dispatch, x); the experts run on it with stacked weights
            [E, F_e, D]; out = einsum(combine, y). A pair past capacity is dropped (its term of the output is 0;
            a token with every pair dropped has a zero MoE output and the residual carries it).
  dropless  (cf None) every routed pair computed: each device's T·k pairs sorted by expert and run with
            jax.lax.ragged_dot over the experts' group sizes (MegaBlocks, Gale et al. 2023; MaxText's sparse matmul),
            in a jax.shard_map over the axes that split the tokens. Over an expert axis, Megatron-LM's all-gather token
            dispatcher: the expert axis's tokens all-gathered, each device runs its E/Ex experts' pairs, the outputs
            reduce-scattered; the all-to-all form needs jax.lax.ragged_all_to_all (variable sizes), which XLA:CPU does
            not implement (jax 0.10.2: "HLO opcode ragged-all-to-all is not supported"), so no test here could run it.
Shared experts (DeepSeekMoE, Dai et al. 2024): one MLP of F_e·shared_experts that every token runs, added.

Expert parallelism (GShard section 3.2; MaxText's layers/moe.py): the package's mesh axes ``data, stage, fsdp,
context, expert, tensor`` (scaling.core.mesh_shape.MESH_AXES, mesh.make_mesh: expert inside fsdp, next to tensor, so
that the all-to-all stays on the nearest links). The
expert weights [E, F_e, D] split E over expert (F_e over tensor, D over fsdp as the dense MLP's); the tokens split
over data, fsdp AND expert (the expert devices hold different tokens), a group being one sequence by default
(MaxText's capacity per sequence). The dispatched x [G, E, C, D] is constrained to G over (data, fsdp) and E over
expert: from the groups' split over expert to the experts' split, which XLA lowers to an all-to-all over expert;
the combine's input goes back the same way. The logical axes are the package's one table
(scaling.core.sharding.LOGICAL_RULES, through mesh.rules.logical_to_spec and ffn_model.sharded): ``moe_batch`` (the
tokens: data, fsdp, expert) and ``exp`` (E: expert) beside the dense stacks' axes; on a mesh of expert=1 nothing is
split over expert, and without a mesh
(jax.set_mesh) the module runs unsharded.

Precision as the dense stacks (ffn_model.sharded): FP32 master weights cast to BF16 before the FSDP gather, the
gradient reduced in BF16 and then cast to FP32; the router in FP32 (Switch section 2.4, selective precision).

MoEStack: L layers x = x + MoE(rms_norm(x)) (no attention, the test model as the FFN stack is), weights stacked over
layers and run by one jax.lax.scan; loss = MSE to the teacher's target (ffn_model.task) + Σ_layers aux loss.
make_train_step: value_and_grad of stack_loss and optax AdamW (ffn_model.train.make_optimizer).
"""

from __future__ import annotations

import functools
import math
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding, PartitionSpec

from ffn_model import transformer as tf
from ffn_model.sharded import (COMPUTE_DTYPE, constrain, gather_bf16, init_normal, loop_checkpoint, param,
                               traced_platform)
from ffn_model.pipeline import live_slots, pad_stack, uneven_stages
from ffn_model.state import module_state_shardings
from ffn_model.task import mse
from ffn_model.transformer import rms_norm
from mesh.rules import logical_to_spec, tokens_over
from scaling.core.kinds import Block, Mlp, Platform
from scaling.core.policies import Remat
from scaling.families.moe import MoESpec
from scaling.core.workload import Workload

X_AXES = ("moe_batch", None, "act_embed")  # x [B, T, D] between layers (MoEStack)
TOKEN_AXES = ("moe_tokens", "act_embed")  # the layer's tokens [B·T, D]: the batch's split and the sequence's
GROUP_AXES = ("moe_tokens", None, "act_embed")  # the groups x [G, S, D]
MASK_AXES = ("moe_tokens", None, None, None)  # dispatch mask, combine weights [G, S, E, C]
GROUPED_AXES = ("moe_tokens", None, None, "act_embed")  # x and y [G, E, C, D] on the devices of their groups
DISPATCHED_AXES = ("expert_groups", "exp", None, "act_embed")  # x and y [G, E, C, D]: E over expert, G over data, fsdp
HIDDEN_AXES = ("expert_groups", "exp", None, "mlp")  # the experts' hidden [G, E, C, F_e]
ROUTER_AXES = ("layers", None, None)  # W_router [L, D, E], FP32, replicated (D·E values per layer)
EXPERT_AXES = ("layers", "exp", "mlp", "embed")  # W_in, W_gate, W_out [L, E, F_e, D]
SHARED_AXES = ("layers", "mlp", "embed")  # the shared experts' W_in, W_gate, W_out [L, F_e·shared, D]
MLP_KINDS = ("swiglu", "gelu", "relu")


def shards(logical) -> int:
    """How many pieces the current mesh splits a dimension of logical axis ``logical`` into (1 without a mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    entry = logical_to_spec((logical,))[0]
    return math.prod(mesh.shape[a] for a in ((entry,) if isinstance(entry, str) else entry or ()))


# ---------------------------------------------------------------------------------------------------------- routing


def route(h_TxD, w_router_DxE, spec: MoESpec):
    """(gates [T, k] FP32, expert ids [T, k] int32, aux loss): logits = h·W_router in FP32;
    softmax: p = softmax(logits), ids = top-k(p), gates = p_ids / Σ_k p_ids (Mixtral section 2.1: the same as a
    softmax over the top-k logits); sigmoid: s = σ(logits), ids = top-k(s), gates = s_ids / Σ_k s_ids (DeepSeek-V3
    eq. 13-15, no bias), its router probabilities P = s / Σ_E s (DeepSeek-V3 eq. 19).
    aux = aux_loss_weight · E · Σ_e f_e·P_e (Switch eq. 4) with f_e = (pairs routed to e) / (T·k), the fraction of the
    T·k routed pairs (Switch's fraction of tokens at k = 1; 1 at perfect balance), P_e = mean_t p_t,e."""
    E, k = spec.experts, spec.top_k
    T = h_TxD.shape[0]
    h_TxD = constrain(h_TxD, TOKEN_AXES)
    logits = jnp.dot(h_TxD.astype(jnp.float32), w_router_DxE.astype(jnp.float32), precision="highest")
    # remat none keeps the logits (MOE_SAVED), the same 4·T·E bytes as the probabilities: the softmax's (sigmoid's)
    # linearization reads its own output, which a name on the probabilities does not reach, so the backward made
    # it again from h·W_router, a second router matmul (docs/findings.md, "Residuals of issue 49, item 14")
    logits = checkpoint_name(logits, "router_logits")
    if spec.router == "softmax":
        probs = scores = jax.nn.softmax(logits, axis=-1)
    else:
        scores = jax.nn.sigmoid(logits)
        probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    top, ids = top_k(constrain(scores, ("moe_tokens", None)), k)
    gates = top / jnp.sum(top, axis=-1, keepdims=True)
    f = checkpoint_name(jnp.sum(jax.nn.one_hot(ids, E, dtype=jnp.float32), axis=(0, 1)) / (T * k), "router_load")
    aux = spec.aux_loss_weight * E * jnp.sum(f * jnp.mean(probs, axis=0))
    return gates, ids.astype(jnp.int32), aux


def top_k(scores_TxE, k: int):
    """(values, indices) [T, k] of each row's k largest scores, largest first, the lower index first among equal
    ones (as jax.lax.top_k): k rounds of argmax, each masking the one it took. Why not jax.lax.top_k: XLA partitions
    its TopK by all-gathering every token's scores (the tokens split over the batch axes: an all-gather of [T, E]);
    an argmax is a reduction along E, done on the token's device."""
    taken = []
    s = scores_TxE
    for _ in range(k):
        i = jnp.argmax(s, axis=-1)
        taken.append(i)
        s = jnp.where(jax.nn.one_hot(i, s.shape[-1], dtype=jnp.bool_), -jnp.inf, s)
    ids = jnp.stack(taken, axis=-1)
    return jnp.take_along_axis(scores_TxE, ids, axis=-1), ids


def capacity(spec: MoESpec, group_tokens: int) -> int:
    """C = ceil(cf·k·S/E): the (token, expert) pairs each expert takes from a group of S tokens (GShard section 2.2;
    Switch eq. 3 with k = 1)."""
    if spec.capacity_factor is None:
        raise ValueError("capacity: the spec is dropless (capacity_factor None)")
    return math.ceil(spec.capacity_factor * spec.top_k * group_tokens / spec.experts)


def dispatch_combine(gates_SxK, ids_SxK, experts: int, C: int):
    """(dispatch [S, E, C] bool, combine [S, E, C] FP32) of one group (GShard algorithm 2 for k experts): the pairs
    taken in priority order, every token's j-th choice before any (j+1)-th, tokens in order within a rank; a pair's
    slot is the number of pairs before it at its expert; slot >= C: dropped (no entry in either).
    dispatch[s, e, c] = [token s is expert e's c-th pair]; combine[s, e, c] = gate of that pair."""
    S, k = ids_SxK.shape
    mask_SxKxE = jax.nn.one_hot(ids_SxK, experts, dtype=jnp.int32)
    ranked = mask_SxKxE.transpose(1, 0, 2).reshape(k * S, experts)  # rank-major: all first choices first
    slot = (jnp.cumsum(ranked, axis=0) - 1).reshape(k, S, experts).transpose(1, 0, 2)
    slot_SxK = jnp.sum(slot * mask_SxKxE, axis=-1)
    at_SxKxC = jax.nn.one_hot(slot_SxK, C, dtype=jnp.float32)  # all zero where slot >= C: dropped
    # the k choices' [S, E, C] terms added one by one (elementwise, fused: no [S, k, E, C] array, and no dot past the
    # two that carry D, whose FLOPs are the closed form's dispatch term, scaling.families.moe.step_flops)
    pairs = [mask_SxKxE[:, j, :, None].astype(jnp.float32) * at_SxKxC[:, j, None, :] for j in range(k)]
    dispatch = sum(pairs) > 0
    combine = sum(gates_SxK[:, j, None, None] * p for j, p in enumerate(pairs))
    return dispatch, combine


# ---------------------------------------------------------------------------------------------------------- experts


def _activate(u, g, kind: str):
    """SwiGLU silu(g)·u (Shazeer 2020), or gelu(u) / relu(u)."""
    if kind == Mlp.SWIGLU:
        return jax.nn.silu(g) * u
    return jax.nn.gelu(u) if kind == Mlp.GELU else jax.nn.relu(u)


def experts_mlp(x_GxExCxD, w: dict, kind: str):
    """The E experts on their dispatched tokens: y[g,e,c] = act(x[g,e,c]·W_in[e]^T (, ·W_gate[e]^T))·W_out[e], the
    stacked weights [E, F_e, D] (BF16, gathered over fsdp); W_in and W_gate as one [2, E, F_e, D] matmul (one partial
    sum over tensor for the input gradient, as ffn_model.transformer.mlp); the hidden split F_e over tensor (named
    mlp_in, mlp_gate: remat none keeps them), the output a partial sum over tensor."""
    names = ["w_in", "w_gate"] if kind == Mlp.SWIGLU else ["w_in"]
    w_in = jnp.stack([gather_bf16(w[n], EXPERT_AXES[1:]) for n in names])
    ug = jnp.einsum("gecd,xefd->xgecf", x_GxExCxD, w_in)
    u = checkpoint_name(constrain(ug[0], HIDDEN_AXES), "mlp_in")
    g = checkpoint_name(constrain(ug[1], HIDDEN_AXES), "mlp_gate") if kind == Mlp.SWIGLU else None
    return jnp.einsum("gecf,efd->gecd", _activate(u, g, kind), gather_bf16(w["w_out"], EXPERT_AXES[1:]))


def capacity_moe(h_NxD, gates_NxK, ids_NxK, w: dict, spec: MoESpec, kind: str, groups: int):
    """GShard's form (module docstring) on N tokens in ``groups`` groups of S = N/groups: dispatch and combine per group
    (dispatch_combine, C = capacity(spec, S)); x [G, E, C, D] resharded from the groups' split to E over expert (an
    all-to-all over expert), the experts run (experts_mlp), y resharded back (the second all-to-all), then
    out[g, s] = Σ_e,c combine[g, s, e, c]·y[g, e, c] (FP32 sums, BF16 out)."""
    N, D = h_NxD.shape
    S, k, E = N // groups, spec.top_k, spec.experts
    C = capacity(spec, S)
    x_GxSxD = constrain(h_NxD.reshape(groups, S, D), GROUP_AXES)
    dispatch, combine = jax.vmap(functools.partial(dispatch_combine, experts=E, C=C))(
        gates_NxK.reshape(groups, S, k), ids_NxK.reshape(groups, S, k))
    dispatch, combine = constrain(dispatch, MASK_AXES), constrain(combine, MASK_AXES)
    # each device dispatches its own groups (a selection: exact in BF16), then E goes over expert: the all-to-all
    x = constrain(jnp.einsum("gsec,gsd->gecd", dispatch.astype(COMPUTE_DTYPE), x_GxSxD), GROUPED_AXES)
    y = experts_mlp(checkpoint_name(constrain(x, DISPATCHED_AXES), "moe_in"), w, kind)
    # summed over tensor, then back to the groups' devices
    y = checkpoint_name(constrain(constrain(y, DISPATCHED_AXES), GROUPED_AXES), "moe_out")
    out = jnp.einsum("gsec,gecd->gsd", combine.astype(COMPUTE_DTYPE), y, preferred_element_type=jnp.float32)
    return constrain(out.astype(COMPUTE_DTYPE), GROUP_AXES).reshape(N, D)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _all_gather_bf16(x, axis: str):
    """jax.lax.all_gather(x, axis, tiled=True) of BF16 x; backward: the gradient reduce-scattered in FP32, then BF16
    (XLA:CPU crashes on a BF16 reduce-scatter inside a shard_map under a mesh: its reduction body holds a copy)."""
    return jax.lax.all_gather(x, axis, tiled=True)


def _all_gather_bf16_fwd(x, axis):
    return _all_gather_bf16(x, axis), None


def _all_gather_bf16_bwd(axis, _, g):
    return (jax.lax.psum_scatter(g.astype(jnp.float32), axis, scatter_dimension=0, tiled=True).astype(g.dtype),)


_all_gather_bf16.defvjp(_all_gather_bf16_fwd, _all_gather_bf16_bwd)


def _grouped_ragged(x_MxK, w, sizes_G, transposed: bool):
    """Each expert's rows times its weights: jax.lax.ragged_dot (CPU, GPU) of w [G, K, N], or of w [G, N, K]
    ``transposed`` (swapped first)."""
    return jax.lax.ragged_dot(x_MxK, jnp.swapaxes(w, 1, 2) if transposed else w, sizes_G)


def _grouped_tpu(x_MxK, w, sizes_G, transposed: bool, interpret: bool = False):
    """Each expert's rows times its weights on a TPU: jax's Pallas megablox grouped matmul (Gale et al. 2023; MaxText's
    TPU sparse matmul, megablox.gmm, its custom_vjp: the input's gradient a gmm, the weights' a tgmm), BF16 out; w
    [G, K, N], or [G, N, K] ``transposed`` (the kernel's transpose_rhs: no copy of the weights). Rows past the groups
    (another device's experts) are not visited, their output unset (and so their input's gradient, the backward's
    gmm): both zeroed here, the input's through the mask's transpose. ``interpret``: Pallas's interpret mode (a CPU runs
    the kernel: tests/test_moe_model.py)."""
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    run = (jnp.arange(x_MxK.shape[0]) < jnp.sum(sizes_G))[:, None]
    zero = jnp.zeros((), x_MxK.dtype)
    y = gmm(jnp.where(run, x_MxK, zero), w, sizes_G, COMPUTE_DTYPE, transpose_rhs=transposed, interpret=interpret)
    return jnp.where(run, y, jnp.zeros((), y.dtype))


def _dropless_local(h_SxD, gates_SxK, ids_SxK, ws: dict, kind: str, weights_dtype=None, expert_axis=None,
                    grouped=_grouped_ragged):
    """dropless_moe on one device's S tokens and its experts' BF16 weights ([E_l, F_e, D] as stored; cast to
    ``weights_dtype`` first if given). ``expert_axis``: the tokens, gates and ids of the devices along it all-gathered
    first, this device's E_l experts' pairs computed (the others' rows past the group sizes, their gates 0), and the
    partial outputs reduce-scattered back to the tokens' devices."""
    if weights_dtype is not None:
        ws = {n: a.astype(weights_dtype) for n, a in ws.items()}
    E_l = ws["w_in"].shape[0]
    first = 0
    if expert_axis is not None:
        h_SxD = _all_gather_bf16(h_SxD, expert_axis)
        gates_SxK, ids_SxK = (jax.lax.all_gather(a, expert_axis, tiled=True) for a in (gates_SxK, ids_SxK))
        first = jax.lax.axis_index(expert_axis) * E_l
    (S, D), k = h_SxD.shape, ids_SxK.shape[1]
    mine_SxK = (ids_SxK >= first) & (ids_SxK < first + E_l)
    key = jnp.where(mine_SxK, ids_SxK - first, E_l).reshape(-1)  # another device's experts: a last group, not run
    order = jnp.argsort(key, stable=True)
    sizes = jnp.bincount(key, length=E_l + 1)[:E_l].astype(jnp.int32)
    # the row gathers in FP32 (BF16 values): their transposes are scatter-adds, which XLA:CPU crashes on in BF16 inside
    # a shard_map under a mesh (their reduction body holds a copy: "Invalid binary instruction opcode copy")
    x = checkpoint_name(h_SxD.astype(jnp.float32)[order // k].astype(COMPUTE_DTYPE), "moe_in")  # [S·k, D], by expert
    u = checkpoint_name(grouped(x, ws["w_in"], sizes, True), "mlp_in")
    g = checkpoint_name(grouped(x, ws["w_gate"], sizes, True), "mlp_gate") if kind == Mlp.SWIGLU else None
    # [S·k, D], sorted; rows past the groups: gate 0
    y = checkpoint_name(grouped(_activate(u, g, kind), ws["w_out"], sizes, False), "moe_out")
    y_SxKxD = y.astype(jnp.float32)[jnp.argsort(order)].reshape(S, k, D)  # pair order
    gates_SxK = jnp.where(mine_SxK, gates_SxK, 0.0).astype(COMPUTE_DTYPE).astype(jnp.float32)
    out = jnp.einsum("sk,skd->sd", gates_SxK, y_SxKxD)  # the gates rounded to BF16 as the capacity form's combine
    if expert_axis is not None:  # each token's terms from the experts on every device of the expert axis
        out = jax.lax.psum_scatter(out, expert_axis, scatter_dimension=0, tiled=True)
    return out.astype(COMPUTE_DTYPE)


def dropless_moe(h_NxD, gates_NxK, ids_NxK, w: dict, kind: str):
    """Every routed pair computed (MegaBlocks' grouped matmul), each device on its own tokens (a jax.shard_map manual
    over the axes that split the tokens; a sort left to XLA gathered every token's pairs): its S·k pairs sorted by
    expert (stable), the tokens gathered in that order, each expert's rows multiplied by its weights with
    jax.lax.ragged_dot over the group sizes (pairs per expert), the results put back in pair order and
    out[n] = Σ_j gate[n, j]·y[n, j] (FP32 sums, BF16 out). Over an expert axis: Megatron-LM's all-gather token
    dispatcher (MoEAllGatherTokenDispatcher): the tokens of the expert axis's devices all-gathered, each device runs
    its E/Ex experts' pairs, the outputs reduce-scattered (module docstring: why not an all-to-all)."""
    ws = {n: gather_bf16(w[n], EXPERT_AXES[1:]) for n in ("w_in", "w_gate", "w_out") if n in w}  # [E, F_e, D]
    mesh = jax.sharding.get_abstract_mesh()
    # a TPU runs megablox's grouped matmul (jax.lax.ragged_dot in a shard_map stops libtpu 0.0.42.1 on an internal
    # check, and without an expert axis lowers densely); CPU and GPU ragged_dot
    tpu = traced_platform() == Platform.TPU
    grouped = _grouped_tpu if tpu else _grouped_ragged
    spec = PartitionSpec() if mesh.empty else logical_to_spec(("moe_tokens", None))
    split = set() if spec == PartitionSpec() or spec[0] is None else {spec[0]} if isinstance(spec[0], str) else set(
        spec[0])
    if tpu:  # a Pallas kernel is not partitioned by XLA: every axis manual (as splash's)
        if not mesh.empty and mesh.shape.get("tensor", 1) > 1:
            raise ValueError(f"the dropless MoE layer on a TPU (megablox's grouped matmul) is built without a tensor "
                             f"axis, not tensor={mesh.shape['tensor']}: split the experts over expert, or give a "
                             "capacity factor")
        split = set() if mesh.empty else set(mesh.axis_names)
    if not split:
        return _dropless_local(h_NxD, gates_NxK, ids_NxK, ws, kind, grouped=grouped)
    # the weights enter as FP32 holding their BF16 values, so that the shard_map's transpose sums their gradients over
    # the token axes in FP32: XLA:CPU crashes on that sum in BF16 (AllReducePromotion: "Invalid binary instruction
    # opcode copy", jax 0.10.2: the psum's reduction body holds a sharding constraint)
    if not tpu:  # (a TPU's in BF16: the FP32 sum is XLA:CPU's need)
        ws = {n: a.astype(jnp.float32) for n, a in ws.items()}
    expert_axis = "expert" if "expert" in split and mesh.shape["expert"] > 1 else None
    local = functools.partial(_dropless_local, kind=kind, weights_dtype=COMPUTE_DTYPE, expert_axis=expert_axis,
                              grouped=grouped)
    w_spec = PartitionSpec(expert_axis)
    out = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, w_spec), out_specs=spec, axis_names=split,
                        check_vma=False)(constrain(h_NxD, ("moe_tokens", None)), gates_NxK, ids_NxK, ws)
    return constrain(out, TOKEN_AXES)


def default_groups() -> int:
    """The token shards of the current mesh (data·fsdp·expert·context; 1 without a mesh): the groups must be a
    multiple."""
    return shards("moe_tokens")


def moe_layer(h_BxTxD, w: dict, spec: MoESpec, kind: str = "swiglu", groups: int | None = None, out_axes=X_AXES):
    """(MoE(h) [B, T, D] BF16, aux loss FP32) of one layer's weights ``w`` (router, w_in, w_gate, w_out, shared_*):
    route over every token of the batch (route), then the capacity or the dropless form (module docstring), plus the
    shared experts. ``groups``: G, the capacity form's groups (each with its own capacity; the dropless form's result
    does not depend on them); default one per sequence, B, and under context parallelism one per sequence chunk
    a device holds, B·C (MaxText's capacity per sequence; scaling.families.moe's expert_capacity and group_tokens);
    it must divide B·T and be a multiple of the token shards (ValueError naming both). The output laid out as
    ``out_axes`` (the transformer's x: ffn_model.transformer.X_AXES)."""
    B, T, D = h_BxTxD.shape
    N, C = B * T, shards("seq")
    # the tokens context-major, [C, B, T/C] (a local transpose: each device's block keeps its own), so that the
    # groups' split is (context, data, fsdp, expert) and the dispatch moves them over expert alone (moe_tokens)
    h_NxD = h_BxTxD.reshape(B, C, T // C, D).transpose(1, 0, 2, 3).reshape(N, D)
    gates, ids, aux = route(h_NxD, w["router"], spec)
    G = groups or B * C
    if N % G or G % default_groups():
        raise ValueError(f"groups={G} must divide the {N} tokens of the batch and be a multiple of the "
                         f"{default_groups()} token shards (data·fsdp·expert·context)")
    if spec.capacity_factor is None:
        out = dropless_moe(h_NxD, gates, ids, w, kind)
    else:
        out = capacity_moe(h_NxD, gates, ids, w, spec, kind, G)
    out = out.reshape(C, B, T // C, D).transpose(1, 0, 2, 3).reshape(B, T, D)
    if spec.shared_experts:  # one MLP of F_e·S_sh (DeepSeekMoE section 3.2), ffn_model.transformer's
        out = out + tf.mlp(h_BxTxD, {"w_in": w["shared_in"], "w_gate": w.get("shared_gate"),
                                     "w_out": w["shared_out"]}, kind)
    return constrain(out, out_axes), aux


# ------------------------------------------------------------------------------------------------------------ stack


def layer_names(spec: MoESpec, kind: str) -> list[str]:
    """The stacked weights of a layer: router, w_in, (w_gate), w_out, and the shared experts' if any."""
    gated = ["w_gate"] if kind == Mlp.SWIGLU else []
    shared = (["shared_in"] + (["shared_gate"] if gated else []) + ["shared_out"]) if spec.shared_experts else []
    return ["router", "w_in", *gated, "w_out", *shared]


class MoEStack(nnx.Module):
    """L layers x = x + MoE(rms_norm(x)) (moe_layer), no attention; weights [L, ...] FP32 with their logical axes
    (ROUTER_AXES, EXPERT_AXES, SHARED_AXES): W_router ~ N(0, 1/D) [L, D, E]; W_in, W_gate ~ N(0, 1/D), W_out ~ N(0,
    1/F_e), [L, E, F_e, D] (W_in stored transposed as the dense stacks do: D minor); the shared experts' [L, F_s, D],
    F_s = F_e·shared_experts. Every layer is MoE (a spec with dense layers, moe_every > 1 or first_dense > 0, is a
    ValueError here)."""

    def __init__(self, d_model: int, blocks: int, spec: MoESpec, *, mlp: str = "swiglu", groups: int | None = None,
                 rngs: nnx.Rngs):
        if mlp not in MLP_KINDS:
            raise ValueError(f"mlp {mlp!r}: one of {', '.join(MLP_KINDS)}")
        if spec.moe_layers(blocks) != blocks:
            raise ValueError(f"MoEStack runs MoE layers only: {spec.moe_layers(blocks)} of {blocks} are MoE "
                             f"(moe_every={spec.moe_every}, first_dense={spec.first_dense})")
        D, L, E, F = d_model, blocks, spec.experts, spec.expert_d_ff
        Fs = F * spec.shared_experts
        self.spec, self.mlp, self.groups = spec, mlp, groups
        self.router = param(init_normal(rngs.params(), (L, D, E), D), ROUTER_AXES)
        self.w_in = param(init_normal(rngs.params(), (L, E, F, D), D), EXPERT_AXES)
        if mlp == Mlp.SWIGLU:
            self.w_gate = param(init_normal(rngs.params(), (L, E, F, D), D), EXPERT_AXES)
        self.w_out = param(init_normal(rngs.params(), (L, E, F, D), F), EXPERT_AXES)
        if Fs:
            self.shared_in = param(init_normal(rngs.params(), (L, Fs, D), D), SHARED_AXES)
            if mlp == Mlp.SWIGLU:
                self.shared_gate = param(init_normal(rngs.params(), (L, Fs, D), D), SHARED_AXES)
            self.shared_out = param(init_normal(rngs.params(), (L, Fs, D), Fs), SHARED_AXES)

    def __call__(self, x_BxTxD):
        """x [B, T, D] -> (the stack's output [B, T, D] BF16, Σ_layers aux loss FP32): one jax.lax.scan over the
        layers."""
        weights = {n: getattr(self, n)[...] for n in layer_names(self.spec, self.mlp)}

        def body(carry, w):
            x, aux = carry
            y, a = moe_layer(rms_norm(x), w, self.spec, self.mlp, self.groups)
            return (constrain(x + y, X_AXES), aux + a), None

        x = constrain(x_BxTxD.astype(COMPUTE_DTYPE), X_AXES)
        (x, aux), _ = jax.lax.scan(body, (x, jnp.zeros((), jnp.float32)), weights)
        return x, aux


def stack_loss(model: MoEStack, batch):
    """MSE in FP32 of the stack's output against the target y (as ffn_model.task.mse, over every element) plus the
    layers' aux losses (Switch eq. 4 summed over layers)."""
    pred, aux = model(batch["x"])
    return jnp.mean(jnp.square(pred.astype(jnp.float32) - constrain(batch["y"], X_AXES))) + aux


# ------------------------------------------------------------------------------------------------ mesh and training


def batch_sharding(mesh) -> NamedSharding:
    """The NamedSharding of a batch's x and y [B, T, D] on ``mesh`` (X_AXES: B over data, fsdp, expert)."""
    return NamedSharding(mesh, logical_to_spec(X_AXES))


def init_state(model_fn, mesh, tx):
    """The train state, created in its shardings (ffn_model.state.module_state_shardings) by one jitted init."""
    _, shardings = module_state_shardings(model_fn, mesh, tx)

    @functools.partial(jax.jit, out_shardings=shardings)
    def init():
        params = nnx.to_pure_dict(nnx.state(model_fn(), nnx.Param))
        return {"params": params, "opt": tx.init(params)}

    with jax.set_mesh(mesh):
        return init()


def make_train_step(model_fn, mesh, tx):
    """(state, batch) -> (state, loss): value_and_grad of ``loss`` and the optax update ``tx`` (AdamW:
    ffn_model.train.make_optimizer); jitted, the state donated and pinned to its shardings, the loss replicated. Call
    it (or lower it) under jax.set_mesh(mesh)."""
    graphdef, _ = nnx.get_abstract_model(model_fn, mesh)
    _, shardings = module_state_shardings(model_fn, mesh, tx)

    def step(state, batch):
        with tokens_over("moe_batch"):  # the tokens over data, fsdp and expert (mesh.rules.BATCH_AXIS)
            value, grads = jax.value_and_grad(lambda p: stack_loss(nnx.merge(graphdef, p), batch))(state["params"])
        updates, opt = tx.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, value

    return jax.jit(step, donate_argnums=(0,), out_shardings=(shardings, NamedSharding(mesh, PartitionSpec())))


# ------------------------------------------------------------------------------------- the MoE transformer (family)
# The program of scaling.families.moe.MoEConfig (ffn_model.families: "moe"): the base transformer's layers
# (ffn_model.transformer) with the MLP of its MoE layers (MoESpec.is_moe) replaced by moe_layer. Its step is traced
# with "batch" read as "moe_batch" (mesh.rules.tokens_over, MoEConfig.batch_axis): attention, the dense MLPs, the
# vocabulary and the loss see each device's B/(d·X·Ex) tokens, as scaling.families.moe's closed forms fold the expert
# axis into data.

# What remat "none" keeps of an MoE layer (jax.checkpoint save_only_these_names; scaling.families.moe._saved counts
# them): the transformer's (ffn_model.transformer.SAVED: the norms, q, k, v, the attention's residuals, mid, and as
# mlp_in, mlp_gate the experts' hidden), the router's logits, the experts' input and output buffers (moe_in, moe_out),
# (as mlp_in, mlp_gate) the shared experts' hidden, and the experts' load f_e [E] (its sum over the tokens not made
# again). The gathered weights are gathered again for the backward; the dispatch and combine masks recomputed from the
# probabilities (elementwise).
MOE_SAVED = (*tf.SAVED, "router_logits", "router_load", "moe_in", "moe_out")
MOE_NAMES = {"router": "router", "expert_in": "w_in", "expert_gate": "w_gate", "expert_out": "w_out",
             "shared_in": "shared_in", "shared_gate": "shared_gate", "shared_out": "shared_out"}  # stored: moe_layer's


def layer_plan(spec: MoESpec, blocks: int) -> tuple[int, int, int, int]:
    """(first, groups, every, rest): the layers as MoESpec.is_moe orders them: ``first`` dense layers, then ``groups``
    groups of ``every`` layers (every − 1 dense, then one MoE), then ``rest`` dense layers."""
    q, r = divmod(blocks - spec.first_dense, spec.moe_every)
    return spec.first_dense, q, spec.moe_every, r


def moe_block(x_BxTxD, w: dict, schedule, spec: MoESpec, kind: str, groups: int | None = None):
    """One pre-norm MoE layer: x = x + attention(RMSNorm(x))·W_o (ffn_model.transformer.attention_sublayer), then
    x + MoE(RMSNorm(x)) (moe_layer). Returns (x, aux loss)."""
    x = checkpoint_name(constrain(x_BxTxD, tf.X_AXES), "layer_input")
    x = tf.attention_sublayer(x, checkpoint_name(constrain(rms_norm(x), tf.X_AXES), "norm1"), w, schedule)
    y, aux = moe_layer(checkpoint_name(rms_norm(x), "norm2"), {MOE_NAMES.get(n, n): a for n, a in w.items()}, spec,
                       kind, groups, tf.X_AXES)
    return constrain(x + y, tf.X_AXES), aux


class MoETransformer(nnx.Module):
    """The MoE transformer of a Workload of scaling.families.moe.MoEConfig: parameters FP32 with their logical axes,
    stacked over the layers of their kind: attention's W_q, W_k, W_v, W_o [L, ...] (ffn_model.transformer's axes), the
    dense layers' MLP [L_dense, F, D] (stored dense_in, dense_gate, dense_out), the MoE layers' router, experts and
    shared experts [L_moe, ...] (MoEStack's axes and initialisation), the embeddings with a vocabulary. Serial blocks
    and global attention only (a ValueError otherwise)."""

    def __init__(self, w: Workload, *, rngs: nnx.Rngs):
        cfg = w.model
        base, spec = cfg.base, cfg.moe
        if base.block != Block.SERIAL or any(x is not None for x in base.layer_windows):
            raise ValueError("the MoE transformer is built with serial blocks and global attention")
        D, F = base.d_model, base.d_ff
        E, Fe, Lm, Ld = spec.experts, spec.expert_d_ff, cfg.moe_layers, cfg.dense_layers
        Fs, gated = Fe * spec.shared_experts, base.mlp == Mlp.SWIGLU
        self.schedule, self.remat, self.spec, self.kind, self.vocab = w.schedule, w.remat, spec, base.mlp, base.vocab
        self.tied, self.qk_norm = base.tied_embeddings, base.qk_norm
        shapes = {n: (shape, fan_in, tf.LAYER_AXES[n]) for n, (shape, fan_in) in tf.attention_shapes(base).items()}
        # with stages the dense layers first run outside the pipeline (outer_layers): their attention a stack of its
        # own, "outer_" + name [L_dense, ...], their stacks' layer axis whole (not over stage)
        self.outer = outer = Ld if w.mesh.get("stage", 1) > 1 else 0
        shapes |= {"router": ((Lm, D, E), D, ROUTER_AXES), "expert_in": ((Lm, E, Fe, D), D, EXPERT_AXES),
                  "expert_gate": ((Lm, E, Fe, D), D, EXPERT_AXES), "expert_out": ((Lm, E, Fe, D), Fe, EXPERT_AXES)}
        if Fs:
            shapes |= {"shared_in": ((Lm, Fs, D), D, SHARED_AXES), "shared_gate": ((Lm, Fs, D), D, SHARED_AXES),
                       "shared_out": ((Lm, Fs, D), Fs, SHARED_AXES)}
        if Ld:
            mlp_axes = (None, *tf.W_MLP_AXES[1:]) if outer else tf.W_MLP_AXES
            shapes |= {"dense_in": ((Ld, F, D), D, mlp_axes), "dense_gate": ((Ld, F, D), D, mlp_axes),
                       "dense_out": ((Ld, F, D), F, mlp_axes)}
        if base.vocab is not None:  # E, U ~ N(0, 1/D) as the transformer's
            shapes["embedding"] = ((base.vocab, D), D, tf.VOCAB_AXES)
            if not base.tied_embeddings:
                shapes["unembedding"] = ((base.vocab, D), D, tf.VOCAB_AXES)
        self.names = tuple(n for n in shapes if gated or not n.endswith("_gate"))
        # uneven stages (every layer MoE): the stage's stacks padded to S·Lmax slots, zeros in the padding
        # (ffn_model.pipeline.pad_stack), the real layers drawn as without stages
        counts, staged = uneven_stages(w), stage_axes(cfg)
        for n in self.names:
            shape, fan_in, axes = shapes[n]
            a = init_normal(rngs.params(), shape, fan_in)  # drawn whole, as without stages
            if outer and n in tf.ATTENTION_WEIGHTS:
                setattr(self, f"outer_{n}", param(a[:outer], (None, *axes[1:])))
                a = a[outer:]
            setattr(self, n, param(pad_stack(a, counts) if counts and n in staged else a, axes))
        if outer:
            self.names += tuple(f"outer_{n}" for n in self.names if n in tf.ATTENTION_WEIGHTS)

    def _stacks(self):
        """(attention [L], dense MLP [L_dense] under the transformer's names, MoE [L_moe]) weight dicts."""
        attn = {n: getattr(self, n)[...] for n in tf.ATTENTION_WEIGHTS if n in self.names}
        dense = {n.replace("dense", "w"): getattr(self, n)[...] for n in self.names if n.startswith("dense_")}
        moe = {n: getattr(self, n)[...] for n in self.names if n in MOE_NAMES}
        return attn, dense, moe

    def __call__(self, x):
        """x: token vectors [B, T, D] (or ids [B, T] with a vocabulary) -> (output [B, T, D] or logits [B, T, V],
        Σ aux loss): layer_plan's dense runs (ffn_model.transformer.stack_forward: one scan each) and MoE groups (one
        scan over the groups, each its every − 1 dense layers and then its MoE layer under jax.checkpoint: remat
        "none" keeps MOE_SAVED, "full" the layer's input only, a named or offloading policy (scaling.families.moe.
        MOE_REMATS) what it keeps of the attention (ffn_model.transformer.remat_policy), nothing of the MoE MLP)."""
        with tf.qk_norm_on(self.qk_norm):
            return self._forward(x)

    def _forward(self, x):
        attn, dense, moe = self._stacks()
        first, q, every, rest = layer_plan(self.spec, len(attn["wo"]))
        if self.vocab is None:
            x = x.astype(COMPUTE_DTYPE)
        else:
            x, e = tf.embed(x, self.embedding[...], self.schedule, self.tied)
        dense_run = lambda x, a, b, lo, hi: tf.stack_forward(  # noqa: E731 (attention layers a..b, dense MLPs lo..hi)
            x, {**{n: v[a:b] for n, v in attn.items()}, **{n: v[lo:hi] for n, v in dense.items()}}, self.schedule,
            self.remat, self.kind)
        if first:
            x = dense_run(x, 0, first, 0, first)
        block = functools.partial(moe_block, schedule=self.schedule, spec=self.spec, kind=self.kind)
        policy = (jax.checkpoint_policies.save_only_these_names(*MOE_SAVED) if self.remat == Remat.NONE
                  else tf.remat_policy(self.remat, self.schedule))  # the named ones keep no name of the MoE MLP
        block = loop_checkpoint(block, policy, q)

        def group(carry, ws):
            x, aux = carry
            a, d, m = ws
            for i in range(every - 1):  # the group's dense layers, unrolled
                x = tf.stack_forward(x, {**{n: v[i:i + 1] for n, v in a.items()},
                                         **{n: v[i:i + 1] for n, v in d.items()}}, self.schedule, self.remat, self.kind)
            x, a_ = block(x, {**{n: v[every - 1] for n, v in a.items()}, **m})
            return (x, aux + a_), None

        g_attn = {n: v[first:first + q * every].reshape(q, every, *v.shape[1:]) for n, v in attn.items()}
        g_dense = {n: v[first:first + q * (every - 1)].reshape(q, every - 1, *v.shape[1:]) for n, v in dense.items()}
        (x, aux), _ = jax.lax.scan(group, (x, jnp.zeros((), jnp.float32)), (g_attn, g_dense, moe))
        if rest:
            L, Ld = len(attn["wo"]), first + q * (every - 1) + rest
            x = dense_run(x, L - rest, L, Ld - rest, Ld)
        if self.vocab is None:
            return x, aux
        return tf.output_logits(x, e if self.tied else self.unembedding[...], self.schedule), aux


# The family's program (ffn_model.families): the functions the train step asks of a model family.


def build(w: Workload, seed: int = 0) -> MoETransformer:
    """The MoE transformer of ``w`` (MoETransformer), its parameters drawn from ``seed`` (init_normal)."""
    return MoETransformer(w, rngs=nnx.Rngs(seed))


input_layout = tf.input_layout  # the transformer's batch: sequences [B/T, T, D] or ids [B/T, T] ("batch": moe_batch)
batch_dtypes = tf.batch_dtypes
synthetic_batch = tf.synthetic_batch


def loss(model: MoETransformer, batch):
    """The transformer's loss on one batch (the MSE of its output, or with a vocabulary the cross-entropy of its
    logits: ffn_model.transformer) plus the MoE layers' aux losses (Switch eq. 4 summed over layers)."""
    out, aux = model(batch["x"])
    if model.vocab is not None:
        return tf.cross_entropy(out, batch["y"]) + aux
    return mse(out, batch["y"], tf.X_AXES) + aux


def stage_axes(cfg) -> dict:
    """{name: logical axes} of the stacked layers a pipeline stage holds: the attention's (ffn_model.transformer's
    LAYER_AXES) and the MoE MLP's (ROUTER_AXES, EXPERT_AXES, SHARED_AXES), under MoETransformer's names."""
    moe = {"router": ROUTER_AXES, "expert_in": EXPERT_AXES, "expert_gate": EXPERT_AXES, "expert_out": EXPERT_AXES}
    if cfg.moe.shared_experts:
        moe |= {"shared_in": SHARED_AXES, "shared_gate": SHARED_AXES, "shared_out": SHARED_AXES}
    gated = cfg.base.mlp == Mlp.SWIGLU
    return {**{n: tf.LAYER_AXES[n] for n in tf.attention_shapes(cfg.base)},
            **{n: a for n, a in moe.items() if gated or not n.endswith("_gate")}}


def moe_chunk(x_BxTxD, ws: dict, select, *, schedule, remat: str, spec: MoESpec, kind: str, counts=None):
    """A pipeline stage's chunk of MoE layers (every layer MoE): one lax.scan over its stacked weights, each layer
    moe_block under jax.checkpoint with the family's policy (MoETransformer's), ``select`` (the chunk of the
    iteration: ffn_model.pipeline.pipeline_outputs) applied to each weight inside it. The aux loss is dropped: stages
    are built with aux_loss_weight 0 (pipeline_loss_fn). ``counts``: uneven chunks' layers (ffn_model.pipeline.
    uneven_stages): a padding slot's layer runs and its output is dropped, x = where(j < live, layer(x), x), as the
    transformer's stack_forward (its FLOPs and all-to-alls executed: every stage runs Cmax slots in lock-step)."""
    policy = (jax.checkpoint_policies.save_only_these_names(*MOE_SAVED) if remat == Remat.NONE
              else tf.remat_policy(remat, schedule))
    trips = next(iter(ws.values())).shape[0]
    live = None if counts is None else live_slots(counts, schedule.repeats, select)

    def one(x, w):
        return moe_block(x, {n: select(a) for n, a in w.items()}, schedule, spec, kind)[0]

    block = loop_checkpoint(one, policy, trips)
    x = constrain(x_BxTxD, tf.X_AXES)
    if live is None:
        return jax.lax.scan(lambda x, w: (block(x, w), None), x, ws)[0]
    return jax.lax.scan(lambda x, wj: (jnp.where(wj[1] < live, block(x, wj[0]), x), None), x,
                        (ws, jnp.arange(trips)))[0]


def outer_layers(params: dict, x_BxTxD, *, w: Workload):
    """The dense layers first (DeepSeek's three), run before the pipeline and outside it, as MaxText runs them
    (its decoders.py: the stage axis "acts like data parallelism" for them): the transformer's stack_forward over the
    stacks "outer_" + attention's names and dense_in, dense_gate, dense_out [L_dense, ...], the tokens split over
    stage too ("moe_batch_stage": a slice of each device's shard), the output gathered back over stage for the
    pipeline's input (an all-gather; its transpose a reduce-scatter of the input's gradient)."""
    ws = {n[len("outer_"):]: a for n, a in params.items() if n.startswith("outer_")}
    ws |= {n.replace("dense", "w"): a for n, a in params.items() if n.startswith("dense_")}
    with tokens_over("moe_batch_stage"):  # the layers and their output split over stage too, then gathered
        x = tf.stack_forward(constrain(x_BxTxD, tf.X_AXES), ws, w.schedule, w.remat, w.model.base.mlp)
        x = constrain(x, tf.X_AXES)
    return constrain(x, tf.X_AXES)


def pipeline_loss_fn(w: Workload, mesh, for_grad: bool = True):
    """(params, batch) -> loss with the layers run as a pipeline over ``stage``: the transformer's
    (ffn_model.transformer.transformer_pipeline_loss: GPipe, circular, 1F1B; the embedding and the output layer as
    there) with moe_chunk's layers, the dense layers first before it (outer_layers). Built where every layer after
    them is MoE and without the load-balancing loss (a loss term of every layer, which the pipeline's chunks do not
    carry): a ValueError naming what to change otherwise."""
    spec = w.model.moe
    if spec.moe_every != 1:
        raise ValueError(f"pipeline stages are built for an MoE transformer whose every layer after the dense ones "
                         f"first is MoE, not moe_every={spec.moe_every}")
    if spec.aux_loss_weight:
        raise ValueError(f"pipeline stages are built without the load-balancing loss: aux_loss_weight 0, not "
                         f"{spec.aux_loss_weight:g} (--aux-loss-weight 0)")
    chunk = functools.partial(moe_chunk, schedule=w.schedule, remat=w.remat, spec=spec, kind=w.model.base.mlp,
                              counts=uneven_stages(w))
    pre = functools.partial(outer_layers, w=w) if spec.first_dense else None
    return functools.partial(tf.transformer_pipeline_loss, w=w, mesh=mesh, axes=stage_axes(w.model), chunk=chunk,
                             pre=pre)
