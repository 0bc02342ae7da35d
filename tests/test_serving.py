"""Serving closed forms (scaling.step.serving) against the Scaling Book's worked inference numbers ("All About
Transformer Inference" and "Serving LLaMA 3-70B on TPUs", jax-ml/scaling-book inference.md and applied-inference.md at
commit 0819a7d), each with the Book's value and precision, and against hand calculations where the Book's inputs are
rounded (its 70e9 parameters, 16 GB and 8.1e11 B/s of a v5e, "160kB" for 163,840 B)."""


import pytest

from scaling.families.presets import PRESETS
from scaling.families.transformer import TransformerConfig
from scaling.hardware.chips import get_chip
from scaling.step import serving as sv

V5E = get_chip("v5e")
L70 = PRESETS["llama3.1-70b"]
BOOK_W, BOOK_C, BOOK_HBM = 8.1e11, 1.97e14, 16e9  # the Book's v5e figures in these answers


def rounds_to(x, book, digits):
    """x shown to the Book's ``digits`` decimals is the Book's figure (its "17ms" is 16.5-17.5 ms)."""
    return round(x, digits) == book


def test_kv_cache_per_token_of_llama3_70b():
    """applied-inference: 2·K·H·L = 2·8·128·80 = 160kB in int8 (163,840 B = 160 KiB); bf16 twice that."""
    assert sv.kv_cache_bytes(L70, 1, "int8") == 2 * 8 * 128 * 80 == 160 * 1024
    assert sv.kv_cache_bytes(L70, 1, "bf16") == 2 * 163_840
    assert sv.kv_cache_bytes(L70, 1, "int4") == 163_840 / 2


def test_kv_cache_of_a_13b_model():
    """inference: 8192 (T) · 40 (K) · 128 (H) · 40 (L) · 2 bytes · 2 = 6.7 GB for LLaMA-2 13B in bf16; its
    parameters 8.5e9 + 4.2e9 + 0.3e9 = 13e9 (the Book's sum)."""
    m = TransformerConfig(d_model=5120, heads=40, head_dim=128, d_ff=13824, blocks=40, seq_len=4096, mlp="swiglu",
                          vocab=32000)
    assert rounds_to(sv.kv_cache_bytes(m, 8192, "bf16") / 1e9, 6.7, 1)
    assert rounds_to(m.params / 1e9, 13, 0)


def test_parameter_count_of_the_worked_problem_model():
    """inference, question 4: L·D·(3F + 2H·(N + K)) + D·V = 64·4096·(3·16384 + 2·256·(32 + 8)) + 4096·32128 =
    18.4e9 (one embedding matrix)."""
    m = TransformerConfig(d_model=4096, heads=32, kv_heads=8, head_dim=256, d_ff=16384, blocks=64, seq_len=4096,
                          mlp="swiglu", vocab=32128, tied_embeddings=True)
    assert rounds_to(m.params / 1e9, 18.4, 1)


def test_critical_decode_batch_on_v5e():
    """applied-inference: bf16 1.97e14 / 8.2e11 = 240; int8 weights with bf16 FLOPs 120; int8 weights and FLOPs
    (3.94e14) 240 again."""
    assert round(sv.critical_decode_batch(V5E)) == 240
    assert round(sv.critical_decode_batch(V5E, "int8")) == 120
    assert round(sv.critical_decode_batch(V5E, "int8", "int8")) == 240


def test_pop_quiz_30b_on_a_v5e_4x4():
    """inference pop quiz: 30e9 parameters in int8, bf16 FLOPs, 8192 context, 100 kB a token, 16 chips: batch 4 at
    least (4·819e6 + 30e9)/(16·8.1e11) = 2.5 ms (the Book's figure truncates 2.57); batch 256 21 ms (the KV term
    plus the compute-bound weights: 256·819e6/(16·8.1e11) + 2·256·30e9/(16·1.97e14))."""
    kv = 100e3 * 8192
    t4 = sv.general_step_seconds(4, kv, 30e9, 1, 16, BOOK_C, BOOK_W)
    assert 2.5e-3 <= t4 < 2.6e-3
    assert rounds_to(sv.general_step_seconds(256, kv, 30e9, 1, 16, BOOK_C, BOOK_W) * 1e3, 21, 0)


