"""The MoE transformer (ffn_model.moe.MoETransformer, the "moe" family's program) trains like one device on the
acceptance's meshes of 8 emulated CPU devices, and its compiled train step holds what scaling.families.moe's closed
forms say: the matmul FLOPs, the all-to-all bytes over expert and every axis' collective bytes on CPU; FLOPs,
collectives and the peak on a v5p topology compiled ahead of time for a Mixtral-shaped stack."""

import dataclasses

import jax
import numpy as np
import pytest

from ffn_model.moe import stage_axes
from ffn_model.pipeline import padded_slots, real_blocks, uneven_stages
from ffn_model.train import train
from mesh import make_mesh, mesh_shape
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.moe import MOE_PRESETS
from scaling.core.flags import DEFAULT_FLAGS
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from tests.helpers import assert_matches, one_device as _one_device, rows

TINY = MOE_PRESETS["moe-tiny"]  # D=64, N=K=4, H=16, L=4 (all MoE), T=32, swiglu, E=8, k=2, F_e=128
B = 8 * TINY.seq_len  # 8 sequences of 32 tokens: one a device on 8
STEPS, LR = 3, 1e-3
MATERIALIZED = Schedule(attention="materialized")


def _moe(**kw):
    return TINY.replace(**kw)


# Every token to all 8 experts (k = E) with cf = E/k = 1: C = ceil(1·8·S/8) = S slots an expert, so no token is dropped
# whatever the groups (one device routes its B tokens as one group, 8 devices as 8), and no top-k choice is made:
# with k = 2 a choice between near-equal scores flips with the order of the sharded reductions (BF16 rounding in the
# attention before the router), moving a token to another expert, a discrete change the rounding tolerance does not
# cover (measured here: parameters' mean difference 0.07-0.11·lr against the 0.05·lr bound, the losses within it).
# The top-2 choice, dropping and the groups are tests/test_moe_model.py's, on the MoE layers alone.
ALL = _moe(top_k=8)
NO_DROP = ALL.replace(capacity_factor=1)


def _run(cfg, spec, remat="none", vocab=None):
    cfg = cfg.replace(vocab=vocab) if vocab else cfg
    mesh = make_mesh(spec, jax.devices()[: parse_mesh_spec(spec).devices])
    losses, state = train(Workload(cfg, mesh_shape(mesh), B, remat=remat, schedule=MATERIALIZED), mesh, STEPS,
                          lr=LR, return_state=True)
    return losses, jax.tree.map(np.asarray, state["params"])


# (model, mesh, remat, vocab): the acceptance's meshes (expert=4 with data or fsdp, expert=2 with tensor), remat none
# and full, the capacity and dropless forms, a vocabulary, shared experts, dense layers among the MoE ones.
CASES = [
    ("capacity", "data=2,expert=4", "none", None),
    ("capacity", "data=2,expert=2,tensor=2", "none", 512),
    ("dropless", "data=2,expert=2,tensor=2", "full", None),
    ("shared", "fsdp=2,expert=2,tensor=2", "none", None),
    ("dense-first", "data=2,expert=4", "none", None),
    # the offloading policy of MaxText's Mixtral recipes (layer input, q, k, v offloaded; XLA:CPU keeps them in its
    # one memory), the MoE MLP recomputed. (Full and save_qkv_proj on fsdp=2,expert=4 matched too and left the suite
    # for its time: remat full is the dropless rows', a named policy's recompute the offloading one's.)
    ("shared", "data=2,expert=2,tensor=2", "input_qkv_offloaded", 512),
    # context parallelism (Ulysses): the tokens routed in groups of each device's T/C
    ("capacity", "data=2,context=2,expert=2", "none", None),
    ("dropless", "fsdp=2,context=2,expert=2", "full", 512),
]
MODELS = {"capacity": NO_DROP, "dropless": ALL, "shared": NO_DROP.replace(shared_experts=1),
          "dense-first": NO_DROP.replace(first_dense=1, moe_every=2, blocks=5)}


@pytest.fixture(scope="module")
def one_device():
    """3 steps of each model on one device (with and without the vocabulary)."""
    return {}


