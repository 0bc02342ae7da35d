# %% [markdown]
# # The 4D-parallelism questions, answered by the library
#
# The XXL FFN stack (D = 16384, F = 53248, L = 126 blocks of two bias-free linears) on TPU v5p.
# Every number below comes from a call into `scaling` (closed forms, no jax) or, in the last section,
# from the XLA compiler itself (ahead-of-time compilation for a v5p 4x4x4 topology on this CPU machine).
# Notation and formulas: the Scaling Book (jax-ml.github.io/scaling-book), training and sharding pages.

# %%
import matplotlib.pyplot as plt
import numpy as np
from scaling.step import memory
from scaling.hardware import roofline
from scaling.reports.answers import answers
from scaling.families.presets import PRESETS

# %matplotlib inline
plt.rcParams.update({"figure.dpi": 110, "font.size": 10})
ans = answers()          # the question's inputs: X=16, Y=4, M_X=2, M_Y=1, C=4.6e14, W_ici=1.8e11
print(ans.render())

# %% [markdown]
# ## (a), (b): memory per device against the FSDP size
#
# State (FP32 master, gradients, two Adam moments: 16 bytes/param) and half of the activations
# (bf16, "every second layer") sharded over N_FSDP devices:
# M(N) = [16·P + ½·2·(D+F)·L·B] / N.

# %%
cfg, inp = PRESETS["xxl"], ans.inputs
N = np.arange(8, 129)
state = memory.state_bytes(cfg) / N
acts = 0.5 * memory.activation_bytes_per_token(cfg) * inp.batch_tokens / N
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(N, state / 1e9, label="FP32 state (16 B/param)")
ax.plot(N, (state + acts) / 1e9,
        label=f"+ half the activations at B = {inp.batch_tokens:,} tokens (a batch we assume)")
ax.axhline(inp.hbm / 1e9, color="k", ls="--", label="95 GB (one v5p)")
n_state = ans.b.min_n_fsdp_without_activations
n_acts = ans.b.min_n_fsdp_with_half_activations_at_batch
for n, text, y, ha, dx in ((n_state, "state alone", 180, "right", -1.5),
                           (n_acts, "with activations", 240, "left", 1.5)):
    ax.axvline(n, color="grey", ls=":")
    ax.text(n + dx, y, f"N = {n}\n({text})", ha=ha, va="center", fontsize=8,
            bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="grey", lw=0.5))
ax.set(xlabel="N_FSDP (devices)", ylabel="memory per device (GB)", ylim=(0, 400),
       title="(b) memory per device vs FSDP size")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)

# %% [markdown]
# ## (c): forward-pass times at X = 16, Y = 4 against the per-device batch
#
# Per block: T_math = 4BDF/(N·C), T_FSDP = 4DF/(Y·M_X·W_ici), T_TP = 4BD/(X·M_Y·W_ici). The sum form
# (spring-2025 text) is compute bound when T_FSDP + T_TP < T_math, the max form (August-2025 text,
# overlapped communication) when max(T_FSDP, T_TP) < T_math.

# %%
c = ans.c
D, F, X, Y = inp.d_model, inp.d_ff, inp.fsdp, inp.tensor
per_dev = np.linspace(50, 800, 300)          # B/N tokens per chip
t = roofline.mixed_times(per_dev * c.N, D, F, X, Y, inp.flops, inp.w_ici, c.M_X, c.M_Y)
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(per_dev, t["math"] * 1e3, label="T_math", lw=2)
ax.plot(per_dev, np.broadcast_to(t["fsdp"], per_dev.shape) * 1e3, label="T_FSDP")
ax.plot(per_dev, t["tp"] * 1e3, label="T_TP")
ax.plot(per_dev, t["comms_sum"] * 1e3, "--", label="T_FSDP + T_TP (sum form)")
top = 6.5
for form, col, ha, dx, y in (("max", "C4", "right", -8, 0.6 * top), ("sum", "C3", "left", 8, 0.85 * top)):
    b = c.critical[form].per_device_batch
    ax.axvline(b, color=col, ls=":")
    ax.text(b + dx, y, f"{form} form: B/N = {b:.0f}\nB = {c.critical[form].overall_batch / 1e3:.1f}k tokens", color=col,
            ha=ha, va="center", fontsize=8, bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=col, lw=0.5))
