#!/bin/bash
# Twenty-second session, call 4: the host weights in one pinned buffer (fp8.HostArena: torch's pinned allocator
# rounds each allocation up to a power of two). GPU tests of the FP8 mode; SD1.5 at batches 1 and 8, eager against
# fast@fp8 (memory); then where one graphed UNet call of the FP8 mode spends its time at CFG batch 2 and 16.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -m gpu tests/engines/test_fp8.py > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
SDACCEL_CACHE=/tmp/c_e2e timeout 200 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines eager,fast@fp8 --engine-opt fast@fp8.fp8=1 \
  --out /tmp/u/e2e > /tmp/u/e2e.log 2>&1; grep -E "^\||^SM MHz" /tmp/u/e2e.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
for b in 2 16; do
  SDACCEL_CACHE=/tmp/c_e2e timeout 90 python3 benchmarks/profile_unet.py --engine fast --graphed --fp8 on --batch $b \
    --out /tmp/u/profile_fp8_b$b.json > /tmp/u/profile_fp8_b$b.txt 2>&1; head -30 /tmp/u/profile_fp8_b$b.txt | cut -c1-160
  tar czf $OUT/u.tgz -C /tmp u
done
echo "elapsed ${SECONDS}s"
