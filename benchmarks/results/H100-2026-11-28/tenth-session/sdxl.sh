#!/bin/bash
# Tenth session: the GEMM + GEGLU kernel's times on this H100 at SD1.5's CFG-batch-2 shapes, then SDXL 1024x1024,
# 30 steps, with gemm_geglu="auto" (the Gluon kernel picked per shape) and "split", fresh processes, empty caches.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 python3 benchmarks/kernels/bench_gated_gemm.py --batch 2 --fused sm90 --l2 hot --iters 50 > $OUT/kernel_b2.txt 2>&1
grep -E "cublas|64x128x64s4c2" $OUT/kernel_b2.txt | cut -c1-80
run() { # tag gemm_geglu
  rm -rf /tmp/c_$1; SDACCEL_CACHE=/tmp/c_$1 timeout 200 python3 -m sdaccel bench --model synthetic:sdxl --height 1024 \
    --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 --engines fast --engine-opt fast.gemm_geglu=$2 \
    --out $OUT/$1 > $OUT/$1.log 2>&1; tail -1 $OUT/$1.log; }
run sdxl_auto auto; run sdxl_split split
python3 benchmarks/results/H100-2026-11-27/eighth-session/loop-plan/stages.py $OUT
cd $OUT && tar czf sdxl.tgz sdxl_auto sdxl_split *.log && rm -rf sdxl_auto sdxl_split *.log
