"""Kernel times measured on this machine's accelerator: what ``jax-scaling calibrate`` writes as a kernel table
(scaling.hardware.kernel_tables reads it; the step model takes its GEMM, pointwise, attention and collective terms from
it).

Each kernel is compiled by XLA (jax.jit, with XLA's own GEMM autotuning, as a training program would be) and timed
on the device's clock as seen from the host: a warm-up call, then calls queued back to back (jax dispatches
asynchronously; on the CPU each call is waited for) until ``target`` seconds have run, the last one waited for; the
time per call is the elapsed time over the calls, the least of ``repeats`` such batches. A kernel shorter than
``small`` seconds is timed as ``copies`` independent instances inside one executable (distinct operands, so XLA can
neither merge nor reuse them), which is how it runs inside a step (no host dispatch between kernels): seconds per
instance = the executable's time / copies.

  gemm        jnp.dot of [m, k]·[k, n]: bf16 (bf16 out, f32 accumulation), fp32 (DotAlgorithmPreset.F32_F32_F32),
              tf32 (TF32_TF32_F32), fp8 (float8_e4m3fn in, bf16 out), int8 (int32 out); FLOPs 2·m·n·k
  pointwise   y = 2·x + 1 on bf16 (one fused kernel): bytes moved = 2 · 2 B · elements (read and written)
  launch      a chain of dependent 128×128×128 bf16 GEMMs in one executable: seconds per link (a kernel's launch
              and its smallest run)
  attention   jax.nn.dot_product_attention (implementation "cudnn" on NVIDIA GPUs, else "xla") on bf16
              [batch, seq, heads, head_dim], causal and not: the forward, and the forward plus the gradients
              of q, k, v
  collectives with D >= 2 devices, over a mesh of all of them (shard_map): all-gather, reduce-scatter, all-reduce,
              all-to-all and a ring permute of a bf16 buffer of ``bytes`` per device
  decode      a decode step's kernels: the bf16 GEMMs of a few tokens against a layer's weights ([m, k]·[k, n], m
              1..256: weight-streaming, HBM-bound; written as gemm.bf16 rows), and attention of one query token a
              sequence against a bf16 KV cache [batch, context, kv_heads, head_dim] with q_heads query heads (grouped
              queries): "xla" (two einsums and a softmax) and, on NVIDIA GPUs, "cudnn" (jax.nn.dot_product_attention)

Sources: jax.jit / jax.block_until_ready timing as jax's own benchmarks do (jax docs, "Benchmarking JAX code");
XLA's DotAlgorithmPreset names (jax.lax.DotAlgorithmPreset).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from scaling.core.kinds import Dtype, Platform
from scaling.core.policies import Attention

GEMM_DTYPES = ("bf16", "fp32", "tf32", "fp8", "int8")
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute")


@dataclass
class Grid:
    """What to measure: GEMM shapes per dtype (m, n, k), pointwise sizes (elements), attention cases
    (batch, seq, heads, head_dim, causal), collective sizes (bytes per device)."""

    gemm: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    pointwise: list[int] = field(default_factory=list)
    attention: list[tuple[int, int, int, int, bool]] = field(default_factory=list)
    collectives: list[int] = field(default_factory=list)
    launch: bool = True
    decode_gemm: list[tuple[int, int, int]] = field(default_factory=list)
    decode_attention: list[tuple[int, int, int, int, int]] = field(default_factory=list)


def default_grid() -> Grid:
    """The issue's grid, trimmed to what one accelerator measures in a few minutes: bf16 squares 256..16384 (the
    published curves' points and the wave sawtooth) and transformer shapes m 256..65,536 × n, k 512..65,536 (a
    product grid thinned to about 100 shapes); the other dtypes at the squares and a small product grid; pointwise
    2^12..2^30 elements; attention at sequence 512..16,384, head dims 64 and 128; collectives 64 KiB..1 GiB."""
    squares = [256, 512, 768, 1024, 1536, 1792, 2048, 2304, 3072, 4096, 6144, 8192, 12288, 16384]
    grid_mnk = [(m, n, k) for m in (256, 1024, 4096, 16384, 65536) for n in (512, 2048, 8192, 32768)
                for k in (512, 2048, 8192, 32768)]
    grid_mnk += [(m, 65536, 8192) for m in (1024, 8192)] + [(m, 8192, 65536) for m in (1024, 8192)]
    bf16 = [(s, s, s) for s in squares] + grid_mnk
    other_sq = [(s, s, s) for s in (512, 1024, 2048, 4096, 8192, 16384)]
    other = other_sq + [(m, n, k) for m in (1024, 8192) for n in (2048, 8192) for k in (2048, 8192)]
    gemm = {"bf16": bf16, "tf32": other, "fp32": other_sq[:5], "fp8": other, "int8": other}
    pointwise = [2**e for e in range(12, 31, 2)]
    attention = [(max(1, 32768 // t), t, 16, h, c) for t in (512, 1024, 2048, 4096, 8192, 16384)
                 for h in (64, 128) for c in (True, False)]
    collectives = [2**e for e in range(16, 31, 2)]
    return Grid(gemm, pointwise, attention, collectives, decode_gemm=decode_gemms(),
                decode_attention=decode_attentions())


def decode_gemms() -> list[tuple[int, int, int]]:
    """The decode section's GEMMs: m (tokens a step) 1, 8, 32, 128, 256 against the (n, k) of LLaMA 3's 8B and 70B
    layers (q/o 4096², gate/up 14,336×4096, down 4096×14,336; 8192², 28,672×8192, 8192×28,672; the 70B's fused kv
    2048×8192): weights of 32-470 MB, several times the L2, so each reads its weights from HBM."""
    nk = [(4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (8192, 28672), (2048, 8192)]
    return [(m, n, k) for m in (1, 8, 32, 128, 256) for n, k in nk]


def decode_attentions() -> list[tuple[int, int, int, int, int]]:
    """The decode section's attention cases (batch, context, q_heads, kv_heads, head_dim): LLaMA 3's grouped heads
    (64 or 32 query heads over 8 KV heads of 128), caches of 16 MB to 4 GB."""
    return [(b, t, n, 8, 128) for n in (64, 32) for b, t in ((1, 8192), (8, 8192), (32, 8192), (64, 4096),
                                                              (16, 32768), (128, 2048))]


def _operands(dtype: str, shapes, key):
    """Random operands of ``dtype`` for ``shapes`` (each its own key), on the default device."""
    out = []
    for i, s in enumerate(shapes):
        k = jax.random.fold_in(key, i)
        if dtype == Dtype.INT8:
            out.append(jax.random.randint(k, s, -64, 64, jnp.int8))
        elif dtype == Dtype.FP8:
            out.append(jax.random.normal(k, s, jnp.bfloat16).astype(jnp.float8_e4m3fn))
        else:
            out.append(jax.random.normal(k, s, jnp.float32 if dtype in (Dtype.FP32, Dtype.TF32) else jnp.bfloat16))
    return out


def _dot(dtype: str):
    """jnp.dot for ``dtype`` (module docstring)."""
    if dtype == Dtype.FP32:
        return lambda a, b: jax.lax.dot(a, b, precision=jax.lax.DotAlgorithmPreset.F32_F32_F32)
    if dtype == Dtype.TF32:
        return lambda a, b: jax.lax.dot(a, b, precision=jax.lax.DotAlgorithmPreset.TF32_TF32_F32)
    out = {"int8": jnp.int32, "fp8": jnp.bfloat16, "bf16": jnp.bfloat16}[dtype]
    return lambda a, b: jnp.dot(a, b, preferred_element_type=out)


def time_call(fn, args, target: float = 0.05, repeats: int = 3) -> float:
    """Seconds per call of the compiled ``fn(*args)`` (module docstring): the least over ``repeats`` batches of
    calls queued back to back for about ``target`` seconds."""
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = max(time.perf_counter() - t0, 1e-7)
    calls = int(min(max(target / once, 1), 1000))
    # emulated devices' collectives deadlock when queued: wait for each call
    each = jax.default_backend() == Platform.CPU
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)
            if each:
                jax.block_until_ready(out)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def time_copies(make, small: float, budget_bytes: float, each_bytes: float, max_copies: int = 128) -> float:
    """Seconds of one instance of a kernel: ``make(c)`` returns (compiled fn, args) running c independent
    instances; timed once with c = 1, then, if under ``small`` seconds, with as many copies as fill about 10·small
    seconds (at most ``max_copies``, and their operands within ``budget_bytes``): the executable's own dispatch
    (tens of microseconds) is then a small share of each copy's time."""
    fn, args = make(1)
    t = time_call(fn, args)
    if t >= small:
        return t
    copies = int(min(max_copies, max(2, 10 * small / max(t, 1e-7)), budget_bytes // max(each_bytes, 1)))
    if copies < 2:
        return t
    fn, args = make(copies)
    return time_call(fn, args) / copies


def gemm_seconds(dtype: str, m: int, n: int, k: int, small: float = 2e-4, budget_bytes: float = 2e9) -> float:
    """Seconds per call of [m, k]·[k, n] in ``dtype`` (module docstring)."""
    dot = _dot(dtype)
    size = {"bf16": 2, "fp32": 4, "tf32": 4, "fp8": 1, "int8": 1}[dtype]

    def make(c):
        key = jax.random.key(m * 7 + n * 13 + k)
        ops = _operands(dtype, [(m, k), (k, n)] * c, key)
        fn = jax.jit(lambda *xs: [dot(xs[2 * i], xs[2 * i + 1]) for i in range(c)])
        return fn, ops

    return time_copies(make, small, budget_bytes, size * (m * k + k * n) + 4 * m * n)


def pointwise_seconds(elements: int, small: float = 2e-4, budget_bytes: float = 2e9) -> float:
    """Seconds of y = 2·x + 1 on ``elements`` bf16 values (one fused kernel; 4 B moved an element)."""
    def make(c):
        xs = _operands("bf16", [(elements,)] * c, jax.random.key(elements))
        return jax.jit(lambda *xs: [2 * x + 1 for x in xs]), xs

    return time_copies(make, small, budget_bytes, 4 * elements)


def launch_seconds(links: int = 200) -> float:
    """Seconds per link of a chain of ``links`` dependent 128×128×128 bf16 GEMMs in one executable."""
    ws = _operands("bf16", [(128, 128)] * (links + 1), jax.random.key(1))

    def chain(x, *ws):
        for w in ws:
            x = jnp.dot(x, w, preferred_element_type=jnp.bfloat16)
        return x

    return time_call(jax.jit(chain), [ws[0], *ws[1:]]) / links


def attention_seconds(batch: int, seq: int, heads: int, head_dim: int, causal: bool) -> tuple[float, float, str]:
    """(forward seconds, forward + backward seconds, implementation) of jax.nn.dot_product_attention on bf16
    [batch, seq, heads, head_dim] q, k, v: "cudnn" on a GPU, "xla" elsewhere."""
    impl = "cudnn" if jax.default_backend() == Platform.GPU else "xla"
    q, k, v = _operands("bf16", [(batch, seq, heads, head_dim)] * 3, jax.random.key(seq + head_dim))

    def attn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)

    def loss(q, k, v):
        return attn(q, k, v).astype(jnp.float32).sum()

    fwd = time_call(jax.jit(attn), (q, k, v))
    both = time_call(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v))
    return fwd, both, impl


