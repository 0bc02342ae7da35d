"""mesh: the logical-axis table, meshes over emulated CPU devices and TPU topologies, bad specs."""

import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import mesh
from mesh import devices as mesh_devices
from scaling.core.mesh_shape import MeshShape
from scaling.hardware.chips import get_chip
from scaling.core.sharding import LOGICAL_RULES


def test_rules_table_and_specs():
    assert LOGICAL_RULES == {"batch": ("data", "fsdp"), "embed": ("fsdp",), "mlp": ("tensor",),
                             "layers": ("stage",), "stages": ("stage",), "act_embed": (),
                             "batch_sp": ("data", "fsdp", "tensor"), "seq": ("context",),
                             "seq_sp": ("context", "tensor"), "heads": ("tensor",), "kv_heads": ("tensor",),
                             "head_dim": (), "tensor_split": ("tensor",), "vocab": ("tensor",),
                             "embed_zero1": ("fsdp", "data"), "data_shards": ("data",), "batch_fsdp": ("fsdp",),
                             "moe_batch": ("data", "fsdp", "expert"), "moe_batch_fsdp": ("fsdp", "expert"),
                             "moe_batch_stage": ("data", "fsdp", "expert", "stage"),
                             "exp": ("expert",),
                             "moe_tokens": ("context", "data", "fsdp", "expert"),
                             "expert_groups": ("context", "data", "fsdp"), "latent": (),
                             "latent_split": ("tensor",)}
    # a transformer's q [B, T, N, H]: batch over data·fsdp, the sequence over context, heads over tensor
    assert mesh.logical_to_spec(("batch", "seq", "heads", "head_dim")) == P(("data", "fsdp"), "context", "tensor", None)
    # W_in, W_out [L,F,D]: the blocks split over pipeline stages (a stage axis of 1 is no split)
    assert mesh.logical_to_spec(("layers", "mlp", "embed")) == P("stage", "tensor", "fsdp")
    # flax's rules from the same table
    assert {k: v for k, v in mesh.FLAX_RULES if k in ("batch", "embed", "mlp", "layers", "act_embed", "seq_sp")} == {
        "batch": ("data", "fsdp"), "embed": "fsdp", "mlp": "tensor", "layers": "stage", "act_embed": None,
        "seq_sp": ("context", "tensor")}
    assert mesh.logical_to_spec(("batch", "act_embed")) == P(("data", "fsdp"), None)  # x [B,D]
    assert mesh.logical_to_spec(("batch", "mlp")) == P(("data", "fsdp"), "tensor")  # h [B,F]
    # 1F1B's batch split [data, B/data]; inside a shard_map manual over data, data leaves every spec
    assert mesh.logical_to_spec(("data_shards", "batch_fsdp", "act_embed")) == P("data", "fsdp", None)


def test_specs_inside_a_shard_map_leave_its_manual_axes_out():
    """Inside jax.shard_map manual over data (1F1B's loop), the batch is split over fsdp alone: the devices of a data
    shard see its block."""
    m = mesh.make_mesh("data=2,fsdp=4", "cpu:8")
    seen = {}

    def inside(x):
        seen["spec"] = mesh.logical_to_spec(("batch", "act_embed"))
        return x

    with jax.set_mesh(m):
        jax.shard_map(inside, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})(jax.numpy.zeros((8, 2)))
    assert seen["spec"] == P("fsdp", None)
    assert mesh.logical_to_spec(("batch", "act_embed")) == P(("data", "fsdp"), None)  # outside it


def test_unknown_logical_axis_is_an_error():
    with pytest.raises(ValueError, match="'experts' has no sharding rule"):
        mesh.logical_to_spec(("batch", "experts"))
    with pytest.raises(ValueError, match="twice"):
        mesh.logical_to_spec(("embed", "embed"))


