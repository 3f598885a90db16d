#!/bin/bash
# Thirteenth session, call 2: end to end with the Gluon convolution in the pick (conv="auto", the new default) against
# conv="gemm" (cuDNN against im2col + cuBLAS, as before): SD1.5 50 steps at batch 1 and 8, SDXL 1024x1024 30 steps.
# Each run its own process with an empty cache, alternated. The restored test first.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 60 python3 -m pytest -q -m gpu tests/engines/test_convolution.py 2>&1 | tail -3 \
  | tee $OUT/gpu_tests.txt
mkdir -p /tmp/e2e
run() { # tag timeout args...
  local tag=$1 t=$2; shift 2; rm -rf /tmp/c_$tag; SDACCEL_CACHE=/tmp/c_$tag timeout $t python3 -m sdaccel bench "$@" \
    --out /tmp/e2e/$tag > /tmp/e2e/$tag.log 2>&1; tail -3 /tmp/e2e/$tag.log | cut -c1-160
  python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py /tmp/e2e | grep "^ *$tag "
  tar czf $OUT/e2e.tgz -C /tmp e2e; }  # as it goes: a call cut short keeps what ran
SD15="--model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2"
SDXL="--model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1"
run sd15_sm90 150 $SD15 --engines fast
run sd15_gemm 150 $SD15 --engines fast --engine-opt fast.conv=gemm
run sdxl_sm90 120 $SDXL --engines fast
run sdxl_gemm 120 $SDXL --engines fast --engine-opt fast.conv=gemm
