"""Devices and meshes: the process's real devices, N emulated CPU devices, or any TPU topology libtpu
compiles for (v4, v5e, v5p, v6e, TPU7x: every TPU row of scaling.hardware.chips), for ahead-of-time
compilation from a machine without TPUs; and the ICI layout of a mesh's axes, read from its devices.

Device specs accepted by :func:`make_mesh`:
  None                  the process's real devices (jax.devices(): GPU, TPU slice, or CPU)
  a list of jax devices those devices
  "cpu:N"               N emulated CPU devices (must be asked for before jax's backend starts)
  "tpu:<chip>:<shape>"  a slice of that shape, from libtpu's topology description: tpu:v5p:4x4x4,
                        tpu:v6e:4x4, tpu:v5e:2x2, tpu:v4:2x2x2, tpu:TPU7x:2x2x1 (2 devices per chip)
  "tpu:<slice>"         a Cloud accelerator type: tpu:v5p-128 (TensorCores: 64 chips, 4x4x4),
                        tpu:v6e-16 (chips), tpu:tpu7x-8; "v5p-128" and "tpu:4x4x4" (v5p) also work.
  "gpu:<chip>:<N>"      N GPUs of a GPU row with a compiler description (gpu:H100:512), in nodes of
                        GPU_NODE, from the CUDA plugin's topology description (jax-cuda12-plugin, no GPU
                        and no CUDA libraries needed): XLA's GPU compiler, ahead of time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile

from scaling.core.inputs import positive_int
from scaling.core.mesh_shape import MESH_AXES, MeshShape, parse_mesh_spec
from scaling.core.kinds import Platform
from scaling.core.limits import ascii_int
from scaling.hardware.chips import (CHIPS, DEFAULT_CHIP, GPU_NODE, Chip, chip_of_device_kind, chips_in, get_chip,
                                    parse_slice, parse_topology)


def _emulated_cpu_devices(n: int) -> list:
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # jax refuses a new count once its backends run: what they have is checked below
        pass
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


# Where `make` puts jax's CUDA plugin (pip install --target): off sys.path, so that jax does not load it on every
# start (on a machine without a GPU it logs the missing CUDA driver, and a traceback when it probes for CUDA), and
# loaded only to compile for GPUs (cuda_aot_dir). The cuda-aot extra installs it on sys.path instead.
CUDA_AOT_DIR = os.path.join(sys.prefix, "cuda-aot")


def cuda_aot_dir() -> str | None:
    """The directory holding jax's CUDA plugin off sys.path (CUDA_AOT_DIR, or $JAX_CUDA_AOT_DIR), if it does."""
    d = os.environ.get("JAX_CUDA_AOT_DIR", CUDA_AOT_DIR)
    return d if os.path.isdir(os.path.join(d, "jax_plugins", "xla_cuda12")) else None


def _cuda_plugin_on_path() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins namespace package at all
        return False


def has_cuda_plugin() -> bool:
    """Whether jax's CUDA plugin is installed (the cuda-aot extra, or in cuda_aot_dir): needed to compile for GPUs
    ahead of time."""
    return cuda_aot_dir() is not None or _cuda_plugin_on_path()


def _load_cuda_plugin() -> None:
    """Make the CUDA plugin's topology factory available: a plugin on sys.path is registered by jax's plugin
    discovery; one in cuda_aot_dir is put on sys.path and registered by hand (its initialize(), what jax's discovery
    calls) where discovery did not find it (it ran before, or jax looked for plugins before the path was there)."""
    d = cuda_aot_dir()
    if d is None:
        return  # on sys.path (the cuda-aot extra): jax's discovery registers it
    if d not in sys.path:
        if _cuda_plugin_on_path():
            return  # on sys.path as well
        sys.path.append(d)
    from jax._src import xla_bridge

    xla_bridge._discover_and_register_pjrt_plugins()  # once per process (jax's own, idempotent)
    if "cuda" not in getattr(xla_bridge, "_topology_factories", {}):  # discovery ran before, or without the path
        importlib.import_module("jax_plugins.xla_cuda12").initialize()


