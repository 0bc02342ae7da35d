"""The serving programs (ffn_model.serve) on emulated CPU devices: a decode step's logits are the training forward's at
the same position (the KV cache path computes what the training layer computes), and greedy generation on 8 devices
(data=2, tensor=4) is token for token one device's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mesh.devices import has_cuda_plugin
from tests.helpers import TINY_TF, mesh_of, refused

CFG = TINY_TF.replace(vocab=512)  # D 64, 8 query heads, 4 KV heads, F 256, 2 layers, V 512
PROMPT, STEPS, BATCH = 12, 6, 4


def _params(spec: str):
    """The model's FP32 parameters on the mesh ``spec`` (ffn_model.train.init_state, seed 0)."""
    from ffn_model.train import init_state
    from mesh import mesh_shape
    from scaling.core.workload import Workload

    m = mesh_of(spec)
    w = Workload(CFG, mesh_shape(m), BATCH * CFG.seq_len)
    return m, init_state(w, m)["params"]


def _ids():
    return jax.random.randint(jax.random.key(7), (BATCH, PROMPT + STEPS), 0, CFG.vocab, jnp.int32)


@pytest.mark.compiles
@pytest.mark.quick
def test_decode_logits_are_the_training_forward():
    """Prefill of 12 tokens, then 6 decode steps fed the next true token (teacher forcing): the logits at each
    position equal the training model's forward over the whole sequence (ffn_model.transformer.TransformerStack) to
    BF16's precision, on one device."""
    from ffn_model import serve
    from ffn_model.transformer import TransformerStack
    from scaling.core.workload import Workload

    ids = _ids()
    mesh = mesh_of("fsdp=1")
    w = Workload(CFG, {}, BATCH * CFG.seq_len)
    t_max = PROMPT + STEPS
    with jax.set_mesh(mesh):
        model = TransformerStack(w, rngs=nnx.Rngs(0))
        full = np.asarray(jax.jit(lambda ids: model(ids))(ids))  # [B, T, V]
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        sw = jax.jit(serve.serving_weights)(params)
        logits, ck, cv = jax.jit(lambda sw, ids: serve.prefill(sw, ids, t_max, mlp_kind=CFG.mlp))(sw, ids[:, :PROMPT])
        got = [np.asarray(logits)]
        step = jax.jit(lambda sw, ck, cv, tok, pos: serve.decode_step(sw, ck, cv, tok, pos, mlp_kind=CFG.mlp))
        for t in range(PROMPT, t_max - 1):
            logits, ck, cv = step(sw, ck, cv, ids[:, t], jnp.int32(t))
            got.append(np.asarray(logits))
    want = full[:, PROMPT - 1:t_max - 1]
    np.testing.assert_allclose(np.stack(got, axis=1), want, atol=3e-2, rtol=0)
    assert np.mean(np.argmax(np.stack(got, axis=1), -1) == np.argmax(want, -1)) > 0.95


@pytest.mark.compiles
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_generation_on_8_devices_is_one_devices(weights):
    """Greedy generation of 6 tokens after a 12-token prompt on data=2,tensor=4 (heads, KV heads, d_ff and the
    vocabulary over tensor, the sequences over data) equals the same weights' generation on one device, token for
    token, BF16 weights or int8 (their scales split as their output channels)."""
    from ffn_model import serve

    ids = _ids()[:, :PROMPT]
    mesh, params = _params("data=2,tensor=4")
    with jax.set_mesh(mesh):
        sw = jax.jit(lambda p: serve.serving_weights(p, weights))(params)
        many = np.asarray(serve.generate(sw, jax.device_put(ids), STEPS, mlp_kind=CFG.mlp))
    host = jax.tree.map(np.asarray, sw)
    one_dev = jax.devices()[0]
    one = np.asarray(serve.generate(jax.device_put(host, one_dev), jax.device_put(ids, one_dev), STEPS,
                                    mlp_kind=CFG.mlp))
    assert many.shape == (BATCH, STEPS)
    np.testing.assert_array_equal(many, one)


