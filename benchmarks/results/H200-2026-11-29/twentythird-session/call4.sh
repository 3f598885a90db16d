#!/bin/bash
# Twenty-third session, call 4: the side by side on this session's tree, SD1.5 50 steps at batches 1 and 8, every
# engine in one `sdaccel bench` run (each in its own process, empty cache): compile first (the device time left is
# short, and the bench writes each engine's rows as it finishes), then fast, fast@fp8 and eager. No --restart.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_s timeout 380 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines compile,fast,fast@fp8,eager --engine-opt fast@fp8.fp8=1 --baseline compile \
  --out /tmp/u/sd15 > /tmp/u/sd15.log 2>&1
grep -E "^\||^SM MHz" /tmp/u/sd15.log | cut -c1-300
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
