"""A measured decode step of the package's serving program on this machine's accelerator, against
scaling.step.serving's closed form.

The step: ffn_model.serve.decode_step (the transformer's layers one after another, each its own weight and cache
buffers; the attention cuDNN's on an NVIDIA GPU) for a LLaMA-shaped model (SwiGLU, grouped KV heads, an untied
vocabulary), BF16 weights drawn at random (and, for INT8_CASES, their int8 form: ffn_model.serve.store), b
sequences of one new token each, every cache full (``context`` keys a layer, the new token's written at context - 1),
the caches donated and handed back each call as generation runs them. Timed as verify.calibrate.time_call times a
kernel: calls queued back to back, the least of 3 batches.

``run(out)`` writes one JSON row per (model, weights, batch, context) with the measured and predicted seconds
(tools/gpu_serve.sh runs it on the device machine).
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp

from scaling.core.kinds import Dtype
from verify.calibrate import time_call

# (name, d_model, heads, kv_heads, head_dim, d_ff, layers, vocab): LLaMA 3.1 8B, and 70B's layers at half its depth
MODELS = {"llama3.1-8b": (4096, 32, 8, 128, 14336, 32, 128256),
          "llama3.1-70b-half": (8192, 64, 8, 128, 28672, 40, 128256)}
CASES = {"llama3.1-8b": [(1, 1024), (8, 2048), (32, 2048), (64, 4096), (128, 2048), (256, 1024)],
         "llama3.1-70b-half": [(1, 2048), (16, 2048), (64, 2048), (128, 1024)]}
INT8_CASES = {"llama3.1-8b": [(1, 1024), (32, 2048)], "llama3.1-70b-half": [(1, 2048), (64, 2048)]}  # int8 weights


def model_of(name: str):
    """The TransformerConfig of MODELS[name] (SwiGLU, untied vocabulary)."""
    from scaling.families.transformer import TransformerConfig

    D, N, K, H, F, L, V = MODELS[name]
    return TransformerConfig(d_model=D, heads=N, kv_heads=K, head_dim=H, d_ff=F, blocks=L, seq_len=8192,
                             mlp="swiglu", vocab=V)


def random_weights(cfg, key) -> dict:
    """Random BF16 weights in ffn_model.serve's layout (each layer its own arrays: serving_weights), drawn on the
    device, N(0, 0.02²)."""
    from ffn_model.transformer import attention_shapes

    D, F, L = cfg.d_model, cfg.d_ff, cfg.blocks
    shapes = {n: s[1:] for n, (s, _) in attention_shapes(cfg).items()} | {n: (F, D) for n in ("w_in", "w_gate",
                                                                                              "w_out")}
    draw = jax.jit(lambda k, shape: jax.random.normal(k, shape, jnp.bfloat16) * 0.02, static_argnums=1)
    layers = [{n: draw(jax.random.fold_in(key, 10 * i + j), s) for j, (n, s) in enumerate(shapes.items())}
              for i in range(L)]
    return {"layers": layers, "embedding": draw(jax.random.fold_in(key, 10**6), (cfg.vocab, D)),
            "unembedding": draw(jax.random.fold_in(key, 10**6 + 1), (cfg.vocab, D))}


_WEIGHTS: dict = {}  # the last model's weights (one model's at a time: the 70B half is 70 GB)


def _weights(name: str, weights: str) -> dict:
    """MODELS[name]'s random weights (random_weights) as ``weights`` stores them: BF16, or int8
    (ffn_model.serve.store of the BF16 ones, which are then let go)."""
    from ffn_model import serve

    if (name, weights) not in _WEIGHTS:
        bf16 = _WEIGHTS.get((name, "bf16")) or random_weights(model_of(name), jax.random.key(0))
        _WEIGHTS.clear()
        _WEIGHTS[name, weights] = jax.block_until_ready(
            bf16 if weights == Dtype.BF16 else jax.jit(lambda w: serve.store(w, weights))(bf16))
    return _WEIGHTS[name, weights]


def measure(name: str, batch: int, context: int, weights: str = "bf16") -> tuple[float, float]:
    """(seconds, the compiled program's "bytes accessed") of one decode step of ffn_model.serve (decode_step, the
    package's serving program) for ``name`` (MODELS) at ``batch`` sequences, each attending to a full cache of
    ``context`` keys (pos = context - 1); the caches donated, as generate runs them; the weights stored as
    ``weights`` (bf16, int8)."""
    from ffn_model import serve

    cfg = model_of(name)
    key = jax.random.key(0)
    w = _weights(name, weights)
    shape = (batch, context, cfg.kv_heads, cfg.head_dim)
    draw = jax.jit(lambda k: jax.random.normal(k, shape, jnp.bfloat16))
    ck = [draw(jax.random.fold_in(key, i)) for i in range(cfg.blocks)]
    cv = [draw(jax.random.fold_in(key, 1000 + i)) for i in range(cfg.blocks)]
    ids = jnp.zeros((batch,), jnp.int32)
    pos = jnp.int32(context - 1)
    fn = jax.jit(lambda w, ck, cv, ids, pos: serve.decode_step(w, ck, cv, ids, pos, mlp_kind=cfg.mlp),
                 donate_argnums=(1, 2))
    state = {"ck": ck, "cv": cv}

    def step(w, ids, pos):  # the caches handed back each call (donated: written in place)
        _, state["ck"], state["cv"] = fn(w, state["ck"], state["cv"], ids, pos)
        return state["ck"][0]

    t = time_call(step, (w, ids, pos), target=0.3)
    cost = fn.lower(w, state["ck"], state["cv"], ids, pos).compile().cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    state.clear()
    return t, float(cost.get("bytes accessed", 0.0))


def predicted(name: str, batch: int, context: int, chip: str, weights: str = "bf16") -> dict:
    """scaling.step.serving.decode_step's terms for the same step on ``chip`` (one device)."""
    from scaling.hardware.chips import get_chip
    from scaling.step.serving import Serving, decode_step as form

    d = form(Serving(model_of(name), get_chip(chip), {}, batch, context, 1, weights, reduce_bytes=(4, 4)), context)
    return {"predicted_s": d.seconds, "t_weights": d.t_weights, "t_attention": d.t_attention,
            "stream_efficiency": d.stream_efficiency, "kv_efficiency": d.kv_efficiency}


def run(out: str, chip: str = "H200", budget: float = 240.0) -> list[dict]:
    """Measure CASES within ``budget`` seconds, each row beside ``chip``'s prediction, rewritten to ``out`` (JSON)
    after each."""
    rows, t0 = [], time.perf_counter()
    cases = [(n, b, t, "bf16") for n, c in CASES.items() for b, t in c]
    cases += [(n, b, t, "int8") for n, c in INT8_CASES.items() for b, t in c]
    for name, b, t, weights in sorted(cases, key=lambda c: list(MODELS).index(c[0])):  # one model's weights at a time
        if time.perf_counter() - t0 > budget:
            break
        try:
            s, nbytes = measure(name, b, t, weights)
        except Exception as e:  # noqa: BLE001 - a case the device cannot run is reported, the rest measured
            print(f"{name} {weights} b={b} T={t}: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        row = {"model": name, "weights": weights, "batch": b, "context": t, "measured_s": s,
               "compiled_bytes_accessed": nbytes, **predicted(name, b, t, chip, weights),
               "device": jax.devices()[0].device_kind, "jax": jax.__version__}
        rows.append(row)
        print(f"{name} {weights} b={b} T={t}: measured {s * 1e3:.3f} ms, predicted {row['predicted_s'] * 1e3:.3f} ms "
              f"({row['predicted_s'] / s - 1:+.1%}); compiled bytes {nbytes / 1e9:.3f} GB", flush=True)
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows
