"""The layer loop's copies of stacked FP32 parameters and gradients (issue 39, item 2): the compiled train step's loop
bodies hold only the copies the closed form names (scaling.families.ffn / scaling.families.transformer
accumulation_copy_bytes), read by verify.hlo.HloProgram.stack_copies. Compiled ahead of time for one H100 (XLA:GPU
through jax's CUDA plugin; skipped where it is not installed) and for 8 emulated CPU devices. Why the copies were there
and what removed them: docs/findings.md, "The layer loop's copies on XLA:GPU (issue 39)"."""

from __future__ import annotations

import pytest

from mesh.devices import has_cuda_plugin, make_mesh, mesh_shape
from scaling.step import program
from scaling.families.ffn import FFNConfig
from scaling.core.schedule import Schedule
from scaling.families.transformer import TransformerConfig
from scaling.core.workload import Workload

GPU = pytest.param("gpu:H100:1", "data=1", marks=pytest.mark.skipif(
    not has_cuda_plugin(), reason="needs jax's CUDA plugin (the cuda-aot extra; `make answer` installs it)"))
CPU = pytest.param("cpu:8", "data=8")

FFN = FFNConfig(d_model=512, d_ff=1024, blocks=4)
# L = 4 layers, D = 512, N = K = 8 heads of H = 64, F = 1024, swiglu (3 MLP matrices), T = 256
TF = TransformerConfig(d_model=512, heads=8, kv_heads=8, d_ff=1024, blocks=4, seq_len=256, mlp="swiglu")


def _copies(cfg, devices: str, spec: str, batch: int, M: int):
    """(workload, stack copies) of the train step of ``cfg`` compiled for ``devices`` on mesh ``spec``."""
    from ffn_model.compile import abstract_compile
    from verify.hlo import parse_hlo

    mesh = make_mesh(spec, devices)
    w = Workload(cfg, mesh_shape(mesh), batch, schedule=Schedule(microbatches=M))
    return w, parse_hlo(abstract_compile(w, mesh).compiled.as_text()).stack_copies()


# Hand calculations, bytes per step (FP32 gradients, 4 B; every stack whole on each device: data parallelism only):
#   FFN, M = 2: W_in and W_out both [4, 1024, 512]: one copy of one stack a microbatch, 2·4·4·1024·512
#   transformer, M = 2: the MLP's three [4, 1024, 512] stacks two copies, W_q/W_k/W_v/W_o [4, 8, 64, 512] three:
#   2·(2·4·4·1024·512 + 3·4·4·8·64·512) = 2·(16,777,216 + 12,582,912)
@pytest.mark.compiles
@pytest.mark.quick  # the loop-state copies' closed form against XLA:GPU's and XLA:CPU's programs, 1-3 s each
@pytest.mark.parametrize("devices,spec", [GPU, CPU])
@pytest.mark.parametrize("cfg,batch,M,zeros", [(FFN, 2048, 1, 0), (FFN, 2048, 2, 2 * 4 * 4 * 1024 * 512),
                                               (TF, 4096, 1, 0), (TF, 4096, 2, 58_720_256)],
                         ids=["ffn-M1", "ffn-M2", "tf-M1", "tf-M2"])
def test_loop_bodies_copy_only_what_the_closed_form_names(devices, spec, cfg, batch, M, zeros):
    """The transformer: no layer-pass's FP32 weights sliced out of the stacks by a copy (XLA:GPU's dynamic-slice
    memcpy; removed: the layer's jax.checkpoint with prevent_cse=False). The FFN stack keeps the barrier (a TPU
    schedule the closed form holds): on XLA:GPU its W_in and W_out slices, M·2·L·4·D·F B = M·2·4·4·1024·512 (named:
    scaling.families.ffn.block_slice_copy_bytes), none on XLA:CPU. Gradient accumulation's zero-buffer copies exactly
    the bytes of the hand calculation and of the closed form (program.loop_copy_bytes)."""
    from scaling.families import ffn

    w, copies = _copies(cfg, devices, spec, batch, M)
    slices = sum(c.bytes for c in copies if c.kind == "slice")
    if cfg is FFN and devices.startswith("gpu"):
        assert slices == M * 2 * 4 * 4 * 1024 * 512 == ffn.block_slice_copy_bytes(w), copies
    else:
        assert slices == 0, copies
    got = sum(c.bytes for c in copies if c.kind == "zeros")
    assert got == zeros, [c.to_json() for c in copies]
    assert program.loop_copy_bytes(w) == pytest.approx(zeros, rel=1e-12, abs=0)
    if M > 1:  # the count: per microbatch one copy (FFN), 2 + 3 (the transformer's MLP and attention stacks)
        assert len([c for c in copies if c.kind == "zeros"]) == (1 if cfg is FFN else 5)


@pytest.mark.compiles
@pytest.mark.parametrize("devices,spec", [GPU, CPU])
def test_every_second_pairs_copy_what_the_closed_form_names(devices, spec):
    """Under every-second remat the pair scan keeps jax's optimization barrier (ffn_model.model), and XLA:GPU copies
    each pair-pass's FP32 W_in and W_out [1, 2, 1024, 512] out of the stacks: L = 4 (2 pairs, M = 1), by hand
    2 pairs · 2 matrices · 4·2·1024·512 B = 16,777,216 B, scaling.families.ffn.pair_slice_copy_bytes; XLA:CPU copies
    none."""
    from ffn_model.compile import abstract_compile
    from scaling.families import ffn
    from verify.hlo import parse_hlo

    mesh = make_mesh(spec, devices)
    w = Workload(FFN, mesh_shape(mesh), 2048, remat="every-second")
    copies = parse_hlo(abstract_compile(w, mesh).compiled.as_text()).stack_copies()
    want = 2 * 2 * 4 * 2 * 1024 * 512 if devices.startswith("gpu") else 0
    assert sum(c.bytes for c in copies if c.kind == "slice") == want, [c.to_json() for c in copies]
    assert [c for c in copies if c.kind == "zeros"] == []
    if want:
        assert ffn.pair_slice_copy_bytes(w) == want


def test_the_reader_names_the_slices_it_removed():
    """verify.hlo's reader finds an FP32 slice memcpy in a loop body (a fragment in XLA:GPU's spelling, from the
    llama2-7b step before the change: f32[1,11008,4096] out of f32[4,11008,4096], 4 trips) and a copy of a zero
    broadcast of a stack's shape; a bf16 slice (a residual) is not a parameter's."""
    from verify.hlo import parse_hlo

    text = """HloModule m

%fds (p0: f32[4,8,16], p1: s32[]) -> f32[1,8,16] {
  %p0 = f32[4,8,16]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %c = s32[] constant(0)
  %ds = f32[1,8,16]{2,1,0} dynamic-slice(%p0, %p1, %c, %c), dynamic_slice_sizes={1,8,16}
  ROOT %cp = f32[1,8,16]{2,1,0} copy(%ds)
}

%zero (x: f32[]) -> f32[4,8,16] {
  %x = f32[] parameter(0)
  ROOT %b = f32[4,8,16]{2,1,0} broadcast(%x), dimensions={}
}

%body (t: (s32[], f32[4,8,16])) -> (s32[], f32[4,8,16]) {
  %t = (s32[], f32[4,8,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %w = f32[4,8,16]{2,1,0} get-tuple-element(%t), index=1
  %s = f32[1,8,16]{2,1,0} fusion(%w, %i), kind=kCustom, calls=%fds, backend_config={CONFIG}
  %k = f32[] constant(0)
  %z = f32[4,8,16]{2,1,0} fusion(%k), kind=kLoop, calls=%zero
  %zc = f32[4,8,16]{2,1,0} copy(%z)
  ROOT %r = (s32[], f32[4,8,16]{2,1,0}) tuple(%i, %zc)
}

%cond (t: (s32[], f32[4,8,16])) -> pred[] {
  %t = (s32[], f32[4,8,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (w: f32[4,8,16]) -> (s32[], f32[4,8,16]) {
  %w = f32[4,8,16]{2,1,0} parameter(0)
  %i0 = s32[] constant(0)
  %t0 = (s32[], f32[4,8,16]{2,1,0}) tuple(%i0, %w)
  ROOT %loop = (s32[], f32[4,8,16]{2,1,0}) while(%t0), condition=%cond, body=%body, backend_config=TRIPS
}
""".replace("CONFIG", '"fusion_backend_config":{"kind":"__custom_fusion","custom_fusion_config":'
            '{"name":"dynamic_slice_fusion","kernel_index":0}}').replace("TRIPS", '{"known_trip_count":{"n":"4"}}')
    copies = parse_hlo(text).stack_copies()
    assert sorted((c.kind, c.shape, c.bytes) for c in copies) == [
        ("slice", "f32[1,8,16]", 4 * 4 * 8 * 16), ("zeros", "f32[4,8,16]", 4 * 4 * 4 * 8 * 16)]
