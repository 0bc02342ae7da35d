"""Seed 000's Ulysses layer compiled: ``python -m scaling trace --seed 000 --verify``.

The trace (scaling.seeds.seed000) is a PyTorch forward of one Ulysses attention layer of the XXL's dimensions
(d 16384, 128 heads, 60,000 tokens) on 16 GPUs. Here the same layer of the package's transformer
(scaling.families.presets preset seed000, one layer: attention and its MLP, FP32 master weights) is compiled ahead
of time for a 16-chip v5p slice, context=16 (Ulysses: 8 heads per device over the whole sequence), the
forward step on one 60,000-token sequence, with materialized scores (as the seed) and with flash
attention, and its compiled peak set beside the seed's 61.02 GB and the closed form
(scaling.families.transformer.memory_per_device). A program the compiler refuses (its HBM need above the chip's)
is reported with the compiler's own figure.
"""

from __future__ import annotations

import sys

from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import get_preset
from scaling.core.schedule import Schedule
from scaling.core.workload import Workload
from scaling.hardware.chips import CHIPS, DEFAULT_CHIP
from scaling.step.program import predict
from verify.check import check
from verify.hlo import refused_bytes

SEED_PEAK_GB = 61.02  # the trace's "Peak memory allocation" of the Ulysses layer
DEVICES = f"tpu:{DEFAULT_CHIP}:2x2x4"  # 16 chips (v5p-32)
MESH = "context=16"
# flash key blocks must divide the 60,000 keys: 480 (125 blocks) is the largest multiple of 8·60 below 512
# label: (tokens, schedule). The materialized layer at half the sequence too: it compiles, so its peak
# shows what the closed form leaves out where the full one is refused.
SCHEDULES = {"materialized": (60000, Schedule(attention="materialized")),
             "flash": (60000, Schedule(attention="flash", attention_block=480)),
             "materialized, T=30000": (30000, Schedule(attention="materialized"))}


def compile_seed000_layer(verbose: bool = False, flags=None) -> dict:
    """{attention form: {"closed_form": bytes, "terms": {...}, "compiled": bytes | None, "error": str}} for
    seed 000's Ulysses layer on DEVICES (module docstring). The closed form is scaling.step.program.predict's
    forward memory (master weights + the batch + the attention working set: FP32 scores of 8 heads, or of
    one 480-key block)."""
    out = {}
    for form, (tokens, schedule) in SCHEDULES.items():
        cfg = get_preset("seed000").replace(blocks=1, seq_len=tokens)
        workload = Workload(cfg, parse_mesh_spec(MESH), cfg.seq_len, "forward", schedule=schedule, flags=flags)
        print(f"compiling seed 000's Ulysses layer ({form} attention) for {DEVICES}, {MESH} ...", file=sys.stderr,
              flush=True)
        try:
            rep = check(workload, DEVICES, verbose=verbose)
            peak = rep.memory.peak
            out[form] = {"closed_form": peak.closed_form, "compiled": peak.compiled, "ratio": peak.ratio,
                         "context_bytes": rep.collectives.by_axis["context"].to_json()}
        except Exception as e:  # the compiler's refusal is the figure: RESOURCE_EXHAUSTED names what it needs
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "RESOURCE_EXHAUSTED" not in msg:
                raise
            out[form] = {"error": msg, "compiled": None, "refused_bytes": refused_bytes(e)}
        out[form]["terms"] = predict(workload, CHIPS[DEFAULT_CHIP]).memory
        out[form]["closed_form"] = out[form]["terms"]["total"]
    return out


def render_compiled(res: dict) -> str:
    """The compiled layer beside the seed's 61.02 GB and the closed form, per attention form."""
    hbm = CHIPS[DEFAULT_CHIP].hbm_budget
    lines = [f"Seed 000's Ulysses layer compiled: one layer of preset seed000 (attention + MLP, FP32 master weights), "
             f"forward, one 60,000-token sequence (30,000 where marked), {MESH} on {DEVICES} "
             f"(16 v5p chips, {hbm / 1e9:.4g} GB usable HBM each).",
             f"  {'attention':<22} {'closed form GB':>14} {'compiled GB':>12} {'ratio':>7} {'seed GB':>8}  "
             "terms of the closed form (GB)"]
    for form, r in res.items():
        terms = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in r["terms"].items() if k != "total" and v)
        got = "-" if r["compiled"] is None else f"{r['compiled'] / 1e9:.2f}"
        ratio = "-" if r["compiled"] is None else f"{r['ratio']:.4f}"
        lines.append(f"  {form:<22} {r['closed_form'] / 1e9:>14.2f} {got:>12} {ratio:>7} {SEED_PEAK_GB:>8.2f}  {terms}")
        if r["compiled"] is None:
            need = r.get("refused_bytes")
            lines.append(f"  {'':<22} the compiler refuses it: {r['error']}"
                         + (f": {need / 2**30:.2f} GiB = {need / 1e9:.2f} GB, {need / r['closed_form']:.4f} x "
                            "the closed form (the figure is the program's whole need, arguments included, though the "
                            "message says temporaries: verify.hlo.refused_bytes)"
                            if need else ""))
    lines.append("  Against the seed's 61.02 GB: the seed's A = q_·k_^T is BF16 and never softmaxed "
                 "(57.60 GB for 8 heads x 60,000^2); this program's scores are FP32 for the softmax "
                 "(115.20 GB, twice the seed's A), so the "
                 "materialized layer does not fit a v5p; flash attention holds one 480-key block's FP32 scores "
                 "(0.92 GB) instead. The seed's weights are the attention's BF16 Q, K, V, O (2.15 GB); "
                 "this layer holds FP32 masters of the attention and its MLP (11.27 GB), "
                 "their BF16 casts fused into the matmuls. "
                 "At 30,000 tokens the materialized layer compiles and its peak follows the closed form.")
    return "\n".join(lines)


def compile_model_layer(cfg, context: int, verbose: bool = False, flags=None) -> dict:
    """trace --verify for a model: one layer of ``cfg`` (attention and its MLP, FP32 master weights), forward, one
    sequence, Ulysses over context = P chips of a v5p slice (tpu:v5p-<2P>: the name counts TensorCores), with
    flash attention (key blocks of 512, or the sequence where shorter); its compiled peak beside the closed form
    (scaling.step.program.predict's memory). {"devices", "mesh", "closed_form", "compiled", "ratio", "terms"}."""
    one = cfg.replace(blocks=1)
    block = min(512, one.seq_len)
    if one.seq_len % block:
        raise ValueError(f"seq_len {one.seq_len} is not a multiple of flash attention's {block}-key blocks")
    mesh, devices = f"context={context}", f"tpu:{DEFAULT_CHIP}-{2 * context}"
    w = Workload(one, parse_mesh_spec(mesh), one.seq_len, "forward",
                 schedule=Schedule(attention="flash", attention_block=block), flags=flags)
    print(f"compiling one layer ({one.seq_len} tokens, flash attention) for {devices}, {mesh} ...", file=sys.stderr,
          flush=True)
    peak = check(w, devices, verbose=verbose).memory.peak
    terms = predict(w, CHIPS[DEFAULT_CHIP]).memory
    return {"devices": devices, "mesh": mesh, "closed_form": terms["total"], "compiled": peak.compiled,
            "ratio": peak.compiled / terms["total"], "terms": terms}
