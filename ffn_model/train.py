"""The sharded train state, train step, synthetic data and training loop.

State (a plain pytree, so optax, jit and orbax all see arrays): {"params": {"w_in", "w_out"} FP32,
"opt": optax.adamw state (FP32 mu and nu, int32 count)} -> 12 bytes/param + 4 bytes stored between
steps. Every array is created and kept sharded by the logical-axis table (mesh.rules): the state
shardings are computed from the parameters' logical axes and pinned as out_shardings.

Data: a synthetic regression task that the linear stack can learn. x ~ N(0, 1) [B,D] (BF16) and
targets y = x·T/sqrt(D) (FP32) for a fixed teacher T ~ N(0, 1) [D,D]; batch ``step`` of seed ``s``
is the same on every mesh (partitionable threefry), sharded batch over (data, fsdp). It is a function
of (seed, step) only, so a run resumed from a checkpoint sees the batches an uninterrupted run would.

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
from ffn_model.model import COMPUTE_DTYPE, FFNStack, gather_bf16, grad_axes, zero1_gradients
from ffn_model.pipeline import (accumulate, circular_layout, merge_microbatches, one_f_one_b, pipeline_loss,
                                pipeline_outputs, split_microbatches)
from ffn_model.transformer import (IDS_AXES, LAYER_AXES, VOCAB_AXES, TransformerStack, embed, layer_names,
                                   loop_lookup, loop_lookup_grad, output_logits, stack_forward, token_cross_entropy)
from ffn_model.transformer import X_AXES as TF_X_AXES
from mesh.devices import mesh_shape
from mesh.rules import logical_to_spec
from scaling.config import (Model, Schedule, TransformerConfig, check_remat, check_seed,
                            positive_float, positive_int)
from scaling.sharding import X_AXES, shards
from scaling.workload import Workload


def make_optimizer(lr: float = 1e-3, weight_decay: float = 1e-4) -> optax.GradientTransformation:
    """optax AdamW with FP32 moments (mu_dtype float32; nu follows the FP32 gradients)."""
    return optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=weight_decay, mu_dtype=jnp.float32)


def _model(cfg: Model, seed: int = 0, remat: str = "none", schedule: Schedule = Schedule()):
    """The model of ``cfg``: the FFN stack, or the transformer stack (ffn_model.transformer)."""
    if isinstance(cfg, TransformerConfig):
        return lambda: TransformerStack(cfg, rngs=nnx.Rngs(seed), remat=remat, schedule=schedule)
    return lambda: FFNStack(cfg, rngs=nnx.Rngs(seed), remat=remat, sequence_parallel=schedule.sequence_parallel)


def input_layout(cfg: Model, batch_tokens: int):
    """(shape, logical axes) of a batch's x and y: [B, D] over (batch, act_embed) for the FFN stack;
    [B/T, T, D] sequences over (batch, seq, act_embed) for a transformer; [B/T, T] token ids over
    (batch, seq) for a transformer with a vocabulary."""
    if _tokens(cfg):
        return (batch_tokens // cfg.seq_len, cfg.seq_len), IDS_AXES
    if isinstance(cfg, TransformerConfig):
        return (batch_tokens // cfg.seq_len, cfg.seq_len, cfg.d_model), TF_X_AXES
    return (batch_tokens, cfg.d_model), X_AXES


def _tokens(cfg: Model) -> bool:
    return isinstance(cfg, TransformerConfig) and cfg.vocab is not None


def zero1_sharding(sharding: NamedSharding) -> NamedSharding:
    """A parameter's sharding with its fsdp-split dimension split over data·fsdp (the rule of the logical axis
    embed_zero1, scaling.sharding): where ZeRO-1 keeps the gradients, Adam's moments and the update."""
    fsdp, zero1 = logical_to_spec(("embed",))[0], logical_to_spec(("embed_zero1",))[0]
    return NamedSharding(sharding.mesh, PartitionSpec(*(zero1 if e == fsdp else e for e in sharding.spec)))


