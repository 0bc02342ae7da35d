"""The serving programs (ffn_model.serve) on emulated CPU devices: a decode step's logits are the training forward's at
the same position (the KV cache path computes what the training layer computes), and greedy generation on 8 devices
(data=2, tensor=4) is token for token one device's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers import TINY_TF, mesh_of

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
def test_generation_on_8_devices_is_one_devices():
    """Greedy generation of 6 tokens after a 12-token prompt on data=2,tensor=4 (heads, KV heads, d_ff and the
    vocabulary over tensor, the sequences over data) equals the same weights' generation on one device, token for
    token."""
    from ffn_model import serve

    ids = _ids()[:, :PROMPT]
    mesh, params = _params("data=2,tensor=4")
    with jax.set_mesh(mesh):
        sw = jax.jit(serve.serving_weights)(params)
        many = np.asarray(serve.generate(sw, jax.device_put(ids), STEPS, mlp_kind=CFG.mlp))
    host = jax.tree.map(np.asarray, sw)
    one_dev = jax.devices()[0]
    one = np.asarray(serve.generate(jax.device_put(host, one_dev), jax.device_put(ids, one_dev), STEPS,
                                    mlp_kind=CFG.mlp))
    assert many.shape == (BATCH, STEPS)
    np.testing.assert_array_equal(many, one)


def test_refusals():
    from ffn_model import serve
    from scaling.families.presets import PRESETS

    with pytest.raises(ValueError, match="vocabulary"):
        serve.check_servable(TINY_TF)
    with pytest.raises(ValueError, match="transformer"):
        serve.check_servable(PRESETS["mixtral-8x7b"])
    serve.check_servable(CFG)
