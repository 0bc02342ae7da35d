"""The one table of logical-axis -> mesh-axis rules (pure Python; no jax at import time).

Every parameter and activation of ``ffn_model`` names its dimensions with logical axes; this table
says which mesh axes (data, fsdp, tensor) each logical axis is split over:

  batch      -> data + fsdp   tokens of the global batch B, split B/(data·fsdp) per device
  embed      -> fsdp          D of the weights (W_in and W_out, both [L,F,D]): FSDP shards
  mlp        -> tensor        F of the weights and of the hidden h[B,F]: tensor parallel
  layers     -> (replicated)  the stacked-blocks axis L that the scan runs over
  act_embed  -> (replicated)  D of the block input x[B,D], replicated over tensor

A logical axis that is not in the table is an error (ValueError), never a silent replication.
"""

from __future__ import annotations

LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "embed": "fsdp",
    "mlp": "tensor",
    "layers": None,
    "act_embed": None,
}

# Logical axes of each parameter and activation of the FFN stack (shapes in Scaling Book letters).
W_IN_AXES = ("layers", "mlp", "embed")  # W_in [L, F, D]
W_OUT_AXES = ("layers", "mlp", "embed")  # W_out [L, F, D]
X_AXES = ("batch", "act_embed")  # block input x [B, D]
H_AXES = ("batch", "mlp")  # hidden h [B, F]


def mesh_axes(logical: tuple[str | None, ...], rules: dict | None = None) -> tuple:
    """Mesh axes for each logical axis name (None entries stay None: an explicitly unsharded dim).

    ValueError naming the axis when a name has no rule."""
    rules = LOGICAL_RULES if rules is None else rules
    out = []
    for name in logical:
        if name is None:
            out.append(None)
            continue
        if name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {', '.join(rules)}")
        out.append(rules[name])
    used = [a for m in out if m is not None for a in ((m,) if isinstance(m, str) else m)]
    if len(used) != len(set(used)):
        raise ValueError(f"logical axes {logical!r} map the same mesh axis twice: {out!r}")
    return tuple(out)


def logical_to_spec(logical: tuple[str | None, ...], rules: dict | None = None):
    """jax.sharding.PartitionSpec for a tuple of logical axis names, through LOGICAL_RULES."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(*mesh_axes(logical, rules))
