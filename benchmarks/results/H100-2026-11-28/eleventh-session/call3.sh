#!/bin/bash
# Eleventh session, call 3: why the Gluon GEMM + GEGLU kernel is slower in the graph than alone. Each launch in one
# graph replay (which kernel ran before it), and the kernel alone with L2 flushed before every call against L2 hot.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SDACCEL_CACHE=/tmp/c_p timeout 150 python3 benchmarks/profile_unet.py --arch sd15 --batch 2 --engine fast --graphed \
  --gemm-geglu auto --trace "linear_geglu_sm90" --out $OUT/trace_auto.json > $OUT/trace_auto.txt 2>&1
SDACCEL_CACHE=/tmp/c_p timeout 150 python3 benchmarks/profile_unet.py --arch sd15 --batch 2 --engine fast --graphed \
  --gemm-geglu split --trace "_geglu_kernel" --out $OUT/trace_split.json > $OUT/trace_split.txt 2>&1
grep " after " $OUT/trace_auto.txt $OUT/trace_split.txt | cut -c1-170
for l2 in cold hot; do
  timeout 120 python3 benchmarks/kernels/bench_gated_gemm.py --batch 2 --fused sm90 --l2 $l2 --iters 50 2>&1 \
    | tee $OUT/kernel_b2_l2$l2.txt | grep -E "cublas|sm90" | cut -c1-90; done
