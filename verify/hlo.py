"""Reading a compiled XLA program: matmul FLOPs, collectives and memory, with loop trip counts.

Why: XLA's ``cost_analysis()`` counts a while-loop body (``lax.scan``, ``nnx.scan``) once, not once
per trip, and reports no collectives. So the compiled program's text (``compiled.as_text()``) is
parsed here, as plain text, and every dot/convolution and every collective is multiplied by the
trip counts of the while loops around it.

What is parsed (verified on jax 0.10.2 / libtpu 0.0.42.1, CPU and TPU v5p HLO):
- computations (``%name (...) -> ... {`` ... ``}``, ``ENTRY`` marks the entry) and their
  instructions ``[ROOT] %name = SHAPE opcode(operands), attributes``;
- calls between computations: any ``key=%comp`` or ``key={%a, %b}`` attribute (while
  ``condition=``/``body=``, fusion ``calls=``, ``to_apply=``, conditional branches, async-start
  ``calls=``). A computation's multiplier is the sum over its call sites of the caller's
  multiplier, times the trip count where the call site is a while loop's body or condition
  (each branch of a conditional counts as taken; async-done is not a second call);
- while trip counts: ``backend_config={..."known_trip_count":{"n":"5"}}`` (CPU), else the bound in
  the condition ``compare(iv, constant(n)), direction=LT`` (TPU; also through a wrapped
  compare fusion), minus the loop's initial induction value when that is a constant, divided by
  the constant the body adds to it (TPU's windowed-einsum loops are unrolled twice: step 2);
- replica groups in three spellings: ``{{0,1},{2,3}}``, iota ``[4,2]<=[4,2]T(1,0)``, and
  ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`` (a mesh the compiler made, with its own axis names and
  optional ``device_ids=(...)`` and sub-axes ``'a':(1)2``); ``source_target_pairs`` for permutes.
  Group members are partition ids, numbered row-major over the user's mesh (jit's device
  assignment is ``mesh.devices.flat``), so ``numpy.unravel_index`` gives their mesh coordinates.

This module imports numpy and the kinds (scaling.core.kinds: COLLECTIVE_KINDS's values are
collective kinds) only; it never imports jax (``read_compiled`` only calls methods on the
compiled object it is given).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from scaling.core.kinds import Collective as CollectiveKind

COLLECTIVE_KINDS = {"all-gather": "all-gather", "reduce-scatter": "reduce-scatter", "all-reduce": "all-reduce",
                    "all-to-all": "all-to-all", "ragged-all-to-all": "all-to-all",
                    "collective-permute": "collective-permute"}
_PASS_THROUGH = {"convert", "bitcast", "copy", "transpose", "reshape", "fusion"}
# what a program launches, by kind (HloProgram.kernels); the opcodes that launch nothing of their own, and the call
# sites whose computations run as kernels of their own (HloProgram.launching)
KERNEL_KINDS = ("gemm", "attention", "fusion", "collective", "copy", "other")
_NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "partition-id", "replica-id",
              "after-all", "opt-barrier", "async-update", "add-dependency", "iota"}
_CONTROL = {"while", "call", "conditional", "async-start", "call-start"}
_GEMM_CALL = re.compile(r"gemm|matmul", re.I)  # cuBLAS and cuBLASLt custom-call targets
_ATTENTION_CALL = re.compile(r"fmha|attention|flash|splash", re.I)  # cuDNN's fused attention, Pallas kernels
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_NAME = re.compile(r"%([\w.\-]+)")


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of an HLO element type: the bit width in its name / 8 (bf16 -> 2, f8e4m3fn
    -> 1, s4 -> 0.5, c64 -> 8); pred -> 1; token and other non-numeric types -> 0."""
    if dtype == "pred":
        return 1.0
    m = re.match(r"[a-z]+(\d+)", dtype)
    return int(m.group(1)) / 8 if m else 0.0


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """The (dtype, dims) of every array in an HLO shape string; a tuple shape gives several.
    Layouts (``{1,0:T(8,128)(2,1)}``) and ``/*index=5*/`` comments are skipped."""
    return [(dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _ARRAY.findall(shape)]


def shape_bytes(shape: str) -> float:
    """Total bytes of an HLO shape string (tuple parts summed)."""
    return sum(dtype_bytes(dt) * math.prod(dims) for dt, dims in arrays(shape))


def _close(s: str, i: int) -> int:
    """Index just past the bracket that closes the one at s[i] (any of (), [], {} nest)."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "([{":
            depth += 1
        elif s[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(s)


def _split_top(s: str) -> list[str]:
    """Split on commas that are outside any brackets."""
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:j])
            start = j + 1
    parts.append(s[start:])
    return [p.strip() for p in parts if p.strip()]


@dataclass
class Instruction:
    """One HLO instruction: ``[ROOT] %name = shape opcode(args), attrs``. ``operands`` are the
    operand names; ``inline_shapes`` the operand shapes where printed inline (else None)."""
    name: str
    shape: str
    opcode: str
    args: str
    attrs: str
    computation: str
    operands: list[str] = field(default_factory=list)
    inline_shapes: list[str | None] = field(default_factory=list)
    is_root: bool = False


@dataclass
class Computation:
    name: str
    instructions: list[Instruction] = field(default_factory=list)
    is_entry: bool = False

    @property
    def root(self) -> Instruction | None:
        return next((i for i in self.instructions if i.is_root), self.instructions[-1] if self.instructions else None)


@dataclass
class Collective:
    """One collective as the program runs it, per device. ``volume`` is the Scaling Book's V, the
    full array the collective spans on each device; ``count`` is how many times it runs (loop trip
    counts); ``async_`` is True for start/done pairs and async-start wrappers; ``overlapped`` where the
    schedule runs a matmul while it is in flight (HloProgram.overlaps)."""
    kind: str
    dtype: str
    operand_bytes: float
    result_bytes: float
    group_size: int
    axes: tuple[str, ...]
    count: float
    name: str
    async_: bool = False
    note: str = ""
    overlapped: bool = False

    @property
    def volume(self) -> float:
        """V: all-gather -> result bytes (the gathered array); every other kind -> operand bytes."""
        return self.result_bytes if self.kind == CollectiveKind.ALL_GATHER else self.operand_bytes


class HloProgram:
    """A parsed HLO module: ``computations`` (name -> Computation), ``instructions`` (name ->
    Instruction, module-wide: HLO names are unique in a module), ``multiplier`` (computation name
    -> how many times it runs per program execution) and ``trip_counts`` (while name ->
    (trips, source) with source "known_trip_count", "condition" or "unknown"; unknown counts as 1)."""

    def __init__(self, computations: dict[str, Computation], num_partitions: int | None = None):
        self.computations = computations
        self.num_partitions = num_partitions  # from the HloModule line; None if not printed
        self.instructions = {i.name: i for c in computations.values() for i in c.instructions}
        self.position = {i.name: k for c in computations.values() for k, i in enumerate(c.instructions)}
        self.entry = next((c.name for c in computations.values() if c.is_entry), None)
        self.users: dict[str, list[Instruction]] = {}
        for ins in self.instructions.values():
            for op in ins.operands:
                self.users.setdefault(op, []).append(ins)
        self.callers: dict[str, list[tuple[Instruction, str]]] = {}  # computation -> [(call site, attr key)]
        for ins in self.instructions.values():
            for key, callee in _callees(ins.attrs):
                if callee in computations and ins.opcode not in ("async-done", "async-update"):  # run once, at start
                    self.callers.setdefault(callee, []).append((ins, key))
        self.trip_counts = {i.name: self._trip_count(i) for i in self.instructions.values() if i.opcode == "while"}
        self.multiplier: dict[str, float] = {}
        for name in computations:
            self._mult(name)
        # computations that run asynchronously: async-start's, and call-start's (TPU7x runs collectives on
        # its SparseCores: call-start(...), async_execution_thread="sparsecore")
        self.async_computations = {c for c, sites in self.callers.items()
                                   if any(s.opcode in ("async-start", "call-start") for s, _ in sites)}

    # --- structure -------------------------------------------------------------------------
    def _mult(self, comp: str) -> float:
        """Runs of ``comp`` per program run: 1 for the entry, else the sum over its call sites of
        the caller's runs, times the trip count at a while's body/condition. 0 if never called."""
        if comp not in self.multiplier:
            self.multiplier[comp] = 0.0  # guards against cycles, which valid HLO does not have
            if comp == self.entry:
                total = 1.0
            else:
                total = 0.0
                for site, key in self.callers.get(comp, []):
                    factor = (self.trip_counts[site.name][0]
                              if site.opcode == "while" and key in ("body", "condition") else 1)
                    total += self._mult(site.computation) * factor
            self.multiplier[comp] = total
        return self.multiplier[comp]

    def operand_shape(self, ins: Instruction, k: int) -> str:
        """Shape of operand k: printed inline, else that of the instruction it names."""
        s = ins.inline_shapes[k] if k < len(ins.inline_shapes) else None
        if s is None and ins.operands[k] not in self.instructions:
            raise ValueError(f"HLO: operand %{ins.operands[k]} of %{ins.name} is not defined in the module")
        return s if s is not None else self.instructions[ins.operands[k]].shape

    def _const(self, name: str, depth: int = 0) -> int | None:
        """The integer value of ``name`` if it is a scalar constant, seen through copies, bitcasts,
        converts and fusion parameters (mapped to the fusion's operands)."""
        ins = self.instructions.get(name)
        if ins is None or depth > 8:
            return None
        if ins.opcode == "constant":
            try:
                return int(ins.args.strip())
            except ValueError:
                return None
        if ins.opcode in ("copy", "bitcast", "convert") and ins.operands:
            return self._const(ins.operands[0], depth + 1)
        if ins.opcode == "parameter":
            sites = [s for s, _ in self.callers.get(ins.computation, []) if s.opcode == "fusion"]
            if len(sites) == 1:
                return self._const(sites[0].operands[int(ins.args)], depth + 1)
        return None

    def _trip_count(self, loop: Instruction) -> tuple[int, str]:
        """Trips of a while loop: backend_config known_trip_count (CPU), else from the condition's
        ``compare(iv, constant(n)), direction=LT`` (LE: n+1; GT/GE with the constant on the left):
        ceil((n - init) / step), where init is the induction variable's constant in the loop's init
        tuple (0 when not a constant: lax.scan starts at 0) and step the constant the body adds to it
        (1 when not read; TPU's windowed-einsum loops are unrolled twice and step by 2)."""
        m = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attrs)
        if m:
            return int(m.group(1)), "known_trip_count"
        cond = dict(_callees(loop.attrs)).get("condition")
        root = self.computations[cond].root if cond in self.computations else None
        if root is not None and root.opcode == "fusion":
            sub = dict(_callees(root.attrs)).get("calls")
            root = self.computations[sub].root if sub in self.computations else None
        if root is None or root.opcode != "compare" or len(root.operands) != 2:
            return 1, "unknown"
        direction = (re.search(r"direction=(\w+)", root.attrs) or [None, ""])[1]
        a, b = (self._const(o) for o in root.operands)
        if direction in ("LT", "LE") and b is not None:
            n, iv = b + (direction == "LE"), root.operands[0]
        elif direction in ("GT", "GE") and a is not None:
            n, iv = a + (direction == "GE"), root.operands[1]
        else:
            return 1, "unknown"
        k = self._iv_index(iv)
        init, step = self._init_value(loop, k), self._step(loop, k)
        return max(-(-(n - init) // step), 0), "condition"

    def _iv_index(self, iv: str) -> int | None:
        """Tuple index of the loop state that the condition compares: ``get-tuple-element(param),
        index=k``, seen through a wrapped compare fusion's parameter."""
        ins = self.instructions.get(iv)
        if ins is not None and ins.opcode == "parameter":  # iv passed into a wrapped compare fusion
            sites = [s for s, _ in self.callers.get(ins.computation, []) if s.opcode == "fusion"]
            ins = self.instructions.get(sites[0].operands[int(ins.args)]) if len(sites) == 1 else None
        m = re.search(r"index=(\d+)", ins.attrs) if ins is not None and ins.opcode == "get-tuple-element" else None
        return int(m.group(1)) if m else None

    def _init_value(self, loop: Instruction, k: int | None) -> int:
        """Initial value of loop-state element k: the constant at index k of the while's init
        tuple; 0 when it cannot be read (lax.scan starts at 0)."""
        init = self.instructions.get(loop.operands[0]) if loop.operands else None
        if k is not None and init is not None and init.opcode == "tuple" and k < len(init.operands):
            v = self._const(init.operands[k])
            return v if v is not None else 0
        return 0

    def _step(self, loop: Instruction, k: int | None) -> int:
        """What the body adds to loop-state element k per trip: the body's root tuple holds
        ``add(get-tuple-element(param, index=k), constant(s))`` at index k (the element seen through
        copies, bitcasts and converts) -> s; else 1."""
        body = self.computations.get(dict(_callees(loop.attrs)).get("body"))
        root = body.root if body is not None else None
        if k is None or root is None or root.opcode != "tuple" or k >= len(root.operands):
            return 1
        upd = self.instructions.get(root.operands[k])
        if upd is None or upd.opcode != "add" or len(upd.operands) != 2:
            return 1
        for x, y in (upd.operands, upd.operands[::-1]):
            src, s = self.instructions.get(x), self._const(y)
            while src is not None and src.opcode in ("copy", "bitcast", "convert") and src.operands:
                src = self.instructions.get(src.operands[0])
            if (src is not None and src.opcode == "get-tuple-element" and re.search(rf"index={k}\b", src.attrs)
                    and s and s > 0):
                return s
        return 1

    def windowed_einsum_loops(self, kind: str = "rs") -> list[str]:
        """While loops that XLA's SPMD partitioner made for a windowed einsum (a matmul split into
        chunks that travel a ring as collective-permutes, overlapping the collective with the
        math): body computations named ``windowed_dot_general_body_<kind>`` (``rs``: the matmul's
        result is reduce-scattered; ``ag``: an operand is all-gathered)."""
        return [name for name in self.trip_counts
                if f"windowed_dot_general_body_{kind}" in dict(_callees(self.instructions[name].attrs)).get("body", "")]

    # --- FLOPs -------------------------------------------------------------------------------
    def dot_flops(self) -> float:
        """Sum over dot and convolution instructions of their FLOPs times their computation's
        multiplier. dot: 2 x prod(result dims) x prod(lhs contracting dims). convolution: see
        ``conv_flops``."""
        total = 0.0
        for comp in self.computations.values():
            m = self.multiplier.get(comp.name, 0.0)
            for ins in comp.instructions:
                if m and ins.opcode == "dot":
                    total += m * self.dot_instruction_flops(ins)
                elif m and ins.opcode == "convolution":
                    total += m * self.conv_flops(ins)
        return total

    def dot_instruction_flops(self, ins: Instruction) -> float:
        """2 x prod(result dims) x prod(sizes of the lhs contracting dims)."""
        out = arrays(ins.shape)[0][1]
        lhs = arrays(self.operand_shape(ins, 0))[0][1]
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs)
        k = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 1
        return 2.0 * math.prod(out) * k

    def conv_flops(self, ins: Instruction) -> float:
        """2 x (output elements / output spatial elements) x kernel input features x the number of
        (output position, window position) pairs that land on real input, per spatial dim.

        TPU prints matmuls as convolutions: ``dim_labels=bf_io->bf`` (no spatial dims) gives
        2 x prod(out) x i. A batched matmul may appear as a spatial dim with a window and
        ``lhs_dilate`` (e.g. ``window={size=4 stride=3 lhs_dilate=4}, dim_labels=0bf_0io->0bf``):
        only taps that hit an undilated, unpadded input element count, as in XLA's HloCostAnalysis.
        The kernel's ``i`` is already input features / feature_group_count; with batch_group_count
        the output batch is already divided, so the same formula holds for grouped convolutions."""
        out = arrays(ins.shape)[0][1]
        lhs = arrays(self.operand_shape(ins, 0))[0][1]
        rhs = arrays(self.operand_shape(ins, 1))[0][1]
        m = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attrs)
        if not m:
            return 0.0
        lhs_l, rhs_l, out_l = m.groups()
        flops = 2.0 * math.prod(out) * rhs[rhs_l.index("i")]
        spatial = sorted(ch for ch in rhs_l if ch.isdigit())
        win = _window(ins.attrs, len(spatial))
        for k, ch in enumerate(spatial):
            n_in, n_out, size = lhs[lhs_l.index(ch)], out[out_l.index(ch)], rhs[rhs_l.index(ch)]
            stride, (lo, _), ld, rd = win["stride"][k], win["pad"][k], win["lhs_dilate"][k], win["rhs_dilate"][k]
            pos = np.arange(n_out)[:, None] * stride + np.arange(size)[None, :] * rd - lo
            taps = np.count_nonzero((pos >= 0) & (pos <= (n_in - 1) * ld) & (pos % ld == 0))
            flops *= taps / n_out
        return flops

    # --- collectives ---------------------------------------------------------------------------
    def collectives(self, mesh_axes: dict[str, int]) -> list[Collective]:
        """Every collective in the program, once per instruction (async start/done pairs once, at
        the start), with its mesh axes and count (the multiplier of its computation). A full-size
        all-reduce whose result is dynamic-sliced to 1/group_size by partition id is reported as the
        reduce-scatter it implements.

        XLA:TPU (v5e) overlaps a collective with a matmul by cloning the instruction into the fusions of
        one asynchronous collective: a start fusion (root custom-call AsyncCollectiveStart), continuation
        fusions and a done fusion (AsyncCollectiveDone). The clones share the instruction's channel_id:
        collectives inside fusion computations that share a channel_id are counted once (the start
        fusion's copy), as asynchronous. (A channel_id alone is not unique: XLA:CPU gives a ppermute and
        its transpose in the backward loop the same one.) A collective over groups of one device moves
        nothing and is left out (XLA:CPU keeps such all-reduces in the transformer's backward)."""
        sizes = tuple(int(s) for s in mesh_axes.values())
        names = tuple(mesh_axes)
        n_dev = math.prod(sizes)
        if self.num_partitions not in (None, n_dev):
            raise ValueError(f"mesh_axes {mesh_axes} has {n_dev} devices but the program has "
                             f"num_partitions={self.num_partitions}; pass the mesh it was compiled for")
        done_of = {i.operands[0]: i for i in self.instructions.values() if i.opcode.endswith("-done") and i.operands}
        out, by_channel = [], {}
        for comp in self.computations.values():
            for ins in comp.instructions:
                op, is_async = ins.opcode, comp.name in self.async_computations
                if op.endswith("-start"):
                    op, is_async = op[: -len("-start")], True
                kind = COLLECTIVE_KINDS.get(op)
                if kind is None:
                    continue
                n_ops = len(ins.operands)
                operand_shapes = [self.operand_shape(ins, k) for k in range(n_ops)]
                if ins.opcode.endswith("-start"):
                    if ins.name in done_of:
                        result = arrays(done_of[ins.name].shape)
                    else:  # the start's tuple holds (operands..., results..., u32 contexts)
                        result = [a for a in arrays(ins.shape)[n_ops:] if a[1]]
                else:
                    result = arrays(ins.shape)
                operand_bytes = sum(shape_bytes(s) for s in operand_shapes)
                result_bytes = sum(dtype_bytes(dt) * math.prod(d) for dt, d in result)
                if kind == CollectiveKind.COLLECTIVE_PERMUTE:
                    groups = _source_target_pairs(ins.attrs)
                else:
                    groups = replica_groups(ins.attrs, n_dev)
                axes, group_size = _axes_of(groups, sizes, names, kind == CollectiveKind.COLLECTIVE_PERMUTE)
                if group_size == 1 and kind != CollectiveKind.COLLECTIVE_PERMUTE:
                    continue  # groups of one device: no data moves (XLA:CPU leaves such all-reduces in)
                c = Collective(kind=kind, dtype=(result or arrays(ins.shape))[0][0], operand_bytes=operand_bytes,
                               result_bytes=result_bytes, group_size=group_size, axes=axes,
                               count=self.multiplier.get(comp.name, 0.0), name=ins.name, async_=is_async)
                if kind == CollectiveKind.ALL_REDUCE and group_size > 1 and len(result) == 1:
                    sliced = self._sliced_elements(ins.name, math.prod(result[0][1]) // group_size)
                    if sliced:
                        c.kind, c.result_bytes = "reduce-scatter", dtype_bytes(c.dtype) * sliced
                        c.note = ("all-reduce followed by a dynamic-slice by partition id: "
                                  "the reduce-scatter it implements")
                channel = re.search(r"\bchannel_id=(\d+)", ins.attrs)
                sites = self.callers.get(comp.name, [])
                if channel and sites and all(site.opcode == "fusion" for site, _ in sites):
                    # one collective's clones are fused into one computation's schedule; a copy of the same
                    # channel called from another computation is another run (a loop's peeled trip: XLA:TPU peels
                    # the layer loops of an offloading remat policy, the copy in the entry, the loop's in its body)
                    # the clones are of one opcode and shape: XLA:TPU gives every collective of a manual shard_map
                    # one channel_id (1), so that a channel alone mixes an asynchronous collective's clones with
                    # collectives of their own (the dropless layer's expert gradients, psums, beside an all-gather)
                    callers = tuple(sorted({site.computation for site, _ in sites}))
                    dims = tuple(d for _, d in arrays(ins.shape))  # the clones' layouts differ (memory space S(1))
                    by_channel.setdefault((channel.group(1), callers, op, dims), []).append((comp, c))
                out.append(c)
        # one asynchronous collective's clones: a start fusion (root AsyncCollectiveStart), continuations and a done
        # fusion, or fusions called one on another's output; fusions of one channel, opcode and shape otherwise are
        # collectives of their own
        by_channel = {k: v for k, v in by_channel.items() if self._one_collective(v)}
        for clones in by_channel.values():
            if len(clones) > 1:  # one asynchronous collective, cloned into its fusions: keep the start's
                keep = next((c for comp, c in clones if comp.root is not None and
                             'custom_call_target="AsyncCollectiveStart"' in comp.root.attrs), clones[0][1])
                keep.async_ = True
                keep.note = ((keep.note + "; " if keep.note else "")
                             + f"one asynchronous collective cloned into {len(clones)} fusions")
                out = [c for c in out if c is keep or all(c is not x for _, x in clones)]
                keep.overlapped = self.overlaps([site for comp, _ in clones for site, _ in self.callers[comp.name]])
        cloned = {c.name for clones in by_channel.values() if len(clones) > 1 for _, c in clones}
        for c in out:
            if c.name not in cloned:
                c.overlapped = self.overlaps(self._span(c.name, done_of))
        return out

    def _one_collective(self, clones: list) -> bool:
        """Whether fusions holding collectives of one channel, opcode and shape are one asynchronous collective's
        clones: one of them a start fusion (root AsyncCollectiveStart), or each called on another's output."""
        starts = sum(comp.root is not None and 'custom_call_target="AsyncCollectiveStart"' in comp.root.attrs
                     for comp, _ in clones)
        if starts:
            return starts == 1
        sites = [site for comp, _ in clones for site, _ in self.callers[comp.name]]
        names = {site.name for site in sites}
        return len(clones) > 1 and sum(any(o in names for o in site.operands) for site in sites) >= len(sites) - 1

    def _span(self, name: str, done_of: dict) -> list[Instruction]:
        """The instructions that bracket one collective in its caller's schedule: a start and its done, an
        async-start wrapper and its done, a fusion holding it (with a matmul, it is one); [] if synchronous."""
        ins = self.instructions[name]
        if ins.opcode.endswith("-start"):
            return [ins, done_of[name]] if name in done_of else []
        sites = [s for s, _ in self.callers.get(ins.computation, [])]
        if ins.computation in self.async_computations:
            out = []
            for site in sites:
                done = site
                while done.opcode.endswith(("-start", "-update")) and done.name in done_of:
                    done = done_of[done.name]
                out += [site, done]
            return out
        return [s for s in sites if s.opcode == "fusion"]

    def runs_compute(self, ins: Instruction, depth: int = 0) -> bool:
        """Whether an instruction runs a matmul: a dot, a convolution, a TPU kernel (custom-call
        tpu_custom_call), or a fusion, call, while or conditional whose computations hold one."""
        if ins.opcode in ("dot", "convolution") or 'custom_call_target="tpu_custom_call"' in ins.attrs:
            return True
        return depth < 8 and ins.opcode in ("fusion", "call", "while", "conditional") and any(
            self.runs_compute(i, depth + 1) for _, callee in _callees(ins.attrs) if callee in self.computations
            for i in self.computations[callee].instructions)

    def overlaps(self, bracket: list[Instruction]) -> bool:
        """Whether a matmul runs while a collective is in flight: ``bracket`` holds the instructions that
        start, continue and finish it in one computation's schedule (the program text is scheduled,
        ``is_scheduled=true``); it overlaps when any of them, or any instruction scheduled between the first and
        the last, runs compute (runs_compute). A synchronous collective (an empty bracket) is exposed."""
        if not bracket:
            return False
        comp = self.computations[bracket[0].computation]
        at = sorted(self.position[i.name] for i in bracket if i.computation == comp.name)
        return any(self.runs_compute(i) for i in comp.instructions[at[0]:at[-1] + 1])

    def launching(self, comp: str) -> bool:
        """Whether ``comp``'s instructions run as kernels of their own: the entry, and computations called only as a
        while's body or condition, a call's, a conditional's branches or an async-start's (not a fusion's body, nor
        a reducer of reduce, all-reduce, scatter or sort: those run inside their caller's kernel)."""
        if comp == self.entry:
            return True
        sites = self.callers.get(comp, [])
        return bool(sites) and all(site.opcode in _CONTROL for site, _ in sites)

    def _fused_opcodes(self, ins: Instruction) -> set[str]:
        """The opcodes inside a fusion's computation (and the fusions it nests)."""
        out: set[str] = set()
        for _, callee in _callees(ins.attrs):
            for sub in self.computations.get(callee, Computation(callee)).instructions:
                out.add(sub.opcode)
                if sub.opcode == "fusion":
                    out |= self._fused_opcodes(sub)
        return out

    def kernel_kind(self, ins: Instruction) -> str | None:
        """What ``ins`` launches (KERNEL_KINDS), or None where it launches nothing (parameters, tuples, bitcasts,
        control flow, the done half of an asynchronous pair): a GEMM (a dot or convolution, a fusion around one, a
        BLAS custom call), an attention kernel (cuDNN's fused attention, a Pallas kernel named flash or splash), a
        collective (its start), a copy, another fusion (elementwise, reductions), or another op."""
        op = ins.opcode
        if op in _NO_KERNEL or op.endswith("-done") or op in _CONTROL:
            return None
        if op.endswith("-start"):
            base = op[: -len("-start")]
            return "collective" if base in COLLECTIVE_KINDS else "copy" if base == "copy" else "other"
        if op in COLLECTIVE_KINDS:
            return "collective"
        if op in ("dot", "convolution"):
            return "gemm"
        if op == "copy":
            return "copy"
        if op == "custom-call":
            target = (re.search(r'custom_call_target="([^"]*)"', ins.attrs) or [None, ""])[1]
            if _GEMM_CALL.search(target):
                return "gemm"
            return "attention" if _ATTENTION_CALL.search(target) or _ATTENTION_CALL.search(ins.name) else "other"
        if op == "fusion":
            inner = self._fused_opcodes(ins)
            if inner & {"dot", "convolution"}:
                return "gemm"
            if inner & COLLECTIVE_KINDS.keys():
                return "collective"
            return "fusion"
        return "other"

    def moved_bytes(self, ins: Instruction) -> float:
        """Bytes a kernel reads and writes: its operands and result as their shapes say, except where a fusion only
        slices an operand (every use of the parameter inside the fusion a dynamic-slice or slice of it: the slices'
        bytes are read) and where it updates a buffer in place (a dynamic-update-slice at the fusion's root, or an
        element of a root tuple, or the instruction itself, of a parameter seen through bitcasts: XLA aliases the
        buffer operand with the result, so the update's bytes are written and the buffer is neither read nor
        rewritten)."""
        if ins.opcode == "dynamic-update-slice":
            return 2.0 * shape_bytes(self.operand_shape(ins, 1)) + sum(
                shape_bytes(self.operand_shape(ins, k)) for k in range(2, len(ins.operands)))
        comp = next((self.computations.get(c) for k, c in _callees(ins.attrs) if k == "calls"), None) \
            if ins.opcode == "fusion" else None
        if comp is None:
            return shape_bytes(ins.shape) + sum(shape_bytes(self.operand_shape(ins, k))
                                                for k in range(len(ins.operands)))
        local = {i.name: i for i in comp.instructions}
        root = comp.root
        outs = [local[o] for o in root.operands if o in local] if root.opcode == "tuple" else [root]
        in_place = set()
        for o in outs:
            if o.opcode == "dynamic-update-slice":  # the buffer: a parameter, seen through bitcasts
                buf = local.get(o.operands[0])
                while buf is not None and buf.opcode == "bitcast":
                    buf = local.get(buf.operands[0])
                in_place.add(buf.name if buf is not None else o.operands[0])
        written = sum(shape_bytes(o.shape) if o.opcode != "dynamic-update-slice" else
                      shape_bytes(local[o.operands[1]].shape if o.operands[1] in local else o.shape) for o in outs)
        params = {int(m.group(1)): i for i in comp.instructions if i.opcode == "parameter"
                  for m in [re.match(r"\s*(\d+)", i.args)] if m}
        read = 0.0
        for k in range(len(ins.operands)):
            p = params.get(k)
            if p is not None and p.name in in_place:
                continue
            sliced = self._slices_of(p.name, comp.name) if p is not None else None
            read += sum(shape_bytes(u.shape) for u in sliced) if sliced else shape_bytes(self.operand_shape(ins, k))
        return read + written

    def _slices_of(self, name: str, comp: str, depth: int = 0) -> list[Instruction] | None:
        """The dynamic-slices and slices that are every use of ``name`` inside computation ``comp`` (seen through
        bitcasts), or None where some use reads it otherwise."""
        users = [u for u in self.users.get(name, []) if u.computation == comp]
        if not users or depth > 8:
            return None
        out = []
        for u in users:
            if u.opcode in ("dynamic-slice", "slice") and u.operands[0] == name:
                out.append(u)
            elif u.opcode == "bitcast":
                sub = self._slices_of(u.name, comp, depth + 1)
                if sub is None:
                    return None
                out += sub
            else:
                return None
        return out

    def kernels(self) -> dict[str, dict[str, float]]:
        """{kind: {"count", "bytes"}} of the kernels one program run launches per device (KERNEL_KINDS; kernel_kind
        of each instruction of each launching computation, times the computation's runs): bytes are what each
        kernel reads and writes (moved_bytes: its operands and result as their shapes say, a slice's bytes where it
        only slices an operand, an in-place update's where it updates a buffer)."""
        out = {k: {"count": 0.0, "bytes": 0.0} for k in KERNEL_KINDS}
        for name, comp in self.computations.items():
            runs = self.multiplier.get(name, 0.0)
            if not runs or not self.launching(name):
                continue
            for ins in comp.instructions:
                kind = self.kernel_kind(ins)
                if kind is None:
                    continue
                moved = self.moved_bytes(ins)
                out[kind]["count"] += runs
                out[kind]["bytes"] += runs * moved
        return out

    def loop_copies(self) -> float:
        """Bytes written per run by ``copy`` instructions in while-loop bodies that copy an all-gather's result,
        times their trips: the copies a rotated loop makes of the gathered weights it carries into the next trip
        (XLA:TPU, gathers pipelined across blocks), plus gradient accumulation's copies of zero-initialized gradient
        stacks (stack_copies, kind "zeros"; scaling.families.ffn.accumulation_copy_bytes)."""
        bodies = {c for c, sites in self.callers.items() if any(s.opcode == "while" and k == "body" for s, k in sites)}
        return sum(shape_bytes(i.shape) * self.multiplier.get(c, 0.0) for c in bodies
                   for i in self.computations[c].instructions if i.opcode == "copy" and self._gathered(i.operands[0])
                   ) + sum(c.bytes for c in self.stack_copies() if c.kind == "zeros")

    def stack_copies(self) -> list[StackCopy]:
        """The copies of stacked FP32 parameters or gradients in while-loop bodies, each with its bytes written per
        run (its shape's bytes times the trips of the loops around it). A stack is an FP32 argument of the entry
        computation of two dimensions or more (the layer stacks [L, ...], the train state's parameters, per device).
          slice  XLA:GPU's dynamic-slice fusion (custom fusion ``dynamic_slice_fusion``, root a copy of a dynamic
                 slice: a device-to-device memcpy) of one layer's (or pair's) FP32 weights [1, ...] out of a stack:
                 the scan slicing each layer-pass's master weights (jax.checkpoint's optimization barrier over the
                 layer's inputs, prevent_cse=True, made XLA materialize them; docs/findings.md, "The layer loop's
                 copies on XLA:GPU (issue 39)");
          zeros  a ``copy`` of a zero broadcast of a stack's shape: the per-microbatch zero-initialized gradient
                 stacks of the layer scan's backward (its stacked outputs), CSE'd into one buffer where stacks share a
                 shape and copied for each further one (every backend; gradient accumulation's loop)."""
        entry = self.computations.get(self.entry)
        stacks = {arrays(i.shape)[0][1] for i in (entry.instructions if entry else []) if i.opcode == "parameter"
                  and len(arrays(i.shape)) == 1 and arrays(i.shape)[0][0] == "f32" and len(arrays(i.shape)[0][1]) >= 2}
        layers = {d[-2:] for d in stacks}  # one layer's matrix; a slice [1, ...] of one layer or of a pair [1, 2, ...]
        bodies = {c for c, sites in self.callers.items() if any(s.opcode == "while" and k == "body" for s, k in sites)}
        out = []
        for c in bodies:
            for i in self.computations[c].instructions:
                a = arrays(i.shape)
                if len(a) != 1 or a[0][0] != "f32":
                    continue
                dims, kind = a[0][1], None
                if (i.opcode == "fusion" and '"name":"dynamic_slice_fusion"' in i.attrs and dims[:1] == (1,)
                        and dims[-2:] in layers and self._root_is(i, "copy")):
                    kind = "slice"
                elif i.opcode == "copy" and dims in stacks and self._is_zeros(i.operands[0]):
                    kind = "zeros"
                if kind:
                    written = shape_bytes(i.shape) * self.multiplier.get(c, 0.0)
                    out.append(StackCopy(kind, i.shape.split("{")[0], written, i.name))
        return out

    def _root_is(self, ins: Instruction, opcode: str) -> bool:
        """Whether a fusion's computation's root has ``opcode``."""
        comp = self.computations.get(dict(_callees(ins.attrs)).get("calls"))
        return bool(comp and comp.root and comp.root.opcode == opcode)

    def _is_zeros(self, name: str) -> bool:
        """Whether a value is a broadcast of a constant: a broadcast, or a fusion of constants only (XLA:GPU: none;
        XLA:CPU: the scalar) that holds one (through a tuple element of a multi-output one)."""
        ins = self.instructions.get(name)
        if ins is None:
            return False
        if ins.opcode == "get-tuple-element":
            return self._is_zeros(ins.operands[0])
        if ins.opcode == "broadcast":
            return True
        return ins.opcode == "fusion" and all(
            self.instructions.get(o) is not None and self.instructions[o].opcode == "constant" for o in ins.operands
        ) and any(x.opcode == "broadcast" for _, c in _callees(ins.attrs) if c in self.computations
                  for x in self.computations[c].instructions)

    def _gathered(self, name: str, depth: int = 0) -> bool:
        """Whether an instruction's value is an all-gather's result, through bitcasts and tuple elements: an
        all-gather(-done), or the done fusion of an asynchronous collective (root AsyncCollectiveDone)."""
        ins = self.instructions.get(name)
        if ins is None or depth > 8:
            return False
        if ins.opcode in ("all-gather", "all-gather-done"):
            return True
        if ins.opcode == "fusion":
            return any('custom_call_target="AsyncCollectiveDone"' in (self.computations[c].root.attrs or "")
                       for _, c in _callees(ins.attrs) if c in self.computations and self.computations[c].root)
        return ins.opcode in ("bitcast", "get-tuple-element", "copy") and bool(ins.operands) and self._gathered(
            ins.operands[0], depth + 1)

    def _sliced_elements(self, name: str, want: int, depth: int = 0) -> int | None:
        """If the value ``name`` flows (through converts, bitcasts, copies, transposes, reshapes and
        into fusions) into a dynamic-slice of ``want`` elements indexed by partition id, return
        ``want``."""
        if depth > 6:
            return None
        for user in self.users.get(name, []):
            if user.opcode == "dynamic-slice" and user.operands[0] == name:
                if (math.prod(arrays(user.shape)[0][1]) == want
                        and any(self._from_partition_id(o) for o in user.operands[1:])):
                    return want
                continue
            if user.opcode == "fusion":  # look inside, at the parameters this value feeds
                callee = self.computations.get(dict(_callees(user.attrs)).get("calls"))
                ks = {str(k) for k, op in enumerate(user.operands) if op == name}
                params = [i.name for i in (callee.instructions if callee else [])
                          if i.opcode == "parameter" and i.args.strip() in ks]
                if any(self._sliced_elements(p, want, depth + 1) for p in params):
                    return want
            if user.opcode in _PASS_THROUGH and self._sliced_elements(user.name, want, depth + 1):
                return want
        return None

    def _from_partition_id(self, name: str, seen: set | None = None) -> bool:
        """Whether the value ``name`` is computed from partition-id (or replica-id), following
        operands backwards and fusion parameters out to the fusion's operands."""
        seen = set() if seen is None else seen
        ins = self.instructions.get(name)
        if ins is None or name in seen or len(seen) > 64:
            return False
        seen.add(name)
        if ins.opcode in ("partition-id", "replica-id"):
            return True
        if ins.opcode == "parameter":
            sites = [s for s, _ in self.callers.get(ins.computation, []) if s.opcode == "fusion"]
            return any(self._from_partition_id(s.operands[int(ins.args)], seen) for s in sites)
        return any(self._from_partition_id(o, seen) for o in ins.operands)


@dataclass
class StackCopy:
    """One copy of a stacked FP32 parameter or gradient in a loop body (HloProgram.stack_copies): ``kind`` "slice"
    or "zeros", the HLO ``shape`` it writes, ``bytes`` written per run (times the loops' trips), its ``name``."""
    kind: str
    shape: str
    bytes: float
    name: str

    def to_json(self) -> dict:
        """{"kind", "shape", "bytes", "name"}."""
        return {"kind": self.kind, "shape": self.shape, "bytes": self.bytes, "name": self.name}


def _callees(attrs: str) -> list[tuple[str, str]]:
    """(attribute key, computation name) for ``key=%comp`` and ``key={%a, %b}`` attributes."""
    out = [(k, v) for k, v in re.findall(r"(\w+)=%([\w.\-]+)", attrs)]
    for k, lst in re.findall(r"(\w+)=\{(%[^}]*)\}", attrs):
        out += [(k, v) for v in _NAME.findall(lst)]
    return out


def _window(attrs: str, n: int) -> dict:
    """Parse ``window={size=4x4 stride=2x2 pad=0_1x0_1 lhs_dilate=.. rhs_dilate=..}``; missing
    fields default to stride 1, pad 0_0, dilation 1."""
    w = {"stride": [1] * n, "pad": [(0, 0)] * n, "lhs_dilate": [1] * n, "rhs_dilate": [1] * n}
    m = re.search(r"window=\{([^}]*)\}", attrs)
    for key, val in re.findall(r"(\w+)=([\d_x\-]+)", m.group(1) if m else ""):
        if key == "pad":
            w["pad"] = [tuple(int(v) for v in p.split("_")) for p in val.split("x")]
        elif key in w:
            w[key] = [int(v) for v in val.split("x")]
    return w


def replica_groups(attrs: str, n_devices: int) -> list[list[int]]:
    """The replica groups of a collective's attributes, as lists of partition ids. Spellings:
    ``{{0,1},{2,3}}``; iota ``[G,S]<=[dims]`` or ``[G,S]<=[dims]T(perm)`` (arange(prod(dims))
    reshaped to dims, transposed by perm, reshaped to G groups of S); and
    ``mesh['a'=2,'b'=4](, device_ids=(...) or ([dims]T(perm))) {'b'}`` (devices reshaped to the mesh, the named
    axes, or sub-axes ``'b':(pre)size``, moved last, then rows). Missing or ``{}``: one group of all."""
    m = re.search(r"replica_groups=", attrs)
    if not m:
        return [list(range(n_devices))]
    s = attrs[m.end():]
    if s.startswith("{"):
        inner = s[1:_close(s, 0) - 1]
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", inner)]
        return groups or [list(range(n_devices))]
    m = re.match(r"\[([\d,]+)\]<=(\[[\d,]+\](?:T\([\d,]+\))?)", s)
    if m:
        return _iota(m.group(2)).reshape(-1, int(m.group(1).split(",")[-1])).tolist()
    m = re.match(r"mesh\[([^\]]*)\](?:,\s*device_ids=\((\[[\d,]+\](?:T\([\d,]+\))?|[^)]*)\))?\s*\{([^}]*)\}", s)
    if m:
        return _mesh_groups(m.group(1), m.group(2), m.group(3))
    raise ValueError(f"replica_groups: unrecognised spelling {s[:80]!r}")


def _iota(text: str) -> np.ndarray:
    """``[dims]`` or ``[dims]T(perm)``: arange(prod(dims)) reshaped to dims, transposed by perm,
    flattened (XLA's iota tile assignment, used for replica groups and device_ids)."""
    m = re.match(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    dims = [int(x) for x in m.group(1).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if m.group(2):
        ids = ids.transpose([int(x) for x in m.group(2).split(",")])
    return ids.reshape(-1)


def _mesh_groups(axes_text: str, device_ids: str | None, group_text: str) -> list[list[int]]:
    """Groups of a ``mesh[...] {axes}`` spelling, following XLA's MeshAxesReplicaGroupList: each
    mesh dim is split into [pre, size, rest] pieces for its sub-axes, the grouped pieces are
    transposed to the end, and each row of the result is one group."""
    mesh = [(n, int(v)) for n, v in re.findall(r"'?([\w.\-]+)'?\s*=\s*(\d+)", axes_text)]
    names = [n for n, _ in mesh]
    sizes = [v for _, v in mesh]
    ids = _iota(device_ids) if device_ids and device_ids.startswith("[") else (
        np.array([int(x) for x in re.findall(r"\d+", device_ids)]) if device_ids else np.arange(math.prod(sizes)))
    refs = []  # (mesh dim, pre, size) in the order written; pre None for a whole axis
    for ref in _split_top(group_text):
        r = re.match(r"'?([\w.\-]+)'?(?::\((\d+)\)(\d+))?", ref)
        d = names.index(r.group(1))
        refs.append((d, int(r.group(2)), int(r.group(3))) if r.group(2) else (d, None, sizes[d]))
    dims, pos = [], {}
    for d, full in enumerate(sizes):
        subs = sorted((r for r in refs if r[0] == d), key=lambda r: r[1] or 1)
        if not subs or subs[0][1] is None:
            if subs:
                pos[subs[0]] = len(dims)
            dims.append(full)
            continue
        done = 1
        for r in subs:
            if r[1] != done:
                dims.append(r[1] // done)
                done = r[1]
            pos[r] = len(dims)
            dims.append(r[2])
            done *= r[2]
        if done != full:
            dims.append(full // done)
    grouped = [pos[r] for r in refs]
    rest = [i for i in range(len(dims)) if i not in grouped]
    size = math.prod(dims[g] for g in grouped)
    return ids.reshape(dims).transpose(rest + grouped).reshape(-1, size).tolist()


def _source_target_pairs(attrs: str) -> list[list[int]]:
    m = re.search(r"source_target_pairs=\{(.*?\})\}", attrs)
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1))] if m else []


def _axes_of(groups: list[list[int]], sizes: tuple[int, ...], names: tuple[str, ...], permute: bool):
    """(axes, group size): the mesh axes (in mesh order) whose coordinate varies within a group.
    For a collective-permute the groups are (source, target) pairs, self-pairs ignored, and the
    group size is the product of the sizes of the axes it moves along."""
    n = math.prod(sizes)
    varies = [False] * len(sizes)
    for g in groups:
        if any(not 0 <= d < n for d in g):
            raise ValueError(f"mesh_axes {dict(zip(names, sizes))} has {n} devices; the program names device {max(g)}")
        coords = np.array(np.unravel_index(g, sizes))
        for k in range(len(sizes)):
            varies[k] |= bool(len(set(coords[k].tolist())) > 1)
    axes = tuple(a for a, v in zip(names, varies) if v)
    if permute:
        return axes, math.prod(s for s, v in zip(sizes, varies) if v)
    return axes, len(groups[0]) if groups else 1


def parse_hlo(text: str) -> HloProgram:
    """Parse ``compiled.as_text()`` into an HloProgram. Only the computation blocks are read; the
    module header and the FileNames/StackFrames tables are skipped."""
    comps: dict[str, Computation] = {}
    cur = None
    m = re.search(r"^HloModule .*?\bnum_partitions=(\d+)", text, re.M)
    num_partitions = int(m.group(1)) if m else None
    for line in text.splitlines():
        if cur is None:
            m = re.match(r"(ENTRY\s+)?%([^\s(]+)\s*\(.*\{\s*$", line)
            if m:
                cur = Computation(m.group(2), is_entry=bool(m.group(1)))
                comps[cur.name] = cur
            continue
        if line.strip() == "}" or re.match(r"\}\s*,\s*execution_thread=", line.strip()):
            cur = None  # a computation for another execution thread (TPU7x: "sparsecore") closes with its name
            continue
        m = re.match(r"\s*(ROOT\s+)?%([^\s=]+)\s*=\s*(.*)$", line)
        if m:
            cur.instructions.append(_instruction(m.group(2), m.group(3), cur.name, bool(m.group(1))))
    return HloProgram(comps, num_partitions)


def _instruction(name: str, rest: str, comp: str, is_root: bool) -> Instruction:
    if rest.startswith("("):
        end = _close(rest, 0)
    else:
        end = rest.index(" ") if " " in rest else len(rest)
    shape, rest = rest[:end], rest[end:].lstrip()
    m = re.match(r"([\w\-]+)\(", rest)
    if not m:
        return Instruction(name, shape, rest.split(",")[0], "", "", comp, is_root=is_root)
    close = _close(rest, m.end() - 1)
    args, attrs = rest[m.end():close - 1], rest[close:]
    ins = Instruction(name, shape, m.group(1), args, attrs, comp, is_root=is_root)
    for piece in _split_top(args):
        names = _NAME.findall(piece)
        if names:
            ins.operands.append(names[-1])
            ins.inline_shapes.append(piece[: piece.rfind("%")].strip() if "[" in piece else None)
    return ins


def overlap_bytes(collectives: list[Collective]) -> dict:
    """{"overlapped": {axes: bytes}, "exposed": {axes: bytes}}: V x count of the collectives a matmul hides
    (Collective.overlapped) and of the others, keyed as collective_bytes keys them."""
    out = {"overlapped": {}, "exposed": {}}
    for c in collectives:
        side = out["overlapped" if c.overlapped else "exposed"]
        key = "+".join(c.axes) or "none"
        side[key] = side.get(key, 0.0) + c.volume * c.count
    return out


def collective_bytes(collectives: list[Collective]) -> dict:
    """{"total": sum of volume x count, "by_axis": {"fsdp": .., "data+fsdp": .., ...},
    "by_kind": {"all-gather": .., ...}}: each collective contributes V x count, keyed by its
    axes joined with "+" (mesh order; "none" for a group of one device)."""
    out = {"total": 0.0, "by_axis": {}, "by_kind": {}}
    for c in collectives:
        v = c.volume * c.count
        key = "+".join(c.axes) or "none"
        out["total"] += v
        out["by_axis"][key] = out["by_axis"].get(key, 0.0) + v
        out["by_kind"][c.kind] = out["by_kind"].get(c.kind, 0.0) + v
    return out


@dataclass
class CompiledProgram:
    """Everything read from one compiled program, per device: the one reader ``check``, ``compile``,
    ``bench``, the plan verification and the tests use.

    dot_flops         dot/convolution FLOPs times the trip counts of the loops around them
    collectives       every collective (Collective: kind, axes, volume V, count, async)
    collective_bytes  {"total", "by_axis", "by_kind"}: V x count summed (collective_bytes)
    overlap           {"overlapped", "exposed"}: the same bytes per axis split by the schedule (overlap_bytes)
    loop_copy_bytes   bytes the loops' copy instructions write (HloProgram.loop_copies)
    kernels           {kind: {"count", "bytes"}} of the kernels one run launches (HloProgram.kernels)
    windowed_rs_loops while loops XLA made for a windowed-einsum reduce-scatter
    memory            memory_analysis(): argument_bytes, output_bytes, alias_bytes, temp_bytes,
                      generated_code_bytes, peak_bytes (peak_memory_in_bytes where > 0, TPU; else None:
                      arguments + outputs + temp - aliases over-states it)
    cost              cost_analysis() as a dict of floats (jax 0.10: a dict; older: the first of a
                      list). It counts a while-loop body once, not per trip: FLOPs and its own
                      estimate "optimal_seconds" of a scanned program are one trip's."""

    dot_flops: float
    collectives: list[Collective]
    collective_bytes: dict
    windowed_rs_loops: list[str]
    memory: dict
    cost: dict
    overlap: dict = field(default_factory=dict)
    loop_copy_bytes: float = 0.0
    kernels: dict = field(default_factory=dict)

    @property
    def async_count(self) -> int:
        return sum(1 for c in self.collectives if c.async_)


def read_compiled(compiled, mesh_axes: dict[str, int]) -> CompiledProgram:
    """Read ``compiled`` (a jax Compiled, or anything with as_text(), cost_analysis() and
    memory_analysis()) for a mesh of ``mesh_axes`` {axis: size} in mesh order."""
    prog = parse_hlo(compiled.as_text())
    cols = prog.collectives(mesh_axes)
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    ma = compiled.memory_analysis()
    if isinstance(ma, (list, tuple)):
        ma = ma[0] if ma else None
    get = lambda a: getattr(ma, a, None)  # noqa: E731
    peak = get("peak_memory_in_bytes")
    memory = {"argument_bytes": get("argument_size_in_bytes"), "output_bytes": get("output_size_in_bytes"),
              "alias_bytes": get("alias_size_in_bytes"), "temp_bytes": get("temp_size_in_bytes"),
              "generated_code_bytes": get("generated_code_size_in_bytes"),
              "peak_bytes": peak if peak and peak > 0 else None,
              "host_temp_bytes": get("host_temp_size_in_bytes")}  # pinned host memory (offloaded residuals)
    return CompiledProgram(dot_flops=prog.dot_flops(), collectives=cols, collective_bytes=collective_bytes(cols),
                           windowed_rs_loops=prog.windowed_einsum_loops("rs"), memory=memory,
                           cost={k: float(v) for k, v in (cost or {}).items()}, overlap=overlap_bytes(cols),
                           loop_copy_bytes=prog.loop_copies(), kernels=prog.kernels())


_REFUSAL = re.compile(r"RESOURCE_EXHAUSTED.*required for HLO temporaries \(([\d.]+)G\)")
_AVAILABLE = re.compile(r"RESOURCE_EXHAUSTED.*exceeds available HBM \(([\d.]+)G\)")


def refused_bytes(error: BaseException | str) -> float | None:
    """The bytes a program XLA:TPU refused for HBM says it needs, from its RESOURCE_EXHAUSTED message
    ("... the total memory required for HLO temporaries (121.89G) exceeds available HBM (95.74G)", G =
    GiB); None for any other error. Despite the wording the figure is the program's whole need, arguments
    included: most refusals measured match the closed-form total (the XXL at M = 1 0.993; the seed-000
    model's train steps with 710 GB of state, which no temporaries-only figure could reach, 1.016-1.019),
    some lie above it (1.093, 1.150: notebooks/sequence_memory.ipynb)."""
    m = _REFUSAL.search(str(error))
    return float(m.group(1)) * 2**30 if m else None


def refusal_error(error: BaseException | str) -> ValueError | None:
    """XLA:TPU's refusal of a program larger than HBM as one line, "the program needs X GB per device, the
    device has Y GB" (refused_bytes; the available figure from the same message; GB = 1e9 B); None for any
    other error."""
    need = refused_bytes(error)
    if need is None:
        return None
    m = _AVAILABLE.search(str(error))
    has = f", the device has {float(m.group(1)) * 2**30 / 1e9:.1f} GB" if m else ""
    return ValueError(f"the program needs {need / 1e9:.1f} GB per device{has} "
                      "(XLA:TPU refused it: RESOURCE_EXHAUSTED); use more devices, more fsdp, remat or a smaller batch")

