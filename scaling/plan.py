"""Mesh planner: every factorisation of a chip count into the mesh axes (PLAN_AXES: data, stage, fsdp, tensor), every
way of laying those axes onto the slice's physical ICI axes, ranked by the one step model
(scaling.program.predict) under an HBM budget.

A layout splits each physical dimension d_i of the slice into one factor per mesh axis. A mesh axis spans
the physical axes where its factor is > 1 (their count is its M: M_X for fsdp, M_Y for tensor); on each
it is a ring with wraparound when it owns the whole dimension and the chip's wraparound rule holds
(scaling.hardware.Chip.has_wraparound), else a line (program.links: 1 link or 1/2). More chips than one
slice holds are equal slices joined by DCN (hardware.split_slices), and the outermost factor of the
data axis (MaxText's dcn_data_parallelism) or of the fsdp axis spans them (both are enumerated).
GPUs: a node of up to 8 GPUs on an NVLink switch (every mesh axis gets the GPU's NVLink bandwidth),
nodes joined like slices over the scale-out network (InfiniBand, IB: the table's dcn_bw).

For each mesh, ``predict`` runs once on numpy arrays of the batch sizes and of the mesh's layouts' links;
each (mesh, batch) keeps its fastest layout. The plans the planner ranks are therefore exactly what
``predict`` says of them (tests/test_plan.py holds the two equal), and what ``python -m scaling check``
compares with the compiler. Ranked by the sum form unless told otherwise (the compiled forward step
runs its collectives synchronously: docs/findings.md, "Finding for question (c)"); plans over the HBM
budget (the table's usable HBM per device unless ``hbm``) are dropped.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from scaling import pipeline, program, roofline
from scaling.config import (MESH_AXES, FFNConfig, MeshShape, Schedule, check_divisible, check_remat, positive_float,
                            positive_int)
from scaling.hardware import Chip, split_slices
from scaling.workload import Workload

GPU_NODE = 8  # GPUs on one NVLink switch [SB-gpus]: an H100/H200/B200 node
# The axes the planner factorises the chips into: the FFN stack's (its tokens have no sequence for a
# context axis to split).
PLAN_AXES = tuple(a for a in MESH_AXES if a != "context")
DCN_AXES = ("data", "fsdp")  # the axes whose outermost factor may span slices joined by DCN


def _splits(d: int, k: int):
    """Every ordered k-tuple of positive integers whose product is d."""
    if k == 1:
        yield (d,)
        return
    for a in range(1, d + 1):
        if d % a == 0:
            for rest in _splits(d // a, k - 1):
                yield (a, *rest)


def layouts(dims: tuple[int, ...], chip: Chip, axes: tuple[str, ...] = PLAN_AXES) -> dict[tuple, list[dict]]:
    """Every distinct way of laying ``axes`` onto a slice of shape ``dims``: {mesh sizes: [layout, ...]}
    where a layout is {axis: (lengths, wraps)} over the physical axes it spans (the form mesh.ici_layout
    reads back from a compiled mesh's devices). Layouts that give every mesh axis the same links
    (program.links) over the same number of physical axes are the same to the step model; one of each
    is kept. GPUs (no torus): one layout, each axis one ring. A chip of several devices (TPU7x: 2) adds
    its cores as one more physical axis, a ring of one link (the cores' die-to-die link, taken as no
    faster than an ICI link)."""
    out: dict[tuple, list[dict]] = {}
    if chip.torus == 0:
        for sizes in _splits(math.prod(dims), len(axes)):
            out[sizes] = [{a: ([n], [True]) for a, n in zip(axes, sizes) if n > 1}]
        return out
    phys = (*dims, chip.devices_per_chip) if chip.devices_per_chip > 1 else tuple(dims)
    wraps = lambda n, i: chip.has_wraparound(n, phys[i], dims) if i < len(dims) else True  # noqa: E731
    # Per physical axis, every split of its length over the mesh axes, as arrays [splits, axes] of factors
    # and link contributions (1 for a ring with wraparound, 1/2 for a line, 0 where the factor is 1); the
    # cartesian product over the physical axes as flat arrays (numpy: 10^5 combinations for 8x20x28).
    splits = [np.array(list(_splits(d, len(axes)))) for d in phys]
    sizes, link, span = np.ones((1, len(axes)), int), np.zeros((1, len(axes))), np.zeros((1, len(axes)), int)
    index = np.zeros((1, 0), int)
    for i, sp in enumerate(splits):
        contrib = np.array([[0.0 if n == 1 else (1.0 if wraps(n, i) else 0.5) for n in row] for row in sp])
        sizes = (sizes[:, None, :] * sp[None, :, :]).reshape(-1, len(axes))
        link = (link[:, None, :] + contrib[None, :, :]).reshape(-1, len(axes))
        span = (span[:, None, :] + (sp > 1)[None, :, :]).reshape(-1, len(axes))
        index = np.concatenate([np.repeat(index, len(sp), axis=0),
                                np.tile(np.arange(len(sp)), len(index))[:, None]], axis=1)
    _, first = np.unique(np.concatenate([sizes, link * 2, span], axis=1), axis=0, return_index=True)
    for k in sorted(first):
        lay = {}
        for a, axis in enumerate(axes):
            spans = [(int(splits[i][j, a]), wraps(int(splits[i][j, a]), i)) for i, j in enumerate(index[k])
                     if splits[i][j, a] > 1]
            if spans:
                lay[axis] = ([n for n, _ in spans], [w for _, w in spans])
        out.setdefault(tuple(int(x) for x in sizes[k]), []).append(lay)
    return out


def repeats_for(cfg: FFNConfig, stages: int, max_repeats: int) -> list[int]:
    """The circular repeats R a mesh with ``stages`` can run: 1 (GPipe), and with stages the powers of
    two up to ``max_repeats`` that divide the blocks of a stage."""
    if stages == 1:
        return [1]
    return [r for r in (1, 2, 4, 8, 16) if r <= max_repeats and (cfg.blocks // stages) % r == 0]


def microbatches_for(stages: int, repeats: int, max_microbatches: int) -> list[int]:
    """Microbatch counts to try: without stages 1, 2, 4, ... (gradient accumulation); with stages
    S, 2S, 4S, ... (fewer than S leaves a stage idle in every iteration), up to ``max_microbatches``."""
    first = stages if stages > 1 else 1
    return [first * 2**k for k in range(12) if first * 2**k <= max(max_microbatches, first)]


def runs(cfg: FFNConfig, mesh: MeshShape, schedule: Schedule, batch_tokens: int | None = None) -> bool:
    """Whether train, check and compile accept ``cfg`` on ``mesh`` with ``schedule`` (and ``batch_tokens``): the
    same two checks they make (scaling.config.check_divisible, Schedule.check: D by fsdp, F by tensor, the blocks
    by the stages, B by microbatches·data·fsdp, ...)."""
    try:
        check_divisible(cfg, mesh, batch_tokens)
        schedule.check(cfg, mesh, batch_tokens)
    except ValueError:
        return False
    return True


PLAN_FORMS = (*roofline.FORMS, "scheduled")  # scheduled: predict's form under the flags' schedule


def plan(cfg: FFNConfig, chip: Chip, chips: int, batch_tokens, hbm: float | None = None, remat: str = "none",
         form: str = "sum", dims: tuple[int, ...] | None = None, max_microbatches: int = 64,
         max_repeats: int = 4, per_mesh: bool = True, flags=None) -> list[dict]:
    """Ranked plans (best first) for one or more batch sizes; see the module docstring.

    ``batch_tokens`` is an int or a list of ints; each plan dict carries its batch, mesh (data, stage,
    fsdp, tensor), microbatches M and repeats R (scaling.config.Schedule: gradient accumulation without
    stages, GPipe or circular with them; microbatches_for, repeats_for), the bubble (Megatron's overhead
    (S−1)/(R·M), paid in the step time as executed FLOPs; bubble_seconds: the math time of the bubble
    iterations, T_math·(S−1)/(R·M+S−1)), layout, M_X/M_Y (physical axes spanned),
    slices, predict's times (both forms), MFU/HFU, bound, memory and critical batch. ``dims``: the slice's shape
    (default: hardware.split_slices). Plans that train and check refuse (``runs``: D by fsdp, F by tensor, B by
    M·data·fsdp, ...) or whose memory exceeds ``hbm`` are dropped. ``per_mesh``: keep each mesh's best
    schedule only (the fastest that fits, then the least memory, then the fewest microbatches); False keeps
    every (mesh, M, R). ``flags``: the XLA flag set the programs are compiled with (scaling.flags), whose
    schedule the "scheduled" form follows (the plan command's default form)."""
    positive_int("chips", chips)
    check_remat(remat)
    if form not in PLAN_FORMS:
        raise ValueError(f"form must be one of {PLAN_FORMS}, got {form!r}")
    hbm = positive_float("hbm", chip.hbm_budget if hbm is None else hbm)
    batches = np.array([batch_tokens] if isinstance(batch_tokens, int) else list(batch_tokens))
    for b in batches.tolist():
        positive_int("batch_tokens", b)
    devices = chips * chip.devices_per_chip
    if chip.kind == "gpu":
        n_slices = math.ceil(chips / GPU_NODE)
        if chips % n_slices:
            raise ValueError(f"{chips} GPUs do not split into equal nodes of at most {GPU_NODE}")
        dims = (chips // n_slices,)
    elif dims is None:
        n_slices, dims = split_slices(chip, chips)
    else:
        n_slices = chips // math.prod(dims)
        if n_slices * math.prod(dims) != chips:
            raise ValueError(f"topology {dims} has {math.prod(dims)} chips, which do not divide {chips}")
    results = []
    for (sizes, lays), dcn_axis in itertools.product(layouts(dims, chip).items(),
                                                     DCN_AXES if n_slices > 1 else (None,)):
        given = dict(zip(PLAN_AXES, sizes))
        if dcn_axis:
            given[dcn_axis] *= n_slices
        mesh = MeshShape(given)
        S = mesh["stage"]
        if not runs(cfg, mesh, Schedule()):
            continue
        lk = [program.links(lay) for lay in lays]
        axis_links = {a: np.array([x.get(a, 1.0) for x in lk])[None, None, :] for a in PLAN_AXES}
        for R in repeats_for(cfg, S, max_repeats):
            ms = np.array(microbatches_for(S, R, max_microbatches))
            w = Workload(cfg, mesh, batches[:, None, None], remat=remat,
                         schedule=Schedule(microbatches=ms[None, :, None], repeats=R), flags=flags)
            p = program.predict(w, chip, axis_links=axis_links, dcn={dcn_axis: n_slices} if dcn_axis else None)
            t = p.times
            shape = (len(batches), len(ms), len(lays))
            step = np.broadcast_to(t.step[form], shape)
            best = step.argmin(axis=2)
            mem = np.broadcast_to(p.memory["total"], shape)[:, :, 0]
            for (i, B), (k, M) in itertools.product(enumerate(batches.tolist()), enumerate(ms.tolist())):
                sched = Schedule(M, R)
                if mem[i, k] > hbm or not runs(cfg, mesh, sched, B):  # over budget, or a batch train refuses
                    continue
                j = best[i, k]
                pick = lambda x: float(np.broadcast_to(x, shape)[i, k, j])  # noqa: E731
                lay = lays[j]
                results.append({
                    "batch_tokens": B,
                    "mesh": {a: mesh[a] for a in PLAN_AXES},
                    "microbatches": M,
                    "repeats": R,
                    "bubble": pipeline.bubble(sched, S)["overhead"] if S > 1 else 0.0,
                    "bubble_seconds": pick(t.math) * (pipeline.bubble(sched, S)["idle_share"] if S > 1 else 0.0),
                    "slices": n_slices,
                    "dcn_axis": dcn_axis,
                    "layout": {a: {"lens": v[0], "wrap": v[1]} for a, v in lay.items()},
                    "M_X": len(lay.get("fsdp", ([], []))[0]),
                    "M_Y": len(lay.get("tensor", ([], []))[0]),
                    "form": form,
                    "step_seconds": pick(t.step[form]),
                    "step_seconds_sum": pick(t.step["sum"]),
                    "step_seconds_max": pick(t.step["max"]),
                    "step_seconds_scheduled": pick(t.step["scheduled"]),
                    "mfu": pick(t.mfu[form]),
                    "mfu_sum": pick(t.mfu["sum"]),
                    "mfu_max": pick(t.mfu["max"]),
                    "hfu": pick(t.hfu[form]),
                    "bound": str(np.broadcast_to(t.bound, shape)[i, k, j]),
                    "times": {"math": pick(t.math), **{a: pick(v) for a, v in t.comms.items()},
                              "hbm": pick(t.hbm)},
                    "memory_bytes": float(mem[i, k]),
                    "hbm_budget": hbm,
                    "per_device_batch": B / devices,
                    "critical_batch": (None if math.isnan(c := pick(t.critical_batch.get(form, np.nan))) else c),
                })
    results.sort(key=lambda r: (r["batch_tokens"], round(r["step_seconds"], 12), r["memory_bytes"], r["microbatches"]))
    if per_mesh:
        seen = set()
        results = [r for r in results
                   if (key := (r["batch_tokens"], tuple(r["mesh"].values()), r["dcn_axis"])) not in seen
                   and not seen.add(key)]
    return results


def nearest_miss(cfg: FFNConfig, chip: Chip, chips: int, batch_tokens: int, remat: str = "none",
                 form: str = "sum", **limits) -> dict | None:
    """The plan with the least memory per device whatever the budget (what comes closest when nothing
    fits), with its memory terms; None when no mesh divides the model at all. ``limits``: plan's
    max_microbatches and max_repeats."""
    plans = plan(cfg, chip, chips, batch_tokens, hbm=1e30, remat=remat, form=form, per_mesh=False, **limits)
    if not plans:
        return None
    best = min(plans, key=lambda r: r["memory_bytes"])
    w = Workload(cfg, MeshShape(best["mesh"]), batch_tokens, remat=remat,
                 schedule=Schedule(best["microbatches"], best["repeats"]))
    best["memory_terms"] = {k: float(v) for k, v in program.predict(
        w, chip, {a: (v["lens"], v["wrap"]) for a, v in best["layout"].items()},
        dcn={best["dcn_axis"]: best["slices"]} if best["dcn_axis"] else None).memory.items()}
    return best
