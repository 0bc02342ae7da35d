#!/bin/bash
# One device session: calibrate the GPU (issue 38) and bench two transformer steps; everything lands in $OUT.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $OUT/smi.txt 2>&1
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" 2>&1 | tee -a $OUT/smi.txt
CAL="import argparse, sys; from jax_scaling import calibrate as c; p = argparse.ArgumentParser(); s = p.add_subparsers(); c.add_parser(s); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
timeout ${CAL_TIMEOUT:-400} python3 -c "$CAL" calibrate --out $OUT/H100.toml --budget ${BUDGET:-330} ${CAL_ARGS} > $OUT/calibrate.log 2>&1
echo "calibrate rc=$?"; tail -15 $OUT/calibrate.log
for cfg in "--preset medium-tf --batch-tokens 16384" "--preset llama2-7b --blocks 4 --batch-tokens 16384"; do
  echo "== bench $cfg"
  timeout ${BENCH_TIMEOUT:-75} python3 -m ffn_model bench $cfg --steps 8 --warmup 2 --json >> $OUT/bench.jsonl 2>> $OUT/bench.err
  echo "rc=$?"; tail -3 $OUT/bench.err
done
ls -la $OUT
