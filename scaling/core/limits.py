"""The input rules every command applies, in one place: how a number is written, the range of each kind of
flag value, and the sizes jax and XLA can count. Pure Python (no jax; at import only scaling.core.inputs, the number
syntax), so the config, hardware and mesh parsers and every command line use the same rules.

    integers      ASCII digits only ("４" is a full-width digit: int() takes it, a shell user did not mean it)
    counts        every integer flag positive and below 2^31 (jax without 64-bit mode takes a Python int as
                  int32), but for the few that may be 0 (ZERO_OK)
    figures       every float flag finite, positive and a float32; a figure inside its unit's range (FIGURES:
                  ``--flops 460`` is TFLOP/s given where FLOP/s is asked)
    text          no empty value and no control character (a newline in a directory name)
    sizes         check_size: the step's block count and arrays below what jax and XLA count; check_gemm: one GEMM's
                  operands within one device's memory
"""

from __future__ import annotations

import math
import os
import unicodedata

from scaling.core.inputs import ascii_float, ascii_int

INT32_LIMIT = 2**31  # jax without 64-bit mode takes a Python int as int32: the layer scan's length L, any count
EXTENT_LIMIT = 2**63  # XLA's "static extent product" (an array's elements) is an int64
MAX_DEVICES = 2**20  # the planner enumerates the meshes of a chip count's divisors; 1,048,576 chips is 20 times
# the largest training run published (50,944 TPU v5e chips, Google Cloud, Nov 2023)

# integer flags (argparse dest) that may be 0 (their own rules refuse a negative one, with their own words); a seed
# has its own upper bound too (scaling.core.inputs.MAX_SEED, 2^32 - 1)
ZERO_OK = frozenset({"seed", "verify_top", "process_id", "warmup"})

# float flags that are hardware figures (argparse dest): (what, unit, least, most). The range is a factor of
# about 1,000 around every chip of the hardware table (scaling/data/chips.toml: C from 1.97e14 (v5e) to 2.3e15
# FLOP/s, links from 2.5e10 to 9e11 B/s, HBM from 1.6e10 to 1.9e11 B): a value outside it is in another unit.
FIGURES = {
    "flops": ("C, a chip's bf16 rate", "FLOP/s", 1e11, 1e18),
    "w_ici": ("W_ici, a chip's bidirectional ICI bandwidth", "bytes/s", 1e8, 1e15),
    "hbm": ("the memory per device", "bytes", 1e8, 1e15),
    "gpu_hbm": ("the memory per GPU", "bytes", 1e8, 1e15),
    "inter_node_bandwidth": ("a node's network bandwidth", "bytes/s", 1e8, 1e15),
    "vector_tflops": ("the chip's rate off the tensor cores", "TFLOP/s", 0.1, 1e4),
    "process_timeout": ("how long a process waits for its peers", "seconds", 1e-3, 1e6),
}
FP32_MAX = 3.4028234663852886e38  # the largest finite float32: what jax computes a float flag in


def integer(text: str) -> int:
    """argparse's type for an integer flag: ascii_int (argparse's message names it: "invalid int value")."""
    return ascii_int(text)


def number(text: str) -> float:
    """argparse's type for a float flag: ascii_float (argparse's message names it: "invalid float value")."""
    return ascii_float(text)


integer.__name__, number.__name__ = "int", "float"


def check_flag(dest: str, value) -> str | None:
    """The one rule for a flag's value (argparse ``dest`` and its parsed value), or None where it holds: an int
    positive (or >= 0 for ZERO_OK) and below INT32_LIMIT; a float finite and positive and, for a hardware figure
    (FIGURES), inside its unit's range; a string neither empty nor holding a control character."""
    name = "--" + dest.replace("_", "-")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        if dest == "seed" or (dest in ZERO_OK and value < 0):
            return None
        if value <= 0 and dest not in ZERO_OK:
            return f"{name} must be a positive integer, got {value}"
        if value >= INT32_LIMIT:
            return (f"{name} must be below 2^31 = {INT32_LIMIT:,} (every count this package takes fits jax's default "
                    f"int32), got {value:,}")
        return None
    if isinstance(value, float):
        if not (math.isfinite(value) and value > 0):
            return f"{name} must be a positive finite number, got {value}"
        if value > FP32_MAX:
            return f"{name} must be below 3.4e38 (float32's largest, what jax computes it in), got {value:g}"
        if dest in FIGURES:
            what, unit, least, most = FIGURES[dest]
            if not least <= value <= most:
                return (f"{name} is {what} in {unit}, between {least:.0e} and {most:.0e}; got {value:g} (another "
                        "unit? write 4.59e14 for 459 TFLOP/s, 1.8e11 for 180 GB/s, 9.5e10 for 95 GB)")
        return None
    if isinstance(value, str):
        return check_text(name, value)
    if isinstance(value, list):
        for v in value:
            if (why := check_flag(dest, v)) is not None:
                return why
    return None


