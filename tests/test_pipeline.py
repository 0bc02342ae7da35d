"""Microbatches: pipeline stages (GPipe and circular) and gradient accumulation train like one device;
the CLI trains, checkpoints and resumes with a stage axis; bad schedules exit 2 with one line."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_scaling.cli import main
from ffn_model.train import init_state, make_batch_fn, make_train_step, train
from mesh import make_mesh, mesh_shape
from scaling.step import pipeline as closed
from scaling.families.ffn import FFNConfig
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from tests import helpers
from tests.helpers import LR, STEPS, assert_matches

# 8 blocks: 2 or 4 stages, and circular R = 2 on 4 stages (2 chunks of 1 block) or on 2 (2 chunks of 2).
TINY8 = FFNConfig(d_model=64, d_ff=256, blocks=8)
B = 64
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def one_device():
    """3 steps of TINY8 on one device, one pass over the batch (tests.helpers.one_device: once per run)."""
    return helpers.one_device(TINY8, B)


# (mesh, devices, schedule, remat): stage=2, stage=4, stage=2×fsdp=2×tensor=2; GPipe and circular; remat
# none and full; weights gathered per microbatch and once per step; data with stages.
PIPELINES = [
    ("stage=2", 2, Schedule(2), "none"),
    ("stage=2", 2, Schedule(4, repeats=2), "full"),
    ("stage=4", 4, Schedule(4), "full"),
    ("stage=4", 4, Schedule(4, repeats=2), "none"),
    ("stage=2,fsdp=2,tensor=2", 8, Schedule(4), "none"),
    ("stage=2,fsdp=2,tensor=2", 8, Schedule(2, repeats=2), "full"),
    ("stage=2,fsdp=2,tensor=2", 8, Schedule(4, fsdp_gather="step"), "every-second"),
    ("data=2,stage=2,fsdp=2", 8, Schedule(2, repeats=4), "none"),
]


@pytest.mark.numerics
@pytest.mark.parametrize("spec, n, schedule, remat", PIPELINES,
                         ids=[f"{s}-M{k.microbatches}R{k.repeats}-{k.fsdp_gather}-{r}" for s, _, k, r in PIPELINES])
def test_pipeline_matches_one_device(one_device, spec, n, schedule, remat):
    m = make_mesh(spec, jax.devices()[:n])
    w = Workload(TINY8, mesh_shape(m), B, remat=remat, schedule=schedule)
    losses, state = train(w, m, STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], one_device)
    # each stage holds its L/S blocks: W_in [L, F, D] split along L over stage
    w = state["params"]["w_in"]
    assert w.sharding.spec[0] == "stage"
    assert {s.data.shape[0] for s in w.addressable_shards} == {TINY8.blocks // m.shape["stage"]}


@pytest.mark.numerics
@pytest.mark.parametrize("spec", ["fsdp=8", "fsdp=4,tensor=2"])
def test_gradient_accumulation_is_one_pass(spec):
    """M = 4 microbatches without a stage axis: the same update as one pass over the whole batch. The
    loss is a mean over tokens, so the mean of M microbatch means is the batch mean and the mean of
    the M gradients the batch's gradient; only the order of the sums differs (FP32 accumulation of
    gradients whose BF16 parts round per microbatch), within the 1-device tolerance above."""
    m = make_mesh(spec, "cpu:8")
    one_loss, one = train(Workload(TINY8, mesh_shape(m), B), m, STEPS, lr=LR, return_state=True)
    ga_loss, ga = train(Workload(TINY8, mesh_shape(m), B, schedule=Schedule(4)), m, STEPS, lr=LR, return_state=True)
    assert_matches(ga_loss, ga["params"], (one_loss, jax.tree.map(np.asarray, one["params"])))


@pytest.mark.numerics
def test_one_step_of_accumulation_equals_the_exact_gradient():
    """One step from the same state: the accumulated gradient's update equals one pass's to
    bf16 rounding of the per-microbatch partial sums (2^-8 relative of the update, lr per element)."""
    m = make_mesh("fsdp=8", "cpu:8")
    w = Workload(TINY8, mesh_shape(m), B)
    batch = make_batch_fn(w, m)(0)
    with jax.set_mesh(m):
        a, la = make_train_step(w, m)(init_state(w, m), batch)
        b, lb = make_train_step(w.replace(schedule=Schedule(8)), m)(init_state(w, m), batch)
    assert float(la) == pytest.approx(float(lb), rel=2**-8)
    for name in a["params"]:
        d = np.abs(np.asarray(a["params"][name]) - np.asarray(b["params"][name]))
        assert d.max() <= 2 * 1e-3 and d.mean() <= 0.05 * 1e-3, (name, d.max(), d.mean())


def test_bubble_conventions_by_hand():
    """S = 4, M = 8, GPipe: idle share 3/11 (MaxText), overhead 3/8 (Megatron); circular R = 2: 3/19 and
    3/16 (Narayanan et al. 2021: (S−1)/(v·M)). Iterations T = R·M + S − 1: 11 and 19."""
    g, c = Schedule(8), Schedule(8, repeats=2)
    assert closed.bubble(g, 4) == {"idle_share": 3 / 11, "overhead": 3 / 8}
    assert closed.bubble(c, 4) == {"idle_share": 3 / 19, "overhead": 3 / 16}
    assert (closed.iterations(g, 4), closed.iterations(c, 4), closed.iterations(Schedule(8), 1)) == (11, 19, 8)


@pytest.mark.parametrize("S, R, moves", [(2, 2, 1), (4, 2, 2), (2, 3, 1), (2, 9, 4), (4, 4, 3), (3, 2, 2)])
def test_circular_relay_rounds(S, R, moves):
    """The circular re-lay: stage s holds chunks s·R .. s·R + R − 1 and must end with chunk r·S + s in its
    slot r. Every round is a perfect matching (each stage sends one chunk and receives one); after all R
    rounds every slot holds its chunk; the rounds that move anything are the fewest possible: the most
    chunks any stage must send away. By hand: S=2, R=9: stage 0 holds chunks 0..8 and keeps the 5 even
    ones (their target is 0), so 4 leave; S=4, R=4: stage 1 holds 4..7 and keeps chunk 5 only, 3 leave."""
    rounds = closed.relay_rounds(S, R)
    assert len(rounds) == R
    slots = {}
    for rd in rounds:
        assert sorted(s for s, *_ in rd) == list(range(S)) and sorted(t for _, _, t, _ in rd) == list(range(S))
        for s, j, t, r in rd:
            slots[(t, r)] = s * R + j
    assert slots == {(t, r): r * S + t for t in range(S) for r in range(R)}
    leave = max(sum((s * R + j) % S != s for j in range(R)) for s in range(S))
    assert closed.relay_moves(S, R) == leave == moves


def _train_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ffn_model", "train", "--preset", "tiny", *args],
                          capture_output=True, text=True, env=ENV, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--blocks", "3", "--mesh", "stage=2,fsdp=4", "--stage-blocks", "2,2"],
     "stage_blocks=2,2 sums to 4, not blocks=3"),
    (["--blocks", "4", "--mesh", "stage=2,fsdp=4", "--microbatches", "3"],
     "batch_tokens=64 is not divisible by microbatches·data·fsdp = 12"),
    (["--blocks", "3", "--mesh", "stage=2,fsdp=4", "--microbatches", "2", "--repeats", "2"],
     "blocks=3 cannot fill the 4 chunks of stage=2, repeats=2"),
    (["--blocks", "4", "--mesh", "fsdp=8", "--repeats", "2"], "repeats=2 needs a stage axis"),
    (["--blocks", "4", "--mesh", "stage=2,fsdp=4", "--microbatches", "1", "--repeats", "2"],
     "needs microbatches >= stages: 1 < 2"),
    (["--blocks", "4", "--mesh", "fsdp=8", "--fsdp-gather", "step"], "fsdp_gather='step'"),
    (["--blocks", "4", "--mesh", "fsdp=8", "--microbatches", "0"], "microbatches must be a positive integer"),
])
def test_bad_schedules_exit_2_with_one_line(args, message):
    r = _train_cli("--devices", "cpu:8", "--batch-tokens", "64", *args, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.compiles
@pytest.mark.processes
def test_cli_trains_checkpoints_and_resumes_across_meshes(tmp_path, capsys):
    """The issue's command, on a 4-block stack: stage=2, fsdp=2, tensor=2, 4 microbatches, 2 steps saved;
    resumed on fsdp=8 (no stages, one pass) and on stage=4 (GPipe, 4 microbatches) for steps 2..3: the
    same run as 4 uninterrupted pipelined steps (sharding and schedule change only the reduction order)."""
    base = ["train", "--preset", "tiny", "--blocks", "4", "--devices", "cpu:8", "--batch-tokens", "64", "--json"]
    pipe = ["--mesh", "stage=2,fsdp=2,tensor=2", "--microbatches", "4"]

    def run(*args):
        assert main([*base, *args]) == 0
        return json.loads(capsys.readouterr().out)

    full = run(*pipe, "--steps", "4")["losses"]
    first = run(*pipe, "--steps", "2", "--checkpoint-dir", str(tmp_path / "ck"))
    assert first["losses"] == full[:2]  # the same program: bit-identical
    for k, other in enumerate((["--mesh", "fsdp=8"], ["--mesh", "stage=4,fsdp=2", "--microbatches", "4"])):
        d = tmp_path / f"ck{k}"
        subprocess.run(["cp", "-r", str(tmp_path / "ck"), str(d)], check=True)
        again = run(*other, "--steps", "4", "--checkpoint-dir", str(d), "--resume")
        assert again["start_step"] == 2
        np.testing.assert_allclose(again["losses"], full[2:], rtol=2**-7)