@pytest.mark.numerics
@pytest.mark.parametrize("model, spec, remat, vocab", CASES, ids=[f"{m}-{s}-{r}" + (f"-V{v}" if v else "")
                                                                 for m, s, r, v in CASES])
def test_moe_transformer_matches_one_device(one_device, model, spec, remat, vocab):
    cfg = MODELS[model]
    want = _one_device(cfg.replace(vocab=vocab) if vocab else cfg, B, MATERIALIZED)
    losses, params = _run(cfg, spec, remat, vocab)
    assert_matches(losses, params, want)


def test_layer_plan_orders_dense_and_moe_layers():
    from ffn_model.moe import layer_plan

    # first_dense 1, moe_every 2, 6 layers: dense, then (dense, MoE) twice, then 1 dense left: MoESpec.is_moe's
    # layers 2 and 4 (0-based)
    spec = dataclasses.replace(TINY.moe, first_dense=1, moe_every=2)
    assert [spec.is_moe(i) for i in range(6)] == [False, False, True, False, True, False]
    assert layer_plan(spec, 6) == (1, 2, 2, 1)


# ------------------------------------------------------------------------------------------------ the check


def _check(cfg, spec, devices, batch_tokens, remat="none", **kw):
    from verify.check import check

    return check(Workload(cfg, parse_mesh_spec(spec), batch_tokens, remat=remat, **kw), devices)


# cf 1.25, the acceptance's meshes and remat full: C = ceil(1.25·2·256/8) = 80 slots an expert from each device's 256
# tokens (2,048 on 8 devices)
CHECKS = [(_moe(capacity_factor=1.25), mesh, 2048, remat) for mesh, remat in
          [("data=2,expert=4", "none"), ("fsdp=2,expert=4", "full"), ("data=2,expert=2,tensor=2", "none"),
           ("fsdp=2,expert=2,tensor=2", "full"),
           # the named policies: q, k, v kept (the attention and W_o recomputed: one more tensor all-reduce a layer),
           # and o·W_o too (none more); the MoE MLP recomputed as under full (its all-to-alls again)
           ("fsdp=2,expert=2,tensor=2", "save_qkv_proj"), ("data=2,expert=2,tensor=2", "save_dot_except_mlp"),
           # Ulysses over context: its all-to-alls, the tokens' groups of T/C, the gradients' reductions over
           # context as XLA builds them (scaling.families.moe._gradient_reductions)
           ("data=2,context=2,expert=2", "none"), ("fsdp=2,context=2,expert=2", "full"),
           ("context=2,expert=2,tensor=2", "save_qkv_proj")]]


@pytest.mark.grid
@pytest.mark.parametrize("cfg, mesh, batch, remat", rows(CHECKS, quick=(0,)), ids=[f"{m}-{r}" for _, m, _, r in CHECKS])
def test_check_on_cpu_holds_flops_and_all_to_all(cfg, mesh, batch, remat):
    rep = _check(cfg, mesh, "cpu:8", batch, remat)
    assert rep.flops.matmul.ratio == pytest.approx(1, abs=0.02)
    # the dispatch and combine all-to-alls over expert (and Ulysses' over context: the program's only others) within 2%
    closed = sum(k.get("all-to-all", 0.0) for k in rep.collectives.closed_form_by_kind.values())
    assert rep.collectives.by_kind["all-to-all"] == pytest.approx(closed, rel=0.02)
    for axis, row in rep.collectives.by_axis.items():
        assert row.ratio == pytest.approx(1, abs=0.02), axis
    assert rep.memory.arguments.ratio == pytest.approx(1, abs=0.01)


@pytest.mark.grid
def test_dropless_check_on_cpu_holds_the_all_gather_dispatcher():
    # Dropless over expert the program all-gathers the expert axis' tokens and reduce-scatters the outputs (the
    # closed form's expert all-gather and reduce-scatter terms), and reduces the experts' partial sums over tensor on
    # every pair of those tokens. Its matmul FLOPs are not compared: XLA:CPU lowers jax.lax.ragged_dot to a dense
    # matmul of every row against every local expert (docs/findings.md).
    rep = _check(_moe(), "data=2,expert=2,tensor=2", "cpu:8", 2048, "full")
    for axis, row in rep.collectives.by_axis.items():
        assert row.ratio == pytest.approx(1, abs=0.02), axis
    assert rep.collectives.by_kind["all-gather"] > 0 and "all-to-all" not in rep.collectives.by_kind


