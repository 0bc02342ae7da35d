# %% [markdown]
# # Planning the XXL on TPU v5p slices
#
# `scaling.planner.plan` enumerates every (data, stage, fsdp, tensor) factorisation of a slice's chips (stage: pipeline
# stages, which must divide the 126 blocks: 1 or 2 here), the microbatch counts (gradient accumulation without
# stages, GPipe or circular with them) and every way of laying the mesh axes onto the slice's three physical
# ICI axes, drops the plans whose closed-form memory per chip exceeds the chip's usable HBM (the hardware
# table: 95.74 GiB = 102.8 GB, what the compiler reports as available on a v5p), and ranks the rest by
# predicted step time in the **sum form** (max(T_math, T_HBM) + the FSDP, TP and DP communication times: the
# compiled XXL forward step runs its collectives synchronously, docs/findings.md "Finding for question (c)"),
# with the max form (everything overlapped) beside it. Each mesh is listed once, with its best microbatch
# count. Both are roofline bounds: the step times are lower bounds and the MFU figures upper bounds. Slices
# are named by TensorCores (v5p-128 = 64 chips = 4x4x4).

# %%
import math
import time
import matplotlib.pyplot as plt
from scaling.families.presets import PRESETS
from scaling.hardware.chips import parse_slice
from scaling.planner.plan import plan

# %matplotlib inline
plt.rcParams.update({"figure.dpi": 110, "font.size": 9})
cfg = PRESETS["xxl"]
slices = ["v5p-64", "v5p-128", "v5p-256", "v5p-1024", "v5p-4096", "v5p-8960"]
per_chip_batch = 400                     # tokens per chip (B/N), about the question's sum-form threshold
results = {}
for s in slices:
    chip, dims = parse_slice(s)
    n = math.prod(dims)
    t0 = time.perf_counter()
    results[s] = plan(cfg, chip, n, per_chip_batch * n, dims=dims)
    print(f"{s:>9}: {n:5d} chips {'x'.join(map(str, dims)):>8}, B = {per_chip_batch * n:>9,} tokens: "
          f"{len(results[s]):3d} meshes fit {chip.hbm_budget / 1e9:.1f} GB "
          f"({(time.perf_counter() - t0) * 1e3:.0f} ms)")
print(chip.describe())


# %% [markdown]
# ## Ranked plans per slice (top 5)
# `M`: microbatches, `bubble`: the pipeline's (S−1)/(R·M) of the ideal step; `M_X`, `M_Y`: the number of
# physical ICI axes the fsdp and tensor mesh axes span; `step sum` / `step max`: the predicted step time in
# the two forms (ranked by the sum form); `MFU`: model FLOPs over the sum-form step at peak; `bound`: the
# largest closed-form term (compute, ICI on an axis, or HBM); `crit B`: the overall batch above which the
# FSDP+TP forward pass is compute bound (sum form), times the data-parallel size.

# %%
def table(plans, k=5):
    print(f"{'data':>5} {'stage':>5} {'fsdp':>5} {'tensor':>6} {'M':>3} {'bubble':>6} {'M_X':>3} {'M_Y':>3} "
          f"{'step sum':>9} {'step max':>9} {'MFU':>5} {'bound':>10} {'GB/chip':>8} {'crit B':>10}")
    for r in plans[:k]:
        m = r.mesh
        crit = "never" if r.critical_batch["sum"] is None else f"{r.critical_batch['sum']:,.0f}"
        print(f"{m['data']:>5} {m['stage']:>5} {m['fsdp']:>5} {m['tensor']:>6} {r.microbatches:>3} "
              f"{r.bubble:>6.3f} {r.M_X:>3} {r.M_Y:>3} {r.step_seconds['sum']:>9.3f} "
              f"{r.step_seconds['max']:>9.3f} {r.mfu['sum']:>5.2f} {r.bound:>10} {r.memory_bytes / 1e9:>8.1f} "
              f"{crit:>10}")
for s, plans in results.items():
    print(f"--- {s}")
    if not plans:
        print("  no mesh fits: 16 bytes/param of state alone need", math.ceil(16 * cfg.params / chip.hbm_budget),
              "chips")
        continue
    table(plans)
    staged = next((r for r in plans if r.mesh["stage"] > 1), None)
    if staged:
        print(f"  best with pipeline stages: #{plans.index(staged) + 1}, {staged.step_seconds['sum']:.3f} s "
              f"(bubble {staged.bubble:.3f} of the ideal step, {staged.bubble_seconds:.3f} s)")

# %% [markdown]
# ## Predicted step time and memory per plan

