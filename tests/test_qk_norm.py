"""QK-norm (TransformerConfig.qk_norm: an RMSNorm over H on each head's q and k before the attention; Qwen3, OLMoE,
Gemma 3): its passes as the closed form counts them, by hand; the compiled program's matmul FLOPs unchanged (the
norms run after q, k, v are named, so no policy recomputes the projections for them); training on 8 CPU devices
within rounding of one device."""

import pytest

from scaling.core.mesh_shape import parse_mesh_spec
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from scaling.families.presets import get_preset
from tests.helpers import assert_matches, one_device, run_steps

SMALL = get_preset("small-tf").replace(qk_norm=True)  # D 256, 8 heads of 32 (K = N), F 1024, 4 layers, T 256
FLASH = Schedule(attention="flash")


def _qk(remat="none", mesh="fsdp=2,tensor=4", tokens=4096):
    w = Workload(SMALL, parse_mesh_spec(mesh), tokens, remat=remat, schedule=FLASH)
    return {k.pass_: (k.calls, k.bytes) for k in w.model.forms.step_kernels(w) if k.name == "qk_norm"}


@pytest.mark.quick
def test_qk_norm_passes_by_hand():
    """4,096 tokens on fsdp 2 × tensor 4: t = 2,048 a device, N/Y = K/Y = 2 heads of 32 each of q and k; a layer's
    forward reads and writes 2·2·2,048·32·(2 + 2) = 1,048,576 B, the 4 layers 4,194,304 in 8 launches (q's and k's);
    the backward twice in 16; the recomputed forward once more under every policy (the normalized q, k are not
    saved). Without QK-norm none of them."""
    for remat in ("none", "full", "save_qkv_proj"):
        assert _qk(remat) == {"forward": (8, 4_194_304), "backward": (16, 8_388_608), "recompute": (8, 4_194_304)}
    off = Workload(SMALL.replace(qk_norm=False), parse_mesh_spec("fsdp=2,tensor=4"), 4096, schedule=FLASH)
    assert not [k for k in off.model.forms.step_kernels(off) if k.name == "qk_norm"]
    assert "qk-norm" in str(SMALL) and get_preset("qwen3-235b-a22b").base.qk_norm


@pytest.mark.numerics
@pytest.mark.parametrize("pipeline", ["gpipe", "1f1b"])
def test_qk_norm_with_stages_trains_as_one_device(pipeline):
    """The pipeline's loss runs the layers without the model's call (ffn_model.transformer.transformer_pipeline_loss
    sets the QK-norm itself): GPipe and 1F1B (whose backward is traced in its loop) on stage 2 × data 2 × tensor 2
    within rounding of one device; without the norms the losses differ by far more than rounding."""
    cfg = get_preset("tiny-tf").replace(qk_norm=True)
    tokens = 8 * cfg.seq_len
    staged = Schedule(attention="flash", microbatches=2, pipeline=pipeline)
    assert_matches(*run_steps(cfg, "stage=2,data=2,tensor=2", tokens, staged), one_device(cfg, tokens, FLASH))


@pytest.mark.compiles
@pytest.mark.parametrize("remat", ["none", "save_qkv_proj"])
def test_qk_norm_flops_are_the_compilers(remat):
    """The compiled step's matmul FLOPs are the closed form's (which has none for the norms): cpu:8, fsdp 2 ×
    tensor 4, flash."""
    from verify.check import check

    rep = check(Workload(SMALL, parse_mesh_spec("fsdp=2,tensor=4"), 4096, remat=remat, schedule=FLASH), "cpu:8")
    assert rep.flops.matmul.ratio == pytest.approx(1.0, abs=1e-4)


@pytest.mark.numerics
def test_qk_norm_trains_as_one_device():
    """3 AdamW steps on data 2 × tensor 4 within rounding of one device (tests.helpers.assert_matches)."""
    cfg = get_preset("tiny-tf").replace(qk_norm=True)
    tokens = 8 * cfg.seq_len
    want = one_device(cfg, tokens, FLASH)
    assert_matches(*run_steps(cfg, "data=2,tensor=4", tokens, FLASH), want)
