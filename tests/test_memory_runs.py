"""Memory of the runs that ran (issue 37, item 6): every measured run of scaling/data/measured.toml fits the
memory predict gives it, the predicted memory is within 10% (median) of the measured peaks, a PyTorch runtime's
memory as its code keeps it (scaling.step.runtimes), and the offloading remat policies (MaxText's qkv_proj_offloaded
and its custom decoder-input + q/k/v policy) in the program and the closed forms: saved residuals in pinned host
memory, not HBM, on a TPU compiled ahead of time; XLA:CPU keeps them in device memory."""
import jax
import pytest

from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import get_preset
from scaling.reports.predict import predict_report, predict_setup
from scaling.step.runtimes import stage_inflight
from scaling.core.schedule import Schedule
from scaling.families.transformer import host_memory_per_device, memory_per_device, offloaded_per_layer
from scaling.reports.validate import RUN_KEYS, measured_runs, validate
from scaling.core.workload import Workload

GIB = 2**30


def _report(run_id: str):
    run = next(r for r in measured_runs() if r["id"] == run_id)
    return predict_report(predict_setup(**{k: v for k, v in run.items() if k not in RUN_KEYS}))


def test_every_run_that_ran_fits_and_memory_is_within_ten_percent():
    """validate: no measured run is predicted not to fit (the 10 of issue 37: MaxText's v5e 128B runs, its v6e 70B
    runs, Megatron-LM's 18.4B, BLOOM's MBS 8 run), and the median |error| of the memory per device against the 24
    measured peaks (BLOOM's topology and micro-batch search) is at most 10%."""
    v = validate()
    assert [r["id"] for r in v["rows"] if not r["fits"]] == []
    assert v["memory"]["n"] == 24 and v["memory"]["median_abs_error"] <= 0.10, v["memory"]


def test_deepspeed_zero1_memory_by_hand():
    """BLOOM's DP4 TP8 PP12 MBS1 row (72 layers of D = 14400, F = 57600, 96 heads of 150, V = 250,880 tied) as
    DeepSpeed's ZeRO-1 keeps it, by hand. Per layer 4·D² + 2·D·F = 829,440,000 + 1,658,880,000 = 2,488,320,000
    parameters; the first stage's 6 layers over tensor 8: 1,866,240,000, and the word embedding
    250,880·14,400/8 = 451,584,000: P = 2,317,824,000. 16-bit weights and gradients 2·P each = 4,635,648,000 B;
    the FP32 master, gradient and moments over data 4: 16·P/4 = 9,271,296,000 B; ZeRO's buckets (overlap_comm)
    4.5·2·5e8·2 B = 9e9 B; each of the 12 microbatches in flight keeps its 6 layers' inputs and its stage output,
    12·7·(2·2048·14400) = 4,954,521,600 B. Measured: 30 GB (GiB) at peak."""
    m = _report("bloom-a100-dp4-pp12-mbs1").prediction.memory
    assert m["weights"] == pytest.approx(4_635_648_000, rel=1e-9)
    assert m["grads"] == pytest.approx(4_635_648_000, rel=1e-9)
    assert m["fp32_state"] == pytest.approx(9_271_296_000, rel=1e-9)
    assert m["zero_buckets"] == pytest.approx(9e9)
    assert m["activations"] == pytest.approx(4_954_521_600, rel=1e-9)
    assert abs(m["total"] / (30 * GIB) - 1) <= 0.10


def test_megatron_18b_fits_with_one_sequence_per_microbatch():
    """Megatron-LM's 18.4B (Narayanan et al. 2021, Table 1: 40 layers of h = 6144, TP 8, DP 32, batch 1024):
    FP16 weights (2 B), the FP32 main_grad (4 B), FP32 master and Adam's moments (12 B) per parameter, 18 B over
    P = (40·12·6144² + 51200·6144)/8 = (18,119,393,280 + 314,572,800)/8 = 2,304,245,760: 18·P = 41.48e9 B; a
    layer's input 2·2048·6144 = 25,165,824 B kept for the 40 layers of the one microbatch in flight: 1.007e9 B.
    The whole data shard at once (32 sequences: 32.2e9 B of layer inputs) is what did not fit."""
    m = _report("megatron-a100-18.4b").prediction.memory
    P = (40 * 12 * 6144**2 + 51200 * 6144) / 8
    assert m["weights"] + m["grads"] + m["fp32_state"] == pytest.approx(18 * P, rel=1e-9)
    assert m["activations"] == pytest.approx(40 * 2 * 2048 * 6144, rel=1e-9)
    assert m["total"] < 79.25 * GIB


