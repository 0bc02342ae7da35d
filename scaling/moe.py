"""Mixture of experts (MoE): the MLP of some layers replaced by E experts of which a router picks k per token
(Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2022; Mixtral, Jiang et al. 2024), over
an ``expert`` mesh axis that splits the experts, the tokens dispatched to their experts' devices and combined back
by all-to-all (GShard section 3.2; MaxText's and Megatron-LM's expert parallelism). Pure Python.

MoESpec holds what an MoE model adds to a transformer's dimensions: E experts of d_ff F_e each, top-k routing
(softmax or sigmoid gates, an auxiliary load-balancing loss), a capacity factor (GShard/Switch: each expert takes at
most C = ceil(cf·k·t/E) of a group's t tokens, the rest dropped) or dropless routing (every routed token computed),
optional shared experts that every token runs, and which layers are MoE (every ``moe_every``-th, after
``first_dense`` dense ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scaling.inputs import positive_int

ROUTERS = ("softmax", "sigmoid")  # the gates: softmax over E then top-k (Mixtral renormalises over the k), or sigmoid


@dataclass(frozen=True)
class MoESpec:
    """E = ``experts`` routed experts, each an MLP of the model's kind with d_ff ``expert_d_ff`` (F_e); a router
    [D, E] picks ``top_k`` (k) per token; ``shared_experts`` MLPs of F_e every token runs (DeepSeekMoE); the
    ``capacity_factor`` cf (None: dropless) and ``drop_tokens`` (tokens past capacity dropped; without it a factor
    below 1 is refused); the ``router`` gates; ``aux_loss_weight`` of the load-balancing loss (Switch eq. 4);
    layer l is MoE iff l >= first_dense and (l - first_dense) % moe_every == moe_every - 1."""

    experts: int
    top_k: int
    expert_d_ff: int
    shared_experts: int = 0
    capacity_factor: float | None = None
    drop_tokens: bool = True
    router: str = "softmax"
    aux_loss_weight: float = 0.01
    moe_every: int = 1
    first_dense: int = 0

    def __post_init__(self):
        for name in ("experts", "top_k", "expert_d_ff", "moe_every"):
            positive_int(name, getattr(self, name))
        if self.shared_experts < 0 or self.first_dense < 0:
            raise ValueError("shared_experts and first_dense must be >= 0")
        if self.top_k > self.experts:
            raise ValueError(f"top-k {self.top_k} is more than the {self.experts} experts")
        if self.router not in ROUTERS:
            raise ValueError(f"router {self.router!r}: one of {', '.join(ROUTERS)}")
        cf = self.capacity_factor
        if cf is not None and not cf > 0:
            raise ValueError(f"capacity factor {cf} must be > 0 (or none: dropless)")
        if cf is not None and cf < 1 and not self.drop_tokens:
            raise ValueError(f"capacity factor {cf} below 1 drops tokens: allow dropping, or take a factor >= 1 "
                             "or none (dropless)")

    def is_moe(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) is an MoE layer."""
        return layer >= self.first_dense and (layer - self.first_dense) % self.moe_every == self.moe_every - 1

    def moe_layers(self, blocks: int) -> int:
        """How many of ``blocks`` layers are MoE."""
        return sum(self.is_moe(i) for i in range(blocks))

    def check_mesh(self, mesh: Mapping) -> None:
        """The experts split evenly over the expert axis (a ValueError naming both)."""
        x = mesh.get("expert", 1)
        if self.experts % x:
            raise ValueError(f"{self.experts} experts do not divide over expert={x}")
