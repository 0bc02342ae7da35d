"""The workload: FFN stack dimensions, precision policy, remat policy and mesh shape.

Pure Python; the single source of the model presets, the precision policy, the remat policy names and
the mesh axis names that the closed forms (``scaling``), the meshes (``mesh``) and the model
(``ffn_model``) all use.

Notation (Scaling Book, "How to Scale Your Model", jax-ml.github.io/scaling-book/training/):
D = d_model, F = d_ff, L = blocks; a block is two bias-free linear layers D -> F -> D, so the
parameter count is P = 2·D·F·L.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scaling.sharding import LOGICAL_RULES, shards

# The mesh axes, outermost first (MaxText's names). Each is an entry of this one tuple; the sharding
# table (scaling.sharding) says what each one splits.
MESH_AXES = ("data", "stage", "fsdp", "tensor")
REMAT_POLICIES = ("none", "every-second", "full")


def positive_int(name: str, value) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def positive_ints(name: str, value):
    """``value`` if it is a positive integer or a numpy array of them (the planner evaluates many batch
    sizes at once), else ValueError naming ``name``."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu" or not (value > 0).all():
            raise ValueError(f"{name} must hold positive integers, got {value!r}")
        return value
    return positive_int(name, value)


def non_negative_int(name: str, value) -> int:
    """Return ``value`` if it is an integer >= 0 (a seed, a count of warm-up steps), else raise
    ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def positive_float(name: str, value) -> float:
    """Return ``value`` as a float if it is a finite positive number, else raise ValueError naming ``name``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not (v > 0 and v != float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


@dataclass(frozen=True)
class FFNConfig:
    """An FFN stack: ``blocks`` blocks of x·W_in (D×F) then ·W_out (F×D), no biases.

    P = 2·D·F·L parameters (questions-4d.md, "The model").
    ``activation`` is None (the question's model: no nonlinearity) or a jax.nn function name.
    """

    d_model: int
    d_ff: int
    blocks: int
    activation: str | None = None

    def __post_init__(self):
        for name in ("d_model", "d_ff", "blocks"):
            positive_int(name, getattr(self, name))

    @property
    def params(self) -> int:
        """P = 2·D·F·L."""
        return 2 * self.d_model * self.d_ff * self.blocks

    @property
    def params_per_block(self) -> int:
        """2·D·F."""
        return 2 * self.d_model * self.d_ff

    def replace(self, **kw) -> "FFNConfig":
        return dataclasses.replace(self, **{k: v for k, v in kw.items() if v is not None})


PRESETS: dict[str, FFNConfig] = {
    # The question's model (questions-4d.md): D=16384, F=53248, L=126 -> P = 219,848,638,464.
    "xxl": FFNConfig(d_model=16384, d_ff=53248, blocks=126),
    # XXL width, two blocks: the GPU benchmark configuration.
    "xxl-2": FFNConfig(d_model=16384, d_ff=53248, blocks=2),
    # Small configurations for emulated-device tests; dims divisible by 8 shards.
    "small": FFNConfig(d_model=256, d_ff=1024, blocks=4),
    "tiny": FFNConfig(d_model=64, d_ff=256, blocks=3),
}


def get_preset(name: str) -> FFNConfig:
    """The preset named ``name``; ValueError listing the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None


@dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of state (questions-4d.md: FP32 master weights, gradients and
    Adam moments; BF16 activations and gradient communication)."""

    master: int = 4
    grad: int = 4
    adam_moment: int = 4
    adam_moments: int = 2
    compute: int = 2
    grad_comm: int = 2
    weight_comm: int = 2

    @property
    def state_bytes_per_param(self) -> int:
        """master + grad + moments·moment = 4 + 4 + 2·4 = 16 bytes/param (training page)."""
        return self.master + self.grad + self.adam_moments * self.adam_moment

    @property
    def stored_bytes_per_param(self) -> int:
        """What persists between steps: master + moments = 12 bytes/param (gradients are transient)."""
        return self.master + self.adam_moments * self.adam_moment


DEFAULT_PRECISION = Precision()


def check_remat(remat: str) -> str:
    """Validate a remat policy name: none, every-second (keep every second block's activations,
    recompute the others), full (keep only each block's input)."""
    if remat not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {remat!r}; valid: {', '.join(REMAT_POLICIES)}")
    return remat


def saved_blocks(blocks: int, remat: str) -> tuple[int, int]:
    """(blocks that save input and hidden, blocks that save only their input) under a remat policy.

    none: every block keeps x and h. full: every block keeps only x (h is recomputed).
    every-second: blocks are taken in pairs (first checkpointed, second not); an odd last block is
    checkpointed: floor(L/2) full, ceil(L/2) input-only.
    """
    check_remat(remat)
    if remat == "none":
        return blocks, 0
    if remat == "full":
        return 0, blocks
    return blocks // 2, blocks - blocks // 2



class MeshShape(Mapping):
    """Sizes of the mesh axes: a read-only mapping over MESH_AXES (outermost first), every axis present;
    an axis not given has size 1 and costs nothing. ``shape["fsdp"]`` or ``shape.fsdp``;
    N = ``shape.devices`` (the product). The closed forms take any mapping of axis sizes, numpy arrays
    included (the planner evaluates many meshes at once); this class is the validated scalar one."""

    __slots__ = ("_sizes",)

    def __init__(self, sizes: Mapping | None = None, /, **kw):
        given = {**(sizes or {}), **kw}
        unknown = [a for a in given if a not in MESH_AXES]
        if unknown:
            raise ValueError(f"unknown mesh axis {unknown[0]!r}; valid axes: {', '.join(MESH_AXES)}")
        object.__setattr__(self, "_sizes", tuple(positive_int(f"mesh axis {a!r}", given.get(a, 1)) for a in MESH_AXES))

    def __getitem__(self, axis: str) -> int:
        try:
            return self._sizes[MESH_AXES.index(axis)]
        except ValueError:
            raise KeyError(axis) from None

    def __getattr__(self, axis: str) -> int:
        if axis in MESH_AXES:
            return self[axis]
        raise AttributeError(axis)

    def __setattr__(self, name, value):
        raise AttributeError("MeshShape is immutable")

    def __iter__(self):
        return iter(MESH_AXES)

    def __len__(self) -> int:
        return len(MESH_AXES)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self) == {a: other.get(a, 1) for a in MESH_AXES} and all(
            a in MESH_AXES for a in other)

    def __hash__(self) -> int:
        return hash(self._sizes)

    def __repr__(self) -> str:
        return f"MeshShape({', '.join(f'{a}={n}' for a, n in self.items())})"

    @property
    def devices(self) -> int:
        """N, the product of the axis sizes."""
        return math.prod(self._sizes)

    def as_dict(self) -> dict[str, int]:
        return dict(self)

    def __str__(self) -> str:
        return ",".join(f"{a}={n}" for a, n in self.items() if n > 1) or "1 device"