MIXTRAL_4 = MOE_PRESETS["mixtral-8x7b"].replace(blocks=4, capacity_factor=1.25)
# DeepSeek-V3's shape at reduced width: MLA (16 heads, r_q 1,536, r_kv 512, qk 128 + 64, v 128), a dense layer first
# (F 4,096), then 32 routed experts of 512, top-8, sigmoid gates and a shared expert; D 1,024, 4 layers, T 2,048,
# V 129,280, cf 1.25
DEEPSEEK_4 = MOE_PRESETS["deepseek-v3"].replace(blocks=4, first_dense=1, d_model=1024, heads=16, d_ff=4096, experts=32,
                                                expert_d_ff=512, seq_len=2048, capacity_factor=1.25)


@pytest.mark.grid
@pytest.mark.tpu
@pytest.mark.parametrize("devices, cfg, mesh, batch, remat, kw", rows([
    # Mixtral 8x7B's layer (D 4,096, 32 heads of 128, 8 kv heads, 8 experts of 14,336, top-2, V 32,000), 4 layers, on
    # a v5p of 8 chips (2x2x2) as fsdp 2, expert 4: 8 sequences of 4,096, cf 1.25, as the commands run it (splash
    # attention, DEFAULT_FLAGS: docs/cli.md's check example, the same program, compiled once a session). The same
    # under MaxText's v6e offloading policy (host bytes 4·83,886,080 B, by hand) and with Ulysses over context 2
    # under remat full held every band too, and left the suite for its time (2-3.5 minutes each on 2 cores): the
    # offloaded tensors are the attention's, held on the transformer (tests/test_memory_runs.py,
    # tests/test_residuals.py), and Ulysses' all-to-alls beside the experts' on cpu:8 (CHECKS above).
    ("tpu:v5p:2x2x2", MIXTRAL_4, "fsdp=2,expert=4", 8 * 4096, "none",
     {"schedule": Schedule(attention="splash"), "flags": DEFAULT_FLAGS})],
    quick=(0,)), ids=["mixtral-4-layers"])
def test_check_on_v5p_holds_flops_all_to_all_and_peak(devices, cfg, mesh, batch, remat, kw):
    rep = _check(cfg, mesh, devices, batch, remat, **kw)
    assert rep.flops.matmul.ratio == pytest.approx(1, abs=0.02)
    assert rep.collectives.by_axis["expert"].ratio == pytest.approx(1, abs=0.02)
    assert rep.memory.peak.ratio == pytest.approx(1, abs=0.10)


@pytest.mark.grid
@pytest.mark.tpu
def test_deepseek_shaped_stages_with_dense_layers_first_on_v5p():
    """DEEPSEEK_4 with two dense layers first and two MoE layers on 1F1B stages (Megatron-Bridge's DeepSeek-V3 runs PP
    16), on stage 2 × data 2 × expert 2 under remat full, aux loss 0: the dense layers outside the pipeline (stage a
    data axis for them), the lookup before the loop; MLA (W_d gathered, its latents kept: ffn_model.transformer's
    mla_projection) with splash attention, as a TPU runs it (the suite's one DeepSeek-shaped compile: the same stack
    without stages on fsdp 2 × expert 4 read every axis 1.0000 and the peak 1.0669, docs/findings.md). FLOPs and every
    axis within 2% (each within 0.1% measured: the head's accumulator summed over data and stage in one, E's gradient
    over data and expert once), the peak within the family's 10% (0.9545 measured) under MaxText's flags, the commands'
    default (libtpu's own: 0.8977, XLA holding 0.36 GB less; docs/findings.md)."""
    from verify.check import check

    cfg = DEEPSEEK_4.replace(first_dense=2, aux_loss_weight=0)
    w = Workload(cfg, parse_mesh_spec("stage=2,data=2,expert=2"), 16 * 2048, remat="full", flags="maxtext",
                 schedule=Schedule(attention="splash", microbatches=4, pipeline="1f1b"))
    rep = check(w, "tpu:v5p:2x2x2")
    assert rep.flops.matmul.ratio == pytest.approx(1, abs=0.02)
    assert {"data+stage", "data+expert", "data+stage+expert"} <= set(rep.collectives.by_axis)
    for axis, row in rep.collectives.by_axis.items():
        assert row.ratio == pytest.approx(1, abs=0.02), axis
    assert rep.memory.peak.ratio == pytest.approx(1, abs=0.10)


