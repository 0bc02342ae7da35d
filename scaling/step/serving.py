"""Serving: the closed forms of a prefill and a decode step of a transformer (or an MoE transformer) on a mesh of
``data`` replicas of ``tensor`` × ``expert`` devices each, as the Scaling Book derives them ("All About Transformer
Inference", "Serving LLaMA 3-70B on TPUs": jax-ml.github.io/scaling-book/inference, /applied-inference).

Per replica of m = tensor·expert devices serving b = B/data sequences, each with ``context`` cached keys:
  KV cache       kv_bytes · model.kv_cache_elements(context) a sequence (2·K·H·L·T standard)
  decode step    T = max(b·KV / (m·W_hbm), attention FLOPs / (m·C))                     (attention: bandwidth-bound)
                   + max(2·b·P_read / (m·C), P_read·w_bytes / (m·W_hbm))             (weights: either)
                   + the tensor all-reduces (2 a layer of b·D·2 B, latency-floored) and the expert all-to-alls
                 (the Book's "theoretical step time (general)"; P_read = model.decode_read_params(b): an MoE layer's
                 experts the batch touches)
  critical batch B* = C_compute · w_bytes / (2·W_hbm): decode's weight matmuls are compute-bound above it
                 (240 on v5e in bf16, 120 with int8 weights and bf16 FLOPs)
  largest batch  (m·HBM − P·w_bytes) / (m-sharded KV of one sequence), per replica
  prefill        FLOPs = model.decode_flops(b·P, P/2) (each prompt token attends to P/2 keys on average, causal),
                 time max(FLOPs / (m·C·eta), weights / (m·W_hbm)) + the tensor all-reduces of b·P·D·2 B a layer
  per request    time to first token = the prefill of one prompt (its last logits give the token); time per output
                 token = the decode step at the mean context P + G/2; throughput = B / step per chip; a static
                 batch: b prompts prefilled at once, then G − 1 steps

C is the matmul rate of ``compute`` (bf16, or int8/fp8 where the weights' 8-bit type is computed in: the hardware
table's dtype_flops), W_hbm the chip's HBM bandwidth. Pure Python; no jax.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from scaling.core.inputs import positive_int
from scaling.core.kinds import Collective, Dtype, Platform
from scaling.hardware.chips import Chip, get_chip
from scaling.hardware.kernel_tables import decode_table
from scaling.hardware.collectives import allgather_time, gpu_time
from scaling.step.kernels import fixed_seconds, large_gemm_efficiency, peak_flops, shape_efficiency

# bytes of one stored element of each serving type (weights and the KV cache): int4 two to a byte
SERVING_BYTES = {"bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
SERVING_AXES = ("data", "expert", "tensor")  # replicas, and the model-parallel axes of one replica


def _choice(name: str, value: str, valid) -> str:
    if value not in valid:
        raise ValueError(f"{name}={value!r}: valid: {', '.join(valid)}")
    return value


@dataclass(frozen=True)
class Serving:
    """What is served and how (module docstring): ``model`` a transformer or MoE config, ``chip`` the hardware
    table's row, ``mesh`` {data: replicas, tensor: Y, expert: Ex} (others refused), ``batch`` B sequences decoded
    together over all replicas, ``prompt`` P and ``output`` G tokens a request, ``weights`` and ``kv`` the stored
    types (SERVING_BYTES), ``compute`` the matmuls' rate (bf16, or the weights' 8-bit type), ``prefill_efficiency``
    the fraction of C a prefill's matmuls reach (None: the chip's fitted matmul_efficiency, 1 on GPUs)."""

    model: object
    chip: Chip
    mesh: Mapping
    batch: int
    prompt: int
    output: int
    weights: str = "bf16"
    kv: str = "bf16"
    compute: str = "bf16"
    prefill_efficiency: float | None = None
    topology: tuple = ()  # a TPU slice's dims (its ICI axes: the tensor axis' rings), () a ring of Y
    reduce_bytes: tuple = (2, 2)  # an element of the tensor all-reduces of (attention's output, the MLP's): BF16 as
    # serving runtimes run them; this package's program reduces FP32 partial sums (4, 4: ffn_model.serve._project_out)
    min_comm_bytes: int = 0  # the narrowest element a collective moves (XLA:CPU widens BF16 to FP32: 4; the
    # training step's CompilerFacts.min_comm_bytes)

    def __post_init__(self):
        for a, n in self.mesh.items():
            if a not in SERVING_AXES and n > 1:
                raise ValueError(f"mesh axis {a}={n}: serving shards over {', '.join(SERVING_AXES)} (data: replicas; "
                                 "tensor and expert: one replica's model parallelism)")
        positive_int("batch", self.batch)
        positive_int("prompt", self.prompt)
        positive_int("output", self.output)
        _choice("weights", self.weights, SERVING_BYTES)
        _choice("kv", self.kv, SERVING_BYTES)
        _choice("compute", self.compute, ("bf16", "int8", "fp8"))
        if self.batch % self.replicas:
            raise ValueError(f"batch={self.batch} is not divisible by data={self.replicas} (the replicas)")
        self.model.kv_cache_elements(1)  # ValueError for a family without sequences
        peak_flops(self.chip, self.compute)  # ValueError where the table has no rate for it

    @property
    def replicas(self) -> int:
        return int(self.mesh.get("data", 1))

    @property
    def model_parallel(self) -> int:
        """m = tensor · expert: the devices one replica's weights and KV caches are split over."""
        return int(self.mesh.get("tensor", 1)) * int(self.mesh.get("expert", 1))

    @property
    def devices(self) -> int:
        return self.replicas * self.model_parallel

    @property
    def per_replica(self) -> int:
        """b = B / data: the sequences one replica decodes."""
        return self.batch // self.replicas


