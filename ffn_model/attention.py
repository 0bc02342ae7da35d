"""Causal multi-head self-attention with grouped-query heads: materialized, flash, Ulysses and ring; and the
libraries' kernels, splash (jax's Pallas kernel, TPU) and cuDNN's fused attention (GPU).

Notation (Scaling Book / nanodo): B batch, T query length, S key length, N query heads, K kv heads,
G = N / K query heads per kv head, H head dim, C devices on the sequence (context) axis. Inputs are
q_BxTxNxH, k_BxSxKxH, v_BxSxKxH in BF16 and the tokens' positions in the full sequence q_pos_T,
k_pos_S (int32); query t attends to key s iff k_pos[s] <= q_pos[t]. Query head n uses kv head n // G.

Precision, every kernel: scores s = q.k * H**-0.5 in FP32 (BF16 x BF16 matmul, FP32 accumulation),
softmax in FP32, probabilities cast to BF16 for the P.V matmul (FP32 accumulation), outputs BF16. The
backward matmuls also take BF16 operands (p, ds cast to BF16, as FlashAttention-2 does) with FP32
accumulation; ds itself is formed in FP32.

Executed matmul FLOPs (the causal half is computed and masked): forward 4.B.T.S.N.H; backward
8.B.T.S.N.H from saved p (materialized) or 10.B.T.S.N.H with the scores recomputed (flash). The kernels are
custom_vjps whose residuals carry checkpoint_names (RESIDUAL_NAMES). What each saves, moves and counts, as
compiled: docs/findings.md, "Attention kernels".
"""

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ffn_model.sharded import traced_platform
from scaling.core.kinds import Platform
from scaling.core.schedule import SPLASH_BLOCK

COMPUTE_DTYPE = jnp.bfloat16
# checkpoint_name of the kernels' own residuals, for jax.checkpoint(policy=save_only_these_names(...)): the
# materialized probabilities p, and a flash or ring attention's o and lse. Without a name a custom_vjp's
# residual is not saved under such a policy and the forward is recomputed in the backward. q, k, v are the
# kernels' inputs: the caller names them ("q", "k", "v").
RESIDUAL_NAMES = ("attn_probs", "attn_out", "attn_lse")


