"""The step's kernels, one by one: what the step model's compute term is made of (scaling.step.program.predict's
scheduled form). Each kernel is one class of op a device runs in a step (a matmul of one shape, a pointwise
pass, the optimizer update), with its FLOPs, the HBM bytes it reads and writes, its calls, and its time:

  matmul     t_fixed·calls + max(FLOPs / (C_dtype · eta · q(shape)), bytes / HBM bandwidth) (the roofline of one
             kernel, Scaling Book roofline page, and a fixed time per call): eta the fraction of peak a large
             aligned matmul sustains, q the quantization of the shape (below).
               TPU: eta = the chip's ``matmul_efficiency`` (hardware table: fitted on one named run), t_fixed 0.
               GPU: eta = the dtype's ceiling and t_fixed (launch, prologue and epilogue of one GEMM) are the
                    chip's GEMM coefficients, fitted by least squares in log time on the GEMM rows of its kernel
                    table (scaling/data/kernels/, published or calibrated kernel-level sweeps: gemm_coefficients);
                    a dtype the table lacks takes the bf16 ceiling and t_fixed at its own peak, a chip without a
                    table its ``matmul_efficiency`` and t_fixed 0: the coefficients say which (``fallback``).
               int8, fp8: a quantized step, its layers' weight GEMMs at that type's peak, attention and the logits
                    at bf16's, a pointwise pass casting each 8-bit GEMM's operands (matmul_dtype, quantize_kernels).
             q:
               TPU: the MXU (a×a systolic array, a = ``mxu``) takes the contracting dim k and the output dim n
                    in whole tiles: q = k/(a·⌈k/a⌉) · n/(a·⌈n/a⌉) (Scaling Book TPU page; m streams through);
               GPU: tile and wave quantization (NVIDIA, "Matrix Multiplication Background", dl-performance
                    guide): an output of batch·⌈m/tm⌉·⌈n/tn⌉ tiles runs in ⌈tiles/SMs⌉ waves,
                    q = batch·m·n / (waves·SMs·tm·tn), the best of the chip's ``mma_tiles``; where the library
                    splits the contracting dim over more thread blocks (split-K / stream-K: CUTLASS's and
                    cuBLAS's kernels for outputs of under two waves of tiles), s slices of k ≥ k_split
                    (s ∈ 1, 2, 4, 8, 16) make s·tiles work units: q = s·batch·m·n / (⌈s·tiles/SMs⌉·SMs·tm·tn);
                    k_split is the table's, fitted with the ceiling (None: the library does not split, as cuBLAS
                    11 on the A100's published curve); a 16-bit operand whose k or n is not a multiple of
                    ``tc_align`` elements misses the tensor cores (same guide, "Tensor Core requirements"): it
                    runs at the fp32 ceiling of the chip's FP32 (SIMT) rate.
  attention  the q·kᵀ and p·v matmuls as batched matmuls over sequences × heads (shape (T, T, H)), the scores
             through HBM where materialized; under flash only q, k, v and o move, and
             the kernel skips the key blocks the causal mask hides (Dao et al. 2022; MaxText's splash and
             cuDNN's kernels): it runs (n_b + 1)/(2·n_b) of the program's units, n_b = T/attention_block
  pointwise  bytes / HBM bandwidth: per layer-pass the norms (read and write c·D a token), the residual adds
             (read 2·c·D, write c·D), the MLP activation (c·m·F/Y), the materialized softmax (read and write
             the scores, c·s·N·T²/Y), the loss's softmax over the vocabulary (c·V/Y a token, read and write);
             a backward pass moves twice its forward's bytes (reads the saved input and the incoming
             gradient, writes the gradient), a recomputed forward its forward's again
             On a GPU (issue 38) a pass is its kernels (pointwise_launches: norms, residual adds, activation,
             materialized softmax; a backward twice the forward's), each launch_seconds + its bytes at the bandwidth
             that size reaches on the kernel table's [pointwise] rows (pointwise_seconds); a fused flash attention
             takes the table's [attention.cudnn] rows (attention_table_seconds) in place of the matmul model.
             A100 (GEMM rows only): the H100's launch and pointwise rows (bandwidth scaled by the HBM ratio), and
             the matmul model for attention; H200/B200 take the H100's table whole (chips.toml kernels_as).
  optimizer  AdamW reads master, gradient, μ, ν and writes master, μ, ν: 7·4 B per parameter shard
             (scaling.step.memory.hbm_traffic_bytes)
  accumulate each microbatch's gradient added to the FP32 accumulator (read both, write one: 3·4 B per
             parameter of the device, P/(S·X·Y)), n times a step: n = M with gradient accumulation (none for
             M = 1: the one gradient is the step's), T/R with S stages (every slot adds its chunk's gradient,
             1/R of the stage's; scaling.step.pipeline.slots); Megatron-LM's main_grad accumulation likewise

A second matmul model, ``kernel_model="hierarchical"`` (DeepFlow's, as seed 002 runs it: scaling.seeds.seed002): a
matmul tiles through the chip's on-chip memory (``onchip``: a GPU's L2, a TPU's VMEM) in the largest power-of-two tiles
t with 3·t²·c bytes in it; with k ≤ t the [m, k] operand is read once and the [k, n] one ⌈m/t⌉ times, else they
are read ⌈n/t⌉ and ⌈m/t⌉ times, the output written once: HBM bytes c·(m·k·r_A + k·n·r_B + m·n) a call; its
time the larger of FLOPs/(C·eta) (no tile or wave quantization) and those bytes over the HBM bandwidth. Attention,
pointwise and update kernels are the same in both.

The matmul FLOPs are the program's (scaling.families.transformer.step_flops, scaling.step.flops.step_flops: the
compiler's count); the kernel times sum to the step model's compute term, ``compute_seconds``. Values may be numpy
arrays (the planner's batches).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from scaling.hardware import chips as hardware
from scaling.hardware import collectives
from scaling.step import launches
from scaling.step.kernel import Kernel
from scaling.step import memory
from scaling.step import pipeline
from scaling.hardware.chips import Chip
from scaling.core.kinds import Block, Dtype, KernelKind, KernelModel, KernelPass, Platform
from scaling.core.mesh_shape import spans
from scaling.core.policies import Attention, Step
from scaling.core.schedule import key_block, runs_flash
from scaling.core.workload import Workload

DTYPES = ("bf16", "fp32", "tf32", "int8", "fp8")  # the matmul input types the hardware table gives peaks for
KERNEL_MODELS = ("efficiency", "hierarchical")  # the matmul term (module docstring)


def peak_flops(chip: Chip, dtype: str = "bf16") -> float:
    """Peak matmul FLOP/s of one device for ``dtype`` (hardware table: bf16_flops, and ``dtype_flops`` for fp32,
    tf32, int8, fp8); ValueError naming what the chip has otherwise."""
    if dtype == Dtype.BF16:
        return chip.device_flops
    table = dict(chip.dtype_flops)
    if dtype not in table:
        raise ValueError(f"{chip.name} has no {dtype} rate in the hardware table; it has: "
                         + ", ".join(["bf16", *table]))
    return table[dtype] / chip.devices_per_chip


DTYPE_BYTES = {"bf16": 2, "fp32": 4, "tf32": 4, "int8": 1, "fp8": 1}  # an element of each matmul input type


@dataclass(frozen=True)
class GemmCoefficients:
    """A chip's GEMM coefficients for one dtype (module docstring): ``ceiling`` the fraction of the dtype's peak a
    large GEMM reaches, ``t_fixed`` seconds per call; ``source`` the data they come from, ``rows`` how many GEMM
    rows they were fitted on (0: taken from elsewhere), ``fallback`` what was taken instead where the chip's table
    has no rows for the dtype ("" where none was), ``rms_log_error`` the fit's root-mean-square error in log time,
    ``k_split`` the least slice of k the library splits the contracting dim into (None: no split-K)."""

    chip: str
    dtype: str
    ceiling: float
    t_fixed: float
    source: str
    rows: int = 0
    fallback: str = ""
    rms_log_error: float = float("nan")
    k_split: int | None = None


_COEFFICIENTS: dict = {}  # (id(chip), dtype) -> (chip, GemmCoefficients): the fit is made once per chip row


def gemm_coefficients(chip: Chip, dtype: str = "bf16") -> GemmCoefficients:
    """The GEMM coefficients of a GPU ``chip`` for ``dtype`` (module docstring): fit_gemm on the rows of
    chip.kernel_table's [gemm.<dtype>] section; a dtype without rows takes bf16's (fallback says so), a chip
    without a table (or without bf16 rows) its matmul_efficiency as ceiling and t_fixed 0 (likewise said). A TPU:
    its matmul_efficiency, t_fixed 0."""
    hit = _COEFFICIENTS.get((id(chip), dtype))
    if hit is not None and hit[0] is chip:
        return hit[1]
    table = chip.kernel_table
    owner = hardware.CHIPS.get(table.chip, chip) if table is not None and table.chip != chip.name else chip
    if chip.kind != Platform.GPU:
        c = GemmCoefficients(chip.name, dtype, chip.matmul_efficiency, 0.0, "matmul_efficiency (hardware table)")
    elif owner is not chip:  # a table measured on another GPU (kernels_as): fitted on that GPU's structure
        o = gemm_coefficients(owner if owner.kernel_table is table else dataclasses.replace(owner, kernel_table=table),
                              dtype)
        c = dataclasses.replace(o, chip=chip.name, fallback="; ".join(
            [f"{chip.name} has no kernel table of its own: the {owner.name}'s coefficients, fitted on its table",
             *([o.fallback] if o.fallback else [])]))
    elif table is not None and dtype in table.gemm:
        c = fit_gemm(chip, dtype, table.gemm[dtype].rows, f"{table.path} [gemm.{dtype}]: {table.gemm[dtype].source}")
    elif table is not None and Dtype.BF16 in table.gemm:
        b = gemm_coefficients(chip, "bf16")
        c = dataclasses.replace(b, dtype=dtype, rows=0, fallback=(
            f"{table.path} has no {dtype} GEMM rows: the bf16 ceiling {b.ceiling:.3f} at the {dtype} peak and the bf16 "
            f"t_fixed {b.t_fixed * 1e6:.1f} us"))
    else:
        where = "no kernel table" if table is None else f"{table.path} has no bf16 or {dtype} GEMM rows"
        c = GemmCoefficients(chip.name, dtype, chip.matmul_efficiency, 0.0, "matmul_efficiency (hardware table)",
                             fallback=f"{chip.name}: {where}: ceiling = the hardware row's matmul_efficiency "
                                      f"{chip.matmul_efficiency}, t_fixed 0")
    _COEFFICIENTS[(id(chip), dtype)] = (chip, c)
    return c


def gemm_terms(chip: Chip, m, n, k, batch=1, dtype: str = "bf16", k_split=None):
    """(A, B): a GEMM [m, k]·[k, n] (× batch)'s math seconds at the full ``dtype`` peak over the wave quantization
    2·m·n·k·batch/(C_dtype·q) and its memory seconds c·(m·k + k·n + m·n)·batch/W_hbm (c the dtype's bytes): its time
    is t_fixed + max(A/ceiling, B) (module docstring; numpy arrays elementwise)."""
    flops, moved = shape_costs(m, n, k, batch, 1, DTYPE_BYTES[dtype])
    q = wave_quantization(chip, m, n, batch, k, k_split)
    return flops / (peak_flops(chip, dtype) * q), moved / chip.device_hbm_bw


K_SPLITS = (None, 256, 512, 1024, 2048, 4096)  # the candidates fit_gemm tries for k_split (None: no split-K)


def fit_gemm(chip: Chip, dtype: str, rows, source: str) -> GemmCoefficients:
    """ceiling, t_fixed and k_split of t = t_fixed + max(A/ceiling, B) (gemm_terms on ``chip``) fitted on measured
    GEMM ``rows`` (m, n, k, seconds) by least squares in log time, min Σ (log t_model − log t_measured)²: for each
    k_split of K_SPLITS a grid search, ceiling on [0.05, 1] by 0.01 and t_fixed on 0 and 0.1 us .. 1 ms 5% apart,
    refined twice tenfold around the best (to 0.0001 and 0.05%); the k_split of the least error (tried from 6 rows
    up; fewer fit no split). One row fits the ceiling alone with t_fixed 0 (two coefficients need two rows)."""
    r = np.asarray(rows, float)
    t = np.log(r[:, 3])
    out = None
    for k_split in K_SPLITS if len(r) >= 6 else (None,):
        a, b = gemm_terms(chip, r[:, 0], r[:, 1], r[:, 2], 1, dtype, k_split)

        def best(ceil, fixed):
            ceil, fixed = np.clip(ceil, 0.05, 1.0), np.clip(fixed, 0.0, None)
            pred = fixed[None, :, None] + np.maximum(a / ceil[:, None, None], b)
            sse = ((np.log(pred) - t) ** 2).sum(-1)
            i, j = np.unravel_index(np.argmin(sse), sse.shape)
            return ceil[i], fixed[j], sse[i, j]

        c, f, sse = best(np.arange(0.05, 1.001, 0.01),
                         np.concatenate([[0.0], np.geomspace(1e-7, 1e-3, 190)]) if len(r) > 1 else np.zeros(1))
        for step, spread in ((0.001, 1.05), (0.0001, 1.005)):
            c, f, sse = best(c + step * np.arange(-10, 11), np.array([0.0]) if f == 0 and len(r) == 1 else
                             (np.concatenate([[0.0], np.geomspace(1e-7, 1e-6, 21)]) if f == 0 else
                              f * np.geomspace(1 / spread, spread, 21)))
        if out is None or sse < out[2] - 1e-12:
            out = (c, f, sse, k_split)
    c, f, sse, k_split = out
    return GemmCoefficients(chip.name, dtype, round(float(c), 4), float(f), source, len(r),
                            rms_log_error=float(np.sqrt(sse / len(r))), k_split=k_split)


SPLITS = (1, 2, 4, 8, 16)  # the slices of k a split-K GEMM may run (module docstring)


def tilings(chip: Chip, m, n, batch=1, k=None, k_split=None):
    """Per output tile (tm, tn) of the GPU's ``mma_tiles`` (128×128 where the row has none): (tm, tn, tiles, waves,
    q, s), tiles = batch·⌈m/tm⌉·⌈n/tn⌉, s the slices of k (split-K: the best of SPLITS with k/s ≥ k_split; 1
    without ``k_split``, and only for outputs of fewer than 2·SMs tiles), waves = ⌈s·tiles/SMs⌉,
    q = s·batch·m·n/(waves·SMs·tm·tn) (NVIDIA, "Matrix Multiplication Background User's Guide", tile and wave
    quantization; CUTLASS's split-K and stream-K GEMMs)."""
    sms = chip.sm_count or 1
    for tm, tn in chip.mma_tiles or ((128, 128),):
        tiles = batch * np.ceil(m / tm) * np.ceil(n / tn)
        best_q, best_s, best_w = 0.0, 1, np.ceil(tiles / sms)
        for s in SPLITS if (k_split is not None and k is not None) else (1,):
            waves = np.ceil(s * tiles / sms)
            q = s * batch * m * n / (waves * sms * tm * tn)
            if s > 1:
                q = np.where(np.asarray(k) / s >= k_split, q, 0.0)
            better = (q > best_q) & ((s == 1) | (tiles < 2 * sms))  # split only outputs of under two waves of tiles
            best_q, best_s, best_w = (np.where(better, q, best_q), np.where(better, s, best_s),
                                      np.where(better, waves, best_w))
        yield tm, tn, tiles, best_w, best_q, best_s


def wave_quantization(chip: Chip, m, n, batch=1, k=None, k_split=None):
    """A GPU's tile and wave quantization q of an output [m, n] (× batch) (module docstring): the best q of
    tilings (split-K over k's slices of at least ``k_split``), the tile and split the library would pick."""
    best = 0.0
    for *_, q, _s in tilings(chip, m, n, batch, k, k_split):
        best = np.maximum(best, q)
    return best


def shape_efficiency(chip: Chip, m, n, k, batch=1, dtype: str = "bf16"):
    """The fraction of the chip's ``dtype`` peak a matmul [m, k]·[k, n] (``batch`` of them) gets on its math:
    eta·q(shape) (module docstring: a TPU's matmul_efficiency and MXU padding; a GPU's ceiling for the dtype,
    gemm_coefficients, and wave_quantization); on a GPU a 16-bit operand with k or n off the tensor-core alignment
    gets the fp32 ceiling times the FP32 rate's fraction of the peak instead."""
    if chip.kind == Platform.TPU:
        eta, a = chip.matmul_efficiency, chip.mxu or 128
        return eta * (k / (np.ceil(k / a) * a)) * (n / (np.ceil(n / a) * a))
    coeff = gemm_coefficients(chip, dtype)
    out = coeff.ceiling * wave_quantization(chip, m, n, batch, k, coeff.k_split)
    if dtype in (Dtype.BF16, Dtype.FP8, Dtype.INT8) and chip.tc_align:
        simt = dict(chip.dtype_flops).get("fp32", chip.bf16_flops) / peak_flops(chip, dtype) * chip.devices_per_chip
        off = (k % chip.tc_align != 0) | (n % chip.tc_align != 0)
        out = np.where(off, simt * gemm_coefficients(chip, "fp32").ceiling, out)
    return out


def fixed_seconds(chip: Chip, dtype: str = "bf16") -> float:
    """A matmul call's fixed time: a GPU's t_fixed for ``dtype`` (gemm_coefficients), a TPU's 0."""
    return gemm_coefficients(chip, dtype).t_fixed if chip.kind == Platform.GPU else 0.0


def large_gemm_efficiency(chip: Chip, dtype: str = "bf16") -> float:
    """The fraction of the ``dtype`` peak the largest aligned matmul reaches: a GPU's ceiling, a TPU's
    matmul_efficiency (no kernel runs faster: a lower bound of the compute term divides by it)."""
    return gemm_coefficients(chip, dtype).ceiling if chip.kind == Platform.GPU else chip.matmul_efficiency


def gemm_seconds(chip: Chip, m, n, k, batch=1, dtype: str = "bf16"):
    """One call of [m, k]·[k, n] (× batch): t_fixed + max(2·m·n·k·batch/(C_dtype·shape_efficiency), c·(m·k + k·n +
    m·n)·batch/W_hbm) (module docstring)."""
    flops, moved = shape_costs(m, n, k, batch, 1, DTYPE_BYTES[dtype])
    math = flops / (peak_flops(chip, dtype) * shape_efficiency(chip, m, n, k, batch, dtype))
    return fixed_seconds(chip, dtype) + np.maximum(math, moved / chip.device_hbm_bw)


# a Kernel's fields, each a keyword of the families' kernel lists
def matmul_kernel(name, pass_, m, n, k, calls, c, batch=1, kind="matmul", flops_=None, bytes_=None, executed=1.0):
    """A matmul kernel of ``calls`` calls of [m, k]·[k, n] (× batch): its FLOPs ``flops_`` per step where the
    program's count differs from the shapes', its bytes ``bytes_`` where given; None otherwise, for shape_costs
    to make (c-byte elements: step_kernels fills them in, compute_term makes them for every kernel at once)."""
    return Kernel(name, pass_, kind, (m, n, k, batch), calls, flops_, bytes_, executed)


def shape_costs(m, n, k, batch, calls, c):
    """(FLOPs, HBM bytes) per step of ``calls`` calls of a matmul [m, k]·[k, n] (× batch) on c-byte elements:
    2·m·n·k·batch and c·(m·k + k·n + m·n)·batch a call. Elementwise, so the same on numpy arrays of many
    kernels' shapes (compute_term)."""
    # scalars first: m and calls are the arrays of the planner's batches (fewer array operations)
    return m * (2 * n * k * batch) * calls, (m * (c * (k + n) * batch) + c * k * n * batch) * calls


def _filled(ks: list[Kernel], c) -> list[Kernel]:
    """The kernels with the FLOPs and bytes matmul_kernel left to their shapes (shape_costs) made."""
    for k in ks:
        if k.flops is None or k.bytes is None:
            f, b = shape_costs(*k.shape, k.calls, c)
            k.flops = f if k.flops is None else k.flops
            k.bytes = b if k.bytes is None else k.bytes
    return ks


def pass_kernels(name: str, w: Workload, calls, forward_bytes, recomputed) -> list[Kernel]:
    """A memory-bound kernel ``name`` a family adds by pass (module docstring, pointwise): forward ``calls`` launches
    moving ``forward_bytes``; in a train step the backward twice both (each op's gradients read the saved input and
    the incoming gradient and write the gradient) and, where ``recomputed``, the forward's once more."""
    out = [Kernel(name, KernelPass.FORWARD, KernelKind.POINTWISE, None, calls, 0.0, forward_bytes)]
    if w.step == Step.TRAIN:
        out.append(Kernel(name, KernelPass.BACKWARD, KernelKind.POINTWISE, None, 2 * calls, 0.0, 2 * forward_bytes))
        if recomputed:
            out.append(Kernel(name, KernelPass.RECOMPUTE, KernelKind.POINTWISE, None, calls, 0.0, forward_bytes))
    return out


def accumulate_kernel(w: Workload, params) -> Kernel:
    """The gradient accumulation's adds (module docstring): n·P/(S·X·Y) parameters of
    Precision.accumulate_bytes_per_param each, n = M for M > 1 without stages, T/R with S stages."""
    S, M, R = w.mesh.get("stage", 1), w.schedule.microbatches, w.schedule.repeats
    n = pipeline.slots(w.schedule, S) / R if S > 1 else np.where(np.asarray(M) > 1, M, 0)
    per = w.precision.accumulate_bytes_per_param * params / memory.weight_shards(w.mesh)
    return Kernel("accumulate", "update", "pointwise", None, n, 0.0, n * per)


def adamw_kernel(w: Workload, params) -> Kernel:
    """AdamW's update: 16 B read and 12 B written per parameter shard (Precision.adam_update_bytes_per_param)."""
    shards = memory.weight_shards(w.mesh) * w.zero1_shards / w.mesh.get("stage", 1)
    per = w.precision.adam_update_bytes_per_param
    return Kernel("adamw", "update", "optimizer", None, 1, 0.0, per * params / shards)


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


# ---- a GPU's non-GEMM kernels from its kernel table (module docstring: pointwise, attention on GPUs) ----

def launch_seconds(chip: Chip) -> float:
    """One kernel launch inside a compiled program (the gap a tiny kernel takes): the chip's kernel table's
    launch_seconds (measured with jax-scaling calibrate); a GPU whose table has none takes the H100
    table's (the same CUDA launch path; A100: published GEMM rows only); 0 on a TPU (XLA:TPU runs one program, no
    launches) or where no table gives one (price_sources says which)."""
    if chip.kind != Platform.GPU:
        return 0.0
    for t in (chip.kernel_table, _h100_table()):
        if t is not None and t.launch_seconds:
            return float(t.launch_seconds)
    return 0.0


def _h100_table():
    from scaling.hardware.kernel_tables import kernel_table
    return kernel_table("H100")


def _pointwise_rows(chip: Chip):
    """(log bytes, bandwidth reached) of the pointwise rows a GPU prices its elementwise kernels by: its own table's,
    or the H100's (a GPU whose table has none: A100), None on a TPU or without any."""
    if chip.kind != Platform.GPU:
        return None
    for t in (chip.kernel_table, _h100_table()):
        if t is not None and t.pointwise is not None:
            return (*_pointwise_bandwidth(t.pointwise.rows, launch_seconds(chip) if t is chip.kernel_table
                                          else float(t.launch_seconds or 0.0)), t is not chip.kernel_table)
    return None


_PW: dict = {}


def _pointwise_bandwidth(rows, launch: float):
    """(log bytes, bytes/s) of each pointwise row past its launch: b / (t − launch) (a row no slower than a launch
    reads as the largest row's bandwidth: the kernel is all launch)."""
    key = (id(rows), launch)
    if key not in _PW:
        b = np.array([r[0] for r in rows], float)
        t = np.array([r[1] for r in rows], float)
        order = np.argsort(b)
        b, t = b[order], t[order]
        bw = np.where(t > launch, b / np.maximum(t - launch, 1e-300), b[-1] / t[-1])
        _PW[key] = (np.log(b), bw)
    return _PW[key]


def pointwise_seconds(chip: Chip, nbytes, launches=1.0):
    """Seconds of ``launches`` elementwise kernels moving ``nbytes`` in all (read + written), each its share
    b = nbytes/launches: launches·(t_launch + b/W(b)). On a GPU W(b) is the bandwidth the kernel table's
    [pointwise] rows reach at that size, b_i/(t_i − t_launch), interpolated linearly in log bytes (clamped to the
    end rows; so a kernel of a row's size takes that row's time), a GPU without rows the H100's scaled by the HBM
    bandwidths' ratio (hardware table), t_launch = launch_seconds; on a TPU nbytes/W_hbm (no launch)."""
    rows = _pointwise_rows(chip)
    nbytes = np.asarray(nbytes, float)
    if rows is None:
        return np.maximum(0.0, nbytes / chip.device_hbm_bw)
    logb, bw, borrowed = rows
    launches = np.asarray(launches, float)
    per = nbytes / np.maximum(launches, 1e-300)
    w = np.interp(np.log(np.maximum(per, 1.0)), logb, bw)
    if borrowed:
        w = w * chip.device_hbm_bw / hardware.CHIPS["H100"].device_hbm_bw
    return np.where(launches > 0, launches * launch_seconds(chip) + nbytes / w, 0.0)


def pointwise_launches(w: Workload, k: Kernel):
    """Kernel launches per call of a non-matmul kernel (each kernel the runtime launches, as the step's program
    runs them): the transformer's per layer-pass ("pointwise", forward) the norms (1 parallel, 2 serial), the
    residual adds (1, 2), the MLP's activation (1: the gate's product fused with it), the materialized softmax (1;
    flash: in the attention kernel); its backward twice the forward's (each op's input and weight gradients), a
    recomputed forward the share of the forward its remat recomputes (the bytes' share); the FFN model's relu 1 a
    block-pass; AdamW 3 (multi-tensor apply in Megatron-LM and DeepSpeed, XLA's few fusions: the gradients'
    norm, the clip, the update); a gradient accumulation 1 per accumulation."""
    if k.name == "adamw":
        return 3.0 / np.maximum(np.asarray(k.calls, float), 1.0)
    if k.name != "pointwise":
        return 1.0
    cfg = w.model
    serial = cfg.block != Block.PARALLEL
    forward = (2 if serial else 1) * 2 + 1 + (0 if runs_flash(w.schedule, w.mesh) else 1)
    return {"forward": forward, "backward": 2 * forward}.get(k.pass_, forward)


def uses_attention_table(w: Workload, chip: Chip) -> bool:
    """Whether a GPU step's attention takes the kernel table's cuDNN rows (attention_seconds): the program runs
    cuDNN's fused kernel (--attention cudnn; the package's flash runs as XLA's fusions: runtime_kernels) without a
    context axis, every layer global (no windows), on a GPU
    whose table (or kernels_as's) has [attention.cudnn] rows."""
    if chip.kind != Platform.GPU or chip.kernel_table is None or Attention.CUDNN not in chip.kernel_table.attention:
        return False
    if w.schedule.attention != Attention.CUDNN:  # the package's flash is XLA's fusions (launches.xla_gpu_flash)
        return False
    cfg = w.model
    return (bool(np.all(runs_flash(w.schedule, w.mesh))) and not spans(w.mesh.get("context", 1))
            and not any(cfg.layer_windows or ()))


def attention_unit_seconds(chip: Chip, seq, head_dim, causal: bool = True):
    """(forward, backward) seconds of one (sequence, head) of cuDNN's fused attention on a GPU: its kernel table's
    [attention.cudnn] rows per batch·heads (fwd, fwd_bwd − fwd), interpolated linearly in log seq between the rows'
    sequence lengths (past the ends: the FLOPs' T² from the nearest) and linearly in the head dimension between the
    rows' (past the ends: proportionally to H from the nearest, the FLOPs' H), of the rows with the causal flag
    given (the kernel's own block skipping)."""
    rows = [r for r in chip.kernel_table.attention["cudnn"].rows if r[4] == causal]
    if not rows:
        raise ValueError(f"{chip.kernel_table.path} [attention.cudnn] has no causal={causal} rows")
    dims = sorted({r[3] for r in rows})
    out = []
    for col in (5, 6):
        per_h = []
        for h in dims:
            pts = sorted((r[1], r[col] / (r[0] * r[2])) for r in rows if r[3] == h)
            s = np.log([p[0] for p in pts])
            t = np.log([p[1] for p in pts])
            x = np.log(np.asarray(seq, float))
            y = np.interp(x, s, t) + np.where(x < s[0], 2 * (x - s[0]), 0.0) + np.where(x > s[-1], 2 * (x - s[-1]), 0.0)
            per_h.append(np.exp(y))
        hd, d = float(head_dim), [float(x) for x in dims]
        if hd <= d[0] or len(d) == 1:
            v = per_h[0] * hd / d[0] if hd <= d[0] else per_h[-1] * hd / d[-1]
        elif hd >= d[-1]:
            v = per_h[-1] * hd / d[-1]
        else:
            i = max(j for j in range(len(d) - 1) if d[j] <= hd)
            f = (hd - d[i]) / (d[i + 1] - d[i])
            v = per_h[i] + f * (per_h[i + 1] - per_h[i])
        out.append(v)
    return out[0], out[1] - out[0]


def attention_table_seconds(chip: Chip, k: Kernel):
    """A flash attention kernel's seconds from the cuDNN rows (attention_unit_seconds): calls · batch ·
    (forward for a forward or recomputed pass, the backward's for a backward), batch = the call's sequences × heads
    (its shape's fourth entry; a ring's chunk pairs included)."""
    seq, _, head_dim, batch = k.shape
    fwd, bwd = attention_unit_seconds(chip, seq, head_dim, True)
    return k.calls * batch * (bwd if k.pass_ == KernelPass.BACKWARD else fwd)


# the layers' weight GEMMs of every family (the FFN stack's, the transformer's, the MoE's), by kernel name
QUANTIZED_GEMMS = frozenset({"w_in", "w_out", "qkv", "out", "mlp_in", "mlp_out", "expert_in", "expert_out", "shared_in",
                             "shared_out"})
LOW_PRECISION = (Dtype.INT8, Dtype.FP8)  # the 1-byte matmul types a quantized step trains in


def matmul_dtype(k: Kernel, dtype: str) -> str:
    """The input type kernel ``k``'s matmul runs in when the step's is ``dtype``: under a quantized step (int8, fp8)
    the layers' weight GEMMs (QUANTIZED_GEMMS, every pass: forward, recompute, input and weight gradients) run in it
    and the rest in bf16: attention's score and value products, the logits, the router, MoE's one-hot dispatch and
    combine (MaxText: AQT's int8 config and its fp8_full quantize the dense layers' dot_generals, fwd, dlhs and drhs;
    Transformer Engine's fp8 Linear layers; attention and the output head stay in 16 bits); any other ``dtype`` is
    every matmul's."""
    if dtype not in LOW_PRECISION:
        return dtype
    return dtype if k.kind == KernelKind.MATMUL and k.name.split(".")[0] in QUANTIZED_GEMMS else Dtype.BF16


def quantize_kernels(ks: list[Kernel], dtype: str, c: int) -> list[Kernel]:
    """The passes a quantized step (``dtype`` int8 or fp8) adds before each of its 8-bit GEMMs (matmul_dtype): both
    operands scaled and cast, each element read in ``c`` bytes (its absolute maximum, the scale) and written in one,
    (c + 1)·(m·k + k·n)·batch bytes a call, one pointwise kernel per GEMM and pass (AQT's and fp8's dynamic scaling:
    a per-tensor or per-channel amax, then the cast; the GEMM's epilogue applies the scales). None for other types."""
    if dtype not in LOW_PRECISION:
        return []
    out = []
    for k in ks:
        if k.shape is not None and matmul_dtype(k, dtype) == dtype:
            m, n, kk, b = k.shape
            out.append(Kernel(f"quantize.{k.name}", k.pass_, KernelKind.POINTWISE, None, k.calls, 0.0,
                              (c + 1) * (m * kk + kk * n) * b * k.calls))
    return out


def runtime_kernels(w: Workload, chip: Chip, ks: list[Kernel]) -> list[Kernel]:
    """The family's kernels as the chip's runtime runs them: the kernels of one platform's compiler (Kernel.only)
    where the chip is that platform's and XLA runs the step; on a GPU, XLA's program (not a PyTorch runtime's,
    whose kernels the family lists: scaling.step.launches.layer_kernels) with its passes over the FP32 weights
    (launches.xla_gpu_weights) and the package's own flash attention as XLA's fusions and dots
    (launches.xla_gpu_flash: its scores through HBM, every key block) and materialized one (xla_gpu_materialized:
    its FP32 scores); else ``ks``."""
    xla_gpu = chip.kind == Platform.GPU and not launches.runs_launches(w)
    ks = [k for k in ks if k.only is None or (xla_gpu and k.only == chip.kind)]
    if not xla_gpu:
        return ks
    ks = launches.xla_gpu_weights(w, _filled(ks, w.precision.compute))
    if not isinstance(w.schedule.attention, str) or not any(k.kind == KernelKind.ATTENTION for k in ks):
        return ks
    if w.schedule.attention == Attention.MATERIALIZED:
        return launches.xla_gpu_materialized(ks)
    if w.schedule.attention != Attention.FLASH:
        return ks
    return launches.xla_gpu_flash(ks, key_block(w.schedule, w.model.seq_len), w.precision.compute)


def step_kernels(w: Workload, chip: Chip | None = None, dtype: str = "bf16",
                 kernel_model: str = "efficiency") -> list[Kernel]:
    """The step's kernels per device (module docstring), with their efficiency, seconds and bound on ``chip``;
    ``kernel_model`` "hierarchical" takes each matmul's bytes from its tiles and its efficiency unquantized."""
    if kernel_model not in KERNEL_MODELS:
        raise ValueError(f"kernel model {kernel_model!r}: one of {', '.join(KERNEL_MODELS)}")
    # the model family's (scaling.families.ffn, .transformer)
    ks = _filled(w.model.forms.step_kernels(w), w.precision.compute)
    if chip is None:
        return [k for k in ks if k.only is None]
    ks = runtime_kernels(w, chip, ks)
    ks = ks + quantize_kernels(ks, dtype, w.precision.compute)
    bw = chip.device_hbm_bw
    table_attention = uses_attention_table(w, chip)
    out = []
    for k in ks:
        kd = matmul_dtype(k, dtype)
        peak, fixed = peak_flops(chip, kd), fixed_seconds(chip, kd)
        if k.kind == KernelKind.ATTENTION and table_attention:  # cuDNN's kernel, timed whole (attention_table_seconds)
            t = attention_table_seconds(chip, k)
            out.append(Kernel(k.name, k.pass_, k.kind, k.shape, k.calls, k.flops, k.bytes, k.executed,
                              k.flops * k.executed / (peak * np.maximum(t, 1e-300)), t, 0.0))
            continue
        if kernel_model == KernelModel.HIERARCHICAL and k.kind == KernelKind.MATMUL:
            b = tiled_bytes(chip, *k.shape, w.precision.compute) * k.calls
            eff = large_gemm_efficiency(chip, kd)
            out.append(Kernel(k.name, k.pass_, k.kind, k.shape, k.calls, k.flops, b, k.executed, eff,
                              k.flops * (k.executed / (peak * eff)), b / bw, fixed * k.calls))
            continue
        if k.shape is None:  # a pointwise pass or the optimizer: its bandwidth and launches (pointwise_seconds)
            t_mem = pointwise_seconds(chip, k.bytes, k.calls * pointwise_launches(w, k))
            out.append(Kernel(k.name, k.pass_, k.kind, None, k.calls, k.flops, k.bytes, 1.0, 1.0, 0.0, t_mem))
            continue
        t_mem = k.bytes / bw
        eff = shape_efficiency(chip, *k.shape, kd)
        t_math = k.flops * (k.executed / (peak * eff))
        out.append(Kernel(k.name, k.pass_, k.kind, k.shape, k.calls, k.flops, k.bytes, k.executed, eff, t_math, t_mem,
                          fixed * k.calls))
    return out


def compute_seconds(kernels: list[Kernel]) -> object:
    """The step model's compute term: Σ of the kernels' seconds (they run one after another on a device)."""
    return sum(k.seconds for k in kernels)


def compute_term(w: Workload, chip: Chip, dtype: str = "bf16", kernel_model: str = "efficiency") -> object:
    """compute_seconds(step_kernels(w, chip, dtype, kernel_model)), the figure predict's scheduled form takes, made
    for all the step's matmuls at once: their shapes, calls, FLOPs and bytes stacked into numpy arrays [kernels, ...]
    and each formula (shape_costs, shape_efficiency, the roofline of a kernel) evaluated once on them, elementwise
    (the same figures, summed in the kernels' order). The planner's candidates each take it (a kernel at a time,
    about 40 of them, was two thirds of a candidate's step time)."""
    if kernel_model != KernelModel.EFFICIENCY:
        return compute_seconds(step_kernels(w, chip, dtype, kernel_model))
    ks = runtime_kernels(w, chip, w.model.forms.step_kernels(w))
    ks = ks + quantize_kernels(ks, dtype, w.precision.compute)
    table_attention = uses_attention_table(w, chip)
    own = [attention_table_seconds(chip, k) if table_attention and k.kind == KernelKind.ATTENTION else None for k in ks]
    mm = {i: matmul_dtype(k, dtype) for i, (k, o) in enumerate(zip(ks, own)) if k.shape is not None and o is None}
    times = {}  # kernel index -> seconds, the matmuls' made a dtype at a time
    for kd in set(mm.values()):
        group = [i for i, d in mm.items() if d == kd]
        times.update(zip(group, _matmul_seconds(w, chip, [ks[i] for i in group], kd)))
    bw = chip.device_hbm_bw
    total = 0
    gpu = chip.kind == Platform.GPU  # a TPU's pointwise passes: bytes / HBM bandwidth (pointwise_seconds), no launches
    for i, (k, o) in enumerate(zip(ks, own)):  # in the kernels' order, as compute_seconds sums them
        total = total + (o if o is not None else times[i] if k.shape is not None else
                         pointwise_seconds(chip, k.bytes, k.calls * pointwise_launches(w, k)) if gpu else
                         np.maximum(0.0, k.bytes / bw))
    return total


def _matmul_seconds(w: Workload, chip: Chip, mm: list[Kernel], dtype: str):
    """compute_term's matmuls of one input type: each one's seconds (t_fixed·calls + the roofline of its FLOPs at
    shape_efficiency and its bytes), made at once on their stacked shapes, calls, FLOPs and bytes."""
    flops_given, bytes_given = [k.flops is not None for k in mm], [k.bytes is not None for k in mm]
    cols = [_stacked(col) for col in zip(*((*k.shape, k.calls, k.executed) for k in mm))]
    if any(flops_given):
        cols += [_stacked(flops_given), _stacked([0.0 if k.flops is None else k.flops for k in mm])]
    if any(bytes_given):
        cols += [_stacked(bytes_given), _stacked([0.0 if k.bytes is None else k.bytes for k in mm])]
    nd = max(a.ndim for a in cols)  # each [kernels, ...] with as many dimensions (numpy aligns the last)
    m, n, kk, b, calls, executed, *given = (a.reshape(a.shape[:1] + (1,) * (nd - a.ndim) + a.shape[1:])
                                            for a in cols)
    flops, moved = shape_costs(m, n, kk, b, calls, w.precision.compute)
    if any(flops_given):
        flops, given = np.where(given[0], given[1], flops), given[2:]
    if any(bytes_given):
        moved = np.where(given[0], given[1], moved)
    peak = peak_flops(chip, dtype)
    seconds = np.maximum(flops * (executed / (peak * shape_efficiency(chip, m, n, kk, b, dtype))),
                         moved / chip.device_hbm_bw)
    fixed = fixed_seconds(chip, dtype)
    return list(seconds + fixed * calls if fixed else seconds)


def _stacked(values) -> np.ndarray:
    """Scalars or arrays as one array [len(values), ...] of their broadcast shape and common type (np.stack of their
    broadcasts, without its cost per value: the scalars written in one assignment, the arrays one by one)."""
    arrays = [i for i, v in enumerate(values) if type(v) is np.ndarray and v.ndim]
    if not arrays:
        return np.array(values)
    scalars = [i for i, v in enumerate(values) if not (type(v) is np.ndarray and v.ndim)]
    shape = np.broadcast_shapes(*{values[i].shape for i in arrays})
    first = np.array([values[i] for i in scalars])
    kinds = {values[i].dtype for i in arrays} | ({first.dtype} if scalars else set())
    a = np.empty((len(values), *shape), np.result_type(*kinds))
    if scalars:
        a[scalars] = first.reshape(-1, *(1,) * len(shape))
    for i in arrays:
        a[i] = values[i]
    return a


def kernel_census(w: Workload, chip: Chip) -> dict[str, dict[str, float]]:
    """The step's kernels as the chip's runtime launches them (step_kernels), by the kinds a compiled program's are
    counted in (verify.hlo.KERNEL_KINDS: gemm, attention, fusion; collectives and copies are compared elsewhere):
    {kind: {"count", "bytes"}}. A matmul is a GEMM; an attention kernel a custom call of its own where a library
    runs it (splash, cuDNN: one a call), else XLA's dots (q·kᵀ and p·v forward, a backward's five a key block under
    the package's flash, four under the materialized one; flash over its key blocks); the pointwise and optimizer
    kernels fusions, their launches (pointwise_launches) a call."""
    out = {k: {"count": 0.0, "bytes": 0.0} for k in ("gemm", "attention", "fusion")}
    fused = w.schedule.attention in (Attention.SPLASH, Attention.CUDNN)
    steps = 1.0
    if w.schedule.attention == Attention.FLASH:
        steps = float(np.max(np.maximum(w.model.seq_len / key_block(w.schedule, w.model.seq_len), 1.0)))
    for k in step_kernels(w, chip, w.precision.dtype):
        if k.kind == KernelKind.ATTENTION:
            kind = "attention" if fused else "gemm"
            dots = 1 if fused else (5 if w.schedule.attention == Attention.FLASH else 4) if \
                k.pass_ == KernelPass.BACKWARD else 2
            n = k.calls * dots * (1 if fused else steps)
        elif k.shape is not None:
            kind, n = "gemm", k.calls
        else:
            kind, n = "fusion", k.calls * pointwise_launches(w, k)
        out[kind]["count"] += float(np.sum(n))
        out[kind]["bytes"] += float(np.sum(k.bytes))
    return out


def price_sources(w: Workload, chip: Chip, dtype: str = "bf16") -> dict[str, str]:
    """Where each kind of the step's kernels takes its price on ``chip`` (predict --kernels prints them): the GEMMs'
    coefficients (gemm_coefficients' source and fallback), the attention's (cuDNN's rows, or the GEMM model), the
    pointwise kernels' launch and bandwidth (the kernel table's rows, or the H100's scaled, or the HBM bandwidth), the
    collectives' (nccl-tests' all-reduce table, or the ICI bandwidth) and a PyTorch runtime's host time."""
    g = gemm_coefficients(chip, dtype)
    if chip.kind == Platform.GPU:
        out = {"matmul": g.source.split(": ")[0] + f" (ceiling {g.ceiling:.3f}, t_fixed {g.t_fixed * 1e6:.1f} us"
               + (f"; {g.fallback}" if g.fallback else "") + ")"}
    else:
        out = {"matmul": f"the hardware table's matmul_efficiency {chip.matmul_efficiency}"
               + (f", fitted on {chip.fitted_on}" if chip.fitted_on else "") + " and the MXU's padding"}
    out["attention"] = (f"{chip.kernel_table.path} [attention.cudnn]" if uses_attention_table(w, chip) else
                        "the GEMM model at its shapes (the scores' bytes as the runtime moves them; a blockwise "
                        "kernel's causal blocks)")
    rows = _pointwise_rows(chip)
    out["pointwise"] = ("bytes / HBM bandwidth (no launches)" if rows is None else
                        "the H100's [pointwise] rows and launch, scaled by the HBM bandwidths' ratio" if rows[2] else
                        f"{chip.kernel_table.path} [pointwise] rows and launch_seconds")
    if chip.kind == Platform.GPU:
        got = collectives.all_reduce_rows(chip)
        out["collectives"] = ("the link bandwidth alone" if got is None else
                              f"all-reduce rows measured on the {got[0].name}'s NVLink (bus bandwidth by message "
                              "size, the rows of the nearest device count)")
        if launches.runs_launches(w):
            out["host"] = launches.HOST_SOURCE
    else:
        out["collectives"] = "the ICI (and DCN) bandwidths of the hardware table (Scaling Book)"
    return out
