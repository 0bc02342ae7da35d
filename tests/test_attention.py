"""ffn_model.attention against a plain FP32 causal softmax attention written here with jnp.

Tolerances. Inputs are BF16 of unit scale (q, k, v ~ N(0, 1)); the reference computes in FP32 from the
same BF16 values, so the differences come from the kernels' own BF16 roundings: BF16 keeps 8
significant bits, a rounding moves a value by at most 2^-9 ~ 2e-3 of itself. Forward: p rounded to BF16
(<= 2e-3 relative per entry, averaged over the keys) and o rounded to BF16 (|o| <= ~2 -> <= 8e-3);
atol 2e-2 on unit-scale outputs is ~3x the worst observed (7e-3) and far below what a wrong mask,
scale or head grouping gives (O(0.1 - 1)). lse has no BF16 step (FP32 scores from exact BF16 products):
atol 1e-4. Gradients pass through three BF16 roundings (p, ds, the gradient itself) each up to 2^-9 of
the gradient's scale: we allow 2e-2 of max|reference gradient| (~10 such roundings; observed: one BF16
ulp, 2^-9..2^-8 of the scale), while a missing rowsum term, scale or lse cotangent errs by O(1).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jex
from jax.sharding import AxisType, PartitionSpec as P

from tests.helpers import FWD_ATOL, GRAD_RTOL, LSE_ATOL, attention_loss, reference_attention
from ffn_model.attention import (RESIDUAL_NAMES, attention_materialized, flash_attention, flash_attention_o, merge,
                                 ring_attention, ulysses_attention)

pytestmark = pytest.mark.compiles

B, T, H, BLOCK = 2, 64, 16, 16


def _inputs(N=4, K=2, seed=0):
    kq, kk, kv, kw = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (B, T, N, H)).astype(jnp.bfloat16)
    k = jax.random.normal(kk, (B, T, K, H)).astype(jnp.bfloat16)
    v = jax.random.normal(kv, (B, T, K, H)).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (B, T, N, H))  # the fixed cotangent of the loss sum(o * w)
    return q, k, v, w


POS = jnp.arange(T, dtype=jnp.int32)


reference = reference_attention
_loss = attention_loss


@jax.jit
def _reference_grads(q, k, v, w):
    return jax.grad(_loss(lambda q, k, v: reference(q, k, v)[0], w), argnums=(0, 1, 2))(q, k, v)


def _check_grads(attend, q, k, v, w):
    got = jax.jit(jax.grad(_loss(attend, w), argnums=(0, 1, 2)))(q, k, v)
    want = _reference_grads(q, k, v, w)
    for name, g, r in zip("qkv", got, want):
        assert g.dtype == jnp.bfloat16, name
        scale = float(jnp.max(jnp.abs(r)))
        np.testing.assert_allclose(np.asarray(g, np.float32), r, atol=GRAD_RTOL * scale, rtol=0, err_msg=f"d{name}")


MATERIALIZED = lambda q, k, v: attention_materialized(q, k, v, POS, POS)  # noqa: E731
FLASH = lambda q, k, v: flash_attention_o(q, k, v, POS, POS, BLOCK)  # noqa: E731


def test_forward_matches_reference():
    q, k, v, _ = _inputs()
    o_ref, lse_ref = reference(q, k, v)
    o_m = jax.jit(MATERIALIZED)(q, k, v)
    o_f, lse = jax.jit(flash_attention, static_argnums=5)(q, k, v, POS, POS, BLOCK)
    assert o_m.dtype == o_f.dtype == jnp.bfloat16 and o_f.shape == q.shape
    assert lse.dtype == jnp.float32 and lse.shape == (B, q.shape[2], T)
    np.testing.assert_allclose(np.asarray(o_m, np.float32), o_ref, atol=FWD_ATOL)
    np.testing.assert_allclose(np.asarray(o_f, np.float32), o_ref, atol=FWD_ATOL)
    np.testing.assert_allclose(lse, lse_ref, atol=LSE_ATOL)
    o_one, _ = flash_attention(q, k, v, POS, POS, 4 * T)  # block >= S: one block
    np.testing.assert_allclose(np.asarray(o_one, np.float32), o_ref, atol=FWD_ATOL)


@pytest.mark.parametrize("attend", [MATERIALIZED, FLASH], ids=["materialized", "flash"])
def test_gradients_match_reference(attend):
    _check_grads(attend, *_inputs())


def test_flash_block_must_divide_keys():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="S=64.*block=24"):
        flash_attention(q, k, v, POS, POS, 24)


def _residuals(f, *args):
    """The arrays jax.vjp keeps for the backward (the leaves of its closure; traced, not run)."""
    leaves = jax.eval_shape(lambda *a: jax.tree_util.tree_leaves(jax.vjp(f, *a)[1]), *args)
    return [(x.shape, x.dtype) for x in leaves]


def _nbytes(residuals):
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in residuals)


def _count(jaxpr, per_eqn):
    """sum of per_eqn(eqn) over a jaxpr and its sub-jaxprs, a scan's body times its length, every cond
    branch counted (the static count of what the program holds)."""
    total = 0
    for eqn in jaxpr.eqns:
        total += per_eqn(eqn)
        trips = eqn.params["length"] if eqn.primitive.name == "scan" else 1
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if isinstance(sub, (jex.ClosedJaxpr, jex.Jaxpr)):
                    total += trips * _count(getattr(sub, "jaxpr", sub), per_eqn)
    return total


def _is(name):
    return lambda eqn: int(eqn.primitive.name == name)


def _dot_flops(eqn):
    if eqn.primitive.name != "dot_general":
        return 0
    (contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(np.prod([lhs[d] for d in contract]))


def test_saved_residuals():
    q, k, v, _ = _inputs()
    N, K = q.shape[2], k.shape[2]
    qkv = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
    # materialized: q, k, v and p in BF16 [B, K, G, T, S], 2 bytes per score, nothing else
    assert _residuals(MATERIALIZED, q, k, v) == qkv + [((B, K, N // K, T, T), jnp.bfloat16)]
    # flash: q, k, v, o (BF16), lse (FP32) and the positions (one array here: q_pos is k_pos); no [T, S]
    saved = _residuals(lambda q, k, v: flash_attention(q, k, v, POS, POS, BLOCK), q, k, v)
    assert saved == qkv + [(q.shape, jnp.bfloat16), ((B, N, T), jnp.float32), ((T,), jnp.int32)]


def test_fully_masked_rows():
    """Queries whose keys are all in their future: o = 0, lse = -inf, finite gradients."""
    q, k, v, w = _inputs()
    k_pos = POS + T // 2  # queries 0 .. T/2-1 see no key
    o_ref, lse_ref = reference(q, k, v, POS, k_pos)
    o_ref = jnp.nan_to_num(o_ref)  # the reference's softmax of an all -inf row is NaN
    o_f, lse = flash_attention(q, k, v, POS, k_pos, BLOCK)
    o_m = attention_materialized(q, k, v, POS, k_pos)
    for o in (o_f, o_m):
        assert not jnp.any(jnp.isnan(o)) and jnp.all(o[:, : T // 2] == 0)
        np.testing.assert_allclose(np.asarray(o, np.float32), o_ref, atol=FWD_ATOL)
    assert jnp.all(lse[..., : T // 2] == -jnp.inf) and not jnp.any(jnp.isnan(lse))
    np.testing.assert_allclose(lse[..., T // 2:], lse_ref[..., T // 2:], atol=LSE_ATOL)
    for attend in (lambda q, k, v: attention_materialized(q, k, v, POS, k_pos),
                   lambda q, k, v: flash_attention_o(q, k, v, POS, k_pos, BLOCK)):
        for g in jax.jit(jax.grad(_loss(attend, w), argnums=(0, 1, 2)))(q, k, v):
            assert jnp.all(jnp.isfinite(g.astype(jnp.float32)))


def test_merge():
    q, k, v, w = _inputs()
    o_ref, lse_ref = reference(q, k, v)
    half = T // 2
    parts = [flash_attention(q, k[:, sl], v[:, sl], POS, POS[sl], BLOCK) for sl in (slice(0, half), slice(half, T))]
    o, lse = merge(*parts[0], *parts[1])  # the second half is fully masked for queries < T/2
    assert o.dtype == lse.dtype == jnp.float32
    np.testing.assert_allclose(o, o_ref, atol=FWD_ATOL)
    np.testing.assert_allclose(lse, lse_ref, atol=LSE_ATOL)
    # one side fully masked: the other side unchanged; both masked: o = 0, lse = -inf; no NaN, gradients included
    o1, lse1 = parts[0]
    none_o, none_lse = jnp.zeros_like(o1), jnp.full_like(lse1, -jnp.inf)
    o, lse = merge(o1, lse1, none_o, none_lse)
    np.testing.assert_allclose(o, o1.astype(jnp.float32), atol=1e-6)
    np.testing.assert_allclose(lse, lse1, atol=1e-6)
    o, lse = merge(none_o, none_lse, none_o, none_lse)
    assert jnp.all(o == 0) and jnp.all(lse == -jnp.inf)

    def loss(o1, lse1, o2, lse2):
        o, lse = merge(o1, lse1, o2, lse2)
        return jnp.sum(o * w) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    for args in ((o1, lse1, none_o, none_lse), (none_o, none_lse, none_o, none_lse)):
        for g in jax.grad(loss, argnums=(0, 1, 2, 3))(*[a.astype(jnp.float32) for a in args]):
            assert jnp.all(jnp.isfinite(g))


def _sharded(body, C, check_vma=False):
    """body(q, k, v) inside a jax.shard_map manual over a C-device "context" axis (sequence axis sharded),
    the pattern of ffn_model/pipeline.py (check_vma=False there; the kernels also type-check with True)."""
    mesh = jax.make_mesh((C,), ("context",), (AxisType.Auto,), devices=jax.devices()[:C])
    seq = P(None, "context")
    return jax.shard_map(body, mesh=mesh, in_specs=(seq, seq, seq), out_specs=seq, axis_names={"context"},
                         check_vma=check_vma)


def _check_sharded(f, q, k, v, w):
    o = jax.jit(f)(q, k, v)
    assert o.dtype == jnp.bfloat16 and o.shape == q.shape
    np.testing.assert_allclose(np.asarray(o, np.float32), reference(q, k, v)[0], atol=FWD_ATOL)
    _check_grads(f, q, k, v, w)


@pytest.mark.parametrize("C,check_vma", [(2, False), (4, False), (4, True), (8, False)])
def test_ring_attention(C, check_vma):
    _check_sharded(_sharded(lambda q, k, v: ring_attention(q, k, v, "context", BLOCK), C, check_vma), *_inputs())


@pytest.mark.parametrize("C,attend,check_vma", [(2, "materialized", False), (4, "materialized", False),
                                                (4, "flash", True)])
def test_ulysses_attention(C, attend, check_vma):
    attend = attention_materialized if attend == "materialized" else functools.partial(flash_attention_o, block=BLOCK)
    f = _sharded(lambda q, k, v: ulysses_attention(q, k, v, "context", attend), C, check_vma)
    _check_sharded(f, *_inputs(N=8, K=4))  # K divisible by C


# ---------------------------------------------------------------------------------------------------
# Remat: the kernels' residuals carry checkpoint_names (RESIDUAL_NAMES), so a save_only_these_names policy
# keeps them and the backward recomputes no forward.

RING_C = 4


def _named_attention(attend):
    def f(q, k, v):
        q, k, v = (checkpoint_name(x, n) for x, n in zip((q, k, v), "qkv"))
        return attend(q, k, v)
    return f


def _remat(kind, names):
    if kind == "ring":  # names inside the shard_map, as ffn_model.transformer does
        f = _sharded(_named_attention(lambda q, k, v: ring_attention(q, k, v, "context", BLOCK)), RING_C)
    else:
        f = _named_attention(MATERIALIZED if kind == "materialized" else FLASH)
    policy = jax.checkpoint_policies.save_only_these_names(*names)
    return jax.checkpoint(lambda q, k, v: checkpoint_name(f(q, k, v), "attn_out"), policy=policy)


@pytest.mark.parametrize("kind", ["materialized", "flash", "ring"])
def test_remat_policy_keeps_named_residuals(kind):
    q, k, v, w = _inputs()
    N, K = q.shape[2], k.shape[2]
    saved = _residuals(_remat(kind, ("q", "k", "v", "attn_out", *RESIDUAL_NAMES)), q, k, v)
    qkv = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
    o, lse = (q.shape, jnp.bfloat16), ((B, N, T), jnp.float32)
    if kind == "materialized":  # p [B, K, G, T, S] BF16 kept
        assert saved == qkv + [((B, K, N // K, T, T), jnp.bfloat16)]
    elif kind == "flash":  # o, lse kept (and the positions, a constant)
        assert saved == qkv + [o, lse, ((T,), jnp.int32)]
    else:  # the named output o (the ring's o residual too, kept once) and, from inside the shard_map, the
        # chunks' q, k, v, lse (global leaves [C.B, T/C, ...]): the same bytes as whole q, k, v, o, lse
        assert len(saved) == 5 and _nbytes(saved) == _nbytes(qkv + [o, lse])
    # exp per key block: forward 2 (p and the rescale), backward 1 (p from lse); ring: + 2 per chunk's merge
    nb, nb_ring = T // BLOCK, max(1, T // RING_C // BLOCK)
    exps = {"materialized": 1, "flash": 3 * nb, "ring": RING_C * (3 * nb_ring + 2)}[kind]

    def grad_exps(names):
        loss = lambda q, k, v: jnp.sum(_remat(kind, names)(q, k, v).astype(jnp.float32) * w)  # noqa: E731
        return _count(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr, _is("exp"))

    assert grad_exps(("q", "k", "v", "attn_out", *RESIDUAL_NAMES)) == exps  # no second forward
    assert grad_exps(("q", "k", "v", "attn_out")) > exps  # the control: unnamed residuals are recomputed


# ---------------------------------------------------------------------------------------------------
# Ring attention's custom_vjp: O(T/C) residuals, its permutes and static FLOPs as the docstring states.

def _ring(C):
    return _sharded(lambda q, k, v: ring_attention(q, k, v, "context", BLOCK), C)


@pytest.mark.parametrize("C", [2, 4, 8])
def test_ring_residuals(C):
    """q, k, v, o (BF16) and lse (FP32) of the device's chunk, nothing per step: 4.B.Tc.(N+K).H + 4.B.N.Tc
    bytes per device (the global leaves hold the C devices' residuals)."""
    q, k, v, _ = _inputs()
    N, K, Tc = q.shape[2], k.shape[2], T // C
    saved = _residuals(_ring(C), q, k, v)
    assert len(saved) == 5
    assert sorted(np.dtype(d).name for _, d in saved) == ["bfloat16"] * 4 + ["float32"]
    assert _nbytes(saved) == C * (4 * B * Tc * (N + K) * H + 4 * B * N * Tc)


@pytest.mark.parametrize("C", [2, 4, 8])
def test_ring_permutes_and_flops(C):
    """Per device: forward C-1 permutes of k and of v; backward C-1 of the stacked (k, v), C-1 of the
    stacked FP32 (dk, dv) and their BF16 hop home, nothing else. Static dot FLOPs (every cond branch
    counted): C chunks."""
    q, k, v, w = _inputs()
    N, K, Tc = q.shape[2], k.shape[2], T // C
    f = _ring(C)
    fwd = jax.make_jaxpr(f)(q, k, v).jaxpr
    grad = jax.make_jaxpr(jax.grad(_loss(f, w), argnums=(0, 1, 2)))(q, k, v).jaxpr

    def permuted(shape, dtype):
        return lambda e: sum(x.aval.shape == shape and x.aval.dtype == dtype for x in e.invars) \
            if e.primitive.name == "ppermute" else 0

    chunk, stacked = (B, Tc, K, H), (2, B, Tc, K, H)
    assert _count(fwd, _is("ppermute")) == 2 * (C - 1)
    assert _count(fwd, permuted(chunk, jnp.bfloat16)) == 2 * (C - 1)
    # the grad's jaxpr holds the forward's permutes and the backward's; the backward's are the stacked ones
    assert _count(grad, _is("ppermute")) == 2 * (C - 1) + (C - 1) + C
    assert _count(grad, permuted(stacked, jnp.bfloat16)) == (C - 1) + 1
    assert _count(grad, permuted(stacked, jnp.float32)) == C - 1
    F = B * Tc * Tc * N * H
    assert _count(fwd, _dot_flops) == 4 * C * F
    assert _count(grad, _dot_flops) == 4 * C * F + 10 * C * F + 2 * B * Tc * N * H