def test_in_flight_microbatches_of_each_schedule():
    """The first stage's microbatch-chunks at its peak: without stages 1 of L layers; 1F1B S of L/S (PipeDream-
    Flush); interleaved with R = 2 on S = 2: Megatron's warm-up (S − 1)·2 + (R − 1)·S = 4 and one more, 5 chunks of
    L/(S·R) = 12 layers (48 layers)."""
    tf = get_preset("tiny-tf").replace(blocks=48)
    w = Workload(tf, parse_mesh_spec("stage=2"), 8 * tf.seq_len, schedule=Schedule(8, repeats=2, pipeline="1f1b"))
    assert stage_inflight(w) == (5, 12)
    w = Workload(tf, parse_mesh_spec("stage=4"), 8 * tf.seq_len, schedule=Schedule(8, pipeline="1f1b"))
    assert stage_inflight(w) == (4, 12)
    assert stage_inflight(Workload(tf, parse_mesh_spec("fsdp=1"), tf.seq_len)) == (1, 48)


# A Llama-style shape small enough to compile quickly: D = 1024, 8 query heads and 2 kv heads of 128, T = 1024
_TF = get_preset("tiny-tf").replace(d_model=1024, heads=8, kv_heads=2, head_dim=128, d_ff=4096, blocks=4,
                                    seq_len=1024)


def test_offloaded_bytes_by_hand():
    """qkv_proj_offloaded keeps q, k, v of each layer in host memory: per device on fsdp=2, tensor=2 with 8
    sequences of 1024, t = 4096 tokens, c·t·H·(N + 2K)/Y = 2·4096·128·12/2 = 6,291,456 B a layer, 25,165,824 B
    for the 4 layers; input_qkv_offloaded adds the layer's input, c·t·D = 8,388,608 B a layer. The device's memory
    is save_qkv_proj's less them where the compiler places them on the host, and save_qkv_proj's where it does not
    (XLA:CPU)."""
    mesh = parse_mesh_spec("fsdp=2,tensor=2")
    B = 8 * _TF.seq_len
    assert offloaded_per_layer(_TF, mesh, B, "qkv_proj_offloaded") == 6_291_456
    assert offloaded_per_layer(_TF, mesh, B, "input_qkv_offloaded") == 6_291_456 + 8_388_608
    assert offloaded_per_layer(_TF, mesh, B, "save_qkv_proj") == 0
    saved = memory_per_device(Workload(_TF, mesh, B, remat="save_qkv_proj"))
    for remat, per in (("qkv_proj_offloaded", 6_291_456), ("input_qkv_offloaded", 14_680_064)):
        w = Workload(_TF, mesh, B, remat=remat)
        assert host_memory_per_device(w) == 4 * per
        m = memory_per_device(w)
        assert saved["activations"] - m["activations"] == pytest.approx(4 * per)
        assert saved["total"] - m["total"] == pytest.approx(4 * per)
        on_cpu = w.with_facts(host_offload=False)
        assert memory_per_device(on_cpu)["total"] == pytest.approx(saved["total"])
        assert host_memory_per_device(on_cpu) == 0


@pytest.mark.numerics
@pytest.mark.parametrize("remat", ["qkv_proj_offloaded", "input_qkv_offloaded"])
def test_offloading_policies_train_like_one_device(remat):
    """3 AdamW steps of the tiny transformer on fsdp=2, tensor=2 (8 emulated CPU devices) with an offloading policy:
    within tests/test_pipeline.assert_matches of one device without remat (the offload moves residuals, it
    computes nothing else)."""
    from tests.helpers import TF_BATCH, TINY_TF, assert_matches, one_device, run_steps

    assert_matches(*run_steps(TINY_TF, "fsdp=2,tensor=2", TF_BATCH, remat=remat), one_device(TINY_TF, TF_BATCH))


