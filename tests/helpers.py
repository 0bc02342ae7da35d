"""What several test modules share (no test module imports another): the numerics tolerance and the one-device
references it compares against (one per model, cached on disk for the run: tests/conftest.py sets the folder), the
check bands, the one-line refusal."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import pickle
import re
import time

import numpy as np

from scaling.families.presets import get_preset
from scaling.core.schedule import Schedule

# 3 AdamW steps at lr 1e-3: every numerics test's run
STEPS, LR = 3, 1e-3
# the numerics tests' transformers: D=64, 8 query heads of 8, 4 key/value heads (grouped-query), F=256, 2 layers,
# T=64 (Ulysses on context·tensor = 4 splits both head counts, ring on context=4 gives chunks of 16 tokens); the
# pipelines' 8 layers with a 512-token vocabulary; 4 sequences a batch
TINY_TF = get_preset("tiny-tf").replace(kv_heads=4)
PIPE_TF = TINY_TF.replace(blocks=8, vocab=512)
TF_BATCH = 4 * TINY_TF.seq_len
REFERENCE_CACHE_ENV = "TESTS_REFERENCE_CACHE"


def mesh_of(spec: str):
    """The jax Mesh of ``spec`` on the first of the 8 emulated devices (as many as its axes multiply to)."""
    import jax

    from mesh import make_mesh
    from scaling.core.mesh_shape import parse_mesh_spec

    return make_mesh(spec, jax.devices()[: parse_mesh_spec(spec).devices])


def run_steps(cfg, spec: str, batch_tokens: int, schedule: Schedule = Schedule(), remat: str = "none",
              steps: int = STEPS, lr: float = LR):
    """(losses, parameters as numpy arrays) of ``steps`` AdamW steps of ``cfg`` on the mesh ``spec``."""
    import jax

    from ffn_model.train import train
    from mesh import mesh_shape
    from scaling.core.workload import Workload

    m = mesh_of(spec)
    losses, state = train(Workload(cfg, mesh_shape(m), batch_tokens, remat=remat, schedule=schedule), m, steps,
                          lr=lr, return_state=True)
    return losses, jax.tree.map(np.asarray, state["params"])


_MEMO: dict = {}


def one_device(cfg, batch_tokens: int, schedule: Schedule = Schedule(), steps: int = STEPS, lr: float = LR):
    """The one-device reference of a numerics test: ``run_steps`` on mesh fsdp=1, made once per run for all of
    pytest-xdist's workers (a pickle in $TESTS_REFERENCE_CACHE, written under a file lock: the second worker waits
    for the first's instead of training the same model again), and kept in memory per process."""
    key = hashlib.sha256(repr((cfg, batch_tokens, schedule, steps, lr)).encode()).hexdigest()[:24]
    if key in _MEMO:
        return _MEMO[key]
    folder = os.environ.get(REFERENCE_CACHE_ENV)
    if not folder:
        _MEMO[key] = run_steps(cfg, "fsdp=1", batch_tokens, schedule, steps=steps, lr=lr)
        return _MEMO[key]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{key}.pkl")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):
            with open(path, "rb") as f:
                ref = pickle.load(f)
        else:
            ref = run_steps(cfg, "fsdp=1", batch_tokens, schedule, steps=steps, lr=lr)
            with open(path + ".tmp", "wb") as f:
                pickle.dump((list(map(float, ref[0])), dict(ref[1])), f)
            os.replace(path + ".tmp", path)
    _MEMO[key] = ref
    return ref


def assert_matches(got_losses, got_params, ref, steps: int = STEPS, lr: float = LR):
    """Sharded training within rounding of one device. Sharding changes only the order of reductions (partial sums
    over tensor, gradient sums over data·fsdp), each of which may round differently in BF16 (relative step 2^-8); the
    loss is a mean over many squared errors, so those roundings mostly average out: losses within 2^-7 relative
    (two BF16 ulps; measured <= 3e-4 on XLA:CPU). Adam divides each gradient by its own magnitude, so a gradient
    element near zero can change sign under another rounding and its update by up to 2·lr a step: every parameter
    within 2·steps·lr, on average within 0.05·lr."""
    ref_losses, ref_params = ref
    np.testing.assert_allclose(got_losses, ref_losses, rtol=2**-7)
    for name, want in ref_params.items():
        got = np.asarray(got_params[name])
        assert got.dtype == np.float32 and got.shape == want.shape
        diff = np.abs(got - want)
        assert diff.max() <= 2 * steps * lr, (name, diff.max())
        assert diff.mean() <= 0.05 * lr, (name, diff.mean())


def assert_bands(rep):
    """The check bands (verify.check): matmul FLOPs and argument memory within [0.99, 1.01], collective bytes (total
    and per mesh axis) within [0.98, 1.02], and every mesh axis of size > 1 moving bytes (data only in a train step)."""
    assert 0.99 <= rep.flops.matmul.ratio <= 1.01, rep.flops.matmul
    assert 0.99 <= rep.memory.arguments.ratio <= 1.01, rep.memory.arguments
    col = rep.collectives
    assert 0.98 <= col.total_bytes.ratio <= 1.02, col.total_bytes
    for axis, size in rep.config.mesh.items():
        if size > 1 and (axis != "data" or rep.config.step == "train"):
            assert any(axis in key.split("+") for key in col.by_axis), (axis, col.by_axis.keys())
    for axis, row in col.by_axis.items():
        assert 0.98 <= row.ratio <= 1.02, (axis, row)


