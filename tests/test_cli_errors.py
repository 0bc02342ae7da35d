"""Bad input, everywhere a user can type: every flag of python -m ffn_model {train, compile, bench}
with a bad value gives one line "error: ..." on stderr naming the input, exit code 2, no traceback,
and nothing written (no checkpoint directory created, no file touched). The public entry points
raise ValueError for the same inputs."""

import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import jax
import pytest

from ffn_model import checkpoint as ckpt
from mesh.devices import infer_chip
from verify.bench import bench
from jax_scaling.cli import main
from ffn_model.train import state_shardings, train
from mesh import make_mesh, mesh_shape
from scaling.families.presets import PRESETS, get_preset
from scaling.core.workload import Workload
from tests.helpers import assert_one_error_line

TINY = PRESETS["tiny"]  # D=64, F=256, L=3
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
TRAIN = "train --preset tiny --devices cpu:8 --mesh fsdp=4,tensor=2 --batch-tokens 64 --steps 2"
MP = "--coordinator localhost:1234 --num-processes 2 --process-id 0"  # never reached: validated first


def _abstract(m, cfg=TINY):
    """The abstract train state of ``cfg`` on the mesh ``m`` (state_shardings of its workload)."""
    return state_shardings(Workload(cfg, mesh_shape(m), 64), m)[0]


