"""Seed 000 (shared/reference/seeds/000_ulysses_2d_tp_trace.txt, shipped with the package as
scaling/data/seeds/000_ulysses_2d_tp_trace.txt): scaling.seeds.seed000 gives one row per printed figure, in trace
order, each reproduced or explained. Expected values are hand calculations from the seed's dims (N = 60000,
d = 16384, h = 128, d' = 53248, L = 126, P = 16 = DP 2 x TP 8, bf16), written out below, and the trace itself
(parsed here with regexes), never scaling.seeds.seed000's own output."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scaling.seeds import seed000 as s0
from jax_scaling.cli import main
from scaling.hardware.chips import CHIPS
from scaling.core.mesh_shape import MeshShape
from scaling.families.presets import get_preset
from scaling.core.workload import Workload
from scaling.families.transformer import step_flops
from verify.trace import compile_seed000_layer, render_compiled

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


@pytest.fixture(scope="module")
def rows():
    return s0.trace_rows()


@pytest.fixture(scope="module")
def trace():
    return s0.seed_text()  # the copy shipped with the package: present in every clone and install


def test_shipped_trace_is_the_seed(trace):
    """The shipped copy's header names its source, and the text below it is the trace: its first and last
    lines as the seed printed them (copied by hand)."""
    from importlib import resources

    head = resources.files("scaling").joinpath("data", "seeds", s0.SEED_FILE).read_text().split("# ---\n")[0]
    assert "shared/reference/seeds/000_ulysses_2d_tp_trace.txt" in head
    lines = trace.splitlines()
    assert lines[0] == "my_rank 7/16 my_device 7/8" and lines[-1] == "Peak memory allocation: 61.02 GB"


def test_one_row_per_printed_figure(rows, trace):
    # 25 tensor lines x (torch.Size, elements, size) + 4 flops + 11 peaks + 1 current + 2 header figures = 93
    n = (len(re.findall(r"torch\.Size\(", trace)) + len(re.findall(r"elements: \d+", trace))
         + len(re.findall(r"size:? [\d.]+ [MG]B", trace)) + len(re.findall(r"flops: ", trace))
         + len(re.findall(r"Peak memory allocation", trace)) + len(re.findall(r"Current memory allocation", trace))
         + len(re.findall(r"head per GPU: \d+", trace)) + len(re.findall(r"tokens per GPU: \d+", trace)))
    assert n == 93 == len(rows)


def test_printed_values_are_the_trace_in_order(rows, trace):
    tensors = re.findall(r"torch\.Size\(\[([\d, ]+)\]\), elements: (\d+), size:? ([\d.]+ [MG]B)", trace)
    got = [r for r in rows if r["quantity"] in ("shape", "elements", "size")]
    want = [x for t, e, z in tensors for x in (str(tuple(map(int, t.split(", ")))), e, z)]
    assert [r["printed"] for r in got] == want
    other = re.findall(r"(?:flops|memory allocation): ([\d.]+ (?:TFLOPs|GB))", trace)
    assert [r["printed"] for r in rows if r["quantity"] in ("FLOPs", "GB")] == other
    assert [r["seed"] for r in rows[:2]] == [8, 3750]  # "head per GPU: 8 tokens per GPU: 3750"


def test_every_row_matches_or_is_explained(rows):
    assert all(r["match"] or r["note"] for r in rows)
    # the one wrong label: input_ [N/DP/TP, d] = (3750, 16384) printed as (30000, 16384) = [N/DP, d]
    assert {r["name"] for r in rows if not r["match"]} == {"input_"}
    assert all("[N/DP, d]" in r["note"] for r in rows if not r["match"])


def test_flops_are_global_and_per_gpu_is_one_sixteenth(rows):
    # 3·2·60000·16384·16384 = 96,636,764,160,000; 2·60000²·16384 = 117,964,800,000,000 (A and c);
    # 2·60000·16384² = 32,212,254,720,000
    f = [r for r in rows if r["quantity"] == "FLOPs"]
    assert [r["closed"] for r in f] == [96_636_764_160_000, 117_964_800_000_000, 117_964_800_000_000,
                                        32_212_254_720_000]
    assert all(r["per_gpu"] * 16 == r["closed"] and r["match"] and "per GPU" in r["note"] for r in f)
    # per GPU, the forward matmuls of one layer of scaling.families.transformer minus its MLP (2·3750·16384·53248·2):
    # 6.0398e12 + 2·7.3728e12 + 2.0133e12 = 22,798,663,680,000
    cfg = get_preset("seed000").replace(blocks=1)
    fwd = step_flops(Workload(cfg, MeshShape(context=16), 60000, "forward"))["forward"] - 2 * 3750 * 16384 * 53248 * 2
    assert sum(r["per_gpu"] for r in f) == pytest.approx(fwd) == pytest.approx(22_798_663_680_000)


def test_a_matrix_is_57_6_gb(rows):
    # 8·60000·60000 = 28.8e9 elements, 2 bytes each
    a = {r["quantity"]: r for r in rows if r["name"] == "A"}
    assert a["elements"]["closed"] == 28_800_000_000 and a["size"]["closed"] == 57_600_000_000
    assert a["size"]["printed"] == "57.60 GB" and a["size"]["match"]


def test_memory_lines(rows):
    mem = [r for r in rows if r["quantity"] == "GB"]
    assert len(mem) == 12 and all(r["match"] for r in mem)
    act, w, ws = 59 * 2 * MIB, 256 * 2 * MIB, 32 * MIB  # 122.88 MB in 2 MiB blocks; 536.87 MB; cuBLAS workspace
    # peak after c_'s copy: input, q,k,v, q_,k_,v_, c, c_ (all-to-all), c_ (copy): 10 activations; 4 weights; A
    peak = 10 * act + 4 * w + ws + 27466 * 2 * MIB  # 57.6e9 rounded up to 2 MiB: 57,600,376,832
    assert peak == 61_018_734_592 and mem[8]["closed"] == peak == mem[9]["closed"] == mem[11]["closed"]
    # q,k,v peak: 4 activations + 4 weights + workspace = 2.676 GB; the tensors alone 2.639 GB would print 2.64
    assert mem[1]["closed"] == 4 * act + 4 * w + ws and round(mem[1]["tensors_only"] / 1e9, 2) == 2.64
    # current: input_ 469·2 MiB, W1 = W2 = 13104·2 MiB, inter 399,360,000 (split: > 1 MiB left), output, workspace
    assert mem[10]["closed"] == 469 * 2 * MIB + 2 * 13104 * 2 * MIB + 399_360_000 + act + ws == 56_502_370_304


def test_render_summary(rows):
    text = s0.render(rows)
    lines = text.splitlines()
    table = lines[: lines.index("notes:")]
    assert len(table) == 94  # header, 93 rows; then the notes, each row's by its reference; the summary last
    assert lines[-1].startswith("90 of 93 figures reproduced") and "3 of the 3 others explained" in text
    notes = {r["note"] for r in rows if r["note"]}
    refs = {line.split()[-1] for line in table[1:] if line.split()[-1].startswith("[")}
    assert len(refs) == len(notes) and all(f"[{k}] " in text for k in range(1, len(notes) + 1))
    assert max(map(len, lines)) <= 160  # a terminal's width: the notes below the table, wrapped


def test_no_jax_import():
    code = ("import sys, scaling.seeds.seed000; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'ffn_model', 'mesh', 'verify')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_trace_and_layers_commands(capsys):
    """python -m scaling trace prints the trace's rows and summary; layers prints seed 001's two tables and,
    with --cells, every printed cell reproduced (tests/test_seed001.py holds the values)."""
    assert main(["trace", "--seed", "000"]) == 0
    out = capsys.readouterr().out
    assert "peak after A" in out and out.strip().splitlines()[-1].startswith("90 of 93 figures reproduced")
    assert main(["layers", "--seed", "001"]) == 0
    out = capsys.readouterr().out
    assert "MLP layer estimates" in out and "SA layer estimates" in out
    assert main(["layers", "--cells"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    n, total = map(int, last.split()[0].split("/"))
    assert n == total and total >= 400


@pytest.mark.tpu
def test_trace_verify_compiles_the_ulysses_layer():
    """Seed 000's Ulysses layer on 16 v5p chips (context=16, forward, one layer of the seed000 preset):
    flash at 60,000 tokens and materialized at 30,000 compile with their peak within 10% of the closed
    form; materialized at 60,000 is refused by the compiler for HBM, and the closed form says so too:
    8 heads x 60,000^2 FP32 scores = 4 x 8 x 3.6e9 = 115.2 GB (hand figure) > the v5p's usable HBM."""
    res = compile_seed000_layer()
    for form in ("flash", "materialized, T=30000"):
        assert 0.90 <= res[form]["ratio"] <= 1.10, (form, res[form])
    mat = res["materialized"]
    assert mat["compiled"] is None and "RESOURCE_EXHAUSTED" in mat["error"]
    assert mat["terms"]["attention_working_set"] == pytest.approx(4 * 8 * 60000**2)
    assert mat["closed_form"] > CHIPS["v5p"].hbm_budget and mat["refused_bytes"] > CHIPS["v5p"].hbm_budget
    assert "61.02" in render_compiled(res)


