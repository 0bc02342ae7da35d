"""The MoE transformer as a model family (scaling.families.moe.MoEConfig implements scaling.core.family.ModelFamily):
its step FLOPs, the expert axis' all-to-alls and the memory's parameter terms by hand on moe-tiny, its refusals, the
flags that set its fields, and predict and plan on Mixtral 8x7B. Closed forms only (no jax). Every expected figure is a
hand calculation written out here."""

import dataclasses

import pytest

from scaling.core.family import is_family
from scaling.hardware.chips import get_chip
from scaling.families.moe import MOE_PRESETS, MoEConfig
from scaling.planner.plan import plan
from scaling.families.presets import FAMILIES, PRESETS, model_from_fields, model_of
from scaling.step.program import predict
from scaling.core.schedule import Schedule, runs_attention
from scaling.core.workload import Workload

TINY, MIXTRAL = MOE_PRESETS["moe-tiny"], MOE_PRESETS["mixtral-8x7b"]
MESH = {"fsdp": 2, "expert": 2, "tensor": 2}
MATERIALIZED = Schedule(attention="materialized")  # 8 backward units, no flash: the count below


def tiny(remat="none", cfg=TINY, **kw):
    # moe-tiny: D=64, N=K=4, H=16, L=4 (all MoE), T=32, swiglu (m=3), E=8, k=2, F_e=128, no vocabulary.
    # 8 sequences of 32 = 256 tokens on data 1, fsdp 2, expert 2, tensor 2: t = 256/(1·2·2) = 64 tokens, s = 2.
    return Workload(cfg, MESH, 256, remat=remat, schedule=MATERIALIZED, **kw)


def test_registered_family_and_presets():
    assert MoEConfig in FAMILIES and is_family(TINY)
    assert all(PRESETS[k] is MOE_PRESETS[k] for k in ("mixtral-8x7b", "mixtral-8x22b", "olmoe-1b-7b", "moe-tiny"))
    assert TINY.plan.axes == ("data", "stage", "fsdp", "expert", "tensor")
    assert (TINY.family, runs_attention(TINY), TINY.runs_1f1b, TINY.plan.grouped) == ("moe", True, True, False)


def test_step_flops_by_hand():
    # Per layer, forward (Y = 2):
    #   qkv  2·t·D·H·(N+2K)/Y = 2·64·64·16·12/2  =   786,432
    #   out  2·t·N·H·D/Y      = 2·64·4·16·64/2   =   262,144
    #   attention, a unit s·T²·N·H/Y = 2·1024·4·16/2 = 65,536; forward 4 units = 262,144, backward 8 = 524,288
    #   router 2·t·D·E (not split over tensor) = 2·64·64·8 = 65,536
    #   experts 2·m·D·F_e·(t·k)/Y = 2·3·64·128·128/2 = 3,145,728
    # forward  = 4·(786,432 + 262,144 + 262,144 + 65,536 + 3,145,728) = 4·4,521,984 = 18,087,936
    # backward = 4·(2·(786,432 + 262,144 + 65,536 + 3,145,728) + 524,288) = 4·9,043,968 = 36,175,872
    f = tiny().model.forms.step_flops(tiny())
    assert f["forward"] == 18_087_936
    assert f["backward"] == 36_175_872
    assert f["recompute"] == 0
    assert f["total"] == 18_087_936 + 36_175_872
    # model: 3·L·(qkv + out + the causal half of attention 2·65,536 + router + k slots' experts 3,145,728)
    #      = 12·(786,432 + 262,144 + 131,072 + 65,536 + 3,145,728) = 12·4,390,912 = 52,690,944
    assert f["model"] == 52_690_944
    # remat full recomputes q, k, v, out, the attention (4 units), the router and all three of the experts' matrices
    # (the combine's gradient takes the experts' output, so it is made again, unlike a dense MLP's W_out; dropless,
    # no dispatch einsum): 4·(786,432 + 262,144 + 262,144 + 65,536 + 3,145,728) = 4·4,521,984
    full = tiny("full")
    assert full.model.forms.step_flops(full)["recompute"] == 18_087_936


