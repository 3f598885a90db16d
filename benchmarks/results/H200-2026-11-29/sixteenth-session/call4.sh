#!/bin/bash
# Call 4: bench_fp8_gemm.py again (activation casts now at the convolution input's size) with --quality: one UNet
# call's error with FP8 fake-quantized GEMMs; SD1.5 CFG batch 2 and 16, SDXL CFG batch 2.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/f
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/f/gpu.txt
timeout 300 python3 benchmarks/kernels/bench_fp8_gemm.py --arch sd15 --batch 2,16 --quality --json /tmp/f/fp8_sd15.json \
  > /tmp/f/fp8_sd15.log 2>&1; grep "per UNet\|relative\|Error" /tmp/f/fp8_sd15.log; tail -2 /tmp/f/fp8_sd15.log
tar czf $OUT/f.tgz -C /tmp f
timeout 240 python3 benchmarks/kernels/bench_fp8_gemm.py --arch sdxl --batch 2 --quality --json /tmp/f/fp8_sdxl.json \
  > /tmp/f/fp8_sdxl.log 2>&1; grep "per UNet\|relative\|Error" /tmp/f/fp8_sdxl.log; tail -2 /tmp/f/fp8_sdxl.log
tar czf $OUT/f.tgz -C /tmp f
echo "elapsed ${SECONDS}s"
