# %% [markdown]
# # Pipeline stages and microbatches: the bubble, and memory against the microbatch count
#
# The `stage` mesh axis (issue 12) runs the FFN stack's L blocks as S pipeline stages (`ffn_model.pipeline`):
# microbatches flow stage to stage with `jax.lax.ppermute` inside one `lax.scan` of T = R·M + S − 1
# iterations (GPipe for R = 1, circular for R > 1). Without a stage axis, M microbatches are gradient
# accumulation. This notebook shows, for the XXL model (D = 16384, F = 53248, L = 126):
#
# 1. the bubble in both conventions it is quoted in (closed forms, `scaling.step.pipeline`);
# 2. per-device peak memory against the microbatch count at a fixed stage count, the closed form
#    (`scaling.step.program.predict`, term by term) beside the compiler's peak for v5p (ahead of time);
# 3. gradient accumulation: the XXL at 1M tokens on 128 v5p chips, which one pass cannot fit;
# 4. the planner's best plans with and without stages on v5p-1024.

# %%
import os
import time
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
import jax
import matplotlib.pyplot as plt
import numpy as np

from mesh import devices as mesh_devices
from scaling.step import pipeline
from scaling.step import program
from scaling.core.mesh_shape import MeshShape
from scaling.families.presets import PRESETS
from scaling.core.schedule import Schedule
from scaling.hardware.chips import get_chip
from scaling.planner.plan import plan
from scaling.core.workload import Workload

XXL, V5P = PRESETS["xxl"], get_chip("v5p")
HAVE_TPU = mesh_devices.has_libtpu()
if HAVE_TPU:
    from verify.check import check
# %matplotlib inline
plt.rcParams.update({"figure.dpi": 110, "font.size": 8})
print(f"jax {jax.__version__}; libtpu installed: {HAVE_TPU}")

# %% [markdown]
# ## 1. The bubble, both conventions
#
# With S stages, M microbatches and R repeats (chunks per stage), the compiled schedule runs
# T = R·M + S − 1 iterations, R·M of them useful per stage:
#
# - **idle share of the step** (MaxText's convention): (S − 1)/(R·M + S − 1);
# - **overhead relative to the ideal step** (Megatron-LM, Narayanan et al. 2021; interleaved:
#   (S − 1)/(v·M) with v = R): (S − 1)/(R·M).
#
# A scan-based pipeline computes in its bubble iterations too (on whatever a stage holds), so the
# overhead is paid as executed FLOPs: `python -m scaling check` counts T·L/(S·R) block-passes per stage
# and matches the compiled program's matmul FLOPs exactly (tests/test_check.py, CPU and TPU stage grids).

# %%
Ms = np.arange(1, 65)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
for S, R, style in ((2, 1, "-"), (4, 1, "-"), (8, 1, "-"), (4, 2, "--"), (8, 4, ":")):
    b = [pipeline.bubble(Schedule(int(M), R), S) for M in Ms]
    lab = f"S={S}" + (f", R={R}" if R > 1 else " (GPipe)")
    axes[0].plot(Ms, [x["idle_share"] for x in b], style, label=lab)
    axes[1].plot(Ms, [x["overhead"] for x in b], style, label=lab)
axes[0].set(title="idle share of the step (S-1)/(RM+S-1)", xlabel="microbatches M", xscale="log", ylim=(0, 1))
axes[1].set(title="overhead vs the ideal step (S-1)/(RM)", xlabel="microbatches M", xscale="log", yscale="log")
axes[0].legend()
plt.tight_layout()
plt.show()
for S, M, R in ((2, 4, 1), (4, 8, 1), (4, 8, 2)):
    b = pipeline.bubble(Schedule(M, R), S)
    print(f"S={S} M={M} R={R}: T = {pipeline.iterations(Schedule(M, R), S)} iterations; idle share "
          f"{b['idle_share']:.4f}, overhead {b['overhead']:.4f}")

# %% [markdown]
# ## 2. Peak memory against the microbatch count, XXL at stage=2, fsdp=8, tensor=4
#
# 64 v5p chips (v5p:4x4x4), B = 25,600 tokens, no remat: 2 stages of 63 blocks (126 = 2·3²·7: 4 stages
# cannot split it). The closed form's terms (`scaling.step.memory.memory_per_device`):
#
# - the stage's FP32 state, 16·P/N (master, Adam moments, gradient accumulator) — fixed;
# - **activations in flight**: a scan's backward needs every forward iteration's residuals, so all
#   T = M + S − 1 iterations' activations are live at the peak, each of B/(M·data·fsdp) tokens:
#   T·saved_per_token·B/(M·data·fsdp). The microbatches split the batch, so this term tends to the
#   whole batch's activations, (M + S − 1)/M of them: GPipe cannot shrink it below one batch;
# - the backward loop's per-iteration stage gradient (grad_iteration, 4·P/N), one iteration's residuals
#   being stacked (staging, 1/M of a batch), stage 0's buffer, the gathered weights, the batch.
#
# The compiled peak is XLA:TPU's `peak_memory_in_bytes` for the same step (`verify.check.check`); no compile is
# started once `NOTEBOOK_COMPILE_BUDGET_S` seconds have gone (unset: every M compiles; the test suite, which
# re-executes the notebook only to see that it runs, sets it low).

