"""Predicted step time against published measured runs: every row of scaling/data/measured.toml (the runs of
../shared/reference/measured.md, each written as the `jax-scaling predict` flags that describe it) predicted by
that command (scaling.cli.predict_result) and set beside its measured step.

A source that reports a rate, not a step, is converted with the FLOP count it states (CONVENTIONS): the measured
step is the FLOPs its convention counts per device divided by the rate it reports. Errors are predicted/measured
− 1; per group (tpu, gpu) the median and the largest |error|; per comparison (rows of one source table that vary
one configuration of one model) Spearman's rank correlation of predicted against measured steps.
"""

from __future__ import annotations

import argparse
import shlex
import tomllib
from importlib import resources

import numpy as np

from scaling.config import TransformerConfig

_TABLE = "data/measured.toml"


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
    """Narayanan et al. 2021, eq. 3 (measured.md 2), per device: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) over the
    GPUs, B sequences of s tokens; it counts the recompute forward of full activation recomputation."""
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


def validate(runs: list[dict] | None = None) -> dict:
    """Predict every run with the predict command's flags; {"rows": [...], "groups": {group: {median, max, n}},
    "comparisons": {compare: spearman}}. Each row: id, table, group, measured and predicted seconds, error, the
    predicted MFU and memory per device, and its assumption where the source leaves something out."""
    from scaling.cli import add_predict_parser, predict_result

    parser = argparse.ArgumentParser(prog="validate")
    add_predict_parser(parser.add_subparsers())
    rows = []
    for run in measured_runs() if runs is None else runs:
        args = parser.parse_args(["predict", *shlex.split(run["args"])])
        out, _ = predict_result(args)
        cfg = TransformerConfig(**out["model"])
        measured = measured_step(run, cfg, out["batch_tokens"], out["devices"])
        rows.append({"id": run["id"], "table": run["table"], "compare": run["compare"], "group": run["group"],
                     "measured_seconds": measured, "predicted_seconds": out["step_seconds"],
                     "error": out["step_seconds"] / measured - 1, "mfu": out["mfu"], "fits": out["fits"],
                     "memory_per_device_bytes": out["memory_per_device_bytes"], "bound": out["bound"],
                     "assumption": run.get("assumption", "")})
    groups = {}
    for g in sorted({r["group"] for r in rows}):
        err = np.abs([r["error"] for r in rows if r["group"] == g])
        groups[g] = {"median_abs_error": float(np.median(err)), "max_abs_error": float(err.max()), "n": len(err)}
    comparisons = {}
    for c in sorted({r["compare"] for r in rows}):
        sel = [r for r in rows if r["compare"] == c]
        if len(sel) >= 3:
            comparisons[c] = spearman([r["predicted_seconds"] for r in sel], [r["measured_seconds"] for r in sel])
    return {"rows": rows, "groups": groups, "comparisons": comparisons}
