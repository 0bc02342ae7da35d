"""Predicted step time against the published measured runs (scaling.validate; closed forms only)."""

import json

import pytest

from jax_scaling.cli import main
from scaling.config import PRESETS, TransformerConfig
from scaling.validate import measured_runs, measured_step, spearman, validate


def _run(run_id):
    return next(r for r in measured_runs() if r["id"] == run_id)


def test_measured_steps_from_the_sources_conventions():
    """Rates converted to steps with each source's own FLOP count, by hand:
    Megatron's 1.7B (Narayanan et al. 2021, Table 1: 137 TFLOP/s on 32 A100s, B = 512, s = 2048, l = 24,
    h = 2304, V = 51200): F = 96·512·2048·24·2304² = 12,824,703,626,379,264 times (1 + 2048/13824 + 51200/884736)
    = 1.2060185 -> 1.54668e16 FLOPs, over 32·137e12 FLOP/s = 3.5280 s.
    MaxText's 32B on one v5e-256 (132 TFLOP/s, 4 sequences of 2048 per chip: t = 8192 tokens): 6·N·t =
    6·32,547,799,040·8192 = 1.599789e15 plus 6·32 heads·32 layers·256·2048·8192 = 2.63883e13, over 132e12 =
    12.3195 s."""
    mega = _run("megatron-a100-1.7b")
    cfg = TransformerConfig(d_model=2304, heads=24, d_ff=9216, blocks=24, seq_len=2048, vocab=51200)
    assert measured_step(mega, cfg, 512 * 2048, 32) == pytest.approx(3.5280178, rel=1e-6)
    assert PRESETS["maxtext-32b"].params == 32_547_799_040
    assert measured_step(_run("maxtext-v5e-32b-x1"), PRESETS["maxtext-32b"], 256 * 4 * 2048, 256) == \
        pytest.approx(12.319528, rel=1e-6)
    assert measured_step(_run("maxtext-v6e-gpt3-175b"), None, 0, 1) == 17.182  # reported as a step


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks [0, 1, 2, 3] against [0.5, 0.5, 2, 3] (a tie): Pearson 0.9487
    assert spearman([1, 2, 3, 4], [5, 5, 7, 9]) == pytest.approx(0.9486833, rel=1e-6)


def test_every_measured_run_is_predicted(capsys):
    """Every row of measured.toml goes through the predict command's flags; each prediction is what predict itself
    prints for those flags (one row checked through the CLI); the summary has both groups."""
    v = validate()
    assert len(v["rows"]) == len(measured_runs()) >= 44
    assert {r["table"] for r in v["rows"]} == {"1a", "1b", "1c", "1d", "2"}
    assert set(v["groups"]) == {"tpu", "gpu"}
    row = next(r for r in v["rows"] if r["id"] == "maxtext-h100-llama2-7b-x2")
    assert main(["predict", *_run(row["id"])["args"].split(), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_seconds"] == row["predicted_seconds"]
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "median |error|" in out and "Spearman" in out
