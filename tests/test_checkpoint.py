"""Checkpoints (orbax): a state saved on one mesh restores bit-identically on another, a stopped and
resumed run gives exactly the losses of an uninterrupted one, and a save cut off half-way leaves the
previous checkpoint as the latest."""

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from ffn_model import checkpoint as ckpt
from jax_scaling.cli import main
from ffn_model.train import state_shardings, train
from mesh import make_mesh, mesh_shape
from scaling.config import PRESETS
from scaling.workload import Workload

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
    # saved at the end
    _, s1 = train(Workload(TINY, mesh_shape(m1), B), m1, 2, checkpoint_dir=tmp_path / "a", return_state=True)
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
    full = train(Workload(TINY, mesh_shape(m), B), m, 6)  # uninterrupted, no checkpoints
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
from mesh import make_mesh, mesh_shape
from scaling.config import PRESETS
from scaling.workload import Workload

d = sys.argv[1]
m = make_mesh("fsdp=4,tensor=2")
_, state = train(Workload(PRESETS["tiny"], mesh_shape(m), 64), m, 2, checkpoint_dir=d, return_state=True)
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
    full, want = train(Workload(TINY, mesh_shape(m), B), m, 4, return_state=True)
    # computed here, independently of the subprocess
    _, at_2 = train(Workload(TINY, mesh_shape(m), B), m, 2, return_state=True)
    step, got, _ = ckpt.restore_latest(d, state_shardings(TINY, make_mesh("fsdp=8", "cpu:8"))[0])
    assert step == 2
    assert_bit_identical(got, jax.tree.map(np.asarray, at_2))

    # resuming writes over the leftover: the new manager removes the unfinished step 3
    losses, state = train(Workload(TINY, mesh_shape(m), B), m, 4, checkpoint_dir=d, resume=True, return_state=True)
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


# --- issue 17, items 11-15: unusable directories, seeds, damaged or diverged state, save messages, leftovers ---


def test_directories_that_cannot_be_written_are_refused_up_front(tmp_path, monkeypatch):
    """Each way a checkpoint directory cannot be used is one ValueError from check_directory (which the
    command line and train run before anything is built), and nothing is created."""
    (tmp_path / "FILE").write_text("not a directory\n")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    os.symlink(tmp_path / "nothing", tmp_path / "dangling")
    cases = [(tmp_path / "FILE" / "sub", False, r"'.*/FILE' is a file, not a directory"),
             ("/proc/x", False, r"--checkpoint-dir '/proc/x': cannot write in '/proc'"),  # root can't either
             (tmp_path / "loop", False, r"'.*/loop': Too many levels of symbolic links"),
             (tmp_path / "loop" / "sub", True, r"'.*/loop': Too many levels of symbolic links"),
             (tmp_path / "dangling", True, r"'.*/dangling': No such file or directory")]
    if importlib.util.find_spec("gcsfs") is None:  # gs:// is what a multi-host slice uses
        cases.append(("gs://bucket/run", False, r"--checkpoint-dir 'gs://bucket/run': .*install gcsfs"))
    for directory, resume, match in cases:
        with pytest.raises(ValueError, match=match):
            ckpt.check_directory(directory, resume)

    # A directory this user may not write in. Root writes anywhere, so os.access answers as it would for
    # another user (it says False for a read-only mount to root as well).
    ro, access = tmp_path / "ro", os.access
    ro.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: os.fspath(p) != str(ro) and access(p, mode, **kw))
    for directory, resume in ((ro / "sub", False), (ro, True)):
        with pytest.raises(ValueError, match=r"no permission to read and write in '.*/ro'"):
            ckpt.check_directory(directory, resume)
    monkeypatch.undo()
    # chmod 000 with --resume: refused for anyone but root, whose override makes it usable
    os.chmod(ro, 0)
    if os.geteuid() == 0:
        ckpt.check_directory(ro, True)
    else:
        with pytest.raises(ValueError, match="no permission"):
            ckpt.check_directory(ro, True)
    os.chmod(ro, 0o755)
    assert sorted(os.listdir(tmp_path)) == ["FILE", "dangling", "loop", "ro"] and os.listdir(ro) == []


