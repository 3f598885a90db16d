#!/bin/bash
# Twenty-third session, call 2: near-ties in the FP8 picks go to e4m3 (kernel_pick.PREFER_MARGIN), and the scales'
# update as one kernel (kernels/fp8_scales.py). GPU tests; then SD1.5 end to end twice, each its own process with an
# empty cache: fast against fast@fp8 (speed, memory, picks), then fast@fp8 alone (do the picks and memory repeat?).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 170 python3 -m pytest -q -m gpu tests/kernels/test_fp8_scales.py tests/engines/test_fp8.py \
  tests/engines/test_kernel_pick.py > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
python3 -m pytest -q tests/kernels/test_fp8_scales.py >> /tmp/u/gpu_tests.txt 2>&1; tail -1 /tmp/u/gpu_tests.txt
SDACCEL_CACHE=/tmp/c_a timeout 220 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out /tmp/u/e2e_a > /tmp/u/e2e_a.log 2>&1; grep -E "^\||^SM MHz" /tmp/u/e2e_a.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
SDACCEL_CACHE=/tmp/c_b timeout 160 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines fast@fp8 --engine-opt fast@fp8.fp8=1 \
  --out /tmp/u/e2e_b > /tmp/u/e2e_b.log 2>&1; grep -E "^\|" /tmp/u/e2e_b.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
