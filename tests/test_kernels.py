"""The step model's kernels (scaling.step.kernels): their sums are the step's terms, their FLOPs the program's count,
and the quantization of a shape is the hand calculation of the Scaling Book's MXU and NVIDIA's tile/wave rules."""

import json

import pytest

from scaling.step import kernels
from scaling.families.presets import PRESETS
from scaling.core.schedule import Schedule
from scaling.hardware.chips import get_chip
from scaling.core.workload import Workload
from jax_scaling.cli import main


def _predict_json(*args):
    import contextlib
    import io

    from jax_scaling.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["predict", *args, "--json"]) == 0
    return json.loads(buf.getvalue())


ROWS = [  # (model and hardware flags): a TPU FSDP row, a GPU pipeline with tensor parallelism, a materialized one
    "--preset llama2-70b --slice v6e-256 --mesh fsdp=256 --global-batch 512 --remat save_qkv_proj --attention flash",
    "--preset llama2-7b --chip H100 --chips 16 --mesh data=2,stage=2,tensor=4 --global-batch 64 --microbatch 2 "
    "--schedule 1f1b --remat full --attention cudnn",
    "--preset gpt3-175b --d-model 2304 --heads 24 --kv-heads 24 --head-dim 96 --d-ff 9216 --blocks 24 --vocab 51200 "
    "--chip A100-80GB --chips 32 --mesh data=32 --global-batch 512 --remat full",
]


@pytest.mark.parametrize("row", ROWS, ids=["v6e-fsdp", "h100-1f1b", "a100-materialized"])
def test_kernel_sums_are_the_step_terms(row):
    """predict --kernels: the kernels' seconds add up to the compute term the scheduled step is built from, and the
    matmul kernels' FLOPs to the program's executed FLOPs (transformer.step_flops, what `check` holds against the
    compiler): every matmul of the step is in the list, once."""
    out = _predict_json(*row.split(), "--kernels")
    ks, chip = out["kernels"], get_chip(out["chip"])
    # each kernel's seconds from its own printed fields: max(FLOPs·executed/(C·efficiency), bytes/W_hbm), the
    # efficiency by hand for the matmuls' shapes (shape_efficiency), pointwise work at the HBM bandwidth; a GPU's
    # matmuls add t_fixed per call (its kernel table's, scaling.step.kernels.gemm_coefficients; a TPU's is 0)
    fixed = kernels.gemm_coefficients(chip, "bf16").t_fixed if chip.kind == "gpu" else 0.0
    # a GPU's non-matmul kernels (issue 38): its launches at the kernel table's pointwise bandwidth for their size
    # (kernels.pointwise_seconds; per layer-pass forward 2 norms + 2 residual adds + the activation, + the softmax
    # where attention is materialized; a backward twice that; AdamW 3 launches; one per accumulation), and a flash
    # attention the cuDNN rows (kernels.attention_table_seconds; tests/test_step_terms.py checks both by hand)
    flash = "--attention materialized" not in row  # a blockwise kernel: splash (v6e), cuDNN (H100)
    cudnn = chip.kernel_table is not None and "cudnn" in chip.kernel_table.attention
    fwd = 2 + 2 + 1 + (0 if flash else 1)
    launches = {"forward": fwd, "backward": 2 * fwd, "recompute": fwd}
    by_hand = []
    for k in ks:
        memory = k["bytes"] / chip.device_hbm_bw
        if k["shape"] is None:
            if chip.kind == "gpu":
                n = 3 if k["name"] == "adamw" else k["calls"] * (launches[k["pass"]] if k["name"] == "pointwise"
                                                                 else 1)
                by_hand.append(float(kernels.pointwise_seconds(chip, k["bytes"], n)))
            else:
                by_hand.append(memory)
            continue
        if k["kind"] == "attention" and chip.kind == "gpu" and flash and cudnn:
            by_hand.append(float(kernels.attention_table_seconds(chip, kernels.Kernel(
                k["name"], k["pass"], k["kind"], tuple(k["shape"]), k["calls"], k["flops"], k["bytes"]))))
            continue
        eff = float(kernels.shape_efficiency(chip, *k["shape"]))
        assert k["efficiency"] == pytest.approx(eff, rel=1e-12)
        by_hand.append(fixed * k["calls"] + max(k["flops"] * k["executed"] / (chip.device_flops * eff), memory))
    assert [k["seconds"] for k in ks] == pytest.approx(by_hand, rel=1e-12)
    # their sum is the compute term the step is built from, their FLOPs the program's (what check holds)
    assert sum(by_hand) == pytest.approx(out["terms"]["compute"], rel=1e-12)
    assert sum(k["flops"] for k in ks) == pytest.approx(out["flops"]["total"], rel=1e-9)
    # the scheduled step: max(compute, hidden collectives) + exposed collectives + loop copies
    exposed = sum(v for k, v in out["terms"].items() if k.startswith("exposed."))
    assert out["step_seconds"] >= out["terms"]["compute"] + exposed + out["terms"]["loop_copies"] - 1e-12


