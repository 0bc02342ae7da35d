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
FLOPs are executed and their activations saved (scaling.step.pipeline). Backward is jax's transpose of the
scan: the same schedule in reverse, the permutes reversed.

The microbatches split each device's tokens (batch -> data·fsdp) M ways, so splitting moves nothing;
the loss is the mean over every token, so the gradient is that of one pass over the whole batch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import partial_eval as pe  # dce_jaxpr: which residuals depend on the chunk's input
from jax.sharding import PartitionSpec

from ffn_model.sharded import COMPUTE_DTYPE, constrain, traced_platform
from scaling.core.kinds import Platform
from scaling.step.pipeline import chunk_counts, relay_rounds


def uneven_stages(w) -> tuple[int, ...] | None:
    """The blocks of each chunk (scaling.step.pipeline.chunk_counts: S·R of them in the order the blocks run, chunk
    c = r·S + s stage s's r-th; R = 1: each stage's) where the Workload ``w``'s chunks are uneven, else None (an
    even split, or no stage axis: the stacks are [L, ...] as they are)."""
    S = w.mesh.get("stage", 1)
    counts = chunk_counts(w.model, w.schedule, S) if S > 1 else (w.model.blocks,)
    return counts if len(set(counts)) > 1 else None


def padded_slots(counts: tuple[int, ...]) -> np.ndarray:
    """Uneven chunks (R = 1: stages) as a padded stack of C·Cmax slots (C chunks, Cmax = max n_c): chunk c holds
    slots c·Cmax .. (c+1)·Cmax − 1, its n_c real blocks first, its last Cmax − n_c slots padding. Over ``stage`` the
    stack splits evenly, stage s holding chunks s·R .. s·R + R − 1 as an even stack does (R = 1: chunk s; R > 1 the
    circular re-lay, relay, moves chunk r·S + s to stage s). Returns the slot of each real block i = 0..L−1:
    c·Cmax + (i − (n_0 + ... + n_{c−1}))."""
    Cmax = max(counts)
    return np.array([c * Cmax + j for c, n in enumerate(counts) for j in range(n)])


def pad_stack(w_Lx___, counts: tuple[int, ...]):
    """[L, ...] -> [S·Lmax, ...]: the real blocks in their slots (padded_slots), zeros in the padding slots."""
    slots = padded_slots(counts)
    out = jnp.zeros((len(counts) * max(counts), *w_Lx___.shape[1:]), w_Lx___.dtype)
    return out.at[slots].set(w_Lx___)


def real_blocks(w_Px___, counts: tuple[int, ...]):
    """[S·Lmax, ...] -> [L, ...]: the real blocks of a padded stack in their order (padded_slots), the slots mapped
    back to blocks (a checkpoint's or a one-device run's layout). Works on numpy and jax arrays."""
    return w_Px___[padded_slots(counts)]


def live_slots(counts: tuple[int, ...], repeats: int = 1, select=None):
    """Inside a shard_map manual over ``stage``: the real blocks n_c of the chunk this stage runs (its first n_c
    slots, then padding), ``counts`` the S·R chunks' (uneven_stages): R = 1, stage s's; R > 1, ``select`` (the
    iteration's chunk r of a stage's R: w -> w[r]) of stage s's n_s, n_{S+s}, ..., n_{(R−1)·S+s}."""
    mine = jnp.asarray(counts, jnp.int32).reshape(repeats, -1)[:, jax.lax.axis_index("stage")]
    return mine[0] if repeats == 1 else select(mine)


