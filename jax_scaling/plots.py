"""``--plot FILE``: the pictures of predict, kernels, plan and validate (issue 41), each drawn from the result the
command prints with --json (one source of the figures) and written whole or not at all (save: a temporary file in
the same folder, then os.replace).

matplotlib (its Agg backend: no display) is imported inside the drawing functions, so that the command line starts
without it and a command without --plot never imports it. plot_path checks the flag's value where argparse checks
the flags, before any work: a PNG or SVG file in a folder that exists and takes a new file. Each draw_* function
returns the figure, whose artists hold the figures drawn (tests/test_plots.py reads them back).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap

FORMATS = {".png": "png", ".svg": "svg"}  # extension -> matplotlib's format
TINY = 1e-9  # a step term below this share of the step is not drawn (step_segments)
KIND_COLORS = {"matmul": "tab:blue", "attention": "tab:cyan", "pointwise": "tab:olive", "optimizer": "tab:brown"}


def plot_path(text: str) -> str:
    """--plot's value, checked before any work: its extension one of FORMATS (.png, .svg; any case), its folder an
    existing directory in which a file can be created (probed with a temporary file, removed at once), the path not
    a directory. argparse.ArgumentTypeError naming the path and what is wrong otherwise (one ``error:`` line, exit
    2: jax_scaling.cli.Parser.error)."""
    ext = os.path.splitext(text)[1].lower()
    if ext not in FORMATS:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown picture format {ext or '(no extension)'!r}; give a file "
                                         f"ending in {' or '.join(FORMATS)}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: no folder {folder}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name ending in {' or '.join(FORMATS)}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: cannot write in {folder} ({e.strerror or e})") from None
    return text


def add_plot_arg(p, what: str) -> None:
    """--plot FILE on a command's own parser; ``what`` says what it draws."""
    p.add_argument("--plot", type=plot_path, metavar="FILE.png|FILE.svg",
                   help=f"also draw {what} into FILE (PNG or SVG by its extension; written whole or not at all)")


def save(fig, path: str) -> None:
    """Write ``fig`` to ``path`` in the format its extension names (FORMATS): drawn into a temporary file in the
    same folder, then renamed over ``path`` (os.replace, atomic on POSIX), so the file is whole or absent; the
    temporary file removed where drawing fails. The new file takes the usual mode (0o666 less the umask)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".plot-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=FORMATS[os.path.splitext(path)[1].lower()])
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _figure(width: float, height: float, cols: int = 1, **margins):
    """A figure of ``cols`` axes drawn by the Agg backend (no display, no pyplot state: it is never shown), its
    margins fixed (Figure.subplots_adjust's ``margins``: a layout engine measures every label first, and took half
    of the drawing time)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    axes = fig.subplots(1, cols)
    fig.subplots_adjust(**margins)
    return fig, axes


def _title(text: str, width: int = 110) -> str:
    return "\n".join(textwrap.wrap(text, width))


def _mesh_text(mesh: dict) -> str:
    return ",".join(f"{a}={n}" for a, n in mesh.items() if n > 1) or "1 device"


def step_segments(report) -> list[tuple[str, float, str]]:
    """The step's time by term, bottom to top, [(label, seconds, color)], adding up to the scheduled step
    (scaling.program.predict: max(T_compute, T_hidden) + Σ T_exposed per axis + T_copies):
      compute by kernel class (the kernels' seconds summed by kind: matmul, attention, pointwise, optimizer), less
        the pipeline bubble's share;
      the pipeline bubble: idle_share = (slots − R·M)/slots (scaling.pipeline.bubble; GPipe (S−1)/(R·M+S−1)) of the
        forward, backward and recompute kernels' seconds (the idle iterations run them too: scaling.pipeline),
        the share plan's "bubble s" column takes of T_math;
      the overlapped collectives beyond the compute, max(0, T_hidden − T_compute): the step less the other terms;
      each axis's exposed collectives (terms exposed.<axis>), the loop copies (loop_copies).
    Terms under TINY of the step are left out (an axis's 4e-12 s of a size-1 group). ``report``: a PredictReport
    with its kernels (predict_report(..., True))."""
    from scaling import pipeline

    out = report.to_json()
    w = report.workload
    S = w.mesh.get("stage", 1)
    idle = pipeline.bubble(w.schedule, S)["idle_share"] if S > 1 else 0.0
    by_kind, passes = {}, 0.0
    for k in out["kernels"]:
        by_kind[k["kind"]] = by_kind.get(k["kind"], 0.0) + k["seconds"]
        if k["pass"] != "update":
            passes += k["seconds"]
    bubble = idle * passes
    segs = []
    for kind, s in by_kind.items():  # each class less its passes' bubble share
        own = sum(k["seconds"] for k in out["kernels"] if k["kind"] == kind and k["pass"] != "update")
        segs.append((f"compute: {kind}", s - idle * own, KIND_COLORS.get(kind, "tab:gray")))
    segs.append(("pipeline bubble", bubble, "lightgray"))
    t = out["terms"]
    exposed = {k[len("exposed."):]: v for k, v in t.items() if k.startswith("exposed.")}
    rest = out["step_seconds_by_form"]["scheduled"] - t["compute"] - sum(exposed.values()) - t["loop_copies"]
    segs.append(("overlapped collectives beyond compute", rest if rest > 1e-12 * out["step_seconds"] else 0.0,
                 "tab:pink"))
    reds = ("tab:red", "tab:orange", "tab:purple", "gold", "tab:green", "salmon")
    segs += [(f"exposed collectives: {a}", v, reds[i % len(reds)]) for i, (a, v) in enumerate(exposed.items())]
    segs.append(("loop copies", t["loop_copies"], "black"))
    return [(label, s, c) for label, s, c in segs if s > TINY * out["step_seconds"]]


