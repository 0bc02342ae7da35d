"""Per-layer FLOPs / memory / communication / time tables of one transformer block under 1D tensor
parallelism, reproducing seed 001 (``shared/reference/seeds/001_layer_estimator.txt``, shipped as SEED_FILE).

The seed is a notebook dump of an MLP-layer and a self-attention (SA) layer estimator for
b = 1, l = 2048, e = 12288, f = 4e, h = 96, depth = 96, fp16 (2e-9 GB per element), an int8 dropout
mask (1e-9 GB per element), FLOPs in TFLOP (1e-12) and an A100-like system. Its helper modules
(matmul, norm, pointwise, time_projections) are not in the dump; the closed forms below were inferred
from its printed numbers with exact integer arithmetic and then confirmed against the public source
of those helpers (github.com/ShashankSubramanian/transformer-perf-estimates, commit cf96a49,
2024-01-31, the notebook ``transformer_estimates.ipynb`` whose outputs the seed prints).

Configuration the printed tables correspond to (not the one the dumped code would run):
tensor parallelism tp = 4 with Megatron sequence parallelism (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", sec. 4.2.2, fig. 5) over the same 4 GPUs:
layer norms and the block-output dropouts run on l/tp tokens; the TP all-reduce is split into an
all-gather before the column-parallel matmul (fc1, qkv_proj) and a reduce-scatter after the
row-parallel one (fc2, v_proj) (Megatron-LM, Shoeybi et al. 2019, sec. 3, fig. 3, for the
column/row split). The forward all-gather before fc1 is booked on the SA table's layer_norm_2 row
(the MLP table has no layer norm row). Each collective is costed at the full b·l·e·element volume
(no ring factor (n-1)/n) at the NVLink bandwidth.

Units are the seed's: memory and communication in GB, FLOPs in TFLOP, times in milliseconds
(TFLOP / (TFLOP/s) · 1e3, GB / (GB/s) · 1e3), ``intensity`` = t_comp_fwd / t_mem_fwd (a time ratio).
"""

from __future__ import annotations

from typing import NamedTuple

from scaling.core.kinds import Platform
from scaling.seeds.seed000 import seed_text
from scaling.core.table import fold

# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------

A100_SEED001: dict[str, float] = {
    # the seed's system dict (In [21]): TFLOP/s, GB/s, GPUs per NVLink domain
    "matrix_flops_fp16": 312.0,
    "vector_flops_fp32": 19.5,  # present in the seed, used by no printed figure
    "vector_flops_fp16": 78.0,
    "hbm_bandwidth": 1555.0,
    "nvlink_bandwidth": 600.0,
    "ib_bandwidth": 100.0,
    "nvlink_size": 4,
}

SEED001: dict = {
    # the seed's printed inputs (In [21]) and the parallel configuration its tables were computed with
    "b": 1, "l": 2048, "e": 12288, "f": 4 * 12288, "h": 96, "depth": 96,
    "tp": 4, "sequence_parallel": True, "ring": False,
    "element": 2e-9, "mask_element": 1e-9, "flop_unit": 1e-12,
    "system": A100_SEED001,
}

# the seed's column order (its DataFrame column order, pandas' first-seen key order)
COLUMNS: tuple[str, ...] = (
    "flops_fwd", "activation_in_mem", "activation_in_other_mem", "activation_out_mem",
    "activation_buffer", "weights_mem", "total_mem_fwd", "flops_bwd", "activation_grad_mem",
    "weights_grad_mem", "total_mem_bwd", "comm_bwd", "comm_bwd_type", "comm_size", "comm_fwd",
    "comm_fwd_type", "t_comp_fwd", "t_mem_fwd", "t_comp_bwd", "t_mem_bwd", "intensity", "t_fwd",
    "t_bwd", "comm_topology", "t_comm_fwd", "t_comm_bwd", "t_total_fwd", "t_total_bwd",
    "frac_t_comm_fwd", "frac_t_comm_bwd",
)
TEXT_COLUMNS = frozenset({"comm_bwd_type", "comm_fwd_type", "comm_topology"})
# the columns the seed sums over the rows and multiplies by depth
TRACKED_COLUMNS: tuple[str, ...] = (
    "activation_buffer", "weights_mem", "weights_grad_mem", "flops_fwd", "flops_bwd",
    "t_total_fwd", "t_total_bwd", "t_comm_fwd", "t_comm_bwd",
)


def _require_positive_ints(**kw: int) -> None:
    for name, v in kw.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}={v!r}: must be a positive integer")


def _require_divides(name: str, value: int, by: str, divisor: int) -> None:
    if value % divisor:
        raise ValueError(f"{name}={value} must be divisible by {by}={divisor}")


def _require_positive(**kw: float) -> None:
    for name, v in kw.items():
        if not v > 0:
            raise ValueError(f"{name}={v!r}: must be > 0")


# ---------------------------------------------------------------------------------------------
# per-op closed forms (element counts and FLOP counts are exact integers; units applied last)
# ---------------------------------------------------------------------------------------------

def _stats(fwd: int, bwd: int, flop_unit: float, **gb: float) -> dict:
    return {"flops_fwd": fwd * flop_unit, "flops_bwd": bwd * flop_unit, **gb}


