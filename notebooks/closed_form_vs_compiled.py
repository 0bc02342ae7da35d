# %% [markdown]
# # Closed forms against the compiled program
#
# Two independent accounts of one training (or forward) step of the FFN stack, per device:
#
# - **closed form**: `scaling.step.program.predict`, built from `scaling.step.flops`, `scaling.step.memory` and the
#   Scaling Book collective volumes. It is derived from the model's structure (D, F, L), the mesh, the
#   batch, the remat policy and the step, and never looks at a compiled program.
# - **compiled**: the same step compiled by XLA ahead of time (`ffn_model.compile.abstract_compile`)
#   for 8 emulated CPU devices or a TPU v5p topology (through libtpu, no TPU needed), read back by
#   `verify.hlo`: dot/convolution FLOPs times loop trip counts, each collective's volume assigned to
#   mesh axes from its replica groups, and the compiler's `memory_analysis()`.
#
# `verify.check.check` puts the two side by side; every number in this notebook is one of its rows,
# or computed from them. The ratio is **compiled / closed form**. The closed forms are what
# `scaling.planner.plan` ranks meshes with for slices we cannot run on, so this is the check that they describe
# the program XLA actually builds.
#
# Acceptance bands (the same as `tests/test_check.py`):
#
# | quantity | band |
# |---|---|
# | matmul FLOPs, argument bytes | 0.99 – 1.01 |
# | collective bytes, total and per mesh axis | 0.98 – 1.02 |
# | compiler's peak memory (TPU targets only) | 0.90 – 1.10 |
#
# The peak is compared on TPU targets only: XLA:CPU's buffer assignment is not XLA:TPU's, so the CPU
# peak says nothing about the closed form. XLA:CPU runs bf16 collectives in f32; the closed form for
# CPU devices models that as 4 bytes per element.

# %%
import os
import time

# 8 emulated CPU devices, asked for before jax starts its backend; TPU targets are compiled ahead
# of time through libtpu. ALLOW_MULTIPLE_LIBTPU_LOAD lets this run beside another process that
# has libtpu loaded (nothing here touches a real TPU).
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
import jax
jax.config.update("jax_num_cpu_devices", 8)

import math
import matplotlib.pyplot as plt
from IPython.display import HTML, display

from mesh import devices as mesh_devices
from verify.check import check, grid_workload

# %matplotlib inline
plt.rcParams.update({"figure.dpi": 110, "font.size": 8})
print(f"jax {jax.__version__}, {len(jax.devices('cpu'))} CPU devices, libtpu installed: {mesh_devices.has_libtpu()}")

# %% [markdown]
# ## The grid
#
# The configurations `tests/test_check.py` asserts, from `verify.grids` (`CPU_GRID`, `TPU_GRID`,
# `XXL_TRAIN`): on 8 CPU devices every data × fsdp × tensor factorisation of 8, then an odd number of
# blocks, two batch sizes, remat none / every-second / full, train and forward; on TPU v5p topologies
# (2x2x1, 2x2x2, 4x4x4) a 4096 × 16384 model large enough that XLA:TPU keeps its arrays in HBM, and the
# XXL (D = 16384, F = 53248, L = 126) on 4x4x4 with fsdp = 16, tensor = 4 at 25,600 tokens, including
# the full train step of `test_tpu_xxl_train_step`. Then `TPU_MID_GRID`: 1024- to 3072-wide models on
# 2x2x1 to 2x2x4, held to the FLOPs, argument and collective bands; their peak is shown but not held to
# the ±10% band (at a few hundred MB, XLA's backward working set, which the closed form does not model,
# is a tenth of it).

# %%
from verify.grids import CPU_GRID, TPU_GRID, TPU_MID_GRID, XXL_TRAIN

TPU_GRID = TPU_GRID + [XXL_TRAIN]
print(f"{len(CPU_GRID)} CPU configurations, {len(TPU_GRID)} TPU configurations, {len(TPU_MID_GRID)} mid-sized TPU ones")

# %%
t0 = time.perf_counter()
cpu_reports = [check(grid_workload(*row), "cpu:8") for row in CPU_GRID]
print(f"CPU grid: {len(cpu_reports)} steps compiled and read in {time.perf_counter() - t0:.1f} s "
      f"(compile {sum(r.config.compile_seconds for r in cpu_reports):.1f} s)")

# %%
tpu_reports, mid_reports = [], []
if not mesh_devices.has_libtpu():
    print("libtpu is not installed: the TPU grid is skipped (pip install -e '.[tpu]')")