def state_shardings(cfg: Model, mesh, tx=None, optimizer_sharding: str = "fsdp"):
    """(abstract state with shardings, state shardings): ShapeDtypeStructs carrying NamedShardings
    for every leaf. The parameters' come from their logical axes through flax
    (nnx.get_abstract_model on ``mesh``); Adam's mu and nu follow their parameter (split over data too under
    ``optimizer_sharding="zero1"``: zero1_sharding), the step count is replicated."""
    tx = tx or make_optimizer()
    _, abs_state = nnx.get_abstract_model(_model(cfg), mesh)
    params = nnx.to_pure_dict(nnx.state(abs_state, nnx.Param))
    opt = jax.eval_shape(tx.init, params)
    pshard = jax.tree.map(lambda a: a.sharding, params)
    moment = zero1_sharding if optimizer_sharding == "zero1" else (lambda s: s)
    oshard = optax.tree_map_params(tx, lambda _, s: moment(s), opt, pshard,
                                   transform_non_params=lambda _: NamedSharding(mesh, PartitionSpec()))
    shardings = {"params": pshard, "opt": oshard}
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            {"params": params, "opt": opt}, shardings)
    return abstract, shardings


def init_state(cfg: Model, mesh, seed: int = 0, tx=None, optimizer_sharding: str = "fsdp"):
    """The train state, created directly in its shardings (no device holds a full weight)."""
    tx = tx or make_optimizer()
    _, shardings = state_shardings(cfg, mesh, tx, optimizer_sharding)

    @functools.partial(jax.jit, out_shardings=shardings)
    def init():
        params = nnx.to_pure_dict(nnx.state(_model(cfg, seed)(), nnx.Param))
        return {"params": params, "opt": tx.init(params)}

    with jax.set_mesh(mesh):
        return init()


def batch_shardings(cfg: Model, mesh) -> dict:
    s = NamedSharding(mesh, logical_to_spec(input_layout(cfg, cfg.d_model)[1]))
    return {"x": s, "y": s}


def batch_structs(cfg: Model, mesh, batch_tokens: int) -> dict:
    """ShapeDtypeStructs of one batch: x BF16 and y FP32 (input_layout: [B, D], or [B/T, T, D]); token
    ids and labels int32 [B/T, T] with a vocabulary."""
    sh = batch_shardings(cfg, mesh)
    shape, _ = input_layout(cfg, batch_tokens)
    x_dtype, y_dtype = (jnp.int32, jnp.int32) if _tokens(cfg) else (COMPUTE_DTYPE, jnp.float32)
    return {"x": jax.ShapeDtypeStruct(shape, x_dtype, sharding=sh["x"]),
            "y": jax.ShapeDtypeStruct(shape, y_dtype, sharding=sh["y"])}


def make_batch_fn(cfg: Model, mesh, batch_tokens: int, seed: int = 0):
    """step -> batch (jitted, sharded). Deterministic in (seed, step), independent of the mesh; no
    host data, so in a multi-process program each process computes just its own shards."""
    shape, _ = input_layout(cfg, batch_tokens)
    D = cfg.d_model
    if _tokens(cfg):  # ids uniform over the vocabulary; the label of position t is the id at t − 1 (at 0, its own)
        @functools.partial(jax.jit, out_shardings=batch_shardings(cfg, mesh))
        def tokens(step):
            key = jax.random.fold_in(jax.random.split(jax.random.key(seed))[1], step)
            ids = jax.random.randint(key, shape, 0, cfg.vocab, jnp.int32)
            return {"x": ids, "y": jnp.concatenate([ids[:, :1], ids[:, :-1]], axis=1)}

        return tokens

    @functools.partial(jax.jit, out_shardings=batch_shardings(cfg, mesh))
    def batch(step):
        k_teacher, k_data = jax.random.split(jax.random.key(seed))
        teacher = jax.random.normal(k_teacher, (D, D), jnp.float32)
        x = jax.random.normal(jax.random.fold_in(k_data, step), shape, jnp.float32).astype(COMPUTE_DTYPE)
        y = jnp.dot(x.astype(jnp.float32), teacher, precision="highest") * D**-0.5
        return {"x": x, "y": y}

    return batch


def token_mean(local_sum, arrays, logical_axes):
    """Σ local_sum(device's shards of ``arrays``) over the mesh / the element count of ``arrays[0]``: every
    device sums its own tokens' terms and one psum over the mesh axes that split the tokens adds them
    (inside a shard_map, so that the loss is one all-reduce of 4 bytes over those axes together on every
    backend; left to XLA it reduced over the sequence and the batch separately on CPU and together on TPU)."""
    mesh = jax.sharding.get_abstract_mesh()
    count = float(math.prod(arrays[0].shape))  # a Python float: 2**32 elements and more overflow an int32 weak type
    if mesh.empty:
        return local_sum(*arrays) / count
    spec = logical_to_spec(logical_axes)
    split = tuple(a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry))

    def local(*a):
        s = local_sum(*a)
        return (jax.lax.psum(s, split) if split else s) / count

    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * len(arrays), out_specs=PartitionSpec(),
                         axis_names=set(mesh.axis_names) - set(mesh.manual_axes))(*arrays)


