"""ffn_model.moe: routing and GShard's dispatch by hand, dropped tokens, the capacity form against the dropless one,
the sharded MoE stack's training against one device, and its dispatch and combine as all-to-alls over ``expert``."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ffn_model import moe
from ffn_model.task import teacher_batch
from ffn_model.train import make_optimizer, module_state_shardings
from mesh import make_mesh
from scaling.families.moe import MoESpec

D, F_E, E, K, L = 64, 128, 8, 2, 2  # the tiny stack of the numerics test; batch 8 sequences of 32 tokens
BATCH = (8, 32, D)
GROUPS = 8  # one group per sequence: one per device's batch shard on both sharded meshes, the same groups on one device
LR, STEPS = 1e-3, 3
MESHES = ["expert=4,data=2", "expert=2,tensor=2,data=2"]


def _layer_weights(key, spec: MoESpec, d: int, kind: str = "swiglu"):
    """One layer's weights as MoEStack draws them (without the layer axis)."""
    E_, F = spec.experts, spec.expert_d_ff
    ks = jax.random.split(key, 7)
    w = {"router": moe.init_normal(ks[0], (d, E_), d), "w_in": moe.init_normal(ks[1], (E_, F, d), d),
         "w_out": moe.init_normal(ks[2], (E_, F, d), F)}
    if kind == "swiglu":
        w["w_gate"] = moe.init_normal(ks[3], (E_, F, d), d)
    if spec.shared_experts:
        Fs = F * spec.shared_experts
        w["shared_in"] = moe.init_normal(ks[4], (Fs, d), d)
        w["shared_out"] = moe.init_normal(ks[5], (Fs, d), Fs)
        if kind == "swiglu":
            w["shared_gate"] = moe.init_normal(ks[6], (Fs, d), d)
    return w


# ------------------------------------------------------------------------------------------------------- routing


@pytest.mark.compiles
def test_softmax_routing_by_hand():
    # h = I (D = 4), so the logits are W_router's rows: log of small integers, whose softmax is the integers over
    # their sum. Top-2, renormalised over the two (Mixtral):
    #   t0 [4,2,1,1]/8  p = [.5, .25, .125, .125]  ids (0, 1)  gates (.5, .25)/.75  = (2/3, 1/3)
    #   t1 [1,1,6,2]/10 p = [.1, .1, .6, .2]       ids (2, 3)  gates (.6, .2)/.8    = (3/4, 1/4)
    #   t2 [1,3,1,5]/10 p = [.1, .3, .1, .5]       ids (3, 1)  gates (.5, .3)/.8    = (5/8, 3/8)
    #   t3 [2,1,1,4]/8  p = [.25, .125, .125, .5]  ids (3, 0)  gates (.5, .25)/.75  = (2/3, 1/3)
    # Aux (Switch eq. 4, f over the T·k = 8 pairs): pairs per expert e0 {t0, t3} 2, e1 {t0, t2} 2, e2 {t1} 1,
    # e3 {t1, t2, t3} 3 -> f = [2, 2, 1, 3]/8; P = mean p = [.95, .775, .95, 1.325]/4;
    # E·Σ f·P = 4·(2·.95 + 2·.775 + .95 + 3·1.325)/(8·4) = 8.375/8 = 1.046875, times the weight 0.01.
    counts = np.array([[4, 2, 1, 1], [1, 1, 6, 2], [1, 3, 1, 5], [2, 1, 1, 4]], np.float32)
    spec = MoESpec(experts=4, top_k=2, expert_d_ff=8, aux_loss_weight=0.01)
    gates, ids, aux = moe.route(jnp.eye(4, dtype=jnp.bfloat16), jnp.log(counts), spec)
    np.testing.assert_array_equal(np.asarray(ids), [[0, 1], [2, 3], [3, 1], [3, 0]])
    np.testing.assert_allclose(np.asarray(gates), [[2 / 3, 1 / 3], [3 / 4, 1 / 4], [5 / 8, 3 / 8], [2 / 3, 1 / 3]],
                               rtol=1e-6)
    np.testing.assert_allclose(float(aux), 0.01 * 1.046875, rtol=1e-6)


