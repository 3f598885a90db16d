#!/bin/bash
# The cluster GroupNorm on by default: its GPU tests (8 and 16 warps a CTA now among them), then SD1.5 end to end,
# compile-RO (the baseline), fast and eager, each in its own process with an empty cache.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm_cluster.py \
  > $OUT/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $OUT/gpu_tests.txt | head -20 | cut -c1-250
rm -rf /tmp/u; mkdir -p /tmp/u
SDACCEL_CACHE=/tmp/c_b timeout 450 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines compile,fast,eager --baseline compile --out /tmp/u/sd15 > /tmp/u/sd15.log 2>&1
grep -E "^\||^SM MHz" /tmp/u/sd15.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
