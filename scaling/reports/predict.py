"""One configuration's predicted step as a typed result: the workload and where it runs built from plain fields
(predict_setup: what ``jax-scaling predict``'s flags and each row of scaling/data/measured.toml give), predicted
by the planner's step model (predict_report: scaling.planner.plan.predict_placed) into a PredictReport, whose
``to_json`` is predict's --json object and ``render`` its text.

Fields are named as predict's flags with ``-`` as ``_`` (``--schedule`` is ``pipeline``); each is checked where
the workload is built (a ValueError naming the flag), before anything is predicted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from scaling.step import kernels
from scaling.step import launches
from scaling.step import pipeline
from scaling.planner import plan as planner
from scaling.core.inputs import positive_float, positive_int
from scaling.core.kinds import Dtype, KernelModel, Platform
from scaling.core.mesh_shape import MeshShape, parse_mesh_spec
from scaling.core.policies import DEFAULT_PRECISION, Precision
from scaling.families.presets import model_fields, model_of
from scaling.core.schedule import Schedule, runs_attention
from scaling.core.flags import DEFAULT_FLAGS, check_modelled, get_flag_set
from scaling.hardware.chips import DEFAULT_CHIP, GPU_NODE, Chip, get_chip, parse_slice, split_slices
from scaling.hardware.kernel_tables import KernelTable, load_kernel_table
from scaling.step.kernels import DTYPE_BYTES, LOW_PRECISION, gemm_coefficients, peak_flops
from scaling.core.limits import check_devices, check_size
from scaling.core.table import in_unit, prose, table, time_text, time_unit
from scaling.core.workload import Workload



# the Schedule's fields, each a flag of predict
def schedule_from(microbatches: int = 1, repeats: int = 1, fsdp_gather: str = "microbatch",
                  sequence_parallel: bool = False, optimizer_sharding: str = "fsdp", pipeline: str = "gpipe",
                  warmup_phases: bool = False, stage_blocks: tuple[int, ...] | None = None, **attention) -> Schedule:
    """The Schedule of these fields and a family's own (its schedule_flags, scaling.families.presets.model_fields; None
    or absent: Schedule's default). ValueError naming a bad value (Schedule's own checks)."""
    own = {k: fam.schedule_flags[k] for k, (kind, fam) in model_fields().items() if kind == "schedule_flags"}
    given = {f: attention[a] for a, f in own.items() if attention.get(a) is not None}
    return Schedule(microbatches, repeats, fsdp_gather, sequence_parallel, optimizer_sharding=optimizer_sharding,
                    pipeline=pipeline, warmup_phases=warmup_phases, stage_blocks=stage_blocks, **given)


def precision_of(dtype: str, accumulation: str = "package") -> Precision:
    """The precision policy with ``dtype`` matmuls: activations and weights on the wire in its bytes
    (DTYPE_BYTES; tf32 is stored as fp32), except a quantized step's (int8, fp8: scaling.step.kernels.LOW_PRECISION),
    whose activations and weight gathers stay in 16 bits (it casts each GEMM's operands as it runs it:
    quantize_kernels); FP32 master weights, gradients and moments as always; the gradient accumulation of the
    runtime ``accumulation`` (scaling.core.policies.ACCUMULATION_BYTES)."""
    b = DTYPE_BYTES[Dtype.BF16 if dtype in LOW_PRECISION else dtype]
    return dataclasses.replace(DEFAULT_PRECISION, compute=b, weight_comm=b, dtype=dtype, accumulation=accumulation)


def named_slice(slice: str, chip: str | None, chips: int | None) -> tuple[Chip, tuple[int, ...]]:
    """(chip, slice dims) of a Cloud TPU slice name, refused beside a chip count or another chip."""
    if chips is not None:
        raise ValueError(f"--slice {slice} names the chip count already; leave out --chips")
    named, dims = parse_slice(slice)
    if chip is not None and get_chip(chip) is not named:
        raise ValueError(f"--slice {slice} is a {named.name} slice, not {chip}")
    return named, dims


def with_kernel_table(hw: Chip, kernel_table) -> Chip:
    """``hw`` with the kernel table ``kernel_table`` (a KernelTable or the path of one: --kernel-table FILE) in place
    of the shipped one: its GEMM coefficients are fitted on it (scaling.step.kernels.gemm_coefficients). ValueError
    where the table is another chip's, or the chip a TPU (its matmuls take the hardware table's matmul_efficiency)."""
    table = kernel_table if isinstance(kernel_table, KernelTable) else load_kernel_table(kernel_table)
    if hw.kind != Platform.GPU:
        raise ValueError(f"--kernel-table {table.path}: {hw.name} is a TPU, whose matmuls take the hardware table's "
                         "matmul_efficiency; kernel tables price a GPU's GEMMs")
    if get_chip(table.chip) is not get_chip(hw.name):
        raise ValueError(f"--kernel-table {table.path} is {table.chip}'s (chip = {table.chip!r}), not {hw.name}'s")
    return dataclasses.replace(hw, kernel_table=table)


def target_of(chip: str | None = None, chips: int | None = None, slice: str | None = None, slices: int | None = None,
              inter_node_bandwidth: float | None = None, kernel_table=None) -> tuple[Chip, tuple[int, ...], int]:
    """(chip, slice dims, slices) from a slice and a slice count, or a chip and a chip count (GPUs: nodes of
    GPU_NODE; TPUs: hardware.split_slices), the GPU's share of ``inter_node_bandwidth`` (bytes/s per node) as its
    dcn_bw, the user's ``kernel_table`` (with_kernel_table) where given."""
    if slice is not None:
        hw, dims = named_slice(slice, chip, chips)
        slices = positive_int("--slices", 1 if slices is None else slices)
    else:
        if slices is not None:
            raise ValueError("--slices counts slices of --slice; with --chip give --chips")
        if chips is None:
            raise ValueError("give the hardware: --chip and --chips, or --slice (and --slices)")
        hw, chips = get_chip(chip or DEFAULT_CHIP), check_devices("--chips", chips)
        if hw.kind == Platform.GPU:
            node = min(chips, GPU_NODE)
            if chips % node:
                raise ValueError(f"{chips} GPUs are not whole nodes of {GPU_NODE}")
            slices, dims = chips // node, (node,)
        else:
            slices, dims = split_slices(hw, chips)
    if inter_node_bandwidth is not None:
        if hw.kind != Platform.GPU:
            raise ValueError("--inter-node-bandwidth is a GPU cluster's (bytes/s per node); a TPU slice's DCN is the "
                             "hardware table's")
        bw = positive_float("--inter-node-bandwidth", inter_node_bandwidth)
        hw = dataclasses.replace(hw, dcn_bw=bw / dims[0])
    if kernel_table is not None:
        hw = with_kernel_table(hw, kernel_table)
    return hw, dims, slices