# ---- the Book's forms in its own inputs (numbers: a parameter count, bytes, chips, C, W_hbm) ----

def general_step_seconds(batch: float, kv_bytes_per_sequence: float, params: float, param_bytes: float,
                         chips: int, C: float, W_hbm: float) -> float:
    """The Book's "theoretical step time (general)" of a decode step (applied-inference): B·KV / (N·W_hbm) (attention,
    always bandwidth-bound) + max(2·B·P / (N·C), P·bytes / (N·W_hbm)) (the weight matmuls: LLaMA 3-70B at batch 32,
    8k context, int8 on a v5e 4x2: (41.9e9 + 70e9) / (8·8.1e11) = 17 ms)."""
    return (batch * kv_bytes_per_sequence / (chips * W_hbm)
            + max(2 * batch * params / (chips * C), params * param_bytes / (chips * W_hbm)))


def prefill_seconds(params: float, tokens: float, chips: int, C: float, efficiency: float = 1.0) -> float:
    """2·P·T / (N·C·eta): a compute-bound prefill of T tokens (applied-inference: 2·70e9·8192 / (16·1.97e14·0.4) =
    0.91 s); the attention's FLOPs are not in it (prefill_step's model-based form has them)."""
    return 2 * params * tokens / (chips * C * efficiency)


def sequences_that_fit(free_bytes: float, kv_bytes_per_token: float, context: int) -> int:
    """floor(free HBM / (KV a token · context)): the KV caches the HBM left after the weights holds (applied-inference:
    116 GB over 324 kB · 8192 = 43 on a v5e 4x4 in bf16)."""
    return max(0, math.floor(free_bytes / (kv_bytes_per_token * context)))


def prefill_servers_per_decode_server(prefill_s: float, decode_s: float, batch: int, output: int) -> float:
    """P/G = b·t_prefill / (t_decode·G_len): disaggregated serving's prefill servers per decode server that keep both
    saturated (applied-inference: 32·0.91 / (0.019·512) = 3)."""
    return batch * prefill_s / (decode_s * output)


def kv_cache_bytes(model, context: int, kv: str = "bf16") -> float:
    """One sequence's KV cache at ``context`` tokens: bytes(kv)·model.kv_cache_elements(context) (Scaling Book
    inference page: 2·bytes·H·K·L·T; LLaMA 3-70B in int8 2·8·128·80 = 163,840 B a token, the Book's "160kB")."""
    return SERVING_BYTES[_choice("kv", kv, SERVING_BYTES)] * model.kv_cache_elements(context)


def critical_decode_batch(chip: Chip, weights: str = "bf16", compute: str = "bf16") -> float:
    """B* = C_compute · bytes(weights) / (2·W_hbm): the tokens a decode step needs for its weight matmuls (2·B·D·F
    FLOPs on D·F weights) to be compute-bound (Scaling Book, applied-inference: 1.97e14/8.2e11 = 240 on v5e in bf16,
    120 with int8 weights and bf16 FLOPs, 240 again with int8 FLOPs)."""
    return peak_flops(chip, compute) * SERVING_BYTES[_choice("weights", weights, SERVING_BYTES)] / (2 * chip.hbm_bw)


def tensor_rings(s: Serving) -> tuple[list[int], list[bool]]:
    """The ICI axes the tensor axis of Y chips spans and whether each wraps around: Y factored over the slice's dims
    from the innermost (the mesh's minor axis is tensor), each whole side a ring that wraps where the chip's rule says
    (Chip.has_wraparound); without a topology one ring of Y."""
    Y = int(s.mesh.get("tensor", 1))
    if not s.topology:
        return [Y], [True]
    lens, wraps, left = [], [], Y
    for d in reversed(s.topology):
        take = math.gcd(left, d)
        if take > 1:
            lens.append(take)
            wraps.append(s.chip.has_wraparound(take, d, tuple(s.topology)))
            left //= take
    return (lens, wraps) if left == 1 else ([Y], [True])