ax.set(xlabel="per-device batch B/N (tokens per chip)", ylabel="time per block (ms)", ylim=(0, top),
       title="(c) forward pass, X=16, Y=4, M_X=2, M_Y=1")
ax.legend(loc="upper left", fontsize=8)
ax.grid(alpha=0.3)

# %% [markdown]
# ## (d): the threshold against the FSDP size X at fixed N = 64, and X_opt
#
# The critical overall batch for each split N = X·Y (continuous X; the integer splits are marked), both
# forms. X_opt = sqrt((B/F)·(M_X/M_Y)·N) minimises T_FSDP + T_TP at a **given** B; it lands on the
# curve's minimum only when B is the threshold batch itself, B = 4·alpha²·N/(M_X·M_Y·F) (sum form):
# then X_opt = 2·N·alpha/(F·M_Y) = 6.1 and the threshold is 15.7k tokens. Evaluated at the question's
# X = 16 threshold (B = 25.3k) it gives 7.8, which is not the minimum of this curve (the curve's
# minimum solves dB/dX = 0 with B itself a function of X). In the max form the curve falls towards
# X = N·alpha/(F·M_Y) = 3.1, where the TP condition stops holding (the book's alpha²/(M_X·M_Y·F) per chip).

# %%
from matplotlib.ticker import NullFormatter, ScalarFormatter
Xs = np.geomspace(1, 64, 400)
al, Nn = c.alpha, c.N
def crit(x, form):
    y = Nn / x
    fs = F / (y * c.M_X)
    m = F / (Nn * al)
    tp = 1 / (x * c.M_Y)
    return np.where(m > tp, fs / (m - tp) if form == "sum" else fs / m, np.nan)
