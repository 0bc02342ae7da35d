"""--plot FILE (issue 41): each command's picture read back from the figure's artists (bar heights, scatter offsets,
line data) against the command's own --json figures and hand calculations; the file a valid PNG or SVG, written
whole or not at all; a bad path or extension refused in one line, exit 2, before any work."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from jax_scaling import plots
from jax_scaling.cli import main

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"  # the PNG signature (PNG spec, 5.2)
# tiny-tf: D=64, 8 heads, F=256, 2 blocks, T=64 (scaling.families.presets); every command here runs in well under a
# second
PREDICT = ["--preset", "tiny-tf", "--chip", "H100", "--chips", "8", "--batch-tokens", "8192"]
STAGED = [*PREDICT, "--mesh", "stage=2,fsdp=4", "--microbatches", "4"]  # GPipe, S = 2, M = 4


def run(capsys, monkeypatch, *argv) -> tuple[dict, object]:
    """The command's --json object and the figure its --plot drew (plots.save caught on its way to the file)."""
    drawn = []
    real = plots.save

    def keep(fig, path):
        drawn.append(fig)
        real(fig, path)

    monkeypatch.setattr(plots, "save", keep)
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(drawn) == 1
    return out, drawn[0]


def status(argv) -> int:
    """main's exit status: returned, or argparse's SystemExit (a flag refused while parsing: exit 2 as well)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG


def is_svg(path: Path) -> bool:
    return ET.parse(path).getroot().tag == "{http://www.w3.org/2000/svg}svg"


def bars(ax) -> dict[str, tuple[float, float]]:
    """{label without its figure: (bottom, height)} of the axes' one-bar containers."""
    out = {}
    for c in ax.containers:
        (r,) = c.patches
        out[c.get_label().rsplit(" ", 2)[0]] = (r.get_y(), r.get_height())
    return out


def scatter(ax, label_start: str) -> np.ndarray:
    (c,) = [c for c in ax.collections if c.get_label().startswith(label_start)]
    return np.asarray(c.get_offsets())


def same_points(a, b, rel=1e-9) -> None:
    a, b = np.asarray(sorted(map(tuple, a))), np.asarray(sorted(map(tuple, b)))
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=rel)


def test_predict_plot_stacks_the_step_and_the_memory(capsys, monkeypatch, tmp_path):
    """The step bar: each kernel class's seconds less its bubble share, the bubble, each axis's exposed collectives,
    the loop copies, adding up to step_seconds; the memory bar: memory_terms in GB under the usable HBM line."""
    path = tmp_path / "step.png"
    out, fig = run(capsys, monkeypatch, "predict", *STAGED, "--plot", str(path))
    assert is_png(path)
    ax_t, ax_m = fig.axes
    got = bars(ax_t)
    # GPipe's idle share (S-1)/(M+S-1) = 1/5 with S = 2, M = 4 (Huang et al. 2019, GPipe, section 2.3): the bubble
    # iterations run the forward and backward kernels too
    idle = 1 / 5
    passes = sum(k["seconds"] for k in out["kernels"] if k["pass"] != "update")
    assert got["pipeline bubble"][1] == pytest.approx(idle * passes, rel=1e-9)
    for kind in {k["kind"] for k in out["kernels"]}:
        ks = [k for k in out["kernels"] if k["kind"] == kind]
        want = sum(k["seconds"] * (1 - idle if k["pass"] != "update" else 1) for k in ks)
        if want > 0:
            assert got[f"compute: {kind}"][1] == pytest.approx(want, rel=1e-9), kind
    for key, v in out["terms"].items():
        if key.startswith("exposed.") and v > 1e-9 * out["step_seconds"]:
            assert got[f"exposed collectives: {key[8:]}"][1] == pytest.approx(v, rel=1e-9)
    top = max(b + h for b, h in got.values())
    assert top == pytest.approx(out["step_seconds"], rel=1e-9)  # the whole bar is the scheduled step
    assert sum(h for _, h in got.values()) == pytest.approx(out["step_seconds"], rel=1e-9)
    mem = bars(ax_m)
    want = {k: v / 1e9 for k, v in out["memory_terms"].items() if k != "total" and v > 0}
    assert {k: h for k, (_, h) in mem.items()} == pytest.approx(want, rel=1e-12)
    assert max(b + h for b, h in mem.values()) == pytest.approx(out["memory_per_device_bytes"] / 1e9, rel=1e-9)
    (hbm,) = ax_m.lines
    assert set(hbm.get_ydata()) == {out["hbm_budget_bytes"] / 1e9}
    assert "H100" in fig._suptitle.get_text() and "stage=2,fsdp=4" in fig._suptitle.get_text()


