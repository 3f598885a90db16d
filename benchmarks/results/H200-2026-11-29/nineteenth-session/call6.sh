#!/bin/bash
# Nineteenth session, call 6 (the session's last device minutes): the FP8 GPU tests after call 5's fix to
# test_fp8_unet_call_in_cuda_graphs (the tiny models' ResNet sites stay at scale 1: their convolutions are not whole
# tiles of the e4m3 kernel); then SDXL 1024x1024 30 steps, fast against fast@fp8, in one `sdaccel bench` run.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 80 python3 -m pytest -q tests/engines/test_fp8.py -m gpu > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -12 | cut -c1-200
left=$((185 - SECONDS)); echo "left ${left}s"
SDACCEL_CACHE=/tmp/c_e2e timeout $left python3 -m sdaccel bench --model synthetic:sdxl --height 1024 --width 1024 \
  --steps 30 --batch-sizes 1 --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out /tmp/u/sdxl > /tmp/u/sdxl.log 2>&1; grep -E "^\|" /tmp/u/sdxl.log | cut -c1-220
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
