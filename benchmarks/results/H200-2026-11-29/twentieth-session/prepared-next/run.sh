#!/bin/bash
# Prepared for the next session's first device call (not run yet): what this session left unmeasured.
# 1. FP8 with SD1.5's 320-wide blocks offered to the block pick (fp8.MIN_WIDTH 320 instead of 640): one UNet call at
#    CFG batch 2 and 16 against fast-fp8 as it is, in one process each (the picks are process-wide, so the 320 run
#    goes first in its own process). MIN_WIDTH dates from before the block pick and the cheap e4m3 norms.
# 2. SD1.5 50 steps at batch 8, fast against fast@fp8, after the e4m3 norm fix (327.8 images/min before it).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
w320() { # tag batch iters: bench_unet with MIN_WIDTH 320
  SDACCEL_CACHE=/tmp/c_w timeout 150 python3 -c "
import runpy, sys
import sdaccel.engines.fp8 as fp8
fp8.MIN_WIDTH = 320
sys.argv = ['bench_unet.py', '--arch', 'sd15', '--batch', '$2', '--iters', '$3', '--variants', 'fast-fp8,fast',
            '--out', '/tmp/u/w320_$1.json']
runpy.run_path('benchmarks/bench_unet.py', run_name='__main__')" > /tmp/u/w320_$1.log 2>&1
  grep -E "^(fast|eager)" /tmp/u/w320_$1.log | sed "s/^/w320 $1 /" | cut -c1-150; grep -E '"block ' /tmp/u/w320_$1.log | cut -c1-120; }
w320 b2 2 60
w320 b16 16 20
SDACCEL_CACHE=/tmp/c_e2e timeout 240 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 8 \
  --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out /tmp/u/b8 > /tmp/u/b8.log 2>&1; grep -E "^\|" /tmp/u/b8.log | cut -c1-250
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