def test_predict_plot_without_stages_has_no_bubble_and_svg(capsys, monkeypatch, tmp_path):
    """Without a stage axis no bubble is drawn and each class is its kernels' whole seconds; an .svg is SVG."""
    path = tmp_path / "step.SVG"
    out, fig = run(capsys, monkeypatch, "predict", *PREDICT, "--mesh", "data=2,fsdp=4", "--plot", str(path))
    assert is_svg(path)
    got = bars(fig.axes[0])
    assert "pipeline bubble" not in got
    by = {}
    for k in out["kernels"]:
        by[k["kind"]] = by.get(k["kind"], 0.0) + k["seconds"]
    assert {k: h for k, (_, h) in got.items() if k.startswith("compute: ")} == pytest.approx(
        {f"compute: {k}": v for k, v in by.items() if v > 0}, rel=1e-12)


def test_predict_text_unchanged_by_plot(capsys, tmp_path):
    """--plot draws the kernels but the text lists them only with --kernels: the same text as without --plot."""
    argv = ["predict", *PREDICT, "--mesh", "fsdp=8"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--plot", str(tmp_path / "a.png")]) == 0
    assert capsys.readouterr().out == plain


def test_kernels_plot_is_the_roofline(capsys, monkeypatch, tmp_path):
    """Each kernel with FLOPs at (FLOPs run / bytes, FLOPs run / seconds); the ridge at C/W_hbm; the kernel table's
    GEMMs at (2mnk / (2(mk+kn+mn)), 2mnk / seconds)."""
    path = tmp_path / "roof.png"
    # the package's flash on an H100: XLA:GPU runs every key block (executed 1; scaling.step.launches.xla_gpu_flash),
    # and the points count the FLOPs run (a kernel with executed < 1, splash's or cuDNN's, would sit at its share)
    out, fig = run(capsys, monkeypatch, "kernels", *PREDICT, "--seq-len", "2048", "--batch-tokens", "16384", "--mesh",
                   "fsdp=8", "--attention", "flash", "--plot", str(path))
    assert is_png(path)
    assert {k["executed"] for k in out["kernels"] if k["kind"] == "attention"} == {1.0}
    (ax,) = fig.axes
    for kind in ("matmul", "attention"):
        want = [(k["flops"] * k["executed"] / k["bytes"], k["flops"] * k["executed"] / k["seconds"])
                for k in out["kernels"] if k["kind"] == kind and k["flops"] > 0]
        same_points(scatter(ax, f"step's {kind} kernels"), want)
    # every kernel that runs FLOPs is drawn; the others are named in the title
    drawn = sum(len(c.get_offsets()) for c in ax.collections if c.get_label().startswith("step's"))
    assert drawn == sum(1 for k in out["kernels"] if k["flops"] > 0 and k["bytes"] > 0 and k["seconds"] > 0)
    left = {}
    for k in out["kernels"]:
        if not (k["flops"] > 0 and k["bytes"] > 0 and k["seconds"] > 0) and k["seconds"] > 0:
            left[k["name"]] = left.get(k["name"], 0.0) + k["seconds"]
    longest = max(left, key=left.get)  # named first in the title (its HBM time the largest of them)
    assert f"(no FLOPs): {sum(left.values()) * 1e3:.3g} ms of HBM time in {longest} (" in ax.get_title().replace(
        "\n", " ")
    # H100 SXM: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3 (NVIDIA H100 datasheet): ridge 989e12 / 3.35e12 = 295 FLOPs/B
    (ridge,) = [ln for ln in ax.lines if ln.get_label().startswith("ridge")]
    assert ridge.get_xdata()[0] == pytest.approx(989e12 / 3.35e12, rel=0.01)
    roof = [ln for ln in ax.lines if ln.get_label().startswith("roofline")][0]
    x, y = np.asarray(roof.get_xdata()), np.asarray(roof.get_ydata())
    assert y.max() == pytest.approx(989e12, rel=0.01)  # flat at the peak right of the ridge
    np.testing.assert_allclose(y[x < 200], x[x < 200] * 3.35e12, rtol=0.01)  # the bandwidth's slope left of it
    with open(ROOT / "scaling/data/kernels/H100.toml", "rb") as f:
        rows = tomllib.load(f)["gemm"]["bf16"]["rows"]
    want = [(2 * m * n * k / (2 * (m * k + k * n + m * n)), 2 * m * n * k / s) for m, n, k, s in rows]
    same_points(scatter(ax, "kernel table GEMMs"), want)


def test_plan_plot_draws_every_plan_and_the_frontier(capsys, monkeypatch, tmp_path):
    """Every plan at (memory per device GB, step seconds); the frontier the plans no other beats in both (checked by
    brute force); the HBM budget; the top five labelled by their mesh."""
    path = tmp_path / "plans.png"
    out, fig = run(capsys, monkeypatch, "plan", "--preset", "llama2-7b", "--chip", "H100", "--chips", "8",
                   "--global-batch", "32", "--top", "1000", "--plot", str(path))
    assert is_png(path)
    (ax,) = fig.axes
    plans = out["plans"]
    assert len(plans) == out["count"] > 5
    pts = [(p["memory_bytes"] / 1e9, p["step_seconds"]) for p in plans]
    same_points(scatter(ax, f"{len(plans)} plans"), pts)
    beaten = {i for i, (m, s) in enumerate(pts)
              if any(m2 <= m and s2 <= s and (m2, s2) != (m, s) for m2, s2 in pts)}
    front = sorted({pts[i] for i in range(len(pts)) if i not in beaten})
    (line,) = [ln for ln in ax.lines if ln.get_label().startswith("Pareto")]
    same_points(list(zip(line.get_xdata(), line.get_ydata())), front)
    (hbm,) = [ln for ln in ax.lines if ln.get_label().startswith("HBM")]
    assert set(hbm.get_xdata()) == {out["hbm_budget"] / 1e9} == {80.0}  # H100's usable HBM in the chip table
    labels = [t.get_text() for t in ax.texts]
    assert len(labels) == 5
    for rank, (p, text) in enumerate(zip(plans, labels), 1):
        mesh = ",".join(f"{a}={n}" for a, n in p["mesh"].items() if n > 1)
        assert text.startswith(f"#{rank} {mesh}")


def test_pareto_by_hand():
    """(1, 5), (2, 3), (3, 3), (4, 1), (2, 4): (3, 3) and (2, 4) are beaten by (2, 3)."""
    pts = [(1, 5), (2, 3), (3, 3), (4, 1), (2, 4)]
    assert [pts[i] for i in plots.pareto(pts)] == [(1, 5), (2, 3), (4, 1)]


def test_validate_plot_is_predicted_against_measured(capsys, monkeypatch, tmp_path):
    """Each group's runs at (measured, predicted), TPU and GPU apart; y = x; the band between 0.9x and 1.1x."""
    path = tmp_path / "validate.svg"
    out, fig = run(capsys, monkeypatch, "validate", "--plot", str(path))
    assert is_svg(path)
    (ax,) = fig.axes
    for group, name in (("tpu", "TPU:"), ("gpu", "GPU:"), ("bench", "GPU, this package's bench")):
        rows = [r for r in out["rows"] if r["group"] == group]
        assert rows
        same_points(scatter(ax, name), [(r["measured_seconds"], r["predicted_seconds"]) for r in rows])
    from matplotlib.collections import PathCollection

    drawn = sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))
    assert drawn == len(out["rows"])
    (diag,) = [ln for ln in ax.lines if ln.get_label() == "predicted = measured"]
    np.testing.assert_allclose(diag.get_ydata(), diag.get_xdata())
    (band,) = [c for c in ax.collections if c.get_label() == "±10%"]
    verts = np.concatenate([p.vertices for p in band.get_paths()])
    assert set(np.round(verts[:, 1] / verts[:, 0], 12)) == {0.9, 1.1}