def decode_attention_seconds(batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int,
                             impl: str = "xla", small: float = 2e-4, budget_bytes: float = 2e9) -> float:
    """Seconds of one query token a sequence attending to a bf16 KV cache [batch, context, kv_heads, head_dim] (the
    module docstring's decode attention): ``impl`` "xla" (q·K^T over each group of q_heads/kv_heads, softmax in FP32,
    ·V) or "cudnn" (jax.nn.dot_product_attention, q of length 1). Bytes read: 2·batch·context·kv_heads·head_dim·2."""
    g = q_heads // kv_heads

    def one(q, k, v):
        if impl == Attention.CUDNN:
            return jax.nn.dot_product_attention(q[:, None], k, v, implementation="cudnn")[:, 0]
        q = q.reshape(batch, kv_heads, g, head_dim)
        s = jnp.einsum("bkgh,btkh->bkgt", q, k, preferred_element_type=jnp.float32) / math.sqrt(head_dim)
        p = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)
        return jnp.einsum("bkgt,btkh->bkgh", p, v).reshape(batch, q_heads, head_dim)

    def make(c):
        shapes = [(batch, q_heads, head_dim), *[(batch, context, kv_heads, head_dim)] * 2] * c
        ops = _operands("bf16", shapes, jax.random.key(batch * 31 + context))
        return jax.jit(lambda *xs: [one(*xs[3 * i:3 * i + 3]) for i in range(c)]), ops

    return time_copies(make, small, budget_bytes, 4 * batch * context * kv_heads * head_dim)