@pytest.mark.compiles
def test_sigmoid_routing_by_hand():
    # Sigmoid scores s chosen, logits log(s/(1-s)); top-2 of s, gates s/(sum of the two) (DeepSeek-V3 eq. 13-15):
    #   t0 s = [.8, .5, .2, .6]  ids (0, 3)  gates (.8, .6)/1.4 = (4/7, 3/7)
    #   t1 s = [.1, .9, .3, .3]  ids (1, 2)  gates (.9, .3)/1.2 = (3/4, 1/4)   (.3 tie: the lower index first)
    #   t2 s = [.5, .5, .5, .5]  ids (0, 1)  gates (1/2, 1/2)
    #   t3 s = [.2, .4, .6, .8]  ids (3, 2)  gates (.8, .6)/1.4 = (4/7, 3/7)
    # Aux: P = mean of s/Σs (DeepSeek-V3 eq. 19): Σs = 2.1, 1.6, 2, 2 ->
    #   P = ([.8,.5,.2,.6]/2.1 + [.1,.9,.3,.3]/1.6 + [.25]*4 + [.1,.2,.3,.4]) / 4;
    #   f: e0 {t0, t2}, e1 {t1, t2}, e2 {t1, t3}, e3 {t0, t3} -> 2/8 each; E·Σ f·P = 4·(1/4)·Σ P = 1 (Σ P = 1).
    s = np.array([[.8, .5, .2, .6], [.1, .9, .3, .3], [.5, .5, .5, .5], [.2, .4, .6, .8]], np.float64)
    spec = MoESpec(experts=4, top_k=2, expert_d_ff=8, router="sigmoid", aux_loss_weight=0.5)
    gates, ids, aux = moe.route(jnp.eye(4, dtype=jnp.bfloat16), jnp.asarray(np.log(s / (1 - s)), jnp.float32), spec)
    np.testing.assert_array_equal(np.asarray(ids), [[0, 3], [1, 2], [0, 1], [3, 2]])
    np.testing.assert_allclose(np.asarray(gates), [[4 / 7, 3 / 7], [3 / 4, 1 / 4], [.5, .5], [4 / 7, 3 / 7]], rtol=1e-5)
    np.testing.assert_allclose(float(aux), 0.5 * 1.0, rtol=1e-5)


@pytest.mark.compiles
def test_top_k_is_lax_top_k():
    scores = jax.random.normal(jax.random.key(3), (64, 8))
    scores = scores.at[0, 3].set(scores[0, 5])  # a tie
    for k in (1, 2, 3):
        v, i = moe.top_k(scores, k)
        v_ref, i_ref = jax.lax.top_k(scores, k)
        np.testing.assert_array_equal(np.asarray(i), np.asarray(i_ref))
        np.testing.assert_array_equal(np.asarray(v), np.asarray(v_ref))


# ------------------------------------------------------------------------------------------------------ capacity


@pytest.mark.compiles
def test_dispatch_priority_by_hand():
    # 3 tokens, k = 2, E = 2, C = 2 (GShard algorithm 2: every first choice before any second choice).
    # ids t0 (0, 1), t1 (0, 1), t2 (1, 0). First choices: t0 -> e0 slot 0, t1 -> e0 slot 1, t2 -> e1 slot 0.
    # Second choices: t0 -> e1 slot 1; t1 -> e1 slot 2 >= C: dropped; t2 -> e0 slot 2: dropped.
    gates = jnp.array([[.7, .3], [.6, .4], [.9, .1]], jnp.float32)
    ids = jnp.array([[0, 1], [0, 1], [1, 0]], jnp.int32)
    dispatch, combine = moe.dispatch_combine(gates, ids, experts=2, C=2)
    want = np.zeros((3, 2, 2), bool)
    want[0, 0, 0] = want[1, 0, 1] = want[2, 1, 0] = want[0, 1, 1] = True
    np.testing.assert_array_equal(np.asarray(dispatch), want)
    w = np.zeros((3, 2, 2), np.float32)
    w[0, 0, 0], w[1, 0, 1], w[2, 1, 0], w[0, 1, 1] = .7, .6, .9, .3
    np.testing.assert_array_equal(np.asarray(combine), w)


