#!/bin/bash
# Where one graphed SD1.5 UNet call's time goes in the FP8 mode on this tree (CFG batch 2), and fp16 beside it.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
for mode in on off; do
  SDACCEL_CACHE=/tmp/c_$mode timeout 200 python3 benchmarks/profile_unet.py --engine fast --graphed --batch 2 \
    --fp8 $mode --top 40 --by-shape --out $R/profile_fp8_$mode.json > $R/profile_fp8_$mode.txt 2>&1
  sed -n '/kernels of one graph replay/,$p' $R/profile_fp8_$mode.txt | head -48 | cut -c1-180
  grep -E "median_ms" $R/profile_fp8_$mode.txt | cut -c1-160
  tar czf $OUT/r.tgz -C /tmp r
done
echo "elapsed ${SECONDS}s"
