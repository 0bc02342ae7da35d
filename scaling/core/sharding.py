"""The one table of logical-axis -> mesh-axis rules, as plain data (no jax).

Every parameter and activation of the model names its dimensions with logical axes; this table says
which mesh axes each logical axis is split over. The model (through mesh.rules, which turns it into
jax PartitionSpecs and flax logical-axis rules) and the closed forms (which count shards with
:func:`shards`) read the same table, so a new mesh axis is a new entry here and its collective terms.

  batch      -> data, fsdp    tokens of the global batch B, split B/(data·fsdp) per device
  embed      -> fsdp          D of the weights: FSDP shards
  mlp        -> tensor        F of the weights and of the hidden h[B,F]: tensor parallel
  layers     -> stage         the stacked-blocks axis L: pipeline stage s holds blocks s·L/S..(s+1)·L/S-1
  stages     -> stage         the stage axis of a pipeline's activations (one microbatch per stage)
  act_embed  -> (replicated)  D of the block input x[B,D], replicated over tensor
  batch_sp   -> data, fsdp, tensor   the FFN's tokens between blocks under sequence parallelism (Megatron
                              SP: the block input split over tensor along the tokens)
  seq        -> context       a transformer's sequence axis T (context parallelism)
  seq_sp     -> context, tensor      T between layers under sequence parallelism
  heads      -> tensor        attention query heads N (and the projections' head axis)
  kv_heads   -> tensor        key/value heads K (grouped-query attention)
  head_dim   -> (replicated)  H, the head dimension
  tensor_split -> tensor      a dimension of size Y made to hold the tensor split (the fused q, k, v weights)
  vocab      -> tensor        the vocabulary V of the embeddings and of the logits (vocab-parallel, Megatron)
  embed_zero1 -> data, fsdp   D of the gradients and Adam moments under ZeRO-1 (Schedule.optimizer_sharding)
  latent     -> (replicated)  MLA's latent rank: the latents and the down-projection's rows
  latent_fsdp -> fsdp         MLA's latent rank in the up-projections: their FSDP shards

A logical axis that is not in the table is an error (ValueError), never a silent replication.
"""

from __future__ import annotations

from collections.abc import Mapping

LOGICAL_RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "mlp": ("tensor",),
    "layers": ("stage",),
    "stages": ("stage",),
    "act_embed": (),
    "batch_sp": ("data", "fsdp", "tensor"),
    "seq": ("context",),
    "seq_sp": ("context", "tensor"),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "tensor_split": ("tensor",),
    "vocab": ("tensor",),
    "embed_zero1": ("fsdp", "data"),
    "data_shards": ("data",),  # the batch split as [data, B/data] (1F1B's loop, manual over data): its two parts
    "batch_fsdp": ("fsdp",),
    # an MoE model's (scaling.families.moe, ffn_model.moe): its tokens split over expert too (expert parallelism splits
    # the batch outside the experts, as data does), and the experts E over expert
    "moe_batch": ("data", "fsdp", "expert"),
    "moe_batch_fsdp": ("fsdp", "expert"),  # its batch_fsdp: a data shard's part of the tokens (1F1B's loop)
    # the layers a pipeline runs outside its stages (an MoE model's dense layers first, ffn_model.moe.outer_layers):
    # the stage axis a data axis for them, minor, so that each stage's tokens are a slice of its whole-batch shard
    "moe_batch_stage": ("data", "fsdp", "expert", "stage"),
    # the MoE layer's tokens (and its routing groups), context-major [C·B·T/C] (ffn_model.moe.moe_layer): the
    # sequence's split over context and the batch's, expert minor so that the dispatch trades it alone
    "moe_tokens": ("context", "data", "fsdp", "expert"),
    "exp": ("expert",),
    # multi-head latent attention's rank r (ffn_model.transformer.mla_projection): the latents and the down-projection's
    # rows whole (replicated over tensor, as Megatron's MLA duplicates them), the up-projections' r over fsdp
    "latent": (),
    "latent_split": ("tensor",),
    "expert_groups": ("context", "data", "fsdp"),  # the token groups once E goes over expert (their split over expert
    # traded)
}

# Logical axes of each parameter and activation of the FFN stack (shapes in Scaling Book letters).
# W_in is stored transposed, [L, F, D] like W_out, so that D (the FSDP-sharded dimension) is minor in
# both: ffn_model.model.FFNStack says why.
W_IN_AXES = ("layers", "mlp", "embed")  # W_in [L, F, D]
W_OUT_AXES = ("layers", "mlp", "embed")  # W_out [L, F, D]
X_AXES = ("batch", "act_embed")  # block input x [B, D]
X_SP_AXES = ("batch_sp", "act_embed")  # block input x [B, D] between blocks under sequence parallelism
H_AXES = ("batch", "mlp")  # hidden h [B, F]


def mesh_axes(logical: tuple[str | None, ...], rules: Mapping | None = None) -> tuple:
    """Mesh axes for each logical axis name: a tuple of axis names, or None for a replicated
    dimension (an explicit None entry stays None). ValueError naming the axis when a name has no rule,
    or when two logical axes would use the same mesh axis."""
    rules = LOGICAL_RULES if rules is None else rules
    out = []
    for name in logical:
        if name is None:
            out.append(None)
            continue
        if name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {', '.join(rules)}")
        out.append(tuple(rules[name]) or None)
    used = [a for m in out if m is not None for a in m]
    if len(used) != len(set(used)):
        raise ValueError(f"logical axes {logical!r} map the same mesh axis twice: {out!r}")
    return tuple(out)


def shards(mesh: Mapping, *logical: str):
    """How many pieces the logical axes are split into on ``mesh`` (a mapping of mesh-axis sizes, ints
    or numpy arrays): the product of the sizes of the mesh axes their rules name (an axis missing from
    ``mesh`` has size 1). shards(mesh, "batch") = data·fsdp; shards(mesh, "embed", "mlp") = fsdp·tensor."""
    n = 1
    for name in logical:
        axes = LOGICAL_RULES.get(name)
        if axes is None:
            mesh_axes((name,))  # its ValueError
        for a in axes:
            n = n * mesh.get(a, 1)
    return n
