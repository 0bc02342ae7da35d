"""The grids of configurations ``jax-scaling check`` compares, closed form beside compiled: data only, no logic.

Rows are (cfg, mesh spec, batch tokens, remat, step[, schedule]) on 8 emulated CPU devices, or the same with the
devices first ("tpu:v5p:2x2x2", "cpu:8", ...); verify.check.grid_workload makes a row the Workload it is, and
tests/test_check.py and the other tests of the closed forms, the notebooks and verify.check.flag_grid compile them.
``GRIDS`` names every list of rows (flag_grid's lookup by name). This module imports the configurations and the
schedule only, never verify.check.
"""

from __future__ import annotations

from scaling.core.schedule import Schedule
from scaling.families.presets import get_preset
from scaling.families.transformer import TransformerConfig


# The acceptance grid of ``scaling check`` (tests/test_check.py asserts the bands on it;
# notebooks/closed_form_vs_compiled.ipynb tabulates and plots it). Rows: (cfg, mesh, batch tokens,
# remat, step) on 8 emulated CPU devices, and (devices, cfg, mesh, batch, remat, step) on TPU v5p.
_SMALL = get_preset("small")   # D=256, F=1024, L=4
_TINY = get_preset("tiny")     # D=64, F=256, L=3 (odd)
# Arrays large enough that HBM dominates the TPU peak: XLA:TPU's peak_memory_in_bytes also counts
# on-chip VMEM, which its memory-space assignment fills with whole weight stacks of tiny programs
# (small preset, data=4, 2x2x1: 33.84 MiB HBM + 28.00 MiB VMEM), and the closed form models HBM.
_MEDIUM = _SMALL.replace(d_model=4096, d_ff=16384, blocks=4)
_XXL = get_preset("xxl")
# every data x fsdp x tensor factorisation of 8 (10 of them), then odd L, two batch sizes, remat
# none / every-second / full, train and forward.
_FACTORS = [(8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 4, 1), (4, 2, 1), (2, 1, 4), (4, 1, 2), (1, 2, 4), (1, 4, 2),
            (2, 2, 2)]
