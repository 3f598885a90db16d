#!/bin/bash
# Twentieth session, call 1: the GPU tests of the three Gluon kernels and the FP8 mode on 0658a20 (the nineteenth
# session's review moved their descriptor builder, dtype map and device check into gluon_hopper; never run on a GPU).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 400 python3 -m pytest -q -m gpu tests/kernels/test_conv_sm90.py \
  tests/kernels/test_linear_geglu_sm90.py tests/kernels/test_flash_attention_sm90.py tests/engines/test_fp8.py \
  > /tmp/u/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " /tmp/u/gpu_tests.txt | head -20 | cut -c1-200
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
