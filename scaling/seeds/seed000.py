"""Seed 000 (shared/reference/seeds/000_ulysses_2d_tp_trace.txt, shipped as SEED_FILE): every figure its
PyTorch trace printed (DeepSpeed-Ulysses attention, then a 2D tensor-parallel FFN, on rank 7 of P = 16 GPUs)
beside its closed form. Shapes follow the seed's labels, elements = their product, bytes = 2·elements (bf16),
FLOPs = 2·m·n·k per matmul, and the "Peak/Current memory allocation" lines come from a running model of
PyTorch's CUDA caching allocator (torch.cuda.max_memory_allocated / memory_allocated). MB/GB/TFLOPs are SI
(1e6/1e9/1e12).
"""

from __future__ import annotations

import math
from importlib import resources

from scaling.families.presets import get_preset
from scaling.core.table import footnoted, table

# the reference seeds ship with the package (pyproject.toml, package data): scaling/data/seeds/<name>, each a
# verbatim copy of shared/reference/seeds/<name> below a header naming it
SEED_FILE = "000_ulysses_2d_tp_trace.txt"


def seed_text(name: str = SEED_FILE) -> str:
    """The reference seed ``name`` as it was printed: scaling/data/seeds/<name> (importlib.resources) less its
    header, the lines up to '# ---'."""
    text = resources.files("scaling").joinpath("data", "seeds", name).read_text(encoding="utf-8")
    header, sep, body = text.partition("# ---\n")
    if not sep or not all(line.startswith("#") for line in header.splitlines()):
        raise ValueError(f"scaling/data/seeds/{name}: no '# ---' line ending a header of '#' lines")
    return body


_CFG = get_preset("seed000")
# the seed's setup: N tokens, d hidden, h heads, d' FFN width, L layers, P GPUs = DP x TP, bf16
SETUP = {"N": _CFG.seq_len, "d": _CFG.d_model, "h": _CFG.heads, "d'": _CFG.d_ff, "L": _CFG.blocks,
         "P": 16, "DP": 2, "TP": 8}
BYTES = 2
MIB = 2**20
CUBLAS_WORKSPACE = 32 * MIB  # PyTorch's default cuBLAS workspace on sm90 (Hopper), from its caching allocator

U, F = "Ulysses attention", "2D model parallel"
# tensor lines in trace order: (section, name, label, printed shape, printed elements, printed size)
TENSORS = [
    (U, "input", "[N/P, d]", (3750, 16384), 61440000, "122.88 MB"),
    *[(U, w, "[h, d, d/h]", (128, 16384, 128), 268435456, "536.87 MB") for w in "QKV"],
    (U, "O", "[h, d/h, d]", (128, 128, 16384), 268435456, "536.87 MB"),
    *[(U, t, "[h, N/P, d/h]", (128, 3750, 128), 61440000, "122.88 MB") for t in "qkv"],
    *[(U, f"{t}_ (after all-to-all)", "[P, h/P, N/P, d/h]", (16, 8, 3750, 128), 61440000, "122.88 MB")
      for t in "qkv"],
    *[(U, f"{t}_ (after transpose)", "[h/P, N, d/h]", (8, 60000, 128), 61440000, "122.88 MB") for t in "qkv"],
    (U, "A", "[h/P, N, N]", (8, 60000, 60000), 28800000000, "57.60 GB"),
    (U, "c", "[h/P, N, d/h]", (8, 60000, 128), 61440000, "122.88 MB"),
    (U, "c (after transpose)", "[N, h/P, d/h]", (60000, 8, 128), 61440000, "122.88 MB"),
    (U, "c_ (after all-to-all)", "[P, N/P, h/P, d/h]", (16, 3750, 8, 128), 61440000, "122.88 MB"),
    (U, "c_ (after transpose)", "[N/P, d]", (3750, 16384), 61440000, "122.88 MB"),
    (U, "O (reshaped)", "[d, d]", (16384, 16384), 268435456, "536.87 MB"),
    (U, "output", "[N/P, d]", (3750, 16384), 61440000, "122.88 MB"),
    (F, "input_", "[N/DP/TP, d]", (30000, 16384), 491520000, "0.98 GB"),
    (F, "W1", "[L, d, d'/TP]", (126, 16384, 6656), 13740539904, "27.48 GB"),
    (F, "W2", "[L, d'/TP, d]", (126, 6656, 16384), 13740539904, "27.48 GB"),
    (F, "inter", "[N/DP, d'/TP]", (30000, 6656), 199680000, "399.36 MB"),
]
# the trace's FLOP and memory lines in trace order, each after the tensor line with that index
LINES = [(4, "peak after weights", "2.27 GB"), (4, "flops q,k,v", "96.64 TFLOPs"),
         (7, "peak after q,k,v", "2.68 GB"), (10, "peak after all-to-all", "3.05 GB"),
         (13, "peak after transpose q_,k_,v_", "3.17 GB"), (13, "flops A = q_ x k_t", "117.96 TFLOPs"),
         (14, "peak after A", "60.65 GB"), (14, "flops c = A x v_", "117.96 TFLOPs"),
         (15, "peak after c", "60.77 GB"), (16, "peak after transpose c", "60.90 GB"),
         (17, "peak after all-to-all c", "60.90 GB"), (19, "peak after transpose c_, reshape O", "61.02 GB"),
         (19, "flops output = c_ x O", "32.21 TFLOPs"), (20, "peak after output", "61.02 GB"),
         (24, "current after inter", "56.50 GB"), (24, "peak after inter", "61.02 GB")]