@pytest.mark.parametrize("argv", [["predict", *PREDICT, "--mesh", "fsdp=8"], ["kernels", *PREDICT, "--mesh", "fsdp=8"],
                                  ["plan", "--preset", "tiny-tf", "--chips", "8"], ["validate"]])
@pytest.mark.parametrize("bad", ["missing/x.png", "a.jpg", "noextension", "afile/x.svg", "."])
def test_bad_plot_path_is_one_line_before_any_work(capsys, monkeypatch, tmp_path, argv, bad):
    """An unknown extension, a missing folder, a folder that is a file, a folder as the path: one error line, exit
    2, nothing created; refused while the flags are parsed (the command itself never starts)."""
    (tmp_path / "afile").write_text("")
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with monkeypatch.context() as m:
        m.setattr("jax_scaling.predict.predict_report", lambda *a, **k: pytest.fail("worked before refusing"))
        m.setattr("scaling.reports.validate.validate", lambda *a, **k: pytest.fail("worked before refusing"))
        m.setattr("scaling.planner.plan.plan", lambda *a, **k: pytest.fail("worked before refusing"))
        assert status([*argv, "--plot", bad]) == 2
    err = capsys.readouterr()
    assert err.out == ""
    lines = err.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--plot" in lines[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_unwritable_folder_refused(capsys, tmp_path):
    """A folder that takes no new file (mode 0o500; root writes anyway, so skipped as root)."""
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert status(["validate", "--plot", str(ro / "v.png")]) == 2
        assert "cannot write" in capsys.readouterr().err
    finally:
        ro.chmod(0o700)


