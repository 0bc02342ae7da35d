"""The FFN stack as a Flax NNX module: L blocks of x·W_in (D×F) then ·W_out (F×D), no biases, run
with one ``jax.lax.scan`` over the stacked weights so the XLA program holds the block body once and
compile time does not grow with depth.

Precision (questions-4d.md; Scaling Book training page): master weights are FP32 and stay sharded
(D over fsdp, F over tensor). Inside the scan body each block's FP32 weight shard is cast to BF16
*first* and only then gathered over fsdp (ffn_model.sharded.gather_bf16), so the FSDP all-gather moves BF16 bytes;
its custom backward reduce-scatters the BF16 weight gradient back to the shard and only then casts it
to FP32, so the gradient reduce-scatter moves BF16 bytes too and the gradients are FP32 from there on.

Saved activations (what backward keeps per block; the gathered BF16 weights are never kept, the
backward gathers them again as FSDP does):
  none          x (block input, [B,D]) and h (hidden, [B,F]) of every block
  full          only x of every block (h recomputed: one more forward matmul pair per block)
  every-second  blocks taken in pairs: the first keeps only x, the second x and h; an odd last
                block keeps only x (scaling.core.schedule.saved_blocks)

The FFN family's program (ffn_model.families): build, input_layout, batch_dtypes, synthetic_batch, loss and
pipeline_loss_fn (the stack as a pipeline over ``stage``: ffn_pipeline_outputs, pipeline_loss), each from the Workload.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from ffn_model.pipeline import (circular_layout, live_slots, pad_stack, pipeline_outputs, real_blocks,
                                split_microbatches, uneven_stages)
from ffn_model.sharded import (COMPUTE_DTYPE, already_gathered, constrain, gather_bf16, gather_once, init_normal, param,
                               reshard)
from ffn_model.task import mse, teacher_batch
from scaling.families.ffn import FFNConfig
from scaling.core.policies import FsdpGather, Remat, check_remat
from scaling.core.sharding import H_AXES, W_IN_AXES, W_OUT_AXES, X_AXES, X_SP_AXES, shards
from scaling.core.workload import Workload


# Under sequence parallelism the stack carries its activations transposed, x^T [D, B] with the tokens minor:
# the reduce-scatter of a block's output then splits the minor dimension. XLA:TPU's all-reduce-scatter fusion
# pads a reduce-scatter along a 2nd-minor dimension (the tokens of x [B, D]) to its pipelining spans and fixes
# the shards up with a collective-permute (libtpu 0.0.42.1; D = 4096, F = 16384, fsdp=2, tensor=4 on
# v5p:2x2x2, B = 8192: 4480 rows all-reduced for 4096 and a 288-row permute, +6.6% of the tensor bytes);
# along the minor one it does not (FFNStack says the same of W_in's gradient).
XT_AXES, XT_SP_AXES, HT_AXES = X_AXES[::-1], X_SP_AXES[::-1], H_AXES[::-1]


def block(x, w_in, w_out, activation=None, hidden_name="hidden", gather=gather_bf16, sp=False):
    """One block on one layer's weight shards: x[B,D] bf16 -> x·W_in^T (W_in [F,D]) -> act -> ·W_out ([F,D])
    -> [B,D] bf16.
    The hidden (before the activation) is tagged ``hidden_name`` for the remat policies. ``gather``
    turns a weight shard into the BF16 weight the matmul uses (default: gathered over fsdp here).
    ``sp`` (sequence parallelism): x arrives transposed, x^T [D, B], split over tensor along the tokens
    (XT_SP_AXES), and is all-gathered for W_in: h^T = W_in·x^T, y^T = W_out^T·h^T; the output's partial
    sums over tensor are reduce-scattered back to that split instead of all-reduced."""
    if sp:  # the input as saved for backward is the token split (1/Y of it); only the all-gather's result is full
        x = reshard(constrain(x, XT_SP_AXES), XT_AXES, XT_SP_AXES)
        h = checkpoint_name(constrain(gather(w_in, W_IN_AXES[1:]) @ x, HT_AXES), hidden_name)
        if activation:
            h = getattr(jax.nn, activation)(h)
        return reshard(gather(w_out, W_OUT_AXES[1:]).T @ h, XT_SP_AXES, XT_AXES)
    x = constrain(x, X_AXES)
    h = x @ gather(w_in, W_IN_AXES[1:]).T
    h = checkpoint_name(constrain(h, H_AXES), hidden_name)
    if activation:
        h = getattr(jax.nn, activation)(h)
    return constrain(h @ gather(w_out, W_OUT_AXES[1:]), X_AXES)


def _pair(x, w_in, w_out, activation=None, gather=gather_bf16, sp=False, live=None):
    """Two blocks (w_* [2, ...]): the first keeps only its input, the second its input and hidden. ``live``: whether
    each is a real block (uneven stages: a padding slot passes its input on, stack_forward)."""
    y = block(x, w_in[0], w_out[0], activation, hidden_name="hidden_recomputed", gather=gather, sp=sp)
    y = y if live is None else jnp.where(live[0], y, x)
    y = checkpoint_name(y, "block_in")
    z = block(y, w_in[1], w_out[1], activation, gather=gather, sp=sp)
    return z if live is None else jnp.where(live[1], z, y)


@jax.custom_vjp
def _pairs(w):
    """[2k, ...] -> [k, 2, ...] (free: a bitcast), for the every-second scan over pairs of blocks."""
    return w.reshape(w.shape[0] // 2, 2, *w.shape[1:])


def _pairs_fwd(w):
    return _pairs(w), None


def _pairs_bwd(_, g):
    # Back to the parameters' [2k, ...] shape behind an optimization barrier. Without it XLA sinks
    # the reshape through the AdamW update, computes mu, nu in the [k, 2, ...] shape and so cannot
    # update them in place: two extra FP32 copies of a weight stack (XXL, fsdp=16, tensor=4, v5p
    # 4x4x4, every-second: peak 68.86 GB without, 65.67 GB with; libtpu 0.0.42.1).
    return (jax.lax.optimization_barrier(g.reshape(g.shape[0] * 2, *g.shape[2:])),)


_pairs.defvjp(_pairs_fwd, _pairs_bwd)


# jax.checkpoint policies. The inputs of the checkpointed function (x and the weight shards, which
# the scan reads from the stacked parameters) are always available to backward; the policies say
# which intermediates are kept besides. Unnamed values, the gathered BF16 weights included, are
# recomputed in backward.
_KEEP_HIDDEN = jax.checkpoint_policies.save_only_these_names("hidden", "block_in")
_KEEP_INPUT = jax.checkpoint_policies.nothing_saveable


def stack_forward(x, w_in, w_out, activation=None, remat="none", gather=gather_bf16, sp=False, live=None):
    """Run the L blocks with lax.scan over the stacked weights w_in [L,F,D], w_out [L,F,D]; ``sp``: the
    blocks' inputs and outputs split over tensor along the tokens and carried transposed (sequence
    parallelism, ``block``); x and the result are [B, D] either way. ``live``: a stage of uneven stages, its real
    slots (ffn_model.pipeline.padded_slots): slot j's block output is kept where j < live, else its input passes on
    (a masked update x = where(j < live, block(x), x): the padding slot's FLOPs are executed, as every stage runs
    Lmax slots in lock-step anyway, and its weights get an exactly zero gradient, the transpose of the select)."""
    check_remat(remat)
    if not sp:
        return _scan_blocks(x, w_in, w_out, activation, remat, gather, sp, live)
    y = _scan_blocks(constrain(x.T, XT_SP_AXES), w_in, w_out, activation, remat, gather, sp, live)
    return constrain(y, XT_SP_AXES).T


def _scan_blocks(x, w_in, w_out, activation, remat, gather, sp, live=None):  # 8 parameters: stack_forward's
    """stack_forward's scans (over pairs of blocks under every-second remat), on x^T under ``sp``."""
    L = w_in.shape[0]
    slot = jnp.arange(L)
    if remat != Remat.EVERY_SECOND:
        policy = _KEEP_HIDDEN if remat == Remat.NONE else _KEEP_INPUT
        # the FFN stack keeps jax's optimization barrier (prevent_cse): without it XLA:TPU's 'overlap' schedule of the
        # XXL (v5p 4x4x4, fsdp=16, tensor=4) leaves 0.21 of the closed form's exposed fsdp bytes exposed, a schedule
        # the closed form does not model yet; on XLA:GPU its FP32 weight slices are then copied (docs/findings.md)
        body = jax.checkpoint(functools.partial(block, activation=activation, gather=gather, sp=sp), policy=policy)
        if live is None:
            x, _ = jax.lax.scan(lambda c, w: (body(c, *w), None), x, (w_in, w_out))
        else:
            x, _ = jax.lax.scan(lambda c, w: (jnp.where(w[2] < live, body(c, w[0], w[1]), c), None), x,
                                (w_in, w_out, slot))
        return x
    pairs = L // 2
    if pairs:
        # the pairs keep jax's optimization barrier (prevent_cse): without it XLA:TPU's 'overlap' schedule exposes one
        # more gathered matrix (v5p 2x2x1, fsdp=4, 6 blocks: 1.125 of the closed form's exposed fsdp bytes), and on
        # XLA:GPU each pair-pass's FP32 weights are copied out of the stacks (docs/findings.md, issue 39)
        body = jax.checkpoint(functools.partial(_pair, activation=activation, gather=gather, sp=sp),
                              policy=_KEEP_HIDDEN)
        # [2k, D, F] -> [k, 2, D, F] is free for even L; odd L slices off the last block first.
        wi, wo = (w_in, w_out) if L % 2 == 0 else (w_in[: 2 * pairs], w_out[: 2 * pairs])
        if live is None:
            x, _ = jax.lax.scan(lambda c, w: (body(c, *w), None), x, (_pairs(wi), _pairs(wo)))
        else:
            x, _ = jax.lax.scan(lambda c, w: (body(c, w[0], w[1], live=w[2] < live), None), x,
                                (_pairs(wi), _pairs(wo), slot[: 2 * pairs].reshape(pairs, 2)))
    if L % 2:
        last = jax.checkpoint(functools.partial(block, activation=activation, gather=gather, sp=sp), policy=_KEEP_INPUT)
        y = last(x, w_in[L - 1], w_out[L - 1])
        x = y if live is None else jnp.where(L - 1 < live, y, x)
    return x