def gpu_target_config(chip: Chip) -> str:
    """The GpuTargetConfigProto (text) XLA's GPU compiler compiles for when no GPU is present: the chip's
    ``gpu_target`` row of the hardware table, its memory bandwidth the row's hbm_bw."""
    t = dict(chip.gpu_target)
    if not t:
        raise ValueError(f"the hardware table has no compiler description of {chip.name} (gpu_target); "
                         f"GPUs with one: {', '.join(c.name for c in CHIPS.values() if c.gpu_target)}")
    (major, minor), (dnn_major, dnn_minor) = t.pop("compute_capability"), t.pop("dnn_version")
    name = t.pop("description")
    info = "".join(f"  {k}: {v}\n" for k, v in {**t, "memory_bandwidth": int(chip.hbm_bw)}.items())
    return (f"gpu_device_info {{\n{info}  cuda_compute_capability {{ major: {major} minor: {minor} }}\n}}\n"
            f'platform_name: "CUDA"\ndnn_version_info {{ major: {dnn_major} minor: {dnn_minor} }}\n'
            f'device_description_str: "{name}"\n')


def parse_gpu_spec(spec: str) -> tuple[Chip, int]:
    """"gpu:<chip>:<N>" -> (chip, N), checked against the hardware table without jax: a GPU row with a compiler
    description, N a positive multiple of GPU_NODE (or fewer GPUs, one node). ValueError otherwise."""
    _, _, body = str(spec).strip().partition(":")
    name, sep, count = body.partition(":")
    if not sep:
        raise ValueError(f"devices {spec!r}: expected gpu:<chip>:<N>, e.g. gpu:H100:512")
    chip = get_chip(name)
    if chip.kind != Platform.GPU:
        raise ValueError(f"devices {spec!r}: {chip.name} is not a GPU; use tpu:{chip.name}:<shape>")
    gpu_target_config(chip)
    try:
        n = positive_int(f"devices {spec!r}: N", ascii_int(count))
    except ValueError:
        raise ValueError(f"devices {spec!r}: N must be a positive integer") from None
    if n > GPU_NODE and n % GPU_NODE:
        raise ValueError(f"devices {spec!r}: {n} GPUs are not whole nodes of {GPU_NODE}")
    return chip, n


def _gpu_topology_devices(chip: Chip, n: int, verbose: bool = False) -> list:
    if not has_cuda_plugin():
        raise ValueError(f"devices for {chip.name} GPUs need jax's CUDA plugin to compile ahead of time; install "
                         "the cuda-aot extra (pip install -e '.[cuda-aot]'), or as make does, off sys.path: pip "
                         f"install --no-deps --target {CUDA_AOT_DIR} jax-cuda12-plugin jax-cuda12-pjrt")
    from jax.experimental import topologies

    per = min(n, GPU_NODE)  # topology "<partitions>x<hosts>x<GPUs per host>": one partition of n / per nodes
    with native_stderr(verbose):  # the plugin logs, once per process, that it finds no CUDA driver
        _load_cuda_plugin()
        topo = topologies.get_topology_desc(platform="cuda", topology=f"1x{n // per}x{per}",
                                            target_config=gpu_target_config(chip))
    return list(topo.devices)


def parse_tpu_spec(spec: str) -> tuple[Chip, tuple[int, ...]]:
    """A TPU device spec -> (chip, slice shape), checked against the hardware table without jax:
    ``tpu:<chip>:<shape>``, ``tpu:<slice name>``, a bare slice name, or ``tpu:<shape>`` (DEFAULT_CHIP).
    ValueError naming what is valid otherwise."""
    s = str(spec).strip()
    body = s[4:] if s.lower().startswith("tpu:") else s
    chip_name, sep, shape = body.partition(":")
    if sep:
        return (chip := get_chip(chip_name)), parse_topology(chip, shape)
    if body[:1].isdigit():
        return CHIPS[DEFAULT_CHIP], parse_topology(CHIPS[DEFAULT_CHIP], body)
    return parse_slice(body)


def chip_of_devices(devices) -> Chip:
    """The chip a device spec compiles for, read without jax: gpu:<chip>:<N>'s GPU (parse_gpu_spec), a TPU
    topology's or slice's chip (parse_tpu_spec); DEFAULT_CHIP for cpu:N, the real devices (None) or a device list
    (the time estimates' default). ValueError naming the spec otherwise."""
    if not isinstance(devices, str) or devices.strip().lower().startswith("cpu:"):
        return CHIPS[DEFAULT_CHIP]
    if devices.strip().lower().startswith("gpu:"):
        return parse_gpu_spec(devices)[0]
    return _tpu(devices)[0]


