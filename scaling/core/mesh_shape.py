"""The mesh's shape: the axis names (MESH_AXES, outermost first), the validated sizes of one mesh (MeshShape),
its spec's syntax (parse_mesh_spec) and whether an axis splits anything (spans). Pure Python and numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from scaling.core.inputs import ascii_int, positive_int

# The mesh axes, outermost first (MaxText's names). Each is an entry of this one tuple; the sharding
# table (scaling.core.sharding) says what each one splits. expert (an MoE model's experts, scaling.families.moe) sits
# next to tensor, so that its all-to-alls run on the nearest links.
MESH_AXES = ("data", "stage", "fsdp", "context", "expert", "tensor")


class MeshGrid(dict):
    """Sizes of the mesh axes over many meshes at once, the planner's groups (scaling.planner.plan): {axis: a size
    or a numpy array of sizes}, every axis of MESH_AXES present, the arrays broadcasting against each other. Checked
    by the planner, not here; a dict, so the closed forms read it as fast as a plain one."""


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
        # {axis: size} in MESH_AXES's order: the closed forms read it tens of thousands of times a plan
        object.__setattr__(self, "_sizes", {a: positive_int(f"mesh axis {a!r}", given.get(a, 1)) for a in MESH_AXES})

    def __getitem__(self, axis: str) -> int:
        return self._sizes[axis]

    def get(self, axis: str, default=None):
        return self._sizes.get(axis, default)

    def __getattr__(self, axis: str) -> int:
        if axis in MESH_AXES:
            return self[axis]
        raise AttributeError(axis)

    def __setattr__(self, name, value):
        raise AttributeError("MeshShape is immutable")

    def __reduce__(self):  # copy, deepcopy and pickle rebuild it from its sizes (its __setattr__ refuses theirs)
        return MeshShape, (dict(self),)

    def __iter__(self):
        return iter(MESH_AXES)

    def __len__(self) -> int:
        return len(MESH_AXES)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self) == {a: other.get(a, 1) for a in MESH_AXES} and all(
            a in MESH_AXES for a in other)

    def __hash__(self) -> int:
        return hash(tuple(self._sizes.values()))

    def __repr__(self) -> str:
        return f"MeshShape({', '.join(f'{a}={n}' for a, n in self.items())})"

    @property
    def devices(self) -> int:
        """N, the product of the axis sizes."""
        return math.prod(self._sizes.values())

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
            n = ascii_int(val)
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


def spans(size) -> bool:
    """Whether a mesh axis of ``size`` devices splits anything (size > 1): an int, or the planner's array of one
    axis's sizes over a group of meshes, all > 1 or all 1 (scaling.planner.plan groups them so; ValueError
    otherwise)."""
    if isinstance(size, (int, np.integer)):
        return bool(size > 1)
    size = np.asarray(size)
    if size.min() > 1:
        return True
    if size.max() <= 1:
        return False
    raise ValueError("a group of meshes mixes sizes of 1 and > 1 on one axis")
