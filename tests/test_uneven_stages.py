"""Uneven pipeline stages (issue 37, item 2): any L over S stages, by the default rule or an explicit list, run as a
padded stack of S·Lmax slots whose padding slots are identities (ffn_model.pipeline.padded_slots): 5 blocks on 2
stages and 7 on 4 train like one device (transformer GPipe and 1F1B, FFN stack GPipe), the padding never changes;
the closed forms hold Lmax blocks a stage; bad lists are one-line errors; predict describes BLOOM's 70 layers on 12
stages and a 126-layer model on 8 and 16."""


import jax
import numpy as np
import pytest

from ffn_model.pipeline import padded_slots, real_blocks
from ffn_model.train import train
from mesh import make_mesh
from scaling.step import pipeline as closed
from scaling.families.ffn import FFNConfig
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import get_preset
from scaling.step.memory import memory_per_device
from scaling.core.schedule import Schedule, default_stage_blocks
from scaling.core.workload import Workload
from tests.helpers import (LR, STEPS, assert_bands as _assert_bands, assert_matches,
                           assert_tpu_bands as _assert_tpu_bands, one_device)
from verify.check import check, grid_workload
from verify.grids import TPU_UNEVEN_STAGE_GRID, UNEVEN_STAGE_GRID

# the tiny transformer with a 512-token vocabulary (tests/test_transformer.py's PIPE_TF, 5 or 7 layers)
TF = get_preset("tiny-tf").replace(kv_heads=4, vocab=512)
B_TF = 4 * TF.seq_len
FFN = FFNConfig(d_model=64, d_ff=256, blocks=5)
B_FFN = 64


def _mesh(spec):
    return make_mesh(spec, jax.devices()[: parse_mesh_spec(spec).devices])


def _one_device(cfg, batch_tokens):
    return one_device(cfg, batch_tokens)


def test_default_rule_by_hand():
    """DeepSpeed's uniform split with the embedding and output counted as a block on the first and last stages:
    BLOOM's 70 + 2 = 72 = 12·6 items, so 5, 6 (×10), 5 (BLOOM's Megatron-DeepSpeed run); Llama 3's 126 + 2 = 128 =
    16·8: 7, 8 (×14), 7 (Dubey et al. 2024: one layer fewer on the first and last stage); on 8: 15, 16 (×6), 15.
    5 + 2 = 7 items on 2: 4, 3 less the ends: 3, 2. 7 + 2 = 9 on 4: 3, 2, 2, 2 less the ends: 2, 2, 2, 1. Without
    a vocabulary the L blocks alone: 5 on 2: 3, 2; 7 on 4: 2, 2, 2, 1. 5 + 2 = 7 on 4 would leave the last stage
    none (2, 2, 2, 1 less the ends: 1, 2, 2, 0): the blocks alone, 2, 1, 1, 1. Even splits stay even (8 on 4)."""
    assert default_stage_blocks(70, 12, 1) == (5,) + (6,) * 10 + (5,)
    assert default_stage_blocks(126, 16, 1) == (7,) + (8,) * 14 + (7,)
    assert default_stage_blocks(126, 8, 1) == (15,) + (16,) * 6 + (15,)
    assert default_stage_blocks(5, 2, 1) == (3, 2) == default_stage_blocks(5, 2)
    assert default_stage_blocks(7, 4, 1) == (2, 2, 2, 1) == default_stage_blocks(7, 4)
    assert default_stage_blocks(5, 4, 1) == (2, 1, 1, 1)
    assert default_stage_blocks(8, 4, 1) == (2, 2, 2, 2)
    # the padded layout: 5 = 3 + 2 on 2 stages of Lmax = 3 slots: blocks in slots 0, 1, 2 | 3, 4 (slot 5 padding)
    assert padded_slots((3, 2)).tolist() == [0, 1, 2, 3, 4]
    assert padded_slots((2, 2, 2, 1)).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert padded_slots((1, 3)).tolist() == [0, 3, 4, 5]


