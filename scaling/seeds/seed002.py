"""Seed 002 (shared/reference/seeds/002_deepflow_output.txt, shipped as SEED_FILE): DeepFlow's report for an LSTM
language model on one projected accelerator, every figure recomputed from the closed forms below and set beside
the seed's. What produced it (docs/findings.md, "Seed 002"): DeepFlow (nanocad-lab/DeepFlow), its 2019 perf.py
(commit 5540eae) with the exp_config.yaml stored beside this very report in that repository
(search_scripts/hw_architecture/membw_batch/data_scale100/core0.2592_DRAM0.2592_L20.16896000000000005_
shared_mem0.20275200000000007/, commit e6a5da0), debug prints on, then its search script's time_limit.sh line.

The model (DeepFlow's LSTM language model, per step of B sequences of S tokens):
  hidden    L LSTM layers of width D, G = 4 gates: per token and layer the gate GEMM [B, 2D]·[2D, G·D] (Cf),
            backward [B, G·D]·[G·D, 2D] (Cb_act) and [2D, B]·[B, G·D] (Cb_wt); pointwise gates
  softmax   the output layer over the vocabulary V on B·S tokens, [B·S, K]·[K, V] and its two backward GEMMs,
            K = D (DeepFlow's perf.py runs with proj = False: no projection in the softmax or in Time)
  projection [B·S, D]·[D, P] and its backward, printed but not in Time (proj = False)
  embedding  read and written once forward, once backward: 2·B·D·S elements each

The kernel model (DeepFlow's, the hierarchical one of issue 22):
  hardware  a power budget split between core, DRAM, L2 and shared memory: peak = f_core·TDP/e_flop,
            DRAM bandwidth f_dram·TDP/e_dram_byte, L2 and shared-memory bandwidth likewise; a memory's size is its
            bandwidth over a bank's bandwidth times a bank's size; compute and DRAM derated by 0.7 (th_scale)
  tiles     the largest power of two t with 3·t²·prec ≤ the memory's size: X1 from the L2 (reloads from HBM),
            X2 from shared memory (reloads from L2)
  GEMM      (m, k, n): with k ≤ X the m×k operand is read once and the k×n operand ⌈m/X⌉ times, else those
            ⌈n/X⌉ and ⌈m/X⌉ times, the m×n output once: bytes = prec·(m·k·r_AB + k·n·r_BC + m·n);
            FLOPs 2·m·k·n + m·n·(15 + 5·⌈k/X2⌉) (DeepFlow's per-output charge); time the roofline
            (FLOPs/th if FLOPs/bytes ≥ th/bw, else bytes/bw + 50 ns + l2 bytes/L2 bw) + one launch (37 µs)
  pointwise its FLOPs and bytes through the same roofline, plus the launches DeepFlow charges (15 per LSTM cell
            pass, 4 per softmax pass)
  update    gradient clipping 4 FLOPs and 3 words per weight, AdamW-like apply 3 FLOPs and 7 words per weight
  step      40·(Cf + Cb) (L + L·(S − 1) cell passes with one pipeline of one stage) + the hidden update (R) +
            the softmax forward and backward + the embedding forward and backward + the softmax update
"""

from __future__ import annotations

import math
import re

from scaling.seeds.seed000 import seed_text
from scaling.core.table import footnoted, prose, table

SEED_FILE = "002_deepflow_output.txt"
GIB, TIB, MIB = 2**30, 2**40, 2**20

# DeepFlow's inputs: the exp_config.yaml stored beside the seed (model_param, tech_param, power_breakdown; sizes
# and bandwidths in binary units, "GB" = 2^30 B, as its config.py converts them) and perf.py's constants
MODEL = {"B": 512, "V": 800_000, "L": 2, "D": 19_968, "P": 2_048, "S": 20, "G": 4, "prec": 4, "launch": 37e-6}
HARDWARE = {"TDP": 300.0, "core": 0.2592, "DRAM": 0.2592, "L2": 0.16896000000000005,
            "shared_mem": 0.20275200000000007, "e_flop": 119e-13, "e_dram_bit": 6e-12, "e_l2_bit": 5e-15,
            "e_smem_bit": 1e-15, "hbm_stack_bw": 225 * GIB, "hbm_stack_bytes": 4 * GIB,
            "bank_bw": 4000 * GIB, "bank_bytes": 32 * 1024, "derate": 0.7, "mem_latency": 50e-9}
