"""Sequence parallelism with pipeline stages (issue 37, item 1): Megatron's layout, the activations between the
layers split over tensor along the tokens inside every stage and the stage-to-stage message the split activation
(each tensor rank sends 1/Y of it, gathered on arrival by the next layer's first all-gather), on GPipe, circular,
1F1B and interleaved 1F1B: numerics against one device, the closed forms against the compiler, plan and predict."""

import json

import pytest

from ffn_model.train import train
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from verify.check import check, grid_workload
from verify.grids import CPU_SP_STAGE_GRID, TPU_SP_STAGE_GRID
from tests.helpers import (LR, PIPE_TF, STEPS, TF_BATCH as B, assert_bands as _assert_bands, assert_matches,
                           assert_tpu_bands as _assert_tpu_bands, mesh_of as _mesh, one_device as _one_device, rows)

# (mesh, schedule, remat): 1F1B and interleaved 1F1B (R = 2: stage=2 holds chunks of 2 layers) with fsdp and
# tensor, GPipe on stage=2, tensor=4 (the sequence of 64 split 4 ways between layers), circular with full remat
SP_PIPES = [
    ("stage=2,tensor=2,fsdp=2", Schedule(2, pipeline="1f1b", sequence_parallel=True), "none"),
    ("stage=2,tensor=4", Schedule(2, repeats=2, pipeline="1f1b", sequence_parallel=True), "full"),
    ("stage=2,tensor=4", Schedule(2, sequence_parallel=True), "none"),
]


@pytest.fixture(scope="module")
def pipe_one_device():
    """3 steps of PIPE_TF (8 layers, V = 512) on one device."""
    return _one_device(PIPE_TF, B)


@pytest.mark.numerics
@pytest.mark.parametrize("spec, schedule, remat", SP_PIPES,
                         ids=[f"{s}-{k.pipeline}{k.repeats}-{r}" for s, k, r in SP_PIPES])
def test_sequence_parallel_stages_match_one_device(pipe_one_device, spec, schedule, remat):
    """3 AdamW steps of PIPE_TF with sequence parallelism on stages: losses and every parameter within
    assert_matches' tolerance of one device (the same program without any split)."""
    losses, state = train(Workload(PIPE_TF, parse_mesh_spec(spec), B, remat=remat, schedule=schedule), _mesh(spec),
                          STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], pipe_one_device)
    assert losses[-1] < losses[0]


def test_ffn_stack_refuses_sequence_parallel_stages():
    """The FFN stack's pipeline carries its activations whole: one ValueError naming the input, before anything is
    built."""
    from scaling.families.presets import get_preset
    with pytest.raises(ValueError, match="sequence_parallel with pipeline stages is built for the transformer"):
        Workload(get_preset("tiny"), parse_mesh_spec("stage=2,tensor=2"), 64,
                 schedule=Schedule(2, sequence_parallel=True))


def test_sp_stage_closed_forms_by_hand():
    """small-tf with V = 1024 (D = 256, L = 4) on stage=2, tensor=4, B = 4096 tokens in M = 4 microbatches, 1F1B,
    BF16 on the wire (c = 2), by hand:
      stage permutes: 2 directions · T = M + 2(S − 1) = 6 iterations · c · (t/M = 1024 tokens) · D/Y = 64
                      = 2·6·2·1024·64 = 1,572,864 B (without SP 4x: 6,291,456)
      tensor all-gathers: act = c·t·D = 2·4096·256 = 2,097,152; layer-passes (L/S)·T/M = 3, each 2 forward and
                      4 backward (the norms again, the outputs' gradients; the backward slot runs no forward of its
                      own), + the lookup's gradient and the final norm's output, (T/M)·act each: 3·6 + 3 = 21 act
                      = 44,040,192 B, under remat none and full alike
      ring (remat full): K = 2S − 1 = 3 slots of a chunk's 2 layer inputs, the token split c·1024·D/Y = 131,072 B
                      each, and one chunk's copy beside them: (3 + 1)·2·131,072 = 1,048,576 B."""
    from scaling.families import transformer
    from scaling.families.presets import get_preset
    cfg = get_preset("small-tf").replace(vocab=1024)
    w = Workload(cfg, parse_mesh_spec("stage=2,tensor=4"), 4096,
                 schedule=Schedule(4, pipeline="1f1b", sequence_parallel=True))
    vols = transformer.collective_volumes(w)
    assert vols["stage"]["collective-permute"] == pytest.approx(1_572_864)
    assert vols["tensor"]["all-gather"] == pytest.approx(44_040_192)
    off = transformer.collective_volumes(w.replace(schedule=Schedule(4, pipeline="1f1b")))
    assert off["stage"]["collective-permute"] == pytest.approx(6_291_456)
    full = w.replace(remat="full")
    assert transformer.collective_volumes(full)["tensor"]["all-gather"] == pytest.approx(44_040_192)
    assert transformer.memory_per_device(full)["activations"] == pytest.approx(1_048_576)


