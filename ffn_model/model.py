"""The FFN stack as a Flax NNX module: L blocks of x·W_in (D×F) then ·W_out (F×D), no biases, run
with one ``jax.lax.scan`` over the stacked weights so the XLA program holds the block body once and
compile time does not grow with depth.

Precision (questions-4d.md; Scaling Book training page): master weights are FP32 and stay sharded
(D over fsdp, F over tensor). Inside the scan body each block's FP32 weight shard is cast to BF16
*first* and only then gathered over fsdp (``gather_bf16``), so the FSDP all-gather moves BF16 bytes;
its custom backward reduce-scatters the BF16 weight gradient back to the shard and only then casts it
to FP32, so the gradient reduce-scatter moves BF16 bytes too and the gradients are FP32 from there on.

Saved activations (what backward keeps per block; the gathered BF16 weights are never kept, the
backward gathers them again as FSDP does):
  none          x (block input, [B,D]) and h (hidden, [B,F]) of every block
  full          only x of every block (h recomputed: one more forward matmul pair per block)
  every-second  blocks taken in pairs: the first keeps only x, the second x and h; an odd last
                block keeps only x (scaling.config.saved_blocks)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from mesh.rules import FLAX_RULES, check_logical, logical_to_spec
from scaling.config import FFNConfig, check_remat
from scaling.sharding import H_AXES, W_IN_AXES, W_OUT_AXES, X_AXES, X_SP_AXES

COMPUTE_DTYPE = jnp.bfloat16
PARAM_DTYPE = jnp.float32


def constrain(x, logical_axes):
    """with_sharding_constraint through the logical-axis table, when a mesh is set (jax.set_mesh);
    a no-op without one, so the module also runs unsharded."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes))


def _gathered(logical_axes):
    """The logical axes of a weight slice after the FSDP all-gather: embed (D) unsharded."""
    return tuple(None if a == "embed" else a for a in logical_axes)


def to_bf16(w):
    """FP32 -> BF16 rounded to nearest even: the same values as ``w.astype(jnp.bfloat16)`` for
    finite w, rounded with integer ops (through a bitcast) so that only one layer's BF16 weights exist at a
    time; why: docs/findings.md, "BF16 weight casts inside the scan"."""
    u = jax.lax.bitcast_convert_type(w.astype(jnp.float32), jnp.uint32)
    u = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(u, jnp.float32).astype(COMPUTE_DTYPE)


_ZERO1 = contextvars.ContextVar("zero1_gradients", default=False)


@contextlib.contextmanager
def zero1_gradients(on: bool):
    """While tracing a train step under ZeRO-1 (Schedule.optimizer_sharding): weight gradients are reduced to
    grad_axes' layout."""
    token = _ZERO1.set(bool(on))
    try:
        yield
    finally:
        _ZERO1.reset(token)