def _tpu_topology_devices(chip: Chip, dims: tuple[int, ...], verbose: bool = False) -> list:
    if not has_libtpu():
        raise ValueError(f"devices for a {chip.name} topology need libtpu to compile ahead of time; "
                         "install the tpu extra: pip install -e '.[tpu]'")
    # Ahead-of-time compilation touches no TPU: let several processes (pytest and a notebook kernel,
    # say) load libtpu at once instead of failing on its /tmp/libtpu_lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    topo_name = f"{chip.libtpu_name}:" + "x".join(str(d) for d in dims)
    kwargs = dict(chip.libtpu_args)
    if chips_in(dims) < 4:  # libtpu's default host is 2x2x1 chips; a smaller slice is one host
        kwargs["chips_per_host_bounds"] = tuple(dims) + (1,) * (3 - len(dims))
    try:
        with native_stderr(verbose):
            return list(topologies.get_topology_desc(platform="tpu", topology_name=topo_name, **kwargs).devices)
    except Exception as e:  # libtpu rejects unknown shapes with various error types
        raise ValueError(f"libtpu cannot describe TPU topology {topo_name!r}: {str(e).splitlines()[0]}") from None


@contextlib.contextmanager
def native_stderr(verbose: bool):
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


# The most emulated CPU devices one process compiles for: jax 0.10.2's CPU backend compiles a program over
# 2048 devices and refuses one over 2049 ("Multiprocess computations aren't implemented on the CPU backend").
MAX_CPU_DEVICES = 2048


def cpu_device_count(devices, name: str = "devices") -> int | None:
    """N of a "cpu:N" spec (ValueError naming ``name`` for an N that is not an integer in 1..MAX_CPU_DEVICES),
    None for any other spec. Needs no jax, so a command line can check its flags before jax starts."""
    if not isinstance(devices, str) or not devices.strip().lower().startswith("cpu:"):
        return None
    try:
        n = ascii_int(devices.strip()[4:])
    except ValueError:
        raise ValueError(f"{name} {devices!r}: expected cpu:N with N a positive integer") from None
    if positive_int(f"{name} {devices!r}: N", n) > MAX_CPU_DEVICES:
        raise ValueError(f"{name} {devices!r}: jax's CPU backend compiles for at most {MAX_CPU_DEVICES} emulated "
                         f"devices in one process; use cpu:N with N <= {MAX_CPU_DEVICES}, or a TPU topology "
                         "(tpu:v5p:16x16x16) for more")
    return n


def device_count(devices) -> int | None:
    """How many devices a device spec names, checked without starting jax (so a command line can
    reject a bad --devices before it prints or compiles anything): cpu:N -> N; a TPU topology -> its
    chips times the chip's devices per chip (libtpu must be installed); None for the process's real
    devices (None, or a device list's length). ValueError naming the spec otherwise."""
    if devices is None:
        return None
    if not isinstance(devices, str):
        return len(devices)
    if devices.strip().lower().startswith("cpu:"):
        return cpu_device_count(devices, "devices")
    if devices.strip().lower().startswith("gpu:"):
        return parse_gpu_spec(devices)[1]
    chip, dims = _tpu(devices)
    if not has_libtpu():
        raise ValueError(f"devices {devices!r} need libtpu to compile for a TPU topology; "
                         "install the tpu extra: pip install -e '.[tpu]'")
    return chips_in(dims) * chip.devices_per_chip


def _tpu(devices: str) -> tuple[Chip, tuple[int, ...]]:
    if not is_emulated(devices):
        raise ValueError(f"unknown devices {devices!r}; use cpu:N, gpu:<chip>:<N> (gpu:H100:64), tpu:<chip>:<shape> "
                         "(e.g. tpu:v5p:4x4x4, tpu:v6e:4x4, tpu:TPU7x:2x2x1), a slice (tpu:v5p-128), or leave it out "
                         "for the process's real devices")
    try:
        return parse_tpu_spec(devices)
    except ValueError as e:
        raise ValueError(f"devices {devices!r}: {e}") from None


def is_emulated(devices) -> bool:
    """Whether a device spec names emulated CPU devices or a TPU topology compiled ahead of time (then
    jax should probe no accelerator: JAX_PLATFORMS=cpu)."""
    if not isinstance(devices, str):
        return False
    low = devices.strip().lower()
    return low.startswith(("cpu:", "tpu:", "gpu:")) or any(
        low.startswith(f"{c.slice_prefix}-") for c in CHIPS.values() if c.slice_prefix)


