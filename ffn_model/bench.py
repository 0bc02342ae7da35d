"""Time the sharded train step: the measurement half of ``python -m ffn_model bench`` (the report, with
the compiled program's FLOPs, MFU and the closed form's prediction beside it, is verify.bench's).

  step time   median over ``steps`` timed steps, each ended by jax.block_until_ready, after ``warmup``
              untimed steps; the step is compiled once, ahead of the clock (jit's lower().compile()),
              and the batch is made before the clock starts
"""

from __future__ import annotations

import statistics
import time

import jax

from ffn_model.train import init_state, make_batch_fn, make_optimizer, make_train_step
from mesh.devices import mesh_shape
from scaling.config import check_seed, non_negative_int, positive_int
from scaling.workload import Workload


def time_train_step(w: Workload, mesh, steps: int = 10, warmup: int = 2, seed: int = 0) -> dict:
    """Time the workload's train step on ``mesh`` (a jax Mesh of w.mesh's shape). Returns
    {"step_seconds" (median), "step_seconds_all", "final_loss", "compiled" (the executable that ran)}.
    ValueError naming any bad input, before anything is created."""
    positive_int("steps", steps)
    non_negative_int("warmup", warmup)
    check_seed("seed", seed)
    if mesh_shape(mesh) != w.mesh:
        raise ValueError(f"the workload's mesh is {w.mesh}, the devices' mesh {mesh_shape(mesh)}")
    cfg, batch_tokens, remat, schedule = w.model, w.batch_tokens, w.remat, w.schedule
    tx = make_optimizer()
    state = init_state(cfg, mesh, seed, tx, schedule.optimizer_sharding)
    batch_fn = make_batch_fn(cfg, mesh, batch_tokens, seed)
    times = []
    with jax.set_mesh(mesh):
        lowered = make_train_step(cfg, mesh, remat, tx, schedule).lower(state, batch_fn(0))
        compiled = lowered.compile(compiler_options=w.flags.options(mesh.devices.flat[0].platform) or None)
        for i in range(warmup + steps):
            batch = jax.block_until_ready(batch_fn(i))
            t0 = time.perf_counter()
            state, loss = jax.block_until_ready(compiled(state, batch))
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return {"step_seconds": statistics.median(times), "step_seconds_all": times, "final_loss": float(loss),
            "compiled": compiled}
