"""A quantized step (--dtype int8 / fp8) as MaxText's and Transformer Engine's run it (scaling.step.kernels.
matmul_dtype, quantize_kernels), splash's fused backward and blocks, the save_qkv_context policy and the TPU topology
slice names: each held to a hand count or the compiler."""

import contextlib
import io
import json

import pytest

from jax_scaling.cli import main
from scaling.hardware.chips import get_chip, parse_slice
from scaling.reports.predict import predict_setup
from scaling.step import kernels
from scaling.step.kernel import Kernel


def _predict(*args):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["predict", *args, "--json"]) == 0
    return json.loads(buf.getvalue())


def _k(name, kind="matmul"):
    return Kernel(name, "backward", kind, (8, 8, 8, 1), 1, 0.0, 0.0)


def test_which_gemms_run_in_eight_bits():
    """The layers' weight GEMMs in every pass run in the step's 8-bit type; attention, the logits and the router stay
    in bf16 (MaxText's fp8_full and AQT int8 quantize the dense layers' dot_generals); a bf16 or fp32 step is every
    matmul's type."""
    for name in ("qkv", "qkv.dx", "out.dw", "mlp_in", "mlp_out.dx", "w_in.dw", "expert_in", "shared_out.dx"):
        assert kernels.matmul_dtype(_k(name), "fp8") == "fp8", name
        assert kernels.matmul_dtype(_k(name), "int8") == "int8", name
    for name in ("logits", "logits.dw", "router", "dispatch", "combine.dy"):
        assert kernels.matmul_dtype(_k(name), "fp8") == "bf16", name
    assert kernels.matmul_dtype(_k("attention", "attention"), "int8") == "bf16"
    assert kernels.matmul_dtype(_k("attention", "attention"), "fp32") == "fp32"
    assert kernels.matmul_dtype(_k("qkv"), "bf16") == "bf16"


def test_quantize_bytes_by_hand():
    """xxl-2 on 8 v5p devices, fsdp=8, 65,536 tokens: each device's forward w_in call is [8192, 16384]·[16384,
    53248]; its quantization reads both operands in bf16 and writes them in one byte: 3·(8192·16384 + 16384·53248)
    = 3,019,898,880 B a call, 2 calls (2 blocks). A bf16 step has no such kernel, and an int8 step's activations and
    weight gathers stay in 16 bits (the step's memory is bf16's)."""
    s = predict_setup("xxl-2", mesh="fsdp=8", chip="v5p", chips=8, batch_tokens=65536, dtype="int8")
    ks = {(k.name, k.pass_): k for k in kernels.step_kernels(s.workload, s.chip, "int8")}
    q = ks[("quantize.w_in", "forward")]
    assert q.calls == 2 and q.bytes == pytest.approx(2 * 3 * (8192 * 16384 + 16384 * 53248), rel=1e-12)
    assert q.kind == "pointwise" and q.flops == 0
    assert s.workload.precision.compute == 2 and s.workload.precision.weight_comm == 2
    b = predict_setup("xxl-2", mesh="fsdp=8", chip="v5p", chips=8, batch_tokens=65536)
    assert not [k for k in kernels.step_kernels(b.workload, b.chip, "bf16") if k.name.startswith("quantize")]
    # the step's compute term is its kernels' sum, made a dtype at a time (compute_term)
    assert kernels.compute_term(s.workload, s.chip, "int8") == pytest.approx(
        kernels.compute_seconds(kernels.step_kernels(s.workload, s.chip, "int8")), rel=1e-12)


def test_fp8_prices_attention_in_bf16():
    """llama3.1-70b on a TPU7x 4x4x4 slice: the fp8 step's attention kernels take the bf16 peak (2.307e15 / 2 a
    device) and its mlp_in GEMM the fp8 one (4.614e15 / 2): their math seconds are FLOPs / (peak · efficiency)."""
    out = _predict(*("--preset llama3.1-70b --slice tpu7x-4x4x4 --mesh fsdp=128 --global-batch 256 --remat full "
                     "--attention splash --dtype fp8 --kernels").split())
    ks = {(k["name"], k["pass"]): k for k in out["kernels"]}
    att, mlp = ks[("attention", "forward")], ks[("mlp_in", "forward")]
    assert att["seconds"] == pytest.approx(att["flops"] * att["executed"] / (2.307e15 / 2 * att["efficiency"]),
                                           rel=1e-6)
    assert mlp["seconds"] == pytest.approx(mlp["flops"] / (4.614e15 / 2 * mlp["efficiency"]), rel=1e-6)


