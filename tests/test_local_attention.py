"""Local (sliding-window) attention, issue 37 item 7: the window in the kernels against a band mask written here,
the local/global stack training like one device (materialized and flash, fsdp·tensor and Ulysses context=2), the
closed forms' shares by hand, the compiled FLOPs, arguments and collectives in their bands on 8 CPU devices and
on v5p:2x2x2, the presets with windows predicted, and bad windows as one error line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ffn_model.attention import attention_materialized, flash_attention_o
from ffn_model.train import train
from jax_scaling.cli import main
from mesh import make_mesh
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import get_preset
from scaling.core.schedule import Schedule
from scaling.families.transformer import TransformerConfig, attention_shares
from scaling.core.workload import Workload
from tests.helpers import assert_matches, assert_one_error_line, one_device
from verify.check import check, grid_workload
from verify.grids import CPU_LOCAL_ATTENTION_GRID, TPU_LOCAL_ATTENTION_GRID

# the tolerances of tests/test_attention.py (its module docstring derives them from BF16's roundings)
FWD_ATOL, GRAD_RTOL = 2e-2, 2e-2
B_, T_, N_, K_, H_ = 2, 64, 4, 2, 16


def _band_reference(q, k, v, window):
    """FP32 softmax attention with the band written out: query t sees key s iff 0 <= t - s < window."""
    G = q.shape[2] // k.shape[2]
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    t, u = np.arange(q.shape[1])[:, None], np.arange(k.shape[1])[None, :]
    band = np.array([[0 <= ti - ui < window for ui in u[0]] for ti in t[:, 0]])  # by enumeration, no shortcut
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(jnp.where(band, s, -jnp.inf), axis=-1), v)


@pytest.mark.compiles
@pytest.mark.parametrize("kernel, block, window", [
    ("materialized", None, 20),
    ("flash", 8, 20),    # c = ceil(19/8) = 3: 4 of 8 key blocks per query block (the banded form)
    ("flash", 16, 17),   # c = 1: the window ends on a block boundary, 2 of 4 blocks
    ("flash", 16, 1),    # c = 0: each query sees itself only
    ("flash", 16, 60),   # c = 4 >= 4 blocks - 1: every block run, masked
])
def test_window_equals_a_band_mask(kernel, block, window):
    """Forward and gradients of each kernel with a window against _band_reference, within tests/test_attention.py's
    tolerances; the causal (no window) output differs from the band's by far more (a wrong mask fails)."""
    kq, kk, kv, kw = jax.random.split(jax.random.key(1), 4)
    q = jax.random.normal(kq, (B_, T_, N_, H_)).astype(jnp.bfloat16)
    k = jax.random.normal(kk, (B_, T_, K_, H_)).astype(jnp.bfloat16)
    v = jax.random.normal(kv, (B_, T_, K_, H_)).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (B_, T_, N_, H_))
    pos = jnp.arange(T_, dtype=jnp.int32)
    if kernel == "materialized":
        def attend(q, k, v):
            return attention_materialized(q, k, v, pos, pos, window)
    else:
        def attend(q, k, v):
            return flash_attention_o(q, k, v, pos, pos, block, window)

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * w)

    want = _band_reference(q, k, v, window)
    got = jax.jit(attend)(q, k, v).astype(jnp.float32)
    np.testing.assert_allclose(got, want, atol=FWD_ATOL)
    causal = attention_materialized(q, k, v, pos, pos).astype(jnp.float32)
    assert window >= T_ or float(jnp.max(jnp.abs(causal - want))) > 10 * FWD_ATOL
    grads = jax.jit(jax.grad(loss(attend), argnums=(0, 1, 2)))(q, k, v)
    ref = jax.jit(jax.grad(loss(lambda q, k, v: _band_reference(q, k, v, window)), argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(grads, ref):
        scale = float(jnp.max(jnp.abs(r)))  # 0 for dq at W = 1 (one visible key: softmax is constant)
        np.testing.assert_allclose(g.astype(jnp.float32), r, atol=GRAD_RTOL * scale + 1e-5)


def test_layer_windows_and_shares_by_hand():
    """Which layers are local (Gemma 2: the first local, then alternating; Gemma 3's 5:1: every sixth global;
    Mistral: all), and attention_shares on the CPU grid's row (T = 256, W = 64, flash blocks b = 32, 1:1):
    a local layer's band c = ceil(63/32) = 2, 3 blocks of 32 of 256 keys: 0.375, the stack (1 + 0.375)/2 =
    0.6875; pairs kept 256·64 − 64·63/2 = 14,368 of T²/2 = 32,768: (1 + 0.438477)/2 = 0.719238; timed,
    a global flash layer (nb + 1)/(2·nb) = 9/16 with nb = 8: (0.5625 + 0.375)/2 = 0.46875. Materialized runs
    every pair: executed 1."""
    g2 = get_preset("gemma-2-9b")
    assert g2.layer_windows[:4] == (4096, None, 4096, None) and len(g2.layer_windows) == 42
    g3 = get_preset("tiny-tf").replace(blocks=12, window=16, global_every=6)
    assert [i for i, w in enumerate(g3.layer_windows) if w is None] == [5, 11]
    assert set(get_preset("mistral-7b").layer_windows) == {4096}
    assert set(get_preset("tiny-tf").replace(window=64).layer_windows) == {None}  # W >= T: global
    cfg = get_preset("small-tf").replace(window=64, global_every=2)
    mesh = parse_mesh_spec("fsdp=2,tensor=4")
    executed, kept, timed = attention_shares(cfg, Schedule(attention="flash", attention_block=32), mesh)
    assert executed == pytest.approx(0.6875) and kept == pytest.approx(0.719238, rel=1e-5)
    assert timed == pytest.approx(0.46875)
    assert attention_shares(cfg, Schedule(), mesh)[0] == 1.0
    assert attention_shares(get_preset("small-tf"), Schedule(), mesh) == (1.0, 1.0, None)


def test_windowed_flash_flops_shrink():
    """The closed form's step FLOPs of the grid's flash row against the same model with every layer global: the
    attention's matmuls (4 + 10 units of s·T²·N·H/(Y·C) per layer, s = 16/2 sequences, T = 256, N/Y = 2, H = 32:
    14·8·256²·2·32 = 469,762,048 per layer) shrink by 1 − 0.6875 of that over 4 layers: 587,202,560 FLOPs."""
    from scaling.step.program import predict  # noqa: F401  (the step model the check compares)
    from scaling.families.transformer import step_flops
    row = CPU_LOCAL_ATTENTION_GRID[0]
    local = step_flops(grid_workload(*row))["total"]
    glob = step_flops(grid_workload(get_preset("small-tf"), *row[1:]))["total"]
    assert glob - local == pytest.approx(4 * 469_762_048 * (1 - 0.6875), rel=1e-9)


def test_bad_windows_are_one_error_line(capsys):
    """--window 0, --global-every 0, and a window with ring attention or with stages: one line, exit 2."""
    base = "predict --preset mistral-7b --chip v5p --chips 64 --global-batch 512"
    for argv, match in [(f"{base} --mesh fsdp=64 --window 0", r"--window must be a positive integer, got 0"),
                        (f"{base} --mesh fsdp=64 --global-every 0", r"--global-every must be a positive integer"),
                        (f"{base} --mesh fsdp=32,context=2 --context-strategy ring",
                         r"window \(local attention\) runs with context ulysses, not ring"),
                        (f"{base} --mesh stage=2,fsdp=32 --microbatches 4",
                         r"window \(local attention\) runs without pipeline stages")]:
        assert_one_error_line(main(argv.split()), *capsys.readouterr(), match)
    with pytest.raises(ValueError, match="global_every needs a window"):
        TransformerConfig(d_model=64, heads=8, d_ff=256, blocks=2, seq_len=64, global_every=2)


def test_gemma3_12b_parameters_are_the_papers():
    """Gemma 3 12B (Gemma Team 2025, arXiv:2503.19786, table 1): 10,759M non-embedding parameters and 1,012M embedding
    ones; the preset's layers (norm scales aside, which the paper counts) within 0.5% of the first, its embedding
    262,144 x 3840 = 1,006.6M within 1% of the second (the table's vocabulary is Gemma 3's 262k plus special
    tokens); layers 6, 12, ... global, the others local over 1024 tokens."""
    from scaling.families.presets import get_preset as preset

    g = preset("gemma3-12b")
    embedding = g.vocab * g.d_model
    assert g.params - embedding == pytest.approx(10_759e6, rel=0.005)
    assert embedding == pytest.approx(1_012e6, rel=0.01)
    assert [i for i, w in enumerate(g.layer_windows) if w is None] == list(range(5, 48, 6))
    assert set(g.layer_windows) == {1024, None}


@pytest.mark.parametrize("preset", ["gemma-2-9b", "gemma3-12b"])
def test_local_and_global_presets_plan(preset, capsys):
    """plan over the planner's meshes with local and global layers mixed: the group's held gradient shards are an
    array over the meshes (a plan on v6e-256 raised "truth value of an array" before)."""
    assert main(f"plan --preset {preset} --slice v6e-256 --top 1".split()) == 0
    assert "fit" in capsys.readouterr().out


@pytest.mark.parametrize("preset", ["mistral-7b", "gemma-2-9b"])
def test_presets_predict(preset, capsys):
    """predict with a window preset: exit 0, the header names the window."""
    argv = f"predict --preset {preset} --chip v5p --chips 64 --mesh fsdp=64 --global-batch 512 --attention flash"
    assert main(argv.split()) == 0
    out = capsys.readouterr().out
    assert "W=4,096" in out and "step:" in out


# numerics: 4 layers, local (W = 16 of T = 64) and global alternating; the one-device run the same model
LOCAL_TF = get_preset("tiny-tf").replace(kv_heads=4, blocks=4, window=16, global_every=2)
B = 4 * LOCAL_TF.seq_len
STEPS, LR = 3, 1e-3


@pytest.fixture(scope="module")
def local_one_device():
    return one_device(LOCAL_TF, B)


# flash blocks of 8: a local layer's band is c + 1 = ceil(15/8) + 1 = 3 of 8 blocks
NUMERICS = [
    ("fsdp=2,tensor=2", Schedule(attention="flash", attention_block=8)),
    ("fsdp=2,tensor=2", Schedule()),
    ("context=2", Schedule(context="ulysses", attention="flash", attention_block=8)),
    ("context=2,tensor=2", Schedule(context="ulysses")),
]


@pytest.mark.numerics
@pytest.mark.parametrize("spec, schedule", NUMERICS, ids=[f"{s}-{k.attention}" for s, k in NUMERICS])
def test_local_stack_matches_one_device(local_one_device, spec, schedule):
    """3 AdamW steps within tests/test_pipeline.py's assert_matches of one device (materialized, the same window)."""
    mesh = make_mesh(spec, jax.devices()[: parse_mesh_spec(spec).devices])
    losses, state = train(Workload(LOCAL_TF, parse_mesh_spec(spec), B, schedule=schedule), mesh, STEPS, lr=LR,
                          return_state=True)
    assert_matches(losses, state["params"], local_one_device)
    assert losses[-1] < losses[0]


def _bands(rep):
    assert 0.98 <= rep.flops.matmul.ratio <= 1.02, rep.flops.matmul
    assert 0.98 <= rep.memory.arguments.ratio <= 1.02, rep.memory.arguments
    assert 0.98 <= rep.collectives.total_bytes.ratio <= 1.02, rep.collectives.total_bytes
    for axis, row in rep.collectives.by_axis.items():
        assert 0.98 <= row.ratio <= 1.02, (axis, row)


@pytest.mark.grid
@pytest.mark.parametrize("row", CPU_LOCAL_ATTENTION_GRID,
                         ids=[f"{r[1]}-{r[5].attention}" for r in CPU_LOCAL_ATTENTION_GRID])
def test_cpu_local_attention_grid(row):
    """The interleaved local/global stack on 8 CPU devices: FLOPs (the band's blocks only, under flash),
    arguments and collectives per axis within ±2%."""
    rep = check(grid_workload(*row), "cpu:8")
    _bands(rep)
    assert set(rep.collectives.by_axis) >= {a for a, n in parse_mesh_spec(row[1]).items() if n > 1 and a != "data"}


@pytest.mark.grid
@pytest.mark.tpu
@pytest.mark.parametrize("row", TPU_LOCAL_ATTENTION_GRID, ids=[r[2] for r in TPU_LOCAL_ATTENTION_GRID])
def test_tpu_local_attention_grid(row):
    """v5p:2x2x2 ahead of time: FLOPs (1.9963e13: the two local layers' attention 2 x 14 units x 4·4096²·8·128
    x (1 − 3·512/4096) = 1.2025e12 below the same stack all global, 2.1166e13, by hand and compiled), arguments
    and collectives per axis within their bands. The peak: tests/test_local_peak.py (6.114 GB against 5.945, 1.028;
    it was 7.664 against 5.857 when this row was added)."""
    rep = check(grid_workload(*row[1:]), row[0])
    _bands(rep)
