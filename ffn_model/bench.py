"""Benchmark the sharded train step: measured step time, achieved FLOP/s and MFU beside the closed
form's predicted step time.

  step time     median over ``steps`` timed steps, each ended by jax.block_until_ready, after
                ``warmup`` untimed steps (the first compiles); the batch is made before the clock starts
  FLOPs         matmul FLOPs per step from the closed form (scaling.flops.step_flops):
                model    = 6·P·B − 2·B·D·F (forward, weight and input gradients; block 0 needs no dx)
                executed = model + remat recompute + block 0's dead dx where the scan computes it
  TFLOP/s       executed FLOPs / step time, over all N devices (and per device: / N)
  MFU           model FLOPs / (step time · N · C); HFU the same with executed FLOPs. C is the chip's
                peak dense bf16 FLOP/s (scaling.hardware), None where the chip is unknown (CPU)
  predicted     scaling.program.predict on the same mesh: T_math = executed FLOPs/(N·C), T_comms per
                mesh axis over ICI, step time in the sum form (T_math + Σ T_axis, no overlap) and the
                max form (max(T_math, T_axis...), full overlap); the measurement should lie between
                them when the closed form models the program
"""

from __future__ import annotations

import statistics
import time

from scaling import flops as flops_lib
from scaling.config import FFNConfig, check_divisible, check_remat, non_negative_int, positive_int
from scaling.hardware import CHIPS, Chip

# device_kind substrings (lower case) -> chip name in scaling.hardware.CHIPS, first match wins.
# jax reports e.g. "NVIDIA H100 80GB HBM3", "TPU v5p", "TPU v5 lite" (v5e), "TPU v6 lite" (v6e), "TPU v4".
DEVICE_KINDS = (("h100", "H100"), ("h200", "H200"), ("b200", "B200"), ("v5p", "v5p"), ("v5 lite", "v5e"),
                ("v5e", "v5e"), ("v6 lite", "v6e"), ("v6e", "v6e"), ("v4", "v4p"))


def infer_chip(device) -> Chip | None:
    """The hardware-table chip of a jax device, from its ``device_kind``: None on CPU (no peak
    FLOP/s to compare with); ValueError for an accelerator the table does not know (pass --chip)."""
    if device.platform == "cpu":
        return None
    kind = str(device.device_kind).lower()
    for key, name in DEVICE_KINDS:
        if key in kind:
            return CHIPS[name]
    raise ValueError(f"cannot tell the chip from device kind {device.device_kind!r}; pass --chip "
                     f"(one of {', '.join(CHIPS)})")


def step_flop_counts(cfg: FFNConfig, batch_tokens: int, remat: str = "none") -> dict[str, float]:
    """{"model", "executed"}: global matmul FLOPs of one train step (see the module docstring)."""
    f = flops_lib.step_flops(cfg, batch_tokens, "train", remat,
                             first_block_input_grad=flops_lib.first_block_dx_computed(cfg.blocks, remat))
    return {"model": f["total"] - f["recompute"] - f["first_block_input_grad"], "executed": f["total"]}


def bench(cfg: FFNConfig, mesh, batch_tokens: int, steps: int = 10, warmup: int = 2, remat: str = "none",
          chip: Chip | None = None, seed: int = 0) -> dict:
    """Time the train step of ``cfg`` on ``mesh`` with a global batch of ``batch_tokens`` tokens and
    report it against ``chip`` (None: no MFU and no prediction). Returns a dict with step_seconds
    (median), step_seconds_all, flops, tflops_per_s (all devices), tflops_per_s_per_device, mfu, hfu
    and predicted (scaling.program.predict's times, or None)."""
    import jax

    from ffn_model.train import init_state, make_batch_fn, make_optimizer, make_train_step
    from mesh.devices import mesh_shape
    from scaling import program
    from scaling.check import ici_layout

    positive_int("steps", steps)
    non_negative_int("warmup", warmup)
    non_negative_int("seed", seed)
    check_remat(remat)
    shape = mesh_shape(mesh)
    check_divisible(cfg, shape, batch_tokens)
    tx = make_optimizer()
    state = init_state(cfg, mesh, seed, tx)
    step_fn = make_train_step(cfg, mesh, remat, tx)
    batch_fn = make_batch_fn(cfg, mesh, batch_tokens, seed)
    times = []
    for i in range(warmup + steps):
        batch = jax.block_until_ready(batch_fn(i))
        t0 = time.perf_counter()
        state, loss = jax.block_until_ready(step_fn(state, batch))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    n = shape.devices
    f = step_flop_counts(cfg, batch_tokens, remat)
    rep = {"step_seconds": t, "step_seconds_all": times, "flops": f, "tflops_per_s": f["executed"] / t / 1e12,
           "tflops_per_s_per_device": f["executed"] / t / n / 1e12, "chip": None, "peak_flops_per_device": None,
           "mfu": None, "hfu": None, "predicted": None, "final_loss": float(loss)}
    if chip is not None:
        pred = program.predict(cfg, shape, batch_tokens, remat, "train", chip, ici_layout(mesh, chip))
        rep.update(chip=chip.name, peak_flops_per_device=chip.bf16_flops,
                   mfu=f["model"] / (t * n * chip.bf16_flops), hfu=f["executed"] / (t * n * chip.bf16_flops),
                   predicted=pred["times"])
    return rep