def linear_stats(tokens: int, d_in: int, d_out: int, *, bias: bool, element: float,
                 flop_unit: float) -> dict:
    """Y = X·W (+ B), X (T, d_in), W (d_in, d_out); T = b·l tokens. Seed 001 fc1/fc2/qkv_proj/v_proj.

    flops_fwd = T·d_out·(2·d_in − 1) [+ T·d_out bias]   (d_in mults, d_in − 1 adds per output)
              → 2·T·d_in·d_out − T·d_out without bias, 2·T·d_in·d_out with bias
    flops_bwd = T·d_in·(2·d_out − 1) [dX] + d_in·d_out·(2·T − 1) [dW] [+ T·d_out dB]
    activation_in = T·d_in, activation_out = T·d_out, activation_buffer = T·d_in (X kept for dW),
    weights = d_in·d_out [+ d_out]; total_mem_fwd = in + out + weights;
    activation_grad = T·d_in + T·d_out, weights_grad = weights,
    total_mem_bwd = weights_grad + activation_grad + weights + buffer   (all × element GB)
    Source: seed 001 printed rows fc1, fc2, qkv_proj, v_proj (every digit); matmul.py of the seed's
    repository (cf96a49).
    """
    w = d_in * d_out + (d_out if bias else 0)
    x, y = tokens * d_in, tokens * d_out
    fwd = tokens * d_out * (2 * d_in - 1) + (tokens * d_out if bias else 0)
    bwd = x * (2 * d_out - 1) + d_in * d_out * (2 * tokens - 1) + (tokens * d_out if bias else 0)
    return _stats(fwd, bwd, flop_unit,
                  activation_in_mem=x * element, activation_in_other_mem=0.0,
                  activation_out_mem=y * element, activation_buffer=x * element,
                  weights_mem=w * element, total_mem_fwd=(x + y + w) * element,
                  activation_grad_mem=(x + y) * element, weights_grad_mem=w * element,
                  total_mem_bwd=(w + x + y + w + x) * element)


def layer_norm_stats(tokens: int, e: int, *, element: float, flop_unit: float) -> dict:
    """LayerNorm over e for T tokens (gain and bias of e each). Seed 001 layer_norm_1/2.

    flops_fwd = 9·T·e   (mean 2, variance 3, normalise 2, affine 2 per element)
    flops_bwd = 13·T·e − 4·T   (dgain, dbias 2·2; dX 5 mults + 4·(e − 1) adds per token)
    in = out = buffer = T·e, weights = 2·e; total_mem_fwd = in + out + weights;
    activation_grad = 2·T·e (dY, dX), weights_grad = 2·e,
    total_mem_bwd = activation_grad + weights_grad + buffer   (weights not re-read, unlike linear)
    Source: seed 001 printed layer_norm rows (FLOPs printed to 2 digits only; t_comp_fwd 0.000726
    and t_comp_bwd 0.001049, 4 digits, fix 9 and 13; the −4·T is below the printed digits and is
    taken from norm.py of the seed's repository, cf96a49).
    """
    n = tokens * e
    return _stats(9 * n, 13 * n - 4 * tokens, flop_unit,
                  activation_in_mem=n * element, activation_in_other_mem=0.0,
                  activation_out_mem=n * element, activation_buffer=n * element,
                  weights_mem=2 * e * element, total_mem_fwd=(2 * n + 2 * e) * element,
                  activation_grad_mem=2 * n * element, weights_grad_mem=2 * e * element,
                  total_mem_bwd=(3 * n + 2 * e) * element)


def activation_stats(n: int, *, element: float, flop_unit: float) -> dict:
    """Pointwise nonlinearity (GELU) on n elements. Seed 001 row act.

    flops_fwd = flops_bwd = n (one op per element); in = out = buffer = n;
    total_mem_fwd = 2·n; activation_grad = n; total_mem_bwd = grad + buffer = 2·n   (× element GB)
    Source: seed 001 printed act row; pointwise.py of the seed's repository (cf96a49).
    """
    return _stats(n, n, flop_unit,
                  activation_in_mem=n * element, activation_in_other_mem=0.0,
                  activation_out_mem=n * element, activation_buffer=n * element,
                  weights_mem=0.0, total_mem_fwd=2 * n * element,
                  activation_grad_mem=n * element, weights_grad_mem=0.0,
                  total_mem_bwd=2 * n * element)


def dropout_stats(n: int, *, element: float, mask_element: float, flop_unit: float) -> dict:
    """Dropout on n elements with a stored random mask. Seed 001 rows dpr1, dpr2, dropout_softmax,
    dropout.

    flops_fwd = flops_bwd = n; in = out = n·element, in_other = buffer = n·mask_element (the mask);
    total_mem_fwd = 2·n·element + n·mask_element; activation_grad = n·element;
    total_mem_bwd = n·element + n·mask_element
    Source: seed 001 printed dropout rows; pointwise.py of the seed's repository (cf96a49).
    """
    return _stats(n, n, flop_unit,
                  activation_in_mem=n * element, activation_in_other_mem=n * mask_element,
                  activation_out_mem=n * element, activation_buffer=n * mask_element,
                  weights_mem=0.0, total_mem_fwd=2 * n * element + n * mask_element,
                  activation_grad_mem=n * element, weights_grad_mem=0.0,
                  total_mem_bwd=n * element + n * mask_element)


def softmax_stats(b: int, h: int, l: int, *, element: float, flop_unit: float) -> dict:  # noqa: E741
    """Softmax over the last axis of the (b, h, l, l) scores. Seed 001 row softmax.

    flops_fwd = 3·b·h·l² − b·h·l   (exp + divide per element, l − 1 adds per row)
    flops_bwd = 4·b·h·l² − b·h·l   (dX = Y·dY − Y·Σ(Y·dY): 2 mults + 1 add per element, l − 1 adds)
    in = out = buffer = b·h·l²; total_mem_fwd = 2·b·h·l²; activation_grad = 2·b·h·l²;
    total_mem_bwd = 3·b·h·l²   (× element GB)
    Source: seed 001 printed softmax row; pointwise.py of the seed's repository (cf96a49).
    """
    s = b * h * l * l
    return _stats(3 * s - b * h * l, 4 * s - b * h * l, flop_unit,
                  activation_in_mem=s * element, activation_in_other_mem=0.0,
                  activation_out_mem=s * element, activation_buffer=s * element,
                  weights_mem=0.0, total_mem_fwd=2 * s * element,
                  activation_grad_mem=2 * s * element, weights_grad_mem=0.0,
                  total_mem_bwd=3 * s * element)


