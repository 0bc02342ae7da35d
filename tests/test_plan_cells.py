"""The transformer planner's cells: a group's (batch, microbatch, mesh) cells each evaluated under its own remat policy
(scaling.core.workload.RematCells, scaling.families.transformer.by_policy), every policy of a schedule sized at once,
and the layouts' links made with the layouts (closed forms only)."""

import itertools
from unittest import mock

import numpy as np
import pytest

from scaling.step import kernels
from scaling.step import memory
from scaling.planner import plan as planner
from scaling.step import program
from scaling.hardware.chips import get_chip, split_slices
from scaling.planner.plan import Choices, plan
from scaling.families.presets import PRESETS
from scaling.core.schedule import Schedule
from scaling.core.workload import RematCells, Workload

LLAMA3_70B = PRESETS["llama3.1-70b"]
POLICIES = LLAMA3_70B.plan.remats  # every policy but every-second and the offloading ones


def _cases():
    """(mesh, schedule) of a group of five meshes (each axis > 1 in all or in none): four pipeline schedules with
    sequence parallelism, and without stages both context strategies, both attentions, with and without SP."""
    arr = lambda *v: np.array(v)[None, None, :, None]  # noqa: E731
    staged = {"data": arr(2, 2, 2, 2, 2), "stage": 4, "fsdp": arr(2, 4, 8, 2, 4), "context": 1,
              "tensor": arr(8, 4, 2, 8, 4)}
    out = [(staged, Schedule(np.array([4, 8, 16])[None, :, None, None], r, pipeline=p, sequence_parallel=True,
                             attention="flash"))
           for p, r in (("gpipe", 1), ("circular", 2), ("1f1b", 1), ("1f1b", 2))]
    flat = {"data": arr(2, 4, 2, 8, 2), "stage": 1, "fsdp": arr(2, 2, 4, 2, 8), "context": 2, "tensor": 2}
    out += [(flat, Schedule(np.array([1])[None, :, None, None], context=c, attention=a, sequence_parallel=sp))
            for c, a, sp in itertools.product(("ulysses", "ring"), ("flash", "materialized"), (False, True))]
    return out


def _figures(w, chip) -> dict:
    """What the planner takes of a workload: memory, the kernels' seconds, the collective volumes, the step's FLOPs,
    the scheduled step and the prediction's memory terms."""
    return {"memory": memory.memory_per_device(w)["total"], "kernels": kernels.compute_term(w, chip),
            "volumes": program.collective_volumes(w), "flops": program.step_flops_per_device(w),
            "step": program.StepModel(w, chip, axis_links={"fsdp": 1.0, "tensor": 0.5}).step("scheduled"),
            "predicted": program.predict(w, chip, axis_links={"fsdp": 1.0}).memory}


def _leaves(x, path=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, path + (k,))
    else:
        yield path, x


@pytest.mark.parametrize("chip", ["v5p", "H100"])
def test_each_cell_takes_its_own_policys_figures(chip):
    """A workload whose remat is one policy a cell (the planner's candidates: each (batch, microbatch, mesh) under the
    first policy that fits it) gives each cell exactly the figures of its policy alone, evaluated on scalars of the
    policy (the closed forms as they were): memory, the kernels' seconds, every collective volume, the step's FLOPs,
    the scheduled step and the predicted memory terms, for train and forward steps. A term a cell's policy has not is
    0 in that cell (a dict's keys are every policy's)."""
    chip = get_chip(chip)
    batch = np.array([2**22, 2**23])[:, None, None, None]
    checked = 0
    for c, (mesh, sched) in enumerate(_cases()):
        K = np.size(sched.microbatches)  # the policies in turn over the cells, from a different one each case
        cells = np.array(POLICIES)[(np.arange(K * 5) + c) % len(POLICIES)].reshape(1, K, 5, 1)
        assert len(set(cells.flat)) >= 5
        for step in ("train", "forward"):
            got = _figures(Workload(LLAMA3_70B, mesh, batch, step=step, remat=cells, schedule=sched), chip)
            for policy in sorted(set(cells.flat)):
                want = _figures(Workload(LLAMA3_70B, mesh, batch, step=step, remat=policy, schedule=sched), chip)
                where = cells == policy
                have = dict(_leaves(got))
                for path, value in _leaves(want):
                    shape = np.broadcast_shapes(np.shape(value), np.shape(have[path]), where.shape)
                    at = np.broadcast_to(where, shape)
                    assert np.array_equal(np.broadcast_to(have[path], shape)[at],
                                          np.broadcast_to(value, shape)[at]), (sched, step, policy, path)
                    checked += 1
                for path in set(have) - dict(_leaves(want)).keys():  # another policy's term: 0 in these cells
                    shape = np.broadcast_shapes(np.shape(have[path]), where.shape)
                    assert not np.broadcast_to(have[path], shape)[np.broadcast_to(where, shape)].any(), path
    assert checked > 1000


