#!/bin/bash
# Eleventh session, call 1: the GEMM + GEGLU kernel's GPU tests as the product now has it (64 x 128 default, the
# launcher's copy of a misaligned input), then the cooperative variant (tenth-session coop/run.sh: patched scratch
# tree, smoke per config, its tests, timings beside cuBLAS + GEGLU).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD SDACCEL_CACHE=/tmp/c
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_linear_geglu_sm90.py 2>&1 | tail -4 | tee $OUT/gpu_tests_product.txt
mkdir -p $OUT/coop && OUT=$OUT/coop bash benchmarks/results/H100-2026-11-28/tenth-session/gemm-geglu/coop/run.sh