def test_import_without_jax():
    code = "import sys, mesh, mesh.rules; assert 'jax' not in sys.modules, 'mesh imported jax'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("spec, shape", [
    ("fsdp=8", (1, 1, 8, 1, 1, 1)), ("tensor=8", (1, 1, 1, 1, 1, 8)), ("fsdp=4,tensor=2", (1, 1, 4, 1, 1, 2)),
    ("data=2,fsdp=2,tensor=2", (2, 1, 2, 1, 1, 2)), ("tensor=2,fsdp=-1", (1, 1, 4, 1, 1, 2)),
    (MeshShape(data=2, fsdp=4), (2, 1, 4, 1, 1, 1)), ("stage=2,fsdp=2,tensor=2", (1, 2, 2, 1, 1, 2)),
    ("fsdp=2,context=2,tensor=2", (1, 1, 2, 2, 1, 2)),
    ("expert=8", (1, 1, 1, 1, 8, 1)), ("fsdp=2,expert=4", (1, 1, 2, 1, 4, 1)),
    ("data=2,expert=2,tensor=2", (2, 1, 1, 1, 2, 2)),
])
def test_cpu_meshes(spec, shape):
    m = mesh.make_mesh(spec, "cpu:8")
    assert m.axis_names == ("data", "stage", "fsdp", "context", "expert", "tensor")
    assert m.devices.shape == shape
    assert all(t == AxisType.Auto for t in m.axis_types)
    assert sorted(d.id for d in m.devices.flat) == list(range(8))


def test_real_devices_and_device_lists():
    assert mesh.make_mesh("fsdp=8").devices.size == len(jax.devices()) == 8
    one = mesh.make_mesh("fsdp=1", jax.devices()[:1])
    assert one.devices.shape == (1, 1, 1, 1, 1, 1)


@pytest.mark.parametrize("spec, devices, match", [
    ("experts=8", "cpu:8", "unknown mesh axis 'experts'"),
    ("fsdp=4", "cpu:8", "4 devices .* but 8 devices"),
    ("fsdp=16", "cpu:8", "16 devices .* but 8 devices"),
    ("fsdp=0,tensor=8", "cpu:8", "must be positive"),
    ("fsdp", "cpu:8", "must be axis=size"),
    ("fsdp=4", "cpu:4", "already running with 8 devices"),  # backend is up with 8 (conftest)
    ("fsdp=8", "cpu:x", "cpu:N"),
    ("fsdp=8", "gpu:8", "expected gpu:<chip>:<N>"),
    ("fsdp=8", "gpu:v5p:8", "v5p is not a GPU"),
    ("fsdp=12", "gpu:H100:12", "12 GPUs are not whole nodes of 8"),
    ("fsdp=8", "gpu:B200:8", "no compiler description of B200"),
    ("fsdp=8", "gpu:H100:x", "N must be a positive integer"),
    ("fsdp=8", "tpu:v5p-7", "v5p-N counts TensorCores, 2 per chip"),
])
def test_bad_specs(spec, devices, match):
    with pytest.raises(ValueError, match=match):
        mesh.make_mesh(spec, devices)


def test_tpu_topology_without_libtpu(monkeypatch):
    monkeypatch.setattr(mesh_devices, "has_libtpu", lambda: False)
    with pytest.raises(ValueError, match=r"install the tpu extra"):
        mesh.make_mesh("fsdp=16,tensor=4", "tpu:v5p:4x4x4")


def test_gpu_topology_without_the_cuda_plugin(monkeypatch):
    monkeypatch.setattr(mesh_devices, "has_cuda_plugin", lambda: False)
    with pytest.raises(ValueError, match=r"install the cuda-aot extra"):
        mesh.make_mesh("fsdp=16", "gpu:H100:16")


def test_gpu_target_config_is_the_hardware_table_row():
    """The text proto XLA's GPU compiler is given: the H100 row's SM count, compute capability 9.0 and its HBM
    bandwidth (3.35e12 B/s) as the table states them."""
    text = mesh_devices.gpu_target_config(get_chip("H100"))
    assert "core_count: 132\n" in text and "cuda_compute_capability { major: 9 minor: 0 }" in text
    assert "memory_bandwidth: 3350000000000\n" in text and 'device_description_str: "NVIDIA H100 80GB HBM3"' in text


