"""The transformer stack and sequence parallelism train like one device: context=2, context=4,
context=2×tensor=2 and fsdp=2×context=2×tensor=2 with Ulysses and ring attention, materialized and flash
scores, Megatron sequence parallelism (transformer and FFN stack), the vocab-parallel embedding, logits and
loss (tied and untied), pipeline stages (GPipe, circular, 1F1B), on 8 emulated CPU devices; bad transformer
settings are one-line errors."""

import numpy as np
import pytest

from ffn_model.train import train
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import get_preset
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from tests.helpers import (LR, PIPE_TF, STEPS, TINY_TF, TF_BATCH as B, assert_matches, mesh_of as _mesh,
                           one_device as _one_device)

# TINY_TF (tests.helpers): D=64, 8 query heads of 8, 4 key/value heads, F=256, 2 layers, T=64; B: 4 sequences
TINY_FFN = get_preset("tiny")


@pytest.fixture(scope="module")
def tf_one_device():
    """3 steps of TINY_TF on one device (materialized attention)."""
    return _one_device(TINY_TF, B)


# (mesh, schedule, remat): every mesh of the acceptance with each context strategy; flash scores (the
# key block smaller than the keys: 2 blocks, or 2 per ring chunk of 32); sequence parallelism
# with a context axis; full remat.
CONTEXT = [
    ("context=2", Schedule(context="ulysses"), "none"),
    ("context=2", Schedule(context="ring"), "none"),
    ("context=4", Schedule(context="ulysses"), "full"),
    ("context=4", Schedule(context="ring", attention_block=8), "none"),
    ("context=2,tensor=2", Schedule(context="ulysses", attention="flash", attention_block=32), "none"),
    ("context=2,tensor=2", Schedule(context="ring"), "full"),
    ("fsdp=2,context=2,tensor=2", Schedule(context="ulysses"), "none"),
    ("fsdp=2,context=2,tensor=2", Schedule(context="ring", sequence_parallel=True), "none"),
    ("data=2,context=2,tensor=2", Schedule(context="ulysses", attention="flash", attention_block=32,
                                           sequence_parallel=True), "full"),
]


@pytest.mark.numerics
@pytest.mark.parametrize("spec, schedule, remat", CONTEXT,
                         ids=[f"{s}-{k.context}-{k.attention}{'-sp' if k.sequence_parallel else ''}-{r}"
                              for s, k, r in CONTEXT])
def test_transformer_matches_one_device(tf_one_device, spec, schedule, remat):
    """Losses within 2^-7 relative, parameters within 2·steps·lr (mean 0.05·lr) of one device: the
    tolerance test_ffn_model.test_sharded_training_matches_one_device derives. The one-device run uses
    materialized attention, so flash and ring (online softmax over key blocks, FP32 running sums) are
    held to the same tolerance as a reordering of the reductions."""
    losses, state = train(Workload(TINY_TF, parse_mesh_spec(spec), B, remat=remat, schedule=schedule), _mesh(spec),
                          STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], tf_one_device)
    assert losses[-1] < losses[0]


@pytest.mark.numerics
@pytest.mark.parametrize("remat", ["selective", "minimal", "save_dot_except_mlpwi", "save_qkv_proj"])
def test_named_remat_policies_match_one_device(tf_one_device, remat):
    """Each named policy keeps a different set of residuals (ffn_model.transformer.POLICY_SAVES) and
    recomputes the rest: the same training as remat none, within the tolerance above, on one device (what a
    policy keeps does not depend on the mesh; the check grids compile the policies sharded).
    save_dot_except_mlp compiles to save_dot_except_mlpwi's program (the MLP's output is no residual)."""
    spec = "fsdp=1"
    losses, state = train(Workload(TINY_TF, parse_mesh_spec(spec), B, remat=remat), _mesh(spec), STEPS, lr=LR,
                          return_state=True)
    assert_matches(losses, state["params"], tf_one_device)


@pytest.mark.numerics
def test_zero1_matches_one_device(tf_one_device):
    """ZeRO-1 on data=4, tensor=2: the gradients reduce-scattered over data, AdamW on each data shard's slice
    of the weights with its slice of the moments, the new weights all-gathered: within the tolerance above of
    one device."""
    spec = "data=4,tensor=2"
    w = Workload(TINY_TF, parse_mesh_spec(spec), B, schedule=Schedule(optimizer_sharding="zero1"))
    losses, state = train(w, _mesh(spec), STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], tf_one_device)


