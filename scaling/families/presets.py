"""The named models (PRESETS, get_preset), MaxText's scale rule (maxtext_scale), and the families the commands
list (FAMILIES; Model, their union). A new family adds its presets here.
"""

from __future__ import annotations

import dataclasses

from scaling.core.family import FamilyDefaults
from scaling.core.kinds import Family
from scaling.families.ffn import FFNConfig
from scaling.core.inputs import positive_int
from scaling.families.moe import MOE_PRESETS, MoEConfig
from scaling.families.transformer import TransformerConfig


def _maxtext(emb: int, heads: int, mlp: int, layers: int) -> TransformerConfig:
    """MaxText's 2023 decoder: parallel block, ReLU MLP, head_dim 256, tied vocabulary of 32,768, T = 2048."""
    return TransformerConfig(d_model=emb, heads=heads, d_ff=mlp, blocks=layers, seq_len=2048, head_dim=256,
                             mlp="relu", block="parallel", vocab=32768, tied_embeddings=True)


def maxtext_scale(scale: int) -> TransformerConfig:
    """MaxText's global_parameter_scale rule (its 2023 configs, base.yml): on a base of emb 2560, 8 heads, mlp
    8192, 16 layers, with k = log2(scale) and (b, r) = divmod(k, 3), heads and mlp scale by 2^(b + [r > 0]),
    emb by 2^(b + [r > 1]), layers by 2^b (../shared/reference/measured.md, section 1)."""
    k = int(scale).bit_length() - 1
    if scale < 1 or 2**k != scale:
        raise ValueError(f"scale={scale} is not a power of two")
    b, r = divmod(k, 3)
    wide, emb = 2 ** (b + (r > 0)), 2 ** (b + (r > 1))
    return _maxtext(2560 * emb, 8 * wide, 8192 * wide, 16 * 2**b)


