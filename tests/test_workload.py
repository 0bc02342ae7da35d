"""The workload object (scaling.core.workload): validated once where it is built, taken by the step model, memory,
the model builder and the check; a new input is one field."""

import copy
import dataclasses
import json
import math
import pickle

import numpy as np
import pytest

from scaling.step import memory
from scaling.step import program
from scaling.core.mesh_shape import MeshShape
from scaling.core.policies import Remat, Step
from scaling.families.presets import PRESETS
from scaling.core.schedule import Schedule
from scaling.hardware.chips import get_chip
from scaling.core.workload import CompilerFacts, Workload

XXL, TINY, SMALL = PRESETS["xxl"], PRESETS["tiny"], PRESETS["small"]


def test_built_once_validated_once():
    w = Workload(TINY, {"fsdp": 4, "tensor": 2}, 64, "forward", "full")
    assert w.mesh == MeshShape(fsdp=4, tensor=2) and w.step is Step.FORWARD and w.remat is Remat.FULL
    for kw, match in [({"remat": "half"}, "unknown remat policy 'half'"), ({"step": "backward"}, "step must be one of"),
                      ({"batch_tokens": 66}, "batch_tokens=66 is not divisible by the data·fsdp shard count 4"),
                      ({"mesh": MeshShape(fsdp=128)}, "d_model=64 is not divisible by the fsdp shard count 128"),
                      ({"schedule": Schedule(repeats=2)}, "repeats=2 needs a stage axis"),
                      ({"model": "tiny"}, "model must be an FFNConfig or a TransformerConfig")]:
        with pytest.raises(ValueError, match=match):
            Workload(**{"model": TINY, "mesh": MeshShape(fsdp=4), "batch_tokens": 64, **kw})
    with pytest.raises(ValueError, match="remat every-second is for the FFN stack; the transformer's remat is none, "
                                         "full or selective, minimal"):
        Workload(PRESETS["tiny-tf"], MeshShape(), PRESETS["tiny-tf"].seq_len, remat="every-second")
    with pytest.raises(ValueError, match="remat minimal is for the transformer"):
        Workload(TINY, MeshShape(), 64, remat="minimal")
    with pytest.raises(ValueError, match="circular_relays must be"):
        CompilerFacts(circular_relays=0)
    with pytest.raises(ValueError, match="batch_tokens=66 is not divisible"):  # replace validates again
        w.replace(batch_tokens=66)


def test_copies_and_pickles_keep_the_workload():
    """A workload (its MeshShape included) survives copy, deepcopy and pickle equal to itself; with_facts changes the
    compiler's facts and nothing else (it skips the validation the rest passed)."""
    w = Workload(XXL, MeshShape(fsdp=16, tensor=4), 25600, remat="full")
    for again in (copy.copy(w), copy.deepcopy(w), pickle.loads(pickle.dumps(w))):
        assert again == w and again.mesh["fsdp"] == 16 and isinstance(again.mesh, MeshShape)
    v = w.with_facts(windowed_grad_rs=True)
    assert v.compiler.windowed_grad_rs is True and w.compiler.windowed_grad_rs is None
    assert dataclasses.replace(v, compiler=w.compiler) == w

    @dataclasses.dataclass(frozen=True)
    class Tagged(Workload):  # a subclass keeps its type and fields through the copy
        tag: str = "a"

    t = Tagged(XXL, MeshShape(fsdp=16, tensor=4), 25600, tag="b").with_facts(min_comm_bytes=0)
    assert type(t) is Tagged and t.tag == "b"
    # Schedule.with_microbatches, the planner's copy: the count validated, the rest kept
    s = Schedule(microbatches=2, repeats=2)
    assert s.with_microbatches(4) == Schedule(microbatches=4, repeats=2) and s.microbatches == 2
    with pytest.raises(ValueError, match="microbatches"):
        s.with_microbatches(0)


def test_policies_are_enums_that_read_as_their_names():
    w = Workload(TINY, MeshShape(), 64, remat="every-second")
    assert w.remat == "every-second" and f"{w.remat}" == "every-second" and json.dumps(w.remat) == '"every-second"'
    s = Schedule(attention="flash", context="ring")
    assert type(s.attention).__name__ == "Attention" and s.context == "ring"
    with pytest.raises(ValueError,
                       match="attention must be one of materialized, flash, splash, cudnn, auto, got 'paged'"):
        Schedule(attention="paged")


def test_a_new_field_passes_through_every_layer_unchanged():
    """A workload with one more field (a subclass stands for the next issue's input) goes through predict,
    memory_per_device and the check's cache key with no signature changed, and changes nothing it does not
    use."""

    @dataclasses.dataclass(frozen=True)
    class WithVocabulary(Workload):
        vocabulary: int = 32000

    base = Workload(XXL, MeshShape(fsdp=16, tensor=4), 25600)
    more = WithVocabulary(XXL, MeshShape(fsdp=16, tensor=4), 25600, vocabulary=128256)
    v5p = get_chip("v5p")
    assert program.predict(more, v5p).times.step == program.predict(base, v5p).times.step
    assert memory.memory_per_device(more) == memory.memory_per_device(base)
    assert "vocabulary=128256" in repr(more)  # verify.check keys its cache by repr(workload)
    assert program.predict(more.replace(batch_tokens=51200), v5p).times.step != program.predict(base, v5p).times.step


def test_prediction_is_a_dataclass_with_json():
    """predict's result: FLOPs, collectives, memory, HBM traffic and times as fields; to_json gives plain JSON.
    By hand (the XXL's train step at fsdp=16, tensor=4, B = 25,600): model FLOPs per device
    (6·P·B − 2·B·D·F)/64 with P = 219,848,638,464: 5.2761e14."""
    p = program.predict(Workload(XXL, MeshShape(fsdp=16, tensor=4), 25600), get_chip("v5p"))
    P, B, D, F = 219_848_638_464, 25600, 16384, 53248
    assert p.flops["model"] == pytest.approx((6 * P * B - 2 * B * D * F) / 64, rel=1e-12)
    assert set(p.times.step) == {"sum", "max", "scheduled"} and p.times.step["sum"] >= p.times.step["max"]
    assert p.times.mfu["sum"] == pytest.approx(p.flops["model"] / (4.59e14 * p.times.step["sum"]), rel=1e-12)
    plain = json.loads(json.dumps(p.to_json()))
    assert plain["times"]["step"]["sum"] == p.times.step["sum"] and plain["memory"]["total"] == p.memory["total"]


def test_array_batches_select_per_element():
    """The planner's arrays: where XLA:TPU's windowed rule differs across batches the prediction takes each
    program where it applies, element by element, as scalar calls give it."""
    v5p = get_chip("v5p")
    batches = np.array([16 * 128, 16 * 4096])  # 128 and 4,096 tokens per device at fsdp=16: off, then on
    mesh = MeshShape(fsdp=16, tensor=4)
    arr = program.predict(Workload(XXL, mesh, batches), v5p, axis_links={"fsdp": 2.0})
    for i, b in enumerate(batches.tolist()):
        one = program.predict(Workload(XXL, mesh, b), v5p, axis_links={"fsdp": 2.0})
        assert math.isclose(arr.memory["total"][i], one.memory["total"], rel_tol=1e-12)
        assert math.isclose(arr.times.step["sum"][i], one.times.step["sum"], rel_tol=1e-12)
    windowed = [program.windowed_einsum_rs(Workload(XXL, mesh, b), v5p, {"fsdp": 2.0}) for b in batches.tolist()]
    assert windowed == [False, True]