PROJ = False  # perf.py's hard-coded switch: no projection in the softmax's K, the parameters or Time
SEARCH_BATCH, DATA_SCALE = 32, 100  # time_limit.sh's arguments in DeepFlow's search script (not the model's B)
WORDS_PER_EPOCH = 768_648_884  # time_limit.sh's corpus size (tokens) at data_scale 1


def hardware(h: dict = HARDWARE, prec: int = MODEL["prec"]) -> dict:
    """The accelerator from its power budget (module docstring): th and bw the derated compute and DRAM rates,
    peak and dram the printed (underated) ones, l2_bw, l2_bytes, smem_bytes, the tiles X1 (L2) and X2 (shared
    memory), and the inflection point th/bw."""
    peak = h["core"] * h["TDP"] / h["e_flop"]
    dram = h["DRAM"] * h["TDP"] / (8 * h["e_dram_bit"])
    l2_bw = h["L2"] * h["TDP"] / (8 * h["e_l2_bit"])
    smem_bw = h["shared_mem"] * h["TDP"] / (8 * h["e_smem_bit"])
    l2_bytes = l2_bw / h["bank_bw"] * h["bank_bytes"]
    smem_bytes = smem_bw / h["bank_bw"] * h["bank_bytes"]
    hw = {"peak": peak, "dram": dram, "th": peak * h["derate"], "bw": dram * h["derate"], "l2_bw": l2_bw,
          "l2_bytes": l2_bytes, "smem_bytes": smem_bytes, "mem_bytes": dram / h["hbm_stack_bw"] * h["hbm_stack_bytes"],
          "X1": tile(l2_bytes, prec), "X2": tile(smem_bytes, prec), "latency": h["mem_latency"]}
    hw["inflection"] = hw["th"] / hw["bw"]
    return hw


def tile(size: float, prec: int) -> int:
    """The largest power of two t with three t×t tiles of prec-byte words in ``size`` bytes:
    2^⌊log2 √(size/3·prec)⌋."""
    return 2 ** math.floor(math.log2(math.sqrt(size / prec / 3)))


def roofline(flop: float, gmem: float, l2mem: float, hw: dict) -> float:
    """FLOPs/th where the intensity FLOPs/bytes reaches the inflection point th/bw, else bytes/bw + the memory
    latency + the L2 bytes over the L2 bandwidth (DeepFlow's roofline)."""
    if flop / gmem < hw["inflection"]:
        return gmem / hw["bw"] + hw["latency"] + l2mem / hw["l2_bw"]
    return flop / hw["th"]


def reloads(m: int, k: int, n: int, X: int) -> tuple[int, int, int]:
    """(r_AB, r_AC, r_BC): how often the m×k operand, the m×n output and the k×n operand pass a memory whose tile is
    X: k ≤ X: (1, 1, ⌈m/X⌉); else (⌈n/X⌉, 1, ⌈m/X⌉)."""
    return (1 if k <= X else math.ceil(n / X)), 1, math.ceil(m / X)


def gemm(m: int, k: int, n: int, hw: dict, prec: int = MODEL["prec"], launch: float = MODEL["launch"]) -> dict:
    """One GEMM [m, k]·[k, n] (module docstring): its reloads at X1 and X2, HBM bytes (gmem), L2 bytes (l2mem),
    FLOPs with DeepFlow's per-output charge, intensity, and time (the roofline plus one launch)."""
    def moved(r):
        return prec * (m * k * r[0] + m * n * r[1] + k * n * r[2])

    r1, r2 = reloads(m, k, n, hw["X1"]), reloads(m, k, n, hw["X2"])
    flop = 2 * m * k * n + m * n * (15 + 5 * math.ceil(k / hw["X2"]))
    g, l2 = moved(r1), moved(r2)
    return {"m": m, "k": k, "n": n, "r_gmem": r1, "r_l2": r2, "flop": flop, "gmem": g, "l2mem": l2,
            "intensity": flop / g, "time": roofline(flop, g, l2, hw) + launch}


