"""Serving reports: ``predict --step prefill|decode`` (one configuration: scaling.step.serving.serving_report) and
``plan --step decode`` (every mesh of the chips and every batch that fits, ranked by throughput under a latency
target, with the latency-throughput frontier), built from the commands' fields.

The plan's candidates: tensor × expert over each divisor of the chips (data the rest: replicas), and batches of
powers of two a replica up to the largest whose caches fit at the full context (scaling.step.serving.max_batch). A
candidate's latency is the time per output token (the decode step at the mean context P + G/2), its throughput the
tokens a second a chip; the frontier is the candidates no other beats on both (Scaling Book, applied-inference:
"Visualizing the latency throughput tradeoff").
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass, field
from importlib import resources

from scaling.core.inputs import positive_float
from scaling.core.kinds import Platform
from scaling.core.mesh_shape import parse_mesh_spec
from scaling.families.presets import model_of
from scaling.step.serving import Serving, decode_memory, decode_step, kv_cache_bytes, max_batch, serving_report

SERVING_STEPS = ("prefill", "decode")


# keyword fields, one per flag of the serving commands: more than 8 parameters by design (predict_setup's too)
def serving_setup(preset: str | None, *, mesh: str, chip=None, chips=None, slice=None, slices=None,
                  global_batch: int | None = None, prompt: int = 2048, output: int = 512, weights: str = "bf16",
                  kv_cache: str = "bf16", compute: str = "bf16", prefill_efficiency: float | None = None,
                  **model) -> Serving:
    """The Serving of the commands' fields: the model (model_of), the hardware (target_of: its chip; the mesh's
    product must be its chips), the mesh, the batch in sequences (default: one a replica)."""
    from scaling.reports.predict import target_of

    cfg = model_of(preset, **{k: v for k, v in model.items() if v is not None})
    hw, dims, n_slices = target_of(chip, chips, slice, slices)
    shape = parse_mesh_spec(mesh)
    devices = math.prod(dims) * n_slices * hw.devices_per_chip
    if math.prod(shape.values()) != devices:
        raise ValueError(f"--mesh {mesh} has {math.prod(shape.values())} devices; the hardware has {devices}")
    batch = global_batch if global_batch is not None else shape.get("data", 1)
    if prefill_efficiency is not None:
        positive_float("--prefill-efficiency", prefill_efficiency)
    return Serving(cfg, hw, dict(shape.items()), batch, prompt, output, weights, kv_cache, compute,
                   prefill_efficiency, tuple(dims) if hw.kind == Platform.TPU and n_slices == 1 else ())


@dataclass(frozen=True)
class ServingPlanRow:
    mesh: dict
    batch: int
    tpot: float  # seconds per output token
    tokens_per_second_per_chip: float
    memory_per_device: float
    frontier: bool

    def to_json(self) -> dict:
        return {"mesh": self.mesh, "batch": self.batch, "tpot_seconds": self.tpot,
                "tokens_per_second_per_chip": self.tokens_per_second_per_chip,
                "memory_per_device": self.memory_per_device, "frontier": self.frontier}


@dataclass(frozen=True)
class ServingPlan:
    """Every candidate (module docstring), the frontier marked, the best under the latency target (None: none meets
    it, or no target)."""

    serving: Serving
    latency: float | None
    rows: list[ServingPlanRow] = field(default_factory=list)

    @property
    def frontier(self) -> list[ServingPlanRow]:
        return sorted((r for r in self.rows if r.frontier), key=lambda r: r.tpot)

    @property
    def best(self) -> ServingPlanRow | None:
        ok = [r for r in self.rows if self.latency is None or r.tpot <= self.latency]
        return max(ok, key=lambda r: r.tokens_per_second_per_chip) if ok else None

    def to_json(self) -> dict:
        s = self.serving
        return {"model": str(s.model), "chip": s.chip.name, "devices": s.devices, "prompt": s.prompt,
                "output": s.output, "weights": s.weights, "kv": s.kv, "latency_seconds": self.latency,
                "best": None if self.best is None else self.best.to_json(),
                "frontier": [r.to_json() for r in self.frontier], "candidates": len(self.rows)}

    def render(self) -> str:
        s = self.serving
        mesh = lambda m: ",".join(f"{a}={n}" for a, n in m.items() if n > 1) or "1 device"  # noqa: E731
        lines = [f"serving plan: {s.model} on {s.devices} {s.chip.name}, prompt {s.prompt}, output {s.output}, "
                 f"weights {s.weights}, KV cache {s.kv}; {len(self.rows)} candidates (mesh × batch that fit)",
                 f"  {s.chip.describe()}",
                 "  the frontier (time per output token against tokens/s a chip; none beats a row on both):",
                 f"    {'mesh':<22}{'batch':>7}{'ms/token':>10}{'tok/s/chip':>12}{'GB/device':>11}"]
        for r in self.frontier:
            lines.append(f"    {mesh(r.mesh):<22}{r.batch:>7}{r.tpot * 1e3:>10.3g}"
                         f"{r.tokens_per_second_per_chip:>12,.0f}{r.memory_per_device / 1e9:>11.4g}")
        target = "" if self.latency is None else f" within {self.latency * 1e3:.3g} ms a token"
        b = self.best
        lines.append(f"  best{target}: " + ("none" if b is None else
                     f"{mesh(b.mesh)}, batch {b.batch}: {b.tpot * 1e3:.3g} ms a token, "
                     f"{b.tokens_per_second_per_chip:,.0f} tokens/s a chip"))
        return "\n".join(lines)


def _model_parallel_meshes(devices: int, expert: bool) -> list[dict]:
    """{data, expert, tensor} over every divisor split of ``devices`` (expert only for an MoE model)."""
    out = []
    for mp in (d for d in range(1, devices + 1) if devices % d == 0):
        for ex in ((e for e in range(1, mp + 1) if mp % e == 0) if expert else (1,)):
            out.append({"data": devices // mp, "expert": ex, "tensor": mp // ex})
    return out


def serving_plan(s: Serving, latency: float | None = None) -> ServingPlan:
    """Every mesh and batch (module docstring) of ``s``'s devices, model and request shape; a mesh the model's
    divisions refuse (the experts over expert) is left out."""
    rows = []
    expert = hasattr(s.model, "moe")
    full, mean = s.prompt + s.output, s.prompt + s.output / 2
    for mesh in _model_parallel_meshes(s.devices, expert):
        if expert and s.model.moe.experts % mesh["expert"]:
            continue
        base = Serving(s.model, s.chip, mesh, mesh["data"], s.prompt, s.output, s.weights, s.kv, s.compute,
                       s.prefill_efficiency, s.topology)
        most = max_batch(base, full) // mesh["data"]
        b = 1
        while b <= most:
            c = Serving(s.model, s.chip, mesh, b * mesh["data"], s.prompt, s.output, s.weights, s.kv, s.compute,
                        s.prefill_efficiency, s.topology)
            t = decode_step(c, mean).seconds
            memory = decode_memory(c, full)
            rows.append((mesh, c.batch, t, c.batch / t / c.devices, memory))
            b *= 2
    marked = []
    for r in rows:
        beaten = any(o[2] <= r[2] and o[3] >= r[3] and (o[2] < r[2] or o[3] > r[3]) for o in rows)
        marked.append(ServingPlanRow(r[0], r[1], r[2], r[3], r[4], not beaten))
    return ServingPlan(s, latency, marked)


_RUNS = "data/serving_measured.toml"


@dataclass(frozen=True)
class ServingValidation:
    """Each measured decode step (scaling/data/serving_measured.toml) beside the closed form's (decode_step at its
    context, one device): rows (preset, blocks, layers, batch, context, measured s, predicted s, error), the median
    and largest |error| of the runs whose layers are laid out as the package's program lays them (unrolled)."""

    source: str
    rows: list = field(default_factory=list)
    published: list = field(default_factory=list)  # the published runs (held out): their rows with the error

    @property
    def errors(self) -> list[float]:
        return [r["error"] for r in self.rows if r["layers"] == "unrolled"]

    def to_json(self) -> dict:
        e = [abs(x) for x in self.errors]
        p = [abs(r["error"]) for r in self.published]
        return {"source": self.source, "rows": self.rows, "median_abs_error": statistics.median(e),
                "max_abs_error": max(e), "published": self.published,
                "published_median_abs_error": statistics.median(p) if p else None,
                "published_max_abs_error": max(p) if p else None}

    def render(self) -> str:
        lines = [f"decode steps measured ({self.source}) beside scaling.step.serving's closed form",
                 f"  {'run':<42}{'measured ms':>12}{'predicted ms':>13}{'error':>8}"]
        for r in self.rows:
            name = f"{r['preset']} L{r['blocks']} {r['layers']} b={r['batch']} T={r['context']}"
            lines.append(f"  {name:<42}{r['measured'] * 1e3:>12.3f}{r['predicted'] * 1e3:>13.3f}{r['error']:>+8.1%}")
        j = self.to_json()
        lines.append(f"  layers unrolled (the package's layout): {len(self.errors)} runs, median |error| "
                     f"{j['median_abs_error']:.1%}, max {j['max_abs_error']:.1%}; a scan over stacked layers is "
                     "XLA:GPU's copy of each layer's weights (docs/serving.md), not a closed-form term")
        if self.published:
            lines += ["published runs, held out (error: predicted time / measured time - 1)",
                      f"  {'run':<58}{'measured':>11}{'predicted':>11}{'error':>8}"]
            for r in self.published:
                what = "tok/s/GPU" if "out_tokens_per_second_per_gpu" in r else "ms first"
                name = (f"{r['preset']} {r['chip']} TP{r['tensor']} {r['dtype']} b={r['batch']} "
                        f"{r['prompt']}/{r['output']} ({what})")
                lines.append(f"  {name:<58}{r['measured']:>11,.1f}{r['predicted']:>11,.1f}{r['error']:>+8.1%}")
            lines.append(f"  {len(self.published)} runs: median |error| {j['published_median_abs_error']:.1%}, max "
                         f"{j['published_max_abs_error']:.1%} (docs/serving.md says what the form lacks)")
        return "\n".join(lines)