# the MoE transformer's serving tests: CFG's attention, layer 0 dense and layer 1 MoE (E 4, k 2, F_e 64)
def _moe_cfg(capacity_factor: float, shared: int = 0):
    from scaling.families.moe import MoEConfig, MoESpec

    return MoEConfig(CFG, MoESpec(experts=4, top_k=2, expert_d_ff=64, capacity_factor=capacity_factor, moe_every=2,
                                  shared_experts=shared))


@pytest.mark.compiles
def test_moe_decode_logits_are_the_training_forward():
    """The MoE transformer's prefill and decode steps (teacher forcing, as the dense test) give the training forward's
    logits (ffn_model.moe.MoETransformer) to the dense test's precision, on one device. With cf = E/k = 2 an expert
    takes C = ceil(2·2·S/4) = S slots of a group of S tokens: nothing is dropped whether a group is a sequence of 64
    (training), a prompt of 12 (prefill) or one token (decode), so the three route the same pairs."""
    from ffn_model import serve
    from ffn_model.moe import MoETransformer
    from scaling.core.workload import Workload

    cfg, ids, t_max = _moe_cfg(2.0), _ids(), PROMPT + STEPS
    kw = dict(mlp_kind=CFG.mlp, moe_spec=cfg.moe)
    with jax.set_mesh(mesh_of("fsdp=1")):
        model = MoETransformer(Workload(cfg, {}, BATCH * CFG.seq_len), rngs=nnx.Rngs(0))
        full = np.asarray(jax.jit(lambda ids: model(ids)[0])(ids))
        sw = jax.jit(lambda p: serve.serving_weights(p, moe_spec=cfg.moe))(nnx.to_pure_dict(nnx.state(model,
                                                                                                       nnx.Param)))
        assert "router" in sw["layers"][1] and "router" not in sw["layers"][0]
        logits, ck, cv = jax.jit(lambda sw, ids: serve.prefill(sw, ids, t_max, **kw))(sw, ids[:, :PROMPT])
        got = [np.asarray(logits)]
        step = jax.jit(lambda sw, ck, cv, tok, pos: serve.decode_step(sw, ck, cv, tok, pos, **kw))
        for t in range(PROMPT, t_max - 1):
            logits, ck, cv = step(sw, ck, cv, ids[:, t], jnp.int32(t))
            got.append(np.asarray(logits))
    want = full[:, PROMPT - 1:t_max - 1]
    np.testing.assert_allclose(np.stack(got, axis=1), want, atol=3e-2, rtol=0)


@pytest.mark.compiles
def test_moe_shared_expert_adds_its_mlp():
    """A shared expert (DeepSeekMoE: one MLP of F_e·S_sh every token runs, added to the routed experts' output) in
    serve._moe: the layer with it less the layer without it is the shared MLP gelu(h·W_inᵀ)·W_out, computed here in
    numpy FP32 from the same BF16 h and weights, within the program's one BF16 rounding of the hidden a, Σ_f
    2^-8·|a_f|·|W_out[f, d]|, and FP32's rounding of the routed sums it is added to (2^-22 of them), for a prompt of
    12 tokens and a decode token (whose combine is the elementwise product)."""
    from ffn_model import serve
    from ffn_model.train import init_state
    from mesh import mesh_shape
    from scaling.core.workload import Workload

    cfg = _moe_cfg(1.25, shared=1)
    mesh = mesh_of("fsdp=1")
    params = init_state(Workload(cfg, mesh_shape(mesh), BATCH * CFG.seq_len), mesh)["params"]
    with jax.set_mesh(mesh):
        lw = jax.jit(lambda p: serve.serving_weights(p, moe_spec=cfg.moe))(params)["layers"][1]
        routed = {n: a for n, a in lw.items() if not n.startswith("shared")}
        for tokens in (PROMPT, 1):
            h = jax.random.normal(jax.random.key(tokens), (BATCH, tokens, CFG.d_model)).astype(jnp.bfloat16)
            both, alone = (np.asarray(jax.jit(lambda h, w: serve._moe(h, w, cfg.moe, CFG.mlp))(h, w))
                           for w in (lw, routed))
            f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
            u = f32(h) @ f32(lw["shared_in"]).T
            a = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))  # jax.nn.gelu's tanh form
            bound = 2.0**-8 * np.abs(a) @ np.abs(f32(lw["shared_out"])) + 2.0**-22 * np.abs(alone) + 1e-6
            assert np.all(np.abs((both - alone) - a @ f32(lw["shared_out"])) <= bound), tokens


