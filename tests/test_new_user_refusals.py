"""What a new user met (issue 49, items 2, 5, 9 and 11), each held here:

- item 2: `check --devices gpu:<chip>:<N>` takes its chip from the devices (it compiled, then stopped on "unknown chip
  'gpu'"); a --chip of the other kind is refused before anything compiles; attention auto takes what compiles here
  (flash where cuDNN's fused attention cannot be traced: no CUDA GPU) and says so in one stderr line;
- item 5: train and bench on the host's own devices keep libtpu's start-up lines off stderr (mesh.devices.get_devices
  under native_stderr, as check's TPU topologies);
- item 9: check of a dropless MoE shows its matmul FLOPs without a ratio, "not comparable" (XLA lowers
  jax.lax.ragged_dot to a dense matmul of every row against every local expert);
- item 11: an absurd --gemm, a binary --kernel-table, both batch flags, a mesh of more devices than the chips: one
  line naming the flag, exit 2, nothing on stdout, before jax starts.

Refusals run the console script's main in this process (its CPU seconds timed), and all of them once more in a
fresh process, which must not have imported jax when they are done."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mesh.devices import has_cuda_plugin, has_libtpu
from scaling.hardware.chips import get_chip
from scaling.families.presets import get_preset
from tests.helpers import run_cli as run, refused

ROOT = Path(__file__).resolve().parents[1]
CUDA = pytest.mark.skipif(not has_cuda_plugin(), reason="needs jax's CUDA plugin (the cuda-aot extra; `make answer` "
                          "installs it in .venv/cuda-aot)")




# (argv, words the line holds), each a configuration the issue names or its nearest valid neighbour made bad in one way
PREDICT = ["predict", "--preset", "llama2-7b", "--chip", "H100", "--chips", "8"]
REFUSALS = [
    # item 2: a TPU timing a program compiled for GPUs (before: it compiled, then timed an H100 program as a v5p's)
    (["check", "--devices", "gpu:H100:8", "--mesh", "fsdp=8", "--preset", "tiny", "--batch-tokens", "64", "--chip",
      "v5p"], ("--chip v5p", "GPU")),
    # item 11: [M, K]·[K, N] of 1e8 each in bf16 is 2·3·1e16 B = 6e16 B (60,000,000 GB), against 80 GB on one H100
    # (before: priced at 2.5e15 us); a dimension of 3e9 is past 2^31, every count's rule (before: priced)
    (["kernels", "--gemm", "100000000x100000000x100000000", "--chip", "H100"], ("--gemm", "6e+07 GB", "80 GB")),
    (["kernels", "--gemm", "3000000000x1x1", "--chip", "H100"], ("--gemm", "2^31")),
    # item 11: both batch flags (before: "give the batch: ..." as if neither were given)
    ([*PREDICT, "--mesh", "fsdp=8", "--global-batch", "8", "--batch-tokens", "32768"],
     ("--global-batch 8 and --batch-tokens 32768 both", "not both")),
    (["plan", "--preset", "llama2-7b", "--chip", "H100", "--chips", "8", "--global-batch", "8", "--batch-tokens",
      "32768"], ("--global-batch 8 and --batch-tokens 32768 both",)),
    # item 11: 9 devices on 8 H100s (before: "d_model=4096 is not divisible by the fsdp shard count 9"); predict and
    # kernels (one setup); TPU7x holds 2 devices a chip: 4 chips are 8 devices
    ([*PREDICT, "--mesh", "fsdp=9", "--global-batch", "72"], ("--mesh fsdp=9", "9 devices", "8 H100 chips")),
    (["kernels", *PREDICT[1:], "--mesh", "fsdp=9", "--global-batch", "72"], ("--mesh fsdp=9", "8 H100 chips")),
    (["predict", "--preset", "small", "--chip", "TPU7x", "--chips", "4", "--mesh", "fsdp=4", "--batch-tokens", "4096"],
     ("the mesh has 4 devices", "the hardware has 8", "4 TPU7x chips, 2 devices each")),
]


@pytest.mark.parametrize("argv, words", REFUSALS, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else "")
def test_refused_with_one_line_naming_the_flag(argv, words):
    refused(argv, *words)


def _binary(tmp_path: Path) -> Path:
    """A PNG's first bytes: 0x89 starts no UTF-8 character."""
    f = tmp_path / "table.png"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    return f


def test_a_binary_kernel_table_is_named_as_not_a_toml_text_table(tmp_path):
    # before: "error: 'utf-8' codec can't decode byte 0x89 in position 0: invalid start byte" (no flag, no file)
    f = _binary(tmp_path)
    refused(["kernels", "--gemm", "4096x4096x4096", "--chip", "H100", "--kernel-table", str(f)],
            f"--kernel-table {f} is not a TOML text table", "byte 0 (0x89)")
    refused([*PREDICT, "--mesh", "fsdp=8", "--global-batch", "8", "--kernel-table", str(f)], "--kernel-table")


@pytest.mark.tpu
def test_a_gpu_chip_timing_a_tpu_topology_is_refused():
    # the topology's devices are counted with libtpu (mesh.devices.device_count), nothing compiles
    refused(["check", "--devices", "tpu:v5p:2x2x1", "--mesh", "fsdp=4", "--preset", "tiny", "--batch-tokens", "64",
             "--chip", "H100"], "--chip H100 is a GPU", "TPU")


