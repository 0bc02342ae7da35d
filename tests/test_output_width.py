"""What a person reads fits a terminal and a picture (issue 49, item 12): check, predict, plan, kernels and bench print
no line over 120 columns (tables fold or abbreviate their long cells, long notes go below the table); times read in
units (0.27 ns, 229.9 us, never 2.655e-10 s); the plots' titles take at most 2 lines inside the figure, their labels
do not overlap (matplotlib's text bounding boxes in the figure's renderer), and plan's log step axis labels round
numbers over the whole plotted range (where the best plans sit too)."""

from __future__ import annotations

import contextlib
import io
import itertools
import re

import pytest

from jax_scaling import plots
from jax_scaling.cli import main
from jax_scaling.model_reports import print_bench
from scaling.core.table import time_text

TERMINAL = 120  # columns
TIME = r"(<0\.01 ns|-?\d[\d.]* (s|ms|us|ns))"  # a time with its unit (scaling.core.table.time_text)


def run(argv: list[str]) -> str:
    """stdout of the console script's main in this process (exit 0 asserted)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    return out.getvalue()


def assert_fits(text: str) -> None:
    widest = max(text.splitlines(), key=len)
    assert len(widest) <= TERMINAL, (len(widest), widest)


def test_times_read_in_units():
    """By hand: 2.655e-10 s = 0.2655 ns, under 1 ns two significant digits: 0.27 ns; 2.2994e-4 s = 229.94 us: 229.9
    us; 4.766e-9 s: 4.766 ns; 1.2e-3 s: 1.2 ms; 13.75 s as it is; 3e-12 s = 0.003 ns: "<0.01 ns"."""
    assert time_text(2.655e-10) == "0.27 ns"
    assert time_text(2.2994e-4) == "229.9 us"
    assert time_text(4.766e-9) == "4.766 ns"
    assert time_text(1.2e-3) == "1.2 ms"
    assert time_text(13.75) == "13.75 s"
    assert time_text(0) == "0 s"
    assert time_text(3e-12) == "<0.01 ns"


PREDICT = [
    "predict --preset tiny --chip H100 --chips 8 --mesh fsdp=8 --batch-tokens 64 --kernels",
    "predict --preset tiny-tf --chip v5p --chips 8 --mesh fsdp=4,tensor=2 --batch-tokens 8192 --kernels",
    "predict --preset llama3.1-70b --slice v5p-1024 --mesh fsdp=512 --global-batch 1024 --kernels",
    "predict --preset llama2-7b --chip H100 --chips 64 --mesh data=8,fsdp=8 --global-batch 256 --kernels",
]


@pytest.mark.parametrize("argv", PREDICT)
def test_predict_fits_and_prints_times_in_units(argv):
    """Every line within 120 columns; each term's time with its unit (the tiny FFN's math term is 4.766e-9 s: 4.766
    ns, not "4.766e-09"); the kernels' times and the per-pass sums in units, no exponent."""
    out = run(argv.split())
    assert_fits(out)
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("term "))
    assert lines[head].split()[-1] == "time"
    end = next(i for i in range(head, len(lines)) if lines[i].startswith("step: "))
    for line in lines[head + 1:end]:
        assert re.search(rf"  {TIME}$", line), line
    assert re.match(r"step: \d[\d.]* (s|ms|us|ns) \(", lines[end]), lines[end]
    per_pass = next(line for line in lines if line.startswith("per pass: "))
    assert not re.search(r"\de[-+]\d", per_pass), per_pass
    ktable = lines[next(i for i, line in enumerate(lines) if line.startswith("kernel ")):]
    assert ktable[0].split()[-2:] == ["time", "bound"]
    for line in ktable[1:]:
        if line.startswith("per pass"):
            break
        assert re.search(rf"  {TIME}  \w+$", line), line


PLAN = [
    "plan --slice v5p-1024 --preset llama3.1-70b",  # the issue's: 183 columns before
    "plan --slice v5p-1024 --preset xxl --batch-tokens 1048576",
    "plan --preset mixtral-8x7b --capacity-factor 1.25 --slice v5p-128 --top 3",
    "plan --slice v5p-128 --preset xxl --batch-tokens 25600",  # the FFN stack: no remat column
    "plan --preset llama3.1-70b --chip H100 --chips 512",  # 64 nodes: the dcn column
]