@pytest.mark.compiles
def test_tokens_past_capacity_are_dropped():
    # k = 1, E = 4, one group of S = 8 tokens, cf = 0.5: C = ceil(0.5·1·8/4) = 1. The router sends every token to
    # expert 0 (its column 8 larger, the inputs positive), which takes only the first: tokens 1..7 are dropped, their
    # MoE output exactly 0; token 0's is not.
    spec = MoESpec(experts=4, top_k=1, expert_d_ff=16, capacity_factor=0.5)
    assert moe.capacity(spec, 8) == 1
    w = _layer_weights(jax.random.key(0), spec, 8)
    w["router"] = jnp.zeros((8, 4), jnp.float32).at[:, 0].set(1.0)
    h = (jnp.abs(jax.random.normal(jax.random.key(1), (1, 8, 8))) + 1).astype(jnp.bfloat16)
    run = jax.jit(moe.moe_layer, static_argnums=(2, 3, 4))
    out, _ = run(h, w, spec, "swiglu", 1)
    out = np.asarray(out.astype(jnp.float32))
    assert np.all(out[0, 1:] == 0), out[0, 1:]
    assert np.any(out[0, 0] != 0)
    # with room for all (cf = E/k = 4: C = 8), none is dropped
    out_all, _ = run(h, w, MoESpec(experts=4, top_k=1, expert_d_ff=16, capacity_factor=4.0), "swiglu", 1)
    assert np.all(np.abs(np.asarray(out_all.astype(jnp.float32))).sum(-1) > 0)


@pytest.mark.compiles
@pytest.mark.parametrize("kind,router,shared", [("swiglu", "softmax", 0), ("gelu", "sigmoid", 1),
                                                ("relu", "softmax", 2)])
def test_capacity_without_drops_equals_dropless(kind, router, shared):
    # cf = E/k: C = ceil((E/k)·k·S/E) = S, every expert can take every token of its group: nothing drops, and the two
    # forms compute the same (token, expert) products. Both round the experts' matmul outputs to BF16 and sum the
    # k gated terms in FP32; the products' summation order may differ (einsum against ragged_dot), so the BF16
    # results may differ by a rounding: 2^-7 relative (two BF16 ulps), as the sharded FFN test allows.
    base = dict(experts=E, top_k=K, expert_d_ff=32, router=router, shared_experts=shared)
    dropless, padded = MoESpec(**base), MoESpec(**base, capacity_factor=E / K)
    w = _layer_weights(jax.random.key(2), dropless, D, kind)
    h = jax.random.normal(jax.random.key(3), (2, 16, D)).astype(jnp.bfloat16)
    run = jax.jit(moe.moe_layer, static_argnums=(2, 3, 4))
    got, aux = run(h, w, padded, kind, 2)
    want, aux_want = run(h, w, dropless, kind, None)
    f32 = lambda a: np.asarray(a.astype(jnp.float32))  # noqa: E731
    np.testing.assert_allclose(f32(got), f32(want), rtol=2**-7, atol=2**-7 * np.abs(f32(want)).mean())
    assert float(aux) == float(aux_want)


