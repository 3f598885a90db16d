#!/bin/bash
# The cluster GroupNorm per UNet call shape against the looped kernel (graphed), then whole UNet calls with it off
# (fast) and on (fast-cluster), alternated in one process: SD1.5 three times each, SDXL twice each, CFG batch 2.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 benchmarks/kernels/bench_group_norm_cluster.py --json $OUT/gn_cluster.json 2>&1 | tee $OUT/gn_cluster.txt | cut -c1-200
SDACCEL_CACHE=/tmp/c_u timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-cluster,fast,fast-cluster,fast,fast-cluster --out $OUT/unet_b2.json > $OUT/unet_b2.txt 2>&1
grep -E "^fast|rror" $OUT/unet_b2.txt | cut -c1-220 | head -12
SDACCEL_CACHE=/tmp/c_x timeout 200 python3 benchmarks/bench_unet.py --arch sdxl --batch 2 \
  --variants fast,fast-cluster,fast,fast-cluster --out $OUT/unet_xl_b2.json > $OUT/unet_xl_b2.txt 2>&1
grep -E "^fast|rror" $OUT/unet_xl_b2.txt | cut -c1-220 | head -12
echo "elapsed ${SECONDS}s"
