#!/bin/bash
# The tree that lands (the two between-step changes; the whole-loop graph reverted): the loop plan's and the
# pipeline's GPU tests, then the side by side, eager, compile-RO (the baseline), fast and fast@fp8, each engine in
# its own process, one empty cache for the run.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engines/test_loop_plan.py \
  tests/test_pipeline_gpu.py > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -12 | cut -c1-250
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_b timeout $((440 - SECONDS)) python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
  --batch-sizes 1,8 --runs 3 --warmup 1 --engines fast,fast@fp8,compile,eager --engine-opt fast@fp8.fp8=1 \
  --baseline compile --out $R/sd15 > $R/sd15.log 2>&1
grep -E "^\||cold start" $R/sd15.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
