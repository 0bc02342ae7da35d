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
from scaling.config import FFNConfig, Schedule, check_divisible, check_remat, check_seed, non_negative_int, positive_int


def time_train_step(cfg: FFNConfig, mesh, batch_tokens: int, steps: int = 10, warmup: int = 2, remat: str = "none",
                    seed: int = 0, schedule: Schedule = Schedule()) -> dict:
    """Time the train step of ``cfg`` on ``mesh`` with a global batch of ``batch_tokens`` tokens. Returns
    {"step_seconds" (median), "step_seconds_all", "final_loss", "compiled" (the executable that ran)}.
    ValueError naming any bad input, before anything is created."""
    positive_int("steps", steps)
    non_negative_int("warmup", warmup)
    check_seed("seed", seed)
    check_remat(remat, cfg)
    check_divisible(cfg, mesh_shape(mesh), batch_tokens)
    schedule.check(cfg, mesh_shape(mesh), batch_tokens)
    tx = make_optimizer()
    state = init_state(cfg, mesh, seed, tx)
    batch_fn = make_batch_fn(cfg, mesh, batch_tokens, seed)
    times = []
    with jax.set_mesh(mesh):
        compiled = make_train_step(cfg, mesh, remat, tx, schedule).lower(state, batch_fn(0)).compile()
        for i in range(warmup + steps):
            batch = jax.block_until_ready(batch_fn(i))
            t0 = time.perf_counter()
            state, loss = jax.block_until_ready(compiled(state, batch))
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return {"step_seconds": statistics.median(times), "step_seconds_all": times, "final_loss": float(loss),
            "compiled": compiled}
