#!/bin/bash
# Twenty-sixth session, call 2: the cluster GroupNorm taking the FP8 mode's e4m3 norms (group_norm.CLUSTER_TAKES_E4M3
# now on) with its e4m3 warps rule (16 values a thread without a concatenation). 1. GPU tests: the kernel's, every
# GroupNorm test, the FP8 engine's. 2. Per call (bench_group_norm_cluster.py --e4m3). 3. One FP8 SD1.5 UNet call at
# CFG batch 2: the new default, the old warps rule (gnw32), the looped kernel for e4m3 (gnlooped), alternated.
# 4. SD1.5 50 steps batch 1, fast against fast@fp8.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; cp /tmp/gpu.txt $R/
SDACCEL_CACHE=/tmp/c_t timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm_cluster.py \
  tests/kernels/test_group_norm.py tests/engines/test_fp8.py > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -20 | cut -c1-250
timeout 120 python3 benchmarks/kernels/bench_group_norm_cluster.py --e4m3 --json $R/gn_cluster_e4m3.json 2>&1 \
  | tee $R/gn_cluster_e4m3.txt | grep -E "x32x32|x16x16|save" | cut -c1-200
SDACCEL_CACHE=/tmp/c_u timeout 200 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast-fp8,fast-fp8-gnw32,fast-fp8-gnlooped,fast-fp8,fast-fp8-gnw32,fast-fp8-gnlooped,fast-fp8,fast-fp8-gnw32 \
  --out $R/unet_fp8_b2.json > $R/unet_fp8_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_fp8_b2.txt | cut -c1-220 | head -12
SDACCEL_CACHE=/tmp/c_b timeout 170 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1 \
  --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast --out $R/sd15 \
  > $R/sd15.log 2>&1
grep -E "^\||^SM MHz" $R/sd15.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