def test_step_flops_with_capacity_counts_the_padded_slots():
    # cf 1.25, a group a sequence of T = 32: C = ceil(1.25·2·32/8) = 10 slots an expert, the device's t/T = 2 groups
    # 2·E·C = 160 rows (not t·k = 128): experts 2·3·64·128·160/2 = 3,932,160 a layer forward, 786,432 more than
    # dropless: 4 layers 3,145,728 more; and GShard's dispatch and combine einsums, [T, E·C] against [T, D] a group
    # (whole on each tensor device): 2 einsums · 2 groups · 2·T·D·E·C = 4·2·32·64·80 = 1,310,720 a layer forward, 4
    # layers 5,242,880
    cf = dataclasses.replace(TINY, moe=dataclasses.replace(TINY.moe, capacity_factor=1.25))
    w = tiny(cfg=cf)
    assert w.model.forms.step_flops(w)["forward"] == 18_087_936 + 3_145_728 + 5_242_880


def test_expert_axis_all_to_all_volume():
    # cf 1.25: the device's t/T = 2 groups of E·C = 8·10 slots, V = c·slots·D = 2·160·64 = 20,480 bytes a device sends
    # in one all-to-all (dispatch or combine); a train step 4 a layer (dispatch, combine, their gradients), 4 layers:
    # 16·20,480 = 327,680
    cf = dataclasses.replace(TINY, moe=dataclasses.replace(TINY.moe, capacity_factor=1.25))
    w = tiny(cfg=cf)
    v = w.model.forms.collective_volumes(w)
    assert v["expert"]["all-to-all"] == 327_680
    # the non-expert gradients over expert (a data axis for them): attention 4·64·16·(8+8) = 65,536 parameters, BF16
    # over tensor: 2·65,536/2 = 65,536 bytes, on the fsdp shard /2 = 32,768
    assert v["expert"]["all-reduce"] == 32_768
    # fsdp: the gathered layers W = 2·(65,536 + 4·(8/2)·3·64·128)/2 = 65,536 + 393,216 = 458,752, gathered forward and
    # backward (917,504), the gradients reduce-scattered once (458,752)
    assert v["fsdp"] == {"all-gather": 917_504, "reduce-scatter": 458_752}
    # over the token axes fsdp and expert together: the loss (4 bytes), the routers' FP32 gradients (replicated
    # weights, 4·4·64·8 = 8,192) and the load-balancing loss's statistics f_e and P_e, 2·8 FP32 a layer (4·64 = 256)
    assert v["fsdp+expert"] == {"all-reduce": 4 + 8_192 + 256}
    assert "data" not in v
    # forward only: 2 all-to-alls a layer, 4·2·20,480 = 163,840
    fwd = tiny(step="forward", cfg=cf)
    assert fwd.model.forms.collective_volumes(fwd)["expert"] == {"all-to-all": 163_840}


def test_dropless_all_gather_dispatcher_volume():
    # Dropless, the expert axis' tokens all-gathered and the outputs reduce-scattered (ffn_model.moe.dropless_moe):
    # G = Ex·t·D = 2·64·64 = 8,192 values, g = Ex·t·k = 256 pairs. A train step's layer: all-gather c·G = 16,384 (the
    # tokens, BF16) + 4·G = 32,768 (the output's FP32 gradient) + 4·4·g = 4,096 (gates FP32 and ids int32, forward and
    # again backward) = 53,248; reduce-scatter 4·G (outputs) + 4·G (the tokens' gradient) + 4·g (the gates') = 66,560.
    # 4 layers: 212,992 and 266,240. Forward only: all-gather 16,384 + 2,048, reduce-scatter 32,768 a layer.
    w = tiny()
    v = w.model.forms.collective_volumes(w)["expert"]
    assert (v["all-gather"], v["reduce-scatter"]) == (212_992, 266_240)
    fwd = tiny(step="forward")
    assert fwd.model.forms.collective_volumes(fwd)["expert"] == {"all-gather": 73_728, "reduce-scatter": 131_072}


def test_memory_parameter_terms():
    # Parameters a device holds: the 4·8·24,576 = 786,432 expert parameters over expert·fsdp·tensor = 8: 98,304; the
    # attention's 65,536 over fsdp·tensor = 4: 16,384; the routers' 2,048 whole (replicated); 116,736 in all.
    # master FP32 4·116,736 = 466,944; Adam's two FP32 moments 8·116,736 = 933,888; FP32 gradients 466,944
    w = tiny()
    mem = w.model.forms.memory_per_device(w)
    assert (mem["master"], mem["optimizer"], mem["grads"]) == (466_944, 933_888, 466_944)
    assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))
    # the inputs: x BF16 and y FP32, (2 + 4)·t·D = 6·64·64 = 24,576
    assert mem["inputs"] == 24_576


