"""Sequence parallelism with pipeline stages (issue 37, item 1): Megatron's layout, the activations between the
layers split over tensor along the tokens inside every stage and the stage-to-stage message the split activation
(each tensor rank sends 1/Y of it, gathered on arrival by the next layer's first all-gather), on GPipe, circular,
1F1B and interleaved 1F1B: numerics against one device, the closed forms against the compiler, plan and predict."""

import pytest

from ffn_model.train import train
from scaling.mesh_shape import parse_mesh_spec
from scaling.schedule import Schedule
from scaling.workload import Workload
from tests.test_pipeline import assert_matches
from tests.test_transformer import B, LR, PIPE_TF, STEPS, _mesh, _one_device

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


@pytest.mark.slow
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
    from scaling.presets import get_preset
    with pytest.raises(ValueError, match="sequence_parallel with pipeline stages is built for the transformer"):
        Workload(get_preset("tiny"), parse_mesh_spec("stage=2,tensor=2"), 64,
                 schedule=Schedule(2, sequence_parallel=True))