def test_hierarchical_tiles_by_hand():
    """DeepFlow's tiles (seed 002's model) through the chip's on-chip memory, 2-byte operands: A100's 40 MiB L2 takes
    tiles of 2^⌊log2 √(41,943,040/6)⌋ = 2^⌊log2 2643.9⌋ = 2048, v5e's 128 MiB VMEM 2^⌊log2 4729.6⌋ = 4096. On A100,
    [16384, 4096]·[4096, 12288] (k > 2048): the left operand read ⌈12288/2048⌉ = 6 times, the right ⌈16384/2048⌉ = 8,
    the output once; [4096, 2048]·[2048, 11008] (k ≤ 2048): the left once, the right ⌈4096/2048⌉ = 2 times."""
    a100, v5e = get_chip("A100-80GB"), get_chip("v5e")
    assert kernels.tiled_bytes(a100, 16384, 12288, 4096, 1, 2) == 2 * (16384 * 4096 * 6 + 4096 * 12288 * 8
                                                                        + 16384 * 12288)
    assert kernels.tiled_bytes(a100, 4096, 11008, 2048, 1, 2) == 2 * (4096 * 2048 + 2048 * 11008 * 2 + 4096 * 11008)
    # v5e: 4096 tiles, so the same first product reads its operands ⌈12288/4096⌉ = 3 and ⌈16384/4096⌉ = 4 times
    assert kernels.tiled_bytes(v5e, 16384, 12288, 4096, 1, 2) == 2 * (16384 * 4096 + 4096 * 12288 * 4
                                                                       + 16384 * 12288)
    with pytest.raises(ValueError, match="on-chip memory"):  # B200: no L2 size in the table
        kernels.tiled_bytes(get_chip("B200"), 16384, 12288, 4096, 1, 2)


def test_hierarchical_kernels_sum_to_the_step_terms():
    """predict --kernel-model hierarchical --kernels: each matmul's bytes are its tiles' (× calls), its efficiency
    the chip's eta unquantized, its seconds the roofline of those; the kernels sum to the compute term."""
    out = _predict_json(*ROWS[1].split(), "--kernels", "--kernel-model", "hierarchical")
    chip = get_chip(out["chip"])
    assert out["kernel_model"] == "hierarchical"
    total = 0.0
    for k in out["kernels"]:
        if k["kind"] == "matmul":
            m, n, kk, b = k["shape"]
            assert k["bytes"] == pytest.approx(float(kernels.tiled_bytes(chip, m, n, kk, b, 2)) * k["calls"])
            g = kernels.gemm_coefficients(chip, "bf16")  # a GPU: its kernel table's ceiling and t_fixed
            assert k["efficiency"] == g.ceiling
            assert k["seconds"] == pytest.approx(g.t_fixed * k["calls"] + max(
                k["flops"] * k["executed"] / (chip.device_flops * g.ceiling), k["bytes"] / chip.device_hbm_bw),
                rel=1e-12)
        total += k["seconds"]
    assert total == pytest.approx(out["terms"]["compute"], rel=1e-12)
    b200 = "--preset llama2-7b --chip B200 --chips 8 --mesh data=8 --global-batch 64 --kernel-model hierarchical"
    assert main(["predict", *b200.split()]) == 2  # B200: no L2 size in the table, one error line


def test_mxu_quantization_by_hand():
    """TPU: the MXU takes k and n in whole a×a tiles (Scaling Book, TPU page). Attention's q·kᵀ with head_dim 128 on
    v6e's 256-wide MXU fills half of it; on v5p's 128-wide it fills it. k = 150 on v5p: 150/256 of two tiles."""
    v6e, v5p = get_chip("v6e"), get_chip("v5p")
    assert kernels.shape_efficiency(v6e, 4096, 4096, 128) == pytest.approx(v6e.matmul_efficiency * 0.5)
    assert kernels.shape_efficiency(v5p, 4096, 4096, 128) == pytest.approx(v5p.matmul_efficiency)
    assert kernels.shape_efficiency(v5p, 4096, 4096, 150) == pytest.approx(v5p.matmul_efficiency * 150 / 256)
    assert kernels.shape_efficiency(v5p, 4096, 200, 256) == pytest.approx(v5p.matmul_efficiency * 200 / 256)


