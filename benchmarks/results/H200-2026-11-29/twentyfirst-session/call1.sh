#!/bin/bash
# Twenty-first session, call 1: the twentieth session's prepared-next/run.sh with its baselines in their own
# processes, and the GPU tests of its last commits (f7c7a82: the block pick through ShapePicks; ecda313:
# profile_unet's L2 eviction).
# 1. FP8 with SD1.5's 320-wide blocks offered to the block pick (fp8.MIN_WIDTH 320 instead of 640), against
#    fast-fp8 as it is, each its own process (the picks are process-wide); fast in the 320 process as the baseline.
# 2. SD1.5 50 steps at batch 8, fast against fast@fp8, after the e4m3 norm fix.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 170 python3 -m pytest -q -m gpu tests/engines/test_fp8.py > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
unet() { # tag min_width batch iters variants timeout
  SDACCEL_CACHE=/tmp/c_$1 timeout $6 python3 -c "
import runpy, sys
import sdaccel.engines.fp8 as fp8
fp8.MIN_WIDTH = $2
sys.argv = ['bench_unet.py', '--arch', 'sd15', '--batch', '$3', '--iters', '$4', '--variants', '$5',
            '--out', '/tmp/u/unet_$1.json']
runpy.run_path('benchmarks/bench_unet.py', run_name='__main__')" > /tmp/u/unet_$1.log 2>&1
  grep -E "^(fast|eager)" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-150; grep -E '"block ' /tmp/u/unet_$1.log | cut -c1-120
  tar czf $OUT/u.tgz -C /tmp u; }
unet w320_b2 320 2 60 fast-fp8,fast 120
unet w640_b2 640 2 60 fast-fp8 100
SDACCEL_CACHE=/tmp/c_e2e timeout 200 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 8 \
  --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out /tmp/u/b8 > /tmp/u/b8.log 2>&1; grep -E "^\|" /tmp/u/b8.log | cut -c1-250
tar czf $OUT/u.tgz -C /tmp u
left=$((560 - SECONDS)); echo "left ${left}s"
[ $left -gt 90 ] && unet w320_b16 320 16 20 fast-fp8,fast $((left / 2))
left=$((560 - SECONDS)); echo "left ${left}s"
[ $left -gt 60 ] && unet w640_b16 640 16 20 fast-fp8 $((left - 5))
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