else:
    t0 = time.perf_counter()
    for grid, reports in ((TPU_GRID, tpu_reports), (TPU_MID_GRID, mid_reports)):
        for devices, cfg, mesh, batch, remat, step in grid:
            reports.append(check(grid_workload(cfg, mesh, batch, remat, step), devices))
            c = reports[-1].config
            print(f"{devices:<14} {cfg.d_model}x{cfg.d_ff}x{cfg.blocks:<4} {mesh:<24} B={batch:<6} {remat:<12} "
                  f"{step:<8} compiled in {c.compile_seconds:5.1f} s")
    print(f"TPU grids: {len(tpu_reports) + len(mid_reports)} steps compiled and read in "
          f"{time.perf_counter() - t0:.1f} s")

# %% [markdown]
# ## Ratios, compiled / closed form
#
# One row per configuration. `per-axis`: collective bytes per mesh axis (keys as `verify.hlo` assigns
# them from the replica groups); `peak`: the compiler's peak memory (TPU only); `windowed RS`: whether
# XLA ran the gradient reduce-scatter as a windowed einsum (collective-permutes in a loop), a fact of
# the program that `verify.check` passes to the closed form, which models both implementations.
# Ratios outside their band are shown in red.

# %%
BANDS = {"flops": (0.99, 1.01), "args": (0.99, 1.01), "coll": (0.98, 1.02), "axis": (0.98, 1.02), "peak": (0.90, 1.10),
         "peak_mid": (0.0, math.inf)}  # mid-sized models: the peak is shown, not banded

def ratios(rep):
    # the ratios of one report, by quantity; per-axis ratios as a dict
    return {"flops": rep.flops.matmul.ratio,
            "args": rep.memory.arguments.ratio,
            "coll": rep.collectives.total_bytes.ratio,
            "axis": {a: r.ratio for a, r in rep.collectives.by_axis.items()},
            "peak": rep.memory.peak.ratio if not rep.config.devices.startswith("cpu") else None,
            "mid": any(rep is m for m in mid_reports)}

def mesh_text(rep):
    m = rep.config.mesh
    return ",".join(f"{k}={v}" for k, v in m.items() if v > 1) or "1 device"

def model_text(rep):
    m = rep.config.model
    return f"{m['d_model']}x{m['d_ff']}x{m['blocks']}"

def cell(x, band):
    if x is None:
        return "<td>-</td>"
    bad = not (band[0] <= x <= band[1])
    return f"<td style='text-align:right{';color:#c00;font-weight:bold' if bad else ''}'>{x:.5f}</td>"

