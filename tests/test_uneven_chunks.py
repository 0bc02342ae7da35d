"""Uneven chunks for the circular and interleaved 1F1B schedules (issue 49, item 16): Llama 3 405B's 126 layers on 8
or 16 stages with virtual stages, as its paper and Megatron-Bridge's recipes ran them. Each of the S·R chunks holds its
own count (the default rule over the chunks, Megatron-LM's embedding/loss accounting with virtual stages; a count a
stage split over its chunks; or one a chunk, Megatron-LM's --pipeline-model-parallel-layout), every chunk padded to the
largest with masked slots: the closed forms by hand, predict and the planner's schedules no longer refuse them, bad
lists are one line, and on 8 CPU devices the compiled programs sit in the even rows' bands and train like one
device."""

from __future__ import annotations


import pytest

from scaling.step import pipeline as closed
from scaling.planner import plan as planner
from scaling.families.ffn import FFNConfig
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import get_preset
from scaling.step.memory import memory_per_device
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from tests.helpers import assert_bands, assert_matches, one_device, run_steps
from verify.grids import UNEVEN_CHUNK_GRID
from tests.helpers import run_cli as _run, refused

L405 = get_preset("llama3.1-405b")  # 126 layers, a vocabulary
# the numerics' tiny transformer (tests/helpers.py PIPE_TF: a 512-token vocabulary) with 7 layers
TF = get_preset("tiny-tf").replace(kv_heads=4, vocab=512, blocks=7)
B_TF = 4 * TF.seq_len
FFN = FFNConfig(d_model=64, d_ff=256, blocks=7)




def test_chunks_of_405b_by_hand():
    """126 layers + the embedding and the output counted as a layer each = 128 items (Megatron-LM's
    --account-for-embedding/loss-in-pipeline-split, which Megatron-Bridge offers for large vocabularies). 16 stages,
    R = 2: 128/32 = 4 a
    chunk, the first chunk (stage 0's first) and the last (stage 15's last) one fewer: 3, 4 (x30), 3; stage 0 holds
    chunks 0 and 16, 3 + 4 = 7, stage 15 chunks 15 and 31, 4 + 3 = 7: the stages 7, 8 (x14), 7 of Dubey et al. 2024
    (sec. 3.3.2). R = 4: 128/64 = 2: 1, 2 (x62), 1. 8 stages, R = 8 (PP 8, VP 8 of NVIDIA's dgxc-benchmarking
    Llama 3.1 405B recipe): 1, 2 (x62), 1, stages 1 + 7·2 = 15, 16 (x6), 15. Every chunk padded to 4 (or 2) slots:
    8 (16) a stage, as GPipe's stages of 8 (16); the stacks 128 slots for 126 layers."""
    s16r2 = closed.chunk_counts(L405, Schedule(16, repeats=2), 16)
    assert s16r2 == (3,) + (4,) * 30 + (3,)
    assert closed.stage_blocks(L405, Schedule(16, repeats=2), 16) == (7,) + (8,) * 14 + (7,)
    assert closed.chunk_counts(L405, Schedule(16, repeats=4), 16) == (1,) + (2,) * 62 + (1,)
    assert closed.chunk_counts(L405, Schedule(8, repeats=8), 8) == (1,) + (2,) * 62 + (1,)
    assert closed.stage_blocks(L405, Schedule(8, repeats=8), 8) == (15,) + (16,) * 6 + (15,)
    for S, R, Cmax in ((16, 2, 4), (16, 4, 2), (8, 8, 2)):
        sched = Schedule(S, repeats=R)
        assert closed.chunk_blocks(L405, sched, S) == Cmax
        assert closed.largest_stage(L405, sched, S) == R * Cmax == 128 // S
        assert closed.padding(L405, sched, S) == pytest.approx(128 / 126)
    assert closed.layout_text(s16r2) == "3,4*30,3"


