#!/bin/bash
# Twentieth session, call 2: the FP8 mode's transformer blocks picked per shape (e4m3 or fp16, fp8.block_in_fp8).
# The FP8 GPU tests (with the pick's two new ones); then one UNet call, fast-fp8 against fast (and fast-fp8-noconv),
# SD1.5 CFG batch 2 and 16, SDXL CFG batch 2 (nineteenth session, call 5: SD1.5 b2 fast 5.311 / fp8 5.461 ms).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 180 python3 -m pytest -q -m gpu tests/engines/test_fp8.py > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
unet() { # tag arch batch iters variants timeout
  SDACCEL_CACHE=/tmp/c_$2 timeout $6 python3 benchmarks/bench_unet.py --arch $2 --batch $3 --iters $4 \
    --variants $5 --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1
  grep -E "^(fast|eager)" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-150; grep -E '"block ' /tmp/u/unet_$1.log | cut -c1-120
  tar czf $OUT/u.tgz -C /tmp u; }
unet b2 sd15 2 60 fast-fp8,fast,fast-fp8-noconv 150
unet b16 sd15 16 20 fast-fp8,fast 130
unet xl sdxl 2 30 fast-fp8,fast 150
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
