#!/bin/bash
# proj_out's bias fold on by default (call 1 timed it): the FP8 mode's GPU tests with it, then SD1.5 end to end,
# compile-RO (the baseline), fast, fast@fp8 and eager, each in its own process with an empty cache.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engines/test_fp8.py \
  > $R/fp8_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/fp8_tests.txt | head -12 | cut -c1-250
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_b timeout $((590 - SECONDS)) python3 -m sdaccel bench --model synthetic:sd15 --steps 50 \
  --batch-sizes 1,8 --runs 2 --warmup 1 --engines compile,fast,fast@fp8,eager --engine-opt fast@fp8.fp8=1 \
  --baseline compile --out $R/sd15 > $R/sd15.log 2>&1
grep -E "^\||^SM MHz|cold start" $R/sd15.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
