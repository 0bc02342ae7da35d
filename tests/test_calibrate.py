"""jax-scaling calibrate: refuses without an accelerator; on the (emulated) CPU with --allow-cpu it times a small grid
and writes a kernel table that scaling.hardware.kernel_tables reads back, row for row."""

import jax
import pytest

from jax_scaling import calibrate as command
from jax_scaling.cli import main
from scaling.hardware.kernel_tables import load_kernel_table
from verify import calibrate as cal


def test_no_accelerator_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(command, "has_accelerator", lambda: False)
    assert main(["calibrate", "--out", str(tmp_path / "t.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "accelerator" in err[0] and "--allow-cpu" in err[0]
    assert not (tmp_path / "t.toml").exists()


@pytest.mark.parametrize("flags, word", [(["--sections", "gemm,nope"], "--sections"),
                                         (["--dtypes", "bf16,fp64"], "--dtypes"),
                                         (["--budget", "-1"], "budget")])
def test_bad_flags(tmp_path, capsys, flags, word):
    assert main(["calibrate", "--out", str(tmp_path / "t.toml"), *flags]) == 2
    assert word in capsys.readouterr().err


def test_missing_out_folder(tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "no" / "t.toml"), "--allow-cpu"]) == 2
    assert "folder" in capsys.readouterr().err


@pytest.mark.compiles
def test_cpu_table_round_trips(tmp_path, capsys, monkeypatch):
    """A tiny grid on the 8 emulated CPU devices: every section is written, and the parser reads the same rows (the
    GEMM shapes asked for, pointwise bytes = 4 B an element, attention's causal flag, collectives over 8 devices)."""
    grid = cal.Grid(gemm={"bf16": [(64, 64, 64), (64, 128, 32)], "fp32": [(64, 64, 64)]}, pointwise=[4096],
                    attention=[(1, 64, 2, 16, True)], collectives=[4096], decode_gemm=[(2, 64, 32)],
                    decode_attention=[(2, 64, 4, 2, 16)])
    monkeypatch.setattr(command, "_quick_grid", lambda: grid)
    out = tmp_path / "cpu.toml"
    assert main(["calibrate", "--out", str(out), "--allow-cpu", "--quick", "--dtypes", "bf16,fp32"]) == 0
    text = capsys.readouterr().out
    assert "table written" in text and "gemm bf16: 3 shapes" in text and "decode attention (xla): 1 cases" in text
    t = load_kernel_table(out)
    assert [tuple(int(v) for v in r[:3]) for r in t.gemm["bf16"].rows] == [(64, 64, 64), (64, 128, 32), (2, 64, 32)]
    assert all(r[3] > 0 for r in t.gemm["bf16"].rows) and len(t.gemm["fp32"].rows) == 1
    assert [r[0] for r in t.pointwise.rows] == [4 * 4096]
    (row,) = t.attention["xla"].rows
    assert tuple(row[:5]) == (1, 64, 2, 16, True) and row[5] > 0 and row[6] > 0
    assert jax.device_count() == 8
    assert set(t.collectives) == set(cal.COLLECTIVES)
    assert all(r[0] == 8 and r[1] == 4096 for rows in t.collectives.values() for r in rows.rows)
    assert t.launch_seconds > 0
    (row,) = t.decode_attention["xla"].rows
    assert tuple(row[:5]) == (2, 64, 4, 2, 16) and row[5] > 0


def test_time_copies_divides_by_the_copies(monkeypatch):
    """A kernel under ``small`` seconds is timed as several copies in one executable and divided by their number: a
    fake executable of c copies taking 5 ms + c·1 ms (a fixed dispatch and 1 ms a copy) reads (5 + 32)/32 ms a copy
    with the 32 copies max_copies allows (10·small/6 ms would be 166)."""
    asked = []

    def make(c):
        asked.append(c)
        return c, ()

    monkeypatch.setattr(cal, "time_call", lambda c, args: 5e-3 + 1e-3 * c)
    per = cal.time_copies(make, small=0.1, budget_bytes=1e9, each_bytes=1.0, max_copies=32)
    assert asked == [1, 32]
    assert per == pytest.approx((5e-3 + 32e-3) / 32)
