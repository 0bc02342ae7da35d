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

from scaling.inputs import positive_float

T_HOP = 1e-6  # seconds per ICI hop (sharding page)

# Time of each collective kind relative to an all-gather of the same V (sharding page). A ring of
# collective-permutes that implements a reduce-scatter (XLA's windowed einsum) is timed as one.
KIND_FACTOR = {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0, "all-to-all": 0.25,
               "collective-permute": 1.0}
KINDS = tuple(KIND_FACTOR)


def zero1_volumes(n_pad, grad_bytes: float, master_bytes: float) -> dict[str, dict[str, float]]:
    """ZeRO-1's collectives over data (Schedule.optimizer_sharding; ffn_model.zero1): a device's flat buffer of
    N_pad elements (scaling.memory.zero1_padded, the padding included), its gradients reduce-scattered in
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
    all-to-all = AG(V)/4 (sharding page)."""
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
    return 2 * t if kind == "all-reduce" else t
