#!/bin/bash
# SDXL 1024x1024, 30 steps, fast alone (fp16), with the narrow split GroupNorm.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_xl timeout 280 python3 -m sdaccel bench --model synthetic:sdxl --height 1024 --width 1024 \
  --steps 30 --batch-sizes 1 --runs 2 --warmup 1 --engines fast --out $R/sdxl > $R/sdxl.log 2>&1
grep -E "^\||^SM MHz" $R/sdxl.log | cut -c1-300
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
