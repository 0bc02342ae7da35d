#!/bin/bash
# Third device session: the small kernels again with more copies per executable (verify.calibrate.time_copies fills
# 10·small seconds, up to 128 copies): pointwise sizes, the launch chain, and the bf16 GEMMs first measured under 40 us.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout ${T:-130} python3 - 2>&1 <<'PY'
import os, time, tomllib
from verify import calibrate as c
out = open(os.environ.get("OUT", "/tmp/out") + "/small.txt", "w")
t0 = time.perf_counter()
out.write(f"launch {c.launch_seconds():.4e}\n"); out.flush()
for e in range(12, 27, 2):
    out.write(f"pointwise {4 * 2**e} {c.pointwise_seconds(2**e):.4e}\n"); out.flush()
rows = tomllib.load(open("scaling/data/kernels/H100.toml", "rb"))["gemm"]["bf16"]["rows"]
for m, n, k, s in sorted(rows, key=lambda r: r[3]):
    if s > 4e-5 or time.perf_counter() - t0 > float(os.environ.get("B", 110)):
        break
    out.write(f"bf16 {m} {n} {k} {c.gemm_seconds('bf16', m, n, k):.4e} was {s:.4e}\n"); out.flush()
print(open(os.environ.get("OUT", "/tmp/out") + "/small.txt").read())
PY
