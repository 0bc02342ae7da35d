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

from scaling.core.kinds import KernelPass
from scaling.core.table import time_text

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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)  # a renderer to measure labels with (place_labels), before the figure is saved
    axes = fig.subplots(1, cols)
    fig.subplots_adjust(**margins)
    return fig, axes


TITLE_LINES = 2  # a title's lines at most


def fit_title(fig, text: str, fontsize: float, lines: int = TITLE_LINES, ax=None) -> str:
    """``text`` in at most ``lines`` lines, each within the figure when centred on it (or on ``ax``, for an axes
    title), measured in the figure's renderer: words go on while the line fits; the last line cut short with "..."
    where more would follow (the command's text output carries the whole)."""
    renderer = fig.canvas.get_renderer()
    pos = ax.get_position() if ax is not None else None
    center = 0.5 if pos is None else (pos.x0 + pos.x1) / 2
    limit = (2 * min(center, 1 - center) - 0.03) * fig.bbox.width
    probe = fig.text(0, 0, "", fontsize=fontsize)

    def fits(line: str) -> bool:
        probe.set_text(line)
        return probe.get_window_extent(renderer).width <= limit

    out, words = [], text.split()
    while words and len(out) < lines:
        n = 1
        while n < len(words) and fits(" ".join(words[: n + 1])):
            n += 1
        out.append(" ".join(words[:n]))
        words = words[n:]
    if words:  # cut the last line short
        last = out[-1].split()
        while len(last) > 1 and not fits(" ".join(last) + " ..."):
            last.pop()
        out[-1] = " ".join(last) + " ..."
    probe.remove()
    return "\n".join(out)


