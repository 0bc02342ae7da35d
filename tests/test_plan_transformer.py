"""The planner over all five axes for transformers (closed forms only)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from mesh.devices import has_cuda_plugin
from scaling.step import kernels
from scaling.step import program
from scaling.families.presets import PRESETS
from scaling.core.schedule import Schedule
from scaling.hardware.chips import get_chip
from scaling.planner.plan import Choices, Plan, plan, workload_of
from scaling.families.transformer import POLICY_KEEPS
from scaling.core.workload import Workload
from tests.helpers import cpu_bound

V5P, V5E, H100 = get_chip("v5p"), get_chip("v5e"), get_chip("H100")
LLAMA2_7B, LLAMA3_70B = PRESETS["llama2-7b"], PRESETS["llama3.1-70b"]


def _predict_one(cfg, chip, r):
    layout = {a: (v["lens"], v["wrap"]) for a, v in r.layout.items()}
    dcn = r.dcn_mesh or None  # the DCN axis's slices, and on GPUs the stage axis's (Plan.dcn_mesh)
    return program.predict(workload_of(r, cfg), chip, layout, dcn=dcn)


@pytest.mark.parametrize("cfg, chip, chips, batch", [(LLAMA2_7B, V5E, 64, 2**20), (LLAMA3_70B, V5P, 512, 2**22),
                                                     (LLAMA3_70B, H100, 512, 2**22)])
def test_planner_ranks_what_predict_says(cfg, chip, chips, batch):
    """The planner evaluates a transformer's meshes a group at a time (the meshes that agree on which axes are > 1,
    their sizes as arrays, with every batch, microbatch count and layout); predict on one plan's own scalar mesh,
    layout and schedule must give the same step times, memory and bound. Plans with stages, context, tensor and
    sequence parallelism among those compared."""
    plans = plan(cfg, chip, chips, batch, form="scheduled", hbm=1e30)
    picked = plans[:3] + [next(r for r in plans if r.mesh[a] > 1) for a in ("stage", "context", "tensor", "data")]
    picked += [r for r in plans if r.sequence_parallel][:1] + [r for r in plans if r.pipeline == "1f1b"][:1]
    for r in picked:
        one = _predict_one(cfg, chip, r)
        t = one.times
        for form in ("sum", "max", "scheduled"):
            assert r.step_seconds[form] == pytest.approx(float(t.step[form]), rel=1e-12), (r.mesh, form)
        assert r.memory_bytes == pytest.approx(float(one.memory["total"]), rel=1e-12)
        assert r.bound == t.bound and r.mfu[r.form] == pytest.approx(float(t.mfu["scheduled"]), rel=1e-12)


def test_the_first_policy_that_fits_is_the_fastest_that_fits():
    """The planner keeps each mesh's best plan by trying the remat policies in the order of what they keep (nested
    sets: POLICY_KEEPS) and predicting only the first that fits; against every policy predicted (per_mesh=False),
    the best per mesh must be the same plan. Llama 2 7B on 64 v5e chips (16 GB each) at 1M tokens, flash attention,
    every pipeline schedule: the budget binds, so the meshes' best policies differ (five of the seven)."""
    chain = sorted(LLAMA2_7B.plan.remats, key=lambda r: -len(POLICY_KEEPS[r]))  # the policies the planner searches
    assert all(POLICY_KEEPS[b] <= POLICY_KEEPS[a] for a, b in zip(chain, chain[1:]))  # the order is nested
    c = Choices.of(LLAMA2_7B, attention="flash", context="ulysses", sequence_parallel=False)
    best = plan(LLAMA2_7B, V5E, 64, 2**20, choices=c)
    every = plan(LLAMA2_7B, V5E, 64, 2**20, per_mesh=False, choices=c)
    assert len({r.remat for r in best}) >= 4 and {r.pipeline for r in best} == {"gpipe", "circular", "1f1b"}
    fastest = {}
    for r in every:
        fastest.setdefault(tuple(r.mesh.values()), r)
    assert len(fastest) == len(best)
    for r in best:
        f = fastest[tuple(r.mesh.values())]
        assert r.step_seconds[r.form] == pytest.approx(f.step_seconds[f.form], rel=1e-12), (r.mesh, r.remat, f.remat)


