#!/bin/bash
# Device session of issue 53 (serving): the decode section of calibrate (weight-streaming GEMMs m 1..256 at LLaMA 3's
# layer shapes, attention of one query token against a KV cache, xla and cudnn), the launch chain and the pointwise
# sizes on the lent H200, written as a kernel table to $OUT/H200-decode.toml.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee $OUT/nvidia-smi.txt
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
timeout ${T:-300} python3 -c "
from jax_scaling.cli import main
raise SystemExit(main(['calibrate', '--chip', 'H200', '--out', '$OUT/H200-decode.toml', '--sections',
                       'launch,pointwise,decode', '--budget', '${B:-240}']))
" 2>&1 | grep -v '^\s*$' | tail -30
