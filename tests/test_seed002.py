"""Seed 002 (shared/reference/seeds/002_deepflow_output.txt, shipped as scaling/data/seeds/002_deepflow_output.txt):
scaling.seeds.seed002 recomputes every numeric line of DeepFlow's report. Expected values are the seed's own printed
digits (parsed here) and hand calculations from DeepFlow's stated inputs (B = 512, V = 800,000, L = 2, D = 19,968,
P = 2,048, S = 20, 4 gates, 4-byte words; the 300 W budget's shares), written out below."""

from __future__ import annotations

import math
import re

import pytest

from jax_scaling.cli import main
from scaling.seeds import seed002 as s2
from scaling.seeds.seed000 import seed_text


@pytest.fixture(scope="module")
def seed():
    return seed_text(s2.SEED_FILE)


def test_shipped_report_is_the_seed(seed):
    """The shipped copy holds DeepFlow's report: its first and last lines as printed (copied by hand)."""
    lines = seed.splitlines()
    assert lines[:2] == ["inflection_point: 4.03", "comp_int: 0.11"]
    assert lines[-2:] == ["Time: 302.88817584", "time_per_step: 0.00071939"]
    assert len(lines) == 251


def test_every_numeric_line_is_reproduced(seed):
    """One row per line of the seed that prints a figure (a number not inside a name such as l2mem or dim1: 165,
    counted here from the seed), each matching to the printed digits; the three the seed gets inconsistent say so
    and give the correct figure."""
    numeric = [line for line in seed.splitlines() if re.search(r"(?<![A-Za-z_\d.])\d", line)]
    rows = s2.rows()
    assert len(rows) == len(numeric) == 165
    assert all(r["match"] for r in rows), [r["seed"] for r in rows if not r["match"]]
    inconsistent = [r for r in rows if r["note"].startswith("INCONSISTENT")]
    assert [r["line"] for r in inconsistent] == [213, 232, 251]


def test_hardware_from_the_power_budget():
    """300 W split by the config's shares: peak 0.2592·300 W / 11.9 pJ = 6.534e12 FLOP/s ("6.5 Tflops"); DRAM
    0.2592·300 W / (6 pJ·8 per byte) = 1.62e12 B/s = 1508.7 GiB/s; L2 0.16896·300 / (5 fJ·8) = 1.2672e15 B/s =
    1152.5 TiB/s, its size 1.2672e15 / (4000 GiB/s) · 32 KiB = 9.22 MiB; the inflection point 6.534e12/1.62e12 =
    4.03 (the 0.7 derating cancels); the tiles: √(9,667,969 B / 12) = 897.6 → 512, √(58,007,813 / 12) = 2198.6 →
    2048."""
    hw = s2.hardware()
    assert hw["peak"] == pytest.approx(0.2592 * 300 / 119e-13)
    assert hw["dram"] / 2**30 == pytest.approx(1508.7, abs=0.05)
    assert hw["l2_bw"] / 2**40 == pytest.approx(1152.5, abs=0.05)
    assert hw["l2_bytes"] / 2**20 == pytest.approx(9.22, abs=0.005)
    assert round(hw["inflection"], 2) == 4.03
    assert (hw["X1"], hw["X2"]) == (512, 2048)


def test_forward_gate_gemm_by_hand():
    """Cf = [B, 2D]·[2D, 4D] = (512, 39936, 79872): FLOPs 2·512·39936·79872 = 3,266,322,628,608 plus DeepFlow's
    per-output charge 512·79872·(15 + 5·⌈39936/2048⌉ = 115) = 4,702,863,360; k > 512, so the [B, 2D] operand passes
    ⌈79872/512⌉ = 156 times and the weights ⌈512/512⌉ = 1: gmem 4·(512·39936·156 + 39936·79872 + 512·79872) B; at
    the 2048 tile 39 and 1 times. Time: FLOPs / (0.7 · peak) + 37 µs."""
    g = s2.gemm(512, 39936, 79872, s2.hardware())
    assert g["flop"] == 3_266_322_628_608 + 4_702_863_360 == 3_271_025_491_968
    assert g["r_gmem"] == (156, 1, 1) and g["r_l2"] == (39, 1, 1)
    assert g["gmem"] == 4 * (512 * 39936 * 156 + 39936 * 79872 + 512 * 79872) == 25_681_723_392
    assert g["l2mem"] == 4 * (512 * 39936 * 39 + 39936 * 79872 + 512 * 79872)
    assert g["time"] == pytest.approx(3_271_025_491_968 / (0.7 * 0.2592 * 300 / 119e-13) + 37e-6, rel=1e-12)


def test_time_composes_the_printed_parts():
    """Time = (L + L·(S − 1))·(Cf + Cb) + R + softmax_f + softmax_b + embedding_f + embedding_b + the softmax's
    update, from the seed's own printed parts (its "Cf: ..." line and the (Softmax) update lines): 40·(0.71693 +
    1.45244) + 0.11251 + 71.84211 + 143.59231 + 2·0.00148 + (0.39443 + 0.16904) = 302.88817584."""
    parts = (0.7169343324747797, 1.45243593904127, 0.11251396920634923, 71.84210768374489, 143.5923132573369,
             0.0014795355026455028)
    cf, cb, r, sf, sb, emb = parts
    time = 40 * (cf + cb) + r + sf + sb + 2 * emb + 0.3944296796296297 + 0.16904131984126988
    assert f"{time:.8f}" == "302.88817584"
    assert s2.report()["time"] == pytest.approx(time, rel=1e-12)


def test_parameters_and_the_time_budget():
    """#Parameters: V·D + (2D + 1)·4D·L + D·P + (D + 1)·V = 15,974,400,000 + 6,379,696,128 + 40,894,464 +
    15,975,200,000 = 38,370,190,592 ("38.37 Billion"). time_per_step: a day over ⌊100·768,648,884 / (32·20)⌋ =
    120,101,388 steps = 0.00071939 s (the search script's batch 32); with the model's 512: 0.01151028."""
    r = s2.report()
    assert r["params"] == 38_370_190_592
    assert f"{r['time_per_step']:.8f}" == "0.00071939" == f"{86400 / 120_101_388:.8f}"
    assert f"{r['time_per_step_model_batch']:.8f}" == f"{86400 / math.floor(76_864_888_400 / 10_240):.8f}"


def test_kernels_command(seed, capsys):
    """`kernels --seed 002` prints the rows and the summary; --text regenerates the report line for line; a seed
    it does not know is one error line and exit 2."""
    assert main(["kernels", "--seed", "002"]) == 0
    assert "165 of 165 numeric lines reproduced" in capsys.readouterr().out
    assert main(["kernels", "--text"]) == 0
    assert capsys.readouterr().out == seed
    with pytest.raises(SystemExit) as e:
        main(["kernels", "--seed", "003"])
    assert e.value.code == 2