def test_bubble_of_405b_by_hand():
    """Interleaved 1F1B with warm-up phases (Megatron's schedule), S = 16, R = 2, M = 16: R·M + S − 1 = 47
    chunk-slots a stage, Megatron's bubble (S − 1)/(R·M) = 15/32 = 0.46875 of the ideal step. Each slot runs Cmax = 4
    layer-slots: 47·4 = 188 a stage, where balanced stages without a bubble run M·L/S = 16·126/16 = 126: overhead
    188/126 − 1 = 62/126 = 0.49206, idle share 62/188 = 0.32979, the padding 128/126 − 1 = 2/126. Circular, S = 8,
    R = 8, M = 8: R·M + S − 1 = 71 slots of 2: 142 against 8·126/8 = 126: 16/126."""
    sched = Schedule(16, repeats=2, pipeline="1f1b", warmup_phases=True)
    assert closed.bubble(sched, 16)["overhead"] == pytest.approx(15 / 32)
    b = closed.padded_bubble(L405, sched, 16)
    assert b["overhead"] == pytest.approx(62 / 126)
    assert b["idle_share"] == pytest.approx(62 / 188)
    assert b["padding"] == pytest.approx(2 / 126)
    assert closed.padded_bubble(L405, Schedule(8, repeats=8), 8)["overhead"] == pytest.approx(16 / 126)
    # even chunks: Megatron's (S − 1)/(R·M) again (32 layers on 4 stages, R = 2, M = 8: 3/16)
    even = get_preset("llama3.1-8b")
    assert closed.padded_bubble(even, Schedule(8, repeats=2, pipeline="1f1b", warmup_phases=True),
                                4)["overhead"] == pytest.approx(3 / 16)


def test_explicit_lists_by_hand():
    """A count a stage with R = 2: each split as DeepSpeed's uniform (floor(L_s/2), the first L_s mod 2 one more):
    7 -> 4, 3 and 8 -> 4, 4, so chunks r = 0 (stages 0..15) are 4 (x16), r = 1: 3, 4 (x14), 3. A count a chunk (32 of
    them, Megatron-LM's layout): as given, the stages their sums. 7 on 2 stages, R = 2, the default: 7 + 2 = 9 items
    over 4 chunks: 3, 2, 2, 2 less the ends: 2, 2, 2, 1, stages 2 + 2 = 4 and 2 + 1 = 3; 6: 8 over 4 = 2 each less the
    ends: 1, 2, 2, 1: even stages (3, 3), uneven chunks; padded layout of 1, 2, 2, 1 in chunks of 2 slots: blocks in
    slots 0 | 2, 3 | 4, 5 | 6."""
    from ffn_model.pipeline import padded_slots
    per_stage = Schedule(16, repeats=2, stage_blocks=(7,) + (8,) * 14 + (7,))
    assert closed.chunk_counts(L405, per_stage, 16) == (4,) * 16 + (3,) + (4,) * 14 + (3,)
    layout = (2,) + (4,) * 31  # 2 + 124 = 126
    per_chunk = Schedule(16, repeats=2, stage_blocks=layout)
    assert closed.chunk_counts(L405, per_chunk, 16) == layout
    assert closed.stage_blocks(L405, per_chunk, 16) == (6,) + (8,) * 15
    assert closed.chunk_counts(TF, Schedule(2, repeats=2), 2) == (2, 2, 2, 1)
    assert closed.stage_blocks(TF, Schedule(2, repeats=2), 2) == (4, 3)
    six = TF.replace(blocks=6)
    assert closed.chunk_counts(six, Schedule(2, repeats=2), 2) == (1, 2, 2, 1)
    assert closed.stage_blocks(six, Schedule(2, repeats=2), 2) == (3, 3)
    assert padded_slots((1, 2, 2, 1)).tolist() == [0, 2, 3, 4, 5, 6]


