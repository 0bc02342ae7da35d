"""The sharded train state, train step, synthetic data and training loop.

State (a plain pytree, so optax, jit and orbax all see arrays): {"params": {"w_in", "w_out"} FP32,
"opt": optax.adamw state (FP32 mu and nu, int32 count)} -> 12 bytes/param + 4 bytes stored between
steps. Every array is created and kept sharded by the logical-axis table (mesh.rules): the state
shardings are computed from the parameters' logical axes and pinned as out_shardings.

Data: the family's synthetic task (ffn_model.task: a regression x ~ N(0, 1) -> x·T/sqrt(D) the linear stack
can learn; token ids with a vocabulary), batch ``step`` of seed ``s`` the same on every mesh, sharded batch over
(data, fsdp): a function of (seed, step) only, so a run resumed from a checkpoint sees the batches an
uninterrupted run would.

What differs between model families (the module, the batch's layout, the loss, the pipeline) is each family's
program module's (ffn_model.model, ffn_model.transformer), chosen from the workload by ffn_model.families; the
builders take the Workload, validated once where it is built.

Several processes (multi-controller JAX, after jax.distributed.initialize): every process runs this
same code on the global mesh; the jitted init, batch and train step each compute only the shards
of the global arrays that the process's devices hold, and the loss is replicated, so every process
can read it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ffn_model import checkpoint as ckpt
from ffn_model.families import program
from ffn_model.pipeline import accumulate
from ffn_model import zero1
from ffn_model.state import module_state_shardings
from mesh.devices import mesh_shape
from mesh.rules import logical_to_spec, tokens_over
from scaling.core.inputs import check_seed, positive_float, positive_int
from scaling.core.policies import OptimizerSharding
from scaling.core.sharding import shards
from scaling.core.workload import Workload


def make_optimizer(lr: float = 1e-3, weight_decay: float = 1e-4) -> optax.GradientTransformation:
    """optax AdamW with FP32 moments (mu_dtype float32; nu follows the FP32 gradients)."""
    return optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=weight_decay, mu_dtype=jnp.float32)


def check_mesh(w: Workload, mesh) -> None:
    """ValueError unless ``mesh`` (a jax Mesh) has the workload's shape w.mesh (mesh.devices.mesh_shape): the one
    check train, bench and the abstract compile make before they build anything."""
    if mesh_shape(mesh) != w.mesh:
        raise ValueError(f"the workload's mesh is {w.mesh}, the devices' mesh {mesh_shape(mesh)}")


def _model(w: Workload, seed: int = 0):
    """() -> the NNX module of ``w``, built by its family's program (ffn_model.families)."""
    return lambda: program(w.model).build(w, seed)


def input_layout(w: Workload):
    """(shape, logical axes) of a batch's x and y for w.batch_tokens, as the family lays it out: [B, D] for the
    FFN stack; [B/T, T, D] sequences, or [B/T, T] token ids with a vocabulary, for a transformer."""
    return program(w.model).input_layout(w.model, w.batch_tokens)


def _zero1(w: Workload) -> bool:
    """Whether the step runs ZeRO-1's distributed optimizer (ffn_model.zero1): optimizer_sharding "zero1" on a
    data axis (with data=1 it is the fsdp layout)."""
    return w.schedule.optimizer_sharding == OptimizerSharding.ZERO1 and w.mesh["data"] > 1


def state_shardings(w: Workload, mesh, tx=None):
    """(abstract state with shardings, state shardings) of ``w``'s module (module_state_shardings), ZeRO-1's
    layout where ``w`` runs it. ``w`` is validated where it is built (scaling.core.workload)."""
    return module_state_shardings(_model(w), mesh, tx or make_optimizer(), zero1_layout=_zero1(w))


def init_state(w: Workload, mesh, seed: int = 0, tx=None):
    """The train state of ``w``, created directly in its shardings (state_shardings: no device holds a full
    weight), the parameters drawn from ``seed``."""
    tx = tx or make_optimizer()
    _, shardings = state_shardings(w, mesh, tx)

    abstract, shardings = state_shardings(w, mesh, tx)

    @functools.partial(jax.jit, out_shardings=shardings)
    def init():
        params = nnx.to_pure_dict(nnx.state(_model(w, seed)(), nnx.Param))
        opt = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), abstract["opt"])  # Adam's state starts at 0
        return {"params": params, "opt": opt if _zero1(w) else tx.init(params)}

    with jax.set_mesh(mesh):
        return init()


def batch_shardings(w: Workload, mesh) -> dict:
    """{"x", "y"}: NamedShardings of a batch on ``mesh``, from its logical axes (input_layout)."""
    with tokens_over(w.model.batch_axis):
        s = NamedSharding(mesh, logical_to_spec(input_layout(w)[1]))
    return {"x": s, "y": s}


