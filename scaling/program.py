"""The closed-form account of one compiled step of the sharded FFN stack, per device.

What ``ffn_model`` compiles (sharding table: W [L,F,D] split D over fsdp and F over tensor; batch over
data·fsdp; block input x[B,D] replicated over tensor; hidden h[B,F] split F over tensor), block by block:

  forward   all-gather W_in, W_out (bf16) over fsdp      V = 2·(2·D·F/Y)  bytes   [FSDP, forward]
            h = x·W_in (local), y = h·W_out: partial sums over tensor ->
            all-reduce y (bf16) over tensor               V = 2·B·D/(d·X)  bytes   [TP]
  backward  all-gather W_in, W_out again over fsdp        V = 2·(2·D·F/Y)          [FSDP, backward]
            dx = dh·W_in^T: partial sums over tensor ->
            all-reduce dx over tensor                     V = 2·B·D/(d·X)          [TP]
            dW_in, dW_out: partial sums over data·fsdp ->
            reduce-scatter (bf16) over fsdp               V = 2·(2·D·F/Y)          [FSDP grads]
            all-reduce of the fsdp shard over data        V = 2·(2·D·F/(X·Y))      [DP grads]
  loss      all-reduce of the f32 loss over data·fsdp     V = 4                    [loss]
Block 0's input gradient is dead; the program computes it (and its TP all-reduce) only when block 0
sits in a scan of more than one trip (scaling.flops.first_block_dx_computed).
When XLA implements the gradient reduce-scatter as a windowed einsum (TPU, large weights: the dW
matmul is split into X chunks that travel a bidirectional ring as collective-permutes, X/2 steps
× 2 directions, then one more hop for the two partial sums to meet), it moves X+1 chunks of V/X:
                                                  V = 2·(2·D·F/Y)·(X+1)/X  [FSDP grads, windowed]
V is the Scaling Book's volume (the full array a collective spans on each device; sharding page);
time = V/(M·W_ici) for AG/RS, 2× for all-reduce (scaling.collectives).
Sources: Scaling Book training page (FSDP+TP per-layer communication 4·D·F/Y and 4·B·D/X);
sharding page (collective times).
"""

from __future__ import annotations

from scaling import collectives, flops, memory
from scaling.config import DEFAULT_PRECISION, FFNConfig, MeshShape, Precision, check_divisible, check_remat
from scaling.hardware import Chip


def collective_volumes(
    cfg: FFNConfig,
    mesh: MeshShape,
    batch_tokens: int,
    step: str = "train",
    precision: Precision = DEFAULT_PRECISION,
    min_comm_bytes: int = 0,
    windowed_grad_rs: bool = False,
    remat: str = "none",
) -> dict[str, dict[str, float]]:
    """Per device, per mesh axis, per collective kind: the summed volume V (bytes) of one step.

    Returns {axis: {kind: bytes}} for the axes of size > 1 (see the module docstring for each term).
    ``min_comm_bytes`` widens narrower element types on the wire: XLA's CPU backend runs bf16
    all-gathers and all-reduces in f32 (``min_comm_bytes=4``; seen in every CPU compile with jax
    0.10.2), while TPU moves bf16 as the precision policy says.
    """
    check_divisible(cfg, mesh, batch_tokens)
    if step not in ("train", "forward"):
        raise ValueError(f"step must be 'train' or 'forward', got {step!r}")
    D, F, L = cfg.d_model, cfg.d_ff, cfg.blocks
    X, Y, d = mesh.fsdp, mesh.tensor, mesh.data
    c, cw, cg = (max(b, min_comm_bytes) for b in (precision.compute, precision.weight_comm, precision.grad_comm))
    b_loc = batch_tokens / (d * X)
    passes = 2 if step == "train" else 1  # weight gathers / activation all-reduces: forward (+ backward)
    out: dict[str, dict[str, float]] = {}
    if X > 1:
        out["fsdp"] = {"all-gather": passes * L * 2 * cw * D * F / Y}
        if step == "train" and windowed_grad_rs:
            out["fsdp"]["collective-permute"] = L * 2 * cg * D * F / Y * (X + 1) / X
        elif step == "train":
            out["fsdp"]["reduce-scatter"] = L * 2 * cg * D * F / Y
    if Y > 1:
        # backward skips block 0's dx all-reduce where the program drops that dead dx (flops.first_block_dx_computed)
        n_ar = passes * L - (step == "train" and not flops.first_block_dx_computed(L, remat))
        out["tensor"] = {"all-reduce": n_ar * c * b_loc * D}
    if d > 1 and step == "train":
        out["data"] = {"all-reduce": L * 2 * cg * D * F / (X * Y)}
    if d * X > 1:  # the loss: mean over the batch, an all-reduce of one f32 scalar over data+fsdp
        key = "+".join(a for a, n in (("data", d), ("fsdp", X)) if n > 1)
        out.setdefault(key, {})
        out[key]["all-reduce"] = out[key].get("all-reduce", 0.0) + 4
    return out


