"""python -m scaling predict: one configuration's step, from the planner's own step model (closed forms only)."""

import json

import pytest

from jax_scaling.cli import main
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import PRESETS
from scaling.hardware.chips import get_chip
from scaling.planner.plan import Choices, dcn_placement, plan


def _predict(capsys, *args):
    assert main(["predict", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_says_what_the_planner_ranks_by(capsys):
    """The planner's best plans for Llama 2 7B on v5e-64 (one slice) and on 64 H100s (8 nodes over IB), given to
    predict as flags (mesh, microbatches, remat, schedule): the same step, memory and MFU (the planner calls the
    same function, program.predict, on the same mesh, layout and DCN placement)."""
    cfg = PRESETS["llama2-7b"]
    for target, chip, chips in ((["--slice", "v5litepod-64"], get_chip("v5e"), 64),
                                (["--chip", "H100", "--chips", "64"], get_chip("H100"), 64)):
        plans = plan(cfg, chip, chips, 2**20, form="scheduled", choices=Choices.of(cfg, attention="flash"))
        for r in [plans[0]] + [r for r in plans if r.mesh["stage"] > 1][:1]:
            mesh = ",".join(f"{a}={n}" for a, n in r.mesh.items())
            args = [*target, "--preset", "llama2-7b", "--mesh", mesh, "--batch-tokens", str(2**20), "--microbatches",
                    str(r.microbatches), "--repeats", str(r.repeats), "--schedule", r.pipeline,
                    "--remat", r.remat, "--attention", "flash", "--context-strategy", r.options["context"],
                    "--optimizer-sharding", r.options["optimizer_sharding"]]
            if r.sequence_parallel:
                args.append("--sequence-parallel")
            if r.dcn_mesh:  # the DCN axis's slices, and on GPUs the stage axis's (Plan.dcn_mesh)
                args += ["--dcn-mesh", ",".join(f"{a}={n}" for a, n in r.dcn_mesh.items())]
            out = _predict(capsys, *args)
            assert out["step_seconds"] == pytest.approx(r.step_seconds["scheduled"], rel=1e-9), (target, mesh)
            assert out["memory_per_device_bytes"] == pytest.approx(r.memory_bytes, rel=1e-9)
            assert out["mfu"] == pytest.approx(r.mfu["scheduled"], rel=1e-9)
            # tokens per second per device: B / step / devices
            assert out["tokens_per_second_per_device"] == pytest.approx(2**20 / r.step_seconds["scheduled"] / chips)


def test_dcn_placement_fills_the_outermost_axes():
    """MaxText's and Megatron's placement: data outermost, tensor innermost. 4 slices over data=2 take data's 2
    and then 2 of fsdp=8; over data=8 they take 4 of data; a mesh whose factors cannot absorb them is refused, as is
    a --dcn-mesh that spans another count."""
    assert dcn_placement(parse_mesh_spec("data=2,fsdp=8,tensor=4"), 4) == {"data": 2, "fsdp": 2}
    assert dcn_placement(parse_mesh_spec("data=8,fsdp=16"), 4) == {"data": 4}
    assert dcn_placement(parse_mesh_spec("stage=4,fsdp=16,tensor=8"), 8) == {"stage": 4, "fsdp": 2}
    assert dcn_placement(parse_mesh_spec("data=8,fsdp=16"), 4, {"fsdp": 4}) == {"fsdp": 4}
    with pytest.raises(ValueError, match="leave 2 of them unplaced"):
        dcn_placement(parse_mesh_spec("fsdp=3,context=3"), 2)
    with pytest.raises(ValueError, match="spans 2 slices or nodes, not 4"):
        dcn_placement(parse_mesh_spec("data=8,fsdp=16"), 4, {"data": 2})


def test_microbatch_and_inter_node_bandwidth(capsys):
    """--microbatch 4 with a global batch of 512 sequences on 64 H100s as data=8 × stage=2 × fsdp=2 × tensor=2:
    M = 512 / (4·8·2) = 8 microbatches. --inter-node-bandwidth:
    on data=8 over 8 nodes every data collective crosses the nodes alone (one GPU of each node per ring), so its
    time is the network's: halving the bandwidth doubles it exactly, less its one call's InfiniBand latency
    (Calculon's 20 us, collectives.IB_LATENCY: the gradient all-reduce is one call)."""
    from scaling.hardware.collectives import IB_LATENCY
    base = ["--preset", "llama2-7b", "--chip", "H100", "--chips", "64", "--global-batch", "512", "--remat", "full"]
    out = _predict(capsys, *base, "--mesh", "data=8,stage=2,fsdp=2,tensor=2", "--microbatch", "4")
    assert out["microbatches"] == 8 and out["batch_tokens"] == 512 * 4096
    fast = _predict(capsys, *base, "--mesh", "data=8,fsdp=8", "--inter-node-bandwidth", "4e11")
    slow = _predict(capsys, *base, "--mesh", "data=8,fsdp=8", "--inter-node-bandwidth", "2e11")
    assert fast["dcn"] == {"data": 8}
    assert slow["terms"]["comms.data"] - IB_LATENCY == pytest.approx(2 * (fast["terms"]["comms.data"] - IB_LATENCY),
                                                                     rel=1e-12)
    assert slow["terms"]["comms.fsdp"] == fast["terms"]["comms.fsdp"]


def test_predict_prints_the_terms(capsys):
    """The text form: the model and hardware line, one row per term, the step, tokens/s, MFU and memory."""
    assert main(["predict", "--preset", "maxtext-32b", "--slice", "v5litepod-256", "--slices", "2", "--mesh",
                 "data=2,fsdp=256", "--global-batch", "2048", "--remat", "full", "--attention", "flash"]) == 0
    out = capsys.readouterr().out
    for text in ("2 slices of 16x16", "over DCN: data x2", "math", "fsdp exposed", "step:", "tokens/s per device",
                 "MFU", "memory per device"):
        assert text in out, text


@pytest.mark.parametrize("args, match", [
    (["--preset", "xxl", "--chip", "v5p", "--chips", "64", "--mesh", "fsdp=64", "--global-batch", "8"],
     "--global-batch counts sequences"),
    (["--preset", "llama2-7b", "--chip", "H100", "--chips", "8", "--mesh", "fsdp=8", "--global-batch", "8",
      "--batch-tokens", "32768"], "--global-batch .sequences. or --batch-tokens"),
    (["--preset", "llama2-7b", "--chip", "H100", "--chips", "8", "--mesh", "fsdp=4", "--global-batch", "8"],
     "the mesh has 4 devices; the hardware has 8"),
    (["--preset", "llama2-7b", "--slice", "v5p-128", "--mesh", "fsdp=64", "--global-batch", "64",
      "--inter-node-bandwidth", "1e11"], "--inter-node-bandwidth is a GPU cluster's"),
    (["--preset", "llama2-7b", "--chip", "v5p", "--chips", "64", "--slices", "2", "--mesh", "fsdp=64",
      "--global-batch", "64"], "--slices counts slices of --slice"),
    (["--preset", "llama2-7b", "--chip", "H100", "--chips", "16", "--mesh", "fsdp=16", "--global-batch", "24",
      "--microbatch", "4"], "not a whole number of microbatches"),
    (["--preset", "llama2-7b", "--chip", "H100", "--chips", "16", "--mesh", "fsdp=16", "--global-batch", "16",
      "--dcn-mesh", "fsdp=4"], "spans 4 slices or nodes, not 2"),
    # the MoE family's (issue 40): experts the expert axis does not divide, top-k above E, a capacity factor below 1
    # with dropping off, a capacity factor that is not a number
    (["--preset", "mixtral-8x7b", "--chip", "v5p", "--chips", "12", "--mesh", "fsdp=4,expert=3", "--global-batch",
      "24"], "experts=8 is not divisible by the expert shard count 3"),
    (["--preset", "mixtral-8x7b", "--chip", "v5p", "--chips", "64", "--mesh", "fsdp=8,expert=8", "--global-batch",
      "64", "--top-k", "9"], "top-k 9 is more than the 8 experts"),
    (["--preset", "mixtral-8x7b", "--chip", "v5p", "--chips", "64", "--mesh", "fsdp=8,expert=8", "--global-batch",
      "64", "--capacity-factor", "0.5", "--keep-tokens"], "capacity factor 0.5 below 1 must drop tokens"),
    (["--preset", "mixtral-8x7b", "--chip", "v5p", "--chips", "64", "--mesh", "fsdp=8,expert=8", "--global-batch",
      "64", "--capacity-factor", "lots"], "capacity factor 'lots': a number > 0, or dropless"),
])
def test_bad_predict_inputs_are_one_line(capsys, args, match):
    import re

    assert main(["predict", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and re.search(match, err[0]), err
