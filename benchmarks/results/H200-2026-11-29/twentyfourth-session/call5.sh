#!/bin/bash
# Twenty-fourth session, call 5 (main tree, nothing changed in sdaccel/): the second starts again. Last session's
# call 1 measured fast 6.8 s and fast@fp8 8.3 s, both higher than before (5.4 and 5.6-6.4 s); is it the machine?
# SD1.5 end to end at batch 1, fast and fast@fp8, each with --restart (a second process on the warm engine cache).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/u; mkdir -p /tmp/u
export PYTHONPATH=/tmp/site:$PWD
SDACCEL_CACHE=/tmp/c_r timeout 400 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1 \
  --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast --restart \
  --out /tmp/u/restart > /tmp/u/restart.log 2>&1; grep -E "^\||second start|restart" /tmp/u/restart.log | cut -c1-300 | head -30
tar czf $OUT/u.tgz -C /tmp u
echo "elapsed ${SECONDS}s"