@pytest.mark.compiles
def test_moe_int8_experts_are_the_bf16_programs():
    """The MoE program with int8 weights (each expert's W_in and W_gate [E, F_e, D] scaled per expert and output
    channel F_e, its W_out per expert and D, the shared expert's as the MLP's; the router kept BF16) computes what the
    BF16 program computes on W = q·s, every s a power of two (test_int8_weights' construction): the prefill's and two
    decode steps' logits equal to 1e-6, on one device, with a shared expert."""
    from ffn_model import serve
    from ffn_model.train import init_state
    from mesh import mesh_shape
    from scaling.core.workload import Workload

    cfg = _moe_cfg(1.25, shared=1)
    mesh = mesh_of("fsdp=1")
    params = init_state(Workload(cfg, mesh_shape(mesh), BATCH * CFG.seq_len), mesh)["params"]
    with jax.set_mesh(mesh):
        sw = jax.jit(lambda p: serve.serving_weights(p, moe_spec=cfg.moe))(params)

    def exact(a, name):  # q times a power of two a channel: BF16 holds it, and quantize finds that s again
        qs = serve.quantize(a, name)
        s2 = jnp.exp2(jnp.round(jnp.log2(qs["scale"].astype(jnp.float32))))
        return qs["q"].astype(jnp.float32) * jnp.expand_dims(s2, serve.CONTRACTED[name])

    ws = {"layers": [{n: a if n == "router" else exact(a, n) for n, a in lw.items()} for lw in sw["layers"]],
          **{n: exact(sw[n], n) for n in ("embedding", "unembedding") if n in sw}}
    assert isinstance(serve.store(ws, "int8")["layers"][1]["w_out"], dict)
    ids, t_max, kw = _ids(), PROMPT + 2, dict(mlp_kind=CFG.mlp, moe_spec=cfg.moe)

    def run(weights):
        with jax.set_mesh(mesh):
            st = jax.jit(lambda w: serve.store(w, weights))(ws)
            logits, ck, cv = jax.jit(lambda w, ids: serve.prefill(w, ids, t_max, **kw))(st, ids[:, :PROMPT])
            out = [logits]
            for t in range(PROMPT, t_max):
                logits, ck, cv = jax.jit(lambda w, ck, cv, tok, pos: serve.decode_step(w, ck, cv, tok, pos, **kw))(
                    st, ck, cv, ids[:, t], jnp.int32(t))
                out.append(logits)
        return np.stack([np.asarray(o) for o in out])

    np.testing.assert_allclose(run("int8"), run("bf16"), atol=1e-6, rtol=0)


@pytest.mark.compiles
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_moe_generation_on_8_devices_is_one_devices(weights):
    """The MoE transformer's greedy generation on data=2,tensor=4 (the routed and the shared experts' F_e over tensor,
    their partial sums combined to the tokens and reduced in FP32) equals one device's token for token, at cf 1 (an
    expert takes ceil(2·S/4) of a group's 2·S pairs: pairs past it dropped, the same ones on any mesh, a group being a
    sequence's tokens), BF16 weights or int8 (the experts' scales split as their output channels)."""
    from ffn_model import serve
    from ffn_model.train import init_state
    from mesh import mesh_shape
    from scaling.core.workload import Workload

    cfg, ids = _moe_cfg(1.0, shared=1), _ids()[:, :PROMPT]
    kw = dict(mlp_kind=CFG.mlp, moe_spec=cfg.moe)
    mesh = mesh_of("data=2,tensor=4")
    params = init_state(Workload(cfg, mesh_shape(mesh), BATCH * CFG.seq_len), mesh)["params"]
    with jax.set_mesh(mesh):
        sw = jax.jit(lambda p: serve.serving_weights(p, weights, moe_spec=cfg.moe))(params)
        many = np.asarray(serve.generate(sw, jax.device_put(ids), STEPS, **kw))
    one_dev = jax.devices()[0]
    one = np.asarray(serve.generate(jax.device_put(jax.tree.map(np.asarray, sw), one_dev),
                                    jax.device_put(ids, one_dev), STEPS, **kw))
    np.testing.assert_array_equal(many, one)