@pytest.mark.parametrize("argv", PLAN)
def test_plan_fits(argv):
    """plan's table folds, within 120 columns, into two: the plan (mesh, choices; the step it is ranked by and its
    memory where they fit beside) and its other figures, each row keyed by the rank #."""
    out = run(argv.split())
    assert_fits(out)
    headers = [line for line in out.splitlines() if line.lstrip().startswith("# ")]
    assert len(headers) == 2 and "fsdp" in headers[0] and "M_X" not in headers[0] and "M_X" in headers[1], headers


KERNELS = [
    "kernels --preset llama2-7b --chip H100 --chips 8 --mesh fsdp=8 --global-batch 64",  # 143 columns before
    "kernels --gemm 8192x8192x8192 --chip H100",  # 348 before: its coefficients' source
    "kernels --gemm 2048x2048x2048 --chip A100-80GB",
    "kernels --seed 002",  # 159 before
]


@pytest.mark.parametrize("argv", KERNELS)
def test_kernels_fits(argv):
    assert_fits(run(argv.split()))


@pytest.mark.compiles
def test_check_fits():
    """The smallest check (the tiny FFN stack on 8 CPU devices): 262 columns before (the notes in the table, the chip
    figures, the times); each long note now starts in the table with a reference [k] and is printed whole below it;
    the times in units (T_math 10.28 ns: 2·(B/8)·(6·D·F·L)... is the closed form's; only the unit is checked)."""
    out = run("check --devices cpu:8 --mesh fsdp=8 --preset tiny --batch-tokens 64".split())
    assert_fits(out)
    lines = out.splitlines()
    matmul = next(line for line in lines if line.startswith("flops.matmul"))
    k = re.search(r"\.\.\. \[(\d+)\]$", matmul).group(1)
    assert any(line.startswith(f"[{k}] dot/convolution FLOPs") for line in lines)
    times = " ".join(lines[next(i for i, line in enumerate(lines) if line.startswith("times (chip")):])
    assert re.search(rf"T_math {TIME};", times) and not re.search(r"\de[-+]\d+ s", times), times


def test_bench_text_fits():
    """bench's text (print_bench) of a hand-made report: the chip figures (250 columns before) wrapped, times in
    units: the step 12.3 ms, a collective of 2.655e-10 s as 0.27 ns."""
    rep = {"model_text": "transformer D=4,096 N=32 K=8 H=128 F=14,336 L=32 T=8,192 swiglu V=128,256",
           "device_kind": "NVIDIA H100 80GB HBM3",
           "mesh": {"data": 2, "stage": 1, "fsdp": 4, "context": 1, "expert": 1, "tensor": 1}, "batch_tokens": 65536,
           "remat": "save_dot_except_mlpwi", "attention": "cudnn", "chip": "H100", "steps": 10, "warmup": 2,
           "step_seconds": 0.0123, "flops": {"executed": 3.1e15, "model": 2.9e15}, "tflops_per_s": 252.0,
           "tflops_per_s_per_device": 31.5, "mfu": 0.318, "hfu": 0.34,
           "predicted": {"step_max": 0.0101, "step_sum": 0.0113, "math": 0.0101, "hbm": 0.0004,
                         "comms": {"data": 2.655e-10, "fsdp": 0.0012}, "bound": "compute"}}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_bench(rep)
    out = buf.getvalue()
    assert_fits(out)
    assert "step time   12.3 ms" in out and "data 0.27 ns" in out and "e-10" not in out


# --- plots: read back from the figures the commands draw (plots.save caught on its way to the file) ---


