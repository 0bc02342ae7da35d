"""The --json output of a fixed list of commands, written one file per command, timing fields removed: a restructuring
is held to leave them byte-identical (issue 36's acceptance).

    python tools/json_outputs.py OUTDIR [NAME ...]     # then: diff -r BEFORE AFTER

Each command runs in its own process (``jax-scaling`` of this checkout's .venv, else on PATH), on emulated CPU devices
where it compiles or runs. Fields that measure this machine's time (TIMING, per command, at any depth) are dropped;
everything else, closed forms and compiled figures alike, is kept as the command printed it (keys sorted, two-space
indent)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".venv" / "bin" / "jax-scaling"
# name -> the command's arguments (each with --json)
COMMANDS = {
    "answer": "answer",
    "plan-ffn": "plan --slice v5p-1024 --preset xxl --batch-tokens 1048576 --top 20",
    "plan-transformer": "plan --preset llama3.1-70b --chip v5p --chips 512 --batch-tokens 4194304 --top 20",
    "predict": "predict --preset xxl --chip v5p --chips 64 --mesh fsdp=16,tensor=4 --batch-tokens 25600",
    "validate": "validate",
    "check-cpu8": "check --devices cpu:8 --mesh data=2,fsdp=2,tensor=2 --preset tiny --batch-tokens 64",
    "trace": "trace --preset llama-8b --context 8",
    "layers": "layers",
    "kernels": "kernels --seed 002",
    "train": "train --devices cpu:8 --mesh fsdp=4,tensor=2 --preset tiny --batch-tokens 64 --steps 3",
    "bench": "bench --devices cpu:8 --mesh fsdp=4,tensor=2 --preset tiny --batch-tokens 64 --steps 3",
}
# per command, the fields that measure this machine's time rather than the model or the program
TIMING = {"plan-ffn": {"enumerate_seconds"}, "plan-transformer": {"enumerate_seconds"},
          "check-cpu8": {"compile_seconds"}, "train": {"tokens_per_s"},
          "bench": {"step_seconds", "step_seconds_all", "tflops_per_s", "tflops_per_s_per_device", "mfu", "hfu"}}


def _drop_timing(x, keys: set):
    if isinstance(x, dict):
        return {k: _drop_timing(v, keys) for k, v in x.items() if k not in keys}
    if isinstance(x, list):
        return [_drop_timing(v, keys) for v in x]
    return x


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    out, names = Path(argv[0]), argv[1:] or list(COMMANDS)
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        print(f"error: unknown command name(s) {', '.join(unknown)}; known: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    script = str(SCRIPT) if SCRIPT.exists() else shutil.which("jax-scaling")
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    failed = 0
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        r = subprocess.run([script, *COMMANDS[name].split(), "--json"], capture_output=True, text=True, env=env,
                           cwd=ROOT)
        if r.returncode:
            failed += 1
            print(f"[{i}/{len(names)}] {name}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}",
                  file=sys.stderr)
            continue
        data = _drop_timing(json.loads(r.stdout), TIMING.get(name, set()))
        (out / f"{name}.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        print(f"[{i}/{len(names)}] {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
