"""Closed forms against the Scaling Book's own worked numbers and hand derivations.

Expected values are written out by hand from the book (training, sharding pages) or derived in the
comments; none is copied from the code under test.
"""

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaling.hardware import collectives
from scaling.step import flops
from scaling.step import memory
from scaling.hardware import roofline
from scaling.reports.answers import answers
from scaling.families.ffn import FFNConfig
from scaling.core.mesh_shape import MeshShape, parse_mesh_spec
from scaling.families.presets import PRESETS
from scaling.core.schedule import Schedule
from scaling.step.program import collective_volumes as collectives_of
from scaling.hardware.chips import get_chip, parse_slice, slice_topology
from scaling.core.workload import Workload

XXL = PRESETS["xxl"]


# --- The Scaling Book's worked numbers -------------------------------------------------------------

def test_alpha_v5p_about_2550():
    # Book, training page: alpha = C / W_ici = 4.59e14 / 1.8e11 ~ 2550 for TPU v5p.
    v5p = get_chip("v5p")
    assert roofline.alpha(v5p.bf16_flops, v5p.ici_bidi) == pytest.approx(2550, rel=1e-3)
    assert v5p.alpha == pytest.approx(2550, rel=1e-3)


def test_dp_threshold_about_850_per_chip_over_three_axes():
    # Book, training page: data parallelism is compute bound when B/N > alpha/M; with all three
    # v5p axes, ~2550/3 = 850 tokens per chip. Solve T_math = T_comms with the roofline's own times.
    v5p = get_chip("v5p")
    D, F, N = 8192, 32768, 64
    per_chip = 850.0
    t = roofline.dp_times(per_chip * N, D, F, N, v5p.bf16_flops, v5p.ici_bidi, M=3)
    assert t["math"] / t["comms"] == pytest.approx(1.0, rel=1e-3)


def test_x_opt_book_example():
    # Book example: N=64, B=48k (49,152), F=32768, M_X/M_Y=2: sqrt(49152/32768·2·64) = sqrt(192) = 13.86.
    assert roofline.x_opt(48 * 1024, 32768, 64, M_X=2, M_Y=1) == pytest.approx(13.86, abs=0.01)


def test_xopt_threshold_about_400():
    # Book (spring-2025): B/N > 4·alpha²/(M_X·M_Y·F) = 4·2550²/(2·32768) = 396.9, "about 400".
    assert roofline.xopt_threshold_per_device(2550, 32768, 2, 1, "sum") == pytest.approx(396.9, abs=0.1)
    # August-2025 max form drops the factor 4.
    assert roofline.xopt_threshold_per_device(2550, 32768, 2, 1, "max") == pytest.approx(99.2, abs=0.1)


def test_llama70b_params_and_moments():
    # Book, applied-training / training page: LLaMA-70B: 140 GB bf16 params, 560 GB fp32 Adam moments.
    m = memory.param_memory(70_000_000_000)
    assert m["weights_compute"] == 140e9
    assert m["optimizer"] == 560e9


def test_collective_times_book_rules():
    # Sharding page: AG of V over one axis with wraparound ~ V/W_ici; over 2 axes V/(2·W_ici);
    # without wraparound twice as long; AR = 2·AG; all-to-all = AG/4; latency floor 1 us per hop.
    V, W = 1e9, 1.8e11
    assert collectives.allgather_time(V, [16], W) == pytest.approx(V / W)
    assert collectives.allgather_time(V, [16, 4], W) == pytest.approx(V / (2 * W))
    assert collectives.allgather_time(V, [8], W, wraparound=False) == pytest.approx(2 * V / W)
    assert collectives.collective_time("all-reduce", V, [16], W) == pytest.approx(2 * V / W)
    assert collectives.collective_time("all-to-all", V, [16], W) == pytest.approx(V / W / 4)
    assert collectives.allgather_time(1.0, [16], W) == pytest.approx(8e-6)  # 16/2 hops x 1 us
    assert collectives.allgather_time(V, [1, 1], W) == 0.0


# --- The question's XXL model, derived by hand -------------------------------------------------------
# (a) P = 2·D·F·L = 2 · 16384 · 53248 · 126. 16384·53248 = 872,415,232; ×2 = 1,744,830,464;
#     ×126 = 219,848,638,464. State: (4 master + 4 grad + 2·4 Adam) = 16 B/param
#     -> 3,517,578,215,424 B = 3.5176e12; / 80e9 = 43.97 H100s -> 44.
#     Activations per token: 2 bytes · (16384 + 53248) · 126 = 2 · 69,632 · 126 = 17,547,264.
# (b) 3.5176e12 / 95e9 = 37.03 -> N_FSDP >= 38 without activations.
# (c) alpha = 4.6e14/1.8e11 = 2555.56. N = 64. F/(Y·M_X) = 53248/8 = 6656.
#     F/(N·alpha) = 53248/(64·2555.56) = 0.325565; 1/(X·M_Y) = 1/16 = 0.0625.
#     sum: B > 6656/(0.325565 − 0.0625) = 25,301.7 -> 395.3 per chip (B/N), 1581.4 per FSDP shard (B/X).
#     max: B > 6656/0.325565 = 20,444.4 -> 319.4 per chip, 1277.8 per FSDP shard.

