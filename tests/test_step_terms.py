"""The GPU step's terms outside its GEMMs (issue 38, items 1, 4 and 5): pointwise kernels at the bandwidth their size
reaches plus a launch each, cuDNN's flash attention from the kernel table, NCCL collectives over NVLink at the bus
bandwidth the published nccl-tests figures give and over InfiniBand at Calculon's, and --runtime.

Expected values are hand calculations from the table rows (scaling/data/kernels/H100.toml, measured with
`jax-scaling calibrate` on an H100) and the published figures (vTrain's nccl-tests all-reduce table on 8 A100s:
1 MiB 92.8 us, 64 MiB 580 us, 1 GiB 8.19 ms; Calculon's IB 25 GB/s per GPU at 0.9 and 20 us), each worked out in a
comment, never read back from the code."""

import argparse

import numpy as np
import pytest

from jax_scaling.args import add_config_args
from scaling.hardware import collectives
from scaling.step import kernels
from scaling.hardware.chips import get_chip
from scaling.step.kernels import Kernel
from scaling.families.presets import PRESETS
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload

H100, A100, V5E = get_chip("H100"), get_chip("A100-80GB"), get_chip("v5e")
LAUNCH = 6.5401e-06  # H100.toml launch_seconds


def test_pointwise_kernel_between_two_rows():
    """One 512 MiB elementwise kernel on an H100, between the table's 256 MiB and 1 GiB rows. Past its launch
    (5.5773 us) the 256 MiB row reaches 268435456 / (93.948 − 5.5773) us = 3.03760e12 B/s, the 1 GiB row
    1073741824 / (370.80 − 5.5773) us = 2.93996e12 B/s; 512 MiB is halfway in log bytes: 2.98878e12 B/s; its time
    5.5773 us + 536870912 / 2.98878e12 = 5.5773 + 179.629 = 185.206 us. At a row's size, the row's time: 4 GiB
    1.4614 ms. Ten such kernels take ten times one."""
    assert kernels.pointwise_seconds(H100, 2**29, 1) == pytest.approx(184.093e-6, rel=1e-4)
    assert kernels.pointwise_seconds(H100, 2**32, 1) == pytest.approx(1.4614e-3, rel=1e-9)
    assert kernels.pointwise_seconds(H100, 10 * 2**29, 10) == pytest.approx(10 * 184.093e-6, rel=1e-4)
    # a tiny kernel is its launch and a little: 16 KiB, the smallest row, 8.9006 us
    assert kernels.pointwise_seconds(H100, 16384, 1) == pytest.approx(8.9006e-6, rel=1e-9)


def test_pointwise_fallbacks():
    """A TPU: bytes / HBM bandwidth, no launch (v5e 8.2e11 B/s: 8.2e9 B in 10 ms). The A100 (no pointwise rows) takes
    the H100's bandwidth at the size scaled by the HBM ratio 2.039/3.35 and the H100's launch: at 4 GiB
    4294967296 / (1.4614 ms − 6.5401 us) = 2.95215e12 B/s -> 1.79685e12 B/s: 6.5401 us + 2.39028 ms = 2.39682 ms."""
    assert kernels.pointwise_seconds(V5E, 8.2e9, 10) == pytest.approx(1e-2, rel=1e-12)
    assert kernels.launch_seconds(V5E) == 0.0 and kernels.launch_seconds(A100) == LAUNCH
    assert kernels.pointwise_seconds(A100, 2**32, 1) == pytest.approx(2.39682e-3, rel=1e-4)


