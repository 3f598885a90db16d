#!/bin/bash
# Call 5: SD1.5 50 steps at batch 1, `sdaccel bench --quality` (PSNR against eager fp32), fast with fp8 and
# without, each its own fresh process with an empty cache: the same-call baseline call 4 did not have time for.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/e2e
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee /tmp/e2e/gpu.txt
run() { # tag timeout args...
  local tag=$1 t=$2; shift 2; rm -rf /tmp/c_$tag; SDACCEL_CACHE=/tmp/c_$tag timeout $t python3 -m sdaccel bench "$@" \
    --out /tmp/e2e/$tag > /tmp/e2e/$tag.log 2>&1; echo "rc=$?" >> /tmp/e2e/$tag.log
  grep -E "cold start|^\| fast|rc=|rror" /tmp/e2e/$tag.log | cut -c1-220
  tar czf $OUT/e2e.tgz -C /tmp e2e; }
SD="--model synthetic:sd15 --steps 50 --batch-sizes 1 --runs 3 --warmup 2 --engines fast --quality"
run sd15_fp8 140 $SD --engine-opt fast.fp8=1
run sd15_fp16 140 $SD
echo "elapsed ${SECONDS}s"