# A 512-token vocabulary: tensor=4 holds 128 rows of E (and U) per device
VOCAB = 512
VOCAB_MESHES = [
    ("tensor=4", Schedule(), "none", False),
    ("fsdp=2,tensor=4", Schedule(), "full", True),
]


@pytest.fixture(scope="module")
def vocab_one_device():
    """3 steps of TINY_TF with the vocabulary on one device, untied and tied: {tied: (losses, params)}."""
    return {tied: _one_device(TINY_TF.replace(vocab=VOCAB, tied_embeddings=tied), B) for tied in (False, True)}


@pytest.mark.numerics
@pytest.mark.parametrize("spec, schedule, remat, tied", VOCAB_MESHES,
                         ids=[f"{s}-{r}{'-sp' if k.sequence_parallel else ''}{'-tied' if t else ''}"
                              for s, k, r, t in VOCAB_MESHES])
def test_vocab_parallel_loss_matches_one_device(vocab_one_device, spec, schedule, remat, tied):
    """Token ids in, E looked up in each device's V/Y rows and summed over tensor, logits split over the
    vocabulary, the cross-entropy reduced over the shards without gathering them: the losses and every
    parameter, E and U among them, within the tolerance above of one device; the loss starts near ln V (the
    logits' scale is about 1 at init) and falls."""
    cfg = TINY_TF.replace(vocab=VOCAB, tied_embeddings=tied)
    losses, state = train(Workload(cfg, parse_mesh_spec(spec), B, remat=remat, schedule=schedule), _mesh(spec),
                          STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], vocab_one_device[tied])
    assert abs(losses[0] - np.log(VOCAB)) < 1.0
    assert losses[-1] < losses[0]


BLOCKS = [
    ("data=2,context=2,tensor=2", "swiglu", Schedule(context="ulysses", sequence_parallel=True), "full"),
]


@pytest.mark.numerics
@pytest.mark.parametrize("spec, mlp, schedule, remat", BLOCKS, ids=[f"{s}-{m}-{r}" for s, m, _, r in BLOCKS])
def test_parallel_block_matches_one_device(spec, mlp, schedule, remat):
    """A parallel block (attention and MLP on one norm, their input and output projections fused so each
    pass reduces over tensor once) with a ReLU or SwiGLU MLP: within the tolerance above of one device."""
    cfg = TINY_TF.replace(block="parallel", mlp=mlp)
    losses, state = train(Workload(cfg, parse_mesh_spec(spec), B, remat=remat, schedule=schedule), _mesh(spec),
                          STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], _one_device(cfg, B))


@pytest.mark.numerics
@pytest.mark.parametrize("spec", ["tensor=8", "fsdp=4,tensor=2", "data=2,fsdp=2,tensor=2"])
def test_sequence_parallel_ffn_matches_one_device(spec):
    """The FFN stack with Megatron sequence parallelism (all-gather before W_in, reduce-scatter after
    W_out, tokens split over tensor between blocks) within the same tolerance of one device."""
    ref = _one_device(TINY_FFN, 64)
    w = Workload(TINY_FFN, parse_mesh_spec(spec), 64, schedule=Schedule(sequence_parallel=True))
    losses, state = train(w, _mesh(spec), STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], ref)