def dim(expr: str, s: dict = SETUP) -> int:
    """One label entry, e.g. "N/DP/TP" = N // DP // TP, "d'/TP" (source: the labels of SEED_FILE)."""
    name, *divs = expr.strip().split("/")
    v = s[name]
    for q in divs:
        if v % s[q]:
            raise ValueError(f"{expr}: {v} is not divisible by {q}={s[q]}")
        v //= s[q]
    return v


def label_shape(label: str, s: dict = SETUP) -> tuple:
    """The shape a label like "[h/P, N, d/h]" states, from the setup's dims (SEED_FILE's labels)."""
    return tuple(dim(e, s) for e in label.strip("[]").split(","))


def block_bytes(n: int) -> int:
    """Bytes torch.cuda.memory_allocated counts for an n-byte tensor in a fresh segment (PyTorch
    c10/cuda/CUDACachingAllocator.cpp): n rounded up to 512 B; a large (>= 10 MB) request gets a segment
    rounded up to 2 MiB that is split only if more than 1 MiB remains, else the whole segment counts
    (122.88 MB -> 59·2 MiB = 123.73 MB); smaller ones split a 2 or 20 MiB segment. Used for SEED_FILE's
    memory lines, where every tensor is >= 10 MiB or a reuse of a same-size cached block."""
    r = -(-n // 512) * 512
    seg = -(-n // (2 * MIB)) * 2 * MIB
    return seg if n >= 10 * MIB and seg - r <= MIB else r


def flops(s: dict = SETUP) -> dict:
    """{trace name: (global FLOPs, per GPU)} of the four matmul lines, 2·m·n·k (SEED_FILE prints the GLOBAL
    count; per GPU = global / P): q,k,v 3·2·N·d·d; A and c 2·N·N·d each (h heads of N·N·d/h); output
    2·N·d·d. Per GPU these are scaling.families.transformer.step_flops' qkv, attention 2 units each, and out terms."""
    N, d, P = s["N"], s["d"], s["P"]
    g = {"flops q,k,v": 3 * 2 * N * d * d, "flops A = q_ x k_t": 2 * N * N * d,
         "flops c = A x v_": 2 * N * N * d, "flops output = c_ x O": 2 * N * d * d}
    return {k: (v, v / P) for k, v in g.items()}


def memory_program(s: dict = SETUP) -> list:
    """The seed's PyTorch program as allocator steps, one per memory line of SEED_FILE: (what, ops), an op
    (name, bytes) allocates, (name, None) frees. A transpose + reshape to a contiguous copy allocates the copy
    while its source lives, then drops the source (the name is reused); an all-to-all allocates its output and
    keeps its input; the cuBLAS workspace appears at the first matmul. After the attention only its output and
    the workspace remain (inferred: the trace prints no frees; 56.50 GB leaves room for ~157 MB)."""
    N, d, h, P, DP, TP, L, F_ = (s[k] for k in ("N", "d", "h", "P", "DP", "TP", "L", "d'"))
    K, q, m = s.get("K", h), s.get("q", d // h), s.get("m", 2)  # kv heads, head dim, MLP matrices (model_setup)
    a = BYTES * N // P * d  # the layer's input and output
    aq, akv = BYTES * N // P * h * q, BYTES * N // P * K * q  # a query-head and a kv-head activation
    wq, wkv = BYTES * d * h * q, BYTES * d * K * q  # Q and O; K and V
    size = {"q": aq, "k": akv, "v": akv}
    gone = ["input", "Q", "K", "V", "O", "q", "k", "v", "q_", "k_", "v_", "A", "c_t", "c_r"]
    return [("input, Q, K, V, O", [("input", a), ("Q", wq), ("K", wkv), ("V", wkv), ("O", wq)]),
            ("+ workspace (first matmul), q, k, v", [("workspace", CUBLAS_WORKSPACE), ("q", aq), ("k", akv),
                                                     ("v", akv)]),
            ("+ all-to-all outputs, inputs kept", [("q_a", aq), ("k_a", akv), ("v_a", akv)]),
            ("each copy beside its source, then the source dropped",
             [x for t in "qkv" for x in ((f"{t}_", size[t]), (f"{t}_a", None))]),
            ("+ A", [("A", BYTES * h // P * N * N)]), ("+ c", [("c", aq)]),
            ("the copy of c beside c, then c dropped", [("c_t", aq), ("c", None)]),
            ("+ all-to-all output c_, its input c kept", [("c_a", aq)]),
            ("the copy of c_ beside c_, then c_ dropped; O's reshape is a view", [("c_r", aq), ("c_a", None)]),
            ("+ output", [("output", a)]),
            ("attention freed but its output (inferred) and the workspace; + input_, W1, W2, inter"
             + (" (carved unrounded from A's freed cached segment instead: 56.5018 GB, same print)" if s == SETUP
                else ""),
             [*[(x, None) for x in gone], ("input_", BYTES * N // DP * d), ("W1", BYTES * L * d * (m - 1) * F_ // TP),
              ("W2", BYTES * L * d * F_ // TP), ("inter", BYTES * N // DP * (m - 1) * F_ // TP)]),
            ("the attention's high-water mark: max_memory_allocated is never reset", [])]


def memory_trace(s: dict = SETUP, exact: bool = False) -> list:
    """[(current, peak)] bytes after each step of memory_program, the peak a running maximum
    (torch.cuda.max_memory_allocated), for SEED_FILE's memory lines. exact: the tensors' bytes alone (no
    workspace, no block rounding), to show what the allocator model adds."""
    live, cur, peak, out = {}, 0, 0, []
    for _, ops in memory_program(s):
        for name, n in ops:
            if n is None:
                cur -= live.pop(name)
            else:
                live[name] = (0 if name == "workspace" else n) if exact else block_bytes(n)
                cur, peak = cur + live[name], max(peak, cur + live[name])
        out.append((cur, peak))
    return out


def _value(text: str) -> tuple[float, float, int]:
    """'122.88 MB' -> (122.88e6, 1e6, 2): value in base units, the unit, the printed decimals."""
    num, unit = text.split()
    scale = {"MB": 1e6, "GB": 1e9, "TFLOPs": 1e12}[unit]
    return float(num) * scale, scale, len(num.partition(".")[2])


# one table row's cells, each a column
def _row(section, name, quantity, label, printed, seed, closed, note="", **extra):
    unit = printed.split()[-1] in ("MB", "GB", "TFLOPs") and _value(printed)
    match = f"{closed / unit[1]:.{unit[2]}f}" == printed.split()[0] if unit else seed == closed
    return {"section": section, "name": name, "quantity": quantity, "label": label, "printed": printed,
            "seed": seed, "closed": closed, "match": match, "note": note, **extra}


def trace_rows(s: dict = SETUP) -> list[dict]:
    """One row per figure of SEED_FILE, in trace order: header (h/P, N/P), each tensor's shape (the label's
    formula), elements (product) and size (2·elements), the FLOP lines (2·m·n·k, global and per GPU) and the
    memory lines (memory_trace). match: the closed form, rounded as the seed printed it, equals the print."""
    rows = [_row("setup", "head per GPU", "count", "h/P", "8", 8, dim("h/P", s)),
            _row("setup", "tokens per GPU", "count", "N/P", "3750", 3750, dim("N/P", s))]
    fl, mem, naive, prog = flops(s), memory_trace(s), memory_trace(s, exact=True), memory_program(s)
    fix = {"input_": ("[N/DP, d]", f"each TP rank holds its DP group's whole {s['N'] // s['DP']}-token shard")}
    for i, (sec, name, label, shape, elements, size) in enumerate(TENSORS):
        want = label_shape(label, s)
        bad = ["", "", ""]
        if want != shape:  # the label's formula against the printed shape; name the formula that fits
            good, why = fix[name]
            right = label_shape(good, s)
            bad = [f"INCONSISTENT: label {label} is wrong: {why}, {good} = {v}" for v in
                   (right, math.prod(right), f"{BYTES * math.prod(right) / 1e9:.5f} GB")]
        n = math.prod(want)
        rows += [_row(sec, name, "shape", label, str(shape), shape, want, bad[0]),
                 _row(sec, name, "elements", label, str(elements), elements, n, bad[1]),
                 _row(sec, name, "size", label, size, _value(size)[0], BYTES * n, bad[2])]
        for _, lname, printed in (x for x in LINES if x[0] == i):
            if lname.startswith("flops"):
                g, per = fl[lname]
                rows.append(_row(sec, lname, "FLOPs", "2·m·n·k", printed, _value(printed)[0], g,
                                 f"INCONSISTENT: GLOBAL over all P={s['P']} GPUs, not per GPU: per GPU "
                                 f"{per / 1e12:.2f} TFLOPs", per_gpu=per))
                continue
            k = sum(r["quantity"] == "GB" for r in rows)
            j = 0 if lname.startswith("current") else 1
            v, raw = mem[k][j], naive[k][j]
            rows.append(_row(sec, lname, "GB", "allocator", printed, _value(printed)[0], v,
                             _memory_note(prog[k][0], v, raw, printed), tensors_only=raw))
    return rows


def _memory_note(what: str, v: float, raw: float, printed: str) -> str:
    """The step, and what the allocator model adds to the tensors' bytes alone (raw)."""
    edge = min(abs(v - _value(printed)[0] + sign * 5e6) for sign in (1, -1))
    ws = CUBLAS_WORKSPACE if v - raw > CUBLAS_WORKSPACE else 0
    return (f"{what}; tensors alone {raw / 1e9:.4f} GB (would print {raw / 1e9:.2f}), +{(v - raw) / 1e6:.2f} MB = "
            + ("the 33.55 MB cuBLAS workspace (32 MiB: PyTorch's sm90 default, so a Hopper GPU) + " if ws else "")
            + f"{(v - raw - ws) / 1e6:.2f} MB block rounding (122.88 MB fills a 59·2 MiB = 123.73 MB block); "
            f"{edge / 1e6:.4f} MB from the rounding edge")


def model_setup(cfg, context: int, data: int, tensor: int) -> dict:
    """The trace's setup for a transformer (scaling.families.transformer.TransformerConfig) on P = context GPUs: Ulysses
    attention over all P (N/P tokens each, then h/P query heads and K/P kv heads over all N), then the FFN's 2D
    split DP = data × TP = tensor of the same P GPUs (the seed's program): N seq_len, d, h, K kv heads, q head dim,
    d', m MLP matrices, L blocks. ValueError where a split does not divide."""
    for name, v in (("context", context), ("data", data), ("tensor", tensor)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"--{name} must be a positive integer, got {v!r}")
    if data * tensor != context:
        raise ValueError(f"data·tensor = {data}·{tensor} must be the context's {context} GPUs (the seed's FFN runs "
                         "on the attention's GPUs)")
    s = {"N": cfg.seq_len, "d": cfg.d_model, "h": cfg.heads, "K": cfg.kv_heads, "q": cfg.head_dim, "d'": cfg.d_ff,
         "m": cfg.mlp_matrices, "L": cfg.blocks, "P": context, "DP": data, "TP": tensor}
    for what, v, by in (("seq_len N", s["N"], "P"), ("heads h", s["h"], "P"), ("kv_heads K", s["K"], "P"),
                        ("seq_len N", s["N"], "DP"), ("d_ff d'", s["d'"], "TP")):
        if v % s[by]:
            raise ValueError(f"{what} = {v} must be divisible by {by} = {s[by]}")
    return s


def model_tensors(s: dict) -> list[tuple[str, str, tuple]]:
    """(section, name, shape) of every tensor of the seed's program for the setup s (model_setup): the seed's
    labels with kv heads K and head dim q in place of h and d/h where a tensor is a key's or a value's."""
    N, d, h, K, q, P, DP, TP, L, F_, m = (s[k] for k in ("N", "d", "h", "K", "q", "P", "DP", "TP", "L", "d'", "m"))
    heads = {"q": h, "k": K, "v": K}
    return [(U, "input", (N // P, d)), (U, "Q", (h, d, q)), (U, "K", (K, d, q)), (U, "V", (K, d, q)),
            (U, "O", (h, q, d)), *[(U, t, (heads[t], N // P, q)) for t in "qkv"],
            *[(U, f"{t}_ (after all-to-all)", (P, heads[t] // P, N // P, q)) for t in "qkv"],
            *[(U, f"{t}_ (after transpose)", (heads[t] // P, N, q)) for t in "qkv"],
            (U, "A", (h // P, N, N)), (U, "c", (h // P, N, q)), (U, "c (after transpose)", (N, h // P, q)),
            (U, "c_ (after all-to-all)", (P, N // P, h // P, q)), (U, "c_ (after transpose)", (N // P, h * q)),
            (U, "O (reshaped)", (h * q, d)), (U, "output", (N // P, d)),
            (F, "input_", (N // DP, d)), (F, "W1", (L, d, (m - 1) * F_ // TP)), (F, "W2", (L, F_ // TP, d)),
            (F, "inter", (N // DP, (m - 1) * F_ // TP))]


def model_flops(s: dict) -> dict:
    """{matmul: (global FLOPs, per GPU)}, 2·m·n·k: q,k,v 2·N·d·(h + 2K)·q; A and c 2·N·N·h·q each; output
    2·N·h·q·d; per GPU global/P."""
    N, d, h, K, q, P = (s[k] for k in ("N", "d", "h", "K", "q", "P"))
    g = {"q,k,v": 2 * N * d * (h + 2 * K) * q, "A = q_ x k_t": 2 * N * N * h * q, "c = A x v_": 2 * N * N * h * q,
         "output = c_ x O": 2 * N * h * q * d}
    return {k: (v, v / P) for k, v in g.items()}


def all_to_all_bytes(s: dict) -> dict:
    """Bytes each GPU sends in each all-to-all: (P − 1)/P of its tensor (the part for the others): q and c
    N/P·h·q elements, k and v N/P·K·q, 2 bytes each."""
    N, h, K, q, P = (s[k] for k in ("N", "h", "K", "q", "P"))
    part = (P - 1) / P * BYTES * N // P * q
    return {"q": part * h, "k": part * K, "v": part * K, "c": part * h}


def model_trace(cfg, context: int, data: int, tensor: int, gpu: bool = True) -> dict:
    """The seed's trace for any transformer (model_setup): tensors (shape, elements, bytes), FLOPs, all-to-all
    bytes and the memory after each step of memory_program, (current, peak): PyTorch's allocator model on a GPU
    (block_bytes, the cuBLAS workspace), the tensors' bytes alone on a TPU (``gpu`` False)."""
    s = model_setup(cfg, context, data, tensor)
    tensors = [{"section": sec, "name": name, "shape": list(shape), "elements": math.prod(shape),
                "bytes": BYTES * math.prod(shape)} for sec, name, shape in model_tensors(s)]
    mem = memory_trace(s, exact=not gpu)
    steps = [{"step": what, "current": c, "peak": p} for (what, _), (c, p) in zip(memory_program(s), mem)]
    return {"setup": s, "tensors": tensors, "flops": {k: {"global": g, "per_gpu": per} for k, (g, per) in
                                                       model_flops(s).items()},
            "all_to_all_bytes_per_gpu": all_to_all_bytes(s), "memory": steps, "allocator": gpu}


def render_model(t: dict) -> str:
    """model_trace as text: the tensors, the FLOPs, the all-to-alls, the memory steps."""
    s = t["setup"]
    ff = s["d'"]
    out = [f"trace: N={s['N']} d={s['d']} h={s['h']} K={s['K']} q={s['q']} d'={ff} L={s['L']}, P={s['P']} "
           f"(Ulysses), DP={s['DP']} x TP={s['TP']} (FFN); bf16; "
           + ("PyTorch's allocator model (GPU)" if t["allocator"] else "the tensors' bytes (no allocator model)")]
    out += table(("section", "tensor", "shape", "elements", "size"),
                 [(r["section"], r["name"], str(tuple(r["shape"])), f"{r['elements']:,}",
                   f"{r['bytes'] / 1e9:.2f} GB" if r["bytes"] >= 1e9 else f"{r['bytes'] / 1e6:.2f} MB")
                  for r in t["tensors"]])
    out += [f"flops {k}: {v['global'] / 1e12:.2f} TFLOPs ({v['per_gpu'] / 1e12:.2f} per GPU)"
            for k, v in t["flops"].items()]
    out += [f"all-to-all {k}: {v / 1e6:.2f} MB sent per GPU" for k, v in t["all_to_all_bytes_per_gpu"].items()]
    out += [f"memory after {m['step']}: current {m['current'] / 1e9:.2f} GB, peak {m['peak'] / 1e9:.2f} GB"
            for m in t["memory"]]
    return "\n".join(out)


def render(rows: list[dict] | None = None) -> str:
    """The table of trace_rows (section, quantity, seed label, seed value, closed form, match, note) and a summary
    line: figures of SEED_FILE reproduced to the printed digits, the others explained, inconsistencies stated."""
    rows = trace_rows() if rows is None else rows

    def show(r):
        c = r["closed"]
        if r["quantity"] == "FLOPs":
            return f"{c / 1e12:.2f} TFLOPs ({r['per_gpu'] / 1e12:.2f}/GPU)"
        if r["quantity"] in ("size", "GB"):
            return f"{c / 1e9:.4f} GB" if c >= 1e9 else f"{c / 1e6:.3f} MB"
        return str(c)

    cells, notes = footnoted([(r["section"], f"{r['name']} {r['quantity']}", r["label"], r["printed"], show(r),
                               "✓" if r["match"] else "✗", r["note"]) for r in rows], 6)
    lines = table(("section", "quantity", "seed label", "seed value", "closed form", "match", "note"), cells)
    ok = sum(r["match"] for r in rows)
    explained = sum(bool(r["note"]) for r in rows if not r["match"])
    bad = sum(r["note"].startswith("INCONSISTENT") for r in rows)
    lines.append(f"{ok} of {len(rows)} figures reproduced to the printed digits (4 significant; 0.98 GB has 2), "
                 f"{explained} of the {len(rows) - ok} others explained; {bad} rows state an inconsistency of the seed")
    return "\n".join([*lines[:-1], "notes:", *notes, lines[-1]])

