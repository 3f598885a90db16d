#!/bin/bash
# Twenty-first session, call 3: the side by side on this tree, SD1.5 50 steps, batches 1 and 8, eager, compile,
# fast and the opt-in fast@fp8, each in fresh processes with a restart (call 2's ablation ran out of time before
# its FP8 row; this run's fast@fp8 stands in for it).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_e2e timeout 580 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1,8 \
  --runs 2 --warmup 1 --engines eager,compile,fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --restart \
  --out /tmp/u/sd15 > /tmp/u/sd15.log 2>&1
grep -E "^\|" /tmp/u/sd15.log | cut -c1-260
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