def _book_answers(**inputs) -> dict:
    """answer-serving's derivations (scaling.reports.serving.serving_answers), {question: value}, with the Book's
    rounded inputs unless others are given: 70e9 parameters, 16e9 B of HBM at 8.1e11 B/s."""
    from scaling.reports.serving import serving_answers

    kw = {"params": 70e9, "hbm": BOOK_HBM, "hbm_bw": BOOK_W, **inputs}
    return {q: v for q, _, v, _ in serving_answers(**kw).rows}


def test_llama3_70b_batch_32_on_v5e():
    """applied-inference: batch 32, 8192 context, int8 weights and KV: 112 GB with the 70e9 B of weights, 7 chips
    (112e9/16e9: a 4x2); a step (112e9)/(8·8.1e11) = 17 ms, 8.5 ms on a 4x4 (half). The Book's caches take 160e3 B a
    token for 163,840: by hand 32·8192·163,840 = 42.95e9, so 112.9 GB and 7.06 chips. The preset on the hardware
    table's v5e (70.55e9 parameters less the untied lookup, 8.2e11 B/s) by hand as well."""
    a = _book_answers()
    assert a["memory at batch 32, 8192 tokens, int8"] == "112.9 GB"
    assert round(float(a["the fewest chips"])) == 7  # "7 TPUs, or (rounding to an even size) 4x2"
    book_kv = 160e3 * 8192
    t8 = sv.general_step_seconds(32, book_kv, 70e9, 1, 8, BOOK_C, BOOK_W)
    assert rounds_to(t8 * 1e3, 17, 0)
    assert sv.general_step_seconds(32, book_kv, 70e9, 1, 16, BOOK_C, BOOK_W) == pytest.approx(t8 / 2)
    s = sv.Serving(L70, V5E, {"tensor": 8}, 32, 8192, 1, weights="int8", kv="int8")
    d = sv.decode_step(s, 8192)
    by_hand = (32 * 163_840 * 8192 + L70.decode_read_params(32)) / (8 * 8.2e11)  # the table's 8.2e11
    assert d.t_weights + d.t_attention == pytest.approx(by_hand)
    assert rounds_to(by_hand * 1e3, 17, 0)
    assert d.weights_bound == "HBM"


def test_smallest_v5e_slices_and_their_caches():
    """applied-inference: parameters 140 GB in bf16 over 16 GB = 8.75 chips, 70 GB in int8 4.38; on a 4x4 in bf16
    256 − 140 = 116 GB left, 116e9 / (324e3 · 8192) = 43 caches of 8k. (The Book's int8 and int4 rows do not follow
    from its own inputs: 128 − 70 = 58 GB, not 68, on a 4x2; int4 weights are 35 GB, not 45: docs/serving.md.)"""
    a = _book_answers()
    assert a["smallest slice in bf16, caches of 8k it holds"] == "8.75 chips; on 16: 43"
    assert a["smallest slice in int8, caches of 8k it holds"].startswith("4.38 chips")
    assert sv.sequences_that_fit(16 * BOOK_HBM - 140e9, 324e3, 8192) == 43


def test_latency_at_full_hbm():
    """applied-inference: a step that reads a whole v5e's HBM takes 16e9 / 8.2e11 = 19 ms (19.5, truncated)."""
    a = _book_answers(hbm_bw=8.2e11)
    assert a["decode latency reading a full chip's HBM"] == "19.5 ms"


def test_prefill_and_disaggregation():
    """applied-inference: 8192 tokens on 16 v5e at 40% of C take 2·70e9·8192/(16·1.97e14·0.4) = 0.91 s; prefill
    servers per decode server at batch 32, 19 ms a step and 512 output tokens: 32·0.91/(0.019·512) = 3."""
    t = sv.prefill_seconds(70e9, 8192, 16, BOOK_C, 0.4)
    assert rounds_to(t, 0.91, 2)
    assert round(sv.prefill_servers_per_decode_server(0.91, 0.019, 32, 512)) == 3


