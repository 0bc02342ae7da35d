"""ZeRO-1 as a distributed optimizer (Schedule.optimizer_sharding "zero1"): Megatron-LM's distributed optimizer and
DeepSpeed's ZeRO stage 1 on a jax mesh, on any data size and every schedule.

Each device's gradients are its data shard's partial sums (data_partials: one data shard's program, jax.vmap'ed over
the data shards with spmd_axis_name "data", so that nothing is reduced over data inside the step while fsdp, tensor
and stage run as they do without ZeRO-1). The optimizer then works on one flat buffer per device (flat_update, in a
jax.shard_map manual over every axis): the device's own shards of every parameter (its fsdp, tensor and stage
pieces) laid end to end in the order of jax.tree.leaves, N elements, padded at the end to N_pad, a multiple of
128·data (scaling.step.memory.zero1_padded: how that follows Megatron-LM's and DeepSpeed's padding), and split evenly
over the data ranks: rank r owns elements [r·N_pad/data, (r + 1)·N_pad/data).

  1. the BF16 gradient buffer reduce-scattered over data (psum_scatter): rank r receives its slice summed;
  2. AdamW (the step's optax ``tx``) on the slice in FP32, with the slice's FP32 moments (mu, nu, kept between steps
     as one flat array of N_pad/data elements per device);
  3. the updated FP32 slice all-gathered over data and laid back into the parameters' shards.

No model dimension has to divide by data. This package's FP32 master weights are the parameters the forward reads:
they stay as they are without ZeRO-1 (sharded over fsdp·tensor·stage, replicated over data), so step 3 gathers FP32
(Megatron-LM keeps BF16 model weights beside sharded FP32 masters and gathers BF16; here the masters are the model
weights). The gradients are ZeRO stage 1's, not stage 2's: each device holds its data shard's full FP32 partial
gradient of its parameter shards until the reduce-scatter. A checkpoint's optimizer state is the flat buffer of its
mesh: it restores onto a mesh with the same flat layout only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from ffn_model.sharded import COMPUTE_DTYPE
from mesh.rules import VMAPPED_AXES
from scaling.step.memory import ZERO1_ROW, zero1_padded
from scaling.core.workload import Workload

P = PartitionSpec


def _spec_axes(spec: PartitionSpec) -> set:
    return {a for e in spec if e for a in ((e,) if isinstance(e, str) else e)}


def flat_axes(mesh, pshard) -> tuple[str, ...]:
    """The mesh axes over which the devices' flat buffers differ: data (each rank its slice) and every axis some
    parameter is split over; over the others (e.g. context) the buffers are copies."""
    used = set().union(*(_spec_axes(s.spec) for s in jax.tree.leaves(pshard))) | {"data"}
    return tuple(a for a in mesh.axis_names if a in used)


def local_sizes(params, pshard) -> list[int]:
    """Elements of each parameter's shard on one device, in jax.tree.leaves order."""
    return [math.prod(s.shard_shape(p.shape)) for p, s in zip(jax.tree.leaves(params), jax.tree.leaves(pshard))]


def slice_len(mesh, params, pshard) -> int:
    """N_pad / data: the elements of the flat buffer one device owns (N = Σ local_sizes; zero1_padded)."""
    d = mesh.shape["data"]
    return zero1_padded(sum(local_sizes(params, pshard)), d) // d


def opt_layout(tx, mesh, params, pshard):
    """(abstract optimizer state, its shardings) under ZeRO-1: ``tx`` initialised on {"flat": [G·N_pad/data]} FP32,
    G the product of flat_axes' sizes, split over flat_axes (each device its slice); scalars (the step count)
    replicated."""
    axes = flat_axes(mesh, pshard)
    n = slice_len(mesh, params, pshard) * math.prod(mesh.shape[a] for a in axes)
    flat = {"flat": jax.ShapeDtypeStruct((n,), jnp.float32)}
    opt = jax.eval_shape(tx.init, flat)
    spec = NamedSharding(mesh, P(axes))
    oshard = optax.tree_map_params(tx, lambda _, s: s, opt, {"flat": spec},
                                   transform_non_params=lambda _: NamedSharding(mesh, P()))
    return opt, oshard


def data_shard_workload(w: Workload) -> Workload:
    """The program one data rank runs inside data_partials: ``w`` on its mesh with data = 1, B/data tokens, the
    optimizer sharding fsdp (its loss, gradients and pipeline are the data=1 program's)."""
    d = w.mesh["data"]
    return w.replace(mesh={**w.mesh, "data": 1}, batch_tokens=w.batch_tokens // d,
                     schedule=dataclasses.replace(w.schedule, optimizer_sharding="fsdp"))