def batch_of(cfg, mesh: MeshShape, global_batch: int | None, batch_tokens: int | None, microbatch: int | None,
             microbatches: int = 1) -> tuple[int, int]:
    """(B tokens, M microbatches) from ``global_batch`` (sequences; a model with sequences) or ``batch_tokens``, and
    ``microbatch`` (sequences per microbatch on each data·fsdp shard: M = global batch / (microbatch·data·fsdp))
    or ``microbatches``."""
    if global_batch is not None and batch_tokens is not None:
        raise ValueError(f"--global-batch {global_batch} and --batch-tokens {batch_tokens} both give the batch: give "
                         "--global-batch (sequences) or --batch-tokens, not both")
    if global_batch is None and batch_tokens is None:
        raise ValueError("give the batch: --global-batch (sequences) or --batch-tokens")
    if global_batch is not None:
        if cfg.seq_len is None:
            raise ValueError("--global-batch counts sequences (a transformer's); give the FFN stack --batch-tokens")
        B = positive_int("--global-batch", global_batch) * cfg.seq_len
    else:
        B = positive_int("--batch-tokens", batch_tokens)
    M = microbatches
    if microbatch is not None:
        if M != 1:
            raise ValueError("give --microbatch (sequences per microbatch) or --microbatches (their count), not both")
        if cfg.seq_len is None:
            raise ValueError("--microbatch counts sequences (a transformer's); give the FFN stack --microbatches")
        replicas = mesh["data"] * mesh["fsdp"]
        seqs = B // cfg.seq_len
        per = positive_int("--microbatch", microbatch) * replicas
        if seqs % per:
            raise ValueError(f"--global-batch {seqs} is not a whole number of microbatches of {microbatch} "
                             f"sequences on each of data·fsdp = {replicas} shards")
        M = seqs // per
    return B, M


