"""The all-to-all's time on TPUs as the Scaling Book prices it (issue 49, item 10), and the bytes it is priced from
held against compiled programs.

The Book (sharding page, "AllToAll"): on a bidirectional ring an AllToAll of an array of V bytes (the whole array,
sharded over the axis' n devices) takes about V/(4·W_ici), a quarter of an AllGather of the same array. Why: each
device holds V/n and sends V/n² to each other device; the mean distance on a bidirectional ring is n/4 hops, so the
byte-hops are n²·(V/n²)·(n/4) = n·V/4, spread over n links of W_ici (both directions) each: V/(4·W_ici).
The package's volumes are per device: an all-to-all's V is the buffer one device sends, the compiled all-to-all's
operand (verify.hlo's volume). The Book's array over the axis is n times it, so a device's buffer V over n devices
takes n·V/(4·W_ici); on main it was priced at V/(4·W_ici), n times less.

Every expected figure is a hand calculation written out here; W is the chip table's input, not an output."""

import dataclasses

import numpy as np
import pytest

from scaling.step import program
from scaling.hardware.chips import get_chip
from scaling.families.moe import MOE_PRESETS, all_to_all_seconds
from scaling.families.presets import get_preset
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload

V5P = get_chip("v5p")
W = V5P.ici_bidi  # W_ici, bidirectional per link (1.8e11 B/s)
TINY = MOE_PRESETS["moe-tiny"]
# moe-tiny (D=64, E=8, k=2, T=32, L=4 MoE layers) with GShard's capacity factor 1.25: the dispatch is an all-to-all
CAPACITY = dataclasses.replace(TINY, moe=dataclasses.replace(TINY.moe, capacity_factor=1.25))
TINY_TF = get_preset("tiny-tf")  # D=64, N=K=8 heads of H=8, F=256, L=2, T=64
ULYSSES = Schedule(context="ulysses")


def moe_workload():
    # data=2, expert=4, B = 256 tokens: t = 256/(2·4) = 32 tokens a device = one sequence, one group;
    # C = ceil(1.25·2·32/8) = 10 slots an expert, the device sends E·C = 80 rows of D = 64
    return Workload(CAPACITY, {"data": 2, "expert": 4}, 256)


def ulysses_workload():
    # data=2, context=4, B = 128 tokens (2 sequences of 64): t = 128/(2·4) = 16 tokens a device
    return Workload(TINY_TF, {"data": 2, "context": 4}, 128, schedule=ULYSSES)


# By hand, BF16 (c = 2), a train step:
#   MoE: one all-to-all moves c·E·C·D = 2·80·64 = 10,240 B from a device; 4 a layer (dispatch, combine, their
#        gradients), 4 layers: 16·10,240 = 163,840 B
#   Ulysses: q, k, v and o each c·t·N·H = 2·16·8·8 = 2,048 B a device (N = K), 4 forward and 4 backward a layer,
#        2 layers: 16·2,048 = 32,768 B
MOE_A2A, ULYSSES_A2A = 163_840, 32_768


def test_the_volumes_are_a_device_s_buffers():
    assert moe_workload().model.forms.collective_volumes(moe_workload())["expert"] == {"all-to-all": MOE_A2A}
    u = ulysses_workload()
    assert u.model.forms.collective_volumes(u)["context"]["all-to-all"] == ULYSSES_A2A


def test_moe_all_to_all_is_priced_on_the_axis_array():
    # The Book: the array over the expert axis V_axis = 4·163,840 = 655,360 B, T = V_axis/(4·W) = 163,840/W
    # (9.102e-7 s on v5p's 1.8e11 B/s); main priced the device's 163,840 B at 163,840/(4·W) = 2.276e-7 s.
    # The expert key holds the all-to-alls alone (the non-expert gradients are data+expert's).
    p = program.predict(moe_workload(), V5P, axis_links={"expert": 1.0})
    assert p.times.comms["expert"] == pytest.approx(655_360 / (4 * W), rel=1e-12)
    assert p.times.comms["expert"] == pytest.approx(9.1022e-7, rel=1e-4)


def test_ulysses_all_to_all_is_priced_on_the_axis_array():
    # context's volumes: the all-to-alls 32,768 B and the gradients all-reduced over context (a data axis for them):
    # tiny-tf's 2 blocks of D·H·(2N+2K) + 2·D·F = 64·8·32 + 2·64·256 = 49,152 parameters, BF16: 196,608 B.
    # T = 2·196,608/W (an all-reduce, twice an all-gather) + the Book's AllToAll of 4·32,768 B: 4·32,768/(4·W)
    u = ulysses_workload()
    assert u.model.forms.collective_volumes(u)["context"]["all-reduce"] == 196_608
    p = program.predict(u, V5P, axis_links={"context": 1.0})
    assert p.times.comms["context"] == pytest.approx((2 * 196_608 + 32_768) / W, rel=1e-12)


