"""Checkpoints (orbax): a state saved on one mesh restores bit-identically on another, a stopped and
resumed run gives exactly the losses of an uninterrupted one, and a save cut off half-way leaves the
previous checkpoint as the latest."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from ffn_model import checkpoint as ckpt
from ffn_model.cli import main
from ffn_model.train import state_shardings, train
from mesh import make_mesh, mesh_shape
from scaling.config import PRESETS

TINY = PRESETS["tiny"]  # D=64, F=256, L=3
B = 64
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def assert_bit_identical(got, want):
    """Same tree, dtypes, shapes and bytes, leaf by leaf."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


def test_restore_on_other_meshes_is_bit_identical(tmp_path):
    """fsdp=4,tensor=2 -> fsdp=2,tensor=4 -> one device: every leaf keeps its exact bytes and takes the
    target mesh's sharding."""
    m1, m2 = make_mesh("fsdp=4,tensor=2", "cpu:8"), make_mesh("fsdp=2,tensor=4", "cpu:8")
    one = make_mesh("fsdp=1", jax.devices()[:1])
    _, s1 = train(TINY, m1, B, 2, checkpoint_dir=tmp_path / "a", return_state=True)  # saved at the end
    want = jax.tree.map(np.asarray, s1)

    step, s2, _ = ckpt.restore_latest(tmp_path / "a", state_shardings(TINY, m2)[0])
    assert step == 2
    assert_bit_identical(s2, want)
    w_in = s2["params"]["w_in"]
    assert mesh_shape(w_in.sharding.mesh).as_dict() == {"data": 1, "stage": 1, "fsdp": 2, "context": 1, "tensor": 4}
    assert w_in.sharding.spec == jax.sharding.PartitionSpec("stage", "tensor", "fsdp")  # W_in [L, F, D]
    assert len(w_in.addressable_shards) == 8 and w_in.addressable_shards[0].data.shape == (3, 64, 32)

    mngr = ckpt.open_manager(tmp_path / "b", create=True)
    ckpt.save(mngr, step, s2)  # saved from the second mesh
    mngr.close()
    step, s3, _ = ckpt.restore_latest(tmp_path / "b", state_shardings(TINY, one)[0])
    assert step == 2
    assert_bit_identical(s3, want)
    assert s3["params"]["w_out"].sharding.mesh.devices.size == 1


def _cli(argv, capsys) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_stop_and_resume_gives_the_uninterrupted_losses(tmp_path, capsys):
    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    full = train(TINY, m, B, 6)  # uninterrupted, no checkpoints
    base = ["train", "--preset", "tiny", "--devices", "cpu:8", "--batch-tokens", str(B),
            "--checkpoint-dir", str(tmp_path / "ck"), "--mesh", "fsdp=4,tensor=2"]

    first = _cli([*base, "--steps", "3", "--save-every", "2"], capsys)
    assert first["losses"] == full[:3] and first["start_step"] == 0
    assert sorted(os.listdir(tmp_path / "ck")) == ["2", "3"]  # every 2 steps, and the final state

    second = _cli([*base, "--steps", "6", "--resume"], capsys)
    assert second["start_step"] == 3
    assert second["losses"] == full[3:]  # exactly: batch i is a function of (seed, i)

    # A run killed after the (asynchronous) save at step 2: steps 3 and 6 never happened. Resuming
    # from step 2 also shows the async save was not disturbed by the next step donating the state.
    for step in ("3", "6"):
        os.rename(tmp_path / "ck" / step, tmp_path / f"gone-{step}")
    third = _cli([*base, "--steps", "4", "--resume"], capsys)
    assert third["start_step"] == 2 and third["losses"] == full[2:4]

    # Resuming on another mesh continues the same run (sharding changes only the reduction order).
    other = _cli([*base[:-1], "fsdp=2,tensor=4", "--steps", "6", "--resume"], capsys)
    assert other["start_step"] == 4 and other["mesh"] == {"data": 1, "stage": 1, "fsdp": 2, "context": 1, "tensor": 4}
    np.testing.assert_allclose(other["losses"], full[4:], rtol=2**-7)