def _all_reduce_seconds(s: Serving, V: float, calls: float) -> float:
    """``calls`` all-reduces of V bytes each over the tensor axis: ICI's 2·max(T_hop·hops, V/Σbw) over its rings
    (tensor_rings; scaling.hardware.collectives.allgather_time: 1 us a hop, the Scaling Book's), NVLink's at the bus
    bandwidth a message of V reaches (nccl-tests rows: its latency in it)."""
    Y = int(s.mesh.get("tensor", 1))
    if Y <= 1 or calls == 0:
        return 0.0
    if s.chip.kind == Platform.GPU:
        return float(gpu_time(Collective.ALL_REDUCE, V * calls, Y, V, s.chip))
    lens, wraps = tensor_rings(s)
    return calls * 2 * allgather_time(V, lens, s.chip.ici_bidi, wraps)


def _all_to_all_seconds(s: Serving, V: float, calls: float) -> float:
    """``calls`` all-to-alls of V bytes each (the array over the axis) over expert: ICI's AG(V)/4, NVLink's at the
    bus bandwidth of V."""
    Ex = int(s.mesh.get("expert", 1))
    if Ex <= 1 or calls == 0:
        return 0.0
    if s.chip.kind == Platform.GPU:
        return float(gpu_time(Collective.ALL_TO_ALL, V * calls, Ex, V, s.chip))
    return calls * allgather_time(V, [Ex], s.chip.ici_bidi) / 4


def _moe_layers(model) -> int:
    return getattr(model, "moe_layers", 0)


def step_collectives(s: Serving, tokens: int) -> list[tuple[str, str, float, float]]:
    """A step's collectives on one replica, ``tokens`` tokens in it, as (axis, kind, bytes of one, how many): over
    tensor two all-reduces a layer (attention's and the MLP's outputs, tokens·D·reduce_bytes each; Megatron's layer,
    Shoeybi et al. 2019 sec. 3) and the vocabulary-parallel lookup's (tokens·D·2, BF16; each element at least
    min_comm_bytes); over expert, an MoE layer's dispatch and combine all-to-alls (tokens·k·D·2)."""
    D, out = s.model.d_model, []
    if s.mesh.get("tensor", 1) > 1:
        wide = lambda n: max(n, s.min_comm_bytes)  # noqa: E731
        for r in s.reduce_bytes:
            out.append(("tensor", Collective.ALL_REDUCE, tokens * D * wide(r), s.model.blocks))
        if s.model.vocab:
            out.append(("tensor", Collective.ALL_REDUCE, tokens * D * wide(2), 1))
    k = getattr(getattr(s.model, "moe", None), "top_k", 0)
    if s.mesh.get("expert", 1) > 1 and k:
        out.append(("expert", Collective.ALL_TO_ALL, tokens * k * D * 2, 2 * _moe_layers(s.model)))
    return out


def _comm_seconds(s: Serving, tokens: int) -> float:
    """The time of step_collectives, each priced on its axis (_all_reduce_seconds, _all_to_all_seconds)."""
    return sum(_all_reduce_seconds(s, V, n) if axis == "tensor" else _all_to_all_seconds(s, V, n)
               for axis, _, V, n in step_collectives(s, tokens))


# ---- kernel data: the fraction of W_hbm a decode step's kernels reach (calibrate's decode section) ----

def _interp_log(x: float, xs: list[float], ys: list[float]) -> float:
    """ys at x, linear in log x between the points, clamped to the ends (np.interp in log x, as
    scaling.hardware.collectives.nvlink_efficiency reads its rows); points of one x (a [k, n] and its [n, k] read the
    same bytes) by their mean."""
    at = np.unique(np.asarray(xs, float))
    mean = [float(np.mean([y for x_, y in zip(xs, ys) if x_ == a])) for a in at]
    return float(np.interp(np.log(x), np.log(at), mean))


def decode_kernels_of(chip: Chip):
    """(the decode table, its chip) a chip's decode step is priced from: its own (scaling/data/kernels/decode), or
    the one it borrows (chips.toml decode_kernels_as: the H100 the H200's, the same die); (None, None) elsewhere
    (TPUs: no decode data; the step is the Book's roofline, every byte at W_hbm)."""
    for name in (chip.name, chip.decode_kernels_as):
        if name and (t := decode_table(name)) is not None:
            return t, get_chip(t.chip)
    return None, None


