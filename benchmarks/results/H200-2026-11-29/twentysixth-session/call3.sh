#!/bin/bash
# Twenty-sixth session, call 3: SDXL in the FP8 mode with the cluster GroupNorm taking the e4m3 norms. 1. One SDXL
# UNet call at CFG batch 2: the new default against the old e4m3 warps rule (gnw32), alternated in one process.
# 2. SDXL 1024x1024 30 steps batch 1, fast against fast@fp8.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; cp /tmp/gpu.txt $R/
SDACCEL_CACHE=/tmp/c_x timeout 250 python3 benchmarks/bench_unet.py --arch sdxl --batch 2 \
  --variants fast-fp8,fast-fp8-gnw32,fast-fp8,fast-fp8-gnw32 --out $R/unet_xl_fp8_b2.json > $R/unet_xl_fp8_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_xl_fp8_b2.txt | cut -c1-220 | head -12
tar czf $OUT/r.tgz -C /tmp r
left=$((580 - SECONDS))
SDACCEL_CACHE=/tmp/c_xl timeout $left python3 -m sdaccel bench --model synthetic:sdxl --height 1024 --width 1024 \
  --steps 30 --batch-sizes 1 --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast \
  --out $R/sdxl > $R/sdxl.log 2>&1
grep -E "^\||^SM MHz" $R/sdxl.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
