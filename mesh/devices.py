"""Devices and meshes: the process's real devices, N emulated CPU devices, or a TPU v5p topology for
ahead-of-time compilation from a machine without TPUs.

Device specs accepted by :func:`make_mesh`:
  None                  the process's real devices (jax.devices(): GPU, TPU slice, or CPU)
  a list of jax devices those devices
  "cpu:N"               N emulated CPU devices (must be asked for before jax's backend starts)
  "tpu:v5p:4x4x4"       the 64 devices of a v5p 4x4x4 slice, from libtpu's topology description;
  "tpu:v5p-128", "v5p-128", "tpu:4x4x4"
                        slice names count TensorCores (2 per chip): v5p-128 = 64 chips = 4x4x4.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile

from scaling.config import MESH_AXES, MeshShape, parse_mesh_spec, positive_int
from scaling.hardware import chips_in, parse_v5p_slice


def _emulated_cpu_devices(n: int) -> list:
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", n)
    have = jax.devices("cpu")
    if len(have) != n:
        raise ValueError(
            f"devices 'cpu:{n}': jax's CPU backend is already running with {len(have)} devices; "
            f"ask for cpu:{n} before any jax computation (or run in a fresh process)"
        )
    return list(have)


def has_libtpu() -> bool:
    """Whether libtpu (the tpu extra) is installed: needed to compile for a TPU topology."""
    return importlib.util.find_spec("libtpu") is not None


def _tpu_topology_devices(name: str, verbose: bool = False) -> list:
    s = name.strip().lower()
    if s.startswith("v5p:"):
        s = s[4:]
    dims = parse_v5p_slice(s)
    if not has_libtpu():
        raise ValueError(
            f"devices 'tpu:{name}' need libtpu to compile for a TPU topology; "
            "install the tpu extra: pip install -e '.[tpu]'"
        )
    # Ahead-of-time compilation touches no TPU: let several processes (pytest and a notebook kernel,
    # say) load libtpu at once instead of failing on its /tmp/libtpu_lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    topo_name = "v5p:" + "x".join(str(d) for d in dims)
    try:
        with _native_stderr(verbose):
            return list(topologies.get_topology_desc(platform="tpu", topology_name=topo_name).devices)
    except Exception as e:  # libtpu rejects unknown shapes with various error types
        raise ValueError(f"libtpu cannot describe TPU topology {topo_name!r}: {str(e).splitlines()[0]}") from None


@contextlib.contextmanager
def _native_stderr(verbose: bool):
    """Unless ``verbose``, send what native code writes to file descriptor 2 to a temporary file that is
    then discarded. libtpu, loaded on a machine without TPUs to compile ahead of time, writes lines
    about TPU hosts it cannot find (``Failed to find host bounds ...``, ``E0000 ... unexpected worker
    hostname``, a source-location trace) that say nothing about the compile."""
    if verbose:
        yield
        return
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def cpu_device_count(devices, name: str = "devices") -> int | None:
    """N of a "cpu:N" spec (ValueError naming ``name`` for an N that is not a positive integer), None
    for any other spec. Needs no jax, so a command line can check its flags before jax starts."""
    if not isinstance(devices, str) or not devices.strip().lower().startswith("cpu:"):
        return None
    try:
        n = int(devices.strip()[4:])
    except ValueError:
        raise ValueError(f"{name} {devices!r}: expected cpu:N with N a positive integer") from None
    return positive_int(f"{name} {devices!r}: N", n)


def device_count(devices) -> int | None:
    """How many devices a device spec names, checked without starting jax (so a command line can
    reject a bad --devices before it prints or compiles anything): cpu:N -> N; a TPU topology -> its
    chips (libtpu must be installed); None for the process's real devices (None, or a device list's
    length). ValueError naming the spec otherwise."""
    if devices is None:
        return None
    if not isinstance(devices, str):
        return len(devices)
    s = devices.strip()
    low = s.lower()
    if low.startswith("cpu:"):
        return cpu_device_count(devices, "devices")
    if low.startswith(("tpu:", "v5p")):
        name = s[4:] if low.startswith("tpu:") else s
        dims = parse_v5p_slice(name[4:] if name.lower().startswith("v5p:") else name)
        if not has_libtpu():
            raise ValueError(f"devices {devices!r} need libtpu to compile for a TPU topology; "
                             "install the tpu extra: pip install -e '.[tpu]'")
        return chips_in(dims)
    raise ValueError(
        f"unknown devices {devices!r}; use cpu:N, tpu:v5p:4x4x4, tpu:v5p-128 (TensorCores), "
        "or leave it out for the process's real devices"
    )


def get_devices(devices=None, verbose: bool = False) -> list:
    """The device list for a device spec (see the module docstring). ``verbose``: let libtpu's start-up
    lines through (a TPU topology; they are discarded otherwise)."""
    import jax

    if devices is None:
        return list(jax.devices())
    if not isinstance(devices, str):
        return list(devices)
    s = devices.strip()
    low = s.lower()
    if low.startswith("cpu:"):
        return _emulated_cpu_devices(cpu_device_count(devices))
    if low.startswith("tpu:"):
        return _tpu_topology_devices(s[4:], verbose)
    if low.startswith("v5p"):
        return _tpu_topology_devices(s, verbose)
    raise ValueError(
        f"unknown devices {devices!r}; use cpu:N, tpu:v5p:4x4x4, tpu:v5p-128 (TensorCores), "
        "or leave it out for the process's real devices"
    )


def make_mesh(spec, devices=None, verbose: bool = False):
    """A jax.sharding.Mesh with axes (data, fsdp, tensor) (Auto axis types) over ``devices``.

    ``spec`` is a string such as "fsdp=16,tensor=4" (axes left out have size 1) or a MeshShape.
    The product of the axis sizes must equal the number of devices (ValueError otherwise).

    Device order: ``mesh_utils.create_device_mesh`` maps the logical mesh onto the physical one.
    On a TPU topology the last mesh axes take whole physical axes first, so on v5p 4x4x4 with
    fsdp=16,tensor=4, tensor spans one physical axis (x, a ring of 4 with wraparound) and fsdp the
    other two (y, z: 16 chips, M_X = 2, M_Y = 1); scaling.check.ici_layout reads the layout back
    from the devices' coords. Shapes it cannot map without splitting a physical axis are mapped
    with split axes; elsewhere (CPU, GPU) the devices are taken in order.
    """
    import numpy as np
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh

    devs = get_devices(devices, verbose)
    shape = spec if isinstance(spec, MeshShape) else parse_mesh_spec(spec, len(devs))
    if shape.devices != len(devs):
        raise ValueError(
            f"mesh {str(spec)!r} has {shape.devices} devices (product of the axis sizes) "
            f"but {len(devs)} devices are available ({devices or 'real devices'})"
        )
    dims = tuple(getattr(shape, a) for a in MESH_AXES)
    try:
        arr = mesh_utils.create_device_mesh(dims, devices=devs)
    except (ValueError, NotImplementedError, AssertionError):
        try:
            arr = mesh_utils.create_device_mesh(dims, devices=devs, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError, AssertionError):
            arr = np.array(devs, dtype=object).reshape(dims)
    return Mesh(arr, MESH_AXES)


def mesh_shape(mesh) -> MeshShape:
    """The MeshShape (data, fsdp, tensor sizes) of a jax Mesh."""
    return MeshShape(**{a: int(mesh.shape[a]) for a in MESH_AXES})


def maybe_initialize_distributed() -> bool:
    """Call jax.distributed.initialize() when this process is one of several: a coordinator address
    in the environment (JAX_COORDINATOR_ADDRESS), or a multi-host Cloud TPU slice
    (TPU_WORKER_HOSTNAMES lists more than one host; jax detects the rest). Returns whether it did."""
    import jax

    multi_tpu = "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if os.environ.get("JAX_COORDINATOR_ADDRESS") or multi_tpu:
        jax.distributed.initialize()
        return True
    return False
