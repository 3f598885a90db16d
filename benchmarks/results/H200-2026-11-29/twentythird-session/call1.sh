#!/bin/bash
# Prepared for the next session's first device call (not run yet).
# 1. GPU tests of the FP8 mode on the last commits (HostArena, the review's rename), and the fast engine's.
# 2. Where one graphed FP8 UNet call spends its time at CFG batch 2 (the twenty-second session's timed out at 90 s:
#    the profile process compiles its kernels cold), beside fp16's, in one process each.
# 3. End to end at batch 1 and 8, fast against fast@fp8 (host weights, the default) with --restart: second starts,
#    and the picks' spread in first-run memory (2047-2484 MB at batch 1 across two calls).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -m gpu tests/engines/test_fp8.py tests/engines/test_fast.py \
  > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
for fp8 in on off; do
  SDACCEL_CACHE=/tmp/c_p timeout 180 python3 benchmarks/profile_unet.py --engine fast --graphed --fp8 $fp8 --batch 2 \
    --out /tmp/u/profile_b2_fp8$fp8.json > /tmp/u/profile_b2_fp8$fp8.txt 2>&1
  sed -n '/kernels of one graph replay/,/idle between/p' /tmp/u/profile_b2_fp8$fp8.txt | head -8 | cut -c1-200
  tar czf $OUT/u.tgz -C /tmp u
done
SDACCEL_CACHE=/tmp/c_e2e timeout 230 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast --restart \
  --out /tmp/u/e2e > /tmp/u/e2e.log 2>&1; grep -E "^\||^SM MHz" /tmp/u/e2e.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
