#!/bin/bash
# The cluster GroupNorm at the 64x64 level too (SD1.5, SDXL; the split kernels' calls at CFG batch 2), against the
# launcher's pick without it, at 4, 8, 16 warps a CTA.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
timeout 240 python3 benchmarks/kernels/bench_group_norm_cluster.py --json $OUT/gn_cluster.json 2>&1 | tee $OUT/gn_cluster.txt | cut -c1-200
echo "elapsed ${SECONDS}s"