@pytest.mark.tpu
def test_dropless_on_a_tpu_is_refused_with_a_tensor_axis():
    # megablox's grouped matmul runs under a shard_map manual over every axis, its weights whole over tensor: a
    # ValueError raised while the step is traced, before XLA compiles anything
    with pytest.raises(ValueError, match="megablox's grouped matmul\\) is built without a tensor axis"):
        _check(TINY, "data=2,expert=2,tensor=2", "tpu:v5p:2x2x2", 2048)


@pytest.mark.grid
@pytest.mark.tpu
def test_dropless_on_v5p_holds_flops_collectives_and_peak():
    """Dropless on a TPU: the routed experts in megablox's grouped matmul (ffn_model.moe._grouped_tpu), the expert
    axis' tokens all-gathered (Megatron's all-gather dispatcher). 4 of Mixtral's layers on fsdp 2 × expert 4: the
    dots the closed form's FLOPs less the grouped matmul's (custom calls: MoEConfig.custom_call_flops), every axis'
    bytes and the peak in their bands (docs/findings.md, "Dropless on TPUs")."""
    rep = _check(MIXTRAL_4.replace(capacity_factor="dropless"), "fsdp=2,expert=4", "tpu:v5p:2x2x2", 8 * 4096)
    assert rep.flops.matmul.ratio == pytest.approx(1, abs=0.02)
    for axis, row in rep.collectives.by_axis.items():
        assert row.ratio == pytest.approx(1, abs=0.02), axis
    assert rep.memory.peak.ratio == pytest.approx(1, abs=0.10)


# ------------------------------------------------------------------------------------------- pipeline stages
# Every layer MoE, no load-balancing loss (the pipeline's chunks carry no loss term: ffn_model.moe.pipeline_loss_fn).
STAGED = ALL.replace(capacity_factor=1, aux_loss_weight=0)
STAGE_CASES = [  # (model, mesh, schedule, remat, vocab)
    (STAGED, "stage=2,data=2,expert=2", Schedule(attention="materialized", microbatches=2), "none", None),
    (STAGED, "stage=2,fsdp=2,expert=2", Schedule(attention="materialized", microbatches=2, pipeline="1f1b"), "full",
     512),
    (STAGED.replace(capacity_factor="dropless"), "stage=2,expert=2,tensor=2",
     Schedule(attention="materialized", microbatches=4, pipeline="1f1b", repeats=2), "none", None),
    # dense layers first (DeepSeek's three), outside the pipeline: two under 1F1B with a vocabulary (one under GPipe
    # matched too, and left the suite for its time; STAGE_CHECKS below still compiles it on cpu:8)
    (STAGED.replace(first_dense=2, blocks=6), "stage=2,fsdp=2,expert=2", Schedule(
        attention="materialized", microbatches=2, pipeline="1f1b"), "full", 512),
    # uneven stages, 3 layers over 2 stages (2 + 1, a padding slot in stage 1's stacks), with QK-norm (Qwen3's)
    (STAGED.replace(blocks=3, qk_norm=True), "stage=2,fsdp=2,expert=2",
     Schedule(attention="materialized", microbatches=2, pipeline="1f1b"), "none", None)]


