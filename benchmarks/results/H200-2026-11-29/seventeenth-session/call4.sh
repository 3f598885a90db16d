#!/bin/bash
# Call 4: FP8 mode with blocks narrower than 640 channels left in fp16 (fp8.MIN_WIDTH). End to end first: SDXL
# 1024x1024 30 steps, `sdaccel bench` on fast with fp8 and without, each its own fresh process with an empty cache;
# then one SD1.5 UNet call, fast-fp8 against fast, alternated, each its own process (CFG batch 2 twice, 16); then
# SD1.5 50 steps at batch 1 and 8 with fp8 and with --quality (PSNR against eager fp32), as time allows.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/e2e /tmp/u
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee /tmp/e2e/gpu.txt
run() { # tag timeout args...
  local tag=$1 t=$2; shift 2; rm -rf /tmp/c_$tag; SDACCEL_CACHE=/tmp/c_$tag timeout $t python3 -m sdaccel bench "$@" \
    --out /tmp/e2e/$tag > /tmp/e2e/$tag.log 2>&1; echo "rc=$?" >> /tmp/e2e/$tag.log
  grep -E "cold start|^\||rc=|rror" /tmp/e2e/$tag.log | cut -c1-220
  tar czf $OUT/e2e.tgz -C /tmp e2e u; }
XL="--model synthetic:sdxl --height 1024 --width 1024 --steps 30 --batch-sizes 1 --runs 3 --warmup 1 --engines fast"
run sdxl_fp8 150 $XL --engine-opt fast.fp8=1
run sdxl_fp16 150 $XL
unet() { # tag variant arch batch iters
  SDACCEL_CACHE=/tmp/c_u timeout 100 python3 benchmarks/bench_unet.py --arch $3 --batch $4 --iters $5 --variants $2 \
    --out /tmp/u/unet_$1.json > /tmp/u/unet_$1.log 2>&1
  grep -E "^fast" /tmp/u/unet_$1.log | sed "s/^/$1 /" | cut -c1-200; tail -2 /tmp/u/unet_$1.log | grep -i error
  tar czf $OUT/e2e.tgz -C /tmp e2e u; }
for i in 1 2; do unet fp8_b2_$i fast-fp8 sd15 2 50; unet fp16_b2_$i fast sd15 2 50; done
[ $SECONDS -lt 420 ] && { unet fp8_b16 fast-fp8 sd15 16 20; unet fp16_b16 fast sd15 16 20; }
left=$((580 - SECONDS)); echo "left ${left}s"
[ $left -gt 70 ] && run sd15_fp8 $left --model synthetic:sd15 --steps 50 --batch-sizes 1,8 --runs 3 --warmup 2 \
  --engines fast --engine-opt fast.fp8=1 --quality
echo "elapsed ${SECONDS}s"
