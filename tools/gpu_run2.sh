#!/bin/bash
# Second device session: the GEMMs the first calibrate run had no time for, and two bench steps profiled by kernel.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout ${MORE_TIMEOUT:-110} python3 - > $OUT/more.log 2>&1 <<'PY'
import os, time
from verify import calibrate as c
todo = [("bf16", s) for s in [(1024, 65536, 8192), (8192, 65536, 8192), (1024, 8192, 65536), (8192, 8192, 65536)]]
todo += [(d, (m, n, k)) for d in ("tf32", "fp8", "int8") for m in (1024, 8192) for n in (2048, 8192) for k in (2048, 8192)
         if (m, n, k) != (8192, 8192, 8192)]
out = open(os.environ.get("OUT", "/tmp/out") + "/more.txt", "w")
for d, s in todo:
    try:
        t = c.gemm_seconds(d, *s)
        out.write(f"{d} {s[0]} {s[1]} {s[2]} {t:.4e}\n"); out.flush()
    except Exception as e:
        out.write(f"# {d} {s} {type(e).__name__} {str(e)[:100]}\n")
PY
echo "more rc=$?"; wc -l $OUT/more.txt
i=0
for cfg in "--preset medium-tf --batch-tokens 16384" "--preset llama2-7b --blocks 4 --batch-tokens 16384"; do
  i=$((i+1)); echo "== profile $cfg"
  timeout ${PROF_TIMEOUT:-80} python3 -m jax_scaling.profile_step $OUT/profile$i.json bench $cfg --steps 5 --warmup 2 > $OUT/profile$i.log 2>&1
  echo "rc=$?"; tail -2 $OUT/profile$i.log
done
ls -la $OUT