@dataclass(frozen=True)
class PredictSetup:
    """A workload and where it runs: ``slices`` slices (GPU nodes) of shape ``dims`` of ``chip``, the mesh axes
    ``dcn_mesh`` names across them (None: the outermost), the step's ``form`` and matmul ``kernel_model``."""

    workload: Workload
    chip: Chip
    dims: tuple[int, ...]
    slices: int
    dcn_mesh: dict | None = None
    form: str = "scheduled"
    kernel_model: str = "efficiency"


# one keyword a predict flag (a measured.toml field): the command and validate pass them by name
def predict_setup(preset: str = "xxl", *, mesh: str, chip: str | None = None, chips: int | None = None,
                  slice: str | None = None, slices: int | None = None, inter_node_bandwidth: float | None = None,
                  dcn_mesh: str | None = None, global_batch: int | None = None, batch_tokens: int | None = None,
                  microbatch: int | None = None, microbatches: int = 1, step: str = "train", remat: str = "none",
                  dtype: str = "bf16", grad_accumulation: str = "package", xla_flags: str | None = None,
                  form: str = "scheduled", kernel_model: str = "efficiency", command: str = "predict",
                  kernel_table=None, **model_and_schedule) -> PredictSetup:
    """The PredictSetup of predict's fields (module docstring): the model (model_of: ``preset`` and the overrides
    in ``model_and_schedule``), the hardware (target_of), the mesh spec, the batch (batch_of), the schedule
    (schedule_from: the rest of ``model_and_schedule``), the precision (precision_of), the XLA flag set (a set the
    step model reads, check_modelled; ``command`` names who asks). Every rule predict checks, checked in its order:
    a ValueError naming the field. (Keyword fields, one per flag: more than 8 parameters by design.)"""
    flags = check_modelled(get_flag_set(xla_flags or DEFAULT_FLAGS), command)
    fields = model_fields()
    cfg = model_of(preset, **{k: v for k, v in model_and_schedule.items() if k in fields})
    hw, dims, slices = target_of(chip, chips, slice, slices, inter_node_bandwidth, kernel_table)
    shape = parse_mesh_spec(mesh)
    planner.check_mesh_devices(shape, hw, dims, slices, mesh)
    B, M = batch_of(cfg, shape, global_batch, batch_tokens, microbatch, microbatches)
    schedule = schedule_from(M, **{k: v for k, v in model_and_schedule.items() if k not in fields
                                   or fields[k][0] == "schedule_flags"})
    w = Workload(cfg, shape, B, step, remat, schedule, precision=precision_of(dtype, grad_accumulation), flags=flags)
    cfg.check_divisible(shape, B)
    check_size(w)
    peak_flops(hw, dtype)  # ValueError where the table has no rate for it
    given = dict(parse_mesh_spec(dcn_mesh).items()) if dcn_mesh else None
    return PredictSetup(w, hw, dims, slices, given, form, kernel_model)


def param_counts(cfg) -> dict[str, int]:
    """A model's parameter counts as its publishers count them: ``params`` = P + the norms' scales (cfg.params, the
    family's closed form, and cfg.norm_params, which this package's model leaves out), ``active_params`` those a token
    runs (an MoE model's k routed experts of E, its shared ones, the router, attention and embeddings: Mistral's
    12.9B of Mixtral 8x7B's 46.7B), and ``params_without_norms`` = P, what the memory terms count."""
    norms = cfg.norm_params
    return {"params": cfg.params + norms, "active_params": cfg.active_params + norms,
            "params_without_norms": cfg.params}


def params_text(cfg) -> str:
    """param_counts in a line: "parameters: 405,853,388,800 (405.9e9), 4,145,152 of them the norms' scales, which
    the program omits", with ", 12,879,925,248 (12.88e9) active per token" after the total for an MoE model."""
    c = param_counts(cfg)
    short = lambda n: f"{n:,} ({n / 1e9:.4g}e9)"  # noqa: E731
    norms = c["params"] - c["params_without_norms"]
    return (f"parameters: {short(c['params'])}"
            + (f", {short(c['active_params'])} active per token" if c["active_params"] != c["params"] else "")
            + (f"; {norms:,} of them the norms' scales, which the program omits" if norms else ""))


