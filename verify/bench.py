"""The benchmark report: a measured step time beside what the compiled program executes and what the
closed form predicts (``jax-scaling bench``, or ``python -m ffn_model bench``).

  step time     ffn_model.bench.time_train_step: median of ``steps`` timed steps after ``warmup``
  FLOPs         executed = the compiled program's own matmul FLOPs per device (verify.hlo: dot FLOPs x
                loop trips, the remat recompute and block 0's dead dx included), times N;
                model = the matmuls the step needs, 6·P·B − 2·B·D·F (scaling.step.program.predict)
  TFLOP/s       executed FLOPs / step time, over all N devices (and per device: / N)
  MFU           model FLOPs / (step time · N · C); HFU the same with executed FLOPs. C is the device's
                peak dense bf16 FLOP/s (scaling.hardware.chips), None where the chip is unknown (CPU)
  predicted     scaling.step.program.predict on the same mesh and ICI layout (mesh.ici_layout): the sum form
                (T_math + Σ T_axis) and the max form (max(T_math, T_axis..., T_hbm)); a measurement
                should lie at or above the max form
"""

from __future__ import annotations

from ffn_model.bench import time_train_step
from mesh import ici_layout, mesh_shape
from scaling.step import program
from scaling.core.workload import Workload
from scaling.hardware.chips import Chip
from verify.hlo import read_compiled


def bench(w: Workload, mesh, steps: int = 10, warmup: int = 2, chip: Chip | None = None, seed: int = 0) -> dict:
    """Time the workload's train step on ``mesh`` and report it against ``chip`` (None: no MFU and no
    prediction). Returns
    step_seconds (median), step_seconds_all, flops {model, executed} (global), tflops_per_s (all
    devices), tflops_per_s_per_device, mfu, hfu, predicted (predict's times) and final_loss."""
    timing = time_train_step(w, mesh, steps, warmup, seed)
    shape = mesh_shape(mesh)
    n = shape.devices
    executed = read_compiled(timing["compiled"], dict(shape)).dot_flops * n
    pred = program.predict(w, chip, ici_layout(mesh, chip) if chip else None)
    model = pred.flops["model"] * n
    t = timing["step_seconds"]
    rep = {"step_seconds": t, "step_seconds_all": timing["step_seconds_all"],
           "flops": {"model": model, "executed": executed}, "tflops_per_s": executed / t / 1e12,
           "tflops_per_s_per_device": executed / t / n / 1e12, "chip": None, "peak_flops_per_device": None,
           "mfu": None, "hfu": None, "predicted": None, "final_loss": timing["final_loss"]}
    if chip is not None:
        peak = chip.device_flops
        times = pred.times
        rep.update(chip=chip.name, peak_flops_per_device=peak, mfu=model / (t * n * peak),
                   hfu=executed / (t * n * peak),
                   predicted={"math": times.math, "comms": times.comms, "hbm": times.hbm, "step_sum": times.step["sum"],
                              "step_max": times.step["max"], "bound": times.bound})
    return rep
