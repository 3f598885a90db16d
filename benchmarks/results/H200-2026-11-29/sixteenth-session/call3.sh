#!/bin/bash
# Call 3: what FP8 (e4m3) would buy the UNet's GEMMs and convolutions (bench_fp8_gemm.py: cuBLAS fp16 against
# cuBLASLt FP8 per shape, summed per UNet call), SD1.5 at CFG batch 2 and 16, SDXL at 2.
# This call ran an earlier bench_fp8_gemm.py whose cast column timed the im2col matrix (9x a 3x3 convolution's input);
# call 4 supersedes it.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/f
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/f/gpu.txt
timeout 300 python3 benchmarks/kernels/bench_fp8_gemm.py --arch sd15 --batch 2,16 --json /tmp/f/fp8_sd15.json \
  > /tmp/f/fp8_sd15.log 2>&1; grep "per UNet\|skip\|Error" /tmp/f/fp8_sd15.log; tail -3 /tmp/f/fp8_sd15.log
tar czf $OUT/f.tgz -C /tmp f
timeout 200 python3 benchmarks/kernels/bench_fp8_gemm.py --arch sdxl --batch 2 --json /tmp/f/fp8_sdxl.json \
  > /tmp/f/fp8_sdxl.log 2>&1; grep "per UNet\|Error" /tmp/f/fp8_sdxl.log; tail -2 /tmp/f/fp8_sdxl.log
tar czf $OUT/f.tgz -C /tmp f
echo "elapsed ${SECONDS}s"