def validate_serving() -> ServingValidation:
    """Every measured decode step predicted by decode_step on its chip (one device, BF16 weights and cache, its context
    the cache's length); error = predicted/measured − 1. No coefficient is fitted on them."""
    from scaling.hardware.chips import get_chip

    with resources.files("scaling").joinpath(_RUNS).open("rb") as f:
        data = tomllib.load(f)
    rows = []
    for r in data["run"]:
        cfg = model_of(r["preset"], blocks=r["blocks"])
        s = Serving(cfg, get_chip(r["chip"]), {}, r["batch"], r["context"], 1)
        t = decode_step(s, r["context"]).seconds
        rows.append({**r, "measured": r["seconds"], "predicted": t, "error": t / r["seconds"] - 1})
    return ServingValidation(data["source"], rows, [_published(r) for r in data.get("published", [])])


def _published(r: dict) -> dict:
    """A published run predicted as `predict --step decode` predicts it: a throughput row's static batch
    (ServingReport.batch_tokens_per_second_per_chip), a first-token row's ttft; its error as a time's."""
    s = serving_setup(r["preset"], mesh=f"tensor={r['tensor']}", chip=r["chip"], chips=r["tensor"],
                      global_batch=r["batch"], prompt=r["prompt"], output=r["output"], weights=r["dtype"],
                      kv_cache=r["dtype"], compute=r["dtype"])
    rep = serving_report(s)
    if "out_tokens_per_second_per_gpu" in r:
        got, pred = r["out_tokens_per_second_per_gpu"], rep.batch_tokens_per_second_per_chip
        return {**r, "measured": got, "predicted": pred, "error": got / pred - 1}
    got, pred = r["first_token_ms"], rep.ttft * 1e3
    return {**r, "measured": got, "predicted": pred, "error": pred / got - 1}