def data_partials(make, mesh, pipelined: bool):
    """(params, batch) -> (loss, grads [data, *shape] FP32): each data shard's loss and partial gradients, unreduced
    over data and scaled by 1/data (so that they sum to the gradient of the batch mean), the loss their mean.
    ``make(mesh)`` builds one data shard's (params, batch) -> (loss, grads) (data_shard_workload's program). Without
    stages it is jax.vmap'ed over the batch split [data, B/data, ...] with spmd_axis_name "data" (the model's specs
    leave data out, mesh.rules.VMAPPED_AXES), so fsdp and tensor run as without ZeRO-1; a pipeline (its own
    shard_map over stage does not batch under that vmap) runs in a jax.shard_map manual over data, built on the
    abstract mesh there, whose fsdp reductions XLA makes all-reduces (docs/findings.md)."""
    d = mesh.shape["data"]
    if pipelined:
        def local(params, batch):
            loss, grads = make(jax.sharding.get_abstract_mesh())(params, batch)
            return jax.lax.psum(loss / d, "data"), jax.tree.map(lambda g: (g / d)[None], grads)

        def manual(params, batch):
            specs = jax.tree.map(lambda _: P(), params)
            return jax.shard_map(local, mesh=mesh, in_specs=(specs, {k: P("data") for k in batch}),
                                 out_specs=(P(), P("data")), axis_names={"data"}, check_vma=False)(params, batch)

        return manual
    loss_and_grad = make(mesh)

    def run(params, batch):
        split = {k: v.reshape(d, v.shape[0] // d, *v.shape[1:]) for k, v in batch.items()}
        token = VMAPPED_AXES.set(frozenset({"data"}))
        try:
            loss, grads = jax.vmap(lambda b: loss_and_grad(params, b), spmd_axis_name="data")(split)
        finally:
            VMAPPED_AXES.reset(token)
        return jnp.mean(loss), jax.tree.map(lambda g: g / d, grads)

    return run


def flat_update(tx, mesh, pshard, oshard):
    """(params, grads [data, ...], opt) -> (params, opt): steps 1-3 of the module docstring, manual over every mesh
    axis. On rank r, with k = N_pad/data: g = RS_data(BF16 flat grads)[r·k:(r+1)·k] in FP32, p = flat weights[r·k:
    (r+1)·k], p' = p + AdamW(g, mu, nu, p), weights = AG_data(p') (Megatron-LM's distributed optimizer; Rajbhandari
    et al. 2020, ZeRO stage 1)."""
    d = mesh.shape["data"]

    def local(params, grads, opt):
        leaves, tree = jax.tree.flatten(params)
        sizes = [p.size for p in leaves]
        n = sum(sizes)
        pad = zero1_padded(n, d) - n
        k = (n + pad) // d
        g = jnp.concatenate([a.reshape(-1).astype(COMPUTE_DTYPE) for a in jax.tree.leaves(grads)]
                            + [jnp.zeros((pad,), COMPUTE_DTYPE)])
        # [rows, 128]: each rank's slice whole rows (scaling.step.memory.zero1_padded)
        g = jax.lax.psum_scatter(g.reshape(-1, ZERO1_ROW), "data", scatter_dimension=0, tiled=True)
        g = g.reshape(-1).astype(jnp.float32)
        r = jax.lax.axis_index("data")
        flat = jnp.concatenate([a.reshape(-1) for a in leaves] + [jnp.zeros((pad,), jnp.float32)])
        p = jax.lax.dynamic_slice_in_dim(flat, r * k, k)
        updates, opt = tx.update({"flat": g}, opt, {"flat": p})
        new = jax.lax.all_gather(p + updates["flat"], "data", axis=0, tiled=True)
        offsets = [0, *itertools.accumulate(sizes)]
        out = [new[o:o + s].reshape(a.shape) for o, s, a in zip(offsets, sizes, leaves)]
        return jax.tree.unflatten(tree, out), opt

    pspecs = jax.tree.map(lambda s: s.spec, pshard)
    gspecs = jax.tree.map(lambda s: P("data", *s.spec), pshard)
    ospecs = jax.tree.map(lambda s: s.spec, oshard)
    return jax.shard_map(local, mesh=mesh, in_specs=(pspecs, gspecs, ospecs), out_specs=(pspecs, ospecs),
                         axis_names=set(mesh.axis_names), check_vma=False)