# %%
from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter, ScalarFormatter
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
shown = [(s, p) for s, p in results.items() if p]
# larger hollow markers first, so that a plan another slice shares (same memory, same time) stays visible
for k, (s, plans) in enumerate(shown):
    size = 11 - 1.6 * k
    axes[0].plot([r.memory_bytes / 1e9 for r in plans], [r.step_seconds["sum"] for r in plans], "o", ms=size,
                 mfc="none", mew=1.2, label=s)
    axes[1].plot(range(1, len(plans) + 1), [r.mfu["sum"] for r in plans], ".-", label=s)
budget = chip.hbm_budget / 1e9
axes[0].axvline(budget, color="k", ls="--", lw=0.8)
axes[0].text(budget - 1, 0.97, f"{budget:.1f} GB usable", ha="right", va="top", fontsize=8,
             transform=axes[0].get_xaxis_transform())
axes[0].set(xlabel="closed-form memory per chip (GB)", ylabel="predicted step time, sum form (s)", yscale="log",
            title=f"every fitting plan, B/N = {per_chip_batch} tokens")
axes[0].yaxis.set_major_locator(FixedLocator([1, 1.5, 2, 3, 4, 6]))
axes[0].yaxis.set_major_formatter(ScalarFormatter())
axes[0].yaxis.set_minor_formatter(NullFormatter())
axes[1].set(xlabel="plan rank", ylabel="MFU, sum form (upper bound)", xscale="log", title="MFU by rank")
axes[1].xaxis.set_major_formatter(FormatStrFormatter("%d"))
axes[0].legend(fontsize=7, loc="center right")
axes[1].legend(fontsize=7)
for a in axes:
    a.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# ## The ranking under the flags production runs pass
# The sum form is what libtpu's default flags compile (every gather synchronous). MaxText's v5p scripts pass
# flags that overlap the FSDP gathers (`maxtext` in scaling/data/xla_flags.toml), and the `overlap` set pipelines
# them across blocks; the **scheduled** form follows each set's schedule (math + the collectives it leaves
# exposed + its loop copies; `plan --form scheduled --xla-flags NAME`). The top three meshes of v5p-128 at the
# question's 25,600 tokens under each, with the memory each set's prefetched weights add:

# %%
chip, dims = parse_slice("v5p-128")
for form, flags in (("sum", "default"), ("scheduled", "maxtext"), ("scheduled", "overlap")):
    top = plan(cfg, chip, 64, 25600, dims=dims, form=form, flags=flags)[:3]
    print(f"{form:>9} form, {flags:8} flags: " + "; ".join(
        f"{','.join(f'{a}={n}' for a, n in p.mesh.items() if n > 1)} {p.step_seconds[form]:.3f} s "
        f"{p.memory_bytes / 1e9:.1f} GB" for p in top))

# %% [markdown]
# ## Where the time goes: the terms of the top plans
# The scheduled form's compute term is the step's kernels one after another (scaling.step.kernels): each matmul at the
# fraction of peak its shape gets (the chip's matmul efficiency, fitted on a measured run: `jax-scaling validate
# --fit`, times the MXU's tile quantization), the pointwise passes and AdamW's update at the HBM bandwidth. The
# top three plans of v5p-128 at 25,600 tokens under `maxtext`, term by term (`jax-scaling predict --kernels` prints
# one of them kernel by kernel):

# %%
from scaling.step import kernels  # noqa: E402
from scaling.step import program  # noqa: E402
from scaling.planner.plan import workload_of  # noqa: E402

for p in plan(cfg, chip, 64, 25600, dims=dims, form="scheduled", flags="maxtext")[:3]:
    w = workload_of(p, cfg, flags="maxtext")
    t = program.predict(w, chip, layout={a: (v["lens"], v["wrap"]) for a, v in p.layout.items()}).times
    ks = kernels.step_kernels(w, chip)
    by_kind = {}
    for k in ks:
        by_kind[k.kind] = by_kind.get(k.kind, 0.0) + float(k.seconds)
    mesh = ",".join(f"{a}={n}" for a, n in p.mesh.items() if n > 1)
    print(f"{mesh}: step {float(t.step['scheduled']):.3f} s = compute {float(t.compute):.3f} ("
          + ", ".join(f"{k} {v:.3f}" for k, v in by_kind.items()) + ") + exposed "
          + ", ".join(f"{a} {float(v):.3f}" for a, v in t.exposed.items()) + f"; MFU {float(t.mfu['scheduled']):.3f}"
          + f" (roofline math {float(t.math):.3f} s)")

# %% [markdown]
# ## Enumeration speed
# The closed forms only: 4,480 chips (v5p-8960) and the full 8,960-chip pod, 20 batch sizes each.

# %%
for n in (4480, 8960):
    batches = [n * k * 64 for k in range(1, 21)]
    t0 = time.perf_counter()
    r = plan(cfg, chip, n, batches)
    print(f"{n} chips x {len(batches)} batch sizes: {len(r)} plans in {time.perf_counter() - t0:.3f} s")