def logit_stats(b: int, h: int, l: int, q: int, *, element: float, flop_unit: float) -> dict:  # noqa: E741
    """A = Q·Kᵀ, (b,h,l,q)·(b,h,q,l) → (b,h,l,l), q = e/h. Seed 001 row logits.

    flops_fwd = b·h·l²·(2·q − 1); flops_bwd = 2·b·h·l·q·(2·l − 1)   (dQ and dK)
    in = in_other = b·h·l·q (Q, K), out = b·h·l², buffer = 2·b·h·l·q;
    total_mem_fwd = in + in_other + out; activation_grad = 2·b·h·l·q + b·h·l²;
    total_mem_bwd = activation_grad + buffer   (× element GB)
    Source: seed 001 printed logits row; matmul.py of the seed's repository (cf96a49).
    """
    s, a = b * h * l * l, b * h * l * q
    return _stats(s * (2 * q - 1), 2 * a * (2 * l - 1), flop_unit,
                  activation_in_mem=a * element, activation_in_other_mem=a * element,
                  activation_out_mem=s * element, activation_buffer=2 * a * element,
                  weights_mem=0.0, total_mem_fwd=(2 * a + s) * element,
                  activation_grad_mem=(2 * a + s) * element, weights_grad_mem=0.0,
                  total_mem_bwd=(4 * a + s) * element)


def attend_stats(b: int, h: int, l: int, q: int, *, element: float, flop_unit: float) -> dict:  # noqa: E741
    """Y = A·V, (b,h,l,l)·(b,h,l,q) → (b,h,l,q). Seed 001 row attend.

    flops_fwd = b·h·l·q·(2·l − 1); flops_bwd = b·h·l²·(2·q − 1) [dA] + b·h·l·q·(2·l − 1) [dV]
    in = b·h·l² (A), in_other = out = b·h·l·q, buffer = b·h·l² + b·h·l·q;
    total_mem_fwd = in + in_other + out;
    activation_grad = b·h·l·q + b·h·l²   (one (b,h,l,q) gradient only: the seed's count, see
    SEED001_INCONSISTENCIES); total_mem_bwd = activation_grad + buffer   (× element GB)
    Source: seed 001 printed attend row; matmul.py of the seed's repository (cf96a49).
    """
    s, a = b * h * l * l, b * h * l * q
    return _stats(a * (2 * l - 1), s * (2 * q - 1) + a * (2 * l - 1), flop_unit,
                  activation_in_mem=s * element, activation_in_other_mem=a * element,
                  activation_out_mem=a * element, activation_buffer=(s + a) * element,
                  weights_mem=0.0, total_mem_fwd=(s + 2 * a) * element,
                  activation_grad_mem=(a + s) * element, weights_grad_mem=0.0,
                  total_mem_bwd=(2 * a + 2 * s) * element)


# ---------------------------------------------------------------------------------------------
# communication and time
# ---------------------------------------------------------------------------------------------

def collective_volume(kind: str, n: int, payload_gb: float, ring: bool = False) -> float:
    """GB charged to one collective over n GPUs on a payload of payload_gb (the full b·l·e tensor).

    ring=False (seed 001's printed figures): allgather, reducescatter → payload; allreduce → 2·payload
    (an all-reduce is a reduce-scatter plus an all-gather, Korthikanti et al. 2022 sec. 4.2.2).
    ring=True (the ring algorithm's per-GPU traffic, the factor the dumped seed code applies):
    allgather, reducescatter → (n−1)/n·payload; allreduce → 2·(n−1)/n·payload.
    Source: seed 001 printed comm_fwd/comm_bwd = b·l·e·2e-9 = 0.050332 GB (no (n−1)/n factor).
    """
    per = {"allgather": 1, "reducescatter": 1, "allreduce": 2}
    if kind not in per:
        raise ValueError(f"kind={kind!r}: must be one of {sorted(per)}")
    return per[kind] * payload_gb * ((n - 1) / n if ring else 1.0)


def topology(n: int, system: dict) -> str:
    """'nvlink' if the n GPUs fit one NVLink domain (n ≤ nvlink_size), else 'ib'.
    Source: seed 001 comm_topology column (time_projections.get_topology of its repository)."""
    return "nvlink" if system["nvlink_size"] > 0 and n <= system["nvlink_size"] else "ib"


def comm_time_ms(volume_gb: float, n: int, system: dict) -> float:
    """t_comm = volume / bandwidth · 1e3 ms, bandwidth = nvlink_bandwidth within an NVLink domain,
    ib_bandwidth across; no latency term and no ring factor beyond collective_volume's.
    Source: seed 001 t_comm = 0.050332 GB / 600 GB/s = 0.083886 ms (every comm row)."""
    bw = system["nvlink_bandwidth"] if topology(n, system) == "nvlink" else system["ib_bandwidth"]
    return volume_gb / bw * 1e3


def compute_time_ms(tflop: float, tensor_core: bool, system: dict) -> float:
    """t_comp = TFLOP / peak · 1e3 ms; peak = matrix_flops_fp16 for the matmul rows (fc1, fc2,
    qkv_proj, v_proj, logits, attend), vector_flops_fp16 for the rest (vector_flops_fp32 = 19.5
    reproduces no printed row). Source: seed 001 compute_timings_and_stats, printed t_comp_* columns."""
    peak = system["matrix_flops_fp16"] if tensor_core else system["vector_flops_fp16"]
    return tflop / peak * 1e3