def mse(pred, y, logical_axes):
    """Mean squared error in FP32 of the BF16 output ``pred`` (laid out on ``logical_axes``) against the FP32
    targets (token_mean)."""
    return token_mean(lambda p, t: jnp.sum(jnp.square(p.astype(jnp.float32) - t)), (pred, y), logical_axes)


def cross_entropy(logits_BxTxV, labels_BxT):
    """Mean softmax cross-entropy in FP32 over the tokens of vocab-parallel logits
    (ffn_model.transformer.token_cross_entropy per token, then token_mean)."""
    return token_mean(jnp.sum, (token_cross_entropy(logits_BxTxV, labels_BxT),), IDS_AXES)


def _loss(graphdef, params, batch):
    """The stack's loss on one batch: mse, or with a vocabulary the cross-entropy of its logits."""
    model = nnx.merge(graphdef, params)
    out = model(batch["x"])
    if getattr(model, "vocab", None) is not None:
        return cross_entropy(out, batch["y"])
    return mse(out, batch["y"], model.output_axes)


def transformer_pipeline_loss(params, batch, *, cfg: TransformerConfig, mesh, schedule: Schedule, remat: str,
                              batch_shards: int):
    """The transformer's loss with its layers run as a pipeline over ``stage`` (ffn_model.pipeline): the
    embedding looked up for the whole batch before it (replicated over stage: a gather and one reduction
    over tensor, no matmul), then the M microbatches. GPipe and circular: through pipeline_outputs, whose
    outputs come back split over the stages (M/S microbatches each), and the output layer and loss (or the
    MSE) of each microbatch on the stage that holds it (jax.vmap over microbatches, spmd_axis_name="stage"):
    every stage runs the output layer on 1/S of the tokens. 1F1B: the loss and every gradient from
    ffn_model.pipeline.one_f_one_b's loop (a jax.custom_vjp whose forward runs it; a forward-only step runs
    GPipe), the output layer on the last stage inside the loop and, with a vocabulary, the lookup on stage 0
    (the token ids go in; E and U gathered once in BF16, their gradients accumulated in the loop). The mean over
    microbatches is the mean over every token."""
    M, R = schedule.microbatches, schedule.repeats
    axes = {n: LAYER_AXES[n] for n in layer_names(cfg.gated)}
    vocab, tied = cfg.vocab is not None, cfg.tied_embeddings

    def inputs(params):  # the stack's input [B, T, D] and the head's parameters: U, or tied the gathered E
        if not vocab:
            return batch["x"].astype(COMPUTE_DTYPE), {}
        x, e = embed(batch["x"], params["embedding"], schedule, tied)
        return x, {"u": e if tied else params["unembedding"]}

    def chunk(x, w, select):
        return stack_forward(x, w, schedule, remat, cfg.mlp, cfg.block, select)

    def head(y, labels, hp):
        if not vocab:
            return mse(y, labels, TF_X_AXES)
        return cross_entropy(output_logits(y, hp["u"], schedule), labels)

    labels = split_microbatches(batch["y"], M, batch_shards)

    def gpipe(params):
        x, hp = inputs(params)
        weights = circular_layout({n: params[n] for n in axes}, axes, mesh, R)
        ys = pipeline_outputs(split_microbatches(x, M, batch_shards), weights, mesh, chunk, TF_X_AXES, repeats=R,
                              to_stages=True)
        return jnp.mean(jax.vmap(lambda y, lab: head(y, lab, hp), spmd_axis_name="stage")(ys, labels))

    if schedule.pipeline != "1f1b":
        return gpipe(params)

    def matrices(params):  # the head's parameters and the lookup's E, gathered once in BF16 (tied: one matrix)
        e = gather_bf16(params["embedding"], VOCAB_AXES)
        return {"u": e} if tied else {"e": e, "u": gather_bf16(params["unembedding"], VOCAB_AXES)}

    def fwd(params):
        # the stacks as the schedule runs them (R > 1: re-laid so stage s holds chunks s, S + s, ...; the
        # gradients re-laid back by the transpose)
        weights, relay_vjp = jax.vjp(lambda ws: circular_layout(ws, axes, mesh, R), {n: params[n] for n in axes})
        run = functools.partial(one_f_one_b, weights=weights, mesh=mesh, chunk=chunk, head=head, x_axes=TF_X_AXES,
                                repeats=R, phases=schedule.warmup_phases)
        if vocab:  # token ids in: stage 0 looks each microbatch up in the loop, E's gradient accumulated there
            hp, hp_vjp = jax.vjp(matrices, params)
            key = "u" if tied else "e"
            lookup = (lambda ids, h: loop_lookup(ids, h[key]),
                      lambda ids, dx: {key: loop_lookup_grad(ids, dx, cfg.vocab)})
            # the matrices' gradients, reduced to their shards each iteration
            loss, dw, dhp, _ = run(split_microbatches(batch["x"], M, batch_shards), labels, head_params=hp,
                                   head_grad_axes={n: grad_axes(VOCAB_AXES) for n in hp}, lookup=lookup)
            d_inputs = hp_vjp(dhp)[0]
        else:
            x, inputs_vjp = jax.vjp(lambda p: inputs(p)[0], params)
            loss, dw, _, dx = run(split_microbatches(x, M, batch_shards), labels, head_params={}, head_grad_axes={})
            d_inputs = inputs_vjp(merge_microbatches(dx, batch_shards))[0]
        grads = jax.tree.map(jnp.add, d_inputs, {**jax.tree.map(jnp.zeros_like, params), **relay_vjp(dw)[0]})
        return loss, grads

    loss_1f1b = jax.custom_vjp(gpipe)
    loss_1f1b.defvjp(fwd, lambda grads, ct: (jax.tree.map(lambda g: ct * g, grads),))
    return loss_1f1b(params)