def draw_predict(report):
    """predict --plot: the step's time as one stacked bar by term (step_segments, seconds; the scheduled form) beside
    the memory per device as one stacked bar by term (memory_terms, GB = 1e9 bytes) with the chip's usable HBM
    (hbm_budget_bytes) as a dashed line; the title names the model, chip, devices, mesh, batch and XLA flags."""
    out = report.to_json()
    fig, (ax_t, ax_m) = _figure(12.0, 6.0, 2, left=0.07, right=0.80, wspace=1.05, top=0.83, bottom=0.06)
    bottom = 0.0
    for label, s, color in step_segments(report):
        ax_t.bar(["step"], [s], bottom=bottom, color=color, label=f"{label} {s:.4g} s", width=0.5)
        bottom += s
    handles, labels = ax_t.get_legend_handles_labels()
    ax_t.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # as stacked
    ax_t.set_ylabel("seconds per step")
    ax_t.set_title(f"step {out['step_seconds']:.4g} s ({out['form']} form)\nMFU {out['mfu']:.3f}, bound: "
                   f"{out['bound']}", fontsize=9)
    cmap = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
            "tab:olive", "tab:cyan")
    bottom = 0.0
    terms = [(k, v) for k, v in out["memory_terms"].items() if k != "total" and v > 0]
    for i, (k, v) in enumerate(terms):
        ax_m.bar(["memory"], [v / 1e9], bottom=bottom, color=cmap[i % len(cmap)], label=f"{k} {v / 1e9:.2f} GB",
                 width=0.5)
        bottom += v / 1e9
    budget = out["hbm_budget_bytes"] / 1e9
    ax_m.axhline(budget, color="black", ls="--", lw=1, label=f"usable HBM of a {out['chip']} {budget:.4g} GB")
    ax_m.set(ylabel="GB per device", ylim=(0, 1.15 * max(budget, bottom)))
    ax_m.set_title(f"memory per device {out['memory_per_device_bytes'] / 1e9:.2f} GB"
                   + ("" if out["fits"] else "\n(does not fit)"), fontsize=9)
    handles, labels = ax_m.get_legend_handles_labels()
    ax_m.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(_title(f"{out['model_text']} on {out['devices']} {out['chip']} devices, mesh {_mesh_text(out['mesh'])}"
                        f", B = {out['batch_tokens']:,} tokens, M = {out['microbatches']}, remat {out['remat']}, "
                        f"{out['dtype']}, {out['xla_flags_text']}"), fontsize=9)
    return fig


def roofline_points(report) -> list[dict]:
    """The step's kernels that run FLOPs, as roofline points: x = FLOPs run / HBM bytes (FLOPs·executed/bytes),
    y = achieved FLOP/s = FLOPs·executed / seconds (Williams, Waterman, Patterson 2009, "Roofline"; seed 002's
    comp_int). Kernels of no FLOPs (pointwise, the optimizer: their HBM time only) or no calls have no place on
    log axes: left out (draw_kernels names them)."""
    pts = []
    for k in report.to_json()["kernels"]:
        if k["flops"] > 0 and k["bytes"] > 0 and k["seconds"] > 0:
            run = k["flops"] * k["executed"]
            pts.append({"name": k["name"], "pass": k["pass"], "kind": k["kind"], "x": run / k["bytes"],
                        "y": run / k["seconds"]})
    return pts


