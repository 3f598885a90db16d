#!/bin/bash
# The cluster GroupNorm with its warps a CTA by the values each thread holds (group_norm_cluster.warps_for): its GPU
# tests, the per-call bench over 4, 8, 16 warps, then whole UNet calls off (fast) and on (fast-cluster), alternated.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm_cluster.py \
  tests/kernels/test_group_norm.py -k "cluster or Cluster" > $OUT/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $OUT/gpu_tests.txt | head -20 | cut -c1-250
timeout 150 python3 benchmarks/kernels/bench_group_norm_cluster.py --json $OUT/gn_cluster.json 2>&1 | tee $OUT/gn_cluster.txt | cut -c1-200
SDACCEL_CACHE=/tmp/c_u timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-cluster,fast,fast-cluster,fast,fast-cluster --out $OUT/unet_b2.json > $OUT/unet_b2.txt 2>&1
grep -E "^fast|rror" $OUT/unet_b2.txt | cut -c1-220 | head -12
SDACCEL_CACHE=/tmp/c_x timeout 200 python3 benchmarks/bench_unet.py --arch sdxl --batch 2 \
  --variants fast,fast-cluster,fast,fast-cluster --out $OUT/unet_xl_b2.json > $OUT/unet_xl_b2.txt 2>&1
grep -E "^fast|rror" $OUT/unet_xl_b2.txt | cut -c1-220 | head -12
echo "elapsed ${SECONDS}s"