@pytest.mark.compiles
@pytest.mark.parametrize("step, shared", [("decode", []), ("decode", ["--shared-experts", "1"]),
                                          ("decode", ["--weights", "int8"]),
                                          ("prefill", ["--shared-experts", "2", "--weights", "int8"])])
def test_check_moe_serving_on_cpu8(step, shared, capsys):
    """check --step decode|prefill of the MoE transformer on cpu:8 (data=2, tensor=4), without and with shared
    experts, BF16 and int8 weights: FLOPs, arguments and tensor all-reduces the closed forms' exactly (capacity_flops:
    every slot, a prefill's dispatch and combine, the routers whole on each device, BF16; the int8 experts' scales,
    MoEConfig.scale_channels). By hand, the decode's all-reduces: b = 4
    sequences, D 64, the two layers' attention and MLP outputs 4·64·4 B each (the MoE layer's E·C = 4 slots a sequence,
    cf 1.25: C = ceil(1.25·2·1/4) = 1, and its shared expert combined to the one token before it), the lookup 4·64·4
    (XLA:CPU's FP32)."""
    import json

    from jax_scaling.cli import main

    assert main(["check", "--step", step, "--devices", "cpu:8", "--mesh", "data=2,tensor=4", "--d-model", "64",
                 "--heads", "8", "--kv-heads", "4", "--d-ff", "256", "--blocks", "2", "--seq-len", "64", "--vocab",
                 "512", "--experts", "4", "--top-k", "2", "--expert-d-ff", "64", "--capacity-factor", "1.25",
                 "--moe-every", "2", *shared, "--prompt", "64", "--global-batch", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for term, t in out["terms"].items():
        assert t["ratio"] == pytest.approx(1.0, abs=1e-4), (term, t)
    if step == "decode":
        assert out["terms"]["collectives tensor"]["closed"] == (2 * 2 + 1) * 4 * 64 * 4


MOE_FLAGS = ["--d-model", "64", "--heads", "8", "--kv-heads", "4", "--d-ff", "256", "--blocks", "2", "--seq-len", "64",
             "--vocab", "512", "--experts", "4", "--top-k", "2", "--expert-d-ff", "64", "--moe-every", "2"]


@pytest.mark.parametrize("flags, words", [
    (MOE_FLAGS, ["capacity factor", "--capacity-factor"]),  # the MoE preset flags' default: dropless
    (["--preset", "tiny-tf", "--vocab", "512", "--weights", "fp8"], ["--weights fp8", "bf16 or int8"]),
    (["--preset", "tiny-tf", "--vocab", "512", "--kv-cache", "int8"], ["--kv-cache int8"]),
    (["--preset", "tiny-tf"], ["a vocabulary (--vocab)"]),
])
def test_check_serving_refuses_what_the_programs_do_not_build(flags, words):
    """check --step decode refuses, in one line before anything compiles, what the serving programs do not build
    (ffn_model.serve.check_servable): a dropless MoE layer, fp8 weights, an int8 cache,
    a model without a vocabulary."""
    refused(["check", "--step", "decode", "--devices", "cpu:8", "--mesh", "tensor=8", "--global-batch", "8",
             "--prompt", "64", *flags], *words)


@pytest.mark.compiles
@pytest.mark.quick
def test_int8_weights():
    """ffn_model.serve.quantize, by its definition: every int8 value in [-127, 127], each output channel's largest
    |w| at ±127, and |q·s − w| at most half a step s/2 (rounding; s itself rounded to BF16, 2^-8 relative: a 1%
    margin). Then the int8 program's (x·q)·s is the BF16 program's x·W on weights W = q·s that BF16 holds exactly (s
    a power of two): the prefill's and two decode steps' logits equal, on one device."""
    from ffn_model import serve
    from ffn_model.transformer import TransformerStack
    from scaling.core.workload import Workload

    with jax.set_mesh(mesh_of("fsdp=1")):
        model = TransformerStack(Workload(CFG, {}, BATCH * CFG.seq_len), rngs=nnx.Rngs(0))
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for name in ("wq", "wo", "w_out", "embedding"):
        w = np.asarray(params[name][0] if name != "embedding" else params[name], np.float32)
        qs = jax.tree.map(np.asarray, serve.quantize(jnp.asarray(w), name))
        q, scale = qs["q"].astype(np.float32), np.expand_dims(qs["scale"].astype(np.float32), serve.CONTRACTED[name])
        assert q.min() >= -127 and q.max() <= 127
        np.testing.assert_array_equal(np.max(np.abs(q), axis=serve.CONTRACTED[name]), 127)
        assert np.all(np.abs(q * scale - w) <= 0.5 * scale * 1.01), name
    # weights whose int8 form is exact: each channel's q times a power of two s (quantize then finds that s, and q·s
    # is a BF16 number: 8 bits of q), so the BF16 program takes the same weights as the int8 one
    def exact(a, name):
        qs = serve.quantize(a, name)
        s2 = jnp.exp2(jnp.round(jnp.log2(qs["scale"].astype(jnp.float32))))
        return qs["q"].astype(jnp.float32) * jnp.expand_dims(s2, serve.CONTRACTED[name])

    layer_names = [n for n in serve.LAYER_WEIGHTS if n in params]
    ws = {n: (jnp.stack([exact(a[i], n) for i in range(len(a))]) if n in layer_names else exact(a, n))
          for n, a in params.items()}
    ids, t_max = _ids(), PROMPT + 2

    def run(weights):
        sw = jax.jit(lambda p: serve.serving_weights(p, weights))(ws)
        logits, ck, cv = jax.jit(lambda sw, ids: serve.prefill(sw, ids, t_max, mlp_kind=CFG.mlp))(sw, ids[:, :PROMPT])
        out = [logits]
        for t in range(PROMPT, t_max):
            logits, ck, cv = jax.jit(lambda sw, ck, cv, tok, pos: serve.decode_step(
                sw, ck, cv, tok, pos, mlp_kind=CFG.mlp))(sw, ck, cv, ids[:, t], jnp.int32(t))
            out.append(logits)
        return np.stack([np.asarray(o) for o in out])

    # (x·q)·2^e = x·(q·2^e) exactly in floating point: the same sums, scaled after
    np.testing.assert_allclose(run("int8"), run("bf16"), atol=1e-6, rtol=0)


def test_refusals():
    """check_servable: the FFN stack (no tokens), a model without a vocabulary, a dropless MoE model (Mixtral's preset)
    refused; the MoE model with a capacity factor built."""
    from ffn_model import serve
    from scaling.families.presets import PRESETS

    with pytest.raises(ValueError, match="vocabulary"):
        serve.check_servable(TINY_TF)
    with pytest.raises(ValueError, match="built for the transformer and the MoE transformer"):
        serve.check_servable(PRESETS["tiny"])
    with pytest.raises(ValueError, match="capacity factor"):
        serve.check_servable(PRESETS["mixtral-8x7b"])
    serve.check_servable(PRESETS["mixtral-8x7b"].replace(capacity_factor=1.25))
    serve.check_servable(CFG)
    with pytest.raises(ValueError, match="int8"):
        serve.store({"layers": []}, "fp8")


@pytest.mark.compiles
@pytest.mark.quick
def test_check_serving_on_cpu8():
    """check --step decode on cpu:8 (data=2, tensor=4): the decode step's matmul FLOPs, its arguments (BF16 weights and
    caches a device holds) and its tensor all-reduces (2 a layer of b·D FP32 partial sums, the lookup's b·D, widened
    to FP32 by XLA:CPU) are the closed form's (scaling.step.serving)."""
    from verify.serve_check import check_serving

    r = check_serving(CFG, "cpu:8", "data=2,tensor=4", 8, 64)
    for term in ("matmul FLOPs", "arguments (weights+caches)", "collectives tensor"):
        assert r.ratio(term) == pytest.approx(1.0, abs=1e-4), (term, r.terms[term])
    # by hand: b = 4, D = 64, L = 2: 2·L all-reduces of 4·64·4 B and the lookup's 4·64·4 B
    assert r.terms["collectives tensor"][0] == 2 * 2 * 4 * 64 * 4 + 4 * 64 * 4
    q8 = check_serving(CFG, "cpu:8", "data=2,tensor=4", 8, 64, weights="int8")
    # by hand, int8: 1 B a parameter, so the arguments drop by P/4 = 155,648/4 B (D 64: W_q 64·64, W_k, W_v 64·32,
    # W_o 64·64, W_in, W_out 256·64, a layer 45,056, 2 layers and the two 512·64 tables) and gain the BF16 scales: a
    # layer's 64/4 + 32/4 + 32/4 (q, k, v: split) + 64 (W_o: whole) + 256/4 + 64 (W_in split, W_out whole), the
    # tables' 512/4 rows each
    scales = 2 * (2 * (16 + 8 + 8 + 64 + 64 + 64) + 2 * 128)
    assert q8.terms["arguments (weights+caches)"][1] == r.terms["arguments (weights+caches)"][1] - 155_648 / 4 + scales
    assert q8.ratio("matmul FLOPs") == 1.0 and q8.ratio("collectives tensor") == 1.0


@pytest.mark.compiles
def test_check_prefill_on_cpu8(capsys):
    """check --step prefill on cpu:8 (data=2, tensor=4), from the command line: 8 prompts of 64 tokens, the FLOPs of
    the materialized attention's whole square and the output layer for each prompt's last token, the weights, the
    tensor all-reduces of b·P tokens: the closed form's."""
    import json

    from jax_scaling.cli import main

    assert main(["check", "--step", "prefill", "--devices", "cpu:8", "--mesh", "data=2,tensor=4", "--preset", "tiny-tf",
                 "--kv-heads", "4", "--vocab", "512", "--prompt", "64", "--global-batch", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step"] == "prefill"
    for term, t in out["terms"].items():
        assert t["ratio"] == pytest.approx(1.0, abs=1e-4), (term, t)
    # by hand: b = 4 prompts of 64 tokens, D 64, L 2: 2·L all-reduces of 4·64·64·4 B, the lookup's 4·64·64·4 B
    assert out["terms"]["collectives tensor"]["closed"] == (2 * 2 + 1) * 4 * 64 * 64 * 4


LLAMA_SHAPED = dict(d_model=2048, heads=16, kv_heads=8, head_dim=128, d_ff=7168, blocks=4, seq_len=4096, mlp="swiglu",
                    vocab=32768)


@pytest.mark.tpu
@pytest.mark.parametrize("step, devices, spec, batch, t_max, weights", [
    ("decode", "tpu:v5e:2x4", "tensor=8", 64, 8192, "bf16"),
    ("decode", "tpu:v5e:2x4", "tensor=8", 64, 8192, "int8"),
    ("decode", "tpu:v6e:2x4", "data=2,tensor=4", 64, 8192, "bf16"),
    ("decode", "tpu:v5p:2x2x2", "tensor=8", 64, 8192, "bf16"),
    ("prefill", "tpu:v5e:2x4", "tensor=8", 8, 2048, "bf16"),
    ("prefill", "tpu:v5e:2x4", "tensor=8", 8, 4096, "bf16"),
    ("prefill", "tpu:v6e:2x4", "data=2,tensor=4", 8, 2048, "bf16")])
def test_check_serving_on_tpus(step, devices, spec, batch, t_max, weights):
    """The decode step (64 sequences, a cache of 8192 tokens: 1.07 GB of caches a device at tensor=8) and the prefill
    (prompts of 2048) of a LLaMA-shaped stack (D 2048, 16 query and 8 KV heads of 128, SwiGLU 7168, 4 layers, V 32768)
    compiled for v5e, v6e and v5p topologies: FLOPs, arguments and tensor collectives within 0.1% of the closed form
    (the arguments' few hundred bytes over: the token ids' tile padding); the decode's peak within training's TPU band
    (10%) of decode_memory, the weights, the caches and the FP32 logits (XLA:TPU's peak counts on-chip VMEM too:
    tens of MB here, 1.3-1.4 of a 2048-token cache's arguments at batch 32). int8 weights: the arguments 1 B a
    parameter and the scales (weight_scale_bytes), and no BF16 copy of a weight in the peak. The prefill's peak within
    3% of prefill_memory in one of its two XLA:TPU forms, each a set of buffers read from XLA's buffer assignment: the
    softmax and p·v fused into W_o's matmul (its FP32 partial sums live beside the scores: 1.0072 at prompts of 2048
    on v5e, 1.2781 of the other form), or p·v written out first (1.0001 at 4096 on v5e, 0.8460 of the fused form;
    0.9921 on v6e's 4 heads a device)."""
    from scaling.families.transformer import TransformerConfig
    from verify.serve_check import check_serving

    r = check_serving(TransformerConfig(**LLAMA_SHAPED), devices, spec, batch, t_max, step, weights)
    assert len(r.terms) == 3
    for term in r.terms:
        assert r.ratio(term) == pytest.approx(1.0, abs=1e-3), (term, r.terms[term])
    if step == "decode":
        assert r.peak / r.peak_closed == pytest.approx(1.0, abs=0.1), (r.peak, r.peak_closed)
    else:
        assert min(abs(r.peak / r.peak_closed - 1), abs(r.peak / r.peak_unfused - 1)) < 0.03, \
            (r.peak, r.peak_closed, r.peak_unfused)


@pytest.mark.compiles
@pytest.mark.skipif(not has_cuda_plugin(), reason="needs jax's CUDA plugin (the cuda-aot extra)")
@pytest.mark.parametrize("step, batch, weights", [("decode", 32, "bf16"), ("decode", 32, "int8"),
                                                  ("prefill", 8, "bf16")])
def test_check_serving_on_h100(step, batch, weights):
    """The same on gpu:H100:8 (tensor=8), XLA's GPU compiler through the CUDA plugin (no GPU here: the attention
    materialized, cuDNN's needs one): every term within 0.1%; the decode's peak within 10% of decode_memory (with p·v
    written p first, XLA:GPU transposed every layer's v cache to [B, K, H, T] and back each step: 1.32; with W_q|W_k|W_v
    and W_in|W_gate concatenated as training does, it wrote them out each step, and a dequantized q·s weight before
    its GEMM: int8 1.106). The prefill's peak within 10% of prefill_memory's XLA:GPU form (the BF16 probabilities
    beside the FP32 scores, the all-reduce out of place; 1.0001 at 8 prompts of 2048)."""
    from scaling.families.transformer import TransformerConfig
    from verify.serve_check import check_serving

    r = check_serving(TransformerConfig(**LLAMA_SHAPED), "gpu:H100:8", "tensor=8", batch, 2048, step, weights)
    for term in r.terms:
        assert r.ratio(term) == pytest.approx(1.0, abs=1e-3), (term, r.terms[term])
    assert r.peak / r.peak_closed == pytest.approx(1.0, abs=0.1), (r.peak, r.peak_closed)


MOE_SHAPED = dict(experts=8, top_k=2, expert_d_ff=2048, capacity_factor=1.25)  # LLAMA_SHAPED's layers, every one MoE


@pytest.mark.parametrize("step, devices, spec, batch, t_max, shared, weights", [
    pytest.param("decode", "tpu:v5e:2x4", "tensor=8", 64, 8192, 0, "bf16", marks=pytest.mark.tpu),
    pytest.param("decode", "tpu:v6e:2x4", "data=2,tensor=4", 64, 8192, 1, "bf16", marks=pytest.mark.tpu),
    pytest.param("prefill", "tpu:v5e:2x4", "tensor=8", 8, 2048, 1, "bf16", marks=pytest.mark.tpu),
    pytest.param("prefill", "tpu:v6e:2x4", "data=2,tensor=4", 8, 2048, 0, "bf16", marks=pytest.mark.tpu),
    pytest.param("decode", "tpu:v6e:2x4", "data=2,tensor=4", 64, 8192, 1, "int8", marks=pytest.mark.tpu),
    pytest.param("prefill", "tpu:v5e:2x4", "tensor=8", 8, 2048, 1, "int8", marks=pytest.mark.tpu),
    pytest.param("decode", "gpu:H100:8", "tensor=8", 64, 8192, 0, "bf16", marks=pytest.mark.compiles),
    pytest.param("decode", "gpu:H100:8", "tensor=8", 64, 8192, 0, "int8", marks=pytest.mark.compiles),
    pytest.param("prefill", "gpu:H100:8", "tensor=8", 8, 2048, 0, "bf16", marks=pytest.mark.compiles)])
def test_check_moe_serving_compiled_ahead_of_time(step, devices, spec, batch, t_max, shared, weights):
    """The MoE transformer's decode step and prefill (LLAMA_SHAPED's attention, 4 MoE layers of 8 experts of F_e 2048,
    top-2, cf 1.25; some with a shared expert of 2048) compiled for v5e and v6e topologies and gpu:H100:8: FLOPs,
    arguments and tensor all-reduces within 0.1% of the closed forms (capacity_flops: a decode step's C = 1, 8 slots a
    token, its dispatch and combine elementwise; the routed form's all-reduces, the slots combined to the tokens before
    the layer's one), the decode's peak within 10% of decode_memory (1.0358 on v5e, 1.0606 on v6e with the shared
    expert, 1.0084 on the H100; XLA:TPU's counts VMEM). The prefill's peak within 3% of prefill_memory in one of its
    forms, read from XLA's live ranges: on v5e the attention's fused form (1.0064 with the shared expert; the experts'
    dispatch as large), on v6e the attention with p·v written out (0.9935), on the H100 the experts' combine (1.0001:
    the slots' and the tokens' FP32 sums, the combine weights in FP32, the attention's all-reduce still in flight).
    int8 weights (the experts' too, the routers BF16): the same terms exact with the scales in the arguments
    (MoEConfig.scale_channels); peaks 1.0321 (v6e decode), 1.0151 (v5e prefill), 1.0080 (H100 decode)."""
    if devices.startswith("gpu") and not has_cuda_plugin():
        pytest.skip("needs jax's CUDA plugin (the cuda-aot extra)")
    from scaling.families.moe import MoEConfig, MoESpec
    from scaling.families.transformer import TransformerConfig
    from verify.serve_check import check_serving

    cfg = MoEConfig(TransformerConfig(**LLAMA_SHAPED), MoESpec(**MOE_SHAPED, shared_experts=shared))
    r = check_serving(cfg, devices, spec, batch, t_max, step, weights)
    for term in r.terms:
        assert r.ratio(term) == pytest.approx(1.0, abs=1e-3), (term, r.terms[term])
    if step == "decode":
        assert r.peak / r.peak_closed == pytest.approx(1.0, abs=0.1), (r.peak, r.peak_closed)
    else:
        forms = [f for f in (r.peak_closed, r.peak_unfused) if f]
        assert min(abs(r.peak / f - 1) for f in forms) < 0.03, (r.peak, forms)


@pytest.mark.compiles
def test_serve_bench_runs_bf16_and_int8(tmp_path, monkeypatch):
    """verify.serve_bench (tools/gpu_serve.sh's device script) on this machine's CPU with a 2-layer model: a row for
    each case, BF16 and int8 weights, each measured and beside the closed form's prediction."""
    import json

    from verify import serve_bench

    monkeypatch.setattr(serve_bench, "MODELS", {"tiny": (64, 8, 4, 8, 256, 2, 512)})
    monkeypatch.setattr(serve_bench, "CASES", {"tiny": [(2, 16)]})
    monkeypatch.setattr(serve_bench, "INT8_CASES", {"tiny": [(2, 16)]})
    rows = serve_bench.run(str(tmp_path / "serve.json"), "H200")
    assert [r["weights"] for r in rows] == ["bf16", "int8"]
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in rows)
    assert json.loads((tmp_path / "serve.json").read_text()) == rows