def drawn(monkeypatch, tmp_path, *argv):
    """The figure ``argv`` --plot draws, drawn in an Agg canvas, and that canvas's renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figs.append(fig))
    run([*argv, "--plot", str(tmp_path / "p.png")])
    (fig,) = figs
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return fig, canvas.get_renderer()


def overlapping(boxes) -> list:
    return [(a, b) for a, b in itertools.combinations(boxes, 2)
            if min(a.x1, b.x1) > max(a.x0, b.x0) and min(a.y1, b.y1) > max(a.y0, b.y0)]


def assert_title(fig, renderer, title) -> None:
    """At most 2 lines, inside the figure."""
    assert title.get_text().count("\n") <= 1, title.get_text()
    box = title.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)


PLAN_PLOT = ["plan", "--slice", "v5p-1024", "--preset", "llama3.1-70b"]


def test_plan_plot_labels_apart_and_steps_ticked(monkeypatch, tmp_path):
    """The issue's plot: the five labels (the best plans, 13.3-13.8 s apart by 4%) overlap neither each other nor the
    legend (before: three printed over each other); the log step axis shows every plan and labels round numbers
    across it, one within 20% above the best plan's step and none more than 2.5x the one below (before: 20, 30, 40,
    50 s only, the best plans at 13.3 s below them all); the title 2 lines inside the figure."""
    fig, renderer = drawn(monkeypatch, tmp_path, *PLAN_PLOT)
    (ax,) = fig.axes
    texts = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(texts) == 5
    assert not overlapping([*texts, ax.get_legend().get_window_extent(renderer)])
    frame = ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in texts)
    steps = [s for _, s in next(c for c in ax.collections if c.get_label().endswith(" plans")).get_offsets()]
    lo, hi = ax.get_ylim()
    assert lo <= min(steps) and max(steps) <= hi
    ticks = sorted(t for m in (False, True) for t, label in zip(ax.get_yticks(minor=m), ax.get_yticklabels(minor=m))
                   if label.get_text() and lo <= t <= hi)
    assert len(ticks) >= 4, ticks
    assert ticks[0] <= 1.2 * min(steps), (ticks, min(steps))
    assert ticks[-1] >= max(steps) / 2.5 and all(b / a <= 2.5 for a, b in zip(ticks, ticks[1:])), ticks
    assert_title(fig, renderer, ax.title)


def test_log_ticks_by_hand():
    """12.3 to 60.1 s: the densest round-number set with at most 8 ticks is (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)·10^k:
    15, 20, 25, 30, 40, 50, 60 (7; 12 is below the range); 0.5 to 500 s: (1, 2, 5)·10^k gives 10 (0.5 ... 500), too
    many: the decades 1, 10, 100; 12.3 to 14.9 s holds none of those round numbers: steps of 0.5."""
    assert plots.log_ticks(12.3, 60.1) == [15, 20, 25, 30, 40, 50, 60]
    assert plots.log_ticks(0.5, 500) == [1, 10, 100]
    assert plots.log_ticks(12.3, 14.9) == [12.5, 13.0, 13.5, 14.0, 14.5]


def test_kernels_plot_labels_apart_and_title(monkeypatch, tmp_path):
    """The roofline's forward kernels labelled without overlap (before: mlp_in and logits printed over each other);
    its title 2 lines inside the figure (before: 4), still naming the kernels of no FLOPs."""
    fig, renderer = drawn(monkeypatch, tmp_path, "kernels", "--preset", "llama2-7b", "--chip", "H100", "--chips",
                          "8", "--mesh", "fsdp=8", "--global-batch", "64")
    (ax,) = fig.axes
    texts = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(texts) == 6  # the forward pass's qkv, attention, out, mlp_in, mlp_out, logits
    assert not overlapping([*texts, ax.get_legend().get_window_extent(renderer)])
    assert_title(fig, renderer, ax.title)
    assert "(no FLOPs): " in ax.get_title() and "ms of HBM time in " in ax.get_title()


@pytest.mark.parametrize("argv", [
    ["predict", "--preset", "mixtral-8x7b", "--slice", "v5p-128", "--mesh", "fsdp=8,expert=8", "--global-batch",
     "256", "--remat", "full"],
    ["predict", "--preset", "llama3.1-405b", "--chip", "H100", "--chips", "1024", "--mesh",
     "data=8,stage=8,fsdp=2,tensor=8", "--global-batch", "1024", "--microbatches", "16", "--schedule", "1f1b",
     "--remat", "full", "--sequence-parallel"],
    ["validate"],
], ids=["predict-moe", "predict-405b", "validate"])
def test_titles_take_two_lines(monkeypatch, tmp_path, argv):
    fig, renderer = drawn(monkeypatch, tmp_path, *argv)
    for title in [fig._suptitle, *(ax.title for ax in fig.axes)]:
        if title is not None and title.get_text():
            assert_title(fig, renderer, title)