# (arguments, what the one error line must contain). {ck} is a checkpoint directory that does not
# exist (and must not be created); {file} a regular file; {empty} an empty directory; {full} a
# complete checkpoint of 2 steps of the tiny model (seed 0); {corrupt} the same with its array files
# overwritten. argparse keeps the last of a repeated flag, so a row's flags override TRAIN's.
CASES = [
    # model
    (f"{TRAIN} --preset huge", r"unknown preset 'huge'; valid presets: xxl, xxl-2, small, tiny"),
    (f"{TRAIN} --d-model 0", r"--d-model must be a positive integer, got 0"),
    (f"{TRAIN} --d-model -64", r"--d-model must be a positive integer, got -64"),
    (f"{TRAIN} --d-model abc", r"argument --d-model: invalid int value: 'abc'"),
    (f"{TRAIN} --d-model 62", r"d_model=62 is not divisible by the fsdp shard count 4"),
    (f"{TRAIN} --d-ff 0", r"--d-ff must be a positive integer, got 0"),
    (f"{TRAIN} --d-ff 255", r"d_ff=255 is not divisible by the tensor shard count 2"),
    (f"{TRAIN} --blocks -1", r"--blocks must be a positive integer, got -1"),
    (f"{TRAIN} --blocks 1.5", r"argument --blocks/--layers: invalid int value: '1.5'"),
    (f"{TRAIN} --remat half", r"argument --remat: invalid choice: 'half'"),
    # batch, steps, optimizer, seed
    (f"{TRAIN} --batch-tokens 0", r"--batch-tokens must be a positive integer, got 0"),
    (f"{TRAIN} --batch-tokens -64", r"--batch-tokens must be a positive integer, got -64"),
    (f"{TRAIN} --batch-tokens 66", r"batch_tokens=66 is not divisible by the data·fsdp shard count 4"),
    (f"{TRAIN} --batch-tokens 1e3", r"argument --batch-tokens: invalid int value: '1e3'"),
    (f"{TRAIN} --steps 0", r"--steps must be a positive integer, got 0"),
    (f"{TRAIN} --steps -3", r"--steps must be a positive integer, got -3"),
    (f"{TRAIN} --steps many", r"argument --steps: invalid int value: 'many'"),
    (f"{TRAIN} --lr 0", r"--lr must be a positive finite number, got 0.0"),
    (f"{TRAIN} --lr=-1e-3", r"--lr must be a positive finite number, got -0.001"),
    (f"{TRAIN} --lr nan", r"--lr must be a positive finite number, got nan"),
    (f"{TRAIN} --lr inf", r"--lr must be a positive finite number, got inf"),
    (f"{TRAIN} --lr fast", r"argument --lr: invalid float value: 'fast'"),
    (f"{TRAIN} --seed -1", r"--seed must be an integer in 0\.\.4294967295 \(a 32-bit seed\), got -1"),
    (f"{TRAIN} --seed 4294967296", r"--seed must be an integer in 0\.\.4294967295 \(a 32-bit seed\), got 4294967296"),
    (f"{TRAIN} --seed x", r"argument --seed: invalid int value: 'x'"),
    # mesh and devices
    (f"{TRAIN} --mesh experts=8",
     r"unknown mesh axis 'experts' in 'experts=8'; valid axes: data, stage, fsdp, context, expert, tensor"),
    (f"{TRAIN} --mesh fsdp=4,expert=2", r"expert=2: the FFN stack has no experts"),
    (f"{TRAIN} --mesh fsdp", r"mesh spec item 'fsdp' must be axis=size"),
    (f"{TRAIN} --mesh fsdp=0", r"mesh axis 'fsdp' size must be positive, got 0"),
    (f"{TRAIN} --mesh fsdp=x", r"mesh axis 'fsdp' size must be an integer, got 'x'"),
    (f"{TRAIN} --mesh fsdp=4,fsdp=2", r"mesh axis 'fsdp' given twice"),
    (f"{TRAIN} --mesh fsdp=16", r"mesh 'fsdp=16' has 16 devices \(product of axis sizes\) but 8 devices are given"),
    (f"{TRAIN} --mesh fsdp=3", r"has 3 devices .* but 8 devices"),
    (f"{TRAIN} --mesh fsdp=3,tensor=-1", r"8 devices are not divisible by 3"),
    (f"{TRAIN} --devices gpu:2", r"train runs on real devices or cpu:N, not 'gpu:2'"),
    (f"{TRAIN} --devices cpu:0", r"--devices 'cpu:0': N must be a positive integer, got 0"),
    (f"{TRAIN} --devices cpu:x", r"--devices 'cpu:x': expected cpu:N with N a positive integer"),
    (f"{TRAIN} --devices tpu:v5p:2x2x2", r"not 'tpu:v5p:2x2x2' \(a TPU topology is compile-only\)"),
    ("train --preset tiny --batch-tokens 64 --mesh fsdp=16",
     r"mesh 'fsdp=16' has 16 devices .* but 8 devices are given"),
    # checkpoints
    (f"{TRAIN} --checkpoint-dir {{ck}} --save-every 0", r"--save-every must be a positive integer, got 0"),
    (f"{TRAIN} --checkpoint-dir {{ck}} --save-every -2", r"--save-every must be a positive integer, got -2"),
    (f"{TRAIN} --checkpoint-dir {{ck}} --save-every x", r"argument --save-every: invalid int value: 'x'"),
    (f"{TRAIN} --save-every 2", r"--save-every and --resume need --checkpoint-dir"),
    (f"{TRAIN} --resume", r"--save-every and --resume need --checkpoint-dir"),
    (f"{TRAIN} --checkpoint-dir {{file}}", r"--checkpoint-dir '.*/file' is a file, not a directory"),
    (f"{TRAIN} --checkpoint-dir {{ck}} --resume", r"--checkpoint-dir '.*/ck' does not exist: nothing to resume from"),
    (f"{TRAIN} --checkpoint-dir {{empty}} --resume", r"no complete checkpoint in --checkpoint-dir '.*/empty'"),
    (f"{TRAIN} --checkpoint-dir {{corrupt}} --resume", r"checkpoint step 2 in --checkpoint-dir '.*/corrupt' cannot be"),
    (f"{TRAIN} --checkpoint-dir {{full}}", r"'.*/full' already holds checkpoints \(latest step 2\); pass --resume"),
    (f"{TRAIN} --checkpoint-dir {{notes}}", r"'.*/notes' holds files that are not checkpoints \(notes.txt\)"),
    (f"{TRAIN} --checkpoint-dir {{file}}/sub", r"--checkpoint-dir '.*/file/sub': '.*/file' is a file, not a directory"),
    (f"{TRAIN} --checkpoint-dir /proc/x", r"--checkpoint-dir '/proc/x': cannot write in '/proc'"),
    # a control character in the name (a newline splits a row's argv here: tests/test_checkpoint.py has it)
    (f"{TRAIN} --checkpoint-dir {{ck}}\x1brun",
     r"--checkpoint-dir '.*/ck\\x1brun' holds a control character \('\\x1b'\); give printable characters"),
    (f"{TRAIN} --checkpoint-dir {{ck}}\x7f", r"--checkpoint-dir '.*/ck\\x7f' holds a control character \('\\x7f'\)"),
    (f"{TRAIN} --checkpoint-dir {{ck}}/a\x08b --resume", r"'.*/ck/a\\x08b' holds a control character \('\\x08'\)"),
    (f"{TRAIN} --checkpoint-dir {{full}} --resume --steps 1",
     r"steps=1 is fewer than the 2 steps already in the checkpoint"),
    (f"{TRAIN} --checkpoint-dir {{full}} --resume --seed 1",
     r"was written with seed 0, not 1; resume with the same seed"),
    (f"{TRAIN} --checkpoint-dir {{full}} --resume --d-ff 512", r"was written with model \{'d_model': 64, 'd_ff': 256"),
    # several processes (validated before jax.distributed.initialize, which would wait for the others)
    (f"{TRAIN} --coordinator localhost:1234", r"go together; missing --num-processes, --process-id"),
    (f"{TRAIN} {MP} --coordinator localhost", r"--coordinator 'localhost' must be HOST:PORT with a port in 1..65535"),
    (f"{TRAIN} {MP} --coordinator localhost:99999", r"--coordinator 'localhost:99999' must be HOST:PORT"),
    (f"{TRAIN} {MP} --num-processes 0", r"--num-processes must be a positive integer, got 0"),
    (f"{TRAIN} {MP} --num-processes x", r"argument --num-processes: invalid int value: 'x'"),
    (f"{TRAIN} {MP} --process-id 2", r"--process-id must be in 0..1 for --num-processes 2, got 2"),
    (f"{TRAIN} {MP} --process-id -1", r"--process-id must be in 0..1 for --num-processes 2, got -1"),
    (f"{TRAIN} {MP} --process-timeout 0", r"--process-timeout must be a positive finite number, got 0.0"),
    (f"{TRAIN} {MP} --devices cpu:4 --mesh fsdp=4", r"mesh 'fsdp=4' has 4 devices .* but 8 devices are given"),
    # compile
    ("compile --devices cpu:8 --mesh fsdp=8 --preset huge", r"unknown preset 'huge'"),
    ("compile --devices cpu:8 --mesh fsdp=8 --step backward", r"argument --step: invalid choice: 'backward'"),
    ("compile --devices cpu:8 --mesh fsdp=8 --batch-tokens 0", r"--batch-tokens must be a positive integer, got 0"),
    ("compile --devices cpu:8 --mesh fsdp=16", r"mesh 'fsdp=16' has 16 devices .* but 8 devices are given"),
    ("compile --devices cpu:8 --mesh fsdp=8 --preset tiny --d-model 60", r"d_model=60 is not divisible by the fsdp"),
    ("compile --devices tpu:v9:2x2 --mesh fsdp=4",
     r"devices 'tpu:v9:2x2': unknown chip 'v9'; valid chips: v4, v5e, v5p"),
    ("compile --devices tpu:v6e:3x3 --mesh fsdp=9",
     r"v6e has no topology 3x3; valid: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"),
    ("compile --devices tpu:v5p:2x2 --mesh fsdp=4",
     r"v5p has no topology 2x2; valid: 2x2x1, 2x2x2, 2x2x4, 2x4x4, or whole"),
    ("compile --devices tpu:v5litepod-12 --mesh fsdp=4", r"v5e has no slice of 12 chips"),
    ("compile --devices abc --mesh fsdp=4",
     r"unknown devices 'abc'; use cpu:N, gpu:<chip>:<N> \(gpu:H100:64\), tpu:<chip>:<shape>"),
    ("compile --devices cpu:8 --mesh fsdp=8 --steps 3", r"unrecognized arguments: --steps 3"),
    # bench
    ("bench --preset tiny --devices cpu:8 --steps 0", r"--steps must be a positive integer, got 0"),
    ("bench --preset tiny --devices cpu:8 --warmup -1", r"--warmup must be a non-negative integer, got -1"),
    ("bench --preset tiny --devices cpu:8 --warmup x", r"argument --warmup: invalid int value: 'x'"),
    ("bench --preset tiny --devices cpu:8 --chip tpu9",
     r"unknown chip 'tpu9'; valid chips: v4, v5e, v5p, v6e, TPU7x, H100"),
    ("bench --preset tiny --devices cpu:8 --mesh fsdp=8 --d-model 60",
     r"d_model=60 is not divisible by the fsdp shard count 8"),
    ("bench --preset tiny --devices cpu:8 --mesh fsdp=16", r"mesh 'fsdp=16' has 16 devices"),
    ("bench --preset tiny --devices tpu:v5p-8", r"bench runs on real devices or cpu:N"),
    ("bench --preset tiny --devices cpu:8 --batch-tokens 12",
     r"batch_tokens=12 is not divisible by the data·fsdp shard count 8"),
    # the transformer, sequence and context parallelism
    (f"{TRAIN} --heads 8", r"--heads is a transformer dimension; 'tiny' is an FFN stack \(transformer presets: "),
    (f"{TRAIN} --preset tiny-tf --heads 0", r"--heads must be a positive integer, got 0"),
    (f"{TRAIN} --preset tiny-tf --mesh context=8 --batch-tokens 512 --kv-heads 4",
     r"kv_heads=4 is not divisible by context·tensor"),
    (f"{TRAIN} --preset tiny-tf --mesh context=8 --batch-tokens 480 --context-strategy ring --seq-len 60",
     r"seq_len=60 is not divisible by context = 8"),
    (f"{TRAIN} --preset tiny-tf --batch-tokens 100", r"batch_tokens=100 is not whole sequences of seq_len=64"),
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --remat every-second", r"remat every-second is for the FFN stack"),
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --mesh context=2,tensor=4 --attention flash --attention-block 48",
     r"attention_block=48 does not divide"),
    # the transformer's pipeline schedules
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --mesh stage=2,fsdp=4 --microbatches 1 --schedule 1f1b "
     "--repeats 2", r"interleaved 1f1b needs microbatches >= stages: 1 < 2"),
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --mesh stage=4,fsdp=2 --microbatches 4",
     r"blocks=2 cannot fill stage=4"),
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --mesh stage=2,fsdp=4 --microbatches 3",
     r"microbatches=3 must be a multiple of stage=2"),
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --schedule 1f1b", r"the 1f1b schedule needs a stage axis"),
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --schedule circular", r"a circular pipeline needs repeats > 1"),
    (f"{TRAIN} --blocks 4 --mesh stage=2,fsdp=4 --microbatches 2 --schedule 1f1b",
     r"the 1f1b schedule is built for the transformer"),
    (f"{TRAIN} --schedule zigzag", r"argument --schedule: invalid choice: 'zigzag'"),
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --remat sometimes",
     r"argument --remat: invalid choice: 'sometimes'"),
    (f"{TRAIN} --sequence-parallel --attention sparse", r"argument --attention: invalid choice: 'sparse'"),
    (f"{TRAIN} --context-strategy star", r"argument --context-strategy: invalid choice: 'star'"),
    # block and MLP kinds
    (f"{TRAIN} --preset tiny-tf --mlp tanh", r"argument --mlp: invalid choice: 'tanh'"),
    (f"{TRAIN} --block parallel", r"--block is a transformer flag; 'tiny' is an FFN stack"),
    # the vocabulary: split over tensor; tied only with one
    (f"{TRAIN} --preset tiny-tf --batch-tokens 512 --mesh fsdp=2,tensor=4 --vocab 1001",
     r"vocab=1001 is not divisible by the tensor shard count 4"),
    (f"{TRAIN} --preset tiny-tf --tied-embeddings", r"tied_embeddings needs a vocabulary \(--vocab N\)"),
    (f"{TRAIN} --vocab 512", r"--vocab is a transformer dimension; 'tiny' is an FFN stack"),
    (f"{TRAIN} --tied-embeddings", r"--tied-embeddings is a transformer flag; 'tiny' is an FFN stack"),
    # a transformer-only flag for an FFN preset, given explicitly (even at its default value): refused like --heads
    (f"{TRAIN} --attention flash", r"--attention is a transformer flag; 'tiny' is an FFN stack \(transformer presets"),
    (f"{TRAIN} --context-strategy ring", r"--context-strategy is a transformer flag; 'tiny' is an FFN stack"),
    ("compile --devices cpu:8 --mesh fsdp=8 --preset tiny --attention materialized",
     r"--attention is a transformer flag"),
    ("bench --preset tiny --devices cpu:8 --attention-block 64", r"--attention-block is a transformer flag"),
    (f"{TRAIN} --head-dim 8", r"--head-dim is a transformer dimension; 'tiny' is an FFN stack"),
    (f"{TRAIN} --preset tiny-tf --head-dim 0", r"--head-dim must be a positive integer, got 0"),
    # D = 64 has the divisors 1, 2, 4, 8, 16, 32, 64
    (f"{TRAIN} --preset tiny-tf --heads 7", r"d_model=64 is not divisible by heads=7: use heads dividing 64 "
     r"\(1, 2, 4, 8, 16, 32, 64\), or give head_dim \(--head-dim\)"),
    # too big for this host, before anything is built (train and bench allocate on emulated CPU devices): the XXL's
    # state alone is 16 B × P / 8 = 16 × 219,848,638,464 / 8 = 439.7 GB per device, 3.5 TB on 8 devices
    ("train --preset xxl --devices cpu:8 --mesh fsdp=8",
     r"the train step needs 4\d\d\.\d GB per device \(closed form\), "
     r"3\d\d\d GB on 8 CPU devices, which share this host.s memory: [\d.]+ GB"),
    ("bench --preset xxl --devices cpu:8 --mesh fsdp=8", r"the train step needs .* on 8 CPU devices, which share"),
    # the state alone, 16 B × 2·D·F·L / 8 per device (the mesh's fsdp·tensor = 8): L = 1e9 -> 65,536 GB;
    # F = 1e9 -> 768 GB (D = 64, L = 3); D = 1e9 -> 3,072 GB (F = 256): each above this host's memory
    (f"{TRAIN} --blocks 1000000000", r"the train step needs [\d.e+]+ GB per device \(closed form\)"),
    (f"{TRAIN} --d-ff 1000000000", r"the train step needs [\d.e+]+ GB per device \(closed form\)"),
    (f"{TRAIN} --d-model 1000000000", r"the train step needs [\d.e+]+ GB per device \(closed form\)"),
    # attention scores B·N·T = 4e8 · 8 · 1e8 = 3.2e17 elements (below 2^63), 4 B each: far above the host
    # (materialized: the default auto is flash on CPU, whose 512-key blocks do not divide T = 1e8)
    (f"{TRAIN} --preset tiny-tf --batch-tokens 400000000 --seq-len 100000000 --attention materialized",
     r"needs .* GB on 8 CPU devices, which share"),
    # every count below 2^31 (the one flag rule: jax's default int32), also for compile (which allocates nothing)
    (f"{TRAIN} --blocks 3000000000", r"--blocks must be below 2\^31 = 2,147,483,648"),
    ("compile --devices cpu:8 --mesh fsdp=8 --preset tiny --blocks 3000000000", r"--blocks must be below 2\^31"),
    (f"{TRAIN} --batch-tokens 1000000000000000000", r"--batch-tokens must be below 2\^31"),
    # an array of 2^63 elements or more from counts each below 2^31: the weights L·D·F = 3 · 2e9 · 2e9 = 1.2e19;
    # scores B·N·T = 2e9 · 8 · 1e9 = 1.6e19
    ("compile --devices cpu:8 --mesh fsdp=8 --preset tiny --d-model 2000000000 --d-ff 2000000000",
     r"weights L·D·F hold 1.2e\+19 elements; .* below 2\^63"),
    ("compile --devices cpu:8 --mesh fsdp=2,tensor=4 --preset tiny-tf --batch-tokens 2000000000 --seq-len 1000000000",
     r"attention scores B·N·T hold 1.6e\+19 elements"),
    # more emulated CPU devices than jax's CPU backend compiles for (2049 and up: "Multiprocess computations aren't
    # implemented on the CPU backend")
    (f"{TRAIN} --devices cpu:4096 --mesh data=4096 --batch-tokens 16384",
     r"--devices 'cpu:4096': jax's CPU backend compiles for at most 2048"),
    ("compile --devices cpu:2049 --mesh data=2049 --preset tiny --batch-tokens 4098",
     r"devices 'cpu:2049': .* at most 2048"),
    # the command itself
    ("", r"the following arguments are required: command"),
    ("serve", r"argument command: invalid choice: 'serve'"),
    (f"{TRAIN} --bogus 1", r"unrecognized arguments: --bogus 1"),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A complete checkpoint (2 steps of the tiny model, seed 0) and a copy with damaged array files."""
    root = tmp_path_factory.mktemp("saved")
    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    train(Workload(TINY, mesh_shape(m), 64), m, 2, checkpoint_dir=root / "full")
    shutil.copytree(root / "full", root / "corrupt")
    for dirpath, _, files in os.walk(root / "corrupt" / "2"):
        for f in files:
            if "ocdbt" in dirpath or f == "manifest.ocdbt":
                with open(os.path.join(dirpath, f), "wb") as fh:
                    fh.write(b"not a checkpoint")
    return root


@pytest.fixture
def places(saved, tmp_path):
    shutil.copytree(saved / "full", tmp_path / "full")
    shutil.copytree(saved / "corrupt", tmp_path / "corrupt")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("a directory that holds something else\n")
    (tmp_path / "unfinished" / "3.orbax-checkpoint-tmp-1").mkdir(parents=True)
    return {k: str(tmp_path / k) for k in ("ck", "file", "empty", "full", "corrupt", "notes", "unfinished")}


def snapshot(root) -> dict:
    """Every path under ``root`` with its size and modification time."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.stat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_size, st.st_mtime_ns)
    return out




