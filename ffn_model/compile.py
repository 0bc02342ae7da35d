"""Abstract compile: lower and compile the train step (or the forward-only step) from
ShapeDtypeStructs carrying NamedShardings, allocating nothing, for any mesh (real devices, emulated
CPU devices, or a TPU topology compiled ahead of time from a CPU machine)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ffn_model.train import batch_structs, make_forward_step, make_train_step, state_shardings
from mesh.devices import mesh_shape
from scaling.config import FFNConfig, check_divisible, check_remat

STEPS = ("train", "forward")


@dataclass
class CompileResult:
    """One compiled step. ``memory`` is per device, in bytes: argument_bytes, output_bytes,
    alias_bytes, temp_bytes and peak_bytes (None where the backend reports no peak, e.g. CPU);
    ``cost`` is XLA's cost_analysis (a scan body is counted once, not per trip)."""

    compiled: object
    lowered: object
    compile_seconds: float
    memory: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)


def memory_dict(compiled) -> dict:
    """compiled.memory_analysis() as {argument,output,alias,temp,peak}_bytes (peak None if absent or 0)."""
    ma = compiled.memory_analysis()
    get = lambda name: getattr(ma, name, None)  # noqa: E731
    peak = get("peak_memory_in_bytes")
    return {"argument_bytes": get("argument_size_in_bytes"), "output_bytes": get("output_size_in_bytes"),
            "alias_bytes": get("alias_size_in_bytes"), "temp_bytes": get("temp_size_in_bytes"),
            "peak_bytes": peak if peak else None}


def cost_dict(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    return {k: float(v) for k, v in (cost or {}).items()}


def abstract_compile(cfg: FFNConfig, mesh, batch_tokens: int, remat: str = "none", step: str = "train") -> CompileResult:
    """Lower and compile ``step`` ("train": state + batch -> state, loss; "forward": params + batch
    -> loss) for ``cfg`` on ``mesh`` with a global batch of ``batch_tokens`` tokens.

    compile_seconds covers tracing, lowering and compiling. ValueError for an unknown step or remat
    policy, or a dimension not divisible by its shard count."""
    check_remat(remat)
    if step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
    check_divisible(cfg, mesh_shape(mesh), batch_tokens)
    t0 = time.perf_counter()
    abstract, _ = state_shardings(cfg, mesh)
    batch = batch_structs(cfg, mesh, batch_tokens)
    if step == "train":
        lowered = make_train_step(cfg, mesh, remat).lower(abstract, batch)
    else:
        lowered = make_forward_step(cfg, mesh, remat).lower(abstract["params"], batch)
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    return CompileResult(compiled, lowered, seconds, memory_dict(compiled), cost_dict(compiled))