def collective_seconds(kind: str, nbytes: int, devices=None) -> float:
    """Seconds of one ``kind`` collective over every device (a 1-D mesh "x") of a bf16 buffer of ``nbytes`` per
    device: all_gather (each device's buffer gathered), reduce_scatter and all_reduce (of the buffer),
    all_to_all (the buffer split in D parts), permute (a ring shift by one)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = list(devices or jax.devices())
    d = len(devices)
    mesh = Mesh(np.array(devices), ("x",))
    per = max(d, nbytes // 2 // d * d)  # elements per device, a multiple of D
    x = jax.device_put(jnp.ones((d * per,), jnp.bfloat16), NamedSharding(mesh, P("x")))
    body = {
        "all_gather": lambda a: jax.lax.all_gather(a, "x", tiled=True),
        "reduce_scatter": lambda a: jax.lax.psum_scatter(a, "x", tiled=True),
        "all_reduce": lambda a: jax.lax.psum(a, "x"),
        "all_to_all": lambda a: jax.lax.all_to_all(a.reshape(d, -1), "x", 0, 0, tiled=True).reshape(-1),
        "permute": lambda a: jax.lax.ppermute(a, "x", [(i, (i + 1) % d) for i in range(d)]),
    }[kind]
    out_spec = P() if kind == "all_gather" else P("x")
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=out_spec, check_vma=False))
    return time_call(fn, (x,))


def device_description() -> dict:
    """The device's kind, platform version, driver (NVIDIA's /proc/driver/nvidia/version where readable) and the
    jax version: what a table's source line names."""
    dev = jax.devices()[0]
    out = {"device_kind": dev.device_kind, "platform": jax.default_backend(), "devices": jax.device_count(),
           "jax": jax.__version__}
    try:
        out["platform_version"] = dev.client.platform_version
    except Exception:  # noqa: BLE001 - not every client says
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            line = f.readline()
        out["driver"] = next((w for w in line.split() if w[:1].isdigit() and "." in w), line.strip())
    except OSError:
        pass
    return out