def test_closed_forms_hold_the_largest_chunk():
    """7 blocks on 2 stages with R = 2 (chunks 2, 2, 2, 1) run as 4 chunks of 2 slots: FLOPs, memory and collectives
    (the circular re-lay moves chunks of Cmax = 2 slots) those of an even 8-block stack, R = 2; the useful FLOPs those
    of 7 blocks: FFN, 6·(2·D·F·L)·B less the first block's unneeded input gradient (2·B·D·F) over 4 devices:
    (6·2·64·256·7·256 − 2·256·64·256)/4 = (352,321,536 − 8,388,608)/4 = 85,983,232."""
    mesh = {"stage": 2, "fsdp": 2}
    seven = Workload(FFN, mesh, 256, schedule=Schedule(2, repeats=2))
    eight = Workload(FFN.replace(blocks=8), mesh, 256, schedule=Schedule(2, repeats=2))
    f7, f8 = seven.model.forms.step_flops(seven), eight.model.forms.step_flops(eight)
    assert f7["total"] == pytest.approx(f8["total"])
    assert f7["model"] == pytest.approx(85_983_232)
    assert memory_per_device(seven)["total"] == pytest.approx(memory_per_device(eight)["total"])
    assert seven.model.forms.collective_volumes(seven) == eight.model.forms.collective_volumes(eight)
    for pipe in ("circular", "1f1b"):
        sched = Schedule(4, repeats=2, pipeline=pipe)
        t7 = Workload(TF, {"stage": 2, "tensor": 2}, B_TF, schedule=sched)
        t8 = Workload(TF.replace(blocks=8), {"stage": 2, "tensor": 2}, B_TF, schedule=sched)
        assert t7.model.forms.step_flops(t7)["total"] == pytest.approx(t8.model.forms.step_flops(t8)["total"])
        assert memory_per_device(t7)["total"] == pytest.approx(memory_per_device(t8)["total"])
        v7, v8 = t7.model.forms.collective_volumes(t7), t8.model.forms.collective_volumes(t8)
        assert v7["stage"] == pytest.approx(v8["stage"])


PREDICT = ("predict --preset llama3.1-405b --chip H100 --global-batch 2048 --remat full --microbatches 16 "
           "--schedule 1f1b")


@pytest.mark.parametrize("args, expect", [
    # 16 stages with 2 and 4 virtual stages (the default rule); 8 stages with 8 (dgxc-benchmarking's 405B recipe)
    (f"{PREDICT} --chips 16384 --mesh fsdp=128,stage=16,tensor=8 --repeats 2", "in chunks of 3,4*30,3"),
    (f"{PREDICT} --chips 16384 --mesh fsdp=128,stage=16,tensor=8 --repeats 4", "in chunks of 1,2*62,1"),
    (f"{PREDICT} --chips 8192 --mesh fsdp=128,stage=8,tensor=8 --repeats 8", "in chunks of 1,2*62,1"),
    # circular, and the lists: a count a stage (split over its chunks) and a count a chunk
    (f"{PREDICT.replace('1f1b', 'circular')} --chips 16384 --mesh fsdp=128,stage=16,tensor=8 --repeats 2",
     "in chunks of 3,4*30,3"),
    (f"{PREDICT} --chips 16384 --mesh fsdp=128,stage=16,tensor=8 --repeats 2 --stage-blocks 7{',8' * 14},7",
     "in chunks of 4*16,3,4*14,3"),
    (f"{PREDICT} --chips 16384 --mesh fsdp=128,stage=16,tensor=8 --repeats 2 --stage-blocks 2{',4' * 31}",
     "stages of 6,8,8,8,8,8,8,8,8,8,8,8,8,8,8,8 blocks in chunks of 2,4*31"),
])
def test_predict_describes_uneven_chunks(args, expect):
    """Before: "repeats=2 (circular, interleaved 1f1b) needs the same blocks on every stage", exit 2."""
    code, out, err, _ = _run(args.split())
    assert code == 0, err
    assert expect in out.replace("\n  ", " ") and "step:" in out


