"""The one table of chips: compute, memory and interconnect figures, each with its source.

Sources (abbreviated in the table):
  [SB-tpus]  Scaling Book, "How to Think About TPUs", jax-ml.github.io/scaling-book/tpus/ (spec table)
  [SB-gpus]  Scaling Book, "How to Think About GPUs", jax-ml.github.io/scaling-book/gpus/
  [GC-v5p]   Google Cloud TPU v5p documentation (cloud.google.com/tpu/docs/v5p): 95 GiB usable of 96 GiB
             HBM, DCN 50 Gbps per chip, slice topologies; full 3D torus (wraparound) from 4x4x4 up.
  [libtpu]   what libtpu 0.0.42.1 says when it compiles a program ahead of time for the chip: a program
             too large fails with "exceeds available HBM (95.74G)" (v5p; G = GiB): the usable HBM.
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
    usable_hbm: float | None = None  # HBM a program may use, where the vendor states less than hbm_bytes

    @property
    def hbm_budget(self) -> float:
        """The memory budget per chip that plans are held to: the usable HBM where the table gives it
        (v5p: 95.74 GiB = 102.8 GB, what the compiler says is available [libtpu], of 96 GiB), else the
        HBM capacity."""
        return self.usable_hbm or self.hbm_bytes

    def describe(self) -> str:
        """One line of the figures a report uses, for its header."""
        hbm = f"HBM {self.hbm_budget / 1e9:.4g} GB" + (
            f" usable of {self.hbm_bytes / 1e9:.4g} GB" if self.usable_hbm else "")
        link = "NVLink per GPU" if self.kind == "gpu" else "per ICI link, bidirectional"
        return (f"{self.name}: C = {self.bf16_flops:.3g} bf16 FLOP/s, {hbm} at {self.hbm_bw:.3g} B/s, "
                f"W = {self.ici_bidi:.3g} B/s {link}, alpha = C/W = {self.alpha:.0f} ({self.source})")

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
        Chip("v5p", "tpu", 4.59e14, 96 * 2**30, 2.8e12, 9e10, 3, 4, 6.25e9,
             "[SB-tpus] spec table; [GC-v5p] 96 GiB HBM, DCN 50 Gb/s; [libtpu] 95.74 GiB available",
             usable_hbm=95.74 * 2**30),
        Chip("v6e", "tpu", 9.2e14, 32e9, 1.6e12, 9e10, 2, 16, 1.25e10, "[SB-tpus] spec table; [GC-v6e]"),
        Chip("H100", "gpu", 9.9e14, 80e9, 3.35e12, 4.5e11, 0, None, 5e10, "[SB-gpus]; [NV-H100] SXM"),
        Chip("H200", "gpu", 9.9e14, 141e9, 4.8e12, 4.5e11, 0, None, 5e10, "[SB-gpus]; [NV-H200]"),
        Chip("B200", "gpu", 2.3e15, 192e9, 8.0e12, 9e11, 0, None, 5e10, "[SB-gpus]; [NV-B200]"),
    ]
}

def get_chip(name: str) -> Chip:
    """Look a chip up by name (case-insensitive); ValueError listing the valid names otherwise (and
    pointing a slice name such as v5p-256 to --slice)."""
    for key, chip in CHIPS.items():
        if key.lower() == str(name).lower():
            return chip
    hint = f" ({name!r} names a slice: use --slice {name})" if str(name).lower().startswith("v5p-") else ""
    raise ValueError(f"unknown chip {name!r}; valid chips: {', '.join(CHIPS)}{hint}")


def parse_slice(name: str) -> tuple[Chip, tuple[int, ...]]:
    """A Cloud TPU slice name -> (chip, physical shape): ``v5p-256`` counts TensorCores, 2 per chip
    [GC-v5p], so it is 128 chips, 4x4x8. ValueError naming the valid form otherwise."""
    s = str(name).strip().lower()
    if not s.startswith("v5p-"):
        raise ValueError(f"unknown slice {name!r}; expected v5p-<TensorCores>, e.g. v5p-256 (128 chips)")
    return CHIPS["v5p"], parse_v5p_slice(s)


def slice_name(chip: Chip, chips: int) -> str | None:
    """The Cloud TPU accelerator type of ``chips`` chips of ``chip`` (v5p: 2 TensorCores per chip,
    v5p-<2·chips>), None where the chip has no slice names (GPUs)."""
    return f"v5p-{2 * chips}" if chip.name == "v5p" else None


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
