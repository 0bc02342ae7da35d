"""Devices (emulated CPU, any TPU topology libtpu compiles for, the real ones), meshes over the axes of
scaling.core.mesh_shape.MESH_AXES, the ICI layout of each mesh axis, and the logical-axis table in jax's and
flax's forms.

Importing this package does not import jax (jax is imported inside the functions that need it, so a
command line can check its flags before jax starts).
"""

from mesh.devices import (device_count, get_devices, ici_layout, is_emulated, make_mesh, # noqa: F401,
                          maybe_initialize_distributed, mesh_shape)
from mesh.rules import FLAX_RULES, check_logical, logical_to_spec  # noqa: F401
