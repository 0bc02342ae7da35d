"""The compiled program's kernels by kind (verify.hlo.HloProgram.kernels, issue 51 item 4's reader): what one run
launches per device, each instruction of each computation that runs as kernels of its own (the entry, a while's body
and condition) counted as many times as the computation runs, fusion and reducer bodies inside their caller's kernel.
Held on a made-up program whose counts are read off by hand."""

from __future__ import annotations

import pytest

from verify.hlo import KERNEL_KINDS, parse_hlo

# A loop of 3 trips whose body runs: a GEMM fusion (a dot inside), an elementwise fusion, cuBLAS's GEMM custom call,
# an asynchronous all-reduce (start and done: one kernel), a copy, and the counter's add; its condition a compare.
# The entry: an elementwise fusion before the loop and cuDNN's fused attention after it.
HLO = """\
HloModule m, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%gemm_body (g0: bf16[64,32], g1: bf16[32,16]) -> bf16[64,16] {
  %g0 = bf16[64,32]{1,0} parameter(0)
  %g1 = bf16[32,16]{1,0} parameter(1)
  ROOT %d = bf16[64,16]{1,0} dot(%g0, %g1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%scale_body (e0: bf16[64,16]) -> bf16[64,16] {
  %e0 = bf16[64,16]{1,0} parameter(0)
  ROOT %n = bf16[64,16]{1,0} negate(%e0)
}

%body (t: (s32[], bf16[64,32], bf16[32,16], bf16[64,16])) -> (s32[], bf16[64,32], bf16[32,16], bf16[64,16]) {
  %t = (s32[], bf16[64,32]{1,0}, bf16[32,16]{1,0}, bf16[64,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[64,32]{1,0} get-tuple-element(%t), index=1
  %w = bf16[32,16]{1,0} get-tuple-element(%t), index=2
  %h = bf16[64,16]{1,0} fusion(%x, %w), kind=kOutput, calls=%gemm_body
  %h2 = bf16[64,16]{1,0} fusion(%h), kind=kLoop, calls=%scale_body
  %h3 = bf16[64,16]{1,0} custom-call(%x, %w), custom_call_target="__cublas$gemm"
  %ars = bf16[64,16]{1,0} all-reduce-start(%h2), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  %ard = bf16[64,16]{1,0} all-reduce-done(%ars)
  %c = bf16[64,16]{1,0} copy(%ard)
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], bf16[64,32]{1,0}, bf16[32,16]{1,0}, bf16[64,16]{1,0}) tuple(%j, %x, %w, %c)
}

%cond (t2: (s32[], bf16[64,32], bf16[32,16], bf16[64,16])) -> pred[] {
  %t2 = (s32[], bf16[64,32]{1,0}, bf16[32,16]{1,0}, bf16[64,16]{1,0}) parameter(0)
  %i2 = s32[] get-tuple-element(%t2), index=0
  %n3 = s32[] constant(3)
  ROOT %lt = pred[] compare(%i2, %n3), direction=LT
}

ENTRY %main (p: bf16[64,32], q: bf16[32,16], o: bf16[64,16]) -> bf16[64,16] {
  %p = bf16[64,32]{1,0} parameter(0)
  %q = bf16[32,16]{1,0} parameter(1)
  %o = bf16[64,16]{1,0} parameter(2)
  %o2 = bf16[64,16]{1,0} fusion(%o), kind=kLoop, calls=%scale_body
  %z = s32[] constant(0)
  %init = (s32[], bf16[64,32]{1,0}, bf16[32,16]{1,0}, bf16[64,16]{1,0}) tuple(%z, %p, %q, %o2)
  %loop = (s32[], bf16[64,32]{1,0}, bf16[32,16]{1,0}, bf16[64,16]{1,0}) while(%init), condition=%cond, body=%body
  %y = bf16[64,16]{1,0} get-tuple-element(%loop), index=3
  ROOT %att = bf16[64,16]{1,0} custom-call(%y, %y, %y), custom_call_target="__cudnn$fmhaSoftmax"
}
"""
X, W, H = 2 * 64 * 32, 2 * 32 * 16, 2 * 64 * 16  # bytes of x [64, 32], w [32, 16] and h [64, 16] in BF16


def test_the_kernels_of_a_made_up_program_by_hand():
    k = parse_hlo(HLO).kernels()
    assert set(k) == set(KERNEL_KINDS)
    # 3 trips: the GEMM fusion and the cuBLAS call, each reading x and w and writing h
    assert k["gemm"] == {"count": 6, "bytes": 6 * (X + W + H)}
    # the entry's fusion once, the body's 3 times: each reads and writes h
    assert k["fusion"] == {"count": 4, "bytes": 4 * 2 * H}
    assert k["collective"] == {"count": 3, "bytes": 3 * 2 * H}  # the start, not the done
    assert k["copy"] == {"count": 3, "bytes": 3 * 2 * H}
    assert k["attention"] == {"count": 1, "bytes": 4 * H}  # q, k, v and o
    # the counter's add (3 trips) and the condition's compare (its known trip count, 3), 4-byte scalars
    assert k["other"]["count"] == 6


def test_fusion_and_reducer_bodies_are_not_kernels_of_their_own():
    prog = parse_hlo(HLO)
    assert prog.launching("body") and prog.launching("cond") and prog.launching("main")
    assert not prog.launching("gemm_body") and not prog.launching("scale_body") and not prog.launching("add")


@pytest.mark.parametrize("target, kind", [("__cublas$lt$matmul", "gemm"), ("__cudnn$fmhaScaleBiasSoftmax", "attention"),
                                          ("tpu_custom_call", "other")])
def test_custom_calls_by_target(target, kind):
    """The entry's attention call given another target moves its one kernel from attention to the target's kind
    (the made-up program's counts above: gemm 6, attention 1, other 6)."""
    base = {k: v["count"] for k, v in parse_hlo(HLO).kernels().items()}
    got = {k: v["count"] for k, v in parse_hlo(HLO.replace('"__cudnn$fmhaSoftmax"', f'"{target}"')).kernels().items()}
    want = dict(base)
    want["attention"] -= 1
    want[kind] += 1
    assert got == want and base["attention"] == 1
