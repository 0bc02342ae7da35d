"""The one table of chips: one row per chip, every figure with its source, and what follows from a row
(slices, topologies, wraparound, per-device figures). The rows live in scaling/data/chips.toml (package
data, read at import); adding a chip is adding a [[chip]] table there.

Sources (abbreviated in the table):
  [SB-tpus]  Scaling Book, "How to Think About TPUs", jax-ml.github.io/scaling-book/tpus/: spec table
             (bf16 FLOP/s, HBM, HBM bandwidth), interconnect table (ICI one-way / bidirectional per
             link), wraparound ("any multiple of a full cube (4x4x4) will have wraparounds"; v5e and
             Trillium "a single 16x16 2D torus with wraparounds along any axis of size 16"), DCN per chip,
             "TPU v7 removes megacore" (two JAX devices per chip).
  [SB-gpus]  Scaling Book, "How to Think About GPUs", jax-ml.github.io/scaling-book/gpus/ (dense bf16,
             HBM, NVLink per GPU one way).
  [NV-A100]  NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOP/s dense bf16, 80 GB HBM2e at 2,039 GB/s (SXM; 40 GB
             HBM2 at 1,555 GB/s), NVLink 600 GB/s per GPU.
  [NV-H100]  NVIDIA H100 Tensor Core GPU datasheet (SXM5): 132 SMs; dense FP32 67, TF32 495, FP8/INT8 1,979 TFLOP/s.
  [NV-B200]  NVIDIA HGX B200 datasheet, per GPU: 148 SMs; dense FP32 75, TF32 1,100, FP8 4,500 TFLOP/s. [NV-A100]
             also: 108 SMs; FP32 19.5, TF32 156, INT8 624 TFLOP/s.
  [NV-matmul]  NVIDIA Deep Learning Performance guide, "Matrix Multiplication Background": cuBLAS's output tiles
             (256×128, 128×256, 128×128 for large GEMMs), tile and wave quantization over the SMs, Tensor Core
             use with 16-bit operands whose dimensions are multiples of 8 elements (16 bytes).
  [seed-001] the reference seed 001's A100 system (its notebook's system dict): FP16 off the tensor cores 78 TFLOP/s
  [NV-Hopper]  NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5: peak FP16 and BF16 non-Tensor 133.8,
             FP32 66.9 TFLOP/s (132 SMs x 128 FP32 lanes x 2 x 1.98 GHz, doubled for 16-bit).
  [derived]  computed from sourced figures, the row's comment saying how (vector_flops of v4, v5e, v6e, TPU7x, B200).
  [jax-tpu_info]   jax's table of TPU generations for Pallas (jax/_src/pallas/mosaic/tpu_info.py, jax 0.10.2):
                   VMEM per TensorCore, v4 16 MiB, v5e 128 MiB, v5p 64 MiB, v6e 128 MiB, TPU7x 64 MiB
  [jax-precision]  jax's dot algorithms (jax.lax.DotAlgorithmPreset): an FP32 matmul on a TPU's bf16 MXU at full
             precision is six bf16 passes (BF16_BF16_F32_X6): a sixth of the bf16 rate.
  [fit]      TPUs: fitted by ``jax-scaling validate --fit`` on the one measured run the row names (``fitted_on``):
             scaling.reports.validate.fit_efficiency; the other rows are held out (docs/findings.md). GPUs fit nothing
             on a step: their GEMM ceiling and fixed time per dtype are fitted on kernel-level data, the chip's
             kernel table (scaling/data/kernels/, scaling.step.kernels.gemm_coefficients).
  [Megatron-2021]  Narayanan et al. 2021 (arXiv 2104.04473): Selene's nodes of 8 A100s, 8 x 200 Gb/s InfiniBand
             per node.
  [GC-v4], [GC-v5e], [GC-v5p], [GC-v6e], [GC-7x]  Google Cloud TPU documentation pages
             (cloud.google.com/tpu/docs/<v4|v5e|v5p|v6e|tpu7x>): HBM in GiB, TensorCores per chip,
             accelerator types (v4-N, v5p-N, tpu7x-N count TensorCores; v5litepod-N, v6e-N count chips),
             slice shapes, DCN per chip; [GC-v5p] "All 4x4x4 and larger slices have full 3D torus".
  [XPK]      AI-Hypercomputer/xpk system_characteristics (tpu7x slice names and shapes: 2x2x1, 2x2x2,
             2x2x4, 2x4x4, then whole 4x4x4 cubes; MaxText's AOT configs wrap them from 4x4x4 up).
  [libtpu]   libtpu 0.0.42.1 compiling ahead of time on a CPU machine (this package's own reading): a
             program too large for a device fails with "exceeds available HBM (95.74G)" (v5p; G = GiB),
             which is the usable HBM per device; the AOT topologies give v4 one device per chip with
             chip_config_name="megacore" (as on the hardware) and TPU7x two devices per chip.
  [PT-cap]   PyTorch's CUDA out-of-memory message on an A100 80GB: "GPU 2 has a total capacity of 79.25 GiB"
             (github.com/wbfwonderful/Vad-R1 issue 11; levihsu/OOTDiffusion issue 235): what a process may use.
ICI figures are per link: one-way, and bidirectional = 2 x one-way (W_ici). A GPU's "ICI" is its NVLink
bandwidth one way, as the Scaling Book's GPU page treats it. Figures per chip unless the name says
per device (TPU7x: two devices per chip, each with half the chip's FLOP/s and HBM bandwidth).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from importlib import resources

from scaling.core.inputs import ascii_int
from scaling.core.kinds import Platform
from scaling.hardware.kernel_tables import kernel_table

GiB = 2**30


@dataclass(frozen=True)
class Chip:
    name: str
    kind: str  # "tpu" | "gpu"
    bf16_flops: float  # C, dense bf16 FLOP/s per chip
    hbm_bytes: float  # HBM capacity per chip
    hbm_bw: float  # HBM bytes/s per chip
    ici_oneway: float  # bytes/s per ICI link, one direction (GPU: NVLink per GPU)
    torus: int  # physical ICI axes of a slice: 3 (3D torus), 2 (2D torus), 0 (GPU: NVLink switch)
    dcn_bw: float  # bytes/s per chip, data-center network
    source: str
    usable_hbm: float | None = None  # per device: what the compiler says a program may use [libtpu]
    devices_per_chip: int = 1  # JAX devices per chip (TPU7x: 2, one per TensorCore)
    cores_per_chip: int = 1  # TensorCores per chip
    device_kinds: tuple[str, ...] = ()  # jax's device_kind, lower case (GPUs: a prefix of it)
    aliases: tuple[str, ...] = ()  # other names accepted for --chip
    libtpu_name: str | None = None  # the topology prefix libtpu accepts: "v5p" in "v5p:4x4x4"
    libtpu_args: tuple[tuple[str, object], ...] = ()  # extra get_topology_desc arguments
    slice_prefix: str | None = None  # Cloud accelerator type: v5p-<N>
    slice_counts_cores: bool = False  # N counts TensorCores (v4, v5p, tpu7x) or chips (v5e, v6e)
    small_topologies: tuple[tuple[int, ...], ...] = ()  # documented shapes below a whole cube
    cube: int | None = None  # 3D: slices of whole cube^3 blocks; they wrap around on every axis
    wrap_length: int | None = None  # 2D: an axis wraps around when it is this long (the full pod side)
    max_slice_chips: int | None = None  # the largest single slice; more chips are slices joined by DCN
    gpu_target: tuple[tuple[str, object], ...] = ()  # GPU: what XLA's compiler is told of it (mesh.devices)
    # the step model's kernel figures (scaling.step.kernels)
    dtype_flops: tuple[tuple[str, float], ...] = ()  # peak matmul FLOP/s per chip of other input types (fp32, ...)
    mxu: int | None = None  # TPU: the side of the MXU's systolic array
    sm_count: int | None = None  # GPU: streaming multiprocessors (the waves of a matmul's tiles)
    mma_tiles: tuple[tuple[int, int], ...] = ()  # GPU: the output tiles (rows, columns) cuBLAS's kernels take
    tc_align: int | None = None  # GPU: a 16-bit operand's k and n in multiples of this many elements for tensor cores
    matmul_efficiency: float = 1.0  # TPU: the fraction of peak a large aligned matmul sustains (fitted: chips.toml)
    fitted_on: str | None = None  # the measured run (scaling/data/measured.toml id) matmul_efficiency is fitted on
    # GPU: the kernel table (scaling.hardware.kernel_tables.KernelTable) the GEMM coefficients are fitted on: the
    # shipped scaling/data/kernels/<name or kernels_as>.toml, or the user's (--kernel-table); None where none ships
    kernels_as: str | None = None  # a GPU without a table of its own takes this chip's (named in chips.toml)
    decode_kernels_as: str | None = None  # a chip without a decode table of its own borrows this one's fractions
    kernel_table: object = None
    efficiency_as: str | None = None  # a chip without measured runs takes the efficiency of this one (same unit)
    onchip_bytes: float | None = None  # the memory a matmul tiles through (GPU L2, TPU VMEM): the hierarchical model
    vector_flops: float | None = None  # per chip off the matrix units: GPU non-Tensor FP16, TPU VPU (layer_estimator)

    @property
    def onchip(self) -> float | None:
        """The on-chip memory the hierarchical kernel model tiles through: onchip_bytes, or a GPU's L2 as XLA's
        description of it gives (gpu_target's l2_cache_size); None where the table has neither."""
        return self.onchip_bytes or dict(self.gpu_target).get("l2_cache_size")

    @property
    def ici_bidi(self) -> float:
        """W_ici, bidirectional bytes/s per link = 2 x one-way [SB-tpus]."""
        return 2 * self.ici_oneway

    @property
    def alpha(self) -> float:
        """alpha = C / W_ici, the arithmetic intensity of ICI (FLOPs per byte) [SB-training]."""
        return self.bf16_flops / self.ici_bidi

    @property
    def link_name(self) -> str:
        """What joins the devices of a slice: ICI (TPU) or a node's NVLink switch (GPU) [SB-tpus][SB-gpus]."""
        return "ICI" if self.kind == Platform.TPU else "NVLink"

    @property
    def network_name(self) -> str:
        """What joins slices (TPU: DCN) or nodes (GPU: the scale-out network, InfiniBand: IB) at ``dcn_bw`` per
        chip [SB-tpus][SB-gpus]."""
        return "DCN" if self.kind == Platform.TPU else "IB"

    @property
    def device_flops(self) -> float:
        """Peak bf16 FLOP/s of one JAX device: C / devices per chip (TPU7x: half a chip)."""
        return self.bf16_flops / self.devices_per_chip

    @property
    def device_hbm_bw(self) -> float:
        """HBM bytes/s of one JAX device: the chip's / devices per chip."""
        return self.hbm_bw / self.devices_per_chip

    @property
    def hbm_budget(self) -> float:
        """Bytes a program may use on one device: the usable HBM the compiler reports where the table
        has it (v5p: 95.74 GiB = 102.8 GB of 96 GiB [libtpu]), else the HBM per device."""
        return self.usable_hbm or self.hbm_bytes / self.devices_per_chip

    def describe(self) -> str:
        """One line of the figures a report uses, for its header."""
        per = f" per chip, {self.devices_per_chip} devices per chip" if self.devices_per_chip > 1 else ""
        hbm = f"HBM {self.hbm_budget / 1e9:.4g} GB usable per device of {self.hbm_bytes / 1e9:.4g} GB per chip"
        link = "NVLink per GPU" if self.kind == Platform.GPU else "per ICI link, bidirectional"
        return (f"{self.name}: C = {self.bf16_flops:.4g} bf16 FLOP/s{per}, {hbm} at {self.hbm_bw:.3g} B/s, "
                f"W = {self.ici_bidi:.3g} B/s {link}, alpha = C/W = {self.alpha:.0f} ({self.source})")

    def has_wraparound(self, axis_len: int, full_len: int, slice_dims: tuple[int, ...]) -> bool:
        """Whether a ring over ``axis_len`` chips of a physical axis ``full_len`` long, in a slice of
        shape ``slice_dims``, closes into a torus: the ring must cover the whole physical axis, and
        3D chips: the slice is whole cubes (every side a multiple of 4) [SB-tpus][GC-v5p];
        2D chips: the side is the full pod side, 16 [SB-tpus]."""
        if axis_len <= 1 or axis_len != full_len:
            return False
        if self.cube:
            return all(d % self.cube == 0 for d in slice_dims)
        return self.wrap_length is not None and full_len == self.wrap_length


# The chip assumed when none is given: the question's TPU (v5p).
DEFAULT_CHIP = "v5p"
GPU_NODE = 8  # GPUs on one NVLink switch [SB-gpus]: an H100/H200/B200 node

_TABLE = "data/chips.toml"  # the rows, shipped as package data (pyproject.toml [tool.setuptools.package-data])
_GIB_KEYS = {"hbm_gib": "hbm_bytes", "usable_hbm_gib": "usable_hbm"}  # keys the file gives in GiB


def _tuples(value):
    """TOML arrays (lists, nested) -> tuples and tables -> tuples of (key, value), so a Chip stays hashable."""
    if isinstance(value, dict):
        return tuple((k, _tuples(v)) for k, v in value.items())
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _load_chips() -> dict[str, Chip]:
    """CHIPS from scaling/data/chips.toml: one [[chip]] table per row; ``*_gib`` keys are multiplied by GiB."""
    with resources.files("scaling").joinpath(_TABLE).open("rb") as f:
        rows = tomllib.load(f)["chip"]
    chips = {}
    for row in rows:
        fields = {_GIB_KEYS.get(k, k): (v * GiB if k in _GIB_KEYS else _tuples(v)) for k, v in row.items()}
        chips[fields["name"]] = Chip(**fields)
    for name, chip in chips.items():  # one value per fitted efficiency: the chips that borrow it read it
        if chip.efficiency_as:
            chips[name] = replace(chip, matmul_efficiency=chips[chip.efficiency_as].matmul_efficiency)
        if chip.kind == Platform.GPU:  # the GEMM coefficients' kernel table (scaling.step.kernels.gemm_coefficients)
            chips[name] = replace(chips[name], kernel_table=kernel_table(chip.kernels_as or name))
    return chips


CHIPS: dict[str, Chip] = _load_chips()


def get_chip(name: str) -> Chip:
    """Look a chip up by name or alias (case-insensitive); ValueError listing the valid names otherwise
    (and pointing a slice name such as v5p-256 to --slice)."""
    low = str(name).strip().lower()
    for chip in CHIPS.values():
        if low == chip.name.lower() or low in chip.aliases:
            return chip
    hint = ""
    try:
        parse_slice(name)
        hint = f" ({name!r} names a slice: use --slice {name})"
    except ValueError:
        pass
    raise ValueError(f"unknown chip {name!r}; valid chips: {', '.join(CHIPS)}{hint}")


def chip_of_device_kind(kind: str) -> Chip | None:
    """The chip whose row lists jax's ``device_kind`` (TPUs exactly, GPUs by prefix: "NVIDIA H100 80GB
    HBM3" is an H100); None if no row does."""
    low = str(kind).strip().lower()
    for chip in CHIPS.values():
        if low in chip.device_kinds:
            return chip
    for chip in CHIPS.values():
        if chip.kind == Platform.GPU and any(low.startswith(k + " ") or low == k for k in chip.device_kinds):
            return chip
    return None


def chips_in(dims) -> int:
    return math.prod(dims)


def _tpus() -> list[Chip]:
    return [c for c in CHIPS.values() if c.kind == Platform.TPU]


def valid_topologies(chip: Chip, limit: int = 8) -> str:
    """A short list of the shapes ``chip`` has, for error messages."""
    shapes = ["x".join(map(str, t)) for t in chip.small_topologies[:limit]]
    c = chip.cube
    more = f", or whole {c}x{c}x{c} cubes up to {chip.max_slice_chips} chips" if c else ""
    return ", ".join(shapes) + more


def check_topology(chip: Chip, dims: tuple[int, ...]) -> tuple[int, ...]:
    """``dims`` if ``chip`` has a slice of that shape, else ValueError naming the valid shapes.
    3D chips: the documented sub-cube shapes (2x2x1, 2x2x2, 2x2x4, 2x4x4, in any order) or whole cubes
    (every side a multiple of 4) up to the largest slice [GC-v4][GC-v5p][XPK]; 2D chips: the documented
    shapes 1x1 .. 16x16 [GC-v5e][GC-v6e]."""
    dims = tuple(int(d) for d in dims)
    if chip.kind != Platform.TPU:
        raise ValueError(f"{chip.name} is not a TPU: it has no slice topologies")
    ok = len(dims) == chip.torus and all(d > 0 for d in dims) and (
        tuple(sorted(dims)) in {tuple(sorted(t)) for t in chip.small_topologies}
        or (chip.cube is not None and all(d % chip.cube == 0 for d in dims)
            and chips_in(dims) <= chip.max_slice_chips))
    if not ok:
        raise ValueError(f"{chip.name} has no topology {'x'.join(map(str, dims))}; valid: {valid_topologies(chip)}")
    return dims


def parse_topology(chip: Chip, text: str) -> tuple[int, ...]:
    """``"4x4x4"`` -> (4, 4, 4), checked against the chip's shapes (check_topology)."""
    try:
        dims = tuple(ascii_int(p) for p in str(text).strip().lower().split("x"))
    except ValueError:
        raise ValueError(f"bad topology {text!r} for {chip.name}; expected e.g. "
                         f"{'x'.join(map(str, chip.small_topologies[-1]))}") from None
    return check_topology(chip, dims)


def slice_topology(chip: Chip, chips: int) -> tuple[int, ...]:
    """The shape of a single slice of ``chips`` chips: the documented shape of that size, else the
    most cube-like shape of whole cubes (3D chips; e.g. v5p 4480 chips -> 8x20x28). ValueError when the
    chip has no slice of that size."""
    if isinstance(chips, bool) or not isinstance(chips, int) or chips <= 0:
        raise ValueError(f"chip count must be a positive integer, got {chips!r}")
    for t in chip.small_topologies:
        if chips_in(t) == chips:
            return t
    cube = chip.cube
    if cube and chips % cube**3 == 0 and chips <= chip.max_slice_chips:
        n, best = chips // cube**3, None
        for a in range(1, n + 1):
            for b in range(a, n // a + 1):
                if n % (a * b) == 0 and n // (a * b) >= b:
                    c = n // (a * b)
                    if best is None or c / a < best[0]:
                        best = (c / a, (cube * a, cube * b, cube * c))
        return best[1]
    sizes = sorted({chips_in(t) for t in chip.small_topologies})
    more = f" or a multiple of {cube**3} up to {chip.max_slice_chips}" if cube else ""
    raise ValueError(f"{chip.name} has no slice of {chips} chips: use one of {sizes}{more}")


def split_slices(chip: Chip, chips: int) -> tuple[int, tuple[int, ...]]:
    """(number of slices, shape of each) for ``chips`` chips: one slice where one can hold them, else the
    fewest equal slices of the largest sizes the chip has, joined by DCN (e.g. 1024 v6e chips ->
    4 slices of 16x16). ValueError when no split exists."""
    try:
        return 1, slice_topology(chip, chips)
    except ValueError:
        pass
    for n in range(2, chips + 1):
        if chips % n == 0 and chips // n <= chip.max_slice_chips:
            try:
                return n, slice_topology(chip, chips // n)
            except ValueError:
                continue
    raise ValueError(f"{chips} {chip.name} chips cannot be split into slices of the shapes it has "
                     f"({valid_topologies(chip)})")


def parse_slice(name: str) -> tuple[Chip, tuple[int, ...]]:
    """A Cloud TPU slice name -> (chip, physical shape): ``v5p-256`` counts TensorCores, 2 per chip, so it
    is 128 chips, 4x4x8 [GC-v5p]; ``v6e-16`` counts chips, 4x4 [GC-v6e]; ``v5litepod-16``, ``v4-8``,
    ``tpu7x-8`` (2x2x1); or the topology (GKE's and XPK's accelerator type): ``tpu7x-4x4x4`` is 64 chips, 4x4x4,
    ``v6e-16x16`` 256 chips. ValueError naming the valid forms otherwise."""
    s = str(name).strip().lower()
    prefix, _, count = s.rpartition("-")
    for chip in _tpus():
        if prefix in {chip.slice_prefix, chip.name.lower(), *chip.aliases}:
            dims = count.split("x")
            if len(dims) > 1 and all(d.isascii() and d.isdigit() and int(d) > 0 for d in dims):
                if len(dims) != chip.torus:
                    raise ValueError(f"bad slice {name!r}: a {chip.name} topology has {chip.torus} dimensions")
                return chip, tuple(int(d) for d in dims)
            if not (count.isascii() and count.isdigit()) or int(count) <= 0:
                break
            n = int(count)
            per = chip.cores_per_chip if chip.slice_counts_cores else 1
            if n % per:
                raise ValueError(f"bad slice {name!r}: {chip.slice_prefix}-N counts TensorCores, {per} per chip")
            return chip, slice_topology(chip, n // per)
    forms = ", ".join(f"{c.slice_prefix}-<{'TensorCores' if c.slice_counts_cores else 'chips'}>" for c in _tpus())
    raise ValueError(f"unknown slice {name!r}; expected {forms} or <prefix>-<topology>, e.g. v5p-256 (128 chips) "
                     "or tpu7x-4x4x4 (64 chips)")


def slice_name(chip: Chip, chips: int) -> str | None:
    """The Cloud TPU accelerator type of ``chips`` chips (v5p-<2·chips>, v6e-<chips>); for more chips
    than one slice of the chip's shapes holds, "<n> x <slice>" (split_slices); None for GPUs."""
    if chip.kind != Platform.TPU:
        return None
    n, dims = split_slices(chip, chips)
    name = f"{chip.slice_prefix}-{chips_in(dims) * (chip.cores_per_chip if chip.slice_counts_cores else 1)}"
    return name if n == 1 else f"{n} x {name}"