def _overlap(a, b, pad: float = 0.0) -> float:
    """The area (display pixels²) two bounding boxes share, each grown by ``pad`` pixels on every side."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0) + 2 * pad
    h = min(a.y1, b.y1) - max(a.y0, b.y0) + 2 * pad
    return w * h if w > 0 and h > 0 else 0.0


def place_labels(ax, items: list[tuple[float, float, str]], avoid=(), fontsize: float = 7) -> list:
    """Annotate each (x, y, text) of ``items`` (data coordinates) in order, each where its text's bounding box
    (Text.get_window_extent, the figure's renderer) overlaps no label placed before, none of the boxes in
    ``avoid`` (a legend's) and stays inside the axes: offsets tried nearest first (right of the point, then left;
    level, then up and down in steps of one line), a thin gray leader line where a label is moved off its point;
    where none fits, the offset of least overlap. The annotations, in order. The axes' limits are frozen first
    (the offsets are measured on screen): draw every other artist before."""
    ax.set_xlim(ax.get_xlim())
    ax.set_ylim(ax.get_ylim())
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    step = fontsize * 1.35  # one line, points
    offsets = [(dx, k * step) for ks in ((0, 1, -1), (2, -2, 3, -3), (4, -4, 5, -5, 6, -6, 8, -8, 10, -10))
               for dx in (5, -5) for k in ks]
    placed, out = [], []
    for x, y, text in items:
        best = None
        for dx, dy in offsets:
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                            ha="left" if dx > 0 else "right", va="center", zorder=5)
            box = t.get_window_extent(renderer)
            outside = (max(frame.x0 - box.x0, 0) + max(box.x1 - frame.x1, 0)) * box.height + (
                max(frame.y0 - box.y0, 0) + max(box.y1 - frame.y1, 0)) * box.width
            cost = sum(_overlap(box, b, 3) for b in [*placed, *avoid]) + outside  # 6 px apart at least
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, t, box)
            else:
                t.remove()
            if cost == 0:
                break
        cost, t, box = best
        placed.append(box)
        out.append(t)
        if abs(t.xyann[1]) >= step:  # moved off its point: a leader line from the point to the label's near end
            end = ax.transData.inverted().transform((box.x0 - 1 if t.xyann[0] > 0 else box.x1 + 1,
                                                     (box.y0 + box.y1) / 2))
            ax.plot([x, end[0]], [y, end[1]], color="gray", lw=0.5, zorder=4, scalex=False, scaley=False)
    return out


def log_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Ticks for a log axis from ``lo`` to ``hi`` (lo > 0): the round numbers m·10^k within it for the densest of
    the mantissa sets (1), (1, 2, 5), (1, 2, 3, 5), (1, 1.5, 2, 3, 4, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
    giving at most ``most``; where even the densest gives fewer than 3 (a range under a factor ~1.5), evenly
    spaced round numbers (matplotlib's MaxNLocator, linear)."""
    import math

    from matplotlib.ticker import MaxNLocator

    sets = ((1,), (1, 2, 5), (1, 2, 3, 5), (1, 1.5, 2, 3, 4, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8))
    best: list[float] = []
    for mant in sets:
        ticks = [float(f"{m * 10.0 ** k:.6g}") for k in range(math.floor(math.log10(lo)) - 1,
                                                            math.ceil(math.log10(hi)) + 1)
                 for m in mant if lo <= m * 10.0 ** k <= hi]
        if len(ticks) > most:
            break
        best = ticks
    if len(best) >= 3:
        return best
    return [float(f"{t:.6g}") for t in MaxNLocator(6, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if lo <= t <= hi]


def _mesh_text(mesh: dict) -> str:
    return ",".join(f"{a}={n}" for a, n in mesh.items() if n > 1) or "1 device"


def step_segments(report) -> list[tuple[str, float, str]]:
    """The step's time by term, bottom to top, [(label, seconds, color)], adding up to the scheduled step
    (scaling.step.program.predict: max(T_compute, T_hidden) + Σ T_exposed per axis + T_copies):
      compute by kernel class (the kernels' seconds summed by kind: matmul, attention, pointwise, optimizer), less
        the pipeline bubble's share;
      the pipeline bubble: idle_share = (slots − R·M)/slots (scaling.step.pipeline.bubble; GPipe (S−1)/(R·M+S−1)) of the
        forward, backward and recompute kernels' seconds (the idle iterations run them too: scaling.step.pipeline),
        the share plan's "bubble s" column takes of T_math;
      the overlapped collectives beyond the compute, max(0, T_hidden − T_compute): the step less the other terms;
      each axis's exposed collectives (terms exposed.<axis>), the loop copies (loop_copies), the GPU's wait for a
      PyTorch runtime's host (host_idle).
    Terms under TINY of the step are left out (an axis's 4e-12 s of a size-1 group). ``report``: a PredictReport
    with its kernels (predict_report(..., True))."""
    from scaling.step import pipeline

    out = report.to_json()
    w = report.workload
    S = w.mesh.get("stage", 1)
    idle = pipeline.bubble(w.schedule, S)["idle_share"] if S > 1 else 0.0
    by_kind, passes = {}, 0.0
    for k in out["kernels"]:
        by_kind[k["kind"]] = by_kind.get(k["kind"], 0.0) + k["seconds"]
        if k["pass"] != KernelPass.UPDATE:
            passes += k["seconds"]
    bubble = idle * passes
    segs = []
    for kind, s in by_kind.items():  # each class less its passes' bubble share
        own = sum(k["seconds"] for k in out["kernels"] if k["kind"] == kind and k["pass"] != KernelPass.UPDATE)
        segs.append((f"compute: {kind}", s - idle * own, KIND_COLORS.get(kind, "tab:gray")))
    segs.append(("pipeline bubble", bubble, "lightgray"))
    t = out["terms"]
    exposed = {k[len("exposed."):]: v for k, v in t.items() if k.startswith("exposed.")}
    idle = t.get("host_idle", 0.0)  # a PyTorch runtime's GPU waiting for its host's launches
    rest = out["step_seconds_by_form"]["scheduled"] - t["compute"] - sum(exposed.values()) - t["loop_copies"] - idle
    segs.append(("overlapped collectives beyond compute", rest if rest > 1e-12 * out["step_seconds"] else 0.0,
                 "tab:pink"))
    reds = ("tab:red", "tab:orange", "tab:purple", "gold", "tab:green", "salmon")
    segs += [(f"exposed collectives: {a}", v, reds[i % len(reds)]) for i, (a, v) in enumerate(exposed.items())]
    segs.append(("loop copies", t["loop_copies"], "black"))
    segs.append(("host idle (the runtime's launches)", idle, "dimgray"))
    return [(label, s, c) for label, s, c in segs if s > TINY * out["step_seconds"]]


def draw_predict(report):
    """predict --plot: the step's time as one stacked bar by term (step_segments, seconds; the scheduled form) beside
    the memory per device as one stacked bar by term (memory_terms, GB = 1e9 bytes) with the chip's usable HBM
    (hbm_budget_bytes) as a dashed line; the title names the model, chip, devices, mesh, batch and XLA flags."""
    out = report.to_json()
    fig, (ax_t, ax_m) = _figure(12.0, 6.0, 2, left=0.07, right=0.80, wspace=1.05, top=0.83, bottom=0.06)
    bottom = 0.0
    for label, s, color in step_segments(report):
        ax_t.bar(["step"], [s], bottom=bottom, color=color, label=f"{label} {time_text(s)}", width=0.5)
        bottom += s
    handles, labels = ax_t.get_legend_handles_labels()
    ax_t.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # as stacked
    ax_t.set_ylabel("seconds per step")
    ax_t.set_title(f"step {time_text(out['step_seconds'])} ({out['form']} form)\nMFU {out['mfu']:.3f}, bound: "
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
    fig.suptitle(fit_title(fig, f"{out['model_text']} on {out['devices']} {out['chip']} devices, mesh "
                           f"{_mesh_text(out['mesh'])}, B = {out['batch_tokens']:,} tokens, M = {out['microbatches']}, "
                           f"remat {out['remat']}, {out['dtype']}, {out['xla_flags_text']}", 9), fontsize=9)
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
    """The chip's kernel-table GEMMs of ``dtype`` (scaling.hardware.kernel_tables: rows m, n, k, seconds) as roofline
    points (x = 2mnk / (c·(mk + kn + mn)), c the dtype's bytes: scaling.step.kernels.shape_costs; y = 2mnk / seconds),
    and the table's path ("" and no points where the chip has none for the dtype)."""
    from scaling.step.kernels import DTYPE_BYTES, shape_costs

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
    roofline min(C, I·W_hbm) with C the peak of the report's dtype (scaling.step.kernels.peak_flops) and W_hbm the
    device's HBM bandwidth, the ridge point C/W_hbm (FLOPs per byte), and the chip's kernel-table GEMMs
    (table_gemm_points: measured or published); the forward pass's kernels labelled apart (place_labels); a
    two-line title: the model and mesh, then the kernels of no FLOPs (off the log axes) and their HBM time."""
    import numpy as np

    from scaling.step.kernels import peak_flops

    out, chip = report.to_json(), report.chip
    dtype = out["dtype"]
    C, bw = peak_flops(chip, dtype), chip.device_hbm_bw
    ridge = C / bw
    pts = roofline_points(report)
    gemms, source = table_gemm_points(chip, dtype)
    fig, ax = _figure(9.0, 6.0, left=0.09, right=0.97, top=0.9, bottom=0.09)
    xs = [p["x"] for p in pts] + [g[0] for g in gemms] + [ridge]
    lo, hi = min(xs) / 3, max(xs) * 3
    x = np.geomspace(lo, hi, 200)
    ax.plot(x, np.minimum(C, x * bw), color="black", lw=1.2, label=f"roofline: min({C / 1e12:.4g} TFLOP/s, "
            f"I x {bw / 1e12:.3g} TB/s)")
    ax.axvline(ridge, color="gray", ls="--", lw=1, label=f"ridge point {ridge:.0f} FLOPs/B")
    if gemms:
        ax.scatter([g[0] for g in gemms], [g[1] for g in gemms], s=10, color="lightgray", edgecolor="gray", lw=0.5,
                   label=f"kernel table GEMMs ({os.path.basename(source)}, {dtype}, {len(gemms)})", zorder=2)
    for kind in dict.fromkeys(p["kind"] for p in pts):
        sel = [p for p in pts if p["kind"] == kind]
        ax.scatter([p["x"] for p in sel], [p["y"] for p in sel], s=28, color=KIND_COLORS.get(kind, "tab:gray"),
                   label=f"step's {kind} kernels", zorder=3)
    left = [k for k in out["kernels"] if not (k["flops"] > 0 and k["bytes"] > 0 and k["seconds"] > 0)
            and k["seconds"] > 0]
    passes, seconds = {}, {}
    for k in left:  # each kernel's passes together, longest first: "pointwise (forward, backward), adamw (update)"
        passes.setdefault(k["name"], []).append(k["pass"])
        seconds[k["name"]] = seconds.get(k["name"], 0.0) + k["seconds"]
    order = sorted(passes, key=lambda n: -seconds[n])
    note = (f"not on the log axes (no FLOPs): {sum(seconds.values()) * 1e3:.3g} ms of HBM time in "
            + ", ".join(f"{n} ({', '.join(passes[n])})" for n in order)) if left else ""
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(min([p["y"] for p in pts] + [g[1] for g in gemms]
                                                                + [C]) / 3, C * 2),
           xlabel="FLOPs per HBM byte", ylabel="achieved FLOP/s per device")
    ax.grid(alpha=0.3)
    legend = ax.legend(fontsize=7, loc="lower right")
    # labelled: the forward pass
    forward = sorted((p for p in pts if p["pass"] == KernelPass.FORWARD), key=lambda p: -p["y"])
    place_labels(ax, [(p["x"], p["y"], p["name"]) for p in forward], [legend.get_window_extent(
        fig.canvas.get_renderer())], fontsize=6)
    ax.set_title(fit_title(fig, f"{out['model_text']} on {out['chip']} ({dtype}), mesh {_mesh_text(out['mesh'])}, "
                           f"B = {out['batch_tokens']:,} tokens", 8, 1, ax) + "\n"
                 + fit_title(fig, note or "the step's kernels on the roofline"
                             + ("" if source else "; no kernel table for this chip"), 8, 1, ax), fontsize=8)
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
    (and M, R where > 1), apart from each other and the legend (place_labels); the step axis logarithmic with
    labelled round-number ticks over the plotted range (log_ticks). ``result``: plan's --json object (its chip,
    chips, slice, budget)."""
    fig, ax = _figure(8.0, 5.6, left=0.11, right=0.97, top=0.9, bottom=0.09)
    pts = [(p["memory_bytes"] / 1e9, p["step_seconds"]) for p in plans]
    ax.scatter([m for m, _ in pts], [s for _, s in pts], s=16, color="tab:blue", alpha=0.6,
               label=f"{len(plans)} plans")
    front = pareto(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], drawstyle="steps-post", color="tab:red", lw=1.2,
            marker="o", ms=4, label=f"Pareto frontier ({len(front)} plans)")
    budget = result["hbm_budget"] / 1e9
    ax.axvline(budget, color="black", ls="--", lw=1, label=f"HBM budget {budget:.4g} GB")
    form = plans[0]["form"] if plans else "scheduled"
    mems = [m for m, _ in pts if m > 0]
    wide = bool(mems) and max(mems) > 20 * min(mems)  # memory over decades: log axis
    ax.set(yscale="log", xscale="log" if wide else "linear", xlabel="memory per device (GB)",
           ylabel=f"predicted step ({form} form, s)")
    steps = [s for _, s in pts if s > 0]
    if steps:  # labelled round numbers over the whole range (matplotlib's log axis labels only the decades)
        from matplotlib.ticker import NullLocator

        lo, hi = min(steps) / 1.08, max(steps) * 1.08
        ax.set_ylim(lo, hi)
        ticks = log_ticks(lo, hi)
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(alpha=0.3)
    legend = ax.legend(fontsize=7, loc="upper right")
    items = []
    for rank, p in enumerate(plans[:labelled], 1):
        text = f"#{rank} {_mesh_text(p['mesh'])}" + (f" M={p['microbatches']}" if p["microbatches"] > 1 else "") + (
            f" R={p['repeats']}" if p["repeats"] > 1 else "")
        items.append((p["memory_bytes"] / 1e9, p["step_seconds"], text))
    place_labels(ax, items, [legend.get_window_extent(fig.canvas.get_renderer())])
    where = f"{result['chips']} {result['chip']} chips" + (f" ({result['slice']})" if result.get("slice") else "")
    ax.set_title(fit_title(fig, f"plan: {result['count']} meshes of {where}, {result['dtype']}, each with its best "
                           "schedule; step time against memory per device", 9, ax=ax), fontsize=9)
    return fig


def draw_serving_plan(plan):
    """plan --step decode --plot: every candidate (scaling.reports.serving.ServingPlan) as its time per output token
    (ms) against its tokens a second a chip, the frontier as a line labelled by mesh and batch, the latency target as a
    dashed line (the Scaling Book's latency-throughput frontier, applied-inference)."""
    fig, ax = _figure(8.0, 5.6, left=0.11, right=0.97, top=0.9, bottom=0.09)
    ax.scatter([r.tpot * 1e3 for r in plan.rows], [r.tokens_per_second_per_chip for r in plan.rows], s=14,
               color="tab:blue", alpha=0.5, label=f"{len(plan.rows)} meshes × batches")
    front = plan.frontier
    ax.plot([r.tpot * 1e3 for r in front], [r.tokens_per_second_per_chip for r in front], color="tab:red", marker="o",
            ms=4, lw=1.2, label=f"frontier ({len(front)})")
    if plan.latency is not None:
        ax.axvline(plan.latency * 1e3, color="black", ls="--", lw=1, label=f"target {plan.latency * 1e3:.3g} ms")
    ax.set(xscale="log", yscale="log", xlabel="time per output token (ms)", ylabel="tokens/s a chip")
    ax.grid(alpha=0.3)
    legend = ax.legend(fontsize=7, loc="lower right")
    items = [(r.tpot * 1e3, r.tokens_per_second_per_chip, f"{_mesh_text(r.mesh)} b={r.batch}") for r in front[:8]]
    place_labels(ax, items, [legend.get_window_extent(fig.canvas.get_renderer())])
    s = plan.serving
    ax.set_title(fit_title(fig, f"decode of {s.model} on {s.devices} {s.chip.name}: prompt {s.prompt}, output "
                           f"{s.output}, weights {s.weights}, KV {s.kv}", 9, ax=ax), fontsize=9)
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