def test_refusals_start_no_jax(tmp_path):
    """Every refusal above, in one fresh process: each exits 2, and jax is not imported when they are done."""
    argvs = [a for a, _ in REFUSALS] + [["kernels", "--gemm", "64x64x64", "--chip", "H100", "--kernel-table",
                                         str(_binary(tmp_path))]]
    script = ("import json, sys\nfrom jax_scaling.cli import main\ncodes = []\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    try:\n        codes.append(main(argv))\n    except SystemExit as e:\n        codes.append(e.code)\n"
              "print(json.dumps([codes, 'jax' in sys.modules]))\n")
    r = subprocess.run([sys.executable, "-c", script, json.dumps(argvs)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    codes, jax_imported = json.loads(r.stdout.strip().splitlines()[-1])
    assert codes == [2] * len(argvs) and not jax_imported, (codes, r.stderr[-2000:])


def test_only_a_dropless_moe_leaves_its_matmul_flops_uncompared():
    # the closed form counts a ragged kernel over the routed rows; XLA lowers ragged_dot densely (docs/findings.md)
    moe = get_preset("moe-tiny")
    assert moe.moe.dropless
    for platform in ("cpu", "gpu"):
        assert moe.uncompared_flops(platform).startswith(f"not comparable: XLA:{platform.upper()} lowers")
    assert moe.replace(capacity_factor=1.25).uncompared_flops("cpu") is None
    assert get_preset("tiny").uncompared_flops("cpu") is None and get_preset("tiny-tf").uncompared_flops("gpu") is None


@pytest.mark.compiles
def test_dropless_moe_check_says_not_comparable():
    """moe-tiny (dropless) on 8 emulated CPU devices, data=2,expert=4, 8 sequences of 32 (the fewest the mesh splits:
    data·expert = 8): the matmul row keeps both figures, no ratio, and says why, in the table and in --json (before:
    a ratio of 5.87 with no note)."""
    argv = ["check", "--devices", "cpu:8", "--preset", "moe-tiny", "--mesh", "data=2,expert=4", "--batch-tokens",
            "256"]
    code, out, err, _ = run([*argv, "--json"])
    assert code == 0, err
    row = json.loads(out)["flops"]["matmul"]
    assert row["ratio"] is None and row["note"].startswith("not comparable: XLA:CPU lowers")
    # the dense lowering computes every gathered row against every local expert: more than the routed rows alone
    assert row["compiled"] > row["closed_form"] > 0
    code, out, err, _ = run(argv)  # the same report from the cache: its table row
    line = next(s for s in out.splitlines() if s.startswith("flops.matmul"))
    assert code == 0 and line.split()[3] == "-" and "not comparable" in line


@pytest.mark.compiles
@CUDA
def test_check_on_gpus_takes_the_chip_from_the_devices_and_flash_for_auto():
    """check --devices gpu:H100:8 of a transformer with neither --chip nor --attention, compiled with XLA's GPU compiler
    through the CUDA plugin (no GPU here): the H100 times it (before: "unknown chip 'gpu'"), and auto, which is cuDNN's
    attention on GPUs, takes flash (cuDNN's is traced only with a CUDA GPU present; before: "use --attention flash or
    auto"), saying so in one line before the compile's."""
    code, out, err, _ = run(["check", "--devices", "gpu:H100:8", "--preset", "tiny-tf", "--mesh", "data=8",
                             "--batch-tokens", "512", "--json"])
    assert code == 0, err
    rep = json.loads(out)["config"]
    assert rep["chip"] == "H100" and rep["platform"] == "gpu" and rep["schedule"]["attention"] == "flash"
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("note: attention flash, not cudnn") and "CUDA GPU" in lines[0]
    assert lines[1] == "compiling the train step for gpu:H100:8 ..."
    assert get_chip(rep["chip"]).kind == "gpu"


@pytest.mark.compiles
@pytest.mark.parametrize("command", ["train", "bench"])
def test_train_and_bench_on_the_hosts_devices_keep_libtpu_off_stderr(command):
    """Without --devices on a host without TPUs (JAX_PLATFORMS unset: jax loads libtpu where it is installed, which
    writes "Failed to find host bounds ...", "E0000 ... unexpected worker hostname" and a source-location trace to
    file descriptor 2): stderr is empty, as check's is (before: those 4 lines on every run that succeeded)."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "VERIFY_CHECK_CACHE")}
    argv = [sys.executable, "-m", "verify", command, "--preset", "tiny", "--batch-tokens", "64", "--steps", "1"]
    r = subprocess.run(argv + (["--warmup", "0"] if command == "bench" else []), capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and r.stdout, r.stderr[-2000:]
    assert r.stderr == "", r.stderr[-2000:]
    if has_libtpu() and command == "train":  # and libtpu's lines are there with --verbose (one helper: get_devices)
        loud = subprocess.run(argv + ["--verbose"] + (["--warmup", "0"] if command == "bench" else []),
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert loud.returncode == 0 and "TPU" in loud.stderr
