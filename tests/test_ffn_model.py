"""ffn_model: sharded training equals one device, the loss falls, the abstract compile of the full
XXL stores 12 bytes/param/N, and weights and their gradients cross the network as BF16."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import one_device

from jax_scaling.cli import main
from ffn_model.compile import abstract_compile
from ffn_model.sharded import to_bf16
from ffn_model.train import train
from mesh import make_mesh, mesh_shape
from scaling.families.ffn import FFNConfig
from scaling.core.mesh_shape import MeshShape
from scaling.families.presets import PRESETS
from scaling.core.workload import Workload
from verify.hlo import read_compiled

TINY = PRESETS["tiny"]  # D=64, F=256, L=3 (odd: every-second remat has a leftover block)
XXL = PRESETS["xxl"]  # D=16384, F=53248, L=126
# P = 2·D·F·L = 2·16384·53248·126 = 219,848,638,464 parameters. Stored between steps: fp32 master
# (4 B) + Adam mu and nu (4 B each) = 12 B/param, plus a 4-byte int32 step count. On N = 64
# devices: 12·P/64 = 41,221,619,712 bytes per device.
XXL_STATE_BYTES_PER_DEVICE_64 = 41_221_619_712
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def compile_on(cfg, mesh, batch_tokens, remat="none", step="train"):
    """abstract_compile of the workload (cfg, the mesh's shape, B, step, remat) on ``mesh``."""
    return abstract_compile(Workload(cfg, mesh_shape(mesh), batch_tokens, step, remat), mesh)


@pytest.fixture(scope="module")
def reference_run():
    """3 steps of the tiny stack on one device."""
    return one_device(TINY, 64)


@pytest.mark.numerics
@pytest.mark.parametrize("spec", ["fsdp=8", "tensor=8", "fsdp=4,tensor=2", "data=2,fsdp=2,tensor=2"])
def test_sharded_training_matches_one_device(reference_run, spec):
    ref_losses, ref_params = reference_run
    lr, steps = 1e-3, 3
    m = make_mesh(spec, "cpu:8")
    losses, state = train(Workload(TINY, mesh_shape(m), 64), m, steps, lr=lr, return_state=True)
    # Tolerance. Sharding changes only the order of reductions (partial sums over tensor, gradient
    # sums over data·fsdp), each of which may round differently in BF16 (relative step 2^-8). The
    # loss is a mean over B·D squared errors, so those roundings mostly average out: we allow 2^-7
    # relative (two BF16 ulps; measured <= 3e-4 on XLA:CPU).
    np.testing.assert_allclose(losses, ref_losses, rtol=2**-7)
    # Parameters: Adam divides each gradient by its own magnitude, so a gradient element near zero
    # can change sign under a different rounding and its update by up to 2·lr per step: every
    # element must stay within 2·steps·lr, and on average the parameters may differ by far less than
    # one step (mean |diff| < 0.05·lr; measured <= 0.004·lr).
    for name, ref in ref_params.items():
        got = np.asarray(state["params"][name])
        assert got.dtype == np.float32 and got.shape == ref.shape
        diff = np.abs(got - ref)
        assert diff.max() <= 2 * steps * lr, (name, diff.max())
        assert diff.mean() <= 0.05 * lr, (name, diff.mean())
    # the state keeps its sharding (out_shardings pinned): W_in and W_out [L,F,D] split L over stage, F over
    # tensor, D over fsdp
    assert state["params"]["w_in"].sharding.spec == jax.sharding.PartitionSpec("stage", "tensor", "fsdp")
    assert state["opt"][0].mu["w_out"].sharding.spec == jax.sharding.PartitionSpec("stage", "tensor", "fsdp")


@pytest.mark.numerics
def test_loss_falls_and_remat_policies_agree():
    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    losses = train(Workload(TINY, mesh_shape(m), 128), m, 50, lr=3e-3)
    assert len(losses) == 50 and all(np.isfinite(losses))
    # random teacher, student starts near the unit-variance output: loss ~2 at step 0
    assert losses[0] > 1.0
    assert np.mean(losses[-5:]) < 0.25 * losses[0], losses[::10]
    # remat changes what is saved for backward, not the maths
    base = train(Workload(TINY, mesh_shape(m), 128, remat="none"), m, 3)
    for remat in ("full", "every-second"):
        np.testing.assert_allclose(train(Workload(TINY, mesh_shape(m), 128, remat=remat), m, 3), base, rtol=2**-7)


def test_to_bf16_rounds_like_astype():
    x = jax.random.normal(jax.random.key(1), (4096,), jnp.float32) * jnp.logspace(-20, 20, 4096)
    x = jnp.concatenate([x, jnp.array([0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, jnp.inf, -jnp.inf])])
    np.testing.assert_array_equal(np.asarray(to_bf16(x)).view(np.uint16),
                                  np.asarray(x.astype(jnp.bfloat16)).view(np.uint16))


def _collectives(hlo: str):
    """(op, [(dtype, dims), ...]) for every all-gather / reduce-scatter / all-reduce / collective-permute."""
    out = []
    for line in hlo.splitlines():
        m = re.search(r"= (.+?) (all-gather|reduce-scatter|all-reduce|collective-permute)(-start|-done)?\(", line)
        if m:
            arrays = [(dt, tuple(int(d) for d in dims.split(",") if d))
                      for dt, dims in re.findall(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]", m.group(1))]
            out.append((m.group(2), arrays))
    return out


def _weight_collectives(hlo: str, D: int, F: int):
    """Collectives whose arrays have the weight's shape or a shard of it: last two dims are
    (D/i, F/j) or (F/j, D/i) for shard counts i, j in 1, 2, 4, ..., 64."""
    ds = {D // k for k in (1, 2, 4, 8, 16, 32, 64)}
    fs = {F // k for k in (1, 2, 4, 8, 16, 32, 64)}
    weighty = lambda dims: len(dims) >= 2 and ((dims[-2] in ds and dims[-1] in fs) or  # noqa: E731
                                               (dims[-2] in fs and dims[-1] in ds))
    return [(op, dt) for op, arrays in _collectives(hlo) for dt, dims in arrays if weighty(dims)]


@pytest.mark.compiles
def test_weight_collectives_are_bf16_before_partitioning():
    """XLA:CPU runs every collective in f32 (it has no bf16 collectives), so on CPU check the program
    handed to the partitioner: each weight is resharded (gathered / reduce-scattered) as BF16."""
    cfg = FFNConfig(d_model=256, d_ff=1536, blocks=2)
    res = compile_on(cfg, make_mesh("data=2,fsdp=2,tensor=2", "cpu:8"), 2560)
    text = res.lowered.as_text()
    resharded = re.findall(r"sdy.sharding_constraint \S+ <@mesh, (.*)> : tensor<([0-9x]+)x([a-z0-9]+)>", text)
    weights = [(spec, dt) for spec, dims, dt in resharded
               if sorted(int(d) for d in dims.split("x")) == [256, 1536]]
    gathered = [dt for spec, dt in weights if "fsdp" not in spec]  # W_in, W_out: forward, backward
    scattered = [dt for spec, dt in weights if "fsdp" in spec]  # their gradients, back to the shard
    assert len(gathered) >= 4 and len(scattered) >= 2, resharded
    assert set(gathered) == set(scattered) == {"bf16"}, weights


@pytest.mark.tpu
@pytest.mark.parametrize("spec", ["fsdp=4,tensor=2", "data=2,fsdp=2,tensor=2"])
def test_weight_collectives_are_bf16_on_tpu(spec):
    # D=256, F=1536, per-device tokens 640: no activation has a weight-like shape.
    cfg = FFNConfig(d_model=256, d_ff=1536, blocks=4)
    res = compile_on(cfg, make_mesh(spec, "tpu:v5p:2x2x2"), 2560)
    found = _weight_collectives(res.compiled.as_text(), 256, 1536)
    gathers = [dt for op, dt in found if op == "all-gather"]
    grads = [dt for op, dt in found if op != "all-gather"]
    assert len(gathers) >= 4, found  # W_in, W_out in forward and again in backward
    assert grads, found  # the weight-gradient reduction (reduce-scatter, or all-reduce + slice)
    assert set(gathers) == set(grads) == {"bf16"}, found


def _check_xxl_arguments(memory: dict, compile_seconds: float):
    args = memory["argument_bytes"]
    # arguments = state (12·P/N + 4) + the batch (x bf16 + y fp32: 6·D·B/16 = 157 MB): within 1%
    assert abs(args / XXL_STATE_BYTES_PER_DEVICE_64 - 1) < 0.01, args
    assert args > XXL_STATE_BYTES_PER_DEVICE_64
    # the updated state is donated: outputs alias the inputs
    assert memory["alias_bytes"] >= XXL_STATE_BYTES_PER_DEVICE_64
    assert compile_seconds < 60


@pytest.mark.compiles
@pytest.mark.processes
def test_xxl_abstract_compile_cpu64_subprocess():
    """The full XXL on 64 emulated CPU devices (a fresh process: this one has 8), through the CLI."""
    cmd = [sys.executable, "-m", "ffn_model", "compile", "--preset", "xxl", "--devices", "cpu:64",
           "--mesh", "fsdp=16,tensor=4", "--batch-tokens", "25600", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    assert rep["platform"] == "cpu" and rep["mesh"] == {
        "data": 1, "stage": 1, "fsdp": 16, "context": 1, "expert": 1, "tensor": 4}
    assert set(rep["memory"]) >= {"argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes"}
    assert rep["cost"]["flops"] > 0
    _check_xxl_arguments(rep["memory"], rep["compile_seconds"])


@pytest.mark.tpu
def test_xxl_abstract_compile_tpu_v5p_4x4x4():
    m = make_mesh("fsdp=16,tensor=4", "tpu:v5p:4x4x4")
    res = compile_on(XXL, m, 25600)
    memory = read_compiled(res.compiled, dict(mesh_shape(m))).memory
    _check_xxl_arguments(memory, res.compile_seconds)
    # peak: 16·P/N = 54.96 GB + saved x and h (2·1600·(16384 + 13312)·126 = 11.97 GB) + gathered
    # weights; it must fit a v5p chip's 95 GB and cannot be below the 16 B/param state alone.
    assert 16 * XXL.params / 64 < memory["peak_bytes"] < 95e9
    found = _weight_collectives(res.compiled.as_text(), 16384, 53248)
    assert [dt for op, dt in found if op == "all-gather"] and {dt for _, dt in found} == {"bf16"}, found


@pytest.mark.compiles
def test_forward_step_compiles():
    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    got = read_compiled(compile_on(TINY, m, 256, step="forward").compiled, dict(mesh_shape(m)))
    # forward-only arguments: fp32 params 4·P/N (P = 2·64·256·3 = 98,304 -> 49,152 B) + batch
    # (x bf16 + y fp32 = 6·64·256/4 = 24,576 B)
    assert got.memory["argument_bytes"] == 49_152 + 24_576
    assert got.cost["flops"] > 0


def test_bad_inputs_raise():
    m = make_mesh("fsdp=8", "cpu:8")
    with pytest.raises(ValueError, match="d_model=60 is not divisible by the fsdp shard count 8"):
        compile_on(FFNConfig(60, 256, 2), m, 64)
    with pytest.raises(ValueError, match="batch_tokens=100 is not divisible"):
        compile_on(TINY, m, 100)
    with pytest.raises(ValueError, match="remat"):
        compile_on(TINY, m, 64, remat="half")
    with pytest.raises(ValueError, match="step"):
        compile_on(TINY, m, 64, step="backward")
    with pytest.raises(ValueError, match="the workload's mesh is fsdp=4, the devices' mesh fsdp=8"):
        abstract_compile(Workload(TINY, MeshShape(fsdp=4), 64), m)


@pytest.mark.parametrize("argv, match", [
    (["train", "--devices", "cpu:8", "--mesh", "experts=8"], "unknown mesh axis 'experts'"),
    (["train", "--devices", "cpu:8", "--mesh", "expert=8"], "expert=8: the FFN stack has no experts"),
    (["train", "--devices", "cpu:8", "--mesh", "fsdp=3"], "3 devices"),
    (["train", "--devices", "cpu:8", "--mesh", "fsdp=8", "--preset", "tiny", "--d-model", "60"], "not divisible"),
    (["compile", "--devices", "cpu:8", "--mesh", "fsdp=8", "--preset", "huge"], "unknown preset 'huge'"),
    (["train", "--devices", "cpu:8", "--remat", "half"], "invalid choice"),
    (["train", "--devices", "cpu:8", "--steps", "0"], "--steps must be a positive integer"),
])
def test_cli_errors_exit_2_with_one_line(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        sys.exit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr()
    assert err.out == ""
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and re.search(match, lines[0]), err.err


@pytest.mark.compiles
@pytest.mark.processes
def test_cli_train_json_subprocess():
    cmd = [sys.executable, "-m", "ffn_model", "train", "--preset", "tiny", "--mesh", "fsdp=4,tensor=2",
           "--devices", "cpu:8", "--steps", "3", "--batch-tokens", "64", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    assert len(rep["losses"]) == 3 and rep["losses"][2] < rep["losses"][0]
    assert len([line for line in out.stderr.splitlines() if line.startswith("step")]) == 3  # progress on stderr


@pytest.mark.compiles
@pytest.mark.processes
def test_bench_reports_step_time_flops_and_mfu(capsys):
    argv = ["bench", "--preset", "tiny", "--devices", "cpu:8", "--mesh", "fsdp=4,tensor=2", "--batch-tokens", "256",
            "--steps", "3", "--warmup", "1"]
    assert main([*argv, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    # matmul FLOPs from the dims (D=64, F=256, L=3, B=256): the model's 6·P·B − 2·B·D·F (block 0 needs
    # no dx), and the program executes block 0's dx too (a scan of 3 trips runs the same body)
    D, F, L, B = 64, 256, 3, 256
    model = 6 * (2 * D * F * L) * B - 2 * B * D * F
    assert rep["flops"] == {"model": model, "executed": model + 2 * B * D * F}
    assert len(rep["step_seconds_all"]) == 3 and rep["step_seconds"] == sorted(rep["step_seconds_all"])[1]
    assert rep["tflops_per_s"] == pytest.approx((model + 2 * B * D * F) / rep["step_seconds"] / 1e12)
    assert rep["tflops_per_s_per_device"] == pytest.approx(rep["tflops_per_s"] / 8)
    assert rep["chip"] is None and rep["mfu"] is None and rep["predicted"] is None  # CPU: no peak FLOP/s

    assert main([*argv, "--chip", "v5p", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    C = 4.59e14  # v5p bf16 FLOP/s per chip
    assert rep["chip"] == "v5p" and rep["mfu"] == pytest.approx(model / (rep["step_seconds"] * 8 * C))
    assert rep["hfu"] == pytest.approx((model + 2 * B * D * F) / (rep["step_seconds"] * 8 * C))
    p = rep["predicted"]
    assert p["math"] == pytest.approx((model + 2 * B * D * F) / 8 / C)
    assert set(p["comms"]) == {"fsdp", "tensor"} and p["step_sum"] >= p["step_max"] >= p["math"]

    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "MFU         n/a" in text and "predicted   n/a (no chip: pass --chip)" in text