def test_cudnn_attention_call():
    """Flash attention from the [attention.cudnn] rows. A call of 4 sequences × 32 heads = 128 (sequence, head) units
    at seq 4096, head dim 128, causal is the row (8, 4096, 16, 128, true): forward 975.96 us, backward
    4098.5 − 975.96 = 3122.54 us. At head dim 96, halfway between the 64 and 128 rows (660.73 and 975.96 us):
    818.345 us forward, 2 calls 1636.69 us. At seq 2896 (≈ √(2048·4096)), head 128: per unit halfway in log between
    the 2048 row (556.20 us / 256 units = 2.17266 us) and the 4096 row (975.96 / 128 = 7.62469 us): √(2.17266 ·
    7.62469) = 4.07010 us (seq taken as exactly 2^11.5, 2896.31)."""
    def call(seq, hd, pass_, calls=1, units=128):
        return kernels.attention_table_seconds(H100, Kernel("attention", pass_, "attention", (seq, seq, hd, units),
                                                            calls, 0.0, 0.0))
    assert call(4096, 128, "forward") == pytest.approx(975.96e-6, rel=1e-9)
    assert call(4096, 128, "backward") == pytest.approx(3122.54e-6, rel=1e-9)
    assert call(4096, 128, "recompute") == pytest.approx(975.96e-6, rel=1e-9)
    assert call(4096, 96, "forward", calls=2) == pytest.approx(1636.69e-6, rel=1e-6)
    assert call(2 ** 11.5, 128, "forward", units=1) == pytest.approx(4.07010e-6, rel=1e-5)


def test_step_takes_cudnn_attention_only_where_cudnn_runs():
    """A cuDNN step on an H100 prices its attention kernels from the table (the forward kernel's seconds are the
    rows': llama2-7b, 4 sequences of 4096 per device, 32 heads of 128, one layer-call each of its 32 layers:
    32 · 975.96 us = 31.231 ms); materialized attention keeps the GEMM model (not the table's figure), and so does the
    package's own flash, which XLA:GPU runs as dots and fusions over every key block (executed 1: no causal skip)."""
    cfg = PRESETS["llama2-7b"]
    mesh = {"data": 1, "stage": 1, "fsdp": 1, "context": 1, "tensor": 1}
    cudnn = Workload(cfg, mesh, 4 * 4096, remat="minimal", schedule=Schedule(attention="cudnn"))
    ks = kernels.step_kernels(cudnn, H100)
    fwd = [k for k in ks if k.kind == "attention" and k.pass_ == "forward"][0]
    assert fwd.seconds == pytest.approx(32 * 975.96e-6, rel=1e-6)
    flash = Workload(cfg, mesh, 4 * 4096, remat="minimal", schedule=Schedule(attention="flash"))
    fwd_f = [k for k in kernels.step_kernels(flash, H100) if k.kind == "attention" and k.pass_ == "forward"][0]
    assert fwd_f.executed == 1.0 and fwd_f.seconds != pytest.approx(32 * 975.96e-6, rel=1e-2)
    mat = Workload(cfg, mesh, 4 * 4096, remat="minimal", schedule=Schedule(attention="materialized"))
    fwd_m = [k for k in kernels.step_kernels(mat, H100) if k.kind == "attention" and k.pass_ == "forward"][0]
    assert fwd_m.seconds != pytest.approx(32 * 975.96e-6, rel=1e-2)
    # both paths of the compute term agree (compute_term stacks the matmuls; step_kernels a kernel at a time)
    assert kernels.compute_term(cudnn, H100) == pytest.approx(kernels.compute_seconds(ks), rel=1e-12)
    flash_ks = kernels.step_kernels(flash, H100)
    assert kernels.compute_term(flash, H100) == pytest.approx(kernels.compute_seconds(flash_ks), rel=1e-12)


