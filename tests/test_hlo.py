"""verify.hlo: reading compiled programs. Expected values are derived by hand in the comments.

Per-device figures throughout: the compiled HLO is the program of one device (SPMD partition).
Meshes are (data, fsdp, tensor) = (2, 2, 2) on 8 emulated CPU devices, and (1, 2, 2) on the 4
chips of a TPU v5p:2x2x1 topology compiled ahead of time (tests marked tpu).
"""

import math
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from verify import hlo

NAMES = ("data", "fsdp", "tensor")
AXES = {"data": 2, "fsdp": 2, "tensor": 2}
DF = ("data", "fsdp")


def _sds(mesh, shape, spec, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*spec)))


def _axes(mesh):
    return {a: int(mesh.shape[a]) for a in mesh.axis_names}


@pytest.fixture(scope="module")
def cpu_mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), NAMES)


@pytest.fixture(scope="module")
def tpu_mesh():
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(platform="tpu", topology_name="v5p:2x2x1").devices
    return Mesh(np.array(devices).reshape(1, 2, 2), NAMES)


def test_import_does_not_import_jax():
    code = "import sys, verify.hlo; assert 'jax' not in sys.modules, 'verify.hlo imported jax'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- loops: dot FLOPs times trip counts (CPU, unsharded) ---------------------------------------

@pytest.mark.compiles
def test_scan_dot_flops_times_trip_count():
    K, B, D = 5, 8, 32

    def f(x, W):
        return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, W)[0]

    c = jax.jit(f).lower(jax.ShapeDtypeStruct((B, D), jnp.float32),
                         jax.ShapeDtypeStruct((K, D, D), jnp.float32)).compile()
    prog = hlo.parse_hlo(c.as_text())
    # K layers of x[B,D] @ W[D,D]: 2*B*D*D FLOPs each.
    assert prog.dot_flops() == 2 * B * D * D * K
    assert list(prog.trip_counts.values()) == [(K, "known_trip_count")]
    # Without known_trip_count the bound is read from the condition: on CPU it sits in a wrapped
    # compare fusion, compare(param_0, param_1) fed by (iv, constant(5)).
    stripped = hlo.parse_hlo(re.sub(r'"known_trip_count":\{"n":"\d+"\}', "", c.as_text()))
    assert list(stripped.trip_counts.values()) == [(K, "condition")]
    assert stripped.dot_flops() == 2 * B * D * D * K
    # Why the parser exists: cost_analysis counts the scan body once (2*B*D*D plus a few scalar ops).
    flops = hlo.read_compiled(c, {"data": 1}).cost["flops"]
    assert flops == pytest.approx(2 * B * D * D, rel=0.01)


@pytest.mark.compiles
def test_nested_scan_multiplies():
    n_outer, n_inner, B, D = 3, 4, 8, 16

    def f(x, W):
        inner = lambda c, w: (jnp.tanh(c @ w), None)  # noqa: E731
        return jax.lax.scan(lambda c, ws: (jax.lax.scan(inner, c, ws)[0], None), x, W)[0]

    c = jax.jit(f).lower(jax.ShapeDtypeStruct((B, D), jnp.float32),
                         jax.ShapeDtypeStruct((n_outer, n_inner, D, D), jnp.float32)).compile()
    prog = hlo.parse_hlo(c.as_text())
    assert sorted(n for n, _ in prog.trip_counts.values()) == sorted([n_outer, n_inner])
    assert prog.dot_flops() == 2 * B * D * D * n_outer * n_inner  # the inner body runs n_outer*n_inner times


# --- sharded programs on 8 CPU devices ----------------------------------------------------------