@pytest.mark.parametrize("cfg, mesh, match", [
    (TINY.replace(first_dense=1, moe_every=2, blocks=5), {"stage": 2, "fsdp": 2},
     "stage=2: pipeline stages are built for an MoE transformer whose every layer after the dense ones first is MoE"),
    (TINY.replace(first_dense=1, blocks=5, vocab=512), {"stage": 2, "fsdp": 2},
     "stage=2 with one dense layer first and a vocabulary is not built"),
    (TINY, {"expert": 3}, "experts=8 is not divisible by the expert shard count 3"),
    (TINY, {"stage": 2, "expert": 2}, "microbatches=1 must be a multiple of stage=2"),  # the base's pipeline rules
    (TINY, {"stage": 2, "context": 2}, "stage=2 with context=2: the MoE transformer's pipeline is built without"),
    (TINY.replace(kv_lora_rank=32, qk_rope_head_dim=8), {"context": 2, "expert": 2},  # MLA: the base's rule
     "multi-head latent attention .kv_lora_rank. is built without context=2")])
def test_refusals_of_the_mesh(cfg, mesh, match):
    with pytest.raises(ValueError, match=match):
        Workload(cfg, mesh, 768)


def test_aux_loss_weight_is_a_flag_and_stages_run_without_it():
    """--aux-loss-weight sets MoESpec.aux_loss_weight (a number >= 0); the pipeline's program refuses a weight above
    0 (its chunks carry no loss term), in one line naming the flag's value."""
    from ffn_model.moe import pipeline_loss_fn

    assert model_of("moe-tiny", aux_loss_weight="0").moe.aux_loss_weight == 0.0
    with pytest.raises(ValueError, match="aux loss weight '-1': a number >= 0"):
        model_of("moe-tiny", aux_loss_weight="-1")
    w = Workload(TINY, {"stage": 2, "expert": 2}, 768, schedule=Schedule(microbatches=2))
    with pytest.raises(ValueError, match="pipeline stages are built without the load-balancing loss: aux_loss_weight "
                                         "0, not 0.01"):
        pipeline_loss_fn(w, None)


def test_context_is_ulysses_and_its_groups_the_chunks():
    """A context axis is Ulysses' (ring refused); the heads split over context·tensor; each device routes the T/C
    tokens of each sequence it holds. 8 sequences of T = 32 over fsdp 2 and context 2: t = 256/4 = 64 tokens a
    device in groups of T/C = 16, 4 groups; C_e = ceil(cf·k·16/E) = ceil(1.25·2·16/8) = 5 slots an expert (10 for
    a whole sequence), E·C_e = 40 rows a group, 160 a device."""
    from scaling.families.moe import all_to_all_bytes, expert_capacity
    cfg = TINY.replace(capacity_factor=1.25)
    mesh = {"fsdp": 2, "context": 2, "expert": 1}
    assert expert_capacity(cfg, mesh) == 5 and expert_capacity(cfg) == 10
    assert all_to_all_bytes(cfg, mesh, 256)["slots"] == 4 * 8 * 5
    with pytest.raises(ValueError, match="context=2 with context_strategy ring: the MoE transformer's context "
                                         "parallelism is Ulysses'"):
        Workload(TINY, {"context": 2, "fsdp": 2}, 256, schedule=Schedule(context="ring"))
    with pytest.raises(ValueError, match=r"heads=4 is not divisible by context·tensor \(Ulysses splits the heads"):
        Workload(TINY, {"context": 4, "tensor": 2}, 256)


def test_refusals_of_the_model_and_the_schedule():
    with pytest.raises(ValueError, match="top-k 9 is more than the 8 experts"):
        TINY.replace(top_k=9)
    with pytest.raises(ValueError, match="remat selective is not built for the MoE transformer"):
        Workload(TINY, MESH, 256, remat="selective")
    with pytest.raises(ValueError, match="sequences .*=3 is not divisible by the data·fsdp·expert shard count 4"):
        Workload(TINY, MESH, 96)  # 3 sequences over fsdp·expert = 4
    with pytest.raises(ValueError, match="divisible by microbatches·data·fsdp·expert = 16"):
        Workload(TINY, MESH, 256, schedule=Schedule(microbatches=4))  # 8 sequences over 4 microbatches·4
    with pytest.raises(ValueError, match="sequence_parallel is not built for the MoE transformer"):
        Workload(TINY, MESH, 256, schedule=Schedule(sequence_parallel=True))