def loss_fn(cfg: Model, mesh, remat: str = "none", schedule: Schedule = Schedule(), for_grad: bool = True):
    """(params, batch) -> loss for ``mesh`` and ``schedule``: the stack as one scan; with a stage axis,
    a pipeline (ffn_model.pipeline; ``for_grad=False``: a forward-only step, which holds weights gathered
    once per step in BF16). Gradient accumulation (microbatches without a stage axis) is the train
    step's (make_train_step)."""
    shape = mesh_shape(mesh)
    schedule.check(cfg, shape)
    if shape["stage"] > 1 and isinstance(cfg, TransformerConfig):
        return functools.partial(transformer_pipeline_loss, cfg=cfg, mesh=mesh, schedule=schedule, remat=remat,
                                 batch_shards=shards(shape, "batch"))
    if shape["stage"] > 1:
        return functools.partial(pipeline_loss, mesh=mesh, batch_shards=shards(shape, "batch"),
                                 microbatches=schedule.microbatches, repeats=schedule.repeats, remat=remat,
                                 activation=cfg.activation, fsdp_gather=schedule.fsdp_gather, for_grad=for_grad)
    graphdef, _ = nnx.get_abstract_model(_model(cfg, remat=remat, schedule=schedule), mesh)
    return functools.partial(_loss, graphdef)


def make_train_step(cfg: Model, mesh, remat: str = "none", tx=None, schedule: Schedule = Schedule(),
                    compiler_options: dict | None = None):
    """(state, batch) -> (state, loss): value_and_grad of the loss, AdamW update. With microbatches and
    no stage axis, the gradient is accumulated over them (ffn_model.pipeline.accumulate). Jitted with the
    state donated and out_shardings pinned to the state shardings (loss replicated), and ``compiler_options``
    (XLA flags, scaling.flags.FlagSet.options) for its compile. Call it (or lower it) with ``mesh`` set
    (jax.set_mesh), so that the model's sharding constraints resolve."""
    check_remat(remat, cfg)
    tx = tx or make_optimizer()
    shape = mesh_shape(mesh)
    loss_and_grad = jax.value_and_grad(loss_fn(cfg, mesh, remat, schedule))
    zero1 = schedule.optimizer_sharding == "zero1"
    _, shardings = state_shardings(cfg, mesh, tx, schedule.optimizer_sharding)
    accumulating = schedule.microbatches > 1 and shape["stage"] == 1

    def step(state, batch):
        with zero1_gradients(zero1):  # the weight gradients reduced to ZeRO-1's layout (ffn_model.model.grad_axes)
            if accumulating:
                loss, grads = accumulate(loss_and_grad, state["params"], batch, schedule.microbatches,
                                         shards(shape, "batch"))
            else:
                loss, grads = loss_and_grad(state["params"], batch)
        params = state["params"]
        if zero1:  # each data shard updates its slice; out_shardings all-gathers the new weights over data
            params = jax.tree.map(lambda p, s: jax.lax.with_sharding_constraint(p, zero1_sharding(s)), params,
                                  shardings["params"])
        updates, opt = tx.update(grads, state["opt"], params)
        return {"params": optax.apply_updates(params, updates), "opt": opt}, loss

    return jax.jit(step, donate_argnums=(0,), out_shardings=(shardings, NamedSharding(mesh, PartitionSpec())),
                   compiler_options=compiler_options or None)