# make test keeps the one-layer 1F1B chunk under save_dot_except_mlp (the policy's only compiled row)
_GRID = rows(CPU_SP_STAGE_GRID, quick=(4,))


@pytest.mark.grid
@pytest.mark.parametrize("cfg,mesh,batch,remat,step,schedule", _GRID,
                         ids=[f"{m}-{k.pipeline}{k.repeats}-{r}-{s}{'-V' if c.vocab else ''}"
                              for c, m, _, r, s, k in CPU_SP_STAGE_GRID])
def test_cpu_sp_stage_grid(cfg, mesh, batch, remat, step, schedule):
    """Sequence parallelism on stages on 8 CPU devices: FLOPs, arguments and collectives per axis (stage's permutes
    of the split activation, tensor's all-gathers and reduce-scatters of every layer-pass the schedule runs) within
    ±2% (test_check's bands)."""
    rep = check(grid_workload(cfg, mesh, batch, remat, step, schedule), "cpu:8")
    _assert_bands(rep)
    assert {"stage", "tensor"} <= set(rep.collectives.by_axis)


@pytest.mark.grid
@pytest.mark.tpu
@pytest.mark.parametrize("devices,cfg,mesh,batch,remat,step,schedule", TPU_SP_STAGE_GRID,
                         ids=[f"{g[0][4:]}-{g[2]}-{g[-1].pipeline}" for g in TPU_SP_STAGE_GRID])
def test_tpu_sp_stage_grid(devices, cfg, mesh, batch, remat, step, schedule):
    """The 2048-wide PIPE_TF with 1F1B and sequence parallelism on v5p (ahead of time): every band, the compiler's
    peak within 10%."""
    _assert_tpu_bands(check(grid_workload(cfg, mesh, batch, remat, step, schedule), devices))


def test_plan_with_sequence_parallel_on_keeps_it_with_stages(capsys):
    """`plan --preset gpt3-175b --chip A100-80GB --chips 1024 --sequence-parallel on`: plans with stages are listed,
    and every plan has sequence parallelism (a mesh without a tensor axis, where it cannot run, is left out rather
    than listed without it)."""
    from jax_scaling.cli import main
    assert main(["plan", "--preset", "gpt3-175b", "--chip", "A100-80GB", "--chips", "1024", "--sequence-parallel",
                 "on", "--json", "--top", "100"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    staged = [p for p in plans if p["mesh"]["stage"] > 1]
    assert staged and all(p["sequence_parallel"] and p["mesh"]["tensor"] > 1 for p in plans)


def test_predict_megatron_gpt3_layout_with_sequence_parallel(capsys):
    """Megatron's GPT-3 175B layout (Narayanan et al. 2021: t = 8, p = 16 on A100s; Korthikanti et al. 2022 add
    sequence parallelism), interleaved 1F1B, selective recomputation: predicted (it exited 2 before), with the stage
    permutes of the split activation: 1/8 of those without sequence parallelism."""
    from jax_scaling.cli import main
    args = ["predict", "--preset", "gpt3-175b", "--chip", "A100-80GB", "--chips", "1536", "--mesh",
            "data=12,stage=16,tensor=8", "--global-batch", "1536", "--microbatch", "1", "--schedule", "1f1b",
            "--repeats", "6", "--remat", "selective", "--json"]
    assert main([*args, "--sequence-parallel"]) == 0
    sp = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    off = json.loads(capsys.readouterr().out)
    assert sp["schedule"]["sequence_parallel"] is True and sp["fits"]
    # the split message and kept inputs: less over stage, fewer activation bytes (the relay of the weights is the same)
    assert sp["terms"]["comms.stage"] < off["terms"]["comms.stage"]
    assert sp["memory_terms"]["activations"] < off["memory_terms"]["activations"]