def batch_structs(w: Workload, mesh) -> dict:
    """ShapeDtypeStructs of one batch of w.batch_tokens: x BF16 and y FP32 (input_layout: [B, D], or
    [B/T, T, D]); token ids and labels int32 [B/T, T] with a vocabulary (the family's batch_dtypes)."""
    sh = batch_shardings(w, mesh)
    shape, _ = input_layout(w)
    x_dtype, y_dtype = program(w.model).batch_dtypes(w.model)
    return {"x": jax.ShapeDtypeStruct(shape, x_dtype, sharding=sh["x"]),
            "y": jax.ShapeDtypeStruct(shape, y_dtype, sharding=sh["y"])}


def make_batch_fn(w: Workload, mesh, seed: int = 0):
    """step -> batch of w.batch_tokens (jitted, sharded): the family's synthetic task (ffn_model.task: the teacher
    regression; token ids with a vocabulary). Deterministic in (seed, step), independent of the mesh; no host
    data, so in a multi-process program each process computes just its own shards."""
    shape, _ = input_layout(w)
    return jax.jit(program(w.model).synthetic_batch(w.model, shape, seed), out_shardings=batch_shardings(w, mesh))


def _loss(stack_loss, graphdef, params, batch):
    """The stack's loss on one batch: its family's loss (mse, or with a vocabulary the cross-entropy)."""
    return stack_loss(nnx.merge(graphdef, params), batch)


def loss_fn(w: Workload, mesh, for_grad: bool = True):
    """(params, batch) -> loss of ``w`` on ``mesh``: the stack as one scan; with a stage axis, its family's
    pipeline (ffn_model.pipeline; ``for_grad=False``: a forward-only step, which holds weights gathered
    once per step in BF16). Gradient accumulation (microbatches without a stage axis) is the train
    step's (make_train_step). ``w`` is validated where it is built (remat, divisibility, Schedule.check)."""
    family = program(w.model)
    if w.mesh["stage"] > 1:
        return family.pipeline_loss_fn(w, mesh, for_grad)
    graphdef, _ = nnx.get_abstract_model(_model(w), mesh)
    return functools.partial(_loss, family.loss, graphdef)


def compiler_options(w: Workload, mesh) -> dict | None:
    """The workload's XLA flags for the platform of ``mesh`` (scaling.core.flags.FlagSet.options: libtpu's flags on a
    TPU, none elsewhere), None for none."""
    return w.flags.options(mesh.devices.flat[0].platform) or None


def make_train_step(w: Workload, mesh, tx=None):
    """(state, batch) -> (state, loss): value_and_grad of the loss, AdamW update (``tx``, default make_optimizer).
    With microbatches and no stage axis, the gradient is accumulated over them (ffn_model.pipeline.accumulate).
    Jitted with the state donated, out_shardings pinned to the state shardings (loss replicated) and the
    workload's XLA flags (compiler_options). Call it (or lower it) with ``mesh`` set (jax.set_mesh), so that the
    model's sharding constraints resolve. ``w`` is validated where it is built (scaling.core.workload)."""
    tx = tx or make_optimizer()
    schedule = w.schedule
    flat = _zero1(w)  # ZeRO-1: each data shard's partial gradients, one flat buffer per device (ffn_model.zero1)
    local = zero1.data_shard_workload(w) if flat else w  # inside zero1's shard_map: one data shard's program
    _, shardings = state_shardings(w, mesh, tx)
    accumulating = schedule.microbatches > 1 and w.mesh["stage"] == 1
    batch_shards = shards(local.mesh, w.model.batch_axis)

    # built outside the step (flax builds the stack's graph under jax.set_mesh); a pipeline's loss under ZeRO-1 inside
    # its shard_map, on the mesh there (abstract, manual over data), which the pipeline's own shard_maps take
    pipelined = w.mesh["stage"] > 1
    outside = None if flat and pipelined else jax.value_and_grad(loss_fn(local, mesh))

    def make_grads(m):
        loss_and_grad = outside or jax.value_and_grad(loss_fn(local, m))

        def grads_of(params, batch):
            if accumulating:
                return accumulate(loss_and_grad, params, batch, schedule.microbatches, batch_shards)
            return loss_and_grad(params, batch)

        return grads_of

    grads_of = make_grads(mesh)
    if flat:
        grads_of = zero1.data_partials(make_grads, mesh, pipelined)
        update = zero1.flat_update(tx, mesh, shardings["params"], shardings["opt"])

    def step(state, batch):
        with tokens_over(w.model.batch_axis):  # the family's "batch" (mesh.rules.BATCH_AXIS) in its trace
            loss, grads = grads_of(state["params"], batch)
        if flat:
            params, opt = update(state["params"], grads, state["opt"])
            return {"params": params, "opt": opt}, loss
        updates, opt = tx.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    return jax.jit(step, donate_argnums=(0,), out_shardings=(shardings, NamedSharding(mesh, PartitionSpec())),
                   compiler_options=compiler_options(w, mesh))