def test_prefill_step_of_the_preset_by_hand():
    """The model-based prefill of one 8192-token prompt of LLaMA 3.1 70B on 16 v5e at 0.4 of C: 2·T·P_read (P less
    the untied lookup, 69,501,714,432) + the causal attention 4·N·H·L·T·T/2, the output layer for the last token only
    (less 2·(T − 1)·V·D), by hand."""
    s = sv.Serving(L70, V5E, {"tensor": 16}, 1, 8192, 1, prefill_efficiency=0.4)
    p = sv.prefill_step(s)
    T = 8192
    flops = 2 * T * 69_501_714_432 + 4 * 64 * 128 * 80 * T * T / 2 - 2 * (T - 1) * 128_256 * 8192  # logits: last only
    assert p.flops == pytest.approx(flops / 16)
    assert p.t_math == pytest.approx(flops / (16 * 1.97e14 * 0.4))


def test_prefill_memory_by_hand():
    """prefill_memory of 8 prompts of 2048 tokens of the LLaMA-shaped stack the check compiles (D 2048, 16 query and 8
    KV heads of 128, SwiGLU 7168, 4 layers, V 32,768) at tensor=8, by hand: the weights 4·(2·2048² + 2·2048·1024 +
    3·2048·7168) + 2·32768·2048 = 360,710,144 parameters, 2 B each over 8; the caches 8·2·1024·4·2048·2 B over 8; the
    logits 8·32768·4 over 8; S = 8·2·2048² scores, X = 8·2048·2048."""
    cfg = TransformerConfig(d_model=2048, heads=16, kv_heads=8, head_dim=128, d_ff=7168, blocks=4, seq_len=4096,
                            mlp="swiglu", vocab=32768)
    base = 360_710_144 * 2 / 8 + 8 * 2 * 1024 * 4 * 2048 * 2 / 8 + 8 * 32768 * 4 / 8
    S, X = 8 * 2 * 2048**2, 8 * 2048 * 2048
    s = sv.Serving(cfg, V5E, {"tensor": 8}, 8, 2048, 1)
    assert sv.prefill_memory(s) == base + 4 * S + 6 * X  # 593,625,088 B: the scores, the residual, W_o's FP32 sums
    assert sv.prefill_memory(s, fused=False) == base + 4 * S + 2 * X + 2 * 8 * 2048 * 256  # p·v written out
    gpu = sv.Serving(cfg, get_chip("H100"), {"tensor": 8}, 8, 2048, 1)
    assert sv.prefill_memory(gpu) == base + 6 * S + 4 * X  # the BF16 probabilities too
    assert sv.prefill_memory(gpu, prompts=32) > sv.prefill_memory(gpu)


def test_moe_prefill_memory_by_hand():
    """prefill_memory of one 2048-token prompt of Mixtral 8x7B (D 4096, 32 query heads, E 8, k 2, cf 1.25) on v5e at
    tensor=8, by hand: C = ceil(1.25·2·2048/8) = 640, Y = 8·640·4096 slots' elements, X = 2048·4096, S = 4·2048²
    scores a device. Its experts' dispatch 4X + 2048·5120 + 2Y + 4·2·2048·640 = 96.5 MB (the residual and the normed
    h, the mask, the BF16 slots, the combine's FP32 one-hots) outweighs their combine 6X + 2Y = 92.3 MB; the
    attention's fused form 4S + 6X = 117.4 MB outweighs both, and with p·v written out (4S + 2X + 2·2048·4·128 =
    86.0 MB) the experts' dispatch is the layer's peak. On an H100 the experts' combine 10X + 4Y + 4·2048·5120 =
    209.7 MB (the slots' and the tokens' FP32 sums, the combine weights in FP32, the attention's all-reduce in flight,
    the residual) outweighs the attention's 6S + 4X = 134.2 MB."""
    mix = PRESETS["mixtral-8x7b"].replace(capacity_factor=1.25)
    s = sv.Serving(mix, V5E, {"tensor": 8}, 1, 2048, 1)
    base = sv.weight_bytes(s) + sv.kv_cache_bytes(mix, 2048, s.kv) / 8 + 32000 * 4 / 8
    X, Y, S = 2048 * 4096, 8 * 640 * 4096, 4 * 2048**2
    assert sv.prefill_memory(s) == pytest.approx(base + 4 * S + 6 * X, rel=1e-12)
    assert sv.prefill_memory(s, fused=False) == pytest.approx(
        base + 4 * X + 2048 * 5120 + 2 * Y + 4 * 2 * 2048 * 640, rel=1e-12)
    gpu = sv.Serving(mix, get_chip("H100"), {"tensor": 8}, 1, 2048, 1)
    assert sv.prefill_memory(gpu) == pytest.approx(base + 10 * X + 4 * Y + 4 * 2048 * 5120, rel=1e-12)