# %%
MESH, DEVICES, B = "stage=2,fsdp=8,tensor=4", "tpu:v5p:4x4x4", 25600
rows, budget, t_start = [], float(os.environ.get("NOTEBOOK_COMPILE_BUDGET_S", "inf")), time.perf_counter()
for M in (1, 2, 4, 8, 16, 32):
    workload = Workload(XXL, MeshShape(stage=2, fsdp=8, tensor=4), B, schedule=Schedule(M))
    terms = program.predict(workload).memory
    compiled, note = None, ""
    if HAVE_TPU and time.perf_counter() - t_start > budget:
        closed, note = terms["total"], "not compiled (NOTEBOOK_COMPILE_BUDGET_S)"
    elif HAVE_TPU:
        try:
            rep = check(workload, DEVICES)
            compiled, closed = rep.memory.peak.compiled, rep.memory.peak.closed_form
            # the terms as check computed them: it tells the closed form what XLA chose for the gradient
            # reduce-scatter (a windowed einsum holds one gathered matrix, not two blocks')
            terms = program.predict(workload.with_facts(windowed_grad_rs=rep.config.windowed_grad_rs)).memory
        except Exception as e:  # the compiler refuses a program that does not fit
            closed, note = terms["total"], str(e).split("\n")[0][:150]
    else:
        closed = terms["total"]
    rows.append((M, terms, closed, compiled, note))
print(f"{'M':>3} {'T':>3} {'state 16P/N':>11} {'activations':>11} {'staging':>8} {'grad_iter':>9} {'other':>6} "
      f"{'closed GB':>9} {'compiled GB':>11} {'ratio':>6}")
for M, t, closed, compiled, note in rows:
    state = t["master"] + t["optimizer"] + t["grads"]
    other = closed - state - t["activations"] - t["staging"] - t["grad_iteration"]
    ratio = f"{compiled / closed:6.3f}" if compiled else "     -"
    print(f"{M:>3} {M + 1:>3} {state / 1e9:>11.2f} {t['activations'] / 1e9:>11.2f} {t['staging'] / 1e9:>8.2f} "
          f"{t['grad_iteration'] / 1e9:>9.2f} {other / 1e9:>6.2f} {closed / 1e9:>9.2f} "
          f"{(compiled or float('nan')) / 1e9:>11.2f} {ratio}  {note}")
print("other: the gathered weights, the batch, stage 0's buffer")

# %%
Mv = [r[0] for r in rows]
fig, ax = plt.subplots(figsize=(6, 3.4))
ax.plot(Mv, [r[2] / 1e9 for r in rows], "o-", label="closed form, total")
ax.plot([r[0] for r in rows if r[3]], [r[3] / 1e9 for r in rows if r[3]], "s", label="compiled peak (v5p)")
ax.plot(Mv, [r[1]["activations"] / 1e9 for r in rows], "^--", label="activations in flight (closed form)")
ax.axhline(V5P.hbm_budget / 1e9, color="k", lw=0.8, ls=":", label="usable HBM per chip")
ax.set(xscale="log", xlabel="microbatches M", ylabel="GB per device",
       title="XXL, stage=2, fsdp=8, tensor=4, B=25,600 (v5p:4x4x4)")
ax.set_xticks(Mv, [str(m) for m in Mv])
ax.legend(fontsize=7)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3. Gradient accumulation: the XXL at 1M tokens on 128 v5p chips
#
# Without remat, one pass over 1,048,576 tokens fits no mesh of 128 v5p chips (the planner's nearest
# miss needs 179 GB per device). M microbatches of gradient accumulation hold one microbatch's
# activations at a time and add one FP32 gradient accumulator (4·P/N). The planner ranks fsdp=32,
# tensor=4 with M = 4 first; compiled for v5p:4x4x8 it fits.

# %%
t_start = time.perf_counter()
for M in (1, 2, 4, 8):
    workload = Workload(XXL, MeshShape(fsdp=32, tensor=4), 2**20, schedule=Schedule(M))
    t = program.predict(workload).memory
    line = (f"M={M}: closed form {t['total'] / 1e9:6.1f} GB (activations {t['activations'] / 1e9:5.1f}, "
            f"accumulator {t.get('accumulated', 0) / 1e9:4.1f})")
    if HAVE_TPU and time.perf_counter() - t_start > budget:
        line += "; not compiled (NOTEBOOK_COMPILE_BUDGET_S)"
    elif HAVE_TPU:
        try:
            rep = check(workload, "tpu:v5p:4x4x8")
            pk = rep.memory.peak
            line += (f"; compiled {pk.compiled / 1e9:6.1f} GB against {pk.closed_form / 1e9:6.1f} "
                     f"(ratio {pk.ratio:.3f})")
        except Exception as e:  # the compiler refuses a program that does not fit
            line += "; compiler: " + str(e).split("\n")[0][:150]
    print(line + ("  <- over the 102.8 GB usable" if t["total"] > V5P.hbm_budget else ""))

# %% [markdown]
# ## 4. The planner with and without stages: v5p-1024, 1M tokens
#
# `scaling.planner.plan` enumerates (data, stage, fsdp, tensor) and the microbatch count (and circular repeats),
# the bubble in its executed FLOPs and the activations in flight in its memory.

# %%
t0 = time.perf_counter()
plans = plan(XXL, V5P, 512, 2**20)
print(f"{len(plans)} plans in {time.perf_counter() - t0:.2f} s")
best = {s: next(p for p in plans if (p.mesh["stage"] > 1) == s) for s in (False, True)}
for staged, p in best.items():
    m = ",".join(f"{a}={n}" for a, n in p.mesh.items() if n > 1)
    print(f"{'with' if staged else 'without'} stages: #{plans.index(p) + 1} {m} M={p.microbatches} "
          f"R={p.repeats}: step {p.step_seconds['sum']:.3f} s (sum form), bubble {p.bubble:.3f} of the ideal step = "
          f"{p.bubble_seconds:.3f} s, {p.memory_bytes / 1e9:.1f} GB per device")