def test_xxl_answers_by_hand():
    ans = answers()
    a, b, c = ans.a, ans.b, ans.c
    assert a.params == 219_848_638_464
    assert a.fp32_state_bytes == 3_517_578_215_424
    assert a.gpu_equivalent == pytest.approx(43.97, abs=0.005)
    assert a.gpu_count == 44
    assert a.activation_bytes_per_token == 17_547_264
    assert b.min_n_fsdp_without_activations == 38
    assert c.alpha == pytest.approx(2555.56, abs=0.01)
    assert c.critical["sum"].overall_batch == pytest.approx(25_301.7, abs=0.5)
    assert c.critical["sum"].per_device_batch == pytest.approx(395.3, abs=0.05)
    assert c.critical["sum"].per_fsdp_shard_batch == pytest.approx(1581.4, abs=0.1)
    assert c.critical["max"].overall_batch == pytest.approx(20_444.4, abs=0.5)
    assert c.critical["max"].per_device_batch == pytest.approx(319.4, abs=0.05)
    assert c.critical["max"].per_fsdp_shard_batch == pytest.approx(1277.8, abs=0.1)


def test_other_inputs_by_hand():
    # A different model and mesh: D=8192, F=32768, L=10, X=8, Y=8, M_X=M_Y=1, alpha=2550.
    # P = 2·8192·32768·10 = 5,368,709,120. F/(Y·M_X) = 4096; F/(N·alpha) = 32768/(64·2550) = 0.200784;
    # 1/(X·M_Y) = 0.125. sum: B > 4096/0.075784 = 54,048; max: B > 4096/0.200784 = 20,400.
    ans = answers(d_model=8192, d_ff=32768, blocks=10, fsdp=8, tensor=8, mx=1, my=1, flops=4.59e14, w_ici=1.8e11)
    assert ans.a.params == 5_368_709_120
    assert ans.c.critical["sum"].overall_batch == pytest.approx(54_048, rel=1e-3)
    assert ans.c.critical["max"].overall_batch == pytest.approx(20_400, rel=1e-3)


def test_tp_alone_exceeds_math_gives_null():
    # Y = 32 >= M_Y·F/alpha = 53248/2555.6 = 20.8: the TP term B/(X·M_Y) = B/2 grows faster than the
    # math B·F/(N·alpha) = B·0.3256: no batch is compute bound.
    ans = answers(fsdp=2, tensor=32, mx=1)  # fsdp=2 spans one ICI axis
    assert ans.c.critical["sum"].overall_batch is None and ans.c.critical["max"].overall_batch is None


def test_first_block_needs_no_input_gradient():
    # Train FLOPs = 6·P·B − 2·B·D·F (the first block's dx = dh·W_in^T is not needed).
    cfg = FFNConfig(64, 256, 3)
    B = 128
    f = flops.step_flops(cfg, B, "train")
    assert f["total"] == 6 * cfg.params * B - 2 * B * 64 * 256
    assert flops.step_flops(cfg, B, "forward")["total"] == 2 * cfg.params * B


# --- Property tests ---------------------------------------------------------------------------------

dims = st.sampled_from([64, 128, 256, 512])
shards = st.sampled_from([1, 2, 4, 8])


@settings(max_examples=200, deadline=None)
@given(dims, dims, st.integers(1, 8), shards, shards, shards, st.sampled_from(["none", "every-second", "full"]))
def test_memory_sharded_covers_unsharded(D, F, L, data, fsdp, tensor, remat):
    # Memory per device × devices >= the unsharded state + activations (sharding never loses bytes).
    cfg = FFNConfig(D, F, L)
    mesh = MeshShape(data=data, fsdp=fsdp, tensor=tensor)
    B = 1024
    per_dev = memory.memory_per_device(Workload(cfg, mesh, B, remat=remat))
    unsharded = memory.memory_per_device(Workload(cfg, MeshShape(), B, remat=remat))
    assert per_dev["total"] * mesh.devices >= unsharded["total"] - unsharded["transient_weights"] - 1e-6


@settings(max_examples=200, deadline=None)
@given(dims, dims, st.integers(1, 8), shards, shards, shards)
def test_memory_monotone_in_shards(D, F, L, data, fsdp, tensor):
    cfg = FFNConfig(D, F, L)
    B = 1024
    base = memory.memory_per_device(Workload(cfg, MeshShape(data=data, fsdp=fsdp, tensor=tensor), B))["total"]
    for bigger in (MeshShape(data=2 * data, fsdp=fsdp, tensor=tensor),
                   MeshShape(data=data, fsdp=2 * fsdp, tensor=tensor),
                   MeshShape(data=data, fsdp=fsdp, tensor=2 * tensor)):
        assert memory.memory_per_device(Workload(cfg, bigger, B))["total"] <= base


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([4096, 16384, 53248]), st.sampled_from([1, 2, 4, 8, 16, 32]), st.sampled_from([1, 2, 4, 8, 16]),
       st.floats(500, 5000), st.integers(1, 3), st.integers(1, 3))
def test_sum_form_never_below_max_form(F, X, Y, alpha_, mx, my):
    s = roofline.critical_batch(F, X, Y, alpha_, mx, my, "sum")
    m = roofline.critical_batch(F, X, Y, alpha_, mx, my, "max")
    assert (s is None) == (m is None)
    if s is not None:
        assert s >= m


# --- Bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, word", [
    (dict(d_model=0), "d_model"), (dict(d_ff=-5), "d_ff"), (dict(blocks=0), "blocks"),
    (dict(fsdp=0), "fsdp"), (dict(tensor=-1), "tensor"), (dict(flops=0), "flops"), (dict(w_ici=-1.0), "w_ici"),
    (dict(d_model=1000, fsdp=16), "d_model"), (dict(d_ff=1001, tensor=4), "d_ff"),
])
def test_bad_input_raises_valueerror_naming_it(kwargs, word):
    with pytest.raises(ValueError, match=word):
        answers(**kwargs)


