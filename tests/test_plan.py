"""The mesh planner (closed forms only)."""

import json
import subprocess
import sys

import pytest

from scaling.config import PRESETS
from scaling.hardware import get_chip
from scaling.plan import plan

XXL, V5P = PRESETS["xxl"], get_chip("v5p")


def test_enumerates_every_factorisation():
    # 64 = 2^6: ordered (data, fsdp, tensor) = exponent triples summing to 6: C(8,2) = 28 meshes.
    # With an unlimited HBM budget every one of them is a plan (D=2^14, F=2^12·13 divide by any 2^k <= 64).
    plans = plan(XXL, V5P, 64, 25600, hbm=1e18)
    assert len(plans) == 28
    assert len({tuple(p["mesh"].values()) for p in plans}) == 28


def test_question_mesh_by_hand():
    # 4x4x4: fsdp=16 spans two whole wrapped axes (M_X=2), tensor=4 one (M_Y=1).
    # T_math = (6·P·B − 2·B·D·F)/(N·C) = (6·219,848,638,464·25,600 − 2·25,600·16,384·53,248)/(64·4.59e14)
    #        = (3.37687e16 − 4.4666e13)/2.9376e16 = 1.1480 s.
    # Max-form critical batch X·alpha/M_X = 16·2550/2 = 20,400 tokens.
    plans = {tuple(p["mesh"].values()): p for p in plan(XXL, V5P, 64, 25600, hbm=95e9)}
    p = plans[(1, 16, 4)]
    assert (p["M_X"], p["M_Y"]) == (2, 1)
    assert p["times"]["math"] == pytest.approx(1.1480, abs=1e-3)
    assert p["critical_batch"] == pytest.approx(20_400, rel=1e-6)
    assert p["bound"] == "compute"


def test_budget_drops_plans_and_top_is_compute_bound():
    # Pure data parallel cannot hold 16·P = 3.5 TB per chip: every plan must shard weights 38+ ways.
    plans = plan(XXL, V5P, 64, 25600, hbm=95e9)
    assert plans and all(p["mesh"]["fsdp"] * p["mesh"]["tensor"] >= 38 for p in plans)
    assert all(p["memory_bytes"] <= 95e9 for p in plans)
    steps = [p["step_seconds"] for p in plans]
    assert steps == sorted(steps)
    assert plans[0]["bound"] == "compute"


def test_plan_cli_bad_input():
    for args in (["--chips", "0"], ["--chip", "v9"], ["--preset", "nope"], ["--chips", "63"], ["--top", "0"]):
        r = subprocess.run([sys.executable, "-m", "scaling", "plan", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, args


def test_plan_cli_json():
    r = subprocess.run([sys.executable, "-m", "scaling", "plan", "--json", "--top", "3"], capture_output=True, text=True, timeout=60)
    j = json.loads(r.stdout)
    assert len(j["plans"]) == 3 and j["count"] == 5


@pytest.mark.tpu
def test_verify_top_plan_compiles_and_fits(capsys):
    """The planner's top plan for the XXL on v5p-64 at the question's batch (25,600 tokens) is
    fsdp=16, tensor=4 (the question's own split), and the compiler's peak for it on the real
    v5p:4x4x4 topology fits the 95 GB budget."""
    import json

    from scaling.__main__ import main

    assert main(["plan", "--chips", "64", "--preset", "xxl", "--batch-tokens", "25600",
                 "--verify-top", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    top = out["plans"][0]
    assert (top["mesh"]["data"], top["mesh"]["fsdp"], top["mesh"]["tensor"]) == (1, 16, 4)
    assert top["compiled_fits"] is True
    assert top["compiled_peak_bytes"] <= 95e9
    assert top["bound"] == "compute"