def table_gemm_points(chip, dtype: str) -> tuple[list[tuple[float, float]], str]:
    """The chip's kernel-table GEMMs of ``dtype`` (scaling.kernel_tables: rows m, n, k, seconds) as roofline points
    (x = 2mnk / (c·(mk + kn + mn)), c the dtype's bytes: scaling.kernels.shape_costs; y = 2mnk / seconds), and the
    table's path ("" and no points where the chip has none for the dtype)."""
    from scaling.kernels import DTYPE_BYTES, shape_costs

    table = getattr(chip, "kernel_table", None)
    sec = None if table is None else table.gemm.get(dtype)
    if sec is None:
        return [], ""
    pts = []
    for m, n, k, s in sec.rows:
        flops, moved = shape_costs(m, n, k, 1, 1, DTYPE_BYTES[dtype])
        pts.append((float(flops / moved), float(flops / s)))
    return pts, table.path


def draw_kernels(report):
    """kernels --mesh ... --plot: every kernel of the step on the chip's roofline (roofline_points; log axes), the
    roofline min(C, I·W_hbm) with C the peak of the report's dtype (scaling.kernels.peak_flops) and W_hbm the
    device's HBM bandwidth, the ridge point C/W_hbm (FLOPs per byte), and the chip's kernel-table GEMMs
    (table_gemm_points: measured or published)."""
    import numpy as np

    from scaling.kernels import peak_flops

    out, chip = report.to_json(), report.chip
    dtype = out["dtype"]
    C, bw = peak_flops(chip, dtype), chip.device_hbm_bw
    ridge = C / bw
    pts = roofline_points(report)
    gemms, source = table_gemm_points(chip, dtype)
    fig, ax = _figure(8.0, 6.0, left=0.11, right=0.97, top=0.87, bottom=0.09)
    xs = [p["x"] for p in pts] + [g[0] for g in gemms] + [ridge]
    lo, hi = min(xs) / 3, max(xs) * 3
    x = np.geomspace(lo, hi, 200)
    ax.plot(x, np.minimum(C, x * bw), color="black", lw=1.2, label=f"roofline: min({C / 1e12:.4g} TFLOP/s, "
            f"I x {bw / 1e12:.3g} TB/s)")
    ax.axvline(ridge, color="gray", ls="--", lw=1, label=f"ridge point {ridge:.0f} FLOPs/B")
    if gemms:
        ax.scatter([g[0] for g in gemms], [g[1] for g in gemms], s=10, color="lightgray", edgecolor="gray", lw=0.5,
                   label=f"kernel table GEMMs ({dtype}, {len(gemms)})", zorder=2)
    for kind in dict.fromkeys(p["kind"] for p in pts):
        sel = [p for p in pts if p["kind"] == kind]
        ax.scatter([p["x"] for p in sel], [p["y"] for p in sel], s=28, color=KIND_COLORS.get(kind, "tab:gray"),
                   label=f"step's {kind} kernels", zorder=3)
        for i, p in enumerate(sorted((p for p in sel if p["pass"] == "forward"), key=lambda p: p["x"])):
            ax.annotate(p["name"], (p["x"], p["y"]), fontsize=6, xytext=(2, -10 - 7 * (i % 3)),
                        textcoords="offset points")
    left = [k for k in out["kernels"] if not (k["flops"] > 0 and k["bytes"] > 0 and k["seconds"] > 0)
            and k["seconds"] > 0]
    note = ("not on the log axes (no FLOPs): " + ", ".join(f"{k['name']} ({k['pass']})" for k in left)
            + f", {sum(k['seconds'] for k in left) * 1e3:.3g} ms of HBM time") if left else ""
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(min([p["y"] for p in pts] + [g[1] for g in gemms]
                                                                + [C]) / 3, C * 2),
           xlabel="FLOPs per HBM byte", ylabel="achieved FLOP/s per device")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(_title(f"{out['model_text']} on {out['chip']} ({dtype}), mesh {_mesh_text(out['mesh'])}, "
                        f"B = {out['batch_tokens']:,} tokens: the step's kernels on the roofline"
                        + (f"; GEMMs of {source}" if source else "; no kernel table for this chip"), 110)
                 + ("\n" + _title(note, 110) if note else ""), fontsize=8)
    return fig


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (memory, seconds) no other point beats in both (Pareto 1906): sorted by memory, then
    seconds, each kept where its seconds are below every earlier one's; in order of memory."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    keep, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            keep.append(i)
            best = points[i][1]
    return keep