@pytest.mark.compiles
def test_cpu_fsdp_all_gather(cpu_mesh):
    B, D, F = 64, 256, 512

    def f(x, W):  # FSDP: gather W over fsdp before use; W stays sharded on tensor
        w = jax.lax.with_sharding_constraint(W.astype(jnp.bfloat16), NamedSharding(cpu_mesh, P(None, "tensor")))
        return x @ w

    c = jax.jit(f).lower(_sds(cpu_mesh, (B, D), (DF, None), jnp.bfloat16),
                         _sds(cpu_mesh, (D, F), ("fsdp", "tensor"))).compile()
    got = hlo.read_compiled(c, AXES)
    (ag,) = [x for x in got.collectives if x.kind == "all-gather"]
    assert ag.axes == ("fsdp",) and ag.group_size == 2 and ag.count == 1
    # The CPU backend normalises bf16 to f32 (the gather moves f32, then rounds to bf16 values),
    # so V = full weight D*F / Y=2 tensor shards * 4 bytes here; on TPU it is bf16 (test below).
    assert ag.dtype == "f32"
    assert ag.volume == D * F / 2 * 4 and ag.operand_bytes == D * F / 4 * 4
    # x[B/4, D] @ W[D, F/2] on each device.
    assert got.dot_flops == 2 * (B / 4) * D * (F / 2)


@pytest.mark.compiles
def test_cpu_tensor_parallel_contracting_dim(cpu_mesh):
    B, D, F = 64, 256, 512
    c = jax.jit(lambda x, W: x @ W, out_shardings=NamedSharding(cpu_mesh, P(DF, None))).lower(
        _sds(cpu_mesh, (B, D), (DF, "tensor")), _sds(cpu_mesh, (D, F), ("tensor", None))).compile()
    (col,) = hlo.read_compiled(c, AXES).collectives
    # Partial sums y[B/4, F] (f32) summed over tensor: V = B/4 * F * 4 bytes for AR or RS alike.
    assert col.kind in ("all-reduce", "reduce-scatter") and col.axes == ("tensor",)
    assert col.volume == (B / 4) * F * 4


@pytest.mark.compiles
def test_cpu_fsdp_gradient_reduce_scatter(cpu_mesh):
    B, D, F = 64, 256, 512

    def loss(W, x):
        return jnp.sum(jnp.tanh(x @ W.astype(jnp.bfloat16)).astype(jnp.float32) ** 2)

    w_sharding = NamedSharding(cpu_mesh, P(DF, "tensor"))
    c = jax.jit(jax.grad(loss), out_shardings=w_sharding).lower(
        _sds(cpu_mesh, (D, F), (DF, "tensor")), _sds(cpu_mesh, (B, D), (DF, None), jnp.bfloat16)).compile()
    cols = hlo.read_compiled(c, AXES).collectives
    (rs,) = [x for x in cols if x.kind == "reduce-scatter"]
    # dW[D, F/2] summed over the 4 batch shards (data x fsdp) and left sharded D/4: f32 on CPU.
    assert rs.axes == ("data", "fsdp") and rs.group_size == 4
    assert rs.operand_bytes == D * F / 2 * 4 and rs.result_bytes == D * F / 2 * 4 / 4
    assert rs.volume == D * F / 2 * 4
    # In jax 0.10.2 the CPU program spells it as a full all-reduce and a dynamic-slice.
    assert "all-reduce followed by a dynamic-slice" in rs.note
    summary = hlo.collective_bytes(cols)
    # plus the forward all-gather of W over data+fsdp: V = D * F/2 * 4 again.
    assert summary["by_axis"] == {"data+fsdp": 2 * D * F / 2 * 4}


@pytest.mark.compiles
def test_memory_report_cpu(cpu_mesh):
    c = jax.jit(lambda x: x * 2).lower(_sds(cpu_mesh, (64, 128), (DF, None))).compile()
    m = hlo.read_compiled(c, AXES).memory
    assert set(m) == {"argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "host_temp_bytes", "peak_bytes",
                      "generated_code_bytes"}
    assert m["argument_bytes"] == 64 / 4 * 128 * 4 and m["output_bytes"] == 64 / 4 * 128 * 4  # the local shard
    assert m["peak_bytes"] is None or m["peak_bytes"] > 0