# Pipeline stages (8 layers: stage=4 with 2 repeats runs chunks of one layer): GPipe, circular and 1F1B on
# stage=2 and stage=4, with context (Ulysses, ring) and tensor, remat none and full; the 512-token vocabulary
# (tests.helpers.PIPE_TF: TINY_TF with 8 layers and V = 512)
PIPE_MESHES = [
    ("stage=2,context=2,tensor=2", Schedule(2), "none"),
    ("stage=2,context=2,tensor=2", Schedule(2, pipeline="1f1b", context="ring"), "full"),
    ("stage=2,fsdp=2,tensor=2", Schedule(2, repeats=2), "none"),
    ("stage=4,tensor=2", Schedule(4), "full"),
    ("stage=4,tensor=2", Schedule(4, repeats=2), "none"),
    ("stage=4,context=2", Schedule(4, pipeline="1f1b"), "none"),
    # interleaved 1F1B: 2 chunks per stage (stage=4: chunks of one layer), the wrap from the last stage to the first
    ("stage=2,fsdp=2,tensor=2", Schedule(2, repeats=2, pipeline="1f1b"), "full"),
    ("stage=4,context=2", Schedule(4, repeats=2, pipeline="1f1b", context="ring"), "none"),
    # 1F1B with fewer microbatches than stages, not a multiple of them: a steady phase of M = 2 iterations
    ("stage=4,tensor=2", Schedule(2, pipeline="1f1b"), "none"),
    # 1F1B with data parallelism: each data shard's partial gradients accumulated through the loop, reduced once
    ("data=2,stage=2,tensor=2", Schedule(2, pipeline="1f1b"), "full"),
    # and ZeRO-1: the once-reduced gradients reduce-scattered over data, each shard updating its slice
    ("data=2,stage=2,tensor=2", Schedule(2, pipeline="1f1b", optimizer_sharding="zero1"), "none"),
    # 1F1B with warm-up phases: forward-only and backward-only loops around the steady one (interleaved too)
    ("stage=4,tensor=2", Schedule(2, pipeline="1f1b", warmup_phases=True), "none"),
    ("stage=2,fsdp=2,tensor=2", Schedule(2, repeats=2, pipeline="1f1b", warmup_phases=True), "full"),
]


@pytest.fixture(scope="module")
def pipe_one_device():
    """3 steps of PIPE_TF on one device."""
    return _one_device(PIPE_TF, B)


@pytest.mark.numerics
@pytest.mark.parametrize("spec, schedule, remat", PIPE_MESHES,
                         ids=[f"{s}-{k.pipeline}{k.repeats}{'-phases' if k.warmup_phases else ''}-{k.context}-{r}"
                              for s, k, r in PIPE_MESHES])
def test_pipeline_stages_match_one_device(pipe_one_device, spec, schedule, remat):
    """The transformer's layers as a pipeline over stage (ffn_model.pipeline): the embedding before it, the
    output layer and loss on the stage that holds each microbatch (GPipe, circular) or in 1F1B's loop, whose
    gradients are its own (a forward and a backward slot every iteration, not jax's transpose of a scan):
    losses and every parameter within the tolerance above of one device."""
    losses, state = train(Workload(PIPE_TF, parse_mesh_spec(spec), B, remat=remat, schedule=schedule), _mesh(spec),
                          STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], pipe_one_device)
    assert losses[-1] < losses[0]


@pytest.mark.numerics
def test_tied_1f1b_lookup_in_the_loop_matches_one_device():
    """Tied embeddings under 1F1B with fsdp and tensor: stage 0 looks each microbatch up inside the loop and its
    gradient joins the output layer's in E's one accumulator (ffn_model.pipeline.one_f_one_b's lookup): losses
    and every parameter within the tolerance above of one device."""
    cfg, spec = PIPE_TF.replace(tied_embeddings=True), "stage=2,fsdp=2,tensor=2"
    losses, state = train(Workload(cfg, parse_mesh_spec(spec), B, schedule=Schedule(2, pipeline="1f1b")), _mesh(spec),
                          STEPS, lr=LR, return_state=True)
    assert_matches(losses, state["params"], _one_device(cfg, B))


@pytest.mark.parametrize("spec, schedule, remat, match", [
    ("context=8", Schedule(context="ulysses"), "none", "kv_heads=4 is not divisible by context·tensor"),
    ("context=2,tensor=4", Schedule(context="ulysses"), "none", "kv_heads=4 is not divisible by context·tensor"),
    ("tensor=8", Schedule(), "none", "kv_heads=4 is not divisible by tensor = 8"),
    ("context=2", Schedule(attention="flash", attention_block=48), "none", "block"),
    ("fsdp=2", Schedule(), "every-second", "every-second"),
    ("stage=4", Schedule(2, repeats=2, pipeline="1f1b"), "none", "interleaved 1f1b needs microbatches >= stages"),
    ("stage=2", Schedule(3), "none", "microbatches=3 must be a multiple of stage=2"),
])
def test_bad_transformer_settings_raise(spec, schedule, remat, match):
    """Each is refused before anything is built, with a ValueError naming the input."""
    with pytest.raises(ValueError, match=match):
        train(Workload(TINY_TF, parse_mesh_spec(spec), B, remat=remat, schedule=schedule), _mesh(spec), 1)