def test_bad_mesh_and_chip():
    with pytest.raises(ValueError, match="product|devices"):
        parse_mesh_spec("fsdp=16,tensor=4", devices=32)
    with pytest.raises(ValueError, match="unknown mesh axis"):
        parse_mesh_spec("pipe=4")
    with pytest.raises(ValueError, match="unknown chip"):
        get_chip("v9z")
    with pytest.raises(ValueError, match="v5p"):
        parse_slice("v5p-7")


def test_v5p_topologies():
    # Google Cloud v5p docs: v5p-128 = 64 chips = 4x4x4; v5p-8 = 4 chips = 2x2x1.
    assert parse_slice("v5p-128")[1] == (4, 4, 4)
    assert parse_slice("v5p-8")[1] == (2, 2, 1)
    dims = slice_topology(get_chip("v5p"), 4480)  # v5p-8960: whole cubes
    assert math.prod(dims) == 4480 and all(d % 4 == 0 for d in dims)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "scaling", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [
    ["--d-model", "0"], ["--fsdp", "-2"], ["--d-model", "1000"], ["--flops", "0"], ["--tensor", "3"],
])
def test_cli_bad_input_exit_2_one_line(args):
    r = _cli("answer", *args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_cli_json_fields():
    r = _cli("answer", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert isinstance(j["a"]["gpu_count"], int) and isinstance(j["a"]["gpu_equivalent"], float)
    for form in ("sum", "max"):
        for k in ("overall_batch", "per_device_batch", "per_fsdp_shard_batch"):
            assert j["c"][form][k] > 0
    assert j["b"]["min_n_fsdp_without_activations"] == 38


@pytest.mark.parametrize("args, word", [
    (["--stages", "3"], "stages=3 must divide the FSDP size fsdp=16"),
    (["--stages", "32"], "stages=32 must divide the FSDP size fsdp=16"),
    (["--stages", "4"], "and blocks=126 (each runs blocks/stages of them); valid: 1, 2"),
    (["--mx", "4"], "span 5 ICI axes"),
    (["--mx", "2", "--my", "2"], "span 4 ICI axes"),
    (["--fsdp", "2", "--tensor", "32", "--mx", "2"], "fsdp=2 cannot span 2 ICI axes"),
])
def test_cli_impossible_inputs_exit_2(args, word):
    """Inputs the question's mesh cannot have: a stage count that does not divide the FSDP size (each
    stage takes X/S of the FSDP shards) or the 126 blocks, more ICI axes than a 3D torus has."""
    r = _cli("answer", *args)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0], lines


def test_one_shard_per_stage_has_no_fsdp_term():
    """--stages 16 with X = 16: each stage is 1 FSDP shard x Y = 4 TP chips, so no weight gathers. By hand,
    the stage is compute bound when T_TP < T_math: 4BD/(1·M_Y·W) < 4BDF/(4·C) <=> 1 < F/(4·alpha) =
    53248/(4·2555.6) = 5.2: true for every B, so the threshold is 0 tokens."""
    d = answers(stages=16, blocks=128).d  # 16 stages need a block count they divide
    assert d.levers["sum"].pipeline == 0 and d.levers["max"].pipeline == 0
    # and with 4 stages, X/S = 4 shards: the sum form's threshold by hand,
    # F/(Y·M_X) / (F/((N/S)·alpha) - 1/((X/S)·M_Y)) = 6656 / (53248/40888.9 - 1/4) = 6656/1.052260 = 6325.4
    assert answers(stages=4, blocks=128).d.levers["sum"].pipeline == pytest.approx(6325.4, rel=1e-4)


def test_default_stages_divide_the_blocks():
    """4 stages cannot split 126 = 2·3²·7 blocks, so (d) takes 2, the largest count <= 4 dividing both
    X = 16 and L = 126. By hand (alpha = 4.6e14/1.8e11 = 2555.56, N/S = 32, X/S = 8):
    6656 / (53248/(32·2555.56) − 1/8) = 6656/(0.651128 − 0.125) = 6656/0.526128 = 12,650.9 tokens. The
    program it names: stage=2, fsdp=8, tensor=4; gathered once per step its fsdp bytes per device are one
    gather of the stage's 63 blocks, 2 matrices × D·F/Y × 2 B × 63 = 54,962,159,616, and per microbatch
    T = M + S − 1 = 5 times that; both add the loss's 4-byte all-reduce over fsdp."""
    d = answers().d
    assert d.levers["sum"].pipeline_stages == 2 and "4 cannot split 126 blocks evenly" in d.pipeline_stages_why
    assert d.levers["sum"].pipeline == pytest.approx(12650.9, rel=1e-4)
    pp = d.pipeline_program
    assert pp.mesh == "stage=2,fsdp=8,tensor=4" and pp.microbatches == 4
    once = pp.gathers["step"].collective_bytes["fsdp"] - 4
    assert once == 2 * 16384 * 53248 // 4 * 2 * 63 == 54_962_159_616
    assert pp.gathers["microbatch"].collective_bytes["fsdp"] - 4 == 5 * once


def test_answer_states_its_constants_batch_and_recommended_form():
    r = _cli("answer")
    assert "C = 4.6e+14" in r.stdout and "95 GB HBM per v5p" in r.stdout and "v5p C = 4.59e+14" in r.stdout
    assert "a batch the question does not state" in r.stdout
    assert "Recommended: the scheduled form under the flags production runs pass ('maxtext'" in r.stdout
    assert "0 asynchronous" in r.stdout
    c = json.loads(_cli("answer", "--json").stdout)["c"]
    assert (c["recommended_form"], c["assumed_flags"]) == ("scheduled", "maxtext")
    # by hand: alpha = 4.6e14/1.8e11 = 2555.6; hidden gathers fit behind the math for B > X·alpha/M_X = 16·2555.6/2
    # = 20,444 (maxtext, overlap); under libtpu's defaults the sum form's 25,302 (test_cli_text_shows_both_conventions)
    assert c["by_flags"]["overlap"]["overall_batch"] == pytest.approx(16 * 4.6e14 / 1.8e11 / 2, rel=1e-9)
    assert c["by_flags"]["maxtext"]["overall_batch"] == c["by_flags"]["overlap"]["overall_batch"]
    assert c["by_flags"]["default"]["overall_batch"] == c["sum"]["overall_batch"]
    # TP exposed under every set: Y·alpha/(M_Y·F) = 4·2555.6/53248 = 19.2% of the math
    assert c["recommended_with_flags"]["tp_share_of_math"] == pytest.approx(4 * 4.6e14 / 1.8e11 / 53248, rel=1e-9)


def test_d_under_the_flags_production_runs_pass():
    """(d) under 'maxtext' (within-block gathers): compute bound above the larger of the max form and the sum form
    with half the FSDP bytes (W_in's gather exposed, W_out's hidden). By hand, alpha = 2555.6, F = 53248, M_X = 2:
      X=16, Y=4:  max 16·alpha/2 = 20,444; half-bytes sum (F/2)/(Y·M_X) / (F/(N·alpha) − 1/X)
                  = 3328/(0.32556 − 0.0625) = 12,651  ->  20,444
      int8:       max 10,222, sum 6,326                                   -> 10,222
      X=8, Y=8:   max 10,222; sum 1664/(0.32556 − 0.125) = 8,297          -> 10,222 (the best split: X=4, Y=16 gives
                  max 5,111 but sum 832/(0.32556 − 0.25) = 11,011; X=2 is never compute bound)
      2 stages:   X=8, Y=4 per stage: max 10,222, sum 3328/(0.65111 − 0.125) = 6,326 -> 10,222"""
    d = json.loads(_cli("answer", "--json").stdout)["d"]["scheduled"]
    al = 4.6e14 / 1.8e11
    assert d["flags"] == "maxtext"
    assert d["baseline"] == pytest.approx(16 * al / 2, rel=1e-9)
    assert d["int8_weight_gathers"] == pytest.approx(8 * al / 2, rel=1e-9)
    assert (d["best_split"]["X"], d["best_split"]["Y"]) == (8, 8)
    assert d["best_split"]["overall_batch"] == pytest.approx(8 * al / 2, rel=1e-9)
    assert d["pipeline"] == pytest.approx(8 * al / 2, rel=1e-9)
    # the X=4, Y=16 split: its half-bytes sum form (11,011 by hand) is what the best split beats
    from scaling.reports.answers import flags_batch
    assert flags_batch(53248, 4, 16, al, 2, 1, "within-block") == pytest.approx(11_011, abs=1)


def test_cli_text_shows_both_conventions():
    r = _cli("answer")
    assert r.returncode == 0
    for needle in ("sum form", "max form", "B/N", "B/X", "25,302", "20,444", "int8", "pipeline"):
        assert needle in r.stdout


def test_import_scaling_does_not_import_jax():
    code = ("import sys, scaling, scaling.reports.answers, scaling.hardware.roofline, scaling.step.memory; "
            "sys.exit('jax' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


# --- issue 17, items 6 and 7: (d) suggests only what answer accepts; labels say what was given ---------

# A Llama-8B-sized FFN stack on 16 chips with a faster chip: alpha = 9.18e14/9e10 = 10,200.
SMALL_FAST = dict(d_model=4096, d_ff=14336, blocks=32, fsdp=8, tensor=2, mx=1, my=1, flops=9.18e14, w_ici=9e10)


def _suggested_meshes(ans):
    """Every (fsdp, tensor, mx, my) that ans's (c) and (d) name as a mesh to use instead."""
    i, c, d = ans.inputs, ans.c, ans.d
    out = [(c.x_opt[f].nearest_split.X, c.x_opt[f].nearest_split.Y, i.mx, i.my)
           for f in ("sum", "max")]
    for f in ("sum", "max"):
        if d.levers[f].fsdp_over_more_axes:
            out.append((i.fsdp, i.tensor, d.levers[f].fsdp_over_more_axes.M_X, i.my))
        if d.levers[f].best_split:
            out.append((d.levers[f].best_split.X, d.levers[f].best_split.Y, i.mx, i.my))
    S = i.stages
    out.append((i.fsdp // S, i.tensor, i.mx, i.my))  # one pipeline stage, M_X kept
    return out


@pytest.mark.parametrize("kwargs", [{}, dict(fsdp=4, mx=1, tensor=16, my=2), SMALL_FAST, dict(mx=1),
                                    dict(fsdp=8, tensor=8, mx=1, my=2), dict(fsdp=4, tensor=16, mx=2, my=1)])
def test_d_suggests_only_meshes_answer_accepts(kwargs):
    """(d) once offered "FSDP spread over 3 ICI axes (M_X=3)" beside M_Y = 1 (4 axes of a 3-axis torus,
    which answer refuses) and offered it for X = 4 (an axis of 4 chips spans at most 2 axes of 2+)."""
    ans = answers(**kwargs)
    q = {k: getattr(ans.inputs, k) for k in ("d_model", "d_ff", "blocks", "flops", "w_ici")}
    for fsdp, tensor, mx, my in _suggested_meshes(ans):
        answers(**q, fsdp=fsdp, tensor=tensor, mx=mx, my=my, stages=1)  # raises if answer would refuse it


def test_fsdp_over_more_axes_by_hand():
    # defaults: M_X = 2 and M_Y = 1 already use the torus's 3 axes; the text says so instead of M_X = 3
    ans = answers()
    assert ans.d.levers["sum"].fsdp_over_more_axes is None and ans.d.levers["max"].fsdp_over_more_axes is None
    text = ans.render()
    assert "FSDP spread over" not in text and "FSDP over more ICI axes (M_X=3): not on this torus" in text
    with pytest.raises(ValueError, match="span 4 ICI axes"):
        answers(mx=3, my=1)
    # X = 4 with M_Y = 2: one axis left, M_X = 1 already
    assert answers(fsdp=4, mx=1, tensor=16, my=2).d.levers["sum"].fsdp_over_more_axes is None
    # the question's mesh at M_X = 1: spreading FSDP over 2 axes gives the question's own threshold,
    # 6656/(0.325565 - 0.0625) = 25,301.7 (by hand above, test_xxl_answers_by_hand)
    more = answers(mx=1).d.levers["sum"].fsdp_over_more_axes
    assert more.M_X == 2 and more.overall_batch == pytest.approx(25_301.7, abs=0.5)


def test_x_opt_reported_within_the_mesh():
    # alpha = 10,200; sum form at X_opt: B/N > 4·alpha²/F = 4·10200²/14336 = 29,029.0, B = 16·that = 464,464;
    # X_opt = sqrt((464464/14336)·1·16) = sqrt(518.4) = 22.8 > N = 16. The divisor of 16 nearest it is X = 16,
    # Y = 1: pure FSDP, B > X·alpha/M_X = 16·10200 = 163,200 tokens.
    ans = answers(**SMALL_FAST)
    xo = ans.c.x_opt["sum"]
    assert xo.x_opt == pytest.approx(22.77, abs=0.01)
    assert xo.nearest_split.X == 16 and xo.nearest_split.Y == 1
    assert xo.nearest_split.overall_batch == pytest.approx(163_200, rel=1e-9)
    text = ans.render()
    assert "X_opt = 22.8 unconstrained: more than the N = 16 chips" in text
    assert "the nearest mesh of X·Y = 16 chips: X=16, Y=1, overall B > 163,200 tokens" in text
    # the question's: X_opt = 6.1 (sum), nearest divisor of 64 on a log scale is 8 (ln(8/6.1) = 0.27 <
    # ln(6.1/4) = 0.42), and X = 8, Y = 8 is the (d) re-split's 16,593 tokens
    assert answers().c.x_opt["sum"].nearest_split.X == 8


@pytest.mark.parametrize("args, word", [
    (["--d-model", str(10**30)], "--d-model must be below 2^31"),  # 1e30 is not an int to argparse (exit 2 there)
    (["--d-model", str(2**30), "--d-ff", str(2**30)], "weights L·D·F"),  # 126·2^60 elements: over 2^63
    (["--batch-tokens", str(10**24)], "--batch-tokens must be below 2^31"),
    (["--hbm", "95"], "--hbm is the memory per device in bytes"),  # 95 GB given as 95
    (["--gpu-hbm", "1e-300"], "--gpu-hbm is the memory per GPU in bytes"),
    (["--fsdp", "4096", "--tensor", "4"], "at most 6,144 chips"),
])
def test_absurd_sizes_exit_2_one_line(args, word, capsys):
    """--d-model 10^30 printed 2.7e27 GPUs and exit 0; --hbm 1e-300 an OverflowError traceback."""
    from jax_scaling.cli import main

    assert main(["answer", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and word in err, err


def test_labels_say_what_was_given():
    """Custom --flops/--hbm were labelled "(TPU v5p as the Scaling Book rounds it)" and "per v5p"; one GPU
    was "1 GPUs". The state of SMALL_FAST: 16·2·4096·14336·32 = 6.01e10 B < 80 GB: 1 GPU."""
    text = answers(**{**SMALL_FAST, "hbm": 32e9, "gpu_hbm": 141e9}).render()
    assert ("C = 9.18e+14 bf16 FLOP/s (given by --flops)" in text
            and "W_ici = 9e+10 B/s per chip (given by --w-ici)" in text)
    assert "32 GB HBM per TPU (given by --hbm)" in text and "141 GB per GPU (given by --gpu-hbm)" in text
    assert "as the Scaling Book rounds it)" not in text and "per v5p" not in text and "H100" not in text
    text = answers(**SMALL_FAST).render()
    assert "-> 1 GPU (state alone)" in text and "1 GPUs" not in text
    assert "95 GB HBM per v5p (the question's)" in text
    # the question's own constants keep the question's label
    assert "(TPU v5p as the Scaling Book rounds it)" in answers().render()


def test_pipeline_label_names_the_compiled_model():
    """answer --verify-pipeline on a 4096-wide model said "Forward step of the XXL" (label only: no compile here)."""
    from verify.check import render_pipeline

    for kwargs, name in (({}, "the XXL"), (SMALL_FAST, "the FFN stack D=4,096, F=14,336, L=32"),
                         (dict(d_model=256, d_ff=1024, blocks=4, fsdp=4, tensor=2, mx=1), "the small preset")):
        ans = answers(**kwargs)
        ans.d.pipeline_program.devices = "tpu:v5p:2x2x2"
        assert f"Forward step of {name}" in render_pipeline(ans)


def test_vocabulary_terms_by_hand():
    """small-tf (D=256, N=K=8, H=32, F=1024, L=4, T=256) with V=1024 on fsdp=2, tensor=4, B=4,096 tokens: each
    device t = 4096/2 = 2,048 tokens; BF16 c = 2. By hand, what the vocabulary adds to the same model without one:
      parameters   2·V·D = 2·1024·256 = 524,288 (untied), 262,144 tied
      FLOPs        logits 2·t·D·V/Y = 2·2048·256·256 = 268,435,456 forward, twice that backward
      fsdp         E and U gathered once, c·V·D/Y = 2·1024·256/4 = 131,072 B each; two gradients reduce-scattered
      tensor       the lookup's sum and the output's input gradient, c·t·D = 1,048,576 B each; the loss's max on
                   the BF16 logits 2·t = 4,096 and its two FP32 sums 8·t = 16,384
      inputs       int32 ids and labels 8·t = 16,384 B instead of x and y, 6·t·D = 3,145,728"""
    from scaling.families.transformer import collective_volumes, memory_per_device, step_flops

    base = PRESETS["small-tf"]
    mesh = parse_mesh_spec("fsdp=2,tensor=4")
    plain = Workload(base, mesh, 4096)
    for tied, params in ((False, 524_288), (True, 262_144)):
        w = Workload(base.replace(vocab=1024, tied_embeddings=tied), mesh, 4096)
        assert w.model.params - base.params == params
        f0, f1 = step_flops(plain), step_flops(w)
        assert f1["forward"] - f0["forward"] == 268_435_456
        assert f1["backward"] - f0["backward"] == 2 * 268_435_456
        c0, c1 = collective_volumes(plain), collective_volumes(w)
        assert c1["fsdp"]["all-gather"] - c0["fsdp"]["all-gather"] == (1 if tied else 2) * 131_072
        assert c1["fsdp"]["reduce-scatter"] - c0["fsdp"]["reduce-scatter"] == 2 * 131_072
        assert c1["tensor"]["all-reduce"] - c0["tensor"]["all-reduce"] == 2 * 1_048_576 + 4_096 + 16_384
        assert memory_per_device(plain)["inputs"] == 3_145_728 and memory_per_device(w)["inputs"] == 16_384


def test_parallel_block_terms_by_hand():
    """small-tf (D=256, N=K=8, H=32, F=1024, L=4) on fsdp=2, tensor=4, B=4,096: t = 2,048 tokens per device,
    one [t, D] BF16 activation c·t·D = 2·2048·256 = 1,048,576 B. By hand, serial against parallel:
      tensor, train      serial 4 all-reduces per layer (2 forward, 2 backward) = 16·1,048,576 = 16,777,216;
                         parallel 2 per layer = 8,388,608; full remat: serial one more per layer (the recomputed
                         mid), 20,971,520; parallel none more, 8,388,608
      recompute FLOPs    parallel skips W_o's matmul, 2·t·N·H·D/Y = 2·2048·256·256/4 = 67,108,864 per layer,
                         268,435,456 for the 4 layers
      saved per layer    parallel keeps one norm and no mid: 2·c·t·D = 2,097,152 B fewer"""
    from scaling.families.transformer import collective_volumes, saved_per_layer, step_flops

    cfg = PRESETS["small-tf"]
    mesh = parse_mesh_spec("fsdp=2,tensor=4")
    par = cfg.replace(block="parallel")
    tensor = {(b, r): collective_volumes(Workload(c, mesh, 4096, remat=r))["tensor"]["all-reduce"]
              for b, c in (("serial", cfg), ("parallel", par)) for r in ("none", "full")}
    assert tensor == {("serial", "none"): 16_777_216, ("parallel", "none"): 8_388_608,
                      ("serial", "full"): 20_971_520, ("parallel", "full"): 8_388_608}
    recompute = [step_flops(Workload(c, mesh, 4096, remat="full"))["recompute"] for c in (cfg, par)]
    assert recompute[0] - recompute[1] == 268_435_456
    saved = [sum(saved_per_layer(c, mesh, 4096).values()) for c in (cfg, par)]
    assert saved[0] - saved[1] == 2_097_152


def test_measured_runs_presets_by_their_sources():
    """The measured runs' models. MaxText's 2023 family from its global_parameter_scale rule reproduces the
    shapes its tables list (../shared/reference/measured.md, section 1: emb, heads, mlp, layers); the Llama
    presets plus the RMSNorm scales this package's model omits (2·L·D + D) give the released checkpoints'
    parameter counts (Llama-2-7B 6,738,415,616; Llama-2-70B 68,976,648,192; Llama-3.1-8B 8,030,261,248;
    Llama-3.1-70B 70,553,706,496)."""
    from scaling.families.presets import maxtext_scale

    table = {16: (5120, 32, 32768, 32), 32: (10240, 32, 32768, 32), 64: (10240, 32, 32768, 64),
             128: (10240, 64, 65536, 64)}
    for scale, shape in table.items():
        c = maxtext_scale(scale)
        assert (c.d_model, c.heads, c.d_ff, c.blocks) == shape and PRESETS[f"maxtext-{scale}b"] == c
        assert (c.head_dim, c.vocab, c.tied_embeddings, c.block, c.mlp, c.seq_len) == (256, 32768, True, "parallel",
                                                                                      "relu", 2048)
    with pytest.raises(ValueError, match="scale=3 is not a power of two"):
        maxtext_scale(3)
    released = {"llama2-7b": 6_738_415_616, "llama2-70b": 68_976_648_192, "llama3.1-8b": 8_030_261_248,
                "llama3.1-70b": 70_553_706_496}
    for name, count in released.items():
        c = PRESETS[name]
        assert c.params + 2 * c.blocks * c.d_model + c.d_model == count, name


def test_zero1_terms_by_hand():
    """The FFN 'small' (D=256, F=1024, L=4; P = 2·256·1024·4 = 2,097,152) on data=4, fsdp=2, B = 4,096, BF16 on the
    wire. By hand, ZeRO-1 as a distributed optimizer (ffn_model.zero1) against optimizer_sharding fsdp:
      fsdp: as without ZeRO-1: all-gathers 2 per block and pass, 2·4·2·(2·256·1024·2 B) = 8,388,608; the gradients'
            reduce-scatter 4·2·256·1024·2 = 4,194,304; each data shard's loss, 4
      data: the flat buffer N = P/X = 1,048,576 (a multiple of 128·4: no padding), its BF16 reduce-scatter 2·N =
            2,097,152, the FP32 all-gather 4·N = 4,194,304, the losses' mean 4 (no all-reduce of gradients)
      memory: Adam's moments 8·N/4 = 2,097,152; the FP32 gradients whole (ZeRO stage 1) 4·N = 4,194,304"""
    mesh = parse_mesh_spec("data=4,fsdp=2")
    z = Workload(PRESETS["small"], mesh, 4096, schedule=Schedule(optimizer_sharding="zero1"))
    vols = collectives_of(z)
    assert vols["fsdp"] == {"all-gather": 8_388_608, "reduce-scatter": 4_194_304, "all-reduce": 4}
    assert vols["data"] == {"reduce-scatter": 2_097_152, "all-gather": 4_194_304, "all-reduce": 4}
    assert "data+fsdp" not in vols
    m = memory.memory_per_device(z)
    assert (m["optimizer"], m["grads"]) == (2_097_152, 4_194_304)


def test_transformer_pipeline_terms_by_hand():
    """The transformer on stage=2, fsdp=2, tensor=2 (D=64, 8 heads and 4 kv heads of 8, F=256, L=4, T=64,
    V=512; 8 sequences: t = 512/(data·fsdp) = 256 tokens per device, M = 4 microbatches of t/M = 64), BF16
    c = 2 on the wire (scaling.families.transformer.passes, stage_volumes, module docstring)."""
    from scaling.step import pipeline
    from scaling.families import transformer as tf

    cfg = PRESETS["tiny-tf"].replace(kv_heads=4, blocks=4, vocab=512)
    mesh = parse_mesh_spec("stage=2,fsdp=2,tensor=2")
    gpipe = Workload(cfg, mesh, 512, schedule=Schedule(4))
    one_f = Workload(cfg, mesh, 512, schedule=Schedule(4, pipeline="1f1b"))
    # GPipe: T = M + S − 1 = 5 iterations of a chunk of L/S = 2 layers: 10 layer-passes on a microbatch, i.e.
    # 10/4 = 2.5 passes over t; the output layer on each stage's M/S = 2 microbatches, half of t
    # (the lookup on the whole batch once, before the pipeline)
    assert tf.passes(gpipe) == {"layers": 2.5, "weight_passes": 10, "head": 0.5, "head_iterations": 1, "again": 0,
                                "iterations": 5, "chunk": 2, "lookup": 1.0, "lookup_iterations": 1}
    # 1F1B: T = M + 2(S − 1) = 6 iterations, the chunk's forward again in each, the output layer in each, and the
    # lookup of a microbatch in each (every stage: 6/4 = 1.5 passes over t), its gradient made in each
    assert tf.passes(one_f) == {"layers": 3.0, "weight_passes": 12, "head": 1.5, "head_iterations": 6, "again": 1,
                                "iterations": 6, "chunk": 2, "lookup": 1.5, "lookup_iterations": 6}
    assert pipeline.bubble(one_f.schedule, 2) == {"idle_share": 2 / 6, "overhead": 2 / 4}
    # over stage, GPipe: 5 iterations x (a microbatch's activations c·64·D forward, their gradient back)
    # = 2·5·2·64·64 = 81,920, and the outputs to stage 1 and back, 2·(S−1)·c·(t/S)·D = 2·2·128·64 = 32,768;
    # all-reduced: the input's gradient c·t·D = 32,768, the output matrix's c·V·D/(X·Y) = 16,384, the loss 4
    v = tf.collective_volumes(gpipe)["stage"]
    assert v == {"collective-permute": 81920 + 32768, "all-reduce": 32768 + 16384 + 4}
    # 1F1B: 6 iterations both ways, 2·6·2·64·64 = 98,304; no input gradient (stage 0 looks the ids up in the
    # loop): the two matrices' gradients (the lookup's on stage 0, the output layer's on stage 1) accumulated in
    # FP32 and summed in BF16, 2·2·512·64/4 = 32,768
    v = tf.collective_volumes(one_f)["stage"]
    assert v == {"collective-permute": 98304, "all-reduce": 32768 + 4}
    # the layers' weights a device holds: L/S = 2 of the 4 layers, ((2·8 + 2·4)·8·64 + 2·64·256)·2 = 90,112
    # parameters over fsdp·tensor = 4, and both embedding matrices (2·512·64 = 65,536 / 4): FP32 master
    # 4·(22,528 + 16,384)
    assert tf.memory_per_device(gpipe)["master"] == 4 * (90112 / 4 + 65536 / 4)


def test_interleaved_one_f_one_b_terms_by_hand():
    """The interleaved 1F1B (repeats R = 2) on the mesh and model above: S = 2, M = 4, chunks of L/(S·R) = 1 layer
    (ffn_model.pipeline.one_f_one_b, scaling.step.pipeline)."""
    from scaling.step import pipeline
    from scaling.families import transformer as tf

    cfg = PRESETS["tiny-tf"].replace(kv_heads=4, blocks=4, vocab=512)
    w = Workload(cfg, parse_mesh_spec("stage=2,fsdp=2,tensor=2"), 512, schedule=Schedule(4, 2, pipeline="1f1b"))
    # T = R·(M + S) + S − 2 = 2·6 + 0 = 12 iterations of one layer on a microbatch: 12/4 = 3 passes over t; the
    # output layer in every iteration, 12/4 = 3
    assert tf.passes(w) == {"layers": 3.0, "weight_passes": 12, "head": 3.0, "head_iterations": 12, "again": 1,
                            "iterations": 12, "chunk": 1, "lookup": 3.0, "lookup_iterations": 12}
    # idle: T − R·M = 12 − 8 = 4 chunk-iterations
    assert pipeline.bubble(w.schedule, 2) == {"idle_share": 4 / 12, "overhead": 4 / 8}
    assert pipeline.microbatches_in_flight(w.schedule, 2) == 7  # the ring: 2·R·S − 1 chunks
    # over stage: 12 iterations both ways, 2·12·c·64·D = 2·12·2·64·64 = 196,608; the re-lay (stage 0 holds chunks
    # 0, 1 and needs 0, 2: one round of swaps, chunk 1 for chunk 2) of one FP32 layer, ((2·8 + 2·4)·8·64 + 2·64·256)
    # = 45,056 parameters over fsdp·tensor = 4, 4·11,264 = 45,056 B, and its gradient back: 90,112; all-reduced,
    # the two matrices' accumulated gradients, 2·2·512·64/4 = 32,768
    v = tf.collective_volumes(w)["stage"]
    assert v == {"collective-permute": 196608 + 90112, "all-reduce": 32768 + 4}
    m = tf.memory_per_device(w)
    # the re-laid copy of the stage's 2 layers: 4·2·45,056/4 = 90,112 B; remat none: the residuals of 7 chunks of one
    # layer kept (the ring of 2·R·S − 1 slots) and one chunk's copy beside them, no chunk input apart
    assert m["relaid"] == 90112
    saved = sum(tf.saved_per_layer(cfg, w.mesh, 512 / 4, "none", w.schedule).values())
    assert m["activations"] == (7 + 1) * saved


def test_one_f_one_b_warmup_phases_by_hand():
    """1F1B with warm-up phases (Schedule.warmup_phases) on the mesh and model above (S = 2, M = 4): its first and
    last W = R·S − 1 iterations run one slot each (ffn_model.pipeline.one_f_one_b), so a stage runs R·M + S − 1
    slots each way and the output layer in the R·(M − S) + S iterations between: Megatron's bubble (S − 1)/(R·M)."""
    from scaling.step import pipeline
    from scaling.families import transformer as tf

    cfg = PRESETS["tiny-tf"].replace(kv_heads=4, blocks=4, vocab=512)
    mesh = parse_mesh_spec("stage=2,fsdp=2,tensor=2")
    w = Workload(cfg, mesh, 512, schedule=Schedule(4, pipeline="1f1b", warmup_phases=True))
    # R = 1: T = 6 iterations, W = 1: 5 slots of a 2-layer chunk each way (10 layer-passes on a microbatch, 2.5 over
    # t); the output layer in the 4 steady iterations, 4/4 = 1 pass over t
    # the lookup in the 5 forward slots, its gradient in the 5 backward ones
    assert tf.passes(w) == {"layers": 2.5, "weight_passes": 10, "head": 1.0, "head_iterations": 4, "again": 1,
                            "iterations": 5, "chunk": 2, "lookup": 5 / 4, "lookup_iterations": 5}
    assert pipeline.bubble(w.schedule, 2) == {"idle_share": 1 / 5, "overhead": 1 / 4}
    # over stage: 5 slots both ways, 2·5·2·64·64 = 81,920, less the one-iteration cool-down's input gradient that
    # nothing reads (XLA unrolls the phase and drops the permute), 2·64·64 = 8,192; all-reduced as without phases
    assert tf.collective_volumes(w)["stage"] == {"collective-permute": 81920 - 8192, "all-reduce": 32768 + 4}
    # R = 2 (chunks of one layer): T = 12, W = 3: 9 slots each way, 9/4 passes over t, the output layer in 6
    w = Workload(cfg, mesh, 512, schedule=Schedule(4, 2, pipeline="1f1b", warmup_phases=True))
    assert tf.passes(w) == {"layers": 2.25, "weight_passes": 9, "head": 1.5, "head_iterations": 6, "again": 1,
                            "iterations": 9, "chunk": 1, "lookup": 9 / 4, "lookup_iterations": 9}
    assert pipeline.bubble(w.schedule, 2) == {"idle_share": 1 / 9, "overhead": 1 / 8}
    # 9 slots both ways, 2·9·2·64·64 = 147,456 (no phase of one iteration), and the re-lay 90,112 (above)
    assert tf.collective_volumes(w)["stage"]["collective-permute"] == 147456 + 90112