def test_seventy_billion_plans_span_every_axis():
    """Llama 3.1 70B (V = 128,256, T = 8192) at Llama 2's 4M tokens on v5p-1024 (512 chips) and on 512 H100s
    (64 nodes of 8 over InfiniBand): every mesh axis is > 1 in some plan that fits, remat policies and sequence
    parallelism are chosen somewhere, and every plan fits the budget; each pipeline schedule, asked for alone
    (Choices), has plans with stages (each mesh's best with stages is otherwise circular: the smallest bubble).

    By hand, the top v5p plan's model math: 3·(L·(qkv + out + mlp + attention's causal half) + logits)·t FLOPs per
    device with t = 8192 tokens per device; per token qkv 2·D·H·(N+2K) = 2·8192·128·80 = 167,772,160, out
    2·N·H·D = 134,217,728, mlp 2·3·D·F = 1,409,286,144, attention 2·T·N·H = 2·8192·64·128 = 134,217,728
    (a layer: 1,845,493,760), logits 2·D·V = 2,101,346,304: (80·1,845,493,760 + 2,101,346,304)·3·8192 =
    3.6803e15 FLOPs, at C = 4.59e14 FLOP/s 8.018 s (= MFU · step)."""
    remats = set()  # on H100s every mesh's best keeps save_dot_except_mlpwi since stages take sequence parallelism
    for chip, chips in ((H100, 512), (V5P, 512)):
        plans = plan(LLAMA3_70B, chip, chips, 2**22, form="scheduled",
                     choices=Choices.of(LLAMA3_70B, attention="flash"))
        assert plans and all(r.memory_bytes <= chip.hbm_budget for r in plans)
        for axis in ("data", "stage", "fsdp", "context", "tensor"):
            assert any(r.mesh[axis] > 1 for r in plans), (chip.name, axis)
        remats |= {r.remat for r in plans}
        assert any(r.sequence_parallel for r in plans)
    assert len(remats) >= 2, remats
    for pipe in ("gpipe", "1f1b"):
        staged = [r for r in plan(LLAMA3_70B, V5P, 512, 2**22, choices=Choices.of(LLAMA3_70B, pipeline=pipe,
                                                                                   attention="flash"))
                  if r.mesh["stage"] > 1]
        assert staged and {r.pipeline for r in staged} == {pipe}
    top = plans[0]  # v5p's
    model_math = (80 * 1_845_493_760 + 2_101_346_304) * 3 * 8192 / 4.59e14
    assert top.mfu[top.form] * top.step_seconds[top.form] == pytest.approx(model_math, rel=1e-6)


def test_plan_of_a_full_v5p_pod_is_evaluated_in_stacks():
    """A 70B transformer over the five axes on 8,960 v5p chips (two slices of 4,480 over DCN), with what the plan
    command tries by default (every schedule, remat policy, context strategy and sequence parallelism; flash
    attention); 2,240 sequences (8,960 = 2^8·5·7: a batch with the factor 7 for data). The planner's work, counted:
    before the step model was stacked (issue 20's planner plus scaling.step.kernels) it made 1,149 predictions and 4,572
    memory evaluations for these 631 plans; now the candidates' steps are evaluated a group of meshes at a time
    (program.StepModel.step, bounded below by the compute term already made for the screen: kernels.compute_term),
    the whole prediction only for the plans returned, and each remat policy sized only where no policy that keeps
    more fits (plan._screen). The counts hold that work: predictions at most one per (group, schedule, policy)
    whose plan is returned (149), the step's collective volumes at most 711, memory at most 947, kernels 423 (with
    sequence parallelism on the staged meshes, issue 37: 113 predictions, 595 volumes, 1,284 memory, 506 kernels;
    with 1F1B keeping its chunks' residuals under every policy but full, more policies are screened before one fits:
    114 predictions, 713 volumes, 1,353 memory, 628 kernels).
    Its time: CPU seconds in a fresh process, as the plan command runs, after a small plan (imports and caches
    warm), the fastest of three runs; issue 20's bound was 2 s (1.69-1.86 s), the issue's goal 1 s, measured on a
    quiet machine 1.65 s (docs/findings.md, "The planner's time"): its time is the next test's."""
    out = _pod_plan(1)
    assert out["plans"] > 0 and out["slices"] == [2] and out["same"]
    c = out["counts"]
    assert c["predictions"] <= 149 and c["volumes"] <= 713 and c["memory"] <= 1353 and c["kernels"] <= 628, c


@pytest.mark.timing
def test_plan_of_a_full_v5p_pod_in_a_second():
    """The previous test's plan in under 1 s of CPU, the fastest of three runs in a fresh process after a small plan
    (imports and caches warm), run alone after the rest (marked timing). It took 2.1-3.7 s on the machines of
    2026-11-27 and 0.87-0.89 s here before each schedule's remat policies were sized in one evaluation
    (scaling.core.workload.RematCells); 0.44-0.47 s after (docs/findings.md, "The planner's timing tests beside a second
    worker")); 1.00-1.08 s on the slower machine of 2026-11-30, so the bound is 1 s on the machine it was set on
    (tests.helpers.cpu_bound)."""
    out = _pod_plan(3)
    assert out["plans"] > 0 and out["same"]
    assert min(out["seconds"]) < cpu_bound(1.0), (out["seconds"], cpu_bound(1.0))