@pytest.mark.compiles
def test_megablox_grouped_matmul_equals_ragged_dot():
    """A TPU's dropless layer (megablox's gmm, ffn_model.moe._grouped_tpu, here in Pallas's interpret mode on the CPU)
    computes what jax.lax.ragged_dot does, forward and the gradients of the input and the weights: 256 routed rows of
    a layer's S·k pairs sorted into 4 experts' groups (the last 32 another device's, not run: zero), w_in as stored
    [E, F_e, D] (the kernel's transpose_rhs) and w_out [E, F_e, D] as the second matmul takes it. Both round to BF16
    and sum in FP32 in another order: 2^-7 relative, as test_capacity_without_drops_equals_dropless allows."""
    sizes = jnp.array([64, 32, 96, 32], jnp.int32)  # 224 of 256 rows; the other 32 another device's
    x = jax.random.normal(jax.random.key(0), (256, 128)).astype(jnp.bfloat16)
    w_in = (jax.random.normal(jax.random.key(1), (4, 256, 128)) / 12).astype(jnp.bfloat16)  # [E, F_e, D]
    w_out = (jax.random.normal(jax.random.key(2), (4, 256, 128)) / 16).astype(jnp.bfloat16)

    def f(grouped, x, w_in, w_out):
        return grouped(jax.nn.silu(grouped(x, w_in, sizes, True)), w_out, sizes, False)

    tpu = functools.partial(moe._grouped_tpu, interpret=True)
    f32 = lambda a: np.asarray(jnp.asarray(a, jnp.float32))  # noqa: E731
    got, want = f(tpu, x, w_in, w_out), f(moe._grouped_ragged, x, w_in, w_out)
    assert not np.any(f32(got)[224:]) and not np.any(f32(want)[224:])
    np.testing.assert_allclose(f32(got), f32(want), rtol=2**-7, atol=2**-7 * np.abs(f32(want)).mean())
    loss = lambda grouped: lambda *a: jnp.sum(f(grouped, *a).astype(jnp.float32) ** 2)  # noqa: E731
    for g, h in zip(jax.grad(loss(tpu), argnums=(0, 1, 2))(x, w_in, w_out),
                    jax.grad(loss(moe._grouped_ragged), argnums=(0, 1, 2))(x, w_in, w_out)):
        np.testing.assert_allclose(f32(g), f32(h), rtol=2**-7, atol=2**-7 * np.abs(f32(h)).mean())


def test_bad_inputs_are_value_errors():
    spec = MoESpec(experts=4, top_k=2, expert_d_ff=8)
    with pytest.raises(ValueError, match="MoE layers only"):
        moe.MoEStack(8, 2, MoESpec(experts=4, top_k=2, expert_d_ff=8, moe_every=2), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="mlp"):
        moe.MoEStack(8, 2, spec, mlp="tanh", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="unknown mesh axis 'experts'"):
        make_mesh("experts=8", "cpu:8")
    w = _layer_weights(jax.random.key(0), spec, 8)
    h = jnp.zeros((4, 2, 8), jnp.bfloat16)
    mesh = make_mesh("expert=2", jax.devices()[:2])
    capped = MoESpec(experts=4, top_k=2, expert_d_ff=8, capacity_factor=1.0)
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="groups=3"):
        jax.eval_shape(lambda h, w: moe.moe_layer(h, w, capped, groups=3), h, w)


# ------------------------------------------------------------------------------------------- sharded training


FORMS = {"capacity": MoESpec(experts=E, top_k=K, expert_d_ff=F_E, capacity_factor=1.25),  # C = ceil(1.25·2·32/8) = 10
         "dropless": MoESpec(experts=E, top_k=K, expert_d_ff=F_E)}
CASES = [(m, "capacity") for m in MESHES] + [("expert=2,tensor=2,data=2", "dropless")]


@functools.cache
def _train(mesh_spec: str, form: str):
    """(losses, final params as numpy, the compiled train step's HLO, the mesh) of STEPS AdamW steps of the tiny MoE
    stack with FORMS[form] on ``mesh_spec`` over the 8 devices ("": one device)."""
    mesh = make_mesh(mesh_spec or "fsdp=1", jax.devices() if mesh_spec else jax.devices()[:1])

    def model():
        return moe.MoEStack(D, L, FORMS[form], groups=GROUPS, rngs=nnx.Rngs(0))

    tx = make_optimizer(LR)
    state = moe.init_state(model, mesh, tx)
    step = moe.make_train_step(model, mesh, tx)
    sharding = moe.batch_sharding(mesh)
    batch = teacher_batch(BATCH, D, seed=0)
    losses = []
    with jax.set_mesh(mesh):
        hlo = step.lower(state, jax.device_put(batch(0), sharding)).compile().as_text()
        for i in range(STEPS):
            state, loss = step(state, jax.device_put(batch(i), sharding))
            losses.append(float(loss))
    specs = {n: a.sharding.spec for n, a in state["params"].items()}
    return losses, jax.tree.map(np.asarray, state["params"]), hlo, mesh, specs