PRESETS: dict[str, FFNConfig | TransformerConfig | MoEConfig] = {
    # The question's model (questions-4d.md): D=16384, F=53248, L=126 -> P = 219,848,638,464.
    "xxl": FFNConfig(d_model=16384, d_ff=53248, blocks=126),
    # XXL width, two blocks: the GPU benchmark configuration.
    "xxl-2": FFNConfig(d_model=16384, d_ff=53248, blocks=2),
    # Small configurations for emulated-device tests; dims divisible by 8 shards.
    "small": FFNConfig(d_model=256, d_ff=1024, blocks=4),
    "tiny": FFNConfig(d_model=64, d_ff=256, blocks=3),
    # Transformers. seed000: the XXL's dimensions as a transformer (../shared/reference/seeds/000: Ulysses
    # over 16 GPUs at 60,000 tokens); seed001: the layer estimator's model (e = 12288, 96 heads, f = 4e,
    # 96 blocks, 2048 tokens); Llama-3-style 8B and 70B shapes (grouped-query, SwiGLU; Meta's model card).
    "seed000": TransformerConfig(d_model=16384, heads=128, d_ff=53248, blocks=126, seq_len=60000),
    "seed001": TransformerConfig(d_model=12288, heads=96, d_ff=4 * 12288, blocks=96, seq_len=2048),
    "llama-8b": TransformerConfig(d_model=4096, heads=32, kv_heads=8, d_ff=14336, blocks=32, seq_len=8192,
                                  mlp="swiglu"),
    "llama-70b": TransformerConfig(d_model=8192, heads=64, kv_heads=8, d_ff=28672, blocks=80, seq_len=8192,
                                   mlp="swiglu"),
    # for emulated-device tests: heads and kv heads divisible by context·tensor up to 8
    "tiny-tf": TransformerConfig(d_model=64, heads=8, kv_heads=8, d_ff=256, blocks=2, seq_len=64),
    "small-tf": TransformerConfig(d_model=256, heads=8, kv_heads=8, d_ff=1024, blocks=4, seq_len=256),
    # for TPU topologies ahead of time: arrays large enough that HBM, not the compiler's working set, sets the peak
    "medium-tf": TransformerConfig(d_model=2048, heads=16, kv_heads=8, d_ff=8192, blocks=4, seq_len=2048),
    # The measured runs' models (../shared/reference/measured.md), with their vocabularies. MaxText's 2023
    # family (maxtext_scale, by its global_parameter_scale rule; the v4 22B and 52B as its tables list them):
    # parallel blocks, ReLU, head_dim 256, a tied 32,768-token vocabulary, T = 2048.
    **{f"maxtext-{k}b": maxtext_scale(k) for k in (16, 32, 64, 128)},
    "maxtext-22b": _maxtext(6144, 24, 24576, 48),
    "maxtext-52b": _maxtext(12288, 32, 49152, 32),
    # GPT-3 175B (Brown et al. 2020, table 2.1; its 50,257 tokens padded to 50,304 = 128·393, as Megatron pads)
    "gpt3-175b": TransformerConfig(d_model=12288, heads=96, d_ff=49152, blocks=96, seq_len=2048, vocab=50304),
    # Llama 2 (Touvron et al. 2023, table 1 and the released configs) and Llama 3.1 (Meta's model cards):
    # SwiGLU, untied embeddings, grouped-query attention at 70B and above
    "llama2-7b": TransformerConfig(d_model=4096, heads=32, d_ff=11008, blocks=32, seq_len=4096, mlp="swiglu",
                                   vocab=32000),
    "llama2-70b": TransformerConfig(d_model=8192, heads=64, kv_heads=8, d_ff=28672, blocks=80, seq_len=4096,
                                    mlp="swiglu", vocab=32000),
    "llama3.1-8b": TransformerConfig(d_model=4096, heads=32, kv_heads=8, d_ff=14336, blocks=32, seq_len=8192,
                                     mlp="swiglu", vocab=128256),
    "llama3.1-70b": TransformerConfig(d_model=8192, heads=64, kv_heads=8, d_ff=28672, blocks=80, seq_len=8192,
                                      mlp="swiglu", vocab=128256),
    "llama3.1-405b": TransformerConfig(d_model=16384, heads=128, kv_heads=8, d_ff=53248, blocks=126, seq_len=8192,
                                       mlp="swiglu", vocab=128256),
    # BLOOM-176B (BigScience 2022, table 3: 70 layers, 14336 wide, 112 heads, 250,880 tokens, tied)
    "bloom-176b": TransformerConfig(d_model=14336, heads=112, d_ff=57344, blocks=70, seq_len=2048, vocab=250880,
                                    tied_embeddings=True),
    # Sliding-window attention. Mistral 7B (Jiang et al. 2023, arXiv:2310.06825, table 1, and mistralai's
    # params.json: dim 4096, 32 layers, head_dim 128, hidden_dim 14336, 32 heads, 8 kv heads, window 4096, context
    # 8192, vocab 32000; SwiGLU, untied): every layer local. Gemma 2 9B (Gemma Team 2024, arXiv:2408.00118, table 1,
    # and its Hugging Face config: hidden 3584, 42 layers, 16 heads, 8 kv heads, head_dim 256, intermediate 14336,
    # sliding_window 4096, 8192 positions, vocab 256000, tied): local and global layers alternating, the first
    # local. Its MLP is GeGLU, counted here as the gated "swiglu" (the same three matrices and FLOPs); its logit
    # soft-capping and extra norms are not modelled.
    "mistral-7b": TransformerConfig(d_model=4096, heads=32, kv_heads=8, d_ff=14336, blocks=32, seq_len=8192,
                                    mlp="swiglu", vocab=32000, window=4096),
    "gemma-2-9b": TransformerConfig(d_model=3584, heads=16, kv_heads=8, head_dim=256, d_ff=14336, blocks=42,
                                    seq_len=8192, mlp="swiglu", vocab=256000, tied_embeddings=True, window=4096,
                                    global_every=2),
    # Gemma 3 12B (Gemma Team 2025, arXiv:2503.19786, table 1: 1,012M embedding and 10,759M non-embedding
    # parameters; MaxText's gemma3-12b.yml: 48 layers, D 3840, 16 heads of 256, 8 kv heads, mlp 15360 gated GELU,
    # vocab 262,144 tied, sliding window 1024, five local layers to one global, QK-norm): its post-attention and
    # post-MLP norms are not modelled
    "gemma3-12b": TransformerConfig(d_model=3840, heads=16, kv_heads=8, head_dim=256, d_ff=15360, blocks=48,
                                    seq_len=32768, mlp="swiglu", vocab=262144, tied_embeddings=True, window=1024,
                                    global_every=6, qk_norm=True),
    # Mixture-of-experts transformers (scaling.families.moe.MOE_PRESETS, their sources there): Mixtral 8x7B and
    # 8x22B, Qwen3-235B-A22B and Qwen3-30B-A3B, OLMoE-1B-7B, and a tiny one for tests
    **MOE_PRESETS,
}


Model = FFNConfig | TransformerConfig | MoEConfig  # the models the package builds, closes forms for and checks
# every model family (each config class implements scaling.core.family.ModelFamily through FamilyDefaults), in
# the order of scaling.core.kinds.Family, as commands list them: derived from the classes, not kept by hand
FAMILIES = tuple(sorted(FamilyDefaults.__subclasses__(), key=lambda c: list(Family).index(c.family)))


