"""Times of collectives over ICI axes and over DCN.

Source: Scaling Book, sharding page ("How to Scale Your Model", jax-ml.github.io/scaling-book/sharding/):
  - AllGather / ReduceScatter of an array of V bytes (the full, gathered size) over one axis with a
    bidirectional ring takes about V / W_ici, independent of the axis length;
  - over n axes at once V / (n·W_ici); with the latency floor
        T = max(T_min · Σ|X_i|/2, V / (n·W_ici)),  T_min ~ 1 us per hop;
  - an axis without wraparound is a line, not a ring: about twice as long (half the bandwidth, and
    |X|-1 hops);
  - AllReduce = 2 × AllGather;  AllToAll on a bidirectional ring ~ AllGather / 4.
DCN (tpus page): a slice-to-slice collective moves V·(n−1)/n bytes through each chip's DCN link.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scaling.core.inputs import positive_float
from scaling.core.kinds import Collective

T_HOP = 1e-6  # seconds per ICI hop (sharding page)

# Time of each collective kind relative to an all-gather of the same V (sharding page). A ring of
# collective-permutes that implements a reduce-scatter (XLA's windowed einsum) is timed as one.
KIND_FACTOR = {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0, "all-to-all": 0.25,
               "collective-permute": 1.0}
KINDS = tuple(KIND_FACTOR)


def zero1_volumes(n_pad, grad_bytes: float, master_bytes: float) -> dict[str, dict[str, float]]:
    """ZeRO-1's collectives over data (Schedule.optimizer_sharding; ffn_model.zero1): a device's flat buffer of
    N_pad elements (scaling.step.memory.zero1_padded, the padding included), its gradients reduce-scattered in
    ``grad_bytes`` per element (BF16) and the updated weights all-gathered in ``master_bytes`` (FP32), each
    V = bytes·N_pad (sharding page: V of a reduce-scatter or an all-gather is the full array)."""
    return {"data": {"reduce-scatter": grad_bytes * n_pad, "all-gather": master_bytes * n_pad}}


def _axes(axis_lens: Sequence[int], wraparound) -> list[tuple[int, bool]]:
    lens = [int(n) for n in axis_lens]
    if not lens or any(n <= 0 for n in lens):
        raise ValueError(f"axis lengths must be positive integers, got {list(axis_lens)!r}")
    wraps = [bool(wraparound)] * len(lens) if isinstance(wraparound, bool) else [bool(w) for w in wraparound]
    if len(wraps) != len(lens):
        raise ValueError("wraparound must be a bool or one flag per axis")
    return [(n, w) for n, w in zip(lens, wraps) if n > 1]


def allgather_time(V: float, axis_lens: Sequence[int], w_ici: float, wraparound=True, t_hop: float = T_HOP) -> float:
    """AllGather (or ReduceScatter) of V bytes over the given ICI axes.

    T = max(t_hop · Σ hops_i, V / Σ bw_i), bw_i = W_ici on a ring with wraparound, W_ici/2 without;
    hops_i = |X_i|/2 with wraparound, |X_i|−1 without (sharding page). 0 if every axis has length 1.
    """
    w_ici = positive_float("w_ici", w_ici)
    if V < 0:
        raise ValueError(f"V must be non-negative bytes, got {V!r}")
    axes = _axes(axis_lens, wraparound)
    if not axes:
        return 0.0
    bw = sum(w_ici if wrap else w_ici / 2 for _, wrap in axes)
    hops = sum(n / 2 if wrap else n - 1 for n, wrap in axes)
    return max(t_hop * hops, V / bw)


def collective_time(kind: str, V: float, axis_lens: Sequence[int], w_ici: float, wraparound=True,
                    t_hop: float = T_HOP) -> float:
    """Time of one collective over ICI: all-gather = reduce-scatter = AG(V); all-reduce = 2·AG(V);
    all-to-all = AG(V)/4 (sharding page), V the array it spans over the axes: for an all-to-all n times the buffer
    each of the n devices sends (scaling.step.program.comm_times takes the buffer and multiplies)."""
    if kind not in KIND_FACTOR:
        raise ValueError(f"unknown collective {kind!r}; valid: {', '.join(KINDS)}")
    return KIND_FACTOR[kind] * allgather_time(V, axis_lens, w_ici, wraparound, t_hop)


def dcn_time(kind: str, V: float, n_slices: int, dcn_bw: float) -> float:
    """A collective across ``n_slices`` slices over DCN, V bytes per chip:
    AG/RS: V·(n−1)/n / W_dcn, AR: twice that (tpus page, multi-slice)."""
    dcn_bw = positive_float("dcn_bw", dcn_bw)
    if n_slices <= 1:
        return 0.0
    t = V * (n_slices - 1) / n_slices / dcn_bw
    return 2 * t if kind == Collective.ALL_REDUCE else t


# ---- GPUs: NCCL over NVLink within a node, InfiniBand across nodes ----
# InfiniBand: the fraction of a GPU's NIC bandwidth a large collective reaches and its latency per call, Calculon's
# A100 system file (calculon-ai/calculon systems/a100_80g.json: IB 25 GB/s per GPU at efficiency 0.9, 20 us;
# ../shared/reference/kernels.md). The NIC bandwidth itself is the hardware table's dcn_bw (A100: Selene's 8 x 200
# Gb/s per node of 8, Narayanan et al. 2021).
IB_EFFICIENCY = 0.9
IB_LATENCY = 20e-6
# Bytes each device moves over its link per byte of V, by kind, on a switch (NVSwitch, or an IB fat tree): a ring
# all-gather or reduce-scatter (n−1)/n, an all-reduce twice that, an all-to-all (n−1)/n; a collective-permute sends
# its V once (the nccl-tests "bus bandwidth" conventions: NVIDIA/nccl-tests doc/PERFORMANCE.md).
GPU_KIND_FACTOR = {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0, "all-to-all": 1.0,
                   "collective-permute": 1.0}


def all_reduce_rows(chip):
    """(the chip whose link bandwidth the rows were measured over, rows) of the [collectives.all_reduce] rows a GPU
    takes: its kernel table's, else the A100-80GB's (the only published NVLink table; an H100's NVLink 4 is taken at
    the same fraction of its link bandwidth). None where no table has rows."""
    from scaling.hardware import chips as hardware
    from scaling.hardware.kernel_tables import kernel_table
    t = chip.kernel_table
    if t is not None and "all_reduce" in t.collectives:
        return hardware.CHIPS.get(t.chip, chip), t.collectives["all_reduce"].rows
    a100 = kernel_table("A100-80GB")
    if a100 is not None and "all_reduce" in a100.collectives:
        return hardware.CHIPS["A100-80GB"], a100.collectives["all_reduce"].rows
    return None


def nvlink_efficiency(chip, message_bytes, devices=None):
    """The fraction of a GPU's one-way NVLink bandwidth (ici_oneway) a collective of ``message_bytes`` per call over
    ``devices`` GPUs reaches: the all-reduce rows' bus bandwidth 2·(n−1)/n·b/t over the measuring chip's one-way link
    bandwidth, interpolated linearly in log bytes between the rows (clamped to the end rows), from the rows measured
    on the device count nearest ``devices`` in log (the larger on a tie; None: the largest count). Latency is in it:
    a small message's bus bandwidth is mostly its latency (vTrain's 1 MiB on 8 A100s: 92.8 us, 0.066 of 300 GB/s;
    XLA's H100 table: 16 KiB on 8 GPUs 34.7 us). 1 where no table has rows (the link bandwidth alone)."""
    got = all_reduce_rows(chip)
    if got is None:
        return np.ones_like(np.asarray(message_bytes, float))
    owner, rows = got
    x = np.log(np.maximum(np.asarray(message_bytes, float), 1.0))
    counts = sorted({int(r[0]) for r in rows})
    effs = []
    for c in counts:
        rs = sorted((r for r in rows if r[0] == c), key=lambda r: r[1])
        eff = [2 * (c - 1) / c * r[1] / r[2] / (owner.ici_bidi / 2) for r in rs]
        effs.append(np.interp(x, np.log([r[1] for r in rs]), eff))
    if devices is None or len(counts) == 1:
        return effs[-1]
    # the nearest count in log, the larger on a tie: the last count whose distance is the least
    dist = np.abs(np.log(np.maximum(np.asarray(devices, float), 1.0))[..., None] - np.log(counts))
    pick = len(counts) - 1 - np.argmin(dist[..., ::-1], axis=-1)
    return np.choose(pick, np.broadcast_arrays(*effs, pick)[:-1])