def test_gpu_tile_and_wave_quantization_by_hand():
    """A100, 108 SMs, BLOOM's MLP shard under TP=8 with one sequence: [2048, 14400]·[14400, 1800]. Tiles 256×128:
    8·15 = 120 tiles, 2 waves of 108: 2048·1800/(2·108·256·128) = 0.5208; 128×256: 16·8 = 128, 2 waves, the same;
    128×128: 16·15 = 240 tiles, 3 waves: 2048·1800/(3·108·128·128) = 0.6944, the best. Head dim 150 (k of q·kᵀ) is
    not a multiple of 8 halves: no tensor cores, the fp32 ceiling of the FP32 rate, 19.5/312 (NVIDIA's guide, A100
    datasheet)."""
    a100 = get_chip("A100-80GB")
    eta, fp32 = (kernels.gemm_coefficients(a100, d).ceiling for d in ("bf16", "fp32"))  # the kernel table's ceilings
    assert kernels.shape_efficiency(a100, 2048, 1800, 14400) == pytest.approx(eta * 2048 * 1800 / (3 * 108 * 128 * 128))
    assert kernels.shape_efficiency(a100, 2048, 2048, 150, batch=12) == pytest.approx(fp32 * 19.5 / 312)
    assert kernels.shape_efficiency(a100, 2048, 2048, 144, batch=12) > fp32 * 19.5 / 312  # 13824/96 = 144: aligned


def test_flash_runs_its_causal_blocks_and_moves_no_scores():
    """Under flash the attention kernel runs (n_b + 1)/(2·n_b) of the program's units (T = 4096, blocks of 512:
    n_b = 8, 9/16) and moves q, k, v and o, not the T² scores; materialized, it runs them all and moves the scores."""
    cfg = PRESETS["llama2-7b"]
    w = Workload(cfg, {"fsdp": 8}, 8 * 4096, remat="full", schedule=Schedule(attention="flash"))
    att = [k for k in kernels.step_kernels(w) if k.kind == "attention"]
    assert att and all(k.executed == pytest.approx(9 / 16) for k in att)
    fwd = next(k for k in att if k.pass_ == "forward")
    T, H, N = cfg.seq_len, cfg.head_dim, cfg.heads
    assert fwd.bytes == pytest.approx(2 * cfg.blocks * 1 * T * H * 4 * N)  # c·L·(q, k, v, o) of 1 sequence, N heads
    m = Workload(cfg, {"fsdp": 8}, 8 * 4096, remat="full")
    fm = next(k for k in kernels.step_kernels(m) if k.kind == "attention" and k.pass_ == "forward")
    assert fm.executed == 1.0 and fm.bytes > T * T * N * cfg.blocks * 2


def test_gradient_accumulation_moves_its_accumulator_per_microbatch():
    """Each microbatch's gradient is added to the FP32 accumulator: read both, write one, 3·4 = 12 B per parameter
    of the device. Llama 2 7B on fsdp=8 with M = 4: 4·12·P/8 B; M = 1: none (the one gradient is the step's).
    With S = 2 stages and 1F1B (R = 1, M = 4): T = M + 2(S − 1) = 6 slots, each adding the stage's P/2."""
    cfg = PRESETS["llama2-7b"]
    P = cfg.params

    def acc(mesh, M, **kw):
        w = Workload(cfg, mesh, 32 * 4096, schedule=Schedule(microbatches=M, **kw))
        return next(k for k in kernels.step_kernels(w) if k.name == "accumulate")

    assert acc({"fsdp": 8}, 4).bytes == pytest.approx(4 * 12 * P / 8)
    assert acc({"fsdp": 8}, 4).calls == 4
    assert acc({"fsdp": 8}, 1).bytes == 0
    assert acc({"stage": 2, "fsdp": 4}, 4, pipeline="1f1b").bytes == pytest.approx(6 * 12 * P / (2 * 4))
    k = next(k for k in kernels.step_kernels(Workload(cfg, {"fsdp": 8}, 32 * 4096, schedule=Schedule(microbatches=4)),
                                              get_chip("H100")) if k.name == "accumulate")
    # on an H100 each of the 4 adds (12·P/8 = 10.1 GB, past the table's largest pointwise row) runs at that row's
    # bandwidth, 4294967296 B / (1.4614 ms − 6.5401 us launch) = 2.95215e12 B/s, plus its launch (H100.toml)
    assert k.seconds == pytest.approx(4 * (6.5401e-6 + 12 * P / 8 / 2.95215e12), rel=1e-5) and k.bound == "HBM"