# --- the same kinds of programs compiled for TPU v5p:2x2x1 --------------------------------------

@pytest.mark.tpu
def test_tpu_scan_fsdp_convolution_flops_and_all_gather(tpu_mesh):
    K, B, D = 5, 64, 256

    def f(x, W):
        def body(c, w):
            w = jax.lax.with_sharding_constraint(w.astype(jnp.bfloat16), NamedSharding(tpu_mesh, P(None, None)))
            return jnp.tanh(c @ w), None
        return jax.lax.scan(body, x, W)[0]

    c = jax.jit(f).lower(_sds(tpu_mesh, (B, D), ("fsdp", None), jnp.bfloat16),
                         _sds(tpu_mesh, (K, D, D), (None, "fsdp", None))).compile()
    text = c.as_text()
    assert "convolution(" in text and " dot(" not in text  # TPU prints matmuls as convolutions
    prog = hlo.parse_hlo(text)
    assert list(prog.trip_counts.values()) == [(K, "condition")]  # no known_trip_count on TPU
    assert prog.dot_flops() == 2 * (B / 2) * D * D * K  # x[B/2, D] @ W[D, D], K times
    got = hlo.read_compiled(c, _axes(tpu_mesh))
    (ag,) = [x for x in got.collectives if x.kind == "all-gather"]
    assert ag.axes == ("fsdp",) and ag.dtype == "bf16" and ag.count == K
    assert ag.volume == D * D * 2  # the full bf16 layer weight (not sharded on tensor here)
    assert got.memory["peak_bytes"] > 0 and got.cost["optimal_seconds"] > 0


@pytest.mark.tpu
def test_tpu_tensor_parallel_all_reduce(tpu_mesh):
    B, D, F = 64, 256, 512
    c = jax.jit(lambda x, W: x @ W, out_shardings=NamedSharding(tpu_mesh, P("fsdp", None))).lower(
        _sds(tpu_mesh, (B, D), ("fsdp", "tensor")), _sds(tpu_mesh, (D, F), ("tensor", None))).compile()
    got = hlo.read_compiled(c, _axes(tpu_mesh))
    (col,) = got.collectives
    assert col.kind in ("all-reduce", "reduce-scatter") and col.axes == ("tensor",)
    assert col.volume == (B / 2) * F * 4  # partial y[B/2, F] in f32
    assert got.dot_flops == 2 * (B / 2) * (D / 2) * F


@pytest.mark.tpu
def test_tpu_fsdp_gradient_reduce_scatter(tpu_mesh):
    B, D, F = 64, 256, 512

    def loss(W, x):
        return jnp.sum(jnp.tanh(x @ W.astype(jnp.bfloat16)).astype(jnp.float32) ** 2)

    c = jax.jit(jax.grad(loss), out_shardings=NamedSharding(tpu_mesh, P(DF, "tensor"))).lower(
        _sds(tpu_mesh, (D, F), (DF, "tensor")), _sds(tpu_mesh, (B, D), (DF, None), jnp.bfloat16)).compile()
    cols = hlo.read_compiled(c, _axes(tpu_mesh)).collectives
    (rs,) = [x for x in cols if x.kind == "reduce-scatter"]
    # dW[D, F/2] in bf16 summed over the 2 fsdp batch shards (data has size 1): V = D*F/2*2.
    assert rs.axes == ("fsdp",) and rs.dtype == "bf16" and rs.volume == D * F / 2 * 2
    (ag,) = [x for x in cols if x.kind == "all-gather"]
    assert ag.axes == ("fsdp",) and ag.volume == D * F / 2 * 2


# --- literal HLO snippets -----------------------------------------------------------------------

def _one_collective(line, axes=AXES):
    text = f"ENTRY %main (p: f32[8,16]) -> f32[8,16] {{\n  %p = f32[8,16]{{1,0}} parameter(0)\n  ROOT {line}\n}}\n"
    (c,) = hlo.parse_hlo(text).collectives(axes)
    return c


