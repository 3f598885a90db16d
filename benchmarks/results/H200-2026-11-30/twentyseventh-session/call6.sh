#!/bin/bash
# SD1.5 at batch 1, fast against fast@fp8 (the opt-in FP8 mode), each in its own process with an empty cache.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_f timeout 240 python3 -m sdaccel bench --model synthetic:sd15 --steps 50 --batch-sizes 1 \
  --runs 2 --warmup 1 --engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1 --baseline fast --out $R/sd15 \
  > $R/sd15.log 2>&1
grep -E "^\|" $R/sd15.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
