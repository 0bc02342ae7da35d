"""The MoE transformer as a model family (scaling.moe.MoEConfig implements scaling.family.ModelFamily): its step
FLOPs, the expert axis' all-to-alls and the memory's parameter terms by hand on moe-tiny, its refusals, the flags
that set its fields, and predict and plan on Mixtral 8x7B. Closed forms only (no jax). Every expected figure is a
hand calculation written out here."""

import dataclasses

import pytest

from scaling.family import is_family
from scaling.hardware import get_chip
from scaling.moe import MOE_PRESETS, MoEConfig
from scaling.plan import plan
from scaling.presets import FAMILIES, PRESETS, model_from_fields, model_of
from scaling.program import predict
from scaling.schedule import Schedule
from scaling.workload import Workload

TINY, MIXTRAL = MOE_PRESETS["moe-tiny"], MOE_PRESETS["mixtral-8x7b"]
MESH = {"fsdp": 2, "expert": 2, "tensor": 2}
MATERIALIZED = Schedule(attention="materialized")  # 8 backward units, no flash: the count below


def tiny(remat="none", cfg=TINY, **kw):
    # moe-tiny: D=64, N=K=4, H=16, L=4 (all MoE), T=32, swiglu (m=3), E=8, k=2, F_e=128, no vocabulary.
    # 8 sequences of 32 = 256 tokens on data 1, fsdp 2, expert 2, tensor 2: t = 256/(1·2·2) = 64 tokens, s = 2.
    return Workload(cfg, MESH, 256, remat=remat, schedule=MATERIALIZED, **kw)


def test_registered_family_and_presets():
    assert MoEConfig in FAMILIES and is_family(TINY)
    assert all(PRESETS[k] is MOE_PRESETS[k] for k in ("mixtral-8x7b", "olmoe-1b-7b", "moe-tiny"))
    assert TINY.plan_axes == ("data", "fsdp", "expert", "tensor")
    assert (TINY.family, TINY.has_attention, TINY.runs_1f1b, TINY.grouped_plan) == ("moe", True, False, False)


def test_step_flops_by_hand():
    # Per layer, forward (Y = 2):
    #   qkv  2·t·D·H·(N+2K)/Y = 2·64·64·16·12/2  =   786,432
    #   out  2·t·N·H·D/Y      = 2·64·4·16·64/2   =   262,144
    #   attention, a unit s·T²·N·H/Y = 2·1024·4·16/2 = 65,536; forward 4 units = 262,144, backward 8 = 524,288
    #   router 2·t·D·E (not split over tensor) = 2·64·64·8 = 65,536
    #   experts 2·m·D·F_e·(t·k)/Y = 2·3·64·128·128/2 = 3,145,728
    # forward  = 4·(786,432 + 262,144 + 262,144 + 65,536 + 3,145,728) = 4·4,521,984 = 18,087,936
    # backward = 4·(2·(786,432 + 262,144 + 65,536 + 3,145,728) + 524,288) = 4·9,043,968 = 36,175,872
    f = tiny().model.step_flops(tiny())
    assert f["forward"] == 18_087_936
    assert f["backward"] == 36_175_872
    assert f["recompute"] == 0
    assert f["total"] == 18_087_936 + 36_175_872
    # model: 3·L·(qkv + out + the causal half of attention 2·65,536 + router + k slots' experts 3,145,728)
    #      = 12·(786,432 + 262,144 + 131,072 + 65,536 + 3,145,728) = 12·4,390,912 = 52,690,944
    assert f["model"] == 52_690_944
    # remat full recomputes q, k, v, out, the attention (4 units), the router and the experts' two input matrices
    # (2/3 of 3,145,728 = 2,097,152): 4·(786,432 + 262,144 + 262,144 + 65,536 + 2,097,152) = 4·3,473,408
    full = tiny("full")
    assert full.model.step_flops(full)["recompute"] == 13_893_632


def test_step_flops_with_capacity_counts_the_padded_slots():
    # cf 1.25: C = ceil(1.25·2·64/8) = 20 slots an expert, E·C = 160 rows a device (not t·k = 128):
    # experts 2·3·64·128·160/2 = 3,932,160 a layer forward, 786,432 more than dropless: 4 layers 3,145,728 more
    cf = dataclasses.replace(TINY, moe=dataclasses.replace(TINY.moe, capacity_factor=1.25))
    w = tiny(cfg=cf)
    assert w.model.step_flops(w)["forward"] == 18_087_936 + 3_145_728


