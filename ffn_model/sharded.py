"""What every model family's program shares (ffn_model.model, ffn_model.transformer): the logical-axis
constraint, the precision policy's weight gathers (FP32 master shards cast to BF16 *first*, then gathered over
fsdp, so the FSDP all-gather moves BF16 bytes; the custom backward reduce-scatters the BF16 gradient to the shard
and only then casts it to FP32: questions-4d.md, the Scaling Book's training page), ZeRO-1's gradient layout,
sequence parallelism's resharding boundaries and the parameters with their logical axes."""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from mesh.rules import FLAX_RULES, check_logical, logical_to_spec

COMPUTE_DTYPE = jnp.bfloat16
PARAM_DTYPE = jnp.float32


def traced_platform() -> str:
    """The platform the program being traced compiles for: the abstract device of the mesh set with jax.set_mesh
    ("cpu", "gpu", "tpu"), or without one jax's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.abstract_device.platform if not mesh.empty and mesh.abstract_device else jax.default_backend()


def constrain(x, logical_axes):
    """with_sharding_constraint through the logical-axis table, when a mesh is set (jax.set_mesh);
    a no-op without one, so the module also runs unsharded."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes))


def _gathered(logical_axes):
    """The logical axes of a weight slice after the FSDP all-gather: embed (D) unsharded, and a weight whole over
    tensor that is stored split over it (latent_split: MLA's down-projection) gathered over tensor too."""
    return tuple(None if a in ("embed", "latent_split") else a for a in logical_axes)


def to_bf16(w):
    """FP32 -> BF16 rounded to nearest even: the same values as ``w.astype(jnp.bfloat16)`` for
    finite w, rounded with integer ops (through a bitcast) so that only one layer's BF16 weights exist at a
    time; why: docs/findings.md, "BF16 weight casts inside the scan"."""
    u = jax.lax.bitcast_convert_type(w.astype(jnp.float32), jnp.uint32)
    u = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(u, jnp.float32).astype(COMPUTE_DTYPE)


def loop_checkpoint(fn, policy, trips: int):
    """jax.checkpoint(fn, policy) for the body of a layer scan of ``trips`` trips, with prevent_cse off where the scan
    runs more than one trip. prevent_cse (jax's default) wraps the backward's rematerialized layer in an optimization
    barrier over its inputs, the layer's weights sliced out of the FP32 stacks and its saved residuals among them:
    XLA:GPU then materializes each as a device-to-device copy every layer-pass (the llama2-7b shapes, 4 layers, one
    H100: 7 FP32 weight slices a layer-pass, 3.24 GB a step; the XXL-2 FFN's 14.0 GB, and two matmuls a step it
    recomputed); a while loop already keeps the backward's recomputation from being merged with the forward (jax's
    jax.checkpoint docstring: prevent_cse=False is recommended inside scan). A one-trip scan is inlined, where it
    would be merged: there the barrier stays. Why: docs/findings.md, "The layer loop's copies on XLA:GPU (issue 39)"."""
    return jax.checkpoint(fn, policy=policy, prevent_cse=trips < 2)


_ZERO1 = contextvars.ContextVar("zero1_gradients", default=False)


@contextlib.contextmanager
def zero1_gradients(on: bool):
    """While tracing a train step under ZeRO-1 (Schedule.optimizer_sharding): weight gradients are reduced to
    grad_axes' layout."""
    token = _ZERO1.set(bool(on))
    try:
        yield
    finally:
        _ZERO1.reset(token)


