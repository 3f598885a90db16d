#!/bin/bash
# SD1.5 end to end with the narrow split GroupNorm: compile-RO (the baseline), fast and eager, each in its own
# process with an empty cache.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
rm -rf /tmp/u; mkdir -p /tmp/u; nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/u/gpu.txt
SDACCEL_CACHE=/tmp/c_b timeout 500 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines compile,fast,eager --baseline compile --out /tmp/u/sd15 > /tmp/u/sd15.log 2>&1
grep -E "^\||^SM MHz" /tmp/u/sd15.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