def _kernel_json(k) -> dict:
    return {"name": k.name, "pass": k.pass_, "kind": k.kind, "shape": None if k.shape is None else
            [float(v) for v in k.shape], "calls": float(k.calls), "flops": float(k.flops), "bytes": float(k.bytes),
            "executed": float(k.executed), "efficiency": float(k.efficiency), "seconds": float(k.seconds),
            "bound": str(k.bound)}


def _mesh_text(mesh: Mapping) -> str:
    return ",".join(f"{a}={n}" for a, n in mesh.items() if n > 1) or "1 device"


@dataclass(frozen=True)
class PredictReport:
    """One configuration's predicted step (predict_report): its setup, the Prediction (scaling.step.program), the mesh
    axes across slices (``dcn``: axis -> factor) and the ICI ``layout`` chosen, and the step's kernels (with
    --kernels; scaling.step.kernels.step_kernels) or None."""

    setup: PredictSetup
    prediction: object
    dcn: dict
    layout: dict
    kernels: list | None = None

    @property
    def workload(self) -> Workload:
        return self.setup.workload

    @property
    def chip(self) -> Chip:
        return self.setup.chip

    @property
    def form(self) -> str:
        return self.setup.form

    @property
    def step_seconds(self) -> float:
        """The step in the setup's form, seconds."""
        return float(self.prediction.times.step[self.form])

    @property
    def mfu(self) -> float:
        return float(self.prediction.times.mfu[self.form])

    @property
    def bound(self) -> str:
        return str(self.prediction.times.bound)

    @property
    def memory_per_device(self) -> float:
        """Bytes per device (the memory terms' total)."""
        return float(self.prediction.memory["total"])

    @property
    def devices(self) -> int:
        return self.workload.mesh.devices

    @property
    def fits(self) -> bool:
        """Whether the memory per device is within the chip's usable HBM (Chip.hbm_budget)."""
        return bool(self.prediction.memory["total"] <= self.chip.hbm_budget)

    @property
    def fit_note(self) -> str | None:
        """Why the step cannot start where it does not fit (None where it fits)."""
        if self.fits:
            return None
        need, have, name = self.memory_per_device, self.chip.hbm_budget, self.chip.name
        return (f"the step needs {need / 1e9:.2f} GB per device, {(need - have) / 1e9:.2f} GB over the "
                f"{have / 1e9:.4g} GB usable on a {name}: the step time is of a run that cannot start")

    def to_json(self) -> dict:
        """predict's --json object: the step and its terms, memory, FLOPs, the hardware, mesh and placement, the
        workload's fields (and fit_note where it does not fit, kernels with --kernels)."""
        t, w, s, form = self.prediction.times, self.workload, self.setup, self.form
        p, chip, step = self.prediction, self.chip, self.step_seconds
        terms = {"compute": float(t.compute), "math": float(t.math), "hbm": float(t.hbm),
                 **{f"comms.{a}": float(v) for a, v in t.comms.items()},
                 **{f"exposed.{a}": float(v) for a, v in t.exposed.items()}, "loop_copies": float(t.copies),
                 "host_idle": float(t.host_idle)}
        out = {"step_seconds": step, "form": form, "mfu": self.mfu, "hfu": float(t.hfu[form]),
               "tokens_per_second_per_device": w.batch_tokens / step / self.devices,
               "memory_per_device_bytes": self.memory_per_device, "hbm_budget_bytes": chip.hbm_budget,
               "fits": self.fits, "bound": self.bound, "terms": terms,
               "step_seconds_by_form": {k: float(v) for k, v in t.step.items()},
               "memory_terms": {k: float(v) for k, v in p.memory.items()},
               "flops": {k: float(v) for k, v in p.flops.items()}, "chip": chip.name, "devices": self.devices,
               "slices": s.slices, "slice_shape": list(s.dims), "mesh": dict(w.mesh), "dcn": self.dcn,
               "layout": {a: {"lens": v[0], "wrap": v[1]} for a, v in self.layout.items()},
               "batch_tokens": w.batch_tokens, "microbatches": w.schedule.microbatches,
               "model": dataclasses.asdict(w.model), **param_counts(w.model), "remat": str(w.remat),
               "schedule": {k: str(v) if not isinstance(v, (int, bool)) else v
                            for k, v in dataclasses.asdict(w.schedule).items()}, "xla_flags": w.flags.name,
               "step": str(w.step), "model_text": str(w.model), "xla_flags_text": w.flags.describe(),
               "dtype": w.precision.dtype, "kernel_model": s.kernel_model}
        if not self.fits:
            out["fit_note"] = self.fit_note
        if self.kernels is not None:
            out["kernels"] = [_kernel_json(k) for k in self.kernels]
        return out

    def render(self) -> str:
        """predict's text: the configuration, the terms, the step, tokens/s, MFU and memory per device; with the
        kernels, one line per kernel after it (render_kernels)."""
        t, w, s, form, chip = self.prediction.times, self.workload, self.setup, self.form, self.chip
        memory, step, devices, budget = self.prediction.memory, self.step_seconds, self.devices, chip.hbm_budget
        lines = [] if self.fits else [prose(f"DOES NOT FIT: {self.fit_note}")]
        lines += [prose(f"note: {line}") for line in w.model.program_notes(chip)]
        B, M, slices, dims = w.batch_tokens, w.schedule.microbatches, s.slices, s.dims
        where = (f"{slices} slices of {'x'.join(map(str, dims))}" if chip.kind == Platform.TPU and slices > 1 else
                 f"{slices} nodes of {dims[0]}" if chip.kind == Platform.GPU and slices > 1 else
                 "x".join(map(str, dims)))
        net = (f"; over {chip.network_name}: " + ", ".join(f"{a} x{n}" for a, n in self.dcn.items())
               if self.dcn else "")
        lines += [prose(f"{w.model}"), prose(params_text(w.model)),
                  prose(f"on {devices} {chip.name} devices ({where}{net}), mesh {_mesh_text(dict(w.mesh))}, "
                        f"B = {B:,} tokens, M = {M}, remat {w.remat}, {w.step} step"
                        + (f", attention {w.schedule.attention}" if runs_attention(w.model) else "")
                        + (f", the {w.precision.accumulation} runtime's eager PyTorch step (no XLA flags)"
                           if launches.runs_launches(w) else f", {w.flags.describe()}"))]
        S = w.mesh.get("stage", 1)
        if S > 1 and len(set(chunks := pipeline.chunk_counts(w.model, w.schedule, S))) > 1:  # uneven stages, chunks
            counts, loads = pipeline.stage_blocks(w.model, w.schedule, S), pipeline.stage_loads(w.model, w.schedule, S)
            R, bub = w.schedule.repeats, pipeline.padded_bubble(w.model, w.schedule, S)
            of = f" in chunks of {pipeline.layout_text(chunks)} (chunk r*S+s on stage s)" if R > 1 else ""
            lines.append(prose(f"stages of {','.join(map(str, counts))} blocks{of}"
                               + f" (with the embedding and output counted: {','.join(map(str, loads))}); the "
                               f"program pads every {'chunk' if R > 1 else 'stage'} to the largest, {max(chunks)} "
                               f"slots, which sets the step: bubble {bub['overhead']:.3f} of the ideal step with the "
                               f"padding ({bub['padding']:.3f} of it)"))
        rows = [("compute", "the kernels at their shapes' efficiency (--kernels)", t.compute),
                ("math", "executed FLOPs / C (roofline)", t.math), ("hbm", "HBM bytes / bandwidth (roofline)", t.hbm)]
        rows += [(f"{a}", f"collectives over {a} (all)", v) for a, v in t.comms.items()]
        rows += [(f"{a} exposed", "what the schedule leaves exposed", v) for a, v in t.exposed.items()]
        rows += [("loop copies", "2 x loop-state copy bytes / HBM bandwidth", t.copies)]
        if launches.runs_launches(w) and chip.kind == Platform.GPU:
            each = f"{launches.HOST_SECONDS * 1e6:.0f} us each"
            rows += [("host idle", f"the GPU waiting for the host's launches ({each})", t.host_idle)]
        lines += table(["term", "what", "time"], [(n, w_, time_text(float(v))) for n, w_, v in rows], right=(2,))
        unit = time_unit(step)  # the step's forms in one unit
        lines.append(prose(f"step: {in_unit(step, unit)} {unit[0]} ({form}; "
                           + ", ".join(f"{k} {in_unit(float(v), unit)}" for k, v in t.step.items() if k != form)
                           + f"), bound: {t.bound}"))
        lines.append(prose(f"tokens/s per device: {B / step / devices:,.1f}; MFU {float(t.mfu[form]):.3f} (model "
                           "FLOPs: the matmuls the step needs, attention's causal half), "
                           f"HFU {float(t.hfu[form]):.3f}"))
        over = memory["total"] - budget
        lines.append(prose(f"memory per device: {memory['total'] / 1e9:.2f} GB of {budget / 1e9:.4g} GB ("
                           + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in memory.items() if k != "total" and v >= 1e7)
                           + ")" + (f": does not fit, {over / 1e9:.2f} GB over" if over > 0 else "")))
        if self.kernels is not None:
            lines.append(self.render_kernels())
        return "\n".join(lines)

    def render_kernels(self) -> str:
        """predict --kernels: one line per kernel (its FLOPs, HBM bytes, intensity against the chip's ridge point
        C/W_hbm, the efficiency its shape gets, seconds, bound) and the sums per pass, as seed 002's report lays
        them out."""
        chip, ks = self.chip, self.to_json()["kernels"]
        ridge = peak_flops(chip, self.workload.precision.dtype) / chip.device_hbm_bw
        rows = []
        for k in ks:
            shape = "" if k["shape"] is None else "x".join(f"{v:.0f}" for v in k["shape"][:3]) + (
                f" (x{k['shape'][3]:.0f})" if k["shape"][3] != 1 else "")
            inten = k["flops"] / k["bytes"] if k["bytes"] else float("inf")
            rows.append((k["name"], k["pass"], shape, f"{k['calls']:.4g}", f"{k['flops'] / 1e12:.4g}",
                         f"{k['bytes'] / 1e9:.4g}", f"{inten:.4g}", f"{k['efficiency']:.3f}" if k["shape"] else "",
                         time_text(k["seconds"]), k["bound"]))
        how = ("efficiency = eta·q(shape)" if self.setup.kernel_model == KernelModel.EFFICIENCY else
               f"hierarchical: matmul bytes from tiles through {chip.onchip / 2**20:.0f} MiB on chip, efficiency = eta")
        dtype = self.workload.precision.dtype
        if chip.kind == Platform.GPU:
            g = gemm_coefficients(chip, dtype)
            eta = (f"eta = the {dtype} ceiling {g.ceiling:.3f} on {chip.name} and t_fixed {g.t_fixed * 1e6:.1f} us per "
                   f"matmul call, fitted on {g.rows} GEMM rows of its kernel table" if not g.fallback else
                   f"eta = the ceiling {g.ceiling:.3f} and t_fixed {g.t_fixed * 1e6:.1f} us per matmul call "
                   f"({g.fallback})")
        else:
            eta = f"eta = {chip.matmul_efficiency} on {chip.name}"
        lines = [prose(f"kernels per device (ridge point C/W_hbm = {ridge:.0f} FLOPs/byte; {how}, {eta}; flash "
                       "attention's time counts its causal blocks)")]
        lines += table(["kernel", "pass", "m x n x k", "calls", "TFLOPs", "GB", "FLOPs/B", "eff", "time", "bound"],
                       rows, right=range(3, 9))
        by = {}
        for k in ks:
            by[k["pass"]] = by.get(k["pass"], 0.0) + k["seconds"]
        unit = time_unit(sum(by.values()))  # one unit: the passes add up to the compute term
        lines.append(prose("per pass: " + ", ".join(f"{k} {in_unit(v, unit)} {unit[0]}" for k, v in by.items())
                           + f"; compute term {in_unit(sum(by.values()), unit)} {unit[0]}"))
        passes = self.prediction.times.passes
        if passes:
            lines += self.render_passes(passes)
        lines.append(prose("prices: " + "; ".join(f"{k} from {v}" for k, v in kernels.price_sources(
            self.workload, chip, dtype).items())))
        return "\n".join(lines)

    def render_passes(self, passes: dict) -> list[str]:
        """A GPU step's passes (scaling.step.program.StepModel.passes): per pass the seconds of its kernels by kind,
        its exposed tensor collectives, the launches the host issues and its time, and which of the two bounds it."""
        kinds = sorted({k for r in passes.values() for k in r["kinds"]})
        runtime = launches.runs_launches(self.workload)
        rows = []
        for name, r in passes.items():
            if not float(r["launches"]) > 0:  # a pass the step does not run (no recompute)
                continue
            host, device = float(r["host"]), float(r["device"])
            rows.append((name, *(time_text(float(r["kinds"].get(k, 0.0))) for k in kinds),
                         time_text(float(r["collectives"])), f"{float(r['launches']):,.0f}", time_text(device),
                         time_text(host) if runtime else "-", "host" if runtime and host > device else "device"))
        head = prose("the passes (the kernels above by kind, the tensor all-reduces they leave exposed, the launches: "
                     + (f"a PyTorch runtime issues each from the host, {launches.HOST_SECONDS * 1e6:.0f} us each "
                        f"({launches.HOST_SOURCE}); where the host takes longer the GPU waits"
                        if runtime else "XLA's program launches them from its executable, no host time") + ")")
        return [head, *table(["pass", *kinds, "tensor", "launches", "device", "host", "bound"], rows,
                             right=range(1, len(kinds) + 6))]

    def kernel_report(self) -> str:
        """The kernels command's report of a model in seed 002's order: per kernel its FLOPs, HBM bytes, intensity
        against the inflection point C/W_hbm and time; the passes' sums (seed 002's Cf, Cb, R); the memory per
        device; the parallelism; the step time and what it is made of (the scheduled form)."""
        out = self.to_json()
        chip = self.chip
        ridge = peak_flops(chip, out["dtype"]) / chip.device_hbm_bw
        lines = [prose(f"DOES NOT FIT: {out['fit_note']}")] if not out["fits"] else []
        lines += [prose(f"{out['model_text']} on {out['devices']} {chip.name} devices, B = {out['batch_tokens']:,} "
                        f"tokens, M = {out['microbatches']}, kernel model {out['kernel_model']}"), ""]
        passes = {}
        for k in out["kernels"]:
            inten = k["flops"] / k["bytes"] if k["bytes"] else float("inf")
            shape = "" if k["shape"] is None else " [" + "x".join(f"{v:.0f}" for v in k["shape"][:3]) + "]"
            lines += [f"inflection_point: {ridge:.2f}", f"comp_int: {inten:.2f}",
                      f"{k['name']} ({k['pass']}){shape} flop: {k['flops']:,.0f}, mem: {k['bytes']:,.0f}, calls: "
                      f"{k['calls']:,.6g}", f"{k['name']} ({k['pass']}) time: {k['seconds']:.6g} ({k['bound']})", ""]
            passes[k["pass"]] = passes.get(k["pass"], 0.0) + k["seconds"]
        t = out["terms"]
        lines.append(", ".join(f"{p}: {v:.6g}" for p, v in passes.items()) + f"; compute {t['compute']:.6g} s")
        lines += ["", "Memory per device", *(f"{k}: {v / 1e9:.2f} GB" for k, v in out["memory_terms"].items()
                                             if k != "total"),
                  f"Total: {out['memory_per_device_bytes'] / 1e9:.2f} GB of {out['hbm_budget_bytes'] / 1e9:.1f} GB",
                  "", "Parallelism: " + ", ".join(f"{a}: {n}" for a, n in out["mesh"].items()
                                              if n > 1 or a in self.workload.model.plan.axes), "",
                  "exposed: " + ", ".join(f"{k[8:]} {v:.6g} s" for k, v in t.items() if k.startswith("exposed."))
                  + f"; loop copies {t['loop_copies']:.6g} s",
                  f"Time: {out['step_seconds']:.8f} ({out['form']} form; MFU {out['mfu']:.3f})"]
        return "\n".join(lines) + "\n"


def predict_report(setup: PredictSetup, with_kernels: bool = False) -> PredictReport:
    """The setup's step predicted: scaling.planner.plan.predict_placed (the mesh laid over the slices and the ICI, the
    planner's program.predict), and with ``with_kernels`` the step's kernels (scaling.step.kernels.step_kernels)."""
    s = setup
    p, dcn, lay = planner.predict_placed(s.workload, s.chip, s.dims, s.slices, s.dcn_mesh, s.form, s.kernel_model)
    ks = (kernels.step_kernels(s.workload, s.chip, s.workload.precision.dtype, s.kernel_model) if with_kernels
          else None)
    return PredictReport(s, p, dcn, lay, ks)