def test_topology_slice_names():
    """GKE's and XPK's accelerator types: tpu7x-4x4x4 is 64 TPU7x chips in a 4x4x4 cube, v6e-16x16 256 v6e chips;
    a topology of the wrong rank is refused in one line."""
    chip, dims = parse_slice("tpu7x-4x4x4")
    assert chip is get_chip("TPU7x") and dims == (4, 4, 4)
    chip, dims = parse_slice("v6e-16x16")
    assert chip is get_chip("v6e") and dims == (16, 16)
    with pytest.raises(ValueError, match="3 dimensions"):
        parse_slice("tpu7x-4x4")


def test_splash_fused_backward_units():
    """splash's backward: a dq and a dkv kernel each recompute s and dp (14 units of s·T²·N·H/(Y·C) FLOPs); the fused
    kernel recomputes them once (10): the backward attention FLOPs fall by 4/14; the forward's do not move. Refused
    beside any other attention."""
    base = ("--preset llama3.1-8b --slice v6e-16 --mesh fsdp=16 --global-batch 16 --remat full --attention splash "
            "--kernels").split()

    def attention(out, pass_):
        return sum(k["flops"] for k in out["kernels"] if k["name"] == "attention" and k["pass"] == pass_)
    sep, fused = _predict(*base), _predict(*base, "--splash-fused-backward")
    assert attention(fused, "backward") == pytest.approx(attention(sep, "backward") * 10 / 14, rel=1e-12)
    assert attention(fused, "forward") == pytest.approx(attention(sep, "forward"), rel=1e-12)
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        assert main(["predict", *[a if a != "splash" else "flash" for a in base], "--splash-fused-backward"]) == 2
    assert "splash_fused_backward is splash's" in buf.getvalue()


@pytest.mark.compiles
def test_save_qkv_context_flops_are_the_compilers():
    """MaxText's custom policy of its TPU7x recipes (q, k, v and the attention's output kept): the compiled
    program's matmul FLOPs (8 CPU devices, as every in-process check asks, the package's flash attention) are the
    closed form's, and below save_qkv_proj's by the attention's recomputed forward."""
    flops = {}
    for remat in ("save_qkv_context", "save_qkv_proj"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["check", *"--preset small-tf --devices cpu:8 --mesh fsdp=8 --batch 2048 --attention flash "
                         "--json --remat".split(), remat]) == 0
        row = json.loads(buf.getvalue())["flops"]["matmul"]
        assert row["ratio"] == pytest.approx(1.0, abs=1e-4), remat
        flops[remat] = row["compiled"]
    assert flops["save_qkv_context"] < flops["save_qkv_proj"]


def test_tpu7x_held_out_runs_within_the_issues_bounds():
    """The dense Ironwood runs of tpu-recipes (bf16 and fp8_full, 8k and 128k tokens, 70B and 405B), TPU7x's eta
    fitted on one of them (its hardware-table row names it): the others held out, median |error| <= 5% and max <=
    15% (issue 51's bounds for the TPU runs the package had not seen). The MoE run of the same table (Qwen3,
    "7x-qwen3") is issue 52's, not held here (docs/findings.md: -28.0%, named)."""
    from statistics import median

    from scaling.reports.validate import validate

    rows = [r for r in validate()["rows"] if r["table"] == "ironwood" and r["compare"] != ["7x-qwen3"]]
    held = [abs(r["error"]) for r in rows if not r["fitted"]]
    assert len(rows) == 8 and len(held) == 7
    assert median(held) <= 0.05 and max(held) <= 0.15, held
