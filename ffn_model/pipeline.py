"""Microbatches: gradient accumulation without a stage axis, and pipeline parallelism over the ``stage``
mesh axis (GPipe and circular schedules), each one lax.scan, so compile time does not grow with depth.

Pipeline (MaxText's layout, layers/pipeline.py): the L blocks' weights [L, F, D] are sharded over
``stage`` along L (the sharding table: layers -> stage), so stage s holds blocks s·L/S .. (s+1)·L/S-1.
Viewed as [R, S, L/(S·R), F, D], chunk c = r·S + s of L/(S·R) blocks is stage s's r-th chunk: GPipe
(R = 1) is that view with no data movement; a circular schedule (R > 1) re-lays the stacked weights
once per step (``relay``: rounds of collective-permutes over ``stage``) so that stage s holds chunks s,
S+s, 2S+s, ...

Every stage runs the same program, inside jax.shard_map manual over ``stage`` only (the model's own
sharding over data, fsdp and tensor stays automatic): one scan over T = R·M + S - 1 iterations. At
iteration t stage s works on microbatch (t - s) mod M of repeat (t - s) // M; its input is the
previous iteration's output of stage s-1, moved one stage on with jax.lax.ppermute (a
collective-permute over ``stage``); stage 0 reads its input from a buffer that holds
the microbatches and, as they arrive from the last stage, their outputs (the next repeat's input, and
at the end the outputs the loss reads). Iterations where a stage has no real microbatch (the bubble:
t < s, or t - s >= R·M) compute on whatever they hold; nothing they produce reaches the loss, but their
FLOPs are executed and their activations saved (scaling.pipeline). Backward is jax's transpose of the
scan: the same schedule in reverse, the permutes reversed.

The microbatches split each device's tokens (batch -> data·fsdp) M ways, so splitting moves nothing;
the loss is the mean over every token, so the gradient is that of one pass over the whole batch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ffn_model.model import COMPUTE_DTYPE, already_gathered, constrain, gather_bf16, gather_once, stack_forward
from scaling.pipeline import relay_rounds


def split_microbatches(a_Bx___, microbatches: int, batch_shards: int):
    """[B, ...] -> [M, B/M, ...]: each device's B/(data·fsdp) tokens (or sequences) split M ways
    (microbatch m holds the m-th piece of every device's), so the split is local to each device."""
    B, rest = a_Bx___.shape[0], a_Bx___.shape[1:]
    n, M = batch_shards, microbatches
    return jnp.swapaxes(a_Bx___.reshape(n, M, B // (n * M), *rest), 0, 1).reshape(M, B // M, *rest)


def relay(w, mesh, repeats: int):
    """A stack [L, F, D] sharded over ``stage`` along L (stage s holds chunks s·R .. s·R + R − 1 of
    Lc = L/(S·R) blocks) re-laid as [S·Lc, R, F, D], sharded the same way, where stage s holds chunks
    s, S + s, 2S + s, ... (its slot r is chunk r·S + s). Done explicitly, in the rounds of
    scaling.pipeline.relay_rounds: in each round every stage sends one chunk and receives one (one
    collective-permute over ``stage``; a stage that keeps its chunk copies it), so the bytes moved are
    the rounds that move anything times one chunk (program.collective_volumes). Left to XLA, the same
    resharding became an all-to-all, an all-to-all plus a permute, or an all-gather of the whole stack,
    depending on S and R."""
    S, R = mesh.shape["stage"], repeats
    rounds = relay_rounds(S, R)
    take = [jnp.array([j for _, j, _, _ in rd]) for rd in rounds]  # round k: the chunk stage s sends
    keeps = [jnp.array([t == src for src, _, t, _ in rd]) for rd in rounds]  # ... to itself
    slot = [[0] * S for _ in rounds]  # slot[k][t]: where stage t puts what it receives in round k
    for k, rd in enumerate(rounds):
        for _, _, t, r in rd:
            slot[k][t] = r
    order = jnp.array([[[slot[k][t] for k in range(R)].index(r) for r in range(R)] for t in range(S)])

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=PartitionSpec("stage"), out_specs=PartitionSpec("stage"),
                       axis_names={"stage"}, check_vma=False)
    def run(w_local):
        s = jax.lax.axis_index("stage")
        chunks = w_local.reshape(R, -1, *w_local.shape[1:])  # [R, Lc, F, D]
        received = []
        for k, rd in enumerate(rounds):
            mine = jnp.take(chunks, take[k][s], axis=0)
            pairs = [(src, t) for src, _, t, _ in rd if t != src]
            got = jax.lax.ppermute(mine, "stage", pairs) if pairs else mine
            received.append(jnp.where(keeps[k][s], mine, got))
        out = jnp.take(jnp.stack(received), order[s], axis=0)  # [R, Lc, F, D], slot r from its round
        return out.transpose(1, 0, 2, 3)  # [Lc, R, F, D]

    return run(w)


def pipeline_outputs(x_MxbxD, w_in, w_out, mesh, *, repeats: int = 1, remat: str = "none", activation=None,
                     fsdp_gather: str = "microbatch", for_grad: bool = True):
    """Stage 0's buffer [S, M, b, D] (its slice holds the stack's outputs for the microbatches x [M, b, D])
    of the blocks run as an S-stage pipeline (S = the mesh's stage size) with ``repeats`` R chunks per
    stage (module docstring). The schedule runs inside jax.shard_map, manual over ``stage`` only: each
    stage's program sees its own blocks and the other mesh axes stay automatic (fsdp, tensor, data).
    ``for_grad=False`` (a forward-only step) holds weights gathered once per step as BF16, not as the FP32
    a gradient accumulates in."""
    S, (M, b, D), R = mesh.shape["stage"], x_MxbxD.shape, repeats
    T = R * M + S - 1
    if R > 1:  # circular: [L] = [R, S, Lc] re-laid as [S, Lc, R] (collective-permutes over stage, once per step)
        w_in, w_out = (constrain(relay(w, mesh, R), ("layers", None, "mlp", "embed")) for w in (w_in, w_out))
    gather = gather_bf16
    if fsdp_gather == "step":  # a stage's weights, every chunk of them, gathered over fsdp once per step
        axes = ("layers", "mlp", "embed") if R == 1 else ("layers", None, "mlp", "embed")
        if for_grad:  # FP32 holding BF16, so that the loop accumulates their gradient in FP32
            w_in, w_out = (gather_once(w, axes) for w in (w_in, w_out))
            gather = already_gathered
        else:  # forward only: held as the BF16 the all-gather moved
            w_in, w_out = (gather_bf16(w, axes) for w in (w_in, w_out))
            gather = lambda w, axes: w  # noqa: E731

    @functools.partial(jax.shard_map, mesh=mesh,
                       in_specs=(PartitionSpec(), PartitionSpec("stage"), PartitionSpec("stage")),
                       out_specs=PartitionSpec("stage"), axis_names={"stage"}, check_vma=False)
    def run(x, wi, wo):
        s = jax.lax.axis_index("stage")
        perm = [(i, (i + 1) % S) for i in range(S)]

        def iteration(carry, t):
            state, buffer = carry
            x_in = jnp.where(s == 0, buffer[t % M], state)  # stage 0: microbatch t mod M (raw or last repeat's)
            r = jnp.clip((t - s) // M, 0, R - 1)  # this stage's chunk this iteration (bubble: clipped)
            # The weights a block uses are chosen inside the block's checkpointed function, so that no
            # per-iteration copy of a stage's weights becomes a residual of the loop: the chunk of repeat r;
            # with one chunk, the weights held behind an optimization barrier with the iteration number, so
            # that XLA cannot hoist the gathers of a whole stage out of the loop (its loop-invariant code
            # motion did: 55 GB of gathered weights for the XXL at stage=2).
            if R == 1:
                pick = lambda w, axes: gather(jax.lax.optimization_barrier((w, t))[0], axes)  # noqa: E731
            else:
                pick = lambda w, axes: gather(w[r], axes)  # noqa: E731
            y = stack_forward(x_in, wi, wo, activation, remat, gather=pick)
            state = jax.lax.ppermute(y, "stage", perm)  # stage s's output becomes stage s+1's input
            done = t - (S - 1)  # the last stage finished microbatch done mod M; its output is now on stage 0
            buffer = buffer.at[done % M].set(jnp.where((s == 0) & (done >= 0), state, buffer[done % M]))
            return (state, buffer), None

        carry = (jnp.zeros((b, D), COMPUTE_DTYPE), x.astype(COMPUTE_DTYPE))
        (_, buffer), _ = jax.lax.scan(iteration, carry, jnp.arange(T))
        return buffer[None]

    return run(x_MxbxD, w_in, w_out)


def pipeline_loss(params, batch, mesh, batch_shards: int, *, microbatches: int, repeats: int = 1,
                  remat: str = "none", activation=None, fsdp_gather: str = "microbatch", for_grad: bool = True):
    """Mean squared error (FP32) over every token of the batch, the stack run as a pipeline. The loss is
    computed on stage 0 (which holds the outputs) as a per-stage masked sum, one scalar all-reduce."""
    M = microbatches
    x = split_microbatches(batch["x"], M, batch_shards)
    y = split_microbatches(batch["y"], M, batch_shards)
    buffer = pipeline_outputs(x, params["w_in"], params["w_out"], mesh, repeats=repeats, remat=remat,
                              activation=activation, fsdp_gather=fsdp_gather, for_grad=for_grad)
    S = buffer.shape[0]
    err = jax.vmap(lambda o: jnp.mean(jnp.square(o.astype(jnp.float32) - y)), spmd_axis_name="stage")(buffer)
    return jnp.sum(jnp.where(jnp.arange(S) == 0, err, 0.0))


def accumulate(loss_and_grad, params, batch, microbatches: int, batch_shards: int):
    """Gradient accumulation: (mean loss, mean gradient) over M microbatches, one microbatch's forward and
    backward at a time (a scan), the FP32 gradients summed in the parameters' sharding."""
    M = microbatches
    xs = {k: split_microbatches(v, M, batch_shards) for k, v in batch.items()}

    def one(acc, mb):
        loss, grads = loss_and_grad(params, mb)
        return jax.tree.map(jnp.add, acc, (loss, grads)), None

    zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), _ = jax.lax.scan(one, zero, xs)
    return loss / M, jax.tree.map(lambda g: g / M, grads)

