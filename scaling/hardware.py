"""The one table of chips: compute, memory and interconnect figures, each with its source.

Sources (abbreviated in the table):
  [SB-tpus]  Scaling Book, "How to Think About TPUs", jax-ml.github.io/scaling-book/tpus/ (spec table)
  [SB-gpus]  Scaling Book, "How to Think About GPUs", jax-ml.github.io/scaling-book/gpus/
  [GC-v5p]   Google Cloud TPU v5p documentation (cloud.google.com/tpu/docs/v5p): 95 GiB usable HBM,
             DCN 50 Gbps per chip, slice topologies; full 3D torus (wraparound) from 4x4x4 up.
  [GC-v5e], [GC-v6e] Google Cloud TPU v5e / v6e (Trillium) documentation.
  [NV-H100], [NV-H200], [NV-B200] NVIDIA data sheets (dense bf16, no sparsity).
ICI figures are per link, one-way and bidirectional (bidirectional = 2 × one-way). GPU "ICI" is the
NVLink bandwidth per GPU (one-way), as the Scaling Book's GPU page treats it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Chip:
    name: str
    kind: str  # "tpu" | "gpu"
    bf16_flops: float  # C, FLOP/s per chip
    hbm_bytes: float  # per chip
    hbm_bw: float  # bytes/s per chip
    ici_oneway: float  # bytes/s per link, one direction
    ici_axes: int  # torus dimensions (0 for GPUs: NVLink switch)
    wraparound_min: int | None  # an axis has wraparound when its length is a multiple of this (None: never)
    dcn_bw: float  # bytes/s per chip, data-center network
    source: str

    @property
    def ici_bidi(self) -> float:
        """W_ici, bidirectional bytes/s per link = 2 × one-way [SB-tpus]."""
        return 2 * self.ici_oneway

    @property
    def alpha(self) -> float:
        """alpha = C / W_ici, the arithmetic intensity of ICI (FLOPs per byte) [SB-training]."""
        return self.bf16_flops / self.ici_bidi

    def has_wraparound(self, axis_len: int, full_len: int | None = None) -> bool:
        """Whether a ring over an ICI axis of ``axis_len`` chips closes into a torus.

        v4p/v5p: axes that are multiples of 4 in a slice of at least one 4x4x4 cube [GC-v5p];
        v5e/v6e: only axes of length 16 (the full pod dimension) [SB-tpus]. ``full_len`` is the
        slice's physical dimension when a mesh axis uses only part of it (then no wraparound).
        """
        if self.wraparound_min is None or axis_len <= 1:
            return False
        if full_len is not None and axis_len != full_len:
            return False
        return axis_len % self.wraparound_min == 0


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in [
        Chip("v4p", "tpu", 2.75e14, 32e9, 1.2e12, 4.5e10, 3, 4, 6.25e9, "[SB-tpus] spec table"),
        Chip("v5e", "tpu", 1.97e14, 16e9, 8.1e11, 4.5e10, 2, 16, 3.125e9, "[SB-tpus] spec table; [GC-v5e]"),
        Chip("v5p", "tpu", 4.59e14, 96e9, 2.8e12, 9e10, 3, 4, 6.25e9, "[SB-tpus] spec table; [GC-v5p] DCN 50 Gb/s"),
        Chip("v6e", "tpu", 9.2e14, 32e9, 1.6e12, 9e10, 2, 16, 1.25e10, "[SB-tpus] spec table; [GC-v6e]"),
        Chip("H100", "gpu", 9.9e14, 80e9, 3.35e12, 4.5e11, 0, None, 5e10, "[SB-gpus]; [NV-H100] SXM"),
        Chip("H200", "gpu", 9.9e14, 141e9, 4.8e12, 4.5e11, 0, None, 5e10, "[SB-gpus]; [NV-H200]"),
        Chip("B200", "gpu", 2.3e15, 192e9, 8.0e12, 9e11, 0, None, 5e10, "[SB-gpus]; [NV-B200]"),
    ]
}

# Usable HBM per v5p chip as the question states it (96 GiB physical, 95 reserved-for-runtime
# adjusted; questions-4d.md uses 95e9).
V5P_USABLE_HBM = 95e9


def get_chip(name: str) -> Chip:
    """Look a chip up by name (case-insensitive); ValueError listing the valid names otherwise."""
    for key, chip in CHIPS.items():
        if key.lower() == str(name).lower():
            return chip
    raise ValueError(f"unknown chip {name!r}; valid chips: {', '.join(CHIPS)}")


# Slice topologies for v5p [GC-v5p]: accelerator type "v5p-<TensorCores>", 2 TensorCores per chip.
V5P_TOPOLOGIES: dict[int, tuple[int, int, int]] = {
    4: (2, 2, 1),
    8: (2, 2, 2),
    16: (2, 2, 4),
    32: (2, 4, 4),
    64: (4, 4, 4),
    128: (4, 4, 8),
    256: (4, 8, 8),
    512: (8, 8, 8),
    1024: (8, 8, 16),
    2048: (8, 16, 16),
    4096: (16, 16, 16),
    6144: (16, 16, 24),
}


def v5p_topology(chips: int) -> tuple[int, int, int]:
    """The 3D shape of a v5p slice of ``chips`` chips.

    The documented shapes [GC-v5p] where listed; otherwise the most cube-like X×Y×Z with every
    dimension a multiple of 4 (whole 4x4x4 cubes, so every axis has wraparound), e.g.
    8960 chips (a full pod) -> 16x20x28.
    """
    if isinstance(chips, bool) or not isinstance(chips, int) or chips <= 0:
        raise ValueError(f"chip count must be a positive integer, got {chips!r}")
    if chips in V5P_TOPOLOGIES:
        return V5P_TOPOLOGIES[chips]
    if chips % 64:
        raise ValueError(
            f"no v5p topology for {chips} chips: use one of {sorted(V5P_TOPOLOGIES)} or a multiple of 64"
        )
    cubes = chips // 64
    best = None
    for a in range(1, cubes + 1):
        for b in range(a, cubes // a + 1):
            if cubes % (a * b) == 0:
                c = cubes // (a * b)
                if c >= b:
                    spread = c / a
                    if best is None or spread < best[0]:
                        best = (spread, (4 * a, 4 * b, 4 * c))
    return best[1]


def parse_v5p_slice(name: str) -> tuple[int, int, int]:
    """``v5p-128`` (TensorCores; 2 per chip) or ``4x4x4`` -> the slice's 3D shape."""
    s = str(name).strip().lower()
    if s.startswith("v5p-"):
        try:
            cores = int(s[4:])
        except ValueError:
            raise ValueError(f"bad v5p slice name {name!r}; expected v5p-<TensorCores>, e.g. v5p-128") from None
        if cores < 8 or cores % 2:
            raise ValueError(f"bad v5p slice name {name!r}: TensorCores must be an even number >= 8")
        return v5p_topology(cores // 2)
    parts = s.split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"bad TPU topology {name!r}; expected e.g. 4x4x4 or v5p-128") from None
    if len(dims) != 3 or any(d <= 0 for d in dims):
        raise ValueError(f"bad v5p topology {name!r}; expected three positive sizes such as 4x4x4")
    return dims


def chips_in(dims) -> int:
    return math.prod(dims)
