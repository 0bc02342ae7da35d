"""Multi-controller JAX: two processes × 4 emulated CPU devices, started through the CLI with
--coordinator/--num-processes/--process-id, train the same 8-device mesh as one process with 8
devices and get its losses; the checkpoint they write together restores in one process."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np

from ffn_model import checkpoint as ckpt
from ffn_model.train import state_shardings, train
from mesh import make_mesh
from scaling.config import PRESETS

TINY = PRESETS["tiny"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process(tmp_path):
    port, d = free_port(), tmp_path / "ck"
    argv = ["train", "--preset", "tiny", "--devices", "cpu:4", "--mesh", "fsdp=4,tensor=2", "--batch-tokens", "64",
            "--steps", "3", "--checkpoint-dir", str(d), "--save-every", "2", "--json",
            "--coordinator", f"localhost:{port}", "--num-processes", "2"]
    procs = [subprocess.Popen([sys.executable, "-m", "ffn_model", *argv, "--process-id", str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for i in range(2)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    # gloo prints "[Gloo] Rank i is connected to ..." on stdout (threads interleaving); the JSON object
    # is the one line starting with "{", and only process 0 prints one
    objects = [[line for line in out.splitlines() if line.startswith("{")] for out, _ in outs]
    assert len(objects[0]) == 1 and objects[1] == [], outs
    rep = json.loads(objects[0][0])
    assert rep["processes"] == 2 and rep["mesh"] == {"data": 1, "stage": 1, "fsdp": 4, "context": 1, "tensor": 2}

    m = make_mesh("fsdp=4,tensor=2", "cpu:8")
    want, state = train(TINY, m, 64, 3, return_state=True)  # one process, 8 devices
    # Same program, same global arrays; only the collectives run over gloo between the processes
    # (bit-identical here; the tolerance allows a different reduction order, one f32 ulp or so).
    np.testing.assert_allclose(rep["losses"], want, rtol=1e-6)

    assert sorted(os.listdir(d)) == ["2", "3"]
    step, got, _ = ckpt.restore_latest(d, state_shardings(TINY, make_mesh("fsdp=2,tensor=4", "cpu:8"))[0])
    assert step == 3
    # The states agree up to the rounding of a bf16 gradient summed in another order. gloo sums the
    # gradient partials of the two processes in another order than one process does; where that sum
    # lands on a bf16 rounding boundary, the communicated gradient element (bf16: precision policy)
    # differs by one bf16 ulp, 2^-8 of itself, and so do its Adam moments and, far less, its weight.
    # So each leaf must agree within 2^-8 of its scale, and only isolated elements may differ (a
    # shard in the wrong place or a step missing would change whole shards: 1/8 of the elements or
    # more). Measured: one element in 49,152 per leaf at most, 1.25e-4 of the scale (mu of w_out);
    # the step counter and nu of w_in bit-identical.
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(state)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        assert np.abs(g - w).max() <= 2**-8 * np.abs(w).max(), (np.abs(g - w).max(), np.abs(w).max())
        assert np.mean(g != w) <= 1e-3, np.mean(g != w)