def _pod_plan(repeats: int) -> dict:
    """The 70B plan on 8,960 v5p chips in a fresh process: the CPU seconds of ``repeats`` runs after a small plan, and
    the counts of one more run's predictions, volumes, memory and kernel evaluations."""
    script = """if True:
        import json, sys, time
        from unittest import mock
        from scaling.step import kernels
        from scaling.step import memory
        from scaling.step import program
        from scaling.families.presets import PRESETS
        from scaling.hardware.chips import get_chip
        from scaling.planner.plan import Choices, plan
        cfg, v5p = PRESETS["llama3.1-70b"], get_chip("v5p")
        plan(PRESETS["llama2-7b"], v5p, 64, 2**20)  # imports and caches warm
        seconds, plans = [], None
        for _ in range(int(sys.argv[1])):
            t0 = time.process_time()
            plans = plan(cfg, v5p, 8960, 2240 * 8192, form="scheduled", choices=Choices.of(cfg, attention="flash"))
            seconds.append(time.process_time() - t0)
        counts = dict.fromkeys(("predictions", "volumes", "memory", "kernels"), 0)
        def counting(name, f):
            def counted(*a, **k):
                counts[name] += 1
                return f(*a, **k)
            return counted
        with mock.patch.object(program.StepModel, "_predict", counting("predictions", program.StepModel._predict)), \\
                mock.patch.object(program, "collective_volumes", counting("volumes", program.collective_volumes)), \\
                mock.patch.object(memory, "memory_per_device", counting("memory", memory.memory_per_device)), \\
                mock.patch.object(kernels, "compute_term", counting("kernels", kernels.compute_term)):
            again = plan(cfg, v5p, 8960, 2240 * 8192, form="scheduled", choices=Choices.of(cfg, attention="flash"))
        plans = again if plans is None else plans
        print(json.dumps({"seconds": seconds, "plans": len(plans), "slices": sorted({r.slices for r in plans}),
                          "counts": counts, "same": again == plans}))
    """
    r = subprocess.run([sys.executable, "-c", script, str(repeats)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("chip", [V5P, H100])
def test_kernels_at_once_are_the_kernels_one_by_one(chip):
    """kernels.compute_term, the planner's compute term (the step's matmuls stacked into arrays, each formula
    evaluated once), is exactly compute_seconds(step_kernels(...)), a kernel at a time: on arrays of meshes, batches
    and microbatch counts as the planner passes them, with stages (GPipe, circular, 1F1B), a context axis (Ulysses,
    ring; flash and materialized attention), sequence parallelism and every remat policy."""
    group = lambda **axes: {a: np.array(v)[None, None, :, None] if isinstance(v, list) else v  # noqa: E731
                            for a, v in {"data": 1, "stage": 1, "fsdp": 1, "context": 1, "tensor": 1, **axes}.items()}
    batch = np.array([2**22, 2**23])[:, None, None, None]
    cases = [(group(data=2, stage=4, fsdp=[2, 4, 8], tensor=[8, 4, 2]), dict(microbatches=[4, 8, 16], pipeline=p,
                                                                               repeats=r, attention="flash"))
             for p, r in (("gpipe", 1), ("circular", 2), ("1f1b", 1), ("1f1b", 2))]
    cases += [(group(data=[4, 2], fsdp=[2, 4], context=8, tensor=2), dict(microbatches=[1], context=ctx,
                                                                          attention=att, sequence_parallel=sp))
              for ctx in ("ulysses", "ring") for att in ("flash", "materialized") for sp in (False, True)]
    for mesh, kw in cases:
        sched = Schedule(**{**kw, "microbatches": np.array(kw["microbatches"])[None, :, None, None]})
        for remat in POLICY_KEEPS:
            w = Workload(LLAMA3_70B, mesh, batch, remat=remat, schedule=sched)
            one_by_one = kernels.compute_seconds(kernels.step_kernels(w, chip))
            at_once = kernels.compute_term(w, chip)
            assert np.shape(at_once) == np.shape(one_by_one) and np.array_equal(at_once, one_by_one), (kw, remat)


def test_choices_fix_what_they_name():
    """A named choice fixes it: only 1F1B with stages, only remat full, ZeRO-1 on every mesh with a data axis (stages
    too); plans keep their schedule fields."""
    c = Choices.of(LLAMA2_7B, remat="full", pipeline="1f1b", sequence_parallel=False, optimizer_sharding="zero1")
    plans = plan(LLAMA2_7B, V5P, 64, 2**20, choices=c)
    assert plans and {r.remat for r in plans} == {"full"}
    assert {r.pipeline for r in plans if r.mesh["stage"] > 1} == {"1f1b"}
    assert not any(r.sequence_parallel for r in plans)
    assert all(r.options["optimizer_sharding"] == ("zero1" if r.mesh["data"] > 1 else "fsdp") for r in plans)
    with pytest.raises(ValueError, match="every-second is for the FFN stack"):
        Choices.of(LLAMA2_7B, remat="every-second")


def _plan_cli(*args):
    return subprocess.run([sys.executable, "-m", "scaling", "plan", *args], capture_output=True, text=True, timeout=60)


def test_plan_cli_for_a_transformer(capsys):
    """plan --preset llama2-70b with explicit shapes: the table shows the five axes and the schedule, remat, SP,
    context strategy and optimizer columns; --json carries them; the FFN stack refuses the transformer's flags and
    bad transformer inputs are one line (exit 2)."""
    from jax_scaling.cli import main

    r = _plan_cli("--preset", "llama2-70b", "--slice", "v5p-256", "--vocab", "32768", "--mlp", "swiglu",
                  "--block", "parallel", "--top", "3")
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if line.lstrip().startswith("#"))
    for col in ("data", "stage", "fsdp", "context", "tensor", "sched", "remat", "SP", "ctx", "opt"):
        assert f" {col} " in f" {header} ", col
    assert main(["plan", "--preset", "llama2-70b", "--chip", "H100", "--chips", "64", "--remat", "full", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plans"] and all(p["remat"] == "full" and set(p["mesh"]) == {"data", "stage", "fsdp", "context",
                                                                              "tensor"} for p in out["plans"])
    for args in (["--preset", "xxl", "--schedule", "1f1b"], ["--preset", "xxl", "--sequence-parallel", "on"],
                 ["--preset", "xxl", "--heads", "8"], ["--preset", "xxl", "--attention", "flash"],
                 ["--preset", "xxl", "--optimizer-sharding", "zero1"], ["--preset", "llama2-7b", "--remat",
                                                                        "every-second"],
                 ["--preset", "llama2-7b", "--heads", "0"], ["--preset", "llama2-7b", "--seq-len", "1000"]):
        assert main(["plan", *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:"), (args, err)
        if "xxl" in args:
            assert "transformer" in err[0], err


@pytest.mark.compiles
@pytest.mark.skipif(not has_cuda_plugin(), reason="needs jax's CUDA plugin (the cuda-aot extra)")
def test_verify_top_compiles_a_gpu_plan_with_the_gpu_compiler():
    """--verify-top on GPUs compiles the top plan with XLA's GPU compiler ahead of time (gpu:H100:16, the CUDA
    plugin's topology of two nodes of 8, no GPU present): its arguments per device (the FP32 state and the int32
    batch) equal the closed form's master + optimizer + inputs, its peak is within 10% of the closed form's memory
    per device (the TPU band), and it fits 80 GB. Llama 2 7B on 16 H100s, a fresh process, up to 32 microbatches
    (the top plan with up to 64, M = 64, compiles to 0.892 of its closed form: docs/findings.md, "1F1B: the lookup
    inside the loop"). The optimizer sharding fixed at fsdp: with zero1 too (the GPU plan's default since issue 49)
    the top plan is data=4,stage=2,fsdp=2 with ZeRO-1, 77.72 GB by the closed form, which compiles to 80.08 GB (1.030),
    84 MB over the budget (docs/findings.md, "Planning 405B on 16,384 H100s")."""
    r = _plan_cli("--preset", "llama2-7b", "--chip", "H100", "--chips", "16", "--max-microbatches", "32",
                  "--optimizer-sharding", "fsdp", "--verify-top", "1", "--json")
    assert r.returncode == 0, r.stderr
    top = json.loads(r.stdout)["plans"][0]
    assert top["compiled_on"] == "gpu:H100:16" and top["compiled_fits"] is True
    terms = program.predict(workload_of(Plan.from_json(top), LLAMA2_7B), H100).memory
    state = terms["master"] + terms["optimizer"] + terms["inputs"]
    assert top["compiled_state_bytes"] == pytest.approx(state, rel=0.01)
    assert top["compiled_peak_bytes"] == pytest.approx(terms["total"], rel=0.10)
    assert top["compiled_peak_bytes"] <= H100.hbm_budget
