"""1F1B with --remat meaning what it means (issue 37, item 4): remat none keeps each in-flight microbatch's
activations (the forward slot's residuals of its chunk, in rings of K = 2·R·S − 1 slots; the backward slot runs no
forward), selective and the named policies keep what the policy names, full keeps only each chunk's input and runs
its forward again (ffn_model.pipeline.one_f_one_b). Numerics against one device, the compiled program against the
closed forms, and the peak against S and M."""

import pytest

from ffn_model.train import train
from scaling.mesh_shape import parse_mesh_spec
from scaling.schedule import Schedule
from scaling.workload import Workload
from tests.test_pipeline import assert_matches
from tests.test_transformer import PIPE_TF, B, LR, STEPS, _mesh, _one_device

NUMERICS = [
    ("stage=2,fsdp=2,tensor=2", Schedule(2, pipeline="1f1b"), "none"),
    ("stage=2,fsdp=2,tensor=2", Schedule(2, pipeline="1f1b"), "selective"),
    # interleaved: 2 chunks per stage, the wrap from the last stage to the first; the rings' slot of each chunk
    ("stage=2,fsdp=2,tensor=2", Schedule(2, repeats=2, pipeline="1f1b"), "none"),
    # (warm-up phases, whose backward-only loop rebuilds every vjp from the rings: tests/test_transformer.py's
    # PIPE_MESHES row with remat none)
]


@pytest.fixture(scope="module")
def pipe_one_device():
    """3 steps of PIPE_TF on one device."""
    return _one_device(PIPE_TF, B)


@pytest.mark.slow
@pytest.mark.parametrize("spec, schedule, remat", NUMERICS,
                         ids=[f"{s}-R{k.repeats}{'-phases' if k.warmup_phases else ''}-{r}" for s, k, r in NUMERICS])
def test_one_f_one_b_keeping_residuals_matches_one_device(pipe_one_device, spec, schedule, remat):
    """1F1B whose backward slot runs the chunk's vjp rebuilt from the residuals its forward slot kept: losses and
    every parameter within tests/test_pipeline.py's tolerance of one device."""
    losses, state = train(Workload(PIPE_TF, parse_mesh_spec(spec), B, remat=remat, schedule=schedule), _mesh(spec),
                          STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], pipe_one_device)
    assert losses[-1] < losses[0]