@pytest.mark.numerics
@pytest.mark.parametrize("mesh_spec,form", CASES)
def test_sharded_training_matches_one_device(mesh_spec, form):
    ref_losses, ref_params, *_ = _train("", form)
    losses, params, _, _, specs = _train(mesh_spec, form)
    # The tolerances of tests/test_ffn_model.py::test_sharded_training_matches_one_device: sharding changes the order
    # of reductions only (partial sums over tensor, gradient sums over data and expert), each rounding in BF16
    # (2^-8 relative): the loss, a mean over B·T·D squared errors, within 2^-7 relative; a parameter within
    # 2·steps·lr (Adam's update of a gradient near zero can change sign), on average within 0.05·lr.
    np.testing.assert_allclose(losses, ref_losses, rtol=2**-7)
    for name, ref in ref_params.items():
        got = params[name]
        assert got.dtype == np.float32 and got.shape == ref.shape
        diff = np.abs(got - ref)
        assert diff.max() <= 2 * STEPS * LR, (name, diff.max())
        assert diff.mean() <= 0.05 * LR, (name, diff.mean())
    # the expert weights [L, E, F_e, D] keep E over expert (and F_e over tensor)
    assert specs["w_in"] == jax.sharding.PartitionSpec("stage", "expert", "tensor", "fsdp")


def _replica_groups(line: str) -> set[frozenset[int]]:
    """The device groups of a collective's replica_groups: explicit {{0,1},{2,3}}, iota [G,S]<=[dims]T(perm), or
    Shardy's mesh['axis_0'=a,...] {'axis_i',...} (the device ids laid out row-major on the axes, a group along the
    named ones)."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line)
    if m:
        names = re.findall(r"'(\w+)'=(\d+)", m.group(1))
        along = re.findall(r"'(\w+)'", m.group(2))
        ids = np.arange(math.prod(int(n) for _, n in names)).reshape([int(n) for _, n in names])
        pos = [[a for a, _ in names].index(a) for a in along]
        ids = np.moveaxis(ids, pos, list(range(ids.ndim - len(pos), ids.ndim)))
        return {frozenset(g) for g in ids.reshape(-1, math.prod(ids.shape[ids.ndim - len(pos):])).tolist()}
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        dims = [int(d) for d in m.group(3).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(4):
            ids = ids.transpose([int(p) for p in m.group(4).split(",")])
        return {frozenset(g) for g in ids.reshape(int(m.group(1)), int(m.group(2))).tolist()}
    m = re.search(r"replica_groups=\{(\{[\d,{} ]*\})\}", line)
    return {frozenset(int(i) for i in g.split(",")) for g in re.findall(r"\{([\d,]+)\}", m.group(1))}


def _axis_groups(mesh, axis: str) -> set[frozenset[int]]:
    """The device groups (positions in the mesh's device order, as the compiled program numbers them) along
    ``axis``."""
    ids = np.arange(mesh.devices.size).reshape(mesh.devices.shape)
    return {frozenset(g) for g in np.moveaxis(ids, mesh.axis_names.index(axis), -1).reshape(-1, mesh.shape[axis])
            .tolist()}


def _ops(hlo: str, op: str) -> list[str]:
    return [line for line in hlo.splitlines() if re.search(rf"= .+ {op}(-start)?\(", line)]


def _shapes(line: str, op: str) -> list[tuple[int, ...]]:
    """The shapes of a collective's results."""
    return [tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\[([0-9,]*)\]", line.split(
        f" {op}(")[0])]


def _holds_experts(shape) -> bool:
    """Whether an array of ``shape`` holds the E experts' weights (E before a last dimension D)."""
    return E in shape[:-1] and shape[-1] == D


@pytest.mark.compiles
@pytest.mark.parametrize("mesh_spec", MESHES)
def test_dispatch_and_combine_are_all_to_all_over_expert(mesh_spec):
    *_, hlo, mesh, _ = _train(mesh_spec, "capacity")
    expert = _axis_groups(mesh, "expert")
    a2a = _ops(hlo, "all-to-all")
    # forward: the dispatch and the combine, backward: their transposes, each once in the scanned layer body
    assert len(a2a) >= 4, len(a2a)
    for line in a2a:
        assert _replica_groups(line) == expert, line
    # no all-gather over expert: the expert weights stay split, never gathered (nor the tokens' router scores)
    for line in _ops(hlo, "all-gather"):
        assert _replica_groups(line) != expert, line
        assert not any(_holds_experts(s) for s in _shapes(line, "all-gather")), line


