"""Predicted step time against published measured runs: every row of scaling/data/measured.toml (the runs of
../shared/reference/measured.md, each written as the fields of `jax-scaling predict` that describe it) predicted
as that command predicts (scaling.reports.predict: predict_setup, predict_report) and set beside its measured step.

A source that reports a rate, not a step, is converted with the FLOP count it states (CONVENTIONS): the measured
step is the FLOPs its convention counts per device divided by the rate it reports. Errors are predicted/measured
− 1; per group (tpu, gpu) the median and the largest |error|, over every row and over the rows held out (no
coefficient fitted on them: each TPU's matmul_efficiency is fitted on the one run its table row names,
fit_efficiency; a GPU fits nothing on a step, its GEMM coefficients come from its kernel table,
scaling.step.kernels.gemm_coefficients); per comparison (rows of one source table that vary one configuration of one
model) Spearman's rank correlation of predicted against measured steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tomllib
from importlib import resources

import numpy as np

from scaling.core.kinds import KernelModel
from scaling.hardware import chips as hardware
from scaling.families.transformer import TransformerConfig
from scaling.hardware.kernel_tables import KernelTable, load_kernel_table
from scaling.reports.predict import PredictReport, predict_report, predict_setup, with_kernel_table

_TABLE = "data/measured.toml"
# a row's keys that describe the measurement, not the configuration (the rest are predict_setup's fields)
RUN_KEYS = ("id", "table", "compare", "group", "source", "step_seconds", "tflops_per_device", "convention",
            "memory_gib", "assumption")


def maxtext_2023(cfg: TransformerConfig, batch_tokens: float, devices: int) -> float:
    """MaxText's 2023 tables (measured.md 1a, 1b), per device: 6·N·t + 12·N_h·L·H·T·t/2 (attention halved for
    causality), N the parameters, t = B/devices tokens."""
    t = batch_tokens / devices
    return 6 * cfg.params * t + 6 * cfg.heads * cfg.blocks * cfg.head_dim * cfg.seq_len * t


def maxtext_2024(cfg: TransformerConfig, batch_tokens: float, devices: int) -> float:
    """MaxText's calculate_tflops_training_per_device of 2024 (measured.md 1d), per device: 3·(L·(2·t·D·F·m +
    2·t·D·H·(N + 2K) + 2·t·N·H·D + 4·t·T·N·H) + 2·t·D·V): the layers' matmuls, attention counted whole
    (non-causal), the output layer; t = B/devices tokens."""
    t = batch_tokens / devices
    D, F, N, K, H, T = cfg.d_model, cfg.d_ff, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.seq_len
    layer = 2 * t * D * F * cfg.mlp_matrices + 2 * t * D * H * (N + 2 * K) + 2 * t * N * H * D + 4 * t * T * N * H
    return 3 * (cfg.blocks * layer + 2 * t * D * (cfg.vocab or 0))


def megatron_2021(cfg: TransformerConfig, batch_tokens: float, devices: int) -> float:
    """Narayanan et al. 2021, eq. 3 (measured.md 2), per device: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) over
    the GPUs, B sequences of s tokens; it counts the recompute forward of full activation recomputation."""
    s, layers, h, V = cfg.seq_len, cfg.blocks, cfg.d_model, cfg.vocab or 0
    B = batch_tokens / s
    return 96 * B * s * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h)) / devices


CONVENTIONS = {"maxtext-2023": maxtext_2023, "maxtext-2024": maxtext_2024, "megatron-2021": megatron_2021}


def measured_runs() -> list[dict]:
    """The rows of scaling/data/measured.toml."""
    with resources.files("scaling").joinpath(_TABLE).open("rb") as f:
        return tomllib.load(f)["run"]


def measured_step(run: dict, cfg: TransformerConfig, batch_tokens: float, devices: int) -> float:
    """The row's measured seconds per step: as reported, or its convention's FLOPs per device over its TFLOP/s."""
    if "step_seconds" in run:
        return float(run["step_seconds"])
    return CONVENTIONS[run["convention"]](cfg, batch_tokens, devices) / (run["tflops_per_device"] * 1e12)


def spearman(a, b) -> float:
    """Spearman's rank correlation: Pearson's of the ranks (ties given their mean rank)."""
    def ranks(x):
        x = np.asarray(x, float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # ties: their mean rank
            r[x == v] = r[x == v].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


@contextlib.contextmanager
def efficiency_of(chip_name: str, eta: float):
    """The hardware table with ``chip_name``'s matmul_efficiency (and that of the chips that borrow it) set to eta,
    inside the block."""
    saved = dict(hardware.CHIPS)
    for name, chip in saved.items():
        if name == chip_name or chip.efficiency_as == chip_name:
            hardware.CHIPS[name] = dataclasses.replace(chip, matmul_efficiency=eta)
    try:
        yield
    finally:
        hardware.CHIPS.clear()
        hardware.CHIPS.update(saved)


def fit_efficiency(chip_name: str, runs: list[dict] | None = None, tol: float = 1e-4,
                   kernel_model: str = "efficiency") -> float:
    """The chip's matmul_efficiency eta fitted on the one run its table row names (``fitted_on``): the eta at which
    that run's predicted step equals its measured step (bisection on [0.05, 1]: the predicted step falls as eta
    rises; ``kernel_model`` the matmul term it is fitted under). ValueError for a chip fitted on no run."""
    chip = hardware.get_chip(chip_name)
    if not chip.fitted_on:
        raise ValueError(f"{chip.name} is fitted on no measured run (fitted_on in scaling/data/chips.toml)")
    run = next(r for r in (measured_runs() if runs is None else runs) if r["id"] == chip.fitted_on)
    lo, hi = 0.05, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        with efficiency_of(chip.name, mid):
            err = validate([run], kernel_model)["rows"][0]["error"]
        lo, hi = (lo, mid) if err < 0 else (mid, hi)
    return round((lo + hi) / 2, 3)


def refitted(kernel_model: str) -> dict:
    """validate under ``kernel_model`` with each fitted chip's matmul_efficiency refitted under it on its own named
    run (fit_efficiency; chips the model cannot predict keep theirs), and the etas: {"validation", "eta"}."""
    eta = {}
    for name, chip in hardware.CHIPS.items():
        if chip.fitted_on and (chip.onchip or kernel_model == KernelModel.EFFICIENCY):
            eta[name] = fit_efficiency(name, kernel_model=kernel_model)
    with contextlib.ExitStack() as stack:
        for name, e in eta.items():
            stack.enter_context(efficiency_of(name, e))
        return {"validation": validate(kernel_model=kernel_model), "eta": eta}


def _row(run: dict, r: PredictReport) -> dict:
    """One run's row of validate: its prediction beside its measured step (and peak memory, where it has one)."""
    w = r.workload
    # a rate's FLOP convention counts a transformer's; a measured step needs no model
    measured = measured_step(run, None if "step_seconds" in run else w.model, w.batch_tokens, r.devices)
    compare = run["compare"] if isinstance(run["compare"], list) else [run["compare"]]
    mem = run.get("memory_gib")  # a measured peak per device (GiB), where the source gives one
    return {"id": run["id"], "table": run["table"], "compare": compare, "group": run["group"],
            "measured_memory_bytes": None if mem is None else mem * 2**30,
            "memory_error": None if mem is None else r.memory_per_device / (mem * 2**30) - 1,
            "measured_seconds": measured, "predicted_seconds": r.step_seconds,
            "error": r.step_seconds / measured - 1, "mfu": r.mfu, "fits": r.fits,
            "memory_per_device_bytes": r.memory_per_device, "bound": r.bound,
            "assumption": run.get("assumption", ""), "chip": r.chip.name,
            "fitted": next((c.name for c in hardware.CHIPS.values() if c.fitted_on == run["id"]), "")}