def _offload_reports():
    """check of TPU_OFFLOAD_GRID's two rows (the reports come from $VERIFY_CHECK_CACHE after the first test) and the
    host bytes the closed form moves off the device for each."""
    from verify.check import check, grid_workload
    from verify.grids import TPU_OFFLOAD_GRID

    reps, host = {}, {}
    for devices, cfg, mesh, batch, remat, step, schedule in TPU_OFFLOAD_GRID:
        w = grid_workload(cfg, mesh, batch, remat, step, schedule)
        reps[remat], host[remat] = check(w, devices), host_memory_per_device(w)
    return reps, host


@pytest.mark.grid
@pytest.mark.tpu
def test_offloading_policy_on_v5p_ahead_of_time():
    """jax 0.10.2's save_and_offload_only_these_names compiled for tpu:v5p:2x2x2 (verify.grids.TPU_OFFLOAD_GRID: the
    4096-wide transformer, 4 layers, fsdp=2, tensor=4, 8 sequences of 4096, flash): XLA:TPU places the offloaded
    q, k, v in pinned host memory and the device's peak falls from save_qkv_proj's (which keeps them in HBM) by
    the offloaded bytes, 4 layers of 2·16384·128·48/4 = 50,331,648 B = 201,326,592 B (compiled 3.5925 - 3.3912 GB
    = 201,295,360 B), within 2%; FLOPs, arguments and collectives in their bands (the offloaded program's dead first-
    layer input gradient: scaling.families.transformer.first_layer_dx_dead)."""
    reps, host = _offload_reports()
    for remat, rep in reps.items():
        assert 0.99 <= rep.flops.matmul.ratio <= 1.01 and 0.99 <= rep.memory.arguments.ratio <= 1.01, remat
        assert 0.98 <= rep.collectives.total_bytes.ratio <= 1.02, (remat, rep.collectives.total_bytes)
    assert host["qkv_proj_offloaded"] == 4 * 2 * 16384 * 128 * 48 // 4 and host["save_qkv_proj"] == 0
    base, peak = reps["save_qkv_proj"].memory.peak, reps["qkv_proj_offloaded"].memory.peak
    assert base.closed_form - peak.closed_form == pytest.approx(host["qkv_proj_offloaded"], rel=1e-9)
    assert base.compiled - peak.compiled == pytest.approx(host["qkv_proj_offloaded"], rel=0.02)


@pytest.mark.grid
@pytest.mark.tpu
@pytest.mark.xfail(strict=True, reason="a residual attributed, not modelled: both programs peak 451.3 MB under the "
                                       "closed form (0.888 and 0.883), its layer phase not the attention backward's "
                                       "(docs/findings.md, 'The offloading policies' peaks')")
def test_offloading_policies_peak_in_band_on_v5p():
    """Both programs' peaks within ±10% of the closed form. Failing where this test was found failing (the main of
    2026-11-28, 4e1c667, before issue 49's changes: the band had left make test and nothing ran it): compiled
    3,592,522,336 B against 4,043,833,344 (save_qkv_proj) and 3,391,226,976 against 3,842,506,752. Strict: the day
    the residual is modelled, this test fails until the mark goes."""
    reps, _ = _offload_reports()
    for remat, rep in reps.items():
        assert 0.90 <= rep.memory.peak.ratio <= 1.10, (remat, rep.memory.peak)


@pytest.mark.compiles
def test_xla_cpu_keeps_offloaded_residuals_in_device_memory():
    """On XLA:CPU (jax 0.10.2) the offloading policies compile (the CPU device lists a pinned_host memory) but
    change nothing: the program's temporaries are save_qkv_proj's to the byte and it reports no host memory (host
    and device memory are one), which is why check tells the closed form host_offload=False on a cpu:N mesh."""
    from ffn_model.compile import abstract_compile
    from mesh import make_mesh

    tf = get_preset("tiny-tf").replace(kv_heads=4)
    spec = "fsdp=2,tensor=2"
    mesh = make_mesh(spec, jax.devices()[:4])
    temp = {}
    for remat in ("save_qkv_proj", "qkv_proj_offloaded", "input_qkv_offloaded"):
        ma = abstract_compile(Workload(tf, parse_mesh_spec(spec), 8 * tf.seq_len, remat=remat), mesh).compiled
        ma = ma.memory_analysis()
        temp[remat] = ma.temp_size_in_bytes
        assert ma.host_temp_size_in_bytes == 0
    assert temp["qkv_proj_offloaded"] == temp["save_qkv_proj"]
    assert temp["input_qkv_offloaded"] == temp["save_qkv_proj"]