def grad_axes(logical_axes):
    """The layout a weight's gradient is reduced to: the weight's own, or under zero1_gradients with D split
    over data·fsdp (the logical axis embed_zero1), so that one reduce-scatter over data·fsdp replaces the
    reduce-scatter over fsdp and the all-reduce over data."""
    return tuple("embed_zero1" if a == "embed" and _ZERO1.get() else a for a in logical_axes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def gather_bf16(w, logical_axes):
    """FP32 weight shard -> BF16, then gathered over fsdp (the all-gather moves BF16)."""
    return constrain(to_bf16(w), _gathered(logical_axes))


def _gather_bf16_fwd(w, logical_axes):
    return gather_bf16(w, logical_axes), None


def _gather_bf16_bwd(logical_axes, _, g):
    # g: BF16 gradient of the gathered weight (partial sums over data·fsdp). Reduce-scatter it to the
    # weight's shard (grad_axes: over data too under ZeRO-1) in BF16, then cast to the FP32 master dtype.
    return (constrain(g, grad_axes(logical_axes)).astype(PARAM_DTYPE),)


gather_bf16.defvjp(_gather_bf16_fwd, _gather_bf16_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def gather_once(w, logical_axes):
    """A whole weight stack gathered over fsdp once (a pipeline stage's weights for every microbatch:
    FSDP gathers once per step): the all-gather moves BF16; the result is FP32 holding BF16 values (the
    loop's gradient for it accumulates in FP32, each block-pass's reduce-scattered first by
    already_gathered). Backward: the accumulated gradient, already in the shard's layout."""
    return constrain(to_bf16(w), _gathered(logical_axes)).astype(PARAM_DTYPE)


def _gather_once_fwd(w, logical_axes):
    return gather_once(w, logical_axes), None


def _gather_once_bwd(logical_axes, _, g):
    return (constrain(g, logical_axes),)


gather_once.defvjp(_gather_once_fwd, _gather_once_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def already_gathered(w, logical_axes):
    """The per-block weight of a stack gathered once (gather_once): its BF16 values, no collective.
    Backward: the block-pass's BF16 gradient reduce-scattered over fsdp to the weight's shard, then FP32,
    so that the loop accumulates sharded FP32 gradients (and every backend reduces the same way)."""
    return w.astype(COMPUTE_DTYPE)


def _already_gathered_fwd(w, logical_axes):
    return already_gathered(w, logical_axes), None


def _already_gathered_bwd(logical_axes, _, g):
    return (constrain(g, logical_axes).astype(PARAM_DTYPE),)


already_gathered.defvjp(_already_gathered_fwd, _already_gathered_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def reshard(x, to_axes, back_axes):
    """x constrained to the logical axes ``to_axes``; its cotangent constrained to ``back_axes``. Sequence
    parallelism's two boundaries (Korthikanti et al. 2022, fig. 5: g and its conjugate g-bar):
    reshard(x, X_AXES, X_SP_AXES) all-gathers the token-split input over tensor, and its backward
    reduce-scatters the input gradient's partial sums straight to the token split;
    reshard(y, X_SP_AXES, X_AXES) reduce-scatters the output's partial sums, and its backward
    all-gathers the gradient. (jax's own transpose of a sharding constraint constrains the cotangent to
    the forward's sharding, which made XLA all-reduce and then slice.)"""
    return constrain(x, to_axes)


def _reshard_fwd(x, to_axes, back_axes):
    return reshard(x, to_axes, back_axes), None


def _reshard_bwd(to_axes, back_axes, _, g):
    return (constrain(g, back_axes),)


reshard.defvjp(_reshard_fwd, _reshard_bwd)


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


def _pair(x, w_in, w_out, activation=None, gather=gather_bf16, sp=False):
    """Two blocks (w_* [2, ...]): the first keeps only its input, the second its input and hidden."""
    y = block(x, w_in[0], w_out[0], activation, hidden_name="hidden_recomputed", gather=gather, sp=sp)
    y = checkpoint_name(y, "block_in")
    return block(y, w_in[1], w_out[1], activation, gather=gather, sp=sp)


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


def stack_forward(x, w_in, w_out, activation=None, remat="none", gather=gather_bf16, sp=False):
    """Run the L blocks with lax.scan over the stacked weights w_in [L,F,D], w_out [L,F,D]; ``sp``: the
    blocks' inputs and outputs split over tensor along the tokens and carried transposed (sequence
    parallelism, ``block``); x and the result are [B, D] either way."""
    check_remat(remat)
    if not sp:
        return _scan_blocks(x, w_in, w_out, activation, remat, gather, sp)
    y = _scan_blocks(constrain(x.T, XT_SP_AXES), w_in, w_out, activation, remat, gather, sp)
    return constrain(y, XT_SP_AXES).T


def _scan_blocks(x, w_in, w_out, activation, remat, gather, sp):
    """stack_forward's scans (over pairs of blocks under every-second remat), on x^T under ``sp``."""
    if remat != "every-second":
        policy = _KEEP_HIDDEN if remat == "none" else _KEEP_INPUT
        body = jax.checkpoint(functools.partial(block, activation=activation, gather=gather, sp=sp), policy=policy)
        x, _ = jax.lax.scan(lambda c, w: (body(c, *w), None), x, (w_in, w_out))
        return x
    L = w_in.shape[0]
    pairs = L // 2
    if pairs:
        body = jax.checkpoint(functools.partial(_pair, activation=activation, gather=gather, sp=sp),
                              policy=_KEEP_HIDDEN)
        # [2k, D, F] -> [k, 2, D, F] is free for even L; odd L slices off the last block first.
        wi, wo = (w_in, w_out) if L % 2 == 0 else (w_in[: 2 * pairs], w_out[: 2 * pairs])
        x, _ = jax.lax.scan(lambda c, w: (body(c, *w), None), x, (_pairs(wi), _pairs(wo)))
    if L % 2:
        last = jax.checkpoint(functools.partial(block, activation=activation, gather=gather, sp=sp), policy=_KEEP_INPUT)
        x = last(x, w_in[L - 1], w_out[L - 1])
    return x


def init_normal(key, shape, fan_in):
    """N(0, 1/fan_in) in FP32: keeps the activation scale through a linear block."""
    return jax.random.normal(key, shape, PARAM_DTYPE) * (fan_in**-0.5)


def param(value, logical_axes):
    """An nnx.Param carrying its logical axes as flax's ``out_sharding`` metadata and the table's
    rules as ``sharding_rules`` (nnx.get_partition_spec / nnx.get_abstract_model turn them into
    PartitionSpecs); an axis the table has no rule for is a ValueError (mesh.rules.check_logical)."""
    return nnx.Param(value, out_sharding=check_logical(logical_axes), sharding_rules=FLAX_RULES)


class FFNStack(nnx.Module):
    """L scanned blocks; parameters w_in [L,F,D] and w_out [L,F,D] (FP32) carry their logical axes
    (``param``).

    W_in is stored transposed, [F, D] per block (h = x·W_in^T), so that both weights keep D, the
    FSDP-sharded dimension, minor (why: docs/findings.md, "W_in's layout")."""

    def __init__(self, cfg: FFNConfig, *, rngs: nnx.Rngs, remat: str = "none", sequence_parallel: bool = False):
        D, F, L = cfg.d_model, cfg.d_ff, cfg.blocks
        self.activation = cfg.activation
        self.remat = check_remat(remat)
        self.sequence_parallel = sequence_parallel
        self.output_axes = X_SP_AXES if sequence_parallel else X_AXES  # where the stack's output lies
        self.w_in = param(init_normal(rngs.params(), (L, F, D), D), W_IN_AXES)
        self.w_out = param(init_normal(rngs.params(), (L, F, D), F), W_OUT_AXES)

    def __call__(self, x_BxD):
        x_BxD = x_BxD.astype(COMPUTE_DTYPE)
        return stack_forward(x_BxD, self.w_in[...], self.w_out[...], self.activation, self.remat,
                             sp=self.sequence_parallel)