class FFNStack(nnx.Module):
    """L scanned blocks; parameters w_in [L,F,D] and w_out [L,F,D] (FP32) carry their logical axes
    (``param``).

    W_in is stored transposed, [F, D] per block (h = x·W_in^T), so that both weights keep D, the
    FSDP-sharded dimension, minor (why: docs/findings.md, "W_in's layout")."""

    def __init__(self, w: Workload, *, rngs: nnx.Rngs):
        """The stack of ``w`` (FFNConfig; its remat and sequence parallelism), validated where ``w`` was built."""
        cfg: FFNConfig = w.model
        D, F, L = cfg.d_model, cfg.d_ff, cfg.blocks
        self.activation = cfg.activation
        self.remat = w.remat
        self.sequence_parallel = sequence_parallel = w.schedule.sequence_parallel
        self.output_axes = X_SP_AXES if sequence_parallel else X_AXES  # where the stack's output lies
        # uneven stages: the stacks padded to S·Lmax slots, zeros in the padding (ffn_model.pipeline.pad_stack)
        self.stage_blocks = counts = uneven_stages(w)
        pad = (lambda a: a) if counts is None else (lambda a: pad_stack(a, counts))  # noqa: E731
        self.w_in = param(pad(init_normal(rngs.params(), (L, F, D), D)), W_IN_AXES)
        self.w_out = param(pad(init_normal(rngs.params(), (L, F, D), F)), W_OUT_AXES)

    def __call__(self, x_BxD):
        x_BxD = x_BxD.astype(COMPUTE_DTYPE)
        w_in, w_out = self.w_in[...], self.w_out[...]
        if self.stage_blocks is not None:  # a padded stack run whole: its real blocks
            w_in, w_out = real_blocks(w_in, self.stage_blocks), real_blocks(w_out, self.stage_blocks)
        return stack_forward(x_BxD, w_in, w_out, self.activation, self.remat, sp=self.sequence_parallel)