def axis_bytes(volumes: dict[str, dict[str, float]]) -> dict[str, float]:
    """Total V per axis: sum over kinds."""
    return {axis: sum(kinds.values()) for axis, kinds in volumes.items()}


def comm_times(volumes: dict, chip: Chip, axis_ici: dict[str, tuple[list[int], bool]], w_ici: float | None = None) -> dict[str, float]:
    """Seconds per mesh axis: each kind's volume through scaling.collectives.collective_time over the
    physical ICI axes the mesh axis spans (``axis_ici[axis] = ([lengths], wraparound)``; an axis
    missing from it is taken as one ring with wraparound of the mesh-axis length)."""
    w = w_ici or chip.ici_bidi
    times = {}
    for axis, kinds in volumes.items():
        lens, wrap = axis_ici.get(axis, ([2], True))
        # a windowed-einsum reduce-scatter (collective-permutes round a bidirectional ring) is timed as one
        times[axis] = sum(collectives.collective_time("reduce-scatter" if k == "collective-permute" else k,
                                                      v, lens, w, wrap, t_hop=0.0) for k, v in kinds.items())
    return times


def predict(
    cfg: FFNConfig,
    mesh: MeshShape,
    batch_tokens: int,
    remat: str = "none",
    step: str = "train",
    chip: Chip | None = None,
    axis_ici: dict | None = None,
    precision: Precision = DEFAULT_PRECISION,
    min_comm_bytes: int = 0,
    windowed_grad_rs: bool = False,
) -> dict:
    """Everything the closed forms say about one compiled step, per device:

    flops      matmul FLOPs per device, term by term (scaling.flops; the scan computes the first
               block's unused input gradient, so it is counted here)
    collectives  V per axis and kind (collective_volumes; ``windowed_grad_rs`` as there)
    memory     bytes per device, term by term (scaling.memory.memory_per_device; a forward step:
               memory.forward_memory_per_device)
    times      T_math = FLOPs/C; T_comms per axis; step time in the sum form (comms after math:
               T_math + Σ T_axis) and the max form (overlapped: max(T_math, T_axis...)); bound.
               The times are those of the bytes the precision policy puts on the wire (bf16), also
               when ``min_comm_bytes`` widens the volumes reported for an XLA:CPU program.
    """
    check_remat(remat)
    f = flops.step_flops(cfg, batch_tokens, step, remat, first_block_input_grad=flops.first_block_dx_computed(cfg.blocks, remat))
    f = {k: flops.flops_per_device(v, mesh) for k, v in f.items()}
    vols = collective_volumes(cfg, mesh, batch_tokens, step, precision, min_comm_bytes, windowed_grad_rs, remat)
    wire = collective_volumes(cfg, mesh, batch_tokens, step, precision, 0, windowed_grad_rs, remat) if min_comm_bytes else vols
    if step == "forward":
        mem = memory.forward_memory_per_device(cfg, mesh, batch_tokens, precision)
    else:
        mem = memory.memory_per_device(cfg, mesh, batch_tokens, remat, precision, windowed_grad_rs)
    res = {"flops": f, "collectives": vols, "collective_bytes": axis_bytes(vols), "memory": mem}
    if chip is not None:
        t_math = f["total"] / chip.bf16_flops
        t_axes = comm_times(wire, chip, axis_ici or {})
        t_sum = t_math + sum(t_axes.values())
        t_max = max([t_math, *t_axes.values()])
        worst = max(t_axes, key=t_axes.get) if t_axes else None
        res["times"] = {
            "math": t_math,
            "comms": t_axes,
            "step_sum": t_sum,
            "step_max": t_max,
            "bound": "compute" if worst is None or t_axes[worst] <= t_math else f"ICI ({worst})",
        }
    return res
