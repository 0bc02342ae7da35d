"""One GEMM's predicted time on one chip, with the terms it is made of and the measured rows it comes from
(``jax-scaling kernels --gemm MxNxK``): scaling.step.kernels.gemm_seconds — on a GPU t_fixed + max(2·m·n·k/(C_dtype ·
ceiling · q), c·(m·k + k·n + m·n)/W_hbm), ceiling and t_fixed fitted on the chip's kernel table
(gemm_coefficients), q the tile and wave quantization (tilings); on a TPU the chip's matmul_efficiency and MXU
padding — beside the kernel table's rows nearest the shape (in log m, log n, log k) and how far the model is from
each.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from scaling.step import kernels
from scaling.hardware.chips import CHIPS, Chip
from scaling.core.inputs import ascii_int
from scaling.core.kinds import Dtype, Platform
from scaling.core.table import prose, table, time_text


def parse_gemm(text: str) -> tuple[int, int, int]:
    """``"4096x4096x4096"`` -> (m, n, k), each a positive integer; ValueError naming the text otherwise."""
    parts = str(text).strip().lower().split("x")
    try:
        dims = tuple(ascii_int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 3 or any(d <= 0 for d in dims):
        raise ValueError(f"bad --gemm {text!r}: expected MxNxK, three positive integers (the product [M, K]·[K, N]), "
                         "e.g. 4096x4096x4096")
    return dims


@dataclass(frozen=True)
class GemmReport:
    """One GEMM [m, k]·[k, n] of ``dtype`` on ``chip`` (module docstring): the predicted ``seconds`` and TFLOP/s,
    the efficiency (achieved FLOP/s over the dtype's peak), the terms (the tile picked, its tiles and waves, q, the
    ceiling and t_fixed, the math and memory seconds, the bound), the coefficients (kernels.GemmCoefficients: where
    they come from and any fallback) and the nearest measured rows (m, n, k, measured s, predicted s, error)."""

    chip: str
    dtype: str
    shape: tuple[int, int, int]
    seconds: float
    peak_flops: float
    efficiency: float
    tile: tuple[int, int] | None
    tiles: int | None
    waves: int | None
    quantization: float
    math_seconds: float
    memory_seconds: float
    coefficients: kernels.GemmCoefficients
    nearest: tuple[tuple, ...] = ()
    aligned: bool = True
    rows_chip: str | None = None  # the chip the nearest rows were measured on (and are predicted for)
    split: int = 1  # the slices of k (split-K; kernels.tilings)

    @property
    def flops(self) -> float:
        m, n, k = self.shape
        return 2.0 * m * n * k

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def bound(self) -> str:
        return "compute" if self.math_seconds >= self.memory_seconds else "HBM"

    def to_json(self) -> dict:
        c = self.coefficients
        return {"chip": self.chip, "dtype": self.dtype, "m": self.shape[0], "n": self.shape[1], "k": self.shape[2],
                "flops": self.flops, "seconds": self.seconds, "tflops": self.tflops, "peak_flops": self.peak_flops,
                "efficiency": self.efficiency,
                "terms": {"tile": None if self.tile is None else list(self.tile), "tiles": self.tiles,
                          "waves": self.waves, "k_slices": self.split, "k_split": c.k_split,
                          "quantization": self.quantization, "tensor_cores": self.aligned,
                          "ceiling": c.ceiling, "t_fixed": c.t_fixed, "math_seconds": self.math_seconds,
                          "memory_seconds": self.memory_seconds, "bound": self.bound},
                "data": {"source": c.source, "rows_fitted": c.rows, "rms_log_error": c.rms_log_error,
                         "fallback": c.fallback, "rows_chip": self.rows_chip,
                         "nearest": [{"m": r[0], "n": r[1], "k": r[2], "measured_seconds": r[3],
                                      "measured_tflops": 2.0 * r[0] * r[1] * r[2] / r[3] / 1e12,
                                      "predicted_seconds": r[4], "error": r[4] / r[3] - 1} for r in self.nearest]}}

    def render(self) -> str:
        m, n, k = self.shape
        c = self.coefficients
        lines = [f"GEMM [{m}, {k}]·[{k}, {n}] {self.dtype} on {self.chip}: {time_text(self.seconds)}, "
                 f"{self.tflops:.4g} TFLOP/s, {self.efficiency:.1%} of the {self.peak_flops / 1e12:.4g} TFLOP/s peak "
                 f"({self.bound} bound)"]
        if self.tile is not None:
            lines.append(f"  tiles: {self.tile[0]}x{self.tile[1]}, {self.tiles} of them"
                         + (f", k in {self.split} slices of {self.shape[2] // self.split} (split-K, slices of at "
                            f"least {c.k_split})" if self.split > 1 else "")
                         + f" in {self.waves} wave{'s' if self.waves != 1 else ''}: "
                         f"q = {self.quantization:.4f}" + ("" if self.aligned else
                                                           "; k or n off the tensor-core alignment: FP32 (SIMT) rate"))
        else:
            lines.append(f"  MXU padding: q = {self.quantization:.4f}")
        lines.append(f"  t = t_fixed {c.t_fixed * 1e6:.3g} us + max(math {self.math_seconds * 1e6:.4g} us at ceiling "
                     f"{c.ceiling:.4f} x q, memory {self.memory_seconds * 1e6:.4g} us)")
        split = f"from k slices of {c.k_split}" if c.k_split else "none"
        lines.append(f"  coefficients: {c.source}" + (f" ({c.rows} rows, rms log error {c.rms_log_error:.3f}; "
                                                      f"split-K {split})" if c.rows else ""))
        if c.fallback:
            lines.append(f"  fallback: {c.fallback}")
        if self.nearest:
            lines.append(f"  nearest measured rows ({self.rows_chip}'s, predicted for it):")
            lines += ["    " + line for line in table(
                ["m", "n", "k", "measured us", "TFLOP/s", "predicted us", "error"],
                [(r[0], r[1], r[2], f"{r[3] * 1e6:.4g}", f"{2 * r[0] * r[1] * r[2] / r[3] / 1e12:.4g}",
                  f"{r[4] * 1e6:.4g}", f"{r[4] / r[3] - 1:+.1%}") for r in self.nearest], right=range(7))]
        return "\n".join(map(prose, lines))


def gemm_report(chip: Chip, m: int, n: int, k: int, dtype: str = "bf16", nearest: int = 3) -> GemmReport:
    """The GemmReport of one [m, k]·[k, n] (kernels.gemm_seconds and its terms), with the ``nearest`` rows of the
    chip's kernel table for ``dtype`` (the table the coefficients were fitted on; none for a fallback dtype or a
    TPU), nearest in Σ log² of the ratios of m, n and k. ValueError for a dtype the chip has no rate for."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"GEMM {name} must be a positive integer, got {v!r}")
    peak = kernels.peak_flops(chip, dtype)
    coeff = kernels.gemm_coefficients(chip, dtype)
    seconds = float(kernels.gemm_seconds(chip, m, n, k, 1, dtype))
    eff = float(kernels.shape_efficiency(chip, m, n, k, 1, dtype))
    flops, moved = kernels.shape_costs(m, n, k, 1, 1, kernels.DTYPE_BYTES[dtype])
    if chip.kind == Platform.GPU:
        tm, tn, tiles, waves, q, split = max(kernels.tilings(chip, m, n, 1, k, coeff.k_split), key=lambda t: t[4])
        tile, tiles, waves, q, split = (tm, tn), int(tiles), int(waves), float(q), int(split)
        aligned = not (dtype in (Dtype.BF16, Dtype.FP8, Dtype.INT8) and chip.tc_align
                       and (k % chip.tc_align or n % chip.tc_align))
    else:
        tile = tiles = waves = None
        split = 1
        q, aligned = eff / chip.matmul_efficiency, True
    rows, owner = (), None
    table = chip.kernel_table
    if chip.kind == Platform.GPU and table is not None and dtype in table.gemm and coeff.rows:
        # rows measured on another GPU (kernels_as) are predicted for that GPU, whose structure they were fitted on
        owner = chip if table.chip == chip.name else CHIPS.get(table.chip, chip)
        owner = owner if owner.kernel_table is table else dataclasses.replace(owner, kernel_table=table)

        def dist(r):
            return sum(math.log(a / b) ** 2 for a, b in zip(r[:3], (m, n, k)))
        near = sorted(table.gemm[dtype].rows, key=dist)[:nearest]
        rows = tuple((int(r[0]), int(r[1]), int(r[2]), float(r[3]),
                      float(kernels.gemm_seconds(owner, r[0], r[1], r[2], 1, dtype))) for r in near)
    return GemmReport(chip.name, dtype, (m, n, k), seconds, peak, float(flops / seconds / peak), tile, tiles, waves,
                      q, float(flops / (peak * eff)), float(np.asarray(moved) / chip.device_hbm_bw), coeff, rows,
                      bool(aligned), None if owner is None else owner.name, split)