def use_cpu_platform_for(devices) -> None:
    """For emulated CPU devices or a TPU topology compiled ahead of time, keep jax from probing for real
    accelerators (it would load libtpu as a TPU backend): JAX_PLATFORMS=cpu unless the environment says
    otherwise, also when jax is already imported (jax reads JAX_PLATFORMS once, at import)."""
    import sys

    if is_emulated(devices) and not os.environ.get("JAX_PLATFORMS"):
        os.environ["JAX_PLATFORMS"] = "cpu"
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_platforms", "cpu")


def get_devices(devices=None, verbose: bool = False) -> list:
    """The device list for a device spec (see the module docstring). ``verbose``: let libtpu's start-up
    lines through (native_stderr: discarded otherwise), of a TPU topology or of the real devices (jax starting
    its backends loads libtpu where it is installed, also on a host without TPUs, which then says so)."""
    import jax

    if devices is None:
        with native_stderr(verbose):
            return list(jax.devices())
    if not isinstance(devices, str):
        return list(devices)
    if devices.strip().lower().startswith("cpu:"):
        return _emulated_cpu_devices(cpu_device_count(devices))
    if devices.strip().lower().startswith("gpu:"):
        return _gpu_topology_devices(*parse_gpu_spec(devices), verbose)
    return _tpu_topology_devices(*_tpu(devices), verbose)


def make_mesh(spec, devices=None, verbose: bool = False):
    """A jax.sharding.Mesh with the axes of scaling.core.mesh_shape.MESH_AXES (Auto axis types) over ``devices``.

    ``spec`` is a string such as "fsdp=16,tensor=4" (axes left out have size 1) or a MeshShape.
    The product of the axis sizes must equal the number of devices (ValueError otherwise).

    Device order: ``mesh_utils.create_device_mesh`` maps the logical mesh onto the physical one.
    On a TPU topology the last mesh axes take whole physical axes first, so on v5p 4x4x4 with
    fsdp=16,tensor=4, tensor spans one physical axis (x, a ring of 4 with wraparound) and fsdp the
    other two (y, z: 16 chips, M_X = 2, M_Y = 1); ici_layout reads the layout back from the
    devices' coords. Shapes it cannot map without splitting a physical axis are mapped
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
    dims = tuple(shape[a] for a in MESH_AXES)
    try:
        arr = mesh_utils.create_device_mesh(dims, devices=devs)
    except (ValueError, NotImplementedError, AssertionError):
        try:
            arr = mesh_utils.create_device_mesh(dims, devices=devs, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError, AssertionError):
            arr = np.array(devs, dtype=object).reshape(dims)
    return Mesh(arr, MESH_AXES)


def mesh_shape(mesh) -> MeshShape:
    """The MeshShape (every axis's size) of a jax Mesh."""
    return MeshShape({a: int(mesh.shape[a]) for a in MESH_AXES})


def ici_layout(mesh, chip: Chip) -> dict[str, tuple[list[int], list[bool]]]:
    """For each mesh axis of size > 1, the physical ICI axes it spans, read from the devices' ``coords``
    (and ``core_on_chip`` where a chip holds several devices, TPU7x: one more axis, a ring of one link):
    their lengths and whether each ring closes (the mesh axis covers the whole physical dimension and the
    chip's wraparound rule holds: Chip.has_wraparound). Devices without coords (CPU, GPU): one ring of
    the axis length. The form scaling.step.program.links and the planner's layouts use."""
    import numpy as np

    devs = np.asarray(mesh.devices)
    if any(getattr(d, "coords", None) is None for d in devs.flat):
        return {name: ([size], [True]) for name, size in mesh.shape.items() if size > 1}
    pos = lambda d: (*d.coords, getattr(d, "core_on_chip", 0))  # noqa: E731
    allc = np.array([pos(d) for d in devs.flat])
    full = allc.max(axis=0) - allc.min(axis=0) + 1
    slice_dims = tuple(int(n) for n in full[:3] if n > 1) or (1,)
    out = {}
    for k, name in enumerate(mesh.axis_names):
        if devs.shape[k] == 1:
            continue
        line = np.array([pos(d) for d in np.moveaxis(devs, k, 0)[(slice(None),) + (0,) * (devs.ndim - 1)]])
        lens, wraps = [], []
        for p in range(line.shape[1]):
            n = len(set(line[:, p].tolist()))
            if n > 1:
                lens.append(n)
                wraps.append(True if p == 3 else chip.has_wraparound(n, int(full[p]), slice_dims))
        out[name] = (lens, wraps)
    return out


def infer_chip(device) -> Chip | None:
    """The hardware-table chip of a jax device, from its ``device_kind`` (hardware.chip_of_device_kind):
    None on CPU (no peak FLOP/s to compare with); ValueError for an accelerator the table does not know
    (pass --chip)."""
    if device.platform == Platform.CPU:
        return None
    chip = chip_of_device_kind(device.device_kind)
    if chip is None:
        raise ValueError(f"cannot tell the chip from device kind {device.device_kind!r}; pass --chip "
                         f"(one of {', '.join(CHIPS)})")
    return chip


def maybe_initialize_distributed(timeout: float | None = None) -> bool:
    """Call jax.distributed.initialize() (initialize_distributed, waiting at most ``timeout`` s) when this
    process is one of several: a coordinator address in the environment (JAX_COORDINATOR_ADDRESS), or a
    multi-host Cloud TPU slice (TPU_WORKER_HOSTNAMES lists more than one host; jax detects the rest).
    Returns whether it did."""
    multi_tpu = "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if os.environ.get("JAX_COORDINATOR_ADDRESS") or multi_tpu:
        initialize_distributed(timeout=timeout or PROCESS_TIMEOUT)
        return True
    return False


# Seconds a process waits for the others to connect (and, at exit, to finish) before it gives up: jax's own
# initialization_timeout (300 s in jax 0.10.2), since the hosts of a multi-host slice may start minutes apart.
PROCESS_TIMEOUT = 300.0


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, timeout: float = PROCESS_TIMEOUT, hint: str = "") -> None:
    """jax.distributed.initialize(coordinator, num_processes, process_id) with a bounded, reported wait:
    after 3 s (or half ``timeout``) without every process connected it writes "waiting ..." on stderr; after ``timeout``
    seconds one line "error: ... did not connect ... ``hint``" and exits with status 2 (os._exit:
    jax's own timeout ends the process with SIGABRT and a C++ stack, and jax cannot be interrupted
    while it waits). jax's timeouts: initialization ``timeout`` + 60 s (so this one comes first),
    shutdown at exit ``timeout``."""
    import sys
    import threading

    import jax

    where = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or "the coordinator"
    who = f"the {num_processes} processes" if num_processes else "every process"

    def say(line, code=None):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        if code is not None:
            os._exit(code)

    timers = [threading.Timer(min(3.0, timeout / 2), say, [f"waiting up to {timeout:g} s for {who} to connect to "
                                                            f"{where} ..."]),
              threading.Timer(timeout, say, [f"error: {who} did not connect to {where} within {timeout:g} s{hint}", 2])]
    for t in timers:
        t.daemon = True
        t.start()
    try:
        jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=int(timeout) + 60,
                                   shutdown_timeout_seconds=max(1, int(timeout)))
    finally:
        for t in timers:
            t.cancel()


