#!/bin/bash
# Twenty-second session, call 3: call 2's host weights plus lazy e4m3 convolution weights (fp8.Fp8Weight(lazy=True):
# made when a shape may run the convolution in e4m3; SD1.5's 8x8 level, which the kernel cannot tile, holds none).
# GPU tests of the FP8 mode, SD1.5 at batches 1 and 8 (eager, fast@fp8, fast@fp8-gpu = fp8_host_weights=0), then
# SDXL 1024x1024 at batch 1 (eager, fast@fp8) as time allows.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -m gpu tests/engines/test_fp8.py > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
SDACCEL_CACHE=/tmp/c_e2e timeout 330 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines eager,fast@fp8,fast@fp8-gpu --engine-opt fast@fp8.fp8=1 \
  --engine-opt fast@fp8-gpu.fp8=1 --engine-opt fast@fp8-gpu.fp8_host_weights=0 --restart \
  --out /tmp/u/e2e > /tmp/u/e2e.log 2>&1; grep -E "^\||^SM MHz" /tmp/u/e2e.log | cut -c1-300
grep -o '"fp8_host_weights_MB": [0-9]*' /tmp/u/e2e/*.json | sort | uniq -c
tar czf $OUT/u.tgz -C /tmp u
left=$((570 - SECONDS)); echo "left ${left}s"
[ $left -gt 100 ] && (SDACCEL_CACHE=/tmp/c_xl timeout $left python3 -m sdaccel bench --model synthetic:sdxl --height 1024 \
  --width 1024 --steps 30 --batch-sizes 1 --runs 2 --warmup 1 --engines eager,fast@fp8 --engine-opt fast@fp8.fp8=1 \
  --out /tmp/u/sdxl > /tmp/u/sdxl.log 2>&1; grep -E "^\|" /tmp/u/sdxl.log | cut -c1-250)
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
