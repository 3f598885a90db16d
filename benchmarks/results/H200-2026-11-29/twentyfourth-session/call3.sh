#!/bin/bash
# Ran with gn-clusters/gn_clusters.patch applied (reverted since: Triton 3.6 could not compile it).
# Twenty-fourth session, call 3: GroupNorm's single-pass kernel spread over a thread-block cluster (Triton's
# num_ctas on Hopper: the group's tile split over 2-8 CTAs, the reductions through distributed shared memory), at
# every shape the split and looped kernels take now, against the launcher's default path, graphed, L2-resident.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import triton; print('triton', triton.__version__)"
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
cd benchmarks/kernels
timeout 400 python3 bench_group_norm_paths.py --clusters 2,4,8 --cluster-warps 4,8 --only-clusters \
  --json /tmp/u/gn_clusters.json > /tmp/u/gn_clusters.txt 2>&1
grep -vE "Warning|warn" /tmp/u/gn_clusters.txt | cut -c1-250 | tail -60
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