def memory_time_ms(gb: float, system: dict) -> float:
    """t_mem = GB / hbm_bandwidth · 1e3 ms. Source: seed 001 printed t_mem_* columns."""
    return gb / system["hbm_bandwidth"] * 1e3


def _row(layer: str, stats: dict, tensor_core: bool, system: dict, size: int | None = None,
         fwd: tuple[float, str] | None = None, bwd: tuple[float, str] | None = None) -> dict:
    """One table row in the seed's columns: stats + comms + times (compute_timings_and_stats)."""
    r: dict = {"layer": layer, **stats}
    r["comm_bwd"], r["comm_bwd_type"] = bwd if bwd else (None, None)
    r["comm_fwd"], r["comm_fwd_type"] = fwd if fwd else (None, None)
    r["comm_size"] = size if (fwd or bwd) else None
    r["t_comp_fwd"] = compute_time_ms(r["flops_fwd"], tensor_core, system)
    r["t_mem_fwd"] = memory_time_ms(r["total_mem_fwd"], system)
    r["t_comp_bwd"] = compute_time_ms(r["flops_bwd"], tensor_core, system)
    r["t_mem_bwd"] = memory_time_ms(r["total_mem_bwd"], system)
    r["intensity"] = r["t_comp_fwd"] / r["t_mem_fwd"]
    r["t_fwd"] = max(r["t_comp_fwd"], r["t_mem_fwd"])
    r["t_bwd"] = max(r["t_comp_bwd"], r["t_mem_bwd"])
    r["comm_topology"] = topology(size, system) if r["comm_size"] else None
    r["t_comm_fwd"] = comm_time_ms(r["comm_fwd"], size, system) if fwd else 0.0
    r["t_comm_bwd"] = comm_time_ms(r["comm_bwd"], size, system) if bwd else 0.0
    r["t_total_fwd"] = r["t_fwd"] + r["t_comm_fwd"]
    r["t_total_bwd"] = r["t_bwd"] + r["t_comm_bwd"]
    r["frac_t_comm_fwd"] = r["t_comm_fwd"] / r["t_total_fwd"]
    r["frac_t_comm_bwd"] = r["t_comm_bwd"] / r["t_total_bwd"]
    return {k: r[k] for k in ("layer", *COLUMNS)}


class _Plan(NamedTuple):
    tp: int
    sp: bool
    seq_tokens: int  # tokens a sequence-parallel region (layer norm, block-output dropout) holds
    payload: float  # b·l·e·element GB: the tensor every TP collective moves
    ring: bool


