"""The 4D-parallelism questions (a)-(d) of questions-4d.md, each number with its formula.

``answers(...)`` returns an ``Answers`` dataclass: ``to_json()`` is ``jax-scaling answer --json``,
``render()`` the printed derivation. Every input is a parameter: the defaults are
the question's (XXL model, X=16, Y=4, M_X=2, M_Y=1, C=4.6e14, W_ici=1.8e11, 95 GB HBM, 80 GB GPUs).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scaling.step import memory
from scaling.step import program
from scaling.hardware import roofline
from scaling.families.ffn import FFNConfig
from scaling.core.inputs import positive_float, positive_int
from scaling.core.kinds import Form
from scaling.core.mesh_shape import MeshShape
from scaling.core.policies import DEFAULT_PRECISION, FSDP_GATHERS
from scaling.families.presets import PRESETS
from scaling.core.schedule import Schedule
from scaling.core.flags import DEFAULT_FLAGS, FLAG_SETS
from scaling.hardware.chips import CHIPS, DEFAULT_CHIP
from scaling.core.workload import Workload

QUESTION = dict(d_model=16384, d_ff=53248, blocks=126, fsdp=16, tensor=4, mx=2, my=1, flops=4.6e14, w_ici=1.8e11,
                hbm=95e9, gpu_hbm=80e9, batch_tokens=25600, int8_bytes=1, stages=4)
# HBM per device below 1 GB is a unit slip (GB given for bytes): the table's smallest chip, v5e, has 16 GiB.
HBM_FLOOR = 1e9
# The question's torus is 3D (TPU v5p): the FSDP and TP mesh axes together span at most 3 ICI axes.
TORUS_AXES = 3
# Which form of (c) the package recommends, and the compiled program's evidence for it (docs/findings.md,
# "Finding for question (c)"; notebooks/4d_parallelism.ipynb, last section).
RECOMMENDED_FORM = "scheduled"  # the schedule of DEFAULT_FLAGS, the flags production runs pass (FLAGS_RULE)
SUM_FORM_WHY = (
    "under libtpu's default flags the compiled XXL forward step at fsdp=16, tensor=4 on v5p:4x4x4 runs all 4 of "
    "its collectives synchronously (0 asynchronous start/done pairs): XLA schedules the weight all-gathers and the "
    "TP all-reduces between the matmuls, not beside them, so their times add (check it: python -m scaling check "
    "--xla-flags default --devices tpu:v5p:4x4x4 --mesh fsdp=16,tensor=4 --preset xxl --batch-tokens 25600 "
    "--step forward)")
# What the compiled forward step supports under each flag set's schedule (scaling.core.flags), per block: compute
# bound when the exposed communication is less than the math and the hidden gathers fit behind the matmuls they
# overlap. Critical batches as (form, FSDP bytes relative to bf16) pairs of roofline.critical_batch, the largest.
FLAGS_RULE = {
    "exposed": ([("sum", 2)], "every gather and TP all-reduce between the matmuls: the sum form"),
    "within-block": ([("sum", 1), ("max", 2)],
                     "W_out's gather hides behind x·W_in (half the math: T_FSDP/2 < T_math/2, the max form's "
                     "B > X·alpha/M_X), W_in's stays exposed (the sum form with half the FSDP bytes)"),
    "across-blocks": ([("max", 2)], "block i+1's gathers hide behind block i's matmuls while T_FSDP < T_math: the max "
                                    "form, B > X·alpha/M_X; each gathered matrix is also copied once into the loop "
                                    "state (HBM time, not in the question's figures)"),
}


def flags_batch(F: int, X: int, Y: int, alpha_: float, mx: int, my: int, gathers: str,
                weight_bytes: float = 2) -> float | None:
    """The overall batch above which the compiled step is compute bound under a flag set's schedule: the largest
    of the critical batches (roofline.critical_batch) its FLAGS_RULE names, with the FSDP bytes per weight scaled
    by weight_bytes/2 (int8 gathers: 1); None where one of them is never compute bound."""
    forms, _ = FLAGS_RULE[gathers]
    bs = [roofline.critical_batch(F, X, Y, alpha_, mx, my, form, weight_bytes=wb * weight_bytes / 2)
          for form, wb in forms]
    return None if None in bs else max(bs)


def axes_error(fsdp: int, tensor: int, mx: int, my: int) -> str | None:
    """Why the FSDP axis of ``fsdp`` chips spanning ``mx`` ICI axes and the TP axis of ``tensor`` chips
    spanning ``my`` cannot be laid on the question's 3D v5p torus, or None: mx + my <= 3 (TORUS_AXES), and
    an axis spans m > 1 torus axes only with at least 2 chips on each (size >= 2^m). The one rule for the
    inputs of answers() and for every mesh (d) suggests."""
    if mx + my > TORUS_AXES:
        return (f"mx={mx} and my={my} span {mx + my} ICI axes; the question's TPU v5p torus has {TORUS_AXES} "
                f"(mx + my <= {TORUS_AXES})")
    for name, size, m in (("fsdp", fsdp, mx), ("tensor", tensor, my)):
        if m > 1 and size < 2**m:
            return f"{name}={size} cannot span {m} ICI axes (each spanned axis needs at least 2 chips)"
    return None


def splits(cfg: FFNConfig, chips: int, mx: int, my: int) -> list[tuple[int, int]]:
    """The meshes X·Y = ``chips`` that answers() accepts for ``cfg`` at M_X = ``mx``, M_Y = ``my``: X a divisor
    of N, D and F divisible by their shard counts (the family's check_divisible), the axes on the torus (axes_error)."""
    out = []
    for X in (k for k in range(1, chips + 1) if chips % k == 0):
        try:
            cfg.check_divisible(MeshShape(fsdp=X, tensor=chips // X))
        except ValueError:
            continue
        if axes_error(X, chips // X, mx, my) is None:
            out.append((X, chips // X))
    return out


def _plain(x):
    """x as JSON-ready values: a result's to_json(), a dataclass's fields in order, a dict's values."""
    if hasattr(x, "to_json"):
        return x.to_json()
    if dataclasses.is_dataclass(x):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


@dataclass
class Inputs:
    """answers()' inputs, checked: D, F, L, X (fsdp), Y (tensor), M_X, M_Y, C (flops), W_ici, HBM per TPU and per
    GPU, the batch in tokens and (d)'s pipeline stages."""

    d_model: int
    d_ff: int
    blocks: int
    fsdp: int
    tensor: int
    mx: int
    my: int
    flops: float
    w_ici: float
    hbm: float
    gpu_hbm: float
    batch_tokens: int
    stages: int


@dataclass
class MemoryAnswer:
    """(a): P = 2·D·F·L, the FP32 state 16·P (scaling.step.memory.state_bytes) in GPUs of gpu_hbm, the BF16 activations
    saved for the backward, 2·(D+F)·L bytes per token, and at the batch."""

    params: int
    fp32_state_bytes: float
    bytes_per_param: int
    gpu_equivalent: float
    gpu_count: int
    activation_bytes_per_token: int
    activation_bytes_at_batch: int
    gpu_count_with_activations_at_batch: int
    batch_tokens: int


@dataclass
class ShardingAnswer:
    """(b): the least N_FSDP with 16·P/N <= HBM, and with half the activations at the batch too
    (scaling.step.memory.min_shards_for_state, min_shards_with_activations)."""

    min_n_fsdp_without_activations: int
    min_n_fsdp_with_half_activations_at_batch: int
    batch_tokens: int
    hbm: float


@dataclass
class CriticalBatch:
    """A critical batch B (roofline.critical_batch; None: never compute bound), overall, B/N and B/X."""

    overall_batch: float | None
    per_device_batch: float | None
    per_fsdp_shard_batch: float | None


@dataclass
class Split:
    """A mesh X·Y = N and the overall critical batch on it."""

    X: int
    Y: int
    overall_batch: float | None


@dataclass
class XOpt:
    """A form's threshold at X_opt = sqrt((B/F)·(M_X/M_Y)·N) (roofline.xopt_threshold_per_device, x_opt): B/N,
    overall, X_opt unconstrained, and the nearest feasible split (log scale)."""

    per_device_batch: float
    overall_batch: float
    x_opt: float
    nearest_split: Split


@dataclass
class FlagsBound:
    """Under one XLA flag set: its FSDP gathers' schedule, FLAGS_RULE's rule, flags_batch and the TP all-reduce's
    share of the math, Y·alpha/(M_Y·F) (0 without TP)."""

    gathers: str
    rule: str
    overall_batch: float | None
    tp_share_of_math: float


@dataclass
class ComputeBound:
    """(c): alpha = C/W_ici, the mesh, the critical batch of each form (``critical``, keyed by roofline.FORMS),
    under each flag set (``by_flags``), the TP limit Y < M_Y·F/alpha, the FSDP term F/(Y·M_X), and each form at
    X_opt (``x_opt``, keyed by form; to_json writes them as x_opt_<form>)."""

    alpha: float
    N: int
    X: int
    Y: int
    M_X: int
    M_Y: int
    critical: dict[str, CriticalBatch]
    recommended_form: str
    sum_form_why: str
    by_flags: dict[str, FlagsBound]
    assumed_flags: str
    tp_limit_Y: float
    fsdp_term: float
    x_opt: dict[str, XOpt]

    @property
    def tp_never_bound(self) -> bool:
        """No batch is compute bound under the sum form: the TP term grows with B as fast as the math."""
        return self.critical["sum"].overall_batch is None

    @property
    def recommended_with_flags(self) -> FlagsBound:
        """The bound under the flags production runs pass (assumed_flags)."""
        return self.by_flags[self.assumed_flags]

    def to_json(self) -> dict:
        """answer --json's "c": the forms' critical batches and x_opt_<form> as top-level keys."""
        return {"alpha": self.alpha, "N": self.N, "X": self.X, "Y": self.Y, "M_X": self.M_X, "M_Y": self.M_Y,
                **_plain(self.critical), "tp_never_bound": self.tp_never_bound,
                "recommended_form": self.recommended_form, "sum_form_why": self.sum_form_why,
                "by_flags": _plain(self.by_flags), "assumed_flags": self.assumed_flags,
                "recommended_with_flags": _plain(self.recommended_with_flags), "tp_limit_Y": self.tp_limit_Y,
                "fsdp_term": self.fsdp_term, **{f"x_opt_{form}": _plain(x) for form, x in self.x_opt.items()}}


@dataclass
class MoreAxes:
    """FSDP spread over M_X ICI axes, and the overall critical batch there."""

    M_X: int
    overall_batch: float | None


@dataclass
class Levers:
    """(d)'s levers under one form: the baseline critical batch, with int8 weight gathers, FSDP over more ICI axes
    (None: not on the torus), the best feasible split (None: none is ever compute bound) and pipeline stages of
    N/S chips with the weights gathered once per step. The scheduled form also names its flags and the TP
    all-reduce's share of the math."""

    baseline: float | None
    int8_weight_gathers: float | None
    fsdp_over_more_axes: MoreAxes | None
    best_split: Split | None
    pipeline: float | None
    pipeline_stages: int
    flags: str | None = None
    tp_share_of_math: float | None = None

    def to_json(self) -> dict:
        """The levers, with "flags" first and "tp_share_of_math" last where the form has them."""
        out = {} if self.flags is None else {"flags": self.flags}
        out.update({k: _plain(getattr(self, k)) for k in ("baseline", "int8_weight_gathers", "fsdp_over_more_axes",
                                                          "best_split", "pipeline", "pipeline_stages")})
        if self.tp_share_of_math is not None:
            out["tp_share_of_math"] = self.tp_share_of_math
        return out


@dataclass
class GatherProgram:
    """(d)'s pipeline program with the weights gathered once per microbatch or step: the closed forms' collective
    bytes per mesh axis and memory terms per device, or why the schedule does not apply (error); ``check``: the
    compiled comparison verify.check.verify_pipeline adds (a verify.report.CheckReport)."""

    collective_bytes: dict | None = None
    memory: dict | None = None
    error: str | None = None
    check: object = None

    def to_json(self) -> dict:
        """{"error"} or {"collective_bytes", "memory"}, and "check" where compiled."""
        out = {"error": self.error} if self.error is not None else {"collective_bytes": self.collective_bytes,
                                                                     "memory": self.memory}
        if self.check is not None:
            out["check"] = _plain(self.check)
        return out


@dataclass
class PipelineProgram:
    """The program behind (d)'s pipeline line (pipeline_program()): its mesh, chips, batch, microbatches, step and
    each gather mode's closed forms; ``devices``: the TPU topology verify_pipeline compiled it for."""

    mesh: str
    chips: int
    batch_tokens: int
    microbatches: int
    step: str
    gathers: dict[str, GatherProgram]
    devices: str | None = None

    def to_json(self) -> dict:
        """The fields in order, "devices" only where compiled."""
        out = {k: _plain(getattr(self, k)) for k in ("mesh", "chips", "batch_tokens", "microbatches", "step",
                                                     "gathers")}
        if self.devices is not None:
            out["devices"] = self.devices
        return out


@dataclass
class SmallerBatch:
    """(d): the levers under each form (``levers``: sum, max and scheduled), why the pipeline has the stages it
    has, its program, and pure FSDP's per-device bound alpha/M_X."""

    levers: dict[str, Levers]
    pipeline_stages_why: str
    pipeline_program: PipelineProgram
    fsdp_only_per_device: float

    def to_json(self) -> dict:
        """answer --json's "d": the forms' levers as top-level keys."""
        return {**_plain(self.levers), "pipeline_stages_why": self.pipeline_stages_why,
                "pipeline_program": _plain(self.pipeline_program), "fsdp_only_per_device": self.fsdp_only_per_device}


@dataclass
class Answers:
    """The numbers of (a)-(d) and their inputs: answers()' result."""

    inputs: Inputs
    a: MemoryAnswer
    b: ShardingAnswer
    c: ComputeBound
    d: SmallerBatch

    def to_json(self) -> dict:
        """{"inputs", "a", "b", "c", "d"}: answer --json."""
        return {k: _plain(getattr(self, k)) for k in ("inputs", "a", "b", "c", "d")}

    def render(self) -> str:
        """The derivation as text: each number with its formula, inputs and units."""
        return _render(self)


# each an input of the question (questions-4d.md), a flag of the answer command
def answers(
    d_model: int = 16384,
    d_ff: int = 53248,
    blocks: int = 126,
    fsdp: int = 16,
    tensor: int = 4,
    mx: int = 2,
    my: int = 1,
    flops: float = 4.6e14,
    w_ici: float = 1.8e11,
    hbm: float = 95e9,
    gpu_hbm: float = 80e9,
    batch_tokens: int = 25600,
    stages: int | None = None,
) -> Answers:
    """All the numbers of (a)-(d), an Answers. Raises ValueError naming any bad input. ``stages``: the pipeline
    stages of (d), which must divide ``fsdp`` (each stage takes fsdp/stages of the FSDP shards) and the
    ``blocks`` (each stage runs blocks/stages of them); None: the largest such count up to 4 (the
    usual 4 cannot split the XXL's 126 = 2·3²·7 blocks evenly, so 2) whose X/S shards per stage can still
    span the M_X ICI axes (axes_error). X·Y chips of one v5p slice: at most the hardware table's largest."""
    cfg = FFNConfig(d_model, d_ff, blocks)
    for name, v in (("fsdp", fsdp), ("tensor", tensor), ("mx", mx), ("my", my), ("batch_tokens", batch_tokens)):
        positive_int(name, v)
    for name, v in (("flops", flops), ("w_ici", w_ici), ("hbm", hbm), ("gpu_hbm", gpu_hbm)):
        positive_float(name, v)
    for name, v in (("hbm", hbm), ("gpu_hbm", gpu_hbm)):
        if v < HBM_FLOOR:
            raise ValueError(f"{name}={v:g} bytes is less than {HBM_FLOOR:.0e}: give HBM in bytes (95 GB is 95e9), at "
                             f"least {HBM_FLOOR:.0e}")
    most = CHIPS[DEFAULT_CHIP].max_slice_chips
    if fsdp * tensor > most:
        raise ValueError(f"fsdp·tensor = {fsdp}·{tensor} = {fsdp * tensor:,} chips; M_X and M_Y count the ICI "
                         f"axes of one v5p slice, which has at most {most:,} chips (fsdp·tensor <= {most:,})")
    cfg.check_divisible(MeshShape(fsdp=fsdp, tensor=tensor))
    if (why := axes_error(fsdp, tensor, mx, my)) is not None:
        raise ValueError(why)
    given_stages = stages is not None
    if stages is None:
        stages = max(k for k in range(1, QUESTION["stages"] + 1)
                     if fsdp % k == 0 and blocks % k == 0 and axes_error(fsdp // k, tensor, mx, my) is None)
    positive_int("stages", stages)
    if stages > fsdp or fsdp % stages or blocks % stages:
        valid = ", ".join(str(k) for k in range(1, fsdp + 1) if fsdp % k == 0 and blocks % k == 0)
        raise ValueError(f"stages={stages} must divide the FSDP size fsdp={fsdp} (each stage takes fsdp/stages of "
                         f"the FSDP shards) and blocks={blocks} (each runs blocks/stages of them); valid: {valid}")
    P = cfg.params
    prec = DEFAULT_PRECISION
    D, F, L, X, Y, N = d_model, d_ff, blocks, fsdp, tensor, fsdp * tensor

    # (a)
    state = memory.state_bytes(cfg, prec)
    act_tok = memory.activation_bytes_per_token(cfg, prec)
    a = MemoryAnswer(
        params=P,
        fp32_state_bytes=state,
        bytes_per_param=prec.state_bytes_per_param,
        gpu_equivalent=state / gpu_hbm,
        gpu_count=math.ceil(state / gpu_hbm),
        activation_bytes_per_token=act_tok,
        activation_bytes_at_batch=act_tok * batch_tokens,
        gpu_count_with_activations_at_batch=math.ceil((state + act_tok * batch_tokens) / gpu_hbm),
        batch_tokens=batch_tokens,
    )
    # (b)
    b = ShardingAnswer(
        min_n_fsdp_without_activations=memory.min_shards_for_state(cfg, hbm, prec),
        min_n_fsdp_with_half_activations_at_batch=memory.min_shards_with_activations(cfg, hbm, batch_tokens, 0.5,
                                                                                     prec),
        batch_tokens=batch_tokens,
        hbm=hbm,
    )
    # (c)
    al = roofline.alpha(flops, w_ici)
    critical = {}
    for form in roofline.FORMS:
        B = roofline.critical_batch(F, X, Y, al, mx, my, form)
        critical[form] = CriticalBatch(overall_batch=B, per_device_batch=None if B is None else B / N,
                                       per_fsdp_shard_batch=None if B is None else B / X)
    by_flags = {name: FlagsBound(gathers=str(fs.gathers), rule=FLAGS_RULE[fs.gathers][1],
                                 overall_batch=flags_batch(F, X, Y, al, mx, my, fs.gathers),
                                 tp_share_of_math=(Y * al / (my * F)) if Y > 1 else 0.0)
                for name, fs in FLAG_SETS.items()}
    feasible = splits(cfg, N, mx, my)  # the meshes X·Y = N this function accepts (X, Y itself among them)
    x_opt = {}
    for form in roofline.FORMS:
        per_dev = roofline.xopt_threshold_per_device(al, F, mx, my, form)
        xo = roofline.x_opt(per_dev * N, F, N, mx, my)
        Xn, Yn = min(feasible, key=lambda s: abs(math.log(s[0] / xo)))  # nearest on a log scale (X·Y = N)
        x_opt[form] = XOpt(per_device_batch=per_dev, overall_batch=per_dev * N, x_opt=xo,
                           nearest_split=Split(Xn, Yn, roofline.critical_batch(F, Xn, Yn, al, mx, my, form)))
    c = ComputeBound(alpha=al, N=N, X=X, Y=Y, M_X=mx, M_Y=my, critical=critical, recommended_form=RECOMMENDED_FORM,
                     sum_form_why=SUM_FORM_WHY, by_flags=by_flags, assumed_flags=DEFAULT_FLAGS,
                     tp_limit_Y=my * F / al,  # compute bound possible only for Y below this
                     fsdp_term=F / (Y * mx), x_opt=x_opt)
    # (d): only meshes answers() accepts
    more_axes = [m for m in range(mx + 1, TORUS_AXES + 1) if axes_error(X, Y, m, my) is None]

    def tricks(batch, **named) -> Levers:
        """(d)'s levers under one form, ``batch(X, Y, M_X, weight_bytes)`` its overall critical batch: int8
        gathers, FSDP over more ICI axes, the best split X·Y = N of the feasible ones, and pipeline stages of N/S
        chips with the weights gathered once per step (each stage: FSDP X/S, TP Y, the whole batch, so the
        threshold is the form's with X -> X/S; the bubble (S−1)/(m+S−1) not counted; training page, pipelining)."""
        by_split = [(x, y, b) for x, y in feasible if (b := batch(x, y, mx, 2)) is not None]
        split = min(by_split, key=lambda t: t[2], default=None)
        return Levers(baseline=batch(X, Y, mx, 2), int8_weight_gathers=batch(X, Y, mx, 1),
                      fsdp_over_more_axes=None if not more_axes else MoreAxes(more_axes[-1],
                                                                              batch(X, Y, more_axes[-1], 2)),
                      best_split=None if split is None else Split(*split),
                      pipeline=batch(X // stages, Y, mx, 2), pipeline_stages=stages, **named)

    levers = {form: tricks(lambda x, y, m, wb, form=form: roofline.critical_batch(F, x, y, al, m, my, form, wb))
              for form in roofline.FORMS}
    g = FLAG_SETS[DEFAULT_FLAGS].gathers  # and under the schedule of the flags production runs pass
    levers["scheduled"] = tricks(lambda x, y, m, wb: flags_batch(F, x, y, al, m, my, g, wb), flags=DEFAULT_FLAGS,
                                 tp_share_of_math=by_flags[DEFAULT_FLAGS].tp_share_of_math)
    thin = [k for k in range(stages + 1, QUESTION["stages"] + 1) if X % k == 0 and L % k == 0]  # too few X/k for M_X
    why = f"{stages} stages, as given" if given_stages else (
        f"{stages} stages: the largest count up to {QUESTION['stages']} that divides both the FSDP size X = {X} and "
        f"the {L} blocks"
        + (f" ({QUESTION['stages']} cannot split {L} blocks evenly)" if L % QUESTION["stages"] else "")
        + (f" and leaves each stage FSDP shards enough to span M_X = {mx} ICI axes ({thin[-1]} stages would leave "
           f"X/{thin[-1]} = {X // thin[-1]})" if thin else ""))
    d = SmallerBatch(levers=levers, pipeline_stages_why=why,
                     pipeline_program=pipeline_program(cfg, X, Y, stages, batch_tokens),
                     fsdp_only_per_device=al / mx)  # pure FSDP: B/X > alpha/M_X
    inputs = Inputs(d_model=D, d_ff=F, blocks=L, fsdp=X, tensor=Y, mx=mx, my=my, flops=flops, w_ici=w_ici, hbm=hbm,
                    gpu_hbm=gpu_hbm, batch_tokens=batch_tokens, stages=stages)
    return Answers(inputs, a, b, c, d)


PIPELINE_MICROBATCHES = 4  # the (d) pipeline program's microbatches: M >= S keeps every stage busy


def pipeline_program(cfg: FFNConfig, fsdp: int, tensor: int, stages: int, batch_tokens: int) -> PipelineProgram:
    """The program behind (d)'s pipeline line, as ``python -m scaling answer --verify-pipeline`` compiles
    it: the forward step of ``cfg`` on the question's N = X·Y v5p chips as ``stages`` stages of
    fsdp = X/S, tensor = Y, M microbatches, the weights gathered once per step (fsdp_gather="step") or
    once per microbatch. For each, the closed forms (scaling.step.program.predict): collective bytes per mesh
    axis and the memory per device, terms and total. Gathered once per step, a stage gathers its L/S
    blocks' BF16 weights once (fsdp bytes 2·(2·D·F/Y)·L/S), against T·L/S times with
    T = M + S − 1 pipeline iterations per microbatch gather; the price is holding them all."""
    mesh = MeshShape(stage=stages, fsdp=fsdp // stages, tensor=tensor)
    M = PIPELINE_MICROBATCHES
    gathers = {}
    for gather in FSDP_GATHERS:
        sched = Schedule(M, 1, gather)
        try:
            sched.check(cfg, mesh, batch_tokens)
        except ValueError as e:
            gathers[gather] = GatherProgram(error=str(e))
            continue
        p = program.predict(Workload(cfg, mesh, batch_tokens, "forward", schedule=sched))
        gathers[gather] = GatherProgram(collective_bytes=p.collective_bytes, memory=p.memory)
    return PipelineProgram(mesh=",".join(f"{a}={n}" for a, n in mesh.items() if n > 1), chips=fsdp * tensor,
                           batch_tokens=batch_tokens, microbatches=M, step="forward", gathers=gathers)


def model_name(inputs: Inputs) -> str:
    """How the text names the model of ``inputs`` (answers().inputs): "the XXL" (the question's), a preset
    of the same dimensions, or its D, F, L."""
    cfg = FFNConfig(inputs.d_model, inputs.d_ff, inputs.blocks)
    name = next((k for k, v in PRESETS.items() if v == cfg), None)
    dims = f"D={cfg.d_model:,}, F={cfg.d_ff:,}, L={cfg.blocks}"
    return "the XXL" if name == "xxl" else f"the {name} preset ({dims})" if name else f"the FFN stack {dims}"


# answers()' inputs that are the question's constants, and the flag of `python -m scaling answer` that sets each
CONSTANT_FLAGS = {"flops": "--flops", "w_ici": "--w-ici", "hbm": "--hbm", "gpu_hbm": "--gpu-hbm"}


def _gpus(n: int) -> str:
    return f"{n:,} GPU" + ("" if n == 1 else "s")


def _k(x) -> str:
    if x is None:
        return "none (never compute bound)"
    return "any batch (no FSDP weight gathers)" if x == 0 else f"{x:,.0f} tokens ({x / 1e3:.1f}k)"


# the answer's text, section by section in the question's order
def _render(ans: Answers) -> str:
    """The derivation as text: each number with its formula, inputs and units (Answers.render)."""
    i, a, b, c, d = ans.inputs, ans.a, ans.b, ans.c, ans.d
    D, F, L, X, Y, N = i.d_model, i.d_ff, i.blocks, i.fsdp, i.tensor, c.N
    B0 = i.batch_tokens
    out = []
    w = out.append
    w(f"Model: D={D:,}  F={F:,}  L={L} blocks of two bias-free linears (D->F->D).")
    v5p = CHIPS[DEFAULT_CHIP]
    table = (f"(python -m scaling plan and check use the hardware table: v5p C = {v5p.bf16_flops:.3g}, "
             f"{v5p.hbm_budget / 1e9:.4g} GB usable of {v5p.hbm_bytes / 1e9:.4g} GB.)")
    given = {k: f for k, f in CONSTANT_FLAGS.items() if getattr(i, k) != QUESTION[k]}
    gpu = "GPU" if "gpu_hbm" in given else "H100"
    if not given:
        w(f"Constants (the question's, not the hardware table's): C = {i.flops:.3g} bf16 FLOP/s and W_ici = "
          f"{i.w_ici:.3g} B/s per chip (TPU v5p as the Scaling Book rounds it),")
        w(f"  {i.hbm / 1e9:g} GB HBM per v5p, {i.gpu_hbm / 1e9:g} GB per H100. " + table)
    else:
        src = {k: f"given by {given[k]}" if k in given else "the question's" for k in CONSTANT_FLAGS}
        w(f"Constants: C = {i.flops:.3g} bf16 FLOP/s ({src['flops']}) and W_ici = {i.w_ici:.3g} B/s per chip "
          f"({src['w_ici']}); the question's are TPU v5p's as the Scaling Book rounds them,")
        w(f"  {i.hbm / 1e9:g} GB HBM per {'TPU' if 'hbm' in given else 'v5p'} ({src['hbm']}), "
          f"{i.gpu_hbm / 1e9:g} GB per {gpu} ({src['gpu_hbm']}). " + table)
    w("")
    w("(a) Memory on one device")
    w(f"  P = 2·D·F·L = 2·{D}·{F}·{L} = {a.params:,} parameters")
    w(f"  FP32 master + FP32 grads + 2 FP32 Adam moments = 4+4+8 = {a.bytes_per_param} bytes/param")
    w(f"  state = 16·P = {a.fp32_state_bytes:.4e} bytes = {a.fp32_state_bytes / 1e12:.3f} TB")
    w(f"  = {a.gpu_equivalent:.2f} {gpu}s of {i.gpu_hbm / 1e9:g} GB -> {_gpus(a.gpu_count)} (state alone)")
    w("  activations saved for backward (BF16, no remat): each block keeps its input (D) and hidden (F)")
    w(f"  = 2·(D+F)·L = 2·({D}+{F})·{L} = {a.activation_bytes_per_token:,} bytes per token")
    w(f"  at B = {B0:,} tokens (a batch the question does not state; --batch-tokens): "
      f"{a.activation_bytes_at_batch / 1e9:,.1f} GB; "
      f"state + activations = {_gpus(a.gpu_count_with_activations_at_batch)}")
    w("")
    w("(b) Sharding state and half the activations over N_FSDP devices")
    w("  M(N) = [16·P + (1/2)·2·(D+F)·L·B] / N  bytes per device   (B tokens in the global batch)")
    w(f"  without activations: 16·P/N <= {i.hbm / 1e9:g} GB  =>  N >= {a.fp32_state_bytes:.4e}/{i.hbm:.3g}"
      f" = {a.fp32_state_bytes / i.hbm:.2f}  =>  N_FSDP >= {b.min_n_fsdp_without_activations}")
    w(f"  with half the activations at B = {B0:,} tokens (not stated by the question; --batch-tokens): "
      f"N_FSDP >= {b.min_n_fsdp_with_half_activations_at_batch}")
    w("")
    w("(c) Forward pass, FSDP+TP: when is it compute bound?")
    w(f"  alpha = C/W_ici = {i.flops:.3g}/{i.w_ici:.3g} = {c.alpha:.1f} FLOPs/byte")
    w(f"  X={X} (FSDP), Y={Y} (TP), N=X·Y={N}, M_X={c.M_X}, M_Y={c.M_Y}")
    w("  per block: T_math = 4BDF/(N·C), T_FSDP = 4DF/(Y·M_X·W_ici), T_TP = 4BD/(X·M_Y·W_ici)")
    if c.tp_never_bound:
        w(f"  The TP term alone grows with B as fast as the math: Y={Y} >= M_Y·F/alpha = {c.tp_limit_Y:.1f}, "
          "so no batch makes this mesh compute bound.")
    else:
        w("  sum form (spring-2025 text: T_FSDP + T_TP < T_math):")
        w("    F/(Y·M_X) + B/(X·M_Y) < B·F/(N·alpha)  =>  B > [F/(Y·M_X)] / [F/(N·alpha) - 1/(X·M_Y)]")
        w(f"    = {c.fsdp_term:.0f} / ({F / (N * c.alpha):.5f} - {1 / (X * c.M_Y):.5f})")
        w(f"    overall B > {_k(c.critical['sum'].overall_batch)}")
        w(f"    B/N (per chip, the book's convention) > {c.critical['sum'].per_device_batch:.0f};"
          f"  B/X (per FSDP shard) > {c.critical['sum'].per_fsdp_shard_batch:.0f}")
        w("  max form (August-2025 text: max(T_FSDP, T_TP) < T_math, the two overlap):")
        w(f"    F/(Y·M_X) < B·F/(N·alpha)  =>  B > N·alpha/(Y·M_X) = X·alpha/M_X;  TP holds since "
          f"1/(X·M_Y) = {1 / (X * c.M_Y):.4f} < F/(N·alpha) = {F / (N * c.alpha):.4f}")
        w(f"    overall B > {_k(c.critical['max'].overall_batch)}")
        w(f"    B/N > {c.critical['max'].per_device_batch:.0f};  B/X > {c.critical['max'].per_fsdp_shard_batch:.0f}")
    if not c.tp_never_bound:
        w(f"  The sum form's {_k(c.critical['sum'].overall_batch)} is what libtpu's default flags give: "
          + c.sum_form_why + ".")
        w(f"  The max form's {_k(c.critical['max'].overall_batch)} holds only where the two communications overlap.")
    w("  What the compiled program supports under each XLA flag set (scaling/data/xla_flags.toml; jax-scaling check "
      "--xla-flags NAME shows the schedule):")
    for name, e in c.by_flags.items():
        w(f"    {name:<8} overall B > {_k(e.overall_batch)}: {e.rule}")
    e = c.recommended_with_flags
    w(f"  Recommended: the scheduled form under the flags production runs pass ({c.assumed_flags!r}, MaxText's "
      f"v5p scripts), overall B > {_k(e.overall_batch)} (below it the hidden gathers outlast the matmuls they "
      f"hide behind); the TP all-reduce stays exposed under every set, Y·alpha/(M_Y·F) = "
      f"{e.tp_share_of_math:.1%} of the math at any batch.")
    for form, k in (("sum", 4), ("max", 1)):
        xo, s = c.x_opt[form], c.x_opt[form].nearest_split
        off = (f": more than the N = {N} chips" if xo.x_opt > N else ": less than 1 chip" if xo.x_opt < 1 else "")
        w(f"  at X_opt = sqrt((B/F)·(M_X/M_Y)·N) instead of the given X ({form} form): "
          f"B/N > {k}·alpha²/(M_X·M_Y·F) = {xo.per_device_batch:.0f}, overall {_k(xo.overall_batch)} "
          f"(X_opt = {xo.x_opt:.1f} unconstrained"
          f"{off}; the nearest mesh of X·Y = {N} chips: X={s.X}, Y={s.Y}, overall B > {_k(s.overall_batch)})")
    w("")
    w("(d) Smaller batch, never communication bound: what helps (overall batch thresholds, this mesh)")
    for form in (*roofline.FORMS, "scheduled"):
        e = d.levers[form]
        w(f"  [{form} form{', XLA flags ' + repr(e.flags) if form == Form.SCHEDULED else ''}]  baseline "
          f"{_k(e.baseline)}")
        w("    int8 weight all-gathers (FSDP bytes halved: 2DF instead of 4DF per block): "
          f"{_k(e.int8_weight_gathers)}")
        if e.fsdp_over_more_axes is not None:
            m = e.fsdp_over_more_axes.M_X
            w(f"    FSDP spread over {m} ICI axes (M_X={m}, M_Y={c.M_Y}: more links per gather): "
              f"{_k(e.fsdp_over_more_axes.overall_batch)}")
        else:
            w(f"    FSDP over more ICI axes (M_X={c.M_X + 1}): not on this torus: "
              + axes_error(X, Y, c.M_X + 1, c.M_Y))
        if e.best_split:
            s = e.best_split
            w(f"    re-split the same {N} chips near X_opt: X={s.X}, Y={s.Y}: {_k(s.overall_batch)}")
        S = e.pipeline_stages
        if S > 1:
            w(f"    {S} pipeline stages of N/{S} chips (FSDP X/{S} = {X // S} per stage, M_X kept), "
              f"weights gathered once per step: {_k(e.pipeline)} "
              f"(plus the bubble (S-1)/(m+S-1) of the step with m microbatches)")
        if form == Form.SCHEDULED:
            w(f"    under every set the TP all-reduce stays exposed, {e.tp_share_of_math:.1%} of the math at any "
              "batch: fewer tensor shards (a smaller Y) is what lowers it")
    if i.stages > 1:
        pp = d.pipeline_program
        w(f"  Pipeline: {d.pipeline_stages_why}. The program it names: the forward step on {pp.chips} chips as "
          f"{pp.mesh}, M = {pp.microbatches} microbatches, B = {pp.batch_tokens:,}; closed forms per device:")
        for gather, g in pp.gathers.items():
            if g.error is not None:
                w(f"    weights gathered once per {gather}: {g.error}")
                continue
            axes = ", ".join(f"{a} {v / 1e9:.3g} GB" for a, v in g.collective_bytes.items())
            w(f"    weights gathered once per {gather}: collectives {axes}; memory {g.memory['total'] / 1e9:.3g} GB")
        w("    compiled beside these (v5p, ahead of time): python -m scaling answer --verify-pipeline")
    w("  Why: the FSDP term F/(Y·M_X) is a fixed cost per block that the batch must amortise; halving its bytes")
    w("  (int8/fp8 gathers), spreading it over more links (M_X), overlapping it with the TP term (max form:")
    w(f"  {_k(d.levers['max'].baseline)} vs {_k(d.levers['sum'].baseline)}), or cutting the FSDP group that shares a")
    w("  weight gather (pipeline stages, a smaller X at X_opt) all lower the batch at which the math hides it.")
    w("  Data parallelism across slices does not help: it multiplies the batch by the number of replicas, and")
    w(f"  pure FSDP alone needs B/X > alpha/M_X = {d.fsdp_only_per_device:.0f} tokens per chip.")
    w("  Sources: Scaling Book, training page (FSDP+TP rooflines, X_opt, both text versions), sharding page")
    w("  (collective times), applied-training page (pipelining).")
    return "\n".join(out)