def test_seeds_are_32_bit():
    """jax.random.key keeps a seed's low 32 bits (64-bit types off), so 2^32 + 1 trained as seed 1 while the
    checkpoint's metadata called it another seed; 2^63 overflowed."""
    m = make_mesh("fsdp=8", "cpu:8")
    for seed in (2**32, 2**32 + 1, 2**63, -1):
        with pytest.raises(ValueError, match=r"^seed must be an integer in 0\.\.4294967295 \(a 32-bit seed\)"):
            train(Workload(TINY, mesh_shape(m), B), m, 1, seed=seed)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of 2 steps of the tiny model on fsdp=4,tensor=2."""
    d = tmp_path_factory.mktemp("saved") / "ck"
    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    train(Workload(TINY, mesh_shape(m), B), m, 2, checkpoint_dir=d)
    return d


def test_a_flipped_bit_in_a_checkpoint_is_found(saved, tmp_path):
    """The same checkpoint with one bit of one array flipped (the lowest mantissa bit: 1 ulp, finite, so only
    a checksum sees it), written by orbax with the metadata the good state was saved with, as damage on
    disk leaves it: the restore refuses it. A flip of bit b changes the sum mod 2^32 by 2^b."""
    abstract = state_shardings(TINY, make_mesh("fsdp=2,tensor=4", "cpu:8"))[0]
    step, state, meta = ckpt.restore_latest(saved, abstract)
    w = np.asarray(state["params"]["w_out"]).copy()
    w.view(np.uint32).flat[1000] ^= 1
    bad = {**state, "params": {**state["params"], "w_out": jax.device_put(w, state["params"]["w_out"].sharding)}}
    mngr = ckpt.open_manager(tmp_path / "flipped", create=True)
    mngr.save(step, args=ckpt._ocp().args.StandardSave(bad), custom_metadata=meta)
    mngr.wait_until_finished()
    mngr.close()
    with pytest.raises(ValueError, match=r"checkpoint step 2 in --checkpoint-dir '.*/flipped' is damaged: "
                                         r"\['params'\]\['w_out'\] does not match the checksum saved with it"):
        ckpt.restore_latest(tmp_path / "flipped", abstract)


def test_a_loss_that_is_not_finite_stops_before_saving(tmp_path):
    """lr = 1e30: step 0's AdamW update moves every weight by ~1e30 (finite, saved as step 1); step 1's
    forward pass through six such matmuls overflows FP32 (3.4e38), loss NaN: the run stops there, saves
    nothing more, and step 1 stays the latest checkpoint (before: it trained on, exit 0, saving NaN states
    and rotating the good steps away)."""
    d = tmp_path / "ck"
    with pytest.raises(ValueError, match=rf"^step 1: the loss is nan, not a finite number: .*; {d} keeps steps up to"):
        m = make_mesh("fsdp=8", "cpu:8")
        train(Workload(TINY, mesh_shape(m), B), m, 6, lr=1e30, checkpoint_dir=d, save_every=1)
    assert os.listdir(d) == ["1"]


def test_saved_is_said_once_committed_and_an_interrupted_first_save_is_removed(tmp_path):
    """A crash during a run's first save leaves only ``<k>.orbax-checkpoint-tmp-<time>``: a new run removes it
    and says so, and so does --resume, starting from step 0. "saved step k" is said once step k's directory
    has its final name (orbax renames the temporary directory when every file is written)."""
    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    d, lines, committed = tmp_path / "ck", [], []
    (d / "2.orbax-checkpoint-tmp-1764000000000000" / "default").mkdir(parents=True)

    def say(line):
        lines.append(line)
        if line.startswith("saved step "):
            committed.append((line.split()[2], os.path.isdir(d / line.split()[2])))

    losses = train(Workload(TINY, mesh_shape(m), B), m, 3, checkpoint_dir=d, save_every=1, say=say)
    assert lines[0] == f"removed 2.orbax-checkpoint-tmp-1764000000000000 from {d}: a save that never finished"
    assert committed == [("1", True), ("2", True), ("3", True)]
    assert sorted(os.listdir(d)) == ["1", "2", "3"]

    d2, lines = tmp_path / "ck2", []
    (d2 / "1.orbax-checkpoint-tmp-1764000000000000").mkdir(parents=True)
    assert train(Workload(TINY, mesh_shape(m), B), m, 1, checkpoint_dir=d2, resume=True, say=lines.append) == losses[:1]
    assert lines[:2] == [f"no complete checkpoint in {d2}, only an unfinished save: starting from step 0",
                         f"removed 1.orbax-checkpoint-tmp-1764000000000000 from {d2}: a save that never finished"]
    assert os.listdir(d2) == ["1"]


def test_a_failed_read_changes_no_logging_of_the_process(saved, tmp_path):
    """A truncated manifest.ocdbt is one ValueError; what keeps orbax's abandoned reads quiet meanwhile
    (absl and asyncio log levels, sys.unraisablehook) is put back when restore_latest returns."""
    shutil.copytree(saved, tmp_path / "ck")
    with open(tmp_path / "ck" / "2" / "default" / "manifest.ocdbt", "r+b") as f:
        f.truncate(50)
    levels = {n: logging.getLogger(n).level for n in ("absl", "asyncio")}
    hook = sys.unraisablehook
    with pytest.raises(ValueError, match=r"checkpoint step 2 .* cannot be read: .*manifest"):
        ckpt.restore_latest(tmp_path / "ck", state_shardings(TINY, make_mesh("fsdp=8", "cpu:8"))[0])
    assert {n: logging.getLogger(n).level for n in levels} == levels
    assert sys.unraisablehook is hook


def test_the_unraisable_hook_is_replaced_only_inside_a_read(monkeypatch):
    """Importing checkpoint leaves sys.unraisablehook alone; inside _reading (around restore_latest's reads)
    it drops only what orbax's abandoned reads report ("Event loop is closed") and passes the rest on to the
    hook installed before; when the block ends, also by an exception, that hook is back."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append((u.exc_type, str(u.exc_value))))
    mine = sys.unraisablehook

    class RaisesOnDelete:  # CPython reports an exception raised in __del__ to sys.unraisablehook
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            raise self.exc

    check = "import sys; h = sys.unraisablehook; import ffn_model.checkpoint; sys.exit(sys.unraisablehook is not h)"
    assert subprocess.run([sys.executable, "-c", check], env=ENV).returncode == 0
    with pytest.raises(KeyError):
        with ckpt._reading():
            assert sys.unraisablehook is not mine
            RaisesOnDelete(RuntimeError("Event loop is closed"))
            RaisesOnDelete(ZeroDivisionError("not orbax's"))
            raise KeyError("the read failed")
    assert sys.unraisablehook is mine
    RaisesOnDelete(RuntimeError("Event loop is closed"))
    assert reported == [(ZeroDivisionError, "not orbax's"), (RuntimeError, "Event loop is closed")]