def stream_efficiency(chip: Chip, weight_bytes: float, tokens: float) -> float:
    """The fraction of W_hbm a decode GEMM reading ``weight_bytes`` of bf16 weights for ``tokens`` rows reaches: the
    decode table's rows (2·k·n bytes / (t·W_hbm) of its chip), interpolated in log bytes at each measured m, then in
    log m (H200: 0.55 at 32 MB, 0.92 at 470 MB, m <= 128; lower at m 256, where the GEMM turns compute-bound);
    1 where the chip has no decode table."""
    table, owner = decode_kernels_of(chip)
    if table is None or Dtype.BF16 not in table.gemm:
        return 1.0
    by_m: dict = {}
    for m, n, k, t in table.gemm["bf16"].rows:
        by_m.setdefault(m, []).append((2 * n * k, 2 * n * k / t / owner.hbm_bw))
    ms = sorted(by_m)
    at = [_interp_log(max(weight_bytes, 1.0), [b for b, _ in by_m[m]], [e for _, e in by_m[m]]) for m in ms]
    return _interp_log(max(tokens, 1.0), ms, at)


def kv_efficiency(chip: Chip, kv_bytes: float) -> float:
    """The fraction of W_hbm one layer's decode attention reading ``kv_bytes`` of bf16 cache reaches: the decode
    table's cudnn rows (else its xla rows), 4·b·T·K·H / (t·W_hbm), interpolated in log bytes (H200, cudnn: 0.22 at
    16 MB, 0.83-0.95 from 134 MB); 1 where the chip has none."""
    table, owner = decode_kernels_of(chip)
    if table is None or not table.decode_attention:
        return 1.0
    rows = (table.decode_attention.get("cudnn") or next(iter(table.decode_attention.values()))).rows
    pts = [(4 * b * t * kv * h, 4 * b * t * kv * h / s / owner.hbm_bw) for b, t, _, kv, h, s in rows]
    return _interp_log(max(kv_bytes, 1.0), [p for p, _ in pts], [e for _, e in pts])