@pytest.mark.parametrize("argv, match", CASES, ids=[c[0].replace(TRAIN, "train") or "<none>" for c in CASES])
def test_bad_flag_gives_one_error_line_and_writes_nothing(argv, match, places, tmp_path, capsys):
    before = snapshot(tmp_path)
    try:
        code = main(argv.format(**places).split())
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    assert_one_error_line(code, out, err, match)
    assert not os.path.exists(places["ck"])
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("argv, match", [
    (f"{TRAIN} --checkpoint-dir {{corrupt}} --resume", r"checkpoint step 2 in --checkpoint-dir '.*/corrupt' cannot be"),
    (f"{TRAIN} --checkpoint-dir {{ck}} --save-every 1.5", r"argument --save-every: invalid int value: '1.5'"),
    (f"{TRAIN} {MP} --devices cpu:4 --mesh fsdp=4", r"mesh 'fsdp=4' has 4 devices .* but 8 devices are given"),
    # no --devices: the real devices, here one CPU (ENV), known only once jax starts; 1e9 blocks of the tiny
    # model hold 16 B × 2·64·256·1e9 = 5.2e14 B of state alone, far above any host's memory
    ("train --preset tiny --blocks 1000000000 --batch-tokens 64 --steps 2", r"on 1 CPU devices, which share this host"),
], ids=["corrupt-checkpoint", "non-numeric", "multiprocess-mesh", "real-cpu-too-large"])
def test_bad_flag_in_a_fresh_process_has_no_traceback(argv, match, places, tmp_path):
    before = snapshot(tmp_path)
    out = subprocess.run([sys.executable, "-m", "ffn_model", *argv.format(**places).split()], capture_output=True,
                         text=True, env=ENV, timeout=120)
    assert_one_error_line(out.returncode, out.stdout, out.stderr, match)
    assert not os.path.exists(places["ck"])
    assert snapshot(tmp_path) == before