def test_nvlink_all_reduce_on_8_a100s():
    """nccl-tests all-reduce on 8 A100s (vTrain's table): 64 MiB in 580 us, 1 MiB in 92.8 us (bus bandwidth
    2·7/8·V/t). At 8 MiB, halfway in log bytes, the bus bandwidth is the mean of 1.75·1048576/92.8 us = 19.773 GB/s
    and 1.75·67108864/580 us = 202.48 GB/s, 111.13 GB/s: 1.75·8388608 / 111.13e9 = 132.10 us. An all-gather of the
    same 64 MiB moves half an all-reduce's bytes: 290 us. Over 4 GPUs the rows measured on 4 (vTrain's AR_GPU4 LUT):
    64 MiB in 543.8 us, not the 8-GPU rows scaled by 3/4 over 7/8 (497.1 us); over 2, 404.7 us; over 3 the nearest
    count in log, 4 (|ln 3/4| 0.29 < |ln 3/2| 0.41): 543.8 us · (2/3)/(3/4) = 483.4 us."""
    MiB = 2**20
    assert collectives.gpu_time("all-reduce", 64 * MiB, 8, 64 * MiB, A100) == pytest.approx(580e-6, rel=1e-9)
    assert collectives.gpu_time("all-reduce", MiB, 8, MiB, A100) == pytest.approx(92.8e-6, rel=1e-9)
    assert collectives.gpu_time("all-reduce", 8 * MiB, 8, 8 * MiB, A100) == pytest.approx(132.10e-6, rel=1e-4)
    assert collectives.gpu_time("all-gather", 64 * MiB, 8, 64 * MiB, A100) == pytest.approx(290e-6, rel=1e-9)
    assert collectives.gpu_time("all-reduce", 64 * MiB, 4, 64 * MiB, A100) == pytest.approx(543.8e-6, rel=1e-9)
    assert collectives.gpu_time("all-reduce", 64 * MiB, 2, 64 * MiB, A100) == pytest.approx(404.7e-6, rel=1e-9)
    assert collectives.gpu_time("all-reduce", 64 * MiB, 3, 64 * MiB, A100) == pytest.approx(483.38e-6, rel=1e-4)
    assert collectives.gpu_time("all-reduce", 64 * MiB, 1, 64 * MiB, A100) == 0.0
    # 16 steps of 64 MiB messages take 16 of them, not one 1 GiB message's 8.19 ms / 1.0 (V adds, the size per call
    # sets the efficiency)
    assert collectives.gpu_time("all-reduce", 16 * 64 * MiB, 8, 64 * MiB, A100) == pytest.approx(16 * 580e-6, rel=1e-9)


def test_nvlink_small_all_reduce_on_h100s():
    """XLA's measured sm_90 collective table (openxla/xla default_collective_perf_table.txtpb, in H100.toml): an F32
    all-reduce of 16 KiB (4096 elements) over 8 GPUs reaches 0.4718894 GB/s of bytes / time: 16384 / 0.4718894e9 =
    34.72 us, a latency the link bandwidth alone (2·7/8·16384 / 450e9 = 0.064 us) misses; 1 MiB over 2 GPUs
    50.027 GB/s: 20.96 us; over 4 24.130 GB/s: 43.46 us. Vectorized over device counts as the planner passes them."""
    H100, KiB = get_chip("H100"), 1024
    assert collectives.gpu_time("all-reduce", 16 * KiB, 8, 16 * KiB, H100) == pytest.approx(34.72e-6, rel=1e-3)
    got = collectives.gpu_time("all-reduce", 1024 * KiB, np.array([2, 4]), 1024 * KiB, H100)
    assert got == pytest.approx([20.96e-6, 43.46e-6], rel=1e-3)


def test_infiniband_part():
    """An all-reduce of 1 GB over 4 nodes of 8 A100s, one call: each GPU carries 1/8 of it over its NIC, 2·(1e9/8)·
    (3/4) / (25 GB/s · 0.9) = 8.3333 ms, plus Calculon's 20 us latency: 8.3533 ms."""
    assert collectives.ib_time("all-reduce", 1e9, 4, 8, 1, 25e9) == pytest.approx(8.3533e-3, rel=1e-4)
    assert collectives.ib_time("all-reduce", 1e9, 1, 8, 1, 25e9) == 0.0


