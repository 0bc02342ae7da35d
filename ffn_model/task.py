"""The synthetic regression task the families share, and the sharded token mean every loss reduces with.

Data: x ~ N(0, 1) (BF16) and targets y = x·T/sqrt(D) (FP32) for a fixed teacher T ~ N(0, 1) [D,D], which the
linear FFN stack (and a transformer without a vocabulary) can learn; batch ``step`` of seed ``s`` is the same
on every mesh (partitionable threefry): a function of (seed, step) only, so a resumed run sees the batches an
uninterrupted one would.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ffn_model.sharded import COMPUTE_DTYPE
from mesh.rules import logical_to_spec


def teacher_batch(shape: tuple, d_model: int, seed: int = 0):
    """step -> {"x": x BF16, "y": x·T/sqrt(D) FP32} of ``shape`` (its last dimension D = ``d_model``), the
    teacher T ~ N(0, 1) [D, D] drawn from ``seed`` and x from (seed, step) (module docstring). Not jitted."""
    D = d_model

    def batch(step):
        k_teacher, k_data = jax.random.split(jax.random.key(seed))
        teacher = jax.random.normal(k_teacher, (D, D), jnp.float32)
        x = jax.random.normal(jax.random.fold_in(k_data, step), shape, jnp.float32).astype(COMPUTE_DTYPE)
        y = jnp.dot(x.astype(jnp.float32), teacher, precision="highest") * D**-0.5
        return {"x": x, "y": y}

    return batch


def token_mean(local_sum, arrays, logical_axes):
    """Σ local_sum(device's shards of ``arrays``) over the mesh / the element count of ``arrays[0]``: every
    device sums its own tokens' terms and one psum over the mesh axes that split the tokens adds them
    (inside a shard_map, so that the loss is one all-reduce of 4 bytes over those axes together on every
    backend; left to XLA it reduced over the sequence and the batch separately on CPU and together on TPU)."""
    mesh = jax.sharding.get_abstract_mesh()
    count = float(math.prod(arrays[0].shape))  # a Python float: 2**32 elements and more overflow an int32 weak type
    if mesh.empty:
        return local_sum(*arrays) / count
    spec = logical_to_spec(logical_axes)
    split = tuple(a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry))

    def local(*a):
        s = local_sum(*a)
        return (jax.lax.psum(s, split) if split else s) / count

    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * len(arrays), out_specs=PartitionSpec(),
                         axis_names=set(mesh.axis_names) - set(mesh.manual_axes))(*arrays)


def mse(pred, y, logical_axes):
    """Mean squared error in FP32 of the BF16 output ``pred`` (laid out on ``logical_axes``) against the FP32
    targets (token_mean)."""
    return token_mean(lambda p, t: jnp.sum(jnp.square(p.astype(jnp.float32) - t)), (pred, y), logical_axes)
