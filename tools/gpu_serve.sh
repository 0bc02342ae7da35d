#!/bin/bash
# Second device session of issue 53 (serving): a measured decode step of LLaMA 3.1 8B and of 70B's layers at half its
# depth on the lent H200, BF16 weights and int8 (verify.serve_bench.INT8_CASES), beside scaling.step.serving's closed
# form (verify.serve_bench), to $OUT/serve.json.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout ${T:-360} python3 -c "from verify.serve_bench import run; run('$OUT/serve.json', 'H200', ${B:-280})" 2>&1 | grep -v '^\s*$' | tail -30
