"""The two test tiers (tests/conftest.py): `make test` keeps, of the tests that compile, those marked quick, and they
must hold at least one compiled comparison of every closed-form term: each family, each mesh axis, each TPU
generation, each pipeline schedule, each remat policy, each attention kernel and context strategy, each optimizer
sharding, both steps, and the compiler's peak per family. The terms a row compares are read off its workload (the
same Workload `check` compiles), so a row cannot claim a term it does not exercise; the required terms come from the
package's own lists (families, mesh axes, the chip table, the policy enums), so a new kind fails here until a quick
row compares it."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaling.hardware.chips import CHIPS
from scaling.core.mesh_shape import MESH_AXES
from scaling.core.policies import REMAT_POLICIES, Attention, ContextStrategy, OptimizerSharding, Pipeline, Step
from scaling.families.presets import FAMILIES

# Terms no quick row compares, each with the reason and where the comparison runs instead (make test-all).
EXEMPT: dict[tuple[str, str], str] = {}


def schedule_kind(w) -> str:
    """A workload's pipeline schedule as the terms name it: gpipe, circular, 1f1b, interleaved-1f1b with stages;
    accumulation for microbatches without stages; one-pass otherwise."""
    s = w.schedule
    if w.mesh["stage"] > 1:
        return "interleaved-1f1b" if s.pipeline == "1f1b" and s.repeats > 1 else str(s.pipeline)
    return "accumulation" if s.microbatches > 1 else "one-pass"


def terms_of(devices: str, w) -> set[tuple[str, str]]:
    """The closed-form terms a check of ``w`` on ``devices`` compares."""
    platform = devices.split(":")[0]
    generation = devices.split(":")[1] if platform in ("tpu", "gpu") else "cpu"
    family = w.model.family
    out = {("family", family), ("generation", generation), ("step", str(w.step)), ("remat", str(w.remat)),
           ("schedule", schedule_kind(w)), ("optimizer sharding", str(w.schedule.optimizer_sharding))}
    out |= {("mesh axis", axis) for axis in MESH_AXES if w.mesh[axis] > 1}
    if platform == "tpu":
        out.add(("peak on a TPU", family))
    if family != "ffn":
        out.add(("attention", str(w.schedule.attention)))
        if w.mesh["context"] > 1:
            out.add(("context strategy", str(w.schedule.context)))
    if w.schedule.sequence_parallel:
        out.add(("sequence parallel", "on"))
    if w.mesh["stage"] > 1:
        out.add(("fsdp gather", str(w.schedule.fsdp_gather)))
    return out


def required_terms() -> set[tuple[str, str]]:
    """Every term the package's lists name."""
    fams = {f.family for f in FAMILIES}
    return ({("family", f) for f in fams} | {("peak on a TPU", f) for f in fams}
            | {("generation", c.name) for c in CHIPS.values() if c.kind == "tpu"} | {("generation", "cpu")}
            | {("mesh axis", a) for a in MESH_AXES} | {("remat", r) for r in REMAT_POLICIES}
            | {("step", str(s)) for s in Step}
            | {("schedule", str(p)) for p in Pipeline} | {("schedule", k) for k in ("interleaved-1f1b", "accumulation")}
            | {("attention", str(a)) for a in Attention if a not in ("auto", "cudnn")}
            | {("context strategy", str(c)) for c in ContextStrategy}
            | {("optimizer sharding", str(o)) for o in OptimizerSharding}
            | {("sequence parallel", "on")} | {("fsdp gather", g) for g in ("microbatch", "step")})


def quick_rows(items):
    """(node id, devices, workload) of every collected test marked quick whose parameters are a check row: cfg,
    mesh, batch[, remat, step, schedule][, devices] (verify.check.grid_workload's)[, kw: the Workload's other
    fields]."""
    from verify.check import grid_workload

    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.get_closest_marker("quick") is None or not {"cfg", "mesh", "batch"} <= params.keys():
            continue
        kw = {k: params[k] for k in ("remat", "step", "schedule") if k in params}
        w = grid_workload(params["cfg"], params["mesh"], params["batch"], **kw).replace(**params.get("kw", {}))
        yield item.nodeid, params.get("devices", "cpu:8"), w


def coverage(items) -> dict[tuple[str, str], str]:
    """{term: the first quick row (node id) that compares it}: the table this tier keeps."""
    table: dict = {}
    for node, devices, w in quick_rows(items):
        for term in terms_of(devices, w):
            table.setdefault(term, node)
    return table


def test_every_term_has_a_quick_compiled_row(request):
    """The quick rows among the collected tests (before -m or -k deselects any: make test selects them by their
    marker) compare every required term, less the named exemptions."""
    tests = Path(__file__).resolve().parent
    if any(Path(a.split("::")[0]).resolve() not in (tests, tests.parent) for a in request.config.args):
        pytest.skip("a part of the suite was asked for: the tiers' rows are the whole suite's")
    from conftest import ALL_ITEMS

    items = request.config.stash[ALL_ITEMS]
    table = coverage(items)
    missing = sorted(required_terms() - table.keys() - EXEMPT.keys())
    assert not missing, f"terms no quick compiled row compares: {missing}"
    assert not EXEMPT.keys() & table.keys(), "an exempt term has a quick row now: drop its exemption"


def test_terms_are_read_off_the_workload():
    """A row's terms by hand: the 1F1B transformer row with R = 2 on stage=2, fsdp=2, tensor=2 is interleaved 1F1B
    over three axes, materialized attention, on CPU; a v5p row adds the peak; an FFN stage-less row with 4
    microbatches is gradient accumulation."""
    from scaling.families.presets import get_preset
    from scaling.core.schedule import Schedule
    from verify.check import grid_workload

    tf = grid_workload(get_preset("small-tf").replace(vocab=1024), "stage=2,fsdp=2,tensor=2", 4096, "none", "train",
                       Schedule(4, repeats=2, pipeline="1f1b"))
    got = terms_of("cpu:8", tf)
    assert {("schedule", "interleaved-1f1b"), ("mesh axis", "stage"), ("mesh axis", "fsdp"), ("mesh axis", "tensor"),
            ("attention", "materialized"), ("generation", "cpu"), ("family", "transformer")} <= got
    assert ("mesh axis", "data") not in got and not any(k == "peak on a TPU" for k, _ in got)
    assert ("peak on a TPU", "transformer") in terms_of("tpu:v5p:2x2x2", tf)
    ffn = grid_workload(get_preset("small"), "fsdp=4,tensor=2", 4096, "none", "train", Schedule(4))
    assert ("schedule", "accumulation") in terms_of("cpu:8", ffn)
    assert ("generation", "v5e") in required_terms() and ("generation", "TPU7x") in required_terms()
