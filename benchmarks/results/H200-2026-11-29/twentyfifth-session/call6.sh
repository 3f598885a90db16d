#!/bin/bash
# The whole GPU test suite with the cluster GroupNorm on by default (the engines' tests now run it at CFG batch 2).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 520 python3 -m pytest -q -p no:cacheprovider -m gpu tests > $OUT/gpu_tests_all.txt 2>&1
grep -E "passed|failed|^FAILED|^ERROR" $OUT/gpu_tests_all.txt | head -30 | cut -c1-200
echo "elapsed ${SECONDS}s"