def test_int8_mixtral_weights_by_hand():
    """Mixtral 8x7B (D 4096, 32 query and 8 KV heads of 128, E 8 experts of F_e 14,336, SwiGLU, 32 layers, V 32,000
    untied) stored int8 on tensor=8, by hand: a layer's scales W_q 4096/8, W_k and W_v 1024/8 each, W_o's 4096 whole,
    and each expert's W_in and W_gate 14,336/8 each and W_out's 4096 whole: 4864 + 8·(2·1792 + 4096) = 66,304; the
    vocabulary tables' 2·32,000/8. Its weights 1 B a parameter over 8 but the routers, 32·4096·8 BF16 on every
    device."""
    mix = PRESETS["mixtral-8x7b"].replace(capacity_factor=1.25)
    scales = 32 * (512 + 128 + 128 + 4096 + 8 * (2 * 1792 + 4096)) + 2 * 32000 / 8
    assert sv.weight_scale_bytes(mix, 8) == 2 * scales
    routers = 32 * 4096 * 8
    s = sv.Serving(mix, V5E, {"tensor": 8}, 64, 2048, 1, "int8")
    assert sv.weight_bytes(s) == pytest.approx((mix.params - routers) / 8 + 2 * routers + 2 * scales, rel=1e-12)


def test_capacity_flops_of_mixtral_by_hand():
    """capacity_flops for Mixtral 8x7B (D 4096, E 8, k 2, F_e 14,336, SwiGLU, 32 MoE layers) at cf 1.25 on tensor=8, by
    hand. A decode step of 64 sequences: C = ceil(1.25·2·1/8) = 1, 8 slots a token for 2 routed, so each layer's
    experts run 64·6 more slots of 2·3·4096·14,336 FLOPs over 8 devices, and the router's other 7/8 of 2·64·4096·8.
    A prefill of one 2048-token prompt: C = ceil(1.25·2·2048/8) =
    640, 5,120 slots for 4,096 pairs, plus the dispatch and combine einsums 2·2·2048·5120·4096 whole on each device.
    Its routers whole on every device in weight_bytes: 32·4096·8 parameters not split."""
    mix = PRESETS["mixtral-8x7b"].replace(capacity_factor=1.25)
    expert = 2 * 3 * 4096 * 14_336
    router = 2 * 4096 * 8
    decode = sv.capacity_flops(mix, 64, 1, 8)
    assert decode == pytest.approx(32 * (expert * 64 * 6 / 8 + router * 64 * 7 / 8), rel=1e-12)
    prefill = sv.capacity_flops(mix, 1, 2048, 8)
    assert prefill == pytest.approx(32 * (expert * (5120 - 4096) / 8 + 2 * 2 * 2048 * 5120 * 4096
                                                   + router * 2048 * 7 / 8), rel=1e-12)
    assert sv.capacity_flops(PRESETS["mixtral-8x7b"], 64, 1, 8) == 0.0  # dropless
    s = sv.Serving(mix, V5E, {"tensor": 8}, 64, 2048, 1)
    routers = 32 * 4096 * 8
    assert sv.weight_bytes(s) == pytest.approx(((mix.params - routers) / 8 + routers) * 2, rel=1e-12)


def test_mla_cache_is_the_latent():
    """DeepSeek-V3's cache (its absorbed form): (r_kv + H_r) = 512 + 64 elements a layer a token, 61 layers: 70,272
    elements, 140,544 B in bf16 (DeepSeek-V2 sec. 2.1.3: (d_c + d_h^R)·l)."""
    m = PRESETS["deepseek-v3"]
    assert sv.kv_cache_bytes(m, 1, "bf16") == 2 * (512 + 64) * 61