# the seed's inputs, each a parameter of its notebook's estimator (names as the seed spells them)
def _plan(b: int, l: int, e: int, tp: int, sequence_parallel: bool, ring: bool, element: float,  # noqa: E741
          mask_element: float, flop_unit: float, system: dict) -> _Plan:
    _require_positive_ints(b=b, l=l, e=e, tp=tp)
    _require_positive(element=element, mask_element=mask_element, flop_unit=flop_unit)
    missing = {"matrix_flops_fp16", "vector_flops_fp16", "hbm_bandwidth", "nvlink_bandwidth",
               "ib_bandwidth", "nvlink_size"} - set(system)
    if missing:
        raise ValueError(f"system is missing {sorted(missing)}")
    sp = sequence_parallel and tp > 1
    if sp:
        _require_divides("l", l, "tp (sequence parallel)", tp)
    return _Plan(tp, sp, b * l // tp if sp else b * l, b * l * e * element, ring)


def _tp_comm(p: _Plan, kind_sp: str) -> tuple[float, str] | None:
    """The TP collective at a column/row-parallel matmul: reduce-scatter with sequence parallelism,
    all-reduce without (Megatron-LM sec. 3; Korthikanti et al. 2022 sec. 4.2.2); none at tp = 1."""
    if p.tp == 1:
        return None
    kind = kind_sp if p.sp else "allreduce"
    return collective_volume(kind, p.tp, p.payload, p.ring), kind


def _sp_gather(p: _Plan) -> tuple[float, str] | None:
    """The all-gather that leaves a sequence-parallel region (only with sequence parallelism)."""
    return (collective_volume("allgather", p.tp, p.payload, p.ring), "allgather") if p.sp else None


# ---------------------------------------------------------------------------------------------
# the two tables
# ---------------------------------------------------------------------------------------------

# the seed's inputs, each a parameter of its notebook's estimator (names as the seed spells them)
def mlp_layer_table(b: int, l: int, e: int, f: int, tp: int = 4, sequence_parallel: bool = True,  # noqa: E741
                    system: dict = A100_SEED001, element: float = 2e-9, mask_element: float = 1e-9,
                    flop_unit: float = 1e-12, ring: bool = False, matrices: int = 2, bias: bool = True) -> list[dict]:
    """Rows fc1, act, dpr1, fc2, dpr2 of the MLP block on one of tp GPUs (seed 001 MLP table).

    fc1  = linear(b·l tokens, e → f/tp, bias); bwd comm: reduce-scatter of dX (all-reduce without SP)
    act  = activation(b·l·f/tp);  dpr1 = dropout(b·l·f/tp)
    fc2  = linear(b·l tokens, f/tp → e, bias); fwd comm: reduce-scatter of Y (all-reduce without SP)
    dpr2 = dropout(b·(l/tp)·e) with sequence parallelism (b·l·e without); bwd comm: all-gather of dY
    Each comm = collective_volume(kind, tp, b·l·e·element, ring); comm_size = tp on rows with a comm.
    No layer-norm row: the pre-MLP norm and its forward all-gather are the SA table's layer_norm_2.
    ``matrices`` 3 (SwiGLU): fc1 is the gate and up projections side by side, e → 2f/tp, and act the SiLU and the
    product on those 2f/tp elements per token (one op each); ``bias`` False drops fc1's and fc2's biases.
    Source: seed 001 printed MLP table (tp = 4, sequence parallelism on, ring = False); Megatron-LM
    (Shoeybi et al. 2019) fig. 3a for the column/row split; Korthikanti et al. 2022 fig. 5 for g/ḡ.
    """
    p = _plan(b, l, e, tp, sequence_parallel, ring, element, mask_element, flop_unit, system)
    _require_positive_ints(f=f)
    _require_divides("f", f, "tp", tp)
    fl = f // tp
    kw = {"element": element, "flop_unit": flop_unit}
    dkw = {**kw, "mask_element": mask_element}
    return [
        _row("fc1", linear_stats(b * l, e, (matrices - 1) * fl, bias=bias, **kw), True, system, tp,
             bwd=_tp_comm(p, "reducescatter")),
        _row("act", activation_stats(b * l * (matrices - 1) * fl, **kw), False, system),
        _row("dpr1", dropout_stats(b * l * fl, **dkw), False, system),
        _row("fc2", linear_stats(b * l, fl, e, bias=bias, **kw), True, system, tp,
             fwd=_tp_comm(p, "reducescatter")),
        _row("dpr2", dropout_stats(p.seq_tokens * e, **dkw), False, system, tp, bwd=_sp_gather(p)),
    ]


# the seed's inputs, each a parameter of its notebook's estimator (names as the seed spells them)
def attention_layer_table(b: int, l: int, e: int, h: int, tp: int = 4, sequence_parallel: bool = True,  # noqa: E741
                          system: dict = A100_SEED001, element: float = 2e-9,
                          mask_element: float = 1e-9, flop_unit: float = 1e-12,
                          ring: bool = False, kv_heads: int | None = None, head_dim: int | None = None,
                          bias: bool = True) -> list[dict]:
    """Rows of the self-attention block on one of tp GPUs (seed 001 SA table); q = e/h, heads h/tp.

    layer_norm_1    = layer_norm(b·l/tp tokens with SP, b·l without); fwd comm: all-gather (SP only)
    qkv_proj        = linear(b·l, e → 3e/tp, no bias); bwd comm: reduce-scatter (all-reduce w/o SP)
    logits          = logit(b, h/tp, l, q);  softmax = softmax(b, h/tp, l)
    dropout_softmax = dropout(b·l·l·h/tp);  attend = attend(b, h/tp, l, q)
    v_proj          = linear(b·l, h·q/tp → e, bias) (the output projection W_O, named v_proj in the
                      seed); fwd comm: reduce-scatter (all-reduce without SP)
    dropout         = dropout(b·l/tp·e with SP); bwd comm: all-gather (SP only)
    layer_norm_2    = the pre-MLP norm, as layer_norm_1 (its all-gather feeds fc1)
    Grouped-query attention (``kv_heads`` K < h, each of tp GPUs K/tp of them): qkv_proj e → (h + 2K)·q/tp; q =
    ``head_dim`` (default e/h); logits and attend over the h/tp query heads. ``bias`` False drops v_proj's bias.
    Source: seed 001 printed SA table (tp = 4, sequence parallelism on, ring = False); Megatron-LM
    (Shoeybi et al. 2019) fig. 3b; Korthikanti et al. 2022 sec. 4.2.2.
    """
    p = _plan(b, l, e, tp, sequence_parallel, ring, element, mask_element, flop_unit, system)
    _require_positive_ints(h=h)
    if head_dim is None:
        _require_divides("e", e, "h", h)
    _require_divides("h", h, "tp", tp)
    K = h if kv_heads is None else kv_heads
    _require_positive_ints(kv_heads=K)
    _require_divides("h", h, "kv_heads", K)
    _require_divides("kv_heads", K, "tp", tp)
    q, hl = (e // h if head_dim is None else head_dim), h // tp
    kw = {"element": element, "flop_unit": flop_unit}
    dkw = {**kw, "mask_element": mask_element}
    ln = layer_norm_stats(p.seq_tokens, e, **kw)
    return [
        _row("layer_norm_1", ln, False, system, tp, fwd=_sp_gather(p)),
        _row("qkv_proj", linear_stats(b * l, e, (h + 2 * K) * q // tp, bias=False, **kw), True, system, tp,
             bwd=_tp_comm(p, "reducescatter")),
        _row("logits", logit_stats(b, hl, l, q, **kw), True, system),
        _row("softmax", softmax_stats(b, hl, l, **kw), False, system),
        _row("dropout_softmax", dropout_stats(b * l * l * hl, **dkw), False, system),
        _row("attend", attend_stats(b, hl, l, q, **kw), True, system),
        _row("v_proj", linear_stats(b * l, hl * q, e, bias=bias, **kw), True, system, tp,
             fwd=_tp_comm(p, "reducescatter")),
        _row("dropout", dropout_stats(p.seq_tokens * e, **dkw), False, system, tp, bwd=_sp_gather(p)),
        _row("layer_norm_2", ln, False, system, tp, fwd=_sp_gather(p)),
    ]


def depth_totals(rows: list[dict], depth: int) -> dict[str, float]:
    """depth · Σ_rows column, for the seed's tracked columns (activation_buffer, weights_mem,
    weights_grad_mem, flops_fwd, flops_bwd, t_total_fwd, t_total_bwd, t_comm_fwd, t_comm_bwd).
    Source: seed 001 ``df[layer_track_cols].sum() * depth``."""
    _require_positive_ints(depth=depth)
    return {c: depth * sum(r[c] for r in rows) for c in TRACKED_COLUMNS}


def comm_fraction(rows: list[dict], direction: str = "fwd") -> float:
    """Σ t_comm_<dir> / Σ t_total_<dir> over the rows (depth cancels). The seed prints the forward
    one as "time spend in comms". Source: seed 001 last lines of the MLP and SA cells."""
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction={direction!r}: must be 'fwd' or 'bwd'")
    return sum(r[f"t_comm_{direction}"] for r in rows) / sum(r[f"t_total_{direction}"] for r in rows)


def seed001_tables() -> dict:
    """Our values for everything the seed prints, computed from SEED001:
    {'mlp': rows, 'sa': rows, 'mlp_totals': {...}, 'sa_totals': {...},
     'mlp_comm_fraction': x, 'sa_comm_fraction': y}. Source: seed 001 In [21]."""
    s = SEED001
    kw = {"tp": s["tp"], "sequence_parallel": s["sequence_parallel"], "system": s["system"],
          "element": s["element"], "mask_element": s["mask_element"], "flop_unit": s["flop_unit"],
          "ring": s["ring"]}
    mlp = mlp_layer_table(s["b"], s["l"], s["e"], s["f"], **kw)
    sa = attention_layer_table(s["b"], s["l"], s["e"], s["h"], **kw)
    return {"mlp": mlp, "sa": sa,
            "mlp_totals": depth_totals(mlp, s["depth"]), "sa_totals": depth_totals(sa, s["depth"]),
            "mlp_comm_fraction": comm_fraction(mlp), "sa_comm_fraction": comm_fraction(sa)}


def system_of(chip, vector_tflops: float | None = None) -> dict:
    """The seed's system dict for a chip of the hardware table (scaling.hardware.chips), in its units (TFLOP/s, GB/s):
    matrix_flops_fp16 = C (dense bf16), vector_flops_fp16 = ``vector_tflops`` or the chip's vector_flops (the rate
    off the matrix units: a GPU's non-Tensor FP16, a TPU's VPU; every row of the table has one), hbm_bandwidth =
    W_hbm, nvlink_bandwidth = 2·W_link one way (both directions, as the seed's 600 GB/s A100 NVLink), ib_bandwidth =
    the chip's DCN/IB share, nvlink_size = a GPU node's 8, or a TPU's largest slice (its ICI). ValueError for a chip
    without a vector rate and none given."""
    vec = vector_tflops if vector_tflops is not None else (chip.vector_flops or 0) / 1e12
    if not vec:
        raise ValueError(f"{chip.name} has no vector (non-tensor) FLOP rate in the hardware table: give "
                         "--vector-tflops")
    _require_positive(vector_tflops=vec)
    return {"matrix_flops_fp16": chip.bf16_flops / 1e12, "vector_flops_fp16": vec,
            "hbm_bandwidth": chip.hbm_bw / 1e9, "nvlink_bandwidth": 2 * chip.ici_oneway / 1e9,
            "ib_bandwidth": chip.dcn_bw / 1e9, "nvlink_size": 8 if chip.kind == Platform.GPU else chip.max_slice_chips}


def model_tables(cfg, b: int, tp: int, sequence_parallel: bool, system: dict) -> dict:
    """The seed's tables for a transformer config (scaling.families.transformer.TransformerConfig: d_model e, d_ff f,
    heads h, kv_heads, head_dim, mlp_matrices, seq_len l, blocks = depth) on one of tp GPUs, b sequences, 16-bit
    elements; no biases (the presets' models have none): {'mlp', 'sa', 'mlp_totals', 'sa_totals',
    'mlp_comm_fraction', 'sa_comm_fraction'} as seed001_tables."""
    _require_positive_ints(b=b, tp=tp)
    kw = {"tp": tp, "sequence_parallel": sequence_parallel, "system": system, "bias": False}
    mlp = mlp_layer_table(b, cfg.seq_len, cfg.d_model, cfg.d_ff, matrices=cfg.mlp_matrices, **kw)
    sa = attention_layer_table(b, cfg.seq_len, cfg.d_model, cfg.heads, kv_heads=cfg.kv_heads,
                               head_dim=cfg.head_dim, **kw)
    return {"mlp": mlp, "sa": sa, "mlp_totals": depth_totals(mlp, cfg.blocks),
            "sa_totals": depth_totals(sa, cfg.blocks), "mlp_comm_fraction": comm_fraction(mlp),
            "sa_comm_fraction": comm_fraction(sa)}


def render_model(t: dict, header: str, tables: tuple[str, ...] = ("mlp", "sa"),
                 columns: tuple[str, ...] = COLUMNS) -> str:
    """model_tables as text in the seed's layout: per table its rows in the seed's columns, the totals × depth and
    the forward comm fraction."""
    out = [header, ""]
    for name in tables:
        out.append(f"{name.upper()} layer estimates (one GPU)")
        out += _table_text(["layer", *columns], [[r["layer"], *(_fmt(r[c]) for c in columns)] for r in t[name]])
        out.append(f"\n{name.upper()} totals × depth")
        out += _table_text(["column", "value"], [[c, _fmt(v)] for c, v in t[f"{name}_totals"].items()])
        out += [f"time spend in comms (fwd) = {t[f'{name}_comm_fraction']!r}", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# the seed's printed values (reference data: the seed file, shipped with the package)
# ---------------------------------------------------------------------------------------------

SEED_FILE = "001_layer_estimator.txt"  # scaling/data/seeds/ (scaling.seeds.seed000.seed_text)


def _cell(text: str, column: str):
    if text == "":
        return None
    return text if column in TEXT_COLUMNS or column == "layer" else float(text)


def parse_printed_table(text: str) -> list[dict]:
    """Rows of a seed table dump (CSV: index, layer, then COLUMNS; blank = NaN → None).
    Source: the seed 001 file's table format (a pandas DataFrame written as CSV)."""
    lines = text.strip().splitlines()
    header = lines[0].split(",")[1:]
    return [{c: _cell(v, c) for c, v in zip(header, line.split(",")[1:])} for line in lines[1:]]


def parse_printed_series(text: str) -> dict[str, float]:
    """A pandas Series dump ('name   value' lines, 'dtype:' line ignored) as {name: value}.
    Source: the seed 001 file's depth-total blocks."""
    out = {}
    for line in text.strip().splitlines():
        name, value = line.split()
        if name != "dtype:":
            out[name] = float(value)
    return out


def printed_from_seed(text: str) -> dict:
    """The values seed 001 printed, read from its text: the MLP and SA tables (the two CSV dumps opening
    'Unnamed: 0,', 5 and 9 rows), the depth totals under each (the Series dumps opening 'activation_buffer ',
    9 rows and dtype) and the two 'time spend in comms = ' fractions, in that order."""
    lines = text.splitlines()
    heads = [i for i, s in enumerate(lines) if s.startswith("Unnamed: 0,")]
    tots = [i for i, s in enumerate(lines) if s.startswith("activation_buffer ")]
    fracs = [float(s.split("=")[1]) for s in lines if s.startswith("time spend in comms")]
    if not len(heads) == len(tots) == len(fracs) == 2:
        raise ValueError(f"seed 001: expected 2 tables, 2 totals, 2 fractions; found {len(heads)}, {len(tots)}, "
                         f"{len(fracs)}")
    return {"mlp": parse_printed_table("\n".join(lines[heads[0]:heads[0] + 6])),
            "sa": parse_printed_table("\n".join(lines[heads[1]:heads[1] + 10])),
            "mlp_totals": parse_printed_series("\n".join(lines[tots[0]:tots[0] + 10])),
            "sa_totals": parse_printed_series("\n".join(lines[tots[1]:tots[1] + 10])),
            "mlp_comm_fraction": fracs[0], "sa_comm_fraction": fracs[1]}


SEED001_PRINTED: dict = printed_from_seed(seed_text(SEED_FILE))

# (table, row, column) -> why our value differs from the seed's printed one beyond the tolerance
# of printed_match. Empty: every printed cell is reproduced (tests/test_seed001.py asserts this set
# is exactly the set of mismatches).
SEED001_MISMATCHES: dict[tuple[str, str, str], str] = {}

SEED001_INCONSISTENCIES: tuple[str, ...] = (
    "The dumped code is not the code that printed the tables: the printed output is that of an "
    "earlier MLP_estimates(b, l, e, f, depth, ..., parallelism={'m1', 'm2'}) (tp = 4, sequence "
    "parallelism implicit and tied to tp, full-volume collectives). With the dumped signature the "
    "call MLP_estimates(b, l, e, f, depth, element_size=...) raises TypeError (element_size given "
    "twice), and parallelism['sequence'] / ['tensor'] would raise KeyError on {'m1': 4, 'm2': 1}.",
    "The dumped self_attention_estimates has an IndentationError: the 'if parallelism[\"sequence\"]>1' "
    "block after the '# fwd allgather comms' comment is indented one level too deep, so cell In [5] "
    "cannot have defined the function that printed the SA table.",
    "The dumped MLP's sequence-parallel branch would not print the dpr2 row: it appends a row named "
    "'dpr1' on (b, l, f/s) elements and writes the all-gather onto the already-appended fc2 row; the "
    "printed dpr2 is a dropout on b·(l/4)·e elements (0.012583 GB) with the all-gather on its own row, "
    "and fc2's comm_bwd is blank.",
    "The dumped code scales every collective by (m−1)/m and adds b·l·e·(m−1)/m reduction FLOPs; the "
    "printed tables do neither (comm = 0.050332 GB = b·l·e·2e-9, not 0.037749; fc1 flops_bwd = "
    "1.236800, not 1.236819).",
    "The dumped MLP has a layer_norm_1 row; the printed MLP table has none (the pre-MLP norm is the SA "
    "table's layer_norm_2, booked once).",
    "attend's activation_grad_mem counts one (b,h,l,q) gradient (b·h·l·q + b·h·l²) where logits counts "
    "two (2·b·h·l·q + b·h·l²): dY and dV are both (b,h,l,q).",
    "total_mem_bwd re-reads the weights for linear rows (weights_grad + grads + weights + buffer) but "
    "not for layer_norm rows (grads + weights_grad + buffer).",
    "Layer norm counts 2 FLOPs per element for the mean (1 suffices) and 9·e per token forward; the "
    "backward 13·e − 4 per token. 'intensity' is t_comp_fwd/t_mem_fwd, a time ratio, not FLOP/byte.",
    "The system dict's vector_flops_fp32 (19.5) is unused; the vector rows run at vector_flops_fp16.",
    "'time spend in comms' is the forward fraction only: Σ t_comm_fwd / Σ t_total_fwd.",
)


# ---------------------------------------------------------------------------------------------
# comparison and rendering
# ---------------------------------------------------------------------------------------------

def printed_match(ours, seed, decimals: int | None = 6, rel: float = 5e-4) -> bool:
    """True when our value reproduces a printed one: blanks (None) and strings exactly, printed zeros
    exactly, other numbers within max(rel·|seed|, half a unit of the printed last decimal) (the seed
    prints its tables and totals rounded to 6 decimals, pandas' display precision, so 6e-06 stands
    for anything in [5.5e-06, 6.5e-06]); decimals=None for values printed in full (the fractions)."""
    if seed is None or isinstance(seed, str):
        return ours == seed
    if ours is None or isinstance(ours, str):
        return False
    if seed == 0:
        return ours == 0
    half_unit = 0.5 * 10.0 ** -decimals if decimals is not None else 0.0
    return abs(ours - seed) <= max(rel * abs(seed), half_unit) * (1 + 1e-9)


class Cell(NamedTuple):
    table: str
    row: str
    column: str
    ours: object
    seed: object
    match: bool


def seed001_cells(ours: dict | None = None) -> list[Cell]:
    """Every printed cell of seed 001 beside ours: tables 'mlp'/'sa' (row = layer), 'mlp_totals'/
    'sa_totals' (row 'depth_sum', and row 'comm_fraction', column 't_comm_fwd/t_total_fwd')."""
    ours = ours or seed001_tables()
    cells = []
    for t in ("mlp", "sa"):
        ours_rows = {r["layer"]: r for r in ours[t]}
        for srow in SEED001_PRINTED[t]:
            orow = ours_rows.get(srow["layer"], {})
            for c in ("layer", *COLUMNS):
                o = orow.get(c)
                cells.append(Cell(t, srow["layer"], c, o, srow[c], printed_match(o, srow[c])))
        for c, v in SEED001_PRINTED[f"{t}_totals"].items():
            o = ours[f"{t}_totals"].get(c)
            cells.append(Cell(f"{t}_totals", "depth_sum", c, o, v, printed_match(o, v)))
        o, v = ours[f"{t}_comm_fraction"], SEED001_PRINTED[f"{t}_comm_fraction"]
        cells.append(Cell(f"{t}_totals", "comm_fraction", "t_comm_fwd/t_total_fwd", o, v,
                          printed_match(o, v, decimals=None)))
    return cells


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if float(v).is_integer() and abs(v) < 1e6:
        return str(int(v)) if v else "0"
    return f"{v:.6f}"


def _table_text(header: list[str], lines: list[list[str]]) -> list[str]:
    """The first column left-aligned, the figures right-aligned, folded where wider than a terminal
    (scaling.core.table.fold)."""
    return fold(header, lines, right=range(1, len(header)))


def render(tables: tuple[str, ...] = ("mlp", "sa"), columns: tuple[str, ...] = COLUMNS,
           ours: dict | None = None) -> str:
    """Text tables of our seed-001 values: layer, then the seed's columns; a cell that differs from
    the seed's printed value (printed_match) shows 'ours [seed's]x' with footnote x from
    SEED001_MISMATCHES; then the depth totals and the forward comm fraction, likewise.
    Source: seed 001 (the layout of its printed tables)."""
    ours = ours or seed001_tables()
    cells = {(c.table, c.row, c.column): c for c in seed001_cells(ours)}
    notes: dict[str, str] = {}

    def show(key, value) -> str:
        c = cells.get(key)
        if c is None or c.match:
            return _fmt(value)
        why = SEED001_MISMATCHES.get(key, "not explained (not in SEED001_MISMATCHES)")
        letter = notes.setdefault(why, chr(ord("a") + len(notes)))
        return f"{_fmt(value)} [{_fmt(c.seed)}]{letter}"

    s, sysd = SEED001, SEED001["system"]
    out = [f"seed 001: b={s['b']} l={s['l']} e={s['e']} f={s['f']} h={s['h']} depth={s['depth']} "
           f"tp={s['tp']} sequence_parallel={s['sequence_parallel']} ring={s['ring']}; "
           f"element {s['element']:g} GB, mask {s['mask_element']:g} GB, FLOPs in TFLOP, times in ms",
           "system: " + ", ".join(f"{k}={v:g}" for k, v in sysd.items()),
           "cells: ours; where it differs from the seed's printed value: ours [seed's]footnote", ""]
    for t in tables:
        out.append(f"{t.upper()} layer estimates (one GPU of tp={s['tp']})")
        lines = [[r["layer"], *(show((t, r["layer"], c), r[c]) for c in columns)] for r in ours[t]]
        out += _table_text(["layer", *columns], lines)
        tot = ours[f"{t}_totals"]
        out.append(f"\n{t.upper()} totals × depth={s['depth']}")
        out += _table_text(["column", "value"],
                           [[c, show((f"{t}_totals", "depth_sum", c), v)] for c, v in tot.items()])
        frac = ours[f"{t}_comm_fraction"]
        key = (f"{t}_totals", "comm_fraction", "t_comm_fwd/t_total_fwd")
        c = cells[key]
        shown = f"{frac!r}" if c.match else f"{frac!r} [{c.seed!r}]" + show(key, frac)[-1]
        out += [f"time spend in comms (fwd) = {shown}", ""]
    out += [f"{letter}: {why}" for why, letter in notes.items()]
    return "\n".join(out)


def compare_text(cells: list[Cell] | None = None) -> str:
    """'table row column | ours | seed's | match' for every printed cell (Source: seed 001)."""
    cells = cells if cells is not None else seed001_cells()
    lines = [[c.table, c.row, c.column, _fmt(c.ours) if not isinstance(c.ours, float) or
              c.column != "t_comm_fwd/t_total_fwd" else repr(c.ours),
              _fmt(c.seed) if c.column != "t_comm_fwd/t_total_fwd" else repr(c.seed),
              "yes" if c.match else "NO"] for c in cells]
    n_ok = sum(c.match for c in cells)
    return "\n".join(_table_text(["table", "row", "column", "ours", "seed's", "match"], lines)
                     + [f"{n_ok}/{len(cells)} printed cells reproduced"])

