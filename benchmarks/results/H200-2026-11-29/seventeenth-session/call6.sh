#!/bin/bash
# Call 6: the harness's new NAME@TAG labels on the GPU, and SDXL's fp16 against FP8 in one `sdaccel bench` run:
# 1024x1024, 30 steps, fast and fast@fp8, each in its own fresh process with an empty cache.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/e2e
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee /tmp/e2e/gpu.txt
SDACCEL_CACHE=/tmp/c_xl timeout 170 python3 -m sdaccel bench --model synthetic:sdxl --height 1024 --width 1024 \
  --steps 30 --batch-sizes 1 --runs 3 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out /tmp/e2e/sdxl > /tmp/e2e/sdxl.log 2>&1; echo "rc=$?" >> /tmp/e2e/sdxl.log
grep -E "cold start|^\||rc=|rror" /tmp/e2e/sdxl.log | cut -c1-240
tar czf $OUT/e2e.tgz -C /tmp e2e
echo "elapsed ${SECONDS}s"