CPU_GRID = [(_SMALL, f"data={d},fsdp={f},tensor={t}", 4096, "none", "train") for d, f, t in _FACTORS] + [
    (_TINY, "data=2,fsdp=2,tensor=2", 1024, "none", "train"),
    (_TINY, "data=2,fsdp=2,tensor=2", 4096, "every-second", "train"),  # one pair + the odd last block
    (_TINY, "fsdp=4,tensor=2", 2048, "every-second", "train"),
    (_SMALL, "fsdp=4,tensor=2", 4096, "none", "forward"),
    (_TINY, "data=2,fsdp=2,tensor=2", 1024, "none", "forward"),
    (_SMALL, "fsdp=8", 8192, "every-second", "train"),
    (_SMALL, "fsdp=2,tensor=4", 2048, "full", "train"),
]
TPU_GRID = [
    ("tpu:v5p:2x2x1", _MEDIUM, "data=4", 4096, "none", "train"),
    ("tpu:v5p:2x2x1", _MEDIUM, "data=2,fsdp=2", 4096, "every-second", "train"),
    ("tpu:v5p:2x2x1", _MEDIUM.replace(blocks=5), "fsdp=2,tensor=2", 8192, "full", "train"),
    ("tpu:v5p:2x2x1", _MEDIUM, "fsdp=4", 4096, "none", "forward"),
    ("tpu:v5p:2x2x2", _MEDIUM, "data=2,fsdp=2,tensor=2", 8192, "none", "train"),
    ("tpu:v5p:2x2x2", _MEDIUM.replace(blocks=3), "fsdp=8", 8192, "every-second", "train"),
    ("tpu:v5p:2x2x2", _MEDIUM, "fsdp=4,tensor=2", 8192, "none", "forward"),
    ("tpu:v5p:2x2x2", _MEDIUM.replace(d_model=2048, d_ff=8192), "data=8", 4096, "full", "train"),
    ("tpu:v5p:4x4x4", _MEDIUM, "data=4,fsdp=4,tensor=4", 8192, "every-second", "train"),
    ("tpu:v5p:4x4x4", _XXL, "fsdp=16,tensor=4", 25600, "every-second", "train"),
    ("tpu:v5p:4x4x4", _XXL, "fsdp=16,tensor=4", 25600, "full", "train"),
    ("tpu:v5p:4x4x4", _XXL, "fsdp=16,tensor=4", 25600, "none", "forward"),
]
# Mid-sized models (1024- to 3072-wide) on v5p: the collective bytes hold to the same band (the
# all-reduce-scatter padding XLA:TPU applied to W_in's gradient when it was stored [D, F] is gone with
# W_in stored [F, D]: ffn_model.model.FFNStack). Their peak is not held to the ±10% band: at a few
# hundred MB the compiler's working set and buffer reuse move it by 0.93 to 1.15 (docs/findings.md, residuals).
_MID = _SMALL.replace(d_model=2048, d_ff=8192, blocks=4)
TPU_MID_GRID = [
    ("tpu:v5p:2x2x2", _MID.replace(blocks=3), "fsdp=4,tensor=2", 8192, "none", "train"),
    ("tpu:v5p:2x2x1", _MID, "fsdp=2,tensor=2", 8192, "every-second", "train"),
    ("tpu:v5p:2x2x2", _MID.replace(d_model=1024, d_ff=4096), "fsdp=8", 8192, "none", "train"),
    ("tpu:v5p:2x2x2", _MID, "data=2,fsdp=2,tensor=2", 8192, "full", "train"),
    ("tpu:v5p:2x2x1", _MID.replace(d_model=3072, d_ff=12288, blocks=2), "fsdp=4", 8192, "none", "forward"),
    ("tpu:v5p:2x2x2", _MID.replace(d_model=1024, blocks=3), "fsdp=2,tensor=4", 4096, "none", "train"),
    ("tpu:v5p:2x2x4", _MID.replace(d_ff=6144, blocks=3), "fsdp=4,tensor=4", 8192, "none", "train"),
]
# Every other generation libtpu compiles for: 2D tori (v5e, v6e), v4 (one device per chip: megacore)
# and TPU7x (two devices per chip). What their compilers do differently, and the closed forms model:
# v5e clones an overlapped all-gather into several fusions (verify.hlo counts it once); v5e, v6e and v4
# run large gradient reduce-scatters as windowed einsums or unrolled rings of collective-permutes;
# TPU7x runs collectives on its SparseCores and reduces the weight gradients with one all-reduce over
# data·fsdp (program.collective_volumes, merged_grad_allreduce). The peak is held to its band where the
# closed-form peak is at least PEAK_BANDED_ABOVE: below it, XLA's working set and buffer reuse (not
# modelled) move small programs by up to ±20% (0.9–1.2 measured on these chips).
_BIG = _SMALL.replace(d_model=4096, d_ff=16384, blocks=4)
PEAK_BANDED_ABOVE = 4 * 2**30
TPU_CHIP_GRID = [
    ("tpu:v6e:4x4", _BIG, "fsdp=8,tensor=2", 16384, "none", "train"),
    ("tpu:v6e:4x4", _BIG, "data=16", 16384, "full", "train"),
    ("tpu:v5e:4x4", _MID, "data=2,fsdp=4,tensor=2", 16384, "full", "train"),
    ("tpu:v5e:2x2", _BIG, "data=4", 8192, "none", "train"),
    ("tpu:v5e:2x2", _BIG, "fsdp=4", 8192, "none", "forward"),
    ("tpu:v4:2x2x2", _BIG, "fsdp=4,tensor=2", 8192, "none", "train"),
    ("tpu:v4:2x2x2", _BIG, "data=8", 16384, "every-second", "train"),
    ("tpu:TPU7x:2x2x1", _BIG, "data=8", 16384, "none", "train"),
    # (TPU7x's fsdp=4,tensor=2 and data=2,fsdp=4,tensor=2 under every-second held every band too, and left the suite
    # for their time: TPU7x compiles the same FFN stack 3-8 times slower than v5p, 70 and 116 s on 2 cores; the
    # TPU7x check example of docs/cli.md, data=2,fsdp=4,tensor=2, still runs in tests/test_doc_examples.py)
]
# The full XXL train step of the question (tests/test_check.py::test_tpu_xxl_train_step).
XXL_TRAIN = ("tpu:v5p:4x4x4", _XXL, "fsdp=16,tensor=4", 25600, "none", "train")
# Microbatches: pipeline stages (GPipe, circular, weights gathered per microbatch or once per step) and
# gradient accumulation, each row ending with its Schedule. On 8 emulated CPU devices: stage=2, 4 and 8,
# with and without fsdp/tensor/data, remat none/every-second/full, train and forward.
_SMALL8 = _SMALL.replace(blocks=8)
CPU_STAGE_GRID = [
    (_SMALL, "stage=2,fsdp=4", 4096, "none", "train", Schedule(2)),
    (_SMALL, "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4)),
    (_SMALL, "stage=4,tensor=2", 4096, "full", "train", Schedule(4)),
    (_SMALL8, "stage=8", 4096, "none", "train", Schedule(8)),
    (_SMALL8, "stage=4,fsdp=2", 4096, "none", "train", Schedule(4, repeats=2)),
    (_SMALL, "stage=2,fsdp=2,tensor=2", 4096, "every-second", "train", Schedule(2, repeats=2)),
    (_SMALL.replace(blocks=6), "stage=2,tensor=4", 2048, "none", "train", Schedule(4, repeats=3)),
    (_SMALL, "stage=2,fsdp=4", 4096, "none", "train", Schedule(4, fsdp_gather="step")),
    (_SMALL, "data=2,stage=2,tensor=2", 4096, "none", "forward", Schedule(4)),
    (_SMALL, "fsdp=4,tensor=2", 4096, "none", "train", Schedule(4)),
    (_SMALL, "data=2,fsdp=4", 4096, "full", "train", Schedule(2)),
]
# The transformer's pipelines (scaling.families.transformer: passes, stage_volumes): GPipe with the output layer on the
# stages' shares of the microbatches, circular, 1F1B (a chunk of one layer), the forward step (GPipe); ring and
# Ulysses, tied and untied vocabularies
_TF_V = get_preset("small-tf").replace(vocab=1024)
CPU_TF_STAGE_GRID = [
    (_TF_V, "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4)),
    (_TF_V.replace(tied_embeddings=True), "stage=2,context=2,tensor=2", 4096, "full", "train",
     Schedule(2, pipeline="1f1b", context="ring")),
    (_TF_V, "stage=4,tensor=2", 4096, "minimal", "train", Schedule(4, pipeline="1f1b")),
    (_TF_V, "data=2,stage=2,context=2", 4096, "none", "train", Schedule(2, repeats=2)),
    (_TF_V, "stage=2,fsdp=2,tensor=2", 4096, "none", "forward", Schedule(4, pipeline="1f1b")),
    # interleaved 1F1B: chunks of one layer (the gathers XLA drops with the second forward's dead matrices)
    (_TF_V, "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4, repeats=2, pipeline="1f1b")),
    # 1F1B with data parallelism: the data shards' gradients reduced once, after the loop
    (_TF_V, "data=2,stage=2,tensor=2", 4096, "full", "train", Schedule(2, pipeline="1f1b")),
    # 1F1B with warm-up phases (S = 2: one-iteration phases, whose dead permute XLA drops) and ZeRO-1
    (_TF_V, "data=2,stage=2,tensor=2", 4096, "none", "train",
     Schedule(2, pipeline="1f1b", warmup_phases=True, optimizer_sharding="zero1")),
]
# On TPU v5p, ahead of time; the full XXL with 2 stages (126 blocks: 63 per stage) on v5p:4x4x4, and the
# XXL at 1M tokens on 128 chips with gradient accumulation (the plan scaling.planner.plan ranks first there
# without remat: nothing fits in one pass).
_LARGE = _SMALL.replace(d_model=8192, d_ff=32768, blocks=8)
TPU_STAGE_GRID = [
    ("tpu:v5p:2x2x2", _MEDIUM, "stage=2,fsdp=2,tensor=2", 8192, "none", "train", Schedule(4)),
    # circular, on 8 blocks of 4096 x 16384 (3.9 and 4.2 GB peaks; 8192-wide blocks compiled 2.5x slower)
    ("tpu:v5p:2x2x2", _MEDIUM.replace(blocks=8), "stage=4,fsdp=2", 8192, "none", "train", Schedule(4, repeats=2)),
    ("tpu:v5p:2x2x1", _MEDIUM, "stage=2,fsdp=2", 8192, "full", "train", Schedule(2, fsdp_gather="step")),
    ("tpu:v5p:4x4x4", _LARGE, "data=2,stage=4,fsdp=4,tensor=2", 16384, "every-second", "train", Schedule(8)),
    ("tpu:v5p:2x2x2", _LARGE.replace(blocks=4), "stage=4,tensor=2", 8192, "full", "train", Schedule(8)),
    ("tpu:v5p:2x2x2", _MEDIUM, "stage=2,fsdp=4", 8192, "none", "forward", Schedule(2)),
    ("tpu:v5p:2x2x2", _MEDIUM, "fsdp=4,tensor=2", 16384, "none", "train", Schedule(4)),
]
# A 2048-wide transformer (16 layers, T = 2048, V = 32768, flash attention) on stage=4, tensor=2 with 8
# microbatches of 8 sequences: 1F1B's peak under remat none (the residuals of 2S − 1 chunks in flight and one chunk's
# copy) and the interleaved 1F1B's (2RS − 1 chunks, the re-laid layers); README's table runs M = S, 2S, 4S for them
# and GPipe (with the program before remat none kept the residuals: each chunk's forward ran again)
PIPE_TF = TransformerConfig(d_model=2048, heads=16, kv_heads=16, d_ff=8192, blocks=16, seq_len=2048, vocab=32768)
TPU_TF_STAGE_GRID = [
    ("tpu:v5p:2x2x2", PIPE_TF, "stage=4,tensor=2", 8 * 8 * 2048, "none", "train",
     Schedule(8, pipeline="1f1b", attention="flash")),
    ("tpu:v5p:2x2x2", PIPE_TF, "stage=4,tensor=2", 8 * 8 * 2048, "none", "train",
     Schedule(8, repeats=2, pipeline="1f1b", attention="flash")),
]
# (GPipe on the same mesh, M = 4, 8, 16: README's table; left out of the suite for its time)
XXL_STAGES = ("tpu:v5p:4x4x4", _XXL, "stage=2,fsdp=8,tensor=4", 25600, "none", "train", Schedule(4))
XXL_ACCUMULATE = ("tpu:v5p:4x4x8", _XXL, "fsdp=32,tensor=4", 2**20, "none", "train", Schedule(4))

# Sequence parallelism and the transformer (each row ends with its Schedule). On 8 emulated CPU devices:
# the FFN stack with sequence parallelism; the transformer with tensor parallelism, sequence parallelism,
# Ulysses and ring over a context axis, materialized and flash scores, remat none and full, train and
# forward, grouped-query attention.
_SMALL_TF = get_preset("small-tf")   # D=256, 8 heads, F=1024, L=4, T=256
_GQA_TF = _SMALL_TF.replace(kv_heads=4)
CPU_SEQUENCE_GRID = [
    (_SMALL, "fsdp=2,tensor=4", 4096, "none", "train", Schedule(sequence_parallel=True)),
    (_SMALL, "data=2,fsdp=2,tensor=2", 4096, "full", "train", Schedule(sequence_parallel=True)),
    (_TINY, "fsdp=4,tensor=2", 2048, "none", "forward", Schedule(sequence_parallel=True)),
    (_SMALL_TF, "fsdp=2,tensor=4", 4096, "none", "train", Schedule()),
    (_SMALL_TF, "data=2,fsdp=2,tensor=2", 4096, "full", "train", Schedule()),
    (_SMALL_TF, "fsdp=2,tensor=4", 4096, "none", "train", Schedule(sequence_parallel=True)),
    (_SMALL_TF, "fsdp=2,context=2,tensor=2", 4096, "none", "train", Schedule(context="ulysses")),
    (_SMALL_TF, "fsdp=2,context=2,tensor=2", 4096, "none", "train", Schedule(attention="flash", attention_block=64)),
    (_SMALL_TF, "context=4,tensor=2", 4096, "none", "train", Schedule(context="ring")),
    (_GQA_TF, "fsdp=2,context=4", 4096, "full", "train", Schedule(context="ring", attention_block=32)),
    (_GQA_TF, "data=2,context=2,tensor=2", 4096, "full", "train", Schedule(context="ulysses", sequence_parallel=True)),
    (_SMALL_TF, "fsdp=4,context=2", 4096, "none", "forward", Schedule(context="ulysses")),
    (_SMALL_TF, "fsdp=2,context=4", 4096, "none", "forward", Schedule(context="ring")),
    # a context strategy without a context axis: unused, the attention is the local materialized one
    (_SMALL_TF, "fsdp=8", 8192, "none", "train", Schedule(context="ring")),
    # token ids in, the vocab-parallel embedding, logits and cross-entropy (V = 1024), untied and tied (untied on
    # fsdp=2,tensor=4 in TPU_SEQUENCE_GRID)
    (_SMALL_TF.replace(vocab=1024, tied_embeddings=True), "data=2,fsdp=2,tensor=2", 4096, "full", "train", Schedule()),
    (_SMALL_TF.replace(vocab=1024), "fsdp=2,context=2,tensor=2", 4096, "none", "train",
     Schedule(context="ring", sequence_parallel=True)),
    (_SMALL_TF.replace(vocab=1024, tied_embeddings=True), "fsdp=2,tensor=4", 4096, "none", "forward", Schedule()),
    # parallel blocks (one tensor reduction per layer and pass), SwiGLU
    (_SMALL_TF.replace(block="parallel", mlp="swiglu"), "data=2,fsdp=2,tensor=2", 4096, "full", "train", Schedule()),
    (_SMALL_TF.replace(block="parallel", mlp="swiglu"), "fsdp=2,context=2,tensor=2", 4096, "none", "train",
     Schedule(context="ring", sequence_parallel=True)),
    # the named remat policies: the recomputed attention's all-to-all of o again (minimal), W_o's matmul and its
    # reduction again (save_qkv_proj)
    (_SMALL_TF, "fsdp=2,context=2,tensor=2", 4096, "minimal", "train", Schedule(context="ulysses")),
    (_SMALL_TF, "fsdp=2,context=2,tensor=2", 4096, "save_qkv_proj", "train",
     Schedule(context="ring", sequence_parallel=True)),
    # ZeRO-1: the gradients reduce-scattered over data·fsdp (the context reduction on that slice), the FP32
    # weights all-gathered over data; the FFN stack and the transformer with a tied vocabulary
    (_SMALL, "data=4,fsdp=2", 4096, "none", "train", Schedule(optimizer_sharding="zero1")),
    (_SMALL_TF.replace(vocab=1024, tied_embeddings=True), "data=2,fsdp=2,context=2", 4096, "none", "train",
     Schedule(optimizer_sharding="zero1")),
    # the policies no other CPU row compiles: save_dot_except_mlpwi, and the offloading ones (XLA:CPU keeps the
    # offloaded residuals in device memory: the FLOPs, arguments and collectives are the policy's all the same)
    (_SMALL_TF, "fsdp=2,tensor=4", 4096, "save_dot_except_mlpwi", "train", Schedule()),
    (_SMALL_TF, "fsdp=2,tensor=4", 4096, "qkv_proj_offloaded", "train", Schedule()),
    (_SMALL_TF, "fsdp=2,tensor=4", 4096, "input_qkv_offloaded", "train", Schedule()),
    # MaxText's custom policy of its TPU7x recipes: q, k, v and the attention's output kept (no attention recompute)
    (_SMALL_TF, "fsdp=2,tensor=4", 4096, "save_qkv_context", "train", Schedule(attention="flash")),
]
# On TPU v5p ahead of time: a 4096-wide transformer (32 heads, 8 kv heads, F=16384, 4 layers, T=4096; 8
# sequences) large enough that HBM dominates its peak (3 to 17 GB), and the XXL with sequence parallelism at
# fsdp=16, tensor=4 beside XXL_TRAIN (tensor parallelism) on v5p:4x4x4. (Rows whose terms other rows hold, 50-100 s
# compiles each, left the suite with issue 49: SP under full remat, Ulysses on fsdp=2,context=4, the Llama-8B shape
# on 4x4x4 with tensor and with context, minimal with flash, ZeRO-1; their figures are in docs/findings.md.)
_LARGE_TF = _SMALL_TF.replace(d_model=4096, heads=32, kv_heads=8, d_ff=16384, blocks=4, seq_len=4096)
TPU_SEQUENCE_GRID = [
    ("tpu:v5p:2x2x2", _LARGE_TF, "context=4,tensor=2", 32768, "none", "train", Schedule(attention="flash")),
    ("tpu:v5p:2x2x2", _LARGE_TF, "fsdp=2,context=4", 32768, "none", "train", Schedule(context="ring")),
    ("tpu:v5p:2x2x2", _LARGE_TF, "fsdp=2,context=2,tensor=2", 32768, "none", "forward", Schedule()),
    # the FFN stack with sequence parallelism at D = 4096: its activations are carried transposed so that the
    # reduce-scatter over tensor splits their minor dimension (ffn_model.model.block; docs/findings.md, residuals)
    ("tpu:v5p:2x2x2", _MEDIUM.replace(blocks=3), "fsdp=2,tensor=4", 8192, "none", "train",
     Schedule(sequence_parallel=True)),
    # a 32k vocabulary (MaxText's), vocab-parallel logits: the loss's phase beside the layers'
    ("tpu:v5p:2x2x2", _LARGE_TF.replace(vocab=32768), "fsdp=2,tensor=4", 32768, "none", "train", Schedule()),
    # a parallel SwiGLU block with sequence parallelism under full remat
    ("tpu:v5p:2x2x2", _LARGE_TF.replace(block="parallel", mlp="swiglu"), "fsdp=2,tensor=4", 32768, "full", "train",
     Schedule(sequence_parallel=True)),
]
XXL_SEQUENCE_PARALLEL = ("tpu:v5p:4x4x4", _XXL, "fsdp=16,tensor=4", 25600, "none", "train",
                         Schedule(sequence_parallel=True))
# Uneven stages (issue 37, item 2): L blocks not divisible by S, run as a padded stack of S·Lmax slots whose padding
# slots are masked (ffn_model.pipeline.padded_slots): the FFN stack's 5 blocks on 2 stages (3, 2), the transformer's
# 5 layers on 2 (the default rule with its embedding and output counted: 3, 2) with GPipe and 7 on 4 (2, 2, 2, 1)
# with 1F1B, and an explicit list; on v5p, the 5-block FFN stack on stage=2 (TPU_STAGE_GRID's first row's mesh).
UNEVEN_STAGE_GRID = [
    (_SMALL.replace(blocks=5), "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4)),
    (_TF_V.replace(blocks=5), "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4)),
    (_TF_V.replace(blocks=7), "stage=4,tensor=2", 4096, "full", "train", Schedule(4, pipeline="1f1b")),
    (_TF_V.replace(blocks=5), "stage=2,tensor=4", 4096, "none", "train", Schedule(2, stage_blocks=(1, 4))),
]
TPU_UNEVEN_STAGE_GRID = [
    ("tpu:v5p:2x2x2", _MEDIUM.replace(blocks=5), "stage=2,fsdp=2,tensor=2", 8192, "none", "train", Schedule(4)),
]
# Uneven chunks (issue 49, item 16): the transformer's 7 layers on 2 stages with 2 chunks each (the default rule over
# the 4 chunks, its embedding and output counted: 2, 2, 2, 1; stages 4, 3), every chunk padded to 2 slots, the padding
# masked: interleaved 1F1B and circular
_TF_V7 = _TF_V.replace(blocks=7)
UNEVEN_CHUNK_GRID = [
    (_TF_V7, "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4, repeats=2, pipeline="1f1b")),
    (_TF_V7, "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4, repeats=2)),
]
# Sequence parallelism with pipeline stages (Megatron's layout: the token split between layers inside every stage,
# the split activation sent from stage to stage, D/Y per token). On 8 emulated CPU devices: GPipe, 1F1B, interleaved
# 1F1B (chunks of one layer), circular without a vocabulary, a one-layer 1F1B chunk under save_dot_except_mlp, and
# the forward step
CPU_SP_STAGE_GRID = [
    (_TF_V, "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4, sequence_parallel=True)),
    (_TF_V, "stage=2,tensor=4", 4096, "none", "train", Schedule(4, pipeline="1f1b", sequence_parallel=True)),
    (_TF_V, "stage=2,fsdp=2,tensor=2", 4096, "full", "train",
     Schedule(4, repeats=2, pipeline="1f1b", sequence_parallel=True)),
    (_SMALL_TF, "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4, repeats=2, sequence_parallel=True)),
    (_SMALL_TF, "stage=4,tensor=2", 4096, "save_dot_except_mlp", "train",
     Schedule(4, pipeline="1f1b", sequence_parallel=True)),
    (_TF_V, "stage=2,fsdp=2,tensor=2", 4096, "none", "forward", Schedule(4, pipeline="1f1b", sequence_parallel=True)),
]
# On TPU v5p ahead of time: PIPE_TF's interleaved 1F1B row of TPU_TF_STAGE_GRID with sequence parallelism (the peak:
# 2RS − 1 chunks' residuals and the backward's copy of one, the token split; compiled 17.073 GB against 16.694,
# 1.023). Its 1F1B row (R = 1): 16.671 against 16.292, 1.023 (docs/findings.md, "1F1B's peak": the 1.103 once
# noted here was the loop that ran each chunk's forward again)
TPU_SP_STAGE_GRID = [
    ("tpu:v5p:2x2x2", PIPE_TF, "stage=4,tensor=2", 8 * 8 * 2048, "none", "train",
     Schedule(8, repeats=2, pipeline="1f1b", attention="flash", sequence_parallel=True)),
]
# ZeRO-1 as a distributed optimizer (ffn_model.zero1), (devices, cfg, mesh, batch, remat, step, schedule): each
# device's flat buffer reduce-scattered over data in BF16 and the FP32 weights all-gathered, where data·fsdp does not
# divide D (196 on data=4, fsdp=2), a transformer with a vocabulary, GPipe stages, and on v5p with odd D and F
# (4095 x 16380 on data=2: each device's flat buffer padded, 134,152,200 elements to 134,152,448). On 8 CPU devices
# (the suite's backend); data=3 and data=6 are in tests/test_zero1_any.py's numerics.
ZERO1_GRID = [
    ("cpu:8", _SMALL.replace(d_model=196), "data=4,fsdp=2", 4096, "none", "train",
     Schedule(optimizer_sharding="zero1")),
    ("cpu:8", _SMALL_TF.replace(vocab=1024), "data=4,tensor=2", 4096, "none", "train",
     Schedule(optimizer_sharding="zero1")),
    ("cpu:8", _TF_V, "data=2,stage=2,tensor=2", 4096, "none", "train", Schedule(2, optimizer_sharding="zero1")),
    ("tpu:v5p:2x2x2", _SMALL.replace(d_model=4095, d_ff=16380), "data=2,tensor=4", 8192, "none", "train",
     Schedule(optimizer_sharding="zero1")),
]
# Local (sliding-window) attention, local and global layers interleaved 1:1 (Gemma 2's pattern): flash runs a local
# layer's band of key blocks only (W = 64, blocks of 32: 3 of 8 per query block), materialized masks the window;
# under Ulysses the window is over the whole sequence after the all-to-all
_LOCAL_TF = _SMALL_TF.replace(window=64, global_every=2)
CPU_LOCAL_ATTENTION_GRID = [
    (_LOCAL_TF, "fsdp=2,tensor=4", 4096, "none", "train", Schedule(attention="flash", attention_block=32)),
    (_LOCAL_TF, "fsdp=2,context=2,tensor=2", 4096, "none", "train", Schedule(context="ulysses")),
]
# v5p: the 4096-wide transformer with W = 1024 on every other layer, flash blocks of 512 (3 of 8 per local layer)
TPU_LOCAL_ATTENTION_GRID = [
    ("tpu:v5p:2x2x2", _LARGE_TF.replace(window=1024, global_every=2), "fsdp=2,tensor=4", 32768, "none", "train",
     Schedule(attention="flash")),
]
# Memory of the runs that ran (issue 37): MaxText's qkv_proj_offloaded beside save_qkv_proj, which keeps the same
# q, k, v in HBM, on the 4096-wide transformer (tests/test_memory_runs.py; 4 to 9 minutes each beside other compiles)
TPU_OFFLOAD_GRID = [("tpu:v5p:2x2x2", _LARGE_TF, "fsdp=2,tensor=4", 32768, remat, "train",
                     Schedule(attention="flash")) for remat in ("save_qkv_proj", "qkv_proj_offloaded")]

# 1F1B with --remat meaning what it means (issue 37, item 4; ffn_model.pipeline.one_f_one_b): remat none keeps every
# in-flight chunk's residuals (no second forward), selective the probabilities recomputed in the backward slot (the
# materialized attention's q·kᵀ and softmax again), on 8 emulated CPU devices; on v5p the peak of the ring of
# 2·R·S − 1 chunks' residuals (scaling.step.pipeline.microbatches_in_flight)
CPU_ONEFB_REMAT_GRID = [
    (_TF_V, "stage=2,fsdp=2,tensor=2", 4096, "none", "train", Schedule(4, pipeline="1f1b")),
    (_TF_V, "stage=2,fsdp=2,tensor=2", 4096, "selective", "train", Schedule(4, pipeline="1f1b")),
]
TPU_ONEFB_REMAT_GRID = [
    # PIPE_TF's 8-layer cut, materialized attention (selective recomputes its probabilities), 8 microbatches of 4
    # sequences: the ring's 7 chunks of 2 layers and one chunk's copy beside them
    ("tpu:v5p:2x2x2", PIPE_TF.replace(blocks=8), "stage=4,tensor=2", 8 * 4 * 2048, "selective", "train",
     Schedule(8, pipeline="1f1b")),
]

# The libraries' attention kernels (issue 39): splash (jax's Pallas kernel, MaxText's on TPUs) on v5p ahead of time,
# the 4096-wide transformer with MaxText's 32k vocabulary, tensor parallelism, and Ulysses over context=2 (the
# kernel on each device's heads over the whole sequence). Its attention FLOPs run inside the custom calls (no dots:
# the FLOPs row compares the closed form less them, step_flops' "kernels")
TPU_SPLASH_GRID = [
    ("tpu:v5p:2x2x2", _LARGE_TF.replace(vocab=32768), "fsdp=2,tensor=4", 32768, "none", "train",
     Schedule(attention="splash")),
    ("tpu:v5p:2x2x2", _LARGE_TF.replace(vocab=32768), "fsdp=2,context=2,tensor=2", 32768, "none", "train",
     Schedule(attention="splash", context="ulysses")),
    # the smallest shape the kernel takes (heads of 128, one 1024-token sequence a device): FLOPs and collectives
    # (its peak, 0.31 GB, is below PEAK_BANDED_ABOVE)
    ("tpu:v5p:2x2x1", _SMALL_TF.replace(d_model=1024, heads=8, kv_heads=8, d_ff=4096, blocks=2, seq_len=1024),
     "fsdp=2,tensor=2", 8 * 1024, "none", "train", Schedule(attention="splash")),
]

# The residuals of issue 49, item 14, (devices, cfg, mesh, batch, remat, step, schedule). On 8 CPU devices, the
# package's flash at its default key block (512, what --attention auto runs on CPU) where the keys fit one block
# under a policy that recomputes the attention: XLA drops the one-trip key-block loops and shares the recomputed
# forward's q·kᵀ with the backward's (scaling.families.transformer.one_key_block). The two configurations the issue
# found (Ulysses on fsdp=4,context=2 under full; a parallel block under minimal), three it did not (GQA and SwiGLU under
# save_dot_except_mlpwi, GPipe stages under full, the MoE layer under full) and two blocks of 128 keys (nothing
# shared); one row per attention kernel the package's own program runs on CPU (materialized, flash at the default
# block) under remat full, so that a change of default moves no band unseen (splash: TPU_SPLASH_GRID).
# Then layer 0's dead input gradient dropped (scaling.families.transformer.first_layer_dx_dead): one layer (found on a
# serial block, remat none and full, fsdp=2,tensor=4; held on a parallel SwiGLU GQA block and on Ulysses with SP), and
# on v5p the offloading policies, whose layer loops XLA:TPU peels (found on TPU_OFFLOAD_GRID's row; held with 3 layers
# on data=2,fsdp=2,tensor=2 under input_qkv_offloaded)
_MOE_TINY = get_preset("moe-tiny")
RESIDUAL_GRID = [
    ("cpu:8", _SMALL_TF, "fsdp=4,context=2", 4096, "full", "train", Schedule(attention="flash", context="ulysses")),
    ("cpu:8", _SMALL_TF.replace(block="parallel"), "fsdp=2,tensor=4", 4096, "minimal", "train",
     Schedule(attention="flash")),
    ("cpu:8", _GQA_TF.replace(mlp="swiglu"), "data=2,fsdp=2,tensor=2", 4096, "save_dot_except_mlpwi", "train",
     Schedule(attention="flash")),
    ("cpu:8", _TF_V, "stage=2,fsdp=2,tensor=2", 4096, "full", "train", Schedule(4, attention="flash")),
    ("cpu:8", _MOE_TINY.replace(capacity_factor=1.25), "fsdp=2,expert=4", 2048, "full", "train",
     Schedule(attention="flash")),
    ("cpu:8", _SMALL_TF, "fsdp=4,context=2", 4096, "full", "train",
     Schedule(attention="flash", context="ulysses", attention_block=128)),
    ("cpu:8", _SMALL_TF, "fsdp=2,tensor=4", 4096, "full", "train", Schedule(attention="materialized")),
    ("cpu:8", _SMALL_TF, "fsdp=2,tensor=4", 4096, "full", "train", Schedule(attention="flash")),
    ("cpu:8", _GQA_TF.replace(blocks=1, block="parallel", mlp="swiglu"), "fsdp=2,tensor=4", 4096, "minimal", "train",
     Schedule(attention="flash")),
    ("cpu:8", _SMALL_TF.replace(blocks=1), "data=2,context=2,tensor=2", 4096, "none", "train",
     Schedule(context="ulysses", sequence_parallel=True)),
    ("tpu:v5p:2x2x2", _LARGE_TF, "fsdp=2,tensor=4", 32768, "qkv_proj_offloaded", "train", Schedule(attention="flash")),
    ("tpu:v5p:2x2x2", _LARGE_TF.replace(blocks=3), "data=2,fsdp=2,tensor=2", 32768, "input_qkv_offloaded", "train",
     Schedule(attention="flash")),
]

# Every list of rows above by its name (verify.check.flag_grid's lookup; tests/test_check.py holds that it names
# each *_GRID of this module). The single rows (XXL_TRAIN, XXL_STAGES, ...) are not grids.
GRIDS = {
    "CPU_GRID": CPU_GRID, "TPU_GRID": TPU_GRID, "TPU_MID_GRID": TPU_MID_GRID, "TPU_CHIP_GRID": TPU_CHIP_GRID,
    "CPU_STAGE_GRID": CPU_STAGE_GRID, "CPU_TF_STAGE_GRID": CPU_TF_STAGE_GRID, "TPU_STAGE_GRID": TPU_STAGE_GRID,
    "TPU_TF_STAGE_GRID": TPU_TF_STAGE_GRID, "CPU_SEQUENCE_GRID": CPU_SEQUENCE_GRID,
    "TPU_SEQUENCE_GRID": TPU_SEQUENCE_GRID, "UNEVEN_STAGE_GRID": UNEVEN_STAGE_GRID,
    "TPU_UNEVEN_STAGE_GRID": TPU_UNEVEN_STAGE_GRID, "UNEVEN_CHUNK_GRID": UNEVEN_CHUNK_GRID,
    "CPU_SP_STAGE_GRID": CPU_SP_STAGE_GRID, "TPU_SP_STAGE_GRID": TPU_SP_STAGE_GRID, "ZERO1_GRID": ZERO1_GRID,
    "CPU_LOCAL_ATTENTION_GRID": CPU_LOCAL_ATTENTION_GRID, "TPU_LOCAL_ATTENTION_GRID": TPU_LOCAL_ATTENTION_GRID,
    "TPU_OFFLOAD_GRID": TPU_OFFLOAD_GRID, "CPU_ONEFB_REMAT_GRID": CPU_ONEFB_REMAT_GRID,
    "TPU_ONEFB_REMAT_GRID": TPU_ONEFB_REMAT_GRID, "TPU_SPLASH_GRID": TPU_SPLASH_GRID, "RESIDUAL_GRID": RESIDUAL_GRID,
}