def pointwise(flop: float, mem: float, launches: int, hw: dict, launch: float = MODEL["launch"]) -> dict:
    """A pointwise pass: FLOPs and bytes through the roofline, plus its kernel launches."""
    return {"flop": flop, "mem": mem, "intensity": flop / mem, "time": roofline(flop, mem, 0.0, hw) + launches * launch}


def update(d0: int, d1: int, hw: dict, prec: int = MODEL["prec"]) -> dict:
    """A [d0, d1] weight's update: gradient clipping (4 FLOPs, 3 words a weight: the norm and the scaling) and the
    apply (3 FLOPs, 7 words: read weight, gradient and 3 words of state, write 2), each through the roofline."""
    n = d0 * d1
    clip = {"flop": 4 * n, "mem": 3 * n * prec}
    apply = {"flop": 3 * n, "mem": 7 * n * prec}
    for u in (clip, apply):
        u["intensity"] = u["flop"] / u["mem"]
        u["time"] = roofline(u["flop"], u["mem"], 0.0, hw)
    return {"clip": clip, "apply": apply, "time": clip["time"] + apply["time"]}


def report(model: dict = MODEL) -> dict:
    """Every quantity of the report, from the closed forms (module docstring)."""
    B, V, L, D, P, S, G, prec = (model[k] for k in ("B", "V", "L", "D", "P", "S", "G", "prec"))
    hw = hardware(prec=prec)
    K, BS = (P if PROJ else D), B * S
    upd = {"Hidden": update(2 * D, G * D, hw), "Projection": update(D, P, hw), "Softmax": update(K, V, hw)}
    g = {"Cf": gemm(B, 2 * D, G * D, hw), "Cb_act": gemm(B, G * D, 2 * D, hw), "Cb_wt": gemm(2 * D, B, G * D, hw),
         "softmax_f": gemm(BS, K, V, hw), "softmax_b_wt": gemm(K, BS, V, hw), "softmax_b_act": gemm(BS, V, K, hw),
         "projection": gemm(BS, D, P, hw), "projection_b_wt": gemm(P, BS, D, hw),
         "projection_b_act": gemm(BS, P, D, hw)}
    gates = B * D * G  # the four gates' pointwise work: sigmoid/tanh (1 + 5/4 + 1 FLOPs), 3·2 + 2·5/4 words
    pw = {"Hidden": pointwise(gates * (1 + 5 / 4 + 1), prec * gates * (3 * 2 + 2 * 5 / 4), 15, hw),
          # backward: the gates' derivatives, and the weight gradient's accumulation, 2D·G·D words with no ×prec
          "(gr) Hidden": pointwise(B * D * (1 + 5 / 4 + 1) + 2 * D * G * D,
                                   prec * B * D * (3 * 2 + 2 * 5 / 4) + 2 * D * G * D * 3, 15, hw),
          "Softmax": pointwise(BS * (3 * V - 1), prec * BS * 7 * V, 4, hw),
          "(gr) Softmax": pointwise(BS * V * 5, prec * BS * V * 11, 4, hw)}
    emb_mem = 2 * B * D * S * prec
    emb = emb_mem / hw["bw"] + hw["latency"] + model["launch"]
    parts = {"Cf": g["Cf"]["time"] + pw["Hidden"]["time"],
             "Cb": g["Cb_act"]["time"] + g["Cb_wt"]["time"] + pw["(gr) Hidden"]["time"],
             "R": upd["Hidden"]["time"],  # no data-parallel all-reduce (dp = 1)
             "softmax_f": g["softmax_f"]["time"] + pw["Softmax"]["time"],
             "softmax_b": g["softmax_b_wt"]["time"] + g["softmax_b_act"]["time"] + pw["(gr) Softmax"]["time"],
             "embedding_f": emb, "embedding_b": emb, "projection_f": g["projection"]["time"],
             "projection_b": g["projection_b_wt"]["time"] + g["projection_b_act"]["time"]}
    passes = L + L * (S - 1)  # LSTM cell passes on one pipeline stage (lp = hlp = 1)
    time = (passes * (parts["Cf"] + parts["Cb"]) + parts["R"] + parts["softmax_f"] + parts["softmax_b"]
            + parts["embedding_f"] + parts["embedding_b"] + upd["Softmax"]["time"])
    params = V * D + (2 * D + 1) * G * D * L + D * P + (K + 1) * V
    # memory per data shard, in words (DeepFlow's util.getTotMemReq): activations, weights, pointwise buffers
    mem = {"Hidden": (B * 2 * D * S * L, (2 * D + 1) * G * D * L, B * D * 9 * L * S),
           "Softmax": (BS * V, (P + 1) * V, 2 * BS * V + BS),  # the weights with P, though proj = False
           "Projection": (BS * P, (D + 1) * P, BS * P), "Embedding": (BS * D, V * D, 0)}
    mem_bytes = {k: prec * sum(v) for k, v in mem.items()}
    total = sum(mem_bytes.values())
    steps = DATA_SCALE * WORDS_PER_EPOCH // (SEARCH_BATCH * S)  # a day's budget over an epoch's steps
    return {"hw": hw, "update": upd, "gemm": g, "pointwise": pw, "embedding_mem": emb_mem, "parts": parts,
            "time": time, "params": params, "memory": mem_bytes, "memory_total": total,
            "memory_kind": {kind: prec * sum(v[i] for v in mem.values())
                            for i, kind in enumerate(("Activation", "Weight", "Pointwise"))},
            "softmax_memory_with_D": prec * (BS * V + (D + 1) * V + 2 * BS * V + BS),
            "overflow": total / hw["mem_bytes"], "time_per_step": 86400 / steps,
            "time_per_step_model_batch": 86400 / (DATA_SCALE * WORDS_PER_EPOCH // (B * S))}


def _f(x) -> str:
    """A float as Python prints it with {:,} (DeepFlow's format for times)."""
    return f"{x:,}"


def text(r: dict | None = None) -> str:
    """The report in the seed's layout, every figure from ``report``: the lines the seed prints, in its order."""
    r = report() if r is None else r
    hw, out = r["hw"], []

    def roof(i):
        out.extend([f"inflection_point: {hw['inflection']:.2f}", f"comp_int: {i:.2f}"])

    for name, u in r["update"].items():
        roof(u["apply"]["intensity"])
        roof(u["clip"]["intensity"])
        out += [f"({name}) gradclip_flop: {u['clip']['flop']:,}, gradclip_mem: {u['clip']['mem']:,}",
                f"({name}) gradclip_time: {_f(u['clip']['time'])}", "",
                f"({name}) applyGrad_flop: {u['apply']['flop']:,}, applyGrad_mem: {u['apply']['mem']:,}",
                f"({name}) applyGrad_time: {_f(u['apply']['time'])}", ""]

    def gemm_lines(name):
        g = r["gemm"][name]
        t = gemm(g["n"], g["k"], g["m"], hw)  # DeepFlow also weighs the transposed orientation (never faster here)
        for x in (g, t):
            for level, rl in (("gmem", x["r_gmem"]), ("l2mem", x["r_l2"])):
                out.extend([f"{level}: reload_AB: {{}}, reload_AC: {{}}, reload_BC: {{}}", " %d %d %d" % rl])
        roof(g["intensity"])
        roof(t["intensity"])
        out.extend([f"{name} GEMM_flop: {g['flop']:,}, GEMM_gmem: {g['gmem']:,}, GEMM_l2mem: {g['l2mem']:,}",
                    f"{name} GEMM_time: {_f(g['time'])}", ""])

    def point(name, label, time_label, blank):
        p = r["pointwise"][name]
        roof(p["intensity"])
        out.append(f"{label} point_flop: {int(p['flop']):,}, point_mem: {int(p['mem']):,}")
        out.extend([""] * blank + [f"{time_label}: {_f(p['time'])}", ""])

    gemm_lines("Cf")
    point("Hidden", "Hidden", "Hidden point_time", 1)
    gemm_lines("Cb_act")
    gemm_lines("Cb_wt")
    point("(gr) Hidden", "(gr) Hidden", "Hidden point_time", 0)
    gemm_lines("softmax_f")
    point("Softmax", "Softmax", "point_time", 0)
    gemm_lines("softmax_b_wt")
    gemm_lines("softmax_b_act")
    point("(gr) Softmax", "(gr) Softmax", "(gr) Softmax point_time", 0)
    for name in ("projection", "projection_b_wt", "projection_b_act"):
        gemm_lines(name)
    ones = "dp: 1, lp: 1, hlp: 1, kp_hidden_dim1: 1, kp_hidden_dim2: 1, "
    p = r["parts"]
    out += [f"Embedding_mem: {r['embedding_mem']:,}", f"(gr) Embedding_mem: {r['embedding_mem']:,}",
            ones + "kp_softmax_dim1: 1, kp_softmax_dim2: 1, kp_embedding_dim1: 1, kp_embedding_dim2: 1,  "
            "kp_hidden_type: -1, kp_softmax_type: -1, kp_embedding_type: -1", "",
            f"Cf: {p['Cf']}, Cb:; {p['Cb']}, R: {p['R']}, softmax_f: {p['softmax_f']}, softmax_b:{p['softmax_b']}, "
            f"embedding_f: {p['embedding_f']}, embedding_b: {p['embedding_b']}, projection_f: {p['projection_f']}, "
            f"projection_b: {p['projection_b']}", "", f"#Parameters: {r['params'] / 1e9:.2f} Billion", "",
            "=" * 22, "Hardware Configuration", "=" * 22,
            f"Throughput: {hw['peak'] / 1e12:.1f} Tflops", f"Memory Bandwidth: {hw['dram'] / GIB:.1f} GB/s",
            f"Memory Size: {hw['mem_bytes'] / GIB:.1f} GB", f"L2 Bandwidth: {hw['l2_bw'] / TIB:.1f} TB/s",
            f"L2 Size: {hw['l2_bytes'] / MIB:.1f} MB", f"Shared Memory Size: {hw['smem_bytes'] / MIB:.1f} MB",
            "Interconnection Bandwidth: 0.0 GB/s", "", ""]
    m, kind, total = r["memory"], r["memory_kind"], r["memory_total"]
    by_layer = [f"Total Memory: {total / GIB:.1f} GB"] + [f"{k} Memory: {m[k] / GIB:.1f} GB" for k in
                                                          ("Embedding", "Hidden", "Softmax", "Projection")]
    by_kind = [f"Total Memory: {total / GIB:.1f} GB"] + [f"{k} Memory: {kind[k] / GIB:.1f} GB" for k in
                                                         ("Weight", "Activation", "Pointwise")]
    overflow = ("Memory Overflow Rate (Total Memory Required per Data Shard / Memory capacity per node): "
                f"{r['overflow']:.1f}")
    out += ["=" * 43, "Memory Requirement Breakdown per Data Shard", "=" * 43, *by_layer, "", *by_kind, "", "",
            overflow, "", "", "", "=" * 57, "Memory Requirement Breakdown per Data Shard Per Model Shard", "=" * 59,
            *by_layer, "", overflow, "", "", *by_kind, "", "", "", "=" * 20, "Parallelism Strategy", "=" * 20,
            ones.rstrip() + "kp_softmax_dim1: 1, kp_softmax_dim2: 1, kp_embedding: 1,kp_projection_dim1: 1, "
            "kp_proejction_dim2: 1", "", f"Time: {r['time']:.8f}", f"time_per_step: {r['time_per_step']:.8f}"]
    return "\n".join(out) + "\n"


_NUM = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?")  # a printed figure, not a digit of a name (l2mem)

# what a reader of the seed should know of a line (a pattern the line starts with -> note; the first): how
# DeepFlow computes it where that is not what its label says, and where the seed is inconsistent with itself
NOTES = [
    (r"\(Hidden\) gradclip", "one [2D, 4D] matrix: no layer factor, no bias (#Parameters counts (2D+1)·4D·L)"),
    (r"\(Hidden\) applyGrad", "one [2D, 4D] matrix, as gradclip"),
    (r"\(Softmax\) ", "the [D, V] output layer: proj = False puts D, not the projection P, in its place"),
    (r"\(Projection\) ", "printed, not in Time (proj = False)"),
    ("projection", "printed, not in Time (proj = False)"),
    (r"\w+ GEMM_flop", "2·m·k·n + m·n·(15 + 5·⌈k/X2⌉): DeepFlow charges each output 15 FLOPs + 5 per "
                       "shared-memory tile"),
    (r"\(gr\) Hidden point_flop",
     "its weight-gradient term, 2D·4D·3 words, is added without ×prec (DeepFlow's getCb)"),
    ("Softmax Memory", "INCONSISTENT: the weights counted (P + 1)·V while the softmax GEMMs and #Parameters use D "
                       "(proj = False); with D: {softmax_memory_with_D}"),
    ("time_per_step", "INCONSISTENT: DeepFlow's search script passes its own batch of 32 to time_limit.sh, not the "
                      "model's 512; with 512: {time_per_step_model_batch}"),
]


def rows(r: dict | None = None) -> list[dict]:
    """One row per numeric line of the seed: its line number, text, the numbers it prints, the package's line and
    numbers (``text``), whether every number matches to the printed digits, and a note (NOTES)."""
    r = report() if r is None else r
    seed = seed_text(SEED_FILE).splitlines()
    ours = text(r).splitlines()
    extra = {"softmax_memory_with_D": f"{r['softmax_memory_with_D'] / GIB:.1f} GB",
             "time_per_step_model_batch": f"{r['time_per_step_model_batch']:.8f}"}
    if len(ours) != len(seed):
        raise ValueError(f"{len(ours)} lines recomputed against the seed's {len(seed)}")
    out = []
    for i, (s, o) in enumerate(zip(seed, ours), start=1):
        ns = _NUM.findall(s)
        if not ns:
            continue
        note = next((v.format(**extra) for k, v in NOTES if re.match(k, s)), "")
        out.append({"line": i, "seed": s, "package": o, "seed_numbers": ns, "package_numbers": _NUM.findall(o),
                    "match": ns == _NUM.findall(o), "note": note})
    return out


def render(rs: list[dict] | None = None) -> str:
    """The table of ``rows`` (line, seed, package, match, note) and a summary line."""
    rs = rows() if rs is None else rs
    cut = lambda text, n: text if len(text) <= n else text[: n - 3] + "..."  # noqa: E731  (--text: whole lines)
    cells, notes = footnoted([(r["line"], cut(r["seed"], 52), cut(" ".join(r["package_numbers"]), 44),
                               "✓" if r["match"] else "✗", r["note"]) for r in rs], 4)
    body = table(("line", "seed", "package (closed form)", "match", "note"), cells)
    ok = sum(r["match"] for r in rs)
    bad = sum(r["note"].startswith("INCONSISTENT") for r in rs)
    body.append(prose(f"{ok} of {len(rs)} numeric lines reproduced to the printed digits; {bad} state an "
                      "inconsistency of the seed (the printed figure is DeepFlow's, the correct one in the note)"))
    return "\n".join([*body[:-1], "notes:", *notes, body[-1]])