def make_forward_step(cfg: Model, mesh, remat: str = "none", schedule: Schedule = Schedule()):
    """(params, batch) -> loss: the forward pass only (no gradients); call it with ``mesh`` set."""
    return jax.jit(loss_fn(cfg, mesh, remat, schedule, for_grad=False),
                   out_shardings=NamedSharding(mesh, PartitionSpec()))


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


def train(w: Workload, mesh, steps: int, lr: float = 1e-3, seed: int = 0, log=None, return_state: bool = False,
          checkpoint_dir=None, save_every: int | None = None, resume: bool = False, say=None):
    """Train the workload's model on the synthetic task on ``mesh`` (a jax Mesh of w.mesh's shape) up to ``steps``
    steps in all and return the losses of the steps this call ran (and the final state with
    ``return_state=True``).

    Without ``resume`` the state is created fresh and steps 0..steps-1 run. With ``checkpoint_dir``
    (ffn_model.checkpoint) the state is saved after every ``save_every`` steps (asynchronously) and
    after the last step; the directory must be new or empty. With ``resume`` the newest complete checkpoint
    k is restored onto ``mesh`` (any mesh) and steps k..steps-1 run: since batch i is a function of
    (seed, i), the losses are those of an uninterrupted run. Every input is validated before anything
    is created or written (ValueError naming the input).

    ``say(line)`` receives what a person running this wants to know besides the losses: "saved step
    k to DIR" once step k is committed (at the first step that ends after it, when the next save starts,
    or at the end), "skipped step j: why" for each newer save that never completed, "resumed from step
    k ...", unfinished saves removed, that a checkpoint is already at ``steps``, and a
    "warning:" line for each setting (batch_tokens, lr) that differs from the checkpoint's. A loss or
    a state that is not finite stops the run with a ValueError before it is saved (train_loop,
    checkpoint.save); the checkpoints already committed stay."""
    positive_int("steps", steps)
    positive_float("lr", lr)
    check_seed("seed", seed)
    if mesh_shape(mesh) != w.mesh:
        raise ValueError(f"the workload's mesh is {w.mesh}, the devices' mesh {mesh_shape(mesh)}")
    cfg, batch_tokens, remat, schedule = w.model, w.batch_tokens, w.remat, w.schedule
    if save_every is not None:
        positive_int("save_every", save_every)
    if checkpoint_dir is None and (save_every is not None or resume):
        raise ValueError("save_every and resume need a checkpoint_dir (--checkpoint-dir)")
    if checkpoint_dir is not None:
        ckpt.check_directory(checkpoint_dir, resume)
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
        start, state, saved = ckpt.restore_latest(checkpoint_dir,
                                                  state_shardings(cfg, mesh, tx, schedule.optimizer_sharding)[0], meta)
        if start > steps:
            raise ValueError(f"steps={steps} is fewer than the {start} steps already in the checkpoint "
                             f"{str(checkpoint_dir)!r}; steps counts all steps, resumed ones included")
        for line in ckpt.skipped_lines(held, start):
            say(line)
        say(f"resumed from step {start} in {checkpoint_dir} (saved on mesh {saved.get('mesh', '?')}, "
            f"restored on mesh {here})")
        for change in ckpt.changed_settings(saved, meta):
            say(f"warning: resuming with {change}")
        if start == steps:
            say(f"the checkpoint is already at step {start} = steps: nothing to train (raise --steps to continue)")
    else:
        state = init_state(cfg, mesh, seed, tx, schedule.optimizer_sharding)
    mngr = ckpt.open_manager(checkpoint_dir, create=True) if checkpoint_dir is not None else None
    removed = held["unfinished"] + ckpt.remove_incomplete(mngr, held, start) if held else []
    for name in removed:  # the manager removes the unfinished ones itself (cleanup_tmp_directories)
        say(f"removed {name} from {checkpoint_dir}: a save that never finished")
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

    options = w.flags.options(mesh.devices.flat[0].platform)  # the workload's XLA flags (none off TPU)
    step_fn = make_train_step(cfg, mesh, remat, tx, schedule, options)
    batch_fn = make_batch_fn(cfg, mesh, batch_tokens, seed)
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