@pytest.mark.compiles
def test_dropless_gathers_tokens_not_experts():
    # Dropless over expert (Megatron-LM's all-gather dispatcher): the tokens, gates and ids all-gathered over expert,
    # the outputs reduce-scattered back; the expert weights never move over expert
    *_, hlo, mesh, _ = _train("expert=2,tensor=2,data=2", "dropless")
    expert = _axis_groups(mesh, "expert")
    gathers = [line for line in _ops(hlo, "all-gather") if _replica_groups(line) == expert]
    assert len(gathers) >= 3 and _ops(hlo, "reduce-scatter"), len(gathers)
    for op in ("all-gather", "all-to-all", "collective-permute"):
        for line in _ops(hlo, op):
            assert not any(_holds_experts(s) for s in _shapes(line, op)), line


def test_parameters_on_a_mesh_of_expert_1():
    # a dense mesh of mesh.make_mesh (expert=1): E over the expert axis of 1 is not split (each device holds all E = 8
    # experts), F_e = 128 over tensor = 2 (64 a device), D = 64 over fsdp = 1; the stacks' logical axes are the same
    mesh = make_mesh("data=4,tensor=2", "cpu:8")
    spec = MoESpec(experts=E, top_k=K, expert_d_ff=F_E, capacity_factor=1.0)
    _, shardings = module_state_shardings(lambda: moe.MoEStack(D, L, spec, rngs=nnx.Rngs(0)), mesh, make_optimizer())
    w_in = shardings["params"]["w_in"]
    assert w_in.spec == jax.sharding.PartitionSpec("stage", "expert", "tensor", "fsdp")
    assert w_in.shard_shape((L, E, F_E, D)) == (2, 8, 64, 64)
    assert shardings["opt"][0].mu["w_out"].spec == jax.sharding.PartitionSpec("stage", "expert", "tensor", "fsdp")
    # on expert=4: E split 4 ways (2 experts a device)
    split = module_state_shardings(lambda: moe.MoEStack(D, L, spec, rngs=nnx.Rngs(0)), make_mesh("expert=4,data=2",
                                                                                             "cpu:8"), make_optimizer())
    assert split[1]["params"]["w_in"].shard_shape((L, E, F_E, D)) == (2, 2, 128, 64)


@pytest.mark.compiles
@pytest.mark.parametrize("mesh_spec", MESHES)
def test_all_to_all_bytes_are_the_closed_forms(mesh_spec):
    """The compiled train step's all-to-all bytes over expert, as verify.hlo reads every collective (V × count per
    axis), against scaling.families.moe.all_to_all_bytes' train_volume (dispatch and combine, forward and backward)
    times the L MoE layers, with c = 4: XLA:CPU moves BF16 collectives as F32
    (scaling.families.transformer.ring_permute_bytes says the same of the ring's permutes). By hand for expert=4,data=2:
    t = 256/(2·4) = 32 tokens a device, one group, C = ceil(1.25·2·32/8) = 10, V = 4·8·10·64 = 20,480 B an all-to-all, 4
    a layer, 2 layers: 163,840 B."""
    from scaling.families.moe import MoEConfig, all_to_all_bytes
    from scaling.families.transformer import TransformerConfig
    from verify.hlo import collective_bytes, parse_hlo

    *_, hlo, mesh, _ = _train(mesh_spec, "capacity")
    axes = dict(zip(mesh.axis_names, mesh.devices.shape))
    compiled = collective_bytes(parse_hlo(hlo).collectives(axes))["by_axis"]
    base = TransformerConfig(d_model=D, heads=4, d_ff=F_E, blocks=L, seq_len=BATCH[1], mlp="swiglu")
    cfg = MoEConfig(base, FORMS["capacity"])
    closed = L * all_to_all_bytes(cfg, axes, BATCH[0] * BATCH[1], c=4)["train_volume"]
    assert compiled.get("expert") == pytest.approx(closed, rel=0.02), (compiled, closed)
    if mesh_spec == "expert=4,data=2":
        assert closed == 163_840
