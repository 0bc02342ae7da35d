"""Multi-head latent attention (MLA: DeepSeek-V2, DeepSeek-AI 2024, section 2.1; TransformerConfig.kv_lora_rank): its
parameters, FLOPs and collectives by hand, the DeepSeek presets' counts against the published ones, the compiled
program's FLOPs and collectives on 8 CPU devices, and training on 8 CPU devices within rounding of one device."""

import pytest

from scaling.core.mesh_shape import parse_mesh_spec
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from scaling.families.presets import get_preset
from scaling.families.transformer import TransformerConfig
from tests.helpers import assert_matches, one_device, run_steps

# D 64, 8 heads, q/k nope 16 + rope 8 (qk 24), v 16, r_q 48, r_kv 32, F 256 gelu, 2 layers, T 64
TINY = TransformerConfig(d_model=64, heads=8, head_dim=16, d_ff=256, blocks=2, seq_len=64, kv_lora_rank=32,
                         q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=16)
MESH = "data=2,fsdp=2,tensor=2"
MATERIALIZED = Schedule(attention="materialized")


@pytest.mark.quick
def test_mla_parameters_by_hand():
    """W_d 64·(48 + 32 + 8) = 5,632; W_uq 48·8·24 = 9,216; W_ukv 32·8·(16 + 16) = 8,192; W_o 8·16·64 = 8,192: 31,232
    a layer; q, k, v 8·(24 + 24 + 16) = 512 a token, o 128, the latents 88. DeepSeek-V3's layer (7,168 wide, 128
    heads, r_q 1,536, r_kv 512, 128 + 64, v 128): 7,168·2,112 + 1,536·128·192 + 512·128·256 + 128·128·7,168 =
    15,138,816 + 37,748,736 + 16,777,216 + 117,440,512 = 187,105,280."""
    assert TINY.attention_params_per_block == 31_232
    assert (TINY.qkv_width, TINY.o_width, TINY.latent_width) == (512, 128, 88)
    assert get_preset("deepseek-v3").base.attention_params_per_block == 187_105_280


@pytest.mark.quick
def test_deepseek_presets_count_the_published_parameters():
    """DeepSeek-V3 (arXiv:2412.19437: 671B total, 37B activated) and V2-Lite (arXiv:2405.04434: 15.7B, 2.4B), by hand:
    V3  61·187,105,280 (attention) + 3·3·7,168·18,432 (dense) + 58·(7,168·256 (router) + 257·3·7,168·2,048)
        + 2·129,280·7,168 = 11,413,422,080 + 1,189,085,184 + 654,569,766,912 + 1,853,358,080 = 671,025,397,760
        active 11,413,422,080 + 1,189,085,184 + 58·(1,835,008 + 9·44,040,192) + 1,853,358,080 = 37,551,276,032
    Lite 27·13,762,560 + 3·2,048·10,944 + 26·(2,048·64 + 66·3·2,048·1,408) + 2·102,400·2,048 = 15,706,357,760
        active 371,589,120 + 67,239,936 + 26·(131,072 + 8·8,650,752) + 419,430,400 = 2,661,023,744.
    DeepSeek's activated counts leave the input embedding out (the lookup runs no matmul; the output matrix in):
    V3 37,551,276,032 − 926,679,040 = 36,624,596,992 (37B to the two figures published, 1.0% under it); Lite
    2,661,023,744 − 209,715,200 = 2,451,308,544 (2.4B truncated, as the paper prints it; 2.1% over)."""
    v3, lite = get_preset("deepseek-v3"), get_preset("deepseek-v2-lite")
    assert (v3.params, v3.active_params) == (671_025_397_760, 37_551_276_032)
    assert (lite.params, lite.active_params) == (15_706_357_760, 2_661_023_744)
    assert abs(v3.params / 671e9 - 1) < 0.005 and abs(lite.params / 15.7e9 - 1) < 0.005
    assert round((v3.active_params - v3.vocab * v3.d_model) / 1e9) == 37
    assert int((lite.active_params - lite.vocab * lite.d_model) / 1e8) == 24