def html_table(reports):
    head = ["devices", "model DxFxL", "mesh", "B", "remat", "step", "flops", "args", "collectives",
            "per-axis", "peak (TPU)", "windowed RS"]
    rows = []
    for rep in reports:
        c, r = rep.config, ratios(rep)
        axes = "<br>".join(f"{a} <span style='color:{'#c00' if not (0.98 <= v <= 1.02) else 'inherit'}'>{v:.5f}</span>"
                           for a, v in r["axis"].items()) or "-"
        rows.append("<tr>" + "".join([
            f"<td>{c.devices}</td>", f"<td>{model_text(rep)}</td>", f"<td>{mesh_text(rep)}</td>",
            f"<td style='text-align:right'>{c.batch_tokens:,}</td>", f"<td>{c.remat}</td>",
            f"<td>{c.step}</td>",
            cell(r["flops"], BANDS["flops"]), cell(r["args"], BANDS["args"]), cell(r["coll"], BANDS["coll"]),
            f"<td style='text-align:right'>{axes}</td>", cell(r["peak"], BANDS["peak_mid" if r["mid"] else "peak"]),
            f"<td>{'yes' if c.windowed_grad_rs else 'no'}</td>"]) + "</tr>")
    return ("<table style='font-size:85%'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join(rows) + "</table>")

display(HTML("<h4>8 emulated CPU devices</h4>" + html_table(cpu_reports)))
if tpu_reports:
    display(HTML("<h4>TPU v5p topologies (ahead of time)</h4>" + html_table(tpu_reports)))
    display(HTML("<h4>TPU v5p, mid-sized models (peak not banded)</h4>" + html_table(mid_reports)))

# %% [markdown]
# ## The same ratios, plotted
#
# Each configuration (x) carries one marker per quantity; the shaded bands are the acceptance bands
# (darkest 0.99 – 1.01 for FLOPs and arguments, then 0.98 – 1.02 for collectives, lightest
# 0.90 – 1.10 for the TPU peak). Markers are spread a little sideways so that coinciding ratios stay
# visible. The y range of each panel is set from the data so that no point is clipped.

# %%
MARKERS = {"flops": ("matmul FLOPs", "o"), "args": ("argument bytes", "s"), "coll": ("collective bytes, total", "^"),
           "data": ("collectives on data", "v"), "fsdp": ("collectives on fsdp", "<"),
           "tensor": ("collectives on tensor", ">"),
           "peak": ("peak memory (TPU)", "D"), "peak_mid": ("peak memory (mid-sized, not banded)", "d")}

def short_label(rep):
    c = rep.config
    mesh = "·".join(f"{k[0]}{v}" for k, v in c.mesh.items() if v > 1)
    dev = "" if c.devices.startswith("cpu") else c.devices.split(":")[-1] + " "
    return f"{dev}{model_text(rep)} {mesh} B{c.batch_tokens} {c.remat} {c.step}"

def series(reports):
    # {quantity: [(x, ratio), ...]}; per-axis keys that are not a single mesh axis get their own marker
    out = {}
    for i, rep in enumerate(reports):
        r = ratios(rep)
        for q in ("flops", "args", "coll", "peak"):
            if r[q] is not None:
                out.setdefault("peak_mid" if q == "peak" and r["mid"] else q, []).append((i, r[q]))
        for a, v in r["axis"].items():
            out.setdefault(a, []).append((i, v))
    return out

def panel(ax, reports, title):
    s = series(reports)
    for lo, hi, shade, label in [(0.90, 1.10, 0.93, "0.90–1.10 (TPU peak)"),
                                 (0.98, 1.02, 0.85, "0.98–1.02 (collectives)"),
                                 (0.99, 1.01, 0.74, "0.99–1.01 (FLOPs, arguments)")]:
        ax.axhspan(lo, hi, color=str(shade), zorder=0, label=label)
    ax.axhline(1.0, color="k", lw=0.6, zorder=1)
    keys = list(s)
    for k, q in enumerate(keys):
        name, marker = MARKERS.get(q, (f"collectives on {q}", "X"))
        dx = (k - (len(keys) - 1) / 2) * 0.09
        ax.scatter([x + dx for x, _ in s[q]], [y for _, y in s[q]], marker=marker, s=22, label=name, zorder=3,
                   edgecolors="k", linewidths=0.3)
    ys = [y for pts in s.values() for _, y in pts]
    peak = "peak" in s or "peak_mid" in s
    lo, hi = (0.885, 1.115) if peak else (0.975, 1.025)
    ax.set_ylim(min(lo, min(ys) - 0.005), max(hi, max(ys) + 0.005))
    ax.set_xticks(range(len(reports)))
    ax.set_xticklabels([short_label(r) for r in reports], rotation=60, ha="right", fontsize=6.5)
    ax.set_xlim(-0.6, len(reports) - 0.4)
    ax.set_ylabel("compiled / closed form")
    ax.set_title(title)
    ax.grid(axis="y", lw=0.3, alpha=0.5)

panels = [(cpu_reports, "8 emulated CPU devices")] + ([(tpu_reports, "TPU v5p topologies (ahead of time)"),
                                                        (mid_reports, "TPU v5p, mid-sized")] if tpu_reports else [])
fig, axes = plt.subplots(1, len(panels), figsize=(15, 5.8), squeeze=False,
                         gridspec_kw={"width_ratios": [len(r) for r, _ in panels]})
for ax, (reports, title) in zip(axes[0], panels):
    panel(ax, reports, title)
handles, labels = {}, {}
for ax in axes[0]:
    for h, lab in zip(*ax.get_legend_handles_labels()):
        handles.setdefault(lab, h)
axes[0][-1].legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                   frameon=False)
fig.suptitle("Closed forms (scaling.step.program) against XLA's compiled program (verify.hlo): ratio per configuration")
fig.supxlabel("configuration: [TPU topology] DxFxL, mesh (d/f/t = data/fsdp/tensor), B tokens, remat, step", fontsize=8)
fig.tight_layout()
plt.show()


# %% [markdown]
# ## Residuals
#
# For each quantity, the largest |ratio − 1| over the grid, the configuration where it occurs, and
# whether every configuration is inside the quantity's band. Computed from the reports above.

# %%
def residuals(reports, platform):
    s = series(reports)
    print(f"{platform}: {len(reports)} configurations")
    print(f"  {'quantity':<26} {'max |ratio-1|':>13}  {'band':>11}  {'all in band':>11}  worst configuration")
    for q, pts in s.items():
        band = BANDS[q] if q in BANDS else BANDS["axis"]
        i, worst = max(pts, key=lambda p: abs(p[1] - 1))
        inside = all(band[0] <= y <= band[1] for _, y in pts) if q != "peak_mid" else None
        name = MARKERS.get(q, (f"collectives on {q}",))[0]
        where = short_label(reports[i]) if worst != 1 else "(every configuration exactly 1)"
        band_text = f"{band[0]:.2f}–{band[1]:.2f}" if q != "peak_mid" else "not banded"
        verdict = "-" if inside is None else ("yes" if inside else "NO")
        print(f"  {name[:26]:<26} {abs(worst - 1):>13.3e}  {band_text:>11}  {verdict:>11}  {where}")

residuals(cpu_reports, "CPU (8 emulated devices)")
if tpu_reports:
    residuals(tpu_reports, "TPU v5p (ahead of time)")
    residuals(mid_reports, "TPU v5p, mid-sized models")
else:
    print("TPU grid skipped: libtpu is not installed")