def test_planner_tries_virtual_stages_of_uneven_stages():
    """The planner's schedules on a 16-stage mesh of the 405B include circular and interleaved 1F1B with R = 2 and 4
    (each 8 slots a stage, as GPipe's: repeats_for), which before were only R = 1 (7 of 126/16 is odd); R = 8 needs
    128 chunks of at least a layer each, more than 126. 8 stages: R = 2, 4, 8 (16 slots a stage each). An even
    32-layer stack on 4 stages keeps the R that divide its 8 layers a stage, 1, 2, 4 and 8, not 16 (64 chunks)."""
    assert planner.repeats_for(L405, 16, 16) == [1, 2, 4]
    assert planner.repeats_for(L405, 8, 16) == [1, 2, 4, 8]
    assert planner.repeats_for(get_preset("llama3.1-8b"), 4, 16) == [1, 2, 4, 8]
    mesh = parse_mesh_spec("fsdp=128,stage=16,tensor=8")
    choices = planner.Choices.of(L405, attention="cudnn")
    runs = {(s.pipeline, s.repeats) for s, _ in planner.schedules(L405, mesh, choices, 64, 4)}
    assert {("1f1b", 2), ("1f1b", 4), ("circular", 2), ("circular", 4)} <= runs
    assert planner.runs(L405, mesh, Schedule(16, repeats=2, pipeline="1f1b"), 2048 * 8192)


@pytest.mark.parametrize("tail, message", [
    ("--repeats 8", "blocks=126 cannot fill the 128 chunks of stage=16, repeats=8"),
    ("--repeats 2 --stage-blocks 60,66", "stage_blocks=60,66 lists 2 stages; the mesh has stage=16 (with repeats=2: "
                                         "16 stages or 32 chunks)"),
    ("--repeats 8 --stage-blocks 7" + ",8" * 14 + ",7", "with repeats=8 every stage needs at least 8 blocks"),
])
def test_bad_chunks_are_one_error_line(tail, message):
    refused(f"{PREDICT} --chips 16384 --mesh fsdp=128,stage=16,tensor=8 {tail}".split(), message)


def test_check_refuses_too_few_blocks_before_compiling():
    """--repeats reaches check's schedule: 3 blocks cannot fill 2 stages of 2 chunks (refused before jax starts)."""
    refused("check --devices cpu:8 --mesh stage=2,fsdp=4 --preset tiny --blocks 3 --batch-tokens 64 --microbatches 2 "
            "--repeats 2".split(), "blocks=3 cannot fill the 4 chunks of stage=2, repeats=2")


@pytest.mark.grid
@pytest.mark.compiles
@pytest.mark.parametrize("row", UNEVEN_CHUNK_GRID, ids=lambda g: g[-1].pipeline)
def test_uneven_chunks_check(row):
    """verify.check on 8 CPU devices: FLOPs (every chunk's Cmax slots, padding and bubble included), arguments (the
    padded stacks) and collectives per axis (the circular re-lay in chunks of Cmax) in the even rows' bands."""
    from verify.check import check, grid_workload
    rep = check(grid_workload(*row), "cpu:8")
    assert_bands(rep)
    assert any("stage" in key.split("+") for key in rep.collectives.by_axis)


@pytest.mark.numerics
@pytest.mark.compiles
@pytest.mark.parametrize("schedule", [Schedule(2, repeats=2, pipeline="1f1b"), Schedule(2, repeats=2)],
                         ids=["interleaved-1f1b", "circular"])
def test_uneven_chunks_match_one_device(schedule):
    """3 AdamW steps of the 7-layer transformer on stage=2,fsdp=2,tensor=2 (8 CPU devices) in chunks of 2, 2, 2, 1
    (stage 0: 2 + 2, stage 1: 2 + 1, padded to 2 slots each) against one device: the real blocks (the padded stacks'
    slots mapped back) within tests/helpers.py's tolerance; the padding slot exactly zero."""
    import numpy as np

    from ffn_model.pipeline import padded_slots, real_blocks
    counts = closed.chunk_counts(TF, schedule, 2)
    assert counts == (2, 2, 2, 1)
    losses, params = run_steps(TF, "stage=2,fsdp=2,tensor=2", B_TF, schedule)
    real = set(padded_slots(counts).tolist())
    stacked = {}
    for name, p in params.items():
        if p.ndim > 2 and p.shape[0] == len(counts) * max(counts):  # a padded stack: 8 slots, slot 7 padding
            assert np.all(p[[i for i in range(p.shape[0]) if i not in real]] == 0), name
            p = real_blocks(p, counts)
        stacked[name] = p
    assert_matches(losses, stacked, one_device(TF, B_TF))
    assert losses[-1] < losses[0]
