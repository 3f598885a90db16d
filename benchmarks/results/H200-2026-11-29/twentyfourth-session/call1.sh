#!/bin/bash
# Prepared for the next session's first device call (not run yet).
# The whole GPU test suite: it last ran whole in the sixth session (H100, 78 passed, 3 skipped); since then each
# session ran only the GPU tests of the files it touched. Then the kernel tests that are not marked gpu, compiled on
# the GPU instead of the CPU interpreter (CI runs them only in the interpreter), as time allows.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests > /tmp/u/gpu_tests_all.txt 2>&1
grep -E "passed|failed|^FAILED|^ERROR" /tmp/u/gpu_tests_all.txt | head -30 | cut -c1-200
tar czf $OUT/u.tgz -C /tmp u
left=$((570 - SECONDS))
[ $left -gt 60 ] && SDACCEL_CACHE=/tmp/c_t timeout $left python3 -m pytest -q -p no:cacheprovider -m "not gpu" \
  tests/kernels > /tmp/u/kernel_tests_on_gpu.txt 2>&1
grep -E "passed|failed|^FAILED|^ERROR" /tmp/u/kernel_tests_on_gpu.txt | head -30 | cut -c1-200
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
