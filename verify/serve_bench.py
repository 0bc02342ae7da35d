"""A measured decode step on this machine's accelerator, against scaling.step.serving's closed form.

The step: a LLaMA-shaped transformer (RMSNorm, q/k/v/o with grouped KV heads, rotary-free, SwiGLU MLP, the final norm
and the logits), its layers in a lax.scan, bf16 weights drawn at random, b sequences of one new token each attending
(jax.nn.dot_product_attention: "cudnn" on NVIDIA GPUs, "xla" elsewhere) to a bf16 KV cache of ``context`` keys a
layer. The cache is read, not written: the new token's k and v (b·2·K·H·2 B a layer) are the only bytes left out,
so the step reads what the closed form counts (every weight but the lookup's rows, the whole cache) and nothing is
copied. Timed as verify.calibrate.time_call times a kernel: calls queued back to back, the least of 3 batches.

``run(out)`` writes one JSON row per (model, batch, context) with the measured and predicted seconds
(tools/gpu_serve.sh runs it on the device machine).
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp

from scaling.core.kinds import Platform
from verify.calibrate import time_call

# (name, d_model, heads, kv_heads, head_dim, d_ff, layers, vocab): LLaMA 3.1 8B, and 70B's layers at half its depth
MODELS = {"llama3.1-8b": (4096, 32, 8, 128, 14336, 32, 128256),
          "llama3.1-70b-half": (8192, 64, 8, 128, 28672, 40, 128256)}
CASES = {"llama3.1-8b": [(1, 1024), (8, 2048), (32, 2048), (64, 4096), (128, 2048), (256, 1024)],
         "llama3.1-70b-half": [(1, 2048), (16, 2048), (64, 2048), (128, 1024)]}


def _params(D, N, K, H, F, L, V, key):
    """Random bf16 weights, stacked over L: wq [L,D,N·H], wkv [L,D,2·K·H] (k and v), wo [L,N·H,D], w_gu [L,D,2F],
    w_down [L,F,D], the norms' scales, the output layer [D,V]."""
    ks = jax.random.split(key, 6)
    n = lambda k, s: (jax.random.normal(k, s, jnp.bfloat16) * 0.02)  # noqa: E731
    return {"wq": n(ks[0], (L, D, N * H)), "wk": n(ks[1], (L, D, K * H)), "wv": n(ks[1], (L, D, K * H)),
            "wo": n(ks[2], (L, N * H, D)), "wg": n(ks[3], (L, D, F)), "wu": n(ks[4], (L, D, F)),
            "wd": n(ks[4], (L, F, D)), "n1": jnp.ones((L, D), jnp.bfloat16), "n2": jnp.ones((L, D), jnp.bfloat16),
            "nf": jnp.ones((D,), jnp.bfloat16), "out": n(ks[5], (D, V))}


def _rms(x, g):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(x.dtype) * g


def decode_step(p, x_BxD, k_LxBxTxKxH, v_LxBxTxKxH, N, K, H, impl, unrolled: bool = True):
    """One decode step (module docstring): the logits [B, V] of b new tokens' embeddings x. ``unrolled``: the layers
    one after another, each its own weight and cache buffers (``p``'s stacks and the caches as lists of L arrays);
    else a lax.scan over the [L, ...] stacks (XLA:GPU copies each layer's slice of a stack before its GEMMs read it:
    docs/serving.md)."""
    B = x_BxD.shape[0]

    def layer(x, w):
        h = _rms(x, w["n1"])
        q = (h @ w["wq"]).reshape(B, 1, N, H)
        # the new token's k and v, computed as the step computes them (their write left out: module docstring)
        kv = (h @ w["wk"]).sum() + (h @ w["wv"]).sum()
        a = jax.nn.dot_product_attention(q, w["k"], w["v"], implementation=impl).reshape(B, N * H)
        x = x + a @ w["wo"]
        h = _rms(x, w["n2"])
        g = jax.nn.silu(h @ w["wg"]) * (h @ w["wu"])
        x = x + g @ w["wd"]
        return x + 0 * kv.astype(x.dtype), None

    names = ("wq", "wk", "wv", "wo", "wg", "wu", "wd", "n1", "n2")
    if unrolled:
        x = x_BxD
        for i in range(len(k_LxBxTxKxH)):
            x, _ = layer(x, {**{k: p[k][i] for k in names}, "k": k_LxBxTxKxH[i], "v": v_LxBxTxKxH[i]})
    else:
        x, _ = jax.lax.scan(layer, x_BxD, {**{k: p[k] for k in names}, "k": k_LxBxTxKxH, "v": v_LxBxTxKxH})
    return _rms(x, p["nf"]) @ p["out"]