def test_all_to_all_over_nodes():
    """An all-to-all of a 1 GB buffer a GPU over 2 nodes of 8 (expert 16): half of each GPU's buffer is bound for
    the other node, through its own NIC: 1e9·(1/2) / (50 GB/s · 0.9) = 11.111 ms + 20 us = 11.131 ms (not the
    1/8 of it an all-reduce's hierarchical split carries); over NVLink the 1/2 for its own node's GPUs, 7/8 of that
    leaving the GPU: gpu_time of 0.5 GB over 8."""
    from scaling.step.program import _gpu_comm_times
    H100 = get_chip("H100")
    assert collectives.ib_time("all-to-all", 1e9, 2, 8, 1, 50e9) == pytest.approx(11.131e-3, rel=1e-4)
    t = _gpu_comm_times({"expert": {"all-to-all": 1e9}}, H100, {"expert": 2}, {"expert": 16}, {})["expert"]
    want = collectives.gpu_time("all-to-all", 0.5e9, 8, 1e9, H100) + collectives.ib_time(
        "all-to-all", 1e9, 2, 8, 1, H100.dcn_bw / H100.devices_per_chip)
    assert t == pytest.approx(want, rel=1e-12)


def test_runtime_flag_sets_the_accumulation():
    """--runtime names the runtime; it sets --grad-accumulation's value (deepspeed: DeepSpeed's BF16 optimizer,
    maxtext: XLA's step as this package's), the later flag winning; a bad name is refused."""
    r = argparse.ArgumentParser()
    add_config_args(r, mesh_required=False)
    assert r.parse_args(["--runtime", "deepspeed"]).grad_accumulation == "deepspeed-bf16"
    assert r.parse_args(["--runtime", "maxtext"]).grad_accumulation == "package"
    assert r.parse_args(["--runtime", "megatron"]).grad_accumulation == "megatron"
    assert r.parse_args(["--runtime", "megatron", "--grad-accumulation", "package"]).grad_accumulation == "package"
    with pytest.raises(SystemExit):
        r.parse_args(["--runtime", "jax"])


def test_gpu_messages_are_one_microbatch_or_one_layer():
    """The per-call sizes the NVLink efficiency is read at: over tensor one microbatch's activations, 2 B ·
    (4096 tokens) · 4096 = 32 MiB for llama2-7b on one sequence per microbatch; over fsdp one layer's weights
    over tensor, 2 B · 202,375,168 / 2 = 202.4 MB (4096·4096·4 attention + 3·4096·11008 MLP = 202,375,168)."""
    from scaling.step.program import gpu_messages
    cfg = PRESETS["llama2-7b"]
    w = Workload(cfg, {"data": 1, "stage": 1, "fsdp": 2, "context": 1, "tensor": 2}, 4 * 4096,
                 schedule=Schedule(microbatches=2))
    m = gpu_messages(w)
    assert float(m["tensor"]) == pytest.approx(2 * 4096 * 4096)
    assert float(m["fsdp"]) == pytest.approx(2 * 202_375_168 / 2)
    assert np.isfinite(float(m["stage"]))


def test_pytorch_full_recompute_reruns_the_whole_layer():
    """Megatron-LM's full recomputation (torch.utils.checkpoint over each layer) runs the layer's forward again,
    W_out's matmul included: Narayanan et al. 2021, eq. 3, count 96·B·s·l·h²·(1 + s/(6h)) = 4 forward passes of
    24·B·s·l·h²·(1 + s/(6h)) without the vocabulary. With --runtime megatron and remat full the matmul FLOPs are
    4 times the forward's; the package's own step (XLA drops the dead W_out matmul) recomputes less."""
    from scaling.core.policies import Precision
    from scaling.families.transformer import TransformerConfig, step_flops

    cfg = TransformerConfig(d_model=2304, heads=24, d_ff=4 * 2304, blocks=4, seq_len=2048, mlp="gelu")
    sched = Schedule(attention="materialized")
    mega = step_flops(Workload(cfg, {"data": 1}, 8 * 2048, remat="full", schedule=sched,
                               precision=Precision(accumulation="megatron")))
    own = step_flops(Workload(cfg, {"data": 1}, 8 * 2048, remat="full", schedule=sched))
    assert mega["total"] == pytest.approx(4 * mega["forward"], rel=1e-12)
    # the package's step: the whole forward but W_out, 2·t·D·F of the layer's 24·t·D²·(1 + s/(6D)) per token
    t, D, F = 8 * 2048, 2304, 4 * 2304
    assert mega["total"] - own["total"] == pytest.approx(cfg.blocks * 2 * t * D * F, rel=1e-12)