def draw_plan(result: dict, plans: list[dict], labelled: int = 5):
    """plan --plot: every plan listed (``plans``: each Plan.to_json, ranked) as its predicted step time (the ranking
    form's, step_seconds) against its memory per device (memory_bytes, GB), the HBM budget (result's hbm_budget) as a
    dashed line, the Pareto frontier (pareto) as a step line, the first ``labelled`` plans labelled by their mesh
    (and M, R where > 1). ``result``: plan's --json object (its chip, chips, slice, budget)."""
    fig, ax = _figure(8.0, 5.6, left=0.11, right=0.97, top=0.9, bottom=0.09)
    pts = [(p["memory_bytes"] / 1e9, p["step_seconds"]) for p in plans]
    ax.scatter([m for m, _ in pts], [s for _, s in pts], s=16, color="tab:blue", alpha=0.6,
               label=f"{len(plans)} plans")
    front = pareto(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], drawstyle="steps-post", color="tab:red", lw=1.2,
            marker="o", ms=4, label=f"Pareto frontier ({len(front)} plans)")
    budget = result["hbm_budget"] / 1e9
    ax.axvline(budget, color="black", ls="--", lw=1, label=f"HBM budget {budget:.4g} GB")
    for rank, p in enumerate(plans[:labelled], 1):
        text = f"#{rank} {_mesh_text(p['mesh'])}" + (f" M={p['microbatches']}" if p["microbatches"] > 1 else "") + (
            f" R={p['repeats']}" if p["repeats"] > 1 else "")
        ax.annotate(text, (p["memory_bytes"] / 1e9, p["step_seconds"]), fontsize=7, xytext=(4, 4 + 7 * (rank % 2)),
                    textcoords="offset points")
    form = plans[0]["form"] if plans else "scheduled"
    mems = [m for m, _ in pts if m > 0]
    wide = bool(mems) and max(mems) > 20 * min(mems)  # memory over decades: log axis
    ax.set(yscale="log", xscale="log" if wide else "linear", xlabel="memory per device (GB)",
           ylabel=f"predicted step ({form} form, s)")
    from matplotlib.ticker import ScalarFormatter

    for which in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # 2, 3, 4 s, not 2 x 10^0
        which(ScalarFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    where = f"{result['chips']} {result['chip']} chips" + (f" ({result['slice']})" if result.get("slice") else "")
    ax.set_title(_title(f"plan: {result['count']} meshes of {where}, {result['dtype']}, each with its best schedule; "
                        f"step time against memory per device", 90), fontsize=9)
    return fig


def draw_validate(v: dict):
    """validate --plot: each measured run's predicted step against its measured step (rows: measured_seconds,
    predicted_seconds; log axes), one scatter per group (TPU: circles, GPU: triangles, the package's bench:
    squares), y = x and the ±10% band (0.9x to 1.1x); each group's median |error| in its label."""
    import numpy as np

    fig, ax = _figure(6.4, 5.8, left=0.12, right=0.96, top=0.9, bottom=0.1)
    rows = v["rows"]
    style = {"tpu": ("o", "tab:blue", "TPU"), "gpu": ("^", "tab:red", "GPU"),
             "bench": ("s", "black", "GPU, this package's bench")}
    for g in dict.fromkeys(r["group"] for r in rows):
        sel = [r for r in rows if r["group"] == g]
        marker, color, name = style.get(g, ("x", "tab:gray", g))
        s = v["groups"].get(g, {})
        ax.scatter([r["measured_seconds"] for r in sel], [r["predicted_seconds"] for r in sel], s=20, marker=marker,
                   color=color, label=f"{name}: {len(sel)} runs" + (
                       f", median |error| {s['median_abs_error']:.1%}" if s else ""), zorder=3)
    both = [x for r in rows for x in (r["measured_seconds"], r["predicted_seconds"])]
    lo, hi = min(both) / 1.5, max(both) * 1.5
    x = np.geomspace(lo, hi, 50)
    ax.plot(x, x, color="black", lw=1, label="predicted = measured")
    ax.fill_between(x, 0.9 * x, 1.1 * x, color="gray", alpha=0.25, label="±10%")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (s)",
           ylabel="predicted step (s)")
    ax.set_title("validate: the step model against the published measured runs\n(scaling/data/measured.toml)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig
