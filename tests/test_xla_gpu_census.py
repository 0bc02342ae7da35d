"""The step model's kernels under XLA:GPU (scaling.step.kernels.kernel_census: the package's flash attention's score
blocks, the FP32 weights' casts and slices, the layer's residual saves and layout copies, scaling.step.launches and
scaling.families.transformer.xla_gpu_layer_copies) beside the compiled program's (verify.hlo.HloProgram.kernels),
compiled ahead of time for one H100 (docs/findings.md, "What XLA:GPU runs around the package's program")."""

from __future__ import annotations

import dataclasses

import pytest

from mesh.devices import has_cuda_plugin
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from scaling.families.presets import PRESETS
from verify.check import check

pytestmark = [pytest.mark.compiles,
              pytest.mark.skipif(not has_cuda_plugin(), reason="compiling for a GPU needs jax's CUDA plugin")]


def _ratios(w: Workload) -> dict:
    """{kind: (compiled count / model's, compiled bytes / model's)} of check's two censuses."""
    r = check(w, "gpu:H100:1")
    return {k: (r.kernels[k]["count"] / v["count"], r.kernels[k]["bytes"] / v["bytes"])
            for k, v in r.kernels_described.items() if v["count"]}


def test_ffn_stack_fusions():
    """xxl-2 on 8,192 tokens: the fusions' bytes within 5% (compiled 1.009 of the model's: the AdamW update, the
    casts and slices of the FP32 weights, the relu; measured with jax 0.10.2). The GEMMs' bytes are not held: XLA
    rematerializes two weight-gradient dots (dot.remat) the model does not count."""
    w = Workload(PRESETS["xxl-2"], {"data": 1}, 8192)
    ratios = _ratios(w)
    assert ratios["fusion"][1] == pytest.approx(1.0, abs=0.05)


def test_transformer_with_the_packages_flash():
    """llama2-7b at 8 layers, 16,384 tokens of 2,048, the package's flash (key blocks of 512): the fusions' bytes
    within 12% (compiled 1.10 of the model's; the rest: the backward's layout copies beyond the model's and the
    embedding gradient's dense scatter, not modelled), the GEMMs' launches within 10% (0.93: the flash's dots a key
    block each)."""
    cfg = dataclasses.replace(PRESETS["llama2-7b"], blocks=8, seq_len=2048)
    w = Workload(cfg, {"data": 1}, 16384, schedule=Schedule(attention="flash"))
    ratios = _ratios(w)
    assert ratios["fusion"][1] == pytest.approx(1.0, abs=0.12)
    assert ratios["gemm"][0] == pytest.approx(1.0, abs=0.10)


def test_transformer_with_materialized_attention():
    """The same at M = 2 with the materialized attention (its FP32 scores: launches.xla_gpu_materialized): the
    GEMMs' bytes within 5% (compiled 1.016 of the model's), the fusions' within 10% (1.075)."""
    cfg = dataclasses.replace(PRESETS["llama2-7b"], blocks=8, seq_len=2048)
    w = Workload(cfg, {"data": 1}, 16384, schedule=Schedule(attention="materialized", microbatches=2))
    ratios = _ratios(w)
    assert ratios["gemm"][1] == pytest.approx(1.0, abs=0.05)
    assert ratios["fusion"][1] == pytest.approx(1.0, abs=0.10)