def _trace_json(*args):
    import contextlib
    import io
    import json

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["trace", *args, "--json"]) == 0
    return json.loads(buf.getvalue())


def test_model_trace_of_the_seeds_setup_is_the_seed():
    """The trace for any model, given seed 000's (its preset, context 16 = data 2 × tensor 8), prints the seed's
    figures: its four FLOP lines (96.64, 117.96, 117.96, 32.21 TFLOPs, global) and its memory lines (copied by hand
    from the seed)."""
    t = _trace_json("--preset", "seed000", "--context", "16", "--data", "2", "--tensor", "8")
    assert [f"{v['global'] / 1e12:.2f}" for v in t["flops"].values()] == ["96.64", "117.96", "117.96", "32.21"]
    peaks = [f"{m['peak'] / 1e9:.2f}" for m in t["memory"]]
    assert peaks[:10] == ["2.27", "2.68", "3.05", "3.17", "60.65", "60.77", "60.90", "60.90", "61.02", "61.02"]
    assert f"{t['memory'][10]['current'] / 1e9:.2f}" == "56.50"


def test_model_trace_of_a_gqa_model_by_hand():
    """`trace --preset llama3.1-8b --context 8 --data 2` (GQA: 32 query heads, 8 kv heads of 128; N = 8192, d =
    4096, SwiGLU d' = 14336, L = 32; the FFN on 2 × 4): K's weight [8, 4096, 128] 2·8·4096·128 B; k after the
    all-to-all [8, 8/8, 1024, 128]; A [32/8, N, N] 2·4·N² B; W1 the gate and up projections [32, 4096, 2·14336/4];
    FLOPs 2·m·n·k: q,k,v 2·N·d·(32 + 2·8)·128, A 2·N·N·32·128, output 2·N·32·128·d; the k all-to-all sends 7/8 of
    2·1024·8·128 B per GPU."""
    t = _trace_json("--preset", "llama3.1-8b", "--context", "8", "--data", "2")
    by = {r["name"]: r for r in t["tensors"]}
    N, d = 8192, 4096
    assert by["K"]["shape"] == [8, 4096, 128] and by["K"]["bytes"] == 2 * 8 * 4096 * 128
    assert by["k_ (after all-to-all)"]["shape"] == [8, 1, 1024, 128]
    assert by["A"]["shape"] == [4, N, N] and by["A"]["bytes"] == 2 * 4 * N * N
    assert by["W1"]["shape"] == [32, 4096, 7168] and by["W1"]["bytes"] == 2 * 32 * 4096 * 7168
    f = t["flops"]
    assert f["q,k,v"]["global"] == 2 * N * d * 48 * 128 and f["q,k,v"]["per_gpu"] == 2 * N * d * 48 * 128 / 8
    assert f["A = q_ x k_t"]["global"] == 2 * N * N * 32 * 128
    assert f["output = c_ x O"]["global"] == 2 * N * 32 * 128 * d
    assert t["all_to_all_bytes_per_gpu"]["k"] == pytest.approx(7 / 8 * 2 * 1024 * 8 * 128)