@pytest.mark.quick
def test_mla_flops_by_hand():
    """1,024 tokens on data 2 × fsdp 2 × tensor 2, materialized attention: t = 256 a device, s = 4 sequences, 4 heads
    (N/Y). A layer forward: W_d 2·256·64·88 = 2,883,584 (whole over tensor); W_uq 2·256·48·96 = 2,359,296; W_ukv
    2·256·32·128 = 2,097,152; q·kᵀ 4·2·64²·4·24 = 3,145,728 and p·v 4·2·64²·4·16 = 2,097,152; W_o 2·256·64·64 =
    2,097,152; the MLP 2·2·256·64·128 = 8,388,608: 23,068,672. Backward: each matmul twice but W_d's gradient, made
    on its tensor split (2,883,584 + 1,441,792), and the attention's dp, dv (v) and dq, dk (qk): 44,695,552. Two
    layers: 135,528,448 (the compiled program's count: test_mla_checks_are_the_compilers)."""
    w = Workload(TINY, parse_mesh_spec(MESH), 1024, schedule=MATERIALIZED)
    f = w.model.forms.step_flops(w)
    assert f["forward"] == 2 * 23_068_672
    assert f["total"] == 135_528_448


@pytest.mark.quick
def test_mla_tensor_collectives_by_hand():
    """BF16 over tensor, the same workload, t = 256: forward the attention's and the MLP's all-reduces, 2·256·64 =
    32,768 each; backward the MLP input gradient's (32,768) and the latents' gradient, 2·256·88 = 45,056, in place of
    the attention input gradient's; W_d, stored split over tensor, gathered whole for the forward and the backward,
    2·88·64 = 11,264 each. Two layers: all-reduce 2·(65,536 + 77,824) = 286,720, all-gather 2·22,528 = 45,056."""
    w = Workload(TINY, parse_mesh_spec(MESH), 1024, schedule=MATERIALIZED)
    assert w.model.forms.collective_volumes(w)["tensor"] == {"all-reduce": 286_720, "all-gather": 45_056}


@pytest.mark.quick
@pytest.mark.parametrize("mesh", [MESH, "fsdp=8"])
@pytest.mark.parametrize("remat", ["none", "full"])
@pytest.mark.parametrize("schedule", [MATERIALIZED, Schedule(attention="flash"), Schedule(attention="flash",
                                                                                          attention_block=32)])
def test_mla_kernels_fold_to_the_step_s_flops(mesh, remat, schedule):
    """The step's kernels (their matmul and attention FLOPs) are the FLOPs step_flops counts (tests/
    test_kernel_fold.py's rule): W_d's gradient on its tensor split, and the attention's qk and v matmuls apart (a
    flash backward recomputes s; one key block shares it with the recomputed forward)."""
    from tests.test_kernel_fold import _fold

    w = Workload(TINY, parse_mesh_spec(mesh), 1024, remat=remat, schedule=schedule)
    assert _fold(w) == pytest.approx(float(w.model.forms.step_flops(w)["total"]), rel=1e-12)


@pytest.mark.quick
def test_mla_refuses_what_it_is_not_built_for():
    with pytest.raises(ValueError, match="kv_heads=4 must equal heads=8"):
        TINY.replace(kv_heads=4)
    with pytest.raises(ValueError, match="q_lora_rank is multi-head latent attention's"):
        TransformerConfig(d_model=64, heads=8, d_ff=256, blocks=2, seq_len=64, q_lora_rank=16)
    with pytest.raises(ValueError, match="multi-head latent attention .* is built without context=2"):
        Workload(TINY, parse_mesh_spec("context=2,fsdp=4"), 1024, schedule=Schedule(microbatches=2))


