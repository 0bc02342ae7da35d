"""The train state's shardings for any NNX module: its parameters' from their logical axes, Adam's moments beside
them (ZeRO-1's flat layout where asked, ffn_model.zero1). ffn_model.train builds a Workload's with it, ffn_model.moe its
MoE stack's."""

from __future__ import annotations

import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ffn_model import zero1


def module_state_shardings(model_fn, mesh, tx, zero1_layout: bool = False):
    """(abstract state with shardings, state shardings) of {"params", "opt"} for the module ``model_fn()`` builds:
    ShapeDtypeStructs carrying NamedShardings for every leaf. The parameters' come from their logical axes through
    flax (nnx.get_abstract_model on ``mesh``); Adam's mu and nu follow their parameter (split over data too under
    ZeRO-1: a flat buffer split over data, ffn_model.zero1.opt_layout), the step count is replicated."""
    _, abs_state = nnx.get_abstract_model(model_fn, mesh)
    params = nnx.to_pure_dict(nnx.state(abs_state, nnx.Param))
    opt = jax.eval_shape(tx.init, params)
    pshard = jax.tree.map(lambda a: a.sharding, params)
    if zero1_layout:  # ZeRO-1: one flat buffer per device, its slice (ffn_model.zero1.opt_layout)
        opt, oshard = zero1.opt_layout(tx, mesh, params, pshard)
    else:
        oshard = optax.tree_map_params(tx, lambda _, s: s, opt, pshard,
                                       transform_non_params=lambda _: NamedSharding(mesh, PartitionSpec()))
    shardings = {"params": pshard, "opt": oshard}
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            {"params": params, "opt": opt}, shardings)
    return abstract, shardings