def check_text(name: str, value: str) -> str | None:
    """Why ``value`` (a flag's text) is refused, or None: empty or blank, or holding a control character
    (Unicode category Cc: a newline, a tab, an escape)."""
    if not value.strip():
        return f"{name} must not be empty"
    bad = next((c for c in value if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        return f"{name} {value!r} holds a control character ({bad!r}); give printable characters"
    return None


def host_memory_bytes() -> int:
    """This host's physical memory (os.sysconf: SC_PHYS_PAGES · SC_PAGE_SIZE), which emulated CPU devices share."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_devices(name: str, n: int) -> int:
    """``n`` devices, or ValueError above MAX_DEVICES (the planner's enumeration and any machine built)."""
    if n > MAX_DEVICES:
        raise ValueError(f"{name} {n:,} is more devices than this package plans for: at most 2^20 = {MAX_DEVICES:,} "
                         "(20 times the largest training run published, 50,944 TPU v5e chips)")
    return n


def check_gemm(m: int, n: int, k: int, element_bytes: int, memory: float, device: str) -> None:
    """ValueError (naming --gemm) where one GEMM [m, k]·[k, n] cannot run as one kernel on one device: a dimension of
    2^31 or more (INT32_LIMIT, every count's rule), or its operands and result, element_bytes·(m·k + k·n + m·n) (the
    bytes scaling.step.kernels.shape_costs moves), above the device's ``memory`` (bytes; ``device`` names it)."""
    text = f"{m}x{n}x{k}"
    if max(m, n, k) >= INT32_LIMIT:
        raise ValueError(f"--gemm {text}: each of M, N, K must be below 2^31 = {INT32_LIMIT:,} (every count's rule)")
    need = element_bytes * (m * k + k * n + m * n)
    if need > memory:
        raise ValueError(f"--gemm {text}: its operands and result take {need / 1e9:.3g} GB, more than the "
                         f"{memory / 1e9:.3g} GB of one {device}: no GEMM kernel of that size runs")


def check_size(w) -> None:
    """ValueError when a step is too large to build, before jax sees it: L of 2^31 blocks or more (INT32_LIMIT);
    a global array of 2^63 elements or more (EXTENT_LIMIT), the largest being the activations B·max(D, F, N·H),
    a weight stack L·D·max(F, N·H) and a transformer's attention scores B·N·T (one layer's, or flash attention's
    key blocks stacked for the backward) and logits B·V; more than MAX_DEVICES devices. Every command that builds a
    Workload calls it (a run on emulated CPU devices check_host_memory too)."""
    cfg = w.model
    B, L = w.batch_tokens, cfg.blocks
    if L >= INT32_LIMIT:
        raise ValueError(f"blocks={L:,} is too many: the scan over the blocks counts them in a 32-bit integer, "
                         f"below 2^31 = {INT32_LIMIT:,}")
    name, n = max(cfg.extents(B).items(), key=lambda kv: kv[1])  # the family's largest arrays
    if n >= EXTENT_LIMIT:
        raise ValueError(f"the step's {name} hold {n:.3g} elements; XLA counts an array's elements in 64 bits, "
                         f"below 2^63 = {EXTENT_LIMIT:.3g}: use a smaller model or batch")
    check_devices("the mesh's", w.mesh.devices)


def check_host_memory(step: str, need: float, cpu_devices: int) -> None:
    """ValueError when a run that allocates on ``cpu_devices`` emulated CPU devices needs more than this host's memory
    (host_memory_bytes): ``need`` bytes per device (the closed form, scaling.step.program.predict) times the devices."""
    have = host_memory_bytes()
    if need * cpu_devices > have:
        raise ValueError(f"the {step} step needs {need / 1e9:.4g} GB per device (closed form), "
                         f"{need * cpu_devices / 1e9:.4g} GB on {cpu_devices} CPU devices, "
                         "which share this host's memory: "
                         f"{have / 1e9:.4g} GB: use a smaller model or batch (compile allocates none of it)")
