"""One kernel of a step's list: the record every model family's kernel list (its forms' step_kernels), the runtimes'
mappings (scaling.step.launches) and the step model's pricing (scaling.step.kernels) share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class Kernel:
    """One class of op of a step, per device: name, pass (forward | backward | recompute | update), kind (matmul |
    attention | pointwise | optimizer), shape (m, n, k, batch) of one call for a matmul (None otherwise), calls per
    step, FLOPs and HBM bytes per step, the share of those FLOPs it runs (``executed``), and with a chip: the
    efficiency its shape gets (eta·q, or the SIMT rate's fraction), its compute and memory seconds and its calls'
    fixed seconds (a GPU's t_fixed); it takes the larger of the first two, plus the third (``seconds``, ``bound``)."""

    name: str
    pass_: str
    kind: str
    shape: tuple | None
    calls: object
    flops: object
    bytes: object
    executed: float = 1.0  # the share of the FLOPs the kernel runs (flash: the causal blocks)
    efficiency: object = 1.0
    math_seconds: object = 0.0
    memory_seconds: object = 0.0
    fixed_seconds: object = 0.0  # a GPU matmul's t_fixed times its calls (gemm_coefficients)
    only: str | None = None  # the platform whose compiler runs it as a kernel of its own (None: every runtime's)

    @property
    def seconds(self):
        """fixed + max(FLOPs·executed/(peak·efficiency), bytes/HBM bandwidth): the roofline of one kernel and its
        calls' fixed time."""
        return self.fixed_seconds + np.maximum(self.math_seconds, self.memory_seconds)

    @property
    def bound(self):
        """compute or HBM: the larger of the two times."""
        return np.where(np.asarray(self.math_seconds) >= self.memory_seconds, "compute", "HBM")