def disagreements(name: str, value, timeout: float = PROCESS_TIMEOUT) -> dict[int, object]:
    """{process: its value} for every other process whose ``value`` (JSON-able) differs from this one's,
    read through jax.distributed's key-value store under ``name`` (each process publishes its own,
    then reads every other's, waiting at most ``timeout`` s); every process has read every value when it
    returns (a barrier), so none stops on a difference while another still reads. {} in a single process."""
    import json

    client, n, me = _kv_client()
    if n == 1:
        return {}
    if client is None:
        import warnings

        warnings.warn(f"cannot compare {name!r} across processes: jax.distributed's key-value store is not "
                      "reachable in this jax version (mesh.devices._kv_client)", RuntimeWarning, stacklevel=2)
        return {}
    mine = json.dumps(value, sort_keys=True)
    client.key_value_set(f"{name}/{me}", mine)
    out = {}
    for j in range(n):
        if j != me:
            theirs = client.blocking_key_value_get(f"{name}/{j}", int(timeout * 1000))
            if theirs != mine:
                out[j] = json.loads(theirs)
    client.wait_at_barrier(f"{name}/read", int(timeout * 1000))
    return out


def _kv_client():
    """(client, number of processes, this process) of the key-value store jax.distributed.initialize
    made; client None when there is none. The one private jax import of the package: jax 0.10.2 has no
    public accessor of that client (jax.distributed exposes initialize, is_initialized, shutdown only),
    and jax.experimental.multihost_utils compares values with a collective, which cannot time out or
    say which process differs. Fallback if the private module moves: no client, from public jax."""
    try:
        from jax._src.distributed import global_state

        return global_state.client, global_state.num_processes, global_state.process_id
    except (ImportError, AttributeError):
        import jax

        return None, jax.process_count(), jax.process_index()
