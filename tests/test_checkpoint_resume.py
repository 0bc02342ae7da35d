"""A damaged newest checkpoint (issue 49, item 13): the refusal names the newest older step that reads intact and
how to resume from it (--resume-step N), and --resume-step N resumes there with the losses of an uninterrupted
run, removing the checkpoints after N. Damage is made as tests/test_checkpoint.py makes it: a truncated
manifest.ocdbt (orbax cannot read the arrays), a changed byte of the metadata (its sha256 differs)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ffn_model import checkpoint as ckpt
from ffn_model.train import train
from mesh import make_mesh, mesh_shape
from scaling.families.presets import PRESETS
from scaling.core.workload import Workload
from tests.helpers import run_cli as run, refused

TINY = PRESETS["tiny"]  # D=64, F=256, L=3
B = 64
MESH = "fsdp=8"




def train_argv(d, *more) -> list[str]:
    return ["train", "--preset", "tiny", "--devices", "cpu:8", "--mesh", MESH, "--batch-tokens", str(B),
            "--checkpoint-dir", str(d), *more]


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    """Steps 1, 2 and 3 of the tiny model on fsdp=8 (a save after every step), and the losses of 4 uninterrupted
    steps without checkpoints."""
    d = tmp_path_factory.mktemp("resume") / "ck"
    m = make_mesh(MESH, "cpu:8")
    train(Workload(TINY, mesh_shape(m), B), m, 3, checkpoint_dir=d, save_every=1)
    assert sorted(os.listdir(d)) == ["1", "2", "3"]
    return d, train(Workload(TINY, mesh_shape(m), B), m, 4)


def truncate_arrays(d, step: int) -> None:
    """Step ``step``'s array manifest cut to 50 bytes: orbax cannot read it."""
    with open(d / str(step) / "default" / "manifest.ocdbt", "r+b") as f:
        f.truncate(50)


def change_metadata_byte(d, step: int) -> None:
    """One byte of step ``step``'s metadata changed (the seed 0 -> 1): its sha256 no longer matches."""
    f = d / str(step) / "_CHECKPOINT_METADATA"
    f.write_text(f.read_text().replace('"seed": 0,', '"seed": 1,'))


@pytest.mark.compiles
def test_a_damaged_newest_step_names_the_newest_intact_one(three_steps, tmp_path):
    """Steps 3 (arrays unreadable) and 2 (metadata changed) damaged: --resume is refused in one line that says step
    1 is intact and to resume with --resume-step 1 (before: "checkpoint step 3 ... cannot be read: ..." and no
    more). --resume-step 1 then trains steps 1..3 with the uninterrupted run's losses (batch i is a function of
    (seed, i)), says it removed steps 2 and 3, and saves step 4 in their place."""
    src, full = three_steps
    d = tmp_path / "ck"
    shutil.copytree(src, d)
    truncate_arrays(d, 3)
    change_metadata_byte(d, 2)
    code, out, err, _ = run(train_argv(d, "--steps", "4", "--resume"))
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, out, err)
    assert lines[0].startswith(f"error: checkpoint step 3 in --checkpoint-dir '{d}' cannot be read: "), lines[0]
    assert lines[0].endswith("; step 1 is intact: resume from it with --resume-step 1 (the checkpoints after it "
                             "are removed)"), lines[0]
    assert sorted(os.listdir(d)) == ["1", "2", "3"]  # the refusal wrote nothing

    code, out, err, _ = run(train_argv(d, "--steps", "4", "--resume-step", "1", "--json"))
    assert code == 0, err
    rep = json.loads(out)
    assert rep["start_step"] == 1 and rep["losses"] == full[1:4]
    assert f"resumed from step 1 in {d} (saved on mesh {MESH}, restored on mesh {MESH})" in err
    assert f"removed step 2 from {d}: newer than --resume-step 1" in err
    assert f"removed step 3 from {d}: newer than --resume-step 1" in err
    assert sorted(os.listdir(d)) == ["1", "4"]
    assert ckpt.restore_latest(d, ckpt_abstract())[0] == 4  # the new step reads intact


def ckpt_abstract():
    from ffn_model.train import state_shardings

    m = make_mesh(MESH, "cpu:8")
    return state_shardings(Workload(TINY, mesh_shape(m), B), m)[0]


@pytest.mark.compiles
def test_every_older_step_damaged_says_so(three_steps, tmp_path):
    """Every step damaged: the newest's refusal says the older steps (1, 2) are damaged too and to start anew; a
    single damaged step (nothing older) keeps the one message it had."""
    src, _ = three_steps
    d = tmp_path / "ck"
    shutil.copytree(src, d)
    truncate_arrays(d, 3)
    change_metadata_byte(d, 2)
    truncate_arrays(d, 1)
    with pytest.raises(ValueError, match=r"^checkpoint step 3 .* cannot be read: .*; the older steps \(1, 2\) are "
                                         r"damaged too: start anew in an empty --checkpoint-dir$"):
        ckpt.restore_latest(d, ckpt_abstract(), {"model": vars(TINY), "seed": 0})
    for k in ("1", "2"):
        shutil.rmtree(d / k)
    with pytest.raises(ValueError, match=r"^checkpoint step 3 .* cannot be read: ") as e:
        ckpt.restore_latest(d, ckpt_abstract())
    assert "intact" not in str(e.value) and "damaged too" not in str(e.value)


def test_resume_step_refusals(tmp_path):
    """--resume-step N: N a complete step of --checkpoint-dir (one line naming the steps there are), a positive
    integer, with --checkpoint-dir; each refused before jax starts, nothing written. The steps here are directories
    with orbax's commit marker and metadata file (what makes a step complete: ffn_model.checkpoint.step_problem),
    which is all the check reads."""
    d = tmp_path / "ck"
    for k in (1, 2, 3):
        (d / str(k)).mkdir(parents=True)
        (d / str(k) / "commit_success.txt").write_text("")
        (d / str(k) / "_CHECKPOINT_METADATA").write_text("{}")
    (d / "5").mkdir()  # an incomplete save is no step to resume from
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    refused(train_argv(d, "--steps", "6", "--resume-step", "5"),
            f"error: --resume-step 5: --checkpoint-dir '{d}' holds no complete checkpoint step 5 (complete steps: "
            "1, 2, 3)")
    refused(train_argv(d, "--steps", "6", "--resume-step", "0"), "--resume-step")
    refused(train_argv(tmp_path / "new", "--steps", "6", "--resume-step", "2"), "does not exist: nothing to resume")
    refused(["train", "--preset", "tiny", "--devices", "cpu:8", "--mesh", MESH, "--batch-tokens", str(B),
             "--steps", "6", "--resume-step", "2"], "--resume-step needs --checkpoint-dir")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