def parse_mesh_spec(spec: str, devices: int | None = None) -> MeshShape:
    """Parse ``"fsdp=16,tensor=4"`` into a MeshShape. Axes not named have size 1.

    If ``devices`` is given the product of the axis sizes must equal it. A single axis may be
    given as ``-1`` to take the remaining devices.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mesh spec must look like 'fsdp=4,tensor=2', got {spec!r}")
    sizes: dict[str, int] = {}
    for part in spec.split(","):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"mesh spec item {part!r} must be axis=size (axes: {', '.join(MESH_AXES)})")
        if key not in MESH_AXES:
            raise ValueError(f"unknown mesh axis {key!r} in {spec!r}; valid axes: {', '.join(MESH_AXES)}")
        if key in sizes:
            raise ValueError(f"mesh axis {key!r} given twice in {spec!r}")
        try:
            n = int(val)
        except ValueError:
            raise ValueError(f"mesh axis {key!r} size must be an integer, got {val!r}") from None
        if n == -1:
            if devices is None or -1 in sizes.values():
                raise ValueError(f"mesh axis {key!r} = -1 needs a device count and only one -1 axis")
        elif n <= 0:
            raise ValueError(f"mesh axis {key!r} size must be positive, got {n}")
        sizes[key] = n
    if -1 in sizes.values():
        rest = 1
        for n in sizes.values():
            rest *= n if n > 0 else 1
        if devices % rest:
            raise ValueError(f"mesh {spec!r}: {devices} devices are not divisible by {rest}")
        sizes = {k: (devices // rest if v == -1 else v) for k, v in sizes.items()}
    shape = MeshShape(**sizes)
    if devices is not None and shape.devices != devices:
        raise ValueError(
            f"mesh {spec!r} has {shape.devices} devices (product of axis sizes) but {devices} devices are given"
        )
    return shape


FSDP_GATHERS = ("microbatch", "step")


@dataclass(frozen=True)
class Schedule:
    """How one train step runs its batch (Scaling Book applied-training page; MaxText's pipeline):

    microbatches M  the batch in M microbatches of B/M tokens. Without a stage axis: gradient
                    accumulation (M forward/backward passes, one optimizer update, one microbatch's
                    activations live at a time). With stage > 1: the pipeline's microbatches.
    repeats R       circular (interleaved) pipeline: each stage holds R non-adjacent chunks of
                    L/(S·R) blocks (stage s holds chunks s, S+s, 2S+s, ...); R = 1 is GPipe.
    fsdp_gather     "microbatch": every block gathers its weights over fsdp each time it runs (per
                    microbatch, per pipeline iteration); "step": a stage gathers all its weights once
                    per step and keeps them for every microbatch (pipeline only).
    """

    microbatches: int = 1
    repeats: int = 1
    fsdp_gather: str = "microbatch"

    def __post_init__(self):
        positive_ints("microbatches", self.microbatches)  # the planner passes a numpy array of candidates
        positive_int("repeats", self.repeats)
        if self.fsdp_gather not in FSDP_GATHERS:
            raise ValueError(f"fsdp_gather must be one of {', '.join(FSDP_GATHERS)}, got {self.fsdp_gather!r}")

    def check(self, cfg: FFNConfig, mesh: Mapping, batch_tokens: int | None = None) -> "Schedule":
        """ValueError naming the input when the schedule cannot run ``cfg`` on ``mesh``: the stages must
        split the blocks evenly, the repeats the blocks of a stage, a circular pipeline needs at least
        as many microbatches as stages, B must split into M microbatches over data·fsdp."""
        S, M, R, L = mesh.get("stage", 1), self.microbatches, self.repeats, cfg.blocks
        if L % S:
            divisors = ", ".join(str(k) for k in range(1, L + 1) if L % k == 0)
            raise ValueError(f"blocks={L} cannot be split evenly over stage={S}; use a stage count that divides "
                             f"{L} ({divisors})")
        if R > 1 and S == 1:
            raise ValueError(f"repeats={R} needs a stage axis (circular pipeline); without one use repeats=1")
        if (L // S) % R:
            raise ValueError(f"repeats={R} must divide the {L // S} blocks of each of the {S} stages")
        if R > 1 and np.any(np.asarray(M) < S):
            raise ValueError(f"a circular pipeline (repeats={R}) needs microbatches >= stages: {M} < {S}")
        if self.fsdp_gather == "step" and S == 1:
            raise ValueError("fsdp_gather='step' (weights gathered once per step) is for pipelined stages: "
                             "without a stage axis every microbatch gathers them")
        if batch_tokens is not None:
            n = M * shards(mesh, "batch")
            if positive_int("batch_tokens", batch_tokens) % n:
                raise ValueError(f"batch_tokens={batch_tokens} is not divisible by microbatches·data·fsdp = {n}")
        return self


def check_divisible(cfg: FFNConfig, mesh: Mapping, batch_tokens: int | None = None) -> None:
    """Every sharded dimension must divide by its shard count, through the sharding table
    (scaling.sharding): D by the shards of ``embed``, F by those of ``mlp``, B by those of ``batch``."""
    checks = [("d_model", cfg.d_model, "embed"), ("d_ff", cfg.d_ff, "mlp")]
    if batch_tokens is not None:
        positive_int("batch_tokens", batch_tokens)
        checks.append(("batch_tokens", batch_tokens, "batch"))
    for name, dim, logical in checks:
        n = shards(mesh, logical)
        if dim % n:
            axes = "·".join(LOGICAL_RULES[logical])
            raise ValueError(f"{name}={dim} is not divisible by the {axes} shard count {n}")
