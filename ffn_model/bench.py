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

from ffn_model.train import check_mesh, init_state, make_batch_fn, make_optimizer, make_train_step
from scaling.core.inputs import check_seed, non_negative_int, positive_int
from scaling.core.workload import Workload


def time_train_step(w: Workload, mesh, steps: int = 10, warmup: int = 2, seed: int = 0) -> dict:
    """Time the workload's train step on ``mesh`` (a jax Mesh of w.mesh's shape). Returns
    {"step_seconds" (median), "step_seconds_all", "final_loss", "compiled" (the executable that ran)}.
    ValueError naming any bad input, before anything is created."""
    positive_int("steps", steps)
    non_negative_int("warmup", warmup)
    check_seed("seed", seed)
    check_mesh(w, mesh)
    tx = make_optimizer()
    state = init_state(w, mesh, seed, tx)
    batch_fn = make_batch_fn(w, mesh, seed)
    times = []
    with jax.set_mesh(mesh):  # compiled under the workload's XLA flags (make_train_step)
        compiled = make_train_step(w, mesh, tx).lower(state, batch_fn(0)).compile()
        for i in range(warmup + steps):
            batch = jax.block_until_ready(batch_fn(i))
            t0 = time.perf_counter()
            state, loss = jax.block_until_ready(compiled(state, batch))
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return {"step_seconds": statistics.median(times), "step_seconds_all": times, "final_loss": float(loss),
            "compiled": compiled}