@pytest.mark.parametrize("groups, axes, size", [
    # ids = data*4 + fsdp*2 + tensor on the (2, 2, 2) mesh
    ("{{0,1},{2,3},{4,5},{6,7}}", ("tensor",), 2),
    ("{{0,2},{4,6},{1,3},{5,7}}", ("fsdp",), 2),
    ("{{0,1,2,3,4,5,6,7}}", ("data", "fsdp", "tensor"), 8),
    ("{}", ("data", "fsdp", "tensor"), 8),
    ("[2,4]<=[8]", ("fsdp", "tensor"), 4),                     # {0..3},{4..7}
    ("[4,2]<=[4,2]T(1,0)", ("fsdp",), 2),                      # {0,2},{4,6},{1,3},{5,7}
    ("[4,2]<=[2,4]T(1,0)", ("data",), 2),                      # {0,4},{1,5},{2,6},{3,7}
    ("[2,4]<=[2,2,2]T(1,0,2)", ("data", "tensor"), 4),         # {0,1,4,5},{2,3,6,7}
    ("mesh['axis_0'=1,'axis_1'=4,'axis_2'=2] {'axis_1'}", ("data", "fsdp"), 4),  # seen on CPU
    ("mesh['axis_0'=2,'axis_1'=2,'axis_2'=2] {'axis_0','axis_2'}", ("data", "tensor"), 4),
    ("mesh['a'=8] {'a':(2)2}", ("fsdp",), 2),                  # sub-axis: [8] -> [2,2,2], middle
    # explicit device order [[0,4,1,5],[2,6,3,7]], grouped over x: {0,2},{4,6},{1,3},{5,7}
    ("mesh['x'=2,'y'=4], device_ids=(0,4,1,5,2,6,3,7) {'x'}", ("fsdp",), 2),
    # the same device order written as an iota, [2,4]T(1,0) -> 0,4,1,5,2,6,3,7 (seen on CPU, jax 0.10.2)
    ("mesh['x'=2,'y'=4], device_ids=([2,4]T(1,0)) {'x'}", ("fsdp",), 2),
])
def test_replica_group_spellings(groups, axes, size):
    c = _one_collective(f"%ar = f32[8,16]{{1,0}} all-reduce(f32[8,16]{{1,0}} %p), channel_id=1, "
                        f"replica_groups={groups}, use_global_device_ids=true, to_apply=%add")
    assert (c.kind, c.axes, c.group_size, c.operand_bytes) == ("all-reduce", axes, size, 8 * 16 * 4)


@pytest.mark.parametrize("groups, axes", [
    # the package's six axes with expert=2 and tensor=2 (the rest 1): ids = expert*2 + tensor by hand
    ("{{0,2},{1,3}}", ("expert",)),                      # the all-to-all of an MoE's dispatch: along expert
    ("{{0,1},{2,3}}", ("tensor",)),
    ("[2,2]<=[2,2]T(1,0)", ("expert",)),                 # iota: [[0,1],[2,3]] transposed -> {0,2},{1,3}
    ("{{0,1,2,3}}", ("expert", "tensor")),
])
def test_groups_over_the_expert_axis_are_named_expert(groups, axes):
    six = {"data": 1, "stage": 1, "fsdp": 1, "context": 1, "expert": 2, "tensor": 2}
    c = _one_collective(f"%a2a = f32[8,16]{{1,0}} all-to-all(f32[8,16]{{1,0}} %p), channel_id=1, "
                        f"replica_groups={groups}, dimensions={{0}}", six)
    assert (c.kind, c.axes, c.group_size) == ("all-to-all", axes, math.prod(six[a] for a in axes))


def test_mesh_device_ids_groups():
    # device_ids [[0,4,1,5],[2,6,3,7]] grouped over x (rows): {0,2},{4,6},{1,3},{5,7} -> fsdp
    g = hlo.replica_groups("replica_groups=mesh['x'=2,'y'=4], device_ids=(0,4,1,5,2,6,3,7) {'x'}", 8)
    assert g == [[0, 2], [4, 6], [1, 3], [5, 7]]


