#!/bin/bash
# Seventeenth session, call 1: where an SDXL UNet call's time goes now (profile_unet.py --graphed, fast engine, CFG
# batch 2), SD1.5's for comparison; the attention tiles at SDXL's two self-attention shapes against cuDNN; LayerNorm
# at its UNet shapes.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/p
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee /tmp/p/gpu.txt
for a in sdxl:2 sd15:2; do
  SDACCEL_CACHE=/tmp/c_prof timeout 200 python3 benchmarks/profile_unet.py --arch ${a%%:*} --batch ${a#*:} \
    --engine fast --graphed --top 45 > /tmp/p/prof_${a%%:*}.txt 2>&1
  sed -n '/kernels of one graph replay/,$p' /tmp/p/prof_${a%%:*}.txt | cut -c1-150; tar czf $OUT/p.tgz -C /tmp p
done
timeout 150 python3 benchmarks/kernels/bench_attention.py --configs 128x64w4s3 \
  --sm90-configs 128x64w4s3r80x2,64x128w4s2r128,64x64w4s3r128,128x128w8s2,128x64w8s2r80,64x128w4s3r128,128x128w4s2r80x2 \
  --shapes 2x20x1024x64,2x10x4096x64 --csv /tmp/p/attention.csv > /tmp/p/attention.log 2>&1
grep -vE "^#" /tmp/p/attention.log | tail -40 | cut -c1-160
timeout 60 python3 benchmarks/kernels/bench_layer_norm.py > /tmp/p/layer_norm.log 2>&1; tail -25 /tmp/p/layer_norm.log
tar czf $OUT/p.tgz -C /tmp p
echo "elapsed ${SECONDS}s"