def test_local_layers_cache_their_window():
    """Gemma 3 12B (5 local layers of window 1024 to one global, 48 layers, K 8, H 256): at 32k tokens the 40 local
    layers keep 1024 keys, the 8 global 32,768: 2·8·256·(40·1024 + 8·32768) elements."""
    m = PRESETS["gemma3-12b"]
    assert m.kv_cache_elements(32768) == 2 * 8 * 256 * (40 * 1024 + 8 * 32768)


def test_moe_decode_reads_the_experts_the_batch_touches():
    """Mixtral 8x7B, top 2 of 8: one token touches 2 experts a layer, 8 tokens 8·(1 − (6/8)^8) = 7.20 in expectation;
    a decode step reads the attention, the router and those experts (the untied lookup's rows only)."""
    m = PRESETS["mixtral-8x7b"]
    assert m.experts_touched(1) == pytest.approx(2)
    assert m.experts_touched(8) == pytest.approx(8 * (1 - 0.75**8))
    lookup = m.vocab * m.d_model
    assert m.decode_read_params(1) == m.active_params - lookup
    assert m.decode_read_params(10**6) == pytest.approx(m.params - lookup)


def test_ffn_stack_and_bad_input_refused():
    with pytest.raises(ValueError, match="no sequences"):
        sv.Serving(PRESETS["xxl"], V5E, {"tensor": 8}, 8, 128, 16)
    with pytest.raises(ValueError, match="fsdp"):
        sv.Serving(L70, V5E, {"fsdp": 8}, 8, 128, 16)
    with pytest.raises(ValueError, match="weights"):
        sv.Serving(L70, V5E, {"tensor": 8}, 8, 128, 16, weights="int3")
    with pytest.raises(ValueError, match="divisible"):
        sv.Serving(L70, V5E, {"data": 2, "tensor": 8}, 3, 128, 16)