@pytest.mark.numerics
@pytest.mark.parametrize("cfg, spec, schedule, remat, vocab", STAGE_CASES,
                         ids=["gpipe-data-expert", "1f1b-fsdp-expert-full-V512", "interleaved-dropless-tensor",
                              "1f1b-dense-first-full-V512", "1f1b-uneven-2-1-qk-norm"])
def test_moe_stages_match_one_device(cfg, spec, schedule, remat, vocab):
    """The MoE transformer's layers as a pipeline (the transformer's GPipe and 1F1B loops with MoE chunks) train as
    one device does: 3 AdamW steps within rounding (tests/helpers.assert_matches); uneven stages' padded stacks
    mapped back to their layers (real_blocks), their padding slots still exactly zero."""
    cfg = cfg.replace(vocab=vocab) if vocab else cfg
    want = _one_device(cfg, B, MATERIALIZED)
    mesh = make_mesh(spec, jax.devices()[: parse_mesh_spec(spec).devices])
    w = Workload(cfg, mesh_shape(mesh), B, remat=remat, schedule=schedule)
    losses, state = train(w, mesh, STEPS, lr=LR, return_state=True)
    params = jax.tree.map(np.asarray, state["params"])
    if counts := uneven_stages(w):
        slots = len(counts) * max(counts)
        pad = sorted(set(range(slots)) - set(padded_slots(counts).tolist()))
        stacked = {n for n, p in params.items() if p.shape[0] == slots and n in stage_axes(cfg)}
        assert stacked and pad and all(np.all(params[n][pad] == 0) for n in stacked)
        params = {n: real_blocks(p, counts) if n in stacked else p for n, p in params.items()}
    # the dense layers first run outside the pipeline: their attention stacks "outer_" + name, before the MoE layers'
    outer = [n for n in params if n.startswith("outer_")]
    assert bool(outer) == bool(cfg.moe.first_dense)
    params |= {n[len("outer_"):]: np.concatenate([params.pop(n), params[n[len("outer_"):]]]) for n in outer}
    assert_matches(losses, params, want)


def _staged_check(cfg, spec, devices, batch_tokens, remat, **schedule):
    from verify.check import check

    return check(Workload(cfg, parse_mesh_spec(spec), batch_tokens, remat=remat, schedule=Schedule(**schedule)),
                 devices)


# moe-tiny at cf 1.25, 2,048 tokens in 4 microbatches over 2 stages: GPipe, circular, 1F1B (interleaved, with warm-up
# phases), remat none, full and a named policy, a vocabulary (the 1F1B loop's lookup and output layer), dropless
STAGE_CHECKS = [(_moe(**{"capacity_factor": 1.25, "aux_loss_weight": 0, **model}), mesh, remat, schedule)
                for model, mesh, remat, schedule in [
    ({}, "stage=2,data=2,expert=2", "none", {}),
    ({}, "stage=2,fsdp=2,expert=2", "full", {"pipeline": "1f1b"}),
    ({"vocab": 512}, "stage=2,data=2,expert=2", "none", {"pipeline": "1f1b"}),
    ({"vocab": 512}, "stage=2,fsdp=2,expert=2", "none", {}),
    ({"shared_experts": 1}, "stage=2,expert=2,tensor=2", "save_qkv_proj", {"pipeline": "1f1b", "repeats": 2}),
    ({}, "stage=2,data=2,expert=2", "none", {"repeats": 2}),
    ({"vocab": 512}, "stage=2,data=2,expert=2", "full", {"pipeline": "1f1b", "microbatches": 8,
                                                         "warmup_phases": True}),
    ({"capacity_factor": "dropless"}, "stage=2,data=2,expert=2", "full", {}),
    # uneven stages and chunks (a padding slot's MoE layer runs, its output dropped): 3 layers as 2 + 1, 5 as
    # chunks 2, 1, 1, 1 (circular R 2) and as 2 + 1 + 1 + 1 on 4 stages
    ({"blocks": 3}, "stage=2,fsdp=2,expert=2", "full", {"pipeline": "1f1b"}),
    ({"blocks": 5}, "stage=2,data=2,expert=2", "none", {"repeats": 2}),
    ({"blocks": 5, "vocab": 512}, "stage=4,expert=2", "full", {"pipeline": "1f1b"}),
    # dense layers first, outside the pipeline (stage a data axis for them; the pipeline's input gathered over it):
    # GPipe; 1F1B with a vocabulary (tied too, and with warm-up phases), its lookup before the loop; interleaved
    # without an expert axis; dropless
    ({"first_dense": 1}, "stage=2,data=2,expert=2", "none", {}),
    ({"first_dense": 2, "blocks": 6, "vocab": 512}, "stage=2,data=2,expert=2", "none", {"pipeline": "1f1b"}),
    ({"first_dense": 2, "blocks": 5, "vocab": 512}, "stage=2,expert=2,tensor=2", "full", {"pipeline": "1f1b"}),
    ({"first_dense": 2, "blocks": 6, "vocab": 512}, "stage=2,data=2,fsdp=2", "none", {"pipeline": "1f1b",
                                                                                    "repeats": 2}),
    ({"first_dense": 2, "blocks": 6, "vocab": 512, "capacity_factor": "dropless"}, "stage=2,data=2,expert=2",
     "full", {}),
    ({"first_dense": 2, "blocks": 6, "vocab": 512, "tied_embeddings": True}, "stage=2,data=2,expert=2", "none",
     {"pipeline": "1f1b"}),
    ({"first_dense": 2, "blocks": 6, "vocab": 512}, "stage=2,data=2,expert=2", "full",
     {"pipeline": "1f1b", "microbatches": 8, "warmup_phases": True})]]