def test_plot_refused_where_nothing_is_drawn(capsys, tmp_path):
    """kernels without --mesh (seed 002's report), validate --fit, kernels --gemm: one line, exit 2, no file."""
    for argv in (["kernels"], ["validate", "--fit"], ["kernels", "--gemm", "64x64x64", "--chip", "H100"]):
        assert status([*argv, "--plot", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "--plot" in err, argv
    assert list(tmp_path.iterdir()) == []


def test_file_written_whole_or_not_at_all(monkeypatch, tmp_path):
    """A drawing that fails half-way leaves the old file as it was and no temporary file beside it."""
    from matplotlib.figure import Figure

    path = tmp_path / "keep.png"
    path.write_bytes(b"old")

    def broken(self, f, **kw):
        f.write(b"half a picture")
        raise RuntimeError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(RuntimeError):
        plots.save(Figure(), str(path))
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.png"]
    monkeypatch.undo()
    plots.save(Figure(), str(path))
    assert is_png(path)
    assert path.stat().st_mode & 0o777 != 0o600  # the umask's mode, not mkstemp's private one


def test_no_matplotlib_without_plot():
    """A command without --plot never imports matplotlib (nor does importing the command line)."""
    code = ("import sys, io, contextlib; from jax_scaling.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({['predict', *PREDICT, '--mesh', 'fsdp=8']!r})\n"
            "print('matplotlib' in sys.modules)")
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "False"
