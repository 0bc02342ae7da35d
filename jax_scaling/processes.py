"""Several processes of one command (multi-controller JAX): jax.distributed started when asked, every process
checked to run the same flags, one line and an exit when another process stops; and the memory check of a run on
the host's own CPU devices, known once jax has started. Used by train and bench (model_commands,
model_reports)."""

from __future__ import annotations

import json
import sys
import time

from mesh.devices import cpu_device_count
from scaling.core.kinds import Platform
from scaling.core.limits import check_host_memory, check_size
from scaling.step.program import predict
from scaling.core.workload import Workload


def start_processes(args):
    """Start jax.distributed when asked (before any jax computation), waiting at most --process-timeout
    for the other processes, then check that every process was started with the same flags (but
    --process-id); the device spec for make_mesh."""
    import jax

    from mesh.devices import initialize_distributed, maybe_initialize_distributed

    devices = args.devices
    if args.distributed or args.coordinator is not None:
        n_cpu = cpu_device_count(args.devices, "--devices")
        if n_cpu is not None:  # K emulated CPU devices in each process, collectives over gloo
            jax.config.update("jax_num_cpu_devices", n_cpu)
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        initialize_distributed(args.coordinator, args.num_processes, args.process_id, args.process_timeout,
                               hint=": start every process with the same --coordinator and --num-processes "
                                    "(or raise --process-timeout)")
        devices = None  # the global device list: every process's devices
    elif args.devices is None:
        maybe_initialize_distributed(args.process_timeout)
    check_same_flags(args)
    return devices


def check_same_flags(args) -> None:
    """ValueError naming the first flag another process was started with a different value of (only
    --process-id, and --verbose, may differ): processes that disagree on the model, the seed or the mesh would train
    a run that is neither. Compared through jax.distributed's key-value store; nothing in one process."""
    import jax

    from mesh.devices import disagreements

    flags = json.loads(json.dumps({k: v for k, v in vars(args).items() if k not in ("process_id", "func", "verbose")},
                                  default=str))
    for j, theirs in disagreements("ffn_model/flags", flags, args.process_timeout).items():
        name = next(k for k in sorted(flags.keys() | theirs.keys()) if flags.get(k) != theirs.get(k))
        flag = "--" + name.replace("_", "-")
        raise ValueError(f"process {j} was started with {flag} {theirs.get(name)!r}, this process "
                         f"({jax.process_index()}) with {flags.get(name)!r}: start every process with the same flags "
                         "(only --process-id differs)")


def check_real_cpu_size(args, w: Workload, mesh) -> None:
    """check_size against this host's memory for a run on the real devices (no --devices) when they are CPUs,
    which check_flags could not know before jax started: the closed form per device times the local devices."""
    local = [d for d in mesh.devices.flat if d.process_index == mesh.devices.flat[0].process_index]
    if args.devices is None and local[0].platform == Platform.CPU:
        check_size(w)
        check_host_memory(w.step, predict(w).memory["total"], len(local))


COORDINATOR_GRACE = 1.0  # seconds process 0 waits before it ends on an error (end_one_of_several)


def end_one_of_several(e: Exception) -> None:
    """In a program of several processes (jax.distributed), end this one now, with one line on stderr, on a
    ValueError ("error: ...", exit 2) or a runtime error of jax (a collective that failed because another
    process stopped: "error: process i: ...", exit 1): exiting normally, jax's shutdown would wait up to
    --process-timeout for the others at a barrier, then abort with a C++ stack. Returns otherwise."""
    import os

    import jax

    if not jax.distributed.is_initialized():
        return
    if isinstance(e, ValueError):
        line, code = str(e), 2
    elif isinstance(e, jax.errors.JaxRuntimeError):
        line, code = (f"process {jax.process_index()}: {str(e).strip().splitlines()[0][:300]} "
                      "(another process has probably stopped)"), 1
    else:
        return
    sys.stdout.flush()
    print(f"error: {line}", file=sys.stderr, flush=True)
    if jax.process_index() == 0 and jax.process_count() > 1:
        # process 0 holds the coordination service: the others' jax aborts (a C++ stack) when it disappears
        # before they have ended, so it ends last
        time.sleep(COORDINATOR_GRACE)
    os._exit(code)