def test_public_entry_points_raise_value_error(places, tmp_path):
    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    before = snapshot(tmp_path)
    for spec, devices, match in [("fsdp=16", "cpu:8", "16 devices"), ("experts=8", "cpu:8", "unknown mesh axis"),
                                 ("fsdp=0", "cpu:8", "must be positive"), ("fsdp=8", "tpu8", "unknown devices")]:
        with pytest.raises(ValueError, match=match):
            make_mesh(spec, devices)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        get_preset("huge")

    abstract = _abstract(m)
    for where, match in [("ck", "does not exist"), ("file", "is a file"), ("empty", "no complete checkpoint"),
                         ("corrupt", "cannot be")]:
        with pytest.raises(ValueError, match=match):
            ckpt.restore_latest(places[where], abstract)
    with pytest.raises(ValueError, match=r"holds \['opt'\]\[0\].mu\['w_in'\] as float32\[3, 256, 64\], "
                                         r"this run needs float32\[3, 512, 64\]"):
        ckpt.restore_latest(places["full"], _abstract(m, TINY.replace(d_ff=512)))  # no metadata check
    with pytest.raises(ValueError, match="written with seed 0, not 3"):
        ckpt.restore_latest(places["full"], abstract, {"model": vars(TINY), "seed": 3})

    for kw, match in [({"steps": 0}, "steps must be a positive integer"), ({"lr": 0.0}, "lr must be a positive"),
                      ({"seed": -1}, "seed must be an integer in 0..4294967295"), ({"remat": "half"}, "unknown remat"),
                      ({"batch_tokens": 66}, "batch_tokens=66 is not divisible"),
                      ({"save_every": 2}, "need a checkpoint_dir"), ({"resume": True}, "need a checkpoint_dir"),
                      ({"save_every": 0, "checkpoint_dir": places["ck"]}, "save_every must be a positive"),
                      ({"checkpoint_dir": places["full"]}, "already holds checkpoints"),
                      ({"checkpoint_dir": places["ck"], "resume": True}, "does not exist"),
                      ({"checkpoint_dir": places["full"], "resume": True, "seed": 2}, "written with seed 0")]:
        args = {"batch_tokens": 64, "steps": 2, **kw}
        with pytest.raises(ValueError, match=match):
            w = Workload(TINY, mesh_shape(m), args.pop("batch_tokens"), remat=args.pop("remat", "none"))
            train(w, m, args.pop("steps"), **args)

    for kw, match in [({"steps": 0}, "steps must be"), ({"warmup": -1}, "warmup must be"),
                      ({"batch_tokens": 66}, "batch_tokens=66 is not divisible"), ({"seed": -2}, "seed must be")]:
        args = {"batch_tokens": 64, **kw}
        with pytest.raises(ValueError, match=match):
            bench(Workload(TINY, mesh_shape(m), args.pop("batch_tokens")), m, **args)
    assert snapshot(tmp_path) == before and not os.path.exists(places["ck"])