def make_forward_step(w: Workload, mesh):
    """(params, batch) -> loss: the forward pass only (no gradients; loss_fn with ``for_grad=False``), with the
    workload's XLA flags (compiler_options); call it with ``mesh`` set."""
    loss = loss_fn(w, mesh, for_grad=False)

    def forward(params, batch):
        with tokens_over(w.model.batch_axis):  # the family's "batch" (mesh.rules.BATCH_AXIS) in its trace
            return loss(params, batch)

    return jax.jit(forward, out_shardings=NamedSharding(mesh, PartitionSpec()),
                   compiler_options=compiler_options(w, mesh))


# what train passes, each used once
def train_loop(state, step_fn, batch_fn, steps: int, batch_tokens: int, start_step: int = 0, log=None,
               save=None, save_every: int | None = None):
    """Run ``steps`` steps from ``start_step``; returns (losses, state). ``log(step, loss,
    tokens_per_s)`` is called after each step (the first step's time includes compilation);
    ``save(k, state)`` after every step that completes a multiple k of ``save_every`` steps. A loss
    that is not finite (NaN, inf) stops the loop with a ValueError before that step's state is saved."""
    losses = []
    for i in range(start_step, start_step + steps):
        t0 = time.perf_counter()
        state, loss = step_fn(state, batch_fn(i))
        loss = float(loss)  # waits for the step (the loss is replicated: every process holds it)
        if not math.isfinite(loss):
            raise ValueError(f"step {i}: the loss is {loss}, not a finite number: training stopped, "
                             "its state not saved")
        losses.append(loss)
        if log is not None:
            log(i, loss, batch_tokens / (time.perf_counter() - t0))
        if save is not None and save_every and (i + 1) % save_every == 0:
            save(i + 1, state)
    return losses, state


# the train command's run (steps, lr, seed), checkpointing (dir, save_every, resume, step) and reports
def train(w: Workload, mesh, steps: int, lr: float = 1e-3, seed: int = 0, log=None, return_state: bool = False,
          checkpoint_dir=None, save_every: int | None = None, resume: bool = False, say=None,
          resume_step: int | None = None):
    """Train the workload's model on the synthetic task on ``mesh`` (a jax Mesh of w.mesh's shape) up to ``steps``
    steps in all and return the losses of the steps this call ran (and the final state with
    ``return_state=True``).

    Without ``resume`` the state is created fresh and steps 0..steps-1 run. With ``checkpoint_dir``
    (ffn_model.checkpoint) the state is saved after every ``save_every`` steps (asynchronously) and
    after the last step; the directory must be new or empty. With ``resume`` the newest complete checkpoint
    k is restored onto ``mesh`` (any mesh) and steps k..steps-1 run: since batch i is a function of
    (seed, i), the losses are those of an uninterrupted run. ``resume_step`` k (implies ``resume``) restores the
    complete step k instead of the newest (after a damaged newest one) and removes the checkpoints after k.
    Every input is validated before anything is created or written (ValueError naming the input).

    ``say(line)`` receives what a person running this wants to know besides the losses: "saved step
    k to DIR" once step k is committed (at the first step that ends after it, when the next save starts,
    or at the end), "skipped step j: why" for each newer save that never completed, "resumed from step
    k ...", unfinished saves removed, that a checkpoint is already at ``steps``, and a
    "warning:" line for each setting (batch_tokens, lr) that differs from the checkpoint's. A loss or
    a state that is not finite stops the run with a ValueError before it is saved (train_loop,
    checkpoint.save); the checkpoints already committed stay."""
    resume = resume or resume_step is not None
    _check_run(w, mesh, steps, lr, seed, checkpoint_dir, save_every, resume, resume_step)
    cfg, batch_tokens, schedule = w.model, w.batch_tokens, w.schedule
    say = say or (lambda line: None)
    tx = make_optimizer(lr)
    here = str(mesh_shape(mesh))
    meta = {"model": dataclasses.asdict(cfg), "seed": seed, "batch_tokens": batch_tokens, "lr": lr, "mesh": here,
            "schedule": dataclasses.asdict(schedule)}
    start = 0
    held = ckpt.directory_contents(checkpoint_dir) if checkpoint_dir is not None else None
    only_tmp = held and all(ckpt.TMP in name for _, name, _ in held["incomplete"])
    if resume and not held["steps"] and held["unfinished"] and only_tmp:  # an interrupted first save: nothing to resume
        say(f"no complete checkpoint in {checkpoint_dir}, only an unfinished save: starting from step 0")
        resume = False
    if resume:
        start, state = _restore(w, mesh, tx, steps, checkpoint_dir, held, meta, say, resume_step)
    else:
        state = init_state(w, mesh, seed, tx)
    mngr = ckpt.open_manager(checkpoint_dir, create=True) if checkpoint_dir is not None else None
    removed = held["unfinished"] + ckpt.remove_incomplete(mngr, held, start) if held else []
    for name in removed:  # the manager removes the unfinished ones itself (cleanup_tmp_directories)
        say(f"removed {name} from {checkpoint_dir}: a save that never finished")
    for k in ckpt.remove_newer(mngr, held, start) if resume_step is not None else ():
        say(f"removed step {k} from {checkpoint_dir}: newer than --resume-step {resume_step}")
    started = []  # saves started and not yet reported: "saved step k" is said once step k is committed

    def save(k, s):
        ckpt.save(mngr, k, s, meta, wait=False)  # returns once the previous save is committed (orbax waits)
        for j in started:
            say(f"saved step {j} to {checkpoint_dir}")
        started[:] = [k]

    def report(i=None, loss=None, tps=None, wait=False):
        if i is not None and log is not None:
            log(i, loss, tps)
        if wait:
            mngr.wait_until_finished()
        if mngr is not None and not mngr.is_saving_in_progress():
            for k in started:
                say(f"saved step {k} to {checkpoint_dir}")
            started.clear()

    step_fn = make_train_step(w, mesh, tx)  # under the workload's XLA flags (none off TPU)
    batch_fn = make_batch_fn(w, mesh, seed)
    try:
        with jax.set_mesh(mesh):  # the model's sharding constraints resolve against it while tracing
            losses, state = train_loop(state, step_fn, batch_fn, steps - start, batch_tokens, start_step=start,
                                       log=report, save=save if mngr is not None else None, save_every=save_every)
        if mngr is not None and steps > start and (not save_every or steps % save_every):
            save(steps, state)  # the final state
    except ValueError as e:
        if mngr is None:
            raise
        report(wait=True)
        latest = mngr.latest_step()
        raise ValueError(f"{e}; {checkpoint_dir} keeps " + (f"steps up to {latest}" if latest is not None
                                                            else "no checkpoint")) from None
    finally:
        if mngr is not None:
            report(wait=True)
            mngr.close()
    return (losses, state) if return_state else losses


