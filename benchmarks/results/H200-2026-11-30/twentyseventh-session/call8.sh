#!/bin/bash
# Ran with call8/cluster-groups.patch applied (the kernel option it times; not landed: it lost everywhere).
# The cluster GroupNorm with two adjacent groups a cluster (cluster_groups=2; offline it spills 80 bytes a thread at
# 16 warps): its GPU tests, then the UNet's 64x64 and 32x32 calls against the launcher's kernels.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_t timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_group_norm_cluster.py \
  > $R/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|^E  " $R/gpu_tests.txt | head -12 | cut -c1-250
tar czf $OUT/r.tgz -C /tmp r
timeout 150 python3 benchmarks/kernels/bench_group_norm_cluster.py --groups 2 --cluster-warps 8,16 \
  --only sd15:64x64,sdxl:64x64,sd15:32x32 --json $R/groups.json > $R/groups.txt 2>&1
cut -c1-220 $R/groups.txt
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