_WEIGHTS: dict = {}  # the last model's weights (one model's at a time: the 70B half is 70 GB)


def measure(name: str, batch: int, context: int, unrolled: bool = True) -> tuple[float, float]:
    """(seconds, the compiled program's "bytes accessed") of one decode step of ``name`` (MODELS) at ``batch``
    sequences of ``context`` cached keys (decode_step: ``unrolled`` or scanned)."""
    D, N, K, H, F, L, V = MODELS[name]
    impl = "cudnn" if jax.default_backend() == Platform.GPU else "xla"
    key = jax.random.key(0)
    if (name, unrolled) not in _WEIGHTS:
        _WEIGHTS.clear()
        p = _params(D, N, K, H, F, L, V, key)
        if unrolled:  # each layer's weights their own buffers
            p = {k: [a[i] for i in range(L)] if a.ndim and a.shape[0] == L and k != "nf" else a for k, a in p.items()}
            p = jax.block_until_ready(p)
        _WEIGHTS[(name, unrolled)] = p
    p = _WEIGHTS[(name, unrolled)]
    cache = lambda k: jax.random.normal(k, (L, batch, context, K, H), jnp.bfloat16)  # noqa: E731
    kc, vc = cache(key), cache(jax.random.fold_in(key, 1))
    if unrolled:
        kc, vc = [kc[i] for i in range(L)], [vc[i] for i in range(L)]
    x = jax.random.normal(key, (batch, D), jnp.bfloat16)
    fn = jax.jit(lambda p, x, k, v: decode_step(p, x, k, v, N, K, H, impl, unrolled))
    t = time_call(fn, (p, x, kc, vc), target=0.3)
    cost = fn.lower(p, x, kc, vc).compile().cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    del kc, vc
    return t, float(cost.get("bytes accessed", 0.0))


def predicted(name: str, batch: int, context: int, chip: str) -> dict:
    """scaling.step.serving.decode_step's terms for the same step on ``chip`` (one device)."""
    from scaling.families.transformer import TransformerConfig
    from scaling.hardware.chips import get_chip
    from scaling.step.serving import Serving, decode_step as form

    D, N, K, H, F, L, V = MODELS[name]
    m = TransformerConfig(d_model=D, heads=N, kv_heads=K, head_dim=H, d_ff=F, blocks=L, seq_len=8192, mlp="swiglu",
                          vocab=V)
    d = form(Serving(m, get_chip(chip), {}, batch, context, 1), context)
    return {"predicted_s": d.seconds, "t_weights": d.t_weights, "t_attention": d.t_attention,
            "stream_efficiency": d.stream_efficiency, "kv_efficiency": d.kv_efficiency}


def run(out: str, chip: str = "H200", budget: float = 240.0) -> list[dict]:
    """Measure CASES within ``budget`` seconds, each row beside ``chip``'s prediction, rewritten to ``out`` (JSON)
    after each."""
    rows, t0 = [], time.perf_counter()
    for name, cases in CASES.items():
        for unrolled, some in ((True, cases), (False, cases[:1])):
            for b, t in some:
                if time.perf_counter() - t0 > budget:
                    break
                s, nbytes = measure(name, b, t, unrolled)
                row = {"model": name, "batch": b, "context": t, "layers": "unrolled" if unrolled else "scan",
                       "measured_s": s, "compiled_bytes_accessed": nbytes, **predicted(name, b, t, chip),
                       "device": jax.devices()[0].device_kind, "jax": jax.__version__}
                rows.append(row)
                print(f"{name} {row['layers']} b={b} T={t}: measured {s * 1e3:.3f} ms, predicted "
                      f"{row['predicted_s'] * 1e3:.3f} ms ({row['predicted_s'] / s - 1:+.1%}); compiled bytes "
                      f"{nbytes / 1e9:.3f} GB", flush=True)
            with open(out, "w") as f:
                json.dump(rows, f, indent=1)
    return rows
