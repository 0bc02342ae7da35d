"""Devices, meshes (axes data, fsdp, tensor) and the logical-axis -> mesh-axis table.

Importing this package does not import jax (jax is imported inside the functions that need it).
"""

from mesh.devices import get_devices, make_mesh, maybe_initialize_distributed, mesh_shape  # noqa: F401
from mesh.rules import LOGICAL_RULES, logical_to_spec, mesh_axes  # noqa: F401
