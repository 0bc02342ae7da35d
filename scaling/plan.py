"""Mesh planner: every (data, fsdp, tensor) factorisation of a chip count, every way of laying its
axes onto the slice's physical ICI axes, ranked by predicted step time under an HBM budget.

A layout splits each physical dimension d_i of the slice into factors (a_i, b_i, c_i) for the
(data, fsdp, tensor) mesh axes. A mesh axis spans the physical axes where its factor is > 1 (that is
its M: M_X for fsdp, M_Y for tensor); on each it gets W_ici of bandwidth when it owns the whole
dimension and that dimension has wraparound (v5p: a multiple of 4 in a slice of whole cubes),
W_ici/2 otherwise (a line, not a ring: sharding page).

Per step and device (scaling.program's collectives, training page rooflines):
  T_math = FLOPs/(N·C),  FLOPs = 6·P·B − 2·B·D·F (+ remat recompute)
  T_fsdp = 3·L·4·D·F/Y / bw_fsdp        (forward and backward gathers, gradient reduce-scatter)
  T_tp   = 2·L·2·(2·B·D/(d·X)) / bw_tp  (two all-reduces per block, AR = 2·AG)
  T_dp   = L·2·(4·D·F/(X·Y)) / bw_data  (gradient all-reduce of the fsdp shard)
  T_hbm  = [28·P/N (AdamW: read master, grad, mu, nu; write master, mu, nu)
            + 3·L·4·D·F/Y (bf16 weights read by forward, dX, dW) + 2·activations] / HBM_BW
  step   = T_math + T_fsdp + T_tp + T_dp ("sum" form, the default: the compiled XXL forward step runs
           its collectives synchronously, README "Finding for question (c)") or
           max(T_math, T_fsdp, T_tp, T_dp, T_hbm) (overlapped; "max" form). Both are rooflines: the
           step times are lower bounds and the utilisations upper bounds.
  MFU    = model FLOPs / (N·C·step), model FLOPs = 6·P·B − 2·B·D·F (the matmuls the step needs);
  HFU    = executed FLOPs / (N·C·step), executed = model + the remat recompute (T_math counts these).
Memory: scaling.memory.memory_per_device (closed-form peak); plans over the HBM budget are dropped.
Critical batch: scaling.roofline.critical_batch for the layout's X, Y, M_X, M_Y, times the data size.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from scaling import memory, roofline
from scaling.config import DEFAULT_PRECISION, FFNConfig, check_remat, positive_float, positive_int
from scaling.hardware import Chip, v5p_topology

AXES = ("data", "fsdp", "tensor")


def _splits(d: int):
    """All ordered (a, b, c) with a·b·c = d."""
    for a in range(1, d + 1):
        if d % a:
            continue
        for b in range(1, d // a + 1):
            if (d // a) % b == 0:
                yield a, b, d // (a * b)


def layouts(dims: tuple[int, ...], chip: Chip, cube_slice: bool) -> list[dict]:
    """Every way of splitting the physical dims over (data, fsdp, tensor).

    Each layout: mesh sizes, per mesh axis the spanned physical lengths, M (count) and bandwidth
    factor Σ(1 if whole wrapped dim else 1/2)."""
    out = []
    for combo in itertools.product(*[list(_splits(d)) for d in dims]):
        sizes = [math.prod(c[k] for c in combo) for k in range(3)]
        axes = {}
        for k, name in enumerate(AXES):
            spans, bw, wraps = [], 0.0, []
            for i, c in enumerate(combo):
                if c[k] > 1:
                    wrap = cube_slice and c[k] == dims[i] and chip.has_wraparound(dims[i])
                    spans.append(c[k])
                    wraps.append(wrap)
                    bw += 1.0 if wrap else 0.5
            axes[name] = {"lens": spans, "wrap": wraps, "M": len(spans), "bw": bw}
        out.append({"mesh": dict(zip(AXES, sizes)), "axes": axes, "split": combo})
    return out


def plan(
    cfg: FFNConfig,
    chip: Chip,
    chips: int,
    batch_tokens,
    hbm: float | None = None,
    remat: str = "none",
    form: str = "sum",
    dims: tuple[int, int, int] | None = None,
) -> list[dict]:
    """Ranked plans (best first) for one or more batch sizes; see the module docstring for the model.

    ``batch_tokens`` is an int or a list of ints; each plan dict carries its batch. Plans whose
    dims do not divide (D by fsdp, F by tensor) or that exceed ``hbm`` are dropped; ``batch_divides``
    says whether B splits evenly over data·fsdp (the closed forms take fractional tokens per device).
    """
    positive_int("chips", chips)
    check_remat(remat)
    if form not in ("max", "sum"):
        raise ValueError(f"form must be 'max' or 'sum', got {form!r}")
    hbm = positive_float("hbm", chip.hbm_budget if hbm is None else hbm)
    batches = [batch_tokens] if isinstance(batch_tokens, int) else list(batch_tokens)
    for b in batches:
        positive_int("batch_tokens", b)
    if dims is None:
        if chip.kind != "tpu" or chip.ici_axes != 3:
            dims = (chips,) + (1,) * 2  # GPUs / 2D tori: treat as one ring
        else:
            dims = v5p_topology(chips)
    if math.prod(dims) != chips:
        raise ValueError(f"topology {dims} has {math.prod(dims)} chips, not {chips}")
    cube_slice = all(d % 4 == 0 for d in dims)
    lay = [l for l in layouts(dims, chip, cube_slice)
           if cfg.d_model % l["mesh"]["fsdp"] == 0 and cfg.d_ff % l["mesh"]["tensor"] == 0]
    if not lay:
        return []
    D, F, L, P = cfg.d_model, cfg.d_ff, cfg.blocks, cfg.params
    W, C = chip.ici_bidi, chip.bf16_flops
    d = np.array([l["mesh"]["data"] for l in lay], float)
    X = np.array([l["mesh"]["fsdp"] for l in lay], float)
    Y = np.array([l["mesh"]["tensor"] for l in lay], float)
    bw = {a: np.array([l["axes"][a]["bw"] for l in lay]) * W for a in AXES}
    N = float(chips)
    c = DEFAULT_PRECISION.compute
    # memory terms that do not depend on the batch (scaling.memory.memory_per_device, vectorised)
    state = DEFAULT_PRECISION.state_bytes_per_param * P / (X * Y)
    transient = c * 2 * (2 * D * F / Y)
    n_full, n_input = memory.saved_blocks(L, remat)
    results = []
    for B in batches:
        b_loc = B / (d * X)
        acts = c * b_loc * (n_full * (D + F / Y) + n_input * D)
        inputs = (c + 4) * D * b_loc
        mem = state + acts + transient + inputs
        model_flops = 6 * P * B - 2 * B * D * F
        flops = model_flops + 2 * B * D * F * n_input  # executed: + h = x·W_in again for remat blocks
        t_math = np.full_like(X, flops / N / C)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_fsdp = np.where(X > 1, 3 * L * 2 * c * D * F / Y / bw["fsdp"], 0.0)
            t_tp = np.where(Y > 1, 2 * L * 2 * (c * b_loc * D) / bw["tensor"], 0.0)
            t_dp = np.where(d > 1, L * 2 * (2 * c * D * F / (X * Y)) / bw["data"], 0.0)
        t_hbm = (28 * P / N + 3 * L * 2 * c * D * F / Y + 2 * acts) / chip.hbm_bw
        terms = np.stack([t_math, t_fsdp, t_tp, t_dp, t_hbm])
        steps = {"max": terms.max(axis=0), "sum": t_math + t_fsdp + t_tp + t_dp}
        step = steps[form]
        bound_names = np.array(["compute", "ICI fsdp", "ICI tensor", "ICI data", "HBM"])
        bound = bound_names[terms.argmax(axis=0)]
        keep = np.nonzero(mem <= hbm)[0]
        seen = set()
        for i in keep[np.lexsort((mem[keep], np.round(step[keep], 12)))]:  # fastest, then smallest
            l = lay[i]
            key = tuple(l["mesh"].values())
            if key in seen:  # keep each mesh's best layout only
                continue
            seen.add(key)
            mx, my = max(l["axes"]["fsdp"]["M"], 1), max(l["axes"]["tensor"]["M"], 1)
            crit = roofline.critical_batch(F, int(X[i]), int(Y[i]), chip.alpha, mx, my, form)
            results.append({
                "batch_tokens": B,
                "mesh": l["mesh"],
                "layout": {a: {"lens": l["axes"][a]["lens"], "wrap": l["axes"][a]["wrap"]} for a in AXES},
                "M_X": l["axes"]["fsdp"]["M"],
                "M_Y": l["axes"]["tensor"]["M"],
                "form": form,
                "step_seconds": float(step[i]),
                "step_seconds_sum": float(steps["sum"][i]),
                "step_seconds_max": float(steps["max"][i]),
                "mfu": float(model_flops / (N * C * step[i])),
                "mfu_sum": float(model_flops / (N * C * steps["sum"][i])),
                "mfu_max": float(model_flops / (N * C * steps["max"][i])),
                "hfu": float(flops / (N * C * step[i])),
                "hbm_budget": hbm,
                "batch_divides": bool(B % (d[i] * X[i]) == 0),
                "bound": str(bound[i]),
                "times": {"math": float(t_math[i]), "fsdp": float(t_fsdp[i]), "tensor": float(t_tp[i]),
                          "data": float(t_dp[i]), "hbm": float(t_hbm[i])},
                "memory_bytes": float(mem[i]),
                "per_device_batch": B / N,
                "critical_batch": None if crit is None else crit * d[i],
            })
    return results
