#!/bin/bash
# Ninth session, call 1: the Gluon sm_90 attention kernel's GPU tests, then every attention candidate at SD's
# self-attention shapes (CUDA-event medians, L2 hot, as the engine's pick sees them).
# Run from the repository root on the GPU machine; results under $OUT.
set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_flash_attention_sm90.py 2>&1 | tail -25 | tee $OUT/gpu_tests.txt
timeout 330 python3 benchmarks/kernels/bench_attention.py --l2 hot --iters 50 --configs 128x64w8s3 ${ARGS} \
  --shapes ${SHAPES:-2x8x4096x40,16x8x4096x40,2x8x1024x80,2x10x4096x64,2x20x1024x64} --csv $OUT/attn.csv 2>&1 \
  | grep -v "^#   \(sdpa-default\|flash2\|efficient\)" | tee $OUT/attn.txt
