"""The step's kernels, one by one: what the step model's compute term is made of (scaling.program.predict's
scheduled form). Each kernel is one class of op a device runs in a step (a matmul of one shape, a pointwise
pass, the optimizer update), with its FLOPs, the HBM bytes it reads and writes, its calls, and its time:

  matmul     FLOPs / (C_dtype · eta · q(shape)), or its bytes / HBM bandwidth where more (the roofline of one
             kernel, Scaling Book roofline page): eta = the chip's ``matmul_efficiency`` (the fraction of peak a
             large aligned matmul sustains, hardware table), q the quantization of the shape:
               TPU: the MXU (a×a systolic array, a = ``mxu``) takes the contracting dim k and the output dim n
                    in whole tiles: q = k/(a·⌈k/a⌉) · n/(a·⌈n/a⌉) (Scaling Book TPU page; m streams through);
               GPU: tile and wave quantization (NVIDIA, "Matrix Multiplication Background", dl-performance
                    guide): an output of batch·⌈m/tm⌉·⌈n/tn⌉ tiles runs in ⌈tiles/SMs⌉ waves,
                    q = batch·m·n / (waves·SMs·tm·tn), the best of the chip's ``mma_tiles``; a 16-bit operand
                    whose k or n is not a multiple of ``tc_align`` elements misses the tensor cores (same guide,
                    "Tensor Core requirements"): it runs at eta of the chip's FP32 (SIMT) rate.
  attention  the q·kᵀ and p·v matmuls as batched matmuls over sequences × heads (shape (T, T, H)), the scores
             through HBM where materialized; under flash only q, k, v and o move, and
             the kernel skips the key blocks the causal mask hides (Dao et al. 2022; MaxText's splash and
             cuDNN's kernels): it runs (n_b + 1)/(2·n_b) of the program's units, n_b = T/attention_block
  pointwise  bytes / HBM bandwidth: per layer-pass the norms (read and write c·D a token), the residual adds
             (read 2·c·D, write c·D), the MLP activation (c·m·F/Y), the materialized softmax (read and write
             the scores, c·s·N·T²/Y), the loss's softmax over the vocabulary (c·V/Y a token, read and write);
             a backward pass moves twice its forward's bytes (reads the saved input and the incoming
             gradient, writes the gradient), a recomputed forward its forward's again
  optimizer  AdamW reads master, gradient, μ, ν and writes master, μ, ν: 7·4 B per parameter shard
             (scaling.memory.hbm_traffic_bytes)
  accumulate each microbatch's gradient added to the FP32 accumulator (read both, write one: 3·4 B per
             parameter of the device, P/(S·X·Y)), n times a step: n = M with gradient accumulation (none for
             M = 1: the one gradient is the step's), T/R with S stages (every slot adds its chunk's gradient,
             1/R of the stage's; scaling.pipeline.slots); Megatron-LM's main_grad accumulation likewise

A second matmul model, ``kernel_model="hierarchical"`` (DeepFlow's, as seed 002 runs it: scaling.seed002): a matmul
tiles through the chip's on-chip memory (``onchip``: a GPU's L2, a TPU's VMEM) in the largest power-of-two tiles t
with 3·t²·c bytes in it; with k ≤ t the [m, k] operand is read once and the [k, n] one ⌈m/t⌉ times, else they
are read ⌈n/t⌉ and ⌈m/t⌉ times, the output written once: HBM bytes c·(m·k·r_A + k·n·r_B + m·n) a call; its
time the larger of FLOPs/(C·eta) (no tile or wave quantization) and those bytes over the HBM bandwidth. Attention,
pointwise and update kernels are the same in both.

The matmul FLOPs are the program's (scaling.transformer.step_flops, scaling.flops.step_flops: the compiler's
count); the kernel times sum to the step model's compute term, ``compute_seconds``. Values may be numpy arrays
(the planner's batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scaling import memory, pipeline, transformer
from scaling.config import TransformerConfig, spans
from scaling.hardware import Chip
from scaling.workload import Workload

DTYPES = ("bf16", "fp32", "tf32", "int8", "fp8")  # the matmul input types the hardware table gives peaks for
KERNEL_MODELS = ("efficiency", "hierarchical")  # the matmul term (module docstring)


@dataclass(slots=True)
class Kernel:
    """One class of op of a step, per device: name, pass (forward | backward | recompute | update), kind (matmul |
    attention | pointwise | optimizer), shape (m, n, k, batch) of one call for a matmul (None otherwise), calls per
    step, FLOPs and HBM bytes per step, the share of those FLOPs it runs (``executed``), and with a chip: the
    efficiency its shape gets (eta·q, or the SIMT rate's fraction) and its compute and memory seconds; it takes
    the larger (``seconds``, ``bound``)."""

    name: str
    pass_: str
    kind: str
    shape: tuple | None
    calls: object
    flops: object
    bytes: object
    executed: float = 1.0  # the share of the FLOPs the kernel runs (flash: the causal blocks)
    efficiency: object = 1.0
    math_seconds: object = 0.0
    memory_seconds: object = 0.0

    @property
    def seconds(self):
        """max(FLOPs·executed/(peak·efficiency), bytes/HBM bandwidth): the roofline of one kernel."""
        return np.maximum(self.math_seconds, self.memory_seconds)

    @property
    def bound(self):
        """compute or HBM: the larger of the two times."""
        return np.where(np.asarray(self.math_seconds) >= self.memory_seconds, "compute", "HBM")


def peak_flops(chip: Chip, dtype: str = "bf16") -> float:
    """Peak matmul FLOP/s of one device for ``dtype`` (hardware table: bf16_flops, and ``dtype_flops`` for fp32,
    tf32, int8, fp8); ValueError naming what the chip has otherwise."""
    if dtype == "bf16":
        return chip.device_flops
    table = dict(chip.dtype_flops)
    if dtype not in table:
        raise ValueError(f"{chip.name} has no {dtype} rate in the hardware table; it has: "
                         + ", ".join(["bf16", *table]))
    return table[dtype] / chip.devices_per_chip


def shape_efficiency(chip: Chip, m, n, k, batch=1, dtype: str = "bf16"):
    """The fraction of the chip's ``dtype`` peak a matmul [m, k]·[k, n] (``batch`` of them) gets: eta·q(shape)
    (module docstring); on a GPU a 16-bit operand with k or n off the tensor-core alignment gets eta times the FP32
    rate's fraction of the peak instead."""
    eta = chip.matmul_efficiency
    if chip.kind == "tpu":
        a = chip.mxu or 128
        return eta * (k / (np.ceil(k / a) * a)) * (n / (np.ceil(n / a) * a))
    sms, best = chip.sm_count or 1, 0.0
    for tm, tn in chip.mma_tiles or ((128, 128),):
        tiles = batch * np.ceil(m / tm) * np.ceil(n / tn)
        q = batch * m * n / (np.ceil(tiles / sms) * sms * tm * tn)
        best = np.maximum(best, q)
    out = eta * best
    if dtype in ("bf16", "fp8", "int8") and chip.tc_align:
        simt = dict(chip.dtype_flops).get("fp32", chip.bf16_flops) / chip.bf16_flops
        off = (k % chip.tc_align != 0) | (n % chip.tc_align != 0)
        out = np.where(off, simt * eta, out)
    return out


def _matmul(name, pass_, m, n, k, calls, c, batch=1, kind="matmul", flops_=None, bytes_=None, executed=1.0):
    """A matmul kernel of ``calls`` calls of [m, k]·[k, n] (× batch): its FLOPs ``flops_`` per step where the
    program's count differs from the shapes', its bytes ``bytes_`` where given; None otherwise, for _shape_costs
    to make (c-byte elements: step_kernels fills them in, compute_term makes them for every kernel at once)."""
    return Kernel(name, pass_, kind, (m, n, k, batch), calls, flops_, bytes_, executed)


def _shape_costs(m, n, k, batch, calls, c):
    """(FLOPs, HBM bytes) per step of ``calls`` calls of a matmul [m, k]·[k, n] (× batch) on c-byte elements:
    2·m·n·k·batch and c·(m·k + k·n + m·n)·batch a call. Elementwise, so the same on numpy arrays of many
    kernels' shapes (compute_term)."""
    # scalars first: m and calls are the arrays of the planner's batches (fewer array operations)
    return m * (2 * n * k * batch) * calls, (m * (c * (k + n) * batch) + c * k * n * batch) * calls


def _filled(ks: list[Kernel], c) -> list[Kernel]:
    """The kernels with the FLOPs and bytes _matmul left to their shapes (_shape_costs) made."""
    for k in ks:
        if k.flops is None or k.bytes is None:
            f, b = _shape_costs(*k.shape, k.calls, c)
            k.flops = f if k.flops is None else k.flops
            k.bytes = b if k.bytes is None else k.bytes
    return ks


def _transformer(w: Workload) -> list[Kernel]:
    """The transformer's kernels (module docstring), from the closed forms' counts (scaling.transformer: passes,
    recomputed, attention_units, dead_in_again)."""
    cfg, mesh, step, remat, schedule, precision = w.model, w.mesh, w.step, w.remat, w.schedule, w.precision
    s, t, X, Y, C, d = transformer._dims(cfg, mesh, w.batch_tokens)
    D, F, N, K, H, T, m = cfg.d_model, cfg.d_ff, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.seq_len, cfg.mlp_matrices
    V, c = cfg.vocab or 0, precision.compute
    p = transformer.passes(w)
    M = schedule.microbatches
    tm = t / M  # tokens of one call (a microbatch's, per device)
    calls = p["layers"] * M  # layer-passes of tm tokens
    ring = spans(C) and schedule.context == "ring"
    Tq = T / C if ring else T
    heads = N / Y / (1 if ring else C)  # heads a device runs attention for
    seqs = s / M  # sequences of one call
    unit = s * T * T * N * H / (Y * C)  # one attention unit over the step's t tokens (transformer.step_flops)
    flash = transformer.runs_flash(schedule, mesh)
    nb = np.maximum(T / (C if ring else 1) / schedule.attention_block, 1.0)
    # the causal blocks a flash kernel runs: its time, not the program's FLOPs (Kernel.flops stays the count)
    skip = (nb + 1) / (2 * nb) if flash else 1.0
    qkv_n, out_k, ff = H * (N + 2 * K) / Y, N * H / Y, F / Y
    bs = C if ring else 1  # ring: C chunk pairs of (T/C)² per call
    train = step == "train"

    def layer(pass_, share, what=("qkv", "out", "mlp_in", "mlp_out"), units=4):
        """One kind of pass over the layers: ``share`` of the layer-passes; forward shapes."""
        n_calls = calls * share
        ks = []
        if "qkv" in what:
            ks.append(_matmul("qkv", pass_, tm, qkv_n, D, n_calls, c))
        if units:
            # flash: the scores stay on chip, only q, k, v and o move (k, v of the kv heads)
            moved = c * n_calls * seqs * bs * Tq * H * (2 * heads + 2 * heads * K / N) if flash else None
            ks.append(_matmul("attention", pass_, Tq, Tq, H, n_calls, c, batch=seqs * heads * bs, kind="attention",
                              flops_=units * unit * p["layers"] * share, bytes_=moved, executed=skip))
        if "out" in what:
            ks.append(_matmul("out", pass_, tm, D, out_k, n_calls, c))
        if "mlp_in" in what:
            ks.append(_matmul("mlp_in", pass_, tm, ff, D, n_calls * (m - 1), c))
        if "mlp_out" in what:
            ks.append(_matmul("mlp_out", pass_, tm, D, ff, n_calls, c))
        return ks

    def transposed(k: Kernel) -> list[Kernel]:
        """The backward of a forward matmul [m,k]·[k,n]: dX [m,n]·[n,k] and dW [k,m]·[m,n]."""
        mm, nn, kk, b = k.shape
        if k.kind == "attention":  # 8 or 10 units backward (scaling.transformer.attention_units), shapes of the forward
            units = transformer.attention_units(schedule, "backward", mesh)
            moved = _shape_costs(*k.shape, k.calls, c)[1] if k.bytes is None else k.bytes
            return [Kernel(k.name, "backward", k.kind, k.shape, k.calls, k.flops * units / 4, moved * 2, k.executed)]
        return [_matmul(k.name + ".dx", "backward", mm, kk, nn, k.calls, c),
                _matmul(k.name + ".dw", "backward", kk, nn, mm, k.calls, c)]

    forward = layer("forward", 1.0)
    ks = list(forward)
    th = t * p["head"]
    staged = not np.all(np.asarray(mesh.get("stage", 1)) == 1)  # one stage count per planner group
    head_calls = p["head_iterations"] if p["again"] else (1 if staged else M)
    logits = _matmul("logits", "forward", th / head_calls, V / Y, D, head_calls, c) if V else None
    if logits is not None:
        ks.append(logits)
    if train:
        for k in forward + ([logits] if logits is not None else []):
            ks += transposed(k)
        r = transformer.recomputed(cfg, remat, schedule, mesh)
        ks += layer("recompute", 1.0, tuple(n for n in ("qkv", "out") if r[n]), units=r["attention_units"])
        if r["mlp_in"]:
            ks += layer("recompute", 1.0, ("mlp_in",), units=0)
        if p["again"]:  # 1F1B's second forward, less what XLA drops from a one-layer chunk's (dead_in_again)
            dead = transformer.dead_in_again(cfg, remat, p)
            again = [k for k in layer("recompute", 1.0, units=4 - dead["attention_units"])
                     if not (k.name == "qkv" and dead["qkv"]) and not (k.name == "out" and dead["out"])]
            dropped = {"mlp_in", "mlp_out"} if dead["mlp"] == 1 else {"mlp_out"} if dead["mlp"] else set()
            ks += [k for k in again if k.name not in dropped]
    # pointwise passes (module docstring), per layer-pass of t tokens (sequence parallel: the D-wide ones on t/Y)
    sp = Y if schedule.sequence_parallel else 1
    norms, adds = (1, 1) if cfg.block == "parallel" else (2, 2)
    per_token = (norms * 2 + adds * 3) * c * D / sp + c * m * ff
    scores = 0 if flash else 2 * c * unit / H  # the softmax reads and writes the s·N·T²/(Y·C) scores
    fwd_bytes = p["layers"] * (per_token * t + scores)
    head_bytes = 2 * c * th * V / Y
    ks.append(Kernel("pointwise", "forward", "pointwise", None, calls, 0.0, fwd_bytes + head_bytes))
    if train:
        ks.append(Kernel("pointwise", "backward", "pointwise", None, calls, 0.0, 2 * (fwd_bytes + head_bytes)))
        share = (r["qkv"] + r["out"] + r["mlp_in"] + r["attention_units"] / 4) / 4 if not p["again"] else 1.0
        ks.append(Kernel("pointwise", "recompute", "pointwise", None, calls, 0.0, share * fwd_bytes))
        ks += [_optimizer(w, cfg.params), _accumulate(w, cfg.params)]
    return ks


def _accumulate(w: Workload, params) -> Kernel:
    """The gradient accumulation's adds (module docstring): n·P/(S·X·Y) parameters of
    Precision.accumulate_bytes_per_param each, n = M for M > 1 without stages, T/R with S stages."""
    S, M, R = w.mesh.get("stage", 1), w.schedule.microbatches, w.schedule.repeats
    n = pipeline.slots(w.schedule, S) / R if S > 1 else np.where(np.asarray(M) > 1, M, 0)
    per = w.precision.accumulate_bytes_per_param * params / memory.weight_shards(w.mesh)
    return Kernel("accumulate", "update", "pointwise", None, n, 0.0, n * per)


def _optimizer(w: Workload, params) -> Kernel:
    """AdamW's update: 16 B read and 12 B written per parameter shard (Precision.adam_update_bytes_per_param)."""
    shards = memory.weight_shards(w.mesh) * w.zero1_shards / w.mesh.get("stage", 1)
    per = w.precision.adam_update_bytes_per_param
    return Kernel("adamw", "update", "optimizer", None, 1, 0.0, per * params / shards)


def _ffn(w: Workload) -> list[Kernel]:
    """The FFN stack's kernels: per block-pass h = relu(x·W_inᵀ) [b, D]·[D, F/Y] and y = h·W_out [b, F/Y]·[F/Y, D]
    on b = B/(M·data·fsdp) tokens; backward dX and dW of each; the program's FLOP terms (scaling.flops.step_flops,
    scaling.program.step_flops_per_device) spread over those shapes; relu's pass c·F/Y a token (forward,
    recompute), twice backward; AdamW."""
    from scaling.program import step_flops_per_device  # the FLOPs the program runs (one definition)

    cfg, mesh, c = w.model, w.mesh, w.precision.compute
    D, F, Y, M = cfg.d_model, cfg.d_ff, mesh["tensor"], w.schedule.microbatches
    b = memory.tokens_per_device(mesh, w.batch_tokens) / M
    f = step_flops_per_device(w)
    one = 2 * b * D * F / Y  # one matmul of one block-pass
    n = pipeline.block_passes(cfg, w.schedule, mesh["stage"])  # block-passes per device
    ks = []

    def pair(pass_, total, shapes):
        calls = total / one
        for name, (mm, nn, kk) in shapes:
            ks.append(_matmul(name, pass_, mm, nn, kk, calls / len(shapes), c, flops_=total / len(shapes)))

    pair("forward", f["forward"], (("w_in", (b, F / Y, D)), ("w_out", (b, D, F / Y))))
    if w.step == "train":
        pair("backward", f["backward_weights"], (("w_in.dw", (D, F / Y, b)), ("w_out.dw", (F / Y, D, b))))
        dx = f["backward_inputs"] + f.get("first_block_input_grad", 0.0)
        pair("backward", dx, (("w_in.dx", (b, D, F / Y)), ("w_out.dx", (b, F / Y, D))))
        if np.any(np.asarray(f.get("recompute", 0.0)) > 0):
            pair("recompute", f["recompute"], (("w_in", (b, F / Y, D)),))
    act = 2 * c * b * F / Y  # relu: read h, write relu(h)
    ks.append(Kernel("relu", "forward", "pointwise", None, n, 0.0, n * act))
    if w.step == "train":
        ks.append(Kernel("relu", "backward", "pointwise", None, n, 0.0, 2 * n * act))
        rec = np.asarray(f.get("recompute", 0.0)) / one
        ks.append(Kernel("relu", "recompute", "pointwise", None, rec, 0.0, rec * act))
        ks += [_optimizer(w, cfg.params), _accumulate(w, cfg.params)]
    return ks


def tiled_bytes(chip: Chip, m, n, k, batch, c):
    """HBM bytes of one matmul call [m, k]·[k, n] (× batch) tiled through the chip's on-chip memory (module
    docstring, the hierarchical model): t = 2^⌊log2 √(onchip/(3·c))⌋, c·(m·k·r_A + k·n·r_B + m·n)·batch
    with r_A = 1 (k ≤ t) or ⌈n/t⌉, r_B = ⌈m/t⌉ (DeepFlow's reloads). ValueError for a chip without an on-chip
    size."""
    if not chip.onchip:
        raise ValueError(f"{chip.name} has no on-chip memory size in the hardware table (onchip_bytes), which the "
                         "hierarchical kernel model tiles through")
    t = 2.0 ** np.floor(np.log2(np.sqrt(chip.onchip / (3 * c))))
    r_a = np.where(k <= t, 1.0, np.ceil(n / t))
    return c * (m * k * r_a + k * n * np.ceil(m / t) + m * n) * batch


def step_kernels(w: Workload, chip: Chip | None = None, dtype: str = "bf16",
                 kernel_model: str = "efficiency") -> list[Kernel]:
    """The step's kernels per device (module docstring), with their efficiency, seconds and bound on ``chip``;
    ``kernel_model`` "hierarchical" takes each matmul's bytes from its tiles and its efficiency unquantized."""
    if kernel_model not in KERNEL_MODELS:
        raise ValueError(f"kernel model {kernel_model!r}: one of {', '.join(KERNEL_MODELS)}")
    ks = _filled(_transformer(w) if isinstance(w.model, TransformerConfig) else _ffn(w), w.precision.compute)
    if chip is None:
        return ks
    peak, bw = peak_flops(chip, dtype), chip.device_hbm_bw
    out = []
    for k in ks:
        if kernel_model == "hierarchical" and k.kind == "matmul":
            b = tiled_bytes(chip, *k.shape, w.precision.compute) * k.calls
            eff = chip.matmul_efficiency
            out.append(Kernel(k.name, k.pass_, k.kind, k.shape, k.calls, k.flops, b, k.executed, eff,
                              k.flops * (k.executed / (peak * eff)), b / bw))
            continue
        t_mem = k.bytes / bw
        if k.shape is None:
            out.append(Kernel(k.name, k.pass_, k.kind, None, k.calls, k.flops, k.bytes, 1.0, 1.0, 0.0, t_mem))
            continue
        eff = shape_efficiency(chip, *k.shape, dtype)
        t_math = k.flops * (k.executed / (peak * eff))
        out.append(Kernel(k.name, k.pass_, k.kind, k.shape, k.calls, k.flops, k.bytes, k.executed, eff, t_math, t_mem))
    return out


def compute_seconds(kernels: list[Kernel]) -> object:
    """The step model's compute term: Σ of the kernels' seconds (they run one after another on a device)."""
    return sum(k.seconds for k in kernels)


def compute_term(w: Workload, chip: Chip, dtype: str = "bf16", kernel_model: str = "efficiency") -> object:
    """compute_seconds(step_kernels(w, chip, dtype, kernel_model)), the figure predict's scheduled form takes, made
    for all the step's matmuls at once: their shapes, calls, FLOPs and bytes stacked into numpy arrays [kernels, ...]
    and each formula (_shape_costs, shape_efficiency, the roofline of a kernel) evaluated once on them, elementwise
    (the same figures, summed in the kernels' order). The planner's candidates each take it (a kernel at a time,
    about 40 of them, was two thirds of a candidate's step time)."""
    if kernel_model != "efficiency":
        return compute_seconds(step_kernels(w, chip, dtype, kernel_model))
    ks = _transformer(w) if isinstance(w.model, TransformerConfig) else _ffn(w)
    mm = [k for k in ks if k.shape is not None]
    peak, bw = peak_flops(chip, dtype), chip.device_hbm_bw
    total = 0
    if mm:
        flops_given, bytes_given = [k.flops is not None for k in mm], [k.bytes is not None for k in mm]
        cols = [_stacked(col) for col in zip(*((*k.shape, k.calls, k.executed) for k in mm))]
        if any(flops_given):
            cols += [_stacked(flops_given), _stacked([0.0 if k.flops is None else k.flops for k in mm])]
        if any(bytes_given):
            cols += [_stacked(bytes_given), _stacked([0.0 if k.bytes is None else k.bytes for k in mm])]
        nd = max(a.ndim for a in cols)  # each [kernels, ...] with as many dimensions (numpy aligns the last)
        m, n, kk, b, calls, executed, *given = (a.reshape(a.shape[:1] + (1,) * (nd - a.ndim) + a.shape[1:])
                                                for a in cols)
        flops, moved = _shape_costs(m, n, kk, b, calls, w.precision.compute)
        if any(flops_given):
            flops, given = np.where(given[0], given[1], flops), given[2:]
        if any(bytes_given):
            moved = np.where(given[0], given[1], moved)
        seconds = iter(np.maximum(flops * (executed / (peak * shape_efficiency(chip, m, n, kk, b, dtype))),
                                  moved / bw))
    for k in ks:  # in the kernels' order, as compute_seconds sums them
        total = total + (np.maximum(0.0, k.bytes / bw) if k.shape is None else next(seconds))
    return total


def _stacked(values) -> np.ndarray:
    """Scalars or arrays as one array [len(values), ...] of their broadcast shape and common type (np.stack of their
    broadcasts, without its cost per value)."""
    shapes = {getattr(v, "shape", ()) for v in values}
    if shapes == {()}:
        return np.array(values)
    kinds = {(type(v), getattr(v, "dtype", None)): v for v in values}.values()  # one value of each type (result_type)
    a = np.empty((len(values), *np.broadcast_shapes(*shapes)), np.result_type(*kinds))
    for i, v in enumerate(values):
        a[i] = v
    return a
