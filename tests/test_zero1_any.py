"""ZeRO-1 as a distributed optimizer on any data size and every schedule (issue 37, item 3; ffn_model.zero1): the
padding rule and the closed forms by hand, the refusals gone, 3 AdamW steps against one device where no model
dimension divides by data, and the compiled program against the closed forms (verify.grids.ZERO1_GRID)."""


import jax
import numpy as np
import pytest

from ffn_model.train import train
from mesh import make_mesh, mesh_shape
from scaling.step import program
from scaling.families.ffn import collective_volumes
from scaling.step.memory import memory_per_device
from scaling.step.memory import zero1_padded
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import get_preset
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from tests.helpers import assert_bands, assert_matches, one_device
from verify.check import check, grid_workload
from verify.grids import ZERO1_GRID

ZERO1 = Schedule(optimizer_sharding="zero1")
CPU_ROWS = [g for g in ZERO1_GRID if g[0].startswith("cpu")]
TPU_ROWS = [g for g in ZERO1_GRID if g[0].startswith("tpu")]
STEPS, LR = 3, 1e-3


def test_padding_by_hand():
    """N_pad = ⌈N / (128·data)⌉·128·data: 819,200 elements on data=2 need none (819,200 = 3,200·256); on data=3 the
    next multiple of 384 is 2,134·384 = 819,456; 100 elements on data=6 fill one 768-element buffer."""
    assert zero1_padded(819_200, 2) == 819_200
    assert zero1_padded(819_200, 3) == 819_456
    assert zero1_padded(100, 6) == 768
    assert list(zero1_padded(np.array([819_200, 819_200]), np.array([2, 3]))) == [819_200, 819_456]


def test_closed_forms_by_hand():
    """small (D=256, F=1024, L=4: P = 2·4·256·1024 = 2,097,152) on data=3, fsdp=2: a device's buffer N = P/2 =
    1,048,576, padded to 2,731·384 = 1,048,704; Adam's moments 8·1,048,704/3 = 2,796,544 B, the gradients whole
    (ZeRO stage 1) 4·1,048,576 = 4,194,304 B; over data the BF16 reduce-scatter 2·1,048,704 = 2,097,408 B, the FP32
    all-gather 4·1,048,704 = 4,194,816 B and the loss's mean, 4 B."""
    w = Workload(get_preset("small"), parse_mesh_spec("data=3,fsdp=2"), 3072, schedule=ZERO1)
    mem = memory_per_device(w)
    assert mem["optimizer"] == pytest.approx(2_796_544)
    assert mem["grads"] == pytest.approx(4_194_304)
    assert collective_volumes(w)["data"] == pytest.approx({"reduce-scatter": 2_097_408, "all-gather": 4_194_816,
                                                           "all-reduce": 4})


def test_no_refusals():
    """A 14,336-wide model on 12 data shards, and ZeRO-1 with GPipe and circular stages, are workloads."""
    wide = get_preset("bloom-176b").replace(blocks=72)
    Workload(wide, parse_mesh_spec("data=12,stage=12,tensor=4"), 12 * 96 * 2048,
             schedule=Schedule(96, pipeline="1f1b", optimizer_sharding="zero1"))
    Workload(wide, parse_mesh_spec("data=12,tensor=8"), 12 * 2048, schedule=ZERO1)
    Workload(get_preset("tiny"), parse_mesh_spec("data=2,stage=3"), 192,
             schedule=Schedule(3, optimizer_sharding="zero1"))
    Workload(get_preset("small"), parse_mesh_spec("data=3,stage=2"), 3072,
             schedule=Schedule(2, repeats=2, optimizer_sharding="zero1"))


def _one_device(preset, batch):
    """3 steps of ``preset`` on one device (tests.helpers.one_device: once per run)."""
    return one_device(_model(preset), batch)


def _model(name):
    """A preset, or "tiny-4": the tiny FFN stack with 4 blocks (2 chunks of 1 on each of 2 stages, circular)."""
    return get_preset("tiny").replace(blocks=4) if name == "tiny-4" else get_preset(name)