def test_grad_accumulation_of_each_runtime():
    """--grad-accumulation names whose accumulation the microbatches pay, per parameter and micro-step: Megatron-LM's
    main_grad.add_(grad) reads a 16-bit gradient and reads and writes FP32, 2 + 4 + 4 = 10 B; DeepSpeed's BF16
    optimizer casts the gradient to a temporary (read 2, write 4) and adds it (read 4 + 4, write 4), 18 B; this
    package's FP32 add, 12 B. The same run's accumulate kernel scales by those bytes; nothing else changes."""
    row = "--preset llama2-7b --chip A100-80GB --chips 8 --mesh data=8 --global-batch 64 --microbatch 2".split()
    acc = {}
    for rt in ("package", "megatron", "deepspeed-bf16"):
        out = _predict_json(*row, "--grad-accumulation", rt, "--kernels")
        acc[rt] = next(k for k in out["kernels"] if k["name"] == "accumulate")
        assert acc[rt]["calls"] == 4  # 8 sequences a device in microbatches of 2
    P = PRESETS["llama2-7b"].params
    assert acc["package"]["bytes"] == pytest.approx(4 * 12 * P)  # data=8 holds every parameter
    assert acc["megatron"]["bytes"] == pytest.approx(4 * 10 * P)
    assert acc["deepspeed-bf16"]["bytes"] == pytest.approx(4 * 18 * P)


def test_peak_of_another_dtype_and_a_missing_one():
    """--dtype takes the table's peak: A100 tf32 156 TFLOP/s, H100 fp8 1979; v5e has no fp8 row: one-line error."""
    assert kernels.peak_flops(get_chip("A100-80GB"), "tf32") == 1.56e14
    assert kernels.peak_flops(get_chip("H100"), "fp8") == 1.979e15
    with pytest.raises(ValueError, match="v5e has no fp8 rate"):
        kernels.peak_flops(get_chip("v5e"), "fp8")


def test_predict_kernels_prints_the_breakdown(capsys):
    """predict --kernels prints one line per kernel and the sums per pass, which add up to the compute term."""
    from jax_scaling.cli import main

    assert main(["predict", *ROWS[0].split(), "--kernels"]) == 0
    text = capsys.readouterr().out
    assert "ridge point" in text and "mlp_in.dw" in text and "adamw" in text
    per_pass = text.split("per pass: ")[1]
    parts = [float(x.split()[1]) for x in per_pass.split(";")[0].split(", ")]
    total = float(per_pass.split("compute term ")[1].split()[0])
    assert sum(parts) == pytest.approx(total, rel=1e-3)


def test_dtype_sets_the_peak_the_step_and_mfu_use():
    """--dtype fp8 on an H100: the matmuls run against the fp8 peak (1,979 TFLOP/s dense, NVIDIA's datasheet), the
    activations move 1 byte; MFU is model FLOPs over that peak times the step (not over bf16's 989). The compute
    term follows the fp8 GEMMs measured on the H100 (scaling/data/kernels/H100.toml: XLA's plain fp8 dot reaches
    0.58 of the fp8 peak at 16384³ but no more than bf16's ~0.8·989 at 2048-8192 shapes), not bf16's ceiling at
    twice the peak, which would halve the bf16 matmuls' time."""
    bf16 = _predict_json(*"--preset llama2-7b --chip H100 --chips 8 --mesh fsdp=8 --global-batch 32".split())
    fp8 = _predict_json(*"--preset llama2-7b --chip H100 --chips 8 --mesh fsdp=8 --global-batch 32 --dtype fp8".split())
    assert fp8["mfu"] == pytest.approx(fp8["flops"]["model"] / (1.979e15 * fp8["step_seconds"]), rel=1e-9)
    assert fp8["terms"]["math"] == pytest.approx(fp8["flops"]["total"] / 1.979e15, rel=1e-9)
    assert fp8["terms"]["compute"] > 0.7 * bf16["terms"]["compute"]


def test_kernels_report_of_a_model(capsys):
    """`kernels` with predict's flags: seed 002's report for that model and chip, from predict's own kernels: one
    entry per kernel (its FLOPs and bytes as predict --json gives them), the inflection point C/W_hbm of the chip
    (H100: 9.9e14 / 3.35e12 = 295.52), and the Time line predict's step; --seed with a model is one error line."""
    row = ROWS[1].split()
    out = _predict_json(*row, "--kernels")
    assert main(["kernels", *row]) == 0
    text = capsys.readouterr().out
    assert text.count("inflection_point: 295.52") == len(out["kernels"])
    for k in out["kernels"]:
        assert f"{k['name']} ({k['pass']})" in text and f"flop: {k['flops']:,.0f}, mem: {k['bytes']:,.0f}" in text
    assert f"Time: {out['step_seconds']:.8f}" in text
    assert main(["kernels", "--seed", "002", *row]) == 2
    assert main(["kernels", "--preset", "llama2-7b", "--chip", "H100", "--chips", "8"]) == 2  # no --mesh
    assert main(["kernels", "--preset", "llama2-7b"]) == 2  # a model flag alone: no --mesh, not the seed's report
