#!/bin/bash
# Prepared for the next session (not run: this session's device time was spent): the staged GroupNorm
# (kernels/group_norm_staged.py: a block of adjacent groups copied by cp.async into a thread-block cluster's shared
# memory, read once, one launch), built and compiled offline for sm_90a (no spills, 168-178 registers at 4 warps).
# 1. Its GPU tests, and the GroupNorm and cluster kernels' (the launcher changed).
# 2. Alone, at the UNet's own CFG-batch-2 calls (64x64 and 32x32 levels, SD1.5 and SDXL) against the launcher's
#    kernels, and at every split call of CFG batch 16 and the VAE (bench_norm_sweep.py --rules: its "staged" column).
# 3. One UNet call, alternated in one process: SD1.5 at CFG batch 2 (fast, fast-gnstaged in place of the split
#    kernels, fast-gnstaged-all in place of the cluster and looped ones too) and 16, SDXL at 2.
# If it wins: group_norm.STAGED_TAKES takes the paths it wins on (its comment, benchmarks/README.md), then the side
# by side.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm_staged.py \
  tests/kernels/test_group_norm.py tests/kernels/test_group_norm_cluster.py > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -12 | cut -c1-250
timeout 120 python3 benchmarks/kernels/bench_group_norm_cluster.py --staged --cluster-warps 4,8 \
  --only sd15:64x64,sd15:32x32,sdxl:64x64,sdxl:32x32 --json $R/staged_calls.json > $R/staged_calls.txt 2>&1
cut -c1-240 $R/staged_calls.txt
timeout 120 python3 benchmarks/kernels/bench_norm_sweep.py --rules --json $R/rules.json > $R/rules.txt 2>&1
cut -c1-220 $R/rules.txt
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_u timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-gnstaged,fast-gnstaged-all,fast,fast-gnstaged,fast-gnstaged-all --out $R/unet_b2.json \
  > $R/unet_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_b2.txt | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
SDACCEL_CACHE=/tmp/c_u timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 16 \
  --variants fast,fast-gnstaged,fast-gnstaged-all,fast,fast-gnstaged,fast-gnstaged-all --out $R/unet_b16.json \
  > $R/unet_b16.txt 2>&1
grep -E "^fast|rror" $R/unet_b16.txt | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
left=$((560 - SECONDS))
[ $left -gt 60 ] && SDACCEL_CACHE=/tmp/c_x timeout $left python3 benchmarks/bench_unet.py --arch sdxl --batch 2 \
  --variants fast,fast-gnstaged,fast,fast-gnstaged --out $R/unet_sdxl.json > $R/unet_sdxl.txt 2>&1
grep -E "^fast|rror" $R/unet_sdxl.txt 2>/dev/null | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
