#!/bin/bash
# For the next GPU session (not run yet): the cooperative variant, one device call. Applies coop.patch to a scratch
# copy of the tree (the checkout is left alone), smoke-tests each COOP config in its own process (a CUDA fault is
# sticky), runs the kernel's GPU tests, then times every config beside cuBLAS + the GEGLU kernel.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
HERE=benchmarks/results/H100-2026-11-28/tenth-session/gemm-geglu
P=$PWD/$HERE/coop/coop.patch
rm -rf /tmp/tree && mkdir /tmp/tree && cp -r sdaccel tests benchmarks pyproject.toml /tmp/tree/ \
  && (cd /tmp/tree && (patch -p1 -s < $P || git apply $P)) || exit 1
export PYTHONPATH=/tmp/site:/tmp/tree
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for c in 128,128,64,4,2,1 128,128,64,3,2,1 128,64,64,6,2,1; do for s in 8192,320,1280 1000,200,200; do
  timeout 60 python3 $HERE/smoke.py $c $s 2>&1 | tail -1 | cut -c1-200 | tee -a $OUT/smoke.txt; done; done
(cd /tmp/tree && timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_linear_geglu_sm90.py -x 2>&1 | tail -3) | tee $OUT/gpu_tests.txt
for a in "--batch 2" "--batch 16" "--model sdxl --batch 2"; do
  timeout 120 python3 /tmp/tree/benchmarks/kernels/bench_gated_gemm.py $a --fused sm90 --l2 hot --iters 50 2>&1 \
    | tee -a $OUT/bench.txt | grep -E "cublas|64x128x64s4c2 |coop" | cut -c1-90; done
