#!/bin/bash
# Where one graphed SD1.5 UNet call's time goes on this tree (CFG batch 2, fp16): the kernels of one replay.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_p timeout 170 python3 benchmarks/profile_unet.py --engine fast --graphed --batch 2 \
  --out $R/profile_b2.json > $R/profile_b2.txt 2>&1
sed -n '/kernels of one graph replay/,/idle between/p' $R/profile_b2.txt | head -24 | cut -c1-200
grep -E "median_ms" $R/profile_b2.txt | cut -c1-160
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