def weight_gemm_seconds(s: Serving, tokens: int, w_bytes: float, w_flops: float, out_tokens: int | None = None):
    """(seconds, of which streaming) of a step's weight GEMMs on one device, ``tokens`` rows each (the output layer
    ``out_tokens``, default the same): each of a layer's matrices (model.layer_matrices, split over the m
    model-parallel devices as tensor parallelism splits it) and the output layer priced one by one, the larger of
    - streaming its weights at the fraction of W_hbm the chip's decode GEMMs reach at that size and token count
      (stream_efficiency: kernel data; W_hbm without), never under the decode table's launch time, and
    - the GEMM model's math time in the ``compute`` type (scaling.step.kernels: t_fixed + 2·rows·n·k/(C·
      shape_efficiency), a GPU's kernel-table fit, a TPU's fitted matmul_efficiency; its memory side is the stream
      above, in the weights' own type), what a GEMM of many tokens is bound by; for no more rows than the decode
      table timed (256 on the H200) the table's time alone (it measured those GEMMs, the fit's rows start there);
    L layers of them. A model without per-matrix shapes (an MoE model's experts) takes its mean matrix's stream and
    2·t·P FLOPs at the large-GEMM efficiency."""
    m, model, W = s.model_parallel, s.model, s.chip.device_hbm_bw
    wb = SERVING_BYTES[s.weights]
    table, _ = decode_kernels_of(s.chip)
    floor = (table.launch_seconds or 0.0) if table is not None else 0.0
    measured = max((r[0] for r in table.gemm[Dtype.BF16].rows), default=0) if table is not None else 0
    out_tokens = tokens if out_tokens is None else out_tokens

    def gemm(k, n, rows):  # (time, streaming time) of one GEMM [rows, k]·[k, n]
        stream = max(k * n * wb / (W * stream_efficiency(s.chip, k * n * wb, rows)), floor)
        if rows <= measured:  # the decode table timed GEMMs of this many rows: its figure is the time
            return stream, stream
        math = fixed_seconds(s.chip, s.compute) + 2 * rows * n * k / (
            peak_flops(s.chip, s.compute) * float(shape_efficiency(s.chip, rows, n, k, 1, s.compute)))
        return max(stream, math), stream

    mats = getattr(model, "layer_matrices", None)
    V = model.vocab or 0
    if mats is None:  # an MoE model: its mean matrix, over as many as its base's layer has
        mean = w_bytes / (model.blocks * len(model.base.layer_matrices))
        stream = w_bytes / (W * stream_efficiency(s.chip, mean, tokens))
        return max(stream, w_flops / (peak_flops(s.chip, s.compute) * large_gemm_efficiency(s.chip, s.compute))), stream

    def local(k, n, split):  # one device's part: n split (column-parallel), k split (row-parallel), or whole (None)
        return (k, n) if split is None else (k, n // m) if split else (k // m, n)

    layer = [gemm(*local(*mat), tokens) for mat in mats]
    head = gemm(model.d_model, V // m, out_tokens) if V else (0.0, 0.0)
    return (model.blocks * sum(t for t, _ in layer) + head[0], model.blocks * sum(x for _, x in layer) + head[1])


@dataclass(frozen=True)
class DecodeStep:
    """One decode step per device (module docstring's terms), seconds and bytes: the weights' and the KV cache's HBM
    reads, their FLOPs, and the step's time as the Book sums it."""

    batch: int  # b, the sequences on one replica
    context: float
    weight_bytes: float  # per device
    kv_bytes: float  # per device
    weight_flops: float
    attention_flops: float
    t_weights: float  # the weight GEMMs (weight_gemm_seconds)
    t_attention: float  # max(attention FLOPs / C, KV bytes / (W_hbm · kv_efficiency))
    t_comms: float
    weights_bound: str  # "HBM" (the GEMMs' streams) or "compute" (a GEMM's math over its stream)
    stream_efficiency: float = 1.0  # the fraction of W_hbm the weights' GEMMs reach (kernel data; 1: the roofline)
    kv_efficiency: float = 1.0  # the fraction of W_hbm the attention's reads reach

    @property
    def seconds(self) -> float:
        return self.t_weights + self.t_attention + self.t_comms

    def to_json(self) -> dict:
        return {**asdict(self), "seconds": self.seconds}


def decode_step(s: Serving, context: float) -> DecodeStep:
    """The decode step of s.per_replica sequences at ``context`` cached keys on one device (module docstring):
    weights P_read·w_bytes/m and 2·b·P_read/m FLOPs (weight_gemm_seconds: each GEMM the larger of its stream and
    its GEMM-model time), KV b·kv_cache_bytes/m at the fraction of W_hbm the chip's decode attention reaches
    (kv_efficiency) or the attention's FLOPs/m at C, plus the collectives."""
    m, b, model = s.model_parallel, s.per_replica, s.model
    C, W = peak_flops(s.chip, s.compute), s.chip.device_hbm_bw
    read = model.decode_read_params(b)
    w_bytes = read * SERVING_BYTES[s.weights] / m
    w_flops = model.decode_flops(b, 0) / m  # 2·b·P_read (an MoE layer: each token's k experts)
    kv = b * kv_cache_bytes(model, context, s.kv) / m
    a_flops = model.decode_flops(b, context) / m - w_flops
    t_w, t_stream = weight_gemm_seconds(s, b, w_bytes, w_flops)
    e_w = w_bytes / (W * t_stream)  # the weights' mean fraction of W_hbm
    e_kv = kv_efficiency(s.chip, kv / model.blocks)
    return DecodeStep(b, context, w_bytes, kv, w_flops, a_flops, t_w, max(a_flops / C, kv / (W * e_kv)),
                      _comm_seconds(s, b), "compute" if t_w > 1.0001 * t_stream else "HBM", e_w, e_kv)


def weight_scale_bytes(model, tensor: int) -> float:
    """The BF16 scales of weights quantized per output channel (ffn_model.serve.quantize) one device holds,
    2·model.scale_channels(tensor): each layer's matrices' output channels, split over tensor where tensor parallelism
    splits them (column-parallel), whole where it splits k (W_o, the MLP's output); an MoE layer's experts' each; the
    vocabulary tables' V rows over tensor. LLaMA 3-70B on one device: 80·(8192 + 2·1024 + 8192 + 2·28,672 + 8192) +
    2·128,256 = 6,973,952 scales, 13.9 MB beside its 70.6 GB of int8. 0 for a model without scale_channels."""
    channels = getattr(model, "scale_channels", None)
    return 2 * channels(tensor) if channels else 0.0


def weight_bytes(s: Serving) -> float:
    """The weights one device holds: P·w_bytes/m, an MoE model's routers whole on every device in BF16 (L_moe·D·E,
    not split: each device routes its tokens; not quantized), and quantized weights' scales (weight_scale_bytes)."""
    scales = weight_scale_bytes(s.model, s.mesh.get("tensor", 1)) if s.weights != Dtype.BF16 else 0.0
    routers = _moe_layers(s.model) * getattr(s.model, "router_params", 0)
    m = s.model_parallel
    return (s.model.params - routers) / m * SERVING_BYTES[s.weights] + routers * SERVING_BYTES[Dtype.BF16] + scales


def _slots(m, tokens: int) -> int:
    """E·C, an MoE layer's slots for one group of S = ``tokens`` tokens: C = ceil(cf·k·S/E) an expert (GShard)."""
    return m.experts * math.ceil(m.capacity_factor * m.top_k * tokens / m.experts)


def capacity_flops(model, sequences: int, tokens: int, tensor: int) -> float:
    """The FLOPs the package's MoE program (ffn_model.serve._moe: GShard's capacity form, one group a sequence of
    S = ``tokens`` tokens, C = ceil(cf·k·S/E) slots an expert) adds per device to the routed form's
    (model.decode_flops: k experts a token, every matmul split over tensor), over its L_moe layers and b =
    ``sequences`` groups (GShard section 3.2; scaling.families.moe.step_flops' terms for training): the experts on
    every slot, 2·m·D·F_e·b·(E·C − k·S)/t; the dispatch and combine einsums 2·2·b·S·E·C·D (at S = 1, a decode step,
    elementwise products: none); the router's other (t − 1)/t of 2·b·S·D·E, whole on each tensor device. Its
    collectives are the routed form's (step_collectives: the layer's one all-reduce of S·D a sequence, the slots
    combined to the tokens before it). Mixtral-like E 8, k 2, cf 1.25 at a decode step (S = 1): C = 1, 8 slots a token
    for 2 routed. 0 for a model without a capacity-form MoE."""
    m = getattr(model, "moe", None)
    if m is None or m.dropless:
        return 0.0
    D, EC = model.d_model, _slots(m, tokens)
    return model.moe_layers * (2 * model.mlp_matrices * D * m.expert_d_ff * sequences * (EC - m.top_k * tokens) / tensor
                               + (4 * sequences * tokens * EC * D if tokens > 1 else 0)
                               + 2 * sequences * tokens * D * m.experts * (tensor - 1) / tensor)


def decode_memory(s: Serving, context: float) -> float:
    """Bytes a device holds in a decode step at a cache of ``context`` tokens: its share of the weights and of its
    replica's caches, weight_bytes + b·kv_cache_bytes(context)/m (Scaling Book, inference: the weights and the KV
    cache are what a decode holds), plus the step's FP32 logits b·V·4/tensor, its one output not written into an
    input's buffer (the caches are updated in place); the activations, a few b·D vectors, are left out (under 1e-4 of
    it)."""
    b, model = s.per_replica, s.model
    logits = b * (model.vocab or 0) * 4 / s.mesh.get("tensor", 1)
    return weight_bytes(s) + b * kv_cache_bytes(model, context, s.kv) / s.model_parallel + logits


def prefill_memory(s: Serving, prompts: int | None = None, fused: bool = True) -> float:
    """Bytes a device holds at the peak of the package's prefill of ``prompts`` (default b) prompts of P tokens
    (ffn_model.serve.prefill, its attention materialized): weight_bytes, the caches it makes b·kv_cache_bytes(P)/m,
    the FP32 logits of each prompt's last token b·V·4/tensor, and one layer at its largest, with S = b·(N/tensor)·P²
    scores and X = b·P·D (XLA's buffer assignments, docs/serving.md):
      XLA:TPU  max(4S + 2X + 4X, 8X): the FP32 scores beside the BF16 residual and W_o's FP32 partial sums, into whose
               matmul the softmax and p·v are fused; ``fused`` False: 4S + 2X + 2·b·P·(N/tensor)·H, p·v written out
               and the partial sums made after the scores (XLA fuses or not by size: both are reported);
      XLA:GPU  max(6S + 4X, 12X): the BF16 probabilities written beside the scores; the all-reduce out of place (its
               FP32 input and output, two BF16 residuals).
    An MoE layer in the capacity form (ffn_model.serve._moe), Y = b·E·C·D slots' elements, C from a group of P tokens,
    on XLA:TPU: the larger of its dispatch, 4X + b·P·E·C + 2Y + 4·k·b·P·C (the residual and the normed h, the
    dispatch mask's bytes, the BF16 slots it makes, the combine's FP32 one-hots [b, P, k, C]), and its combine,
    6X + 2Y (the slots beside the tokens' FP32 sums and the residual); on XLA:GPU the combine's, 10X + 4Y + 4·b·P·E·C
    (the slots' FP32 partial sums, the combine weights in FP32, the tokens' FP32 sums, the attention's FP32 all-reduce
    still in flight, the residual); the layer's peak the larger of its attention's and its experts'.
    8 prompts of 2048 (D 2048, 16 heads of 128, tensor=8): S = 67.1 M, X = 33.6 M; 8 experts, top-2, cf 1.25: C = 640,
    Y = 83.9 M."""
    b = s.per_replica if prompts is None else positive_int("prompts", prompts)
    model, P, t = s.model, s.prompt, s.mesh.get("tensor", 1)
    S, X = b * (model.heads / t) * P * P, b * P * model.d_model
    moe = getattr(model, "moe", None) if _moe_layers(model) else None
    slots = _slots(moe, P) if moe is not None and not moe.dropless else 0
    Y = b * slots * model.d_model
    if s.chip.kind == Platform.GPU:
        layer = max(6 * S + 4 * X, 12 * X, (10 * X + 4 * Y + 4 * b * P * slots) if slots else 0)
    else:
        layer = max(4 * S + 2 * X + (4 * X if fused else 2 * b * P * (model.heads / t) * model.head_dim), 8 * X)
        if slots:
            layer = max(layer, 4 * X + b * P * slots + 2 * Y + 4 * moe.top_k * b * P * slots / moe.experts,
                        6 * X + 2 * Y)
    logits = b * (model.vocab or 0) * 4 / t
    return weight_bytes(s) + b * kv_cache_bytes(model, P, s.kv) / s.model_parallel + logits + layer


def max_batch(s: Serving, context: float) -> int:
    """The most sequences of ``context`` tokens all replicas hold: per replica floor((m·HBM − P·w_bytes) / KV of one
    sequence), the chip's usable HBM (Scaling Book, applied-inference: LLaMA 3-70B in bf16 on 16 v5e, 116 GB left,
    43 caches of 8k); 0 where the weights do not fit."""
    m = s.model_parallel
    free = m * s.chip.hbm_budget - s.model.params * SERVING_BYTES[s.weights]
    return s.replicas * max(0, math.floor(free / kv_cache_bytes(s.model, context, s.kv)))


@dataclass(frozen=True)
class PrefillStep:
    """One prefill of b prompts of P tokens on one replica, per device: FLOPs, weight bytes, the all-reduces, and the
    time at the efficiency it assumes."""

    prompts: int
    prompt: int
    flops: float
    weight_bytes: float
    efficiency: float
    t_math: float
    t_weights: float
    t_comms: float

    @property
    def seconds(self) -> float:
        return max(self.t_math, self.t_weights) + self.t_comms

    def to_json(self) -> dict:
        return {**asdict(self), "seconds": self.seconds}


def prefill_flops(model, prompts: int, P: int, square: bool = False) -> float:
    """Matmul FLOPs of a prefill of ``prompts`` prompts of P tokens, all devices: every token through every weight
    but the output layer, which only the last token of each prompt reaches (its logits sample the first new token), and
    causal attention over P/2 keys a token on average: model.decode_flops(b·P, P/2) − 2·b·(P − 1)·V·D. ``square``: an
    attention kernel that computes the whole P×P score square, masked (materialized), P keys a token."""
    V = (model.vocab or 0) * model.d_model
    return model.decode_flops(prompts * P, P if square else P / 2) - 2 * prompts * (P - 1) * V


def prefill_step(s: Serving, prompts: int | None = None) -> PrefillStep:
    """A prefill of ``prompts`` prompts (default b) of P tokens on one replica (module docstring), per device: its
    weight GEMMs of b·P rows (the output layer's b: weight_gemm_seconds, the GEMM model in the compute type) and its
    causal attention's FLOPs at the bf16 peak times the chip's large-GEMM efficiency; with prefill_efficiency eta
    given, every FLOP at eta·C instead (the Book's form); the tensor all-reduces of b·P·D a layer."""
    b = s.per_replica if prompts is None else positive_int("prompts", prompts)
    m, P, model = s.model_parallel, s.prompt, s.model
    flops = prefill_flops(model, b, P) / m
    V = (model.vocab or 0) * model.d_model
    w_flops = (2 * b * P * (model.decode_read_params(b * P) - V) + 2 * b * V) / m
    w_bytes = model.decode_read_params(b * P) * SERVING_BYTES[s.weights] / m
    C, W = peak_flops(s.chip, s.compute), s.chip.device_hbm_bw
    if s.prefill_efficiency is not None:
        t_math = flops / (C * s.prefill_efficiency)
    else:
        t_w, _ = weight_gemm_seconds(s, b * P, w_bytes, w_flops, out_tokens=b)
        t_math = t_w + (flops - w_flops) / (peak_flops(s.chip) * large_gemm_efficiency(s.chip))
    return PrefillStep(b, P, flops, w_bytes, flops / (C * t_math), t_math, w_bytes / W, _comm_seconds(s, b * P))


@dataclass(frozen=True)
class ServingReport:
    """A request's figures (module docstring): the prefill of one prompt, the decode step at the mean context P + G/2,
    time to first token, time per output token, throughput, the KV cache, the largest batch, the critical batch."""

    serving: Serving
    prefill: PrefillStep
    decode: DecodeStep
    batch_prefill: PrefillStep  # the replica's b prompts at once (a static batch's first phase)
    kv_bytes_per_sequence: float
    memory_per_device: float
    largest_batch: int
    critical_batch: float
    notes: list[str] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        """Time to the first token: the prefill of one prompt, whose last position's logits give it."""
        return self.prefill.seconds

    @property
    def tpot(self) -> float:
        return self.decode.seconds

    @property
    def tokens_per_second_per_chip(self) -> float:
        """B / t_decode / devices: the decode phase's throughput (a continuous batch kept full)."""
        return self.serving.batch / self.tpot / self.serving.devices

    @property
    def batch_seconds(self) -> float:
        """A static batch from start to end: its b prompts prefilled at once (the first token each), then G − 1
        decode steps at the mean context (the step is linear in the context)."""
        return self.batch_prefill.seconds + (self.serving.output - 1) * self.tpot

    @property
    def batch_tokens_per_second_per_chip(self) -> float:
        """B·G / batch_seconds / devices: a static batch's output throughput, its prefill included."""
        s = self.serving
        return s.batch * s.output / self.batch_seconds / s.devices

    def to_json(self) -> dict:
        s = self.serving
        return {"model": str(s.model), "chip": s.chip.name, "mesh": dict(s.mesh), "batch": s.batch,
                "prompt": s.prompt, "output": s.output, "weights": s.weights, "kv": s.kv, "compute": s.compute,
                "prefill": self.prefill.to_json(), "decode": self.decode.to_json(),
                "kv_bytes_per_sequence": self.kv_bytes_per_sequence, "memory_per_device": self.memory_per_device,
                "largest_batch": self.largest_batch, "critical_batch": self.critical_batch,
                "ttft_seconds": self.ttft, "tpot_seconds": self.tpot,
                "tokens_per_second_per_chip": self.tokens_per_second_per_chip,
                "batch_prefill": self.batch_prefill.to_json(), "batch_seconds": self.batch_seconds,
                "batch_tokens_per_second_per_chip": self.batch_tokens_per_second_per_chip, "notes": self.notes}

    def render(self) -> str:
        s, d, p = self.serving, self.decode, self.prefill
        ms = lambda t: f"{t * 1e3:.3g} ms"  # noqa: E731
        mesh = ",".join(f"{a}={n}" for a, n in s.mesh.items() if n > 1) or "1 device"
        fits = "fits" if self.memory_per_device <= s.chip.hbm_budget else "DOES NOT FIT"
        lines = [
            f"serving {s.model} on {s.devices} {s.chip.name} ({mesh}): batch {s.batch}, prompt {s.prompt}, output "
            f"{s.output}; weights {s.weights}, KV cache {s.kv}, matmuls at the {s.compute} rate",
            f"  {s.chip.describe()}",
            f"  KV cache: {self.kv_bytes_per_sequence / 1e9:.4g} GB a sequence at {d.context:.0f} tokens "
            f"({kv_cache_bytes(s.model, 1, s.kv):,.0f} B a token); memory per device "
            f"{self.memory_per_device / 1e9:.4g} GB of {s.chip.hbm_budget / 1e9:.4g} ({fits}); largest batch at this "
            f"context {self.largest_batch}",
            f"  critical batch B* = C·w_bytes/(2·W_hbm) = {self.critical_batch:.0f} tokens a replica: decode's weight "
            f"matmuls are {d.weights_bound}-bound at b = {d.batch}",
            f"  decode step at context {d.context:.0f}: {ms(d.seconds)} = weights {ms(d.t_weights)} "
            f"({d.weight_bytes / 1e9:.4g} GB, {d.weight_flops:.3g} FLOPs a device) + KV {ms(d.t_attention)} "
            f"({d.kv_bytes / 1e9:.4g} GB) + collectives {ms(d.t_comms)}",
            f"  prefill of one prompt: {ms(p.seconds)} ({p.flops:.3g} FLOPs a device at {p.efficiency:.3g} of C; "
            f"collectives {ms(p.t_comms)})",
            f"  time to first token {ms(self.ttft)}; time per output token {ms(self.tpot)}; "
            f"{self.tokens_per_second_per_chip:,.0f} tokens/s a chip decoding; a request's {s.output} tokens in "
            f"{self.ttft + (s.output - 1) * self.tpot:.3g} s",
            f"  a static batch (its {s.per_replica} prompts a replica prefilled at once, "
            f"{ms(self.batch_prefill.seconds)}, then {s.output - 1} decode steps): {self.batch_seconds:.3g} s, "
            f"{self.batch_tokens_per_second_per_chip:,.0f} output tokens/s a chip",
        ]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def serving_report(s: Serving) -> ServingReport:
    """The ServingReport of ``s``: prefill of one prompt a replica, decode at the mean context P + G/2, what a device
    holds at the full context P + G (decode_memory)."""
    mean = s.prompt + s.output / 2
    full = s.prompt + s.output
    kv = kv_cache_bytes(s.model, full, s.kv)
    memory = decode_memory(s, full)
    notes = []
    if s.model.kv_heads < s.mesh.get("tensor", 1):
        notes.append(f"tensor={s.mesh['tensor']} is more than the K={s.model.kv_heads} KV heads: the caches are "
                     "taken as split over the batch too (Scaling Book, inference: sharding the KVs along the batch)")
    return ServingReport(s, prefill_step(s, 1), decode_step(s, mean), prefill_step(s), kv, memory,
                         max_batch(s, full), critical_decode_batch(s.chip, s.weights, s.compute), notes)
