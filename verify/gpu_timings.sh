#!/usr/bin/env bash
# Timed train steps on one GPU, for the validation's measured rows (scaling/data/measured.toml, group bench):
# each `jax-scaling bench` below, in order, while the time budget lasts (BUDGET seconds, default 420), each
# run in a process of its own under a timeout; one JSON object per run to $OUT/runs.jsonl (or ./gpu_runs.jsonl),
# the GPU's name and the software's versions to $OUT/env.txt. Run from the repository root on the GPU's
# machine, with jax, flax and optax installed there: bash verify/gpu_timings.sh (ONLY=regex: the runs named so)
set -u
OUT=${OUT:-.}
BUDGET=${BUDGET:-420}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
PY=${PY:-python3}
start=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
  $PY -c "import sys, jax, jaxlib, flax, optax; print(sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__, 'optax', optax.__version__); print(jax.devices())"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# a transformer of Llama 2 7B's layer shapes, 8 layers, 2,048-token sequences, 8 of them a step
T="--preset llama2-7b --blocks 8 --seq-len 2048 --batch-tokens 16384 --attention flash"
runs=(
  "smoke|--preset llama2-7b --blocks 2 --d-model 256 --heads 4 --kv-heads 4 --head-dim 64 --d-ff 512 --vocab 1024 --seq-len 256 --batch-tokens 2048 --microbatches 2 --attention flash --steps 2 --warmup 1"
  "llama2-7b-l8-m1|$T --microbatches 1"
  "llama2-7b-l8-m8|$T --microbatches 8"
  "llama2-7b-l8-m2|$T --microbatches 2"
  "llama2-7b-l8-m4|$T --microbatches 4"
  "llama2-7b-l8-full|$T --microbatches 1 --remat full"
  "xxl2-8192|--preset xxl-2 --batch-tokens 8192"
  "llama2-7b-l8-f11072|$T --microbatches 1 --d-ff 11072"
  "llama2-7b-l8-f11000|$T --microbatches 1 --d-ff 11000"
  "llama2-7b-l8-mat-m2|--preset llama2-7b --blocks 8 --seq-len 2048 --batch-tokens 16384 --attention materialized --microbatches 2"
)
for r in "${runs[@]}"; do
  name=${r%%|*}; args=${r#*|}
  [[ $name =~ ${ONLY:-.} ]] || continue
  left=$(( BUDGET - ($(date +%s) - start) ))
  if (( left < 60 )); then echo "skip $name (budget)"; continue; fi
  echo "== $name ($left s left): $args"
  t0=$(date +%s)
  timeout $(( left < 180 ? left : 180 )) $PY -m ffn_model bench --mesh data=1 --steps 10 --warmup 2 --json $args \
    >"/tmp/$name.json" 2>"/tmp/$name.err"
  rc=$?
  echo "   rc $rc in $(( $(date +%s) - t0 )) s"
  if [[ $rc == 0 ]]; then
    $PY -c "import json,sys; d=json.load(open('/tmp/$name.json')); d['name']='$name'; d['args']='$args'; d['wall_seconds']=$(( $(date +%s) - t0 )); print(json.dumps(d))" >>"$OUT/runs.jsonl"
    $PY -c "import json; d=json.load(open('/tmp/$name.json')); print('   step %.4f s  mfu %s  loss %.3f' % (d['step_seconds'], d['mfu'], d['final_loss']))"
  else
    tail -25 "/tmp/$name.err"
    [[ $name == smoke ]] && { cp "/tmp/$name.err" "$OUT/smoke.err"; exit 1; }
    tail -60 "/tmp/$name.err" >"$OUT/$name.err"
  fi
done
