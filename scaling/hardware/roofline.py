"""Rooflines of the parallelism strategies: T_math against T_comms per block, critical batch, X_opt.

Source: Scaling Book, training page ("How to Parallelize a Transformer for Training",
jax-ml.github.io/scaling-book/training/), per block of two D×F matmuls in bf16:
  DP (backward):  T_math = 8·B·D·F/(N·C),  T_comms = 8·D·F/(M·W_ici)      bound: B/N > alpha/M
  FSDP (forward): T_math = 4·B·D·F/(X·C),  T_comms = 4·D·F/(M_X·W_ici)    bound: B/X > alpha/M_X
  TP (forward):   T_math = 4·B·D·F/(Y·C),  T_comms = 4·B·D/(M_Y·W_ici)    bound: Y < M_Y·F/alpha
  FSDP+TP:        T_FSDP = 4·D·F/(Y·M_X·W_ici),  T_TP = 4·B·D/(X·M_Y·W_ici),  T_math = 4·B·D·F/(N·C)
Two conventions for FSDP+TP (questions-4d.md, "Known ambiguities"):
  "sum" (spring-2025 text, the two communications add):  T_FSDP + T_TP < T_math
        <=> F/(Y·M_X) + B/(X·M_Y) < B·F/(N·alpha)
  "max" (August-2025 text, they overlap):                 max(T_FSDP, T_TP) < T_math
        <=> F/(Y·M_X) < B·F/(N·alpha)  and  B/(X·M_Y) < B·F/(N·alpha)
  X_opt = sqrt((B/F)·(M_X/M_Y)·N); at X_opt the sum form needs B/N > 4·alpha²/(M_X·M_Y·F), the max
  form B/N > alpha²/(M_X·M_Y·F).
``weight_bytes`` (2 for bf16) scales the FSDP term: int8 weight gathers (1 byte) halve it.
"""

from __future__ import annotations

import math

import numpy as np

from scaling.core.inputs import positive_float, positive_int
from scaling.core.kinds import Form

FORMS = ("sum", "max")


def alpha(C: float, w_ici: float) -> float:
    """alpha = C / W_ici (FLOPs per byte of ICI); v5p: 4.59e14/1.8e11 = 2550 (training page)."""
    return positive_float("C", C) / positive_float("w_ici", w_ici)


def _check_form(form: str) -> str:
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    return form


def dp_times(B: float, D: int, F: int, N: int, C: float, w_ici: float, M: int = 1) -> dict[str, float]:
    """Data parallel, backward pass of one block: T_math = 8BDF/(NC), T_comms = 8DF/(M·W_ici)
    (an AllReduce of 2·D·F bf16 gradients = 2 × AllGather of 4·D·F bytes)."""
    return {"math": 8 * B * D * F / (N * C), "comms": 8 * D * F / (M * w_ici)}


# each a figure of the roofline (its docstring), as the callers hold them
def mixed_times(
    B: float, D: int, F: int, X: int, Y: int, C: float, w_ici: float, M_X: int = 1, M_Y: int = 1,
    weight_bytes: float = 2,
) -> dict[str, float]:
    """FSDP+TP, forward pass of one block (N = X·Y):
    T_math = 4BDF/(NC), T_FSDP = 2·c_w·DF/(Y·M_X·W_ici), T_TP = 4BD/(X·M_Y·W_ici);
    comms_sum = T_FSDP + T_TP, comms_max = max(T_FSDP, T_TP). An axis of size 1 moves nothing:
    T_FSDP = 0 at X = 1, T_TP = 0 at Y = 1."""
    X, Y = np.asarray(X), np.asarray(Y)
    t = {
        "math": 4 * B * D * F / (X * Y * C),
        "fsdp": np.where(X > 1, 2 * weight_bytes * D * F / (Y * M_X * w_ici), 0.0),
        "tp": np.where(Y > 1, 4 * B * D / (X * M_Y * w_ici), 0.0),
    }
    t["comms_sum"] = t["fsdp"] + t["tp"]
    t["comms_max"] = np.maximum(t["fsdp"], t["tp"])  # works on scalars and arrays
    return t


def critical_batch(
    F: int, X: int, Y: int, alpha_: float, M_X: int = 1, M_Y: int = 1, form: str = "sum", weight_bytes: float = 2
) -> float | None:
    """Smallest overall batch B (tokens) at which FSDP+TP is compute bound; None if no B is.

    sum: F'/(Y·M_X) + B/(X·M_Y) < B·F/(N·alpha)  =>  B > [F'/(Y·M_X)] / [F/(N·alpha) − 1/(X·M_Y)]
    max: B > F'/(Y·M_X) · N·alpha/F = X·alpha·(c_w/2)/M_X, and the TP condition F/(N·alpha) > 1/(X·M_Y)
    with F' = F·c_w/2 (the FSDP bytes relative to bf16). The TP term grows with B as fast as the
    math when F/(N·alpha) <= 1/(X·M_Y) (i.e. Y >= M_Y·F/alpha): then no batch is compute bound.
    An axis of size 1 moves nothing: no FSDP term at X = 1 (then any batch is compute bound, B = 0,
    when the TP condition holds), no TP term at Y = 1 (pure FSDP: B > X·alpha/M_X).
    """
    _check_form(form)
    for name, v in (("F", F), ("X", X), ("Y", Y), ("M_X", M_X), ("M_Y", M_Y)):
        positive_int(name, v)
    positive_float("alpha", alpha_)
    b = critical_batch_array(F, X, Y, alpha_, M_X, M_Y, form, weight_bytes)
    return None if math.isnan(b) else b


def critical_batch_array(F: int, X, Y, alpha_: float, M_X=1, M_Y=1, form: str = "sum", weight_bytes: float = 2):
    """critical_batch on numpy arrays of X, Y, M_X, M_Y (the planner's meshes and layouts at once), NaN
    where no batch is compute bound; the same formula, term by term."""
    _check_form(form)
    X, Y, M_X, M_Y = (np.asarray(v, dtype=float) for v in (X, Y, M_X, M_Y))
    N = X * Y
    with np.errstate(divide="ignore", invalid="ignore"):
        fsdp_term = np.where(X > 1, F * (weight_bytes / 2) / (Y * M_X), 0.0)
        per_token_math = F / (N * alpha_)
        per_token_tp = np.where(Y > 1, 1 / (X * M_Y), 0.0)
        b = fsdp_term / (per_token_math - per_token_tp) if form == Form.SUM else fsdp_term / per_token_math
    out = np.where(per_token_math > per_token_tp, b, np.nan)
    return out.item() if out.ndim == 0 else out


def x_opt(B: float, F: int, N: int, M_X: int = 1, M_Y: int = 1) -> float:
    """X_opt = sqrt((B/F)·(M_X/M_Y)·N), the FSDP size minimising T_FSDP + T_TP at fixed N
    (training page; book example N=64, B=48k, F=32768, M_X/M_Y=2 gives ~13.9)."""
    return math.sqrt(B / F * (M_X / M_Y) * N)


def xopt_threshold_per_device(alpha_: float, F: int, M_X: int = 1, M_Y: int = 1, form: str = "sum") -> float:
    """Per-device batch B/N above which FSDP+TP at X = X_opt is compute bound:
    sum 4·alpha²/(M_X·M_Y·F) (spring-2025 text; ~400 for alpha=2550, F=32768, M_X·M_Y=2);
    max alpha²/(M_X·M_Y·F) (August-2025 text)."""
    _check_form(form)
    k = 4 if form == Form.SUM else 1
    return k * alpha_**2 / (M_X * M_Y * F)