@dataclass(frozen=True)
class ServingAnswers:
    """The Scaling Book's serving questions on LLaMA 3-70B ("Serving LLaMA 3-70B on TPUs"), each as (question, the
    derivation with its numbers, the value, the Book's figure), from the model's and the chip's figures (or the Book's
    rounded inputs where given: ``inputs``)."""

    inputs: dict
    rows: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"inputs": self.inputs, "answers": [dict(zip(("question", "derivation", "value", "book"), r))
                                                   for r in self.rows]}

    def render(self) -> str:
        i = self.inputs
        lines = [f"The Scaling Book's serving questions (applied-inference), derived: {i['model']}, P = "
                 f"{i['params']:.4g} parameters, on {i['chip']}: HBM {i['hbm']:.3g} B at W_hbm {i['hbm_bw']:.3g} B/s, "
                 f"C {i['flops']:.3g} bf16 FLOP/s ({i['int8_flops']:.3g} int8)"]
        for q, how, value, book in self.rows:
            lines += [f"  {q}", f"      {how} = {value}   (the Book: {book})"]
        return "\n".join(lines)


def serving_answers(preset: str = "llama3.1-70b", chip: str = "v5e", params: float | None = None,
                    hbm: float | None = None, hbm_bw: float | None = None,
                    flops: float | None = None) -> ServingAnswers:
    """The derivations of ServingAnswers: the KV cache a token (kv_cache_bytes), the memory and smallest slice at batch
    32 and 8k in int8, its step on 8 and 16 chips (general_step_seconds), the critical batches
    (critical_decode_batch's form), the smallest slice per type, the latency at full HBM, queries a chip, the prefill
    (prefill_seconds at 40%), prefill servers per decode server. ``params``, ``hbm``, ``hbm_bw``, ``flops``: the
    Book's rounded inputs (70e9, 16e9, 8.1e11, 1.97e14) in place of the preset's count and the hardware table's."""
    from scaling.hardware.chips import get_chip
    from scaling.step.serving import (critical_decode_batch, general_step_seconds, prefill_seconds,
                                      prefill_servers_per_decode_server, sequences_that_fit)

    cfg, hw = model_of(preset), get_chip(chip)
    P = params or cfg.params
    H, W, C = hbm or hw.hbm_budget, hbm_bw or hw.hbm_bw, flops or hw.bf16_flops
    C8 = dict(hw.dtype_flops).get("int8", 2 * C)
    kv8 = kv_cache_bytes(cfg, 1, "int8")
    rows = [("KV cache a token, int8", f"2·K·H·L = 2·{cfg.kv_heads}·{cfg.head_dim}·{cfg.blocks}", f"{kv8:,.0f} B",
             "160kB")]
    mem = P + 32 * 8192 * kv8
    rows.append(("memory at batch 32, 8192 tokens, int8", f"P + 32·8192·{kv8:,.0f}", f"{mem / 1e9:.1f} GB", "112GB"))
    rows.append(("the fewest chips", f"{mem / 1e9:.1f} GB / {H / 1e9:.3g} GB", f"{mem / H:.2f}", "7 (a 4x2)"))
    for n, book in ((8, "17ms"), (16, "8.5ms")):
        t = general_step_seconds(32, 8192 * kv8, P, 1, n, C, W)
        rows.append((f"its decode step on {n} chips", f"(32·8192·KV + P) / ({n}·W_hbm)", f"{t * 1e3:.2f} ms", book))
    t8 = general_step_seconds(32, 8192 * kv8, P, 1, 8, C, W)
    rows.append(("its throughput a chip on 8", "32 / (step · 8)", f"{32 / t8 / 8:.0f} tokens/s", "235"))
    for w, c, wb, book in (("bf16", C, 2, "240"), ("int8 weights, bf16 FLOPs", C, 1, "120"),
                           ("int8 both", C8, 1, "240")):
        rows.append((f"critical batch, {w}", f"C·bytes/(2·W_hbm) = {c:.3g}·{wb}/(2·{W:.3g})",
                     f"{c * wb / (2 * W):.0f}", book))
    for w, wb, n, book in (("bf16", 2, 16, "8.75 chips, a 4x4, 43 caches"), ("int8", 1, 8, "4.38, a 4x2, 52"),
                           ("int4", 0.5, 4, "2.81, a 2x2, 67")):
        fit = sequences_that_fit(n * H - P * wb, 2 * kv8 * wb / 2, 8192)
        rows.append((f"smallest slice in {w}, caches of 8k it holds", f"P·{wb}/HBM; ({n}·HBM − P·{wb})/(KV·8192)",
                     f"{P * wb / H:.2f} chips; on {n}: {fit}", book))
    rows.append(("decode latency reading a full chip's HBM", f"{H / 1e9:.3g} GB / {W:.3g} B/s", f"{H / W * 1e3:.1f} ms",
                 "19ms"))
    pre = prefill_seconds(P, 8192, 16, C, 0.4)
    rows.append(("prefill of 8192 tokens on 16 chips at 40% of C", "2·P·T / (16·C·0.4)", f"{pre:.2f} s", "0.91s"))
    ratio = prefill_servers_per_decode_server(pre, H / W, 32, 512)
    rows.append(("prefill servers per decode server (batch 32, 512 out)", "32·t_prefill / (t_decode·512)",
                 f"{ratio:.1f}", "3"))
    critical_decode_batch(hw)  # the table's chip has a rate for the forms above (ValueError otherwise)
    return ServingAnswers({"model": preset, "params": P, "chip": hw.name, "hbm": H, "hbm_bw": W, "flops": C,
                           "int8_flops": C8}, rows)
