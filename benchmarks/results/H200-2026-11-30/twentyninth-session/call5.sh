#!/bin/bash
# The pipeline's GPU tests with the guard's checks queued before the sync (call 4 timed it).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_pipeline_gpu.py \
  tests/quality > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -12 | cut -c1-250
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