def test_collective_permute_and_all_to_all():
    cp = _one_collective("%cp = f32[8,16]{1,0} collective-permute(%p), channel_id=1, "
                         "source_target_pairs={{0,4},{4,0},{1,5},{5,1}}")
    assert (cp.kind, cp.axes, cp.volume) == ("collective-permute", ("data",), 8 * 16 * 4)
    a2a = _one_collective("%a = (bf16[4,16]{1,0}, bf16[4,16]{1,0}) all-to-all(bf16[4,16]{1,0} %x, bf16[4,16]{1,0} %y), "
                          "channel_id=2, replica_groups=[4,2]<=[8], dimensions={0}")
    assert (a2a.kind, a2a.dtype, a2a.axes, a2a.operand_bytes, a2a.result_bytes) == \
        ("all-to-all", "bf16", ("tensor",), 2 * 4 * 16 * 2, 2 * 4 * 16 * 2)


ASYNC_LOOP = """\
HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%wrapped_ag (q: bf16[4,16]) -> bf16[8,16] {
  %q = bf16[4,16]{1,0} parameter(0)
  ROOT %ag2 = bf16[8,16]{1,0} all-gather(%q), channel_id=3, replica_groups=[4,2]<=[8], dimensions={0}
}

%body (t: (s32[], bf16[4,16])) -> (s32[], bf16[4,16]) {
  %t = (s32[], bf16[4,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[4,16]{1,0} get-tuple-element(%t), index=1
  %ags = (bf16[4,16]{1,0}, bf16[8,16]{1,0}) all-gather-start(%x), channel_id=1, \
replica_groups={{0,2},{4,6},{1,3},{5,7}}, dimensions={0}
  %agd = bf16[8,16]{1,0} all-gather-done(%ags)
  %ars = bf16[8,16]{1,0} all-reduce-start(%agd), channel_id=2, replica_groups=[2,4]<=[8], to_apply=%add
  %ard = bf16[8,16]{1,0} all-reduce-done(%ars)
  %as = ((bf16[4,16]{1,0}), bf16[8,16]{1,0}, s32[]) async-start(%x), calls=%wrapped_ag
  %ad = bf16[8,16]{1,0} async-done(%as), calls=%wrapped_ag
  %w = bf16[8,16]{1,0} dot(bf16[8,16]{1,0} %ard, bf16[16,16]{1,0} %ad), lhs_contracting_dims={1}, \
rhs_contracting_dims={0}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], bf16[4,16]{1,0}) tuple(%j, %x)
}

%cond (t2: (s32[], bf16[4,16])) -> pred[] {
  %t2 = (s32[], bf16[4,16]{1,0}) parameter(0)
  %i2 = s32[] get-tuple-element(%t2), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%i2, %n), direction=LT
}

ENTRY %main (p: bf16[4,16]) -> bf16[4,16] {
  %p = bf16[4,16]{1,0} parameter(0)
  %z = s32[] constant(1)
  %init = (s32[], bf16[4,16]{1,0}) tuple(%z, %p)
  %loop = (s32[], bf16[4,16]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = bf16[4,16]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_async_pairs_counted_once_in_a_loop():
    prog = hlo.parse_hlo(ASYNC_LOOP)
    # bound from the condition (7), less the constant initial induction value (1): 6 trips
    assert prog.trip_counts == {"loop": (6, "condition")}
    cols = {c.name: c for c in prog.collectives(AXES)}
    assert set(cols) == {"ags", "ars", "ag2"}  # the -done halves are not counted again
    assert all(c.async_ and c.count == 6 for c in cols.values())
    assert (cols["ags"].kind, cols["ags"].axes, cols["ags"].volume) == ("all-gather", ("fsdp",), 8 * 16 * 2)
    assert (cols["ars"].kind, cols["ars"].axes, cols["ars"].volume) == ("all-reduce", ("fsdp", "tensor"), 8 * 16 * 2)
    assert (cols["ag2"].kind, cols["ag2"].axes) == ("all-gather", ("tensor",))
    assert prog.dot_flops() == 2 * 8 * 16 * 16 * 6
    s = hlo.collective_bytes(list(cols.values()))
    assert s["total"] == 6 * 3 * 8 * 16 * 2
    assert s["by_kind"] == {"all-gather": 6 * 2 * 8 * 16 * 2, "all-reduce": 6 * 8 * 16 * 2}
    with pytest.raises(ValueError, match="num_partitions=8"):
        prog.collectives({"data": 2, "fsdp": 2})  # not the mesh the program was compiled for


def test_unrolled_loop_steps_by_two():
    # XLA:TPU unrolls a windowed-einsum loop twice: the body adds 2 (through a copy) to the
    # induction variable, so "i < 8" from i = 0 runs 4 trips, not 8 (fsdp=16: 4 trips x 2 unrolled
    # steps x 2 ring directions = 16 chunks).
    text = ASYNC_LOOP.replace("%one = s32[] constant(1)", "%one = s32[] constant(2)") \
        .replace("%j = s32[] add(%i, %one)", "%ic = s32[] copy(%i)\n  %j = s32[] add(%ic, %one)") \
        .replace("%n = s32[] constant(7)", "%n = s32[] constant(8)") \
        .replace("%z = s32[] constant(1)", "%z = s32[] constant(0)")
    prog = hlo.parse_hlo(text)
    assert prog.trip_counts == {"loop": (4, "condition")}
    assert prog.dot_flops() == 2 * 8 * 16 * 16 * 4
    # an odd bound rounds up: i = 0, 2, 4, 6 < 7 is 4 trips
    odd = text.replace("%n = s32[] constant(8)", "%n = s32[] constant(7)")
    assert hlo.parse_hlo(odd).trip_counts["loop"] == (4, "condition")


def test_convolution_flops():
    # TPU matmul as convolution: out[32,256] = x[32,128] @ w[128,256]; and a batched matmul that
    # the TPU compiler writes as a dilated window over the batch dim (seen in jax 0.10.2):
    # out[4,64,256] = a[4,64,128] @ b[4,128,256] per batch -> 2*4*64*256*128.
    text = """ENTRY %e (x: f32[32,128], w: f32[128,256], a: f32[4,64,128], b: f32[4,128,256]) -> f32[32,256] {
  %x = f32[32,128]{1,0:T(8,128)} parameter(0)
  %w = f32[128,256]{1,0:T(8,128)} parameter(1)
  %a = f32[4,64,128]{2,1,0:T(8,128)} parameter(2)
  %b = f32[4,128,256]{2,1,0:T(8,128)} parameter(3)
  %c2 = f32[4,64,256]{2,1,0:T(8,128)} convolution(%a, %b), window={size=4 stride=3 lhs_dilate=4}, \
dim_labels=0bf_0io->0bf
  ROOT %c1 = f32[32,256]{1,0:T(8,128)} convolution(%x, %w), dim_labels=bf_io->bf
}
"""
    assert hlo.parse_hlo(text).dot_flops() == 2 * 32 * 128 * 256 + 2 * 4 * 64 * 256 * 128


def test_collective_bytes_by_axis():
    mk = lambda kind, axes, ob, rb, n: hlo.Collective(kind, "bf16", ob, rb, 2, axes, n, kind)  # noqa: E731
    s = hlo.collective_bytes([mk("all-gather", ("fsdp",), 10, 20, 3), mk("reduce-scatter", ("fsdp",), 20, 10, 3),
                              mk("all-reduce", ("fsdp", "tensor"), 8, 8, 1)])
    assert s == {"total": 3 * 20 + 3 * 20 + 8, "by_axis": {"fsdp": 120, "fsdp+tensor": 8},
                 "by_kind": {"all-gather": 60, "reduce-scatter": 60, "all-reduce": 8}}
