#!/bin/bash
# Tenth session: where the CFG-batch-2 UNet call's time goes with the Gluon GEMM + GEGLU kernel (auto) and without
# (split), kernel by kernel without the graph; then the GPU tests of the engine and the kernel.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
for m in auto split; do
  SDACCEL_CACHE=/tmp/c_p timeout 120 python3 benchmarks/profile_unet.py --arch sd15 --batch 2 --engine fast --by-shape \
    --gemm-geglu $m > $OUT/prof_b2_$m.txt 2>&1; tail -12 $OUT/prof_b2_$m.txt
done
SDACCEL_CACHE=/tmp/c_t timeout 240 python3 -m pytest -q -m gpu tests/engines/test_fast.py tests/engines/test_feed_forward.py \
  tests/kernels/test_linear_geglu_sm90.py 2>&1 | tail -4 | tee $OUT/gpu_tests.txt