@pytest.mark.compiles
@pytest.mark.parametrize("mesh,remat", [(MESH, "none"), ("fsdp=2,tensor=4", "full"), ("fsdp=8", "save_qkv_proj")])
def test_mla_checks_are_the_compilers(mesh, remat):
    """The compiled step's matmul FLOPs, arguments and collective bytes on every axis are the closed form's (cpu:8)."""
    from verify.check import check

    rep = check(Workload(TINY, parse_mesh_spec(mesh), 1024, remat=remat, schedule=MATERIALIZED), "cpu:8")
    assert rep.flops.matmul.ratio == pytest.approx(1.0, abs=1e-4)
    assert rep.memory.arguments.ratio == pytest.approx(1.0, abs=1e-4)
    for axis, row in rep.collectives.by_axis.items():
        assert row.ratio == pytest.approx(1.0, abs=1e-4), axis


# MLA in pipeline stages (DeepSeek's runs on Megatron: PP 16): the transformer's GPipe and 1F1B, and the MoE
# transformer's (every layer MoE, 3 layers as 2 + 1), 2,048 tokens in 4 microbatches
STAGED = [(TINY, "stage=2,data=2,tensor=2", "none", "gpipe"), (TINY, "stage=2,fsdp=2,tensor=2", "full", "1f1b"),
          (get_preset("moe-tiny").replace(kv_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, blocks=3,
                                          capacity_factor=1.25, aux_loss_weight=0), "stage=2,expert=2,tensor=2",
           "none", "1f1b")]


@pytest.mark.compiles
@pytest.mark.parametrize("cfg, mesh, remat, pipeline", STAGED, ids=["tf-gpipe", "tf-1f1b-full", "moe-1f1b-uneven"])
def test_mla_with_stages_checks_are_the_compilers(cfg, mesh, remat, pipeline):
    """With stages the same (cpu:8): FLOPs, arguments and every axis' bytes, the stage axis' permutes among them."""
    from verify.check import check

    schedule = Schedule(attention="flash", microbatches=4, pipeline=pipeline)
    rep = check(Workload(cfg, parse_mesh_spec(mesh), 2048, remat=remat, schedule=schedule), "cpu:8")
    assert rep.flops.matmul.ratio == pytest.approx(1.0, abs=1e-4)
    assert rep.memory.arguments.ratio == pytest.approx(1.0, abs=1e-4)
    assert "stage" in rep.collectives.by_axis
    for axis, row in rep.collectives.by_axis.items():
        assert row.ratio == pytest.approx(1.0, abs=1e-4), axis


@pytest.mark.numerics
def test_mla_with_1f1b_stages_trains_as_one_device():
    """MLA (with a q rank) on 1F1B stages, stage 2 × fsdp 2 × tensor 2, within rounding of one device."""
    tokens = 8 * TINY.seq_len
    staged = Schedule(attention="flash", microbatches=2, pipeline="1f1b")
    assert_matches(*run_steps(TINY, "stage=2,fsdp=2,tensor=2", tokens, staged, remat="full"),
                   one_device(TINY, tokens, Schedule(attention="flash")))


@pytest.mark.numerics
def test_mla_trains_as_one_device():
    """3 AdamW steps of MLA (with a q rank, flash attention) on data 2 × fsdp 2 × tensor 2 within rounding of one
    device (tests.helpers.assert_matches)."""
    schedule = Schedule(attention="flash")
    tokens = 8 * TINY.seq_len
    assert_matches(*run_steps(TINY, MESH, tokens, schedule), one_device(TINY, tokens, schedule))


@pytest.mark.numerics
def test_deepseek_shaped_moe_trains_as_one_device():
    """A DeepSeek-shaped MoE stack at reduced width (MLA without a q rank as V2-Lite's, a dense layer first, sigmoid
    gates and a shared expert): 3 AdamW steps on fsdp 2 × expert 2 × tensor 2 within rounding of one device. Every
    token to all 8 experts at capacity 1, as tests/test_moe_transformer.py says why (a top-2 choice between near-equal
    scores flips with the sharded reductions' rounding: 0.1·lr here against the 0.05·lr bound, with and without MLA)."""
    cfg = get_preset("moe-tiny").replace(kv_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, first_dense=1,
                                         shared_experts=1, router="sigmoid", top_k=8, capacity_factor=1.0)
    tokens = 8 * cfg.seq_len
    assert_matches(*run_steps(cfg, "fsdp=2,expert=2,tensor=2", tokens), one_device(cfg, tokens))