def test_chip_from_device_kind():
    dev = lambda kind, platform="gpu": SimpleNamespace(device_kind=kind, platform=platform)  # noqa: E731
    assert infer_chip(dev("NVIDIA H100 80GB HBM3")).name == "H100"
    assert infer_chip(dev("NVIDIA H200")).name == "H200"
    assert infer_chip(dev("TPU v5p", "tpu")).name == "v5p"
    assert infer_chip(dev("TPU v5 lite", "tpu")).name == "v5e"
    assert infer_chip(dev("TPU v6 lite", "tpu")).name == "v6e"
    assert infer_chip(jax.devices()[0]) is None  # CPU: no peak FLOP/s
    assert infer_chip(dev("NVIDIA A100-SXM4-40GB")).name == "A100-40GB"
    assert infer_chip(dev("NVIDIA A100-SXM4-80GB")).name == "A100-80GB"
    with pytest.raises(ValueError, match="cannot tell the chip from device kind 'NVIDIA L4'; pass --chip"):
        infer_chip(dev("NVIDIA L4"))


def test_size_rule_weighs_the_closed_form_against_the_host(monkeypatch):
    """train and bench on emulated CPU devices allocate in this host's memory: the closed-form memory per device
    times the devices must fit it; compile (no cpu_devices) allocates nothing and is not held to it."""
    from scaling.core import limits as cli
    from scaling.step.program import predict
    from scaling.core.mesh_shape import parse_mesh_spec

    mesh = parse_mesh_spec("fsdp=8", 8)
    # the tiny model's state alone: 16 B × 2·64·256·3 / 8 = 24,576 B per device, 196,608 B on 8 devices
    monkeypatch.setattr(cli, "host_memory_bytes", lambda: 196_608)
    need = predict(Workload(TINY, mesh, 64)).memory["total"]
    with pytest.raises(ValueError, match=r"on 8 CPU devices, which share this host.s memory: 0.0001966 GB"):
        cli.check_host_memory("train", need, 8)
    monkeypatch.setattr(cli, "host_memory_bytes", lambda: 10**9)  # a few hundred kB fit in 1 GB
    cli.check_host_memory("train", need, 8)