@pytest.mark.parametrize("schedule, stage, message", [
    (Schedule(2, stage_blocks=(3, 3)), 2, "stage_blocks=3,3 sums to 6, not blocks=5"),
    (Schedule(2, stage_blocks=(2, 2, 1)), 2, "stage_blocks=2,2,1 lists 3 stages; the mesh has stage=2"),
    (Schedule(4), 8, "blocks=5 cannot fill stage=8 (every stage needs at least one block)"),
    (Schedule(4, repeats=3), 2, "blocks=5 cannot fill the 6 chunks of stage=2, repeats=3"),
])
def test_bad_splits_are_value_errors(schedule, stage, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Workload(FFN, {"stage": stage}, B_FFN * 4, schedule=schedule)


def test_a_zero_in_the_list_is_a_value_error():
    with pytest.raises(ValueError, match="stage_blocks=5,0 must list a positive block count for every stage"):
        Schedule(2, stage_blocks=(5, 0))


def test_closed_forms_hold_the_largest_stage():
    """7 FFN blocks on 4 stages (2, 2, 2, 1) run as 4·2 = 8 slots: FLOPs, memory and collectives those of an even
    8-block stack on 4 stages (every stage runs its Lmax = 2 slots each iteration), the useful ("model") FLOPs
    those of 7 blocks."""
    mesh = {"stage": 4, "fsdp": 2}
    seven = Workload(FFN.replace(blocks=7), mesh, 256, schedule=Schedule(4))
    eight = Workload(FFN.replace(blocks=8), mesh, 256, schedule=Schedule(4))
    assert closed.largest_stage(seven.model, seven.schedule, 4) == 2
    assert closed.padding(seven.model, seven.schedule, 4) == 8 / 7
    f7, f8 = seven.model.forms.step_flops(seven), eight.model.forms.step_flops(eight)
    assert f7["total"] == pytest.approx(f8["total"])
    # useful FLOPs of the 7 real blocks by hand: 6·(2·D·F·L)·B less the first block's unneeded input gradient
    # (2·B·D·F), over the 8 devices: (6·2·64·256·7·256 − 2·256·64·256)/8 = (352,321,536 − 8,388,608)/8
    assert f7["model"] == pytest.approx(42_991_616)
    assert memory_per_device(seven)["total"] == pytest.approx(memory_per_device(eight)["total"])
    assert seven.model.forms.collective_volumes(seven) == eight.model.forms.collective_volumes(eight)
    # the transformer the same way: 7 layers (2, 2, 2, 1) against 8
    t7 = Workload(TF.replace(blocks=7), {"stage": 4, "tensor": 2}, B_TF, schedule=Schedule(4))
    t8 = Workload(TF.replace(blocks=8), {"stage": 4, "tensor": 2}, B_TF, schedule=Schedule(4))
    assert t7.model.forms.step_flops(t7)["total"] == pytest.approx(t8.model.forms.step_flops(t8)["total"])
    assert memory_per_device(t7)["total"] == pytest.approx(memory_per_device(t8)["total"])


def _check_padding(params, counts):
    """Every padding slot of every stack is still exactly zero (zero gradient, never updated by AdamW)."""
    real = set(padded_slots(counts).tolist())
    pad = [i for i in range(len(counts) * max(counts)) if i not in real]
    assert pad
    for name, p in params.items():
        p = np.asarray(p)
        if p.shape[0] == len(counts) * max(counts) and p.ndim > 2:
            assert np.all(p[pad] == 0), name


# (model, blocks, mesh, schedule, remat, the split)
CASES = [
    ("tf", 5, "stage=2,tensor=2", Schedule(2), "none", (3, 2)),
    ("tf", 7, "stage=4,tensor=2", Schedule(4), "full", (2, 2, 2, 1)),
    ("tf", 5, "stage=2,fsdp=2,tensor=2", Schedule(2, pipeline="1f1b"), "none", (3, 2)),
    ("tf", 7, "stage=4,tensor=2", Schedule(4, pipeline="1f1b", stage_blocks=(1, 2, 2, 2)), "full", (1, 2, 2, 2)),
    ("ffn", 5, "stage=2,fsdp=2", Schedule(2), "none", (3, 2)),
    ("ffn", 7, "stage=4,fsdp=2", Schedule(4), "full", (2, 2, 2, 1)),
]


@pytest.mark.numerics
@pytest.mark.parametrize("kind, L, spec, schedule, remat, counts", CASES,
                         ids=[f"{k}{L}-{s}-{sc.pipeline}-{r}" for k, L, s, sc, r, _ in CASES])
def test_uneven_stages_match_one_device(kind, L, spec, schedule, remat, counts):
    """3 AdamW steps with L blocks on uneven stages against one device: the real blocks (the padded stacks' slots
    mapped back, real_blocks) within tests/test_pipeline.py's tolerances; the padding slots exactly zero."""
    cfg, B = (TF, B_TF) if kind == "tf" else (FFN, B_FFN)
    cfg = cfg.replace(blocks=L)
    w = Workload(cfg, parse_mesh_spec(spec), B, remat=remat, schedule=schedule)
    assert closed.stage_blocks(cfg, schedule, parse_mesh_spec(spec)["stage"]) == counts
    losses, state = train(w, _mesh(spec), STEPS, lr=LR, return_state=True)
    params = jax.tree.map(np.asarray, state["params"])
    _check_padding(params, counts)
    stacked = {n: real_blocks(p, counts) if p.shape[0] == len(counts) * max(counts) and p.ndim > 2 else p
               for n, p in params.items()}
    assert_matches(losses, stacked, _one_device(cfg, B))
    assert losses[-1] < losses[0]


PREDICT = "predict --chip A100-80GB --global-batch 2048 --remat full --schedule 1f1b"


@pytest.mark.parametrize("args, expect", [
    # BLOOM-176B's 70 layers on 12 stages (its 384-GPU run: data 8, stage 12, tensor 4), the default split
    (f"{PREDICT} --preset bloom-176b --chips 384 --mesh data=8,stage=12,tensor=4 --microbatches 128",
     "stages of 5,6,6,6,6,6,6,6,6,6,6,5 blocks"),
    # Llama 3.1 405B's 126 layers on 16 and on 8 stages, and an explicit list (Megatron's first/last counts)
    (f"{PREDICT} --preset llama3.1-405b --chips 2048 --mesh data=16,stage=16,tensor=8 --microbatches 16",
     "stages of 7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7 blocks"),
    (f"{PREDICT} --preset llama3.1-405b --chips 1024 --mesh data=16,stage=8,tensor=8 --microbatches 16",
     "stages of 15,16,16,16,16,16,16,15 blocks"),
    (f"{PREDICT} --preset llama3.1-405b --chips 1024 --mesh data=16,stage=8,tensor=8 --microbatches 16 "
     "--stage-blocks 14,16,16,16,16,16,16,16", "stages of 14,16,16,16,16,16,16,16 blocks"),
])
def test_predict_describes_uneven_stages(capsys, args, expect):
    from jax_scaling.cli import main
    assert main(args.split()) == 0
    out = capsys.readouterr().out
    assert expect in out and "step:" in out


@pytest.mark.parametrize("flag, message", [
    ("--stage-blocks 60,10,0", "stage_blocks=60,10,0 must list a positive block count for every stage"),
    ("--stage-blocks 30,30,9", "stage_blocks=30,30,9 sums to 69, not blocks=70"),
    ("--stage-blocks 30,40", "stage_blocks=30,40 lists 2 stages; the mesh has stage=3"),
    ("--stage-blocks 3,x", "is not a comma-separated list of block counts"),
])
def test_bad_lists_are_one_error_line(capsys, flag, message):
    from jax_scaling.cli import main
    args = f"{PREDICT} --preset bloom-176b --chips 384 --mesh data=32,stage=3,tensor=4 --microbatches 8 {flag}"
    try:
        rc = main(args.split())
    except SystemExit as e:  # argparse's own error (the list's type)
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.grid
@pytest.mark.parametrize("row", range(len(UNEVEN_STAGE_GRID)))
def test_uneven_check_grid(row):
    """verify.check on 8 CPU devices: FLOPs (every stage's Lmax slots, padding included), arguments (the padded
    stacks) and collectives per axis in tests/test_check.py's bands."""
    rep = check(grid_workload(*UNEVEN_STAGE_GRID[row]), "cpu:8")
    _assert_bands(rep)
    assert any("stage" in key.split("+") for key in rep.collectives.by_axis)


@pytest.mark.grid
@pytest.mark.tpu
@pytest.mark.parametrize("row", TPU_UNEVEN_STAGE_GRID, ids=lambda g: f"{g[1].blocks}-{g[2]}")
def test_uneven_tpu_grid(row):
    """The 5-block FFN stack (3, 2) on v5p:2x2x2, ahead of time: every band, the compiler's peak within 10%."""
    devices, *rest = row
    _assert_tpu_bands(check(grid_workload(*rest), devices))
