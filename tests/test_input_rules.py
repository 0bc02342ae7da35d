"""One rule for sizes and values in every command (scaling.core.limits), and what a new user reads (issue 35, items
1, 3-7): every integer and float flag of every command refuses 0, negatives, full-width digits, absurd sizes,
nan and inf with one `error:` line and exit 2, before anything is computed; the silent coercions and no-ops a new
user found are refused; predict says on its first line when a configuration does not fit; the output fits a
terminal. Expected messages name the input; the values refused come from the flags' meaning (a count is a positive
integer jax's int32 holds; a hardware figure is in its unit), not from the code under test."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jax_scaling.cli import main, parser
from scaling.core.limits import FIGURES, INT32_LIMIT, ZERO_OK as LIMITS_ZERO_OK, check_size
from scaling.core.mesh_shape import MeshShape
from scaling.families.presets import get_preset
from scaling.core.workload import Workload
from tests.helpers import run_cli as run, refused

ROOT = Path(__file__).resolve().parents[1]

# a valid command line of each command; a bad flag value appended to it must be refused before it runs
BASE = {
    "answer": "answer",
    "plan": "plan --preset xxl --chips 64",
    "predict": "predict --preset llama2-7b --chip H100 --chips 64 --mesh data=8,fsdp=8 --global-batch 256",
    "validate": "validate",
    "trace": "trace --preset llama3.1-8b",
    "layers": "layers --preset llama3.1-8b",
    "kernels": "kernels --preset llama2-7b --chip H100 --chips 64 --mesh data=8,fsdp=8 --global-batch 256",
    "check": "check --devices cpu:8 --mesh fsdp=8 --preset tiny --batch-tokens 64",
    "train": "train --devices cpu:8 --mesh fsdp=8 --preset tiny --batch-tokens 64 --steps 1",
    "compile": "compile --devices cpu:8 --mesh fsdp=8 --preset tiny --batch-tokens 64",
    "bench": "bench --devices cpu:8 --mesh fsdp=8 --preset tiny --batch-tokens 64 --steps 1 --warmup 0",
    "calibrate": "calibrate --out /tmp/calibrate-refused.toml --allow-cpu --quick",
}
ZERO_OK = {"--seed", "--verify-top", "--process-id", "--warmup"}  # counts that may be 0




def number_flags():
    """(command, flag, type) for every integer and float flag of every command (the parser's own list)."""
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for cmd, p in sub.choices.items():
        for a in p._actions:
            if a.option_strings and a.type is not None and a.type.__name__ in ("int", "float"):
                yield cmd, a.option_strings[-1], a.type.__name__


# Every number flag is of one kind, and cli.run refuses a value by its kind alone (scaling.core.limits.check_flag,
# applied to every parsed flag of every command): so the kind's bad values are tried on one flag of each kind in each
# command, and a test holds that every flag has a kind. The bad values by kind (what the flag means, not what the code
# does):
KINDS = {
    # a count: positive, within jax's int32; a full-width digit ('４': int() reads it) is not what a user typed
    "count": ["0", "-1", "\uff14", str(10**30)],
    # a count that may be 0 (--seed, --verify-top, --warmup, --process-id): negatives and 10^30 refused all the same
    "count or 0": ["-1", "\uff14", str(10**30)],
    # a hardware figure in its unit (scaling.core.limits.FIGURES): 0, negatives, nan, inf, 1e300 and full-width digits
    "figure": ["0", "-1", "nan", "inf", "1e300", "\uff14"],
    # any other float: the same values, none of them a finite positive float32
    "float": ["0", "-1", "nan", "inf", "1e300", "\uff14"],
}


def kind_of(flag: str, type_name: str) -> str | None:
    """A number flag's kind (KINDS), from its type and its name as scaling.core.limits' rules read it."""
    dest = flag.lstrip("-").replace("-", "_")
    if type_name == "int":
        return "count or 0" if flag in ZERO_OK else "count"
    if type_name == "float":
        return "figure" if dest in FIGURES else "float"
    return None


def test_every_number_flag_has_a_kind():
    """Every integer and float flag of every command (the parser's own list, 11 of the 12 commands) has a kind, each
    kind is some flag's, and the figures' ranges are the flags' (a renamed flag would leave its range behind)."""
    kinds = {(c, f): kind_of(f, t) for c, f, t in number_flags()}
    assert None not in kinds.values()
    assert {c for c, _ in kinds} == set(BASE) - {"validate"}  # validate takes no number
    assert set(kinds.values()) == set(KINDS)
    assert {f.lstrip("-").replace("-", "_") for (_, f), k in kinds.items() if k == "figure"} == set(FIGURES)
    assert len(kinds) > 200
    assert {f.lstrip("-").replace("-", "_") for f in ZERO_OK} == LIMITS_ZERO_OK  # the counts that may be 0


# one flag of each kind in each command (the first the parser lists), each with its kind's bad values
CASES = [(c, f, v) for (c, k), f in {(c, kind_of(f, t)): f for c, f, t in reversed(list(number_flags()))}.items()
         for v in KINDS[k]]


@pytest.mark.parametrize("cmd, flag, value", CASES, ids=[f"{c}{f}={v!r}" for c, f, v in CASES])
def test_a_bad_number_is_one_error_line(cmd, flag, value):
    """Each kind's bad values, on one flag of that kind in each command: one error line, exit 2, under 2 s."""
    refused([*BASE[cmd].split(), f"{flag}={value}"])


@pytest.mark.parametrize("argv, match", [
    # sizes: the rule check, train and compile use (scaling.core.limits.check_size), in predict and plan too
    (f"{BASE['predict']} --seq-len {10**30}", "--seq-len must be below 2^31"),
    (f"{BASE['predict']} --blocks {2**40}", "--blocks must be below 2^31"),
    (f"{BASE['predict']} --d-model {10**30}", "--d-model must be below 2^31"),
    ("predict --preset xxl --chip v5p --chips 1000000000000 --mesh data=1000000000000 --batch-tokens 1024",
     "--chips must be below 2^31"),
    ("predict --preset xxl --chip v5p --chips 2097152 --mesh data=2097152 --batch-tokens 2097152",
     "--chips 2,097,152 is more devices than this package plans for"),
    ("plan --preset xxl --chips 4194304", "--chips 4,194,304 is more devices"),
    (f"plan --d-model {10**30}", "--d-model must be below 2^31"),
    # each count below 2^31, the arrays over XLA's 2^63 elements: weights L·D·F = 126 · 2^30 · 2^30 = 1.45e20
    (f"plan --preset xxl --d-model {2**30} --d-ff {2**30}", "weights L·D·F hold 1.45e+20 elements"),
    (f"predict --preset llama2-7b --chip H100 --chips 8 --mesh data=8 --global-batch 8 --seq-len {2**30} "
     f"--vocab {2**30}", "hold"),
    (f"trace --preset llama3.1-8b --d-model {2**30} --d-ff {2**30}", "weights L·D·F"),
    (f"layers --preset llama3.1-8b --d-model {2**30} --d-ff {2**30}", "weights L·D·F"),
    # silent coercions and no-ops
    ([*BASE["predict"].split(), "--chip", " "], "--chip must not be empty"),
    (f"{BASE['predict']} --xla-flags=--xla_no_such=1", "--xla_no_such=1 is in none of them"),
    (f"{BASE['kernels']} --xla-flags=--xla_no_such=1", "--xla_no_such=1 is in none of them"),
    ("plan --preset xxl --chips 64 --xla-flags=--xla_tpu_no_such_flag=true", "is in none of them"),
    ([*BASE["predict"].split(), "--xla-flags="], "--xla-flags must not be empty"),
    ("trace --preset llama3.1-8b --context 0", "--context must be a positive integer, got 0"),
    ("trace --preset llama3.1-8b --data 0", "--data must be a positive integer, got 0"),
    ("trace --preset llama3.1-8b --tensor -2", "--tensor must be a positive integer, got -2"),
    ("layers --preset llama3.1-8b --tp 0", "--tp must be a positive integer, got 0"),
    ("layers --preset llama3.1-8b --batch 0", "--batch must be a positive integer, got 0"),
    ("kernels --seed 002 --text --json", "--text and --json"),
    ("layers --seed 001 --cells --json", "--cells and --json"),
    ("validate --fit --json", "--fit"),
    ("plan --preset xxl --chips 64 --verbose", "--verbose changes what --verify-top does"),
    ("answer --verbose", "--verbose changes what --verify-pipeline does"),
    ("trace --seed 000 --verbose", "--verbose changes what --verify does"),
    ("check --devices cpu:8 --mesh fsdp=8 --preset tiny --batch-tokens 64 --sequence-parallel",
     "the mesh has none"),
    ("predict --preset llama2-7b --chip H100 --chips 8 --mesh fsdp=8 --global-batch 8 --sequence-parallel",
     "the mesh has none"),
    ("train --devices cpu:8 --mesh fsdp=\uff18 --preset tiny --batch-tokens 64", "size must be an integer"),
    ("train --devices cpu:\uff18 --mesh fsdp=8 --preset tiny --batch-tokens 64", "expected cpu:N"),
    ("check --devices tpu:v5p:2x2x\uff12 --mesh fsdp=8 --preset tiny --batch-tokens 64", "bad topology"),
    ("plan --slice v5p-\uff11\uff12\uff18", "unknown slice"),
    ([*BASE["train"].split(), "--checkpoint-dir", "/tmp/a\tb"], "holds a control character ('\\t')"),
    ([*BASE["bench"].split(), "--preset", "tiny\n"], "holds a control character"),
    ([*BASE["predict"].split(), "--chip", ""], "--chip must not be empty"),
    # hardware figures in another unit: C given in TFLOP/s, HBM in GB, a bandwidth in GB/s
    ("answer --flops 460", "--flops is C, a chip's bf16 rate in FLOP/s"),
    ("answer --w-ici 180", "--w-ici is W_ici"),
    ("answer --hbm 95", "--hbm is the memory per device in bytes"),
    ("plan --preset xxl --chips 64 --hbm 95", "--hbm is the memory per device in bytes"),
    (f"{BASE['predict']} --inter-node-bandwidth 400", "--inter-node-bandwidth is a node's network bandwidth"),
    ("layers --preset llama3.1-8b --chip H100 --vector-tflops 1.338e14", "--vector-tflops is the chip's rate"),
])
def test_refused_with_one_line(argv, match):
    refused(argv.split() if isinstance(argv, str) else argv, match)


def test_size_rule_holds_without_the_command_line():
    """check_size directly: L = 2^31 blocks (the scan's int32 length), an array of 2^63 elements (the weights
    L·D·F = 2 · 2^31 · 2^31 = 2^63), more devices than MAX_DEVICES (2^20)."""
    xxl = get_preset("xxl")
    with pytest.raises(ValueError, match="too many"):
        check_size(Workload(xxl.replace(blocks=INT32_LIMIT), MeshShape(), 1024))
    with pytest.raises(ValueError, match=r"weights L·D·F hold 9.22e\+18 elements"):
        check_size(Workload(xxl.replace(blocks=2, d_model=2**31, d_ff=2**31), MeshShape(), 1024))
    with pytest.raises(ValueError, match="more devices than this package plans for"):
        check_size(Workload(xxl, MeshShape(data=2**21), 2**21))
    check_size(Workload(xxl, MeshShape(data=2**20), 2**20))  # 2^20 chips: allowed


def test_plan_says_which_rule_no_mesh_meets():
    """8,960 = 2^8·5·7 v5p chips and B = 2^22 tokens: the XXL's D = 2^14 and F = 2^12·13 divide by no 5 or 7 and
    B only by powers of 2, L = 126 = 2·3^2·7 takes the 7 at most: no mesh splits the factor 5, whatever the
    memory. The message must say a divisibility rule, not that nothing fits in 102.8 GB."""
    line = refused("plan --batch-tokens 4194304 --chips 8960 --preset xxl".split())
    assert "whatever the memory" in line and "is not divisible by" in line, line
    assert "fits" not in line.split("whatever")[0]


def test_predict_says_first_when_it_does_not_fit():
    """Llama 2 7B on 8 H100s with data=8: 16 B × 6.7e9 parameters = 108 GB of state per device before any
    activation, above 80 GB. The step is still printed (exit 0), but the first line says it does not fit, and
    --json carries fits false with the reason."""
    argv = "predict --preset llama2-7b --chip H100 --chips 8 --mesh data=8 --global-batch 64".split()
    code, out, err, _ = run(argv)
    assert code == 0 and out.splitlines()[0].startswith("DOES NOT FIT: the step needs"), out
    code, out, err, _ = run([*argv, "--json"])
    j = json.loads(out)
    assert j["fits"] is False and "GB over" in j["fit_note"] and j["memory_per_device_bytes"] > 16 * 6.7e9
    code, out, err, _ = run("predict --preset llama2-7b --chip H100 --chips 64 --mesh data=8,fsdp=8 "
                            "--global-batch 256 --remat full --attention flash".split())
    assert code == 0 and "DOES NOT FIT" not in out and "fit_note" not in out


# what a person reads: every line within a terminal of 200 columns (prose wrapped at 120), headers in words (no
# Python reprs)
READ = [
    "answer", "plan --slice v5p-128 --preset xxl --batch-tokens 25600",
    "plan --chip H100 --chips 512 --preset llama3.1-70b --top 3",
    "predict --preset llama2-7b --chip H100 --chips 64 --mesh data=8,fsdp=8 --global-batch 256 --kernels",
    "validate", "trace --seed 000", "trace --preset llama3.1-8b --context 8 --data 2", "layers --seed 001",
    "layers --preset llama3.1-8b --tp 4 --chip A100-80GB", "kernels --seed 002",
    "kernels --preset llama2-7b --chip H100 --chips 64 --mesh data=8,fsdp=8 --global-batch 256",
]


@pytest.mark.parametrize("argv", READ)
def test_output_fits_a_terminal_and_names_things_in_words(argv):
    code, out, err, _ = run(argv.split())
    assert code == 0, err
    widest = max(out.splitlines(), key=len)
    assert len(widest) <= 200, (len(widest), widest)
    for repr_ in ("TransformerConfig(", "FFNConfig(", "{'d_model'", "MeshShape("):
        assert repr_ not in out, repr_


def test_every_program_names_every_command():
    """python -m verify --help (and each module docstring that lists the commands) names all 11 subcommands."""
    import jax_scaling.cli

    out = subprocess.run([sys.executable, "-m", "verify", "--help"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
    head = out.split("positional arguments")[0]
    for c in BASE:
        assert c in head.split("{", 2)[-1], (c, head)
        assert c in jax_scaling.cli.__doc__.split("\n\n")[0]
    for c in ("answer", "plan", "predict", "validate", "check", "trace", "layers", "kernels"):
        assert c in jax_scaling.cli.PROGRAMS["python -m scaling"][0]
        assert f"`{c}`" in (ROOT / "docs/cli.md").read_text().split("## How the commands run")[1].split("##")[0]


def test_cpu_check_says_it_compares_no_peak(capsys):
    """A cpu:N check prints why its peak is not compared (XLA:CPU's peak is about the arguments alone)."""
    assert main(BASE["check"].split()) == 0
    out = capsys.readouterr().out
    assert "peak memory is not compared on CPU devices" in out


def test_crit_b_says_why_it_is_empty():
    """Under the scheduled form (the default) the critical batch is the sum form's (the scheduled form has none
    of its own): the column says which form, and no row reads 'never' without a word why."""
    code, out, err, _ = run("plan --slice v5p-128 --preset xxl --batch-tokens 25600 --top 3".split())
    assert code == 0
    header = next(line for line in out.splitlines() if line.lstrip().startswith("#"))
    assert "crit B sum" in header, header
    assert "never" not in out.split(header)[1].split("Best")[0]  # the top 3 meshes have a critical batch
    # the same mesh and schedule: the scheduled table's crit B is the sum form's own critical batch
    key = lambda p: (tuple(p["mesh"].values()), p["microbatches"], p["repeats"])  # noqa: E731
    flags = "plan --slice v5p-128 --preset xxl --batch-tokens 25600 --top 1000 --json".split()
    sched = {key(p): p for p in json.loads(run(flags)[1])["plans"]}
    summed = {key(p): p for p in json.loads(run([*flags, "--form", "sum"])[1])["plans"]}
    both = sched.keys() & summed.keys()
    assert len(both) >= 10 and all(sched[k]["critical_batch_sum"] == summed[k]["critical_batch"] for k in both)
    assert all(p["critical_batch"] is None for p in sched.values())  # the scheduled form has none of its own


def test_make_answer_installs_what_the_examples_need():
    """The README's examples compile for TPU topologies (libtpu: the tpu extra) and H100s (jax's CUDA plugin):
    the set-up `make answer` runs installs both, not the base package alone."""
    make = (ROOT / "Makefile").read_text()
    base = make.split("$(VENV)/.base:")[1].split("\n\n")[0]
    assert '-e ".[tpu]"' in base and "jax-cuda12-plugin" in base, base
    assert "answer: $(VENV)/.base" in make


def test_gpu_verify_top_without_the_plugin_is_one_line(monkeypatch):
    """Without jax's CUDA plugin, --verify-top for GPUs compiled on cpu:N and printed 'state 1.7 n/a'; now it
    refuses, naming the install step, before anything is compiled."""
    import verify.check as vc
    from scaling.planner import plan as planner
    from scaling.hardware.chips import get_chip

    monkeypatch.setattr(vc, "has_cuda_plugin", lambda: False)
    cfg, chip = get_preset("llama2-7b"), get_chip("H100")
    plans = planner.plan(cfg, chip, 16, 16 * 4096)[:1]
    with pytest.raises(ValueError, match="needs jax's CUDA plugin: `make answer` installs it"):
        vc.verify_plans(plans, cfg, chip, 16)
    assert plans[0].compiled is None


@pytest.mark.compiles
@pytest.mark.processes
def test_a_gpu_program_larger_than_the_gpu_is_refused():
    """The XXL on 8 H100s with fsdp=8: 16 B × 2.2e11 parameters / 8 = 440 GB of state per device alone, far above
    80 GB. XLA:GPU compiles it (and logs that it cannot rematerialize below its limit); compile must refuse it with
    one line, exit 2, and no C++ log lines, as XLA:TPU's refusal of the same reads."""
    from mesh.devices import has_cuda_plugin

    if not has_cuda_plugin():
        pytest.skip("jax's CUDA plugin not installed (make answer installs it)")
    r = subprocess.run([sys.executable, "-m", "verify", "compile", "--preset", "xxl", "--devices", "gpu:H100:8",
                        "--mesh", "fsdp=8"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, r.stderr
    assert "GB per device (XLA:GPU's peak), more than the 80.0 GB usable on one H100" in lines[0]