def test_the_time_takes_the_axis_size_its_links_and_the_planner_s_arrays():
    V = 10_240
    # n = 2, 4, 8 devices (the planner's array of meshes): n·V/(4·W) each
    t = program.comm_times({"expert": {"all-to-all": V}}, V5P, {"expert": 1.0}, mesh={"expert": np.array([2, 4, 8])})
    np.testing.assert_allclose(t["expert"], [2 * V / (4 * W), V / W, 2 * V / W], rtol=1e-12)
    # over two physical axes (links 2: 2x2) the array's bytes split over both rings, 4·V/(4·2·W); a line (links
    # 1/2) twice a ring's
    two = program.comm_times({"expert": {"all-to-all": V}}, V5P, {"expert": 2.0}, mesh={"expert": 4})
    line = program.comm_times({"expert": {"all-to-all": V}}, V5P, {"expert": 0.5}, mesh={"expert": 4})
    assert (two["expert"], line["expert"]) == (pytest.approx(V / (2 * W)), pytest.approx(2 * V / W))
    # the same as scaling.families.moe's ring form (expert_critical_batch's), n·V/(4·W_ici)
    assert program.comm_times({"expert": {"all-to-all": V}}, V5P, {"expert": 1.0}, mesh={"expert": 8})["expert"] \
        == pytest.approx(all_to_all_seconds(V, 8, W, "ring"), rel=1e-12)


def test_across_slices_the_buffer_s_share_off_the_slice_goes_over_dcn():
    # expert = 8 over 2 slices of 4: within a slice the Book's AllToAll of 4·V, 4·V/(4·W); over DCN the half of a
    # device's buffer bound for the other slice through its own link, V·(2−1)/2 / (DCN bytes/s per device)
    V = 10_240
    t = program.comm_times({"expert": {"all-to-all": V}}, V5P, {"expert": 1.0}, dcn={"expert": 2}, mesh={"expert": 8})
    dcn = V5P.dcn_bw / V5P.devices_per_chip
    assert t["expert"] == pytest.approx(4 * V / (4 * W) + V / 2 / dcn, rel=1e-12)


def test_an_all_to_all_without_the_mesh_is_refused():
    with pytest.raises(ValueError, match="all-to-all over expert .* give the mesh"):
        program.comm_times({"expert": {"all-to-all": 1.0}}, V5P)


@pytest.mark.compiles
@pytest.mark.parametrize("make,axis,hand_f32,ops", [
    # XLA:CPU moves the BF16 buffers as F32 (4 B an element): MoE 4 all-to-alls a layer of 4·80·64 = 20,480 B,
    # 4 layers: 327,680 B; Ulysses 8 a layer of 4·16·8·8 = 4,096 B, 2 layers: 65,536 B
    (moe_workload, "expert", 327_680, 4),
    (ulysses_workload, "context", 65_536, 8),
], ids=["moe-expert4", "ulysses-context4"])
def test_compiled_all_to_alls_against_the_closed_form(make, axis, hand_f32, ops):
    """The train step compiled on cpu:8: every all-to-all runs over the 4 devices of the axis and keeps its size per
    device; the operands (x the loop's trips) sum to the closed form's volume, the quantity its time is priced
    from; the Book's time of the compiled program (each all-to-all the array of its group, group·operand, at the
    BF16 bytes a TPU moves) is the closed form's."""
    from ffn_model.compile import abstract_compile
    from mesh import make_mesh, mesh_shape
    from verify.hlo import read_compiled

    w = make()
    mesh = make_mesh(w.mesh, "cpu:8")
    got = read_compiled(abstract_compile(w, mesh).compiled, dict(mesh_shape(mesh)))
    a2a = [c for c in got.collectives if c.kind == "all-to-all"]
    assert len(a2a) == ops and all(c.dtype == "f32" for c in a2a)
    assert all(c.axes == (axis,) and c.group_size == 4 and c.operand_bytes == c.result_bytes for c in a2a)
    compiled = sum(c.operand_bytes * c.count for c in a2a)
    widened = w.with_facts(min_comm_bytes=4)
    assert compiled == hand_f32 == widened.model.forms.collective_volumes(widened)[axis]["all-to-all"]
    # the Book on the compiled program: Σ count·group·operand·(2/4)/(4·W), e.g. MoE 4·327,680/2/(4·W) = 163,840/W
    book = sum(c.count * c.group_size * c.operand_bytes * 2 / 4 for c in a2a) / (4 * W)
    priced = program.comm_times({axis: {"all-to-all": w.model.forms.collective_volumes(w)[axis]["all-to-all"]}}, V5P,
                                {axis: 1.0}, mesh=w.mesh)[axis]
    assert priced == pytest.approx(book, rel=1e-12)
