#!/bin/bash
# Ran with attention-exp16/attention_exp16.patch applied (reverted since: slower, not kept).
# Twenty-fourth session, call 2: the Gluon sm_90 attention with its softmax's exponentials in packed fp16
# (EXP16, "h" in a tile's name): the kernel alone at SD1.5's self-attention shapes against cuDNN and the fp32-exp
# tiles, with each one's error against fp32; then one UNet call at CFG batch 2, fast against fast-exp16 (its
# attention picks timed afresh), latency and error against fp32 eager.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
timeout 240 python3 benchmarks/kernels/bench_attention.py --shapes 2x8x4096x40,16x8x4096x40,2x8x1024x80 \
  --configs 128x64w4s3 --sm90-configs 128x64w4s3r80x2,128x64w4s3r80x2h,128x64w4s2r80x2h,64x128w4s2r128,64x128w4s2r128h \
  > /tmp/u/attn.txt 2>&1
grep -vE "Warning|warn" /tmp/u/attn.txt | cut -c1-220 | tail -60
tar czf $OUT/u.tgz -C /tmp u
SDACCEL_CACHE=/tmp/c_u timeout 200 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 --variants fast,fast-exp16,fast \
  --out /tmp/u/unet_b2.json > /tmp/u/unet_b2.txt 2>&1
grep -vE "Warning|warn" /tmp/u/unet_b2.txt | cut -c1-220 | tail -12
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