def ffn_pipeline_outputs(x_MxbxD, w_in, w_out, mesh, w: Workload, for_grad: bool = True):
    """Stage 0's buffer [S, M, b, D] of the FFN stack run as a pipeline (pipeline_outputs). ``fsdp_gather="step"``:
    a stage's weights, every chunk of them, gathered over fsdp once per step; ``for_grad=False`` (a
    forward-only step) holds them as BF16, not as the FP32 a gradient accumulates in."""
    R, remat, activation, fsdp_gather = w.schedule.repeats, w.remat, w.model.activation, w.schedule.fsdp_gather
    axes = ("layers", "mlp", "embed")
    ws = circular_layout({"w_in": w_in, "w_out": w_out}, {"w_in": axes, "w_out": axes}, mesh, R)
    gather = gather_bf16
    if fsdp_gather == FsdpGather.STEP:
        step_axes = axes if R == 1 else ("layers", None, "mlp", "embed")
        if for_grad:  # FP32 holding BF16, so that the loop accumulates their gradient in FP32
            ws = {k: gather_once(w, step_axes) for k, w in ws.items()}
            gather = already_gathered
        else:  # forward only: held as the BF16 the all-gather moved
            ws = {k: gather_bf16(w, step_axes) for k, w in ws.items()}
            gather = lambda w, axes: w  # noqa: E731

    counts = uneven_stages(w)

    def chunk(x, ws, select):  # uneven stages or chunks: the chunk's padding slots masked (stack_forward's ``live``)
        return stack_forward(x, ws["w_in"], ws["w_out"], activation, remat,
                             gather=lambda v, axes: gather(select(v), axes),
                             live=None if counts is None else live_slots(counts, R, select))

    return pipeline_outputs(x_MxbxD, ws, mesh, chunk, X_AXES, repeats=R)