@pytest.mark.skipif(not mesh_devices.has_cuda_plugin(), reason="needs jax's CUDA plugin (the cuda-aot extra)")
def test_gpu_topology_mesh():
    """gpu:H100:16: two nodes of 8 H100s from the CUDA plugin's topology description, each device an H100 of its
    host (process_index 0 and 1)."""
    m = mesh.make_mesh("data=2,fsdp=8", "gpu:H100:16")
    devs = list(m.devices.flat)
    assert all(d.platform == "gpu" and d.device_kind == "NVIDIA H100 80GB HBM3" for d in devs)
    assert sorted({d.process_index for d in devs}) == [0, 1]


@pytest.mark.tpu
@pytest.mark.parametrize("devices", ["tpu:v5p:4x4x4", "tpu:v5p-128", "v5p-128", "tpu:4x4x4"])
def test_tpu_topology_mesh(devices):
    m = mesh.make_mesh("fsdp=16,tensor=4", devices)
    assert m.devices.shape == (1, 1, 16, 1, 1, 4)
    assert {d.platform for d in m.devices.flat} == {"tpu"}
    # tensor spans one physical axis (a ring of 4), fsdp the other two (4x4 chips).
    coords = np.array([[d.coords for d in row] for row in m.devices[0, 0, :, 0, 0]])  # [16, 4, 3]
    tensor_line, fsdp_line = coords[0, :, :], coords[:, 0, :]
    assert sum(len(set(tensor_line[:, k])) > 1 for k in range(3)) == 1
    assert sum(len(set(fsdp_line[:, k])) > 1 for k in range(3)) == 2


@pytest.mark.tpu
@pytest.mark.parametrize("name, chips", [("v5p-8", 4), ("v5p-16", 8), ("v5p-64", 32), ("v5p-256", 128)])
def test_tpu_slice_names(name, chips):
    m = mesh.make_mesh(f"fsdp={chips}", f"tpu:{name}")
    assert m.devices.size == chips
    with pytest.raises(ValueError, match=f"but {chips} devices"):
        mesh.make_mesh(f"fsdp={2 * chips}", name)


def test_the_expert_axis():
    """expert (an MoE model's experts) is the fifth of the six axes, between context and tensor; a spec with it
    parses, builds a jax Mesh with that axis (8 devices = 2·4), and renders only the axes > 1."""
    from scaling.core.mesh_shape import MESH_AXES, parse_mesh_spec

    assert MESH_AXES == ("data", "stage", "fsdp", "context", "expert", "tensor")
    shape = parse_mesh_spec("fsdp=2,expert=4", 8)
    assert shape["expert"] == 4 and shape.devices == 8 and str(shape) == "fsdp=2,expert=4"
    assert str(MeshShape(fsdp=8)) == "fsdp=8"  # an expert axis of 1 is not shown
    m = mesh.make_mesh(shape, "cpu:8")
    assert m.shape["expert"] == 4 and m.devices.shape[MESH_AXES.index("expert")] == 4
    assert mesh.mesh_shape(m) == shape
    # the logical axes of an MoE: the tokens over data·fsdp·expert, the experts E over expert
    assert mesh.logical_to_spec(("moe_batch", None, "act_embed")) == P(("data", "fsdp", "expert"), None, None)
    assert mesh.logical_to_spec(("layers", "exp", "mlp", "embed")) == P("stage", "expert", "tensor", "fsdp")


@pytest.mark.parametrize("preset, family", [("tiny", "the FFN stack"), ("tiny-tf", "the transformer")])
def test_families_without_experts_refuse_an_expert_axis(preset, family):
    from scaling.families.presets import get_preset
    from scaling.core.workload import Workload

    with pytest.raises(ValueError, match=f"^expert=2: {family} has no experts"):
        Workload(get_preset(preset), MeshShape(fsdp=4, expert=2), 4096)


def test_predict_refuses_an_expert_axis_in_one_line(capsys):
    """jax-scaling predict of a transformer on a mesh with expert=2: exit 2, one line on stderr, nothing on stdout."""
    from jax_scaling.cli import main

    argv = "predict --preset llama2-7b --chip v5p --chips 8 --mesh fsdp=4,expert=2 --batch-tokens 65536".split()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, (out, err)
    assert lines[0].startswith("error: expert=2: the transformer has no experts"), err