# train's inputs, each checked before anything is created or written
def _check_run(w: Workload, mesh, steps: int, lr: float, seed: int, checkpoint_dir, save_every, resume: bool,
               resume_step: int | None = None) -> None:
    """train's inputs checked before anything is created or written (ValueError naming the input): positive
    steps, lr and save_every, a seed, the mesh of the workload's shape (check_mesh), a checkpoint_dir for
    save_every and resume (ffn_model.checkpoint.check_directory), resume_step a complete step there
    (ffn_model.checkpoint.check_resume_step)."""
    positive_int("steps", steps)
    positive_float("lr", lr)
    check_seed("seed", seed)
    check_mesh(w, mesh)
    if save_every is not None:
        positive_int("save_every", save_every)
    if checkpoint_dir is None and (save_every is not None or resume):
        raise ValueError("save_every and resume need a checkpoint_dir (--checkpoint-dir)")
    if checkpoint_dir is not None:
        ckpt.check_directory(checkpoint_dir, resume)
    if resume_step is not None:
        positive_int("resume_step", resume_step)
        ckpt.check_resume_step(checkpoint_dir, resume_step)


# what train holds when it restores: the run's shapes, its optimizer and the checkpoint's metadata
def _restore(w: Workload, mesh, tx, steps: int, checkpoint_dir, held: dict, meta: dict, say,
             step: int | None = None):
    """(k, state): the newest complete checkpoint k in ``checkpoint_dir`` (or the complete ``step``) restored onto
    ``mesh`` (ffn_model.checkpoint.restore_latest against ``meta``), what was skipped, the mesh it was saved on and
    each changed setting said; ValueError where k > ``steps``."""
    start, state, saved = ckpt.restore_latest(checkpoint_dir, state_shardings(w, mesh, tx)[0], meta, step)
    if start > steps:
        raise ValueError(f"steps={steps} is fewer than the {start} steps already in the checkpoint "
                         f"{str(checkpoint_dir)!r}; steps counts all steps, resumed ones included")
    for line in ckpt.skipped_lines(held, start):
        say(line)
    say(f"resumed from step {start} in {checkpoint_dir} (saved on mesh {saved.get('mesh', '?')}, "
        f"restored on mesh {mesh_shape(mesh)})")
    for change in ckpt.changed_settings(saved, meta):
        say(f"warning: resuming with {change}")
    if start == steps:
        say(f"the checkpoint is already at step {start} = steps: nothing to train (raise --steps to continue)")
    return start, state