fig, ax = plt.subplots(figsize=(7, 4))
ints = [1, 2, 4, 8, 16, 32, 64]
for form, col in (("sum", "C0"), ("max", "C1")):
    ax.plot(Xs, crit(Xs, form) / 1e3, color=col, label=f"{form} form")
    ax.plot(ints, [(roofline.critical_batch(F, x, Nn // x, al, c.M_X, c.M_Y, form) or np.nan) / 1e3
                   for x in ints],
            "o", ms=4, color=col)
    xo = c.x_opt[form]
    ax.plot([xo.x_opt], [xo.overall_batch / 1e3], "*", ms=11, color=col, mec="k", mew=0.5,
            label=f"X_opt = {xo.x_opt:.1f} at B = {xo.overall_batch / 1e3:.1f}k ({form} minimum)")
xq = roofline.x_opt(c.critical["sum"].overall_batch, F, Nn, c.M_X, c.M_Y)
ax.axvline(xq, color="grey", ls=":", lw=0.8)
ax.text(xq * 1.03, 62, f"X_opt at the question's\nB = {c.critical['sum'].overall_batch / 1e3:.1f}k: {xq:.1f}",
        fontsize=8, color="grey")
ax.axvline(X, color="k", ls="--", lw=0.8)
ax.text(X * 1.03, 85, "X = 16 (question)", fontsize=8)
ax.set(xscale="log", xlabel="FSDP size X (Y = 64/X)", ylabel="critical overall batch (k tokens)", ylim=(0, 100),
       title="(d) compute-bound threshold vs X, N = 64")
ax.set_xticks(ints)
ax.xaxis.set_major_formatter(ScalarFormatter())
ax.xaxis.set_minor_formatter(NullFormatter())
ax.legend(fontsize=8, loc="upper left")
ax.grid(alpha=0.3)
print({f: vars(ans.d.levers[f].best_split) for f in ("sum", "max")})

# %% [markdown]
# ## Closed form vs compiled: the full XXL on v5p:4x4x4 (fsdp = 16, tensor = 4, 25,600 tokens)
#
# The same train and forward steps, compiled here ahead of time for a real TPU v5p 4x4x4 topology
# (libtpu on this CPU machine, `ShapeDtypeStruct`s only, nothing allocated), read back from the
# compiled HLO (`verify.hlo`: dot FLOPs × loop trip counts, collectives by mesh axis) and
# `memory_analysis()`, beside the closed forms (`scaling.step.program.predict`). `verify.check` does both.

# %%
import os
os.environ.setdefault("JAX_PLATFORMS", "cpu")    # compile for TPU ahead of time; run nothing
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from mesh.devices import has_libtpu
from verify.check import check, grid_workload

xxl = PRESETS["xxl"]
reps = {}
if has_libtpu():
    for step in ("train", "forward"):
        reps[step] = check(grid_workload(xxl, "fsdp=16,tensor=4", inp.batch_tokens, "none", step), "tpu:v5p:4x4x4")
        print(reps[step].render(), end="\n\n")
else:
    print("libtpu is not installed (pip install -e '.[tpu]'): the compiled side is skipped")

# %%
if reps:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    panels = [("memory per device (GB)", 1e9, [("train", "memory", "arguments"), ("train", "memory", "peak"),
                                               ("forward", "memory", "peak")]),
              ("matmul FLOPs per device (TFLOP)", 1e12, [("train", "flops", "matmul"), ("forward", "flops", "matmul")])]
    for ax, (ylabel, unit, rows) in zip(axes, panels):
        xs = np.arange(len(rows))
        cells = [getattr(getattr(reps[s], q), k) for s, q, k in rows]  # e.g. reps["train"].memory.peak
        ax.bar(xs - 0.2, [r.closed_form / unit for r in cells], 0.4, label="closed form")
        ax.bar(xs + 0.2, [r.compiled / unit for r in cells], 0.4, label="compiled")
        ax.set_xticks(xs, [f"{s}\n{k}" for s, q, k in rows], fontsize=8)
        ax.set_ylabel(ylabel)
    ax = axes[2]
    crow = [(s, a) for s in ("train", "forward") for a in reps[s].collectives.by_axis]
    xs = np.arange(len(crow))
    ax.bar(xs - 0.2, [reps[s].collectives.by_axis[a].closed_form / 1e9 for s, a in crow], 0.4,
           label="closed form")
    ax.bar(xs + 0.2, [reps[s].collectives.by_axis[a].compiled / 1e9 for s, a in crow], 0.4, label="compiled")
    ax.set_xticks(xs, [f"{s}\n{a}" for s, a in crow], fontsize=8)
    ax.set_ylabel("collective volume V per device per step (GB)")
    axes[0].legend(fontsize=8)
    fig.suptitle("XXL on v5p:4x4x4, fsdp=16, tensor=4, 25,600 tokens: closed form beside compiled")
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ### Finding for (c): which form, sum or max, the compiled program supports
#
# The forward pass's collectives per mesh axis, how many of them are asynchronous (start/done pairs
# the scheduler can overlap with matmuls), and the step time in each form, all read from the
# program just compiled:

# %%
if reps:
    fwd, trn = reps["forward"], reps["train"]
    for name, r in (("forward", fwd), ("train", trn)):
        col = r.collectives
        print(f"{name}: {col.count} collectives in the program, {col.asynchronous} asynchronous; "
              "bytes per device per step:",
              ", ".join(f"{a} {v.compiled / 1e9:.2f} GB" for a, v in col.by_axis.items()),
              "| by kind:", ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in col.by_kind.items()))
    t = fwd.times
    print(f"forward: T_math {t.math:.3f} s, T_comms " + ", ".join(f"{a} {v:.3f} s" for a, v in t.comms.items())
          + f"; sum form {t.step_sum:.3f} s, max form {t.step_max:.3f} s")

# %% [markdown]
# In the forward step every FSDP all-gather and TP all-reduce is a synchronous instruction (the
# count of asynchronous collectives above is 0 for the forward pass): XLA:TPU schedules the weight
# all-gathers and the activation all-reduces between the matmuls, not beside them. So the compiled
# forward pass's structure supports the **sum** form (T_math + T_FSDP + T_TP) for question (c), the
# spring-2025 convention, not the overlapped max form. In the train step the only asynchronous
# collectives are the collective-permutes of the windowed-einsum gradient reduce-scatter, which run
# beside the dW matmul chunks: there, and only there, the max form's overlap holds. That is libtpu's
# default flags (the compiles above, `Workload`'s default); the next section compiles under the flags
# production runs pass.

# %% [markdown]
# ### (c) under production XLA flags
#
# MaxText's v5p scripts pass flags that run the FSDP all-gathers asynchronously (`maxtext` in
# `scaling/data/xla_flags.toml`); the `overlap` set adds the flags that pipeline them across blocks. The
# same forward step compiled under each set: which share of each axis's bytes the schedule overlaps with
# a matmul, the exposed bytes beside the closed form's (`scaling.step.program.exposed_volumes`), the copies the
# rotated loop adds, the peak, and the scheduled step time (math + exposed communication + copies).

# %%
from scaling.core.flags import FLAG_SETS

flag_reps = {}
if has_libtpu():
    for name in FLAG_SETS:
        w = grid_workload(xxl, "fsdp=16,tensor=4", inp.batch_tokens, "none", "forward").replace(flags=name)
        r = flag_reps[name] = check(w, "tpu:v5p:4x4x4")
        ov, t, pk = r.overlap, r.times, r.memory.peak
        print(f"{name:8} overlapped: " + ", ".join(f"{a} {v:.1%}" for a, v in ov.overlapped_share.items())
              + "; exposed (closed form / compiled): "
              + ", ".join(f"{a} {e.closed_form / 1e9:.2f} / {e.compiled / 1e9:.2f} GB"
                          for a, e in ov.exposed.items())
              + f"; loop copies {ov.loop_copies.compiled / 1e9:.1f} GB; peak {pk.compiled / 1e9:.2f} GB"
              f" (closed form {pk.closed_form / 1e9:.2f}); scheduled step {t.step_scheduled:.3f} s"
              f" (sum {t.step_sum:.3f}, max {t.step_max:.3f})")

# %% [markdown]
# Exposed communication per block against the batch, from the closed forms (v5p, the 4x4x4 layout's
# links: fsdp over 2 ICI axes, tensor over 1): under `default` every gather and all-reduce adds to the
# math; under `maxtext` W_in's gather stays exposed; under `overlap` only the TP all-reduce, once the
# batch makes a block's matmuls outlast its gathers (below X·alpha/M_X, the grey line, the hidden gathers run
# longer than the math they hide behind). Solid: the exposed collectives; dashed: what the scheduled step adds
# to the math (exposed collectives, hidden gathers that outlast the math, and under `overlap` the loop-state
# copies, 2·0.87 GB of HBM traffic per block); dotted: T_math.

# %%
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.hardware.chips import CHIPS
from scaling.step.program import predict
from scaling.core.workload import Workload

Bs = np.arange(2048, 65537, 2048)
fig, ax = plt.subplots(figsize=(7, 3.8))
links = {"fsdp": 2.0, "tensor": 1.0}
for name, color in zip(FLAG_SETS, ("C0", "C1", "C2")):
    w = Workload(xxl, parse_mesh_spec("fsdp=16,tensor=4"), Bs, "forward", flags=name)
    t = predict(w, CHIPS["v5p"], axis_links=links).times
    ax.plot(Bs, 1e3 * sum(np.broadcast_to(v, Bs.shape) for v in t.exposed.values()) / xxl.blocks, color=color,
            label=f"{name}: exposed collectives")
    ax.plot(Bs, 1e3 * (t.step["scheduled"] - np.maximum(t.math, t.hbm)) / xxl.blocks, color=color, ls="--", lw=0.8,
            label=f"{name}: scheduled step − math")
ax.plot(Bs, 1e3 * np.broadcast_to(t.math, Bs.shape) / xxl.blocks, "k:", label="T_math")
ax.axvline(ans.c.critical["max"].overall_batch, color="grey", lw=0.6)
ax.set_xlabel("global batch B (tokens)")
ax.set_ylabel("ms per block (forward)")
ax.set_title("XXL forward, fsdp=16, tensor=4 on v5p: time the flags' schedule leaves exposed")
ax.legend(fontsize=7)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## (d)'s pipeline line, compiled
#
# "Pipeline stages, weights gathered once per step" in (d) names a program: the forward step of the XXL
# on the question's 64 chips as 2 stages (4 cannot split 126 blocks) of fsdp = 8, tensor = 4, with 4
# microbatches. `verify.check.verify_pipeline` compiles it for v5p:4x4x4 twice, the FSDP weights
# gathered once per microbatch (every pipeline iteration gathers its stage's blocks) and once per step
# (`--fsdp-gather step`), and sets the collective bytes per mesh axis and the peak beside the closed
# forms (`python -m scaling answer --verify-pipeline` prints the same table).

# %%
if has_libtpu():
    from verify.check import render_pipeline, verify_pipeline
    print(render_pipeline(verify_pipeline(answers())))
else:
    print("libtpu is not installed: pip install -e '.[tpu]' to compile for v5p ahead of time")
