#!/bin/bash
# The FP8 mode with and without proj_out's bias fold: one SD1.5 UNet call at CFG batch 2, alternated in one process.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
SDACCEL_CACHE=/tmp/c_u8 timeout 270 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast-fp8-nofold,fast-fp8,fast-fp8-nofold,fast-fp8,fast-fp8-nofold,fast-fp8 --out $R/unet_fp8_b2.json \
  > $R/unet_fp8_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_fp8_b2.txt | cut -c1-200
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
