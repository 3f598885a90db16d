#!/bin/bash
# Call 2: the attention kernel's softmax variants (fp16 exponentials, tensor-core row sums) -- GPU tests, then
# bench_attention on SD1.5 / SDXL self-attention shapes against cuDNN and the plain kernel, same process.
# It ran on the tree with softmax-variants.patch applied (the patch adds the kernel options, their GPU tests and
# --sm90-tricks); the patch was reverted after this call.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/a
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee /tmp/a/gpu.txt
timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_flash_attention_sm90.py 2>&1 | tail -5 | cut -c1-400 | tee /tmp/a/gpu_tests.txt
timeout 330 python3 benchmarks/kernels/bench_attention.py --sm90-tricks --configs 128x64w4s3 \
  --sm90-configs 128x64w4s3r80x2,64x128w4s2r128 \
  --shapes 2x8x4096x40,16x8x4096x40,2x8x1024x80,16x8x1024x80,2x10x4096x64,2x20x1024x64 \
  --csv /tmp/a/attention.csv > /tmp/a/attention.log 2>&1
grep -E "TFLOP|skip" /tmp/a/attention.log | head -120
tar czf $OUT/a.tgz -C /tmp a
echo "elapsed ${SECONDS}s"