def test_model_trace_of_llama2_7b_by_hand():
    """`trace --preset llama2-7b --context 4 --chip v5p` (MHA, N = 4096, d = 4096, 32 heads of 128, the FFN on 1 × 4;
    a TPU: the tensors' bytes, no allocator): q [32, 1024, 128] 2·32·1024·128 B; after its transpose [8, 4096, 128];
    c_ after its transpose [1024, 4096]; FLOPs q,k,v 2·N·d·96·128, c 2·N·N·32·128; the first memory line the input
    and Q, K, V, O: 2·1024·4096 + 4·2·4096·32·128 B."""
    t = _trace_json("--preset", "llama2-7b", "--context", "4", "--chip", "v5p")
    by = {r["name"]: r for r in t["tensors"]}
    N, d = 4096, 4096
    assert by["q"]["shape"] == [32, 1024, 128] and by["q"]["bytes"] == 2 * 32 * 1024 * 128
    assert by["q_ (after transpose)"]["shape"] == [8, N, 128]
    assert by["c_ (after transpose)"]["shape"] == [1024, 4096]
    assert t["flops"]["q,k,v"]["global"] == 2 * N * d * 96 * 128
    assert t["flops"]["c = A x v_"]["global"] == 2 * N * N * 32 * 128
    assert t["memory"][0]["current"] == 2 * 1024 * 4096 + 4 * 2 * 4096 * 32 * 128


def test_model_trace_bad_inputs():
    """kv heads the context does not divide, a data·tensor split that is not the context's GPUs, an FFN preset,
    --seed with a model: one error line, exit 2."""
    assert main(["trace", "--preset", "llama3.1-8b", "--context", "16"]) == 2
    assert main(["trace", "--preset", "llama2-7b", "--context", "4", "--data", "3"]) == 2
    assert main(["trace", "--preset", "small", "--context", "2"]) == 2
    assert main(["trace", "--seed", "000", "--preset", "llama2-7b"]) == 2


@pytest.mark.tpu
def test_model_trace_verify_in_the_tpu_band():
    """trace --verify for a model: one layer of a GQA variant of seed 000's model (16 kv heads, 8192 tokens), forward,
    Ulysses over 8 v5p chips (tpu:v5p-16), flash attention: the compiled peak within the TPU band [0.90, 1.10] of the
    closed form (tests/test_check.py's band)."""
    from verify.trace import compile_model_layer

    cfg = get_preset("seed000").replace(kv_heads=16, seq_len=8192)
    v = compile_model_layer(cfg, 8)
    assert v["devices"] == "tpu:v5p-16" and 0.90 <= v["ratio"] <= 1.10, v
