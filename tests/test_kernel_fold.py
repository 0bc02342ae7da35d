"""The step's kernel list (scaling.step.kernels.step_kernels, each family's forms.step_kernels) and its FLOPs
(forms.step_flops) are one description: on every row of every grid (verify.grids.GRIDS: the workloads the compiler
checks), the matmul and attention kernels' FLOPs add up to the step's total. Closed forms only: the grids' figures
against the compiler are held elsewhere; this holds that the kernels the step model times are the FLOPs it counts
(a dead matmul left in one and not the other, as layer 0's input gradient was, fails it)."""

from __future__ import annotations

import pytest

from scaling.core.kinds import KernelKind
from scaling.core.policies import Remat
from scaling.core.schedule import Schedule
from scaling.families.presets import get_preset
from scaling.step import kernels
from scaling.core.workload import Workload
from verify.check import grid_workload
from verify.grids import GRIDS


def _rows():
    for name, rows in GRIDS.items():
        for i, row in enumerate(rows):
            devices, r = (row[0], row[1:]) if isinstance(row[0], str) else ("cpu:8", row)
            yield pytest.param(devices, *r[:5], r[5] if len(r) > 5 else Schedule(), id=f"{name}[{i}]")


def _fold(w: Workload) -> float:
    return sum(float(k.flops) for k in kernels.step_kernels(w) if k.kind in (KernelKind.MATMUL, KernelKind.ATTENTION))


@pytest.mark.parametrize("devices, cfg, mesh, batch, remat, step, schedule", list(_rows()))
def test_the_kernels_fold_to_the_step_s_flops(devices, cfg, mesh, batch, remat, step, schedule):
    w = grid_workload(cfg, mesh, batch, remat, step, schedule)
    if devices.startswith("tpu") and str(remat).endswith("offloaded"):
        w = w.with_facts(host_offload=True)  # as verify.check compiles it: the offloaded residuals in host memory
    assert _fold(w) == pytest.approx(float(w.model.forms.step_flops(w)["total"]), rel=1e-12)


def test_a_kernel_the_flops_do_not_count_is_caught(monkeypatch):
    """The fold can fail: one layer of small-tf, whose input gradient XLA drops (first_layer_dx_dead), with the
    kernel list made to keep it."""
    w = Workload(get_preset("small-tf").replace(blocks=1), {"fsdp": 2, "tensor": 4}, 4096, remat=Remat.NONE)
    total = float(w.model.forms.step_flops(w)["total"])
    assert _fold(w) == pytest.approx(total, rel=1e-12)
    monkeypatch.setattr(w.model.forms, "first_layer_dx_dead", lambda w: 0)
    assert _fold(w) > total * 1.01