def _run(cfg, spec, batch, schedule):
    m = make_mesh(spec, jax.devices()[: parse_mesh_spec(spec).devices])
    losses, state = train(Workload(cfg, mesh_shape(m), batch, schedule=schedule), m, STEPS, lr=LR, return_state=True)
    return losses, jax.tree.map(np.asarray, state["params"])


# (model, mesh, batch tokens, schedule): D = 64 on data=3 and data=6 (neither divides it), the FFN stack and the
# transformer; pipelines with data=2: GPipe (FFN, 3 blocks on 3 stages), 1F1B (transformer), circular (FFN)
NUMERICS = [
    ("tiny", "data=3", 192, ZERO1),
    ("tiny", "data=6", 192, ZERO1),
    ("tiny-tf", "data=3", 3 * 64, ZERO1),
    ("tiny", "data=2,stage=3", 192, Schedule(3, optimizer_sharding="zero1")),
    ("tiny-tf", "data=2,stage=2", 4 * 64, Schedule(2, pipeline="1f1b", optimizer_sharding="zero1")),
    ("tiny-4", "data=2,stage=2", 192, Schedule(2, repeats=2, optimizer_sharding="zero1")),
]


@pytest.mark.numerics
@pytest.mark.parametrize("preset, spec, batch, schedule", NUMERICS,
                         ids=[f"{p}-{s}-{k.pipeline if 'stage' in s else 'nostage'}" for p, s, _, k in NUMERICS])
def test_zero1_matches_one_device(preset, spec, batch, schedule):
    """3 AdamW steps under ZeRO-1 within test_pipeline.assert_matches' tolerance of the same steps on one device."""
    assert_matches(*_run(_model(preset), spec, batch, schedule), _one_device(preset, batch))


def _assert_bands(rep, w, devices, peak: bool):
    """FLOPs, arguments and the collectives per axis within ±2% (tests/test_check.py's bands), the peak within ±10%
    on a TPU; the program's reduce-scatters at least the flat buffer's over data (a reduce-scatter, not an all-reduce
    and a slice; XLA:CPU's f32 wire: 4 B an element)."""
    assert_bands(rep)
    wide = w.with_facts(min_comm_bytes=4 if devices.startswith("cpu") else 0)
    flat = program.collective_volumes(wide)["data"]["reduce-scatter"]
    assert rep.collectives.by_kind.get("reduce-scatter", 0) >= 0.98 * flat, (rep.collectives.by_kind, flat)
    if peak:
        assert 0.90 <= rep.memory.peak.ratio <= 1.10, rep.memory.peak


@pytest.mark.grid
@pytest.mark.parametrize("devices,cfg,mesh,batch,remat,step,schedule", CPU_ROWS,
                         ids=[f"{g[2]}-{g[-1].pipeline}" for g in CPU_ROWS])
def test_zero1_cpu_check(devices, cfg, mesh, batch, remat, step, schedule):
    w = grid_workload(cfg, mesh, batch, remat, step, schedule)
    _assert_bands(check(w, devices), w, devices, peak=False)


@pytest.mark.grid
@pytest.mark.tpu
@pytest.mark.parametrize("devices,cfg,mesh,batch,remat,step,schedule", TPU_ROWS,
                         ids=[f"{g[0]}-{g[2]}" for g in TPU_ROWS])
def test_zero1_tpu_check(devices, cfg, mesh, batch, remat, step, schedule):
    w = grid_workload(cfg, mesh, batch, remat, step, schedule)
    _assert_bands(check(w, devices), w, devices, peak=True)


def test_predict_a_14336_wide_model_on_12_data_shards(capsys):
    """`predict` describes BLOOM's width (D = 14,336 is not divisible by data = 12: the refusal this replaces) with
    ZeRO-1 on 12 data shards and 1F1B stages, and prints the optimizer's share of memory: exit 0."""
    from jax_scaling.cli import main

    argv = ["predict", "--preset", "bloom-176b", "--blocks", "72", "--chip", "A100-80GB", "--chips", "576", "--mesh",
            "data=12,stage=12,tensor=4", "--batch-tokens", str(12 * 192 * 2048), "--microbatches", "96",
            "--schedule", "1f1b", "--remat", "full", "--optimizer-sharding", "zero1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "D=14,336" in out and "optimizer" in out
