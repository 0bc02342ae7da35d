"""``check --step decode|prefill``: the serving program's decode step (ffn_model.serve.decode_step) or prefill
(ffn_model.serve.prefill, its attention materialized) compiled for a mesh of data replicas × tensor, from abstract
shapes, read back (verify.hlo.read_compiled), beside scaling.step.serving's closed forms, term by term, per device.
The decode step:

  FLOPs        model.decode_flops(b, T_max) / m (the program attends over the whole cache, masked: context T_max)
  collectives  step_collectives by mesh axis (the package's program reduces FP32 partial sums: reduce_bytes 4)
  arguments    the weights a device holds (weight_bytes: P·2/m in BF16, P·1/m in int8 and its scales; its share of
               every weight, the lookup table's too) and the caches (2·b·T_max·K·H·L·2/m)
  bytes read   the weights a step reads (decode_read_params·2/m) + the caches, beside XLA's "bytes accessed" (its
               cost model's count, read and written, every operand of every op; reported, not banded)
  peak         decode_memory (the arguments and the FP32 logits) beside the compiler's peak, where it reports one
               (XLA:TPU's counts on-chip VMEM too: tens of MB, within 10% from a GB of caches a device up)

The prefill of b prompts of P = T_max tokens: FLOPs prefill_flops(b, P, square) / m (the materialized attention's
whole P×P square; the output layer for each prompt's last token); the collectives of b·P tokens; its arguments the
weights and the prompts' ids; its peak prefill_memory (TPU and GPU: the weights, the caches it makes, one layer's
largest phase; XLA:TPU's two forms both printed).

An MoE model (ffn_model.serve._moe, GShard's capacity form, a group a sequence; shared experts too): the routed
form's FLOPs plus capacity_flops (every slot, the dispatch and combine einsums of a prefill, the routers whole on each
device), the routed form's all-reduces (the slots combined to the tokens before the layer's one); its routers whole
in the arguments (weight_bytes); its prefill's peak prefill_memory's, its experts' phases too.

b = B/data, m = tensor. Works for any device spec mesh.devices takes (cpu:N, tpu:<chip>:<topology>, gpu:<chip>:N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from scaling.core.kinds import Dtype, Platform
from scaling.core.policies import Attention
from scaling.core.schedule import Schedule
from scaling.step.serving import (SERVING_BYTES, Serving, capacity_flops, decode_memory, kv_cache_bytes,
                                  prefill_flops, prefill_memory, step_collectives, weight_bytes)

NO_AXIS = "none"  # verify.hlo.collective_bytes' key of a collective over a group of one device


@dataclass(frozen=True)
class ServingCheck:
    """The closed form beside the compiled decode step or prefill, per device (module docstring): {term: (closed,
    compiled)}."""

    model: str
    step: str  # "decode" or "prefill"
    devices: str
    mesh: dict
    batch: int
    t_max: int
    terms: dict = field(default_factory=dict)
    bytes_accessed: float = 0.0
    bytes_read_closed: float = 0.0
    peak: float | None = None  # the compiler's peak where it reports one (TPU, GPU)
    peak_closed: float = 0.0  # decode: decode_memory (weights, caches, FP32 logits); prefill: prefill_memory
    weights: str = "bf16"
    peak_unfused: float = 0.0  # a TPU prefill's prefill_memory with p·v written out (fused=False)

    def ratio(self, term: str) -> float:
        closed, compiled = self.terms[term]
        return compiled / closed if closed else (1.0 if compiled == 0 else math.inf)

    def to_json(self) -> dict:
        return {"model": self.model, "step": self.step, "devices": self.devices, "mesh": self.mesh, "batch": self.batch,
                "t_max": self.t_max, "terms": {k: {"closed": c, "compiled": p, "ratio": self.ratio(k)}
                                               for k, (c, p) in self.terms.items()},
                "bytes_accessed": self.bytes_accessed, "bytes_read_closed": self.bytes_read_closed, "peak": self.peak,
                "peak_closed": self.peak_closed or None, "weights": self.weights,
                "peak_unfused": self.peak_unfused or None}

    def render(self) -> str:
        mesh = ",".join(f"{a}={n}" for a, n in self.mesh.items() if n > 1) or "1 device"
        what = "cache" if self.step == "decode" else "prompts"
        lines = [f"check --step {self.step}: {self.model}, batch {self.batch}, {what} of {self.t_max} tokens, "
                 f"weights {self.weights}, on {self.devices} ({mesh}); per device, closed form beside the compiled "
                 "program",
                 f"  {'term':<28}{'closed':>18}{'compiled':>18}{'ratio':>9}"]
        for k, (c, p) in self.terms.items():
            lines.append(f"  {k:<28}{c:>18,.0f}{p:>18,.0f}{self.ratio(k):>9.4f}")
        if self.step == "decode":
            lines.append(f"  bytes a step reads (weights + caches): {self.bytes_read_closed / 1e9:.4g} GB closed; "
                         f"XLA's cost model counts {self.bytes_accessed / 1e9:.4g} GB accessed (read and written, "
                         "every op)")
        if self.peak and self.peak_closed:
            named = ("the weights, the caches, the FP32 logits" if self.step == "decode" else
                     "the weights, the caches it makes, a layer's largest phase")
            lines.append(f"  peak {self.peak / 1e9:.4g} GB compiled, {self.peak_closed / 1e9:.4g} GB closed ({named}): "
                         f"{self.peak / self.peak_closed:.4f}"
                         + (f"; XLA:TPU's other form (p·v written out) {self.peak_unfused / 1e9:.4g} GB: "
                            f"{self.peak / self.peak_unfused:.4f}" if self.peak_unfused else "")
                         + ("; XLA:TPU's peak counts on-chip VMEM too (docs/serving.md)"
                            if self.devices.startswith("tpu") else ""))
        return "\n".join(lines)


def _structs(tree_shapes: dict, mesh, axes: dict, weights: str = "bf16"):
    """Abstract weights {name: struct} of ``tree_shapes`` laid out as their logical ``axes``: BF16, or int8 with
    their BF16 scales (ffn_model.serve.quantize's {"q", "scale"}: the output channels, laid out as in the weight)."""
    from ffn_model.serve import scale_dims
    from mesh.rules import logical_to_spec

    def one(shape, dtype, ax):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, logical_to_spec(ax)))

    if weights == Dtype.BF16:
        return {n: one(s, jnp.bfloat16, axes[n]) for n, s in tree_shapes.items()}
    out = {}
    for n, s in tree_shapes.items():
        out[n] = {"q": one(s, jnp.int8, axes[n]),
                  "scale": one(scale_dims(n, s), jnp.bfloat16, scale_dims(n, axes[n]))}
    return out