def test_expert_axis_all_to_all_volume():
    # V = c·t·k·D = 2·64·2·64 = 16,384 bytes a device sends in one all-to-all (dispatch or combine); a train step
    # 4 a layer (dispatch, combine, their gradients), 4 layers: 16·16,384 = 262,144
    w = tiny()
    v = w.model.collective_volumes(w)
    assert v["expert"]["all-to-all"] == 262_144
    # the non-expert gradients over expert (a data axis for them): attention 4·64·16·(8+8) = 65,536 and routers
    # 4·64·8 = 2,048 parameters, BF16 over tensor: 2·67,584/2 = 67,584 bytes, on the fsdp shard /2 = 33,792
    assert v["expert"]["all-reduce"] == 33_792
    # fsdp: the gathered layers W = 2·(67,584 + 4·(8/2)·3·64·128)/2 = 67,584 + 393,216 = 460,800, gathered forward and
    # backward (921,600), the gradients reduce-scattered once (460,800); the loss over fsdp and expert, 4 bytes
    assert v["fsdp"] == {"all-gather": 921_600, "reduce-scatter": 460_800}
    assert v["fsdp+expert"] == {"all-reduce": 4.0}
    assert "data" not in v
    # forward only: 2 all-to-alls a layer, 4·2·16,384 = 131,072
    fwd = tiny(step="forward")
    assert fwd.model.collective_volumes(fwd)["expert"] == {"all-to-all": 131_072}


def test_memory_parameter_terms():
    # Parameters a device holds: the 4·8·24,576 = 786,432 expert parameters over expert·fsdp·tensor = 8: 98,304; the
    # attention's 65,536 and the routers' 2,048 over fsdp·tensor = 4: 16,896; 115,200 in all.
    # master FP32 4·115,200 = 460,800; Adam's two FP32 moments 8·115,200 = 921,600; FP32 gradients 460,800
    w = tiny()
    mem = w.model.memory_terms(w)
    assert (mem["master"], mem["optimizer"], mem["grads"]) == (460_800, 921_600, 460_800)
    assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))
    # the inputs: x BF16 and y FP32, (2 + 4)·t·D = 6·64·64 = 24,576
    assert mem["inputs"] == 24_576


@pytest.mark.parametrize("mesh, match", [({"stage": 2, "fsdp": 2}, "stage=2: pipeline stages are not built"),
                                         ({"context": 2, "fsdp": 2}, "context=2: context parallelism is not built"),
                                         ({"expert": 3}, "experts=8 is not divisible by the expert shard count 3")])
def test_refusals_of_the_mesh(mesh, match):
    with pytest.raises(ValueError, match=match):
        Workload(TINY, mesh, 768)


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
    with pytest.raises(ValueError, match="--experts is a MoE transformer dimension"):
        model_of("llama-8b", experts=8)
    built = model_from_fields(d_model=64, heads=4, d_ff=128, blocks=2, seq_len=32, experts=4, top_k=2,
                              expert_d_ff=64, mlp="swiglu")
    assert isinstance(built, MoEConfig) and built.moe.experts == 4 and built.base.d_model == 64


@pytest.mark.parametrize("chip, mesh", [("v5p", {"fsdp": 16, "expert": 4}), ("H100", {"data": 8, "expert": 8})])
def test_mixtral_predicts(chip, mesh):
    # 256 sequences of 4,096 on 64 devices: t = 16,384 tokens a device; the all-to-all V = 2·16,384·2·4096 bytes
    w = Workload(MIXTRAL, mesh, 256 * 4096)
    p = predict(w, get_chip(chip))
    assert p.collectives["expert"]["all-to-all"] == 32 * 4 * 2 * 16_384 * 2 * 4096
    assert p.times.step["sum"] > 0 and p.flops["total"] > p.flops["model"] > 0


@pytest.mark.parametrize("chip, chips", [("v5p", 64), ("H100", 64)])
def test_mixtral_plans(chip, chips):
    ch = get_chip(chip)
    plans = plan(MIXTRAL, ch, chips, MIXTRAL.plan_batch_tokens)
    assert plans
    top = plans[0]
    assert tuple(top.mesh) == ("data", "fsdp", "expert", "tensor")
    assert top.memory_bytes <= top.hbm_budget