def test_remat_cells_read_as_their_policies():
    """RematCells compares as its cells' policies and keeps them under slicing; an array of names is taken as one, each
    name checked as a policy (an unknown one refused)."""
    cells = RematCells(("none", "full", "minimal"), np.array([[0, 1], [2, 1]]))
    assert (cells == "full").tolist() == [[False, True], [False, True]]
    assert (cells != "none").tolist() == [[False, True], [True, True]]
    assert (cells == "selective").tolist() == [[False, False], [False, False]]
    assert (cells[:, 1:] == "full").tolist() == [[True], [True]]
    assert [n for n, _ in cells[:, 1:].used] == ["full"]
    mesh = {"data": 2, "fsdp": np.array([2, 4])[None, None, :, None], "tensor": 8}
    w = Workload(LLAMA3_70B, mesh, 2**22, remat=np.array([["full", "none"]])[..., None])
    assert isinstance(w.remat, RematCells) and set(w.remat.names) == {"full", "none"}
    with pytest.raises(ValueError, match="unknown remat policy"):
        Workload(LLAMA3_70B, mesh, 2**22, remat=np.array([["full", "most"]])[..., None])


@pytest.mark.parametrize("chip, chips", [("v5p", 128), ("v5p", 512), ("TPU7x", 64), ("v5e", 256), ("H100", 8)])
def test_layouts_carry_their_links(chip, chips):
    """The planner's layouts carry each layout's links (_layouts): for every layout of every mesh, program.links of
    each axis it spans (1 for a ring that closes, 1/2 for a line, summed over the physical axes) and 1 for an axis it
    does not; the public layouts are the same layouts."""
    chip = get_chip(chip)
    _, dims = split_slices(chip, chips) if chip.kind != "gpu" else (1, (chips,))
    axes = planner.plan_axes(LLAMA3_70B)
    laid = planner._layouts(dims, chip, axes)
    assert {k: list(v) for k, v in laid.items()} == planner.layouts(dims, chip, axes)
    for lays in laid.values():
        assert lays.links.shape == (len(lays), len(axes))
        for lay, row in zip(lays, lays.links.tolist()):
            assert row == [program.links(lay).get(a, 1.0) for a in axes]


def test_pod_plan_sizes_each_schedule_once():
    """The 70B plan on 8,960 v5p chips (tests/test_plan_transformer.py's pod plan) sizes every policy of a schedule at
    once, on the meshes of one stage count and context split (the screen's groups), and evaluates each group's
    schedule once with its cells' policies: memory evaluations at most one per (stage count, context split,
    schedule) and one per prediction, kernel evaluations at most one per (stage count, context split, schedule), step
    models at most one per (group, schedule). Before, each policy was sized and evaluated apart: 1,350 memory, 628
    kernel and 713 step evaluations for these 258 triples and 522 pairs."""
    choices = Choices.of(LLAMA3_70B, attention="flash")
    v5p = get_chip("v5p")
    slices, dims = split_slices(v5p, 8960)
    groups = planner._groups(LLAMA3_70B, v5p, dims, slices, choices, 64, 4)
    triples = {(g[0][0]["stage"], g[0][0]["context"] > 1, key) for g in groups for key in g[3]}
    pairs = sum(len(g[3]) for g in groups)
    counts = dict.fromkeys(("memory", "kernels", "models", "predictions"), 0)

    def counting(name, f):
        def counted(*a, **k):
            counts[name] += 1
            return f(*a, **k)
        return counted
    with mock.patch.object(memory, "memory_per_device", counting("memory", memory.memory_per_device)), \
            mock.patch.object(kernels, "compute_term", counting("kernels", kernels.compute_term)), \
            mock.patch.object(program, "collective_volumes", counting("models", program.collective_volumes)), \
            mock.patch.object(program.StepModel, "_predict", counting("predictions", program.StepModel._predict)):
        plans = plan(LLAMA3_70B, v5p, 8960, 2240 * 8192, form="scheduled", choices=choices)
    assert len(plans) > 600 and len(triples) > 200 and pairs > 400
    assert counts["kernels"] <= len(triples), (counts, len(triples))
    assert counts["memory"] <= len(triples) + counts["predictions"], (counts, len(triples))
    assert counts["models"] <= pairs, (counts, pairs)