def grad_axes(logical_axes):
    """The layout a weight's gradient is reduced to: the weight's own, or under zero1_gradients with D split
    over data·fsdp (the logical axis embed_zero1), so that one reduce-scatter over data·fsdp replaces the
    reduce-scatter over fsdp and the all-reduce over data."""
    return tuple("embed_zero1" if a == "embed" and _ZERO1.get() else a for a in logical_axes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def gather_bf16(w, logical_axes):
    """FP32 weight shard -> BF16, then gathered over fsdp (the all-gather moves BF16)."""
    return constrain(to_bf16(w), _gathered(logical_axes))


def _gather_bf16_fwd(w, logical_axes):
    return gather_bf16(w, logical_axes), None


def _gather_bf16_bwd(logical_axes, _, g):
    # g: BF16 gradient of the gathered weight (partial sums over data·fsdp). Reduce-scatter it to the
    # weight's shard (grad_axes: over data too under ZeRO-1) in BF16, then cast to the FP32 master dtype.
    return (constrain(g, grad_axes(logical_axes)).astype(PARAM_DTYPE),)


gather_bf16.defvjp(_gather_bf16_fwd, _gather_bf16_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def gather_once(w, logical_axes):
    """A whole weight stack gathered over fsdp once (a pipeline stage's weights for every microbatch:
    FSDP gathers once per step): the all-gather moves BF16; the result is FP32 holding BF16 values (the
    loop's gradient for it accumulates in FP32, each block-pass's reduce-scattered first by
    already_gathered). Backward: the accumulated gradient, already in the shard's layout."""
    return constrain(to_bf16(w), _gathered(logical_axes)).astype(PARAM_DTYPE)


def _gather_once_fwd(w, logical_axes):
    return gather_once(w, logical_axes), None


def _gather_once_bwd(logical_axes, _, g):
    return (constrain(g, logical_axes),)


gather_once.defvjp(_gather_once_fwd, _gather_once_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def already_gathered(w, logical_axes):
    """The per-block weight of a stack gathered once (gather_once): its BF16 values, no collective.
    Backward: the block-pass's BF16 gradient reduce-scattered over fsdp to the weight's shard, then FP32,
    so that the loop accumulates sharded FP32 gradients (and every backend reduces the same way)."""
    return w.astype(COMPUTE_DTYPE)


def _already_gathered_fwd(w, logical_axes):
    return already_gathered(w, logical_axes), None


def _already_gathered_bwd(logical_axes, _, g):
    return (constrain(g, logical_axes).astype(PARAM_DTYPE),)


already_gathered.defvjp(_already_gathered_fwd, _already_gathered_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def reshard(x, to_axes, back_axes):
    """x constrained to the logical axes ``to_axes``; its cotangent constrained to ``back_axes``. Sequence
    parallelism's two boundaries (Korthikanti et al. 2022, fig. 5: g and its conjugate g-bar):
    reshard(x, X_AXES, X_SP_AXES) all-gathers the token-split input over tensor, and its backward
    reduce-scatters the input gradient's partial sums straight to the token split;
    reshard(y, X_SP_AXES, X_AXES) reduce-scatters the output's partial sums, and its backward
    all-gathers the gradient. (jax's own transpose of a sharding constraint constrains the cotangent to
    the forward's sharding, which made XLA all-reduce and then slice.)"""
    return constrain(x, to_axes)


def _reshard_fwd(x, to_axes, back_axes):
    return reshard(x, to_axes, back_axes), None


def _reshard_bwd(to_axes, back_axes, _, g):
    return (constrain(g, back_axes),)


reshard.defvjp(_reshard_fwd, _reshard_bwd)


def init_normal(key, shape, fan_in):
    """N(0, 1/fan_in) in FP32: keeps the activation scale through a linear block."""
    return jax.random.normal(key, shape, PARAM_DTYPE) * (fan_in**-0.5)


def param(value, logical_axes):
    """An nnx.Param carrying its logical axes as flax's ``out_sharding`` metadata and the table's
    rules as ``sharding_rules`` (nnx.get_partition_spec / nnx.get_abstract_model turn them into
    PartitionSpecs); an axis the table has no rule for is a ValueError (mesh.rules.check_logical)."""
    return nnx.Param(value, out_sharding=check_logical(logical_axes), sharding_rules=FLAX_RULES)

