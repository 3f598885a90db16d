#!/bin/bash
# The FP8 mode on this tree (its fp16 norms may now take the cluster GroupNorm), next to fast, SD1.5 batch 1.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
rm -rf /tmp/u; mkdir -p /tmp/u
SDACCEL_CACHE=/tmp/c_b timeout 200 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1 \
  --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast --out /tmp/u/sd15 \
  > /tmp/u/sd15.log 2>&1
grep -E "^\||^SM MHz" /tmp/u/sd15.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
