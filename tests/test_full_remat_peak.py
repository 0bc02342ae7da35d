"""Full remat with ring attention: the compiled peak against the closed form's
(scaling.families.transformer.memory_per_device, ring_forward_phase).

Under full remat the backward's phase holds the FP32 gradients, one layer's gathered weights and its recomputed
residuals; with ring attention the forward's phase also holds what jax's linearization hoists out of the layer loop,
the ring's per-step -inf scores, visibility masks and o zeros for all C steps, and that phase is the higher one where
the state is small beside a chunk's scores. The 4096-wide transformer at fsdp=4, context=4 on v6e:4x4 compiled to
1.19 times the closed form's peak (5.08 GB against 4.26 GB) while the closed form modelled the backward's phase
alone; each test compiles one configuration ahead of time and holds its peak within [0.90, 1.10] of the closed
form's (the band tests/test_check.py holds TPU peaks to; every closed-form peak here is above PEAK_BANDED_ABOVE).
"""

from __future__ import annotations

import pytest

from scaling.families import transformer
from scaling.families.presets import get_preset
from scaling.core.schedule import Schedule
from scaling.core.flags import get_flag_set
from verify.check import check, grid_workload
from verify.grids import PEAK_BANDED_ABOVE

RING = Schedule(context="ring", attention="flash")
# the TPU sequence grid's 4096-wide transformer (verify.grids): 32 heads, 8 kv heads, F = 16384, 4 layers, T = 4096
_LARGE_TF = get_preset("small-tf").replace(d_model=4096, heads=32, kv_heads=8, d_ff=16384, blocks=4, seq_len=4096)

# (devices, cfg, mesh, batch tokens, XLA flag set): the configuration, then others that move C, s, the key
# blocks per chunk, the chip, the model and which phase is the higher
NAMED = ("tpu:v6e:4x4", _LARGE_TF, "fsdp=4,context=4", 65536, "default")
# One compile in the suite: v5p 2x2x2, fsdp=2 (the grid's ring mesh under full remat: twice the state, the two phases
# 0.17 GB apart). The other configurations measured with it (the on v6e, medium-tf on v5p 2x2x4, context=2 on
# v6e, MaxText's flags: 2-6 minutes each on 2 cores) are in docs/findings.md; make test holds the term by hand.
CONFIGS = [("tpu:v5p:2x2x2", _LARGE_TF, "fsdp=2,context=4", 32768, "default")]


def _workload(cfg, mesh, batch, flags):
    return grid_workload(cfg, mesh, batch, "full", "train", RING).replace(flags=get_flag_set(flags))


def _id(row):
    devices, cfg, mesh, batch, flags = row
    return f"{devices[4:]}-{cfg.d_model}x{cfg.blocks}-{mesh}-B{batch}-{flags}"


def test_ring_forward_phase_by_hand():
    """The issue's configuration by hand: s = 65536/(4096·4) = 4 sequences, Tc = 1024, b = 512, 32 heads, H = 128,
    C = 4. Held: 4·4·32·1024·(4·512 + 1024 + 4·128) = 1,879,048,192 B, the sum of the six buffers XLA holds through
    the forward loop (805,306,368 + 402,653,184 + 201,326,592 for the scan's three steps, 268,435,456 + 134,217,728 +
    67,108,864 for the last); working: a key block's FP32 scores 4·4·32·1024·512, two FP32 o's 8·4096·32·128, x, q,
    k, v and the K/V pair in flight 2·4096·(4096 + 64·128), the step's slices of the stacks 4·32·1024·(4·512 + 1024)
    (C = 4 > 2); the peak the forward's: the arguments (2,214,592,512 B), the 4 saved layer inputs and both."""
    devices, cfg, mesh, batch, flags = NAMED
    w = _workload(cfg, mesh, batch, flags)
    held = 4 * 4 * 32 * 1024 * (4 * 512 + 1024 + 4 * 128)
    assert held == 805_306_368 + 402_653_184 + 201_326_592 + 268_435_456 + 134_217_728 + 67_108_864
    working = (4 * 4 * 32 * 1024 * 512 + 8 * 4096 * 32 * 128 + 2 * 4096 * (4096 + 64 * 128)
               + 4 * 32 * 1024 * (4 * 512 + 1024))
    assert transformer.ring_forward_phase(cfg, w.mesh, batch, RING) == held + working
    m = transformer.memory_per_device(w)
    arguments = m["master"] + m["optimizer"] + m["inputs"]
    assert arguments == 2_214_592_512
    assert m["total"] == pytest.approx(arguments + 4 * 2 * 4096 * 4096 + held + working)
    assert m["ring_forward_phase"] > 0 and m["total"] >= PEAK_BANDED_ABOVE


def test_no_forward_phase_without_a_ring_under_full_remat():
    """The term is the ring's under full remat: Ulysses, remat none and the same mesh without a context axis have
    none (their peaks are the backward's, held by tests/test_check.py's grids)."""
    devices, cfg, mesh, batch, flags = NAMED
    for w in (grid_workload(cfg, mesh, batch, "full", "train", Schedule(context="ulysses", attention="flash")),
              grid_workload(cfg, mesh, batch, "none", "train", RING),
              grid_workload(cfg, "fsdp=16", batch, "full", "train", RING),
              grid_workload(cfg, mesh, batch, "full", "forward", RING)):
        assert "ring_forward_phase" not in transformer.memory_per_device(w)


@pytest.mark.grid
@pytest.mark.tpu
@pytest.mark.parametrize("devices,cfg,mesh,batch,flags", CONFIGS, ids=[_id(r) for r in CONFIGS])
def test_full_remat_ring_peak_in_band(devices, cfg, mesh, batch, flags):
    """The compiled peak within [0.90, 1.10] of the closed form's (the issue's configuration read 1.19 when the
    closed form counted the backward's phase alone, 4.26 GB: below PEAK_BANDED_ABOVE, so no grid held it), and the
    closed form's peak at least PEAK_BANDED_ABOVE, where the project's grids hold the band."""
    rep = check(_workload(cfg, mesh, batch, flags), devices)
    peak = rep.memory.peak
    assert 0.90 <= peak.ratio <= 1.10, peak
    assert peak.closed_form >= PEAK_BANDED_ABOVE, peak