def test_flags_set_its_fields():
    cfg = model_of("moe-tiny", experts=4, top_k=1, expert_d_ff=256, capacity_factor="1.25")
    assert (cfg.moe.experts, cfg.moe.top_k, cfg.moe.expert_d_ff, cfg.moe.capacity_factor) == (4, 1, 256, 1.25)
    assert model_of("mixtral-8x7b", capacity_factor="dropless").moe.dropless
    with pytest.raises(ValueError, match="--experts is an MoE transformer dimension"):
        model_of("llama-8b", experts=8)
    built = model_from_fields(d_model=64, heads=4, d_ff=128, blocks=2, seq_len=32, experts=4, top_k=2,
                              expert_d_ff=64, mlp="swiglu")
    assert isinstance(built, MoEConfig) and built.moe.experts == 4 and built.base.d_model == 64


@pytest.mark.parametrize("chip, mesh", [("v5p", {"fsdp": 16, "expert": 4}), ("H100", {"data": 8, "expert": 8})])
def test_mixtral_predicts(chip, mesh):
    # 256 sequences of 4,096 on 64 devices, cf 1.25: t = 16,384 tokens a device, 4 groups of C = ceil(1.25·2·4096/8)
    # = 1,280 slots an expert; the all-to-all V = 2·(4·8·1,280)·4096 bytes, 4 a layer, 32 layers
    w = Workload(MIXTRAL.replace(capacity_factor=1.25), mesh, 256 * 4096)
    p = predict(w, get_chip(chip))
    assert p.collectives["expert"]["all-to-all"] == 32 * 4 * 2 * 40_960 * 4096
    assert p.times.step["sum"] > 0 and p.flops["total"] > p.flops["model"] > 0


@pytest.mark.parametrize("chip, chips", [("v5p", 64), ("H100", 64)])
def test_mixtral_plans(chip, chips):
    ch = get_chip(chip)
    plans = plan(MIXTRAL, ch, chips, MIXTRAL.plan.batch_tokens)
    assert plans
    top = plans[0]
    assert tuple(top.mesh) == ("data", "stage", "fsdp", "expert", "tensor")
    assert top.memory_bytes <= top.hbm_budget


def test_dropless_on_a_tpu_has_no_note():
    # the dropless layer runs on a TPU (megablox's grouped matmul): plan and predict add no note for any model
    assert MIXTRAL.program_notes(get_chip("v5p")) == [] and MIXTRAL.program_notes(get_chip("H100")) == []
    assert MIXTRAL.replace(capacity_factor=1.25).program_notes(get_chip("v5p")) == []
    assert PRESETS["llama-8b"].program_notes(get_chip("v5p")) == [] and PRESETS["xxl"].program_notes(
        get_chip("v5p")) == []


def test_deepseek_v3_on_16_stages_predicts():
    """Megatron-Bridge's DeepSeek-V3 layout on 1,024 H100s, PP 16 × EP 64 (1F1B, 128 microbatches of one sequence a
    device, 33,554,432 tokens): described, not refused. By hand: the 3 dense layers run outside the pipeline, the
    58 MoE layers split over 16 stages, at most 4 a stage (Megatron's default, the embedding and the loss counted as a
    layer each: 60 items over 16);
    over stage the outer layers' output gathered, c·t·D = 2·(33,554,432/64)·7,168 = 7,516,192,768 B, and its gradient
    reduce-scattered, the same; their gradients all-reduced over stage and expert once, 3 layers of
    A + 3·D·F = 187,105,280 + 3·7,168·18,432 = 583,467,008 parameters at 2 B: 3,500,802,048 B."""
    from scaling.step.pipeline import stage_blocks

    cfg = MOE_PRESETS["deepseek-v3"].replace(aux_loss_weight=0, capacity_factor=1.0)
    w = Workload(cfg, {"stage": 16, "expert": 64}, 33_554_432, remat="full",
                 schedule=Schedule(microbatches=128, pipeline="1f1b"))
    counts = stage_blocks(cfg, w.schedule, 16)
    assert sum(counts) == 58 and max(counts) == 4 and len(counts) == 16
    p = predict(w, get_chip("H100"))
    stage = p.collectives["stage"]
    assert stage["all-gather"] == 7_516_192_768 and stage["reduce-scatter"] == 7_516_192_768
    assert p.collectives["stage+expert"] == {"all-reduce": 3_500_802_048}
    assert p.times.step["sum"] > 0