def split_microbatches(a_Bx___, microbatches: int, batch_shards: int):
    """[B, ...] -> [M, B/M, ...]: each device's B/(data·fsdp) tokens (or sequences) split M ways
    (microbatch m holds the m-th piece of every device's), so the split is local to each device."""
    B, rest = a_Bx___.shape[0], a_Bx___.shape[1:]
    n, M = batch_shards, microbatches
    return jnp.swapaxes(a_Bx___.reshape(n, M, B // (n * M), *rest), 0, 1).reshape(M, B // M, *rest)


def merge_microbatches(a_MxbX___, batch_shards: int):
    """[M, B/M, ...] -> [B, ...]: split_microbatches undone (local to each device)."""
    M, b, rest = a_MxbX___.shape[0], a_MxbX___.shape[1], a_MxbX___.shape[2:]
    n = batch_shards
    return jnp.swapaxes(a_MxbX___.reshape(M, n, b // n, *rest), 0, 1).reshape(M * b, *rest)


def relay(w, mesh, repeats: int):
    """A stack [L, ...] sharded over ``stage`` along L (stage s holds chunks s·R .. s·R + R − 1 of
    Lc = L/(S·R) blocks) re-laid as [S·Lc, R, ...], sharded the same way, where stage s holds chunks
    s, S + s, 2S + s, ... (its slot r is chunk r·S + s). Done explicitly, in the rounds of
    scaling.step.pipeline.relay_rounds: in each round every stage sends one chunk and receives one (one
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
        out = jnp.take(jnp.stack(received), order[s], axis=0)  # [R, Lc, ...], slot r from its round
        return jnp.swapaxes(out, 0, 1)  # [Lc, R, ...]

    return run(w)


def circular_layout(weights: dict, axes: dict, mesh, repeats: int) -> dict:
    """The stacks {name: [L, ...]} as a schedule with ``repeats`` R runs them: as they are for R = 1; for
    R > 1 (circular) re-laid [L] = [R, S, Lc] -> [S, Lc, R] (relay: collective-permutes over stage, once
    per step), keeping their logical ``axes``."""
    if repeats == 1:
        return weights
    return {k: constrain(relay(w, mesh, repeats), ("layers", None, *axes[k][1:])) for k, w in weights.items()}


def pipeline_outputs(x_MxbxD, weights: dict, mesh, chunk, x_axes: tuple, *, repeats: int = 1,
                     to_stages: bool = False):
    """The microbatches x [M, b, ...] run through the stacked blocks as an S-stage pipeline (S = the mesh's
    stage size) with ``repeats`` R chunks per stage (module docstring), inside jax.shard_map manual over
    ``stage`` only: each stage's program sees its own blocks and the other mesh axes stay automatic (fsdp,
    tensor, data, context); ``x_axes``: a microbatch's logical axes. ``weights``: {name: stack} laid out by
    circular_layout; ``chunk(x, weights,
    select)`` runs a stage's blocks on x, calling ``select`` on each block's weights inside the block's
    checkpointed function (the chunk of this iteration's repeat; with one chunk, the weights behind an
    optimization barrier with the iteration number, so that XLA cannot hoist the gathers of a whole stage
    out of the loop: its loop-invariant code motion did, 55 GB of gathered weights for the XXL at
    stage=2). No per-iteration copy of a stage's weights becomes a residual of the loop.

    Returns stage 0's buffer [S, M, b, ...] (stage 0's slice holds the outputs), or with ``to_stages``
    the outputs [M, b, ...] with M split over ``stage`` (M/S microbatches each, sent from stage 0 by S − 1
    collective-permutes), so that what follows the stack runs on every stage's share of the tokens."""
    S, M, R = mesh.shape["stage"], x_MxbxD.shape[0], repeats
    T = R * M + S - 1
    stage = {k: PartitionSpec("stage") for k in weights}

    # the microbatches as stage 0's input: given to every stage ([S, M, b, ...] over stage: a broadcast that moves
    # nothing, as the batch is replicated over stage), so that their gradient is summed over stage outside the
    # shard_map (as the transpose of its replicated input, that sum was an all-reduce XLA:CPU failed to compile)
    x_SxMxbxD = to_every_stage(x_MxbxD, S, x_axes)

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(PartitionSpec("stage"), stage),
                       out_specs=PartitionSpec("stage"), axis_names={"stage"}, check_vma=False)
    def run(x, ws):
        x = x[0]
        s = jax.lax.axis_index("stage")
        perm = [(i, (i + 1) % S) for i in range(S)]

        def iteration(carry, t):
            state, buffer = carry
            x_in = jnp.where(s == 0, buffer[t % M], state)  # stage 0: microbatch t mod M (raw or last repeat's)
            r = jnp.clip((t - s) // M, 0, R - 1)  # this stage's chunk this iteration (bubble: clipped)
            if R == 1:
                select = lambda w: jax.lax.optimization_barrier((w, t))[0]  # noqa: E731
            else:
                select = lambda w: w[r]  # noqa: E731
            y = chunk(x_in, ws, select)
            state = jax.lax.ppermute(y, "stage", perm)  # stage s's output becomes stage s+1's input
            done = t - (S - 1)  # the last stage finished microbatch done mod M; its output is now on stage 0
            buffer = buffer.at[done % M].set(jnp.where((s == 0) & (done >= 0), state, buffer[done % M]))
            return (state, buffer), None

        carry = (jnp.zeros(x.shape[1:], COMPUTE_DTYPE), x.astype(COMPUTE_DTYPE))
        (_, buffer), _ = jax.lax.scan(iteration, carry, jnp.arange(T))
        if not to_stages:
            return buffer[None]
        # stage j gets stage 0's microbatches j·M/S .. (j+1)·M/S − 1: S − 1 collective-permutes from stage 0 (an
        # all_to_all over stage made XLA all-gather the microbatches over fsdp around it)
        k, out = M // S, buffer[:M // S]
        for j in range(1, S):
            out = jnp.where(s == j, jax.lax.ppermute(buffer[j * k:(j + 1) * k], "stage", [(0, j)]), out)
        return out

    return run(x_SxMxbxD, weights)


def to_every_stage(x_MxbxD, stages: int, x_axes: tuple):
    """[M, b, ...] -> [S, M, b, ...] BF16 over ``stage``, each microbatch in its own layout (``x_axes``): the
    pipeline's input given to every stage (a broadcast that moves nothing, the batch being replicated over
    stage), so that its gradient is summed over stage outside the shard_map (as the transpose of a replicated
    shard_map input, that sum was an all-reduce XLA:CPU failed to compile)."""
    x = jnp.broadcast_to(x_MxbxD.astype(COMPUTE_DTYPE)[None], (stages, *x_MxbxD.shape))
    return constrain(x, ("stages", None, *x_axes))


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


# each family passes its own stacks, chunk, head (and lookup), layouts and remat; one schedule, one loop
def one_f_one_b(x_MxbxD, labels_Mxbx, weights: dict, head_params: dict, mesh, chunk, head, head_grad_axes: dict,
                x_axes: tuple, repeats: int = 1, phases: bool = False, lookup=None,
                ids_axes: tuple | None = None, keep: bool = True):
    """The 1F1B schedule (Narayanan et al. 2021, PipeDream-Flush; Megatron-LM's default) and, with ``repeats`` R > 1,
    its interleaved form (Megatron's virtual stages: stage s runs chunks s, S + s, ..., (R − 1)·S + s of L/(S·R)
    layers, ``weights`` laid out by circular_layout), in one SPMD loop, by hand: (Σ_m loss_m / M, d weights,
    d head_params, dx [M, b, ...]) of the microbatches x through the stacked blocks on ``stage`` and
    ``head(y, labels, head_params)`` (a microbatch's mean loss) after them. jax's transpose of a scan runs every
    backward after every forward (GPipe), holding every iteration's activations; here every iteration has a
    forward slot and a backward slot, inside jax.shard_map manual over ``stage``:

      forward   stage s runs item k = t − s: in groups of S microbatches, each through the R chunks in turn,
                chunk r = (k mod S·R) // S of microbatch m = (k // S·R)·S + k mod S (R = 1: m = k). Stage 0 reads
                m from x for its first chunk; otherwise the input is the previous iteration's output of stage
                s − 1 (stage S − 1's output wraps round to stage 0 for the next chunk), a collective-permute. With
                ``keep`` (remat other than full) the slot runs jax.vjp of the chunk and keeps its residuals (the
                array leaves of the vjp function, a pytree, that depend on the input: what the chunk's remat policy
                saves of each layer, the layer inputs among them; remat none: every activation the backward reads)
                in rings of K = 2·R·S − 1 slots; without (remat full) only the input, in one such ring;
      head      the last stage's output of the last chunk goes through the head at once (its loss and the
                gradient of the loss w.r.t. its output and head_params);
      backward  stage s runs item j = t − (R·S − 1) − (S − 1 − s): the items in the same groups with the
                chunks in reverse, chunk R − 1 − (j mod S·R) // S of microbatch (j // S·R)·S + j mod S: the
                chunk's vjp rebuilt from its kept residuals (no forward; the policy's recomputation inside each
                layer's backward) or, without ``keep``, the chunk's forward again from the kept input (jax.vjp,
                under the chunk's remat policy), and its transpose with the output gradient (the head's for the
                last chunk on the last stage, the same iteration as its forward; otherwise stage s + 1's of the
                previous iteration, stage 0's wrapping round to stage S − 1).

    T = R·(M + S) + S − 2 iterations (M + 2(S − 1) for R = 1). A kept chunk lives at most 2·R·S − 2 iterations
    (chunk r on stage s: 2·(R − r)·S − 2 − 2s), so a slot is free when the next forward writes it, and stage s holds K
    chunks' residuals (without ``keep``: K chunk inputs and one chunk's residuals at a time), whatever M: memory
    grows with S (Megatron's stage 0 holds S microbatches; this lock-step schedule up to 2·R·S − 1 chunks:
    scaling.step.pipeline.microbatches_in_flight), flat in M. Every
    stage runs both slots every iteration, the head among them (lock-step SPMD: the last stage's head costs every stage
    its time, as the imbalance of a Megatron pipeline whose last stage holds the output layer costs the step), bubble
    slots on whatever they hold, masked out of the sums; without ``keep`` the forward runs twice (the slot, and again
    in the backward).
    With ``phases`` the first and last W = R·S − 1 iterations run in loops of their own with only the forward (no
    backward item is ready on any stage before t = W) or only the backward slot (no forward item is left after T − W
    − 1): R·M + S − 1 slots each way, Megatron's bubble (S − 1)/(R·M); XLA:GPU copies the gradient accumulators
    between the loops (docs/findings.md). With R = 1 the weights are selected behind an optimization barrier with the
    iteration (pipeline_outputs), and M is any count; with R > 1 the chunk w[r] of the iteration, and M a multiple of S.
    The head's gradients accumulate in FP32 in the layout of ``head_grad_axes`` (logical axes per name). With ``lookup``
    = (first, first_grad), ``x_MxbxD`` are token ids and stage 0 looks its microbatch up in the forward slot,
    ``first(ids, head_params)``, and adds ``first_grad(ids, dx)`` ({name: gradient}) to the head's accumulators in the
    backward slot (Megatron-LM's first stage holds the embedding): no stage holds the embedded batch or its gradient (dx
    comes back None). ``ids_axes``: the logical axes of a microbatch of token ids (the labels and, with ``lookup``,
    the input), when they are not ``x_axes``' leading ones (under sequence parallelism x is split along the
    tokens over tensor, the ids are not)."""
    # data manual already (ZeRO-1's data shards, ffn_model.zero1.data_partials): this data shard's batch only
    dd = None if "data" in mesh.manual_axes else "data"
    S, M, R, dp = mesh.shape["stage"], x_MxbxD.shape[0], repeats, mesh.shape["data"] if dd else 1
    label_axes = x_axes if labels_Mxbx.ndim == x_MxbxD.ndim and not lookup else (ids_axes or x_axes)
    labels_MxDxbx = _by_data(labels_Mxbx, 1, (None, *label_axes[:labels_Mxbx.ndim - 1]), dp)
    if lookup:  # the ids, as the labels: every stage holds them (int32), stage 0 looks them up
        x_SxMxDxbxD = _by_data(x_MxbxD, 1, (None, *(ids_axes or x_axes)[:x_MxbxD.ndim - 1]), dp)[None]
    else:
        x_SxMxDxbxD = _by_data(to_every_stage(x_MxbxD, S, x_axes), 2, ("stages", None, *x_axes), dp)
    stage = {k: PartitionSpec("stage") for k in weights}
    P = PartitionSpec
    loop = _Loop(S, M, R, dp, chunk, head, head_grad_axes, lookup, phases, keep)

    # manual over data too: each data shard accumulates its own partial gradients through the loop, reduced once
    # after it (an automatic data axis would all-reduce every iteration's)
    per_data = {k: PartitionSpec(dd, "stage") for k in weights}  # the gradients, one partial sum per data shard

    @functools.partial(jax.shard_map, mesh=mesh,
                       in_specs=(P(None, None, dd) if lookup else P("stage", None, dd), P(None, dd), stage,
                                 P()),
                       out_specs=(P("stage", dd), per_data, P("stage", dd))
                       + (() if lookup else (P("stage", None, dd),)),
                       axis_names={"stage", "data"} - set(mesh.manual_axes), check_vma=False)
    def run(x, labels, ws, hp):
        return _run_loop(loop, x, labels, ws, hp)

    loss, dws, dhp, *dx = run(x_SxMxDxbxD, labels_MxDxbx, weights, head_params)
    # the data shards' partial gradients reduced once (BF16 on the wire, the precision policy's gradient
    # communication); the head's and the input's are on the last stage and on stage 0: summed over stage too. A BF16
    # sum (lax.reduce) but on XLA:CPU: jnp.sum computes a BF16 sum in FP32, which XLA:GPU then all-reduces in FP32 (2x
    # the bytes; XLA:TPU narrows it); XLA:CPU aborts on some BF16 all-reduces (its all-reduce promotion) and widens
    # every one to FP32 anyway
    zero = jnp.zeros((), COMPUTE_DTYPE)
    reduce = (lambda g, axes: jnp.sum(g.astype(COMPUTE_DTYPE), axis=axes)) if traced_platform() == Platform.CPU else (
        lambda g, axes: jax.lax.reduce(g.astype(COMPUTE_DTYPE), zero, jax.lax.add, axes))
    if dx:  # stage 0's input gradients, [M, b, ...]
        dx = reduce(dx[0], (0,))
        dx = dx.reshape(dx.shape[0], dx.shape[1] * dx.shape[2], *dx.shape[3:])
    else:
        dx = None
    return (jnp.sum(loss), jax.tree.map(lambda w, g: reduce(g, (0,)).astype(w.dtype), weights, dws),
            jax.tree.map(lambda p, g: reduce(g, (0, 1)).astype(p.dtype), head_params, dhp), dx)


def _by_data(a, at: int, axes: tuple, dp: int):
    """The batch dimension ``at`` of ``a`` split [b] -> [data, b/data] (b/data over fsdp), so that one_f_one_b's
    loop, manual over data, sees its shard of each microbatch with the fsdp split kept."""
    a = a.reshape(*a.shape[:at], dp, a.shape[at] // dp, *a.shape[at + 1:])
    return constrain(a, axes[:at] + ("data_shards", "batch_fsdp") + axes[at + 1:])


@dataclasses.dataclass(frozen=True)
class _Loop:
    """one_f_one_b's schedule as its loop runs it: S stages, M microbatches, R chunks per stage, dp data shards,
    the chunk and the head it runs (and the lookup), the head's gradient layout and whether it runs in phases."""

    S: int
    M: int
    R: int
    dp: int
    chunk: Callable
    head: Callable
    head_grad_axes: dict
    lookup: tuple | None
    phases: bool
    keep: bool = True  # the forward slot keeps the chunk's residuals (remat other than full); else its input only

    @property
    def K(self) -> int:  # the ring of kept chunk residuals (or inputs): 2·R·S − 1 slots
        return 2 * self.S * self.R - 1

    @property
    def T(self) -> int:  # iterations: R·(M + S) + S − 2
        return self.R * (self.M + self.S) + self.S - 2

    @property
    def delay(self) -> int:  # R·S − 1: the backward's lag, and with ``phases`` the warm-up and cool-down iterations
        return self.S * self.R - 1

    def perms(self) -> tuple[list, list]:
        """The forward's and the backward's collective-permute pairs over stage: with R > 1 the last stage's
        output goes round to stage 0 (and its gradient back) for the next chunk."""
        S, wrap = self.S, self.R > 1
        return ([(i, (i + 1) % S) for i in range(S if wrap else S - 1)],
                [((i + 1) % S, i) for i in range(S if wrap else S - 1)])

    def chunk_vjp(self, x, ws, t, r):
        """(y, the chunk's vjp function) of chunk r on x at iteration t (jax.vjp under the chunk's remat policy)."""
        return jax.vjp(lambda xi, w: self.chunk(xi, w, self.selector(t, r)), x, ws)

    def selector(self, t, r):
        """A chunk's weights at iteration t: with R = 1 behind an optimization barrier with t (pipeline_outputs);
        otherwise chunk r."""
        if self.R == 1:
            return lambda w: jax.lax.optimization_barrier((w, t))[0]
        return lambda w: w[r]


def _run_loop(c: _Loop, x, labels, ws, hp):
    """one_f_one_b's loop inside its shard_map (manual over stage and data) on this stage's and data shard's
    microbatches: T iterations (_iteration), in three loops with ``phases``; returns each data shard's partial
    sums (loss, weight gradients, head gradients[, stage 0's input gradients])."""
    x, labels = x[0, :, 0], labels[:, 0]  # this stage's and this data shard's [M, b/data, ...]
    s = jax.lax.axis_index("stage")
    iteration = functools.partial(_iteration, c, (s, x, labels, ws, hp), c.perms())
    f32 = lambda a: jnp.zeros(a.shape, jnp.float32)  # noqa: E731
    dhp = {k: constrain(f32(a), c.head_grad_axes[k]) for k, a in hp.items()}
    x_shape = jax.eval_shape(c.lookup[0], x[0], hp).shape if c.lookup else x.shape[1:]  # a microbatch's layer input
    zero = jnp.zeros(x_shape, COMPUTE_DTYPE)
    on_x, avals = _residuals_on_x(c, zero, ws) if c.keep else ((), [])
    iteration = functools.partial(iteration, on_x=on_x)
    kept = (tuple(jnp.zeros((c.K, *a.shape), a.dtype) for a in avals) if c.keep
            else jnp.zeros((c.K, *x_shape), COMPUTE_DTYPE))
    carry = (zero, zero, kept, jax.tree.map(f32, ws), dhp,
             jnp.zeros((), jnp.float32), None if c.lookup else jnp.zeros(x.shape, COMPUTE_DTYPE))
    T, W = c.T, c.delay
    if not c.phases:  # one scan, both slots in every iteration, the bubble ones masked
        (_, _, _, dws, dhp, loss, dx_all), _ = jax.lax.scan(iteration, carry, jnp.arange(T))
    else:  # W forward-only iterations (no backward item is ready on any stage), the steady phase, W backward-only
        # ones (no forward item is left)
        carry, _ = jax.lax.scan(functools.partial(iteration, bwd=False), carry, jnp.arange(W))
        carry, _ = jax.lax.scan(iteration, carry, jnp.arange(W, T - W))
        (_, _, _, dws, dhp, loss, dx_all), _ = jax.lax.scan(functools.partial(iteration, fwd=False), carry,
                                                            jnp.arange(T - W, T))
    # each data shard's partial sums, stacked over data: summed outside (one reduction; a psum of BF16 here
    # crashed XLA:CPU's all-reduce promotion)
    sums = (loss[None, None], jax.tree.map(lambda a: a[None], dws), jax.tree.map(lambda a: a[None, None], dhp))
    return sums if c.lookup else (*sums, dx_all[None, :, None])


def _arrays(tree) -> list:
    """The array leaves of a pytree (of a jax.vjp function: its residuals; its other leaves mark unused inputs)."""
    return [a for a in jax.tree.leaves(tree) if hasattr(a, "shape")]


def _residuals_on_x(c: _Loop, x, ws) -> tuple[tuple[bool, ...], list]:
    """Which residuals of a chunk's vjp (the array leaves of jax.vjp's function, a pytree) depend on the chunk's
    input x, by dead-code elimination of their jaxpr, and their avals: the forward slot keeps those in rings; the
    others (the weights, the chunk index: no microbatch's) the backward slot takes from its own trace of the
    chunk's vjp, whose forward is then dead code (XLA removes it)."""
    i32 = jnp.zeros((), jnp.int32)
    closed = jax.make_jaxpr(lambda *a: _arrays(c.chunk_vjp(*a)[1]))(x, ws, i32, i32)
    n, nc = len(closed.jaxpr.outvars), len(closed.jaxpr.constvars)
    jaxpr = pe.convert_constvars_jaxpr(closed.jaxpr)  # consts first, then x
    on_x = tuple(bool(pe.dce_jaxpr(jaxpr, [j == i for j in range(n)])[1][nc]) for i in range(n))
    return on_x, [a for a, k in zip(closed.out_avals, on_x) if k]


def _iteration(c: _Loop, ins: tuple, perms: tuple, carry, t, fwd: bool = True, bwd: bool = True,
               on_x: tuple = ()):
    """Iteration t of one_f_one_b's loop on stage s (``ins`` = (s, x, labels, ws, hp)): the forward slot, the head
    with the last stage's last chunk, the backward slot (one_f_one_b's docstring); ``fwd``/``bwd`` False: that
    slot left out (the phases). ``on_x``: which of the chunk vjp's residuals the rings keep (_residuals_on_x)."""
    S, M, R, SR, K, delay, dp = c.S, c.M, c.R, c.S * c.R, c.K, c.delay, c.dp
    s, x, labels, ws, hp = ins
    lookup, chunk, head, head_grad_axes = c.lookup, c.chunk, c.head, c.head_grad_axes
    forward, back = perms
    recv_f, recv_b, kept, dws, dhp, loss, dx_all = carry
    if fwd:  # the forward slot: item k = t − s, chunk r of microbatch m
        k = t - s
        r, m = (k % SR) // S, jnp.clip((k // SR) * S + k % S, 0, M - 1)
        f_real = (k >= 0) & (k < R * M)
        x_in = jnp.where((s == 0) & (r == 0), lookup[0](x[m], hp) if lookup else x[m], recv_f)
        if c.keep:  # the chunk's residuals of microbatch m into the rings (the slot is free: one_f_one_b's docstring)
            y, f = c.chunk_vjp(x_in, ws, t, r)
            res = [a for a, k in zip(_arrays(f), on_x) if k]
            kept = tuple(b.at[k % K].set(a.astype(b.dtype)) for b, a in zip(kept, res))
        else:  # only the input, its forward run again in the backward slot
            kept = kept.at[k % K].set(jnp.where(f_real, x_in, kept[k % K]))
            y = chunk(x_in, ws, c.selector(t, r))
        recv_f = jax.lax.ppermute(y, "stage", forward)
    if fwd and bwd:  # the head runs with the last stage's last chunk, forward and backward in one iteration
        loss_f, head_vjp = jax.vjp(lambda yy, h: head(yy, labels[m], h), y, hp)
        dy_head, dh = head_vjp(jnp.ones_like(loss_f) / (M * dp))  # the mean over every data shard's tokens
        head_real = f_real & (s == S - 1) & (r == R - 1)  # the head's microbatch is the backward's (same t)
        dhp = {n: constrain(a + jnp.where(head_real, dh[n], 0).astype(a.dtype), head_grad_axes[n])
               for n, a in dhp.items()}
        loss = loss + jnp.where(head_real, loss_f, 0.0) / (M * dp)
    if bwd:  # the backward slot: item j, chunk rb of microbatch mb, its input kept as item kb
        j = t - delay - (S - 1 - s)
        group, i = j // SR, j % S
        rb = R - 1 - (j % SR) // S
        mb = jnp.clip(group * S + i, 0, M - 1)
        b_real, last = (j >= 0) & (j < R * M), (s == S - 1) & (rb == R - 1)
        slot = (group * SR + rb * S + i) % K
        if c.keep:  # the vjp rebuilt: its residuals of microbatch mb from the rings, the others from a trace whose
            # forward (on zeros) nothing reads
            leaves, tree = jax.tree.flatten(c.chunk_vjp(jnp.zeros_like(recv_f), ws, t, rb)[1])
            flags, rings = iter(on_x), iter(kept)
            chunk_vjp = jax.tree.unflatten(tree, [next(rings)[slot] if hasattr(a, "shape") and next(flags) else a
                                                  for a in leaves])
        else:  # the chunk's forward again from its kept input
            _, chunk_vjp = c.chunk_vjp(kept[slot], ws, t, rb)
        dx, dw = chunk_vjp(jnp.where(last, dy_head, recv_b) if fwd else recv_b)
        dws = jax.tree.map(lambda a, b: a + jnp.where(b_real, b, 0).astype(a.dtype), dws, dw)
        first = b_real & (s == 0) & (rb == 0)
        if lookup:  # stage 0's lookup: its gradient into the head's accumulators
            de = lookup[1](x[mb], dx)
            dhp = {n: constrain(a + jnp.where(first, de[n], 0).astype(a.dtype), head_grad_axes[n])
                   if n in de else a for n, a in dhp.items()}
        else:
            dx_all = dx_all.at[mb].set(jnp.where(first, dx, dx_all[mb]))
        recv_b = jax.lax.ppermute(dx, "stage", back)
    return (recv_f, recv_b, kept, dws, dhp, loss, dx_all), None