def _split_heads(q_BxTxNxH, K):
    B, T, N, H = q_BxTxNxH.shape
    if N % K:
        raise ValueError(f"query heads N={N} must be a multiple of kv heads K={K}")
    return q_BxTxNxH.reshape(B, T, K, N // K, H)


def _visible(q_pos, k_pos, window=None):
    """Query at q_pos sees the key at k_pos iff q_pos - window < k_pos <= q_pos (window None: k_pos <= q_pos);
    broadcasts q_pos [..., T, 1] against k_pos [..., 1, S]."""
    visible = k_pos <= q_pos
    return visible if window is None else visible & (k_pos > q_pos - window)


def _tied(q_pos, k_pos, q, window):
    """With a window: the positions through an optimization barrier with q, so that the masks made from them depend
    on the layer's data. Otherwise the masks depend on nothing the layer computes: jax's partial evaluation and
    XLA's loop-invariant code motion moved them out of the layer loop, the masks of every key block broadcast to
    their scores' shape and held through the step (on v5p 0.7 GB for a 4-layer stack, T = 4096, blocks of 512).
    Without a window the positions are returned as they are (the global programs unchanged)."""
    if window is None:
        return q_pos, k_pos
    return jax.lax.optimization_barrier((q_pos, k_pos, q))[:2]


def _scores(q_BxTxKxGxH, k_BxSxKxH, q_pos_T, k_pos_S, window=None):
    """FP32 scaled scores [B, K, G, T, S], -inf where the key is in the query's future (or before its window)."""
    scale = q_BxTxKxGxH.shape[-1] ** -0.5
    s = jnp.einsum("btkgh,bskh->bkgts", q_BxTxKxGxH, k_BxSxKxH, preferred_element_type=jnp.float32) * scale
    return jnp.where(_visible(q_pos_T[:, None], k_pos_S[None, :], window), s, -jnp.inf)


def _safe(m):
    """A running max with -inf (nothing visible yet) replaced by 0, so exp(s - m) never sees -inf - -inf."""
    return jnp.where(jnp.isfinite(m), m, 0.0)


def _pv(p_BxKxGxTxS, v_BxSxKxH):
    """p.v [B, T, K, G, H] in FP32 from BF16 probabilities."""
    return jnp.einsum("bkgts,bskh->btkgh", p_BxKxGxTxS.astype(COMPUTE_DTYPE), v_BxSxKxH,
                      preferred_element_type=jnp.float32)


def _grads_from_p(p, ds, q5, k, do5):
    """The matmuls that turn p and ds [B, K, G, T, S] into dq5 (FP32, [B,T,K,G,H]), dk, dv (FP32, [B,S,K,H])."""
    scale = q5.shape[-1] ** -0.5
    p16, ds16 = p.astype(COMPUTE_DTYPE), ds.astype(COMPUTE_DTYPE)
    dv = jnp.einsum("bkgts,btkgh->bskh", p16, do5, preferred_element_type=jnp.float32)
    dq5 = jnp.einsum("bkgts,bskh->btkgh", ds16, k, preferred_element_type=jnp.float32) * scale
    dk = jnp.einsum("bkgts,btkgh->bskh", ds16, q5, preferred_element_type=jnp.float32) * scale
    return dq5, dk, dv


# ---------------------------------------------------------------------------------------------------
# Materialized: the whole [T, S] score matrix, p saved in BF16.

def probabilities(q_BxTxNxH, k_BxSxKxH, q_pos_T, k_pos_S, window=None):
    """The BF16 probabilities p = softmax(q.k^T * H**-0.5 + mask) [B, K, G, T, S] of attention_materialized (a row
    with no visible key: p = 0)."""
    s = _scores(_split_heads(q_BxTxNxH, k_BxSxKxH.shape[2]), k_BxSxKxH, q_pos_T, k_pos_S, window)
    e = jnp.exp(s - _safe(jnp.max(s, axis=-1, keepdims=True)))
    row_sum = jnp.sum(e, axis=-1, keepdims=True)
    return (e / jnp.where(row_sum > 0, row_sum, 1.0)).astype(COMPUTE_DTYPE)


def _materialized_fwd(q, k, v, q_pos, k_pos, window=None):
    q_pos, k_pos = _tied(q_pos, k_pos, q, window)
    p = checkpoint_name(probabilities(q, k, q_pos, k_pos, window), "attn_probs")
    o = _pv(p, v).reshape(*q.shape[:-1], v.shape[-1]).astype(COMPUTE_DTYPE)  # v's head dim (MLA: H_v)
    return o, (q, k, v, p)


def _materialized_bwd(window, res, do):
    q, k, v, p = res
    q5, do5 = _split_heads(q, k.shape[2]), _split_heads(do, k.shape[2])
    pf = p.astype(jnp.float32)
    dp = jnp.einsum("btkgh,bskh->bkgts", do5, v, preferred_element_type=jnp.float32)
    ds = pf * (dp - jnp.sum(dp * pf, axis=-1, keepdims=True))
    dq5, dk, dv = _grads_from_p(p, ds, q5, k, do5)
    return (dq5.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def attention_materialized(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, q_pos_T, k_pos_S, window=None):
    """Causal softmax attention o = softmax(q.k^T * H**-0.5 + mask) . v, the [B, K, G, T, S] scores
    materialized at once -> o_BxTxNxH (BF16); a row with no visible key gives o = 0. Saves q, k, v and the
    BF16 probabilities p ("attn_probs"); backward dv = p^T.do, dp = do.v^T, ds = p * (dp - rowsum(dp * p)),
    dq = ds.k * H**-0.5, dk = ds^T.q * H**-0.5. FLOPs: forward 4.B.T.S.N.H, backward 8.B.T.S.N.H.
    Source: Vaswani et al. 2017, eq. 1; the backward as FlashAttention-2 (Dao 2023), Algorithm 2 without the
    recomputation. ``window`` W (sliding-window attention, Beltagy et al. 2020 / Mistral 7B, Jiang et al. 2023):
    query t sees keys t - W < s <= t; the whole [T, S] matrix is still computed and masked (same FLOPs)."""
    return _materialized_fwd(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, q_pos_T, k_pos_S, window)[0]


attention_materialized.defvjp(_materialized_fwd, _materialized_bwd)


# ---------------------------------------------------------------------------------------------------
# Flash: a scan over key blocks with an online softmax; only q, k, v, o, lse saved.

def _blocks(x_BxSx___, nb):
    """[B, S, ...] -> [nb, B, S/nb, ...] (the scan axis first)."""
    B, S = x_BxSx___.shape[:2]
    return jnp.moveaxis(x_BxSx___.reshape(B, nb, S // nb, *x_BxSx___.shape[2:]), 1, 0)


def _unblocks(x_nbxBxbx___):
    nb, B, b = x_nbxBxbx___.shape[:3]
    return jnp.moveaxis(x_nbxBxbx___, 0, 1).reshape(B, nb * b, *x_nbxBxbx___.shape[3:])


def _num_blocks(S, block):
    if block <= 0:
        raise ValueError(f"block={block} must be a positive number of keys")
    if block >= S:
        return 1
    if S % block:
        raise ValueError(f"key length S={S} must be divisible by block={block} (or block >= S for one block)")
    return S // block


def _flash_fwd(q, k, v, q_pos, k_pos, block, window=None):
    """-> (o BF16 [B, T, N, H], lse FP32 [B, N, T]) by key blocks (flash_attention's forward); a window that
    leaves key blocks out of every query block's band runs the banded form (_band_fwd)."""
    B, T, N, H = q.shape
    K, nb = k.shape[2], _num_blocks(k.shape[1], block)
    c = _band(q.shape[1], k.shape[1], block, window)
    q_pos, k_pos = _tied(q_pos, k_pos, q, window)
    if c is not None:
        return _band_fwd(q, k, v, q_pos, k_pos, nb, c, window)
    q5 = _split_heads(q, K)

    def step(carry, blk):
        m, row_sum, acc = carry  # [B,K,G,T] running max and sum, [B,T,K,G,H] FP32 accumulator
        k_blk, v_blk, k_pos_blk = blk
        s = _scores(q5, k_blk, q_pos, k_pos_blk, window)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = _safe(m_new)
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m - m_safe)  # 0 on the first visible block (m = -inf)
        row_sum = alpha * row_sum + jnp.sum(p, axis=-1)
        acc = jnp.moveaxis(alpha, 3, 1)[..., None] * acc + _pv(p, v_blk)
        return (m_new, row_sum, acc), None

    # carries built *_like q, so that inside a shard_map with check_vma they vary as q does
    m0 = jnp.moveaxis(jnp.full_like(q5[..., 0], -jnp.inf, dtype=jnp.float32), 1, 3)  # [B, K, G, T]
    init = (m0, jnp.zeros_like(m0), jnp.zeros_like(q5, dtype=jnp.float32, shape=(*q5.shape[:-1], v.shape[-1])))
    (m, row_sum, acc), _ = jax.lax.scan(step, init, (_blocks(k, nb), _blocks(v, nb), k_pos.reshape(nb, -1)))
    l_safe = jnp.where(row_sum > 0, row_sum, 1.0)
    o = (acc / jnp.moveaxis(l_safe, 3, 1)[..., None]).reshape(*q.shape[:-1], v.shape[-1]).astype(COMPUTE_DTYPE)
    lse = jnp.where(row_sum > 0, m + jnp.log(l_safe), -jnp.inf)  # [B, K, G, T]; -inf: no visible key
    return o, lse.reshape(B, N, T)


def _flash_bwd_stats(q, K, o, do, lse_BxNxT, dlse_BxNxT=None):
    """The backward's per-query terms: q5, do5 [B,T,K,G,H], lse (-inf -> 0) and D = rowsum(do * o) - dlse,
    both FP32 [B,K,G,T,1] (D = rowsum(dp * p); the lse cotangent adds p * dlse to ds, d lse / d s = p)."""
    B, T, N, H = q.shape
    q5, do5 = _split_heads(q, K), _split_heads(do, K)
    lse = _safe(lse_BxNxT.reshape(B, K, N // K, T))[..., None]
    D = jnp.einsum("btkgh,btkgh->bkgt", do5, _split_heads(o, K), preferred_element_type=jnp.float32)
    if dlse_BxNxT is not None:
        D = D - dlse_BxNxT.reshape(D.shape).astype(jnp.float32)
    return q5, do5, lse, D[..., None]


# the backward's saved residuals and statistics, each an array of _flash_bwd's, passed as they are
def _flash_bwd_keys(dq5, q5, do5, lse, D, k, v, q_pos, k_pos, nb, dkv_dtype, window=None):
    """FlashAttention-2's backward of the queries against one key set, a scan over its nb key blocks:
    -> (dq5 + this key set's part, FP32; dk, dv [B, S, K, H] in dkv_dtype)."""
    def step(dq5, blk):
        k_blk, v_blk, k_pos_blk = blk
        p = jnp.exp(_scores(q5, k_blk, q_pos, k_pos_blk, window) - lse)  # masked: exp(-inf) = 0
        dp = jnp.einsum("btkgh,bskh->bkgts", do5, v_blk, preferred_element_type=jnp.float32)
        dq5_blk, dk_blk, dv_blk = _grads_from_p(p, p * (dp - D), q5, k_blk, do5)
        return dq5 + dq5_blk, (dk_blk.astype(dkv_dtype), dv_blk.astype(dkv_dtype))

    dq5, (dk, dv) = jax.lax.scan(step, dq5, (_blocks(k, nb), _blocks(v, nb), k_pos.reshape(nb, -1)))
    return dq5, _unblocks(dk), _unblocks(dv)


def _flash_bwd(block, window, res, cts):
    q, k, v, o, lse_BxNxT, q_pos, k_pos = res
    do, dlse_BxNxT = cts
    K, nb = k.shape[2], _num_blocks(k.shape[1], block)
    q5, do5, lse, D = _flash_bwd_stats(q, K, o, do, lse_BxNxT, dlse_BxNxT)
    c = _band(q.shape[1], k.shape[1], block, window)
    q_pos, k_pos = _tied(q_pos, k_pos, do, window)
    if c is not None:
        dq5, dk, dv = _band_bwd(q5, do5, lse, D, k, v, q_pos, k_pos, nb, c, window)
    else:
        dq5, dk, dv = _flash_bwd_keys(jnp.zeros_like(q5, dtype=jnp.float32), q5, do5, lse, D, k, v, q_pos, k_pos,
                                      nb, k.dtype, window)
    return (dq5.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def flash_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, q_pos_T, k_pos_S, block=512, window=None):
    """Causal attention by key blocks with an online softmax -> (o_BxTxNxH BF16, lse_BxNxT FP32).

    A lax.scan over S/block key blocks (S divisible by ``block``; block >= S is one block): m' = max(m,
    rowmax s), p = exp(s - m'), l' = exp(m - m').l + rowsum p, acc' = exp(m - m').acc + p.v_blk; o = acc / l,
    lse = m + log l. Saves q, k, v, o ("attn_out"), lse ("attn_lse"): nothing O(T.S). Backward recomputes
    p = exp(s - lse) per block: ds = p * (dp - D + dlse), D = rowsum(do * o). FLOPs: forward 4.B.T.S.N.H,
    backward 10.B.T.S.N.H + 2.B.T.N.H. Source: FlashAttention-2 (Dao 2023), Algorithms 1 and 2.

    ``window`` W: query t sees keys t - W < s <= t. Where T = S and the band of c + 1 key blocks a query block
    needs, c = ceil((W - 1)/b), is narrower than the nb = S/b blocks, the blocks outside it are skipped (_band_fwd):
    FLOPs forward 4.B.T.(c+1).b.N.H, backward 10.B.T.(c+1).b.N.H + 2.B.T.N.H; otherwise every block, masked."""
    return _flash_fwd(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, q_pos_T, k_pos_S, block, window)


def _flash_fwd_rule(q, k, v, q_pos, k_pos, block, window):
    o, lse = _flash_fwd(q, k, v, q_pos, k_pos, block, window)
    o, lse = checkpoint_name(o, "attn_out"), checkpoint_name(lse, "attn_lse")
    return (o, lse), (q, k, v, o, lse, q_pos, k_pos)


flash_attention.defvjp(_flash_fwd_rule, _flash_bwd)


def flash_attention_o(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, q_pos_T, k_pos_S, block=512, window=None):
    """flash_attention's o_BxTxNxH only (a drop-in for attention_materialized); saved bytes and FLOPs
    as flash_attention's (FlashAttention-2, Dao 2023)."""
    return flash_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, q_pos_T, k_pos_S, block, window)[0]


# ---------------------------------------------------------------------------------------------------
# Banded flash: a sliding window's key blocks only. Query block i (b queries) needs key blocks i - c .. i,
# c = ceil((W - 1)/b); step j of a scan over the c + 1 diagonals takes key block i - c + j for every query block
# at once, from k padded in front by c blocks (masked: position _PAD_POS is before every window).

_PAD_POS = -(2 ** 30)


def _band(T, S, block, window):
    """c, the diagonals below the main one a query block of the banded form visits, or None where the window
    leaves no key block out (every block is run: None window, T != S, or c + 1 >= S/block)."""
    if window is None or T != S:
        return None
    nb = _num_blocks(S, block)
    c = -(-(window - 1) // (S // nb))
    return c if c + 1 < nb else None


def _band_layout(q, k, v, q_pos, k_pos, nb, c):
    """q6 [B, nb, b, K, G, H], k, v padded [B, nb + c, b, K, H], q_pos [nb, b], padded k_pos [nb + c, b]."""
    B, T, N, H = q.shape
    K, b = k.shape[2], T // nb
    q6 = _split_heads(q, K).reshape(B, nb, b, K, N // K, H)

    def pad(x):
        return jnp.pad(x, ((0, 0), (c * b, 0), (0, 0), (0, 0))).reshape(B, nb + c, b, *x.shape[2:])

    k_pos = jnp.concatenate([jnp.full((c * b,), _PAD_POS, k_pos.dtype), k_pos]).reshape(nb + c, b)
    return q6, pad(k), pad(v), q_pos.reshape(nb, b), k_pos


def _diagonal(j, nb, *xs):
    """Key blocks j .. j + nb - 1 of padded arrays (axis 1, or 0 for the positions): diagonal j's keys."""
    return [jax.lax.dynamic_slice_in_dim(x, j, nb, axis=0 if x.ndim == 2 else 1) for x in xs]


def _band_scores(q6, k_blk, q_pos, k_pos_blk, window):
    """FP32 scaled scores [B, nb, K, G, b, b] of every query block against its diagonal's key block, masked."""
    scale = q6.shape[-1] ** -0.5
    s = jnp.einsum("bitkgh,biskh->bikgts", q6, k_blk, preferred_element_type=jnp.float32) * scale
    visible = _visible(q_pos[:, :, None], k_pos_blk[:, None, :], window)  # [nb, b, b]
    return jnp.where(visible[None, :, None, None], s, -jnp.inf)


def _band_fwd(q, k, v, q_pos, k_pos, nb, c, window):
    """The banded forward: (o BF16 [B, T, N, H], lse FP32 [B, N, T]), an online softmax over c + 1 diagonals."""
    B, T, N, H = q.shape
    q6, kp, vp, qp, kpp = _band_layout(q, k, v, q_pos, k_pos, nb, c)

    def step(carry, j):
        m, row_sum, acc = carry  # [B,nb,K,G,b] running max and sum, [B,nb,b,K,G,H] FP32 accumulator
        k_blk, v_blk, k_pos_blk = _diagonal(j, nb, kp, vp, kpp)
        s = _band_scores(q6, k_blk, qp, k_pos_blk, window)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = _safe(m_new)
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m - m_safe)
        row_sum = alpha * row_sum + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bikgts,biskh->bitkgh", p.astype(COMPUTE_DTYPE), v_blk, preferred_element_type=jnp.float32)
        return (m_new, row_sum, jnp.moveaxis(alpha, 4, 2)[..., None] * acc + pv), None

    m0 = jnp.moveaxis(jnp.full_like(q6[..., 0], -jnp.inf, dtype=jnp.float32), 2, 4)  # [B, nb, K, G, b]
    init = (m0, jnp.zeros_like(m0), jnp.zeros_like(q6, dtype=jnp.float32))
    (m, row_sum, acc), _ = jax.lax.scan(step, init, jnp.arange(c + 1))
    l_safe = jnp.where(row_sum > 0, row_sum, 1.0)
    o = (acc / jnp.moveaxis(l_safe, 4, 2)[..., None]).reshape(q.shape).astype(COMPUTE_DTYPE)
    lse = jnp.where(row_sum > 0, m + jnp.log(l_safe), -jnp.inf)  # [B, nb, K, G, b]
    return o, jnp.moveaxis(lse, 1, 3).reshape(B, N, T)


# the banded backward's residuals and statistics and its band (c diagonals of a window), passed as they are
def _band_bwd(q5, do5, lse, D, k, v, q_pos, k_pos, nb, c, window):
    """The banded backward (FlashAttention-2's, diagonal by diagonal): -> (dq5 FP32 [B, T, K, G, H], dk, dv in
    k's dtype). dk, dv accumulate in FP32 over the diagonals in k's padded layout."""
    B, T, K, G, H = q5.shape
    b = T // nb
    q6, kp, vp, qp, kpp = _band_layout(q5.reshape(B, T, K * G, H), k, v, q_pos, k_pos, nb, c)
    do6 = do5.reshape(q6.shape)

    def blocked(x_BxKxGxTx1):  # [B, K, G, T, 1] -> [B, nb, K, G, b, 1]
        return jnp.moveaxis(x_BxKxGxTx1.reshape(B, K, G, nb, b, 1), 3, 1)

    lse6, D6 = blocked(lse), blocked(D)
    scale = H ** -0.5

    def step(carry, j):
        dq6, dkp, dvp = carry
        k_blk, v_blk, k_pos_blk = _diagonal(j, nb, kp, vp, kpp)
        p = jnp.exp(_band_scores(q6, k_blk, qp, k_pos_blk, window) - lse6)
        dp = jnp.einsum("bitkgh,biskh->bikgts", do6, v_blk, preferred_element_type=jnp.float32)
        p16, ds16 = p.astype(COMPUTE_DTYPE), (p * (dp - D6)).astype(COMPUTE_DTYPE)
        dv = jnp.einsum("bikgts,bitkgh->biskh", p16, do6, preferred_element_type=jnp.float32)
        dq6 = dq6 + jnp.einsum("bikgts,biskh->bitkgh", ds16, k_blk, preferred_element_type=jnp.float32) * scale
        dk = jnp.einsum("bikgts,bitkgh->biskh", ds16, q6, preferred_element_type=jnp.float32) * scale

        def add(acc, d):
            return jax.lax.dynamic_update_slice_in_dim(acc, _diagonal(j, nb, acc)[0] + d, j, axis=1)
        return (dq6, add(dkp, dk), add(dvp, dv)), None

    init = (jnp.zeros_like(q6, dtype=jnp.float32), jnp.zeros_like(kp, dtype=jnp.float32),
            jnp.zeros_like(vp, dtype=jnp.float32))
    (dq6, dkp, dvp), _ = jax.lax.scan(step, init, jnp.arange(c + 1))
    unpad = lambda x: x[:, c:].reshape(k.shape).astype(k.dtype)  # noqa: E731
    return dq6.reshape(q5.shape), unpad(dkp), unpad(dvp)


def merge(o1_BxTxNxH, lse1_BxNxT, o2_BxTxNxH, lse2_BxNxT):
    """Combine two partial attentions over disjoint key sets -> (o_BxTxNxH FP32, lse_BxNxT FP32):
    lse = log(exp lse1 + exp lse2), o = exp(lse1 - lse).o1 + exp(lse2 - lse).o2 (o1, o2 in any float
    dtype, computed in FP32). A side with lse = -inf (no visible key) has weight 0; both -inf gives
    o = 0, lse = -inf. The shift by m = max(lse1, lse2) cancels, so it is a stop_gradient, and the
    log of a zero sum is guarded, so the gradient is NaN-free too. Plain jax ops (autodiff): saves
    o1, o2 as FP32 (8.B.T.N.H bytes) and a few FP32 [B, N, T] weights; no matmul FLOPs. Source: the blockwise softmax
    rescaling of FlashAttention (Dao et al. 2022, sec. 3.1) / Ring Attention (Liu et al. 2023)."""
    m = jax.lax.stop_gradient(_safe(jnp.maximum(lse1_BxNxT, lse2_BxNxT)))
    e1, e2 = jnp.exp(lse1_BxNxT - m), jnp.exp(lse2_BxNxT - m)
    row_sum = e1 + e2
    l_safe = jnp.where(row_sum > 0, row_sum, 1.0)
    lse = jnp.where(row_sum > 0, m + jnp.log(l_safe), -jnp.inf)
    w1, w2 = (jnp.moveaxis(e / l_safe, 2, 1)[..., None] for e in (e1, e2))  # [B, T, N, 1]
    o = w1 * o1_BxTxNxH.astype(jnp.float32) + w2 * o2_BxTxNxH.astype(jnp.float32)
    return o, lse


# ---------------------------------------------------------------------------------------------------
# Sequence (context) parallel: call inside a jax.shard_map manual over ``axis_name``.

def ulysses_attention(q_BxTcxNxH, k_BxTcxKxH, v_BxTcxKxH, axis_name, attend=attention_materialized):
    """DeepSpeed-Ulysses sequence parallelism, inside a jax.shard_map manual over ``axis_name`` (size C):
    q, k, v are this device's sequence shards [B, T/C, heads, H]; an all_to_all makes them head-sharded over
    the full sequence, ``attend(q, k, v, q_pos, k_pos)`` (attention_materialized or a partial of
    flash_attention_o) runs on N/C heads, and a second all_to_all returns o [B, T/C, N, H] BF16. N and K must
    be divisible by C. Per device: ``attend``'s FLOPs and residuals with N/C heads and S = T; 3 all_to_alls
    forward and 1 back, each (C-1)/C of the local shard. Source: DeepSpeed-Ulysses (Jacobs et al. 2023,
    arXiv:2309.14509), sec. 3."""
    C = jax.lax.axis_size(axis_name)
    N, K = q_BxTcxNxH.shape[2], k_BxTcxKxH.shape[2]
    if N % C or K % C:
        raise ValueError(f"query heads N={N} and kv heads K={K} must be divisible by the {axis_name} size C={C}")
    to_heads = functools.partial(jax.lax.all_to_all, axis_name=axis_name, split_axis=2, concat_axis=1, tiled=True)
    q, k, v = to_heads(q_BxTcxNxH), to_heads(k_BxTcxKxH), to_heads(v_BxTcxKxH)
    pos_T = jnp.arange(q.shape[1], dtype=jnp.int32)
    o_BxTxNcxH = attend(q, k, v, pos_T, pos_T)
    return jax.lax.all_to_all(o_BxTxNcxH, axis_name, split_axis=1, concat_axis=2, tiled=True)


def _ring_setup(q, axis_name, block):
    """C, this device's index i, the key block (capped at T/C), q's positions, a chunk's local positions,
    and the ring permutation i -> i+1 mod C."""
    C, i = jax.lax.axis_size(axis_name), jax.lax.axis_index(axis_name)
    Tc = q.shape[1]
    chunk_pos = jnp.arange(Tc, dtype=jnp.int32)
    return C, i, min(block, Tc), i * Tc + chunk_pos, chunk_pos, [(d, (d + 1) % C) for d in range(C)]


def _ring_fwd(q, k, v, axis_name, block):
    """-> (o BF16 [B, T/C, N, H], lse FP32 [B, N, T/C]) of the local queries against the whole sequence."""
    C, i, b, q_pos, chunk_pos, perm = _ring_setup(q, axis_name, block)
    Tc = q.shape[1]

    def visit(o_lse, kv, j):  # merge in the chunk of device (i - j) mod C, unless it is in the future
        def compute(o_lse):
            o_j, lse_j = _flash_fwd(q, *kv, q_pos, (i - j) % C * Tc + chunk_pos, b)
            return merge(*o_lse, o_j, lse_j)
        return jax.lax.cond(j <= i, compute, lambda o_lse: o_lse, o_lse)

    def step(carry, j):
        o_lse, kv = carry
        kv_next = jax.lax.ppermute(kv, axis_name, perm)  # independent of this step's compute: overlappable
        return (visit(o_lse, kv, j), kv_next), None

    o0 = jnp.zeros_like(q, dtype=jnp.float32)  # derived from q: same vma under check_vma
    lse0 = jnp.full_like(o0[..., 0], -jnp.inf).transpose(0, 2, 1)  # [B, N, T/C]
    carry = ((o0, lse0), (k, v))
    if C > 1:
        carry, _ = jax.lax.scan(step, carry, jnp.arange(C - 1))  # steps 0 .. C-2
    o, lse = visit(*carry, C - 1)  # step C-1: nothing more to send
    return o.astype(COMPUTE_DTYPE), lse


def _ring_fwd_rule(q, k, v, axis_name, block):
    o, lse = _ring_fwd(q, k, v, axis_name, block)
    o, lse = checkpoint_name(o, "attn_out"), checkpoint_name(lse, "attn_lse")
    return o, (q, k, v, o, lse)


def _ring_bwd(axis_name, block, res, do):
    q, k, v, o, lse_BxNxT = res
    C, i, b, q_pos, chunk_pos, perm = _ring_setup(q, axis_name, block)
    Tc, K = q.shape[1], k.shape[2]
    nb = _num_blocks(Tc, b)
    q5, do5, lse, D = _flash_bwd_stats(q, K, o, do, lse_BxNxT)  # D once, from the final o; the final lse
    send = functools.partial(jax.lax.ppermute, axis_name=axis_name, perm=perm)

    def visit(dq5, kv_2xBxTcxKxH, j):  # -> dq5 + chunk (i - j)'s part, the chunk's [dk, dv] from these queries
        def compute(dq5):
            src_pos = (i - j) % C * Tc + chunk_pos
            dq5, dk, dv = _flash_bwd_keys(dq5, q5, do5, lse, D, *kv_2xBxTcxKxH, q_pos, src_pos, nb, jnp.float32)
            return dq5, jnp.stack([dk, dv])

        def skip(dq5):  # a future chunk: nothing
            return dq5, jnp.zeros_like(kv_2xBxTcxKxH, dtype=jnp.float32)
        return compute(dq5) if isinstance(j, int) and j == 0 else jax.lax.cond(j <= i, compute, skip, dq5)

    # k, v travel stacked, as one array (so do dk, dv): one permute each way per step, and never the same op
    # as the forward's permutes of k and of v, which XLA would otherwise merge with the backward's first
    # when both sit outside a loop (C = 2), keeping the received chunk alive from forward to backward.
    # Step 0: the own chunk (always visible); k, v start round the ring, no accumulator has arrived yet.
    kv = jnp.stack([k, v])
    kv_next = send(kv) if C > 1 else kv
    dq5, dkv = visit(jnp.zeros_like(q5, dtype=jnp.float32), kv, 0)

    def step(carry, j, last=False):
        # the accumulator of chunk (i - j), from device i-1 (its step j-1), arrives while this device computes
        # its own part on that chunk; k, v go on for step j+1, except at the last step
        dq5, kv, dkv = carry
        kv_next = kv if last else send(kv)
        dkv_in = send(dkv)
        dq5, dkv_j = visit(dq5, kv, j)
        return (dq5, kv_next, dkv_in + dkv_j), None

    carry = (dq5, kv_next, dkv)
    if C > 2:
        carry, _ = jax.lax.scan(step, carry, jnp.arange(1, C - 1))  # steps 1 .. C-2
    if C > 1:
        (dq5, _, dkv), _ = step(carry, C - 1, last=True)  # step C-1: the accumulator of chunk i+1 mod C ...
        # ... goes home, rounded to k's dtype first: nothing adds to it after this hop (XLA:TPU sinks the
        # rounding before the permute by itself; XLA:CPU does not, so the program says it)
        dkv = send(dkv.astype(k.dtype))
    return dq5.reshape(q.shape).astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ring(q, k, v, axis_name, block):
    return _ring_fwd(q, k, v, axis_name, block)[0]


_ring.defvjp(_ring_fwd_rule, _ring_bwd)


def ring_attention(q_BxTcxNxH, k_BxTcxKxH, v_BxTcxKxH, axis_name, block=512):
    """Ring attention, inside a jax.shard_map manual over ``axis_name`` (size C): device i holds positions
    i.T/C .. (i+1).T/C - 1 of q, k, v [B, Tc, heads, H], Tc = T/C; returns o [B, Tc, N, H] BF16 (custom_vjp).
    Forward, steps j = 0 .. C-1: flash attention of the local queries against the K/V chunk of device
    (i - j) mod C, merged into a running FP32 (o, lse) with ``merge``, while (k, v) pass on by ppermute
    i -> i+1; chunks in the queries' future (j > i) are skipped with lax.cond. Backward: a second ring, the
    visiting (k, v) carrying FP32 (dk, dv) accumulators, FlashAttention-2's backward per chunk with the final
    lse, and a last BF16 hop home. Saves q, k, v, o, lse: 4.B.Tc.(N + K).H + 4.B.N.Tc bytes. Permutes per
    layer, Sk = B.Tc.K.H: forward 2(C-1), 4(C-1).Sk bytes; backward 2C-1, 4(C-1).Sk + 8(C-1).Sk + 4.Sk bytes.
    Device i computes i+1 chunks (F = B.Tc^2.N.H: forward 4F, backward 10F each). Layout, counts and compiler
    notes: docs/findings.md, "Attention kernels". Source: Ring Attention (Liu, Zaharia, Abbeel 2023,
    arXiv:2310.01889), Algorithm 1; per chunk FlashAttention-2 (Dao 2023), Algorithms 1 and 2."""
    return _ring(q_BxTcxNxH, k_BxTcxKxH, v_BxTcxKxH, axis_name, block)


# ---------------------------------------------------------------------------------------------------
# The libraries' kernels: splash attention (Pallas, TPU; MaxText's) and cuDNN's fused attention (GPU).

# MaxText's splash block sizes (its base.yml: sa_block_q, sa_block_kv, sa_block_kv_compute, sa_block_q_dkv,
# sa_block_kv_dkv, sa_block_kv_dkv_compute, sa_block_q_dq, sa_block_kv_dq all 512, sa_use_fused_bwd_kernel false),
# each capped at the sequence as layers/attention_op.py's tpu_flash_attention caps them:
# scaling.core.schedule.SPLASH_BLOCK


def splash_blocks(T: int, S: int, block: int = SPLASH_BLOCK, fused_backward: bool = False):
    """splash_attention_kernel.BlockSizes as MaxText sets them (attention_op.tpu_flash_attention): every block
    min(``block``, T) for the queries and min(``block``, S) for the keys, separate dq and dkv backward kernels, or
    with ``fused_backward`` one (MaxText's sa_use_fused_bwd_kernel: no dq blocks)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    bq, bkv = min(block, T), min(block, S)
    dq = {} if fused_backward else {"block_q_dq": bq, "block_kv_dq": bkv}
    return sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                         block_kv_dkv_compute=bkv, use_fused_bwd_kernel=fused_backward, **dq)


def interpret_kernels() -> bool:
    """Whether a Pallas TPU kernel runs through Pallas's interpret mode: where the devices being compiled for (the
    mesh set with jax.set_mesh, its abstract device's platform; without one jax's default backend) are not TPUs."""
    return traced_platform() != Platform.TPU


# nine parameters: the kernel's inputs and positions, its mask's window and the blocks a recipe sets
def splash_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, q_pos_T=None, k_pos_S=None, window=None,
                     block=SPLASH_BLOCK, fused_backward=False, interpret=None):
    """Causal attention by jax's splash attention kernel (jax.experimental.pallas.ops.tpu.splash_attention,
    what MaxText runs on TPUs) on one device's arrays -> o_BxTxNxH (BF16). q is scaled by H**-0.5 in BF16 first
    (MaxText's query scaling), then, per sequence (vmap over B, MaxText's form), make_splash_mha's kernel on
    [N, T, H] against the K kv heads [K, S, H] (grouped-query: query head n reads kv head n // G) with a
    CausalMask, or with ``window`` W a LocalMask of window_size (W - 1, 0) (query t sees t - W < s <= t), block
    sizes splash_blocks (MaxText's 512s; ``block``, ``fused_backward`` as a recipe sets them). q_pos_T, k_pos_S
    must be None or arange(T) (the mask is the kernel's: positions are not taken). The kernel's custom_vjp saves q,
    k, v, o and the FP32 logsumexp (named "attn_lse", both: RESIDUAL_NAMES) and runs separate dq and dkv kernels
    that recompute p = exp(s - lse) (one kernel with ``fused_backward``). It visits only the (query block, key
    block) pairs the mask does not fully hide: causal, nb·(nb + 1)/2 of nb² (nb = T/b).
    FLOPs per visited block pair of b_q·b_kv scores, per head: forward 4·b_q·b_kv·H, backward 14·b_q·b_kv·H (the dq
    kernel s, dp, dq; the dkv kernel s, dp, dv, dk; 2 each); 10·b_q·b_kv·H with ``fused_backward`` (s, dp, dv, dk,
    dq). ``interpret``: Pallas's interpret mode (None: interpret_kernels()).
    Source: FlashAttention-2 (Dao 2023), Algorithms 1 and 2, as the splash kernel implements them."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    B, T, N, H = q_BxTxNxH.shape
    S, K = k_BxSxKxH.shape[1], k_BxSxKxH.shape[2]
    if N % K:
        raise ValueError(f"query heads N={N} must be a multiple of kv heads K={K}")
    mask = sm.CausalMask((T, S)) if window is None else sm.LocalMask((T, S), window_size=(window - 1, 0), offset=0)
    blocks = splash_blocks(T, S, block, fused_backward)
    kernel = sk.make_splash_mha(mask=sm.MultiHeadMask((mask,) * N), block_sizes=blocks,
                                head_shards=1, q_seq_shards=1, residual_checkpoint_name="attn_lse",
                                interpret=interpret_kernels() if interpret is None else interpret)
    scale = jnp.asarray(H ** -0.5, COMPUTE_DTYPE)
    q = jnp.swapaxes(q_BxTxNxH.astype(COMPUTE_DTYPE) * scale, 1, 2)  # [B, N, T, H]
    k, v = jnp.swapaxes(k_BxSxKxH, 1, 2), jnp.swapaxes(v_BxSxKxH, 1, 2)
    o_BxNxTxH = jax.vmap(kernel)(q, k, v)
    return jnp.swapaxes(o_BxNxTxH, 1, 2).astype(COMPUTE_DTYPE)


def has_cudnn() -> bool:
    """Whether cuDNN's fused attention can be traced here: a CUDA GPU among jax's devices."""
    try:
        return any(d.platform == Platform.GPU for d in jax.devices("gpu"))
    except RuntimeError:
        return False


def cudnn_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, q_pos_T=None, k_pos_S=None, window=None):
    """Causal attention by cuDNN's fused attention, jax.nn.dot_product_attention(q, k, v, is_causal=True,
    implementation="cudnn") -> o_BxTxNxH (BF16): grouped-query heads as given (K kv heads), the scale H**-0.5,
    ``window`` W as local_window_size (W - 1, 0). The kernel (cuDNN's FlashAttention-2 form) saves o and the
    softmax statistics, recomputes the scores in the backward and skips the key blocks above the diagonal.
    FLOPs as flash's: forward 4, backward 10 units of B·T·S·N·H over the visited blocks. It needs the CUDA
    libraries when traced: ValueError where no GPU is present."""
    if not has_cudnn():
        raise ValueError("attention cudnn needs a CUDA GPU (cuDNN's fused attention is traced with the CUDA "
                         "libraries); none is present here: use --attention flash or auto")
    local = None if window is None else (window - 1, 0)
    o = jax.nn.dot_product_attention(q_BxTxNxH.astype(COMPUTE_DTYPE), k_BxSxKxH.astype(COMPUTE_DTYPE),
                                     v_BxSxKxH.astype(COMPUTE_DTYPE), is_causal=True, local_window_size=local,
                                     implementation="cudnn")
    return o.astype(COMPUTE_DTYPE)