def pipeline_loss(params, batch, w: Workload, mesh, for_grad: bool = True):
    """Mean squared error (FP32) over every token of the batch, the stack run as a pipeline of w's M microbatches
    (ffn_model.pipeline). The loss is computed on stage 0 (which holds the outputs) as a per-stage masked sum,
    one scalar all-reduce."""
    M, batch_shards = w.schedule.microbatches, shards(w.mesh, "batch")
    x = split_microbatches(batch["x"], M, batch_shards)
    y = split_microbatches(batch["y"], M, batch_shards)
    buffer = ffn_pipeline_outputs(x, params["w_in"], params["w_out"], mesh, w, for_grad)
    S = buffer.shape[0]
    err = jax.vmap(lambda o: jnp.mean(jnp.square(o.astype(jnp.float32) - y)), spmd_axis_name="stage")(buffer)
    return jnp.sum(jnp.where(jnp.arange(S) == 0, err, 0.0))

# The family's program (ffn_model.families): what the train step asks of a model family, the same functions in
# ffn_model.transformer.


def build(w: Workload, seed: int = 0) -> FFNStack:
    """The FFN stack of ``w`` (FFNStack), its parameters drawn from ``seed`` (init_normal: N(0, 1/fan_in))."""
    return FFNStack(w, rngs=nnx.Rngs(seed))


def input_layout(cfg: FFNConfig, batch_tokens: int):
    """(shape, logical axes) of a batch's x and y: B token vectors [B, D] over (batch, act_embed)."""
    return (batch_tokens, cfg.d_model), X_AXES


def batch_dtypes(cfg: FFNConfig):
    """(x, y) element types of a batch: BF16 inputs, FP32 targets (ffn_model.task)."""
    return COMPUTE_DTYPE, jnp.float32


def synthetic_batch(cfg: FFNConfig, shape: tuple, seed: int = 0):
    """step -> batch of ``shape``: the teacher regression (ffn_model.task.teacher_batch), not jitted."""
    return teacher_batch(shape, cfg.d_model, seed)


def loss(model: FFNStack, batch):
    """The stack's loss on one batch: the MSE of its output against y (ffn_model.task.mse)."""
    return mse(model(batch["x"]), batch["y"], model.output_axes)


def pipeline_loss_fn(w: Workload, mesh, for_grad: bool = True):
    """(params, batch) -> loss with the blocks run as a pipeline over ``stage`` (pipeline_loss; ``for_grad=False``:
    a forward-only step, its weights gathered once per step in BF16)."""
    return functools.partial(pipeline_loss, w=w, mesh=mesh, for_grad=for_grad)