# the command's inputs, passed through
def check_serving(cfg, devices: str, mesh_spec: str, batch: int, t_max: int, step: str = "decode",
                  weights: str = "bf16") -> ServingCheck:
    """Compile the decode step (or with ``step`` "prefill" the prefill) of ``cfg`` (ffn_model.serve.check_servable)
    for ``batch`` sequences and a cache (prompts) of ``t_max`` tokens on ``mesh_spec`` over ``devices``, its weights
    stored as ``weights`` (ffn_model.serve.WEIGHT_TYPES: int8 with per-channel scales), and set it beside the closed
    forms (module docstring)."""
    from ffn_model import moe, serve
    from ffn_model.transformer import LAYER_AXES, VOCAB_AXES, attention_shapes, layer_names
    from mesh import make_mesh, mesh_shape
    from mesh.devices import get_devices
    from mesh.rules import logical_to_spec
    from verify.hlo import read_compiled

    serve.check_servable(cfg)
    mesh = make_mesh(mesh_spec, get_devices(devices))
    shape = {a: n for a, n in mesh_shape(mesh).items()}
    spec, base = getattr(cfg, "moe", None), getattr(cfg, "base", cfg)  # an MoE model's MoESpec and transformer
    D, F, L = cfg.d_model, cfg.d_ff, cfg.blocks
    # one layer's weights (a stack's shape without L, its logical axes without "layers"), each layer its own arrays
    shapes = {n: s[1:] for n, (s, _) in attention_shapes(base).items()}
    axes = {n: LAYER_AXES[n][1:] for n in shapes}
    mlp = {n: (F, D) for n in ("w_in", "w_gate", "w_out") if n in layer_names(base)}
    dense = _structs(shapes | mlp, mesh, axes | {n: LAYER_AXES[n][1:] for n in mlp}, weights)
    if spec is not None:  # an MoE layer's router [D, E] (whole on every device), experts [E, F_e, D], shared [F_s, D]
        experts = {n: (spec.experts, spec.expert_d_ff, D) for n in mlp}
        shared = {n.replace("w_", "shared_"): (spec.expert_d_ff * spec.shared_experts, D)
                  for n in (mlp if spec.shared_experts else ())}
        routed = (_structs(shapes | experts | shared, mesh, axes | {n: moe.EXPERT_AXES[1:] for n in experts}
                           | {n: moe.SHARED_AXES[1:] for n in shared}, weights)
                  | _structs({"router": (D, spec.experts)}, mesh, {"router": (None, None)}))  # BF16 in every store
    heads = {"embedding": (base.vocab, D)} | ({} if base.tied_embeddings else {"unembedding": (base.vocab, D)})
    cache = (batch, t_max, base.kv_heads, base.head_dim)
    kw = dict(mlp_kind=base.mlp, qk_norm=base.qk_norm, moe_spec=spec)
    with jax.set_mesh(mesh):
        w = {"layers": [dict(routed if spec is not None and spec.is_moe(i) else dense) for i in range(L)],
             **_structs(heads, mesh, {n: VOCAB_AXES for n in heads}, weights)}
        c = [jax.ShapeDtypeStruct(cache, jnp.bfloat16, sharding=NamedSharding(mesh, logical_to_spec(serve.CACHE_AXES)))
             for _ in range(L)]
        if step == "prefill":
            ids = jax.ShapeDtypeStruct((batch, t_max), jnp.int32,
                                       sharding=NamedSharding(mesh, logical_to_spec(("batch", None))))
            sched = Schedule(attention=Attention.MATERIALIZED)
            fn = jax.jit(lambda w, ids: serve.prefill(w, ids, t_max, schedule=sched, **kw))
            compiled = fn.lower(w, ids).compile()
        else:
            ids = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=NamedSharding(mesh, logical_to_spec(("batch",))))
            pos = jax.ShapeDtypeStruct((), jnp.int32)
            fn = jax.jit(lambda w, ck, cv, ids, pos: serve.decode_step(w, ck, cv, ids, pos, **kw),
                         donate_argnums=(1, 2))
            compiled = fn.lower(w, c, c, ids, pos).compile()
    prog = read_compiled(compiled, shape)
    d, m = shape.get("data", 1), shape.get("tensor", 1)
    b = batch // d
    # the program reduces FP32 partial sums (ffn_model.serve._project_out); XLA:CPU widens the lookup's BF16 one
    s = Serving(cfg, _chip_of(devices), {a: n for a, n in shape.items() if n > 1}, batch, t_max, 1, weights,
                reduce_bytes=(4, 4), min_comm_bytes=4 if devices.startswith("cpu") else 0)
    caches = b * kv_cache_bytes(cfg, t_max, "bf16") / m  # k and v (kv_cache_bytes counts both)
    w_bytes = weight_bytes(s)
    got_args = float(prog.memory["argument_bytes"] or 0)
    # an MoE model's capacity form: its slots, dispatch, combine and whole routers
    extra = capacity_flops(cfg, b, t_max if step == "prefill" else 1, m)
    if step == "prefill":
        tokens = b * t_max
        terms = {"matmul FLOPs": (prefill_flops(cfg, b, t_max, square=True) / m + extra, prog.dot_flops),
                 "arguments (weights)": (w_bytes, got_args - 4 * tokens)}
    else:
        tokens = b
        terms = {"matmul FLOPs": (cfg.decode_flops(b, t_max) / m + extra, prog.dot_flops),
                 "arguments (weights+caches)": (w_bytes + caches, got_args - 4 * b - 4)}
    by_axis = prog.collective_bytes["by_axis"]
    for axis in sorted({a for a, *_ in step_collectives(s, tokens)} | set(by_axis) - {NO_AXIS}):
        closed = sum(V * n for a, _, V, n in step_collectives(s, tokens) if a == axis)
        terms[f"collectives {axis}"] = (closed, by_axis.get(axis, 0.0))
    read = cfg.decode_read_params(b) * SERVING_BYTES[weights] / m + caches
    # the prefill's peak modelled on TPU (both of XLA:TPU's forms) and GPU (prefill_memory)
    modelled = step == "prefill" and not devices.startswith("cpu")
    peak = decode_memory(s, t_max) if step == "decode" else prefill_memory(s) if modelled else 0.0
    unfused = prefill_memory(s, fused=False) if modelled and devices.startswith("tpu") else 0.0
    return ServingCheck(str(cfg), step, devices, shape, batch, t_max, terms,
                        float(prog.cost.get("bytes accessed", 0.0)), read, prog.memory.get("peak_bytes"), peak,
                        weights, unfused)


def _chip_of(devices: str):
    """The hardware table's chip of a device spec (the CPU: v5p, whose figures no compared term reads)."""
    from scaling.hardware.chips import get_chip

    kind, _, rest = devices.partition(":")
    return get_chip("v5p") if kind == Platform.CPU else get_chip(rest.split(":")[0])