def test_tpu_refusal_is_one_line():
    """XLA:TPU's RESOURCE_EXHAUSTED message (G = GiB) as one line in GB: 928.48 · 2^30 = 996.94e9 B needed,
    95.74 · 2^30 = 102.80e9 B available (the XXL train step at fsdp=4 on tpu:v5p:2x2x1)."""
    from verify.hlo import refusal_error

    msg = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (928.48G) "
           "exceeds available HBM (95.74G).")
    assert str(refusal_error(RuntimeError(msg))).startswith(
        "the program needs 996.9 GB per device, the device has 102.8 GB")
    assert refusal_error(RuntimeError("INTERNAL: something else")) is None


@pytest.mark.tpu
def test_program_larger_than_the_tpu_is_one_line(capsys):
    """libtpu's own figure for the synchronous program (--xla-flags default); under 'maxtext' it is 996.0 GB."""
    code = main("compile --preset xxl --devices tpu:v5p:2x2x1 --mesh fsdp=4 --batch-tokens 25600 --xla-flags default"
                .split())
    out, err = capsys.readouterr()
    assert_one_error_line(code, out, err, r"the program needs 996.9 GB per device, the device has 102.8 GB")


def test_head_dim_sets_h_apart_from_d_over_n():
    """--heads 7 on a 64-wide model with --head-dim 8: W_q, W_o [N, H, D] and W_k, W_v [K, H, D] with K = N = 7,
    D·H·(2N + 2K) = 64·8·28 = 14,336 attention and 2·D·F = 32,768 MLP parameters per layer, 2 layers."""
    from jax_scaling.cli import parser
    from jax_scaling.args import model_config

    cfg = model_config(parser().parse_args("train --preset tiny-tf --heads 7 --head-dim 8".split()))
    assert (cfg.heads, cfg.kv_heads, cfg.head_dim) == (7, 7, 8)
    assert cfg.params == 2 * (14_336 + 32_768)


def test_closed_pipe_ends_quietly():
    """A reader that goes away (``| head``): no BrokenPipeError traceback, exit 1. The pipe's read end is closed
    before the command starts, so its first write fails."""
    r, w = os.pipe()
    os.close(r)
    try:
        out = subprocess.run([sys.executable, "-m", "scaling", "layers", "--cells"], stdout=w, stderr=subprocess.PIPE,
                             text=True, env=ENV, timeout=60)
    finally:
        os.close(w)
    assert out.returncode == 1 and out.stderr == "", out.stderr
