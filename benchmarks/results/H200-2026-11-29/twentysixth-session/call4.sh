#!/bin/bash
# Twenty-sixth session, call 4. 1. Does the e4m3 rule's 16 values a thread help the fp16 calls too, inside the UNet
# (in call 2 the FP8 UNet call gained more than the per-call bench predicted)? One UNet call at CFG batch 2, fast
# against fast-gnw16, alternated in one process, SD1.5 then SDXL. 2. The whole GPU suite on the new defaults.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export PYTHONPATH=/tmp/site:$PWD
R=/tmp/r; rm -rf $R; mkdir -p $R; cp /tmp/gpu.txt $R/
SDACCEL_CACHE=/tmp/c_u timeout 150 python3 benchmarks/bench_unet.py --arch sd15 --batch 2 \
  --variants fast,fast-gnw16,fast,fast-gnw16,fast,fast-gnw16 --out $R/unet_b2.json > $R/unet_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_b2.txt | cut -c1-220 | head -12
SDACCEL_CACHE=/tmp/c_x timeout 200 python3 benchmarks/bench_unet.py --arch sdxl --batch 2 \
  --variants fast,fast-gnw16,fast,fast-gnw16 --out $R/unet_xl_b2.json > $R/unet_xl_b2.txt 2>&1
grep -E "^fast|rror" $R/unet_xl_b2.txt | cut -c1-220 | head -12
tar czf $OUT/r.tgz -C /tmp r
left=$((585 - SECONDS))
SDACCEL_CACHE=/tmp/c_t timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests > $R/gpu_suite.txt 2>&1
grep -E "passed|failed|^FAILED|^ERROR" $R/gpu_suite.txt | tail -12 | cut -c1-250
tar czf $OUT/r.tgz -C /tmp r
echo "elapsed ${SECONDS}s"
