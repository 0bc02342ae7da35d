"""Abstract compile: lower and compile the train step (or the forward-only step) from
ShapeDtypeStructs carrying NamedShardings, allocating nothing, for any mesh (real devices, emulated
CPU devices, or a TPU topology compiled ahead of time from a CPU machine)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import jax

from ffn_model.train import batch_structs, check_mesh, make_forward_step, make_train_step, state_shardings
from mesh.devices import native_stderr
from scaling.core.policies import Step
from scaling.core.limits import check_size
from scaling.core.flags import unknown_flag
from scaling.core.workload import Workload


@dataclass
class CompileResult:
    """One compiled step: jax's Compiled and Lowered, and how long tracing, lowering and compiling took.
    What the program holds (FLOPs, collectives, memory, cost analysis) is read by verify.hlo.read_compiled."""

    compiled: object
    lowered: object
    compile_seconds: float


def abstract_compile(w: Workload, mesh, verbose: bool = False) -> CompileResult:
    """Lower and compile the workload's step ("train": state + batch -> state, loss; "forward": params + batch
    -> loss) on ``mesh`` (a jax Mesh of w.mesh's shape), from ShapeDtypeStructs (nothing is allocated), with
    ``mesh`` set (jax.set_mesh) while tracing, under the workload's XLA flags (w.flags.options: libtpu's flags on a
    TPU, none elsewhere; ValueError naming a flag XLA does not know). What XLA's C++ code logs while compiling
    (XLA:GPU's scheduler and rematerialization warnings) is discarded unless ``verbose``.

    compile_seconds covers tracing, lowering and compiling. ValueError for a mesh of another shape than the
    workload's or a size jax or XLA cannot count (scaling.core.limits.check_size)."""
    check_mesh(w, mesh)
    check_size(w)  # sizes jax and XLA can count
    t0 = time.perf_counter()
    abstract, _ = state_shardings(w, mesh)
    batch = batch_structs(w, mesh)
    if w.step == Step.TRAIN:
        fn, args = make_train_step(w, mesh), (abstract, batch)
    else:
        fn, args = make_forward_step(w, mesh), (abstract["params"], batch)
    with jax.set_mesh(mesh):  # the model's sharding constraints resolve against it while tracing
        lowered = fn.lower(*args)
    try:  # under the flag set's flags, set by the step's builder (scaling.core.flags: none on CPU); XLA's C++ log lines
        # kept off stderr
        with native_stderr(verbose):
            compiled = lowered.compile()
    except Exception as e:
        if flag := unknown_flag(e):
            raise ValueError(f"XLA does not know the flag --{flag} (XLA flags {w.flags.name!r})") from None
        raise
    return CompileResult(compiled, lowered, time.perf_counter() - t0)