INTERRUPT = """
import os, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
from ffn_model import checkpoint as ckpt
from ffn_model.train import train
from mesh import make_mesh
from scaling.config import PRESETS

d = sys.argv[1]
_, state = train(PRESETS["tiny"], make_mesh("fsdp=4,tensor=2"), 64, 2, checkpoint_dir=d, return_state=True)
mngr = ckpt.open_manager(d, create=True)
ckpt.save(mngr, 3, jax.tree.map(lambda x: x + 1, state), wait=False)  # returns before the files are written
os._exit(1)  # die half-way through the save of step 3
"""


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path):
    d = tmp_path / "ck"
    out = subprocess.run([sys.executable, "-c", INTERRUPT, str(d)], capture_output=True, text=True, env=ENV,
                         timeout=240)
    assert out.returncode == 1, out.stderr[-2000:]
    names = sorted(os.listdir(d))
    # the save of step 3 was really cut off: its files are in a temporary directory, never renamed
    assert "2" in names and "3" not in names and any(n.startswith("3.orbax-checkpoint-tmp") for n in names), names

    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    full, want = train(TINY, m, B, 4, return_state=True)
    _, at_2 = train(TINY, m, B, 2, return_state=True)  # computed here, independently of the subprocess
    step, got, _ = ckpt.restore_latest(d, state_shardings(TINY, make_mesh("fsdp=8", "cpu:8"))[0])
    assert step == 2
    assert_bit_identical(got, jax.tree.map(np.asarray, at_2))

    # resuming writes over the leftover: the new manager removes the unfinished step 3
    losses, state = train(TINY, m, B, 4, checkpoint_dir=d, resume=True, return_state=True)
    assert losses == full[2:]
    assert sorted(os.listdir(d)) == ["2", "4"]
    assert_bit_identical(state, jax.tree.map(np.asarray, want))


def test_an_empty_directory_works_like_a_missing_one(tmp_path):
    """A directory made with mkdir (or a mounted volume) before the run: the directory check reads the
    file system only, so jax's 8 emulated devices are still set up after it (in a fresh process)."""
    d = tmp_path / "ck"
    d.mkdir()
    out = subprocess.run([sys.executable, "-m", "ffn_model", "train", "--preset", "tiny", "--devices", "cpu:8",
                          "--mesh", "fsdp=4,tensor=2", "--batch-tokens", str(B), "--steps", "2",
                          "--checkpoint-dir", str(d)], capture_output=True, text=True, env=ENV, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert os.listdir(d) == ["2"]
    assert f"saved step 2 to {d}" in out.stdout


def test_checkpoint_messages_and_changed_settings(tmp_path, capsys):
    """What a person running train is told: each save, the step and meshes of a resume, a checkpoint
    already at --steps, and a warning for each setting that differs from the checkpoint's."""
    d = tmp_path / "ck"
    base = ["train", "--preset", "tiny", "--devices", "cpu:8", "--batch-tokens", str(B), "--checkpoint-dir", str(d)]
    assert main([*base, "--mesh", "fsdp=4,tensor=2", "--steps", "4", "--save-every", "2"]) == 0
    out = capsys.readouterr().out
    assert f"saved step 2 to {d}" in out and f"saved step 4 to {d}" in out

    assert main([*base, "--mesh", "fsdp=4,tensor=2", "--steps", "4", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "already at step 4 = steps: nothing to train" in out
    assert not any(line.startswith("step ") for line in out.splitlines())  # no step ran

    assert main([*base, "--mesh", "fsdp=2,tensor=4", "--steps", "5", "--resume", "--lr", "2e-3",
                 "--batch-tokens", str(2 * B)]) == 0
    out, err = capsys.readouterr()
    assert (f"resumed from step 4 in {d} (saved on mesh fsdp=4,tensor=2, restored on mesh fsdp=2,tensor=4)" in out)
    assert "warning: resuming with lr 0.002, the checkpoint was written with 0.001" in err
    assert f"warning: resuming with batch_tokens {2 * B}, the checkpoint was written with {B}" in err
    assert f"saved step 5 to {d}" in out
