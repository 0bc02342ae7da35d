"""The logical-axis table (scaling.core.sharding, plain data) in the forms jax and flax take.

``logical_to_spec`` gives the PartitionSpec of a tuple of logical axis names (activations:
with_sharding_constraint); ``FLAX_RULES`` are the same rules as flax's ``sharding_rules`` metadata,
which ``nnx.get_partition_spec`` / ``nnx.get_abstract_model`` apply to the parameters' logical
``out_sharding``. Flax passes a name it has no rule for through unchanged; ``check_logical`` keeps the
table strict (an axis without a rule is an error), and the model calls it for every parameter.
"""

from __future__ import annotations

import contextlib
import contextvars

from scaling.core.sharding import H_AXES, LOGICAL_RULES, W_IN_AXES, W_OUT_AXES, X_AXES, mesh_axes  # noqa: F401

def _spec_entry(axes: tuple[str, ...] | None):
    """A PartitionSpec entry: None (replicated), one axis name, or a tuple of them."""
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


FLAX_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = tuple(
    (name, _spec_entry(axes)) for name, axes in LOGICAL_RULES.items())


def check_logical(logical: tuple[str | None, ...]) -> tuple[str | None, ...]:
    """``logical`` unchanged if every name has a rule (ValueError naming the axis otherwise)."""
    mesh_axes(logical)
    return tuple(logical)


# Mesh axes a jax.vmap(spmd_axis_name=...) is mapping over while the model is traced (ZeRO-1's data shards,
# ffn_model.zero1.data_partials): left out of the specs as manual axes are, vmap adds them to the mapped dimension.
VMAPPED_AXES = contextvars.ContextVar("vmapped_axes", default=frozenset())


# The logical axis a model family's tokens take where its program says "batch" (ModelFamily.batch_axis): "batch"
# (data, fsdp), or an MoE model's "moe_batch" (data, fsdp, expert: outside the experts the expert axis splits the
# tokens as data does), set while its step is traced (tokens_over).
BATCH_AXIS = contextvars.ContextVar("batch_axis", default="batch")


@contextlib.contextmanager
def tokens_over(logical: str):
    """While tracing a family's program: its "batch" is the table's ``logical`` (BATCH_AXIS)."""
    token = BATCH_AXIS.set(logical)
    try:
        yield
    finally:
        BATCH_AXIS.reset(token)


def logical_to_spec(logical: tuple[str | None, ...]):
    """jax.sharding.PartitionSpec for a tuple of logical axis names, through the table ("batch" read as the traced
    family's BATCH_AXIS); inside jax.shard_map the mesh axes it is manual over are left out (each device sees its
    own block of them)."""
    import jax
    from jax.sharding import PartitionSpec

    batch = BATCH_AXIS.get()
    if batch != "batch":  # the family's batch, and its part within a data shard (batch_fsdp: "<batch>_fsdp")
        logical = tuple(batch if a == "batch" else f"{batch}_fsdp" if a == "batch_fsdp" else a for a in logical)
    manual = set(jax.sharding.get_abstract_mesh().manual_axes) | VMAPPED_AXES.get()
    return PartitionSpec(*(_spec_entry(tuple(m for m in a if m not in manual) if a else a)
                           for a in mesh_axes(logical)))