def get_preset(name: str) -> Model:
    """The preset named ``name``; ValueError listing the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None


def presets_of(family) -> str:
    """'FFN presets: tiny, ...' or 'transformer presets: ...': a family's presets (PRESETS by ``family.family``),
    named by the first word of its noun."""
    return (family.noun.split()[0] + " presets: "
            + ", ".join(k for k, v in PRESETS.items() if v.family == family.family))


def model_fields() -> dict[str, tuple]:
    """{field: (kind, the first family in FAMILIES that has it)} of every field a command may set on a model,
    kinds in the order dimension, schedule, kind, switch (each family's ModelFamily.dimensions, schedule_flags,
    kinds, switches): model_of's and the command line's one list."""
    out = {}
    for kind in ("dimensions", "schedule_flags", "kinds", "switches"):
        for fam in FAMILIES:
            for k in getattr(fam, kind):
                out.setdefault(k, (kind, fam))
    return out


def model_of(preset: str | None, **given):
    """The preset ``preset`` with the fields in ``given`` (model_fields; None: not given): dimensions positive
    counts, kinds and switches the family's. ValueError naming a bad value, or a field of another family (a
    dimension, or a flag: a kind, a switch or a schedule field) than the preset's. ``preset`` None: the model of
    ``given`` alone (model_from_fields)."""
    fields = model_fields()
    for k, (kind, _) in fields.items():
        if kind == "dimensions" and given.get(k) is not None:
            positive_int(f"--{k.replace('_', '-')}", given[k])
    if preset is None:
        return model_from_fields(**given)
    cfg = get_preset(preset)
    own = {**cfg.dimensions, **cfg.schedule_flags, **cfg.kinds, **cfg.switches}
    extra = [k for k in fields if k not in own and given.get(k) is not None]
    if extra:
        kind, owner = fields[extra[0]]
        what = "dimension" if kind == "dimensions" else "flag"
        a = lambda noun: ("an " if noun[:1] in "aeiouFHLMNRSX" else "a ") + noun  # noqa: E731 (an FFN, an MoE)
        raise ValueError(f"--{extra[0].replace('_', '-')} is {a(owner.noun)} {what}; {preset!r} is {a(cfg.noun)} "
                         f"({presets_of(owner)})")
    return cfg.replace(**{k: given.get(k) for k in (*cfg.dimensions, *cfg.kinds, *cfg.switches)})


def _required(family) -> list[str]:
    """A family's dimensions with no default: those a model from flags must be given (its ``required``, where its
    dataclass fields are not flat: the MoE family's; else its dataclass fields)."""
    if getattr(family, "required", None):
        return list(family.required)
    return [f.name for f in dataclasses.fields(family)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def model_from_fields(**given):
    """The model ``given`` describes with no preset (None: not given): of the families in FAMILIES whose fields
    (dimensions, schedule flags, kinds, switches) hold every field given, the one whose required dimensions
    (_required) are all given; the others take their dataclass defaults. The FFN stack's fields (D, F, L) are a
    subset of the transformer's, which also needs N (--heads) and T (--seq-len): --d-model --d-ff --blocks alone
    make an FFN stack; any field only a transformer has (--heads, --seq-len, --vocab, --mlp, --attention, ...)
    makes a transformer. ValueError naming the missing flags (or the fields no one family has)."""
    named = [k for k, v in given.items() if v is not None and v is not False]
    flag = lambda k: f"--{k.replace('_', '-')}"  # noqa: E731
    if not named:
        raise ValueError("give --preset, or the model's dimensions: " + "; ".join(
            f"{' '.join(map(flag, _required(f)))} (a{'n' if f.noun[0] in 'AEFIOU' else ''} {f.noun})"
            for f in FAMILIES))
    own = {f: {**f.dimensions, **f.schedule_flags, **f.kinds, **f.switches} for f in FAMILIES}
    fams = [f for f in FAMILIES if all(k in own[f] for k in named)]
    if not fams:
        raise ValueError("no model family has all of " + " ".join(map(flag, named)) + "; " + "; ".join(
            f"{f.noun}: {' '.join(map(flag, own[f]))}" for f in FAMILIES))
    whole = [f for f in fams if all(k in named for k in _required(f))]
    if not whole:
        raise ValueError("a model with no --preset needs " + " or ".join(
            f"{' '.join(flag(k) for k in _required(f) if k not in named)} (a{'n' if f.noun[0] in 'AEFIOU' else ''} "
            f"{f.noun}: {' '.join(map(flag, _required(f)))})" for f in fams) + "; give them or --preset NAME")
    fam = whole[0]  # the fewest fields: the FFN stack's D, F, L before the transformer's
    make = getattr(fam, "from_fields", fam)  # a family of nested configs builds itself from flat fields
    return make(**{k: given[k] for k in (*fam.dimensions, *fam.kinds, *fam.switches) if given.get(k) is not None})


def defaults_taken(cfg, given: dict) -> dict:
    """{field: value} of the dimensions and kinds (ModelFamily.dimensions, kinds) a model from flags alone
    (model_from_fields) took at their defaults, ``given`` not naming them (None: not given): its dataclass fields,
    those of a nested config (an MoE model's base and MoESpec) flattened, in the family's order; a field that only
    qualifies another left at its default (global_every without a window) left out."""
    flat, todo = {}, [cfg]
    while todo:
        obj = todo.pop(0)
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            todo += [v] if dataclasses.is_dataclass(v) else []
            flat.setdefault(f.name, v)
    out = {k: flat[k] for k in (*cfg.dimensions, *cfg.kinds) if k in flat and given.get(k) is None}
    if out.get("window", 0) is None:
        out.pop("global_every", None)
    return out