def gpu_time(kind: str, V, n, message_bytes, chip):
    """One step's collectives of ``kind``, V bytes in all, over n GPUs of one node (NVLink/NVSwitch), in calls of
    ``message_bytes``: GPU_KIND_FACTOR·(n−1)/n·V / (W_oneway · nvlink_efficiency(message_bytes, n)) (a permute: V
    over one link, no (n−1)/n); 0 where n = 1."""
    n = np.asarray(n, float)
    share = 1.0 if kind == Collective.COLLECTIVE_PERMUTE else (n - 1) / np.maximum(n, 1.0)
    t = GPU_KIND_FACTOR[kind] * share * V / (chip.ici_bidi / 2 * nvlink_efficiency(chip, message_bytes, n))
    return np.where(n > 1, t, 0.0)


def ib_time(kind: str, V, n, m, calls, dcn_bw_per_device):
    """The across-node part of a GPU collective over n nodes of m GPUs each: GPU_KIND_FACTOR·(V/m)·(n−1)/n / (IB
    bandwidth per GPU · IB_EFFICIENCY) + calls · IB_LATENCY (Calculon's IB figures; hierarchical: each GPU carries
    1/m of the bytes over its own NIC); an all-to-all's (n−1)/n·V instead, the share of each GPU's own buffer bound
    for other nodes, through its own NIC (a rail-optimized fabric: NCCL's alltoall sends each GPU's data itself;
    nothing to split over the node's GPUs); 0 where n = 1."""
    n = np.asarray(n, float)
    share = 1.0 if kind == Collective.COLLECTIVE_PERMUTE else (n - 1) / np.maximum(n, 1.0)
    per_gpu = V if kind == Collective.ALL_TO_ALL else V / m
    t = GPU_KIND_FACTOR[kind] * per_gpu * share / (dcn_bw_per_device * IB_EFFICIENCY) + calls * IB_LATENCY
    return np.where(n > 1, t, 0.0)