def test_predict_decode_command(capsys):
    """predict --step decode prints the Book's terms: LLaMA 3.1 70B, batch 32, 8k prompt, int8 on a v5e 4x2 (the
    weights and cache terms sum to the 17 ms above; the all-reduces beside them)."""
    from jax_scaling.cli import main

    assert main(["predict", "--step", "decode", "--preset", "llama3.1-70b", "--slice", "v5e-8", "--mesh", "tensor=8",
                 "--global-batch", "32", "--prompt", "8192", "--output", "1", "--weights", "int8", "--kv-cache",
                 "int8", "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    d = out["decode"]
    assert rounds_to((d["t_weights"] + d["t_attention"]) * 1e3, 17, 0)
    assert out["critical_batch"] == pytest.approx(1.97e14 / (2 * 8.2e11))


@pytest.mark.parametrize("target", [["--slice", "v5e-16"], ["--slice", "v6e-8"], ["--chip", "H100", "--chips", "8"]])
def test_serving_plan_under_two_seconds(target, capsys):
    """plan --step decode for LLaMA 3.1 70B on v5e-16, v6e-8 and 8 H100s prints the frontier in under 2 s (the
    issue's bound), its rows ordered (latency up, throughput up) and the best within the latency target."""
    import time

    from jax_scaling.cli import main

    t0 = time.perf_counter()
    assert main(["plan", "--step", "decode", "--preset", "llama3.1-70b", *target, "--prompt", "2048", "--output",
                 "512", "--weights", "int8", "--kv-cache", "int8", "--latency-ms", "50", "--json"]) == 0
    assert time.perf_counter() - t0 < 2.0
    import json
    out = json.loads(capsys.readouterr().out)
    front = out["frontier"]
    assert front and all(a["tpot_seconds"] < b["tpot_seconds"] and a["tokens_per_second_per_chip"] <
                         b["tokens_per_second_per_chip"] for a, b in zip(front, front[1:]))
    assert out["best"]["tpot_seconds"] <= 0.05


@pytest.mark.parametrize("flags, word", [(["--step", "train", "--prompt", "128"], "serving flag"),
                                         (["--step", "decode", "--mesh", "fsdp=8"], "serving shards"),
                                         (["--step", "decode", "--global-batch", "3", "--mesh", "data=2,tensor=4"],
                                          "divisible")])
def test_predict_serving_bad_input_one_line(flags, word, capsys):
    from jax_scaling.cli import main

    args = ["predict", "--preset", "llama3.1-70b", "--slice", "v5e-8", *flags]
    if "--mesh" not in args:
        args += ["--mesh", "tensor=8"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert word in err[-1]


def test_serving_plan_tries_expert_meshes_for_moe():
    """An MoE model's plan splits each replica over expert × tensor (every divisor pair whose expert count divides
    E = 8), and its frontier is the candidates no other beats on both latency and throughput."""
    from scaling.reports.serving import serving_plan, serving_setup

    s = serving_setup("mixtral-8x7b", mesh="tensor=8", chip="H100", chips=8, prompt=1024, output=256)
    plan = serving_plan(s)
    meshes = {tuple(sorted(r.mesh.items())) for r in plan.rows}
    assert (("data", 1), ("expert", 8), ("tensor", 1)) in meshes
    assert (("data", 1), ("expert", 2), ("tensor", 4)) in meshes
    for r in plan.frontier:
        assert not any(o.tpot <= r.tpot and o.tokens_per_second_per_chip > r.tokens_per_second_per_chip
                       for o in plan.rows)


def test_decode_steps_measured_on_the_h200():
    """The decode steps measured on the H200 (scaling/data/serving_measured.toml, layers in the package's layout):
    the closed form, its GPU kernels priced from the H200's decode table (kernel data, not these rows), within 15% of
    each but the 8B's batch of one, where each of the 32 layers' small kernels (norms, residual adds, SwiGLU's
    product) run at their launch floor, which the form leaves out: too fast there, within 20%; median |error| <= 5%.
    The scanned layouts, 2.3x and 2.9x the unrolled ones' time (XLA:GPU's copies of each layer's slice), are not
    held."""
    from scaling.reports.serving import validate_serving

    v = validate_serving()
    rows = [r for r in v.rows if r["layers"] == "unrolled"]
    assert len(rows) == 10
    for r in rows:
        bound = 0.20 if (r["preset"], r["batch"]) == ("llama3.1-8b", 1) else 0.15
        assert abs(r["error"]) <= bound, r
    assert v.to_json()["median_abs_error"] <= 0.05
    scans = [r for r in v.rows if r["layers"] == "scan"]
    assert all(r["measured"] > 2 * u["measured"] for r in scans for u in rows
               if (u["preset"], u["batch"], u["context"]) == (r["preset"], r["batch"], r["context"]))


def test_answer_serving_with_the_books_inputs(capsys):
    """answer-serving --book-inputs (70e9 parameters, 16e9 B at 8.1e11 B/s): the Book's figures where its own
    arithmetic gives them: 4x2 step 17 ms, bf16's 8.75 chips and 43 caches on a 4x4, the prefill 0.91 s, 3 prefill
    servers a decode server; the KV cache 163,840 B (its "160kB")."""
    import json

    from jax_scaling.cli import main

    assert main(["answer-serving", "--book-inputs", "--json"]) == 0
    a = {r["question"]: r["value"] for r in json.loads(capsys.readouterr().out)["answers"]}
    assert a["KV cache a token, int8"] == "163,840 B"
    assert a["its decode step on 8 chips"].startswith("17.")
    assert a["smallest slice in bf16, caches of 8k it holds"] == "8.75 chips; on 16: 43"
    assert a["prefill of 8192 tokens on 16 chips at 40% of C"] == "0.91 s"
    assert round(float(a["prefill servers per decode server (batch 32, 512 out)"])) == 3


def test_published_serving_runs_are_predicted_held_out():
    """TensorRT-LLM's published H100 FP8 throughput (static batches) and first-token latencies (H100 FP8, A100 FP16)
    are predicted as `predict --step decode` predicts them, nothing fitted on them (the forms' only coefficients are the
    kernel tables' and the hardware table's): 8 throughput rows and 8 first-token rows, each with a finite error. The
    issue's 15% bound is not met on them (docs/serving.md gives the errors and what the form lacks)."""
    import math

    from scaling.reports.serving import validate_serving

    pub = validate_serving().published
    assert sum("out_tokens_per_second_per_gpu" in r for r in pub) == 8
    assert sum("first_token_ms" in r for r in pub) == 8
    assert all(r["predicted"] > 0 and math.isfinite(r["error"]) for r in pub)
