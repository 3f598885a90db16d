#!/bin/bash
# Twentieth session, call 5 (the session's last device minutes): end to end after call 4's kernel changes, fast
# against fast@fp8 in one `sdaccel bench` run each: SDXL 1024x1024 30 steps, then SD1.5 50 steps at batch 1.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_xl timeout 170 python3 -m sdaccel bench --model synthetic:sdxl --height 1024 --width 1024 \
  --steps 30 --batch-sizes 1 --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 \
  --baseline fast --out /tmp/u/sdxl > /tmp/u/sdxl.log 2>&1; grep -E "^\|" /tmp/u/sdxl.log | cut -c1-250
tar czf $OUT/u.tgz -C /tmp u
left=$((280 - SECONDS)); echo "left ${left}s"
[ $left -gt 60 ] && (SDACCEL_CACHE=/tmp/c_e2e timeout $left python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
  --batch-sizes 1 --runs 3 --warmup 2 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out /tmp/u/b1 > /tmp/u/b1.log 2>&1; grep -E "^\|" /tmp/u/b1.log | cut -c1-250)
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