def assert_tpu_bands(rep):
    """Every band, and the compiler's peak within 10%."""
    assert_bands(rep)
    assert 0.90 <= rep.memory.peak.ratio <= 1.10, rep.memory.peak


def assert_one_error_line(code, out, err, match):
    """A refusal as the package refuses: exit 2, nothing on stdout, one `error: ...` line (matching ``match``, a
    regular expression) and no traceback on stderr."""
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert re.search(match, lines[0]), (match, lines[0])


# Attention's tolerances (tests/test_attention.py's docstring derives them from BF16's 2^-9 rounding): forward atol on
# unit-scale outputs, the log-sum-exp's atol, gradients as a share of max|reference gradient|
FWD_ATOL, LSE_ATOL, GRAD_RTOL = 2e-2, 1e-4, 2e-2


def reference_attention(q, k, v, q_pos=None, k_pos=None):
    """FP32 causal softmax attention, kv heads repeated G times (query head n uses kv head n // G): (o, lse)."""
    import jax
    import jax.numpy as jnp

    T = q.shape[1]
    q_pos = jnp.arange(T, dtype=jnp.int32) if q_pos is None else q_pos
    k_pos = jnp.arange(k.shape[1], dtype=jnp.int32) if k_pos is None else k_pos
    G = q.shape[2] // k.shape[2]
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q, k) * q.shape[-1] ** -0.5
    s = jnp.where(k_pos[None, :] <= q_pos[:, None], s, -jnp.inf)
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-1), v), jax.nn.logsumexp(s, axis=-1)


def attention_loss(attend, w):
    """The loss sum(attend(q, k, v) · w) in FP32: w is the fixed cotangent the gradients are checked under."""
    import jax.numpy as jnp

    return lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32) * w)


def rows(grid, quick=(), marks=()):
    """A check grid's rows as pytest.params: every row with ``marks``, the rows at the positions ``quick`` also marked
    quick (kept in make test: the smallest compiled comparison of a term; tests/test_tiers.py holds the coverage)."""
    import pytest

    assert all(0 <= i < len(grid) for i in quick), (quick, len(grid))
    return [pytest.param(*row, marks=[*marks, *([pytest.mark.quick] if i in quick else [])])
            for i, row in enumerate(grid)]


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, CPU seconds) of the console script's main in this process."""
    import contextlib
    import io
    import time

    from jax_scaling.cli import main

    out, err = io.StringIO(), io.StringIO()
    t = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue(), time.process_time() - t


# The CPU seconds of machine_reference() on the machine of 2026-11-29 where the CPU-second bounds below and in the
# timing tests were set: the same code (c306af6's planner) made the 70B plan on 8,960 v5p chips in 0.44-0.47 s there
# and in 1.00-1.08 s on the machine of 2026-11-30, where the reference takes 0.146-0.149 s (docs/findings.md, "The
# CPU-second bounds on a slower machine")
REFERENCE_SECONDS = 0.065


def machine_reference() -> None:
    """A fixed piece of the work the planner and the refusals do (Python calls, dict reads, small numpy arrays
    broadcast and reduced), whose CPU seconds measure this machine's speed."""
    a, d = np.arange(24.0).reshape(2, 3, 4, 1), {"data": 2, "fsdp": 4, "tensor": 8}
    for i in range(20000):
        float(np.where(a > i % 7, a * d["tensor"], a / d["fsdp"]).sum(axis=1)[0, 0, 0]) + sum(d[k] for k in d)


@functools.cache
def machine_scale() -> float:
    """How much slower this machine runs machine_reference than the machine the bounds were set on (the fastest of
    three runs over REFERENCE_SECONDS), never below 1: a CPU-second bound b holds here as b·machine_scale()."""
    runs = []
    for _ in range(3):
        t = time.process_time()
        machine_reference()
        runs.append(time.process_time() - t)
    return max(1.0, min(runs) / REFERENCE_SECONDS)


def cpu_bound(seconds: float) -> float:
    """A CPU-second bound set on the reference machine, as it holds on this one (machine_scale)."""
    return seconds * machine_scale()


def refused(argv: list[str], *words: str) -> str:
    """Assert ``argv`` is refused as the package refuses bad input: exit 2, nothing on stdout, one `error:` line on
    stderr holding each of ``words``, within 2 CPU seconds of this process on the reference machine (cpu_bound; CPU
    seconds, not the wall clock: the machine may be busy); return that line."""
    code, out, err, seconds = run_cli(argv)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), (argv, code, out, err)
    assert seconds < cpu_bound(2), (argv, seconds, cpu_bound(2))
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]