@pytest.mark.grid
@pytest.mark.parametrize("cfg, mesh, remat, schedule", rows(STAGE_CHECKS, quick=(1,)),
                         ids=[f"{m}-{r}-L{c.blocks}" + f"-first{c.moe.first_dense}" * bool(c.moe.first_dense)
                              + f"-V{c.vocab}" * bool(c.vocab) + "-dropless" * c.moe.dropless
                              + "".join(f"-{k}{v}" for k, v in s.items()) for c, m, r, s in STAGE_CHECKS])
def test_stages_check_on_cpu_holds_flops_and_every_axis(cfg, mesh, remat, schedule):
    """FLOPs (but dropless's, not comparable on CPU), the arguments and every axis' bytes within 0.1%: the stage
    axis' permutes, the all-to-alls per layer-pass (bubble iterations included), the gradients' reductions (1F1B: the
    non-expert ones over expert every weight pass, over data once after the loop)."""
    rep = _staged_check(cfg, mesh, "cpu:8", 2048, remat, **{"microbatches": 4, **schedule})
    if rep.flops.matmul.ratio is not None:
        assert rep.flops.matmul.ratio == pytest.approx(1, abs=1e-3)
    assert rep.memory.arguments.ratio == pytest.approx(1, abs=1e-3)
    for axis, row in rep.collectives.by_axis.items():
        assert row.ratio == pytest.approx(1, abs=1e-3), axis


@pytest.mark.grid
@pytest.mark.tpu
def test_1f1b_stages_on_v5p_hold_flops_every_axis_and_peak():
    """Mixtral's layer, 4 layers at T 2,048, on a v5p of 8 chips as stage 2 × fsdp 2 × expert 2, 1F1B over 4
    microbatches, remat none: FLOPs and every axis within 2%, the peak within the family's 10% (0.9198: the chunk's
    FP32 gradients held sharded over fsdp, as the loop's accumulators). Remat full on MoE stages is the DeepSeek-shaped
    test's (above); this mesh under full read 0.9755 (docs/findings.md)."""
    cfg = MIXTRAL_4.replace(seq_len=2048, aux_loss_weight=0)
    rep = _staged_check(cfg, "stage=2,fsdp=2,expert=2", "tpu:v5p:2x2x2", 16 * 2048, "none", microbatches=4,
                        pipeline="1f1b")
    assert rep.flops.matmul.ratio == pytest.approx(1, abs=0.02)
    for axis, row in rep.collectives.by_axis.items():
        assert row.ratio == pytest.approx(1, abs=0.02), axis
    assert rep.memory.peak.ratio == pytest.approx(1, abs=0.10)