def validate(runs: list[dict] | None = None, kernel_model: str = "efficiency", kernel_table=None) -> dict:
    """Predict every run from its fields as the predict command does (scaling.reports.predict); {"rows": [...],
    "groups": {group: {median, max, n}}, "comparisons": {compare: spearman}, "fastest": {compare: how much slower
    the predicted-fastest row measured than the measured-fastest, measured/measured − 1}, "memory": {median, max,
    n}} (memory: the predicted memory per device against the measured peak of the runs that report one). Each row:
    id, table, group, measured and predicted seconds, error, the predicted MFU and memory per device (and its error
    against a measured peak), whether a coefficient was fitted on it (``fitted``: the chip whose matmul_efficiency
    it sets), and its assumption where the source leaves something out. ``kernel_model``
    (scaling.step.kernels.KERNEL_MODELS) is predict's matmul term; "hierarchical" predicts the rows whose chip has
    an on-chip memory size in the hardware table, the others are left out. ``kernel_table`` (a KernelTable or its
    path: --kernel-table) replaces the shipped kernel table of the rows on its chip
    (scaling.reports.predict.with_kernel_table)."""
    if kernel_table is not None and not isinstance(kernel_table, KernelTable):
        kernel_table = load_kernel_table(kernel_table)
    rows = []
    for run in measured_runs() if runs is None else runs:
        setup = predict_setup(**{k: v for k, v in run.items() if k not in RUN_KEYS}, kernel_model=kernel_model)
        if kernel_model == KernelModel.HIERARCHICAL and not setup.chip.onchip:
            continue
        if kernel_table is not None and setup.chip.name == hardware.get_chip(kernel_table.chip).name:
            setup = dataclasses.replace(setup, chip=with_kernel_table(setup.chip, kernel_table))
        rows.append(_row(run, predict_report(setup)))
    groups = {}
    for g in sorted({r["group"] for r in rows}):
        err = np.abs([r["error"] for r in rows if r["group"] == g])
        held = np.abs([r["error"] for r in rows if r["group"] == g and not r["fitted"]])
        groups[g] = {"median_abs_error": float(np.median(err)), "max_abs_error": float(err.max()), "n": len(err),
                     "held_out_median_abs_error": float(np.median(held)) if len(held) else float("nan"),
                     "held_out_max_abs_error": float(held.max()) if len(held) else float("nan"), "held_out": len(held)}
    mem = np.abs([r["memory_error"] for r in rows if r["memory_error"] is not None])
    memory = {"median_abs_error": float(np.median(mem)), "max_abs_error": float(mem.max()), "n": len(mem)} if len(
        mem) else {}
    comparisons, fastest = {}, {}
    for c in sorted({c for r in rows for c in r["compare"]}):
        sel = [r for r in rows if c in r["compare"]]
        if len(sel) >= 3:
            comparisons[c] = spearman([r["predicted_seconds"] for r in sel], [r["measured_seconds"] for r in sel])
            picked = min(sel, key=lambda r: r["predicted_seconds"])  # the configuration a search would pick
            fastest[c] = picked["measured_seconds"] / min(r["measured_seconds"] for r in sel) - 1
    return {"rows": rows, "groups": groups, "comparisons": comparisons, "fastest": fastest, "memory": memory}
